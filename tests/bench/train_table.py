#!/usr/bin/env python3
"""train_table.py — aldit's training run against its PyTorch peer (tests/bench/peer_train.py) and the floor, as one
table: samples/s, tokens/s, model TFLOP/s and peak memory of each, aldit/peer, and the epoch's floor (its GEMM and
attention FLOPs at the rates aldit-bench measured in the same call). Plain Python (json, configparser); h5py to read
the store's index. peer_train.py takes the deck reading and the FLOP count from here.

usage: tests/bench/train_table.py --deck DECK [section.key=value ...] --aldit RUN_DIR/metrics.jsonl --peer PEER_JSON
           [--bench BENCH_JSON] [--aldit-peak-gib X] [--peer-peak-gib Y] [--aldit-wall-s S] [--json FILE]

Time of aldit: the sum of its steps' step_s (set-up, start-up calibration and the final checkpoint left out, as
tools/runs_table.py counts) less the first step's data wait, which is the loading of its samples (aldit reads each
step's samples from the store while the step before computes, so only the first step waits; its wait is printed);
of the peer: its timed epoch (its loading of the whole store onto the device, compilation and warm-up left out). Model
FLOPs: 3x the forward's GEMM and attention FLOPs per sample (aldit's cost_model_model_flops, model_flops in
metrics.jsonl); the table checks that both runs trained the same samples, tokens and FLOPs.

The floor (with --bench, aldit-bench --sections gemm,attention --json on the same GPU): every GEMM FLOP of the
epoch at the rate of the block's GEMMs (gemm_block, fwd+bwd) measured at the epoch's mean micro-batch rows, and
each sample's self- and cross-attention, forward and backward, at the fastest backend's time measured at the
nearest S (interpolated per FLOP in log S between measured S, held at the ends), times the layers. Of
model.family = hunyuanvideo15 (aldit-bench --wan hv15: its GEMM widths and heads): each block's joint attention
over N = S + L and the token refiner's over the L text rows, both at the self-attention's time per FLOP at that
length; a sample's L is its Qwen, ByT5 and, drawn as image-to-video (tests/bench/aldit_draws.py), SigLIP rows.
"""
import argparse
import configparser
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import aldit_draws  # noqa: E402  (aldit's per-sample task draws: which samples take SigLIP rows)

# aldit's deck defaults (src/deck/deck.c) of the keys the peer reads
DECK_DEFAULTS = {
    "run.seed": "1234", "run.epochs": "1", "run.device": "auto",
    "model.dim": "1536", "model.ffn_dim": "8960", "model.num_heads": "12", "model.num_layers": "30",
    "model.in_dim": "16", "model.out_dim": "16", "model.patch_t": "1", "model.patch_h": "2", "model.patch_w": "2",
    "model.text_len": "512", "model.text_padding": "wan", "model.text_dim": "4096", "model.freq_dim": "256",
    "model.eps": "1e-6", "model.qk_norm": "on", "model.cross_attn_norm": "on",
    "model.family": "wan", "model.text_2_dim": "1472", "model.image_dim": "1152", "model.rope_axes_t": "16",
    "data.store": "",
    "train.lr": "1e-4", "train.weight_decay": "0.01", "train.beta1": "0.9", "train.beta2": "0.999",
    "train.adam_eps": "1e-8", "train.grad_clip": "1", "train.min_lr": "0", "train.warmup_steps": "100",
    "train.lr_schedule": "cosine", "train.nonfinite": "error", "train.timestep_shift": "5", "train.timesteps": "uniform",
    "train.i2v_share": "0",
}
# keys whose default depends on [model] family (deck.c's family_default)
FAMILY_DEFAULTS = {"hunyuanvideo15": {"train.timestep_shift": "3", "train.timesteps": "logit_normal",
                                      "train.i2v_share": "0.3"}}
