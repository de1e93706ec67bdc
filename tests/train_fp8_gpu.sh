#!/bin/sh
# train_fp8_gpu.sh — [train] precision = fp8 end to end. Everywhere: fp8 on run.device = cpu is refused by the deck,
# and fp8 where device = auto lands on the CPU (the GPUs hidden) by the CPU backend, both exit 2 saying why. On a GPU
# of compute capability 8.9 or more (else skipped): the test deck trained 20 steps in bf16 and in fp8 from the same
# weights, samples and noise (calibration and autotuning off, constant lr after the warmup): fp8's losses are not
# bf16's (the FP8 path ran), its first 5 stay within the bound below of bf16's, and its loss falls; an fp8 run of 10
# steps resumed to 20 gives steps 11-20 bit for bit as the uninterrupted fp8 run (the scales and amax histories come
# from the checkpoint), where a bf16 run resumed the same way is checked bit for bit too (to tell the two apart); a
# resume with another fp8_amax_history is refused; with the start-up calibration on, step 1 is the uncalibrated run's
# (the calibration's scaling state restarted); with 2 GPU ranks (the amaxes max-reduced over them, so rank 0's
# scaling state in the checkpoint is both ranks') an fp8 run resumed is bit for bit as uninterrupted too. [train]
# fp8_attention: refused on the deck's head_dim; on a head_dim-128 model over samples on cuDNN it runs (no call
# refused, losses not the GEMMs-only run's) and resumes bit for bit.
#
# The loss bound (steps 1-5). Each FP8 forward GEMM's output errs by a relative RMS of at most
# sigma = sqrt((u^2 + u^2) / 3) = 0.051 (E4M3 x E4M3, u = 2^-4; the derivation is test_cuda_fp8.c's). The deck's
# 2 blocks have G = 16 FP8 linears (8 each) on the path to the prediction; their errors are independent and each is at
# most its output's share of the residual stream, so the prediction errs by eps <= sqrt(2 G) sigma = 0.29 in
# relative RMS (sqrt(2 G): a GEMM's input error, from the GEMMs before it, as large again as its own). With the loss
# L = mean((p - v)^2), Cauchy-Schwarz gives |dL| <= 2 sqrt(L) rms(dp) + rms(dp)^2 <= L (2 eps rho + eps^2 rho^2),
# rho = rms(p) / sqrt(L); early in training p and the flow target v are uncorrelated, so L = E p^2 + E v^2 >= E p^2
# and rho <= 1: |dL| / L <= 2 eps + eps^2 = 0.67. The weights the two runs step to differ by the same kind of
# error, by at most lr times the clipped update per step: over 5 steps with lr 3e-3 that is far below it.
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=20
HALF=10
SAME="train.lr_schedule=constant balance.calibrate=0 train.autotune=off"
LOSS_BOUND=0.67
tap_plan 17

n_gpus=0
probe="$top_builddir/tests/gpu_present"
if [ -x "$probe" ]; then n_gpus=$("$probe" 2> /dev/null) || n_gpus=0; fi
case $n_gpus in ''|*[!0-9]*) n_gpus=0 ;; esac
echo "# GPUs visible: $n_gpus"
skip() { tap_result 0 "$1 # SKIP $2"; }

tap_ok "aldit-store synth makes the test store" make_store

# everywhere: the CPU has no FP8 (deck check; backend check where auto lands on the CPU)
run_aldit 1 cpu_fp8 run.device=cpu train.precision=fp8 run.steps=1; status=$?
case $status:$(cat "$WORK/cpu_fp8.log") in 2:*"train.precision = fp8 needs the CUDA backend"*) found=0 ;; *) found=1 ;; esac
tap_result $found "precision = fp8 with run.device = cpu: exit 2 saying why" "$(cat "$WORK/cpu_fp8.log")"
env CUDA_VISIBLE_DEVICES=-1 $MPIEXEC -np 1 --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/store.h5" \
    run.dir="$WORK/auto_fp8" run.device=auto train.precision=fp8 run.steps=1 > "$WORK/auto_fp8.log" 2>&1; status=$?
