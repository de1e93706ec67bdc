#!/bin/sh
# sim.sh — the balancer benchmark: aldit-sim on inputs/mixed.lengths with the Wan-1.3B deck at R = 8 and 1024,
# every strategy, without and with --noise 0.1; prints one table (figures for docs/PERFORMANCE.md).
# usage: tests/bench/sim.sh [BUILD_DIR] (default: the current directory, which must hold aldit-sim)
# Environment: SRCDIR (default: this script's source tree), SEED (default 1234), extra aldit-sim deck
# overrides in SIM_OVERRIDES (e.g. SIM_OVERRIDES="balance.compute_budget=40").
set -eu
build=${1:-.}
srcdir=${SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
seed=${SEED:-1234}
sim="$build/aldit-sim"
[ -x "$sim" ] || { echo "sim.sh: $sim not found (build it: make aldit-sim)" >&2; exit 2; }
spec="$srcdir/inputs/mixed.lengths"
model="$srcdir/inputs/wan1.3b.ini"
printf '%-6s %-8s %-6s %-13s %6s %10s %10s %12s %12s %9s %9s %12s\n' ranks samples noise strategy steps imbalance predicted \
    epoch_time lower_bound vs_bound mem_util balancer_ms
# R = 8 over 100k samples (~12,500 per rank); R = 1024 over 1M samples (~1,000 per rank: 100k would be
# under 100 samples per rank, an epoch of two or three steps).
for run in "8 100000" "1024 1000000"; do
    set -- $run
    for noise in 0 0.1; do
        # shellcheck disable=SC2086
        "$sim" --spec "$spec" --model "$model" --ranks "$1" --samples "$2" --noise "$noise" --seed "$seed" --json \
            ${SIM_OVERRIDES:-} |
        awk -F'[:,{}]' -v ranks="$1" -v samples="$2" -v noise="$noise" '{
            for (i = 2; i < NF; i += 2) { key = $i; gsub(/"/, "", key); value = $(i + 1); gsub(/"/, "", value); v[key] = value }
            printf "%-6s %-8s %-6s %-13s %6d %9.2f%% %9.2f%% %12.1f %12.1f %8.2f%% %8.1f%% %12.3f\n", ranks, samples, noise,
                v["strategy"], v["steps"], 100 * v["imbalance"], 100 * v["predicted_imbalance"], v["epoch_time"],
                v["lower_bound"], 100 * (v["epoch_time"] / v["lower_bound"] - 1), 100 * v["mem_util"], v["balancer_ms_per_step"]
        }'
    done
done
