#!/bin/sh
# gpu_ulysses.sh — the GPU model's sequence parallelism on 2 and 4 GPU ranks (test_cuda_ulysses: groups of k = 2 and 4
# against k = 1, summed over the group, within test_cuda_model's bf16 tolerances). Each rank count is skipped where
# tests/gpu_present reports fewer GPU ranks. ULYSSES_PROGRAM names another such test program (tests/gpu_mmdit_ulysses.sh:
# test_cuda_mmdit_ulysses, HunyuanVideo-1.5's GPU model).
. "${top_srcdir:-.}/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
n_gpus=0
probe="${top_builddir:-.}/tests/gpu_present"
if [ -x "$probe" ]; then n_gpus=$("$probe" 2> /dev/null) || n_gpus=0; fi
case $n_gpus in ''|*[!0-9]*) n_gpus=0 ;; esac
tap_plan 2
for n in 2 4; do
    if [ "$n_gpus" -lt "$n" ]; then
        tap_result 0 "$n GPU ranks: groups of 2$([ $n -ge 4 ] && echo ' and 4') # SKIP $n_gpus GPU rank(s) possible, $n needed"
        continue
    fi
    out=$($MPIEXEC -np $n --oversubscribe "${top_builddir:-.}/tests/${ULYSSES_PROGRAM:-test_cuda_ulysses}" 2>&1); status=$?
    printf '%s\n' "$out" | sed 's/^/# /'
    if [ $status -eq 0 ] && printf '%s\n' "$out" | grep -q '^1\.\.0 # SKIP'; then
        tap_result 0 "$n GPU ranks # SKIP $(printf '%s\n' "$out" | sed -n 's/^1\.\.0 # SKIP //p' | head -1)"
        continue
    fi
    if [ $status -eq 0 ] && printf '%s\n' "$out" | grep -q '^ok' && ! printf '%s\n' "$out" | grep -q '^not ok'; then
        ran=0
    else
        ran=1
    fi
    tap_result $ran "$n GPU ranks: groups of 2$([ $n -ge 4 ] && echo ' and 4') give k = 1's loss and gradients within bf16 tolerances" "$out"
done
tap_done
