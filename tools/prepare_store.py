#!/usr/bin/env python3
"""prepare_store.py — videos and images with captions -> an aldit latent store (docs/store.md), with Wan 2.1's VAE and umT5 or HunyuanVideo-1.5's encoders.

Inputs, either
  --csv FILE     a CSV with a header row and columns `path` and `caption` (paths relative to the CSV's folder)
  --media DIR    every image / video / frame folder under DIR that has a caption NAME.txt beside it
Media: images (.png .jpg .jpeg .webp .bmp), videos (.mp4 .mov .mkv .webm .avi .gif, read with PyAV) and
folders of image frames (in name order).

Each clip becomes one sample: resized (to cover) and centre-cropped to the nearest bucket of a length spec
(--lengths FILE, buckets in latent units as aldit-store synth reads them: pixels = 8 x height/width,
frames = 4 (F - 1) + 1, the clip's first frames), or with --native kept at its own size, cropped to
multiples of 16 pixels and 4k+1 frames. Latents: diffusers' AutoencoderKLWan (the Wan 2.1 VAE), the mean
of its posterior normalised with the VAE's latents_mean / latents_std as Wan does. Text: transformers'
UMT5EncoderModel on the caption tokenised to at most --text-len tokens (Wan's 512) with the EOS token; the
embedding is trimmed to the caption's real token count (the store's text_len), as Wan's T5 encoder does.

Weights come from local folders only (no hub downloads): --vae DIR, --text-encoder DIR, --tokenizer DIR,
or --wan DIR for a diffusers Wan 2.1 folder holding vae/, text_encoder/ and tokenizer/.

--family hunyuanvideo15 makes a store for HunyuanVideo-1.5 (docs/store.md, "Caption sources") with the encoders
of its diffusers pipelines, from --hunyuan DIR (a diffusers HunyuanVideo-1.5 folder: vae/, text_encoder/,
tokenizer/, text_encoder_2/, tokenizer_2/, image_encoder/, feature_extractor/) or the seven folders one by one:
latents from AutoencoderKLHunyuanVideo15 (16x spatial, 4x temporal, 32 channels: the posterior's mode times the
VAE's scaling_factor, as the image-to-video pipeline encodes its image; buckets in latent units then mean
pixels = 16 x height/width, and --native crops to 16 pixels); /text from Qwen2.5-VL (the pipeline's chat template
and system message, the hidden states of the third-last layer, the template's first --qwen-crop-start tokens
dropped, at most --text-len tokens (1000), trimmed to the caption's own); /text_2 from ByT5 on the caption's
quoted glyph texts (the pipeline's extract_glyph_texts; none: 0 rows; at most 256 tokens); /image from SigLIP
on a video's first frame (after the resize and crop; the pipeline's feature extractor; images get none, as the
official trainer trains images as text-to-video only).

Resumable: each finished sample is kept in --work DIR (default OUT.parts) as NNNNNNNN.npy (latent
[C, F, H, W]), NNNNNNNN.text.npy ([L, D]) and NNNNNNNN.json (its source, caption, and each part's shape,
dtype and CRC-32, written last); a rerun skips samples whose .json matches and whose parts still have the
recorded shape, dtype and CRC-32 (a part that does not, or cannot be read, is named and encoded again),
and once all are done packs the store (written as OUT.tmp, renamed to OUT; each part checked again as it
is packed). OUT and OUT.tmp may be absent or regular files: a directory, symbolic link or named pipe there
is refused before any work. The work folder also suits `aldit-store pack`. Uses every visible GPU (one
worker process each), the CPU otherwise.

Needs torch, diffusers, transformers, h5py, numpy, Pillow, tqdm; PyAV (`av`) for video files.
"""
import argparse
import csv
import html
import json
import math
import os
import re
import stat
import sys
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # local folders only: never reach for the hub

import numpy as np

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
VIDEO_EXTENSIONS = {".mp4", ".mov", ".mkv", ".webm", ".avi", ".gif"}
COLUMNS = "channels,frames,height,width,text_len,latent_offset,text_offset,checksum"
CHUNK = 1 << 18
SPATIAL, TEMPORAL, PATCH = 8, 4, 2   # Wan VAE strides; the DiT's 2x2 patch needs even latent height and width
SOURCE_COLUMNS = "text_2_len,text_2_offset,image_len,image_offset,checksum"


def fail(message, status=2):
    print(f"prepare_store: {message}", file=sys.stderr)
    sys.exit(status)


# ---- inputs ---------------------------------------------------------------------------------------


