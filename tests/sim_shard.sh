#!/bin/sh
# sim_shard.sh — aldit-sim's per-rank memory plan under [train] shard: Wan-14B (inputs/wan14b.ini, its device_mem
# an H200's) on 8 ranks with shard = full holds at most 32 GiB of training state and leaves an activation budget
# beside it that holds the longest video (a CUDA build plans it as aldit --check does, with the GPU model's workspace
# and the CUDA libraries' reserve; otherwise device_mem x (1 - margin) less the state); every mode's breakdown (bf16 weights, gathered blocks, gradients, master, moments) and budget on
# the GPU and the CPU backend equal an independent computation from the dims' parameter count (awk below, not
# the layout table; samples over a mode's budget are skipped there); auto picks the least mode whose budget holds the largest sample; none refuses 14B (exit 2).
. "$top_srcdir/tests/tap.sh"
spec="$top_srcdir/inputs/mixed.lengths"
deck14="$top_srcdir/inputs/wan14b.ini"
deck13="$top_srcdir/inputs/wan1.3b.ini"
tap_plan 14

# sim RANKS DECK OVERRIDE...: aldit-sim's JSON line for the global strategy
sim() {
    ranks=$1 model=$2; shift 2
    ./aldit-sim --spec "$spec" --ranks "$ranks" --samples 2000 --strategy global --json --model "$model" "$@"
}
# value KEY JSON: a number (or the shard name) of aldit-sim's JSON line
value() { printf '%s\n' "$2" | tr '{},' '\n\n\n' | awk -F: -v key="\"$1\"" '$1 == key {gsub(/"/, "", $2); print $2; exit}'; }

# expected MODE RANKS BACKEND D F LAYERS: "parameters weights gathered gradients master moments" from the dims of
# Wan 2.1 (text 4096, freq 256, 16 channels, patch 1x2x2, qk_norm and cross_attn_norm on), counted tensor by tensor.
expected() {
    awk -v mode="$1" -v R="$2" -v backend="$3" -v D="$4" -v F="$5" -v L="$6" 'function up(x) { return int((x + R - 1) / R) }
    BEGIN {
        attn = 4 * (D * D + D) + 2 * D                       # q, k, v, o and the q, k RMSNorms
        block = 6 * D + attn + 2 * D + attn + (F * D + F) + (D * F + D)   # modulation, self, norm3, cross, FFN
        emb = D * 16 * 4 + D + (4096 * D + D) + (D * D + D) + (256 * D + D) + (D * D + D) + (6 * D * D + 6 * D)
        head = 2 * D + 64 * D + 64
        n = emb + L * block + head; e = emb + head
        s = backend == "gpu" ? up(emb) + L * up(block) + up(head) : up(n)
        if (backend == "cpu") {
            w = 4 * n; g = 4 * n; gath = 0; mast = 0; mom = 8 * n
            if (mode != "none") mom = 8 * s
            if (mode == "gradients" || mode == "full") g += 4 * s
        } else {
            w = 2 * n; g = 4 * n; gath = 0; mast = 4 * n; mom = 8 * n
            # sharded: each unit padded to R equal pieces; the fp32 reads f (modulations, norm3 and, but in full,
            # the time path) whole; two staging slots, each taking the gradients of a block or of the embeddings
            ep = R * (up(emb) + up(head)); bp = R * up(block); np = ep + L * bp
            stage = (bp > R * up(emb)) ? bp : R * up(emb)
            f = 2 * D + L * 8 * D
            if (mode != "full") f += (256 * D + D) + (D * D + D) + (6 * D * D + 6 * D)
            if (mode != "none") { w = 2 * np; mast = 4 * s + 4 * f; mom = 8 * s }
            if (mode == "gradients" || mode == "full") g = 4 * (R * up(head) + 2 * stage) + 4 * s
            if (mode == "full") { w = 2 * ep; gath = 4 * bp }
        }
        printf "%.0f %.0f %.0f %.0f %.0f %.0f\n", n, w, gath, g, mast, mom
    }'
}
got_split() {
    printf '%s %s %s %s %s %s\n' "$(value parameters "$1")" "$(value state_weights_bytes "$1")" \
        "$(value state_gathered_bytes "$1")" "$(value state_gradients_bytes "$1")" "$(value state_master_bytes "$1")" \
        "$(value state_moments_bytes "$1")"
}
gib=1073741824
# a CUDA build plans a GPU deck with the backend's own plan (as aldit --check does), else with the formula
cuda=; [ -x "${top_builddir:-.}/tests/gpu_present" ] && cuda=1
device=$(awk -v g=$gib 'BEGIN {printf "%.0f", 140 * g}')   # balance.device_mem in inputs/wan14b.ini

out=$(sim 8 "$deck14" train.shard=full 2>&1); status=$?
tap_is "14B, 8 ranks, shard = full: exit 0" "$status" 0
tap_is "its breakdown equals the count from the dims" "$(got_split "$out")" "$(expected full 8 gpu 5120 13824 40)"
state=$(value state_bytes "$out"); budget=$(value mem_budget_bytes "$out"); largest=$(value largest_sample_bytes "$out")
check=$(awk -v s="$state" -v b="$budget" -v l="$largest" -v g=$gib 'BEGIN {print (s <= 32 * g && b >= l) ? 0 : 1}')
tap_result "$check" "state <= 32 GiB, leaving an activation budget that holds the largest sample" \
    "state $state, budget $budget, largest $largest"
