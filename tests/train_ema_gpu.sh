#!/bin/sh
# train_ema_gpu.sh — [train] ema_decay on the CUDA backend (skips without a GPU, or without h5py): from [model] init's
# weights, the /ema of each of 6 GPU steps equals the EMA recomputed on the host from the GPU's own fp32 master
# weights of that step (tests/ema_recompute.py) within 1e-6 of each tensor's largest value (the kernel rounds as
# the host's optim_ema, so bit for bit is expected and reported); the summary counts the EMA in the state; a GPU
# run resumed from its checkpoint reads /ema.
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs h5py numpy
. "$top_srcdir/tests/train_lib.sh"
n_gpus=0
probe="$top_builddir/tests/gpu_present"
if [ -x "$probe" ]; then n_gpus=$("$probe" 2> /dev/null) || n_gpus=0; fi
case $n_gpus in ''|*[!0-9]*) n_gpus=0 ;; esac
[ "$n_gpus" -ge 1 ] || tap_skip_all "no GPU visible"
tap_plan 6
step_file() { printf '%s/%s/checkpoints/step_%08d.h5' "$WORK" "$1" "$2"; }

tap_ok "aldit-store synth makes the test store" make_store
run_aldit 1 init run.device=cpu run.steps=1
init=$(step_file init 1)
tap_ok "a 1-step CPU run makes the init weights" test -f "$init"
run_aldit 1 gpu run.device=cuda run.steps=6 checkpoint.every=1 checkpoint.keep=10 model.init="$init" \
    train.ema_decay=0.9 balance.calibrate=0; status=$?
tap_is "6 GPU steps with ema_decay = 0.9 from [model] init exit 0" "$status" 0
grep -q "state .*EMA weights" "$WORK/gpu.log"
tap_result $? "the summary counts the EMA in the state" "$(grep state "$WORK/gpu.log")"
out=$("$PYTHON" "$top_srcdir/tests/ema_recompute.py" --rtol 1e-6 "$init" 0.9 0 \
    $(for s in 1 2 3 4 5 6; do step_file gpu $s; printf ' '; done) 2>&1)
case $out in *"same 6"*|*"within 1e-06 6"*) found=0 ;; *) found=1 ;; esac
tap_result $found "each step's GPU /ema is the host formula on the GPU's master weights within 1e-6 ($(printf '%s' "$out" | tr '\n' ' '))" "$out"
run_aldit 1 gpu run.device=cuda run.steps=8 checkpoint.every=0 train.ema_decay=0.9 balance.calibrate=0; status=$?
grep -q "ema        .*from the checkpoint's /ema" "$WORK/gpu.log"
tap_result $? "resumed on the GPU (exit $status), the EMA comes from the checkpoint's /ema" "$(head -20 "$WORK/gpu.log")"
tap_done
