#!/bin/sh
# aldit_draws.sh — tests/bench/aldit_draws.py (the training peer's copy of aldit's per-sample draws) against aldit's
# own (tests/print_draws: prefetch_sigma, prefetch_i2v) for 500 samples, under both timestep laws, as TAP; skips where
# python3 does not run.
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON=${PYTHON:-python3}
. "$top_srcdir/tests/tap.sh"
"$PYTHON" -c "import numpy" > /dev/null 2>&1 || tap_skip_all "$PYTHON with numpy does not run"
work=$(mktemp -d /tmp/aldit_draws.XXXXXX)
tap_plan 2
n=0
for case in "1234 3 logit_normal 0.3" "77 5 uniform 0.5"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    "$top_builddir/tests/print_draws" $case 500 > "$work/c.$n" 2>&1
    # shellcheck disable=SC2086
    BENCH_DIR="$top_srcdir/tests/bench" "$PYTHON" - $case 500 > "$work/py.$n" 2>&1 <<'PY'
import os, sys
import numpy as np
sys.path.insert(0, os.environ["BENCH_DIR"])
import aldit_draws
seed, shift, law, share, n = sys.argv[1:]
draws = aldit_draws.AlditDraws({"run.seed": seed, "train.timestep_shift": shift, "train.timesteps": law,
                                "train.i2v_share": share})
for i in range(int(n)):
    print(f"{i} {float(np.float32(draws.sigma(0, i))):.9g} {int(draws.i2v(0, i, True))}")
PY
    cmp -s "$work/c.$n" "$work/py.$n"; status=$?
    [ "$(wc -l < "$work/c.$n")" = 500 ] || status=1
    tap_result $status "seed, shift, law, i2v_share $case: aldit_draws.py gives aldit's 500 sigmas and tasks" \
        "$(diff "$work/c.$n" "$work/py.$n" | head -6)"
done
rm -rf "$work"
tap_done
