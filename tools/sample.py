#!/usr/bin/env python3
"""sample.py — samples from an aldit checkpoint: Wan-format weights, then a video (mp4) and a frame grid (PNG) with diffusers' WanPipeline (or HunyuanVideo-1.5's pipelines).

Reads the weights of an aldit checkpoint (or any HDF5 file with a dataset per Wan parameter name), or its
`/ema/<name>` datasets when the file has an `/ema` group (a run with [train] ema_decay writes one; --ema: those,
an error where the file has none; --no-ema: the raw weights), and the model dims
from its `/model` attributes (or --deck-dims for a plain weights file). An aldit checkpoint without its
completion mark (one being written, or its run stopped mid-save), a file that is not HDF5 or is damaged or
truncated, and a weight that is not finite are refused (exit 2) naming the file and the tensor. The weights go into diffusers'
WanTransformer3DModel under diffusers' names (tools/wan_names.py) and optionally out as Wan's official
format (--save-wan DIR: diffusion_pytorch_model.safetensors + config.json) or diffusers' (--save-diffusers
DIR). Then WanPipeline with the Wan 2.1 VAE and umT5 from local folders samples --prompt with
classifier-free guidance (--guidance, --negative-prompt) and a flow-matching scheduler (UniPC, as Wan, or
Euler) with timestep shift --shift, and writes OUT.mp4 and OUT.png (up to 16 frames, evenly spaced).

Text padding: as the model was trained, the checkpoint deck's [model] text_padding: wan (aldit's default,
and Wan's) pads each prompt's embedding with zeros to text_len as WanPipeline does; trim (also taken for
a checkpoint whose deck has no such key, written before it existed) gives the transformer the embedding
trimmed to its tokens. --text-padding overrides it.

    python3 tools/sample.py --checkpoint run/checkpoints/step_00010000.h5 --wan Wan2.1-T2V-1.3B-Diffusers \\
        --prompt "a red fox runs through snow" --out fox

HunyuanVideo-1.5 (a checkpoint of model.family = hunyuanvideo15, its /model attribute family = 1): the weights,
kept under diffusers' names, go into HunyuanVideo15Transformer3DModel (its timestep sinusoids computed in float64,
as aldit computes them), and diffusers' HunyuanVideo15Pipeline samples with the VAE (AutoencoderKLHunyuanVideo15),
Qwen2.5-VL and ByT5 of --hunyuan DIR (a diffusers HunyuanVideo-1.5 folder; or --vae, --text-encoder, --tokenizer,
--text-encoder-2, --tokenizer-2), Euler flow matching with --shift and classifier-free guidance --guidance; with
--image FILE, HunyuanVideo15ImageToVideoPipeline animates that image (also --image-encoder, --feature-extractor:
SigLIP). The pipeline pads and masks each caption, which equals aldit's training on captions at their own lengths
(docs/model.md). --qwen-crop-start sets the template tokens dropped before the caption (the pipeline's 108; tiny
test tokenizers need another).

    python3 tools/sample.py --checkpoint run/checkpoints/step_00010000.h5 --hunyuan HunyuanVideo-1.5-Diffusers-480p_t2v \\
        --prompt "a red fox runs through snow" --height 480 --width 848 --frames 121 --out fox

--prompts FILE samples each line of FILE instead (the pipeline loaded once): `PROMPT | key=value ...`, the keys
height, width, frames, steps, seed and guidance overriding the options for that line; blank lines and lines
starting with # are skipped. OUT is then a folder: OUT/01.mp4 and OUT/01.png for the first prompt, and so on.

Needs torch, diffusers, transformers, h5py, numpy, Pillow and PyAV (`av`, for the mp4).
"""
import argparse
import json
import math
import os
import re
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # local folders only: never reach for the hub

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wan_names  # noqa: E402


