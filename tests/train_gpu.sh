#!/bin/sh
# train_gpu.sh — the CUDA training path. Everywhere: [run] device = cuda with the GPUs hidden is refused
# with exit 1. On a GPU: 1 GPU rank against the CPU (bf16 against fp32: the first steps within 2e-2),
# 2 GPU ranks against 1 with a fixed global batch (within 1e-2; needs two GPUs), the all-reduce overlapped in
# buckets against one call after the backward and one call per range (2 ranks: the same sums, so the losses
# equal to the bit; calibration and autotuning off so that measured times steer neither the packing nor the
# GEMM and attention configurations), and a GPU checkpoint
# resumed on the GPU (the steps after it within 1e-3 of an uninterrupted run), and the start-up calibration
# timed on the GPU, kept in the run folder and read back by the next run there. The checks a machine
# cannot run are reported as skipped.
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=20
HALF=10
# constant lr after the warmup, so a 10-step run is the first half of a 20-step run (for the resume)
SCHEDULE=train.lr_schedule=constant
tap_plan 16

n_gpus=0
probe="$top_builddir/tests/gpu_present"
if [ -x "$probe" ]; then n_gpus=$("$probe" 2> /dev/null) || n_gpus=0; fi
case $n_gpus in ''|*[!0-9]*) n_gpus=0 ;; esac
echo "# GPUs visible: $n_gpus"
skip() { tap_result 0 "$1 # SKIP $2"; }

tap_ok "aldit-store synth makes the test store" make_store

# (d) no GPU: CUDA_VISIBLE_DEVICES=-1 hides every GPU from the CUDA runtime
env CUDA_VISIBLE_DEVICES=-1 $MPIEXEC -np 2 --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/store.h5" \
    run.dir="$WORK/nogpu" run.device=cuda > "$WORK/nogpu.log" 2>&1; status=$?
case $status:$(cat "$WORK/nogpu.log") in
    1:*"device = cuda, but"*"sees no GPU"*|1:*"device = cuda, but this build of aldit has no CUDA"*) found=0 ;;
    *) found=1 ;;
esac
tap_result $found "device = cuda without a GPU: exit 1 saying why" "$(cat "$WORK/nogpu.log")"

# falling FILE: mean loss of the last 5 steps below that of the first 5
falling() {
    awk 'NR <= 5 { first += $2 } { last[NR % 5] = $2 } END { for (i in last) tail += last[i]
         printf "first 5: %g, last 5: %g\n", first / 5, tail / 5; exit !(NR >= 10 && tail < first) }' "$1"
}

if [ "$n_gpus" -lt 1 ]; then
    for name in "1-rank CPU run exits 0" "1-GPU run exits 0" "its summary names the GPU and the capacity" \
                "first 5 steps within 2e-2 of the CPU" "the loss falls on the CPU and on the GPU" \
                "2-GPU run exits 0" "2 GPU ranks within 1e-2 of 1" \
                "2 GPU ranks: bucketed, single and per-range all-reduce give the same losses" "a 10-step GPU run exits 0" \
                "restarted with 20 steps it resumes from step 10" "steps 11-20 after the resume within 1e-3" \
                "a calibrated GPU run times the shapes and keeps the timings" \
                "the next run in its folder reads them instead of timing" \
                "log.profile_from = 2, profile_steps = 2: the capture starts before step 2 and stops after step 3"; do
        skip "$name" "no GPU visible"
    done
    tap_done
fi

# (a) 1 GPU rank against the CPU
run_aldit 1 cpu run.device=cpu run.steps=$STEPS $SCHEDULE; status=$?
tap_is "1-rank CPU run exits 0" "$status" 0
run_aldit 1 gpu run.device=cuda run.steps=$STEPS $SCHEDULE; status=$?
tap_is "1-GPU run exits 0" "$status" 0
grep -q "device     cuda: GPU" "$WORK/gpu.log" && grep -q "capacity   GPU model for micro-batches" "$WORK/gpu.log"
tap_result $? "its summary names the GPU and the capacity" "$(head -16 "$WORK/gpu.log")"
losses "$WORK/cpu/metrics.jsonl" > "$WORK/cpu.losses"
losses "$WORK/gpu/metrics.jsonl" > "$WORK/gpu.losses"
compare "$WORK/cpu.losses" "$WORK/gpu.losses" 2e-2 1 5 > "$WORK/a.compare"
tap_result $? "first 5 steps within 2e-2 of the CPU (largest $(tail -1 "$WORK/a.compare"))" \
    "$(cat "$WORK/a.compare"; paste "$WORK/cpu.losses" "$WORK/gpu.losses" | head -5)"
{ falling "$WORK/cpu.losses" && falling "$WORK/gpu.losses"; } > "$WORK/falling"
tap_result $? "the loss falls on the CPU and on the GPU" "$(cat "$WORK/falling")"
all_steps=$(compare "$WORK/cpu.losses" "$WORK/gpu.losses" 1 1 $STEPS | tail -1)
echo "# CPU vs GPU, steps 1-$STEPS: largest relative difference $all_steps"