def read_lengths(path):
    """Buckets (frames, height, width) in latent units from a length spec, parsed as io/lengths.c does."""
    buckets, errors = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 4:
                errors.append(f"{path}:{number}: expected 4 fields `weight frames height width`, found {len(fields)}")
                continue
            try:
                weight = float(fields[0])
                dims = [int(x) for x in fields[1:]]
            except ValueError:
                errors.append(f"{path}:{number}: not `weight frames height width` numbers")
                continue
            if not (math.isfinite(weight) and weight > 0) or not all(1 <= d <= 65536 for d in dims):
                errors.append(f"{path}:{number}: weight must be positive, frames/height/width in [1, 65536]")
                continue
            buckets.append(tuple(dims))
    if not buckets and not errors:
        errors.append(f"{path}: no buckets (expected lines `weight frames height width`)")
    if errors:
        fail("\n".join(errors))
    return buckets


def media_kind(path):
    if os.path.isdir(path):
        return "frames"
    extension = os.path.splitext(path)[1].lower()
    return "image" if extension in IMAGE_EXTENSIONS else "video" if extension in VIDEO_EXTENSIONS else None


def list_inputs(args):
    """[(path, caption)] in a fixed order: the CSV's row order, or media file names sorted."""
    items = []
    if args.csv:
        root = os.path.dirname(os.path.abspath(args.csv))
        with open(args.csv, newline="") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or "path" not in reader.fieldnames or "caption" not in reader.fieldnames:
                fail(f"{args.csv}: needs a header row with columns `path` and `caption`")
            for row_number, row in enumerate(reader, 2):
                path = os.path.join(root, row["path"])
                if media_kind(path) is None:
                    fail(f"{args.csv}:{row_number}: {row['path']} is not an image, video or frame folder")
                items.append((path, row["caption"] or ""))
    else:
        for name in sorted(os.listdir(args.media)):
            path = os.path.join(args.media, name)
            stem = os.path.splitext(path)[0] if not os.path.isdir(path) else path
            if media_kind(path) and os.path.exists(stem + ".txt"):
                with open(stem + ".txt", encoding="utf-8") as f:
                    items.append((path, f.read()))
    if not items:
        fail(f"{args.csv or args.media}: no media with captions found")
    return items


def read_media(path):
    """uint8 frames [T, H, W, 3]. Images: Pillow; videos: PyAV (every frame of the first video stream)."""
    from PIL import Image

    kind = media_kind(path)
    if kind == "image":
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))[None]
    if kind == "frames":
        names = sorted(n for n in os.listdir(path) if os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS)
        if not names:
            raise ValueError("frame folder holds no images")
        frames = []
        for name in names:
            with Image.open(os.path.join(path, name)) as image:
                frames.append(np.asarray(image.convert("RGB")))
        return np.stack(frames)
    import av   # PyAV: FFmpeg's decoders

    with av.open(path) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    if not frames:
        raise ValueError("no video frames")
    return np.stack(frames)


def choose_shape(frames, height, width, buckets, spatial=SPATIAL, patch=PATCH):
    """(pixel frames, height, width) of the nearest bucket: same kind (image = 1 latent frame, video = more,
    no more frames than the clip has), then the closest aspect ratio, then the closest area, then the most
    frames. None when no bucket fits. Without buckets (--native): the clip's own size, cropped."""
    if buckets is None:
        f = 1 if frames == 1 else (frames - 1) // TEMPORAL * TEMPORAL + 1
        h, w = height // (spatial * patch) * spatial * patch, width // (spatial * patch) * spatial * patch
        return (f, h, w) if h and w else None
    fitting = [b for b in buckets if (b[0] == 1) == (frames == 1) and TEMPORAL * (b[0] - 1) + 1 <= frames]
    if not fitting:
        return None

    def cost(bucket):
        aspect = abs(math.log((bucket[2] / bucket[1]) / (width / height)))
        area = abs(math.log(bucket[1] * bucket[2] * spatial * spatial / (height * width)))
        return (round(aspect, 6), round(area, 6), -bucket[0])

    f, h, w = min(fitting, key=cost)
    return TEMPORAL * (f - 1) + 1, spatial * h, spatial * w


