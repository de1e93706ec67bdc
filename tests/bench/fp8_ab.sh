#!/bin/sh
# fp8_ab.sh — issue 34's accuracy A/B of [train] precision = fp8 against bf16, in resumable chunks of one device call:
# each call advances the runs in WORK where their folders stand, stops cleanly before its time budget, prints the
# table of tests/bench/fp8_ab_table.py over the validation steps every run has reached, and says whether to call again.
#
# usage: tests/bench/fp8_ab.sh [--smoke | --toy] [BUILD_DIR]   (default: the current directory)
#   GPU (default): inputs/wan1.3b-8layers.ini (Wan-1.3B dims, 8 layers) on run.device = cuda, over a store of
#     aldit-store synth (tests/bench/fp8_ab.lengths: images and short videos of 256-5,824 tokens, TRAIN_SAMPLES
#     samples, 64 text tokens of 4096, --seed DATA_SEED): 8 classes, each a smooth latent pattern that the sample's
#     text embedding names, so the model has something to learn; the validation store is the same classes drawn
#     again (--draw-seed DATA_SEED + 1, VAL_SAMPLES samples). For each seed 1..SEEDS (run.seed, which seeds the
#     initial weights, the epoch order, the noise and the timesteps, and the validation noise) the bf16 run and one
#     run per FP8 arm, same deck otherwise: the balancer's draws pinned so that precision cannot change them
#     (balance.calibrate = off: no timing refits the cost model; global_batch = BATCH and mem_budget = MEM_BUDGET
#     fixed, since an auto budget is the free memory, which FP8's buffers change; train.autotune = off), a constant
#     learning rate after the warmup (a cosine would depend on run.steps, raised per slice), [eval] at the default
#     9 sigmas every EVAL_EVERY steps, one checkpoint per run (at each slice's end or on the stop signal).
#     The runs advance in slices of SLICE steps, round robin (every run to SLICE, then to 2 SLICE, ... up to STEPS),
#     so that an unfinished A/B still has every seed at the same steps. No run is started with less than MIN_LAUNCH
#     seconds left before TIME_LIMIT - GRACE; at TIME_LIMIT - GRACE the run in flight gets SIGTERM (sent to its
#     ranks: mpirun need not forward it), which stops it at the next step boundary after a checkpoint; GRACE
#     covers that checkpoint, so the call ends before TIME_LIMIT and never mid-checkpoint.
#   --toy: the same at toy size on the CPU (tests/decks/train_small.ini, a 2-layer model of dim 32;
#     tests/decks/train_tiny.lengths, 64 training and 128 validation samples), no launcher.
#   --smoke: make check's test (tests/bench/fp8_ab_smoke.sh), as TAP: --toy calls with both arms in bf16
#     (ARM_PRECISION=bf16: the CPU has no FP8), 2 seeds, 8 steps in slices of 4: a first call stopped after 4
#     launches, a second that resumes each run to the end, the table passing (identical arms), RESULTS filled, a
#     doctored copy of the second arm's metrics failing (validation losses raised by 1%; or sigma 0.1 alone worse by
#     3%, while 0.5% passes), bad input refused (a step trained on other tokens in one arm; a missing file), a call
#     with no time left launching nothing, and a run stopped by the time budget's signal mid-slice with its
#     checkpoint. About 10 s.
# Environment: WORK (the runs, stores, logs and table; GPU default /tmp/fp8_ab, kept: call again with the same WORK
#   to go on), SEEDS (3; --toy 2), STEPS (2000; --toy 8), EVAL_EVERY (250; --toy 2), SLICE (1000; --toy 4),
#   TIME_LIMIT (seconds this call may take, from its start: 540), GRACE (30), MIN_LAUNCH (60; --toy 1),
#   LAUNCHES (the most aldit launches this call; default no limit), PARALLEL (1: launches made at once, each group
#   waited for whole; several runs share the GPU, whose small steps leave it idle between kernels, and overlap their
#   start-ups, validations and checkpoints; their results do not depend on it, the table checks that each seed's arms
#   trained the same steps; mind the memory: each run takes MEM_BUDGET plus its ~7 GiB of state), BATCH (8; --toy 6), MEM_BUDGET (32GiB;
#   --toy 256MiB), TRAIN_SAMPLES (2048), VAL_SAMPLES (128), DATA_SEED (11), FP8_ARMS (the FP8 arms, each a
#   '+'-joined list of parts, default "gemm"; parts: gemm = the block's large linears, train.precision =
#   ARM_PRECISION; attn_fwd = the self-attention's forward, train.fp8_attention = forward; attn_bwd = its backward
#   too, fp8_attention = on; both need ARM_PRECISION = fp8: e.g. FP8_ARMS="gemm gemm+attn_fwd gemm+attn_fwd+attn_bwd"
#   shows each switch separately; inputs/wan1.3b-8layers.ini has head_dim 128, as they need), ARM_PRECISION (fp8;
#   the precision the gemm part sets, bf16 for the smoke), ALDIT_ARGS (more section.key=value for every run),
#   ALDIT_LAUNCH (GPU default "mpirun -np 1"; --toy none), RESULTS (a folder to copy the table, the curves'
#   PNG and a tar.gz of the metrics and logs into, e.g. $OUT), PYTHON (python3).
# Exit status: 0 every run reached STEPS and the table passes; 1 a run failed, or the table fails; 2 bad input;
#   3 stopped at the time budget (or LAUNCHES): call again with the same WORK.
set -u
mode=gpu
case ${1:-} in
    --smoke) mode=smoke; shift ;;
    --toy) mode=toy; shift ;;
