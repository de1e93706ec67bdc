#!/bin/sh
# train_watchdog.sh — a stalled rank (rank 1 stopped with SIGSTOP mid-run, 2 CPU ranks): with [run] step_timeout
# = 2 s the job ends within seconds, exit != 0, rank 0 naming rank 1; rank 0 does not spin on a core meanwhile.
. "${top_srcdir:-.}/tests/train_lib.sh"
tap_plan 4

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
tap_done
