#!/bin/sh
# train_safetensors.sh — aldit-export and [model] init with safetensors in the programs: a trained checkpoint exported as
# Wan and diffusers safetensors (whole, sharded, EMA), runs started from each train as from the HDF5 checkpoint (losses
# and exported weights equal to the bit), a conversion diffusers -> Wan equals the direct export, and the refusals
# (a bad --out, no dims, a missing EMA, a truncated or damaged init) exit non-zero naming what.
. "${top_srcdir:-.}/tests/train_lib.sh"
EXPORT="$top_builddir/aldit-export"
tap_plan 18
make_store || exit 1

run_aldit 1 a run.steps=3 train.ema_decay=0.9
tap_result $? "a 3-step run with an EMA writes its checkpoint" "$(tail -5 "$WORK/a.log")"
ckpt="$WORK/a/checkpoints/step_00000003.h5"
st=diffusion_pytorch_model.safetensors

out=$("$EXPORT" "$ckpt" --format wan --out "$WORK/wan" 2>&1) &&
    out=$out$("$EXPORT" "$ckpt" --format diffusers --out "$WORK/diff" 2>&1) &&
    out=$out$("$EXPORT" "$ckpt" --format diffusers --shard-size 0.01 --out "$WORK/shards" 2>&1) &&
    out=$out$("$EXPORT" "$ckpt" --format wan --ema --out "$WORK/ema" 2>&1)
tap_result $? "aldit-export: wan, diffusers, diffusers sharded, EMA (dims from the checkpoint)" "$out"
tap_ok "the diffusers folder has config.json of WanTransformer3DModel" grep -q '"_class_name": "WanTransformer3DModel"' "$WORK/diff/config.json"
n_shards=$(ls "$WORK/shards" | grep -c '^diffusion_pytorch_model-000[0-9][0-9]-of-000[0-9][0-9]\.safetensors$')
tap_result "$([ "$n_shards" -gt 2 ] && [ -f "$WORK/shards/$st.index.json" ]; echo $?)" "--shard-size 0.01: $n_shards shards and their index" "$(ls "$WORK/shards")"
tap_is "no temporary file is left" "$(find "$WORK/wan" "$WORK/diff" "$WORK/shards" "$WORK/ema" -name '*.tmp' | wc -l | tr -d ' ')" 0

run_aldit 1 h5 run.steps=3 model.init="$ckpt"
losses "$WORK/h5/metrics.jsonl" > "$WORK/h5.loss"
tap_is "the run from the HDF5 checkpoint logs 3 losses" "$(wc -l < "$WORK/h5.loss" | tr -d " ")" 3
for kind in wan diff shards; do
    case $kind in shards) init="$WORK/shards/$st.index.json" ;; diff) init="$WORK/diff" ;; *) init="$WORK/$kind/$st" ;; esac
    run_aldit 1 "from_$kind" run.steps=3 model.init="$init"
    losses "$WORK/from_$kind/metrics.jsonl" > "$WORK/$kind.loss"
    status=1; [ -s "$WORK/h5.loss" ] && cmp -s "$WORK/h5.loss" "$WORK/$kind.loss" && status=0
    tap_result $status "[model] init = the $kind export (${init#"$WORK/"}) trains as the HDF5 checkpoint does: the same losses to the bit" \
        "$(tail -3 "$WORK/from_$kind.log")"
done
"$EXPORT" "$WORK/h5/checkpoints/step_00000003.h5" --format wan --out "$WORK/h5_out" > /dev/null 2>&1 &&
    "$EXPORT" "$WORK/from_diff/checkpoints/step_00000003.h5" --format wan --out "$WORK/diff_out" > /dev/null 2>&1
tap_ok "their trained weights, exported, are the same bytes" cmp "$WORK/h5_out/$st" "$WORK/diff_out/$st"

