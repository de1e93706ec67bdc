#!/bin/sh
# mpi_deck.sh — the deck under MPI: rank 0 reads it, every rank gets the same struct; a bad deck ends every
# rank with exit status 2 and one FILE:LINE message from rank 0.
. "$top_srcdir/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
run2() { $MPIEXEC -np 2 --oversubscribe ./tests/test_mpi_deck "$@"; }

tap_plan 5
out=$(run2 "$top_srcdir/tests/decks/good.ini" run.steps=99 2>&1); status=$?
tap_result $status "2 ranks receive the same deck with the deck's and the override's values" "$out"
tap_is "rank 0 reports agreement" "$(printf '%s\n' "$out" | grep -c 'deck agrees on 2 ranks')" 1

bad="$top_srcdir/tests/decks/errors.ini"
out=$(run2 "$bad" 2>&1); status=$?
tap_is "a bad deck ends the job with status 2" "$status" 2
tap_is "the unknown key is named as FILE:LINE, once" \
    "$(printf '%s\n' "$out" | grep -c "^$bad:7: unknown key 'dimm' in \[model\]")" 1

out=$(run2 "$top_srcdir/tests/decks/good.ini" model.num_heads=5 2>&1); status=$?
tap_result $([ $status -eq 2 ] && printf '%s\n' "$out" | grep -q '^command line: model.dim (96) is not divisible' \
             && echo 0 || echo 1) "a bad override ends the job with status 2 and a command-line message" "$out"
tap_done
