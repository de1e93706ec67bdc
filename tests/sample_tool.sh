#!/bin/sh
# sample_tool.sh — tools/sample.py on a real aldit checkpoint of a tiny model (2 CPU training steps) with tiny
# random Wan VAE and umT5 (tests/tiny_wan.py): an mp4 of the asked frame count and size and a PNG grid, the
# /ema weights preferred when present (--no-ema: the raw ones; --ema: those, exported as such, and an error where
# there are none), --out's folder made when missing, Wan's official safetensors + config.json, and the Wan-name
# mapping loading every parameter (strict); a prompt file sampled by [checkpoint] hook after each checkpoint of a run;
# refused with exit 2 naming the file and tensor, without a traceback or a video: a NaN or Inf weight, a checkpoint
# without its completion mark, a non-HDF5, truncated or damaged file. Skips where torch, diffusers or transformers do
# not import.
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs torch diffusers transformers tokenizers h5py av PIL safetensors
. "$top_srcdir/tests/train_lib.sh"
tiny="$PYTHON $top_srcdir/tests/tiny_wan.py"
tap_plan 22

$tiny models "$WORK/models" > "$WORK/models.log" 2>&1
tap_result $? "tiny Wan VAE, umT5 encoder and tokenizer are made" "$(cat "$WORK/models.log")"
"$top_builddir/aldit-store" synth --spec "$top_srcdir/tests/decks/train_tiny.lengths" --samples 8 --text-len 16 \
    --text-dim 24 --seed 3 --out "$WORK/store.h5" > /dev/null 2>&1
$MPIEXEC -np 1 "$ALDIT" "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/run" run.steps=2 \
    model.text_dim=24 balance.global_batch=2 > "$WORK/train.log" 2>&1
checkpoint=$(ls "$WORK"/run/checkpoints/step_*.h5 2> /dev/null | tail -1)
tap_ok "aldit writes a checkpoint of the tiny model" test -n "$checkpoint"

sample() {
    weights=$1; shift
    $PYTHON "$top_srcdir/tools/sample.py" --checkpoint "$weights" --wan "$WORK/models" --prompt "a red ball on the grass" \
        --negative-prompt "blue" --height 32 --width 48 --frames 9 --steps 3 --guidance 4 --seed 1 --device cpu "$@"
}
out=$(sample "$checkpoint" --out "$WORK/a" --save-wan "$WORK/wan" 2>&1)
tap_result $? "sample.py exits 0" "$out"
case $out in *"text padding wan"*) found=0 ;; *) found=1 ;; esac
tap_result $found "the checkpoint deck's text_padding (wan, the default) is used" "$out"

cat > "$WORK/check.py" <<'PY'
import sys, av, h5py, json, numpy as np
from PIL import Image
from safetensors.numpy import load_file
work, checkpoint = sys.argv[1], sys.argv[2]
with av.open(work + "/a.mp4") as c:
    frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
print("mp4", len(frames), "x".join(str(v) for v in frames[0].shape))
print("png", "x".join(str(v) for v in Image.open(work + "/a.png").size))
state = load_file(work + "/wan/diffusion_pytorch_model.safetensors")
with h5py.File(checkpoint) as f:
    same = all(np.array_equal(state[k], f[k][()]) for k in state) and len(state) == len(f["optim/m"])
config = json.load(open(work + "/wan/config.json"))
print("wan", len(state), "same" if same else "differ", config["dim"], config["num_layers"], config["text_dim"])
PY
out=$($PYTHON "$WORK/check.py" "$WORK" "$checkpoint" 2>&1)
tap_is "the mp4 holds 9 frames of 48x32" "$(printf '%s\n' "$out" | sed -n 's/^mp4 //p')" "9 32x48x3"
tap_is "the PNG grid shows the 9 frames in 4 columns (192x96)" "$(printf '%s\n' "$out" | sed -n 's/^png //p')" "192x96"
tap_is "Wan's format holds every parameter, as trained, with Wan's config" \
    "$(printf '%s\n' "$out" | sed -n 's/^wan [0-9]* //p')" "same 32 2 24"

