#!/bin/sh
# train_vs_peer.sh — aldit against its PyTorch peer (tests/bench/peer_train.py) on the same store and samples, in one
# call, and the floor: aldit-bench's GEMM and attention rates measured in the same call. Prints the table of
# tests/bench/train_table.py (samples/s, tokens/s, model TFLOP/s, peak GiB, aldit/peer, the floor).
#
# usage: tests/bench/train_vs_peer.sh [--smoke] [--family wan|hunyuanvideo15] [BUILD_DIR]   (default: wan, the
#   current directory)
#   GPU (default), family wan: the store of docs/PERFORMANCE.md (aldit-store synth, inputs/mixed.lengths, 800
#     samples, 64 text tokens of 4096, seed 11), inputs/wan1.3b-8layers.ini (Wan-1.3B dims, 8 layers, recompute
#     none, one epoch), aldit-bench --sections gemm,attention at S = 256 ... 76032, aldit on one GPU, the peer on the same GPU; each
#     run's peak memory is the largest memory.used nvidia-smi reports while it runs (every 0.2 s).
#   GPU, --family hunyuanvideo15: inputs/hunyuanvideo15-8layers.ini (HunyuanVideo-1.5 dims, 8 blocks, recompute
#     none, one epoch) against diffusers' HunyuanVideo15Transformer3DModel (peer_train.py, peer_mmdit.py) on a mixed
#     image/video store with real-length captions (aldit-store synth, inputs/hunyuanvideo15-1gpu.lengths: Qwen
#     captions of 50 to 1,000 tokens of 3584, up to 256 ByT5 rows of 1472, 729 SigLIP rows of 1152 per video, 1000
#     samples, seed 11), aldit-bench --wan hv15 (its GEMM widths and heads) at S = 256 ... 63232 (joint lengths
#     N = S + L up to 61,200 + 1,985).
#   --smoke: the same steps at toy size on the CPU (a 2-layer model of dim 32, 40 samples of
#     tests/decks/train_tiny.lengths, with hunyuanvideo15 toy caption sources and i2v_share 0.5, the peer eager with
#     one block checkpointed; no aldit-bench), as TAP: both runs finish, train the same samples, tokens and model
#     FLOPs, the table prints, and its floor, from a made-up aldit-bench JSON of 1e9 FLOP/s for GEMMs and attention,
#     gives aldit's model FLOPs at 1e9 FLOP/s (every sample's rows priced). Skips (exit 77) where torch, diffusers
#     or h5py do not import. make check runs it (tests/bench/train_smoke.sh, tests/bench/train_smoke_hunyuan.sh).
# Environment: WORK (scratch folder; default a new one under /tmp, kept), ALDIT_LAUNCH (default "mpirun -np 1";
# --smoke: none), PEER_ARGS (more peer_train.py options, e.g. "--compile model" or "--attention-backend NAME"),
# SAMPLES (800; hunyuanvideo15: 1000), SMOKE_COMPILE (--smoke: the peer's --compile, default none: inductor's first
# CPU compile takes minutes), RUNS (GPU: the runs of this call, default "aldit peer"; one left out, and aldit-bench
# where WORK has its JSON, are read from WORK, an earlier call's: e.g. RUNS=aldit, then RUNS=peer, for calls of
# limited length; the table is printed each time), FP8 (1: after the bf16
# run, the same epoch again with train.precision=fp8 into WORK/aldit_fp8, a row of its own in the table with its
# ratios to bf16 aldit and to the peer; GPU only, a GPU of compute capability 8.9 or more), FP8_ARGS (more overrides
# of that fp8 run, e.g. "train.fp8_attention=on").
# GPU: nvidia-smi's SM clock and power every 100 ms go to WORK/smi.csv with a mark after each phase (WORK/marks.txt),
# and tools/clock_summary.py's table per phase ends the output: the floor's rates come from aldit-bench's short timed
# bursts, the runs are minutes of sustained load, and this says whether they ran at the same clocks.
set -u
smoke=0
family=wan
while :; do
    case ${1:-} in
        --smoke) smoke=1; shift ;;
        --family) family=${2:-}; shift 2 || { echo "train_vs_peer.sh: --family needs a value" >&2; exit 2; } ;;
        *) break ;;
    esac
done
build=$(cd "${1:-.}" && pwd)
srcdir=${SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${PYTHON:-python3}
case $family in
    wan) deck="$srcdir/inputs/wan1.3b-8layers.ini" ;;
    hunyuanvideo15) deck="$srcdir/inputs/hunyuanvideo15-8layers.ini" ;;
    *) echo "train_vs_peer.sh: --family $family: wan or hunyuanvideo15" >&2; exit 2 ;;
