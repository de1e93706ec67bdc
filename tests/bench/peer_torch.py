#!/usr/bin/env python3
"""peer_torch.py — the PyTorch peer of aldit-bench: device copy bandwidth; LayerNorm-Modulate (F.layer_norm
without affine in fp32, then * (1 + scale) + shift, bf16 out), forward and backward in GB/s over the same byte
floors that aldit-bench counts; F.scaled_dot_product_attention forward and backward (self S x S, cross S x T);
one Wan 2.1 block with Wan-1.3B's or Wan-14B's dims (--wan), forward+backward. Eager mode and torch.compile.

Run it in the same device call as aldit-bench so both measure the same machine:
    python3 tests/bench/peer_torch.py [--sections lnmod,attention,block] [--samples 2] [--rows 32760]
        [--dims 1536,3072,5120] [--seq 4096,16384,32760,75600] [--text-rows 512] [--wan 1.3b|14b] [--json FILE]
(--wan picks the attention and block sections' dims as aldit-bench's --wan does.)
"""
import argparse
import gc
import json
import statistics
import sys
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

# The block dims (--wan): dim, ffn_dim, heads (of HEAD_DIM), as aldit-bench's kWanModels.
WAN_DIMS = {"1.3b": (1536, 8960, 12), "14b": (5120, 13824, 40)}
HEAD_DIM, EPS = 128, 1e-6
ACTIVATION_DTYPE = torch.bfloat16  # of the LN-modulate outputs and the block's residual stream
BLOCK_WARMUP, BLOCK_REPEATS = 3, 10


def lnmod(x, shift, scale):
    """x [B, S, D] bf16; shift, scale [B, 1, D] fp32 (one vector per sample); bf16 out."""
    y = F.layer_norm(x.float(), (x.shape[-1],), eps=EPS)
    return (y * (1.0 + scale) + shift).to(ACTIVATION_DTYPE)


def time_ms(fn, repeats, launches, warmup=3):
    """Median over `repeats` groups of `launches` calls between two CUDA events, in ms per call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        for _ in range(launches):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / launches)
    return statistics.median(times)


def free_memory():
    gc.collect()
    torch.cuda.empty_cache()


# ---- LayerNorm-Modulate ---------------------------------------------------------------------------------


def run_lnmod(args, device, copy_gbs):
    B, S = args.samples, args.rows
    N = B * S
    print(f"LayerNorm-Modulate, B={B} samples x S={S} rows, bf16 rows, fp32 statistics and modulation")
    print(f"{'D':<6} {'op':<6} {'mode':<8} {'ms':>10} {'floor MB':>12} {'GB/s':>10} {'% copy':>9}")
    compiled = torch.compile(lnmod, dynamic=False)
    results = []
    for D in [int(d) for d in args.dims.split(",")]:
        x = (torch.rand(B, S, D, device=device) * 4 - 1.5).to(torch.bfloat16).requires_grad_()
        shift = ((torch.rand(B, 1, D, device=device) * 2 - 1) * 0.5).requires_grad_()
        scale = ((torch.rand(B, 1, D, device=device) * 2 - 1) * 0.5).requires_grad_()
        dy = (torch.rand(B, S, D, device=device) * 4 - 1.5).to(torch.bfloat16)
        # The same floors as aldit-bench: forward reads x and writes y (+ mean, rstd, modulation vectors);
        # backward reads x, dy, mean, rstd and writes dx (+ scale, dshift, dscale).
        floors = {"fwd": 4.0 * N * D + 8.0 * N + 8.0 * B * D, "bwd": 6.0 * N * D + 8.0 * N + 12.0 * B * D}
        for mode, fn in (("eager", lnmod), ("compile", compiled)):
            with torch.no_grad():
                fwd_ms = time_ms(lambda: fn(x, shift, scale), args.repeats, 10)

            def fwd_bwd():
                y = fn(x, shift, scale)
                torch.autograd.grad(y, (x, shift, scale), dy)

            # Backward alone = (forward + backward) - forward with autograd recording.
            fwd_rec_ms = time_ms(lambda: fn(x, shift, scale), args.repeats, 10)
            bwd_ms = time_ms(fwd_bwd, args.repeats, 10) - fwd_rec_ms
            for op, ms in (("fwd", fwd_ms), ("bwd", bwd_ms)):
                gbs = floors[op] / (ms * 1e6)
                results.append({"dim": D, "op": op, "mode": mode, "ms": ms, "gbs": gbs, "pct_copy": 100 * gbs / copy_gbs})
                print(f"{D:<6} {op:<6} {mode:<8} {ms:>10.4f} {floors[op] / 1e6:>12.1f} {gbs:>10.0f} {100 * gbs / copy_gbs:>8.1f}%")
        del x, dy, shift, scale
        free_memory()
    return results


# ---- attention ------------------------------------------------------------------------------------------


def attention_fwd_flops(n_q, n_kv, heads):
    """aldit's count (attention_fwd_flops): the two products, 4 * Sq * Skv * head_dim * heads; backward 2.5x."""
    return 4.0 * n_q * n_kv * HEAD_DIM * heads


