#!/bin/sh
# sample_hunyuan.sh — tools/sample.py on an aldit checkpoint of a tiny model.family = hunyuanvideo15 model (2 CPU
# training steps on a store that tools/prepare_store.py made with tiny random HunyuanVideo-1.5 encoders,
# tests/tiny_hunyuan.py) through diffusers' HunyuanVideo15Pipeline and, with --image, its image-to-video pipeline: mp4s
# of the asked frames and sizes, the transformer holding the checkpoint's weights (--save-diffusers, every tensor
# equal), the same seed giving the same frames and another weight other frames. Skips where torch, diffusers or
# transformers do not import.
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs torch diffusers transformers tokenizers h5py av PIL tqdm
. "$top_srcdir/tests/train_lib.sh"
tap_plan 6

crop=$($PYTHON "$top_srcdir/tests/tiny_hunyuan.py" models "$WORK/models" 2> "$WORK/models.log" | tail -1) &&
    $PYTHON "$top_srcdir/tests/tiny_wan.py" media "$WORK/media" >> "$WORK/models.log" 2>&1 &&
    printf '1 1 2 2\n1 2 2 2\n1 3 2 3\n' > "$WORK/buckets.lengths" &&
    $PYTHON "$top_srcdir/tools/prepare_store.py" --family hunyuanvideo15 --hunyuan "$WORK/models" --media "$WORK/media" \
        --out "$WORK/h.h5" --lengths "$WORK/buckets.lengths" --qwen-crop-start "$crop" >> "$WORK/models.log" 2>&1
tap_result $? "tiny HunyuanVideo-1.5 encoders make a store" "$(tail -5 "$WORK/models.log")"
# diffusers' model needs freq_dim 256; patch 1 as HunyuanVideo-1.5's
sed -e 's/^text_len = .*/text_len = 64/' -e 's/^patch_h = .*/patch_h = 1/' -e 's/^patch_w = .*/patch_w = 1/' \
    -e 's/^freq_dim = .*/freq_dim = 256/' "$top_srcdir/tests/decks/hunyuan_tiny.ini" > "$WORK/deck.ini"
$MPIEXEC -np 1 "$ALDIT" "$WORK/deck.ini" data.store="$WORK/h.h5" run.dir="$WORK/run" run.steps=2 run.threads=1 \
    balance.global_batch=2 > "$WORK/train.log" 2>&1
checkpoint=$(ls "$WORK"/run/checkpoints/step_*.h5 2> /dev/null | tail -1)
tap_ok "aldit writes a checkpoint of the tiny hunyuanvideo15 model" test -n "$checkpoint"

sample() {
    weights=$1; shift
    $PYTHON "$top_srcdir/tools/sample.py" --checkpoint "$weights" --hunyuan "$WORK/models" --qwen-crop-start "$crop" \
        --prompt 'a red ball, a sign says "OPEN"' --negative-prompt "blue" --frames 5 --steps 2 --guidance 4 --seed 1 \
        --device cpu "$@"
}
out=$(sample "$checkpoint" --height 32 --width 48 --out "$WORK/a" --save-diffusers "$WORK/diffusers" 2>&1) &&
    out="$out
$(sample "$checkpoint" --height 32 --width 48 --out "$WORK/again" 2>&1)" &&
    out="$out
$(sample "$checkpoint" --image "$WORK/media/b_wide.png" --target-size 32 --out "$WORK/i2v" 2>&1)"
tap_result $? "text-to-video twice and image-to-video (--image): sample.py exits 0" "$out"
$PYTHON - "$checkpoint" "$WORK/models/vae" "$WORK/perturbed.h5" <<'PY'
import shutil, sys, h5py
shutil.copy(sys.argv[1], sys.argv[3])
with h5py.File(sys.argv[3], "r+") as f:
    f["proj_out.weight"][...] = f["proj_out.weight"][()] + 0.5
PY
out=$(sample "$WORK/perturbed.h5" --height 32 --width 48 --out "$WORK/perturbed" 2>&1)
tap_result $? "the same with proj_out.weight moved by 0.5" "$out"

cat > "$WORK/check.py" <<'PY'
import sys, av, h5py, numpy as np, torch
from diffusers import HunyuanVideo15Transformer3DModel
work, checkpoint = sys.argv[1], sys.argv[2]
def frames(name):
    with av.open(f"{work}/{name}.mp4") as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
a, again, i2v, other = frames("a"), frames("again"), frames("i2v"), frames("perturbed")
print("t2v", "x".join(map(str, a.shape)), "i2v", "x".join(map(str, i2v.shape)))
print("same_seed", "equal" if np.array_equal(a, again) else "differ")
print("perturbed", "differ" if not np.array_equal(a, other) else "equal")
model = HunyuanVideo15Transformer3DModel.from_pretrained(work + "/diffusers")
state = model.state_dict()
with h5py.File(checkpoint) as f:
    names = [n for n in f if isinstance(f[n], h5py.Dataset)]
    bad = [n for n in names if n in state and not np.array_equal(f[n][()].astype(np.float32), state[n].numpy())]
    missing = [n for n in state if n not in names]
print("weights", len(state), "bad", len(bad), "missing", len(missing), bad[:3], missing[:3])
PY
out=$($PYTHON "$WORK/check.py" "$WORK" "$checkpoint" 2>&1)
ok=0
echo "$out" | grep -q "^t2v 5x32x48x3 i2v 5x32x32x3$" || ok=1
echo "$out" | grep -q "^same_seed equal$" || ok=1
echo "$out" | grep -q "^perturbed differ$" || ok=1
tap_result $ok "5-frame mp4s of 48x32 (text-to-video) and 32x32 (the crop bucket of base size 32 nearest the 50x30 image); the same seed the same frames, another weight other frames" "$out"
case "$out" in *"bad 0 missing 0 "*) found=0 ;; *) found=1 ;; esac
tap_result $found "the pipeline's transformer holds every tensor of the checkpoint (--save-diffusers)" "$out"
tap_done
