#!/bin/sh
# calibration_gpu.sh — the GPU start-up calibration of a model deeper than two blocks: timed on models of one and
# two blocks in the memory of the training model (which is rebuilt after them), then at full depth the shapes the
# time target affords (balance.calibrate_seconds = 0: the cheapest alone, the others scaled; the default 60 s: all
# six tiny shapes); the start-up summary comes first, then the calibration's lines, then the schedule; the rebuilt
# model trains as one that was never swapped out (the losses of the first steps within 1e-2 of a run without
# calibration: one rank, a fixed global batch of small samples in one micro-batch, so the same samples each step);
# a second run in the folder reads the timings back. Skipped without a GPU.
. "${top_srcdir:-.}/tests/train_lib.sh"
LAYERS=4
STEPS=6
tap_plan 7

n_gpus=0
probe="$top_builddir/tests/gpu_present"
if [ -x "$probe" ]; then n_gpus=$("$probe" 2> /dev/null) || n_gpus=0; fi
case $n_gpus in ''|*[!0-9]*) n_gpus=0 ;; esac
echo "# GPUs visible: $n_gpus"

tap_ok "aldit-store synth makes the test store" make_store
if [ "$n_gpus" -lt 1 ]; then
    for name in "a calibrated $LAYERS-block GPU run exits 0, timed on 1 and 2 blocks, the cheapest at $LAYERS" \
                "the summary first, then the calibration's lines, then the schedule" \
                "the rebuilt model trains as without calibration" \
                "a second run in the folder reads the timings"; do
        tap_result 0 "$name # SKIP no GPU visible"
    done
    tap_result 0 "the timings file holds every shape at full depth # SKIP no GPU visible"
    tap_result 0 "with the default target every shape is timed at $LAYERS blocks # SKIP no GPU visible"
    tap_done
fi

# line NUMBER of the first line of FILE matching PATTERN (0 when none)
line_of() { n=$(grep -n -m 1 -- "$2" "$1" | cut -d: -f1); echo "${n:-0}"; }

SCALED="balance.calibrate_seconds=0"
run_aldit 1 scaled run.device=cuda run.steps=$STEPS model.num_layers=$LAYERS balance.calibrate=1 $SCALED; status=$?
log="$WORK/scaled.log"
[ $status -eq 0 ] &&
    grep -q "timed on the GPU .* on 1 and 2 blocks, 1 of them at $LAYERS blocks (5 scaled to $LAYERS), in .* s, kept in .*calibration.txt" "$log" &&
    grep -q "^calibration: 1 shape at $LAYERS blocks (the cheapest, about [0-9]* s), 5 scaled$" "$log" &&
    grep -q "^             misfit of the scaling at $LAYERS blocks: worst [-+][0-9.]*% (.*) of the cheapest shape timed there; 5 scaled, not checked; worst [0-9.]*%$" "$log"
tap_result $? "a calibrated $LAYERS-block GPU run exits 0, timed on 1 and 2 blocks, the cheapest at $LAYERS" "$(cat "$log")"
grep "misfit of\|cost model fitted" "$log" | sed 's/^ */# /'

memory=$(line_of "$log" "^  memory  ")
timing=$(line_of "$log" "^calibration: timing .* on models of 1 and 2 blocks, .* the others scaled to $LAYERS blocks$")
result=$(line_of "$log" "^  calibrate  ")
schedule=$(line_of "$log" "^  schedule  ")
[ "$memory" -gt 0 ] && [ "$timing" -gt "$memory" ] && [ "$result" -gt "$timing" ] && [ "$schedule" -gt "$result" ]
tap_result $? "the summary first, then the calibration's lines, then the schedule" \
    "memory line $memory, calibration start $timing, result $result, schedule $schedule"

run_aldit 1 plain run.device=cuda run.steps=$STEPS model.num_layers=$LAYERS balance.calibrate=0; status=$?
losses "$WORK/scaled/metrics.jsonl" > "$WORK/scaled.losses"
losses "$WORK/plain/metrics.jsonl" > "$WORK/plain.losses"
paste "$WORK/plain.losses" "$WORK/scaled.losses" | awk -v steps=$STEPS '
    { n++; d = $2 - $4; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2
      if ($1 != $3 || !(m > 0) || d / m > 1e-2) bad = 1; if (m > 0 && d / m > worst) worst = d / m }
    END { printf "largest relative difference %.2g over %d steps\n", worst, n; exit bad || n != steps }' \
    > "$WORK/compare"; compared=$?
[ $status -eq 0 ] && [ $compared -eq 0 ]; ok=$?
tap_result $ok "the rebuilt model trains as without calibration ($(cat "$WORK/compare"))" \
    "$(paste "$WORK/plain.losses" "$WORK/scaled.losses")"

# 6 lines for the 6 shapes of train_tiny.lengths, after the header, key and count
shapes=$(awk 'NR > 3 && NF == 6 && $5 > 0 && $6 > 0' "$WORK/scaled/calibration.txt" | wc -l | tr -d ' ')
[ "$shapes" -eq 6 ]
tap_result $? "the timings file holds every shape at full depth" "$(cat "$WORK/scaled/calibration.txt")"

run_aldit 1 scaled run.device=cuda run.steps=$((STEPS + 2)) model.num_layers=$LAYERS balance.calibrate=1 $SCALED
status=$?
[ $status -eq 0 ] && grep -q "timings read from .*calibration.txt" "$WORK/scaled.log" &&
    ! grep -q "^calibration: timing" "$WORK/scaled.log"
tap_result $? "a second run in the folder reads the timings" "$(grep -i calibrat "$WORK/scaled.log")"

run_aldit 1 deep run.device=cuda run.steps=2 model.num_layers=$LAYERS balance.calibrate=1; status=$?
log="$WORK/deep.log"
[ $status -eq 0 ] && grep -q "timed on the GPU .* on 1 and 2 blocks, all at $LAYERS blocks, in .* s" "$log" &&
    grep -q "^             misfit of the scaling at $LAYERS blocks: worst [-+][0-9.]*% (.*) of the 6 cheapest shapes timed there; none scaled; worst [0-9.]*%$" "$log"
tap_result $? "with the default target every shape is timed at $LAYERS blocks" "$(grep -i calibrat "$log")"
grep "misfit of\|cost model fitted" "$log" | sed 's/^ */# /'
tap_done
