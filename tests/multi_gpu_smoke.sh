#!/bin/sh
# multi_gpu_smoke.sh — tests/bench/multi_gpu.sh at toy size on 2 CPU ranks (SMOKE=1): every section runs and its
# tables hold every expected row with numbers; the layer search stops where aldit --check does; a second call
# with the same WORK runs nothing again; a failing run, a run past its time limit and a run that does not fit the
# deadline are rows saying so, with the script's exit status 1, 1 and 3; a shared start-up calibration in WORK is
# copied into every run's folder.
. "${top_srcdir:-.}/tests/tap.sh"
PYTHON=${PYTHON:-python3}
"$PYTHON" -c "import json" > /dev/null 2>&1 || tap_skip_all "$PYTHON does not run"
script="${top_srcdir:-.}/tests/bench/multi_gpu.sh"
build=${top_builddir:-.}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/aldit-multigpu-XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT
export SMOKE=1 NGPU=2 ISSUE=21 PYTHON
tap_plan 15

SECTIONS=strategies,shard,wan14b,wan14b_fixed WORK="$WORK/all" sh "$script" "$build" > "$WORK/all.out" 2>&1; status=$?
tap_is "SMOKE=1 with every section exits 0" "$status" 0
tables="$WORK/all/tables.md"

# field FIELD LABEL: the FIELD-th |-separated field of the first table row of LABEL (awk's numbering: 2 = first column)
field() { awk -F'|' -v label="$2" -v f="$1" '{ l = $2; gsub(/ /, "", l) } l == label { v = $f; gsub(/^ +| +$/, "", v); print v; exit }' "$tables"; }
positive() { awk -v v="$1" 'BEGIN { gsub(/,/, "", v); exit !(v + 0 > 0) }'; }

bad=
for run in global_2gpu equal_tokens_2gpu dual_2gpu global_1gpu; do
    rate=$(field 8 "$run"); positive "$rate" || bad="$bad $run:samples/s='$rate'"
done
tap_result "$([ -z "$bad" ]; echo $?)" "the strategies table: the three strategies on 2 ranks and global on 1, samples/s > 0" \
    "$bad$(cat "$tables")"
met=$(grep -c '^- .*: [0-9.]*[%x] — \(met\|NOT met\)$' "$tables")
tap_is "three targets with their figures and met / NOT met" "$met" 3

bad=
for mode in none optimizer gradients full; do
    rate=$(field 6 "$mode"); state=$(field 9 "$mode")
    positive "$rate" && case $state in [0-9]*" "[KMG]iB) ;; *) false ;; esac || bad="$bad $mode:'$rate','$state'"
done
tap_result "$([ -z "$bad" ]; echo $?)" "the shard table: none, optimizer, gradients, full with samples/s > 0 and a state per rank" \
    "$bad$(cat "$tables")"
tap_is "shard none is the strategies' global run" "$(field 3 none)" global_2gpu

# the layer search: the trained count passed --check and one more layer did not (or it is the search's top, 6)
search_ok() {
    layers=$(cat "$WORK/all/$1.layers" 2>/dev/null)
    [ -n "$layers" ] && grep -qx "$layers 0" "$WORK/all/$1.search" || return 1
    [ "$layers" = 6 ] || grep -q "^$((layers + 1)) [1-9]" "$WORK/all/$1.search"
}
tap_result "$(search_ok wan14b; echo $?)" "wan14b: the most layers that aldit --check accepts (balance.mem_budget = 1MiB)" \
    "$(cat "$WORK/all/wan14b.search" 2>/dev/null)"
tap_is "wan14b: the search stopped below its top (6 layers do not fit 1MiB)" "$(cat "$WORK/all/wan14b.layers")" 2
bad=
for section in wan14b wan14b_fixed; do
    label="${section}_$(cat "$WORK/all/$section.layers" 2>/dev/null)l"
    flops=$(field 11 "$label"); steps=$(field 6 "$label")
    { positive "$flops" && [ "$steps" = 2 ]; } || bad="$bad $label:TFLOP/s='$flops',steps='$steps'"
