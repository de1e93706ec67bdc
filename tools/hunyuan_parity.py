#!/usr/bin/env python3
"""hunyuan_parity.py — aldit's CPU forward (aldit-forward) against diffusers' HunyuanVideo15Transformer3DModel on the same random weights.

Builds a HunyuanVideo15Transformer3DModel of the given dims with random weights, writes them under diffusers'
names (aldit's hunyuanvideo15 family keeps them) to an HDF5 weights file, and runs both models on packed samples
of different video shapes, timesteps and caption lengths (Qwen, ByT5 and, for image-to-video, SigLIP rows and a
condition latent with its mask). aldit gets every sample at its own lengths in one packed micro-batch (varlen,
no text padding); diffusers runs

  - each sample alone (batch 1, every text row valid): the per-sample reference, and
  - the samples of one video shape and task together, each caption padded to the longest with the attention
    masks diffusers takes (its pipeline's way): the padded-and-masked forward,

and prints the largest relative error of each, max |aldit - diffusers| / max |diffusers| over the sample's output.
Exit status 1 when any exceeds --tolerance. The timestep sinusoids are computed in float64 on both sides.

    python3 tools/hunyuan_parity.py --aldit-forward ./aldit-forward [--dim 32 --layers 2 ...]

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

# (latent frames, height, width, Qwen tokens, ByT5 tokens, image tokens (0: text-to-video), sigma). Two groups
# share a video shape and task (for the padded forward): samples 0 and 1 (T2V, 1x4x4), 3 and 4 (I2V, 2x2x4).
SAMPLES = [(1, 4, 4, 5, 3, 0, 0.5), (1, 4, 4, 11, 0, 0, 0.03), (3, 6, 2, 1, 6, 0, 0.97),
           (2, 2, 4, 7, 2, 4, 0.2), (2, 2, 4, 3, 5, 4, 0.8)]
IMAGE_ROWS_T2V = 4   # diffusers always takes image rows: zeros and masked out for text-to-video


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--aldit-forward", default="./aldit-forward", help="the aldit-forward program")
    parser.add_argument("--dim", type=int, default=32, help="hidden size (heads x head dim)")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--mlp-ratio", type=int, default=4)
    parser.add_argument("--channels", type=int, default=4, help="latent channels out (in: 2 x this + 1)")
    parser.add_argument("--patch", type=int, default=1, help="spatial patch size (HunyuanVideo-1.5: 1)")
    parser.add_argument("--text-dim", type=int, default=12, help="Qwen embedding width")
    parser.add_argument("--text-2-dim", type=int, default=6, help="ByT5 embedding width")
    parser.add_argument("--image-dim", type=int, default=10, help="SigLIP embedding width")
    parser.add_argument("--rope-axes-t", type=int, default=4, help="head channels of the frame axis")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64",
                        help="precision of the diffusers reference (default float64)")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--perturb", metavar="NAME",
                        help="add 1e-3 to parameter NAME in aldit's copy only (to see the check fail)")
    parser.add_argument("--keep", metavar="DIR", help="keep the weights, input and output files in DIR")
    return parser.parse_args()


def head_dim(args):
    return args.dim // args.heads


def aldit_dims(args):
    return dict(family="hunyuanvideo15", text_padding="trim", dim=args.dim, ffn_dim=args.mlp_ratio * args.dim, num_heads=args.heads,
                num_layers=args.layers, in_dim=2 * args.channels + 1, out_dim=args.channels, patch_t=1,
                patch_h=args.patch, patch_w=args.patch, text_len=max(s[3] for s in SAMPLES), text_dim=args.text_dim,
                text_2_dim=args.text_2_dim, image_dim=args.image_dim, rope_axes_t=args.rope_axes_t, freq_dim=256,
                eps=1e-6)


class Float64Sinusoid(torch.nn.Module):
    """diffusers' Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0) computed in float64: [cos, sin]."""

    def forward(self, timesteps):
        half = 128
        frequency = torch.exp(-np.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
        angle = timesteps.to(torch.float64)[:, None] * frequency[None]
        return torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1)


