#!/bin/sh
# wan_parity.sh — aldit-forward against diffusers' WanTransformer3DModel (tools/wan_parity.py) on tiny random
# models: two configurations and both text paddings within 1e-5, and a perturbed weight in aldit's copy caught; aldit-forward's own
# errors (usage, a missing parameter, a bad input file). Skips where torch, diffusers or h5py do not import.
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs torch diffusers h5py numpy
work=$(mktemp -d "$PWD/wan_parity.tmp.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
parity() { "$PYTHON" "$top_srcdir/tools/wan_parity.py" --aldit-forward "$top_builddir/aldit-forward" "$@"; }
tap_plan 9

out=$(parity --keep "$work/a" 2>&1); status=$?
tap_result $status "2 layers, dim 32, 2 heads, aldit pads the captions (text_padding = wan): within 1e-5" "$out"
tap_is "five samples compared" "$(printf '%s\n' "$out" | grep -c '^sample [0-9]: .* = ')" 5
tap_is "aldit-forward's output equals model_forward_loss's prediction" \
    "$(printf '%s\n' "$out" | grep -c '^self-check sample')" 5
out=$(parity --dim 64 --heads 4 --ffn-dim 96 --layers 3 --text-len 20 --text-dim 8 --no-cross-attn-norm --seed 5 2>&1)
tap_result $? "3 layers, dim 64, 4 heads, no cross-attention norm: within 1e-5" "$out"
out=$(parity --text-padding trim 2>&1)
tap_result $? "captions given zero-padded, text_padding = trim: within 1e-5" "$out"
out=$(parity --perturb blocks.1.cross_attn.norm_k.weight 2>&1); status=$?
tap_is "a weight off by 1e-3 in aldit's copy fails the comparison" "$status" 1

dims="model.dim=32 model.ffn_dim=64 model.num_heads=2 model.text_len=16 model.text_dim=24 model.freq_dim=32"
"$top_builddir/aldit-forward" --weights "$work/a/weights.h5" --input "$work/a/input.h5" > "$work/usage.log" 2>&1
tap_is "a missing --output is a usage error (2)" "$?" 2
# shellcheck disable=SC2086
"$top_builddir/aldit-forward" --weights "$work/a/weights.h5" --input "$work/a/input.h5" --output "$work/o.h5" \
    $dims model.num_layers=3 > "$work/layers.log" 2>&1; status=$?
case "$status:$(cat "$work/layers.log")" in 2:*blocks.2.*) found=0 ;; *) found=1 ;; esac
tap_result $found "weights of 2 layers for a 3-layer model: exit 2 naming blocks.2" "$(cat "$work/layers.log")"
# shellcheck disable=SC2086
"$top_builddir/aldit-forward" --weights "$work/a/weights.h5" --input "$work/a/weights.h5" --output "$work/o.h5" \
    $dims model.num_layers=2 > "$work/input.log" 2>&1; status=$?
case "$status:$(cat "$work/input.log")" in 2:*"no dataset shapes"*) found=0 ;; *) found=1 ;; esac
tap_result $found "an input file without /shapes: exit 2 naming it" "$(cat "$work/input.log")"
tap_done
