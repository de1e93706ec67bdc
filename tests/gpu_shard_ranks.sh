#!/bin/sh
# gpu_shard_ranks.sh — tests/gpu_shard on 2 MPI ranks with a GPU each: every [train] shard mode's device state is the
# formula at 2 ranks and its 5 steps give the losses of none at 2 ranks (rank 0 with 2 micro-batches on odd steps, so
# rank 1 replays a round). Skipped where fewer than 2 GPUs are visible.
. "${top_srcdir:-.}/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
n_gpus=0
probe="${top_builddir:-.}/tests/gpu_present"
if [ -x "$probe" ]; then n_gpus=$("$probe" 2> /dev/null) || n_gpus=0; fi
case $n_gpus in ''|*[!0-9]*) n_gpus=0 ;; esac
if [ "$n_gpus" -lt 2 ]; then
    echo "1..0 # SKIP $n_gpus GPU(s) visible, 2 needed"
    [ "${CMOCKA_MESSAGE_OUTPUT:-}" = TAP ] && exit 0   # make check: a skipped plan; by hand: automake's 77
    exit 77
fi
tap_plan 1
log="${TMPDIR:-/tmp}/gpu_shard_ranks.$$.log"
env CMOCKA_MESSAGE_OUTPUT=stdout $MPIEXEC -np 2 "${top_builddir:-.}/tests/gpu_shard" > "$log" 2>&1; status=$?
tap_result "$status" "every shard mode on 2 GPU ranks: the state formula to the byte, losses of none within 1e-6" \
    "$(cat "$log")"
grep '^# ' "$log" | sort -u
rm -f "$log"
tap_done
