#!/usr/bin/env python3
"""export_weights.py — an aldit checkpoint's weights (or their EMA) out as Wan's official and diffusers' safetensors.

    python3 tools/export_weights.py --checkpoint run/checkpoints/step_00010000.h5 --wan out/wan --diffusers out/diffusers

--wan DIR writes Wan's official format: DIR/diffusion_pytorch_model.safetensors (Wan's parameter names, float32)
and DIR/config.json for Wan's WanModel (what ComfyUI and Wan's own code load). --diffusers DIR writes the
diffusers model folder of WanTransformer3DModel (config.json, diffusion_pytorch_model.safetensors), which
WanTransformer3DModel.from_pretrained(DIR) and WanPipeline load. The weights are the checkpoint's own, bit for bit
(float32); with an /ema group ([train] ema_decay) its EMA weights unless --no-ema (--ema: an error where there is
none). A plain weights file without /model needs --deck-dims. Nothing is sampled: no VAE or text encoder is needed
(tools/sample.py --save-wan / --save-diffusers does the same beside a sample).

Needs torch, diffusers, safetensors, h5py and numpy (tools/requirements.txt).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sample   # noqa: E402  (the same folder: read_weights, save_wan, build_transformer)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--checkpoint", required=True, help="aldit checkpoint or Wan-named HDF5 weights")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--ema", action="store_true", help="the /ema weights; an error where the file has none")
    which.add_argument("--no-ema", action="store_true", help="the raw weights even where /ema exists")
    parser.add_argument("--deck-dims", metavar="KEY=VALUE,...", help="model dims for a file without /model")
    parser.add_argument("--wan", metavar="DIR", help="write Wan's official format here")
    parser.add_argument("--diffusers", metavar="DIR", help="write diffusers' WanTransformer3DModel folder here")
    args = parser.parse_args()
    if not args.wan and not args.diffusers:
        parser.error("give --wan DIR, --diffusers DIR or both")
    if not os.path.isfile(args.checkpoint):
        parser.error(f"--checkpoint {args.checkpoint}: no such file")
    for option, folder in (("--wan", args.wan), ("--diffusers", args.diffusers)):
        if folder:
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as error:
                parser.error(f"{option}: cannot make the folder {folder}: {error.strerror}")
    return args


def main():
    args = parse_args()
    import torch

    state, dims, _, source = sample.read_weights(args)
    if args.wan:
        sample.save_wan(state, dims, args.wan)
        print(f"export_weights: wrote Wan's format of {source} to {args.wan}", file=sys.stderr)
    if args.diffusers:
        sample.build_transformer(state, dims, torch.float32).save_pretrained(args.diffusers)
        print(f"export_weights: wrote diffusers' WanTransformer3DModel of {source} to {args.diffusers}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
