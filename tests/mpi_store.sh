#!/bin/sh
# mpi_store.sh — the store under MPI: rank 0 reads the index and broadcasts it, every rank opens the file and
# reads the same bytes; a missing or corrupt store ends every rank with exit status 2 and one message.
. "$top_srcdir/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
run2() { $MPIEXEC -np 2 --oversubscribe ./tests/test_mpi_store "$@"; }
work=$(mktemp -d "$PWD/mpi_store.tmp.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT

tap_plan 5
./aldit-store synth --spec "$top_srcdir/inputs/quickstart.lengths" --samples 60 --out "$work/s.h5" \
    --text-len 6 --text-dim 8 --seed 4 >/dev/null
tap_is "aldit-store synth makes the test store" "$?" 0
out=$(run2 "$work/s.h5" 2>&1); status=$?
tap_result $status "2 ranks see the same index and read the same sample bytes" "$out"
tap_is "rank 0 reports agreement on 60 samples" "$(printf '%s\n' "$out" | grep -c 'store agrees on 2 ranks: 60 samples')" 1

out=$(run2 "$work/missing.h5" 2>&1); status=$?
tap_is "a missing store ends the job with status 2" "$status" 2
tap_is "the missing file is named once, by rank 0" \
    "$(printf '%s\n' "$out" | grep -c "missing.h5: cannot open store: No such file or directory")" 1
tap_done
