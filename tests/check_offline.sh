#!/bin/sh
# check_offline.sh — `aldit --check` planning a GPU job where no GPU is visible (a login node): Wan-14B
# (inputs/wan14b.ini, balance.device_mem an H200's 140 GiB) on 8 ranks with shard = full plans each rank as one GPU of
# device_mem, its state and activation budget are aldit-sim's for the same run (one plan) and at most 32 GiB, and a run (not --check)
# with device = cuda and no GPU is still refused; one rank without room for the state is told to shard over more.
# Runs with CUDA_VISIBLE_DEVICES empty; skips where aldit has no CUDA backend.
. "${top_srcdir:-.}/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
if [ ! -x "${top_builddir:-.}/tests/gpu_present" ]; then
    echo "1..0 # SKIP this build of aldit has no CUDA backend"
    [ "${CMOCKA_MESSAGE_OUTPUT:-}" = TAP ] && exit 0
    exit 77
fi
tap_plan 7
work=$(mktemp -d "${TMPDIR:-/tmp}/check_offline.XXXXXX")
trap 'rm -rf "$work"' EXIT
deck="$top_srcdir/inputs/wan14b.ini"
./aldit-store synth --spec "$top_srcdir/inputs/mixed.lengths" --samples 200 --text-len 64 --text-dim 4096 --seed 11 \
    --out "$work/mixed.h5" > "$work/synth.log" 2>&1
tap_result $? "aldit-store synth makes a 200-sample mixed store" "$(cat "$work/synth.log")"

CUDA_VISIBLE_DEVICES= $MPIEXEC -np 8 --oversubscribe ./aldit --check "$deck" run.device=cuda train.shard=full \
    "data.store=$work/mixed.h5" "run.dir=$work/run" > "$work/check.log" 2>&1
status=$?
grep -q "planned as GPUs of balance.device_mem = 140.0 GiB each, one rank per GPU" "$work/check.log"
tap_result $(( status != 0 || $? != 0 )) "aldit --check on 8 ranks without a GPU plans each as an H200 (exit $status)" \
    "$(tail -n 20 "$work/check.log")"

# the state per rank, GiB: --check's summary line against aldit-sim's JSON for the same deck and ranks
planned=$(sed -n 's/^  state      shard = full over 8 rank(s): \([0-9.]*\) GiB per rank.*/\1/p' "$work/check.log")
./aldit-sim --store "$work/mixed.h5" --ranks 8 --strategy global --json --model "$deck" train.shard=full \
    > "$work/sim.json" 2> "$work/sim.log"
sim=$(tr '{},' '\n\n\n' < "$work/sim.json" | awk -F: '$1 == "\"state_bytes\"" {printf "%.1f", $2 / 1073741824; exit}')
[ -n "$planned" ] && [ "$planned" = "$sim" ]
tap_result $? "the planned state is aldit-sim's: $planned GiB and $sim GiB per rank" "$(cat "$work/sim.log")"
# and the activation budget: aldit-sim plans it with the backend's own plan, as --check does (one answer)
check_budget=$(sed -n 's/^  memory     activation budget \([0-9.]*\) GiB per rank.*/\1/p' "$work/check.log")
sim_budget=$(tr '{},' '\n\n\n' < "$work/sim.json" | awk -F: '$1 == "\"mem_budget_bytes\"" {printf "%.1f", $2 / 1073741824; exit}')
[ -n "$check_budget" ] && [ "$check_budget" = "$sim_budget" ]
tap_result $? "the activation budget is aldit-sim's: $check_budget GiB and $sim_budget GiB per rank" "$(cat "$work/sim.json")"
awk -v s="$planned" 'BEGIN {exit !(s != "" && s + 0 <= 32.0)}'
tap_result $? "Wan-14B's state with full on 8 ranks is at most 32 GiB per rank ($planned GiB)" \
    "$(grep "state " "$work/check.log")"

# one rank cannot hold Wan-14B's state: the error reads plainly and points to [train] shard with more ranks
out=$(CUDA_VISIBLE_DEVICES= $MPIEXEC -np 1 ./aldit --check "$deck" run.device=cuda train.shard=none \
      "data.store=$work/mixed.h5" "run.dir=$work/run" 2>&1); status=$?
case $status:$out in *" on none on "*) found=1 ;; 2:*"set [train] shard = full and run more ranks"*) found=0 ;; *) found=1 ;; esac
tap_result $found "1 rank, Wan-14B, shard = none: exit 2 pointing to [train] shard = full with more ranks" "$out"

CUDA_VISIBLE_DEVICES= ./aldit "$deck" run.device=cuda "data.store=$work/mixed.h5" "run.dir=$work/run" \
    > "$work/run.log" 2>&1
status=$?
grep -q "sees no GPU" "$work/run.log"
tap_result $(( status == 0 || $? != 0 )) "a run with device = cuda and no GPU is refused (exit $status)" \
    "$(cat "$work/run.log")"
tap_done
