#!/bin/sh
# train_hunyuan_groups_gpu.sh — tests/train_groups_gpu.sh's cases (groups of 2 and 4 on GPU ranks against a 1-GPU
# run) on model.family = hunyuanvideo15's tiny GPU deck: the MMDiT GPU model's sequence parallelism in training.
GROUPS_FAMILY=hunyuanvideo15 exec sh "${top_srcdir:-.}/tests/train_groups_gpu.sh"
