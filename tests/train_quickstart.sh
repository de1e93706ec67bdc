#!/bin/sh
# train_quickstart.sh — end to end on 2 CPU ranks: --check, a short run (metrics, falling loss, final
# checkpoint), [model] init from it, and the errors a user meets first (init shape, unreadable checkpoint,
# run dir, option, store, a corrupt sample); device = cuda without a GPU is in train_gpu.sh.
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=60
tap_plan 21

tap_ok "aldit-store synth makes the test store" make_store

run_check() { $MPIEXEC -np 2 --oversubscribe "$ALDIT" --check "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/check" "$@"; }
out=$(run_check 2>&1); status=$?
tap_is "--check exits 0" "$status" 0
case $out in *"activation budget"*"steps per epoch"*) found=0 ;; *) found=1 ;; esac
tap_result $found "--check prints the resolved deck and the plan" "$out"

run_aldit 2 run run.steps=$STEPS; status=$?
tap_is "2-rank run exits 0" "$status" 0
tap_is "one metrics line per step" "$(metrics_lines run)" "$STEPS"

missing=
for key in step epoch loss lr grad_norm samples tokens step_s compute_s_max compute_s_mean imbalance \
           imbalance_pred data_wait_s mem_peak mem_budget; do
    grep -q "\"$key\": " "$WORK/run/metrics.jsonl" || missing="$missing $key"
done
tap_is "metrics lines carry every documented key" "$missing" ""

losses "$WORK/run/metrics.jsonl" > "$WORK/losses"
awk 'BEGIN { bad = 0 } { if ($2 !~ /^[0-9.eE+-]+$/) bad++ } END { exit bad > 0 || NR == 0 }' "$WORK/losses"
tap_result $? "every loss is finite" "$(head -5 "$WORK/losses")"
awk -v n="$STEPS" 'NR <= 10 { first += $2 } NR > n - 10 { last += $2 }
     END { printf "first 10: %g, last 10: %g\n", first / 10, last / 10; exit !(last < 0.9 * first) }' \
    "$WORK/losses" > "$WORK/falling" 2>&1
tap_result $? "the loss falls (mean of the last 10 steps < 0.9 x the first 10)" "$(cat "$WORK/falling")"
tap_ok "a final checkpoint is written" test -f "$WORK/run/checkpoints/step_$(printf %08d $STEPS).h5"

# the CPU's mem_peak is the activations' growth (the state's zeroed arrays are resident before its baseline): at dim
# 256 within 25% of the memory model's largest prediction, where the state (41 MiB) would put it 2.7x over
run_aldit 1 mem run.steps=3 model.dim=256 model.ffn_dim=512 model.num_heads=4 run.threads=1; status=$?
awk -v status="$status" 'match($0, /"mem_peak": [0-9.e+]+/) { p = substr($0, RSTART + 12, RLENGTH - 12) + 0; if (p > peak) peak = p }
     match($0, /"mem_pred": [0-9.e+]+/) { q = substr($0, RSTART + 12, RLENGTH - 12) + 0; if (q > pred) pred = q }
     END { printf "exit %d, peak %.0f, predicted %.0f bytes\n", status, peak, pred
           exit !(status == 0 && pred > 0 && peak <= 1.25 * pred && peak >= 0.5 * pred) }' \
    "$WORK/mem/metrics.jsonl" > "$WORK/mem.check" 2>&1
tap_result $? "CPU mem_peak within 25% of the memory model's prediction (dim 256)" "$(cat "$WORK/mem.check")"

