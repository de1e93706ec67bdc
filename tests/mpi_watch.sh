#!/bin/sh
# mpi_watch.sh — comm.h's watch on 2 ranks (test_mpi_watch): what rank 0 reports when a deadline passes. A whole-span
# deadline (a step's) passed during the work, every rank answering, is said to be the work outlasting it, with how
# long ago the deadline's count and the wait began (it read "not completed in 0 s of waiting ... the network?"); a
# per-wait deadline, every rank answering, is a collective that does not complete; a rank that does not answer is named.
. "${top_srcdir:-.}/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
tap_plan 3
# stall MODE: the program's output (stderr), exit != 0 required (the job aborts); the times are those of the program's
# pauses (test_mpi_watch.c), with room for a loaded machine
stall() { out=$($MPIEXEC -np 2 --oversubscribe ./tests/test_mpi_watch "$1" 2>&1); status=$?; }
stall step
printf '%s\n' "$out" | grep -q "aldit: error: unit step: past the deadline (the deadline counts from \(0\.[5-9]\|[1-9][0-9]*\.[0-9]\) s ago, this wait began 0\.[0-9] s ago) and every rank answers: the work outlasted the deadline" &&
    test "$status" -ne 0
tap_result $? "a step's deadline passed in its work, every rank answering: the work outlasted it (exit $status)" "$out"
stall each
printf '%s\n' "$out" | grep -q "aldit: error: unit stream: a collective has not completed in [12] s of waiting although every rank answers" &&
    test "$status" -ne 0
tap_result $? "a wait's own deadline passed, every rank answering: the collective did not complete (exit $status)" \
    "$out"
stall stopped
printf '%s\n' "$out" | grep -q "aldit: error: unit step: rank 1 (of 2) has not arrived by the deadline (the deadline counts from \(0\.[5-9]\|[1-9][0-9]*\.[0-9]\) s ago, this wait began 0\.[0-9] s ago) and has not answered in 1 s" &&
    test "$status" -ne 0
tap_result $? "a rank that does not answer is named, with the step's and the wait's time (exit $status)" "$out"
tap_done
