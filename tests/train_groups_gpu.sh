#!/bin/sh
# train_groups_gpu.sh — training with sequence-parallel groups on GPU ranks ([run] device = cuda; the test hook
# ALDIT_TEST_SP_GROUP forces the groups): 2 ranks on groups of 2, also with [train] recompute = block and with the
# gradients reduce-scattered ([train] shard = full), and 4 ranks on groups of 4 and on a group of 2 beside single ranks,
# each within train_gpu.sh's 2-rank tolerance (1e-2 relative per step) of a 1-rank GPU run's losses, with its samples
# and tokens. 4 heads of 16 (dim 64): groups of 2 and 4 hold 2 and 1. Skipped where tests/gpu_present reports fewer
# GPU ranks than a case needs.
# GROUPS_FAMILY=hunyuanvideo15 (tests/train_hunyuan_groups_gpu.sh): the same cases on the MMDiT family's tiny GPU deck
# (tests/decks/hunyuan_tiny_gpu.ini, 4 heads of 16), both streams split over the groups.
. "${top_srcdir:-.}/tests/train_lib.sh"
STEPS=8
if [ "${GROUPS_FAMILY:-wan}" = hunyuanvideo15 ]; then
    TRAIN_DECK="$top_srcdir/tests/decks/hunyuan_tiny_gpu.ini"
    make_store() {
        "$top_builddir/aldit-store" synth --spec "$top_srcdir/tests/decks/train_tiny.lengths" --samples 64 \
            --text-len 16 --text-dim 32 --channels 8 --seed 3 --out "$WORK/store.h5"
    }
fi

n_gpus=0
probe="$top_builddir/tests/gpu_present"
if [ -x "$probe" ]; then n_gpus=$("$probe" 2> /dev/null) || n_gpus=0; fi
case $n_gpus in ''|*[!0-9]*) n_gpus=0 ;; esac
echo "# GPU ranks possible: $n_gpus"
if [ "$n_gpus" -lt 2 ]; then tap_skip_all "$n_gpus GPU rank(s) possible, 2 needed"; fi
tap_plan 7

DIMS="run.device=cuda model.dim=64 model.ffn_dim=128 model.num_heads=4 train.lr_schedule=constant"
fields() { sed -n 's/^{"step": \([0-9]*\),.*"loss": \([^,]*\),.*"samples": \([0-9]*\), "tokens": \([0-9]*\),.*/\1 \2 \3 \4/p' "$1"; }
# near REFERENCE RUN: RUN's steps, samples and tokens are REFERENCE's, its losses within 1e-2 relative
near() {
    fields "$WORK/$1/metrics.jsonl" > "$WORK/$1.fields"
    fields "$WORK/$2/metrics.jsonl" > "$WORK/$2.fields"
    paste "$WORK/$1.fields" "$WORK/$2.fields" | awk -v n="$STEPS" '
        { if ($1 != $5 || $3 != $7 || $4 != $8) { print "step, samples or tokens differ: " $0; bad = 1; next }
          if ($2 !~ /^[0-9.eE+-]+$/ || $6 !~ /^[0-9.eE+-]+$/) { print "not a loss: " $0; bad = 1; next }
          d = $2 - $6; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2
          if (d > 1e-2 * m) { print "step " $1 ": " $2 " vs " $6; bad = 1 }
          if (d / m > worst) worst = d / m }
        END { printf "%d steps, largest difference %.2g\n", NR, worst; exit bad || NR != n }'
}

tap_ok "aldit-store synth makes the test store" make_store
run_aldit 1 one run.steps=$STEPS $DIMS; status=$?
tap_is "the 1-GPU run without groups exits 0" "$status" 0

for case in "2 2 two" "2 2 block train.recompute=block balance.recompute=block" "2 2 sharded train.shard=full" \
            "4 4 four" "2,1 4 mixed"; do
    set -- $case
    k=$1; np=$2; run=$3; shift 3
    if [ "$n_gpus" -lt "$np" ]; then
        tap_result 0 "$np GPU ranks, groups ALDIT_TEST_SP_GROUP=$k${*:+ $*} # SKIP $n_gpus GPU rank(s) possible"
        continue
    fi
    ALDIT_TEST_SP_GROUP=$k run_aldit "$np" "$run" run.steps=$STEPS $DIMS "$@"; status=$?
    out=$(near one "$run" 2>&1); same=$?
    [ $status -eq 0 ] && grep -q "ALDIT_TEST_SP_GROUP: micro-batches run on groups of ${k%,*} ranks" "$WORK/$run.log"; ran=$?
    tap_result $((status + same + ran)) "$np GPU ranks, groups ALDIT_TEST_SP_GROUP=$k${*:+ $*}: the 1-GPU run's losses within 1e-2, its samples and tokens ($out)" \
        "$out
$(tail -8 "$WORK/$run.log")"
done
tap_done