def fit_clip(frames, shape):
    """frames [T, H, W, 3] uint8 -> float tensor [3, F, h, w] in [-1, 1]: the first F frames, resized to cover
    (h, w) (bicubic, antialiased) and centre-cropped."""
    import torch
    import torch.nn.functional as F

    f, h, w = shape
    clip = torch.from_numpy(np.ascontiguousarray(frames[:f])).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    scale = max(h / clip.shape[2], w / clip.shape[3])
    size = (max(h, round(clip.shape[2] * scale)), max(w, round(clip.shape[3] * scale)))
    if size != tuple(clip.shape[2:]):
        clip = F.interpolate(clip, size=size, mode="bicubic", antialias=True, align_corners=False).clamp(-1, 1)
    top, left = (size[0] - h) // 2, (size[1] - w) // 2
    return clip[:, :, top:top + h, left:left + w].permute(1, 0, 2, 3).contiguous()


def clean_caption(text):
    """Wan's prompt cleaning: ftfy where installed, HTML entities, runs of whitespace."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


# ---- encoding -------------------------------------------------------------------------------------


class Encoders:
    """The Wan VAE and the umT5 encoder with its tokenizer, on one device."""
    parts = (".npy", ".text.npy")   # what arrays() gives, as the work folder keeps them

    def __init__(self, args, device):
        import torch
        from diffusers import AutoencoderKLWan
        from transformers import AutoTokenizer, UMT5EncoderModel

        self.torch, self.device, self.text_len = torch, device, args.text_len
        text_dtype = torch.float32 if device == "cpu" or args.text_dtype == "float32" else torch.bfloat16
        self.vae = AutoencoderKLWan.from_pretrained(args.vae, local_files_only=True, torch_dtype=torch.float32)
        self.vae = self.vae.to(device).eval()
        if args.vae_tiling:
            self.vae.enable_tiling()
        self.tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
        self.text_encoder = UMT5EncoderModel.from_pretrained(args.text_encoder, local_files_only=True,
                                                             torch_dtype=text_dtype).to(device).eval()
        config = self.vae.config
        self.mean = torch.tensor(config.latents_mean, device=device).view(1, -1, 1, 1, 1)
        self.std = torch.tensor(config.latents_std, device=device).view(1, -1, 1, 1, 1)

    def latent(self, clip):
        """[3, F, H, W] in [-1, 1] -> normalised latent [C, 1 + (F-1)/4, H/8, W/8], float32 numpy."""
        torch = self.torch
        with torch.no_grad():
            z = self.vae.encode(clip[None].to(self.device)).latent_dist.mode()
            return ((z - self.mean) / self.std)[0].float().cpu().numpy()

    def text(self, caption):
        """Caption -> [L, D] float32 numpy, L = its tokens with EOS (at most text_len)."""
        torch = self.torch
        tokens = self.tokenizer([clean_caption(caption)], padding="max_length", max_length=self.text_len,
                                truncation=True, add_special_tokens=True, return_attention_mask=True,
                                return_tensors="pt")
        length = int(tokens.attention_mask.gt(0).sum())
        with torch.no_grad():
            hidden = self.text_encoder(tokens.input_ids.to(self.device),
                                       tokens.attention_mask.to(self.device)).last_hidden_state
        return hidden[0, :max(length, 1)].float().cpu().numpy()

    def arrays(self, clip, caption):
        """The sample's parts (self.parts' order) from the fitted clip [3, F, H, W] and its caption."""
        return self.latent(clip), self.text(caption)


class HunyuanEncoders:
    """HunyuanVideo-1.5's VAE and its three encoders (Qwen2.5-VL, ByT5, SigLIP) as its diffusers pipelines call them."""
    parts = (".npy", ".text.npy", ".text_2.npy", ".image.npy")

    def __init__(self, args, device):
        import torch
        from diffusers import AutoencoderKLHunyuanVideo15
        from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import HunyuanVideo15Pipeline
        from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5_image2video import (
            HunyuanVideo15ImageToVideoPipeline)
        from transformers import (AutoImageProcessor, AutoTokenizer, Qwen2_5_VLTextModel, SiglipVisionModel,
                                  T5EncoderModel)

        self.torch, self.device, self.args = torch, device, args
        self.pipeline, self.i2v_pipeline = HunyuanVideo15Pipeline, HunyuanVideo15ImageToVideoPipeline
        dtype = torch.float32 if device == "cpu" or args.text_dtype == "float32" else torch.bfloat16
        load = {"local_files_only": True}
        self.vae = AutoencoderKLHunyuanVideo15.from_pretrained(args.vae, torch_dtype=torch.float32, **load).to(device).eval()
        if args.vae_tiling:
            self.vae.enable_tiling()
        self.tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, **load)
        self.text_encoder = Qwen2_5_VLTextModel.from_pretrained(args.text_encoder, torch_dtype=dtype, **load).to(device).eval()
        self.tokenizer_2 = AutoTokenizer.from_pretrained(args.tokenizer_2, **load)
        self.text_encoder_2 = T5EncoderModel.from_pretrained(args.text_encoder_2, torch_dtype=dtype, **load).to(device).eval()
        self.feature_extractor = AutoImageProcessor.from_pretrained(args.feature_extractor, **load)
        self.image_encoder = SiglipVisionModel.from_pretrained(args.image_encoder, torch_dtype=dtype, **load).to(device).eval()

    def arrays(self, clip, caption):
        from PIL import Image

        torch, caption = self.torch, clean_caption(caption)
        with torch.no_grad():
            latent = self.vae.encode(clip[None].to(self.device)).latent_dist.mode() * self.vae.config.scaling_factor
            text, mask = self.pipeline._get_mllm_prompt_embeds(self.text_encoder, self.tokenizer, [caption], self.device,
                                                               tokenizer_max_length=self.args.text_len,
                                                               crop_start=self.args.qwen_crop_start)
            text_2, mask_2 = self.pipeline._get_byt5_prompt_embeds(self.tokenizer_2, self.text_encoder_2, [caption],
                                                                   self.device, tokenizer_max_length=256)
            image = np.zeros((0, self.image_encoder.config.hidden_size), dtype=np.float32)
            if clip.shape[1] > 1:   # a video: SigLIP rows of its first frame (images train as text-to-video only)
                first = ((clip[:, 0].permute(1, 2, 0).float().cpu().numpy() + 1.0) * 127.5).round().clip(0, 255)
                image = self.i2v_pipeline._get_image_embeds(self.image_encoder, self.feature_extractor,
                                                            Image.fromarray(first.astype(np.uint8)), self.device)[0]
                image = image.float().cpu().numpy()
        # each source at its own length: the rows its mask keeps (the pipelines pad and mask them)
        text = text[0][mask[0].bool()].float().cpu().numpy()
        text_2 = text_2[0][mask_2[0].bool()].float().cpu().numpy()
        if text.shape[0] == 0:
            raise ValueError("the caption gives no Qwen2.5-VL tokens after the template (--qwen-crop-start too large?)")
        return latent[0].float().cpu().numpy(), text, text_2, image


