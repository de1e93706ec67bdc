#!/bin/sh
# train_ranks.sh — with a fixed global batch, 1 rank and 2 ranks see the same samples, noise and timesteps
# each step, so their per-step losses agree to 1e-5 relative (only the order of float sums differs); a global
# batch smaller than the rank count (a rank without samples) runs.
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=40
tap_plan 8

tap_ok "aldit-store synth makes the test store" make_store
run_aldit 1 one run.steps=$STEPS balance.global_batch=6; status=$?
tap_is "1-rank run exits 0" "$status" 0
run_aldit 2 two run.steps=$STEPS balance.global_batch=6; status=$?
tap_is "2-rank run exits 0" "$status" 0
losses "$WORK/one/metrics.jsonl" > "$WORK/one.losses"
losses "$WORK/two/metrics.jsonl" > "$WORK/two.losses"
tap_is "both ran every step" "$(wc -l < "$WORK/one.losses") $(wc -l < "$WORK/two.losses")" "$STEPS $STEPS"
paste "$WORK/one.losses" "$WORK/two.losses" | awk '
    { if ($1 != $3) { print "step mismatch: " $0; bad = 1; next }
      d = $2 - $4; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2
      if (d > 1e-5 * m) { print "step " $1 ": " $2 " vs " $4; bad = 1 }
      if (d / m > worst) worst = d / m }
    END { printf "%.2g\n", worst; exit bad || NR == 0 }' > "$WORK/compare"
tap_result $? "per-step losses within 1e-5 relative (largest difference $(tail -1 "$WORK/compare"))" "$(cat "$WORK/compare")"
# every metrics line of the 2-rank run splits the step's samples over both ranks, with a measured and a
# predicted time for each
awk '{ n = split($0, f, /"rank_samples": \[/); if (n < 2) { print "no rank_samples: " NR; bad = 1; next }
       split(f[2], g, /\]/); k = split(g[1], c, /, /); sum = 0; for (i = 1; i <= k; i++) sum += c[i]
       match($0, /"samples": [0-9]+/); total = substr($0, RSTART + 11, RLENGTH - 11)
       if (k != 2 || sum != total) { print "line " NR ": " k " ranks, " sum " of " total " samples"; bad = 1 }
       if ($0 !~ /"rank_compute_s": \[[0-9.]+, [0-9.]+\]/ || $0 !~ /"rank_pred_s": \[[^]]+, [^]]+\]/) {
           print "line " NR ": per-rank seconds missing"; bad = 1 } }
     END { exit bad || NR == 0 }' "$WORK/two/metrics.jsonl" > "$WORK/rank_arrays"
tap_result $? "2-rank metrics carry per-rank samples (summing to the step's) and seconds" "$(head -3 "$WORK/rank_arrays")"

# a global batch smaller than the rank count leaves a rank without samples in a step
run_aldit 2 sparse run.steps=3 balance.global_batch=1; status=$?
tap_is "global batch 1 on 2 ranks exits 0" "$status" 0
tap_is "it ran every step" "$(metrics_lines sparse)" 3
tap_done
