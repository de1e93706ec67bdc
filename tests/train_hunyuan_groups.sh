#!/bin/sh
# train_hunyuan_groups.sh — model.family = hunyuanvideo15 trains with sequence-parallel groups on the CPU (a store with
# ByT5 and SigLIP rows, train.i2v_share = 0.5: text-to-video and image-to-video samples): on 4 ranks with groups the
# balancer chooses ([balance] sp = 2, mixed with single ranks), and with every micro-batch forced on groups of 2 and of
# 4 (the test hook ALDIT_TEST_SP_GROUP), the per-step losses equal a 1-rank run's within 1e-6 relative (as
# train_groups.sh holds Wan) and so do the steps' sample and token counts; the start-up no longer says the family runs
# no groups.
. "${top_srcdir:-.}/tests/train_lib.sh"
TRAIN_DECK="$top_srcdir/tests/decks/hunyuan_tiny.ini"
STEPS=6
tap_plan 4
"$top_builddir/aldit-store" synth --spec "$top_srcdir/tests/decks/train_tiny.lengths" --samples 32 --text-len 8 \
    --text-dim 12 --channels 4 --seed 3 --text-2-dim 6 --image-dim 10 --text-2-len 5 --image-len 3 \
    --out "$WORK/store.h5" > /dev/null || exit 1
# 4 heads (head dim 8): groups of 2 and 4 hold 2 and 1
common="run.threads=1 balance.global_batch=4 train.lr=2e-3 train.lr_schedule=constant train.warmup_steps=5 log.every=1
        train.i2v_share=0.5 model.num_heads=4 run.steps=$STEPS"

# counts FILE: "step samples tokens" per metrics line
counts() { sed -n 's/^{"step": \([0-9]*\),.*"samples": \([0-9]*\), "tokens": \([0-9]*\),.*/\1 \2 \3/p' "$1"; }
# same_as_one RUN: RUN's losses within 1e-6 of the 1-rank run's, its steps' sample and token counts equal
same_as_one() {
    losses "$WORK/$1/metrics.jsonl" > "$WORK/$1.loss"
    counts "$WORK/$1/metrics.jsonl" > "$WORK/$1.counts"
    cmp -s "$WORK/one.counts" "$WORK/$1.counts" || { echo "sample or token counts differ"; return 1; }
    compare "$WORK/one.loss" "$WORK/$1.loss" 1e-6 1 $STEPS
}

# shellcheck disable=SC2086
run_aldit 1 one $common; status=$?
losses "$WORK/one/metrics.jsonl" > "$WORK/one.loss"
counts "$WORK/one/metrics.jsonl" > "$WORK/one.counts"
tap_is "the 1-rank run without groups: exit 0, $STEPS steps" "$status $(wc -l < "$WORK/one.loss")" "0 $STEPS"

# [balance] sp = 2: the planner groups a sample over a rank's share of the step (some steps have one)
# shellcheck disable=SC2086
run_aldit 4 sp2 $common balance.sp=2; status=$?
out=$(same_as_one sp2 2>&1); same=$?
grouped=$(awk '{ match($0, /"samples": [0-9]+/); total = substr($0, RSTART + 11, RLENGTH - 11)
                 n = split($0, f, /"rank_samples": \[/); split(f[2], g, /\]/); k = split(g[1], c, /, /); sum = 0
                 for (i = 1; i <= k; i++) sum += c[i]; if (sum > total) steps++ }
               END { print steps + 0 }' "$WORK/sp2/metrics.jsonl")
! grep -q "runs no sequence-parallel groups" "$WORK/sp2.log" && [ $status -eq 0 ] && [ "$grouped" -gt 0 ]; ran=$?
tap_result $((same + ran)) "4 ranks, [balance] sp = 2: groups in $grouped of $STEPS steps; the 1-rank run's losses within 1e-6 (largest $out), samples and tokens" \
    "$out
$(tail -5 "$WORK/sp2.log")"

for k in 2 4; do
    # shellcheck disable=SC2086
    ALDIT_TEST_SP_GROUP=$k run_aldit 4 forced$k $common; status=$?
    out=$(same_as_one forced$k 2>&1); same=$?
    [ $status -eq 0 ] && grep -q "ALDIT_TEST_SP_GROUP: micro-batches run on groups of $k ranks" "$WORK/forced$k.log"; ran=$?
    tap_result $((same + ran)) "4 ranks, every micro-batch on groups of $k (ALDIT_TEST_SP_GROUP=$k): the 1-rank run's losses within 1e-6 (largest $out), samples and tokens" \
        "$out
$(tail -5 "$WORK/forced$k.log")"
done
tap_done