esac
build=$(cd "${1:-.}" && pwd) || exit 2
srcdir=${SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${PYTHON:-python3}
started=$(date +%s)
self="$srcdir/tests/bench/fp8_ab.sh"
table="$srcdir/tests/bench/fp8_ab_table.py"

if [ "$mode" = smoke ]; then
    . "$srcdir/tests/tap.sh"
    "$PYTHON" -c "import json" > /dev/null 2>&1 || tap_skip_all "$PYTHON does not run"
    work=${WORK:-$(mktemp -d /tmp/fp8_ab_smoke.XXXXXX)}
    toy() { env WORK="$work/ab" ARM_PRECISION=bf16 "$@" sh "$self" --toy "$build"; }
    tap_plan 17
    # chunk 1: 4 launches (each run to step 4), then stopped as at a time budget
    toy LAUNCHES=4 > "$work/chunk1.log" 2>&1; status=$?
    tap_is "first call: stopped after 4 launches, exit 3 (call again)" "$status" 3
    steps=$(for run in bf16_s1 fp8_gemm_s1 bf16_s2 fp8_gemm_s2; do ls "$work/ab/$run/checkpoints" 2>/dev/null; done | tr '\n' ' ')
    tap_is "every run (2 seeds x 2 arms) holds one checkpoint, of step 4" "$steps" \
        "step_00000004.h5 step_00000004.h5 step_00000004.h5 step_00000004.h5 "
    # chunk 2: each run resumed to step 8
    toy RESULTS="$work/results" > "$work/chunk2.log" 2>&1; status=$?
    tap_result $status "second call: every run resumed to step 8, the table passes (exit 0)" "$(tail -n 30 "$work/chunk2.log")"
    resumed=0
    for run in bf16_s1 fp8_gemm_s1 bf16_s2 fp8_gemm_s2; do
        grep -q "resumed .*step_00000004.h5 at step 4" "$work/ab/$run.log" || resumed=1
        [ -f "$work/ab/$run/checkpoints/step_00000008.h5" ] || resumed=1
    done
    tap_result $resumed "each run's second launch resumed its step-4 checkpoint and ended at step 8" \
        "$(grep -h "resumed" "$work/ab/"*.log)"
    vals() { sed -n 's/^{"step": \([0-9]*\),.*"val_loss": \([^,]*\),.*"val_loss_sigma": \[\([^]]*\)\].*/\1 \2 \3/p' "$1"; }
    vals "$work/ab/bf16_s1/metrics.jsonl" > "$work/b1"; vals "$work/ab/fp8_gemm_s1/metrics.jsonl" > "$work/f1"
    vals "$work/ab/bf16_s2/metrics.jsonl" > "$work/b2"; vals "$work/ab/fp8_gemm_s2/metrics.jsonl" > "$work/f2"
    tap_is "validation after steps 2, 4, 6 and 8 in each run" "$(cut -d' ' -f1 "$work/b1" "$work/f1" "$work/b2" \
        "$work/f2" | tr '\n' ' ')" "2 4 6 8 2 4 6 8 2 4 6 8 2 4 6 8 "
    cmp -s "$work/b1" "$work/f1" && cmp -s "$work/b2" "$work/f2" && ! cmp -s "$work/b1" "$work/b2"
    tap_result $? "both arms of a seed validate bit for bit alike (same weights, samples, noise), the seeds differ" \
        "$(paste "$work/b1" "$work/f1" "$work/b2")"
    case $(cat "$work/chunk2.log") in *"| 8 |"*PASS*) found=0 ;; *) found=1 ;; esac
    tap_result $found "the table has step 8 and passes" "$(cat "$work/chunk2.log")"
    results=$(cd "$work/results" 2>/dev/null && ls | tr '\n' ' ')
    if "$PYTHON" -c "import matplotlib" > /dev/null 2>&1; then want="fp8_ab.png fp8_ab_runs.tar.gz fp8_ab_table.txt "
    else want="fp8_ab_runs.tar.gz fp8_ab_table.txt "; fi
    [ "$results" = "$want" ] && [ "$(tar tzf "$work/results/fp8_ab_runs.tar.gz" | grep -c 'metrics.jsonl$')" = 4 ]
    tap_result $? "RESULTS gets the table, the curves (where matplotlib imports) and the 4 runs' metrics in a tar.gz" \
        "got '$results', want '$want'; $(tar tzf "$work/results/fp8_ab_runs.tar.gz" 2>&1)"
    # doctored copies of the second arm's metrics: doctor NAME LOSS_FACTOR SIGMA0_FACTOR [TOKENS_OF_STEP_3], then the
    # table on them
    doctor() {
        mkdir -p "$work/$1"
        for seed in 1 2; do
            "$PYTHON" - "$work/ab/fp8_gemm_s$seed/metrics.jsonl" "$work/$1/s$seed.jsonl" "$2" "$3" "${4:-}" <<'PY'
import json, sys
loss, sigma0, tokens = float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
with open(sys.argv[1]) as src, open(sys.argv[2], "w") as out:
    for line in src:
        record = json.loads(line)
        if tokens and record["step"] == 3:
            record["tokens"] = int(tokens)
        if "val_loss" in record:
            record["val_loss"] *= loss
            record["val_loss_sigma"] = [v * loss * (sigma0 if i == 0 else 1.0)
                                        for i, v in enumerate(record["val_loss_sigma"])]
        out.write(json.dumps(record) + "\n")
PY
        done
        "$PYTHON" "$table" --bf16 "$work/ab/bf16_s1/metrics.jsonl" "$work/ab/bf16_s2/metrics.jsonl" \
            --arm fp8_gemm "$work/$1/s1.jsonl" "$work/$1/s2.jsonl" > "$work/$1.txt" 2>&1
    }
    doctor raised 1.01 1; status=$?
    case $status:$(cat "$work/raised.txt") in 1:*FAIL*) found=0 ;; *) found=1 ;; esac
    tap_result $found "the second arm's validation losses raised by 1%: the table fails (exit 1)" \
        "exit $status: $(cat "$work/raised.txt")"
    doctor sigma_bad 1 1.03; status=$?
    case $status:$(cat "$work/sigma_bad.txt") in 1:*"| 2 |"*PASS*"| 0.1: +3."*FAIL*) found=0 ;; *) found=1 ;; esac
    tap_result $found "val_loss kept, sigma 0.1 worse by 3% (over 3x the bound): the table fails (exit 1)" \
        "exit $status: $(cat "$work/sigma_bad.txt")"
    doctor sigma_ok 1 1.005; status=$?
    tap_result $status "val_loss kept, sigma 0.1 worse by 0.5% (under 3x the 0.25% floor): the table passes" \
        "exit $status: $(cat "$work/sigma_ok.txt")"
    doctor unlike 1 1 99999; status=$?
    case $status:$(cat "$work/unlike.txt") in 2:*"step 3 trained"*"did not see the same steps"*) found=0 ;; *) found=1 ;; esac
    tap_result $found "the arms of a seed trained other tokens at step 3: the table refuses (exit 2) naming it" \
        "exit $status: $(cat "$work/unlike.txt")"
    "$PYTHON" "$table" --bf16 "$work/ab/bf16_s1/metrics.jsonl" "$work/missing.jsonl" \
        --arm fp8_gemm "$work/raised/s1.jsonl" > "$work/missing.txt" 2>&1; status=$?
    case $status:$(cat "$work/missing.txt") in 2:*missing.jsonl*) found=0 ;; *) found=1 ;; esac
    tap_result $found "a metrics file that is not there: exit 2 naming it" "exit $status: $(cat "$work/missing.txt")"
    toy FP8_ARMS="gemm+attn_fwd" > "$work/part.log" 2>&1; status=$?
    case $status:$(cat "$work/part.log") in 2:*"attn_fwd"*"needs ARM_PRECISION = fp8"*) found=0 ;; *) found=1 ;; esac
    tap_result $found "an attention part with ARM_PRECISION = bf16 (attn_fwd): exit 2 naming it" "exit $status: $(cat "$work/part.log")"
    # no time left: nothing launched, exit 3
    toy STEPS=10 TIME_LIMIT=0 > "$work/late.log" 2>&1; status=$?
    [ $status = 3 ] && [ ! -f "$work/ab/bf16_s1/checkpoints/step_00000010.h5" ] && grep -q "time budget" "$work/late.log"
    tap_result $? "a call with no time left launches nothing and exits 3" "exit $status: $(cat "$work/late.log")"
    # the time budget's signal mid-slice: a long run stopped at a step boundary with its checkpoint, exit 3, in time
    before=$(date +%s)
    env WORK="$work/stop" ARM_PRECISION=bf16 SEEDS=1 STEPS=100000 SLICE=100000 EVAL_EVERY=1000 TIME_LIMIT=6 GRACE=2 \
        sh "$self" --toy "$build" > "$work/stop.log" 2>&1; status=$?
    took=$(($(date +%s) - before))
    at=$(ls "$work/stop/bf16_s1/checkpoints" 2>/dev/null | sed -n 's/^step_0*\([0-9][0-9]*\)\.h5$/\1/p')
    [ $status = 3 ] && [ "${at:-0}" -gt 0 ] && [ "${at:-0}" -lt 100000 ] && [ $took -le 7 ] &&
        grep -q "stop requested by a signal: checkpointing step $at" "$work/stop/bf16_s1.log"
    stopped=$?
    name="the run in flight, signalled at 4 s (TIME_LIMIT 6, GRACE 2), stops with a checkpoint (step ${at:-none})"
    tap_result $stopped "$name, exit 3, in ${took} s" \
        "exit $status: $(cat "$work/stop.log"; tail -n 5 "$work/stop/bf16_s1.log")"
    # PARALLEL=3: the same 4 runs, 3 at a time, then the last alone; the same validation losses as the serial calls'
    toy WORK="$work/par" PARALLEL=3 > "$work/par.log" 2>&1; status=$?
    same=0
    for run in bf16_s1 fp8_gemm_s1 bf16_s2 fp8_gemm_s2; do
        a=$(grep -o '"val_loss": [^,]*' "$work/ab/$run/metrics.jsonl"); b=$(grep -o '"val_loss": [^,]*' "$work/par/$run/metrics.jsonl")
        [ -n "$a" ] && [ "$a" = "$b" ] || same=1
    done
    [ $status = 0 ] && [ $same = 0 ]
    tap_result $? "PARALLEL=3: every run to step 8 (exit $status), validation losses equal to the serial calls'" \
        "$(tail -n 12 "$work/par.log")"
    [ -n "${WORK:-}" ] || rm -rf "$work"
    tap_done
