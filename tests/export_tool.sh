#!/bin/sh
# export_tool.sh — tools/export_weights.py (issue 32): a checkpoint of a tiny model (2 CPU steps, with EMA) out as
# Wan's official safetensors (every parameter under Wan's name, bit for bit, and Wan's config.json) and as
# diffusers' folder, which WanTransformer3DModel.from_pretrained loads with every parameter equal to the
# checkpoint's (through tools/wan_names.py); the EMA by default where the file has one, --no-ema the raw weights.
# Skips where torch, diffusers, safetensors, h5py or accelerate (from_pretrained needs it) do not import.
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs torch diffusers safetensors h5py accelerate
. "$top_srcdir/tests/train_lib.sh"
tool="$PYTHON $top_srcdir/tools/export_weights.py"
tap_plan 5
"$top_builddir/aldit-store" synth --spec "$top_srcdir/tests/decks/train_tiny.lengths" --samples 8 --text-len 16 \
    --text-dim 16 --seed 3 --out "$WORK/store.h5" > /dev/null 2>&1
run_aldit 1 run run.steps=2 balance.global_batch=2 train.ema_decay=0.5
checkpoint=$(ls "$WORK"/run/checkpoints/step_*.h5 2> /dev/null | tail -1)
tap_ok "aldit writes a checkpoint with an EMA" test -n "$checkpoint"
$tool --checkpoint "$checkpoint" --wan "$WORK/wan" --diffusers "$WORK/diffusers" > "$WORK/ema.log" 2>&1 &&
    $tool --checkpoint "$checkpoint" --no-ema --wan "$WORK/wan-raw" --diffusers "$WORK/diffusers-raw" > "$WORK/raw.log" 2>&1
tap_result $? "the EMA and the raw weights are exported" "$(cat "$WORK/ema.log" "$WORK/raw.log")"

cat > "$WORK/check.py" <<'PY'
import json, sys
import h5py, numpy as np, torch
from diffusers import WanTransformer3DModel
from safetensors.numpy import load_file
sys.path.insert(0, sys.argv[2] + "/tools")
import wan_names
work, checkpoint = sys.argv[1], sys.argv[3]
with h5py.File(checkpoint) as f:
    raw = {k: v[()] for k, v in f.items() if isinstance(v, h5py.Dataset)}
    ema = {k: v[()] for k, v in f["ema"].items()}
for name, want in (("", ema), ("-raw", raw)):
    state = load_file(f"{work}/wan{name}/diffusion_pytorch_model.safetensors")
    same = sorted(state) == sorted(want) and all(np.array_equal(state[k], want[k]) for k in state)
    config = json.load(open(f"{work}/wan{name}/config.json"))
    model = WanTransformer3DModel.from_pretrained(f"{work}/diffusers{name}")
    loaded = {wan_names.diffusers_to_wan(k): v.detach().numpy() for k, v in model.state_dict().items()}
    equal = sorted(loaded) == sorted(want) and all(np.array_equal(loaded[k], want[k]) for k in loaded)
    print(f"wan{name}", "same" if same else "differ", config["dim"], f"diffusers{name}", "same" if equal else "differ")
PY
out=$($PYTHON "$WORK/check.py" "$WORK" "$top_srcdir" "$checkpoint" 2>&1)
tap_is "Wan's format holds the EMA bit for bit; from_pretrained loads the diffusers folder with it" \
    "$(printf '%s\n' "$out" | grep '^wan ')" "wan same 32 diffusers same"
tap_is "--no-ema: the raw weights, in both" "$(printf '%s\n' "$out" | grep '^wan-raw ')" \
    "wan-raw same 32 diffusers-raw same"
$tool --checkpoint "$checkpoint" > "$WORK/none.log" 2>&1
tap_is "no --wan and no --diffusers: a usage error (2)" "$?" 2
tap_done
