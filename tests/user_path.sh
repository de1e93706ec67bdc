#!/bin/sh
# user_path.sh — what a new user meets first on the CPU (issue 32): `aldit --check`'s stdout is a deck that
# `aldit --check` accepts again (the plan on stderr); recompute = block where no GPU is visible says how to plan a
# GPU job (run.device=cuda); a tiny mem_budget is written in sensible units and advises no recomputation on the
# CPU; a deck without [data] store names the key; a finished run says how to go on; a resumed run that its
# schedule is the deck's; a global_batch over the store's size that each step takes the whole epoch; and
# docs/running.md's start-up summary is what the quick start prints.
. "${top_srcdir:-.}/tests/train_lib.sh"
tap_plan 12
tap_ok "aldit-store synth makes the test store" make_store

check() { $MPIEXEC -np 1 "$ALDIT" --check "$@"; }
check "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/check" > "$WORK/resolved.ini" 2> "$WORK/plan.log"
tap_is "--check exits 0" "$?" 0
grep -q "steps per epoch" "$WORK/plan.log" && ! grep -q "steps per epoch\|^  store  \|^# plan" "$WORK/resolved.ini"
tap_result $? "--check: the plan goes to stderr, the resolved deck alone to stdout" "$(cat "$WORK/resolved.ini")"
out=$(check "$WORK/resolved.ini" 2>&1)
tap_result $? "the resolved deck passes --check again" "$out"

out=$(CUDA_VISIBLE_DEVICES= check "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/check" run.device=auto \
      train.recompute=block 2>&1); status=$?
case $status:$out in 2:*"add run.device=cuda"*) found=0 ;; *) found=1 ;; esac
tap_result $found "recompute = block, device = auto, no GPU: exit 2 saying run.device=cuda plans a GPU job" "$out"

echo "1 8 32 32" > "$WORK/big.lengths"   # 2048-token videos: 16.5 MiB of activations each
"$top_builddir/aldit-store" synth --spec "$WORK/big.lengths" --samples 4 --text-len 16 --text-dim 16 --seed 3 \
    --out "$WORK/big.h5" > /dev/null 2>&1
out=$(check "$TRAIN_DECK" data.store="$WORK/big.h5" run.dir="$WORK/check" balance.mem_budget=1MiB 2>&1); status=$?
case $status:$out in *"0.00 GiB"*|*"recompute = block,"*) found=1 ;; 2:*"memory budget of 1.0 MiB per rank"*) found=0 ;;
    *) found=1 ;; esac
tap_result $found "mem_budget = 1MiB: exit 2, sizes in MiB/KiB, no recomputation advised on the CPU" "$out"

sed '/^store *=/d' "$TRAIN_DECK" > "$WORK/nostore.ini"
out=$($MPIEXEC -np 1 "$ALDIT" "$WORK/nostore.ini" run.dir="$WORK/nostore" 2>&1); status=$?
case $status:$out in 2:*"nostore.ini sets no [data] store"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a deck without [data] store: exit 2 naming the key" "$out"
tap_ok "... and no run folder is made" test ! -e "$WORK/nostore"

run_aldit 1 done run.steps=2 && run_aldit 1 done run.steps=2
case $(cat "$WORK/done.log") in *"already complete at step 2 (raise run.steps"*) found=0 ;; *) found=1 ;; esac
tap_result $found "running a finished run again says how to go on" "$(cat "$WORK/done.log")"
grep -q "resumed .* at step 2; the schedule below is this deck's (a run extended past" "$WORK/done.log"
tap_result $? "a resumed run says its schedule is the deck's, re-planned when extended" "$(cat "$WORK/done.log")"
run_aldit 1 batch run.steps=1 balance.global_batch=100
grep -q "global batch 100 samples: more than the store's 64, so each step takes the whole epoch" "$WORK/batch.log"
tap_result $? "global_batch above the store's size says so" "$(cat "$WORK/batch.log")"
# running.md's start-up summary is the quick start's own (a 2-step run: the schedule line says 2 steps)
"$top_builddir/aldit-store" synth --spec "$top_srcdir/inputs/quickstart.lengths" --samples 256 --text-len 16 \
    --text-dim 32 --out "$WORK/quickstart.h5" > /dev/null 2>&1
$MPIEXEC -np 2 --oversubscribe "$ALDIT" "$top_srcdir/inputs/quickstart.ini" data.store="$WORK/quickstart.h5" \
    run.dir="$WORK/qs" run.steps=2 > "$WORK/qs.log" 2>&1
sed -n '/^aldit .*: training$/,/^  metrics/p' "$WORK/qs.log" | sed -e "s|$WORK/qs|run-quickstart|g" \
    -e "s|$WORK/||g" -e "s|$top_srcdir/inputs/|inputs/|" -e 's/^aldit [^ ]*: training/aldit VERSION: training/' \
    > "$WORK/summary.run"
awk '/^A start-up summary:/ {on = 1; next} on && /^```/ {if (inside) exit; inside = 1; next} inside {print}' \
    "$top_srcdir/docs/running.md" | sed -e 's/^aldit [^ ]*: training/aldit VERSION: training/' \
    -e 's/schedule   300 steps/schedule   2 steps/' > "$WORK/summary.doc"
diff "$WORK/summary.doc" "$WORK/summary.run" > "$WORK/summary.diff"
tap_result $? "running.md's start-up summary is the quick start's" "$(cat "$WORK/summary.diff" "$WORK/qs.log")"
tap_done
