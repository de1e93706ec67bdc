#!/bin/sh
# python_pins.sh — tools/requirements.txt and .ci/run's pip line pin the same Python packages at the same versions,
# so that what users install is what CI tests.
. "${top_srcdir:-.}/tests/tap.sh"
tap_plan 2
req="$top_srcdir/tools/requirements.txt"
pins_of_requirements() { grep -v '^#' "$req" | grep '==' | sort; }
pins_of_ci() { sed -n '/pip install/,/||/p' "$top_srcdir/.ci/run" | tr ' \\' '\n\n' | grep '==' | sort; }
n=$(pins_of_requirements | wc -l)
tap_result $(( n < 13 )) "tools/requirements.txt pins the tools' packages ($n pins)" "$(cat "$req")"
tap_is "... the same as .ci/run installs" "$(pins_of_ci | tr '\n' ' ')" "$(pins_of_requirements | tr '\n' ' ')"
tap_done
