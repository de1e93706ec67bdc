#!/bin/sh
# hunyuan_parity.sh — aldit-forward (model.family = hunyuanvideo15) against diffusers' HunyuanVideo15Transformer3DModel
# (tools/hunyuan_parity.py) on tiny random models: T2V and I2V samples of mixed shapes and caption lengths packed
# varlen within 1e-5 of each sample alone and of diffusers' padded-and-masked batches, two configurations; a
# perturbed weight caught; aldit --check planning run.device = cuda for the family; its refusal of a Wan-shaped
# input. Skips where torch, diffusers or h5py do not import.
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs torch diffusers h5py numpy
work=$(mktemp -d "$PWD/hunyuan_parity.tmp.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
parity() { "$PYTHON" "$top_srcdir/tools/hunyuan_parity.py" --aldit-forward "$top_builddir/aldit-forward" "$@"; }
tap_plan 8

out=$(parity --keep "$work/a" 2>&1); status=$?
tap_result $status "2 blocks, dim 32, 2 heads, patch 1: T2V and I2V within 1e-5" "$out"
tap_is "five samples compared alone" "$(printf '%s\n' "$out" | grep -c '^sample [0-9]: .*I2V\|^sample [0-9]: .*T2V')" 5
tap_is "four samples compared with diffusers' padded-and-masked batches" \
    "$(printf '%s\n' "$out" | grep -c '^padded batch .* = [0-9.e-]*$')" 4
out=$(parity --dim 64 --heads 4 --layers 3 --patch 2 --rope-axes-t 8 --seed 5 2>&1)
tap_result $? "3 blocks, dim 64, 4 heads, patch 2 (channel-major unpatchify): within 1e-5" "$out"
out=$(parity --perturb transformer_blocks.1.attn.norm_added_k.weight 2>&1); status=$?
tap_is "a weight off by 1e-3 in aldit's copy fails the comparison" "$status" 1

"$top_builddir/aldit-store" synth --spec "$top_srcdir/tests/decks/train_tiny.lengths" --samples 16 --text-len 16 \
    --text-dim 32 --channels 8 --seed 3 --out "$work/gpu_store.h5" > /dev/null
"$top_builddir/aldit" --check "$top_srcdir/tests/decks/hunyuan_tiny_gpu.ini" data.store="$work/gpu_store.h5" \
    run.device=cuda > "$work/cuda.log" 2>&1; status=$?
case "$status:$(cat "$work/cuda.log")" in 0:*"capacity   GPU model for micro-batches"*) found=0 ;; *) found=1 ;; esac
tap_result $found "run.device = cuda with family = hunyuanvideo15: aldit --check plans the GPU model" "$(tail -8 "$work/cuda.log")"
"$top_builddir/aldit" --check "$top_srcdir/tests/decks/hunyuan_tiny.ini" model.in_dim=4 > "$work/in.log" 2>&1; status=$?
case "$status:$(cat "$work/in.log")" in 2:*"2 * model.out_dim + 1"*) found=0 ;; *) found=1 ;; esac
tap_result $found "in_dim not 2 out_dim + 1: exit 2 naming the rule" "$(cat "$work/in.log")"
"$PYTHON" -c "
import h5py, numpy as np
with h5py.File('$work/wan.h5', 'w') as f:
    f['shapes'] = np.array([[1, 2, 2, 3]], np.int64); f['latents'] = np.zeros(36, np.float32)
    f['sigma'] = np.array([0.5], np.float32); f['text'] = np.zeros(36, np.float32)
"
"$top_builddir/aldit-forward" --weights "$work/a/weights.h5" --input "$work/wan.h5" --output "$work/o.h5" \
    --deck "$top_srcdir/tests/decks/hunyuan_tiny.ini" model.patch_h=1 model.patch_w=1 model.text_len=11 \
    model.freq_dim=256 model.ffn_dim=128 > "$work/shapes.log" 2>&1; status=$?
case "$status:$(cat "$work/shapes.log")" in 2:*"expected [samples >= 1, 6]"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a Wan-shaped /shapes [B, 4] for hunyuanvideo15: exit 2 naming the 6 columns" "$(cat "$work/shapes.log")"
tap_done