def fail(message, status=2):
    print(f"sample: {message}", file=sys.stderr)
    sys.exit(status)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--checkpoint", required=True, help="aldit checkpoint or Wan-named HDF5 weights")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--ema", action="store_true",
                       help="use the /ema weights ([train] ema_decay); an error where the file has none")
    which.add_argument("--no-ema", action="store_true", help="use the raw weights even where /ema exists")
    parser.add_argument("--deck-dims", metavar="KEY=VALUE,...",
                        help="model dims for a file without /model, e.g. dim=32,ffn_dim=64,num_heads=2,...")
    parser.add_argument("--wan", help="a diffusers Wan 2.1 folder with vae/, text_encoder/, tokenizer/")
    parser.add_argument("--hunyuan", help="a diffusers HunyuanVideo-1.5 folder: vae/, text_encoder/, tokenizer/, "
                        "text_encoder_2/, tokenizer_2/ (and image_encoder/, feature_extractor/ for --image)")
    parser.add_argument("--vae", help="AutoencoderKLWan (AutoencoderKLHunyuanVideo15) folder")
    parser.add_argument("--text-encoder", help="UMT5EncoderModel (Qwen2_5_VLTextModel) folder")
    parser.add_argument("--tokenizer", help="its tokenizer folder")
    parser.add_argument("--text-encoder-2", help="hunyuanvideo15: the ByT5 T5EncoderModel folder")
    parser.add_argument("--tokenizer-2", help="hunyuanvideo15: the ByT5 tokenizer folder")
    parser.add_argument("--image-encoder", help="hunyuanvideo15 with --image: the SigLIP SiglipVisionModel folder")
    parser.add_argument("--feature-extractor", help="hunyuanvideo15 with --image: SigLIP's image processor folder")
    parser.add_argument("--image", help="hunyuanvideo15: image-to-video, this image as the first frame")
    parser.add_argument("--target-size", type=int, help="hunyuanvideo15 with --image: the pipeline's base size (its "
                        "transformer's target_size, 640): the video takes the crop bucket of that size nearest the "
                        "image's aspect ratio (--height and --width are not used)")
    parser.add_argument("--qwen-crop-start", type=int, default=108,
                        help="hunyuanvideo15: template tokens dropped before the caption (the pipeline's 108)")
    prompts = parser.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompt")
    prompts.add_argument("--prompts", metavar="FILE",
                         help="one prompt a line, `PROMPT | height=H width=W frames=F steps=S seed=N guidance=G`; "
                              "OUT is then a folder of NN.mp4 and NN.png")
    parser.add_argument("--negative-prompt", default="")
    parser.add_argument("--out", required=True, help="writes OUT.mp4 and OUT.png (with --prompts: OUT/NN.mp4, .png)")
    parser.add_argument("--height", type=int, default=480, help="pixels, a multiple of 16")
    parser.add_argument("--width", type=int, default=832, help="pixels, a multiple of 16")
    parser.add_argument("--frames", type=int, default=81, help="4k+1 frames (1 = an image)")
    parser.add_argument("--steps", type=int, default=50, help="sampling steps")
    parser.add_argument("--guidance", type=float, default=5.0, help="classifier-free guidance scale (1 = off)")
    parser.add_argument("--shift", type=float, default=5.0, help="flow-matching timestep shift (Wan: 5 at 720p, 3 at 480p)")
    parser.add_argument("--scheduler", choices=("unipc", "euler"), default="unipc")
    parser.add_argument("--text-padding", choices=("trim", "wan"), help="default: the checkpoint deck's [model] text_padding, else trim")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--save-wan", metavar="DIR", help="also write Wan's official format here")
    parser.add_argument("--save-diffusers", metavar="DIR", help="also write the WanTransformer3DModel here")
    args = parser.parse_args()
    if not os.path.isfile(args.checkpoint):
        parser.error(f"--checkpoint {args.checkpoint}: no such file")
    args.family = family_of(args.checkpoint)
    hunyuan = args.family == "hunyuanvideo15"
    if args.image and not hunyuan:
        parser.error("--image (image-to-video) is for a hunyuanvideo15 checkpoint")
    folder, folder_option = (args.hunyuan, "--hunyuan") if hunyuan else (args.wan, "--wan")
    parts = ("vae", "text_encoder", "tokenizer") + (("text_encoder_2", "tokenizer_2") if hunyuan else ()) + \
        (("image_encoder", "feature_extractor") if args.image else ())
    for part in parts:
        if getattr(args, part) is None and folder:
            setattr(args, part, os.path.join(folder, part))
        if getattr(args, part) is None or not os.path.isdir(getattr(args, part)):
            parser.error(f"--{part.replace('_', '-')} DIR (or {folder_option} DIR) must name a folder")
    if args.image and not os.path.isfile(args.image):
        parser.error(f"--image {args.image}: no such file")
    args.jobs = read_prompts(parser, args) if args.prompts else [job_of(args, args.prompt, {}, args.out)]
    for job in args.jobs:
        where = job["where"]
        if job["height"] % 16 or job["width"] % 16 or job["height"] <= 0 or job["width"] <= 0:
            parser.error(f"{where}--height {job['height']} --width {job['width']}: need positive multiples of 16")
        if job["frames"] < 1 or (job["frames"] - 1) % 4:
            parser.error(f"{where}--frames {job['frames']}: need 4k+1 frames (1, 5, 9, ..., 81)")
        if job["steps"] < 1:
            parser.error(f"{where}--steps {job['steps']}: need at least 1")
    # the output folders are made (and found writable) now, not after minutes of sampling
    out_folder = args.out if args.prompts else os.path.dirname(args.out) or "."
    for option, folder in (("--out", out_folder), ("--save-wan", args.save_wan),
                           ("--save-diffusers", args.save_diffusers)):
        if folder is None:
            continue
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as error:
            parser.error(f"{option}: cannot make the folder {folder}: {error.strerror}")
        if not os.access(folder, os.W_OK):
            parser.error(f"{option}: the folder {folder} is not writable")
    return args


