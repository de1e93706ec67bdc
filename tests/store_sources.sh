#!/bin/sh
# store_sources.sh — the caption sources of model.family = hunyuanvideo15 in the store (/text_2, /image,
# /index_sources; docs/store.md): synth writes them, info and verify read them, verify --deck checks their widths
# against the deck, damaged or incomplete sources are refused naming the sample and the dataset, a Wan store
# (no sources) is unchanged; with h5py, the checksums recomputed in Python and a store written by h5py.
. "$top_srcdir/tests/tap.sh"
tool=./aldit-store
top_builddir=${top_builddir:-.}
work=$(mktemp -d "$PWD/store_sources.tmp.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
spec="$top_srcdir/tests/decks/train_tiny.lengths"
deck="$top_srcdir/tests/decks/hunyuan_tiny.ini"
have_h5py=0
python3 -c "import h5py, numpy" 2>/dev/null && have_h5py=1

tap_plan 14
out=$($tool synth --spec "$spec" --samples 24 --text-len 8 --text-dim 12 --channels 4 --seed 3 --text-2-dim 6 \
      --image-dim 10 --text-2-len 5 --image-len 3 --out "$work/s.h5" 2>&1)
tap_result $? "synth --text-2-dim --image-dim writes a store with caption sources" "$out"
out=$($tool verify "$work/s.h5" 2>&1); status=$?
case "$status:$out" in 0:*"caption sources too"*) found=0 ;; *) found=1 ;; esac
tap_result $found "verify reads every sample's sources and checks their checksums" "$out"
out=$($tool info "$work/s.h5" 2>&1)
case "$out" in *"sources      text_2 (ByT5) bf16, 6 wide"*"image (SigLIP) bf16, 10 wide"*) found=0 ;; *) found=1 ;; esac
tap_result $found "info describes the sources" "$out"
out=$($tool verify --deck "$deck" "$work/s.h5" 2>&1)
tap_result $? "verify --deck: the sources' widths fit the deck's text_2_dim and image_dim" "$out"
sed 's/^text_2_dim = 6/text_2_dim = 7/' "$deck" > "$work/wide.ini"
out=$($tool verify --deck "$work/wide.ini" "$work/s.h5" 2>&1); status=$?
case "$status:$out" in 1:*"ByT5 rows (/text_2) are 6 wide, [model] text_2_dim = 7"*) found=0 ;; *) found=1 ;; esac
tap_result $found "verify --deck: another text_2_dim is exit 1 naming both widths" "$out"

# a sample with image rows (a video): its /image value flipped, then its /text_2 value
cp "$work/s.h5" "$work/image.h5"
video=
for candidate in 0 1 2 3 4 5 6 7 8 9 10 11; do
    if "$top_builddir/tests/store_damage" "$work/image.h5" "$candidate" /image 2>/dev/null; then video=$candidate; break; fi
done
out=$($tool verify "$work/image.h5" 2>&1); status=$?
case "$status:$out" in 1:*"sample $video: /index_sources checksum mismatch"*"FAILED: 1 of 24"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a flipped bit in a sample's /image: exit 1 naming the sample" "$out"
cp "$work/s.h5" "$work/text2.h5"
for candidate in 0 1 2 3 4 5 6 7 8 9 10 11; do
    "$top_builddir/tests/store_damage" "$work/text2.h5" "$candidate" /text_2 2>/dev/null && { byt5=$candidate; break; }
done
out=$($tool verify "$work/text2.h5" 2>&1); status=$?
case "$status:$out" in 1:*"sample $byt5: /index_sources checksum mismatch"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a flipped bit in a sample's /text_2: exit 1 naming the sample" "$out"
size=$(wc -c < "$work/s.h5")
head -c $((size / 2)) "$work/s.h5" > "$work/truncated.h5"
out=$($tool verify "$work/truncated.h5" 2>&1); status=$?
case "$status:$out" in 1:*"FAILED"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a truncated store with sources: exit 1" "$out"

# a Wan store (no sources) is as before
out=$($tool synth --spec "$spec" --samples 8 --text-len 8 --text-dim 12 --channels 4 --out "$work/wan.h5" 2>&1) &&
    out=$($tool verify "$work/wan.h5" 2>&1) && ! $tool info "$work/wan.h5" | grep -q '^sources '
tap_result $? "a store without sources: verify and info as before" "$out"
out=$($tool synth --spec "$spec" --samples 8 --text-2-dim 6 --out "$work/half.h5" 2>&1); status=$?
case "$status:$out" in 2:*"need both --text-2-dim and --image-dim"*) found=0 ;; *) found=1 ;; esac
tap_result $found "synth with one source width only: exit 2" "$out"