done
tap_result "$([ -z "$bad" ]; echo $?)" "both Wan-14B sections trained 2 steps with model TFLOP/s per GPU > 0" "$bad$(cat "$tables")"

if "$PYTHON" -c "import matplotlib" > /dev/null 2>&1; then
    pngs=$(find "$WORK/all/plots" -name '*.png' | wc -l | tr -d ' ')
    tap_result "$([ "$pngs" -ge 6 ]; echo $?)" "PNG plots of the runs ($pngs)" "$(tail -n 3 "$WORK/all.out")"
else
    tap_result 0 "PNG plots skipped: $PYTHON cannot import matplotlib # SKIP"
fi

SECTIONS=strategies,shard PLOTS=off WORK="$WORK/all" sh "$script" "$build" > "$WORK/again.out" 2>&1; status=$?
tap_is "a second call with the same WORK exits 0 and runs nothing again" \
    "$status $(grep -c 'done in an earlier call' "$WORK/again.out") $(grep -c '^== .*(limit ' "$WORK/again.out")" "0 7 0"

SECTIONS=shard SHARDS=full ARGS=train.lr=-1 PLOTS=off WORK="$WORK/fail" sh "$script" "$build" > "$WORK/fail.out" 2>&1
status=$?
row=$(grep '^| full | shard_full |' "$WORK/fail/tables.md")
case $row in *"failed: exit 2 after"*"train.lr"*) found=0 ;; *) found=1 ;; esac
tap_is "a failing run: exit 1, and its row names the exit status and the bad key" "$status $found" "1 0"

SECTIONS=strategies RUNS=1gpu BASELINE_STEPS=100000 TIMEOUT=3 PLOTS=off WORK="$WORK/slow" sh "$script" "$build" \
    > "$WORK/slow.out" 2>&1; status=$?
row=$(grep '^| global_1gpu |' "$WORK/slow/tables.md" | head -n 1)
case $row in *"timed out (limit 3 s) after"*"step "*) found=0 ;; *) found=1 ;; esac
tap_is "a run past TIMEOUT: exit 1, and its row says timed out with its last progress line" "$status $found" "1 0" 
left=0
for proc in /proc/[0-9]*; do
    tr '\000' '\n' 2>/dev/null < "$proc/cmdline" | grep -qxF "run.dir=$WORK/slow/global_1gpu" && left=$((left + 1))
done
tap_is "the timed-out run's ranks are gone" "$left" 0

# the runs of one deck start from the calibration the first of them left in WORK (the CPU backend times none, so the
# file is planted: it is copied, not read)
mkdir -p "$WORK/share" && printf '# aldit start-up calibration (planted)\nkey test\nshapes 0\n' > "$WORK/share/calibration.quickstart.txt"
SECTIONS=shard SHARDS=optimizer,gradients PLOTS=off WORK="$WORK/share" sh "$script" "$build" > "$WORK/share.out" 2>&1
status=$?
copied=0
for mode in optimizer gradients; do
    cmp -s "$WORK/share/calibration.quickstart.txt" "$WORK/share/shard_$mode/calibration.txt" && copied=$((copied + 1))
done
tap_is "CALIBRATION_SHARE: both runs start from WORK's calibration.quickstart.txt, and say so" \
    "$status $copied $(grep -c '^   the start-up calibration from calibration.quickstart.txt$' "$WORK/share.out")" "0 2 2"

SECTIONS=shard DEADLINE_S=20 PLOTS=off WORK="$WORK/late" sh "$script" "$build" > "$WORK/late.out" 2>&1; status=$?
notrun=$(grep -c '^| [a-z]* | shard_[a-z]* | not run: expected' "$WORK/late/tables.md")
tap_is "runs that do not fit DEADLINE_S: exit 3, four rows saying not run" "$status $notrun" "3 4"
tap_done
