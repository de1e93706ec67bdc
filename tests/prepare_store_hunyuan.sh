#!/bin/sh
# prepare_store_hunyuan.sh — tools/prepare_store.py --family hunyuanvideo15 on tiny random HunyuanVideo-1.5
# components (tests/tiny_hunyuan.py: AutoencoderKLHunyuanVideo15, Qwen2.5-VL text model, ByT5, SigLIP) and generated
# media: a store with the caption sources (docs/store.md) that aldit-store verify accepts against the deck; every
# sample's latent, Qwen rows, ByT5 rows (a caption with a quoted glyph text) and SigLIP rows (videos only) equal what
# the diffusers pipelines' own encoding functions give; a short CPU training run on it with an I2V share of 0.5.
# Skips where torch, diffusers or transformers do not import.
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs torch diffusers transformers tokenizers h5py av PIL tqdm
. "$top_srcdir/tests/train_lib.sh"
tool="$PYTHON $top_srcdir/tools/prepare_store.py"
tap_plan 8

crop=$($PYTHON "$top_srcdir/tests/tiny_hunyuan.py" models "$WORK/models" 2> "$WORK/models.log" | tail -1) &&
    $PYTHON "$top_srcdir/tests/tiny_wan.py" media "$WORK/media" >> "$WORK/models.log" 2>&1
tap_result $? "tiny HunyuanVideo-1.5 VAE, Qwen2.5-VL, ByT5, SigLIP and media are made (template prefix: $crop tokens)" \
    "$(cat "$WORK/models.log")"
# a caption with a quoted text: the pipeline hands it to ByT5
sed -i 's/^c_clip.mp4,"\(.*\)"$/c_clip.mp4,"\1, a sign says ""OPEN 24h"""/' "$WORK/media/list.csv"
cat > "$WORK/buckets.lengths" <<'SPEC'
# weight frames height width  (latent units of the 16x VAE)
1 1 2 2    # 32x32 image
1 1 2 3    # 32x48 image
1 2 2 2    # 32x32, 5 frames
1 3 2 3    # 32x48, 9 frames
SPEC
$tool --family hunyuanvideo15 --hunyuan "$WORK/models" --csv "$WORK/media/list.csv" --out "$WORK/h.h5" \
    --lengths "$WORK/buckets.lengths" --qwen-crop-start "$crop" --precision f32 > "$WORK/h.log" 2>&1
tap_result $? "prepare_store --family hunyuanvideo15 writes the store" "$(tail -5 "$WORK/h.log")"
sed -e 's/^text_len = .*/text_len = 64/' -e 's/^patch_h = .*/patch_h = 1/' -e 's/^patch_w = .*/patch_w = 1/' \
    "$top_srcdir/tests/decks/hunyuan_tiny.ini" > "$WORK/deck.ini"
out=$("$top_builddir/aldit-store" verify --deck "$WORK/deck.ini" "$WORK/h.h5" 2>&1)
case "$?:$out" in 0:*"caption sources too; fits"*) found=0 ;; *) found=1 ;; esac
tap_result $found "aldit-store verify --deck accepts it (sources, checksums, widths)" "$out"

cat > "$WORK/check.py" <<'PY'
import csv, os, sys, h5py, numpy as np, torch
sys.path.insert(0, sys.argv[2] + "/tools")
import prepare_store as ps
from diffusers import AutoencoderKLHunyuanVideo15
from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import HunyuanVideo15Pipeline as T2V
from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5_image2video import HunyuanVideo15ImageToVideoPipeline as I2V
from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLTextModel, SiglipVisionModel, T5EncoderModel
from PIL import Image
work, crop, models = sys.argv[1], int(sys.argv[3]), sys.argv[1] + "/models/"
vae = AutoencoderKLHunyuanVideo15.from_pretrained(models + "vae").eval()
qwen, tok = Qwen2_5_VLTextModel.from_pretrained(models + "text_encoder").eval(), AutoTokenizer.from_pretrained(models + "tokenizer")
byt5, tok2 = T5EncoderModel.from_pretrained(models + "text_encoder_2").eval(), AutoTokenizer.from_pretrained(models + "tokenizer_2")
siglip = SiglipVisionModel.from_pretrained(models + "image_encoder").eval()
features = AutoImageProcessor.from_pretrained(models + "feature_extractor")
rows = list(csv.DictReader(open(work + "/media/list.csv")))
buckets = ps.read_lengths(work + "/buckets.lengths")
f = h5py.File(work + "/h.h5")
index, sources = f["index"][()], f["index_sources"][()]
worst, kept = 0.0, 0
glyph_rows, image_rows = [], []
for row in rows:
    frames = ps.read_media(os.path.join(work, "media", row["path"]))
    shape = ps.choose_shape(frames.shape[0], frames.shape[1], frames.shape[2], buckets, 16, 1)
    if shape is None:
        continue
    clip = ps.fit_clip(frames, shape)
    caption = ps.clean_caption(row["caption"])
    with torch.no_grad():
        latent = (vae.encode(clip[None]).latent_dist.mode() * vae.config.scaling_factor)[0].numpy()
        text, mask = T2V._get_mllm_prompt_embeds(qwen, tok, [caption], "cpu", tokenizer_max_length=1000, crop_start=crop)
        text_2, mask_2 = T2V._get_byt5_prompt_embeds(tok2, byt5, [caption], "cpu", tokenizer_max_length=256)
        image = np.zeros((0, 10), np.float32)
        if clip.shape[1] > 1:
            first = ((clip[:, 0].permute(1, 2, 0).numpy() + 1.0) * 127.5).round().clip(0, 255).astype(np.uint8)
            image = I2V._get_image_embeds(siglip, features, Image.fromarray(first), "cpu")[0].numpy()
    text, text_2 = text[0][mask[0].bool()].numpy(), text_2[0][mask_2[0].bool()].numpy()
    c, fr, h, w, q, lo, to, _ = index[kept]
    g, go, n, io, _ = sources[kept]
    got = [f["latents"][lo:lo + latent.size], f["text"][to:to + q * 12], f["text_2"][go:go + g * 6], f["image"][io:io + n * 10]]
    for want, have in zip((latent, text, text_2, image), got):
        assert want.size == have.size, (kept, want.shape, have.shape)
        if want.size:
            worst = max(worst, float(np.abs(want.ravel() - have).max() / max(np.abs(want).max(), 1e-6)))
    glyph_rows.append(int(g)); image_rows.append(int(n))
    kept += 1
