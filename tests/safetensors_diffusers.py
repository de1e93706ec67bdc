#!/usr/bin/env python3
"""safetensors_diffusers.py — the diffusers side of tests/safetensors_diffusers.sh (aldit-export's folders in diffusers).

    forward DIR INPUT OUTPUT --text-len N   WanTransformer3DModel.from_pretrained(DIR) on aldit-forward's INPUT (captions
                                            zero-padded to N, Wan's float64 timestep sinusoid): its output against aldit's
                                            OUTPUT, largest relative error per sample; exit 1 above --tolerance
    resave DIR OUT [--shard-kb K]           from_pretrained(DIR).save_pretrained(OUT) as safetensors (sharded when K given)
    same FILE H5                            the tensors of safetensors FILE are those of HDF5 weights H5, names and values
                                            equal to the bit (exit 1 otherwise)

Needs torch, diffusers, safetensors, h5py and numpy.
"""
import argparse
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import wan_names  # noqa: E402


def load(folder):
    from diffusers import WanTransformer3DModel
    from diffusers.utils import logging

    logging.set_verbosity_error()
    model = WanTransformer3DModel.from_pretrained(folder, torch_dtype=torch.float32)
    return wan_names.wan_sinusoid_timesteps(model.eval())


def forward(args):
    model = load(args.folder).to(torch.float64)
    with h5py.File(args.input, "r") as f:
        shapes, latents, sigma, text = f["shapes"][()], f["latents"][()], f["sigma"][()], f["text"][()]
    with h5py.File(args.output, "r") as f:
        flat = f["output"][()]
    channels = model.config.in_channels
    text_dim = model.config.text_dim
    worst, latent_at, text_at, out_at = 0.0, 0, 0, 0
    for i, (frames, height, width, caption) in enumerate(shapes):
        n = channels * frames * height * width
        latent = latents[latent_at:latent_at + n].reshape(channels, frames, height, width)
        padded = np.zeros((args.text_len, text_dim), np.float64)
        padded[:caption] = text[text_at:text_at + caption * text_dim].reshape(caption, text_dim)
        n_out = model.config.out_channels * frames * height * width
        mine = flat[out_at:out_at + n_out].reshape(model.config.out_channels, frames, height, width)
        latent_at, text_at, out_at = latent_at + n, text_at + caption * text_dim, out_at + n_out
        with torch.no_grad():
            ref = model(hidden_states=torch.from_numpy(latent)[None].double(),
                        timestep=torch.tensor([np.float32(1000.0) * sigma[i]]),
                        encoder_hidden_states=torch.from_numpy(padded)[None], return_dict=False)[0][0].numpy()
        error = float(np.max(np.abs(mine - ref)) / np.max(np.abs(ref)))
        worst = max(worst, error)
        print(f"sample {i}: max |aldit - diffusers from_pretrained| / max |diffusers| = {error:.3g}")
    print(f"largest relative error {worst:.3g} (tolerance {args.tolerance:g})")
    return 0 if worst <= args.tolerance else 1


def resave(args):
    model = load(args.folder)
    shard = f"{args.shard_kb}KB" if args.shard_kb else "10GB"
    model.save_pretrained(args.out, safe_serialization=True, max_shard_size=shard)
    print("\n".join(sorted(os.listdir(args.out))))
    return 0


def same(args):
    from safetensors.numpy import load_file

    mine = load_file(args.file)
    with h5py.File(args.h5, "r") as f:
        theirs = {name: item[()] for name, item in f.items() if isinstance(item, h5py.Dataset)}
    if sorted(mine) != sorted(theirs):
        print(f"names differ: only in {args.file}: {sorted(set(mine) - set(theirs))[:5]}, "
              f"only in {args.h5}: {sorted(set(theirs) - set(mine))[:5]}")
        return 1
    for name, values in mine.items():
        if values.dtype != np.float32 or values.shape != theirs[name].shape or \
                values.tobytes() != theirs[name].astype(np.float32).tobytes():
            print(f"{name}: {values.dtype} {values.shape} differs from the HDF5 file's")
            return 1
    print(f"{len(mine)} tensors equal to the bit")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("forward")
    p.add_argument("folder")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--text-len", type=int, required=True)
    p.add_argument("--tolerance", type=float, default=1e-5)
    p = sub.add_parser("resave")
    p.add_argument("folder")
    p.add_argument("out")
    p.add_argument("--shard-kb", type=int)
    p = sub.add_parser("same")
    p.add_argument("file")
    p.add_argument("h5")
    args = parser.parse_args()
    torch.set_num_threads(1)
    return {"forward": forward, "resave": resave, "same": same}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