def diffusers_config(dims):
    """HunyuanVideo15Transformer3DModel's config for aldit's [model] dims (aldit_dims' keys; also the training
    peer's, tests/bench/peer_train.py)."""
    hd, t = dims["dim"] // dims["num_heads"], dims["rope_axes_t"]
    if dims["patch_h"] != dims["patch_w"]:
        sys.exit(f"hunyuan_parity: patch_h {dims['patch_h']} and patch_w {dims['patch_w']} differ (diffusers has one)")
    return dict(in_channels=dims["in_dim"], out_channels=dims["out_dim"], num_attention_heads=dims["num_heads"],
                attention_head_dim=hd, num_layers=dims["num_layers"], num_refiner_layers=2,
                mlp_ratio=dims["ffn_dim"] / dims["dim"], patch_size=dims["patch_h"], patch_size_t=dims["patch_t"],
                text_embed_dim=dims["text_dim"], text_embed_2_dim=dims["text_2_dim"], image_embed_dim=dims["image_dim"],
                rope_axes_dim=(t, (hd - t) // 2, (hd - t) // 2))


def random_model(args):
    """Every parameter random: matrices ~ N(0, 1/fan_in), biases and the type embedding ~ N(0, 0.1^2), norm
    weights 1 + N(0, 0.1^2) (so that nothing is trivially zero)."""
    from diffusers import HunyuanVideo15Transformer3DModel
    from diffusers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    model = HunyuanVideo15Transformer3DModel(**diffusers_config(aldit_dims(args)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.ndim >= 2 and "cond_type_embed" not in name:
                p.normal_(0.0, 1.0 / np.sqrt(np.prod(p.shape[1:])))
            elif "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.1)
    model.time_embed.time_proj = Float64Sinusoid()
    model.context_embedder.time_text_embed.time_proj = Float64Sinusoid()
    return model.eval()


def write_weights(model, path, perturb=None):
    state = {k: v for k, v in model.state_dict().items()}
    if perturb is not None and perturb not in state:
        sys.exit(f"hunyuan_parity: --perturb {perturb}: no such parameter")
    with h5py.File(path, "w") as f:
        for name, tensor in state.items():
            values = tensor.detach().to(torch.float32).cpu().numpy()
            f.create_dataset(name, data=values + np.float32(1e-3) if name == perturb else values)


def make_samples(args, seed):
    """Per sample: the whole input [2C + 1, F, H, W] (x_t; for I2V the first frame's condition latent and its
    mask), Qwen, ByT5 and image rows, sigma."""
    rng = np.random.default_rng(seed)
    C = args.channels
    samples = []
    for frames, height, width, qwen, byt5, image, sigma in SAMPLES:
        x = np.zeros((2 * C + 1, frames, height, width), np.float32)
        x[:C] = rng.standard_normal((C, frames, height, width))
        if image:
            x[C:2 * C, 0] = rng.standard_normal((C, height, width))
            x[2 * C, 0] = 1.0
        samples.append(dict(x=x, qwen=rng.standard_normal((qwen, args.text_dim)).astype(np.float32),
                            byt5=rng.standard_normal((byt5, args.text_2_dim)).astype(np.float32),
                            image=rng.standard_normal((image, args.image_dim)).astype(np.float32),
                            sigma=np.float32(sigma)))
    return samples


def write_input(samples, path):
    with h5py.File(path, "w") as f:
        f["shapes"] = np.array([[*s["x"].shape[1:], len(s["qwen"]), len(s["byt5"]), len(s["image"])]
                                for s in samples], np.int64)
        f["latents"] = np.concatenate([s["x"].ravel() for s in samples])
        f["sigma"] = np.array([s["sigma"] for s in samples], np.float32)
        f["text"] = np.concatenate([s["qwen"].ravel() for s in samples])
        f["text_2"] = np.concatenate([s["byt5"].ravel() for s in samples])
        f["image"] = np.concatenate([s["image"].ravel() for s in samples])


def padded(rows_list, width):
    """Rows of each sample padded with zeros to the longest (at least 1 row), and the masks."""
    longest = max(1, max(len(r) for r in rows_list))
    values = np.zeros((len(rows_list), longest, width), np.float32)
    mask = np.zeros((len(rows_list), longest), np.int64)
    for i, rows in enumerate(rows_list):
        values[i, :len(rows)] = rows
        mask[i, :len(rows)] = 1
    return values, mask


def diffusers_forward(model, group, args, dtype):
    """One diffusers call on samples of one video shape and task, captions padded to the longest and masked."""
    qwen, qwen_mask = padded([s["qwen"] for s in group], args.text_dim)
    byt5, byt5_mask = padded([s["byt5"] for s in group], args.text_2_dim)
    if len(group[0]["image"]):
        image = np.stack([s["image"] for s in group])
    else:   # text-to-video: zero image rows, which diffusers masks out
        image = np.zeros((len(group), IMAGE_ROWS_T2V, args.image_dim), np.float32)
    # aldit's t = 1000 sigma in fp32, given in the reference's dtype (diffusers casts the sinusoid to it)
    timestep = torch.tensor([np.float32(1000.0) * s["sigma"] for s in group]).to(dtype)
    with torch.no_grad():
        out = model(hidden_states=torch.from_numpy(np.stack([s["x"] for s in group])).to(dtype), timestep=timestep,
                    encoder_hidden_states=torch.from_numpy(qwen).to(dtype),
                    encoder_attention_mask=torch.from_numpy(qwen_mask),
                    encoder_hidden_states_2=torch.from_numpy(byt5).to(dtype),
                    encoder_attention_mask_2=torch.from_numpy(byt5_mask),
                    image_embeds=torch.from_numpy(image).to(dtype), return_dict=False)[0]
    return [o.to(torch.float64).numpy() for o in out]


def groups_of(samples):
    """Indices of the samples that share a video shape and task (two or more)."""
    keys = {}
    for i, (frames, height, width, _, _, image, _) in enumerate(SAMPLES):
        keys.setdefault((frames, height, width, image > 0), []).append(i)
    return [ids for ids in keys.values() if len(ids) > 1]


def aldit_outputs(args, weights, inputs, output):
    overrides = [f"model.{key}={value}" for key, value in aldit_dims(args).items()]
    command = [args.aldit_forward, "--weights", weights, "--input", inputs, "--output", output, *overrides]
    result = subprocess.run(command, capture_output=True, text=True)
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        sys.exit(f"hunyuan_parity: {' '.join(command)} exited with status {result.returncode}")
    with h5py.File(output, "r") as f:
        flat, shapes = f["output"][()], f["shapes"][()]
    outputs, offset = [], 0
    for frames, height, width, *_ in shapes:
        n = args.channels * frames * height * width
        outputs.append(flat[offset:offset + n].reshape(args.channels, frames, height, width).astype(np.float64))
        offset += n
    return outputs


def relative_error(got, ref):
    if got.shape != ref.shape:
        sys.exit(f"hunyuan_parity: aldit output {got.shape}, diffusers {ref.shape}")
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def main():
    args = parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    work = args.keep or tempfile.mkdtemp(prefix="hunyuan-parity-")
    os.makedirs(work, exist_ok=True)
    weights, inputs, output = (os.path.join(work, n) for n in ("weights.h5", "input.h5", "output.h5"))
    model = random_model(args)
    write_weights(model, weights, args.perturb)
    model = model.to(dtype)
    samples = make_samples(args, args.seed + 1)
    write_input(samples, inputs)
    mine = aldit_outputs(args, weights, inputs, output)
    worst = 0.0
    for i, (s, got) in enumerate(zip(samples, mine)):
        error = relative_error(got, diffusers_forward(model, [s], args, dtype)[0])
        worst = max(worst, error)
        frames, height, width, qwen, byt5, image, sigma = SAMPLES[i]
        task = f"I2V, {image} image rows" if image else "T2V"
        print(f"sample {i}: latent {frames}x{height}x{width} sigma {sigma:g} {task}, Qwen {qwen} ByT5 {byt5} rows: "
              f"max |aldit - diffusers| / max |diffusers| = {error:.3g}")
    for ids in groups_of(samples):
        reference = diffusers_forward(model, [samples[i] for i in ids], args, dtype)
        for i, ref in zip(ids, reference):
            error = relative_error(mine[i], ref)
            worst = max(worst, error)
            print(f"padded batch {ids}, sample {i}: captions padded to the longest and masked in diffusers, packed in "
                  f"aldit: max |aldit - diffusers| / max |diffusers| = {error:.3g}")
    if not args.keep:
        for path in (weights, inputs, output):
            os.remove(path)
        os.rmdir(work)
    verdict = "ok" if worst <= args.tolerance else "FAILED"
    print(f"largest relative error {worst:.3g} (tolerance {args.tolerance:g}): {verdict}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