case $status:$(cat "$WORK/auto_fp8.log") in 2:*"precision = fp8 needs the CUDA backend"*"CPU backend"*) found=0 ;; *) found=1 ;; esac
tap_result $found "precision = fp8 where device = auto lands on the CPU: exit 2 saying why" "$(cat "$WORK/auto_fp8.log")"

names="bf16 run exits 0|fp8 run exits 0|fp8's losses differ from bf16's (the FP8 path ran)|fp8's first 5 steps within $LOSS_BOUND of bf16|the fp8 loss falls|a 10-step fp8 run resumed to 20 steps exits 0 and restores the FP8 state|fp8 steps 11-20 after the resume bit for bit as uninterrupted|bf16 steps 11-20 after the resume bit for bit as uninterrupted|a resume with another fp8_amax_history is refused (exit 2)|fp8 with the start-up calibration: step 1 within 1e-6 of the uncalibrated run's (the scaling restarted)|2 ranks: fp8 steps 11-20 after the resume bit for bit as uninterrupted|fp8_attention on a model of head_dim 16: exit 2 naming head_dim 128|fp8_attention = on, head_dim 128, 12 steps|fp8_attention = on: steps 7-12 after a resume bit for bit as uninterrupted"
skip_rest() {
    echo "$names" | tr '|' '\n' | while read -r name; do skip "$name" "$1"; done
    tap_done
}
[ "$n_gpus" -ge 1 ] || skip_rest "no GPU visible"

run_aldit 1 gpu_bf16 run.device=cuda run.steps=$STEPS $SAME; status=$?
tap_is "bf16 run exits 0" "$status" 0
run_aldit 1 gpu_fp8 run.device=cuda run.steps=$STEPS $SAME train.precision=fp8; status=$?
if [ $status = 2 ] && grep -q "compute capability 8.9 or more" "$WORK/gpu_fp8.log"; then
    skip "fp8 run exits 0" "$(grep -o 'is [0-9]*\.[0-9]*' "$WORK/gpu_fp8.log" | head -1): no FP8 tensor cores"
    names=${names#*|*|}
    skip_rest "the GPU has no FP8 tensor cores"
fi
tap_is "fp8 run exits 0" "$status" 0
losses "$WORK/gpu_bf16/metrics.jsonl" > "$WORK/bf16.losses"
losses "$WORK/gpu_fp8/metrics.jsonl" > "$WORK/fp8.losses"
! cmp -s "$WORK/bf16.losses" "$WORK/fp8.losses" && [ -s "$WORK/fp8.losses" ]
tap_result $? "fp8's losses differ from bf16's (the FP8 path ran)" "$(paste "$WORK/bf16.losses" "$WORK/fp8.losses" | head -5)"
compare "$WORK/bf16.losses" "$WORK/fp8.losses" $LOSS_BOUND 1 5 > "$WORK/bound.compare"
tap_result $? "fp8's first 5 steps within $LOSS_BOUND of bf16 (largest $(tail -1 "$WORK/bound.compare"))" \
    "$(cat "$WORK/bound.compare"; paste "$WORK/bf16.losses" "$WORK/fp8.losses" | head -5)"
echo "# bf16 vs fp8, steps 1-$STEPS: largest relative difference $(compare "$WORK/bf16.losses" "$WORK/fp8.losses" 1 1 $STEPS | tail -1)"
awk 'NR <= 5 { first += $2 } { last[NR % 5] = $2 } END { for (i in last) tail += last[i]
     printf "first 5: %g, last 5: %g\n", first / 5, tail / 5; exit !(NR >= 10 && tail < first) }' "$WORK/fp8.losses" \
    > "$WORK/falling"
tap_result $? "the fp8 loss falls ($(cat "$WORK/falling"))" "$(cat "$WORK/fp8.losses")"

# resume: 10 steps, then the same folder to 20
run_aldit 1 resumed_fp8 run.device=cuda run.steps=$HALF $SAME train.precision=fp8 &&
    run_aldit 1 resumed_fp8 run.device=cuda run.steps=$STEPS $SAME train.precision=fp8; status=$?
grep -q "resumed .*step_$(printf %08d $HALF).h5 at step $HALF" "$WORK/resumed_fp8.log" &&
    ! grep -q "no FP8 scaling state" "$WORK/resumed_fp8.log" && [ $status = 0 ]
