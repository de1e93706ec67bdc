#!/usr/bin/env python3
"""kernel_summary.py — a profile's GPU kernel time by kind (attention, GEMMs, aldit's own kernels), plain Python.

usage: tools/kernel_summary.py CSV [--top N]

CSV is either Nsight Compute's raw page of a report recorded with the kernel durations,
    ncu --profile-from-start off --metrics gpu__time_duration.sum -f -o prof aldit DECK log.profile_from=5
    ncu -i prof.ncu-rep --csv --page raw --metrics gpu__time_duration.sum > prof.csv
or Nsight Systems' kernel summary,
    nsys stats --report cuda_gpu_kern_sum --format csv -o prof prof.nsys-rep    (writes prof_cuda_gpu_kern_sum.csv)
(docs/running.md, "Profiling"). Prints the total, each kind's milliseconds and share, then the N kernels that
took longest (default 30). A kernel's kind is the first of KINDS whose pattern its name matches.
docs/PERFORMANCE.md, "Session 12", used it.
"""
import argparse
import collections
import csv
import re
import sys

KINDS = [
    ("cuDNN attention", r"cudnn|fmha|sdpa|flash"),
    ("cuBLASLt GEMMs", r"nvjet|xmma|gemm|cutlass|splitKreduce"),
    ("own attention", r"attention"),
    ("LN-modulate", r"lnmod"),
    ("RMSNorm + RoPE", r"rope|qk_norm"),
    ("bias column sums", r"colsum|column_partials"),
    ("AdamW, norms", r"adamw|sumsq"),
    ("copies, fills, conversions", r"fill|copy|memset|f32_to_bf16|bf16_to_f32"),
]


def read_kernels(path):
    """{kernel name: [calls, milliseconds]} from either CSV."""
    rows = list(csv.reader(open(path, newline="")))
    if not rows:
        sys.exit(f"kernel_summary.py: {path} is empty")
    header = rows[0]
    kernels = collections.defaultdict(lambda: [0, 0.0])
    if "Total Time (ns)" in header:  # nsys cuda_gpu_kern_sum
        name, total, calls = header.index("Name"), header.index("Total Time (ns)"), header.index("Instances")
        for row in rows[1:]:
            kernels[row[name]][0] += int(row[calls])
            kernels[row[name]][1] += float(row[total]) / 1e6
    elif "gpu__time_duration.sum" in header:  # ncu raw page: a units row, then one row per kernel launch
        name, duration = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
        unit = rows[1][duration] if len(rows) > 1 else "ns"
        to_ms = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}.get(unit)
        if to_ms is None:
            sys.exit(f"kernel_summary.py: {path}: unknown time unit {unit!r} of gpu__time_duration.sum")
        for row in rows[2:]:
            try:
                milliseconds = float(row[duration].replace(",", "")) * to_ms
            except (ValueError, IndexError):
                continue
            kernels[row[name]][0] += 1
            kernels[row[name]][1] += milliseconds
    else:
        sys.exit(f"kernel_summary.py: {path} is neither an ncu raw CSV with gpu__time_duration.sum nor an nsys "
                 "cuda_gpu_kern_sum CSV")
    return kernels


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "the rest"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    kernels = read_kernels(args.csv)
    total = sum(ms for _, ms in kernels.values())
    if total <= 0:
        sys.exit(f"kernel_summary.py: {args.csv} holds no kernel times")
    by_kind = collections.defaultdict(float)
    for name, (_, ms) in kernels.items():
        by_kind[kind_of(name)] += ms
    print(f"kernels: {sum(calls for calls, _ in kernels.values())} launches, {total:.1f} ms")
    print("| kind | ms | share |\n|---|---|---|")
    for kind, ms in sorted(by_kind.items(), key=lambda item: -item[1]):
        print(f"| {kind} | {ms:.1f} | {100 * ms / total:.1f}% |")
    print(f"the {args.top} longest:")
    for name, (calls, ms) in sorted(kernels.items(), key=lambda item: -item[1][1])[:args.top]:
        print(f"{ms:10.2f} ms {calls:6d}  {name[:110]}")


if __name__ == "__main__":
    main()
