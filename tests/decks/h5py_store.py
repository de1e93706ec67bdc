# mk_h5py_store.py — writes tests/decks/h5py_store.h5 as h5py does: fixed-length (numpy bytes) precision names,
# a variable-length UTF-8 (Python str) /index columns attribute, contiguous datasets (a small file).
import os, zlib
import h5py, numpy as np
COLUMNS = "channels,frames,height,width,text_len,latent_offset,text_offset,checksum"
def stored(values, dtype):
    values = np.ascontiguousarray(values, dtype=np.float32).ravel()
    if dtype == "bf16":
        bits = values.view(np.uint32).astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return values.astype({"f16": np.float16, "f32": np.float32}[dtype])
def write_store(path, samples, dtype="bf16"):
    channels, text_dim = samples[0][0].shape[0], samples[0][1].shape[1]
    rows, latents, texts = [], [], []
    latent_offset = text_offset = 0
    for latent, text in samples:
        lv, tv = stored(latent, dtype), stored(text, dtype)
        checksum = zlib.crc32(tv.tobytes(), zlib.crc32(lv.tobytes()))
        rows.append([*latent.shape, text.shape[0], latent_offset, text_offset, checksum])
        latents.append(lv); texts.append(tv)
        latent_offset += lv.size; text_offset += tv.size
    with h5py.File(path + ".tmp", "w") as f:
        f.attrs["aldit_store_version"] = 1
        f.attrs["latent_dtype"] = np.bytes_(dtype)  # fixed-length (numpy bytes)
        f.attrs["text_dtype"] = np.bytes_(dtype)
        f.attrs["text_dim"] = text_dim
        f.attrs["latent_channels"] = channels
        f.create_dataset("latents", data=np.concatenate(latents))
        f.create_dataset("text", data=np.concatenate(texts))
        index = f.create_dataset("index", data=np.array(rows, dtype=np.int64))
        index.attrs["columns"] = COLUMNS
    os.replace(path + ".tmp", path)
rng = np.random.default_rng(0)
samples = [(rng.standard_normal((4, 1, 4, 4)), rng.standard_normal((3, 8))),
           (rng.standard_normal((4, 3, 2, 4)), rng.standard_normal((5, 8)))]
write_store("h5py_store.h5", samples)
