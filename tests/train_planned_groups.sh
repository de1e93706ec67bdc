#!/bin/sh
# train_planned_groups.sh — the groups the balancer chooses ([balance] sp = auto, no test hook) train on CPU ranks:
# aldit --check shows that the test deck's steps use groups of 2 (and 4) on 2 and 4 ranks; those runs give a 1-rank
# run's losses, samples and tokens (losses within 1e-6 relative: the fixed global batch makes them rank-count
# independent); a 4-rank run with groups stopped mid-epoch resumes on 2 ranks with the same losses.
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=6
tap_plan 7

tap_ok "aldit-store synth makes the test store" make_store
fields() { sed -n 's/^{"step": \([0-9]*\),.*"loss": \([^,]*\),.*"samples": \([0-9]*\), "tokens": \([0-9]*\),.*/\1 \2 \3 \4/p' "$1"; }
# same_as_one RUN: RUN's steps, samples and tokens are the 1-rank run's, its losses within 1e-6 relative
same_as_one() {
    fields "$WORK/one/metrics.jsonl" > "$WORK/one.fields"
    fields "$WORK/$1/metrics.jsonl" > "$WORK/$1.fields"
    paste "$WORK/one.fields" "$WORK/$1.fields" | awk -v n="$STEPS" '
        { if ($1 != $5 || $3 != $7 || $4 != $8) { print "step, samples or tokens differ: " $0; bad = 1; next }
          d = $2 - $6; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2
          if (d > 1e-6 * m) { print "step " $1 ": " $2 " vs " $6; bad = 1 }
          if (d / m > worst) worst = d / m }
        END { printf "%d steps, largest difference %.2g\n", NR, worst; exit bad || NR != n }'
}

# 4 heads: groups of up to 4
run_aldit 1 one run.steps=$STEPS model.num_heads=4; status=$?
tap_is "the 1-rank run (no group possible) exits 0" "$status" 0
for np in 2 4; do
    $MPIEXEC -np $np --oversubscribe "$ALDIT" --check "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/check$np" \
        model.num_heads=4 balance.sp=auto > "$WORK/check$np.log" 2>&1
    status=$?
    groups=$(sed -n "s/^  groups     sp up to $np ranks: \(.*\) samples per step.*/\1/p" "$WORK/check$np.log")
    run_aldit $np planned$np run.steps=$STEPS model.num_heads=4 balance.sp=auto; ran=$?
    out=$(same_as_one planned$np 2>&1); same=$?
    echo "$groups" | grep -q 'k=2 [0-9.]*[1-9]'; used=$?
    tap_result $((status + ran + same + used)) "$np ranks, sp = auto: the plan uses groups ($groups); the 1-rank run's losses ($out)" \
        "$out
$(tail -5 "$WORK/check$np.log")
$(tail -5 "$WORK/planned$np.log")"
done

run_aldit 4 resumed run.steps=3 model.num_heads=4 balance.sp=auto; status=$?
tap_is "a 4-rank run with groups stops at step 3 (mid-epoch) with a checkpoint" \
    "$status $(test -f "$WORK/resumed/checkpoints/step_00000003.h5" && echo written)" "0 written"
mv "$WORK/resumed.log" "$WORK/resumed.first.log"
run_aldit 2 resumed run.steps=$STEPS model.num_heads=4 balance.sp=auto; status=$?
grep -q "resumed .*step_00000003.h5 at step 3" "$WORK/resumed.log"
tap_result $((status + $?)) "it resumes on 2 ranks with groups" "$(head -20 "$WORK/resumed.log")"
out=$(same_as_one resumed 2>&1)
tap_result $? "the resumed run's steps 1-$STEPS: the 1-rank run's losses, samples and tokens ($out)" "$out"
tap_done
