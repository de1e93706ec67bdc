#!/bin/sh
# train_watchdog.sh — a stalled rank (rank 1 stopped with SIGSTOP mid-run, 2 CPU ranks): with [run] step_timeout
# = 2 s the job ends within seconds, exit != 0, rank 0 naming rank 1; rank 0 does not spin on a core meanwhile.
# The same inside a checkpoint's save (shard = full, rank 1 stopped as the .tmp appears: the previous checkpoint
# stays the newest and resumable, the .tmp is never renamed in) and inside a resume's load (issue 35.1).
. "${top_srcdir:-.}/tests/train_lib.sh"
tap_plan 8

tap_ok "aldit-store synth makes the test store" make_store
start_aldit 2 stall run.steps=100000 log.every=1000 run.step_timeout=2
wait_for 60 has_lines stall 3
rank0=$(rank_pid stall $launcher 0)
rank1=$(rank_pid stall $launcher 1)
kill -STOP "$rank1"
cpu_before=$(awk '{ print $14 + $15 }' "/proc/$rank0/stat")
stopped=$(date +%s)
sleep 1.5
cpu_after=$(awk '{ print $14 + $15 }' "/proc/$rank0/stat" 2>/dev/null)
# the watchdog must end the job: after 60 s it is a hang, and the test ends it
launcher_gone() { ! kill -0 $launcher 2>/dev/null; }
wait_for 60 launcher_gone || kill -KILL $launcher $rank0 2>/dev/null
wait $launcher; status=$?
took=$(($(date +%s) - stopped))
kill -CONT "$rank1" 2>/dev/null; kill -KILL "$rank1" 2>/dev/null
test "$status" -ne 0 -a "$took" -le 20
tap_result $? "the job ends, exit != 0 ($status), within 20 s of the stall ($took s)" "$(tail -5 "$WORK/stall.log")"
grep -q "aldit: error: step [0-9]* (\[run\] step_timeout = 2 s): rank 1 (of 2) has not arrived by the deadline" "$WORK/stall.log"
tap_result $? "rank 0 names rank 1" "$(grep aldit "$WORK/stall.log")"
# clock ticks (1/100 s) rank 0 used in the 1.5 s after the stall: its wait sleeps (polling only the first 50 ms)
test -n "$cpu_after" && test $((cpu_after - cpu_before)) -lt 75
tap_result $? "rank 0 waits without holding a core ($((cpu_after - cpu_before)) ticks in 1.5 s)"
# stop_rank1_and_wait: SIGSTOP rank 1 of run "save", wait up to 60 s for the job to end; $status, $took (seconds)
stop_rank1_and_wait() {
    kill -STOP "$rank1"
    stopped=$(date +%s)
    wait_for 60 launcher_gone || kill -KILL $launcher $(run_pids save $launcher) 2>/dev/null
    wait $launcher; status=$?
    took=$(($(date +%s) - stopped))
    kill -CONT "$rank1" 2>/dev/null; kill -KILL "$rank1" 2>/dev/null
}
# issue 35.1: rank 1 stopped inside a checkpoint's save (a model large enough that the save takes ~0.5 s)
BIG="model.dim=512 model.ffn_dim=2048 model.num_heads=4 model.num_layers=4 train.shard=full run.step_timeout=4 run.device=cpu"
start_aldit 2 save run.steps=100000 log.every=1000 checkpoint.every=2 $BIG
tmp_there() { [ -e "$WORK/save/checkpoints/step_00000004.h5.tmp" ]; }
found_rank1() { rank1=$(rank_pid save $launcher 1); [ -n "$rank1" ]; }
wait_for 60 found_rank1
wait_for 60 tmp_there
stop_rank1_and_wait
grep -q "aldit: error: checkpoint of step 4 (a deadline of 4 s for each tensor, from \[run\] step_timeout): rank 1 (of 2) has not arrived by the deadline" "$WORK/save.log" &&
    test "$status" -ne 0 -a "$took" -le 20
tap_result $? "stopped in a checkpoint's save: exit != 0 ($status) within 20 s ($took s), rank 0 naming rank 1" \
    "$(grep aldit "$WORK/save.log" | tail -5)"
test ! -e "$WORK/save/checkpoints/step_00000004.h5" -a -e "$WORK/save/checkpoints/step_00000002.h5"
tap_result $? "the stalled checkpoint was never renamed in; step 2's is the newest" "$(ls "$WORK/save/checkpoints")"
out=$($MPIEXEC -np 2 --oversubscribe "$ALDIT" --check "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/save" \
    run.steps=100000 $BIG 2>&1)
tap_result $? "--check passes the run folder: step 2's checkpoint is whole" "$out"

# rank 1 stopped inside the resume's load of that checkpoint (rank 0 has printed its summary's head)
start_aldit 2 save run.steps=100000 log.every=1000 $BIG
head_printed() { grep -q "^aldit .*: training" "$WORK/save.log"; }
wait_for 60 found_rank1
wait_for 60 head_printed
stop_rank1_and_wait
grep -q "aldit: error: resume: loading the checkpoint's state (a deadline of 12 s for each tensor, from \[run\] step_timeout): rank 1 (of 2) has not arrived" "$WORK/save.log" &&
    test "$status" -ne 0 -a "$took" -le 30
tap_result $? "stopped in a resume's load: exit != 0 ($status) within 30 s ($took s), rank 0 naming rank 1" \
    "$(grep aldit "$WORK/save.log" | tail -5)"
tap_done
