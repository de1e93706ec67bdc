#!/usr/bin/env python3
"""prepare_timing.py — time tools/prepare_store.py per clip with Wan 2.1's full-size components (random weights).

    python3 tests/bench/prepare_timing.py DIR [--clips N] [--images N]

Builds in DIR a Wan 2.1 VAE (diffusers' AutoencoderKLWan with its default, i.e. Wan 2.1's, dims) and a umT5-XXL
encoder (transformers' UMT5EncoderModel: d_model 4096, 24 layers, 64 heads, d_ff 10240, vocabulary 256384), both
random-initialised (no download: the timing depends on the shapes, not on the values), a word-level tokenizer,
N captioned 81-frame 480x832 clips (JPEG frame folders) and N 480x832 images; then runs prepare_store.py into
stores with a length spec of those two buckets (clips, then images), and prints one JSON line with what
prepare_store.py reports: the seconds to load the models, the first sample's (kernel warm-up) and each one's after.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def build_models(folder, tiny):
    import torch
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config, UMT5EncoderModel
    import tiny_wan
    tiny_wan.models(os.path.join(folder, "tiny"))   # its tokenizer (a word per token, as long as real captions)
    tokenizer_dir = os.path.join(folder, "tiny", "tokenizer")
    if tiny:   # a smoke test of this script: the tiny components stand in
        for name in ("vae", "text_encoder"):
            if not os.path.exists(os.path.join(folder, name)):
                os.symlink(os.path.join(folder, "tiny", name), os.path.join(folder, name))
        return tokenizer_dir
    torch.manual_seed(0)
    AutoencoderKLWan().save_pretrained(os.path.join(folder, "vae"))
    config = UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                        relative_attention_num_buckets=32, relative_attention_max_distance=128,
                        feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        encoder = UMT5EncoderModel(config).to(torch.bfloat16)
    encoder.save_pretrained(os.path.join(folder, "text_encoder"))
    del encoder
    return tokenizer_dir


def build_media(folder, clips, images, height, width):
    import numpy as np
    from PIL import Image
    import tiny_wan
    os.makedirs(folder, exist_ok=True)
    words = tiny_wan.WORDS
    for c in range(clips):
        frames_dir = os.path.join(folder, f"clip{c:03d}")
        os.makedirs(frames_dir, exist_ok=True)
        for i, frame in enumerate(tiny_wan.pattern(81, height, width, c)):
            Image.fromarray(frame).save(os.path.join(frames_dir, f"{i:03d}.jpg"), quality=90)
        with open(frames_dir + ".txt", "w") as f:
            f.write(" ".join(words[(c + k) % len(words)] for k in range(60)))
    for i in range(images):
        Image.fromarray(tiny_wan.pattern(1, height, width, 100 + i)[0]).save(os.path.join(folder, f"image{i:03d}.png"))
        with open(os.path.join(folder, f"image{i:03d}.txt"), "w") as f:
            f.write(" ".join(words[(i + k) % len(words)] for k in range(40)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="tiny components and 64x64 media (checks the script only)")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    started = time.time()
    height, width = (64, 64) if args.tiny else (480, 832)
    tokenizer = build_models(args.dir, args.tiny)
    build_media(os.path.join(args.dir, "media"), args.clips, args.images, height, width)
    setup_s = time.time() - started
    lengths = os.path.join(args.dir, "timing.lengths")
    with open(lengths, "w") as f:
        f.write(f"1 21 {height // 8} {width // 8}\n1 1 {height // 8} {width // 8}\n")   # 81-frame clips, images
    tool = os.path.join(HERE, "..", "..", "tools", "prepare_store.py")

    def run(kind, count):
        """prepare_store.py over the first `count` media of a kind: its timing line."""
        media = os.path.join(args.dir, f"media_{kind}_{count}")
        os.makedirs(media, exist_ok=True)
        names = sorted(n for n in os.listdir(os.path.join(args.dir, "media")) if n.startswith(kind))
        stems = sorted({os.path.splitext(n)[0] for n in names})[:count]
        for name in names:
            if os.path.splitext(name)[0] in stems and not os.path.exists(os.path.join(media, name)):
                os.symlink(os.path.join(args.dir, "media", name), os.path.join(media, name))
        command = [sys.executable, tool, "--media", media, "--out", os.path.join(args.dir, f"store_{kind}_{count}.h5"),
                   "--vae", os.path.join(args.dir, "vae"), "--text-encoder", os.path.join(args.dir, "text_encoder"),
                   "--tokenizer", tokenizer, "--lengths", lengths]
        done = subprocess.run(command, check=True, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(done.stderr)
        found = re.findall(r"(\d+) samples encoded, ([0-9.]+) s the first, ([0-9.]+) s each after it", done.stderr)
        loaded = re.findall(r"models loaded in ([0-9.]+) s", done.stderr)
        if not found:
            raise SystemExit(f"prepare_timing: no timing line from prepare_store.py for {kind}")
        return {"samples": int(found[0][0]), "first_s": float(found[0][1]), "s_each": float(found[0][2]),
                "load_s": float(loaded[0]) if loaded else None}

    result = {"setup_s": round(setup_s, 1)}
    for kind, count in (("clip", args.clips), ("image", args.images)):
        result[kind] = run(kind, count)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