esac

missing=
for module in torch diffusers h5py numpy; do
    "$PYTHON" -c "import $module" > /dev/null 2>&1 || missing="$missing $module"
done
if [ -n "$missing" ]; then
    if [ "$smoke" = 1 ]; then echo "1..0 # SKIP $PYTHON cannot import:$missing"; else echo "train_vs_peer.sh: $PYTHON cannot import:$missing" >&2; fi
    [ "${CMOCKA_MESSAGE_OUTPUT:-}" = TAP ] && exit 0
    exit 77
fi
for program in aldit aldit-store; do
    [ -x "$build/$program" ] || { echo "train_vs_peer.sh: $build/$program not found (build it: make $program)" >&2; exit 2; }
done
work=${WORK:-$(mktemp -d /tmp/train_vs_peer.XXXXXX)}
mkdir -p "$work" || exit 2

# peak MiB of GPU 0 while COMMAND runs: peak_watch FILE COMMAND...; the peak goes to FILE ("-" without nvidia-smi)
peak_watch() {
    out=$1; shift
    if [ "$smoke" = 1 ] || ! command -v nvidia-smi > /dev/null 2>&1; then echo - > "$out"; "$@"; return; fi
    ( peak=0
      while :; do
          used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | tr -d ' ')
          [ -n "$used" ] && [ "$used" -gt "$peak" ] && { peak=$used; echo "$peak" > "$out"; }
          sleep 0.2
      done ) &
    watcher=$!
    "$@"; status=$?
    kill "$watcher" 2> /dev/null; wait "$watcher" 2> /dev/null
    return $status
}
# the GPU's SM clock and power every 100 ms over the whole call (GPU only), with a mark after each phase, so that a run
# and the aldit-bench rates its floor is priced at can be compared at the clocks they ran at (tools/clock_summary.py)
clock_watch() {
    [ "$smoke" = 1 ] || ! command -v nvidia-smi > /dev/null 2>&1 && return
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv -lms 100 \
        >> "$work/smi.csv" 2> /dev/null &
    smi_pid=$!
    mark "call start"
}
mark() { [ -n "${smi_pid:-}" ] && echo "$(date +%s.%N) $1" >> "$work/marks.txt"; return 0; }
gib_of() { v=$(cat "$1" 2>/dev/null); case $v in ''|-) echo "" ;; *) awk -v m="$v" 'BEGIN {printf "%.2f", m / 1024}' ;; esac; }

if [ "$smoke" = 1 ] && [ "$family" = wan ]; then
    store="$work/smoke.h5"
    set -- run.device=cpu run.threads=1 model.dim=32 model.ffn_dim=64 model.num_heads=2 model.num_layers=2 \
        model.text_len=16 model.text_dim=16 model.freq_dim=32 balance.mem_budget=256MiB balance.calibrate=0 \
        balance.global_batch=8 train.warmup_steps=2 "data.store=$store" "run.dir=$work/aldit"
    synth="--text-len 8 --text-dim 16"
elif [ "$smoke" = 1 ]; then   # hunyuanvideo15 at toy size: head dim 16 (RoPE 4/6/6), diffusers' 256-wide sinusoid
    store="$work/smoke.h5"
    set -- run.device=cpu run.threads=1 model.dim=32 model.ffn_dim=64 model.num_heads=2 model.num_layers=2 \
        model.in_dim=9 model.out_dim=4 model.text_len=16 model.text_dim=12 model.text_2_dim=6 model.image_dim=10 \
        model.rope_axes_t=4 train.recompute=none balance.recompute=none train.i2v_share=0.5 \
        balance.mem_budget=256MiB balance.calibrate=0 balance.global_batch=8 train.warmup_steps=2 \
        "data.store=$store" "run.dir=$work/aldit"
    synth="--text-len 16 --text-dim 12 --channels 4 --text-2-dim 6 --text-2-len 5 --image-dim 10 --image-len 3"
fi
if [ "$smoke" = 1 ]; then
    # shellcheck disable=SC2086
    "$build/aldit-store" synth --spec "$srcdir/tests/decks/train_tiny.lengths" --samples 40 $synth \
        --seed 11 --out "$store" > "$work/store.log" 2>&1 || { echo "Bail out! aldit-store synth failed: $(cat "$work/store.log")"; exit 1; }
    launch=${ALDIT_LAUNCH:-}
    peer_options="--device cpu --bucket-tokens 64 --compile ${SMOKE_COMPILE:-none} --checkpoint 1"