if [ "$have_h5py" = 0 ]; then
    for n in 11 12 13 14; do echo "ok $n - # SKIP h5py does not import"; done
    exit 0
fi
out=$(python3 - "$work/s.h5" <<'EOF' 2>&1
import sys, zlib, h5py
f = h5py.File(sys.argv[1], "r")
t2, im, rows = f["text_2"][:], f["image"][:], f["index_sources"][:]
w2, wi = int(f.attrs["text_2_dim"]), int(f.attrs["image_dim"])
columns = f["index_sources"].attrs["columns"]
assert (columns.decode() if isinstance(columns, bytes) else columns) == "text_2_len,text_2_offset,image_len,image_offset,checksum"
for i, (g, go, n, io, crc) in enumerate(rows):
    got = zlib.crc32(im[io:io + n * wi].tobytes(), zlib.crc32(t2[go:go + g * w2].tobytes()))
    assert got == crc, (i, got, crc)
    frames = f["index"][i, 1]
    assert (n > 0) == (frames > 1), (i, n, frames)
print(len(rows), "rows checked")
EOF
)
tap_result $? "h5py: every /index_sources checksum is zlib.crc32 of the sample's /text_2 then /image bytes" "$out"
# incomplete sources, and an index row outside /image, written with h5py
python3 - "$work" <<'EOF'
import sys, shutil, h5py
work = sys.argv[1]
shutil.copy(work + "/s.h5", work + "/noimage.h5")
with h5py.File(work + "/noimage.h5", "r+") as f:
    del f["image"]
shutil.copy(work + "/s.h5", work + "/badrow.h5")
with h5py.File(work + "/badrow.h5", "r+") as f:
    rows = f["index_sources"][:]
    rows[3, 3] = 10 ** 6
    f["index_sources"][:] = rows
EOF
out=$($tool verify "$work/noimage.h5" 2>&1); status=$?
case "$status:$out" in 1:*"the caption sources are incomplete: /image is missing"*) found=0 ;; *) found=1 ;; esac
tap_result $found "sources without /image: exit 1 naming what is missing" "$out"
out=$($tool verify "$work/badrow.h5" 2>&1); status=$?
case "$status:$out" in 1:*"/index_sources row 3 (sample 3): image range [1000000, "*"is outside /image"*) found=0 ;; *) found=1 ;; esac
tap_result $found "an /index_sources range outside /image: exit 1 naming the row and the dataset" "$out"
# a store written by h5py alone (docs/store.md's example with the sources) verifies
out=$(python3 - "$work/py.h5" <<'EOF' 2>&1
import sys, zlib, h5py, numpy as np
def bf16(values):
    bits = np.ascontiguousarray(values, dtype=np.float32).ravel().view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
rng = np.random.default_rng(1)
lat, txt, t2s, ims, index, sources = [], [], [], [], [], []
lo = to = o2 = oi = 0
for frames, g, n in [(1, 3, 0), (3, 0, 5), (2, 2, 5)]:
    latent, text = bf16(rng.standard_normal((4, frames, 2, 2))), bf16(rng.standard_normal((5, 12)))
    t2, im = bf16(rng.standard_normal((g, 6))), bf16(rng.standard_normal((n, 10)))
    index.append([4, frames, 2, 2, 5, lo, to, zlib.crc32(text.tobytes(), zlib.crc32(latent.tobytes()))])
    sources.append([g, o2, n, oi, zlib.crc32(im.tobytes(), zlib.crc32(t2.tobytes()))])
    lat.append(latent); txt.append(text); t2s.append(t2); ims.append(im)
    lo += latent.size; to += text.size; o2 += t2.size; oi += im.size
with h5py.File(sys.argv[1], "w") as f:
    for name, value in [("aldit_store_version", 1), ("latent_dtype", "bf16"), ("text_dtype", "bf16"), ("text_dim", 12),
                        ("latent_channels", 4), ("text_2_dim", 6), ("text_2_dtype", "bf16"), ("image_dim", 10),
                        ("image_dtype", "bf16")]:
        f.attrs[name] = value
    f["latents"], f["text"] = np.concatenate(lat), np.concatenate(txt)
    f["text_2"], f["image"] = np.concatenate(t2s), np.concatenate(ims)
    f["index"] = np.array(index, dtype=np.int64)
    f["index_sources"] = np.array(sources, dtype=np.int64)
    f["index_sources"].attrs["columns"] = "text_2_len,text_2_offset,image_len,image_offset,checksum"
EOF
) && out=$($tool verify --deck "$deck" "$work/py.h5" 2>&1)
tap_result $? "a store with sources written by h5py alone verifies and fits the deck" "$out"
tap_done
