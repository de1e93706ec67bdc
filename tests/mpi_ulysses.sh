#!/bin/sh
# mpi_ulysses.sh — the CPU model's sequence parallelism under MPI on 2 and 4 ranks (test_mpi_ulysses compares the
# groups of k = 2 and 4 with k = 1 on every rank; k = 4 needs 4 ranks). Training with groups: train_groups.sh.
. "$top_srcdir/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
tap_plan 2
for n in 2 4; do
    out=$($MPIEXEC -np $n --oversubscribe ./tests/test_mpi_ulysses 2>&1); status=$?
    printf '%s\n' "$out" | sed 's/^/# /'
    if [ $status -eq 0 ] && ! printf '%s\n' "$out" | grep -q '^not ok'; then ran=0; else ran=1; fi
    tap_result $ran "$n ranks: groups of 2$([ $n -ge 4 ] && echo ' and 4') give k = 1's loss and gradients within 1e-6" "$out"
done
tap_done
