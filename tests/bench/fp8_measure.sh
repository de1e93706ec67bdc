#!/bin/sh
# fp8_measure.sh — issue 34, step 1, in one GPU call: tests/bench/fp8_bench times cuBLASLt FP8 GEMMs and cuDNN FP8
# attention against bf16 at Wan's block shapes, then tests/bench/fp8_table.py prices the epoch of
# tests/bench/train_vs_peer.sh (inputs/mixed.lengths, 800 samples drawn with seed 11, inputs/wan1.3b-8layers.ini) with
# train_table.py's floor model, bf16 against FP8 part by part, and prints one table.
#
# usage: tests/bench/fp8_measure.sh [BUILD_DIR]     (BUILD_DIR: default the current directory; needs a GPU)
# Environment: OUT (folder for fp8_gemm.log/.json, fp8_attention.log/.json, fp8_table.md/.json, fp8_speedups.md; default
# a new one under /tmp), SEQ (the M / S list; default 1024,4096,16384,32768,75600), MODELS (default 1.3b,14b), REPEATS (default 3),
# DECK (default inputs/wan1.3b-8layers.ini), MEAN_ROWS (the epoch's mean micro-batch rows; default 32768), SAMPLES
# (800). Exit 77 without a GPU (fp8_bench's own check).
set -u
build=$(cd "${1:-.}" && pwd)
srcdir=${SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${PYTHON:-python3}
bench="$build/tests/bench/fp8_bench"
[ -x "$bench" ] || { echo "fp8_measure.sh: $bench not found (a CUDA build: make tests/bench/fp8_bench)" >&2; exit 2; }
out=${OUT:-$(mktemp -d /tmp/fp8_measure.XXXXXX)}
mkdir -p "$out" || exit 2

# two runs, so that a failure in one section leaves the other's figures: the GEMMs (with the epoch), then attention;
# the bench writes JSON lines as it measures, so that even a run cut short leaves what it measured
seq=${SEQ:-1024,4096,16384,32768,75600}
failed=0
for section in gemm attention; do
    echo "== fp8_bench --sections $section (raw log: $out/fp8_$section.log)"
    epoch=
    [ $section = gemm ] && epoch="--spec $srcdir/inputs/mixed.lengths --samples ${SAMPLES:-800} --draw-seed 11"
    # shellcheck disable=SC2086
    "$bench" --sections $section --seq "$seq" --wan "${MODELS:-1.3b,14b}" --repeats "${REPEATS:-3}" $epoch \
        --json "$out/fp8_$section.json" > "$out/fp8_$section.log" 2>&1
    status=$?
    cat "$out/fp8_$section.log"
    [ $status = 0 ] || { echo "fp8_measure.sh: fp8_bench --sections $section: exit $status" >&2; failed=$status; }
done

echo "== the projection (train_vs_peer.sh's floor model)"
"$PYTHON" "$srcdir/tests/bench/fp8_table.py" --bench "$out/fp8_gemm.json" --bench "$out/fp8_attention.json" \
    --deck "${DECK:-$srcdir/inputs/wan1.3b-8layers.ini}" --mean-rows "${MEAN_ROWS:-32768}" \
    --json "$out/fp8_table.json" --speedups "$out/fp8_speedups.md" > "$out/fp8_table.md" 2>&1
status=$?
cat "$out/fp8_table.md"
echo; cat "$out/fp8_speedups.md" 2>/dev/null
echo "(files in $out)"
# a bench that failed part-way still leaves its figures (JSON lines) to the table above, which notes what is missing
[ $failed = 0 ] || exit $failed
exit $status