MODEL_INTS = ("dim", "ffn_dim", "num_heads", "num_layers", "in_dim", "out_dim", "patch_t", "patch_h", "patch_w",
              "text_len", "text_dim", "freq_dim", "text_2_dim", "image_dim", "rope_axes_t")
# HunyuanVideo-1.5's fixed widths (src/model/layout.h): ByT5 embedder hidden, refiner blocks and MLP ratio
MMDIT_BYT5_HIDDEN, MMDIT_REFINER_LAYERS, MMDIT_REFINER_MLP_RATIO = 2048, 2, 4


def read_deck(path, overrides):
    """An aldit deck (INI, ';' comments) with section.key=value overrides, as {"section.key": "text"}."""
    parser = configparser.ConfigParser(inline_comment_prefixes=(";", "#"), interpolation=None)
    try:
        with open(path) as f:
            parser.read_file(f)
    except (OSError, configparser.Error) as e:
        sys.exit(f"{path}: {e}")
    given = {}
    for section in parser.sections():
        for key, value in parser.items(section):
            given[f"{section}.{key}"] = value.strip()
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            sys.exit(f"{item}: an override is section.key=value")
        given[key.strip()] = value.strip()
    deck = dict(DECK_DEFAULTS)
    deck.update(FAMILY_DEFAULTS.get(given.get("model.family", DECK_DEFAULTS["model.family"]), {}))
    deck.update(given)
    return deck


def on(text):
    return text.lower() in ("1", "on", "yes", "true")


def model_dims(deck):
    """The deck's [model] dims as ints (qk_norm, cross_attn_norm as 0/1)."""
    dims = {key: int(deck[f"model.{key}"]) for key in MODEL_INTS}
    dims["qk_norm"] = int(on(deck["model.qk_norm"]))
    dims["cross_attn_norm"] = int(on(deck["model.cross_attn_norm"]))
    dims["family"] = deck["model.family"]
    if dims["family"] not in ("wan", "hunyuanvideo15"):
        sys.exit(f"model.family = {dims['family']}: wan or hunyuanvideo15")
    return dims


def forward_flops(dims):
    """Forward FLOPs per token, text row and sample of aldit's layout table (src/model/layout.c: 2 per weight of
    each Linear and row it multiplies) and the attentions': Wan's per token^2 and token x text row (4 D each, all
    layers); a joint attention's (family hunyuanvideo15) per N^2, N = S + L (4 D, all layers), and the token
    refiner's per L^2 (4 D per refiner block), as src/balance/costmodel.c counts them."""
    if dims["family"] == "hunyuanvideo15":
        return mmdit_forward_flops(dims)
    d, f, layers = dims["dim"], dims["ffn_dim"], dims["num_layers"]
    patch = dims["patch_t"] * dims["patch_h"] * dims["patch_w"]
    per_token = 2.0 * (d * dims["in_dim"] * patch + layers * (6 * d * d + 2 * d * f) + dims["out_dim"] * patch * d)
    per_text = 2.0 * (d * dims["text_dim"] + d * d + layers * 2 * d * d)
    per_sample = 2.0 * (d * dims["freq_dim"] + d * d + 6 * d * d)
    return {"per_token": per_token, "per_text": per_text, "per_sample": per_sample, "joint": False,
            "attention_per_token2": layers * 4.0 * d, "attention_per_token_text": layers * 4.0 * d,
            "attention_per_text2": 0.0}


