#!/bin/sh
# train_hook.sh — [checkpoint] on_save on 2 CPU ranks: the command runs after each checkpoint with ALDIT_CHECKPOINT,
# ALDIT_STEP and ALDIT_RUN_DIR set (a complete checkpoint file each time); a slow command neither slows the run nor piles
# up (a checkpoint while it runs starts none, and the end says it goes on); a failing one is reported, the run exits 0.
. "${top_srcdir:-.}/tests/train_lib.sh"
tap_plan 6
tap_ok "aldit-store synth makes the test store" make_store

run_aldit 2 seen run.steps=6 checkpoint.every=2 checkpoint.keep=5 \
    'checkpoint.on_save=echo "$ALDIT_STEP $ALDIT_CHECKPOINT $ALDIT_RUN_DIR" >> "$ALDIT_RUN_DIR/seen.txt"'
tap_is "a run with on_save: exit 0" "$?" 0
three_lines() { [ "$(wc -l < "$WORK/seen/seen.txt" 2> /dev/null)" = 3 ]; }
wait_for 20 three_lines
ok=0
for step in 2 4 6; do
    file="$WORK/seen/checkpoints/step_$(printf %08d $step).h5"
    grep -qx "$step $file $WORK/seen" "$WORK/seen/seen.txt" && [ -f "$file" ] || ok=1
done
tap_result $ok "the command ran after the checkpoints of steps 2, 4 and 6 with the file, step and folder" \
    "$(cat "$WORK/seen/seen.txt"; ls "$WORK/seen/checkpoints")"

started=$(date +%s)
run_aldit 2 slow run.steps=4 checkpoint.every=1 checkpoint.keep=5 'checkpoint.on_save=sleep 6'
status=$?
took=$(($(date +%s) - started))
[ $status -eq 0 ] && [ $took -lt 6 ] && grep -q "on_save for step 1 (pid [0-9]*) is still running: not started for step 2" \
    "$WORK/slow.log" && grep -q "on_save for step 1 (pid [0-9]*) is still running; it goes on after aldit exits" \
    "$WORK/slow.log"
tap_result $? "a command slower than the steps: the run takes $took s (< 6), starts no second one, and says it goes on" \
    "$(grep aldit "$WORK/slow.log")"

run_aldit 2 failing run.steps=5 checkpoint.every=1 checkpoint.keep=5 'checkpoint.on_save=echo broken; exit 3'
status=$?
[ $status -eq 0 ] && grep -q "on_save for step [1-4] exited with status 3 (its output: .*on_save.log)" "$WORK/failing.log"
tap_result $? "a failing command is reported, the run exits 0 ($status)" "$(grep aldit "$WORK/failing.log")"
grep -q broken "$WORK/failing/on_save.log"
tap_result $? "its output is in RUN/on_save.log" "$(cat "$WORK/failing/on_save.log")"
tap_done