if [ -n "$cuda" ]; then
    # the GPU backend's own plan (aldit --check's): its model's workspace and 1 GiB for the CUDA libraries fit too
    check=$(awk -v s="$state" -v b="$budget" -v d="$device" -v g=$gib 'BEGIN {print (b > 0 && b <= d * (1 - 0.1) - s - g) ? 0 : 1}')
    tap_result "$check" "activation budget: the GPU plan's, within device_mem x (1 - mem_margin) - state - 1 GiB" \
        "budget $budget, state $state"
else
    check=$(awk -v s="$state" -v b="$budget" -v d="$device" 'BEGIN {print (b == d * (1 - 0.1) - s) ? 0 : 1}')
    tap_result "$check" "activation budget = device_mem x (1 - mem_margin) - state (no CUDA backend)" "budget $budget, state $state"
fi
text=$(./aldit-sim --spec "$spec" --ranks 8 --samples 2000 --strategy global --model "$deck14" train.shard=full 2>&1)
case $text in *"train.shard = full over 8 ranks"*"gathered blocks 1.31 GiB"*"activation budget"*) found=0 ;; *) found=1 ;; esac
tap_result $found "the table prints the per-rank breakdown and the budget" "$text"

ok=0; detail=
# (3 ranks with optimizer: 133 GiB of state, more than the H200 holds)
for run in "3 gradients" "3 full" "8 optimizer" "8 gradients" "64 optimizer" "64 gradients" "64 full"; do
    set -- $run
    out=$(sim "$1" "$deck14" train.shard="$2" balance.oversize=skip 2>&1)
    got=$(got_split "$out"); want=$(expected "$2" "$1" gpu 5120 13824 40)
    [ "$got" = "$want" ] || { ok=1; detail="$detail$1 ranks $2: got $got, want $want
"; }
done
tap_result $ok "GPU, 14B: optimizer, gradients, full at 3, 8, 64 ranks (uneven cuts too) equal the count" "$detail"
ok=0; detail=
for mode in none optimizer gradients full; do
    out=$(sim 3 "$deck13" train.shard=$mode run.device=cpu balance.oversize=skip 2>&1)
    got=$(got_split "$out"); want=$(expected $mode 3 cpu 1536 8960 30)
    [ "$got" = "$want" ] || { ok=1; detail="$detail$mode: got $got, want $want
"; }
done
tap_result $ok "CPU backend, 1.3B on 3 ranks: every mode equals the count" "$detail"

out=$(sim 8 "$deck14" train.shard=full train.ema_decay=0.999 2>&1)
# the master holds, besides the held values, full's fp32 reads (head.modulation, each block's modulation and norm3)
f14=$(awk 'BEGIN {D = 5120; printf "%.0f", 2 * D + 40 * 8 * D}')
check=$(awk -v e="$(value state_ema_bytes "$out")" -v t="$(value state_bytes "$out")" -v m="$(value state_master_bytes "$out")" \
    -v s="$state" -v f="$f14" 'BEGIN {print (e == m - 4 * f && t == s + e) ? 0 : 1}')
tap_result "$check" "with train.ema_decay the fp32 EMA adds 4 bytes per held value (as the master)" "$out"

# auto: the formula leaves gradients room for the 76,032-token video; the GPU plan (workspace, reserve) only full
want_auto=gradients less=optimizer
[ -n "$cuda" ] && want_auto=full less=gradients
out=$(sim 8 "$deck14" train.shard=auto 2>&1); status=$?
auto_mode=$(value shard "$out")
tap_is "14B, 8 ranks, shard = auto: exit 0, chosen by auto, $want_auto" "$status:$(value shard_auto "$out"):$auto_mode" "0:1:$want_auto"
largest=$(value largest_sample_bytes "$out")
opt=$(sim 8 "$deck14" train.shard=$less balance.oversize=skip 2>/dev/null)
check=$(awk -v l="$largest" -v a="$(value mem_budget_bytes "$out")" -v o="$(value mem_budget_bytes "$opt")" \
    'BEGIN {print (o < l && l <= a) ? 0 : 1}')
tap_result "$check" "auto is the least: $less's budget is short of the largest sample, $want_auto's holds it" "$out"
text=$(./aldit-sim --spec "$spec" --ranks 8 --samples 2000 --strategy global --model "$deck14" 2>&1)
case $text in *"train.shard = $want_auto over 8 ranks; auto: the least sharding that fits"*"by mode: none"*) found=0 ;; *) found=1 ;; esac
tap_result $found "auto says so, and lists every mode's state and budget" "$text"

out=$(sim 8 "$deck14" train.shard=none 2>&1); status=$?
case $status:$out in 2:*"239.5 GiB per rank with train.shard = none"*|2:*"239.53 GiB of weights, gradients and AdamW moments"*)
    found=0 ;; *) found=1 ;; esac
tap_result $found "14B with shard = none: exit 2 naming the state" "$status: $out"
out=$(sim 8 "$deck13" train.shard=auto 2>&1)
tap_is "1.3B on 8 ranks, auto: none fits" "$(value shard "$out"):$(got_split "$out")" "none:$(expected none 8 gpu 1536 8960 30)"
./aldit-sim --spec "$spec" --ranks 8 --model "$deck14" train.shard=most > /dev/null 2>&1
tap_is "an unknown train.shard: exit 2" "$?" 2
tap_done