tap_result $? "a 10-step fp8 run resumed to 20 steps exits 0 and restores the FP8 state" "$(head -20 "$WORK/resumed_fp8.log")"
losses "$WORK/resumed_fp8/metrics.jsonl" | awk -v h=$HALF '$1 > h' > "$WORK/resumed_fp8.losses"
awk -v h=$HALF '$1 > h' "$WORK/fp8.losses" > "$WORK/fp8.tail"
[ -s "$WORK/fp8.tail" ] && cmp -s "$WORK/fp8.tail" "$WORK/resumed_fp8.losses"
tap_result $? "fp8 steps 11-20 after the resume bit for bit as uninterrupted" \
    "$(paste "$WORK/fp8.tail" "$WORK/resumed_fp8.losses")"
run_aldit 1 resumed_bf16 run.device=cuda run.steps=$HALF $SAME &&
    run_aldit 1 resumed_bf16 run.device=cuda run.steps=$STEPS $SAME
losses "$WORK/resumed_bf16/metrics.jsonl" | awk -v h=$HALF '$1 > h' > "$WORK/resumed_bf16.losses"
awk -v h=$HALF '$1 > h' "$WORK/bf16.losses" > "$WORK/bf16.tail"
[ -s "$WORK/bf16.tail" ] && cmp -s "$WORK/bf16.tail" "$WORK/resumed_bf16.losses"
tap_result $? "bf16 steps 11-20 after the resume bit for bit as uninterrupted" \
    "$(paste "$WORK/bf16.tail" "$WORK/resumed_bf16.losses")"
run_aldit 1 resumed_fp8 run.device=cuda run.steps=$((STEPS + 2)) $SAME train.precision=fp8 train.fp8_amax_history=8
status=$?
case $status:$(cat "$WORK/resumed_fp8.log") in 2:*"cannot resume from"*"history 16"*"fp8_amax_history"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a resume with another fp8_amax_history is refused (exit 2)" "$(tail -5 "$WORK/resumed_fp8.log")"

# the start-up calibration times fp8 at delayed scaling, then restarts the scaling state: step 1 (the same samples in
# one micro-batch, the same weights) as the uncalibrated run's, cast at its own current scaling; a state left over
# from the timing would cast it at other scales (E4M3 steps of 6%: far over the bound)
run_aldit 1 calibrated_fp8 run.device=cuda run.steps=1 train.lr_schedule=constant train.autotune=off \
    balance.calibrate=1 train.precision=fp8; status=$?
losses "$WORK/calibrated_fp8/metrics.jsonl" > "$WORK/calibrated.losses"
plan_of() { sed -n 's/^{"step": 1,.*"samples": \([0-9]*\),.*"micro_batches": \([0-9]*\),.*/\1 \2/p' "$1"; }
[ $status = 0 ] && [ -n "$(plan_of "$WORK/gpu_fp8/metrics.jsonl")" ] &&
    [ "$(plan_of "$WORK/calibrated_fp8/metrics.jsonl")" = "$(plan_of "$WORK/gpu_fp8/metrics.jsonl")" ] &&
    compare "$WORK/fp8.losses" "$WORK/calibrated.losses" 1e-6 1 1 > "$WORK/calibrated.compare"
tap_result $? "fp8 with the start-up calibration: step 1 within 1e-6 of the uncalibrated run's (the scaling restarted)" \
    "$(plan_of "$WORK/gpu_fp8/metrics.jsonl"); $(plan_of "$WORK/calibrated_fp8/metrics.jsonl"); \
$(cat "$WORK/calibrated.compare" 2>/dev/null); $(tail -5 "$WORK/calibrated_fp8.log")"

if [ "$n_gpus" -ge 2 ]; then
    run_aldit 2 two_fp8 run.device=cuda run.steps=$STEPS $SAME train.precision=fp8
    run_aldit 2 two_resumed run.device=cuda run.steps=$HALF $SAME train.precision=fp8 &&
        run_aldit 2 two_resumed run.device=cuda run.steps=$STEPS $SAME train.precision=fp8
    losses "$WORK/two_fp8/metrics.jsonl" | awk -v h=$HALF '$1 > h' > "$WORK/two.tail"
    losses "$WORK/two_resumed/metrics.jsonl" | awk -v h=$HALF '$1 > h' > "$WORK/two_resumed.losses"
    [ -s "$WORK/two.tail" ] && cmp -s "$WORK/two.tail" "$WORK/two_resumed.losses"
    tap_result $? "2 ranks: fp8 steps 11-20 after the resume bit for bit as uninterrupted" \
        "$(paste "$WORK/two.tail" "$WORK/two_resumed.losses"; tail -5 "$WORK/two_resumed.log")"