# (b) 2 GPU ranks against 1, the same global batch
if [ "$n_gpus" -ge 2 ]; then
    run_aldit 2 gpu2 run.device=cuda run.steps=$STEPS $SCHEDULE; status=$?
    tap_is "2-GPU run exits 0" "$status" 0
    losses "$WORK/gpu2/metrics.jsonl" > "$WORK/gpu2.losses"
    compare "$WORK/gpu.losses" "$WORK/gpu2.losses" 1e-2 1 $STEPS > "$WORK/b.compare"
    tap_result $? "2 GPU ranks within 1e-2 of 1 (largest $(tail -1 "$WORK/b.compare"))" "$(cat "$WORK/b.compare")"
    grep "device     cuda" "$WORK/gpu2.log" | sed 's/^/# /'
    same=0
    for bucket in 64MiB 0 1; do
        run_aldit 2 "bucket$bucket" run.device=cuda run.steps=$HALF $SCHEDULE balance.calibrate=off \
            train.allreduce_bucket=$bucket train.autotune=off || same=1
        losses "$WORK/bucket$bucket/metrics.jsonl" > "$WORK/bucket$bucket.losses"
    done
    [ -s "$WORK/bucket64MiB.losses" ] || same=1
    cmp -s "$WORK/bucket64MiB.losses" "$WORK/bucket0.losses" || same=1
    cmp -s "$WORK/bucket64MiB.losses" "$WORK/bucket1.losses" || same=1
    tap_result $same "2 GPU ranks: bucketed, single and per-range all-reduce give the same losses" \
        "$(paste "$WORK/bucket64MiB.losses" "$WORK/bucket0.losses" "$WORK/bucket1.losses"; tail -3 "$WORK/bucket1.log")"
else
    skip "2-GPU run exits 0" "one GPU visible"
    skip "2 GPU ranks within 1e-2 of 1" "one GPU visible"
    skip "2 GPU ranks: bucketed, single and per-range all-reduce give the same losses" "one GPU visible"
fi

# (c) a GPU checkpoint resumed on the GPU against the uninterrupted 1-GPU run above
run_aldit 1 resumed run.device=cuda run.steps=$HALF $SCHEDULE; status=$?
tap_is "a 10-step GPU run exits 0" "$status" 0
run_aldit 1 resumed run.device=cuda run.steps=$STEPS $SCHEDULE; status=$?
grep -q "resumed .*step_$(printf %08d $HALF).h5 at step $HALF" "$WORK/resumed.log"; found=$?
[ $status -eq 0 ] && [ $found -eq 0 ]
tap_result $? "restarted with 20 steps it resumes from step 10" "$(head -14 "$WORK/resumed.log")"
losses "$WORK/resumed/metrics.jsonl" > "$WORK/resumed.losses"
compare "$WORK/gpu.losses" "$WORK/resumed.losses" 1e-3 $((HALF + 1)) $STEPS > "$WORK/c.compare"
tap_result $? "steps 11-20 after the resume within 1e-3 (largest $(tail -1 "$WORK/c.compare"))" \
    "$(cat "$WORK/c.compare")"
identical=no
cmp -s "$WORK/gpu.losses" "$WORK/resumed.losses" && identical=yes
echo "# resumed losses bit-identical to the uninterrupted run: $identical"

# (e) the calibration cache: the first calibrated run times on the GPU and keeps calibration.txt; the next
# run in the same folder (here: resuming it) reads the file instead
run_aldit 1 calibrated run.device=cuda run.steps=2 balance.calibrate=1; status=$?
[ $status -eq 0 ] && grep -q "timed on the GPU .*kept in .*calibration.txt" "$WORK/calibrated.log" &&
    [ -s "$WORK/calibrated/calibration.txt" ]
tap_result $? "a calibrated GPU run times the shapes and keeps the timings" "$(grep -i calibrat "$WORK/calibrated.log")"
run_aldit 1 calibrated run.device=cuda run.steps=4 balance.calibrate=1; status=$?
[ $status -eq 0 ] && grep -q "timings read from .*calibration.txt.*the device's plans for them built in [0-9.]* s" \
    "$WORK/calibrated.log"
tap_result $? "the next run in its folder reads them instead of timing, and builds their plans before step 0" \
    "$(grep -i calibrat "$WORK/calibrated.log")"

# (f) the profiler's capture around steps 2-3 (cudaProfilerStart / Stop; without a profiler attached they do nothing)
run_aldit 1 profiled run.device=cuda run.steps=4 log.profile_from=2 log.profile_steps=2; status=$?
test "$status" -eq 0 -a "$(metrics_lines profiled)" -eq 4 &&
    grep -q "device profiler capture started at step 2" "$WORK/profiled.log" &&
    grep -q "device profiler capture stopped at step 3" "$WORK/profiled.log"
tap_result $? "log.profile_from = 2, profile_steps = 2: the capture starts before step 2 and stops after step 3" \
    "exit $status; $(grep -i profiler "$WORK/profiled.log")"
tap_done
