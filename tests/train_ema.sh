#!/bin/sh
# train_ema.sh — [train] ema_decay on the CPU backend: the checkpoints' /ema equals the EMA recomputed from the
# per-step weights (from [model] init's weights; plain and with ema_warmup; needs h5py); a run cut halfway and
# resumed ends with weights, moments and EMA bit-identical to an uninterrupted run (1 rank, and 2 ranks with
# shard = full; h5diff); resumed with another mode and rank count, within fp32 summation noise; a checkpoint
# without /ema resumes with the EMA started at its weights (a note says so); one with /ema is not resumed with
# ema_decay off (exit 2 naming the ema_decay to set) unless ema_drop = on; ema_decay = off writes no /ema, and
# ema_decay outside [0, 1) is a deck error naming the key.
. "${top_srcdir:-.}/tests/train_lib.sh"
. "$top_srcdir/tests/python_lib.sh"
command -v h5diff > /dev/null 2>&1 || tap_skip_all "h5diff (hdf5-tools) is not installed"
STEPS=20
HALF=10
tap_plan 25
# a constant learning rate after the warmup: a run of HALF steps then resumed to STEPS follows the STEPS-step schedule
ema_run() { run_aldit "$@" train.lr_schedule=constant train.ema_decay=0.9; }
step_file() { printf '%s/%s/checkpoints/step_%08d.h5' "$WORK" "$1" "$2"; }
# same_state A B [OBJECT [h5diff options]]: the tensors of two checkpoints (weights, /optim, /ema; or OBJECT, e.g. /ema)
# agree, exactly unless the options say otherwise; prints h5diff's last lines, returns its status (0: the same)
same_state() {
    a=$1 b=$2 object=${3:-}
    shift 2; [ $# -gt 0 ] && shift
    h5diff "$@" --exclude-path /run --exclude-path /model --exclude-attribute / "$a" "$b" ${object:+"$object" "$object"} \
        > "$WORK/h5diff.out" 2>&1
    status=$?
    tail -5 "$WORK/h5diff.out"
    return $status
}
has_ema() { h5ls "$1" 2> /dev/null | grep -q '^ema  *Group'; }

tap_ok "aldit-store synth makes the test store" make_store

# (1) the EMA of every step against its recomputation from the weights, starting at [model] init's weights
run_aldit 1 init run.steps=1; status=$?
init=$(step_file init 1)
tap_is "a 1-step run without EMA makes the init weights (exit 0)" "$status:$(has_ema "$init" && echo ema)" "0:"
for variant in plain warmup; do
    if [ $variant = plain ]; then decay=0.9 warm=0; else decay=0.99 warm=1; fi
    run_aldit 1 $variant run.steps=6 checkpoint.every=1 checkpoint.keep=10 model.init="$init" \
        train.ema_decay=$decay train.ema_warmup=$warm; status=$?
    tap_is "6 steps with ema_decay = $decay, ema_warmup = $warm from [model] init exit 0" "$status" 0
    if "$PYTHON" -c "import h5py, numpy" > /dev/null 2>&1; then
        out=$("$PYTHON" "$top_srcdir/tests/ema_recompute.py" "$init" $decay $warm \
            $(for s in 1 2 3 4 5 6; do step_file $variant $s; printf ' '; done) 2>&1)
        case $out in *"same 6"*) found=0 ;; *) found=1 ;; esac
        tap_result $found "its /ema of each step is the EMA recomputed from the weights, bit for bit ($(printf '%s' "$out" | tr '\n' ' '))" "$out"
    else
        echo "ok $((TAP_COUNT += 1)) # SKIP $PYTHON cannot import h5py and numpy"
    fi
done
grep -q "ema        fp32 EMA of the weights, decay 0.9, from the \[model\] init weights" "$WORK/plain.log"
tap_result $? "the summary says the EMA starts at the [model] init weights" "$(grep ema "$WORK/plain.log")"

# (2) cut halfway and resumed, bit-identical to uninterrupted: 1 rank (none), 2 ranks (full)
for setting in "1 none" "2 full"; do
    set -- $setting
    ema_run $1 whole$1 run.steps=$STEPS train.shard=$2; status=$?
    ema_run $1 cut$1 run.steps=$HALF train.shard=$2
    ema_run $1 cut$1 run.steps=$STEPS train.shard=$2; status="$status:$?"
    tap_is "$1 rank(s), shard = $2: the uninterrupted and the resumed run exit 0" "$status" "0:0"
    grep -q "ema        .*from the checkpoint's /ema" "$WORK/cut$1.log"
    tap_result $? "the resumed run's EMA comes from the checkpoint's /ema" "$(head -20 "$WORK/cut$1.log")"
    out=$(same_state "$(step_file whole$1 $STEPS)" "$(step_file cut$1 $STEPS)"); status=$?
    tap_result $status "$1 rank(s), shard = $2: weights, moments and EMA of step $STEPS bit-identical to the uninterrupted run's" "$out"
    has_ema "$(step_file whole$1 $STEPS)"
    tap_result $? "the checkpoint holds /ema" "$(h5ls "$(step_file whole$1 $STEPS)" | grep -v '^blocks')"