print("samples", kept, "glyph_rows", ",".join(map(str, glyph_rows)), "image_rows", ",".join(map(str, image_rows)))
print("worst", worst)
sys.exit(0 if worst <= 1e-5 and kept == len(index) else 1)
PY
out=$($PYTHON "$WORK/check.py" "$WORK" "$top_srcdir" "$crop" 2>&1); status=$?
tap_result $status "each sample's latent and Qwen, ByT5 and SigLIP rows are the pipelines' own ($(echo "$out" | grep -E '^(samples|worst)' | tr '\n' ' '))" "$out"
glyphs=$(echo "$out" | sed -n 's/^samples .* glyph_rows \([^ ]*\) image_rows \(.*\)$/\1 \2/p')
case "$glyphs" in *[1-9]*" "*) found=0 ;; *) found=1 ;; esac
images=${glyphs#* }
case "$images" in 0,0,[1-9]*,[1-9]*) ;; *) found=1 ;; esac
tap_result $found "ByT5 rows only for the quoted text, SigLIP rows for the videos alone (ByT5,SigLIP rows: $glyphs)" "$out"

# aldit-store pack reads the same work folder, the sources' parts included
out=$("$top_builddir/aldit-store" pack --precision f32 --out "$WORK/packed.h5" "$WORK/h.h5.parts" 2>&1) &&
    out="$out
$($PYTHON - "$WORK/packed.h5" "$WORK/h.h5" <<'PY' 2>&1
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
names = ("index", "latents", "text", "text_2", "image", "index_sources")
sys.exit(0 if all(np.array_equal(a[k][()], b[k][()]) for k in names) else "the datasets differ")
PY
)"
tap_result $? "aldit-store pack of the work folder writes the same store, sources included" "$out"
cp -r "$WORK/h.h5.parts" "$WORK/parts2"
rm "$WORK/parts2/00000002.image.npy"
out=$("$top_builddir/aldit-store" pack --out "$WORK/packed2.h5" "$WORK/parts2" 2>&1); status=$?
case "$status:$out" in 1:*"parts2/00000002.image.npy: cannot open"*) found=0 ;; *) found=1 ;; esac
[ -e "$WORK/packed2.h5" ] && found=1
tap_result $found "a sample's missing .image.npy: pack exits 1 naming it, no store" "$out"

$MPIEXEC -np 1 "$ALDIT" "$WORK/deck.ini" data.store="$WORK/h.h5" run.dir="$WORK/train" run.steps=4 run.threads=1 \
    balance.global_batch=2 train.i2v_share=0.5 > "$WORK/train.log" 2>&1
status=$?
losses "$WORK/train/metrics.jsonl" > "$WORK/losses" 2>/dev/null
awk 'BEGIN { bad = 0 } { if ($2 !~ /^[0-9.eE+-]+$/) bad++ } END { exit bad > 0 || NR != 4 }' "$WORK/losses"
tap_result $((status || $?)) "aldit trains 4 CPU steps on the store (hunyuanvideo15, i2v_share 0.5), finite losses" \
    "$(tail -5 "$WORK/train.log"; cat "$WORK/losses")"
tap_done
