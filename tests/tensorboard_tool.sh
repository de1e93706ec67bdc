#!/bin/sh
# tensorboard_tool.sh — tools/tensorboard_metrics.py on a real run's metrics (2 CPU ranks, the EMA and validation every
# 3 steps): every step's training loss, learning rate and validation losses (overall, per sigma, EMA) read back from
# the event files equal the metrics file's (float32); after a "resume" that rewrites steps 4-6 with other values, a second
# pass leaves each step once, with the new values; --follow picks up lines appended while it runs. Skipped where torch
# and tensorboard do not import.
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs torch tensorboard
. "${top_srcdir:-.}/tests/train_lib.sh"
tap_plan 5
TOOL="$PYTHON $top_srcdir/tools/tensorboard_metrics.py"
tap_ok "aldit-store synth makes the test store" make_store
run_aldit 2 run run.steps=6 train.ema_decay=0.9 eval.store="$WORK/store.h5" eval.every=3 eval.samples=8
tap_is "a 6-step run with the EMA and validation: exit 0" "$?" 0
cat > "$WORK/check.py" << 'PY'
import json, math, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
logdir, metrics = sys.argv[1], sys.argv[2]
acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
bad = []
rows = [json.loads(line) for line in open(metrics)]
def check(tag, step, want):
    if tag not in tags:
        bad.append(f"no {tag}")
        return
    got = [e.value for e in acc.Scalars(tag) if e.step == step]
    if len(got) != 1 or abs(got[0] - want) > 1e-6 * max(1.0, abs(want)):
        bad.append(f"{tag} step {step}: {got} against {want}")
for row in rows:
    step = row["step"]
    check("train/loss", step, row["loss"])
    check("train/lr", step, row["lr"])
    if "val_loss" in row:
        check("val/loss", step, row["val_loss"])
        check("val/loss_ema", step, row["val_loss_ema"])
        for sigma, value in zip(row["val_sigmas"], row["val_loss_sigma"]):
            check(f"val/loss_sigma_{sigma:g}", step, value)
steps = sorted(e.step for e in acc.Scalars("train/loss")) if "train/loss" in tags else []
if steps != [row["step"] for row in rows]:
    bad.append(f"train/loss steps {steps}")
print("; ".join(bad) if bad else f"{len(rows)} steps, {len(tags)} tags equal")
sys.exit(1 if bad else 0)
PY
$TOOL "$WORK/run" > "$WORK/tool.log" 2>&1 && $PYTHON "$WORK/check.py" "$WORK/run/tensorboard" "$WORK/run/metrics.jsonl" 2> /dev/null \
    > "$WORK/check.log"
tap_result $? "every step's losses, lr and validation losses read back equal ($(cat "$WORK/check.log"))" \
    "$(cat "$WORK/tool.log" "$WORK/check.log")"
# a resume rewrote steps 4-6 (other losses): the second pass purges the first one's from step 4 on
head -3 "$WORK/run/metrics.jsonl" > "$WORK/resumed.jsonl"
sed -n '4,6p' "$WORK/run/metrics.jsonl" | sed 's/"loss": \([0-9.e+-]*\)/"loss": 7.25/' >> "$WORK/resumed.jsonl"
cp "$WORK/resumed.jsonl" "$WORK/run/metrics.jsonl"
$TOOL "$WORK/run" > "$WORK/tool.log" 2>&1 && $PYTHON "$WORK/check.py" "$WORK/run/tensorboard" "$WORK/run/metrics.jsonl" 2> /dev/null \
    > "$WORK/check.log"
tap_result $? "after a rewrite of steps 4-6, each step once with its new values ($(cat "$WORK/check.log"))" \
    "$(cat "$WORK/tool.log" "$WORK/check.log")"
# --follow: lines appended while it runs are written; it stops after 2 s without growth
head -3 "$WORK/resumed.jsonl" > "$WORK/run/metrics.jsonl"
rm -rf "$WORK/run/tensorboard"
$TOOL "$WORK/run" --follow --interval 0.2 --stop-after 2 > "$WORK/tool.log" 2>&1 &
follower=$!
sleep 0.6
sed -n '4,6p' "$WORK/resumed.jsonl" >> "$WORK/run/metrics.jsonl"
wait $follower && $PYTHON "$WORK/check.py" "$WORK/run/tensorboard" "$WORK/run/metrics.jsonl" > "$WORK/check.log" 2> /dev/null
tap_result $? "--follow writes the lines appended while it runs ($(cat "$WORK/check.log"))" \
    "$(cat "$WORK/tool.log" "$WORK/check.log")"
tap_done
