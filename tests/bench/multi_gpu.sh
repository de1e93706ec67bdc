#!/bin/sh
# multi_gpu.sh — every multi-GPU measurement of issues 21 (2 GPUs) and 22 (8 GPUs) from one command: the three
# balance strategies against a 1-GPU run, the [train] shard modes, and the largest Wan-14B-dims model that
# `aldit --check` accepts under shard = full, trained a few steps (on mixed samples and on fixed 37,440-token
# ones); then Markdown tables ready for docs/PERFORMANCE.md (tests/bench/multi_gpu_table.py) with the issue's
# targets, and PNG plots (tools/plot_metrics.py) where matplotlib imports.
#
# usage: tests/bench/multi_gpu.sh [BUILD_DIR]     (BUILD_DIR holds aldit, aldit-store and, for the layer search's
#                                                  first guess, aldit-sim; default the current directory)
# Sections (SECTIONS, comma list; default: issue 21 strategies,shard,wan14b; issue 22 strategies,wan14b,wan14b_fixed):
#   strategies    global, equal_tokens and dual on NGPU ranks, one epoch each over the same store, and global on
#                 1 GPU (the baseline); issue 21 inputs/wan1.3b-8layers.ini, issue 22 inputs/wan1.3b.ini.
#   shard         train.shard = optimizer, gradients, full and none on NGPU ranks, the same deck and samples (none
#                 is the strategies' global run where that ran).
#   wan14b        inputs/wan14b.ini with train.shard = full: the most layers (SEARCH_FROM, 40, down; the walk
#                 starts at aldit-sim's guess) that `aldit --check` accepts on NGPU ranks, trained STEPS_14B steps.
#   wan14b_fixed  the same on a store of FIXED_SAMPLES samples of one shape (13 x 90 x 128 latents: 37,440 tokens)
#                 with FIXED_TEXT_LEN text tokens, FIXED_BATCH samples per step.
# The mixed store: aldit-store synth --spec inputs/mixed.lengths --samples SAMPLES --text-len 64 --text-dim 4096
# --seed 11 (the 1-GPU comparison of issue 20). Each run: $MPIRUN -np N aldit DECK ... run.dir=$WORK/LABEL, its
# output in $WORK/LABEL.log, "RC SECONDS NOTE" in $WORK/LABEL.status. Runs leave out the final checkpoint
# (checkpoint.at_end=off: a Wan-14B one is ~170 GB; FINAL_CHECKPOINT=1 lets runs write it); a run past its time
# limit has its ranks killed; a failed, timed-out or skipped run is a table row saying so. The whole call keeps within DEADLINE_S: a run whose expected time no longer fits is not started, and a
# second call with the same WORK runs only what is missing (REDO=1: everything again).
# Exit status: 0 every run done, 1 a run failed or timed out, 3 only that some runs did not fit the deadline,
# 2 bad usage.
# Environment: WORK (scratch; default a new folder under /tmp), NGPU (default: the GPUs nvidia-smi -L lists),
# ISSUE (21 or 22; default 22 when NGPU >= 8), SECTIONS, RUNS (strategies: any of global,equal_tokens,dual,1gpu),
# SHARDS (any of none,optimizer,gradients,full), MPIRUN (default mpirun), DEADLINE_S (default 540), TIMEOUT (the
# limit of each run; default twice its expected time), SAMPLES (800), BASELINE_STEPS (the 1-GPU run's steps;
# default 0: the whole epoch), STEPS_14B (4), SEARCH_FROM (40), FIXED_SAMPLES (16 x NGPU), FIXED_TEXT_LEN (512),
# FIXED_BATCH (global_batch of the fixed-length runs; default 2 x NGPU), ARGS (key=value overrides for every
# run, of keys the script does not set: aldit refuses a key given twice), KEEP_CHECKPOINTS (default 0: a run's
# checkpoints are deleted after it), FINAL_CHECKPOINT, PLOTS (default $WORK/plots; off: none), REDO,
# CALIBRATION_SHARE (default 1: the first run of a deck and layer count that times the start-up calibration leaves
# it in $WORK/calibration.DECK[.Kl].txt and the later ones start from it, in their own run folder, so that every
# strategy and shard mode plans from the same timings and none pays for them again; the key in the file still has
# to match, else a run times its own; 0: every run times its own),
# BASELINE_GPU (the 1-GPU run's CUDA_VISIBLE_DEVICES, default 0), PYTHON, and E_RUN, E_ONE, E_SHARD, E_CHECK, E_14B:
# the seconds expected of an NGPU strategy run, the 1-GPU run, a shard run, a --check and a Wan-14B run (issue 21:
# 75, 100, 75, 30, 240; issue 22: 130, 330, 130, 40, 270), which decide what still fits the deadline.
# SMOKE=1: the same steps at toy size on the CPU (run.device=cpu, inputs/quickstart.ini, 40 samples of
# inputs/quickstart.lengths, NGPU ranks (default 2), 2 steps per run, the layer search on the quick-start deck
# under balance.mem_budget = 1MiB from 6 layers down); make check runs it (tests/multi_gpu_smoke.sh).
set -u
build=$(cd "${1:-.}" && pwd) || exit 2
srcdir=${SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${PYTHON:-python3}
smoke=${SMOKE:-0}
redo=${REDO:-0}
started=$(date +%s.%N)
for program in aldit aldit-store; do
    [ -x "$build/$program" ] || { echo "multi_gpu.sh: $build/$program not found (build it: make $program)" >&2; exit 2; }
done

if [ "$smoke" = 1 ]; then
    ngpu=${NGPU:-2}
    MPIRUN=${MPIRUN:-${MPIEXEC:-mpirun} --oversubscribe}
    deadline_s=${DEADLINE_S:-240}
elif [ -n "${NGPU:-}" ]; then
    ngpu=$NGPU
else
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
MPIRUN=${MPIRUN:-mpirun}
deadline_s=${deadline_s:-${DEADLINE_S:-540}}
case $ngpu in ''|*[!0-9]*|0|1) echo "multi_gpu.sh: NGPU = '$ngpu': needs 2 or more GPUs (ranks with SMOKE=1)" >&2; exit 2 ;; esac
issue=${ISSUE:-$([ "$ngpu" -ge 8 ] && echo 22 || echo 21)}
case $issue in
    21) sections=${SECTIONS:-strategies,shard,wan14b}; deck13="$srcdir/inputs/wan1.3b-8layers.ini" ;;
    22) sections=${SECTIONS:-strategies,wan14b,wan14b_fixed}; deck13="$srcdir/inputs/wan1.3b.ini" ;;
    *) echo "multi_gpu.sh: ISSUE = '$issue': 21 or 22" >&2; exit 2 ;;
