#!/bin/sh
# prepare_store.sh — tools/prepare_store.py on tiny random Wan components (tests/tiny_wan.py: AutoencoderKLWan,
# UMT5EncoderModel, a word-level tokenizer) and generated media (images, an mp4, frame folders): bucket shapes,
# caption lengths, latents and text as the encoders give them, aldit-store verify, resuming after a stop (a
# rerun with nothing left loads no encoders), damaged work-folder parts named and encoded again (or refused when
# packed), --out that is not a regular file refused, the CSV input, and a short CPU training run on the store. Skips where torch, diffusers or transformers do
# not import.
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs torch diffusers transformers tokenizers h5py av PIL tqdm
. "$top_srcdir/tests/train_lib.sh"
tool="$PYTHON $top_srcdir/tools/prepare_store.py"
tiny="$PYTHON $top_srcdir/tests/tiny_wan.py"
tap_plan 21

$tiny models "$WORK/models" > "$WORK/models.log" 2>&1 && $tiny media "$WORK/media" >> "$WORK/models.log" 2>&1
tap_result $? "tiny Wan VAE, umT5 encoder, tokenizer and media are made" "$(cat "$WORK/models.log")"
cat > "$WORK/buckets.lengths" <<'SPEC'
# weight frames height width  (latent units)
1 1 4 4    # 32x32 image
1 1 4 6    # 32x48 image
1 2 4 4    # 32x32, 5 frames
1 3 4 6    # 32x48, 9 frames
SPEC
models="--vae $WORK/models/vae --text-encoder $WORK/models/text_encoder --tokenizer $WORK/models/tokenizer"
# shellcheck disable=SC2086
$tool --media "$WORK/media" --out "$WORK/a.h5" --lengths "$WORK/buckets.lengths" --text-len 16 --precision f32 \
    $models --max-samples 2 > "$WORK/a1.log" 2>&1; status=$?
case "$status:$(cat "$WORK/a1.log")" in 0:*"stopped after 2 new samples"*) found=0 ;; *) found=1 ;; esac
tap_result $found "--max-samples 2 stops after two samples" "$(cat "$WORK/a1.log")"
tap_ok "no store is written before every sample is done" test ! -e "$WORK/a.h5"
# shellcheck disable=SC2086
$tool --media "$WORK/media" --out "$WORK/a.h5" --lengths "$WORK/buckets.lengths" --text-len 16 --precision f32 \
    $models > "$WORK/a2.log" 2>&1
tap_result $? "the rerun finishes the store" "$(cat "$WORK/a2.log")"
tap_is "the rerun encodes only the rest" "$(grep -c '5 inputs, 2 already done, 3 to encode' "$WORK/a2.log")" 1
tap_is "the 3-frame clip is left out (no bucket)" "$(grep -c 'no bucket fits .*e_short' "$WORK/a2.log")" 1
out=$("$top_builddir/aldit-store" verify "$WORK/a.h5" 2>&1)
tap_result $? "aldit-store verify accepts the store" "$out"
# shellcheck disable=SC2086
$tool --media "$WORK/media" --out "$WORK/a.h5" --lengths "$WORK/buckets.lengths" --text-len 16 --precision f32 \
    $models > "$WORK/a3.log" 2>&1; status=$?
case "$status:$(cat "$WORK/a3.log")" in *"models loaded"*) found=1 ;; 0:*"0 to encode"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a third run with nothing to encode loads no encoders" "$(cat "$WORK/a3.log")"

cat > "$WORK/check.py" <<'PY'
import sys, h5py, numpy as np, torch
sys.path.insert(0, sys.argv[2] + "/tools")
import prepare_store as ps
from diffusers import AutoencoderKLWan
from transformers import AutoTokenizer, UMT5EncoderModel
from PIL import Image
work = sys.argv[1]
with h5py.File(work + "/a.h5") as f:
    index, latents, text = f["index"][()], f["latents"][()], f["text"][()]
    print("shapes", " ".join("x".join(str(v) for v in row[:4]) for row in index))
    print("text_len", " ".join(str(row[4]) for row in index))
    # sample 0 (a_square.png) again with the encoders directly: resized/cropped clip -> VAE mean, normalised
    vae = AutoencoderKLWan.from_pretrained(work + "/models/vae")
    clip = ps.fit_clip(np.asarray(Image.open(work + "/media/a_square.png").convert("RGB"))[None], (1, 32, 32))
    with torch.no_grad():
        z = vae.encode(clip[None]).latent_dist.mean
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    want = ((z - mean) / std)[0].numpy().ravel()
    got = latents[index[0, 5]:index[0, 5] + want.size]
    print("latent0", "ok" if np.allclose(got, want, rtol=1e-5, atol=1e-6) else f"differs by {np.abs(got - want).max()}")
    tok = AutoTokenizer.from_pretrained(work + "/models/tokenizer")
    enc = UMT5EncoderModel.from_pretrained(work + "/models/text_encoder")
    ids = tok(["a red ball on the grass"], return_tensors="pt")
    with torch.no_grad():
        want = enc(ids.input_ids, ids.attention_mask).last_hidden_state[0].numpy().ravel()
    got = text[index[0, 6]:index[0, 6] + want.size]
    print("text0", "ok" if np.allclose(got, want, rtol=1e-5, atol=1e-6) else f"differs by {np.abs(got - want).max()}")
