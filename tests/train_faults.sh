#!/bin/sh
# train_faults.sh — faults a week-long job meets, on 2 CPU ranks: checkpoints that keep failing stop the run
# ([checkpoint] max_failures) with whole metrics lines, the last good checkpoint kept and a torn line repaired
# on resume; [checkpoint] interval; [train] max_skipped; [data] on_corrupt (checkpoint first, or skip and
# count); SIGINT and SIGHUP checkpoint and exit 0 like SIGTERM.
. "${top_srcdir:-.}/tests/train_lib.sh"
command -v prlimit > /dev/null 2>&1 || tap_skip_all "prlimit (util-linux) is not installed"
tap_plan 18

tap_ok "aldit-store synth makes the test store" make_store

# 1. Rank 0's files are limited (RLIMIT_FSIZE, set after start-up) to the metrics file's size plus less than a
# line: every later checkpoint fails ("File too large") and so does every metrics line.
# a wider model than the deck's (about 45 ms a step here instead of 7), so the limit lands well before step 20
WIDER="model.dim=128 model.ffn_dim=256 model.num_heads=4 model.num_layers=4"
start_aldit 2 full run.steps=60 checkpoint.every=10 checkpoint.keep=10 checkpoint.max_failures=3 log.every=100 $WIDER
wait_for 60 test -f "$WORK/full/checkpoints/step_00000010.h5"
rank0=$(rank_pid full $launcher 0)
size=$(wc -c < "$WORK/full/metrics.jsonl")
prlimit --pid "$rank0" --fsize=$((size + 200)) > "$WORK/prlimit.log" 2>&1
limited=$?
wait $launcher; status=$?
log=$(cat "$WORK/full.log")
# (exit != 0: 1, or a crash inside HDF5 at exit on main's checkpoint writer, which leaves the failed file open)
[ "$status" -ne 0 ] && status=nonzero
case $limited:$status:$log in
    0:nonzero:*"3 checkpoints in a row failed (step 40 the last"*"the last good checkpoint is $WORK/full/checkpoints/step_00000010.h5"*) found=0 ;;
    *) found=1 ;;