esac
for section in $(echo "$sections" | tr ',' ' '); do
    case $section in strategies|shard|wan14b|wan14b_fixed) ;; *)
        echo "multi_gpu.sh: SECTIONS: unknown section '$section' (strategies, shard, wan14b, wan14b_fixed)" >&2; exit 2 ;;
    esac
done
work=${WORK:-$(mktemp -d /tmp/multi_gpu.XXXXXX)}
mkdir -p "$work" || exit 2
work=$(cd "$work" && pwd)
plots=${PLOTS:-$work/plots}
runs=${RUNS:-global,equal_tokens,dual,1gpu}
shards=${SHARDS:-none,optimizer,gradients,full}
args=${ARGS:-}
[ "${FINAL_CHECKPOINT:-0}" = 1 ] || args="$args checkpoint.at_end=off"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"   # the project's NVLink machines have no multicast set up
deck14="$srcdir/inputs/wan14b.ini"
if [ "$smoke" = 1 ]; then
    deck13="$srcdir/inputs/quickstart.ini"; deck14=$deck13
    run13="run.device=cpu run.threads=1 log.every=1" len13="run.steps=2"
    run14="run.device=cpu run.threads=1 balance.mem_budget=1MiB"
    samples=${SAMPLES:-40}; steps14=${STEPS_14B:-2}; search_from=${SEARCH_FROM:-6}
    fixed_spec="1 1 8 8"; fixed_samples=${FIXED_SAMPLES:-40}; fixed_text=${FIXED_TEXT_LEN:-16}
    # expected seconds: N-rank strategy run, 1-rank run, shard run, --check, Wan-14B training run
    e_run=10; e_one=10; e_shard=10; e_check=10; e_14b=10
else
    samples=${SAMPLES:-800}
    run13="log.every=10 checkpoint.keep=1" len13="run.steps=0 run.epochs=1"
    run14=""
    steps14=${STEPS_14B:-4}; search_from=${SEARCH_FROM:-40}
    fixed_spec="1 13 90 128"; fixed_samples=${FIXED_SAMPLES:-$((16 * ngpu))}; fixed_text=${FIXED_TEXT_LEN:-512}
    if [ "$issue" = 21 ]; then e_run=75; e_one=100; e_shard=75; e_check=30; e_14b=240
    else e_run=130; e_one=330; e_shard=130; e_check=40; e_14b=270; fi