fi

# ---- one call (GPU, or --toy) ------------------------------------------------------------------------------------
if [ "$mode" = toy ]; then
    deck="$srcdir/tests/decks/train_small.ini" spec="$srcdir/tests/decks/train_tiny.lengths"
    work=${WORK:-$(mktemp -d /tmp/fp8_ab_toy.XXXXXX)}
    SEEDS=${SEEDS:-2} STEPS=${STEPS:-8} EVAL_EVERY=${EVAL_EVERY:-2} SLICE=${SLICE:-4} MIN_LAUNCH=${MIN_LAUNCH:-1}
    BATCH=${BATCH:-6} MEM_BUDGET=${MEM_BUDGET:-256MiB} TRAIN_SAMPLES=${TRAIN_SAMPLES:-64} VAL_SAMPLES=${VAL_SAMPLES:-128}
    synth="--text-len 16 --text-dim 16" device=cpu launcher=${ALDIT_LAUNCH:-} log_every=1
else
    deck="$srcdir/inputs/wan1.3b-8layers.ini" spec="$srcdir/tests/bench/fp8_ab.lengths"
    work=${WORK:-/tmp/fp8_ab}
    SEEDS=${SEEDS:-3} STEPS=${STEPS:-2000} EVAL_EVERY=${EVAL_EVERY:-250} SLICE=${SLICE:-1000} MIN_LAUNCH=${MIN_LAUNCH:-60}
    BATCH=${BATCH:-8} MEM_BUDGET=${MEM_BUDGET:-32GiB} TRAIN_SAMPLES=${TRAIN_SAMPLES:-2048} VAL_SAMPLES=${VAL_SAMPLES:-128}
    synth="--text-len 64 --text-dim 4096" device=cuda launcher=${ALDIT_LAUNCH:-mpirun -np 1} log_every=50
