#!/bin/sh
# train_resume.sh — a 2-rank run stopped by SIGUSR1 (sent to its ranks) checkpoints and exits 0; restarted, it
# ends with per-step losses bit-identical to an uninterrupted run.
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=240
STOP_AFTER=20
tap_plan 8

tap_ok "aldit-store synth makes the test store" make_store
run_aldit 2 whole run.steps=$STEPS balance.global_batch=16; status=$?
tap_is "uninterrupted run exits 0" "$status" 0

$MPIEXEC -np 2 --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/stopped" \
    run.steps=$STEPS balance.global_batch=16 > "$WORK/stopped.log" 2>&1 &
launcher=$!
waited=0
while [ "$(metrics_lines stopped)" -lt $STOP_AFTER ] && kill -0 $launcher 2>/dev/null && [ $waited -lt 3000 ]; do
    sleep 0.02
    waited=$((waited + 1))
done
# The signal goes to the ranks themselves, as Slurm's `scancel --signal=USR1` sends it: a launcher need not
# forward it (Open MPI 4.1.6's mpirun on the GPU machine did not). Where the ranks cannot be found, to the launcher.
ranks=$(run_pids stopped $launcher)
kill -USR1 ${ranks:-$launcher}
wait $launcher; status=$?
tap_is "the run stopped by SIGUSR1 exits 0" "$status" 0
stopped_at=$(metrics_lines stopped)
test "$stopped_at" -ge $STOP_AFTER -a "$stopped_at" -lt $STEPS
tap_result $? "it stopped mid-run (after step $stopped_at of $STEPS)" "$(tail -5 "$WORK/stopped.log")"
checkpoint="$WORK/stopped/checkpoints/step_$(printf %08d "$stopped_at").h5"
test -f "$checkpoint" && ! ls "$WORK"/stopped/checkpoints/*.tmp > /dev/null 2>&1
tap_result $? "a complete checkpoint of the last step, no temporary file" "$(ls -l "$WORK/stopped/checkpoints")"

$MPIEXEC -np 2 --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/stopped" \
    run.steps=$STEPS balance.global_batch=16 > "$WORK/resumed.log" 2>&1; status=$?
tap_is "the restarted run exits 0" "$status" 0
grep -q "resumed .*step_$(printf %08d "$stopped_at").h5 at step $stopped_at" "$WORK/resumed.log"
tap_result $? "it resumed from that checkpoint" "$(head -12 "$WORK/resumed.log")"

losses "$WORK/whole/metrics.jsonl" > "$WORK/whole.losses"
losses "$WORK/stopped/metrics.jsonl" > "$WORK/resumed.losses"
test "$(wc -l < "$WORK/whole.losses")" -eq $STEPS && cmp -s "$WORK/whole.losses" "$WORK/resumed.losses"
tap_result $? "per-step losses bit-identical to the uninterrupted run" \
    "$(diff "$WORK/whole.losses" "$WORK/resumed.losses" | head -10)"
tap_done