final="$WORK/run/checkpoints/step_$(printf %08d $STEPS).h5"
run_aldit 2 init model.init="$final" run.steps=1; status=$?
tap_is "[model] init = a checkpoint exits 0" "$status" 0
fresh=$(losses "$WORK/run/metrics.jsonl" | awk 'NR == 1 { print $2 }')
warm=$(losses "$WORK/init/metrics.jsonl" | awk 'NR == 1 { print $2 }')
awk -v warm="$warm" -v fresh="$fresh" 'BEGIN { exit !(warm != "" && warm < fresh) }'
tap_result $? "it starts from the trained weights (first loss $warm < $fresh from random init)"
run_aldit 2 badinit model.init="$final" model.ffn_dim=48 run.steps=1; status=$?
case $status:$(cat "$WORK/badinit.log") in 2:*"ffn.0.weight has shape [64, 32] in the file, the model expects [48, 32]"*) found=0 ;; *) found=1 ;; esac
tap_result $found "init weights of another shape: exit 2 naming the parameter and both shapes" "$(cat "$WORK/badinit.log")"
out=$(run_check model.init="$final" model.ffn_dim=48 2>&1); status=$?
case $status:$out in 2:*"ffn.0.weight has shape [64, 32] in the file, the model expects [48, 32]"*) found=0 ;; *) found=1 ;; esac
tap_result $found "--check finds the same before any step" "$out"
out=$(run_check model.init="$WORK/nosuch.h5" 2>&1); status=$?
case $status:$out in 2:*"nosuch.h5: cannot open ([model] init): No such file or directory"*) found=0 ;; *) found=1 ;; esac
tap_result $found "--check with a missing [model] init: exit 2 naming it" "$out"

mkdir -p "$WORK/cut/checkpoints"
head -c 4096 "$final" > "$WORK/cut/checkpoints/step_$(printf %08d $STEPS).h5"
run_aldit 2 cut run.steps=$((STEPS + 1)); status=$?
case $status:$(cat "$WORK/cut.log") in 2:*"none of the 1 checkpoint(s) in $WORK/cut/checkpoints can be read"*) found=0 ;; *) found=1 ;; esac
tap_result $found "only a truncated checkpoint to resume from: exit 2 naming the folder, no fresh start" "$(cat "$WORK/cut.log")"

: > "$WORK/plainfile"
$MPIEXEC -np 2 --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/plainfile" \
    > "$WORK/plainfile.log" 2>&1; status=$?
case $status:$(cat "$WORK/plainfile.log") in 2:*"cannot create the run folder $WORK/plainfile ([run] dir): Not a directory"*) found=0 ;; *) found=1 ;; esac
tap_result $found "[run] dir naming a file: exit 2 naming it" "$(cat "$WORK/plainfile.log")"

run_aldit 2 nostore data.store="$WORK/missing.h5"; status=$?
tap_is "a missing store exits 2" "$status" 2

# one stored latent bit flipped (still finite): [data] verify (on by default) stops the run at that sample
cp "$WORK/store.h5" "$WORK/damaged.h5"
"$top_builddir/tests/store_damage" "$WORK/damaged.h5" 5
# run_damaged RUN [section.key=value ...]: one epoch over the damaged store into $WORK/RUN (log $WORK/RUN.log)
run_damaged() {
    run=$1; shift
    $MPIEXEC -np 2 --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/damaged.h5" run.dir="$WORK/$run" \
        run.epochs=1 run.steps=0 "$@" > "$WORK/$run.log" 2>&1
}
run_damaged damaged; status=$?
case $status:$(cat "$WORK/damaged.log") in 2:*"damaged.h5: sample 5: checksum mismatch"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a store sample whose bytes changed: exit 2 naming the store and the sample" "$(tail -5 "$WORK/damaged.log")"
run_damaged unverified data.verify=off; status=$?
tap_is "with [data] verify = off the same run completes" "$status" 0
$MPIEXEC -np 2 --oversubscribe "$ALDIT" --bogus "$TRAIN_DECK" > "$WORK/usage.log" 2>&1; status=$?
case $status:$(cat "$WORK/usage.log") in 2:*"unknown option '--bogus'"*) found=0 ;; *) found=1 ;; esac
tap_result $found "an unknown option exits 2 naming it" "$(cat "$WORK/usage.log")"
tap_done