PY
out=$($PYTHON "$WORK/check.py" "$WORK" "$top_srcdir" 2>&1)
tap_is "each clip gets its nearest bucket" "$(printf '%s\n' "$out" | sed -n 's/^shapes //p')" \
    "16x1x4x4 16x1x4x6 16x3x4x6 16x2x4x4"
tap_is "text lengths are the captions' tokens + EOS, whitespace cleaned" \
    "$(printf '%s\n' "$out" | sed -n 's/^text_len //p')" "7 6 10 5"
tap_is "latent and text of sample 0 are the encoders' own" \
    "$(printf '%s\n' "$out" | grep -c '^latent0 ok$\|^text0 ok$')" 2

# the work folder's parts are checked against the shape, dtype and CRC-32 their .json recorded: a flipped bit,
# another shape and a truncated part are each named and encoded again, and the store comes out as before
parts="$WORK/a.h5.parts"
cp "$WORK/a.h5" "$WORK/a.first.h5"
$PYTHON - "$parts" <<'PY'
import sys, numpy as np
parts = sys.argv[1]
with open(parts + "/00000000.npy", "r+b") as f:   # one bit of the last value
    f.seek(-1, 2); byte = f.read(1); f.seek(-1, 2); f.write(bytes([byte[0] ^ 0x10]))
np.save(parts + "/00000001.text.npy", np.zeros((3, 24), np.float32))
with open(parts + "/00000003.npy", "r+b") as f:
    f.truncate(200)
PY
# shellcheck disable=SC2086
$tool --media "$WORK/media" --out "$WORK/a.h5" --lengths "$WORK/buckets.lengths" --text-len 16 --precision f32 \
    $models > "$WORK/a3.log" 2>&1; status=$?
log=$(cat "$WORK/a3.log")
case "$status:$log" in
    0:*"00000000.npy: its values fail the CRC-32"*"00000001.text.npy: float32 [3, 24], but float32 [6, 24]"*"00000003.npy: cannot be read as .npy"*"1 already done, 4 to encode"*) found=0 ;;
    *) found=1 ;;
esac
tap_result $found "a flipped bit, another shape and a truncated part are each named and encoded again" "$status: $log"
cmp "$WORK/a.h5" "$WORK/a.first.h5" > /dev/null 2>&1 || $PYTHON - "$WORK/a.h5" "$WORK/a.first.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as a, h5py.File(sys.argv[2]) as b:
    same = all(np.array_equal(a[k][()], b[k][()]) for k in ("index", "latents", "text"))
sys.exit(0 if same else 1)
PY
tap_result $? "the store made from the re-encoded parts holds what it held before"
# a part damaged after the check (when the store is packed): refused naming it, its .json removed, no OUT.tmp
$PYTHON - "$top_srcdir" "$parts" "$WORK/packed.h5" > "$WORK/pack.log" 2>&1 <<'PY'
import argparse, sys
sys.path.insert(0, sys.argv[1] + "/tools")
import prepare_store as ps
with open(sys.argv[2] + "/00000002.text.npy", "r+b") as f:
    f.seek(-3, 2); f.write(b"\x00\x01\x02")
ps.pack(argparse.Namespace(work=sys.argv[2], out=sys.argv[3], precision="f32"), [0, 1, 2, 3])
PY
status=$?; log=$(cat "$WORK/pack.log")
case "$status:$log" in 1:*"00000002.text.npy: its values fail the CRC-32"*"run the same command again"*) found=0 ;; *) found=1 ;; esac
[ -e "$WORK/packed.h5" ] || [ -e "$WORK/packed.h5.tmp" ] || [ -e "$parts/00000002.json" ] && found=1
tap_result $found "a part damaged before packing: exit 1 naming it, its .json removed, no store or .tmp left" "$status: $log"