def family_of(path):
    """The checkpoint's model family: hunyuanvideo15 where its /model attribute family is 1, else wan."""
    with open_checkpoint(path) as f:
        family = int(f["model"].attrs.get("family", 0)) if "model" in f else 0
    return "hunyuanvideo15" if family == 1 else "wan"


def open_checkpoint(path):
    """The file opened with h5py, or exit 2 naming it where it is not HDF5 (or damaged, or truncated)."""
    try:
        return h5py.File(path, "r")
    except OSError as error:
        fail(f"{path}: cannot open as HDF5 ({error}): not a checkpoint, or a damaged or truncated one")


def check_complete(f, path):
    """An aldit checkpoint (root attribute aldit_checkpoint_version) must carry its completion mark: one
    without it was being written (a .tmp) or its run stopped mid-save, and may lack tensors or hold old ones."""
    if "aldit_checkpoint_version" in f.attrs and int(f.attrs.get("complete", 0)) != 1:
        fail(f"{path}: incomplete checkpoint (no completion mark `complete`: it was being written when its run "
             "stopped): sample from a complete one, e.g. the newest step_*.h5 that aldit resumes from")


def read_tensor(item, source, name, family="wan"):
    """One weights dataset as float32, checked: exit 2 naming the file and the tensor where it cannot be read
    (a damaged or truncated file, a failed Fletcher-32 checksum) or where a value is not finite."""
    try:
        values = np.asarray(item[()], np.float32)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
        fail(f"{source}: tensor {name} cannot be read ({error}): the file is damaged or truncated")
    try:
        if family == "wan":   # hunyuanvideo15 keeps diffusers' names: every root dataset is a parameter
            wan_names.wan_to_diffusers(name)
    except KeyError:
        return values   # not a model parameter: not used (as [model] init ignores it)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        fail(f"{source}: tensor {name} element {bad[0]} is {values.flat[bad[0]]} ({bad.size} values not finite): "
             "these weights cannot make a sample; take an earlier checkpoint")
    return values


PROMPT_KEYS = {"height": int, "width": int, "frames": int, "steps": int, "seed": int, "guidance": float}


def job_of(args, prompt, settings, out, where=""):
    """One sample to make: the prompt, the options (settings override them) and the output prefix."""
    job = {key: settings.get(key, getattr(args, key)) for key in PROMPT_KEYS}
    job.update(prompt=prompt, out=out, where=where)
    return job


