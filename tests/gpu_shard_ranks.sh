#!/bin/sh
# gpu_shard_ranks.sh — tests/gpu_shard on 2 and 3 MPI ranks with a GPU each, or sharing the GPUs where NCCL lets ranks share one (tests/gpu_present counts the GPU ranks the node can run): every [train] shard mode's device state is the formula at that rank count and its 5 steps give the losses of none (rank 0 with 2 micro-batches on odd steps, so the others replay a round). Each rank count is skipped where the node cannot run it.
. "${top_srcdir:-.}/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
n_gpus=0
probe="${top_builddir:-.}/tests/gpu_present"
if [ -x "$probe" ]; then n_gpus=$("$probe" 2> /dev/null) || n_gpus=0; fi
case $n_gpus in ''|*[!0-9]*) n_gpus=0 ;; esac
tap_plan 2
log="${TMPDIR:-/tmp}/gpu_shard_ranks.$$.log"
for np in 2 3; do
    if [ "$n_gpus" -lt "$np" ]; then
        tap_result 0 "every shard mode on $np GPU ranks # SKIP $n_gpus GPU rank(s) possible on this node, $np needed"
        continue
    fi
    env CMOCKA_MESSAGE_OUTPUT=stdout $MPIEXEC --oversubscribe -np $np "${top_builddir:-.}/tests/gpu_shard" > "$log" 2>&1
    status=$?
    tap_result "$status" "every shard mode on $np GPU ranks: the state formula to the byte, losses of none within the bounds" \
        "$(cat "$log")"
    grep '^# ' "$log" | sort -u
done
rm -f "$log"
tap_done
