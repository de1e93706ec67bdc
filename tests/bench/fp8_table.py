#!/usr/bin/env python3
"""fp8_table.py — issue 34's projection: the epoch floor of tests/bench/train_vs_peer.sh (train_table.py's model:
every GEMM FLOP at the block GEMMs' rate at the epoch's mean micro-batch rows, each sample's self- and cross-attention
at the time measured at the nearest S, interpolated per FLOP in log S, times the layers), priced with the rates
tests/bench/fp8_bench measured in one call, bf16 against FP8 part by part, as one table. Plain Python (json,
configparser).

usage: tests/bench/fp8_table.py --bench FP8_JSON [--bench FP8_JSON ...] --deck DECK [section.key=value ...]
           [--mean-rows R] [--bandwidth-tbs B] [--json FILE] [--speedups FILE]

Rows: the bf16 floor; FP8 GEMMs (forward with fast accumulation, dgrad and wgrad without: Transformer Engine's
default); the same with fast accumulation in dgrad too; + FP8 self-attention forward; + FP8 self-attention backward
(cross-attention to the text stays bf16 in every row). Gain: the bf16 floor over the row's. The bench's FP8 GEMMs read
transposed FP8 copies (dgrad: W^T; wgrad: x^T, dy^T), which a real path writes in the fused kernels that make its
activations (issue 34, item 2); "with casts" adds, as a bound, unfused casts at --bandwidth-tbs (default 4.19, an
H200's device copy): per token and layer, GEMM operands 4 bytes (bf16 read, FP8 and FP8^T written) for each of
12 dim + 2 ffn values (inputs 5 dim + ffn, output gradients 7 dim + ffn), attention 3 bytes (bf16 read, FP8
written, or back) for each of 4 dim per direction. The epoch is the one the bench drew (--spec, --samples,
--draw-seed: aldit-store synth's draw); its mean micro-batch rows are --mean-rows (default 32768;
train_vs_peer.sh takes them from aldit's run). --speedups writes the measurement itself, per shape (bf16 time over
FP8 time of the block's GEMMs per pass and variant; self-attention TFLOP/s and ratios).
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_table import forward_flops, interpolate, model_dims, model_flops, read_deck, text_rows  # noqa: E402

GEMM_CONFIGS = [
    ("bf16", {"fwd": "bf16", "dgrad": "bf16", "wgrad": "bf16"}),
    ("fp8", {"fwd": "fp8_fast", "dgrad": "fp8", "wgrad": "fp8"}),
    ("fp8_fast_dgrad", {"fwd": "fp8_fast", "dgrad": "fp8_fast", "wgrad": "fp8"}),
]


def gemm_rates(cases, dim):
    """{config: [(M, FLOP/s of the block's linears, fwd + dgrad + wgrad)]} for the model whose attn linears have K = dim,
    and the cases that fell back to bf16 (refused in FP8)."""
    by_key = {}
    for c in cases:
        if c["section"] == "gemm":
            by_key[(c["model"], c["M"], c["linear"], c["pass"], c["variant"])] = c
    models = {c["model"] for c in cases if c["section"] == "gemm" and c["linear"] == "attn" and c["K"] == dim}
    if len(models) != 1:
        sys.exit(f"--bench: no GEMM cases at dim {dim} (the deck's model)")
    model = models.pop()
    rows = sorted({c["M"] for c in cases if c["section"] == "gemm" and c["model"] == model})
    linears = {c["linear"]: c for c in cases if c["section"] == "gemm" and c["model"] == model}
    rates, fallbacks = {}, []
    for name, config in GEMM_CONFIGS:
        points = []
        for M in rows:
            flops = seconds = 0.0
            for linear, spec in linears.items():
                for pass_name, variant in config.items():
                    case = by_key.get((model, M, linear, pass_name, variant))
                    if case is None or case.get("refused") or case["ms"] <= 0:
                        fallbacks.append(f"{linear} {pass_name} {variant} at M {M}")
                        case = by_key[(model, M, linear, pass_name, "bf16")]
                    flops += spec["count"] * 2.0 * M * spec["K"] * spec["N"]
                    seconds += spec["count"] * 1e-3 * case["ms"]
            points.append((M, flops / seconds))
        rates[name] = points
    return model, rates, fallbacks


def attention_costs(cases, heads, head_dim):
    """{(kind, precision, direction): [(S, seconds per forward FLOP)]} at these heads; direction fwd or bwd."""
    costs = {}
    for c in cases:
        if c["section"] != "attention" or c["heads"] != heads or c["head_dim"] != head_dim:
            continue
        flops = 4.0 * c["S"] * c["kv_rows"] * heads * head_dim
        for direction in ("fwd", "bwd"):
            ms = c[f"{direction}_ms"]
            if ms > 0:
                costs.setdefault((c["kind"], c["precision"], direction), []).append((c["S"], 1e-3 * ms / flops))
    for key in costs:
        costs[key].sort()
    return costs


def epoch_samples(bench, deck, dims):
    """(tokens, text rows) of each sample of the epoch the bench drew."""
    epoch = bench.get("epoch")
    if not epoch:
        sys.exit("--bench: no epoch (run fp8_bench with --spec, --samples and --draw-seed)")
    rows = text_rows(deck, deck["model.text_len"])
    return [(f // dims["patch_t"] * (h // dims["patch_h"]) * (w // dims["patch_w"]), rows) for f, h, w in epoch["shapes"]]


def attention_seconds(samples, dims, cost):
    """The epoch's seconds of one attention part at cost [(S, s per FLOP)] (kind self: S x S; cross: S x text)."""
    kind, points = cost
    total = 0.0
    for s, rows in samples:
        keys = s if kind == "self" else rows
        total += dims["num_layers"] * 4.0 * dims["dim"] * s * keys * interpolate(points, s)
    return total


def project(bench, deck, mean_rows, bandwidth):
    """The table's rows: (name, GEMM s, self fwd s, self bwd s, cross s, cast s) and the notes."""
    dims = model_dims(deck)
    head_dim = dims["dim"] // dims["num_heads"]
    model, rates, fallbacks = gemm_rates(bench["cases"], dims["dim"])
    costs = attention_costs(bench["cases"], dims["num_heads"], head_dim)
    notes = [f"GEMM rates of Wan-{model} at {mean_rows:g} mean micro-batch rows"]
    if bench.get("cut"):
        notes.append(f"{bench['cut']} line(s) of the measurement did not parse (a run cut short) and were left out")
    if fallbacks:
        notes.append("FP8 refused, priced at bf16: " + ", ".join(fallbacks))
    samples = epoch_samples(bench, deck, dims)
    coef = forward_flops(dims)
    gemm_flops = sum(model_flops(coef, s, rows)[0] for s, rows in samples)
    gemm_s = {name: gemm_flops / interpolate(points, mean_rows) for name, points in rates.items()}

    def part(kind, precision, direction):
        points = costs.get((kind, precision, direction))
        if not points and precision == "fp8":
            notes.append(f"FP8 {kind}-attention {direction}: no measurement (refused), priced at bf16")
            points = costs.get((kind, "bf16", direction))
        if not points:
            sys.exit(f"--bench: no bf16 {kind}-attention {direction} at {dims['num_heads']} heads")
        return attention_seconds(samples, dims, (kind, points))

    tokens = sum(s for s, _ in samples) * dims["num_layers"]
    gemm_cast_s = tokens * 4.0 * (12 * dims["dim"] + 2 * dims["ffn_dim"]) / bandwidth
    attention_cast_s = tokens * 3.0 * 4 * dims["dim"] / bandwidth
    cross = part("cross", "bf16", "fwd") + part("cross", "bf16", "bwd")
    self_bf16 = (part("self", "bf16", "fwd"), part("self", "bf16", "bwd"))
    self_fp8 = (part("self", "fp8", "fwd"), part("self", "fp8", "bwd"))
    rows = [
        ("bf16 floor", gemm_s["bf16"], self_bf16[0], self_bf16[1], cross, 0.0),
        ("FP8 GEMMs (fast accumulation: fwd)", gemm_s["fp8"], self_bf16[0], self_bf16[1], cross, gemm_cast_s),
        ("FP8 GEMMs (fast accumulation: fwd, dgrad)", gemm_s["fp8_fast_dgrad"], self_bf16[0], self_bf16[1], cross,
         gemm_cast_s),
        ("+ FP8 attention forward", gemm_s["fp8"], self_fp8[0], self_bf16[1], cross, gemm_cast_s + attention_cast_s),
        ("+ FP8 attention backward", gemm_s["fp8"], self_fp8[0], self_fp8[1], cross,
         gemm_cast_s + 2 * attention_cast_s),
    ]
    for c in bench["cases"]:
        if c["section"] == "attention_check":
            notes.append(f"FP8 attention against bf16 on the same inputs, {c['heads']} heads, S {c['S']} (relative RMS "
                         f"error): O {c['o']:.4f}, dQ {c['dq']:.4f}, dK {c['dk']:.4f}, dV {c['dv']:.4f}"
                         + ("" if c["same"] else " - NOT the same attention: its timings measure something else"))
    notes.append(f"{len(samples)} samples, {tokens / dims['num_layers']:,.0f} tokens, {dims['num_layers']} layers of "
                 f"dim {dims['dim']}, {dims['num_heads']} heads")
    return rows, notes


def read_bench(paths):
    """fp8_bench's JSON lines of these files as {"device", "epoch", "cases", "cut"}: the header's device, the first
    epoch, every case; a line that does not parse (a run cut short mid-line) is counted in "cut" and left out."""
    bench = {"cases": [], "cut": 0}
    for path in paths:
        try:
            with open(path) as f:
                lines = [line for line in f if line.strip()]
        except OSError as e:
            sys.exit(f"--bench {path}: {e}")
        for line in lines:
            try:
                item = json.loads(line)
            except ValueError:
                bench["cut"] += 1
                continue
            if "section" in item:
                bench["cases"].append(item)
            for key in ("device", "epoch"):
                if key in item and key not in bench:
                    bench[key] = item[key]
    return bench


def speedup_lines(bench):
    """The measurement in two markdown tables: per model and M, the block's GEMM time in bf16 over FP8 per pass and
    variant (its linears weighted by their count); per heads and S, self-attention TFLOP/s and the ratios."""
    gemm = {}
    for c in bench["cases"]:
        if c["section"] == "gemm" and c["ms"] > 0:
            key = (c["model"], c["M"], c["pass"], c["variant"])
            gemm[key] = gemm.get(key, 0.0) + c["count"] * c["ms"]
    columns = [("fwd", "fp8_fast"), ("fwd", "fp8"), ("dgrad", "fp8_fast"), ("dgrad", "fp8"), ("wgrad", "fp8")]
    lines = ["| model | M | " + " | ".join(f"{p} {v}" for p, v in columns) + " | fwd+bwd (fp8 config) |",
             "|---" * (len(columns) + 3) + "|"]
    for model, M in sorted({(k[0], k[1]) for k in gemm}):
        def ratio(p, v):
            bf16, fp8 = gemm.get((model, M, p, "bf16")), gemm.get((model, M, p, v))
            return f"{bf16 / fp8:.2f}x" if bf16 and fp8 else "refused"
        total = [gemm.get((model, M, p, v)) for p, v in (("fwd", "fp8_fast"), ("dgrad", "fp8"), ("wgrad", "fp8"))]
        base = [gemm.get((model, M, p, "bf16")) for p in ("fwd", "dgrad", "wgrad")]
        both = f"{sum(base) / sum(total):.2f}x" if all(total) and all(base) else "-"
        lines.append(f"| {model} | {M} | " + " | ".join(ratio(p, v) for p, v in columns) + f" | {both} |")
    lines += ["", "| heads | S | bf16 fwd TFLOP/s | FP8 fwd TFLOP/s | fwd | bf16 bwd TFLOP/s | FP8 bwd TFLOP/s | bwd |",
              "|---|---|---|---|---|---|---|---|"]
    attention = {(c["heads"], c["S"], c["precision"]): c for c in bench["cases"]
                 if c["section"] == "attention" and c["kind"] == "self"}
    for heads, S in sorted({(k[0], k[1]) for k in attention}):
        b, f = attention.get((heads, S, "bf16")), attention.get((heads, S, "fp8"))
        flops = 4.0 * S * S * heads * (b or f)["head_dim"]
        def rate(case, d, factor):
            return f"{factor * flops / (1e9 * case[d + '_ms']):.0f}" if case and case[d + "_ms"] > 0 else "refused"
        def ratio(d):
            return f"{b[d + '_ms'] / f[d + '_ms']:.2f}x" if b and f and b[d + "_ms"] > 0 and f[d + "_ms"] > 0 else "-"
        lines.append(f"| {heads} | {S} | {rate(b, 'fwd', 1)} | {rate(f, 'fwd', 1)} | {ratio('fwd')} | "
                     f"{rate(b, 'bwd', 2.5)} | {rate(f, 'bwd', 2.5)} | {ratio('bwd')} |")
    return lines


def print_table(rows, notes, bench):
    base = sum(rows[0][1:5])
    print(f"## FP8 projection of the epoch floor ({bench.get('device', '?')})")
    print()
    print("| configuration | GEMM s | self-attn fwd s | self-attn bwd s | cross-attn s | floor s | gain | "
          "with unfused casts |")
    print("|---|---|---|---|---|---|---|---|")
    out = []
    for name, gemm, fwd, bwd, cross, cast in rows:
        floor = gemm + fwd + bwd + cross
        print(f"| {name} | {gemm:.2f} | {fwd:.2f} | {bwd:.2f} | {cross:.2f} | {floor:.2f} | {base / floor:.3f}x | "
              f"{base / (floor + cast):.3f}x |")
        out.append({"name": name, "gemm_s": gemm, "self_fwd_s": fwd, "self_bwd_s": bwd, "cross_s": cross,
                    "floor_s": floor, "gain": base / floor, "cast_s": cast, "gain_with_casts": base / (floor + cast)})
    print()
    for note in notes:
        print(f"- {note}")
    best = max(out[1:], key=lambda r: r["gain"])
    verdict = "meets" if best["gain"] >= 1.10 else "misses"
    print(f"- best: {best['name']}, {best['gain']:.3f}x ({best['gain_with_casts']:.3f}x with unfused casts); "
          f"it {verdict} issue 34's bar of 1.10x on this epoch")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, action="append",
                        help="fp8_bench --json of the call (repeatable: the cases of all are taken, the epoch of the "
                             "first that has one)")
    parser.add_argument("--deck", required=True)
    parser.add_argument("--mean-rows", type=float, default=32768.0)
    parser.add_argument("--bandwidth-tbs", type=float, default=4.19)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--speedups", help="write the measurement's bf16/FP8 ratios here (markdown)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args()
    bench = read_bench(args.bench)
    deck = read_deck(args.deck, args.overrides)
    if not (args.mean_rows > 0 and math.isfinite(args.mean_rows)):
        sys.exit("--mean-rows: a positive number")
    rows, notes = project(bench, deck, args.mean_rows, args.bandwidth_tbs * 1e12)
    out = print_table(rows, notes, bench)
    if args.speedups:
        with open(args.speedups, "w") as f:
            f.write(f"## FP8 against bf16, per shape ({bench.get('device', '?')}; bf16 time / FP8 time)\n\n")
            f.write("\n".join(speedup_lines(bench)) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": out, "notes": notes}, f, indent=1)


if __name__ == "__main__":
    main()