def read_prompts(parser, args):
    """The --prompts file's lines as jobs (OUT/NN), each checked; a usage error names FILE:LINE."""
    try:
        with open(args.prompts, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as error:
        parser.error(f"--prompts {args.prompts}: {error.strerror}")
    jobs = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{args.prompts}:{number}: "
        prompt, _, rest = line.partition("|")
        settings = {}
        for item in rest.split():
            key, equals, value = item.partition("=")
            if key not in PROMPT_KEYS or not equals:
                parser.error(f"{where}'{item}' is not one of {', '.join(k + '=' for k in PROMPT_KEYS)}")
            try:
                settings[key] = PROMPT_KEYS[key](value)
            except ValueError:
                parser.error(f"{where}{key}={value}: not a number")
        if not prompt.strip():
            parser.error(f"{where}an empty prompt")
        jobs.append(job_of(args, prompt.strip(), settings, os.path.join(args.out, f"{len(jobs) + 1:02d}"), where))
    if not jobs:
        parser.error(f"--prompts {args.prompts}: no prompt in it")
    return jobs


def read_weights(args):
    """(Wan-named float32 arrays, model dims, text padding of the deck or None, where the weights came from)."""
    with open_checkpoint(args.checkpoint) as f:
        try:
            return read_contents(f, args)
        except (OSError, KeyError, ValueError, RuntimeError) as error:
            fail(f"{args.checkpoint}: cannot be read ({error}): the file is damaged or truncated")


def read_contents(f, args):
    check_complete(f, args.checkpoint)
    if "model" in f and f["model"].attrs:
        dims = {k: int(f["model"].attrs[k]) for k in wan_names.MODEL_KEYS if k in f["model"].attrs}
    elif args.deck_dims:
        try:
            dims = {k: int(v) for k, v in (item.split("=", 1) for item in args.deck_dims.split(","))}
        except ValueError:
            fail(f"--deck-dims {args.deck_dims}: expected KEY=VALUE,... with whole numbers (dim=32,num_heads=2,...)")
    else:
        fail(f"{args.checkpoint}: no /model attributes (not an aldit checkpoint): give --deck-dims")
    if args.family == "hunyuanvideo15":
        dims.update({k: int(f["model"].attrs[k]) for k in HUNYUAN_KEYS if k in f["model"].attrs})
    missing = [k for k in wan_names.MODEL_KEYS + (HUNYUAN_KEYS if args.family == "hunyuanvideo15" else ()) if k not in dims]
    if missing:
        fail(f"{args.checkpoint}: model dims lack {', '.join(missing)}")
    deck = f.attrs.get("deck", "")
    deck = deck.decode() if isinstance(deck, bytes) else str(deck)
    found = re.search(r"^\s*text_padding\s*=\s*(\w+)", deck, re.M)
    has_ema = "ema" in f and isinstance(f["ema"], h5py.Group)
    if args.ema and not has_ema:
        fail(f"{args.checkpoint}: --ema, but the file has no /ema group (its run kept no EMA: [train] ema_decay = off)")
    group = f["ema"] if has_ema and not args.no_ema else f
    source = f"{args.checkpoint}:/ema" if group is not f else args.checkpoint
    state = {name: read_tensor(item, source, name, args.family) for name, item in group.items()
             if isinstance(item, h5py.Dataset)}
    return state, dims, found.group(1) if found else None, source


def build_transformer(state, dims, dtype):
    import torch
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(**wan_names.diffusers_config(dims))
    try:
        diffusers_state = {}
        for name, values in state.items():
            try:
                diffusers_state[wan_names.wan_to_diffusers(name)] = torch.from_numpy(values)
            except KeyError:
                continue   # datasets the model does not have (as [model] init ignores them)
        model.load_state_dict(diffusers_state, strict=True)
    except RuntimeError as error:
        fail(f"the weights do not fit the model dims: {error}")
    return wan_names.wan_sinusoid_timesteps(model.to(dtype).eval())


HUNYUAN_KEYS = ("text_2_dim", "image_dim", "rope_axes_t")


def float64_sinusoid():
    """diffusers' Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0) in float64, as aldit computes it."""
    import torch

    class Sinusoid(torch.nn.Module):
        def forward(self, timesteps):
            half = 128
            frequency = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
            angle = timesteps.to(torch.float64)[:, None] * frequency.to(timesteps.device)[None]
            return torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1)

    return Sinusoid()