def sample_record(path, caption, args):
    """What a finished sample was made from: a rerun reuses it only when all of this is unchanged."""
    record = {"source": os.path.abspath(path), "caption": caption, "shapes": args.shapes,
              "vae": os.path.abspath(args.vae), "text_encoder": os.path.abspath(args.text_encoder),
              "tokenizer": os.path.abspath(args.tokenizer), "text_len_max": args.text_len}
    if args.family == "hunyuanvideo15":
        record.update({part: os.path.abspath(getattr(args, part)) for part in HUNYUAN_EXTRA_PARTS})
        record.update({"family": args.family, "qwen_crop_start": args.qwen_crop_start})
    return record


PARTS = (".npy", ".text.npy")   # a sample's arrays in the work folder: the latent, the text embedding (Wan)
HUNYUAN_EXTRA_PARTS = ("text_encoder_2", "tokenizer_2", "image_encoder", "feature_extractor")


def part_record(array):
    """What a part is when it is written: its shape, dtype and the CRC-32 of its values' bytes."""
    return {"shape": list(array.shape), "dtype": str(array.dtype), "crc32": zlib.crc32(np.ascontiguousarray(array))}


def load_part(name, suffix, kept):
    """(array, None) when the part NAME+SUFFIX reads and has the shape, dtype and CRC-32 that its .json
    recorded when it was written, else (None, a message naming the file and what is wrong)."""
    path = name + suffix
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        return None, f"{path}: cannot be read as .npy ({type(error).__name__}: {error}): truncated or damaged"
    recorded = (kept.get("parts") or {}).get(suffix)
    if not isinstance(recorded, dict):
        return None, f"{path}: {name}.json records no shape and CRC-32 for it (written by an older prepare_store)"
    if list(array.shape) != recorded.get("shape") or str(array.dtype) != recorded.get("dtype"):
        return None, (f"{path}: {array.dtype} {list(array.shape)}, but {recorded.get('dtype')} "
                      f"{recorded.get('shape')} when it was written")
    if zlib.crc32(np.ascontiguousarray(array)) != recorded.get("crc32"):
        return None, f"{path}: its values fail the CRC-32 recorded when it was written: the file is damaged"
    return array, None


