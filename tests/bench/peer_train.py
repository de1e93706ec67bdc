#!/usr/bin/env python3
"""peer_train.py — aldit's training peer: the same model trained the way a good PyTorch user would, over the same
store and samples as an aldit run, timed; one JSON line with samples/s, tokens/s, model TFLOP/s and peak memory.

    python3 tests/bench/peer_train.py --deck DECK [section.key=value ...] [--device cuda|cpu]
        [--bucket-tokens 76032] [--compile blocks|model|none] [--checkpoint auto|none|all|N]
        [--attention-backend NAME] [--joint-masks] [--json FILE]

The model, by the deck's [model] family: diffusers' WanTransformer3DModel with the deck's [model] dims
(tools/wan_names.py's config), or (family = hunyuanvideo15) diffusers' HunyuanVideo15Transformer3DModel
(tests/bench/peer_mmdit.py: its draws, buckets and inputs); fp32 parameters under bf16 autocast, fused AdamW (the
deck's lr, betas, eps, weight decay; aldit's schedule: linear warmup over train.warmup_steps, then cosine to
min_lr at the epoch's last step, or constant, by the peer's own step count), the deck's grad_clip and its
train.nonfinite policy (error: stop at the first non-finite loss or gradient norm, naming the step and its batch;
skip: leave the weights unchanged on such a step and count it), torch.compile on each transformer block
(regional compilation, diffusers' compile_repeated_blocks; --compile model compiles the whole model). Data: the
deck's store read with h5py as docs/store.md defines it, every sample once (one epoch, as the aldit run over the
same store), held on the device (with the store's caption sources, ByT5 and SigLIP rows, for hunyuanvideo15); Wan's
captions zero-padded to text_len as [model] text_padding = wan does. Batches: Open-Sora-style buckets, samples of
one shape (frames x height x width; hunyuanvideo15: and task), B = floor(bucket_tokens / S) per batch
(hunyuanvideo15: / (S + text_len), the joint length of a sample with the longest caption; the last batch of a
bucket holds the rest), the batches shuffled with run.seed; one optimizer step per batch. Each sample
(Wan; hunyuanvideo15: peer_mmdit.py): sigma = shift u / (1 + (shift - 1) u), u uniform (aldit's timestep
distribution, shift = train.timestep_shift), x_t = (1 - sigma) x0 + sigma noise, timestep 1000 sigma, loss = the
mean square error against noise - x0 (the batch's samples weigh alike, as in aldit's step).

Activation checkpointing only where memory needs it (--checkpoint auto): before the timed epoch every batch shape
runs once (compiling it; its gradients are dropped), largest first, each from the previous shape's count of
checkpointed blocks less L/4, with L/4 more each time it runs out of memory; the timed epoch uses the count that
fitted per shape (none, all or N: that many for every shape). Model FLOPs per sample are aldit's
(train_table.py: 3x the forward's GEMM and attention FLOPs; hunyuanvideo15 by the joint length N = S + L with the
sample's Qwen, ByT5 and, as image-to-video, SigLIP rows). --attention-backend names a diffusers attention backend
(set_attention_backend, e.g. flash or _native_cudnn; default: diffusers' own, PyTorch's SDPA). hunyuanvideo15's
attentions take key masks, every valid row's result unchanged (peer_mmdit.py says why); --joint-masks keeps
diffusers' own [B, 1, N, N] masks. Peak memory:
torch.cuda.max_memory_reserved over the timed epoch (the dataset on the device included, also given alone); on the
CPU the process's peak resident set.
"""
import argparse
import gc
import json
import math
import os
import random
import resource
import sys
import time

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import train_table  # noqa: E402  (the deck, aldit's FLOP count)
import wan_names  # noqa: E402  (WanTransformer3DModel's config for aldit's dims)

GIB = 1024.0 ** 3


def fail(message):
    print(f"peer_train.py: {message}", file=sys.stderr)
    sys.exit(2)


def as_float32(values, dtype_name, where):
    """A stored array as float32 (docs/store.md: bf16 = uint16 bit patterns, f16, f32)."""
    if dtype_name == "bf16":
        if values.dtype != np.uint16:
            fail(f"{where}: latent/text dtype bf16 needs uint16 values, found {values.dtype}")
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