def mmdit_forward_flops(dims):
    """forward_flops of HunyuanVideo-1.5's table (layout.c's mmdit_tensors): video rows through the patch embedding,
    each block's q/k/v/out and MLP, proj_out; text rows (Qwen, ByT5 and image rows alike: the layout counts every
    text-row Linear per row of the joint text) through the image and ByT5 embedders, proj_in, the refiner and each
    block's text stream; per sample the time and pooled-text embedders, the refiner's and blocks' modulations."""
    d, f, layers = dims["dim"], dims["ffn_dim"], dims["num_layers"]
    patch = dims["patch_t"] * dims["patch_h"] * dims["patch_w"]
    image, byt5, refiner = dims["image_dim"], MMDIT_BYT5_HIDDEN, MMDIT_REFINER_LAYERS
    block_stream = layers * (4 * d * d + 2 * d * f)
    per_token = 2.0 * (d * dims["in_dim"] * patch + block_stream + dims["out_dim"] * patch * d)
    refiner_block = 4 * d * d + 2 * MMDIT_REFINER_MLP_RATIO * d * d
    per_text = 2.0 * (image * image + d * image + d * dims["text_dim"] + refiner * refiner_block
                      + byt5 * dims["text_2_dim"] + byt5 * byt5 + d * byt5 + block_stream)
    per_sample = 2.0 * (2 * (d * dims["freq_dim"] + d * d) + d * dims["text_dim"] + d * d + refiner * 2 * d * d
                        + 2 * d * d + layers * 2 * 6 * d * d)
    return {"per_token": per_token, "per_text": per_text, "per_sample": per_sample, "joint": True,
            "attention_per_token2": layers * 4.0 * d, "attention_per_token_text": 0.0,
            "attention_per_text2": refiner * 4.0 * d}


def model_flops(coef, tokens, text_rows):
    """(GEMM, attention) model FLOPs of one sample: 3x the forward's (aldit's cost_model_model_flops); text_rows:
    the rows the model takes (of a joint attention, L of N = S + L)."""
    s, l = float(tokens), float(text_rows)
    gemm = 3.0 * (coef["per_token"] * s + coef["per_text"] * l + coef["per_sample"])
    n = s + l if coef["joint"] else s
    attention = 3.0 * (coef["attention_per_token2"] * n * n + coef["attention_per_token_text"] * s * l
                       + coef["attention_per_text2"] * l * l)
    return gemm, attention


def text_rows(deck, text_len):
    """The text rows the model sees: text_len under [model] text_padding = wan, the caption's own under trim."""
    return int(deck["model.text_len"]) if deck["model.text_padding"] == "wan" else int(text_len)


def store_samples(deck):
    """(tokens, text rows the model takes) of each sample of the deck's store, from its /index (and, of
    family hunyuanvideo15, /index_sources: ByT5 rows and, trained as image-to-video by aldit's draw, SigLIP rows)."""
    import h5py

    dims = model_dims(deck)
    with h5py.File(deck["data.store"], "r") as f:
        index = f["index"][:]
        sources = f["index_sources"][:] if "index_sources" in f and dims["family"] == "hunyuanvideo15" else None
    draws = aldit_draws.AlditDraws(deck)
    samples = []
    for i, r in enumerate(index):
        tokens = int(r[1]) // dims["patch_t"] * (int(r[2]) // dims["patch_h"]) * (int(r[3]) // dims["patch_w"])
        rows = text_rows(deck, int(r[4]))
        if sources is not None:
            image = int(sources[i][2])
            rows += int(sources[i][0]) + (image if draws.i2v(0, i, int(r[1]) > 1 and image > 0) else 0)
        samples.append((tokens, rows))
    return samples


def interpolate(points, x):
    """Piecewise-linear in log x through sorted (x, y) points, held at the ends."""
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    return points[-1][1]


def attention_seconds_per_flop(bench, kind):
    """[(S, seconds per forward FLOP of one fwd+bwd)] of the fastest backend aldit-bench measured per S."""
    best = {}
    for entry in bench.get("attention", []):
        if entry["kind"] != kind:
            continue
        seconds = 1e-3 * (entry["fwd_ms"] + entry["bwd_ms"])
        fwd_flops = 4.0 * entry["S"] * entry["kv_rows"] * bench["attention_heads"] * bench["attention_head_dim"]
        per_flop = seconds / fwd_flops
        if entry["S"] not in best or per_flop < best[entry["S"]]:
            best[entry["S"]] = per_flop
    return sorted(best.items())