esac
tap_result $found "3 failed checkpoints in a row: exit != 0 at step 40 naming the last good one" "$(cat "$WORK/prlimit.log"; tail -20 "$WORK/full.log")"
case $log in *"File too large"*) found=0 ;; *) found=1 ;; esac
tap_result $found "errno's text reaches the log (File too large: the metrics warning; the checkpoint writer names its own reason)" "$(grep -i 'aldit\|error' "$WORK/full.log" | head -20)"
lines=$(metrics_lines full)
# the limit lands while the run goes on: at step 10 or a little later, but before step 20's checkpoint (which failed)
whole_lines "$WORK/full/metrics.jsonl" && [ "$lines" -ge 10 ] && [ "$lines" -le 20 ]
tap_result $? "metrics.jsonl holds whole lines only after its writes failed ($lines lines)" "$(tail -c 300 "$WORK/full/metrics.jsonl")"
test -f "$WORK/full/checkpoints/step_00000010.h5" && ! ls "$WORK"/full/checkpoints/*.tmp > /dev/null 2>&1
tap_result $? "the last good checkpoint stays, no temporary file" "$(ls -l "$WORK/full/checkpoints")"
printf '{"step": 3, "epoch": 0, "loss": 1.2' >> "$WORK/full/metrics.jsonl" # a line torn by a crash
run_aldit 2 full run.steps=60 checkpoint.every=10 checkpoint.keep=10 log.every=100 $WIDER; status=$?
tap_is "restarted without the limit it exits 0" "$status" 0
grep -q "resumed .*step_00000010.h5 at step 10" "$WORK/full.log"
tap_result $? "it resumed from the last good checkpoint" "$(head -12 "$WORK/full.log")"
whole_lines "$WORK/full/metrics.jsonl" && [ "$(metrics_lines full)" -eq 60 ] \
    && [ "$(losses "$WORK/full/metrics.jsonl" | awk '{ print $1 }' | sort -n | uniq | wc -l)" -eq 60 ]
tap_result $? "the resumed run dropped the torn line: 60 whole lines, one per step" "$(head -c 300 "$WORK/full/metrics.jsonl")"

# 2. [checkpoint] interval: due at every step boundary with a tiny interval, decided by rank 0 for both ranks
run_aldit 2 interval run.steps=5 checkpoint.interval=1e-9 checkpoint.keep=100; status=$?
tap_is "[checkpoint] interval = 1e-9 exits 0" "$status" 0
tap_is "a checkpoint at every step" "$(ls "$WORK/interval/checkpoints" | tr '\n' ' ')" \
    "step_00000001.h5 step_00000002.h5 step_00000003.h5 step_00000004.h5 step_00000005.h5 "

# 5. [train] max_skipped: lr 10 with weight decay 10 multiplies the weights by -99 a step until they overflow
run_aldit 2 skipping run.steps=60 train.lr=10 train.weight_decay=10 train.warmup_steps=0 train.nonfinite=skip \
    train.max_skipped=3; status=$?
case $status:$(cat "$WORK/skipping.log") in 1:*"3 steps in a row skipped for a non-finite loss or gradient ([train] max_skipped = 3)"*) found=0 ;; *) found=1 ;; esac
tap_result $found "nonfinite = skip stops after max_skipped skipped steps in a row, exit 1" "$(tail -5 "$WORK/skipping.log")"

# 6. [data] on_corrupt: one stored latent bit of sample 5 flipped ([data] verify finds it)
cp "$WORK/store.h5" "$WORK/damaged.h5"
"$top_builddir/tests/store_damage" "$WORK/damaged.h5" 5
# run_damaged [section.key=value ...]: one epoch over the damaged store into $WORK/corrupt (log $WORK/corrupt.log)
run_damaged() {
    $MPIEXEC -np 2 --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/damaged.h5" run.dir="$WORK/corrupt" \
        run.steps=0 run.epochs=1 "$@" > "$WORK/corrupt.log" 2>&1
}
run_damaged; status=$?
at=$(sed -n 's/^aldit: error: step \([0-9]*\): 1 sample(s) of the store .* cannot be read (sample 5 .*/\1/p' "$WORK/corrupt.log")
case $status:$at in 2:[0-9]*) found=0 ;; *) found=1 ;; esac
tap_result $found "on_corrupt = error: exit 2 naming the sample and the step" "$(tail -8 "$WORK/corrupt.log")"
healthy=$(printf %08d $((${at:-1} - 1)))
test "${at:-1}" -gt 1 && test -f "$WORK/corrupt/checkpoints/step_$healthy.h5"
tap_result $? "it checkpointed the healthy model of the step before (step_$healthy.h5)" "$(ls -l "$WORK/corrupt/checkpoints" 2>&1)"
run_damaged data.on_corrupt=skip; status=$?
tap_is "restarted with on_corrupt = skip it completes the epoch" "$status" 0
log=$(cat "$WORK/corrupt.log")
case $log in *"resumed "*"step_$healthy.h5"*"leaving out sample 5 of the store"*"1 corrupt sample(s) left out"*) found=0 ;; *) found=1 ;; esac
tap_result $found "it resumed there, warned naming the sample and counted it in the summary" "$log"
tail -1 "$WORK/corrupt/metrics.jsonl" | grep -q '"corrupt_samples": 1,'
tap_result $? "the count is in metrics.jsonl" "$(tail -1 "$WORK/corrupt/metrics.jsonl")"

# 7. SIGINT and SIGHUP, sent to the ranks, stop the run like SIGTERM: a checkpoint of the last step, exit 0
for signal in INT HUP; do
    start_aldit 2 sig$signal run.steps=20000 log.every=100   # far more steps than run before the signal lands
    wait_for 60 has_lines sig$signal 5
    ranks=$(run_pids sig$signal $launcher)
    kill -$signal ${ranks:-$launcher}
    wait $launcher; status=$?
    stopped_at=$(metrics_lines sig$signal)
    test "$status" -eq 0 -a "$stopped_at" -lt 20000 -a -f "$WORK/sig$signal/checkpoints/step_$(printf %08d "$stopped_at").h5"
    tap_result $? "SIG$signal: exit 0 with a checkpoint of the step it stopped at ($stopped_at)" \
        "exit $status; $(tail -5 "$WORK/sig$signal.log")"
done
tap_done
