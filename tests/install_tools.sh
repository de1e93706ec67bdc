#!/bin/sh
# install_tools.sh — `make install` puts the Python tools beside the programs (issue 32): with prefix=DIR, DIR/bin
# holds aldit-prepare-store, aldit-sample, aldit-plot, aldit-tensorboard, aldit-wan-parity and aldit-tiny-wan
# (and the program aldit-export, which also answers --help), each
# running the copy
# in DIR/share/aldit/tools with its helpers; they answer --help from there, and aldit-plot draws a real run's curves
# (where python3 imports numpy, h5py and matplotlib).
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs numpy h5py matplotlib
. "$top_srcdir/tests/train_lib.sh"
tap_plan 5
# a make of its own (not the jobserver of the make check that runs this)
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$top_builddir" install prefix="$WORK/inst" > "$WORK/install.log" 2>&1
tap_result $? "make install prefix=DIR" "$(tail -20 "$WORK/install.log")"
missing=
for command in aldit aldit-store aldit-sim aldit-forward aldit-prepare-store aldit-sample aldit-plot aldit-tensorboard \
               aldit-export aldit-wan-parity aldit-tiny-wan; do
    [ -x "$WORK/inst/bin/$command" ] || missing="$missing $command"
done
tap_is "the programs and the tools' commands are in DIR/bin" "$missing" ""
failed=
for command in aldit-prepare-store aldit-sample aldit-plot aldit-tensorboard aldit-export aldit-wan-parity \
               aldit-tiny-wan; do
    (cd "$WORK" && "$WORK/inst/bin/$command" --help > "$WORK/$command.help" 2>&1) || failed="$failed $command"
done
tap_is "each tool's command answers --help from the installed copy" "$failed" ""
grep -q "share/aldit/tools/sample.py" "$WORK/inst/bin/aldit-sample"
tap_result $? "aldit-sample runs DIR/share/aldit/tools/sample.py" "$(cat "$WORK/inst/bin/aldit-sample")"
make_store > /dev/null 2>&1 && run_aldit 1 run run.steps=3 && \
    (cd "$WORK" && "$WORK/inst/bin/aldit-plot" "$WORK/run/metrics.jsonl" --out "$WORK/plots" > "$WORK/plot.log" 2>&1) && \
    ls "$WORK"/plots/*.png > /dev/null 2>&1
tap_result $? "aldit-plot draws a 3-step run's curves as PNGs" "$(cat "$WORK/run.log" "$WORK/plot.log" 2>/dev/null | tail -20)"
tap_done
