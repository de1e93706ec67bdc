#!/bin/sh
# gpu_mmdit_ulysses.sh — HunyuanVideo-1.5's GPU model (cuda/mmdit_gpu.cu) with sequence parallelism on 2 and 4 GPU
# ranks (test_cuda_mmdit_ulysses: both streams split over groups of k = 2 and 4 against k = 1, summed over the group,
# within test_cuda_ulysses' bf16 tolerances for Wan), run as tests/gpu_ulysses.sh runs Wan's. Each rank count is
# skipped where tests/gpu_present reports fewer GPU ranks.
ULYSSES_PROGRAM=test_cuda_mmdit_ulysses exec sh "${top_srcdir:-.}/tests/gpu_ulysses.sh"