dims="model.dim=32 model.ffn_dim=64 model.num_heads=2 model.num_layers=2 model.in_dim=16 model.out_dim=16 model.text_len=16 model.text_dim=16 model.freq_dim=32"
# shellcheck disable=SC2086
"$EXPORT" "$WORK/shards/$st.index.json" --format wan --out "$WORK/converted" $dims > "$WORK/convert.log" 2>&1
tap_ok "sharded diffusers -> Wan with the deck's dims equals the direct Wan export" cmp "$WORK/converted/$st" "$WORK/wan/$st"

"$EXPORT" "$WORK/wan/$st" --format diffusers --out "$WORK/nodims" > "$WORK/nodims.log" 2>&1; status=$?
case "$status:$(cat "$WORK/nodims.log")" in 2:*"$WORK/wan/$st"*"give them (--deck FILE or model.KEY=VALUE)"*) found=0 ;; *) found=1 ;; esac
tap_result $found "safetensors without dims: exit 2, saying to give them" "$(cat "$WORK/nodims.log")"

ln -s "$WORK/wan" "$WORK/link"; : > "$WORK/plain"
"$EXPORT" "$ckpt" --format wan --out "$WORK/link" > "$WORK/link.log" 2>&1; s1=$?
"$EXPORT" "$ckpt" --format wan --out "$WORK/plain" > "$WORK/plain.log" 2>&1; s2=$?
case "$s1:$s2:$(cat "$WORK/link.log" "$WORK/plain.log")" in
    1:1:*"link exists and is a symbolic link"*"plain exists and is a file"*) found=0 ;; *) found=1 ;; esac
tap_result $found "--out a symbolic link or a file: refused, naming it" "$(cat "$WORK/link.log" "$WORK/plain.log")"

"$EXPORT" "$WORK/h5/checkpoints/step_00000003.h5" --format wan --ema --out "$WORK/noema" > "$WORK/noema.log" 2>&1; status=$?
case "$status:$(cat "$WORK/noema.log")" in 1:*"has no /ema weights"*) found=0 ;; *) found=1 ;; esac
tap_result $found "--ema of a checkpoint without one: refused" "$(cat "$WORK/noema.log")"
"$EXPORT" "$ckpt" --out "$WORK/x" > "$WORK/usage.log" 2>&1
tap_is "no --format: a usage error (2)" "$?" 2
# shellcheck disable=SC2086
"$EXPORT" "$ckpt" --format wan --out "$WORK/other" $(echo "$dims" | sed "s/num_layers=2/num_layers=1/") > "$WORK/other.log" 2>&1; status=$?
case "$status:$(cat "$WORK/other.log")" in 2:*"model.num_layers is 2 in the checkpoint, 1 in the deck"*) found=0 ;; *) found=1 ;; esac
tap_result $found "dims given that differ from the checkpoint's: exit 2 naming the difference" "$(cat "$WORK/other.log")"

cp "$WORK/diff/$st" "$WORK/cut.safetensors"
truncate -s -8 "$WORK/cut.safetensors"
run_aldit 1 cut run.steps=3 model.init="$WORK/cut.safetensors"; status=$?
case "$status:$(cat "$WORK/cut.log")" in 2:*"cut.safetensors: truncated: the data of tensor "*"cannot start from [model] init"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a truncated init: exit 2 naming the file and the tensor" "$(tail -3 "$WORK/cut.log")"
printf '\010\000\000\000\000\000\000\000{"a": 1 ' > "$WORK/bad.safetensors"
"$ALDIT" --check "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/check" model.init="$WORK/bad.safetensors" \
    > "$WORK/check.log" 2>&1; status=$?
case "$status:$(cat "$WORK/check.log")" in 2:*"bad.safetensors: damaged safetensors header: "*) found=0 ;; *) found=1 ;; esac
tap_result $found "aldit --check with a damaged safetensors header: exit 2 naming the file" "$(tail -3 "$WORK/check.log")"
tap_done
