#!/bin/sh
# train_rundir.sh — the run folder's guards on 2 CPU ranks: a second live run on a folder is refused naming the
# holder, a dead run's lock is taken over naming it; a fresh start ([checkpoint] resume = off) into a used folder
# is refused, deleting nothing; --check finds a checkpoint of another model in the run folder; [checkpoint]
# a lock file that is a symbolic link or a FIFO is refused, its target untouched; a holder line's control bytes are
# escaped; at_end = off leaves out the final checkpoint of a run that ends by its steps, not that of a signal; [log]
# profile_from on the CPU backend (no profiler) is ignored with a warning.
. "${top_srcdir:-.}/tests/train_lib.sh"
tap_plan 19

tap_ok "aldit-store synth makes the test store" make_store

# 3. the lock: a live run holds it; a second one is refused (exit 2) naming host, pid and job id
SLURM_JOB_ID=4242 start_aldit 2 shared run.steps=100000 log.every=1000
first=$launcher
wait_for 60 has_lines shared 2
SLURM_JOB_ID=4343 $MPIEXEC -np 2 --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/shared" \
    run.steps=10 > "$WORK/second.log" 2>&1; status=$?
holder=$(cat "$WORK/shared/aldit.lock")
case $status:$holder:$(cat "$WORK/second.log") in
    2:"host $(hostname), pid "*", job 4242, started "*:*"the run folder $WORK/shared is in use by another run (host $(hostname), pid "*", job 4242"*) found=0 ;;
    *) found=1 ;;
esac
tap_result $found "a second run on a locked folder: exit 2 naming the holder ($holder)" "$(cat "$WORK/second.log")"
kill -0 $first 2>/dev/null
tap_result $? "the first run goes on"
# the first run dies without a normal exit (SIGKILL): the file still names it, the lock is free
kill -KILL $(run_pids shared $first) 2>/dev/null
wait $first
lines=$(metrics_lines shared)
run_aldit 2 shared run.steps=3 checkpoint.resume=on; status=$?
case $status:$(cat "$WORK/shared.log") in
    0:*"taking over the lock of the run folder $WORK/shared from a run that ended without a normal exit ($holder)"*) found=0 ;;
    *) found=1 ;;
esac
tap_result $found "the stale lock of the killed run is taken over, naming it" "$(head -5 "$WORK/shared.log")"
tap_is "a normal exit empties the lock file" "$(wc -c < "$WORK/shared/aldit.lock" | tr -d ' ')" 0

# issue 35.3: a lock file that is a symbolic link is refused (exit 2, saying to remove it), its target untouched
printf 'precious\n' > "$WORK/precious"
rm -f "$WORK/shared/aldit.lock"
ln -s "$WORK/precious" "$WORK/shared/aldit.lock"
run_aldit 2 shared run.steps=3 checkpoint.resume=on; status=$?
case $status:$(cat "$WORK/precious"):$(cat "$WORK/shared.log") in
    2:precious:*"the run folder's lock file $WORK/shared/aldit.lock is a symbolic link"*"Remove the link"*) found=0 ;;
    *) found=1 ;;
esac
tap_result $found "a symbolic link as the lock file: exit 2, its target untouched" "exit $status; $(cat "$WORK/shared.log")"
rm -f "$WORK/shared/aldit.lock"
mkfifo "$WORK/shared/aldit.lock"
run_aldit 2 shared run.steps=3 checkpoint.resume=on; status=$?
case $status:$(cat "$WORK/shared.log") in
    2:*"the run folder's lock file $WORK/shared/aldit.lock is not a regular file"*) found=0 ;;
    *) found=1 ;;
esac
tap_result $found "a FIFO as the lock file: exit 2" "exit $status; $(cat "$WORK/shared.log")"
rm -f "$WORK/shared/aldit.lock"
# a dead run's holder line with an escape sequence and a tab: printed as \x1b and \x09, not raw
printf 'host h\033[2J\tx, pid 1\n' > "$WORK/shared/aldit.lock"
run_aldit 2 shared run.steps=3 checkpoint.resume=on; status=$?
case $status:$(cat "$WORK/shared.log") in
    0:*'from a run that ended without a normal exit (host h\x1b[2J\x09x, pid 1)'*) found=0 ;;
    *) found=1 ;;
esac
grep -q "$(printf '\033')" "$WORK/shared.log" && found=1
tap_result $found "a lock file's control bytes are escaped in the take-over note" "exit $status; $(cat -v "$WORK/shared.log" | head -3)"

# 4. a fresh start into a folder with an earlier run's checkpoints and metrics: refused, nothing deleted
before=$(ls "$WORK/shared/checkpoints"; wc -c < "$WORK/shared/metrics.jsonl")
run_aldit 2 shared run.steps=5 checkpoint.resume=off; status=$?
case $status:$(cat "$WORK/shared.log") in
    2:*"[checkpoint] resume = off (a fresh start), but the run folder $WORK/shared holds an earlier run's files: 1 checkpoint(s) in $WORK/shared/checkpoints (the newest step_00000003.h5) and the metrics file"*) found=0 ;;
    *) found=1 ;;
esac
tap_result $found "resume = off into a used folder: exit 2 naming its checkpoints and metrics" "$(cat "$WORK/shared.log")"
tap_is "its files are untouched" "$(ls "$WORK/shared/checkpoints"; wc -c < "$WORK/shared/metrics.jsonl")" "$before"

