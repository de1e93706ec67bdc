#!/bin/sh
# train_shard.sh — [train] shard on the CPU backend: optimizer, gradients and full give the per-step losses of none
# on 2 and 3 ranks (within 1e-6 relative: only the order of float sums differs), and a checkpoint written with full
# on 3 ranks resumes with none on 2 ranks and continues as the uninterrupted run does.
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=20
tap_plan 15
# a constant learning rate after the warmup: a run of 10 steps then resumed to 20 follows the 20-step schedule
run_aldit_constant() { run_aldit "$@" train.lr_schedule=constant; }

# compare A B TOLERANCE: per-step losses of runs A and B agree within TOLERANCE relative; prints the largest
compare() {
    losses "$WORK/$1/metrics.jsonl" > "$WORK/$1.losses"
    losses "$WORK/$2/metrics.jsonl" > "$WORK/$2.losses"
    paste "$WORK/$1.losses" "$WORK/$2.losses" | awk -v tol="$3" -v steps="$4" '
        { if ($1 != $3) { print "step mismatch: " $0; bad = 1; next }
          d = $2 - $4; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2
          if (d > tol * m) { print "step " $1 ": " $2 " vs " $4; bad = 1 }
          if (d / m > worst) worst = d / m }
        END { printf "%.2g\n", worst; exit bad || NR != steps }' > "$WORK/compare.$1.$2"
}

tap_ok "aldit-store synth makes the test store" make_store
for ranks in 2 3; do
    run_aldit_constant "$ranks" none$ranks run.steps=$STEPS train.shard=none; status=$?
    tap_is "shard = none on $ranks ranks exits 0" "$status" 0
    for mode in optimizer gradients full; do
        run_aldit_constant "$ranks" $mode$ranks run.steps=$STEPS train.shard=$mode; status=$?
        compare none$ranks $mode$ranks 1e-6 $STEPS
        tap_result $? "shard = $mode on $ranks ranks (exit $status): losses of none within 1e-6 (largest $(tail -1 "$WORK/compare.none$ranks.$mode$ranks"))" \
            "$(head -3 "$WORK/compare.none$ranks.$mode$ranks"; tail -3 "$WORK/$mode$ranks.log")"
    done
done
grep -q "shard = full over 3 rank(s)" "$WORK/full3.log"
tap_result $? "the start-up summary names the mode and the rank count" "$(grep state "$WORK/full3.log")"

# full on 3 ranks for 10 steps, then none on 2 ranks to step 20, against none on 2 ranks uninterrupted
run_aldit_constant 3 moved run.steps=10 train.shard=full; status=$?
tap_is "full on 3 ranks, 10 steps, exits 0" "$status" 0
ls "$WORK/moved"/checkpoints/*.h5 > /dev/null 2>&1
tap_result $? "it wrote a checkpoint" "$(ls -R "$WORK/moved")"
run_aldit_constant 2 moved run.steps=$STEPS train.shard=none; status=$?
tap_is "resumed with none on 2 ranks, exits 0" "$status" 0
grep -q "resumed" "$WORK/moved.log"
tap_result $? "it resumed from the checkpoint" "$(head -5 "$WORK/moved.log")"
compare none2 moved 1e-6 $STEPS
tap_result $? "its 20 steps match the uninterrupted none run within 1e-6 (largest $(tail -1 "$WORK/compare.none2.moved"))" \
    "$(head -3 "$WORK/compare.none2.moved")"
tap_done
