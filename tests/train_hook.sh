#!/bin/sh
# train_hook.sh — [checkpoint] hook (issue 32): rank 0 starts the command after each checkpoint with
# ALDIT_CHECKPOINT, ALDIT_STEP and ALDIT_RUN_DIR, detached (its output in run.dir/hooks.log); a slow command never
# slows the run (none is started while it runs, and the run says so and ends without waiting for it); a failing
# one is a warning, and the run's losses are those of a run without a hook.
. "${top_srcdir:-.}/tests/train_lib.sh"
tap_plan 8
tap_ok "aldit-store synth makes the test store" make_store

run_aldit 2 plain run.steps=6
run_aldit 2 hooked run.steps=6 checkpoint.every=2 \
    checkpoint.hook='echo "$ALDIT_STEP $ALDIT_CHECKPOINT $ALDIT_RUN_DIR" >> "$ALDIT_RUN_DIR/seen"; echo said step $ALDIT_STEP'
tap_result $? "a run with a hook after each checkpoint exits 0" "$(cat "$WORK/hooked.log")"
wait_for 10 sh -c "[ \$(wc -l < '$WORK/hooked/seen' 2>/dev/null || echo 0) -ge 3 ]"
want=$(for s in 2 4 6; do printf '%s %s/hooked/checkpoints/step_%08d.h5 %s/hooked\n' "$s" "$WORK" "$s" "$WORK"; done)
tap_is "the command ran for steps 2, 4 and 6 with the checkpoint's path and the run folder" \
    "$(sort -n "$WORK/hooked/seen")" "$want"
grep -q "said step 4" "$WORK/hooked/hooks.log" && grep -q "== aldit: checkpoint hook for step 6" "$WORK/hooked/hooks.log"
tap_result $? "its output goes to run.dir/hooks.log" "$(cat "$WORK/hooked/hooks.log")"
tap_is "the losses are those of the run without a hook" "$(losses "$WORK/hooked/metrics.jsonl")" \
    "$(losses "$WORK/plain/metrics.jsonl")"

# a slow command: started once, the run does not wait for it (the command stops itself after 60 s at most)
started=$(date +%s)
run_aldit 1 slow run.steps=4 checkpoint.every=1 \
    checkpoint.hook='echo $$ > "$ALDIT_RUN_DIR/sleeper.pid"; exec sleep 60'
status=$?; took=$(( $(date +%s) - started ))
sleeper=$(cat "$WORK/slow/sleeper.pid" 2> /dev/null)
[ -n "$sleeper" ] && kill "$sleeper" 2> /dev/null
case $status:$(cat "$WORK/slow.log") in
    0:*"hook of step 1 is still running; none is started for step 2"*"step 1 is still running (pid"*) found=0 ;;
    *) found=1 ;; esac
tap_result $found "a slow hook: none started while it runs, the run says so and exits 0" "$(cat "$WORK/slow.log")"
tap_result $(( took >= 50 )) "... without waiting for it (${took} s)" ""

run_aldit 1 failing run.steps=3 checkpoint.every=1 checkpoint.hook='exit 3'; status=$?
case $status:$(cat "$WORK/failing.log") in *"hook of step "[12]" exited with status 3"*) found=$(( status != 0 )) ;;
    *) found=1 ;; esac
tap_result $found "a failing hook is a warning; the run goes on to the end (exit 0)" "$(cat "$WORK/failing.log")"
tap_done