# an /ema group is preferred: zero EMA weights give another video than the trained weights
cp "$checkpoint" "$WORK/ema.h5"
$PYTHON -c "
import h5py, sys
with h5py.File(sys.argv[1], 'a') as f:
    for name in [n for n, d in f.items() if isinstance(d, h5py.Dataset)]:
        f['ema/' + name] = f[name][()] * 0.5
" "$WORK/ema.h5"
out=$(sample "$WORK/ema.h5" --out "$WORK/e" 2>&1)
case $out in *"ema.h5:/ema"*) found=0 ;; *) found=1 ;; esac
tap_result $found "with /ema present its weights are used" "$out"
cmp -s "$WORK/a.png" "$WORK/e.png"; tap_is "the EMA weights give another sample" "$?" 1
out=$(sample "$WORK/ema.h5" --out "$WORK/samples/n" --no-ema 2>&1)
tap_ok "--no-ema uses the raw weights: the same sample as the checkpoint's (--out in a folder it makes)" \
    cmp "$WORK/a.png" "$WORK/samples/n.png"
out=$(sample "$WORK/ema.h5" --out "$WORK/m" --ema --save-wan "$WORK/wan-ema" 2>&1)
tap_ok "--ema uses the /ema weights: the same sample as the default's with /ema present" cmp "$WORK/e.png" "$WORK/m.png"
out=$($PYTHON -c "
import h5py, sys
from safetensors.numpy import load_file
state = load_file(sys.argv[2] + '/diffusion_pytorch_model.safetensors')
with h5py.File(sys.argv[1]) as f:
    print('ema' if all((state[k] == f['ema/' + k][()]).all() for k in state) and len(state) == len(f['ema']) else 'not ema')
" "$WORK/ema.h5" "$WORK/wan-ema" 2>&1)
tap_is "--ema --save-wan exports the /ema weights in Wan's format" "$out" "ema"
out=$(sample "$checkpoint" --out "$WORK/none" --ema 2>&1); status=$?
case $status:$out in 2:*"--ema, but the file has no /ema group"*) found=0 ;; *) found=1 ;; esac
tap_result $found "--ema on a checkpoint without /ema is a usage error (2) saying so" "$status: $out"
sample "$checkpoint" --out "$WORK/bad" --frames 8 > "$WORK/bad.log" 2>&1
tap_is "8 frames (not 4k+1) is a usage error (2)" "$?" 2

# refused, exit 2, naming the file (and the tensor), no traceback and no video:
# damage KIND FILE: a copy of the checkpoint made bad as KIND says
damage() {
    $PYTHON - "$1" "$checkpoint" "$2" <<'PY'
import shutil, sys, h5py, numpy as np
kind, checkpoint, path = sys.argv[1:]
name = "blocks.0.ffn.0.weight"
if kind == "text":
    open(path, "w").write("not a checkpoint\n" * 64)
    sys.exit(0)
shutil.copy(checkpoint, path)
if kind == "truncated":
    with open(path, "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    sys.exit(0)
with h5py.File(path, "r+") as f:
    if kind == "nan":
        values = f[name][()]; values[1, 2] = np.nan; f[name][...] = values
    elif kind == "ema-inf":
        for key in [k for k, d in f.items() if isinstance(d, h5py.Dataset)]:
            f["ema/" + key] = f[key][()]
        values = f["ema/" + name][()]; values[0, 0] = np.inf; f["ema/" + name][...] = values
    elif kind == "incomplete":
        del f.attrs["complete"]
    elif kind == "flipped":
        offset = f[name].id.get_chunk_info(0).byte_offset
if kind == "flipped":   # a byte inside the tensor's stored values: its Fletcher-32 checksum fails
    with open(path, "r+b") as f:
        f.seek(offset + 10); byte = f.read(1); f.seek(offset + 10); f.write(bytes([byte[0] ^ 0xFF]))
PY
}
refused() {
    description=$1; kind=$2; expected=$3
    damage "$kind" "$WORK/$kind.h5"
    out=$(sample "$WORK/$kind.h5" --out "$WORK/$kind" 2>&1); status=$?
    case "$status:$out" in 2:*"$expected"*) found=0 ;; *) found=1 ;; esac
    case $out in *Traceback*) found=1 ;; esac
    [ -e "$WORK/$kind.mp4" ] && found=1
    tap_result $found "$description" "exit $status: $out"
}
refused "a NaN in a weight: exit 2 naming the tensor and element, no video" nan \
    "nan.h5: tensor blocks.0.ffn.0.weight element 34 is nan"
