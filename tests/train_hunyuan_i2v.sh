#!/bin/sh
# train_hunyuan_i2v.sh — model.family = hunyuanvideo15 trains on a store with caption sources (ByT5 and SigLIP rows)
# by the official recipe (the family's defaults: logit-normal timesteps, shift 3) with train.i2v_share = 0.5: the loss
# is finite and falls; the image-to-video draws change the losses (against i2v_share = 0); 2 ranks give the 1-rank
# losses; a stop at step 8 resumed to 16 gives the uninterrupted losses to the bit; data.verify = off the same losses;
# a flipped bit in a sample's /image stops the run naming the sample.
. "${top_srcdir:-.}/tests/train_lib.sh"
TRAIN_DECK="$top_srcdir/tests/decks/hunyuan_tiny.ini"
tap_plan 6
"$top_builddir/aldit-store" synth --spec "$top_srcdir/tests/decks/train_tiny.lengths" --samples 32 --text-len 8 \
    --text-dim 12 --channels 4 --seed 3 --text-2-dim 6 --image-dim 10 --text-2-len 5 --image-len 3 \
    --out "$WORK/store.h5" > /dev/null || exit 1
base="run.threads=1 balance.global_batch=4 train.lr=2e-3 train.lr_schedule=constant train.warmup_steps=5 log.every=1"
common="$base train.i2v_share=0.5"

# shellcheck disable=SC2086
run_aldit 1 one $common run.steps=16; status=$?
losses "$WORK/one/metrics.jsonl" > "$WORK/one.loss"
first=$(awk 'NR <= 4 { s += $2 } END { print s / 4 }' "$WORK/one.loss")
last=$(awk 'NR > 12 { s += $2 } END { print s / 4 }' "$WORK/one.loss")
falls=$(awk -v a="$first" -v b="$last" -v n="$(wc -l < "$WORK/one.loss")" 'BEGIN { print (n == 16 && b < 0.9 * a) ? 0 : 1 }')
tap_result $((status + falls)) "1 rank, 16 steps, i2v_share 0.5: finite losses that fall (steps 1-4 $first, 13-16 $last)" \
    "$(tail -5 "$WORK/one.log")"
# shellcheck disable=SC2086
run_aldit 1 t2v $base run.steps=16 train.i2v_share=0; status=$?
losses "$WORK/t2v/metrics.jsonl" > "$WORK/t2v.loss"
differ=$(paste "$WORK/one.loss" "$WORK/t2v.loss" | awk '$2 != $4 { n++ } END { print n + 0 }')
[ "$status" = 0 ] && [ "$differ" -gt 0 ]; status=$?
tap_result $status "i2v_share 0 gives other losses ($differ of 16 steps differ): the image-to-video draws take effect" \
    "$(tail -5 "$WORK/t2v.log")"
# shellcheck disable=SC2086
run_aldit 2 two $common run.steps=16; status=$?
losses "$WORK/two/metrics.jsonl" > "$WORK/two.loss"
out=$(compare "$WORK/one.loss" "$WORK/two.loss" 1e-5 1 16); status=$((status + $?))
tap_result $status "2 ranks: the 1-rank losses within 1e-5 (largest $out)" "$(tail -5 "$WORK/two.log")"
# shellcheck disable=SC2086
run_aldit 1 resumed $common run.steps=8 && run_aldit 1 resumed $common run.steps=16; status=$?
losses "$WORK/resumed/metrics.jsonl" | awk '!seen[$1]++' > "$WORK/resumed.loss"
out=$(compare "$WORK/one.loss" "$WORK/resumed.loss" 0 1 16); status=$((status + $?))
tap_result $status "stopped at step 8, resumed to 16: the uninterrupted losses to the bit" "$(tail -5 "$WORK/resumed.log")"
# shellcheck disable=SC2086
run_aldit 1 unverified $common run.steps=16 data.verify=off; status=$?
losses "$WORK/unverified/metrics.jsonl" > "$WORK/unverified.loss"
out=$(compare "$WORK/one.loss" "$WORK/unverified.loss" 0 1 16); status=$((status + $?))
tap_result $status "data.verify = off (text-to-video samples' SigLIP rows left unread): the same losses to the bit" \
    "$(tail -5 "$WORK/unverified.log")"
cp "$WORK/store.h5" "$WORK/clean.h5"
for candidate in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
    "$top_builddir/tests/store_damage" "$WORK/store.h5" "$candidate" /image 2>/dev/null && { video=$candidate; break; }
done
# shellcheck disable=SC2086
run_aldit 1 damaged $common run.steps=16; status=$?
case "$status:$(cat "$WORK/damaged.log")" in [12]:*"sample $video: /index_sources checksum mismatch"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a flipped bit in sample $video's /image: the run stops naming it" "$(tail -4 "$WORK/damaged.log")"
tap_done
