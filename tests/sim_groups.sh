#!/bin/sh
# sim_groups.sh — the balancer's sequence-parallel groups ([balance] sp) end to end: aldit-sim at a fixed batch with
# groups balances within 5% and 1.1x its bound where equal_tokens does not; sp = off prints no groups; a Wan-14B 720p
# 10 s clip (41 x 90 x 160 latents, 147,600 tokens) over one H200's memory is refused with sp = off and planned on a
# group of 2 with sp = auto; aldit --check on 2 CPU ranks prints the groups a step uses.
. "$top_srcdir/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
spec="$top_srcdir/inputs/mixed.lengths"
tap_plan 8
work=$(mktemp -d "${TMPDIR:-/tmp}/sim_groups.XXXXXX")
trap 'rm -rf "$work"' EXIT

# value KEY: the number after "KEY": in the JSON line on stdin
value() { tr '{},' '\n\n\n' | awk -F: -v k="\"$1\"" '$1 == k {print $2; exit}'; }

./aldit-sim --spec "$spec" --model "$top_srcdir/inputs/wan1.3b.ini" --ranks 8 --samples 6400 --seed 7 --json \
    balance.global_batch=102 balance.sp=auto > "$work/mixed.json" 2>&1
tap_is "aldit-sim with balance.sp=auto: exit 0, three strategies" "$?:$(grep -c '^{"strategy"' "$work/mixed.json")" "0:3"
global=$(grep '"strategy":"global"' "$work/mixed.json")
baseline=$(grep '"strategy":"equal_tokens"' "$work/mixed.json")
awk -v i="$(echo "$global" | value imbalance)" -v e="$(echo "$global" | value epoch_time)" \
    -v b="$(echo "$global" | value lower_bound)" -v s="$(echo "$global" | value steps)" \
    -v eb="$(echo "$baseline" | value epoch_time)" -v sb="$(echo "$baseline" | value steps)" \
    'BEGIN {exit !(i <= 0.05 && e <= 1.1 * b && s == sb && eb >= 1.6 * e)}'
tap_result $? "8 ranks, the baseline's 63 steps: imbalance <= 5%, epoch <= 1.1x the bound, >= 1.6x equal_tokens' speed" \
    "$global
$baseline"
k2=$(echo "$global" | value k2_per_step); k4=$(echo "$global" | value k4_per_step)
awk -v a="$k2" -v b="$k4" -v m="$(echo "$global" | value sp_max)" 'BEGIN {exit !(m == 4 && a > 0 && b > 0)}'
tap_result $? "groups of 2 and 4 ranks run some samples (12 heads: at most 4)" "$global"

./aldit-sim --spec "$spec" --model "$top_srcdir/inputs/wan1.3b.ini" --ranks 8 --samples 2000 --seed 7 \
    --strategy global balance.global_batch=102 > "$work/off.txt" 2>&1
tap_is "sp = off (the default): exit 0 and no groups line" "$?:$(grep -c 'groups (sp' "$work/off.txt")" "0:0"

# the Wan-14B 720p 10-second clip: 104.7 GiB of activations, over the 95.9 GiB an H200 leaves beside the full-sharded
# state on 8 ranks
printf '1 41 90 160\n' > "$work/720p.lengths"
./aldit-sim --spec "$work/720p.lengths" --model "$top_srcdir/inputs/wan14b.ini" --ranks 8 --samples 16 \
    --strategy global train.shard=full balance.device_mem=141GiB > "$work/14b_off.txt" 2>&1
status=$?
tap_is "Wan-14B 147,600-token clip with sp = off: exit 2 naming it" \
    "$status:$(grep -c 'sample 0: 147600 tokens' "$work/14b_off.txt")" "2:1"
./aldit-sim --spec "$work/720p.lengths" --model "$top_srcdir/inputs/wan14b.ini" --ranks 8 --samples 16 --json \
    --strategy global train.shard=full balance.device_mem=141GiB balance.sp=auto > "$work/14b.json" 2>&1
status=$?
line=$(grep '"strategy":"global"' "$work/14b.json")
tap_is "with sp = auto it is planned: exit 0, all 16 on groups of 2 (8 per step), none alone, sp up to 8 (40 heads)" \
    "$status:$(echo "$line" | value k1_per_step):$(echo "$line" | value k2_per_step):$(echo "$line" | value sp_max)" \
    "0:0.0000:8.0000:8"

./aldit-store synth --spec "$top_srcdir/tests/decks/train_tiny.lengths" --samples 60 --text-len 16 --text-dim 16 \
    --seed 3 --out "$work/store.h5" > "$work/synth.log" 2>&1
$MPIEXEC -np 2 --oversubscribe ./aldit --check "$top_srcdir/tests/decks/train_small.ini" "data.store=$work/store.h5" \
    "run.dir=$work/run" balance.sp=auto > "$work/check.log" 2>&1
status=$?
tap_is "aldit --check on 2 CPU ranks with sp = auto: exit 0, a groups line with k=1 and k=2" \
    "$status:$(grep -c '^  groups     sp up to 2 ranks: k=1 [0-9.]*, k=2 [0-9.]* samples per step' "$work/check.log")" "0:1"
$MPIEXEC -np 2 --oversubscribe ./aldit --check "$top_srcdir/tests/decks/train_small.ini" "data.store=$work/store.h5" \
    "run.dir=$work/run" > "$work/check_off.log" 2>&1
tap_is "aldit --check with sp = off: exit 0, no groups line" "$?:$(grep -c '^  groups ' "$work/check_off.log")" "0:0"
tap_done