refused "an Inf in an /ema weight: exit 2 naming the tensor in /ema" ema-inf \
    "ema-inf.h5:/ema: tensor blocks.0.ffn.0.weight element 0 is inf"
refused "a checkpoint without its completion mark: exit 2 saying so" incomplete \
    "incomplete.h5: incomplete checkpoint (no completion mark"
refused "a file that is not HDF5: exit 2 naming it, no traceback" text "text.h5: cannot open as HDF5"
refused "a truncated checkpoint: exit 2 naming it, no traceback" truncated "truncated.h5: cannot open as HDF5"
refused "a flipped byte in a tensor: exit 2 naming the tensor (its checksum fails)" flipped \
    "flipped.h5: tensor blocks.0.ffn.0.weight cannot be read"
# samples during training: [checkpoint] hook runs sample.py on each checkpoint with a prompt file
cat > "$WORK/prompts.txt" <<'PROMPTS'
a red ball on the grass | height=32 width=48 frames=9 steps=2 seed=1
# a comment, then an image
a blue cat | height=16 width=32 frames=1 steps=2 seed=2
PROMPTS
# the interpreter by its path: the hook sees rank 0's environment, which mpirun may set up otherwise (a PATH in
# which python3 is another, as with pyenv's shims under make check)
interpreter=$($PYTHON -c 'import sys; print(sys.executable)')
$MPIEXEC -np 1 "$ALDIT" "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/hooked" run.steps=2 \
    model.text_dim=24 balance.global_batch=2 checkpoint.hook="$interpreter $top_srcdir/tools/sample.py --checkpoint \"\$ALDIT_CHECKPOINT\" --wan $WORK/models --prompts $WORK/prompts.txt --device cpu --out \"\$ALDIT_RUN_DIR/samples/step_\$ALDIT_STEP\"" \
    > "$WORK/hooked.log" 2>&1
status=$?
wait_for 200 test -s "$WORK/hooked/samples/step_2/02.png"   # the hook runs detached: the run did not wait
out=$($PYTHON -c "
import sys, av
from PIL import Image
for name in ('01', '02'):
    with av.open(sys.argv[1] + '/' + name + '.mp4') as c:
        frames = [f.to_ndarray(format='rgb24') for f in c.decode(video=0)]
    print(name, len(frames), 'x'.join(str(v) for v in frames[0].shape[:2]), 'x'.join(str(v) for v in Image.open(sys.argv[1] + '/' + name + '.png').size))
" "$WORK/hooked/samples/step_2" 2>&1)
want="01 9 32x48 192x96
02 1 16x32 32x16"
[ "$out" = "$want" ]
tap_result $? "the checkpoint hook samples each prompt of the file into the run folder (exit $status)" \
    "got '$out', want '$want'; $(cat "$WORK/hooked.log" "$WORK/hooked/hooks.log" 2>&1 | tail -30)"
printf 'a dog | height=32 size=4\n' > "$WORK/bad_prompts.txt"
out=$($PYTHON "$top_srcdir/tools/sample.py" --checkpoint "$checkpoint" --wan "$WORK/models" --out "$WORK/badp" \
      --prompts "$WORK/bad_prompts.txt" 2>&1); status=$?
case $status:$out in 2:*"bad_prompts.txt:1: 'size=4' is not one of"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a bad line in the prompt file is a usage error naming FILE:LINE" "$status: $out"
tap_done