# 9. --check looks at the checkpoint the run would resume from
run_check() { $MPIEXEC -np 2 --oversubscribe "$ALDIT" --check "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/shared" "$@"; }
out=$(run_check model.ffn_dim=48 2>&1); status=$?
case $status:$out in 2:*"checkpoint of another model: model.ffn_dim is 64 in the checkpoint, 48 in the deck"*"the run would resume from $WORK/shared/checkpoints/step_00000003.h5, which does not fit this deck"*) found=0 ;; *) found=1 ;; esac
tap_result $found "--check: the run folder's checkpoint belongs to another model: exit 2 naming it" "$out"
# issue 35.5: every difference the run's resume refuses, --check refuses too (it passed them), naming it
for case in "model.eps=1e-5|model.eps is 1e-06 in the checkpoint, 1e-05 in the deck" \
            "model.qk_norm=off|model.qk_norm is 1 in the checkpoint, 0 in the deck" \
            "model.cross_attn_norm=off|model.cross_attn_norm is 1 in the checkpoint, 0 in the deck" \
            "model.text_len=32|model.text_len is 16 in the checkpoint, 32 in the deck" \
            "model.text_padding=trim|model.text_padding is wan in the checkpoint, trim in the deck" \
            "run.seed=8|written with [run] seed = 7, the deck says 8"; do
    override=${case%%|*}
    out=$(run_check "$override" 2>&1); status=$?
    case $status:$out in 2:*"${case#*|}"*"the run would resume from $WORK/shared/checkpoints/step_00000003.h5"*) ;; *) break ;; esac
    override=
done
test -z "$override"
tap_result $? "--check refuses what the resume refuses: eps, qk_norm, cross_attn_norm, text_len, text_padding, seed" \
    "$override: exit $status; $out"
out=$(run_check balance.strategy=equal_tokens 2>&1); status=$?
case $status:$out in 2:*"step_00000003.h5: the balancer state does not match this deck and store; the run would not resume from it"*) found=0 ;; *) found=1 ;; esac
tap_result $found "--check: a checkpoint whose balancer state the resume would refuse (another strategy): exit 2" "$out"
# issue 35.10: the run itself names a changed text_padding (it said "different store index")
run_aldit 2 shared run.steps=5 model.text_padding=trim; status=$?
case $status:$(cat "$WORK/shared.log") in
    2:*"model.text_padding is wan in the checkpoint, trim in the deck (set [model] text_padding = wan to resume it)"*)
        ! grep -q "store index" "$WORK/shared.log" ;;
    *) false ;;
esac
tap_result $? "resuming with another text_padding: exit 2 naming it" "exit $status; $(cat "$WORK/shared.log")"
out=$(run_check checkpoint.resume=off 2>&1); status=$?
case $status:$out in 2:*"holds an earlier run's files"*) found=0 ;; *) found=1 ;; esac
tap_result $found "--check: a fresh start into the used folder: exit 2" "$out"

# 10. at_end = off: no final checkpoint when the steps are done (the every-2 one stays), one on a signal
run_aldit 2 noend run.steps=3 checkpoint.every=2 checkpoint.at_end=off; status=$?
test "$status" -eq 0 -a "$(metrics_lines noend)" -eq 3 -a "$(ls "$WORK/noend/checkpoints")" = step_00000002.h5 &&
    grep -q "no final checkpoint (\[checkpoint\] at_end = off): the last one is step 2's" "$WORK/noend.log"
tap_result $? "at_end = off: 3 steps, exit 0, only step 2's checkpoint, said so" \
    "exit $status; $(ls "$WORK/noend/checkpoints"); $(tail -3 "$WORK/noend.log")"
run_aldit 2 noend2 run.steps=2 checkpoint.at_end=off; status=$?
test "$status" -eq 0 -a -z "$(ls "$WORK/noend2/checkpoints" 2>/dev/null)" &&
    grep -q "no final checkpoint (\[checkpoint\] at_end = off): the run folder holds none" "$WORK/noend2.log"
tap_result $? "at_end = off without other checkpoints: none written, said so" "exit $status; $(tail -3 "$WORK/noend2.log")"
start_aldit 2 noendsig run.steps=20000 log.every=100 checkpoint.at_end=off
wait_for 60 has_lines noendsig 3
ranks=$(run_pids noendsig $launcher)
kill -TERM ${ranks:-$launcher}
wait $launcher; status=$?
stopped_at=$(metrics_lines noendsig)
test "$status" -eq 0 -a "$stopped_at" -lt 20000 -a -f "$WORK/noendsig/checkpoints/step_$(printf %08d "$stopped_at").h5"
tap_result $? "at_end = off: a signal still checkpoints the step it stopped at ($stopped_at)" \
    "exit $status; $(tail -5 "$WORK/noendsig.log")"

# 11. [log] profile_from: the CPU backend has no profiler: warned once, the run goes on
run_aldit 2 prof run.steps=3 log.profile_from=2 log.profile_steps=1; status=$?
test "$status" -eq 0 -a "$(metrics_lines prof)" -eq 3 -a \
    "$(grep -c "profile_from = 2: the cpu backend has no profiler to start; ignored" "$WORK/prof.log")" -eq 1
tap_result $? "profile_from on the CPU: 3 steps, exit 0, one warning" "exit $status; $(tail -5 "$WORK/prof.log")"
tap_done