fi
e_run=${E_RUN:-$e_run} e_one=${E_ONE:-$e_one} e_shard=${E_SHARD:-$e_shard} e_check=${E_CHECK:-$e_check} e_14b=${E_14B:-$e_14b}
fixed_batch=${FIXED_BATCH:-$((2 * ngpu))}
reserve=15      # seconds kept for the tables and plots
failed=0; skipped=0

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }
left() { awk -v a="$started" -v b="$(date +%s.%N)" -v d="$deadline_s" -v r="$reserve" 'BEGIN {printf "%d", d - r - (b - a)}'; }
status_ok() { [ -f "$work/$1.status" ] && [ "$(cut -d' ' -f1 "$work/$1.status")" = 0 ]; }

# kill_ranks DIR LAUNCHER: SIGKILL the aldit processes whose command line holds run.dir=DIR (the run's ranks; the
# same argument in every rank), then the launcher if it has not gone 10 s later
kill_ranks() {
    for proc in /proc/[0-9]*; do
        read -r name 2>/dev/null < "$proc/comm" || continue
        [ "$name" = aldit ] || continue
        tr '\000' '\n' 2>/dev/null < "$proc/cmdline" | grep -qxF "run.dir=$1" && kill -KILL "${proc#/proc/}" 2>/dev/null
    done
    waited=0
    while kill -0 "$2" 2>/dev/null && [ $waited -lt 50 ]; do sleep 0.2; waited=$((waited + 1)); done
    kill -0 "$2" 2>/dev/null && kill -KILL "$2" 2>/dev/null
}

# bounded LOG DIR LIMIT_S COMMAND...: runs COMMAND (output to LOG) and watches it every 0.2 s: past LIMIT_S its ranks
# (those of run.dir=DIR) are killed. Sets rc, how ("" or "timed out ...") and seconds, and with nvidia-smi writes the largest memory.used (MiB, over the GPUs) while it ran to LOG's .gpu_peak beside it.
bounded() {
    log=$1 dir=$2 limit=$3; shift 3
    peak_file=${log%.log}.gpu_peak
    rm -f "$peak_file"
    t_start=$(date +%s.%N)
    "$@" > "$log" 2>&1 &
    pid=$!
    how='' tick=0 peak=0
    while kill -0 "$pid" 2>/dev/null; do
        sleep 0.2
        tick=$((tick + 1))
        if [ $((tick % 5)) = 0 ]; then
            if [ "$(awk -v a="$t_start" -v b="$(date +%s.%N)" -v l="$limit" 'BEGIN {print (b - a > l)}')" = 1 ]; then
                how="timed out (limit $limit s)"; kill_ranks "$dir" "$pid"; break
            fi
            if [ "$smoke" = 0 ] && command -v nvidia-smi > /dev/null 2>&1; then
                used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | sort -n | tail -n 1 | tr -d ' ')
                case $used in ''|*[!0-9]*) ;; *) [ "$used" -gt "$peak" ] && { peak=$used; echo "$peak" > "$peak_file"; } ;; esac
            fi
        fi
    done
    wait "$pid"; rc=$?
    case $how in timed*) [ $rc = 0 ] && rc=124 ;; esac
    seconds=$(elapsed "$t_start")
}

# limit_for EXPECT_S: the time limit of a run expected to take EXPECT_S, or "" when it no longer fits the deadline
limit_for() {
    l=$(left)
    [ "$l" -lt "$1" ] && { echo ""; return; }
    cap=${TIMEOUT:-$((2 * $1))}
    [ "$cap" -lt "$l" ] && echo "$cap" || echo "$l"
}

# calibration_cache DECK [key=value ...]: the file the runs of DECK (and of its model.num_layers) share their start-up
# calibration in, or "" with CALIBRATION_SHARE=0
calibration_cache() {
    [ "${CALIBRATION_SHARE:-1}" = 1 ] || { echo ""; return; }
    name=$(basename "$1" .ini); shift
    for arg in "$@"; do case $arg in model.num_layers=*) name="$name.${arg#model.num_layers=}l" ;; esac; done
    echo "$work/calibration.$name.txt"
}

