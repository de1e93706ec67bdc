#!/bin/bash
# tests/bench/cudnn_fe_compare.sh — on the GPU host: builds aldit twice out of tree, cuda/attention_cudnn.h through cuDNN's backend API (b-backend/) and through cudnn-frontend (b-frontend/), runs tests/test_cuda_attention_cudnn in each, times aldit-bench's attention and block sections with each and prints them side by side.
# Usage, from the repository root (not configured in place), after `source .dev/remote-env.sh`:
#   tests/bench/cudnn_fe_compare.sh [OUT_DIR]
# OUT_DIR (default $OUT, else ./cudnn-fe-compare) gets the logs, both benches' stdout and --json figures and
# compare.txt. The headers come from .dev/cudnn-frontend/include (tools/fetch_cudnn_frontend.sh) unless
# CUDNN_FRONTEND_INCLUDE names another folder. BENCH_ARGS replaces the bench's arguments (default: the block
# section, which runs the gemm and attention sections too, at S=16384 and 75600, for cudnn-tiles: what the model
# runs, plain at 16384 and 512 keys, zero-padded at 75600).
set -euo pipefail
src=$(pwd)
out=$(mkdir -p "${1:-${OUT:-cudnn-fe-compare}}" && cd "${1:-${OUT:-cudnn-fe-compare}}" && pwd)
fe=${CUDNN_FRONTEND_INCLUDE:-$src/.dev/cudnn-frontend/include}
bench_args=${BENCH_ARGS:---sections block --seq 16384,75600 --backends cudnn-tiles}
variants="backend frontend"
jobs=$(( $(nproc) / 2 )); [ "$jobs" -ge 1 ] || jobs=1
[ -f "$fe/cudnn_frontend.h" ] || { echo "cudnn_fe_compare.sh: no $fe/cudnn_frontend.h (run tools/fetch_cudnn_frontend.sh here first)" >&2; exit 2; }
if [ -f config.status ]; then  # configured in place: out-of-tree builds refuse such a source folder
    echo "cudnn_fe_compare.sh: make distclean first (the source folder is configured in place)" >&2; exit 2; fi
[ -x configure ] || autoreconf -fi > "$out/autoreconf.log" 2>&1

# 1. both builds at once (half the cores each)
for v in $variants; do
    (mkdir -p "b-$v" && cd "b-$v" &&
     "$src/configure" ${ALDIT_DEVICE_CONFIGURE_FLAGS:-} --with-cudnn-attention=$v --with-cudnn-frontend="$fe" \
         > "$out/configure-$v.log" 2>&1 &&
     make -j"$jobs" aldit-bench tests/test_cuda_attention_cudnn > "$out/make-$v.log" 2>&1) &
    eval "build_$v=$!"
done
status=0
for v in $variants; do
    pid_var=build_$v
    if ! wait "${!pid_var}"; then echo "build $v failed: see $out/configure-$v.log, $out/make-$v.log" >&2; status=1; fi
done
[ $status = 0 ] || { tail -20 "$out"/make-*.log >&2; exit 1; }
for v in $variants; do
    grep -q "cuDNN attention *$v " "$out/configure-$v.log" || { echo "b-$v: not configured with $v" >&2; exit 1; }
done

# 2. the oracle test in each build
for v in $variants; do
    echo "== tests/test_cuda_attention_cudnn ($v)"
    if ./b-$v/tests/test_cuda_attention_cudnn > "$out/test-$v.log" 2>&1; then echo "passed"; else
        echo "FAILED (exit $?)"; status=1; fi
    grep -E "^(not ok|ok|# )" "$out/test-$v.log" | head -40 || true
done

# 3. the bench with each, in turn
for v in $variants; do
    echo "== aldit-bench $bench_args ($v)"
    start=$(date +%s)
    ./b-$v/aldit-bench $bench_args --json "$out/bench-$v.json" > "$out/bench-$v.txt" 2>&1 || {
        echo "aldit-bench ($v) failed:"; tail -20 "$out/bench-$v.txt"; status=1; }
    echo "  $(( $(date +%s) - start )) s"
done

# 4. side by side: the attention rows (S kind backend kv fwd_ms fwd_TF bwd_ms bwd_TF f+b_TF) and the block rows
# (S grid 1-layer deep block_ms ...), frontend / backend as a ratio of times
awk '
FNR == 1 { v = (FILENAME ~ /bench-backend/) ? "b" : "f" }
$2 ~ /^(self|cross)$/ && $3 ~ /^cudnn/ && NF >= 9 {
    key = sprintf("%-6s %-6s %-11s %6s", $1, $2, $3, $4); if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    fwd[v, key] = $5; bwd[v, key] = $7 }
$2 ~ /^[0-9]+x[0-9]+x[0-9]+$/ && NF >= 5 {
    if (!($1 in bseen)) { bseen[$1] = 1; border[++m] = $1 }
    block[v, $1] = $5 }
function ratio(a, b) { return (a != "" && b != "" && b + 0 > 0) ? sprintf("%.3f", a / b) : "-" }
END {
    printf "cuDNN attention, ms (frontend/backend < 1: the frontend is faster)\n"
    printf "%-6s %-6s %-11s %6s | %9s %9s | %9s %9s | %7s %7s\n", "S", "kind", "impl", "kv", "fwd be", "fwd fe",
           "bwd be", "bwd fe", "fwd f/b", "bwd f/b"
    for (i = 1; i <= n; ++i) { k = order[i]
        printf "%s | %9s %9s | %9s %9s | %7s %7s\n", k, fwd["b", k], fwd["f", k], bwd["b", k], bwd["f", k],
               ratio(fwd["f", k], fwd["b", k]), ratio(bwd["f", k], bwd["b", k]) }
    printf "\nWan-1.3B block forward+backward, ms\n%-6s | %9s %9s | %7s\n", "S", "backend", "frontend", "f/b"
    for (i = 1; i <= m; ++i) { s = border[i]
        printf "%-6s | %9s %9s | %7s\n", s, block["b", s], block["f", s], ratio(block["f", s], block["b", s]) }
}' "$out/bench-backend.txt" "$out/bench-frontend.txt" | tee "$out/compare.txt"
echo "lines of code: $(wc -l < cuda/attention_cudnn.cu) cuda/attention_cudnn.cu, $(wc -l < cuda/attention_cudnn_fe.cu) cuda/attention_cudnn_fe.cu" | tee -a "$out/compare.txt"
exit $status
