#!/bin/sh
# sim.sh — the balancer benchmark: aldit-sim on inputs/mixed.lengths with the Wan-1.3B deck at R = 8 and 1024,
# every strategy, without and with --noise 0.1; prints one table (figures for docs/PERFORMANCE.md).
# usage: tests/bench/sim.sh [BUILD_DIR] (default: the current directory, which must hold aldit-sim)
# Environment: SRCDIR (default: this script's source tree), SEED (default 1234), extra aldit-sim deck
# overrides in SIM_OVERRIDES (e.g. SIM_OVERRIDES="balance.compute_budget=40"), RUNS (default 1): runs of each
# configuration; the balancer time is then their median, with the range after it (the other figures do not
# change from run to run: the same seed gives the same assignments).
set -eu
build=${1:-.}
srcdir=${SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
seed=${SEED:-1234}
runs=${RUNS:-1}
sim="$build/aldit-sim"
[ -x "$sim" ] || { echo "sim.sh: $sim not found (build it: make aldit-sim)" >&2; exit 2; }
spec="$srcdir/inputs/mixed.lengths"
model="$srcdir/inputs/wan1.3b.ini"
printf '%-6s %-8s %-6s %-13s %6s %10s %10s %12s %12s %9s %9s %12s %s\n' ranks samples noise strategy steps imbalance predicted \
    epoch_time lower_bound vs_bound mem_util balancer_ms "(range)"
# R = 8 over 100k samples (~12,500 per rank); R = 1024 over 1M samples (~1,000 per rank: 100k would be
# under 100 samples per rank, an epoch of two or three steps).
for run in "8 100000" "1024 1000000"; do
    set -- $run
    for noise in 0 0.1; do
        done_runs=0
        while [ "$done_runs" -lt "$runs" ]; do
            # shellcheck disable=SC2086
            "$sim" --spec "$spec" --model "$model" --ranks "$1" --samples "$2" --noise "$noise" --seed "$seed" --json \
                ${SIM_OVERRIDES:-}
            done_runs=$((done_runs + 1))
        done |
        awk -F'[:,{}]' -v ranks="$1" -v samples="$2" -v noise="$noise" '
        {
            for (i = 2; i < NF; i += 2) { key = $i; gsub(/"/, "", key); value = $(i + 1); gsub(/"/, "", value); v[key] = value }
            s = v["strategy"]
            if (!(s in line)) {
                order[++n] = s
                line[s] = sprintf("%-6s %-8s %-6s %-13s %6d %9.2f%% %9.2f%% %12.1f %12.1f %8.2f%% %8.1f%%", ranks, samples,
                                  noise, s, v["steps"], 100 * v["imbalance"], 100 * v["predicted_imbalance"], v["epoch_time"],
                                  v["lower_bound"], 100 * (v["epoch_time"] / v["lower_bound"] - 1), 100 * v["mem_util"])
            }
            ms[s, ++count[s]] = v["balancer_ms_per_step"] + 0
        }
        END {
            for (k = 1; k <= n; k++) {
                s = order[k]; c = count[s]
                for (i = 2; i <= c; i++)   # insertion sort of the run times
                    for (j = i; j > 1 && ms[s, j - 1] > ms[s, j]; j--) { t = ms[s, j]; ms[s, j] = ms[s, j - 1]; ms[s, j - 1] = t }
                median = c % 2 ? ms[s, (c + 1) / 2] : (ms[s, c / 2] + ms[s, c / 2 + 1]) / 2
                range = c > 1 ? sprintf("%.3f-%.3f", ms[s, 1], ms[s, c]) : ""
                printf "%s %12.3f %s\n", line[s], median, range
            }
        }'
    done
done