# launch LABEL RANKS EXPECT_S DECK [key=value ...]: one training run into $work/LABEL within its limit (bounded),
# without its final checkpoint unless FINAL_CHECKPOINT=1, starting from the shared calibration where there is one
# (calibration_cache); run_env: environment for the launcher (one GPU)
launch() {
    label=$1 np=$2 expect=$3; shift 3
    if [ "$redo" = 0 ] && status_ok "$label"; then
        echo "== $label: done in an earlier call ($(cut -d' ' -f2 "$work/$label.status") s)"; return 0
    fi
    limit=$(limit_for "$expect")
    if [ -z "$limit" ]; then
        echo "-1 0 not run: expected ~$expect s, $(left) s left of DEADLINE_S = $deadline_s (run again with WORK=$work)" \
            > "$work/$label.status"
        echo "== $label: not started (expected ~$expect s, $(left) s left)"; skipped=1; return 1
    fi
    rm -rf "${work:?}/$label" "$work/$label.alias"
    echo "== $label: ${run_env:+$run_env }$MPIRUN -np $np aldit $(echo "$* $args" | sed "s|$srcdir/||g; s|$work/||g") (limit $limit s)"
    shared=$(calibration_cache "$@")
    if [ -n "$shared" ] && [ -s "$shared" ]; then
        mkdir -p "$work/$label" && cp "$shared" "$work/$label/calibration.txt"
        echo "   the start-up calibration from ${shared#$work/}"
    fi
    # shellcheck disable=SC2086
    bounded "$work/$label.log" "$work/$label" "$limit" env $run_env $MPIRUN -np "$np" "$build/aldit" "$@" $args \
        "run.dir=$work/$label"
    echo "$rc $seconds $how" > "$work/$label.status"
    echo "   exit $rc in $seconds s${how:+ ($how)}"
    if [ -n "$shared" ] && [ ! -s "$shared" ] && [ -s "$work/$label/calibration.txt" ]; then
        cp "$work/$label/calibration.txt" "$shared.tmp" && mv "$shared.tmp" "$shared"
    fi
    [ "$rc" = 0 ] || { failed=1; tail -n 3 "$work/$label.log" | sed 's/^/   | /'; }
    [ "${KEEP_CHECKPOINTS:-0}" = 1 ] || rm -rf "${work:?}/$label/checkpoints"
    return "$rc"
}

# store NAME SPEC COUNT TEXT_LEN: $work/NAME.h5 from aldit-store synth (kept for a later call)
store() {
    out="$work/$1.h5"
    [ -f "$out" ] && { echo "$out"; return 0; }
    if [ "$smoke" = 1 ]; then dim=32; else dim=4096; fi
    "$build/aldit-store" synth --spec "$2" --samples "$3" --text-len "$4" --text-dim "$dim" --seed 11 --out "$out.tmp" \
        > "$work/$1.store.log" 2>&1 && mv "$out.tmp" "$out" && { echo "$out"; return 0; }
    echo "multi_gpu.sh: aldit-store synth failed: $(tail -n 2 "$work/$1.store.log")" >&2
    return 1
}

