#!/bin/sh
# train_hunyuan.sh — training with model.family = hunyuanvideo15 on the CPU (text-to-video, Qwen captions only):
# the loss falls; 2 ranks give the 1-rank losses, sharded (full, with an EMA) as unsharded; a stop at step 10 resumed to 20 gives the uninterrupted losses to
# the bit (a constant learning rate: the cosine schedule spans run.steps); a checkpoint is refused under another
# family dim; padded captions are refused, and so is run.device = cuda on these dims (not multiples of 8: the GPU
# model's own tests are tests/test_cuda_mmdit and tests/train_hunyuan_gpu.sh).
. "${top_srcdir:-.}/tests/train_lib.sh"
TRAIN_DECK="$top_srcdir/tests/decks/hunyuan_tiny.ini"
tap_plan 7
"$top_builddir/aldit-store" synth --spec "$top_srcdir/tests/decks/train_tiny.lengths" --samples 32 --text-len 8 \
    --text-dim 12 --channels 4 --seed 3 --out "$WORK/store.h5" > /dev/null || exit 1
common="run.threads=1 balance.global_batch=4 train.lr=2e-3 train.lr_schedule=constant train.warmup_steps=5 log.every=1"

# shellcheck disable=SC2086
run_aldit 1 one $common run.steps=20; status=$?
losses "$WORK/one/metrics.jsonl" > "$WORK/one.loss"
first=$(awk 'NR <= 5 { s += $2 } END { print s / 5 }' "$WORK/one.loss")
last=$(awk 'NR > 15 { s += $2 } END { print s / 5 }' "$WORK/one.loss")
falls=$(awk -v a="$first" -v b="$last" 'BEGIN { print (b < 0.8 * a) ? 0 : 1 }')
tap_result $((status + falls)) "1 rank, 20 steps: the loss falls (mean of steps 1-5 $first, of 16-20 $last)" \
    "$(tail -5 "$WORK/one.log")"
# shellcheck disable=SC2086
run_aldit 2 two $common run.steps=20; status=$?
losses "$WORK/two/metrics.jsonl" > "$WORK/two.loss"
out=$(compare "$WORK/one.loss" "$WORK/two.loss" 1e-5 1 20); status=$((status + $?))
tap_result $status "2 ranks: the 1-rank losses within 1e-5 (largest $out)" "$(tail -5 "$WORK/two.log")"
# shellcheck disable=SC2086
run_aldit 2 full $common run.steps=20 train.shard=full train.ema_decay=0.9; status=$?
losses "$WORK/full/metrics.jsonl" > "$WORK/full.loss"
out=$(compare "$WORK/two.loss" "$WORK/full.loss" 1e-6 1 20); status=$((status + $?))
tap_result $status "2 ranks, train.shard = full with an EMA: the losses of shard = none within 1e-6 (largest $out)" \
    "$(tail -5 "$WORK/full.log")"
# shellcheck disable=SC2086
run_aldit 1 resumed $common run.steps=10 && run_aldit 1 resumed $common run.steps=20; status=$?
losses "$WORK/resumed/metrics.jsonl" | awk '!seen[$1]++' > "$WORK/resumed.loss"
out=$(compare "$WORK/one.loss" "$WORK/resumed.loss" 0 1 20); status=$((status + $?))
tap_result $status "stopped at step 10, resumed to 20: the uninterrupted losses to the bit" "$(tail -5 "$WORK/resumed.log")"
# shellcheck disable=SC2086
run_aldit 1 resumed $common run.steps=30 model.rope_axes_t=8; status=$?
case "$status:$(cat "$WORK/resumed.log")" in 2:*"model.rope_axes_t is 4 in the checkpoint, 8 in the deck"*) found=0 ;; *) found=1 ;; esac
tap_result $found "resuming under another rope_axes_t: exit 2 naming it" "$(tail -3 "$WORK/resumed.log")"
# shellcheck disable=SC2086
run_aldit 1 gpu $common run.steps=20 run.device=cuda; status=$?
case "$status:$(cat "$WORK/gpu.log")" in
    1:*"device = cuda, but"*|2:*"must be positive multiples of 8"*) found=0 ;;
    *) found=1 ;;
esac
tap_result $found "run.device = cuda on dims the GPU model cannot take: exit 1 without a GPU, 2 naming the dims on one" \
    "$(tail -3 "$WORK/gpu.log")"
# shellcheck disable=SC2086
run_aldit 1 padded $common run.steps=20 model.text_padding=wan; status=$?
case "$status:$(cat "$WORK/padded.log")" in 2:*"set model.text_padding = trim"*) found=0 ;; *) found=1 ;; esac
tap_result $found "text_padding = wan (captions padded): exit 2 saying to set trim" "$(tail -3 "$WORK/padded.log")"
tap_done
