#!/bin/sh
# train_padding.sh — [model] text_padding = wan (the default) pads every caption with zero rows to text_len at read
# time, as Wan 2.1 does: a run on the trimmed store gives bit for bit the losses of text_padding = trim on a copy of
# the store whose captions are stored zero-padded; trim on the trimmed store differs.
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=10
tap_plan 6

tap_ok "aldit-store synth makes the test store (captions of 8 to 16 rows)" make_store
tap_ok "store_pad copies it with every caption zero-padded to 16 rows" \
    "$top_builddir/tests/store_pad" "$WORK/store.h5" "$WORK/padded.h5" 16
run_aldit 2 wan run.steps=$STEPS; status=$?
tap_is "the default (wan) on the trimmed store exits 0" "$status" 0
$MPIEXEC -np 2 --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/padded.h5" run.dir="$WORK/stored" \
    run.steps=$STEPS model.text_padding=trim > "$WORK/stored.log" 2>&1; status=$?
tap_is "trim on the padded store exits 0" "$status" 0
losses "$WORK/wan/metrics.jsonl" > "$WORK/wan.losses"
losses "$WORK/stored/metrics.jsonl" > "$WORK/stored.losses"
[ "$(wc -l < "$WORK/wan.losses")" -eq $STEPS ] && cmp -s "$WORK/wan.losses" "$WORK/stored.losses"
tap_result $? "padded at read time = stored padded, bit for bit ($STEPS steps)" \
    "$(paste "$WORK/wan.losses" "$WORK/stored.losses" | head -3)"
run_aldit 2 trim run.steps=$STEPS model.text_padding=trim
losses "$WORK/trim/metrics.jsonl" > "$WORK/trim.losses"
[ "$(wc -l < "$WORK/trim.losses")" -eq $STEPS ] && ! cmp -s "$WORK/wan.losses" "$WORK/trim.losses"
tap_result $? "trim on the trimmed store sees other inputs (its losses differ)" \
    "$(paste "$WORK/wan.losses" "$WORK/trim.losses" | head -3)"
tap_done