else
    store="$work/peer.h5"
    set -- "data.store=$store" "run.dir=$work/aldit"
    if [ "$family" = wan ]; then
        spec=mixed.lengths samples=${SAMPLES:-800} synth="--text-len 64 --text-dim 4096"
        bench="--wan 1.3b --seq 256,1024,4096,16384,32760,76032"
    else
        spec=hunyuanvideo15-1gpu.lengths samples=${SAMPLES:-1000}
        synth="--text-len 1000 --text-dim 3584 --channels 32 --text-2-dim 1472 --text-2-len 256"
        synth="$synth --image-dim 1152 --image-len 729"
        bench="--wan hv15 --seq 256,1024,4096,16384,32760,63232"
    fi
    # shellcheck disable=SC2086
    clock_watch
    [ -f "$store" ] || "$build/aldit-store" synth --spec "$srcdir/inputs/$spec" --samples "$samples" $synth --seed 11 \
        --out "$store" || exit 2
    [ -x "$build/aldit-bench" ] || { echo "train_vs_peer.sh: $build/aldit-bench not found (a CUDA build: make aldit-bench)" >&2; exit 2; }
    if [ -f "$work/bench.json" ] && [ -n "${RUNS:-}" ]; then
        echo "== aldit-bench: $work/bench.json of an earlier call (RUNS is set)"
    else
        echo "== aldit-bench: the block's GEMMs and attention at the store's S (the floor's rates)"
        # shellcheck disable=SC2086
        "$build/aldit-bench" --sections gemm,attention $bench --backends own,cudnn \
            --repeats 5 --json "$work/bench.json" || exit 1
        mark "aldit-bench (the floor's rates)"
    fi
    launch=${ALDIT_LAUNCH:-mpirun -np 1}
    peer_options="--device cuda"
fi
# RUNS (GPU): the runs of this call, "aldit peer" by default; a run left out is read from WORK (an earlier call's)
runs=${RUNS:-aldit peer}
[ "$smoke" = 1 ] && runs="aldit peer"
case " $runs " in
    *" aldit "*)
        rm -rf "$work/aldit"
        [ "$smoke" = 1 ] || echo "== aldit: $deck $*"
        started=$(date +%s.%N)
        # shellcheck disable=SC2086
        # no final checkpoint: it is no part of the comparison, and 30 s of a device call at HunyuanVideo-1.5's size
        peak_watch "$work/aldit.peak" $launch "$build/aldit" "$deck" "$@" log.micro_batches=on checkpoint.at_end=off \
            > "$work/aldit.log" 2>&1
        aldit_status=$?
        awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f\n", b - a}' > "$work/aldit.wall"
        echo "$aldit_status" > "$work/aldit.status"
        mark "aldit (start-up and epoch)"
        [ "$smoke" = 1 ] || tail -n 25 "$work/aldit.log" ;;
    *)  aldit_status=$(cat "$work/aldit.status" 2>/dev/null || echo 1)
        echo "== aldit: $work/aldit of an earlier call (exit $aldit_status)" ;;
esac
aldit_wall=$(cat "$work/aldit.wall" 2>/dev/null)
fp8_status=0
if [ "${FP8:-0}" = 1 ] && [ "$smoke" = 0 ]; then
    echo "== aldit: $deck data.store=$store run.dir=$work/aldit_fp8 train.precision=fp8 ${FP8_ARGS:-}"
    rm -rf "$work/aldit_fp8"
    # shellcheck disable=SC2086
    peak_watch "$work/aldit_fp8.peak" $launch "$build/aldit" "$deck" "data.store=$store" "run.dir=$work/aldit_fp8" \
        train.precision=fp8 ${FP8_ARGS:-} > "$work/aldit_fp8.log" 2>&1; fp8_status=$?
    mark "aldit fp8 (start-up and epoch)"
    tail -n 25 "$work/aldit_fp8.log"
fi
case " $runs " in
    *" peer "*)
        [ "$smoke" = 1 ] || echo "== peer_train.py"
        # shellcheck disable=SC2086
        peak_watch "$work/peer.peak" "$PYTHON" "$srcdir/tests/bench/peer_train.py" --deck "$deck" $peer_options \
            ${PEER_ARGS:-} --json "$work/peer.json" "$@" > "$work/peer.log" 2>&1; peer_status=$?
        echo "$peer_status" > "$work/peer.status"
        mark "peer (loading, warm-up, epoch)"
        [ "$smoke" = 1 ] || tail -n 5 "$work/peer.log" ;;
    *)  peer_status=$(cat "$work/peer.status" 2>/dev/null || echo 1)
        echo "== peer_train.py: $work/peer.json of an earlier call (exit $peer_status)" ;;