# --out (or OUT.tmp) that is not a regular file is refused before any work, left as it was, no OUT.tmp
# out NAME: the finished work folder packed to $WORK/NAME (log $WORK/out.log)
out() {
    # shellcheck disable=SC2086
    $tool --media "$WORK/media" --out "$WORK/$1" --work "$parts" --lengths "$WORK/buckets.lengths" --text-len 16 \
        --precision f32 $models > "$WORK/out.log" 2>&1
}
printf 'keep me\n' > "$WORK/target"
ln -s "$WORK/target" "$WORK/link.h5"
out link.h5; status=$?
case "$status:$(cat "$WORK/out.log")" in 2:*"link.h5 exists and is a symbolic link"*) found=0 ;; *) found=1 ;; esac
[ -L "$WORK/link.h5" ] && [ "$(cat "$WORK/target")" = "keep me" ] && [ ! -e "$WORK/link.h5.tmp" ] || found=1
tap_result $found "a symbolic link as --out: exit 2 saying so, the link and its target untouched" "$status: $(cat "$WORK/out.log")"
mkfifo "$WORK/pipe.h5"
out pipe.h5; status=$?
case "$status:$(cat "$WORK/out.log")" in 2:*"pipe.h5 exists and is a named pipe"*) found=0 ;; *) found=1 ;; esac
[ -p "$WORK/pipe.h5" ] || found=1
tap_result $found "a named pipe as --out: exit 2 saying so, the pipe kept" "$status: $(cat "$WORK/out.log")"
mkdir "$WORK/folder.h5"
out folder.h5; status=$?
case "$status:$(cat "$WORK/out.log")" in 2:*"folder.h5 exists and is a directory"*) found=0 ;; *) found=1 ;; esac
case "$(cat "$WORK/out.log")" in *Traceback*) found=1 ;; esac
[ -e "$WORK/folder.h5.tmp" ] && found=1
tap_result $found "a directory as --out: exit 2 saying so, no traceback, no folder.h5.tmp left" "$status: $(cat "$WORK/out.log")"
$PYTHON - "$top_srcdir" "$parts" "$WORK/absent/x.h5" > "$WORK/absent.log" 2>&1 <<'PY'
import argparse, sys
sys.path.insert(0, sys.argv[1] + "/tools")
import prepare_store as ps
ps.pack(argparse.Namespace(work=sys.argv[2], out=sys.argv[3], precision="f32"), [0])
PY
status=$?
case "$status:$(cat "$WORK/absent.log")" in 1:*"absent/x.h5: cannot write the store: No such file or directory"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a store that cannot be created: exit 1 with errno's text" "$status: $(cat "$WORK/absent.log")"

# the CSV input: the same samples in the CSV's row order
# shellcheck disable=SC2086
$tool --csv "$WORK/media/list.csv" --out "$WORK/b.h5" --lengths "$WORK/buckets.lengths" --text-len 16 $models \
    > "$WORK/b.log" 2>&1 && "$top_builddir/aldit-store" info "$WORK/b.h5" > "$WORK/b.info" 2>&1
tap_result $? "a CSV of path,caption gives a bf16 store" "$(cat "$WORK/b.log" "$WORK/b.info")"
tap_is "aldit-store info counts 4 samples, 2 of them videos" \
    "$(grep -c 'samples *4 (2 images, 2 videos)' "$WORK/b.info")" 1

$MPIEXEC -np 1 "$ALDIT" "$TRAIN_DECK" data.store="$WORK/b.h5" run.dir="$WORK/train" run.steps=4 \
    model.text_dim=24 balance.global_batch=2 > "$WORK/train.log" 2>&1
status=$?
losses "$WORK/train/metrics.jsonl" > "$WORK/losses" 2>/dev/null
awk 'BEGIN { bad = 0 } { if ($2 !~ /^[0-9.eE+-]+$/) bad++ } END { exit bad > 0 || NR != 4 }' "$WORK/losses"
tap_result $((status || $?)) "aldit trains 4 CPU steps on the store (text_dim 24), finite losses" \
    "$(tail -5 "$WORK/train.log"; cat "$WORK/losses")"
tap_done