def read_record(name):
    """The sample's .json, or None where it is missing or unreadable (the sample is not done)."""
    try:
        with open(name + ".json") as f:
            kept = json.load(f)
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) else None


def done(work, index, record, parts=PARTS):
    """(True, None) when sample `index` is in the work folder, made from this very record, its parts as
    written; (False, None) when it is not there (or was made from something else); (False, message) when
    its .json is there but a part fails its check: the message names the file."""
    name = os.path.join(work, f"{index:08d}")
    kept = read_record(name)
    if kept is None or {k: kept.get(k) for k in record} != record:
        return False, None
    for suffix in parts:
        _, problem = load_part(name, suffix, kept)
        if problem:
            return False, problem
    return True, None


def unfit_before(work, index, record):
    """True when an earlier run found no bucket for sample `index`, made from this very record."""
    try:
        with open(os.path.join(work, f"{index:08d}.unfit.json")) as f:
            return json.load(f) == record
    except (OSError, ValueError):
        return False


def mark_unfit(work, index, record):
    """Remember that no bucket fits sample `index`, so that a rerun does not read it (or load encoders) again."""
    name = os.path.join(work, f"{index:08d}.unfit.json")
    with open(name + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(name + ".tmp", name)


def save_sample(work, index, arrays, record, suffixes=PARTS):
    """Write the sample's arrays (latent, text, and a HunyuanVideo-1.5 store's text_2 and image), then its .json (the
    mark that it is complete, with each part's shape, dtype and CRC-32), each by rename."""
    name = os.path.join(work, f"{index:08d}")
    latent, text = arrays[0], arrays[1]
    parts = {}
    for suffix, array in zip(suffixes, arrays):
        array = np.ascontiguousarray(array, dtype=np.float32)
        with open(name + suffix + ".tmp", "wb") as f:
            np.save(f, array)
        os.replace(name + suffix + ".tmp", name + suffix)
        parts[suffix] = part_record(array)
    with open(name + ".json.tmp", "w") as f:
        json.dump({**record, "latent": list(latent.shape), "text_len": int(text.shape[0]), "parts": parts}, f)
    os.replace(name + ".json.tmp", name + ".json")


def encode_items(args, device, todo, report):
    """Encode (index, path, caption) items on `device`; report(index, status) after each, status "ok",
    "unfit" (no bucket fits the clip) or an error message naming the file."""
    import time
    started = time.time()
    encoders = (HunyuanEncoders if args.family == "hunyuanvideo15" else Encoders)(args, device)
    print(f"prepare_store: {device}: models loaded in {time.time() - started:.1f} s", file=sys.stderr)
    seconds = []
    for index, path, caption in todo:
        sample_started = time.time()
        try:
            frames = read_media(path)
            shape = choose_shape(frames.shape[0], frames.shape[1], frames.shape[2], args.buckets, args.spatial, args.patch)
            if shape is None:
                report(index, "unfit")
                continue
            arrays = encoders.arrays(fit_clip(frames, shape), caption)
            if not all(np.isfinite(array).all() for array in arrays):
                raise ValueError("the encoders gave values that are not finite")
            save_sample(args.work, index, arrays, sample_record(path, caption, args), encoders.parts)
            seconds.append(time.time() - sample_started)
            report(index, "ok")
        except Exception as error:   # reported with the file's name; the caller stops or skips
            report(index, f"{path}: {type(error).__name__}: {error}")
    if len(seconds) > 1:   # the first sample also warms up the kernels
        print(f"prepare_store: {device}: {len(seconds)} samples encoded, {seconds[0]:.2f} s the first, "
              f"{sum(seconds[1:]) / (len(seconds) - 1):.2f} s each after it", file=sys.stderr)


def worker(args, device, todo, queue):
    encode_items(args, device, todo, lambda index, status: queue.put((index, status)))
    queue.put(None)


def run_encoders(args, todo, progress):
    """Encode on every visible GPU (one process each, items dealt round-robin) or on the CPU.
    Returns {index: status} of the items done."""
    import torch

    statuses = {}
    paths = {index: path for index, path, _ in todo}
    captions = {index: caption for index, _, caption in todo}

    def report(index, status):
        progress.update(1)
        statuses[index] = status
        if status == "unfit":
            progress.write(f"prepare_store: no bucket fits {paths[index]} (too few frames or too small); left out")
            mark_unfit(args.work, index, sample_record(paths[index], captions[index], args))
        elif status != "ok":
            if not args.skip_bad:
                raise SystemExit(f"prepare_store: {status}")
            progress.write(f"prepare_store: skipped {status}")

    gpus = torch.cuda.device_count() if args.device in ("auto", "cuda") else 0
    if args.device == "cuda" and gpus == 0:
        fail("--device cuda but no GPU is visible")
    if gpus <= 1 or len(todo) <= 1:
        encode_items(args, "cuda" if gpus else "cpu", todo, report)
        return statuses
    context = torch.multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=worker, args=(args, f"cuda:{g}", todo[g::gpus], queue)) for g in range(gpus)]
    for process in workers:
        process.start()
    finished = 0
    try:
        while finished < len(workers):
            message = queue.get()
            if message is None:
                finished += 1
            else:
                report(*message)
    finally:
        for process in workers:
            if finished < len(workers) and process.is_alive():
                process.terminate()
            process.join()
    return statuses