def text_attr(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def load_store(deck, dims, latent_channels, device):
    """Every sample of the store on `device`: a list of dicts (shape, tokens, latent [C, F, H, W], text [L, D],
    text_2 [G, D2] and image [I, D3], of 0 rows where the store has no caption sources)."""
    path = deck["data.store"]
    if not path:
        fail("the deck names no store (data.store)")
    samples = []
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        fail(f"{path}: {e}")
    with f:
        version = int(f.attrs.get("aldit_store_version", -1))
        if version != 1:
            fail(f"{path}: store format version {version}, this peer reads version 1")
        latent_dtype, text_dtype = text_attr(f.attrs["latent_dtype"]).strip(), text_attr(f.attrs["text_dtype"]).strip()
        if int(f.attrs["latent_channels"]) != latent_channels or int(f.attrs["text_dim"]) != dims["text_dim"]:
            fail(f"{path}: latent_channels {int(f.attrs['latent_channels'])} and text_dim {int(f.attrs['text_dim'])} "
                 f"differ from the deck's {latent_channels} and text_dim {dims['text_dim']}")
        index, latents, texts = f["index"][:], f["latents"], f["text"]
        # the caption sources (docs/store.md), which a Wan run ignores
        has_sources = "index_sources" in f and dims["family"] == "hunyuanvideo15"
        sources = load_sources(f, dims, device) if has_sources else None
        for sample, (channels, frames, height, width, text_len, latent_at, text_at, _) in enumerate(index):
            n_latent = int(channels * frames * height * width)
            latent = as_float32(latents[latent_at:latent_at + n_latent], latent_dtype, f"{path} sample {sample}")
            text = as_float32(texts[text_at:text_at + int(text_len) * dims["text_dim"]], text_dtype,
                              f"{path} sample {sample}")
            shape = (int(frames), int(height), int(width))
            if frames % dims["patch_t"] or height % dims["patch_h"] or width % dims["patch_w"]:
                fail(f"{path}: sample {sample}: shape {shape} is not a multiple of the patch")
            tokens = frames // dims["patch_t"] * (height // dims["patch_h"]) * (width // dims["patch_w"])
            samples.append({"id": sample, "shape": shape, "tokens": int(tokens), "text_len": int(text_len),
                            "latent": torch.from_numpy(latent.reshape(int(channels), *shape)).to(device),
                            "text": torch.from_numpy(text.reshape(int(text_len), dims["text_dim"])).to(device)})
            samples[-1].update(sources(sample) if sources else {
                "text_2": torch.zeros(0, dims["text_2_dim"], device=device),
                "image": torch.zeros(0, dims["image_dim"], device=device)})
    return samples


def load_sources(f, dims, device):
    """A reader of sample i's caption sources (docs/store.md: /text_2, /image, /index_sources) as {text_2, image}."""
    rows = f["index_sources"][:]
    if int(f.attrs["text_2_dim"]) != dims["text_2_dim"] or int(f.attrs["image_dim"]) != dims["image_dim"]:
        fail(f"{f.filename}: text_2_dim {int(f.attrs['text_2_dim'])} and image_dim {int(f.attrs['image_dim'])} differ "
             f"from the deck's {dims['text_2_dim']} and {dims['image_dim']}")
    kinds = {name: (f[name], text_attr(f.attrs[f"{name}_dtype"]).strip(), dims[f"{name}_dim"])
             for name in ("text_2", "image")}

    def read(i):
        out = {}
        for name, (n, at) in (("text_2", rows[i][0:2]), ("image", rows[i][2:4])):
            data, dtype, width = kinds[name]
            values = as_float32(data[int(at):int(at) + int(n) * width], dtype, f"{f.filename} sample {i} /{name}")
            out[name] = torch.from_numpy(values.reshape(int(n), width)).to(device)
        return out
    return read


class WanFamily:
    """WanTransformer3DModel: captions zero-padded to text_len, sigma drawn by torch, buckets by shape."""
    name = "diffusers WanTransformer3DModel"

    def __init__(self, deck, dims, device):
        self.deck, self.dims, self.device = deck, dims, device
        self.shift, self.text_len = float(deck["train.timestep_shift"]), dims["text_len"]

    def latent_channels(self):
        return self.dims["in_dim"]

    def check(self, deck):
        if deck["model.text_padding"] != "wan":
            return ("model.text_padding = trim: diffusers' model attends to every text row it is given; the peer "
                    "pads captions to text_len (text_padding = wan)")
        return None

    def build(self):
        from diffusers import WanTransformer3DModel

        return WanTransformer3DModel(**wan_names.diffusers_config(self.dims, eps=float(self.deck["model.eps"])))

    @staticmethod
    def blocks(model):
        return model.blocks

    @staticmethod
    def set_blocks(model, blocks):
        model.blocks = blocks

    def prepare(self, samples):
        self.samples = samples
        for s in samples:
            s["bucket"], s["bucket_rows"] = s["shape"], s["tokens"]
            s["text_rows"] = train_table.text_rows(self.deck, s["text_len"])

    def sigmas(self, batch, generator):
        u = torch.rand(len(batch), device=self.device, generator=generator, dtype=torch.float64)
        return (self.shift * u / (1.0 + (self.shift - 1.0) * u)).float()

    def forward(self, model, batch, x_t, x0, sigma):
        text = torch.zeros(len(batch), self.text_len, self.dims["text_dim"], device=self.device)
        for row, i in enumerate(batch):   # text_padding = wan: zero rows after the caption
            caption = self.samples[i]["text"][:self.text_len]
            text[row, :caption.shape[0]] = caption
        return model(hidden_states=x_t, timestep=1000.0 * sigma, encoder_hidden_states=text, return_dict=False)[0]


def family_of(deck, dims, device):
    if dims["family"] == "hunyuanvideo15":
        import peer_mmdit

        return peer_mmdit.HunyuanFamily(deck, dims, device)
    return WanFamily(deck, dims, device)


def bucket_batches(samples, bucket_tokens, seed):
    """Open-Sora-style buckets: samples of one bucket (the family's: shape, and task), B = max(1, bucket_tokens //
    rows) per batch (rows: S, or S + text_len where the text joins the attention), batches shuffled."""
    rng = random.Random(seed)
    by_shape = {}
    for i, sample in enumerate(samples):
        by_shape.setdefault(sample["bucket"], []).append(i)
    batches = []
    for shape in sorted(by_shape):
        members = by_shape[shape]
        rng.shuffle(members)
        size = max(1, bucket_tokens // samples[members[0]]["bucket_rows"])
        batches += [members[k:k + size] for k in range(0, len(members), size)]
    rng.shuffle(batches)
    return batches


class Checkpointable(torch.nn.Module):
    """A transformer block that recomputes its activations in the backward while `checkpoint` is set."""

    def __init__(self, block):
        super().__init__()
        self.block = block
        self.checkpoint = False

    def forward(self, *args):
        if self.checkpoint and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self.block, *args, use_reentrant=False)
        return self.block(*args)


def build_model(family, deck, device, compile_mode, attention_backend, joint_masks=False):
    from diffusers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(int(deck["run.seed"]))
    model = family.build(joint_masks=True) if joint_masks else family.build()
    if attention_backend:
        model.set_attention_backend(attention_backend)
    family.set_blocks(model, torch.nn.ModuleList(Checkpointable(block) for block in family.blocks(model)))
    model.to(device).train()
    if compile_mode != "none":
        for name in ("cache_size_limit", "recompile_limit"):   # 2 graphs (checkpointed or not) x shapes, per block
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)
        if compile_mode == "blocks":
            for block in family.blocks(model):
                block.compile()
        else:
            model.compile()
    return model


