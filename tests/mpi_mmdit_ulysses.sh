#!/bin/sh
# mpi_mmdit_ulysses.sh — HunyuanVideo-1.5's MMDiT on the CPU with sequence parallelism, under MPI on 1, 2 and 4 ranks
# (test_mpi_mmdit_ulysses compares the groups of k = 2 and 4 with k = 1 on every rank; on 1 rank both skip, k = 4
# needs 4 ranks). Training with the family's groups: train_hunyuan_groups.sh.
. "$top_srcdir/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
tap_plan 3
for n in 1 2 4; do
    out=$($MPIEXEC -np $n --oversubscribe ./tests/test_mpi_mmdit_ulysses 2>&1); status=$?
    printf '%s\n' "$out" | sed 's/^/# /'
    if [ $status -eq 0 ] && ! printf '%s\n' "$out" | grep -q '^not ok'; then ran=0; else ran=1; fi
    case $n in 1) what="no group (both skip)" ;; 2) what="groups of 2" ;; *) what="groups of 2 and 4" ;; esac
    tap_result $ran "$n ranks: $what give k = 1's loss and gradients within 1e-6" "$out"
done
tap_done
