#!/bin/sh
# sim_cli.sh — aldit-sim end to end: JSON per strategy with the documented keys, global balanced within 2%,
# epoch time never below its lower bound, --name=value options, and usage errors with exit status 2 naming
# the option.
. "$top_srcdir/tests/tap.sh"
spec="$top_srcdir/inputs/mixed.lengths"
model="$top_srcdir/inputs/wan1.3b.ini"
tap_plan 11

out=$(./aldit-sim --spec "$spec" --model "$model" --ranks 8 --samples 5000 --json 2>&1); status=$?
tap_is "aldit-sim --json exits 0" "$status" 0
tap_is "one JSON line per strategy" "$(printf '%s\n' "$out" | grep -c '^{"strategy":')" 3
keys_ok=0
for key in strategy ranks steps imbalance epoch_time lower_bound mem_util balancer_ms_per_step; do
    [ "$(printf '%s\n' "$out" | grep -c "\"$key\":")" -eq 3 ] || keys_ok=1
done
tap_result $keys_ok "every line has strategy, ranks, steps, imbalance, epoch_time, lower_bound, mem_util, balancer_ms_per_step" "$out"
global=$(printf '%s\n' "$out" | grep '"strategy":"global"')
check=$(printf '%s\n' "$global" | awk -F'[:,]' '{for (i = 1; i < NF; i++) v[$i] = $(i + 1)}
    END {print (v["\"imbalance\""] < 0.02 && v["\"epoch_time\""] <= 1.03 * v["\"lower_bound\""]) ? 0 : 1}')
tap_result "$check" "global: predicted imbalance < 2% and epoch time within 3% of the lower bound" "$global"
check=$(printf '%s\n' "$out" | awk -F'[:,]' '{for (i = 1; i < NF; i++) v[$i] = $(i + 1); if (v["\"epoch_time\""] < v["\"lower_bound\""] * 0.999999) bad = 1}
    END {print bad ? 1 : 0}')
tap_result "$check" "no strategy beats the lower bound" "$out"

./aldit-sim --spec "$spec" --model "$model" >/dev/null 2>&1
tap_is "missing --ranks: exit 2" "$?" 2
./aldit-sim --spec "$spec" --model "$model" --ranks 4 --strategy fastest >/dev/null 2>&1
tap_is "unknown strategy: exit 2" "$?" 2
./aldit-sim --spec "$top_srcdir/tests/sim_cli.sh" --model "$model" --ranks 4 >/dev/null 2>&1
tap_is "a file that is not a length spec: exit 2" "$?" 2
out=$(./aldit-sim --spec="$spec" --model="$model" --ranks=2 --samples=200 --strategy=global --json 2>&1); status=$?
tap_is "--name=value options: exit 0, one JSON line" "$status:$(printf '%s\n' "$out" | grep -c '^{"strategy":"global"')" "0:1"
out=$(./aldit-sim --spec "$spec" --model "$model" --ranks 2>&1); status=$?
tap_is "an option without its value: exit 2 naming it" "$status:$(printf '%s\n' "$out" | grep -c -- '--ranks needs a value')" "2:1"
out=$(./aldit-sim --spec "$spec" --model "$model" --ranks 2 --frobnicate 2>&1); status=$?
tap_is "an unknown option: exit 2 naming it" "$status:$(printf '%s\n' "$out" | grep -c "unknown argument '--frobnicate'")" "2:1"
tap_done