in_list() { case ",$2," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

section_strategies() {
    # shellcheck disable=SC2086
    for s in global equal_tokens dual; do
        in_list "$s" "$runs" && launch "${s}_${ngpu}gpu" "$ngpu" "$e_run" "$deck13" "data.store=$mixed" \
            "balance.strategy=$s" train.shard=none $run13 $len13
    done
    if in_list 1gpu "$runs"; then
        one="$run13 $len13"
        [ "${BASELINE_STEPS:-0}" -gt 0 ] && one="$run13 run.steps=$BASELINE_STEPS"
        [ "$smoke" = 1 ] || run_env="CUDA_VISIBLE_DEVICES=${BASELINE_GPU:-0}"
        # shellcheck disable=SC2086
        launch global_1gpu 1 "$e_one" "$deck13" "data.store=$mixed" balance.strategy=global train.shard=none $one
        run_env=
    fi
    # aldit-sim's plan of the same store, ranks and budget (the N-rank global run's measured mem_budget)
    if [ -x "$build/aldit-sim" ] && [ -s "$work/global_${ngpu}gpu/metrics.jsonl" ]; then
        budget=$(sed -n 's/.*"mem_budget": \([0-9]*\).*/\1/p' "$work/global_${ngpu}gpu/metrics.jsonl" | head -n 1)
        # shellcheck disable=SC2086
        "$build/aldit-sim" --store "$mixed" --model "$deck13" --ranks "$ngpu" train.shard=none $run13 $len13 \
            "balance.mem_budget=$budget" > "$work/strategies.sim" 2>&1 || rm -f "$work/strategies.sim"
    fi
}

section_shard() {
    for mode in optimizer gradients full none; do
        in_list "$mode" "$shards" || continue
        if [ "$mode" = none ] && status_ok "global_${ngpu}gpu" && [ "$redo" = 0 ]; then
            echo "global_${ngpu}gpu" > "$work/shard_none.alias"
            echo "== shard_none: the strategies' run global_${ngpu}gpu (the same deck, samples and train.shard = none)"
            continue
        fi
        rm -f "$work/shard_none.alias"
        # shellcheck disable=SC2086
        launch "shard_$mode" "$ngpu" "$e_shard" "$deck13" "data.store=$mixed" balance.strategy=global \
            "train.shard=$mode" $run13 $len13
    done
}

# check SECTION STORE K: `aldit --check` of the Wan-14B deck with K layers; appends "K RC" to SECTION.search
check() {
    limit=$(limit_for "$e_check")
    [ -n "$limit" ] || { echo "== $1: no time left for --check with $3 layers"; skipped=1; return 2; }
    rm -rf "${work:?}/$1_check"
    # shellcheck disable=SC2086
    bounded "$work/$1_check_$3.log" "$work/$1_check" "$limit" $MPIRUN -np "$ngpu" "$build/aldit" --check \
        "$deck14" train.shard=full "model.num_layers=$3" "data.store=$2" $run14 $args "run.dir=$work/$1_check"
    echo "$3 $rc" >> "$work/$1.search"
    echo "== $1: aldit --check with $3 layers: exit $rc in $seconds s${how:+ ($how)}"
    [ "$rc" = 0 ] && return 0
    [ -n "$how" ] && return 2   # timed out: no answer
    return 1
}

# sim_guess STORE: the most layers (from search_from down) for which aldit-sim's plan of shard = full fits
sim_guess() {
    [ -x "$build/aldit-sim" ] || { echo "$search_from"; return; }
    k=$search_from
    while [ "$k" -ge 1 ]; do
        # shellcheck disable=SC2086
        out=$("$build/aldit-sim" --store "$1" --model "$deck14" --ranks "$ngpu" --strategy global train.shard=full \
            "model.num_layers=$k" $run14 2>&1)
        case $out in *"exceed the memory budget"*) ;; *"full "*" GiB (budget "*", fits)"*) echo "$k"; return ;; esac
        k=$((k - 1))
    done
    echo 1
}

# section_14b SECTION STORE [key=value ...]: the layer search, then STEPS_14B steps of the largest model that fits
section_14b() {
    section=$1 data=$2; shift 2
    if [ "$redo" = 0 ] && [ -f "$work/$section.layers" ] && status_ok "${section}_$(cat "$work/$section.layers")l"; then
        echo "== $section: done in an earlier call ($(cat "$work/$section.layers") layers)"; return 0
    fi
    if [ "$redo" = 1 ] || [ ! -f "$work/$section.layers" ]; then
        rm -f "$work/$section.search" "$work/$section.layers"
        guess=$(sim_guess "$data")
        echo "sim $guess" > "$work/$section.search"
        if [ -x "$build/aldit-sim" ]; then echo "== $section: aldit-sim's plan fits $guess layers at most (from $search_from down)"
        else echo "== $section: no aldit-sim in $build: the search starts at $search_from layers"; fi
        k=$guess best=''
        if check "$section" "$data" "$k"; then
            best=$k
            while [ "$k" -lt "$search_from" ]; do
                k=$((k + 1))
                check "$section" "$data" "$k" || break
                best=$k
            done
        else
            [ $? = 2 ] && return 1
            while [ "$k" -gt 1 ]; do
                k=$((k - 1))
                check "$section" "$data" "$k"; found=$?
                [ $found = 0 ] && { best=$k; break; }
                [ $found = 2 ] && return 1
            done
        fi
        [ -n "$best" ] || { echo "== $section: no layer count passes aldit --check"; failed=1; return 1; }
        echo "$best" > "$work/$section.layers"
    fi
    best=$(cat "$work/$section.layers")
    failed_before=$failed
    # shellcheck disable=SC2086
    launch "${section}_${best}l" "$ngpu" "$e_14b" "$deck14" train.shard=full "model.num_layers=$best" "data.store=$data" \
        "run.steps=$steps14" log.every=1 $run14 "$@"
    # a run measures its free memory after NCCL's buffers, which --check does not: one layer fewer where it did not fit
    if [ "$rc" = 2 ] && [ ! -s "$work/${section}_${best}l/metrics.jsonl" ] && [ "$best" -gt 1 ] \
        && grep -q "does not fit\|over the memory budget\|no GPU memory left" "$work/${section}_${best}l.log"; then
        best=$((best - 1)); echo "$best" > "$work/$section.layers"
        echo "== $section: the run did not fit beside NCCL's buffers; $best layers"
        # shellcheck disable=SC2086
        launch "${section}_${best}l" "$ngpu" "$e_14b" "$deck14" train.shard=full \
            "model.num_layers=$best" "data.store=$data" "run.steps=$steps14" log.every=1 $run14 "$@" && failed=$failed_before
    fi
}

