#!/bin/sh
# train_warmstart.sh — a warm start onto a grown store ([checkpoint] resume_data = changed, issue 32): a run of 4
# steps on a 64-sample store goes on to step 8 on a 96-sample one; a plain resume there is refused (exit 2, naming
# resume_data); with changed, the step and schedule go on (steps 5-8 have the learning rates of an 8-step run),
# the AdamW moments carry over (step 5's m and v agree with step 4's through one gradient: ((m5 - b1 m4) / (1 - b1))^2
# = (v5 - b2 v4) / (1 - b2)) and so does the EMA (ema5 = d ema4 + (1 - d) w5); another model is still refused.
. "${top_srcdir:-.}/tests/train_lib.sh"
tap_plan 9
tap_ok "aldit-store synth makes the test store" make_store
"$top_builddir/aldit-store" synth --spec "$top_srcdir/tests/decks/train_tiny.lengths" --samples 96 --text-len 16 \
    --text-dim 16 --seed 5 --out "$WORK/grown.h5" > /dev/null 2>&1
tap_is "... and a grown one of 96 samples" "$?" 0

common="train.ema_decay=0.9 train.beta1=0.9 train.beta2=0.999 checkpoint.every=1 checkpoint.keep=10"
# shellcheck disable=SC2086
run_aldit 1 whole run.steps=8 $common && run_aldit 1 warm run.steps=4 $common
tap_result $? "an 8-step run and a 4-step one on the store" "$(tail -3 "$WORK/warm.log")"
# grown ARGS...: the run in $WORK/warm goes on, on the grown store
grown() {
    # shellcheck disable=SC2086
    $MPIEXEC -np 1 --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/grown.h5" run.dir="$WORK/warm" $common "$@" \
        > "$WORK/warm.log" 2>&1
}

grown run.steps=8; status=$?
case $status:$(cat "$WORK/warm.log") in 2:*"set checkpoint.resume_data = changed"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a plain resume onto the grown store: exit 2 naming checkpoint.resume_data" "$(cat "$WORK/warm.log")"

grown run.steps=8 checkpoint.resume_data=changed; status=$?
case $status:$(cat "$WORK/warm.log") in 0:*"at step 4"*"data       changed"*"96 samples"*|0:*"96 samples"*"at step 4"*"data       changed"*)
    found=0 ;; *) found=1 ;; esac
tap_result $found "resume_data = changed: the run goes on from step 4 on the 96 samples" "$(cat "$WORK/warm.log")"

# the learning rate of each step: the schedule of 8 steps, carried over the change of store
lrs() { sed -n 's/^{"step": \([0-9]*\),.*"lr": \([^,]*\),.*/\1 \2/p' "$1"; }
tap_is "steps 1-8 with the learning rates of the uninterrupted 8-step run" "$(lrs "$WORK/warm/metrics.jsonl")" \
    "$(lrs "$WORK/whole/metrics.jsonl")"

# values FILE DATASET: the dataset's values, one a line, at 9 significant digits
values() { h5dump -m '%.9g' -y -w 0 -d "$2" "$1" | sed -n '/DATA {/,/}/p' | tr ', ' '\n\n' | grep '^[-0-9]'; }
step4="$WORK/warm/checkpoints/step_00000004.h5" step5="$WORK/warm/checkpoints/step_00000005.h5"
tensor=blocks.0.ffn.0.weight
values "$step4" "/optim/m/$tensor" > "$WORK/m4"; values "$step5" "/optim/m/$tensor" > "$WORK/m5"
values "$step4" "/optim/v/$tensor" > "$WORK/v4"; values "$step5" "/optim/v/$tensor" > "$WORK/v5"
paste -d ' ' "$WORK/m4" "$WORK/m5" "$WORK/v4" "$WORK/v5" > "$WORK/moments"
awk 'BEGIN {b1 = 0.9; b2 = 0.999}
     {g = ($2 - b1 * $1) / (1 - b1); want = ($4 - b2 * $3) / (1 - b2); err += (g * g - want) ^ 2; norm += want ^ 2; n++}
     END {printf "%d values, relative error %.2g\n", n, sqrt(err / norm); exit !(n == 2048 && err <= 1e-6 * norm)}' \
    "$WORK/moments" > "$WORK/moments.result"
tap_result $? "the AdamW moments carry over: $(cat "$WORK/moments.result")" "$(head -3 "$WORK/moments")"
values "$step4" "/ema/$tensor" > "$WORK/e4"; values "$step5" "/ema/$tensor" > "$WORK/e5"
values "$step5" "/$tensor" > "$WORK/w5"
paste -d ' ' "$WORK/e4" "$WORK/e5" "$WORK/w5" > "$WORK/ema"
awk '{want = 0.9 * $1 + 0.1 * $3; err += ($2 - want) ^ 2; norm += want ^ 2; n++}
     END {printf "%d values, relative error %.2g\n", n, sqrt(err / norm); exit !(n == 2048 && err <= 1e-12 * norm)}' \
    "$WORK/ema" > "$WORK/ema.result"
tap_result $? "the EMA carries over: $(cat "$WORK/ema.result")" "$(head -3 "$WORK/ema")"

grown run.steps=12 checkpoint.resume_data=changed model.ffn_dim=96
case $?:$(cat "$WORK/warm.log") in 2:*"cannot resume"*) found=0 ;; *) found=1 ;; esac
tap_result $found "another model (ffn_dim 96) is still refused: exit 2" "$(cat "$WORK/warm.log")"
tap_done