def floor_seconds(deck, bench, samples, mean_rows):
    """The epoch's floor: GEMM FLOPs at the block GEMMs' rate at mean_rows, attentions at their measured times."""
    dims = model_dims(deck)
    if bench.get("dim") not in (None, dims["dim"]):
        sys.exit(f"--bench: measured at dim {bench.get('dim')}, the deck's model has dim {dims['dim']}")
    coef = forward_flops(dims)
    gemm_rates = sorted((e["S"], e["tflops"] * 1e12) for e in bench["gemm_block"])
    self_cost, cross_cost = attention_seconds_per_flop(bench, "self"), attention_seconds_per_flop(bench, "cross")
    if not gemm_rates or not self_cost or not cross_cost:
        sys.exit("--bench: needs aldit-bench's gemm and attention sections (gemm_block, attention self and cross)")
    gemm_flops = sum(model_flops(coef, s, rows)[0] for s, rows in samples)
    gemm_s = gemm_flops / interpolate(gemm_rates, mean_rows)
    attention_s = 0.0
    for s, rows in samples:
        if coef["joint"]:   # the blocks' joint attention over N = S + L, the refiner's over the text: self-attentions
            n = s + rows
            attention_s += 4.0 * dims["dim"] * (dims["num_layers"] * n * n * interpolate(self_cost, n)
                                                + MMDIT_REFINER_LAYERS * rows * rows * interpolate(self_cost, rows))
        else:
            attention_s += dims["num_layers"] * 4.0 * dims["dim"] * (
                s * s * interpolate(self_cost, s) + s * rows * interpolate(cross_cost, s))
    return gemm_s, attention_s


def aldit_summary(path):
    rows = []
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"{path}: {e}")
    if not rows:
        sys.exit(f"{path}: no steps")
    first_wait = rows[0].get("data_wait_s", 0.0)
    return {"time_s": sum(r["step_s"] for r in rows) - first_wait, "first_wait_s": first_wait,
            "first_step_s": rows[0]["step_s"] - first_wait,
            "samples": sum(r["samples"] for r in rows),
            "tokens": sum(r["tokens"] for r in rows), "model_flops": sum(r["model_flops"] for r in rows),
            "micro_batches": sum(r["micro_batches"] for r in rows), "steps": len(rows),
            "losses": [r.get("loss", 0.0) for r in rows]}


def micro_batch_floors(deck, bench, paths):
    """Each logged micro-batch ([log] micro_batches) against its floor: floor_seconds over its own samples, its GEMMs
    at the rate of its own video rows; a sequence-parallel group's micro-batch (group k > 1, logged by each member)
    at a member's share, 1/k of it. Returns a list of dicts (step, rank, micro, samples, tokens, text rows, longest
    sample, seconds, floor_s)."""
    batches = []
    for path in paths:
        try:
            with open(path) as f:
                lines = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError) as e:
            sys.exit(f"{path}: {e}")
        for m in lines:
            samples = [(int(s), int(rows)) for s, rows in m["samples"]]
            tokens = sum(s for s, _ in samples)
            gemm_s, attention_s = floor_seconds(deck, bench, samples, max(1, tokens))
            batches.append({"step": m["step"], "rank": m["rank"], "micro": m["micro"], "samples": len(samples),
                            "tokens": tokens, "text_rows": sum(r for _, r in samples),
                            "longest": max(s for s, _ in samples), "seconds": m["seconds"],
                            "setup_s": m.get("setup_s", 0.0),
                            "floor_s": (gemm_s + attention_s) / max(1, int(m.get("group", 1)))})
    return batches


MICRO_CLASSES = [("a sample of 30,000 tokens or more", 30000), ("a sample of 8,000 to 30,000", 8000),
                 ("every sample under 8,000 tokens", 0)]


def setup_seconds(paths):
    """Rank 0's one-time device set-up inside the steps: the sum of its logged micro-batches' setup_s."""
    total = 0.0
    for path in paths:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if rows and rows[0].get("rank", 0) == 0:
            total += sum(r.get("setup_s", 0.0) for r in rows)
    return total