fi
TIME_LIMIT=${TIME_LIMIT:-540} GRACE=${GRACE:-30} DATA_SEED=${DATA_SEED:-11} ARM_PRECISION=${ARM_PRECISION:-fp8}
FP8_ARMS=${FP8_ARMS-gemm} LAUNCHES=${LAUNCHES:-0} PARALLEL=${PARALLEL:-1}
for pair in "SEEDS=$SEEDS" "STEPS=$STEPS" "EVAL_EVERY=$EVAL_EVERY" "SLICE=$SLICE" "TIME_LIMIT=$TIME_LIMIT" \
            "GRACE=$GRACE" "MIN_LAUNCH=$MIN_LAUNCH" "LAUNCHES=$LAUNCHES" "TRAIN_SAMPLES=$TRAIN_SAMPLES" \
            "VAL_SAMPLES=$VAL_SAMPLES" "DATA_SEED=$DATA_SEED" "BATCH=$BATCH" "PARALLEL=$PARALLEL"; do
    case ${pair#*=} in ''|*[!0-9]*) echo "fp8_ab.sh: ${pair%%=*} = '${pair#*=}': a whole number" >&2; exit 2 ;; esac
done
[ "$SEEDS" -ge 1 ] && [ "$STEPS" -ge 1 ] && [ "$SLICE" -ge 1 ] && [ "$EVAL_EVERY" -ge 1 ] && [ "$PARALLEL" -ge 1 ] ||
    { echo "fp8_ab.sh: SEEDS, STEPS, SLICE, EVAL_EVERY and PARALLEL must be at least 1" >&2; exit 2; }
case $ARM_PRECISION in bf16|fp8) ;; *) echo "fp8_ab.sh: ARM_PRECISION = $ARM_PRECISION: bf16 or fp8" >&2; exit 2 ;; esac