esac

table_options=
[ "$smoke" = 1 ] || table_options="--bench $work/bench.json"
# each of aldit's micro-batches against its floor (an earlier call's aldit run may predate the log)
[ "$smoke" = 1 ] || [ ! -s "$work/aldit/micro_batches.0.jsonl" ] || \
    table_options="$table_options --micro-batches $work/aldit/micro_batches.0.jsonl"
aldit_gib=$(gib_of "$work/aldit.peak"); peer_gib=$(gib_of "$work/peer.peak")
[ -n "$aldit_gib" ] && table_options="$table_options --aldit-peak-gib $aldit_gib"
[ -n "$peer_gib" ] && table_options="$table_options --peer-peak-gib $peer_gib"
if [ "${FP8:-0}" = 1 ] && [ "$smoke" = 0 ]; then
    table_options="$table_options --aldit-fp8 $work/aldit_fp8/metrics.jsonl"
    fp8_gib=$(gib_of "$work/aldit_fp8.peak")
    [ -n "$fp8_gib" ] && table_options="$table_options --aldit-fp8-peak-gib $fp8_gib"
fi
# shellcheck disable=SC2086
"$PYTHON" "$srcdir/tests/bench/train_table.py" --deck "$deck" --aldit "$work/aldit/metrics.jsonl" --peer "$work/peer.json" \
    --aldit-wall-s "${aldit_wall:-0}" --json "$work/table.json" $table_options "$@" > "$work/table.txt" 2>&1; table_status=$?

if [ "$smoke" = 0 ]; then
    cat "$work/table.txt"
    if [ -n "${smi_pid:-}" ]; then
        kill "$smi_pid" 2> /dev/null; wait "$smi_pid" 2> /dev/null
        echo "GPU clocks and power while busy (over 300 W), per phase of this and earlier calls with this WORK:"
        "$PYTHON" "$srcdir/tools/clock_summary.py" "$work/smi.csv" "$work/marks.txt" || true
    fi
    echo "(files in $work; aldit exit $aldit_status, peer exit $peer_status${FP8:+, aldit fp8 exit $fp8_status})"
    [ "$aldit_status" = 0 ] && [ "$peer_status" = 0 ] && [ $table_status = 0 ] && [ $fp8_status = 0 ]
    exit $?
fi

# the floor from a made-up aldit-bench JSON: GEMMs at 1e9 FLOP/s and attention at 3e-9 s per forward FLOP of a
# forward+backward (1e9 model FLOP/s), so the floor's model FLOP/s must be 1e9 when it prices every sample's rows
BENCH_DIR="$srcdir/tests/bench" "$PYTHON" - "$work/bench.json" "$deck" "$@" > "$work/bench.log" 2>&1 <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["BENCH_DIR"])
import train_table
deck = train_table.read_deck(sys.argv[2], sys.argv[3:])
dims = train_table.model_dims(deck)
heads, head = dims["num_heads"], dims["dim"] // dims["num_heads"]
entries = [{"kind": kind, "S": s, "kv_rows": s if kind == "self" else 16, "fwd_ms": 0.0,
            "bwd_ms": 3e-6 * 4.0 * s * (s if kind == "self" else 16) * heads * head}
           for kind in ("self", "cross") for s in (16, 256)]
json.dump({"dim": dims["dim"], "attention_heads": heads, "attention_head_dim": head,
           "gemm_block": [{"S": 16, "tflops": 1e-3}, {"S": 256, "tflops": 1e-3}], "attention": entries},
          open(sys.argv[1], "w"))
PY
bench_status=$?
# shellcheck disable=SC2086
[ $bench_status = 0 ] && "$PYTHON" "$srcdir/tests/bench/train_table.py" --deck "$deck" --aldit "$work/aldit/metrics.jsonl" \
    --peer "$work/peer.json" --bench "$work/bench.json" --micro-batches "$work/aldit/micro_batches.0.jsonl" \
    --json "$work/floor.json" "$@" > "$work/floor.txt" 2>&1
floor_status=$?
rate=$("$PYTHON" -c "import json, sys; print(json.load(open(sys.argv[1]))['floor']['model_tflops'] * 1e12)" \
    "$work/floor.json" 2>/dev/null)
awk -v r="${rate:-0}" 'BEGIN { exit !(r > 0.99999e9 && r < 1.00001e9) }' || floor_status=1
# the micro-batches aldit logged, priced alike, must add up to the epoch's floor: every sample logged once, with the
# video tokens and caption rows the table counts from the store
micro=$("$PYTHON" -c "import json, sys; d = json.load(open(sys.argv[1])); print(d['micro_batches']['floor_s'] / d['floor']['time_s'])" \
    "$work/floor.json" 2>/dev/null)
