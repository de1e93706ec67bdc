#!/bin/sh
# calibration_smoke.sh — make check's run of tests/bench/calibration_cache.sh --smoke: its three runs at toy size on the
# CPU, as TAP.
exec sh "${top_srcdir:-.}/tests/bench/calibration_cache.sh" --smoke "${top_builddir:-.}"