def scheduled_lr(deck, step, total_steps):
    """aldit's learning rate of 1-based optimizer step `step` of `total_steps` (src/model/optim.c's optim_lr)."""
    peak, floor_lr = float(deck["train.lr"]), float(deck["train.min_lr"])
    warmup = int(deck["train.warmup_steps"])
    if warmup > 0 and step <= warmup:
        return peak * step / warmup
    if deck["train.lr_schedule"] == "constant":
        return peak
    decay_steps = total_steps - warmup
    if decay_steps <= 0 or step >= total_steps:
        return floor_lr
    return floor_lr + 0.5 * (peak - floor_lr) * (1.0 + math.cos(math.pi * (step - warmup) / decay_steps))


def make_optimizer(model, deck, device):
    options = dict(lr=float(deck["train.lr"]), betas=(float(deck["train.beta1"]), float(deck["train.beta2"])),
                   eps=float(deck["train.adam_eps"]), weight_decay=float(deck["train.weight_decay"]))
    try:
        return torch.optim.AdamW(model.parameters(), fused=True, **options), "fused"
    except (RuntimeError, ValueError):   # a build without the fused kernel for this device
        return torch.optim.AdamW(model.parameters(), foreach=True, **options), "foreach"


class Trainer:
    def __init__(self, family, model, optimizer, samples, deck, device):
        self.family, self.model, self.optimizer, self.samples, self.device = family, model, optimizer, samples, device
        self.grad_clip = float(deck["train.grad_clip"])
        self.skip_nonfinite = deck["train.nonfinite"] == "skip"
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(deck["run.seed"]) + 1)
        self.autocast = torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)

    def set_checkpointing(self, n_blocks):
        for i, block in enumerate(self.family.blocks(self.model)):
            block.checkpoint = i < n_blocks

    def loss(self, batch):
        """The batch's flow-matching loss (fp32 scalar)."""
        x0 = torch.stack([self.samples[i]["latent"] for i in batch])
        sigma = self.family.sigmas(batch, self.generator)
        noise = torch.randn(x0.shape, device=self.device, generator=self.generator)
        s = sigma.view(-1, 1, 1, 1, 1)
        x_t = (1.0 - s) * x0 + s * noise
        with self.autocast:
            pred = self.family.forward(self.model, batch, x_t, x0, sigma)
        return torch.nn.functional.mse_loss(pred.float(), noise - x0)

    def step(self, batch, lr):
        """One optimizer step at learning rate lr: (loss, gradient norm, skipped), the first two as numbers (the
        step waits for its loss, as aldit's does, to apply the non-finite policy)."""
        loss = self.loss(batch)
        loss.backward()
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm, foreach=True)
        loss, norm = float(loss.detach()), float(norm)
        finite = math.isfinite(loss) and math.isfinite(norm)
        if finite or not self.skip_nonfinite:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, norm, not finite

    def warm(self, batch):
        """Forward and backward of one batch, gradients dropped (compiles the shape, probes its memory)."""
        self.loss(batch).backward()
        self.optimizer.zero_grad(set_to_none=True)
        synchronize(self.device)


