#!/bin/sh
# train_groups.sh — training with sequence-parallel groups on the CPU (the test hook ALDIT_TEST_SP_GROUP forces them
# where the balancer chooses none): on 2 and 4 ranks, with every micro-batch on groups of 2 or 4 and with a step that
# mixes a group and single ranks, and with the gradients reduce-scattered ([train] shard = full), the per-step losses, sample and token counts equal a 1-rank run's (losses within
# 1e-6 relative); so do the groups the balancer chooses ([balance] sp = 2 on 2 ranks, 4 on 4, mixed with single
# ranks); a grouped run stopped mid-epoch on 4 ranks resumes on 2 (forced groups, and the planner's); a corrupt sample left out of a group's
# micro-batch counts once; a bad group size is refused.
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=6
tap_plan 16

tap_ok "aldit-store synth makes the test store" make_store
# 4 heads: groups of 2 and 4 hold 2 and 1
run_group() {  # run_group K NP RUN [key=value ...]
    k=$1; shift
    ALDIT_TEST_SP_GROUP=$k run_aldit "$@" model.num_heads=4
}
fields() { sed -n 's/^{"step": \([0-9]*\),.*"loss": \([^,]*\),.*"samples": \([0-9]*\), "tokens": \([0-9]*\),.*/\1 \2 \3 \4/p' "$1"; }
# same_as REFERENCE RUN STEPS: RUN's steps, samples and tokens are REFERENCE's, its losses within 1e-6 relative
same_as() {
    fields "$WORK/$1/metrics.jsonl" > "$WORK/$1.fields"
    fields "$WORK/$2/metrics.jsonl" > "$WORK/$2.fields"
    paste "$WORK/$1.fields" "$WORK/$2.fields" | awk -v n="$3" '
        { if ($1 != $5 || $3 != $7 || $4 != $8) { print "step, samples or tokens differ: " $0; bad = 1; next }
          d = $2 - $6; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2
          if (d > 1e-6 * m) { print "step " $1 ": " $2 " vs " $6; bad = 1 }
          if (d / m > worst) worst = d / m }
        END { printf "%d steps, largest difference %.2g\n", NR, worst; exit bad || NR != n }'
}
same_as_one() { same_as one "$1" $STEPS; }

run_aldit 1 one run.steps=$STEPS model.num_heads=4; status=$?
tap_is "the 1-rank run without groups exits 0" "$status" 0
for case in "2 2 two" "4 4 four" "2,1 4 mixed" "2 4 sharded train.shard=full"; do
    set -- $case
    run_group "$1" "$2" "$3" run.steps=$STEPS $4; status=$?
    out=$(same_as_one "$3" 2>&1); same=$?
    [ $status -eq 0 ] && grep -q "ALDIT_TEST_SP_GROUP: micro-batches run on groups of ${1%,*} ranks" "$WORK/$3.log"; ran=$?
    tap_result $((status + same + ran)) "$2 ranks, groups ALDIT_TEST_SP_GROUP=$1${4:+ $4}: the 1-rank run's losses, samples and tokens ($out)" \
        "$out
$(tail -5 "$WORK/$3.log")"
done

# [balance] sp: the planner groups a sample over a rank's share of the step (here, most steps have one)
for case in "2 sp2" "4 sp4"; do
    set -- $case
    run_aldit "$1" "$2" run.steps=$STEPS model.num_heads=4 balance.sp="$1"; status=$?
    out=$(same_as_one "$2" 2>&1); same=$?
    grouped=$(awk '{ match($0, /"samples": [0-9]+/); total = substr($0, RSTART + 11, RLENGTH - 11)
                     n = split($0, f, /"rank_samples": \[/); split(f[2], g, /\]/); k = split(g[1], c, /, /); sum = 0
                     for (i = 1; i <= k; i++) sum += c[i]; if (sum > total) steps++ }
                   END { print steps + 0 }' "$WORK/$2/metrics.jsonl")
    [ $status -eq 0 ] && [ "$grouped" -gt 0 ]; ran=$?
    tap_result $((status + same + ran)) "$1 ranks, [balance] sp = $1: groups in $grouped of $STEPS steps; the 1-rank run's losses, samples and tokens ($out)" \
        "$out
