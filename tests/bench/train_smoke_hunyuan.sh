#!/bin/sh
# train_smoke_hunyuan.sh — make check's run of tests/bench/train_vs_peer.sh --smoke --family hunyuanvideo15: aldit and
# its PyTorch peer (diffusers' HunyuanVideo15Transformer3DModel) at toy size on the CPU, over a store with caption
# sources and image-to-video draws, as TAP (skips where torch, diffusers or h5py do not import).
exec sh "${top_srcdir:-.}/tests/bench/train_vs_peer.sh" --smoke --family hunyuanvideo15 "${top_builddir:-.}"