def run_attention(args, device, seqs):
    HEADS = WAN_DIMS[args.wan][2]
    print(f"F.scaled_dot_product_attention ({HEADS} heads x {HEAD_DIM}, bf16, [B, S, heads, d] viewed as "
          f"[B, heads, S, d]), one sample; backward = (forward + backward) - forward with autograd recording:")
    print(f"{'S':<6} {'kind':<6} {'kv rows':>8} {'fwd ms':>10} {'fwd TF/s':>10} {'bwd ms':>10} {'bwd TF/s':>10} {'f+b TF/s':>10}")
    results = []
    for S in seqs:
        for kind, n_kv in (("self", S), ("cross", args.text_rows)):
            row = {"S": S, "kind": kind, "kv_rows": n_kv}
            try:
                q = torch.randn(1, S, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16).requires_grad_()
                k = torch.randn(1, n_kv, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16).requires_grad_()
                v = torch.randn(1, n_kv, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16).requires_grad_()
                dout = torch.randn(1, HEADS, S, HEAD_DIM, device=device, dtype=torch.bfloat16)

                def forward():
                    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

                def fwd_bwd():
                    torch.autograd.grad(forward(), (q, k, v), dout)

                with torch.no_grad():
                    fwd_ms = time_ms(forward, BLOCK_REPEATS, 1)
                fwd_rec_ms = time_ms(forward, BLOCK_REPEATS, 1)
                bwd_ms = time_ms(fwd_bwd, BLOCK_REPEATS, 1) - fwd_rec_ms
                flops = attention_fwd_flops(S, n_kv, HEADS)
                row.update(fwd_ms=fwd_ms, fwd_tflops=flops / (fwd_ms * 1e9), bwd_ms=bwd_ms,
                           bwd_tflops=2.5 * flops / (bwd_ms * 1e9), fwd_bwd_tflops=3.5 * flops / ((fwd_ms + bwd_ms) * 1e9))
                print(f"{S:<6} {kind:<6} {n_kv:>8} {fwd_ms:>10.3f} {row['fwd_tflops']:>10.1f} {bwd_ms:>10.3f} "
                      f"{row['bwd_tflops']:>10.1f} {row['fwd_bwd_tflops']:>10.1f}")
            except torch.cuda.OutOfMemoryError:
                row["error"] = "out of memory"
                print(f"{S:<6} {kind:<6} {n_kv:>8} out of memory")
            results.append(row)
            q = k = v = dout = None
            free_memory()
    return results


# ---- the Wan 2.1 block ----------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Wan's WanRMSNorm: x / sqrt(mean(x^2) + eps) over the last dim in fp32, back to x's dtype, times weight."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).type_as(x) * self.weight


def rope(x, cos, sin):
    """x [B, S, heads, head_dim]: each adjacent pair (2j, 2j+1) is a complex number turned by the angle of
    pair j (the complex product of Wan's rope_apply in its real form, in fp32); cos, sin [S, 1, head_dim / 2]."""
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    turned = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return turned.flatten(-2).type_as(x)


