#!/usr/bin/env python3
"""peer_torch.py — the PyTorch peer of aldit-bench: device copy bandwidth and LayerNorm-Modulate
(F.layer_norm without affine in fp32, then * (1 + scale) + shift, bf16 out) in eager mode and under
torch.compile, forward and backward, in GB/s over the same byte floors that aldit-bench counts.

Run it in the same device call as aldit-bench so both measure the same machine:
    python3 tests/bench/peer_torch.py [--samples 2] [--rows 32760] [--dims 1536,3072,5120] [--json FILE]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def lnmod(x, shift, scale):
    """x [B, S, D] bf16; shift, scale [B, 1, D] fp32 (one vector per sample); bf16 out."""
    y = F.layer_norm(x.float(), (x.shape[-1],), eps=1e-6)
    return (y * (1.0 + scale) + shift).to(torch.bfloat16)


def time_ms(fn, repeats, launches):
    """Median over `repeats` groups of `launches` calls between two CUDA events, in ms per call."""
    for _ in range(3):
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--rows", type=int, default=32760, help="rows (tokens) per sample")
    parser.add_argument("--dims", default="1536,3072,5120")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--json")
    args = parser.parse_args()
    dims = [int(d) for d in args.dims.split(",")]
    B, S = args.samples, args.rows
    N = B * S
    device = torch.device("cuda")
    torch.manual_seed(0)

    n_copy = 2 << 30
    src = torch.randint(0, 255, (n_copy,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src), args.repeats, 10)
    copy_gbs = 2 * n_copy / (copy_ms * 1e6)
    del src, dst
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"device copy (torch copy_, 2 GiB, read + write): {copy_ms:.3f} ms, {copy_gbs:.0f} GB/s")
    print(f"LayerNorm-Modulate, B={B} samples x S={S} rows, bf16 rows, fp32 statistics and modulation")
    print(f"{'D':<6} {'op':<6} {'mode':<8} {'ms':>10} {'floor MB':>12} {'GB/s':>10} {'% copy':>9}")

    compiled = torch.compile(lnmod, dynamic=False)
    results = []
    for D in dims:
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
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"torch": torch.__version__, "copy_gbs": copy_gbs, "samples": B, "rows_per_sample": S,
                       "lnmod": results}, out, indent=1)


if __name__ == "__main__":
    main()