# ---- packing --------------------------------------------------------------------------------------


def stored(values, precision):
    """Values as stored (docs/store.md): bf16 bit patterns rounded to nearest even, float16 or float32."""
    values = np.ascontiguousarray(values, dtype=np.float32).ravel()
    if precision == "bf16":
        bits = values.view(np.uint32).astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    if precision == "f16" and np.abs(values).max(initial=0.0) > 65504.0:
        raise ValueError("a value overflows float16")
    return values.astype(np.float16 if precision == "f16" else np.float32)


def packed_sample(args, index):
    """(latent, text) of sample `index`, each checked against its .json. A part that fails is refused: its
    .json is removed (so that a rerun encodes the sample again) and prepare_store stops naming the file."""
    name = os.path.join(args.work, f"{index:08d}")
    kept = read_record(name) or {}
    arrays = []
    for suffix in getattr(args, "parts", PARTS):
        array, problem = load_part(name, suffix, kept)
        if problem:
            try:
                os.remove(name + ".json")
            except OSError:
                pass
            fail(f"{problem}; no store written: run the same command again to encode this sample anew", 1)
        arrays.append(array)
    return arrays


def write_store(args, indices, path):
    """The store from the work folder's samples (in index order) into `path`; the sample count."""
    import h5py
    from tqdm import tqdm

    element = {"bf16": np.uint16, "f16": np.float16, "f32": np.float32}[args.precision]
    rows, source_rows, channels, text_dim, widths = [], [], None, None, None
    with h5py.File(path, "w") as f:
        latents = f.create_dataset("latents", shape=(0,), maxshape=(None,), chunks=(CHUNK,), dtype=element)
        texts = f.create_dataset("text", shape=(0,), maxshape=(None,), chunks=(CHUNK,), dtype=element)
        sources = [f.create_dataset(name, shape=(0,), maxshape=(None,), chunks=(CHUNK,), dtype=element)
                   for name in ("text_2", "image")] if len(getattr(args, "parts", PARTS)) == 4 else []
        for index in tqdm(indices, desc="pack", unit="sample"):
            name = os.path.join(args.work, f"{index:08d}")
            latent, text, *extra = packed_sample(args, index)
            if sources:   # the caption sources: ByT5 rows and SigLIP rows, each at its own length (docs/store.md)
                widths = widths or (extra[0].shape[1], extra[1].shape[1])
                if (extra[0].shape[1], extra[1].shape[1]) != widths:
                    fail(f"{name}: text_2 / image widths {extra[0].shape[1]} / {extra[1].shape[1]}, the first sample "
                         f"has {widths[0]} / {widths[1]}", 1)
                try:
                    values = [stored(array, args.precision) for array in extra]
                except ValueError as error:
                    fail(f"{name}: {error}", 1)
                source_rows.append([extra[0].shape[0], sources[0].shape[0], extra[1].shape[0], sources[1].shape[0],
                                    zlib.crc32(values[1].tobytes(), zlib.crc32(values[0].tobytes()))])
                for dataset, stored_values in zip(sources, values):
                    start = dataset.shape[0]
                    dataset.resize((start + stored_values.size,))
                    dataset[start:] = stored_values
            if channels is None:
                channels, text_dim = latent.shape[0], text.shape[1]
            if latent.shape[0] != channels or text.shape[1] != text_dim:
                fail(f"{name}.npy: {latent.shape[0]} channels / text width {text.shape[1]}, the first sample has "
                     f"{channels} / {text_dim}", 1)
            try:
                latent_values, text_values = stored(latent, args.precision), stored(text, args.precision)
            except ValueError as error:
                fail(f"{name}.npy: {error}", 1)
            checksum = zlib.crc32(text_values.tobytes(), zlib.crc32(latent_values.tobytes()))
            rows.append([*latent.shape, text.shape[0], latents.shape[0], texts.shape[0], checksum])
            for dataset, values in ((latents, latent_values), (texts, text_values)):
                start = dataset.shape[0]
                dataset.resize((start + values.size,))
                dataset[start:] = values
        index = f.create_dataset("index", data=np.array(rows, dtype=np.int64))
        index.attrs["columns"] = COLUMNS
        f.attrs["aldit_store_version"] = 1
        f.attrs["latent_dtype"] = args.precision
        f.attrs["text_dtype"] = args.precision
        f.attrs["text_dim"] = text_dim
        f.attrs["latent_channels"] = channels
        if sources:
            index_sources = f.create_dataset("index_sources", data=np.array(source_rows, dtype=np.int64))
            index_sources.attrs["columns"] = SOURCE_COLUMNS
            for key, value in (("text_2_dim", widths[0]), ("text_2_dtype", args.precision), ("image_dim", widths[1]),
                               ("image_dtype", args.precision)):
                f.attrs[key] = value
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    return len(rows)