$(tail -5 "$WORK/$2.log")"
done

run_group 2 4 resumed run.steps=3; status=$?
tap_is "a 4-rank run on groups of 2 stops at step 3 (mid-epoch) with a checkpoint" \
    "$status $(test -f "$WORK/resumed/checkpoints/step_00000003.h5" && echo written)" "0 written"
mv "$WORK/resumed.log" "$WORK/resumed.first.log"
run_group 2 2 resumed run.steps=$STEPS; status=$?
grep -q "resumed .*step_00000003.h5 at step 3" "$WORK/resumed.log"
tap_result $((status + $?)) "it resumes on 2 ranks on groups of 2" "$(head -20 "$WORK/resumed.log")"
out=$(same_as_one resumed 2>&1)
tap_result $? "the resumed run's steps 1-$STEPS: the 1-rank run's losses, samples and tokens ($out)" "$out"

# the planner's groups across a resume on another rank count: sp = auto, 4 ranks to step 3, then 2 ranks
run_aldit 4 planned run.steps=3 model.num_heads=4 balance.sp=auto; status=$?
mv "$WORK/planned.log" "$WORK/planned.first.log"
run_aldit 2 planned run.steps=$STEPS model.num_heads=4 balance.sp=auto; status=$((status + $?))
grep -q "resumed .*step_00000003.h5 at step 3" "$WORK/planned.log"; status=$((status + $?))
out=$(same_as_one planned 2>&1)
tap_result $((status + $?)) "[balance] sp = auto stopped at step 3 on 4 ranks, resumed on 2: the 1-rank run's losses, samples and tokens ($out)" \
    "$out
$(tail -5 "$WORK/planned.log")"

# one stored latent bit of sample 5 flipped ([data] verify finds it), on_corrupt = skip, one epoch (11 steps)
cp "$WORK/store.h5" "$WORK/damaged.h5"
"$top_builddir/tests/store_damage" "$WORK/damaged.h5" 5
run_damaged() {  # run_damaged K NP RUN: one epoch over the damaged store, groups of K
    ALDIT_TEST_SP_GROUP=$1 $MPIEXEC -np "$2" --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/damaged.h5" \
        run.dir="$WORK/$3" data.on_corrupt=skip run.steps=0 run.epochs=1 model.num_heads=4 > "$WORK/$3.log" 2>&1
}
run_damaged 1 1 corrupt_one; status=$?
run_damaged 2 2 corrupt_two; status=$((status + $?))
counts=$(for run in corrupt_one corrupt_two; do tail -1 "$WORK/$run/metrics.jsonl" | grep -c '"corrupt_samples": 1,'; done | tr '\n' ' ')
tap_is "a corrupt sample left out on 1 rank and on a group of 2: both runs count it once" "$status $counts" "0 1 1 "
out=$(same_as corrupt_one corrupt_two 11 2>&1)
tap_result $? "the group's steps without it: the 1-rank run's losses, samples and tokens ($out)" \
    "$out
$(grep -h 'leaving out' "$WORK/corrupt_one.log" "$WORK/corrupt_two.log")"

ALDIT_TEST_SP_GROUP=3 run_aldit 2 bad run.steps=1 model.num_heads=4; status=$?
grep -q "ALDIT_TEST_SP_GROUP=3 (a test hook: K or K,BLOCKS): the group size must be a power of two up to 2" "$WORK/bad.log"
tap_result $(( (status != 2) + $? )) "a group of 3 ranks is refused with exit 2, naming the limit" "$(cat "$WORK/bad.log")"
ALDIT_TEST_SP_GROUP=2 run_aldit 2 heads run.steps=1 model.num_heads=1 model.dim=32; status=$?
grep -q "the group size must be a power of two up to 1 (that divides \[model\] num_heads = 1" "$WORK/heads.log"
tap_result $(( (status != 2) + $? )) "a group larger than the heads allow is refused with exit 2" "$(cat "$WORK/heads.log")"
tap_done
