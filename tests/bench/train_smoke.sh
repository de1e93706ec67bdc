#!/bin/sh
# train_smoke.sh — make check's run of tests/bench/train_vs_peer.sh --smoke: aldit and its PyTorch peer at toy size on
# the CPU, as TAP (skips where torch, diffusers or h5py do not import).
exec sh "${top_srcdir:-.}/tests/bench/train_vs_peer.sh" --smoke "${top_builddir:-.}"
