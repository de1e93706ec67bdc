#!/bin/sh
# fp8_ab_smoke.sh — make check's run of tests/bench/fp8_ab.sh --smoke: the FP8 accuracy A/B's plumbing at toy size on
# the CPU (both arms bf16, chunks with resume, the table's pass and fail, the time budget's stop), as TAP.
exec sh "${top_srcdir:-.}/tests/bench/fp8_ab.sh" --smoke "${top_builddir:-.}"