echo "multi_gpu.sh: issue $issue, $ngpu $([ "$smoke" = 1 ] && echo "CPU ranks (SMOKE)" || echo GPUs), sections $sections,"
echo "  work $work, deadline $deadline_s s, $MPIRUN"
if [ "$smoke" = 1 ]; then spec="$srcdir/inputs/quickstart.lengths"; text=16; else spec="$srcdir/inputs/mixed.lengths"; text=64; fi
run_env=
[ "$redo" = 1 ] && rm -f "$work"/calibration.*.txt
mixed=$(store "mixed-$samples" "$spec" "$samples" "$text") || exit 1
echo "== store $mixed ($(elapsed "$started") s so far)"
for section in $(echo "$sections" | tr ',' ' '); do
    case $section in
        strategies) section_strategies ;;
        shard) section_shard ;;
        wan14b) section_14b wan14b "$mixed" ;;
        wan14b_fixed)
            echo "# one shape: $fixed_spec (weight frames height width)" > "$work/fixed.lengths"
            echo "$fixed_spec" >> "$work/fixed.lengths"
            fixed=$(store "fixed-$fixed_samples" "$work/fixed.lengths" "$fixed_samples" "$fixed_text") || { failed=1; continue; }
            section_14b wan14b_fixed "$fixed" "balance.global_batch=$fixed_batch" ;;
    esac
done

echo
"$PYTHON" "$srcdir/tests/bench/multi_gpu_table.py" --work "$work" --issue "$issue" --ngpu "$ngpu" --sections "$sections" \
    | tee "$work/tables.md"
[ -s "$work/strategies.sim" ] && case ",$sections," in *,strategies,*)
    echo "aldit-sim's plan of the same store on $ngpu ranks, at the global run's measured budget (seeded rates):"
    echo; grep -E '^(strategy|  *step|equal_tokens|dual|global) ' "$work/strategies.sim" | sed 's/^/    /'; echo ;; esac

if [ "$plots" = off ]; then
    echo "plots: off (PLOTS=off)"
elif "$PYTHON" -c "import matplotlib" > /dev/null 2>&1; then
    mkdir -p "$plots"
    for group in strategies shard; do
        case ",$sections," in *",$group,"*) ;; *) continue ;; esac
        if [ $group = strategies ]; then labels="equal_tokens_${ngpu}gpu dual_${ngpu}gpu global_${ngpu}gpu global_1gpu"
        else labels="shard_none shard_optimizer shard_gradients shard_full"; fi
        files=
        for label in $labels; do
            [ -f "$work/$label.alias" ] && label=$(cat "$work/$label.alias")
            [ -s "$work/$label/metrics.jsonl" ] && files="$files $work/$label/metrics.jsonl"
        done
        # shellcheck disable=SC2086
        [ -n "$files" ] && "$PYTHON" "$srcdir/tools/plot_metrics.py" --compare $files --out "$plots/$group" > /dev/null 2>&1
    done
    for section in wan14b wan14b_fixed; do
        [ -f "$work/$section.layers" ] || continue
        label="${section}_$(cat "$work/$section.layers")l"
        [ -s "$work/$label/metrics.jsonl" ] && "$PYTHON" "$srcdir/tools/plot_metrics.py" "$work/$label/metrics.jsonl" \
            --smooth 1 --out "$plots/$label" > /dev/null 2>&1
    done
    echo "plots: $(find "$plots" -name '*.png' 2>/dev/null | wc -l | tr -d ' ') PNG files under $plots"
else
    echo "plots: skipped ($PYTHON cannot import matplotlib)"
fi
echo "(runs, logs and tables.md in $work; $(elapsed "$started") s in all)"
[ $failed = 0 ] || { echo "multi_gpu.sh: some runs failed or timed out (rows above)"; exit 1; }
[ $skipped = 0 ] || { echo "multi_gpu.sh: some runs did not fit DEADLINE_S; run again with WORK=$work"; exit 3; }
exit 0
