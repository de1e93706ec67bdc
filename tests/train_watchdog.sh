#!/bin/sh
# train_watchdog.sh — a stalled rank (rank 1 stopped with SIGSTOP mid-run, 2 CPU ranks): with [run] step_timeout
# = 2 s the job ends within seconds, exit != 0, rank 0 naming rank 1; rank 0 does not spin on a core meanwhile.
# The same inside a checkpoint's save (shard = full: the previous checkpoint stays the newest and resumable, the .tmp
# is never renamed in), inside a resume's load (issue 35.1) and inside the start-up (the device's start), where rank
# 1 stops itself (the test hook ALDIT_TEST_STOP, watchdog.h) so that the place does not hang on the machine's load;
# and stopped from outside once the summary's head is printed (it hung in the start-up's unwatched allgather); and
# rank 0's main thread hung outside any collective (ALDIT_TEST_STOP=0:hang:3), reported by its backstop thread; and a
# one-rank job hung in a checkpoint's save (ALDIT_TEST_STOP=0:hangsave:4), ended by the backstop with step 2's intact.
# Each stall's bound follows from the deadline rank 0 waits (D: per wait) and its grace: D + grace + 10 s.
. "${top_srcdir:-.}/tests/train_lib.sh"
tap_plan 13

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
# rank1_stopped RUN: rank 1 of that run ($launcher's) is found ($rank1) and stopped (state T in /proc)
rank1_stopped() {
    rank1=$(rank_pid "$1" $launcher 1)
    [ -n "$rank1" ] && [ "$(cut -d' ' -f3 "/proc/$rank1/stat" 2>/dev/null)" = T ]
}
# wait_stall RUN: wait (60 s) for rank 1 of the run to be stopped, then (60 s) for the job to end; $status, $took
# (seconds from the stop seen to the job's end); the test ends a job that hangs, and rank 1 in every case
wait_stall() {
    wait_for 60 rank1_stopped "$1"
    stopped=$(date +%s)
    wait_for 60 launcher_gone || kill -KILL $launcher $(run_pids "$1" $launcher) 2>/dev/null
    wait $launcher; status=$?
    took=$(($(date +%s) - stopped))
    [ -n "$rank1" ] && { kill -CONT "$rank1" 2>/dev/null; kill -KILL "$rank1" 2>/dev/null; }
}
# named_in_time RUN D WHAT: the job ended with exit != 0 within D + grace + 10 s of the stall (D: the deadline of rank
# 0's wait, grace: D / 4 within [1, 30] s), rank 0 naming rank 1 after waiting D s in WHAT (a grep pattern)
named_in_time() {
    grace=$(($2 / 4 < 1 ? 1 : $2 / 4 > 30 ? 30 : $2 / 4))
    grep -q "aldit: error: $3: rank 1 (of 2) has not arrived by the deadline (waited \($2\|$(($2 + 1))\) s)" "$WORK/$1.log" &&
        test "$status" -ne 0 -a "$took" -le $(($2 + grace + 10))
}
# a model whose steps take ~10 ms (far under the deadlines on a loaded machine) and whose tensors (up to 256 KiB)
# are sent by rendezvous: rank 0 waits for the stopped rank 1 in a resume's load
MID="model.dim=128 model.ffn_dim=512 model.num_heads=4 train.shard=full run.device=cpu"

# issue 35.1: rank 1 stopped inside a checkpoint's save (step 4's; step 2's is written): 4 s for each tensor
export ALDIT_TEST_STOP=1:save:4
start_aldit 2 save run.steps=100000 log.every=1000 checkpoint.every=2 run.step_timeout=4 $MID
unset ALDIT_TEST_STOP
wait_stall save
named_in_time save 4 "checkpoint of step 4 (a deadline of 4 s for each tensor, from \[run\] step_timeout)"
tap_result $? "stopped in a checkpoint's save: exit != 0 ($status) within 15 s ($took s), rank 0 naming rank 1" \
    "$(grep aldit "$WORK/save.log" | tail -5)"
test ! -e "$WORK/save/checkpoints/step_00000004.h5" -a -e "$WORK/save/checkpoints/step_00000004.h5.tmp" \
    -a -e "$WORK/save/checkpoints/step_00000002.h5"
tap_result $? "the stalled checkpoint was never renamed in (its .tmp stays); step 2's is the newest" \
    "$(ls "$WORK/save/checkpoints")"
out=$($MPIEXEC -np 2 --oversubscribe "$ALDIT" --check "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/save" \
    run.steps=100000 $MID 2>&1)
tap_result $? "--check passes the run folder: step 2's checkpoint is whole" "$out"

