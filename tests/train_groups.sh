#!/bin/sh
# train_groups.sh — training with sequence-parallel groups on the CPU (the test hook ALDIT_TEST_SP_GROUP forces them
# where the balancer chooses none): on 2 and 4 ranks, with every micro-batch on groups of 2 or 4 and with a step that
# mixes a group and single ranks, the per-step losses, sample and token counts equal a 1-rank run's (losses within
# 1e-6 relative); a grouped run stopped mid-epoch on 4 ranks resumes on 2; a bad group size is refused.
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=6
tap_plan 10

tap_ok "aldit-store synth makes the test store" make_store
# 4 heads: groups of 2 and 4 hold 2 and 1
run_group() {  # run_group K NP RUN [key=value ...]
    k=$1; shift
    ALDIT_TEST_SP_GROUP=$k run_aldit "$@" model.num_heads=4
}
fields() { sed -n 's/^{"step": \([0-9]*\),.*"loss": \([^,]*\),.*"samples": \([0-9]*\), "tokens": \([0-9]*\),.*/\1 \2 \3 \4/p' "$1"; }
# same_as_one RUN: RUN's steps, samples and tokens are the 1-rank run's, its losses within 1e-6 relative
same_as_one() {
    fields "$WORK/one/metrics.jsonl" > "$WORK/one.fields"
    fields "$WORK/$1/metrics.jsonl" > "$WORK/$1.fields"
    paste "$WORK/one.fields" "$WORK/$1.fields" | awk -v n=$STEPS '
        { if ($1 != $5 || $3 != $7 || $4 != $8) { print "step, samples or tokens differ: " $0; bad = 1; next }
          d = $2 - $6; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2
          if (d > 1e-6 * m) { print "step " $1 ": " $2 " vs " $6; bad = 1 }
          if (d / m > worst) worst = d / m }
        END { printf "%d steps, largest difference %.2g\n", NR, worst; exit bad || NR != n }'
}

run_aldit 1 one run.steps=$STEPS model.num_heads=4; status=$?
tap_is "the 1-rank run without groups exits 0" "$status" 0
for case in "2 2 two" "4 4 four" "2,1 4 mixed"; do
    set -- $case
    run_group "$1" "$2" "$3" run.steps=$STEPS; status=$?
    out=$(same_as_one "$3" 2>&1); same=$?
    [ $status -eq 0 ] && grep -q "ALDIT_TEST_SP_GROUP: micro-batches run on groups of ${1%,*} ranks" "$WORK/$3.log"; ran=$?
    tap_result $((status + same + ran)) "$2 ranks, groups ALDIT_TEST_SP_GROUP=$1: the 1-rank run's losses, samples and tokens ($out)" \
        "$out
$(tail -5 "$WORK/$3.log")"
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

ALDIT_TEST_SP_GROUP=3 run_aldit 2 bad run.steps=1 model.num_heads=4; status=$?
grep -q "ALDIT_TEST_SP_GROUP=3 (a test hook: K or K,BLOCKS): the group size must be a power of two up to 2" "$WORK/bad.log"
tap_result $(( (status != 2) + $? )) "a group of 3 ranks is refused with exit 2, naming the limit" "$(cat "$WORK/bad.log")"
ALDIT_TEST_SP_GROUP=2 run_aldit 2 heads run.steps=1 model.num_heads=1 model.dim=32; status=$?
grep -q "the group size must be a power of two up to 1 (that divides \[model\] num_heads = 1" "$WORK/heads.log"
tap_result $(( (status != 2) + $? )) "a group larger than the heads allow is refused with exit 2" "$(cat "$WORK/heads.log")"
tap_done