def pack(args, indices):
    """Write the store as OUT.tmp, then rename it to OUT. On any failure OUT.tmp is removed and the error
    names the file and errno's text (exit 1); OUT, if there, is left as it was."""
    temporary = args.out + ".tmp"
    try:
        n = write_store(args, indices, temporary)
        os.replace(temporary, args.out)   # publish only a complete file
        return n
    except BaseException as error:
        removed = os.path.isfile(temporary) and not os.path.islink(temporary)
        if removed:
            os.remove(temporary)
        if isinstance(error, OSError):
            reason = os.strerror(error.errno) if error.errno else str(error)
            fail(f"{args.out}: cannot write the store: {reason}" + (f" (removed {temporary})" if removed else ""), 1)
        raise


def refuse_unreplaceable(out):
    """Stop (exit 2) when --out or its .tmp exists and is not a regular file: the rename that publishes the
    store would fail on a directory and replace a symbolic link or a named pipe (aldit-store refuses them too)."""
    for path in (out, out + ".tmp"):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as error:
            fail(f"--out {out}: {path}: {error.strerror}")
        kinds = ((stat.S_ISREG, None), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
                 (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                 (stat.S_ISSOCK, "a socket"))
        kind = next((name for test, name in kinds if test(mode)), "not a regular file")
        if kind:
            fail(f"--out {out}: {path} exists and is {kind}; prepare_store replaces only regular files: "
                 "move it away or give another --out")


# ---- main -----------------------------------------------------------------------------------------


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--csv", help="CSV with `path` and `caption` columns")
    source.add_argument("--media", help="folder of media files with a NAME.txt caption beside each")
    parser.add_argument("--out", required=True, help="the store to write (HDF5)")
    parser.add_argument("--family", choices=("wan", "hunyuanvideo15"), default="wan",
                        help="the model family whose encoders make the store (default wan)")
    parser.add_argument("--wan", help="a diffusers Wan 2.1 folder with vae/, text_encoder/, tokenizer/")
    parser.add_argument("--hunyuan", help="a diffusers HunyuanVideo-1.5 folder with vae/, text_encoder/, tokenizer/, "
                        "text_encoder_2/, tokenizer_2/, image_encoder/, feature_extractor/")
    parser.add_argument("--vae", help="AutoencoderKLWan (AutoencoderKLHunyuanVideo15) folder (config.json + weights)")
    parser.add_argument("--text-encoder", help="UMT5EncoderModel (Qwen2_5_VLTextModel) folder")
    parser.add_argument("--tokenizer", help="its tokenizer folder")
    parser.add_argument("--text-encoder-2", help="hunyuanvideo15: the ByT5 T5EncoderModel folder")
    parser.add_argument("--tokenizer-2", help="hunyuanvideo15: the ByT5 tokenizer folder")
    parser.add_argument("--image-encoder", help="hunyuanvideo15: the SigLIP SiglipVisionModel folder")
    parser.add_argument("--feature-extractor", help="hunyuanvideo15: SigLIP's image processor folder")
    parser.add_argument("--qwen-crop-start", type=int, default=108,
                        help="hunyuanvideo15: template tokens dropped before the caption's (the pipeline's 108)")
    shape = parser.add_mutually_exclusive_group(required=True)
    shape.add_argument("--lengths", help="length spec: resize and crop each clip to its nearest bucket")
    shape.add_argument("--native", action="store_true", help="keep each clip's size (cropped to 16 px, 4k+1 frames)")
    parser.add_argument("--text-len", type=int, help="most text tokens per caption (Wan: 512; hunyuanvideo15: 1000)")
    parser.add_argument("--precision", choices=("bf16", "f16", "f32"), default="bf16")
    parser.add_argument("--work", help="folder of finished samples (default OUT.parts)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--text-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="umT5 precision on a GPU (the CPU always uses float32)")
    parser.add_argument("--vae-tiling", action="store_true", help="encode large clips in tiles (less memory)")
    parser.add_argument("--skip-bad", action="store_true", help="skip unreadable media (listed) instead of stopping")
    parser.add_argument("--max-samples", type=int, help="encode at most this many new samples, then stop (resume later)")
    args = parser.parse_args()
    hunyuan = args.family == "hunyuanvideo15"
    folder, folder_option = (args.hunyuan, "--hunyuan") if hunyuan else (args.wan, "--wan")
    for part in ("vae", "text_encoder", "tokenizer") + (HUNYUAN_EXTRA_PARTS if hunyuan else ()):
        if getattr(args, part) is None and folder:
            setattr(args, part, os.path.join(folder, part))
        if getattr(args, part) is None:
            parser.error(f"--{part.replace('_', '-')} DIR (or {folder_option} DIR) is required")
        if not os.path.isdir(getattr(args, part)):
            parser.error(f"--{part.replace('_', '-')} {getattr(args, part)}: not a folder")
    for option, path, isthere in (("--csv", args.csv, os.path.isfile), ("--media", args.media, os.path.isdir),
                                  ("--lengths", args.lengths, os.path.isfile)):
        if path is not None and not isthere(path):
            parser.error(f"{option} {path}: no such {'folder' if option == '--media' else 'file'}")
    if args.text_len is None:
        args.text_len = 1000 if hunyuan else 512
    if args.text_len < 1:
        parser.error("--text-len must be at least 1")
    # the VAE's spatial stride and the DiT's patch: crops and buckets in pixels
    args.spatial, args.patch = (16, 1) if hunyuan else (SPATIAL, PATCH)
    args.parts = HunyuanEncoders.parts if hunyuan else Encoders.parts
    args.work = args.work or args.out + ".parts"
    refuse_unreplaceable(args.out)
    return args


def main():
    args = parse_args()
    from tqdm import tqdm

    args.buckets = None if args.native else read_lengths(args.lengths)
    args.shapes = "native" if args.native else [list(b) for b in sorted(set(args.buckets))]
    items = list_inputs(args)
    os.makedirs(args.work, exist_ok=True)
    complete = []
    for i, (path, caption) in enumerate(items):
        finished, problem = done(args.work, i, sample_record(path, caption, args), args.parts)
        if finished:
            complete.append(i)
        elif problem:
            print(f"prepare_store: {problem}; encoding sample {i} ({path}) again", file=sys.stderr)
    unfit_known = [i for i, (path, caption) in enumerate(items)
                   if i not in set(complete) and unfit_before(args.work, i, sample_record(path, caption, args))]
    kept = set(complete) | set(unfit_known)
    todo = [(i, path, caption) for i, (path, caption) in enumerate(items) if i not in kept]
    print(f"prepare_store: {len(items)} inputs, {len(complete)} already done, {len(todo)} to encode"
          + (f" ({len(unfit_known)} without a bucket, left out before)" if unfit_known else ""), file=sys.stderr)
    limit = len(todo) if args.max_samples is None else min(args.max_samples, len(todo))
    statuses = {}
    if limit > 0:   # the encoders load only where there is something to encode
        with tqdm(total=len(complete) + limit, initial=len(complete), unit="sample", desc="encode") as progress:
            statuses = run_encoders(args, todo[:limit], progress)
    if limit < len(todo):
        print(f"prepare_store: stopped after {limit} new samples (--max-samples); run again to continue",
              file=sys.stderr)
        return 0
    encoded = [index for index, status in statuses.items() if status == "ok"]
    unfit = sum(status == "unfit" for status in statuses.values()) + len(unfit_known)
    if not complete and not encoded:
        fail("no sample could be made (no bucket fits any input?)", 1)
    n = pack(args, sorted(complete + encoded))
    print(f"prepare_store: wrote {args.out}: {n} samples ({unfit} without a bucket, "
          f"{len(statuses) - len(encoded) - (unfit - len(unfit_known))} unreadable and skipped)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