def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def is_oom(error):
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error)


def plan_checkpointing(trainer, batches, mode, n_layers):
    """{batch shape: blocks checkpointed}, every shape warmed up once (largest first)."""
    shapes = {}
    for batch in batches:
        key = (len(batch), trainer.samples[batch[0]]["bucket"])
        shapes.setdefault(key, batch)
    order = sorted(shapes, key=lambda k: k[0] * trainer.samples[shapes[k][0]]["tokens"], reverse=True)
    step = max(1, n_layers // 4)
    plan, k = {}, 0
    for key in order:
        if mode == "auto":
            k = max(0, k - step)   # a shape with fewer tokens may need fewer
        else:
            k = {"none": 0, "all": n_layers}.get(mode, min(n_layers, int(mode)))
        while True:
            trainer.set_checkpointing(k)
            try:
                trainer.warm(shapes[key])
                break
            except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
                if not is_oom(error) or mode != "auto" or k == n_layers:
                    raise
            # out of memory: the failed step's tensors go with the exception (left behind here), then more blocks
            trainer.optimizer.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
            k = min(n_layers, k + step)
        plan[key] = k
        print(f"peer_train.py: warm-up: {key[0]} x {key[1]}: {k} of {n_layers} blocks "
              f"checkpointed", file=sys.stderr, flush=True)
    return plan


def peak_gib(device):
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_reserved() / GIB, torch.cuda.max_memory_allocated() / GIB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0 / GIB   # Linux: KiB
    return rss, rss


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deck", required=True, help="the aldit deck of the run to compare with")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bucket-tokens", type=int, default=76032, help="B = floor(this / S) per batch")
    parser.add_argument("--compile", choices=("blocks", "model", "none"), default="blocks")
    parser.add_argument("--checkpoint", default="auto", help="auto, none, all or N blocks")
    parser.add_argument("--attention-backend", help="a diffusers attention backend (set_attention_backend)")
    parser.add_argument("--joint-masks", action="store_true",
                        help="hunyuanvideo15: diffusers' own [B, 1, N, N] joint masks, not the key masks (peer_mmdit.py)")
    parser.add_argument("--json", help="also write the JSON line to FILE")
    parser.add_argument("overrides", nargs="*", help="section.key=value, as given to aldit")
    args = parser.parse_args()
    if args.checkpoint not in ("auto", "none", "all") and not args.checkpoint.isdigit():
        fail(f"--checkpoint {args.checkpoint}: auto, none, all or a block count")
    deck = train_table.read_deck(args.deck, args.overrides)
    dims = train_table.model_dims(deck)
    family = family_of(deck, dims, args.device)
    problem = family.check(deck)
    if problem:
        fail(problem)
    if int(deck["run.epochs"]) != 1:
        fail(f"run.epochs = {deck['run.epochs']}: the peer trains one epoch (set run.epochs = 1 for both runs)")
    json_out = open(args.json, "w") if args.json else None   # a bad path fails before the work
    device = args.device

    started = time.perf_counter()
    samples = load_store(deck, dims, family.latent_channels(), device)
    family.prepare(samples)
    dataset_gib = sum(s[k].numel() for s in samples for k in ("latent", "text", "text_2", "image")) * 4 / GIB
    if args.joint_masks and dims["family"] != "hunyuanvideo15":
        fail("--joint-masks: only model.family = hunyuanvideo15 masks its captions")
    model = build_model(family, deck, device, args.compile, args.attention_backend, args.joint_masks)
    optimizer, adamw = make_optimizer(model, deck, device)
    trainer = Trainer(family, model, optimizer, samples, deck, device)
    batches = bucket_batches(samples, args.bucket_tokens, int(deck["run.seed"]))
    load_s = time.perf_counter() - started

    started = time.perf_counter()
    plan = plan_checkpointing(trainer, batches, args.checkpoint, dims["num_layers"])
    warmup_s = time.perf_counter() - started

    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses, norms, bad = [], [], []
    synchronize(device)
    started = time.perf_counter()
    for step, batch in enumerate(batches, start=1):
        trainer.set_checkpointing(plan[(len(batch), samples[batch[0]]["bucket"])])
        loss, norm, skipped = trainer.step(batch, scheduled_lr(deck, step, len(batches)))
        losses.append(loss)
        norms.append(norm)
        if skipped:
            bad.append(step - 1)
            described = (f"step {step}: the loss ({loss:g}) or gradient norm ({norm:g}) is not finite: {len(batch)} x "
                         f"{samples[batch[0]]['bucket']}, caption rows per sample {[samples[i]['text_rows'] for i in batch]}")
            if not trainer.skip_nonfinite:
                recent = ", ".join(f"{a:.4g}/{b:.4g}" for a, b in zip(losses[-6:-1], norms[-6:-1]))
                fail(f"{described} (the steps before it, loss/gradient norm: {recent or 'none'}; "
                     f"train.nonfinite = error; skip leaves such a step's weights unchanged)")
            print(f"peer_train.py: {described}: skipped (train.nonfinite = skip)", file=sys.stderr, flush=True)
    synchronize(device)
    time_s = time.perf_counter() - started
    reserved, allocated = peak_gib(device)

    coef = train_table.forward_flops(dims)
    tokens = sum(s["tokens"] for s in samples)
    flops = sum(sum(train_table.model_flops(coef, s["tokens"], s["text_rows"])) for s in samples)
    finite = [x for x in losses if math.isfinite(x)] or [float("nan")]   # a skipped step's loss is left out
    tenth = max(1, len(finite) // 10)
    report = {
        "peer": family.name, "family": dims["family"], "torch": torch.__version__,
        "diffusers": __import__("diffusers").__version__,
        "device": torch.cuda.get_device_name() if torch.device(device).type == "cuda" else "cpu",
        "layers": dims["num_layers"], "dim": dims["dim"], "compile": args.compile, "adamw": adamw,
        "autocast": "bf16", "bucket_tokens": args.bucket_tokens, "samples": len(samples), "tokens": tokens,
        "steps": len(batches), "time_s": time_s, "samples_per_s": len(samples) / time_s,
        "tokens_per_s": tokens / time_s,
        "model_flops": flops, "model_tflops": flops / time_s / 1e12, "peak_gib": reserved,
        "peak_allocated_gib": allocated, "dataset_gib": dataset_gib, "load_s": load_s, "warmup_s": warmup_s,
        "checkpointed_shapes": sum(1 for k in plan.values() if k > 0), "batch_shapes": len(plan),
        "max_checkpointed_blocks": max(plan.values()), "loss_first_tenth": sum(finite[:tenth]) / tenth,
        "loss_last_tenth": sum(finite[-tenth:]) / tenth, "text_rows": sum(s["text_rows"] for s in samples),
        "i2v_samples": sum(1 for s in samples if s.get("i2v")),
        "nonfinite_steps": len(bad), "first_nonfinite_step": bad[0] + 1 if bad else None,
        "lr_first": scheduled_lr(deck, 1, len(batches)), "lr_last": scheduled_lr(deck, len(batches), len(batches)),
        "losses": [x if math.isfinite(x) else None for x in losses],
        "grad_norms": [x if math.isfinite(x) else None for x in norms],
    }
    line = json.dumps(report)
    print(line, flush=True)
    if json_out:
        with json_out:
            json_out.write(line + "\n")


if __name__ == "__main__":
    main()