def rope_tables(grid, device):
    """cos, sin [S, 1, 64] of Wan 2.1's 3D RoPE on a token grid (frames, rows, columns), tokens in row-major
    order: of the 64 pairs of a 128-wide head, the first 22 turn by the frame index, the next 21 by the row, the
    last 21 by the column (c - 2(c // 3), c // 3, c // 3 with c = 64); pair j of a part of n pairs turns by
    position * 10000^(-j / n). Computed in float64 as Wan does, kept in fp32."""
    c = HEAD_DIM // 2
    parts = (c - 2 * (c // 3), c // 3, c // 3)
    positions = torch.meshgrid(*(torch.arange(n, dtype=torch.float64) for n in grid), indexing="ij")
    angles = torch.cat([position.reshape(-1, 1) * 10000.0 ** (-torch.arange(n, dtype=torch.float64) / n)
                        for position, n in zip(positions, parts)], dim=1)
    return (angles.cos().float().unsqueeze(1).to(device), angles.sin().float().unsqueeze(1).to(device))


class Attention(nn.Module):
    """Wan's WanSelfAttention / WanT2VCrossAttention: q, k, v, o Linear(D, D); q and k RMSNorm over all of D
    before the split into heads; 3D RoPE on q and k in self-attention; non-causal softmax attention."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x, context, cos=None, sin=None):
        B, S, L, H = x.shape[0], x.shape[1], context.shape[1], self.heads
        q = self.norm_q(self.q(x)).view(B, S, H, HEAD_DIM)
        k = self.norm_k(self.k(context)).view(B, L, H, HEAD_DIM)
        v = self.v(context).view(B, L, H, HEAD_DIM)
        if cos is not None:
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.o(out.transpose(1, 2).flatten(2))


class WanBlock(nn.Module):
    """Wan 2.1's WanAttentionBlock (t2v), as docs/model.md writes it, with e = the time projection [B, 6, D] (fp32):
        x = x + SelfAttn(LN(x)(1 + e1) + e0) e2      LN without affine, eps 1e-6, fp32
        x = x + CrossAttn(norm3(x), context)          norm3: LayerNorm with affine
        x = x + FFN(LN(x)(1 + e4) + e3) e5            Linear -> GELU(tanh) -> Linear
    bf16 weights and activations (the residual stream too, as in aldit); LayerNorm/RMSNorm statistics, the
    modulation and the gated residual sums in fp32."""

    def __init__(self, dim, ffn_dim, heads):
        super().__init__()
        self.dim = dim
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim ** 0.5)
        self.self_attn = Attention(dim, heads)
        self.norm3 = nn.LayerNorm(dim, eps=EPS)
        self.cross_attn = Attention(dim, heads)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(ffn_dim, dim))

    def forward(self, x, e, context, cos, sin):
        m = (self.modulation + e).chunk(6, dim=1)  # fp32 [B, 1, D] each
        h = lnmod(x, m[0], m[1])
        x = (x + self.self_attn(h, h, cos, sin) * m[2]).to(ACTIVATION_DTYPE)
        normed = F.layer_norm(x.float(), (self.dim,), self.norm3.weight.float(), self.norm3.bias.float(), EPS)
        x = x + self.cross_attn(normed.type_as(x), context)
        h = lnmod(x, m[3], m[4])
        return (x + self.ffn(h) * m[5]).to(ACTIVATION_DTYPE)


def block_grid(S):
    """A token grid (frames, rows, columns after the 1x2x2 patch) of exactly S tokens, aldit-bench's choice:
    Wan 2.1's shapes where S is one (32760 = 21x30x52: 81 frames of 480x832; 75600 = 21x45x80: 720x1280),
    else the most frames up to 21 that divide S, then the squarest rows x columns."""
    for grid in ((4, 32, 32), (16, 32, 32), (21, 30, 52), (21, 45, 80)):
        if grid[0] * grid[1] * grid[2] == S:
            return grid
    frames = next((f for f in range(21, 1, -1) if S % f == 0), 1)
    plane = S // frames
    rows = max(h for h in range(1, int(plane ** 0.5) + 1) if plane % h == 0)
    return (frames, rows, plane // rows)


def block_flops(S, T, dim, ffn_dim, heads):
    """3x the forward's FLOPs (issue 5's convention): GEMMs (self q, k, v, o and cross q, o on S rows, cross k, v
    on T rows, the FFN) and both attentions' two products."""
    gemm = 2.0 * S * dim * dim * 6 + 2.0 * T * dim * dim * 2 + 2.0 * 2 * S * dim * ffn_dim
    return 3.0 * (gemm + attention_fwd_flops(S, S, heads) + attention_fwd_flops(S, T, heads))


def run_block(args, device, seqs):
    T = args.text_rows
    DIM, FFN, HEADS = WAN_DIMS[args.wan]
    print(f"Wan-{args.wan} block forward+backward in PyTorch (dim {DIM}, ffn {FFN}, {HEADS} heads; one sample of S tokens "
          f"and {T} text tokens of dim {DIM} (the text embedding's output);\n  bf16 weights and activations; "
          f"gradients of the weights, x, e and the context; {BLOCK_WARMUP} warm-up steps, median of {BLOCK_REPEATS}; "
          f"TFLOP/s over 3x the forward's FLOPs):")
    print(f"{'S':<6} {'grid':<10} {'mode':<8} {'ms':>10} {'GFLOP':>9} {'TFLOP/s':>9}")
    torch.manual_seed(0)
    block = WanBlock(DIM, FFN, HEADS).to(device=device, dtype=torch.bfloat16)
    block.modulation.data = block.modulation.data.float()  # Wan keeps the modulation path in fp32
    modes = [(mode, block if mode == "eager" else torch.compile(block, dynamic=False)) for mode in args.modes.split(",")]
    results = []
    for S in seqs:
        grid = block_grid(S)
        grid_text = "x".join(str(n) for n in grid)
        flops = block_flops(S, T, DIM, FFN, HEADS)
        for mode, fn in modes:
            row = {"S": S, "grid": list(grid), "mode": mode, "gflop": flops / 1e9}
            try:
                cos, sin = rope_tables(grid, device)
                x = torch.randn(1, S, DIM, device=device, dtype=torch.bfloat16).requires_grad_()
                e = (0.1 * torch.randn(1, 6, DIM, device=device)).requires_grad_()
                context = torch.randn(1, T, DIM, device=device, dtype=torch.bfloat16).requires_grad_()
                dy = torch.randn(1, S, DIM, device=device, dtype=torch.bfloat16)
                leaves = [x, e, context, *block.parameters()]

                def step():
                    for leaf in leaves:
                        leaf.grad = None
                    fn(x, e, context, cos, sin).backward(dy)

                ms = time_ms(step, BLOCK_REPEATS, 1, warmup=BLOCK_WARMUP)
                row.update(ms=ms, tflops=flops / (ms * 1e9))
                print(f"{S:<6} {grid_text:<10} {mode:<8} {ms:>10.3f} {flops / 1e9:>9.1f} {row['tflops']:>9.1f}")
            except torch.cuda.OutOfMemoryError:
                row["error"] = "out of memory"
                print(f"{S:<6} {grid_text:<10} {mode:<8} out of memory")
            except Exception as error:  # a failed compile must not cost the other rows
                row["error"] = f"{type(error).__name__}: {error}"
                print(f"{S:<6} {grid_text:<10} {mode:<8} failed: {type(error).__name__} (traceback on stderr)")
                traceback.print_exc(file=sys.stderr)
            results.append(row)
            x = e = context = dy = cos = sin = leaves = None
            block.zero_grad(set_to_none=True)
            free_memory()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default="lnmod", help="comma-separated: lnmod, attention, block")
    parser.add_argument("--samples", type=int, default=2, help="lnmod: samples")
    parser.add_argument("--rows", type=int, default=32760, help="lnmod: rows (tokens) per sample")
    parser.add_argument("--dims", default="1536,3072,5120", help="lnmod: D values")
    parser.add_argument("--repeats", type=int, default=21, help="lnmod: timed groups of 10 launches")
    parser.add_argument("--seq", default="4096,16384,32760,75600", help="attention, block: tokens S of the sample")
    parser.add_argument("--text-rows", type=int, default=512, help="attention, block: text tokens T")
    parser.add_argument("--wan", choices=sorted(WAN_DIMS), default="1.3b",
                        help="attention, block: Wan-1.3B's dims (1536, ffn 8960, 12 heads) or Wan-14B's (5120, 13824, 40)")
    parser.add_argument("--modes", default="eager,compile", help="block: eager, compile or both")
    parser.add_argument("--json")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # rows show up as they are measured, also through a pipe
    sections = args.sections.split(",")
    unknown = [s for s in sections if s not in ("lnmod", "attention", "block")]
    if unknown:
        parser.error(f"--sections {args.sections}: unknown section {unknown[0]} (lnmod, attention, block)")
    seqs = [int(s) for s in args.seq.split(",")]
    if not args.modes or any(mode not in ("eager", "compile") for mode in args.modes.split(",")):
        parser.error(f"--modes {args.modes}: eager, compile or eager,compile")
    json_out = open(args.json, "w") if args.json else None  # a bad path fails before the measurements
    device = torch.device("cuda")
    torch.manual_seed(0)

    n_copy = 2 << 30
    src = torch.randint(0, 255, (n_copy,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src), args.repeats, 10)
    copy_gbs = 2 * n_copy / (copy_ms * 1e6)
    del src, dst
    free_memory()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    print(f"device copy (torch copy_, 2 GiB, read + write): {copy_ms:.3f} ms, {copy_gbs:.0f} GB/s", flush=True)

    dim, ffn_dim, heads = WAN_DIMS[args.wan]
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "copy_gbs": copy_gbs,
              "wan": args.wan, "dim": dim, "ffn_dim": ffn_dim, "heads": heads}
    if "lnmod" in sections:
        report.update(samples=args.samples, rows_per_sample=args.rows, lnmod=run_lnmod(args, device, copy_gbs))
    if "attention" in sections:
        report.update(text_rows=args.text_rows, attention=run_attention(args, device, seqs))
    if "block" in sections:
        report.update(text_rows=args.text_rows, block=run_block(args, device, seqs))
    if json_out:
        with json_out:
            json.dump(report, json_out, indent=1)


if __name__ == "__main__":
    main()
