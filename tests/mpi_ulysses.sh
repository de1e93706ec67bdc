#!/bin/sh
# mpi_ulysses.sh — the CPU model's sequence parallelism under MPI on 1, 2 and 4 ranks (test_mpi_ulysses compares the
# groups of k = 2 and 4 with k = 1; on 1 rank it has no group to run and says so).
. "$top_srcdir/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
tap_plan 3
for n in 1 2 4; do
    out=$($MPIEXEC -np $n --oversubscribe ./tests/test_mpi_ulysses 2>&1); status=$?
    printf '%s\n' "$out" | sed 's/^/# /'
    if [ $status -eq 0 ] && ! printf '%s\n' "$out" | grep -q '^not ok'; then ran=0; else ran=1; fi
    tap_result $ran "$n rank(s): groups of 2 and 4 (where they fit) give k = 1's loss and gradients within 1e-6" "$out"
done
tap_done
