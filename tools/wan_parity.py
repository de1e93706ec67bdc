#!/usr/bin/env python3
"""wan_parity.py — aldit's CPU forward (aldit-forward) against diffusers' WanTransformer3DModel on the same random weights.

Builds a WanTransformer3DModel of the given dims with random weights, writes them under Wan's official
names (tools/wan_names.py) to an HDF5 weights file, runs both models on several packed samples of
different shapes, timesteps and caption lengths, and prints the largest relative error of each sample,
max |aldit - diffusers| / max |diffusers| over its output. Exit status 1 when any exceeds --tolerance.

Captions: Wan pads every caption with zeros to text_len and attends to all text_len positions. Each
caption here has its own real length; diffusers gets it zero-padded to text_len. aldit-forward gets its
real rows and pads them itself ([model] text_padding = wan, the default, as training does), or with
--text-padding trim gets the padded rows (text_len = the full length in its input file) and attends to
exactly those. The timestep sinusoid is Wan's float64 one on both sides (wan_names.py).

    python3 tools/wan_parity.py --aldit-forward ./aldit-forward [--dim 32 --layers 2 ...]

Needs torch, diffusers and h5py.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wan_names  # noqa: E402

# (latent frames, height, width, real caption tokens, sigma): images and videos, odd grid sizes, short and
# full captions, timesteps near both ends.
SAMPLES = [(1, 4, 4, 3, 0.5), (2, 4, 6, 7, 0.03), (3, 6, 4, 16, 0.97), (1, 8, 2, 1, 1.0), (5, 2, 2, 11, 0.0)]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--aldit-forward", default="./aldit-forward", help="the aldit-forward program")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--ffn-dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--channels", type=int, default=16, help="latent channels in and out")
    parser.add_argument("--text-len", type=int, default=16, help="captions are zero-padded to this")
    parser.add_argument("--text-dim", type=int, default=24)
    parser.add_argument("--freq-dim", type=int, default=32)
    parser.add_argument("--no-cross-attn-norm", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64",
                        help="precision of the diffusers reference (default float64)")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--diffusers-sinusoid", action="store_true",
                        help="keep diffusers' float32 timestep sinusoid instead of Wan's float64 one")
    parser.add_argument("--perturb", metavar="NAME",
                        help="add 1e-3 to Wan parameter NAME in aldit's copy only (to see the check fail)")
    parser.add_argument("--text-padding", choices=("wan", "trim"), default="wan",
                        help="wan: aldit-forward gets each caption's real rows and pads them itself ([model] "
                        "text_padding = wan); trim: it gets them already zero-padded to text_len")
    parser.add_argument("--keep", metavar="DIR", help="keep the weights, input and output files in DIR")
    return parser.parse_args()


def model_dims(args):
    return dict(dim=args.dim, ffn_dim=args.ffn_dim, num_heads=args.heads, num_layers=args.layers,
                in_dim=args.channels, out_dim=args.channels, patch_t=1, patch_h=2, patch_w=2,
                text_len=args.text_len, text_dim=args.text_dim, freq_dim=args.freq_dim, qk_norm=1,
                cross_attn_norm=0 if args.no_cross_attn_norm else 1)


def random_model(dims, seed, wan_sinusoid=True):
    """A WanTransformer3DModel with every parameter random: linear weights ~ N(0, 1/fan_in), biases and
    modulation tables ~ N(0, 0.1^2), norm weights 1 + N(0, 0.1^2) (so that nothing is trivially zero)."""
    from diffusers import WanTransformer3DModel
    from diffusers.utils import logging

    logging.set_verbosity_error()   # not the cast-to-float64 advice: the reference is meant to be float64
    torch.manual_seed(seed)
    model = WanTransformer3DModel(**wan_names.diffusers_config(dims))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.ndim >= 2:
                p.normal_(0.0, 1.0 / np.sqrt(np.prod(p.shape[1:])))
            elif "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.1)
    return wan_names.wan_sinusoid_timesteps(model.eval()) if wan_sinusoid else model.eval()


def write_weights(model, path, perturb=None):
    """The model's weights under Wan's names, float32, one dataset each at the root ([model] init's format)."""
    state = wan_names.rename_state(model.state_dict(), to_diffusers=False)
    if perturb is not None and perturb not in state:
        sys.exit(f"wan_parity: --perturb {perturb}: no such parameter")
    with h5py.File(path, "w") as f:
        for name, tensor in state.items():
            values = tensor.detach().to(torch.float32).cpu().numpy()
            f.create_dataset(name, data=values + np.float32(1e-3) if name == perturb else values)


def make_samples(dims, seed):
    rng = np.random.default_rng(seed)
    samples = []
    for frames, height, width, caption, sigma in SAMPLES:
        latent = rng.standard_normal((dims["in_dim"], frames, height, width)).astype(np.float32)
        text = np.zeros((dims["text_len"], dims["text_dim"]), np.float32)   # Wan's zero padding to text_len
        text[:caption] = rng.standard_normal((caption, dims["text_dim"]))
        samples.append((latent, text, np.float32(sigma)))
    return samples


def write_input(samples, path, padded):
    """aldit-forward's input: each caption zero-padded to text_len (padded) or its real rows only."""
    texts = [text if padded else text[:caption] for (_, text, _), (*_, caption, _) in zip(samples, SAMPLES)]
    with h5py.File(path, "w") as f:
        f["shapes"] = np.array([[*s[0].shape[1:], t.shape[0]] for s, t in zip(samples, texts)], np.int64)
        f["latents"] = np.concatenate([s[0].ravel() for s in samples])
        f["sigma"] = np.array([s[2] for s in samples], np.float32)
        f["text"] = np.concatenate([t.ravel() for t in texts])


def diffusers_outputs(model, samples, dtype):
    model = model.to(dtype)
    outputs = []
    with torch.no_grad():
        for latent, text, sigma in samples:
            timestep = torch.tensor([np.float32(1000.0) * sigma])   # aldit's t = 1000 sigma in fp32
            out = model(hidden_states=torch.from_numpy(latent)[None].to(dtype), timestep=timestep,
                        encoder_hidden_states=torch.from_numpy(text)[None].to(dtype), return_dict=False)[0]
            outputs.append(out[0].to(torch.float64).numpy())
    return outputs


def aldit_outputs(args, dims, weights, inputs, output):
    overrides = [f"model.{key}={value}" for key, value in dims.items()] + [f"model.text_padding={args.text_padding}"]
    command = [args.aldit_forward, "--weights", weights, "--input", inputs, "--output", output, "--self-check",
               *overrides]
    result = subprocess.run(command, capture_output=True, text=True)
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        sys.exit(f"wan_parity: {' '.join(command)} exited with status {result.returncode}")
    with h5py.File(output, "r") as f:
        flat, shapes = f["output"][()], f["shapes"][()]
    outputs, offset = [], 0
    for frames, height, width, _ in shapes:
        n = dims["out_dim"] * frames * height * width
        outputs.append(flat[offset:offset + n].reshape(dims["out_dim"], frames, height, width).astype(np.float64))
        offset += n
    return outputs


def main():
    args = parse_args()
    dims = model_dims(args)
    torch.set_num_threads(1)
    work = args.keep or tempfile.mkdtemp(prefix="wan-parity-")
    os.makedirs(work, exist_ok=True)
    weights, inputs, output = (os.path.join(work, n) for n in ("weights.h5", "input.h5", "output.h5"))
    model = random_model(dims, args.seed, wan_sinusoid=not args.diffusers_sinusoid)
    write_weights(model, weights, args.perturb)
    samples = make_samples(dims, args.seed + 1)
    write_input(samples, inputs, padded=args.text_padding == "trim")
    reference = diffusers_outputs(model, samples, getattr(torch, args.dtype))
    mine = aldit_outputs(args, dims, weights, inputs, output)
    worst = 0.0
    for i, ((latent, _, sigma), ref, got) in enumerate(zip(samples, reference, mine)):
        if ref.shape != got.shape:
            sys.exit(f"wan_parity: sample {i}: aldit output {got.shape}, diffusers {ref.shape}")
        error = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        worst = max(worst, error)
        caption = SAMPLES[i][3]
        print(f"sample {i}: latent {list(latent.shape)} sigma {float(sigma):g} caption {caption}/{dims['text_len']} "
              f"tokens: max |aldit - diffusers| / max |diffusers| = {error:.3g}")
    if not args.keep:
        for path in (weights, inputs, output):
            os.remove(path)
        os.rmdir(work)
    verdict = "ok" if worst <= args.tolerance else "FAILED"
    print(f"largest relative error {worst:.3g} (tolerance {args.tolerance:g}): {verdict}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