def print_micro_batches(batches, top=10):
    """The micro-batches' seconds against their floors, by the length of their longest sample, and the worst."""
    seconds, floor = sum(b["seconds"] for b in batches), sum(b["floor_s"] for b in batches)
    setup = sum(b["setup_s"] for b in batches)
    print(f"micro-batches logged: {len(batches)}, {seconds:.2f} s against a floor of {floor:.2f} s "
          f"({100 * floor / seconds:.1f}%), of which {setup:.2f} s the device's one-time set-up (cuDNN plans of "
          f"shapes met the first time); by their longest sample:")
    print("| micro-batches with | count | samples | seconds | floor (s) | floor % | seconds over the floor | share of it "
          "| of which set-up (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    excess = seconds - floor
    for label, least in MICRO_CLASSES:
        upper = min([bound for _, bound in MICRO_CLASSES if bound > least], default=None)
        group = [b for b in batches if b["longest"] >= least and (upper is None or b["longest"] < upper)]
        if not group:
            continue
        s, f = sum(b["seconds"] for b in group), sum(b["floor_s"] for b in group)
        print(f"| {label} | {len(group)} | {sum(b['samples'] for b in group)} | {s:.2f} | {f:.2f} | {100 * f / s:.1f}% | "
              f"{s - f:.2f} | {100 * (s - f) / excess if excess > 0 else 0.0:.0f}% | "
              f"{sum(b['setup_s'] for b in group):.2f} |")
    print(f"the {min(top, len(batches))} furthest over their floor (seconds - floor):")
    print("| step | rank | micro | samples | video tokens | caption rows | longest | seconds | floor (s) | floor % "
          "| set-up (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for b in sorted(batches, key=lambda b: b["floor_s"] - b["seconds"])[:top]:
        print(f"| {b['step']} | {b['rank']} | {b['micro']} | {b['samples']} | {b['tokens']} | {b['text_rows']} | "
              f"{b['longest']} | {b['seconds']:.3f} | {b['floor_s']:.3f} | {100 * b['floor_s'] / b['seconds']:.1f}% | "
              f"{b['setup_s']:.3f} |")
    return {"count": len(batches), "seconds": seconds, "floor_s": floor, "setup_s": setup}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deck", required=True)
    parser.add_argument("--aldit", help="aldit's metrics.jsonl")
    parser.add_argument("--peer", help="peer_train.py's JSON")
    parser.add_argument("--bench", help="aldit-bench --sections gemm,attention --json of the same call")
    parser.add_argument("--aldit-peak-gib", type=float, help="aldit's peak device memory (e.g. from nvidia-smi)")
    parser.add_argument("--peer-peak-gib", type=float, help="the peer's peak device memory (default: its own count)")
    parser.add_argument("--aldit-wall-s", type=float, help="aldit's whole run, start-up included")
    parser.add_argument("--aldit-fp8", help="metrics.jsonl of the same epoch with [train] precision = fp8 (a row of its own)")
    parser.add_argument("--aldit-fp8-peak-gib", type=float, help="that run's peak device memory")
    parser.add_argument("--micro-batches", action="append", metavar="JSONL",
                        help="aldit's micro_batches.RANK.jsonl ([log] micro_batches = on; once per file): each "
                             "micro-batch against its floor (needs --bench)")
    parser.add_argument("--json")
    parser.add_argument("overrides", nargs="*", help="section.key=value, as given to aldit")
    args = parser.parse_args()
    deck = read_deck(args.deck, args.overrides)
    if args.micro_batches and not args.bench:
        sys.exit("--micro-batches: needs --bench (aldit-bench's rates price each micro-batch)")
    if args.micro_batches and not args.aldit and not args.peer:   # the micro-batches alone, no comparison
        with open(args.bench) as f:
            print_micro_batches(micro_batch_floors(deck, json.load(f), args.micro_batches))
        return
    if not args.aldit or not args.peer:
        parser.error("--aldit and --peer are required (without them: --bench and --micro-batches alone)")
    aldit = aldit_summary(args.aldit)
    try:
        with open(args.peer) as f:
            peer = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{args.peer}: {e}")

    # samples and tokens exactly; model FLOPs within metrics.jsonl's 6 significant digits per step
    same = {key: (aldit[key], peer[key]) for key in ("samples", "tokens", "model_flops")}
    tolerance = {"samples": 0.0, "tokens": 0.0, "model_flops": 1e-5}
    mismatch = [k for k, (a, p) in same.items() if abs(a - p) > tolerance[k] * abs(a)]
    runs = [("aldit", aldit, args.aldit_peak_gib),
            (f"peer (diffusers, compile {peer.get('compile')})", peer, args.peer_peak_gib or peer.get("peak_gib"))]
    if args.aldit_fp8:
        fp8 = aldit_summary(args.aldit_fp8)
        fp8_same = [k for k in ("samples", "tokens") if fp8[k] != aldit[k]]
        mismatch += [f"{k} (fp8 run)" for k in fp8_same]
        same.update({f"{k} (fp8 run)": (fp8[k], aldit[k]) for k in fp8_same})
        runs.append(("aldit fp8", fp8, args.aldit_fp8_peak_gib))
    rows = []
    for name, run, peak in runs:
        t = run["time_s"]
        rows.append({"run": name, "time_s": t, "samples_per_s": run["samples"] / t, "tokens_per_s": run["tokens"] / t,
                     "model_tflops": run["model_flops"] / t / 1e12, "peak_gib": peak})
    floor = None
    if args.bench:
        with open(args.bench) as f:
            bench = json.load(f)
        gemm_s, attention_s = floor_seconds(deck, bench, store_samples(deck), aldit["tokens"] / aldit["micro_batches"])
        floor = {"gemm_s": gemm_s, "attention_s": attention_s, "time_s": gemm_s + attention_s,
                 "model_tflops": aldit["model_flops"] / (gemm_s + attention_s) / 1e12}

    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)

    print("| run | time (s) | samples/s | tokens/s | model TFLOP/s | peak GiB |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['time_s']:.2f} | {r['samples_per_s']:.2f} | {r['tokens_per_s']:,.0f} | "
              f"{r['model_tflops']:.1f} | {cell(r['peak_gib'], '.1f')} |")
    a, p = rows[0], rows[1]
    peak_ratio = a["peak_gib"] / p["peak_gib"] if a["peak_gib"] and p["peak_gib"] else None
    print(f"| aldit / peer | {a['time_s'] / p['time_s']:.3f} | {a['samples_per_s'] / p['samples_per_s']:.3f}x | "
          f"{a['tokens_per_s'] / p['tokens_per_s']:.3f}x | {a['model_tflops'] / p['model_tflops']:.3f}x | "
          f"{cell(peak_ratio, '.3f')} |")
    if len(rows) > 2:
        f8 = rows[2]
        for label, base in (("aldit fp8 / aldit", a), ("aldit fp8 / peer", p)):
            ratio = f8["peak_gib"] / base["peak_gib"] if f8["peak_gib"] and base["peak_gib"] else None
            print(f"| {label} | {f8['time_s'] / base['time_s']:.3f} | {f8['samples_per_s'] / base['samples_per_s']:.3f}x | "
                  f"{f8['tokens_per_s'] / base['tokens_per_s']:.3f}x | {f8['model_tflops'] / base['model_tflops']:.3f}x | "
                  f"{cell(ratio, '.3f')} |")
        rest = (aldit["time_s"] - aldit["first_step_s"], fp8["time_s"] - fp8["first_step_s"])
        whole = a["time_s"] / f8["time_s"]
        print(f"aldit fp8 / aldit samples/s: {whole:.3f}x over the epoch (issue 34's target 1.2x, "
              f"{'met' if whole >= 1.2 else 'not met'}); "
              + (f"{rest[0] / rest[1]:.3f}x over its steps after the first ({fp8['first_step_s']:.2f} s against "
                 f"{aldit['first_step_s']:.2f} s: an fp8 run's first step has no amax history, its casts scale by "
                 f"their own amaxes and FP8 attention runs bf16 and probes them)" if aldit["steps"] > 1 and rest[1] > 0 else "one step only"))
    if floor:
        print(f"| floor (GEMM {floor['gemm_s']:.2f} s + attention {floor['attention_s']:.2f} s) | {floor['time_s']:.2f} | "
              f"{aldit['samples'] / floor['time_s']:.2f} | {aldit['tokens'] / floor['time_s']:,.0f} | "
              f"{floor['model_tflops']:.1f} | |")
        share = a['model_tflops'] / floor['model_tflops']
        speedup = a['samples_per_s'] / p['samples_per_s']
        issue, target = ("33", 1.15) if deck["model.family"] == "hunyuanvideo15" else ("20", 1.3)
        print(f"aldit's model TFLOP/s is {100 * share:.2f}% of the floor's (issue {issue}'s target: within 10%, "
              f"{'met' if share >= 0.9 else 'not met'}); aldit / peer samples/s {speedup:.3f}x "
              f"(target {target}x, {'met' if speedup >= target else 'not met'})")
        setup = setup_seconds(args.micro_batches) if args.micro_batches else 0.0
        if setup > 0.0:   # the same epoch with its one-time set-up left out, as the peer's warm-up is
            rest = a["time_s"] - setup
            print(f"aldit less its device's one-time set-up inside the steps ({setup:.2f} s: cuDNN plans of shapes met "
                  f"the first time, from --micro-batches; the peer's per-shape compilation is not counted either): "
                  f"{rest:.2f} s, {aldit['samples'] / rest:.2f} samples/s, {100 * floor['time_s'] / rest:.2f}% of the "
                  f"floor, {p['time_s'] / rest:.3f}x the peer's samples/s")
    else:
        print("floor: - (no --bench: aldit-bench's GEMM and attention rates are measured on a GPU)")
    print(f"both runs: {aldit['samples']} samples, {aldit['tokens']:.0f} tokens, {aldit['model_flops'] / 1e12:.3f} "
          f"model TFLOP; aldit {aldit['steps']} steps (the first step's loading, {aldit['first_wait_s']:.2f} s, not "
          f"counted), peer {peer['steps']} steps"
          + (f"; aldit's whole run {args.aldit_wall_s:.1f} s" if args.aldit_wall_s else "")
          + f"; the peer's loading and warm-up {peer.get('load_s', 0) + peer.get('warmup_s', 0):.1f} s")
    micro = None
    if args.micro_batches:
        micro = print_micro_batches(micro_batch_floors(deck, bench, args.micro_batches))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "floor": floor, "same": same, "micro_batches": micro}, f, indent=1)
    diverged = []
    if peer.get("nonfinite_steps") or not math.isfinite(peer.get("loss_last_tenth", 0.0)):
        diverged.append(f"the peer's loss is not finite at {peer.get('nonfinite_steps', '?')} of {peer['steps']} steps "
                        f"(first: step {peer.get('first_nonfinite_step', '?')})")
    if not all(math.isfinite(x) for x in aldit.get("losses", [])):
        diverged.append("aldit's loss is not finite at some step")
    for line in diverged:   # the same work was timed, but a diverged run is no comparison to stand on
        print(f"train_table: {line}: the comparison is not valid until it trains", file=sys.stderr)
    if mismatch:
        for key in mismatch:
            print(f"train_table: the runs differ in {key}: aldit {same[key][0]:.17g}, peer {same[key][1]:.17g}",
                  file=sys.stderr)
    if mismatch or diverged:
        sys.exit(1)


if __name__ == "__main__":
    main()