# part_options PART: the deck keys that switch one FP8 part on (a new switch gets a line here)
part_options() {
    case $1 in
        gemm) echo "train.precision=$ARM_PRECISION" ;;
        attn_fwd|attn_bwd)
            [ "$ARM_PRECISION" = fp8 ] || { echo "fp8_ab.sh: FP8 part $1 (the self-attention's $( [ "$1" = attn_fwd ] &&
                echo forward || echo "backward too")) needs ARM_PRECISION = fp8 (train.fp8_attention needs" \
                "train.precision = fp8)" >&2; return 2; }
            echo "train.precision=fp8 train.fp8_attention=$( [ "$1" = attn_fwd ] && echo forward || echo on)" ;;
        *) echo "fp8_ab.sh: FP8 part '$1' unknown (parts: gemm, attn_fwd, attn_bwd; an arm joins them with +)" >&2
           return 2 ;;
    esac
}
# arms: "bf16" and one per FP8 arm, fp8_<parts joined by _>; the options of each in arm_<name>
# shellcheck disable=SC2034 # arm_NAME is read through eval
arms=bf16 arm_bf16=
for arm in $FP8_ARMS; do
    name=fp8_$(echo "$arm" | tr + _) options=
    for part in $(echo "$arm" | tr + ' '); do
        for option in $(part_options "$part" || echo FAILED); do
            [ "$option" = FAILED ] && exit 2
            case " $options " in *" $option "*) ;; *) options="$options $option" ;; esac
        done
    done
    # attn_bwd (the backward too) wins over attn_fwd, in whichever order the arm names them
    case " $options " in *" train.fp8_attention=on "*) options=$(echo "$options" | sed 's/ train.fp8_attention=forward//') ;; esac
    arms="$arms $name"
    eval "arm_$name=\$options"
