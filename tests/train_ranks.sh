#!/bin/sh
# train_ranks.sh — with a fixed global batch, 1 rank and 2 ranks see the same samples, noise and timesteps
# each step, so their per-step losses agree to 1e-5 relative (only the order of float sums differs).
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=40
tap_plan 5

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
tap_done