else
    skip "2 ranks: fp8 steps 11-20 after the resume bit for bit as uninterrupted" "one GPU rank"
fi

# [train] fp8_attention: refused by name on the test deck's head_dim 16; on a model of head_dim 128 (dim 256, 2 heads)
# over samples of 1,024-1,536 tokens (on cuDNN): runs with no call refused, differs from the GEMMs-only fp8 run, and a
# run of 6 steps resumed to 12 gives steps 7-12 bit for bit as the uninterrupted run
run_aldit 1 att_small run.device=cuda run.steps=1 $SAME train.precision=fp8 train.fp8_attention=on; status=$?
[ $status = 2 ] && grep -q "fp8_attention = on needs head_dim 128" "$WORK/att_small.log"
tap_result $? "fp8_attention on a model of head_dim 16: exit 2 ($status) naming head_dim 128" "$(tail -3 "$WORK/att_small.log")"
printf '# weight frames height width\n1 1 64 64\n1 2 64 48\n1 1 64 80\n' > "$WORK/long.lengths"
"$top_builddir/aldit-store" synth --spec "$WORK/long.lengths" --samples 24 --text-len 16 --text-dim 16 --seed 5 \
    --out "$WORK/long.h5" > /dev/null
WIDE="model.dim=256 model.num_heads=2 model.ffn_dim=512 balance.mem_budget=4GiB data.store=$WORK/long.h5"
att_run() {  # NAME STEPS [key=value ...]
    name=$1 steps=$2; shift 2
    $MPIEXEC -np 1 --oversubscribe "$ALDIT" "$TRAIN_DECK" run.dir="$WORK/$name" run.device=cuda run.steps=$steps $SAME \
        train.precision=fp8 $WIDE "$@" >> "$WORK/$name.log" 2>&1
}
att_run wide_gemms 12; s1=$?
att_run wide_att 12 train.fp8_attention=on; s2=$?
losses "$WORK/wide_gemms/metrics.jsonl" > "$WORK/wide_gemms.losses"
losses "$WORK/wide_att/metrics.jsonl" > "$WORK/wide_att.losses"
[ $s1 = 0 ] && [ $s2 = 0 ] && grep -q "self-attention on cuDNN too" "$WORK/wide_att.log" &&
    ! grep -q "ran in bf16" "$WORK/wide_att.log" && [ "$(wc -l < "$WORK/wide_att.losses")" = 12 ] &&
    ! cmp -s "$WORK/wide_gemms.losses" "$WORK/wide_att.losses"
tap_result $? "fp8_attention = on, head_dim 128, 12 steps: exit 0, no call refused, losses not the GEMMs-only run's" \
    "$(paste "$WORK/wide_gemms.losses" "$WORK/wide_att.losses" | head -12; tail -5 "$WORK/wide_att.log")"
echo "# fp8_attention on vs off, steps 1-12: largest relative difference $(compare "$WORK/wide_gemms.losses" \
"$WORK/wide_att.losses" 1 1 12 | tail -1)"
att_run wide_resumed 6 train.fp8_attention=on && att_run wide_resumed 12 train.fp8_attention=on; status=$?
losses "$WORK/wide_resumed/metrics.jsonl" | awk '$1 > 6' > "$WORK/wide_resumed.losses"
awk '$1 > 6' "$WORK/wide_att.losses" > "$WORK/wide_att.tail"
[ $status = 0 ] && [ -s "$WORK/wide_att.tail" ] && cmp -s "$WORK/wide_att.tail" "$WORK/wide_resumed.losses"
tap_result $? "fp8_attention = on: steps 7-12 after a resume bit for bit as uninterrupted" \
    "$(paste "$WORK/wide_att.tail" "$WORK/wide_resumed.losses"; tail -5 "$WORK/wide_resumed.log")"
tap_done