done

for program in aldit aldit-store; do
    [ -x "$build/$program" ] || { echo "fp8_ab.sh: $build/$program not found (build it: make $program)" >&2; exit 2; }
done
mkdir -p "$work" || exit 2
work=$(cd "$work" && pwd)
stop_at=$((started + TIME_LIMIT - GRACE))
now() { date +%s; }

# the stores: made once per WORK (written under another name and renamed, so that a cut call leaves none half made)
store="$work/train.h5" val="$work/val.h5"
make_store() {  # make_store FILE SAMPLES DRAW_SEED
    [ -f "$1" ] && return 0
    # shellcheck disable=SC2086
    "$build/aldit-store" synth --spec "$spec" --samples "$2" $synth --seed "$DATA_SEED" --draw-seed "$3" \
        --out "$1.part.h5" > "$1.log" 2>&1 && mv "$1.part.h5" "$1" ||
        { echo "fp8_ab.sh: aldit-store synth failed: $(cat "$1.log")" >&2; exit 1; }
}
make_store "$store" "$TRAIN_SAMPLES" "$DATA_SEED"
make_store "$val" "$VAL_SAMPLES" $((DATA_SEED + 1))

# run_step DIR: the step of the run's newest checkpoint (0: none)
run_step() {
    last=$(ls "$1/checkpoints" 2>/dev/null | sed -n 's/^step_0*\([0-9][0-9]*\)\.h5$/\1/p' | sort -n | tail -n 1)
    echo "${last:-0}"
}
# rank_pids DIR LAUNCHER: the aldit processes but LAUNCHER whose command line names run.dir=DIR (the ranks)
rank_pids() {
    for proc in /proc/[0-9]*; do
        pid=${proc#/proc/}
        [ "$pid" = "$2" ] && continue
        read -r comm 2>/dev/null < "$proc/comm" || continue
        [ "$comm" = aldit ] || continue
        tr '\000' ' ' 2>/dev/null < "$proc/cmdline" | grep -q -- "run.dir=$1 " && printf '%s ' "$pid"
    done
}

# launch NAME SEED TARGET: train run NAME (seed SEED) on to step TARGET; signalled at stop_at. Sets signalled.
launch() {
    name=$1 dir="$work/$1_s$2"
    eval "options=\$arm_$name"
    echo "== $(date -u '+%F %T') run.steps=$3 (from step $(run_step "$dir"))" >> "$dir.log"
    # shellcheck disable=SC2086
    $launcher "$build/aldit" "$deck" "run.dir=$dir" "run.seed=$2" "run.steps=$3" "run.device=$device" \
        "data.store=$store" "eval.store=$val" "eval.every=$EVAL_EVERY" balance.calibrate=off \
        "balance.global_batch=$BATCH" "balance.mem_budget=$MEM_BUDGET" train.autotune=off train.lr_schedule=constant \
        checkpoint.resume=on checkpoint.at_end=on checkpoint.every=0 checkpoint.interval=0 checkpoint.keep=1 \
        "log.every=$log_every" $options ${ALDIT_ARGS:-} >> "$dir.log" 2>&1 &
    pid=$! signalled=0
    while kill -0 "$pid" 2> /dev/null; do
        if [ $signalled = 0 ] && [ "$(now)" -ge $stop_at ]; then
            ranks=$(rank_pids "$dir" "$pid")
            echo "== $(date -u '+%F %T') the time budget: SIGTERM to ${ranks:-the launcher $pid}" >> "$dir.log"
            kill -TERM ${ranks:-$pid} 2> /dev/null
            signalled=1
        fi
        sleep 0.2
    done
    wait "$pid"
}

# finish NAME SEED TARGET FROM: report a launch that ended (its status file); 0 on, 3 stopped at the time budget, 1 failed
finish() {
    dir="$work/$1_s$2"
    read -r status signalled took < "$dir.status" || { status=1 signalled=0 took=0; }
    at=$(run_step "$dir")
    echo "$1 seed $2: steps $4 -> $at of $3 in $took s (exit $status)" | tee -a "$work/timing.txt"
    if [ "$signalled" = 1 ]; then  # a signal before aldit's handler (start-up) ends it unclean: no checkpoint lost
        echo "== stopped at the time budget: $1_s$2 at its checkpoint of step $at (exit $status)"
        return 3
    fi
    if [ "$status" != 0 ]; then
        echo "fp8_ab.sh: run $1_s$2 failed (exit $status); its log, $dir.log, ends:" >&2
        tail -n 25 "$dir.log" >&2
        return 1
    fi
    [ "$at" -ge "$3" ] || { echo "fp8_ab.sh: run $1_s$2 ended at step $at, not $3" >&2; return 1; }
    return 0
}

# advance: every run to each slice's end in turn, PARALLEL launches at a time (each waits for the whole group); 0 all
# at STEPS, 3 stopped (time or LAUNCHES), 1 a run failed
launches=0
advance() {
    target=0
    while [ $target -lt "$STEPS" ]; do
        target=$((target + SLICE)); [ $target -gt "$STEPS" ] && target=$STEPS
        todo= seed=1
        while [ $seed -le "$SEEDS" ]; do
            for name in $arms; do
                [ "$(run_step "$work/${name}_s$seed")" -ge $target ] || todo="$todo $name:$seed"
            done
            seed=$((seed + 1))
        done
        set -- $todo
        while [ $# -gt 0 ]; do
            group= stop=0
            while [ $# -gt 0 ] && [ "$(echo $group | wc -w)" -lt "$PARALLEL" ]; do
                name=${1%:*} seed=${1#*:}
                if [ "$LAUNCHES" -gt 0 ] && [ $launches -ge "$LAUNCHES" ]; then
                    echo "== stopping: $LAUNCHES launches made (LAUNCHES)"; stop=3; break
                fi
                left=$((stop_at - $(now)))
                if [ $left -lt "$MIN_LAUNCH" ]; then
                    echo "== stopping before the time budget: ${left} s left before TIME_LIMIT - GRACE," \
                         "less than MIN_LAUNCH = $MIN_LAUNCH"
                    stop=3; break
                fi
                launches=$((launches + 1))
                dir="$work/${name}_s$seed"
                rm -f "$dir.status"
                group="$group $name:$seed:$(run_step "$dir")"
                (begun=$(now); launch "$name" "$seed" $target; status=$?
                 echo "$status $signalled $(($(now) - begun))" > "$dir.status") &
                shift
            done
            wait
            result=0
            for run in $group; do
                name=${run%%:*} rest=${run#*:}
                finish "$name" "${rest%%:*}" $target "${rest#*:}"; status=$?
                if [ $status = 1 ]; then result=1; elif [ $status = 3 ] && [ $result = 0 ]; then result=3; fi
            done
            [ $result != 0 ] && return $result
            [ $stop != 0 ] && return $stop
        done
    done
    return 0
}
echo "== fp8_ab.sh: $deck, arms: $arms, seeds 1-$SEEDS, $STEPS steps in slices of $SLICE, validation every $EVAL_EVERY" \
     "steps; WORK $work; stop at $TIME_LIMIT - $GRACE s"
ls "$work"/*_s*/checkpoints/step_*.h5 > /dev/null 2>&1 ||
    echo "== a fresh start: no run in $work has a checkpoint yet (a machine given back loses WORK: call back to back)"
advance; advanced=$?

# the table over the steps every run has reached (bf16 the reference; one block per FP8 arm)
set --
for name in $arms; do
    if [ "$name" = bf16 ]; then set -- "$@" --bf16; else set -- "$@" --arm "$name"; fi
    seed=1
    while [ $seed -le "$SEEDS" ]; do set -- "$@" "$work/${name}_s$seed/metrics.jsonl"; seed=$((seed + 1)); done
done
missing=
for name in $arms; do
    seed=1
    while [ $seed -le "$SEEDS" ]; do
        [ -s "$work/${name}_s$seed/metrics.jsonl" ] || missing="$missing ${name}_s$seed"; seed=$((seed + 1))
    done
done
if [ -n "$missing" ]; then
    echo "== no table yet: no metrics from$missing" | tee "$work/table.txt"; table_status=2
else
    "$PYTHON" "$table" "$@" --png "$work/fp8_ab.png" --json "$work/table.json" > "$work/table.txt" 2>&1; table_status=$?
    cat "$work/table.txt"
fi
if [ -n "${RESULTS:-}" ]; then
    mkdir -p "$RESULTS" && cp "$work/table.txt" "$RESULTS/fp8_ab_table.txt" &&
        { [ ! -f "$work/fp8_ab.png" ] || cp "$work/fp8_ab.png" "$RESULTS/fp8_ab.png"; } &&
        (cd "$work" && tar czf "$RESULTS/fp8_ab_runs.tar.gz" ./*_s*/metrics.jsonl ./*.log timing.txt table.json \
            2> /dev/null)
fi
case $advanced in
    0) echo "== done: every run at step $STEPS (table exit $table_status; files in $work)"; exit $table_status ;;
    3) echo "== not done: call again with WORK=$work to go on (the table above covers the steps every run has reached)"
       exit 3 ;;
    *) exit 1 ;;
esac