done
out=$(same_state "$(step_file cut1 $HALF)" "$(step_file cut1 $STEPS)" /ema)
tap_is "the EMA moved between steps $HALF and $STEPS (h5diff finds differences)" "$?" 1

# another mode and rank count: the 2-rank full checkpoint of step HALF resumed on 3 ranks with optimizer
mkdir -p "$WORK/moved/checkpoints" && cp "$(step_file cut2 $HALF)" "$WORK/moved/checkpoints/"
ema_run 3 moved run.steps=$STEPS train.shard=optimizer; status=$?
tap_is "resumed on 3 ranks with shard = optimizer, exits 0" "$status" 0
out=$(same_state "$(step_file whole2 $STEPS)" "$(step_file moved $STEPS)" /ema -d 1e-6); status=$?
tap_result $status "its EMA of step $STEPS is the uninterrupted 2-rank run's within 1e-6 (fp32 summation noise)" "$out"

# a checkpoint without /ema: the EMA starts at its weights
run_aldit 1 noema run.steps=$HALF train.lr_schedule=constant; status=$?
has_ema "$(step_file noema $HALF)"
tap_is "ema_decay = off (the default) exits 0 and writes no /ema" "$status:$?" "0:1"
ema_run 1 noema run.steps=$STEPS; status=$?
grep -q "has no /ema (its run kept no EMA): the EMA starts at its weights" "$WORK/noema.log"
tap_result $? "resuming it with ema_decay = 0.9 (exit $status) notes that the EMA starts at its weights" \
    "$(head -20 "$WORK/noema.log")"
has_ema "$(step_file noema $STEPS)"
tap_result $? "and its checkpoint of step $STEPS holds /ema" ""

# issue 35.2: resuming a checkpoint with /ema and ema_decay off would drop the EMA: refused (run and --check)
# naming the ema_decay to set, its checkpoints untouched; with ema_drop = on it is dropped, said so
before=$(ls "$WORK/cut1/checkpoints")
run_aldit 1 cut1 run.steps=$((STEPS + 2)) train.lr_schedule=constant; status=$?
out=$("$ALDIT" --check "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/cut1" run.steps=$((STEPS + 2)) 2>&1)
status="$status:$?"
message="holds an EMA of the weights (/ema), but [train] ema_decay is off: resuming would drop it. Set [train] ema_decay = 0.9 (its run's) to keep it, or [train] ema_drop = on"
grep -qF "$message" "$WORK/cut1.log" && case $out in *"$message"*) true ;; *) false ;; esac &&
    test "$status" = 2:2 -a "$(ls "$WORK/cut1/checkpoints")" = "$before"
tap_result $? "ema_decay off on a checkpoint with /ema: run and --check exit 2 ($status) naming ema_decay = 0.9" \
    "$(tail -3 "$WORK/cut1.log"); $out"
run_aldit 1 cut1 run.steps=$((STEPS + 2)) train.lr_schedule=constant train.ema_drop=on; status=$?
grep -q "the EMA of .*step_000000$STEPS.h5 (/ema) is dropped (\[train\] ema_drop = on): this run keeps none" "$WORK/cut1.log"
found=$?
has_ema "$(step_file cut1 $((STEPS + 2)))" && found=1
[ "$status" -eq 0 ] || found=1
tap_result $found "with ema_drop = on: exit $status, the EMA dropped with a note, no /ema in step $((STEPS + 2))" \
    "$(head -20 "$WORK/cut1.log")"

# (3) ema_decay outside [0, 1)
for bad in 1 -0.1; do
    out=$("$ALDIT" --check "$TRAIN_DECK" data.store="$WORK/store.h5" train.ema_decay=$bad 2>&1); status=$?
    case $out in *"train.ema_decay: $bad is out of range [0, 1)"*) found=$status ;; *) found=x$status ;; esac
    tap_is "ema_decay = $bad is a deck error naming the key (exit 2)" "$found" 2
done
tap_done
