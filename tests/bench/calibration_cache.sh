#!/bin/sh
# calibration_cache.sh — what reading the start-up calibration from calibration.txt costs a run's steps: three runs of
# one deck on one store, in one call: the first times its calibration, the second starts from a copy of the first's
# calibration.txt, the third times its own again. Prints each run's start-up calibration line, the per-step step_s
# and samples side by side, and each run's sum of step_s (the first step's data wait left out) and from step 2 on.
#
# usage: tests/bench/calibration_cache.sh [--smoke] [BUILD_DIR]     (BUILD_DIR: default the current directory)
#   GPU (default): the store of docs/PERFORMANCE.md (aldit-store synth, inputs/mixed.lengths, 800 samples, 64 text
#     tokens of 4096, seed 11) and inputs/wan1.3b-8layers.ini, one epoch each, no final checkpoint (~250 s on an H200).
#   --smoke: the same steps on the CPU at toy size (tests/decks/train_small.ini, 24 samples of
#     tests/decks/train_tiny.lengths, 3 steps of 6; the CPU backend times no calibration, so all three start alike), as TAP:
#     every run exits 0, the table has a row per step, and the three runs trained the same samples in every step.
# Environment: WORK (scratch folder; default a new one under /tmp, kept), ALDIT_LAUNCH (default "mpirun -np 1";
# --smoke: none), ARGS (more key=value overrides for every run), PYTHON (python3).
set -u
smoke=0
[ "${1:-}" = "--smoke" ] && { smoke=1; shift; }
build=$(cd "${1:-.}" && pwd)
srcdir=${SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${PYTHON:-python3}
for program in aldit aldit-store; do
    [ -x "$build/$program" ] || { echo "calibration_cache.sh: $build/$program not found (build it: make $program)" >&2; exit 2; }
done
"$PYTHON" -c "import json" > /dev/null 2>&1 || { echo "calibration_cache.sh: $PYTHON does not run" >&2; exit 77; }
work=${WORK:-$(mktemp -d /tmp/calibration_cache.XXXXXX)}
mkdir -p "$work" || exit 2

if [ "$smoke" = 1 ]; then
    deck="$srcdir/tests/decks/train_small.ini" launch=${ALDIT_LAUNCH:-}
    synth="--spec $srcdir/tests/decks/train_tiny.lengths --samples 24 --text-len 8 --text-dim 16 --seed 5"
    runs_args="run.steps=3"
else
    deck="$srcdir/inputs/wan1.3b-8layers.ini" launch=${ALDIT_LAUNCH:-mpirun -np 1}
    synth="--spec $srcdir/inputs/mixed.lengths --samples 800 --text-len 64 --text-dim 4096 --seed 11"
    runs_args=""
fi
store="$work/store.h5"
# shellcheck disable=SC2086
[ -s "$store" ] || "$build/aldit-store" synth $synth --out "$store" > "$work/synth.log" 2>&1 ||
    { echo "calibration_cache.sh: aldit-store synth failed:"; cat "$work/synth.log"; exit 1; } >&2

failed=0
for run in timed read timed_again; do
    rm -rf "${work:?}/$run"
    mkdir -p "$work/$run"
    [ "$run" = read ] && [ -s "$work/timed/calibration.txt" ] && cp "$work/timed/calibration.txt" "$work/read/"
    started=$(date +%s)
    # shellcheck disable=SC2086
    $launch "$build/aldit" "$deck" data.store="$store" run.dir="$work/$run" checkpoint.at_end=off $runs_args \
        ${ARGS:-} > "$work/$run.log" 2>&1
    status=$?
    echo "# $run: exit $status in $(( $(date +%s) - started )) s"
    grep "^  calibrate" "$work/$run.log" | sed 's/^ */#   /'
    [ "$status" = 0 ] || { failed=1; tail -n 5 "$work/$run.log" | sed 's/^/#   | /'; }
done
[ "$failed" = 0 ] || { [ "$smoke" = 1 ] && echo "1..1" && echo "not ok 1 - every run exits 0"; exit 1; }

"$PYTHON" - "$work" "$smoke" <<'PY'
import json, os, sys
work, smoke = sys.argv[1], sys.argv[2] == "1"
names = ["timed", "read", "timed_again"]
runs = {}
for name in names:
    with open(os.path.join(work, name, "metrics.jsonl")) as f:
        runs[name] = [row for row in (json.loads(line) for line in f if line.strip()) if "step_s" in row]
steps = max(len(rows) for rows in runs.values())
print("| step | " + " | ".join(f"{n}: s | samples" for n in names) + " |")
print("|---|" + "---|---|" * len(names))
for i in range(steps):
    cells = [f"{r[i]['step_s']:.3f} | {r[i]['samples']}" if i < len(r) else "- | -" for r in runs.values()]
    print(f"| {i} | " + " | ".join(cells) + " |")
for name, rows in runs.items():
    total = sum(r["step_s"] for r in rows) - rows[0]["data_wait_s"]
    print(f"{name}: {len(rows)} steps, {sum(r['samples'] for r in rows)} samples, {total:.2f} s (first wait out), "
          f"steps 2+ {sum(r['step_s'] for r in rows[2:]):.2f} s")
if smoke:
    same = all(len(rows) == steps for rows in runs.values()) and all(
        len({(runs[name][i]["samples"], runs[name][i]["tokens"]) for name in names}) == 1 for i in range(steps))
    print("1..2")
    print("ok 1 - every run exits 0, the table has a row per step (%d)" % steps)
    print(("ok" if same else "not ok") + " 2 - the three runs trained the same samples and tokens in every step")
    sys.exit(0 if same else 1)
PY