# rank 1 stopped inside the resume's load of that checkpoint: 3 x 2 s for each tensor
export ALDIT_TEST_STOP=1:load
start_aldit 2 save run.steps=100000 log.every=1000 run.step_timeout=2 $MID
unset ALDIT_TEST_STOP
wait_stall save
named_in_time save 6 "resume: loading the checkpoint's state (a deadline of 6 s for each tensor, from \[run\] step_timeout)"
tap_result $? "stopped in a resume's load: exit != 0 ($status) within 17 s ($took s), rank 0 naming rank 1" \
    "$(grep aldit "$WORK/save.log" | tail -5)"

# rank 1 stopped in the start-up, at the device's start (shard = full gathers the weights there): 3 x 2 s a wait
export ALDIT_TEST_STOP=1:start
start_aldit 2 start run.steps=100000 log.every=1000 run.step_timeout=2 $MID
unset ALDIT_TEST_STOP
wait_stall start
named_in_time start 6 "start-up (a deadline of 6 s for each wait, from \[run\] step_timeout)"
tap_result $? "stopped in the start-up: exit != 0 ($status) within 17 s ($took s), rank 0 naming rank 1" \
    "$(grep aldit "$WORK/start.log" | tail -5)"

# rank 1 stopped from outside once rank 0 printed the summary's head: whatever comes next (the start-up, the first
# step) waits at most 3 x 2 s for it
start_aldit 2 head run.steps=100000 log.every=1000 run.step_timeout=2 $MID
found_rank1() { rank1=$(rank_pid head $launcher 1); [ -n "$rank1" ]; }
head_printed() { grep -q "^aldit .*: training" "$WORK/head.log"; }
wait_for 60 found_rank1
wait_for 60 head_printed
kill -STOP "$rank1"
wait_stall head
grep -q "aldit: error: .*: rank 1 (of 2) has not arrived by the deadline" "$WORK/head.log" &&
    test "$status" -ne 0 -a "$took" -le 17
tap_result $? "stopped once the head is printed: exit != 0 ($status) within 17 s ($took s), rank 0 naming rank 1" \
    "$(grep aldit "$WORK/head.log" | tail -5)"

# hung_run RUN HOOK LINES RANKS ARGS...: run RUN on RANKS ranks with ALDIT_TEST_STOP=HOOK, wait for LINES metrics lines
# (the hang comes after), then (60 s) for the job to end; $status, $took (seconds from those lines to the end)
hung_run() {
    run=$1 hook=$2 lines=$3 np=$4; shift 4
    export ALDIT_TEST_STOP=$hook
    start_aldit "$np" "$run" run.steps=100000 log.every=1000 run.step_timeout=2 $MID "$@"
    unset ALDIT_TEST_STOP
    wait_for 60 has_lines "$run" "$lines"
    hung=$(date +%s)
    wait_for 60 launcher_gone || kill -KILL $launcher $(run_pids "$run" $launcher) 2>/dev/null
    wait $launcher; status=$?
    took=$(($(date +%s) - hung))
}

# rank 0's main thread blocked for good before step 3's compute, its other threads running (as in a hung device call):
# no wait reports it (rank 1's deadline is 2 x 2 + 1 + 30 s), the backstop does at 2 + 1 + 10 s from the step's start
hung_run hang 0:hang:3 2 2
grep -q "aldit: error: rank 0: step 3 (\[run\] step_timeout = 2 s): the step has run 1[3-5] s, .* stuck outside" \
    "$WORK/hang.log" && test "$status" -ne 0 -a "$took" -le 25
tap_result $? "rank 0 hung outside a collective: its backstop names it and ends the job, exit != 0 ($status), within 25 s ($took s)" \
    "$(grep aldit "$WORK/hang.log" | tail -5)"

# one rank, its main thread blocked in step 4's checkpoint save (before the first tensor; step 2's is written): no
# other rank can report it, the backstop does at 2 + 1 + 10 s from the save's start
hung_run hangsave 0:hangsave:4 4 1 checkpoint.every=2
grep -q "aldit: error: rank 0: checkpoint of step 4 (a deadline of 2 s for each tensor, from \[run\] step_timeout): no tensor done for 1[3-5] s, .* stuck outside" \
    "$WORK/hangsave.log" && test "$status" -ne 0 -a "$took" -le 25
tap_result $? "one rank hung in a checkpoint's save: its backstop names it and ends the job, exit != 0 ($status), within 25 s ($took s)" \
    "$(grep aldit "$WORK/hangsave.log" | tail -5)"
test ! -e "$WORK/hangsave/checkpoints/step_00000004.h5" -a -e "$WORK/hangsave/checkpoints/step_00000002.h5"
tap_result $? "the hung checkpoint was never renamed in; step 2's is the newest" "$(ls "$WORK/hangsave/checkpoints")"
tap_done