micro_status=0
awk -v r="${micro:-0}" 'BEGIN { exit !(r > 0.999999 && r < 1.000001) }' || micro_status=1

# the peer's learning rate at each of aldit's steps (peer_train.py's scheduled_lr, over aldit's step count) is aldit's
lr_check=$("$PYTHON" -c "
import json, sys
sys.path.insert(0, sys.argv[1])
import peer_train, train_table
deck = train_table.read_deck(sys.argv[2], sys.argv[4:])
rows = [json.loads(line) for line in open(sys.argv[3])]
worst = max(abs(peer_train.scheduled_lr(deck, r['step'], len(rows)) - r['lr']) / r['lr'] for r in rows)
print(f'{len(rows)} steps, largest relative difference {worst:.2e}')
sys.exit(worst > 1e-9)
" "$srcdir/tests/bench" "$deck" "$work/aldit/metrics.jsonl" "$@" 2>&1)
lr_status=$?

# the fp8 row from a doctored copy of aldit's metrics (the first step 1.5x as long, the others 0.8x): the table's line
# gives the epoch's ratio and 1.250x over the steps after the first
"$PYTHON" -c "
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
with open(sys.argv[2], 'w') as out:
    for i, r in enumerate(rows):
        wait = r.get('data_wait_s', 0.0) if i == 0 else 0.0   # the first step's loading is not counted
        r['step_s'] = wait + (r['step_s'] - wait) * (1.5 if i == 0 else 0.8)
        out.write(json.dumps(r) + '\n')
" "$work/aldit/metrics.jsonl" "$work/fp8_metrics.jsonl" > "$work/fp8_table.txt" 2>&1 &&
    "$PYTHON" "$srcdir/tests/bench/train_table.py" --deck "$deck" --aldit "$work/aldit/metrics.jsonl" \
        --peer "$work/peer.json" --aldit-fp8 "$work/fp8_metrics.jsonl" "$@" >> "$work/fp8_table.txt" 2>&1
grep -q "aldit fp8 / aldit samples/s: [0-9.]*x over the epoch .* 1.250x over its steps after the first" "$work/fp8_table.txt"
fp8_row_status=$?

. "$srcdir/tests/tap.sh"
tap_plan 9
tap_result "$aldit_status" "aldit trains one epoch of the toy store (CPU, family $family)" "$(tail -n 20 "$work/aldit.log")"
peer=$(sed -n 's/.*"peer": "\([^"]*\)".*/\1/p' "$work/peer.json" 2>/dev/null)
tap_result "$peer_status" "peer_train.py trains the same store (CPU, $peer, bf16 autocast, fused AdamW, buckets, checkpointing)" \
    "$(tail -n 20 "$work/peer.log")"
keys=0
for key in samples_per_s tokens_per_s model_tflops peak_gib model_flops steps; do
    grep -q "\"$key\":" "$work/peer.json" 2>/dev/null || keys=1
done
tap_result $keys "the peer's JSON line has samples_per_s, tokens_per_s, model_tflops, peak_gib, model_flops, steps" \
    "$(cat "$work/peer.json" 2>/dev/null)"
tap_result $table_status "the table: both runs trained the same samples, tokens and model FLOPs" "$(cat "$work/table.txt")"
case $(cat "$work/table.txt") in *"| aldit |"*"| peer (diffusers, compile "*"| aldit / peer |"*"40 samples"*) found=0 ;; *) found=1 ;; esac
tap_result $found "the table has aldit's, the peer's and the ratio row, over the 40 samples" "$(cat "$work/table.txt")"
tap_result $floor_status "the floor at made-up rates of 1e9 FLOP/s: aldit's model FLOPs at 1e9 FLOP/s (got ${rate:-none})" \
    "$(cat "$work/bench.log" "$work/floor.txt" 2>/dev/null)"
tap_result $micro_status "aldit's micro-batch log ([log] micro_batches), each priced at the same rates, sums to the epoch's floor (ratio ${micro:-none})" \
    "$(cat "$work/floor.txt" 2>/dev/null; head -3 "$work/aldit/micro_batches.0.jsonl" 2>/dev/null)"
tap_result $lr_status "the peer's learning rate at aldit's steps is aldit's (warmup, then cosine): $lr_check" "$lr_check"
tap_result $fp8_row_status "an fp8 run's row: the epoch's ratio and that over the steps after the first (1.250x)" \
    "$(cat "$work/fp8_table.txt")"
[ -n "${WORK:-}" ] || rm -rf "$work"
tap_done