def build_hunyuan_transformer(state, dims, dtype):
    """HunyuanVideo15Transformer3DModel of the checkpoint's dims, its weights as saved (diffusers' names)."""
    import torch
    from diffusers import HunyuanVideo15Transformer3DModel

    head = dims["dim"] // dims["num_heads"]
    t = dims["rope_axes_t"]
    if dims["patch_h"] != dims["patch_w"] or dims["patch_t"] != 1 or dims["freq_dim"] != 256:
        fail(f"model dims {dims}: diffusers' HunyuanVideo15Transformer3DModel needs patch_t 1, patch_h = patch_w and "
             "freq_dim 256")
    model = HunyuanVideo15Transformer3DModel(
        in_channels=dims["in_dim"], out_channels=dims["out_dim"], num_attention_heads=dims["num_heads"],
        attention_head_dim=head, num_layers=dims["num_layers"], num_refiner_layers=2,
        mlp_ratio=dims["ffn_dim"] / dims["dim"], patch_size=dims["patch_h"], patch_size_t=1,
        text_embed_dim=dims["text_dim"], text_embed_2_dim=dims["text_2_dim"], image_embed_dim=dims["image_dim"],
        rope_axes_dim=(t, (head - t) // 2, (head - t) // 2))
    wanted = model.state_dict()
    loaded = {name: torch.from_numpy(values) for name, values in state.items() if name in wanted}
    try:
        model.load_state_dict(loaded, strict=True)
    except RuntimeError as error:
        fail(f"the weights do not fit the model dims: {error}")
    model.time_embed.time_proj = float64_sinusoid()
    model.context_embedder.time_text_embed.time_proj = float64_sinusoid()
    return model.to(dtype).eval()


def hunyuan_pipeline(args, transformer, dtype, device):
    """HunyuanVideo-1.5's diffusers pipeline (image-to-video with --image) around the transformer."""
    import torch
    from diffusers import (AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15ImageToVideoPipeline,
                           HunyuanVideo15Pipeline)
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLTextModel, SiglipVisionModel, T5EncoderModel

    load = {"local_files_only": True}
    parts = dict(
        tokenizer=AutoTokenizer.from_pretrained(args.tokenizer, **load),
        text_encoder=Qwen2_5_VLTextModel.from_pretrained(args.text_encoder, torch_dtype=dtype, **load),
        tokenizer_2=AutoTokenizer.from_pretrained(args.tokenizer_2, **load),
        text_encoder_2=T5EncoderModel.from_pretrained(args.text_encoder_2, torch_dtype=dtype, **load),
        vae=AutoencoderKLHunyuanVideo15.from_pretrained(args.vae, torch_dtype=torch.float32, **load),
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=args.shift),
        guider=ClassifierFreeGuidance(guidance_scale=args.guidance), transformer=transformer)
    if args.image:
        parts.update(image_encoder=SiglipVisionModel.from_pretrained(args.image_encoder, torch_dtype=dtype, **load),
                     feature_extractor=AutoImageProcessor.from_pretrained(args.feature_extractor, **load))
    pipe = (HunyuanVideo15ImageToVideoPipeline if args.image else HunyuanVideo15Pipeline)(**parts).to(device)
    pipe.prompt_template_encode_start_idx = args.qwen_crop_start
    return pipe


def hunyuan_frames(pipe, args, job):
    """One sample of HunyuanVideo-1.5's pipeline: uint8 frames [T, H, W, 3]."""
    import torch
    from diffusers.guiders import ClassifierFreeGuidance
    from PIL import Image

    pipe.guider = ClassifierFreeGuidance(guidance_scale=job["guidance"])
    if args.image:   # the pipeline sizes the video from the image (crop buckets of its target_size)
        extra = {"image": Image.open(args.image).convert("RGB")}
        if args.target_size:
            pipe.target_size = args.target_size
    else:
        extra = {"height": job["height"], "width": job["width"]}
    result = pipe(prompt=job["prompt"], negative_prompt=args.negative_prompt,
                  num_frames=job["frames"], num_inference_steps=job["steps"],
                  generator=torch.Generator(device="cpu").manual_seed(job["seed"]), output_type="np", **extra)
    return (np.clip(np.asarray(result.frames[0], np.float32), 0.0, 1.0) * 255.0).round().astype(np.uint8)


def save_wan(state, dims, folder):
    """Wan's official format: diffusion_pytorch_model.safetensors (Wan names, float32) and config.json."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    wanted = {name: torch.from_numpy(values).contiguous() for name, values in state.items()
              if name.split(".")[0] in {"patch_embedding", "text_embedding", "time_embedding", "time_projection",
                                        "blocks", "head"}}
    save_file(wanted, os.path.join(folder, "diffusion_pytorch_model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(wan_names.wan_config(dims), f, indent=2)


def prompt_embeddings(pipe, text, device, padding, text_len):
    """[1, L, D]: the prompt's umT5 embedding trimmed to its tokens (trim), or zero-padded to text_len (wan)."""
    import torch
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    tokens = pipe.tokenizer([prompt_clean(text)], padding="max_length", max_length=text_len, truncation=True,
                            add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    length = max(int(tokens.attention_mask.sum()), 1)
    with torch.no_grad():
        hidden = pipe.text_encoder(tokens.input_ids.to(device), tokens.attention_mask.to(device)).last_hidden_state
    hidden = hidden[:, :length]
    if padding == "wan":
        hidden = torch.cat([hidden, hidden.new_zeros(1, text_len - length, hidden.shape[2])], dim=1)
    return hidden


def write_mp4(frames, path, fps):
    """frames [T, H, W, 3] uint8 -> H.264 (or MPEG-4 part 2 where libx264 is missing) mp4 with PyAV."""
    import av

    with av.open(path + ".tmp.mp4", "w") as container:
        try:
            stream = container.add_stream("libx264", rate=fps)
        except Exception:
            stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    os.replace(path + ".tmp.mp4", path)


def write_grid(frames, path, most=16):
    """Up to `most` frames, evenly spaced, in a grid of at most 4 columns, as one PNG."""
    from PIL import Image

    picks = np.unique(np.linspace(0, len(frames) - 1, min(most, len(frames))).round().astype(int))
    columns = min(4, len(picks))
    rows = math.ceil(len(picks) / columns)
    height, width = frames.shape[1:3]
    grid = np.zeros((rows * height, columns * width, 3), np.uint8)
    for k, i in enumerate(picks):
        r, c = divmod(k, columns)
        grid[r * height:(r + 1) * height, c * width:(c + 1) * width] = frames[i]
    Image.fromarray(grid).save(path)
    return len(picks), grid.shape


def main():
    args = parse_args()
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanPipeline
    from diffusers.utils import logging as diffusers_logging
    from transformers import AutoTokenizer, UMT5EncoderModel

    diffusers_logging.set_verbosity_error()
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    state, dims, deck_padding, source = read_weights(args)
    if args.family == "hunyuanvideo15":
        return main_hunyuan(args, state, dims, source, dtype, device)
    padding = args.text_padding or deck_padding or "trim"
    if padding not in ("trim", "wan"):
        fail(f"{args.checkpoint}: the deck's text_padding is {padding}, not wan or trim")
    print(f"sample: weights {source} ({len(state)} tensors), model dims {dims}, text padding {padding}", file=sys.stderr)
    if args.save_wan:
        save_wan(state, dims, args.save_wan)
    transformer = build_transformer(state, dims, dtype)
    if args.save_diffusers:
        transformer.save_pretrained(args.save_diffusers)
    if args.scheduler == "unipc":
        scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                            num_train_timesteps=1000, flow_shift=args.shift)
    else:
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=args.shift)
    pipe = WanPipeline(
        tokenizer=AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True),
        text_encoder=UMT5EncoderModel.from_pretrained(args.text_encoder, local_files_only=True, torch_dtype=dtype),
        vae=AutoencoderKLWan.from_pretrained(args.vae, local_files_only=True, torch_dtype=torch.float32),
        scheduler=scheduler, transformer=transformer).to(device)
    negative = prompt_embeddings(pipe, args.negative_prompt, device, padding, dims["text_len"]).to(dtype)
    for job in args.jobs:
        positive = prompt_embeddings(pipe, job["prompt"], device, padding, dims["text_len"]).to(dtype)
        generator = torch.Generator(device="cpu").manual_seed(job["seed"])
        result = pipe(prompt_embeds=positive, negative_prompt_embeds=negative, height=job["height"],
                      width=job["width"], num_frames=job["frames"], num_inference_steps=job["steps"],
                      guidance_scale=job["guidance"], generator=generator, output_type="np",
                      max_sequence_length=dims["text_len"])
        frames = (np.clip(np.asarray(result.frames[0], np.float32), 0.0, 1.0) * 255.0).round().astype(np.uint8)
        out = job["out"]
        write_mp4(frames, out + ".mp4", args.fps)
        shown, shape = write_grid(frames, out + ".png")
        print(f"sample: wrote {out}.mp4 ({len(frames)} frames of {frames.shape[2]}x{frames.shape[1]}) and "
              f"{out}.png ({shown} frames, {shape[1]}x{shape[0]})", file=sys.stderr)
    return 0


def main_hunyuan(args, state, dims, source, dtype, device):
    if args.save_wan:
        fail("--save-wan: Wan's format holds a wan checkpoint only (this one is hunyuanvideo15)")
    print(f"sample: weights {source} ({len(state)} tensors), hunyuanvideo15 dims {dims}"
          f"{', image-to-video from ' + args.image if args.image else ''}", file=sys.stderr)
    transformer = build_hunyuan_transformer(state, dims, dtype)
    if args.save_diffusers:
        transformer.save_pretrained(args.save_diffusers)
    pipe = hunyuan_pipeline(args, transformer, dtype, device)
    for job in args.jobs:
        frames = hunyuan_frames(pipe, args, job)
        out = job["out"]
        write_mp4(frames, out + ".mp4", args.fps)
        shown, shape = write_grid(frames, out + ".png")
        print(f"sample: wrote {out}.mp4 ({len(frames)} frames of {frames.shape[2]}x{frames.shape[1]}) and "
              f"{out}.png ({shown} frames, {shape[1]}x{shape[0]})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
