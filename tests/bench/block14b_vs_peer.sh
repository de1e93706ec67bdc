#!/bin/sh
# block14b_vs_peer.sh — the Wan-14B-dims block (dim 5120, 40 heads of 128, FFN 13824, 512 text tokens) forward+backward
# in aldit (aldit-bench --wan 14b --sections block: ((1 + K)-layer step - 1-layer step) / K, against the floor of
# its GEMMs and attentions measured in the same run) and in PyTorch (tests/bench/peer_torch.py --wan 14b, eager and
# torch.compile), at S = 4096, 16384, 32760 on the same GPU in one call; then one table with issue 18's target
# (aldit >= 1.05x torch.compile at every S).
# usage: tests/bench/block14b_vs_peer.sh [BUILD_DIR]   (a CUDA build holding aldit-bench; default the current directory)
# Environment: WORK (scratch folder for the JSON files; default a new one under /tmp), SEQ (default 4096,16384,32760),
# BLOCK_LAYERS (K, default 8), WAN (default 14b; 1.3b gives the same table for the 1.3B block), BENCH_ARGS (more
# aldit-bench options, e.g. --gemm-autotune 1 --attention-autotune 1).
set -u
build=$(cd "${1:-.}" && pwd)
srcdir=${SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${PYTHON:-python3}
seq=${SEQ:-4096,16384,32760}
wan=${WAN:-14b}
work=${WORK:-$(mktemp -d /tmp/block_vs_peer.XXXXXX)}
mkdir -p "$work" || exit 2
[ -x "$build/aldit-bench" ] || { echo "block14b_vs_peer.sh: $build/aldit-bench not found (a CUDA build: make aldit-bench)" >&2; exit 2; }
echo "== aldit-bench --wan $wan --sections block --seq $seq"
"$build/aldit-bench" --wan "$wan" --sections block --seq "$seq" --backends cudnn,cudnn-tiles --repeats 11 \
    --block-layers "${BLOCK_LAYERS:-8}" ${BENCH_ARGS:-} --json "$work/aldit.json" || exit 1
echo "== peer_torch.py --wan $wan --sections block --seq $seq"
"$PYTHON" "$srcdir/tests/bench/peer_torch.py" --wan "$wan" --sections block --seq "$seq" --json "$work/peer.json" || exit 1
"$PYTHON" - "$work/aldit.json" "$work/peer.json" <<'PY'
import json
import sys

aldit, peer = (json.load(open(path)) for path in sys.argv[1:3])
if (aldit["dim"], aldit["ffn_dim"], aldit["heads"]) != (peer["dim"], peer["ffn_dim"], peer["heads"]):
    sys.exit(f"the two measured other dims: aldit {aldit['wan']}, peer {peer['wan']}")
times = {}
for entry in peer["block"]:
    times.setdefault(entry["S"], {})[entry["mode"]] = entry.get("ms")
print(f"Wan-{aldit['wan']} block (dim {aldit['dim']}, ffn {aldit['ffn_dim']}, {aldit['heads']} heads) on {aldit['device']}:")
print("| S | aldit ms | aldit TFLOP/s | floor ms | aldit vs floor | eager ms | torch.compile ms | aldit / compile | >= 1.05x |")
print("|---|---|---|---|---|---|---|---|---|")
met = True
for entry in aldit["block"]:
    if entry.get("skipped"):
        print(f"| {entry['S']} | skipped (needs {entry['need_gib']:.1f} GiB, {entry['free_gib']:.1f} free) | | | | | | | |")
        met = False
        continue
    peer_s = times.get(entry["S"], {})
    eager, compiled = peer_s.get("eager"), peer_s.get("compile")
    speedup = compiled / entry["ms"] if compiled else None
    met = met and speedup is not None and speedup >= 1.05
    cell = lambda v, f: "-" if v is None else format(v, f)
    print(f"| {entry['S']} | {entry['ms']:.3f} | {entry['tflops']:.1f} | {entry['floor_ms']:.3f} | "
          f"{entry['over_floor_pct']:+.1f}% | {cell(eager, '.3f')} | {cell(compiled, '.3f')} | "
          f"{cell(speedup, '.3f')}x | {'yes' if speedup and speedup >= 1.05 else 'no'} |")
print("issue 18's target (>= 1.05x torch.compile at every S):", "met" if met else "not met")
PY
echo "(JSON files in $work)"
