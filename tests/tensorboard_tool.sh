#!/bin/sh
# tensorboard_tool.sh — tools/tensorboard_metrics.py (issue 32): a run's metrics.jsonl with validation and EMA as
# TensorBoard scalars (read back with tensorboard's EventAccumulator): the loss of every step, the validation
# losses and one curve per noise level; following a file as a run writes it, through a resume that rewrites its
# last steps (each step once, the new values). Skips where python3 cannot import tensorboard.
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs tensorboard
. "$top_srcdir/tests/train_lib.sh"
tool="$PYTHON $top_srcdir/tools/tensorboard_metrics.py"
tap_plan 6
tap_ok "aldit-store synth makes the test store" make_store
"$top_builddir/aldit-store" synth --spec "$top_srcdir/tests/decks/train_tiny.lengths" --samples 8 --text-len 16 \
    --text-dim 16 --draw-seed 1 --out "$WORK/val.h5" > /dev/null 2>&1
run_aldit 1 run run.steps=6 eval.store="$WORK/val.h5" eval.every=3 eval.sigmas=0.25,0.75 train.ema_decay=0.9
tap_result $? "a 6-step run with validation and EMA" "$(tail -5 "$WORK/run.log")"

cat > "$WORK/read.py" <<'PY'
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
board = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
board.Reload()
tags = board.Tags()["scalars"]
for tag in sys.argv[2:]:
    print(tag, " ".join(f"{e.step}:{e.value:.6g}" for e in board.Scalars(tag)) if tag in tags else "missing")
PY
# want METRICS KEY [INDEX]: "step:value" of each line with KEY, at 6 digits (INDEX: of a list)
want() {
    $PYTHON -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
key, index = sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None
print(' '.join(f\"{r['step']}:{(r[key] if index is None else r[key][index]):.6g}\" for r in rows if key in r))
" "$@"
}
$tool "$WORK/run/metrics.jsonl" > "$WORK/tool.log" 2>&1
tap_result $? "the tool writes run/tensorboard" "$(cat "$WORK/tool.log")"
got=$($PYTHON "$WORK/read.py" "$WORK/run/tensorboard" train/loss val/loss val/loss_ema val/loss_sigma/0.75 2> "$WORK/read.err")
m="$WORK/run/metrics.jsonl"
tap_is "loss, val_loss, val_loss_ema and the loss at sigma 0.75 at their steps" "$got" \
"train/loss $(want "$m" loss)
val/loss $(want "$m" val_loss)
val/loss_ema $(want "$m" val_loss_ema)
val/loss_sigma/0.75 $(want "$m" val_loss_sigma 1)"

# following: the first 5 lines, then (a resume from step 3) lines 1-3 and another run's 4-6
mkdir -p "$WORK/follow"
run_aldit 1 other run.steps=6 run.seed=9 eval.store="$WORK/val.h5" eval.every=3 eval.sigmas=0.25,0.75 train.ema_decay=0.9
head -5 "$m" > "$WORK/follow/metrics.jsonl"
$tool "$WORK/follow/metrics.jsonl" --follow --interval 0.2 --idle 4 > "$WORK/follow.log" 2>&1 &
follower=$!
sleep 1.5
{ head -3 "$m"; sed -n 4,6p "$WORK/other/metrics.jsonl"; } > "$WORK/follow/new" && mv "$WORK/follow/new" "$WORK/follow/metrics.jsonl"
wait $follower
tap_result $? "--follow stops after --idle seconds without a new line" "$(cat "$WORK/follow.log")"
got=$($PYTHON "$WORK/read.py" "$WORK/follow/tensorboard" train/loss 2> "$WORK/read.err")   # (it notes the purge)
tap_is "through the rewrite each step shows once, with the new lines' values" "$got" \
    "train/loss $( { head -3 "$m"; sed -n 4,6p "$WORK/other/metrics.jsonl"; } > "$WORK/expected"; want "$WORK/expected" loss)"
tap_done
