#!/usr/bin/env python3
"""plot_metrics.py — turn an aldit metrics.jsonl into PNG curves of loss, throughput and imbalance.

usage: tools/plot_metrics.py RUN_DIR/metrics.jsonl [--out DIR] [--smooth N]

Writes loss.png, throughput.png and imbalance.png into DIR (default: the metrics file's folder).
Needs matplotlib (pip install matplotlib). Steps skipped for a non-finite loss (loss null) are left out.
"""
import argparse
import json
import os
import sys


def read_metrics(path):
    rows = []
    with open(path) as metrics:
        for number, line in enumerate(metrics, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                sys.exit(f"{path}:{number}: not a JSON line: {error}")
    if not rows:
        sys.exit(f"{path}: no metrics lines")
    return rows


def moving_mean(values, window):
    if window <= 1:
        return values
    means, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        means.append(total / min(i + 1, window))
    return means


def column(rows, key):
    return [(row["step"], row[key]) for row in rows if row.get(key) is not None]


def plot(pyplot, series, title, ylabel, path, smooth):
    figure, axes = pyplot.subplots(figsize=(8, 4.5))
    for label, points in series:
        if not points:
            continue
        steps, values = zip(*points)
        axes.plot(steps, values, alpha=0.35 if smooth > 1 else 1.0, linewidth=1, label=label)
        if smooth > 1:
            axes.plot(steps, moving_mean(list(values), smooth), linewidth=2, label=f"{label} (mean of {smooth})")
    axes.set_xlabel("step")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description="PNG curves of an aldit metrics.jsonl")
    parser.add_argument("metrics", help="metrics.jsonl written by aldit")
    parser.add_argument("--out", help="folder for the PNGs (default: the metrics file's folder)")
    parser.add_argument("--smooth", type=int, default=10, help="moving-mean window in steps (1 = none)")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        sys.exit("plot_metrics.py needs matplotlib: pip install matplotlib")

    rows = read_metrics(args.metrics)
    out = args.out or os.path.dirname(os.path.abspath(args.metrics))
    os.makedirs(out, exist_ok=True)
    throughput = [(row["step"], row["tokens"] / row["step_s"]) for row in rows if row.get("step_s")]
    plot(pyplot, [("loss", column(rows, "loss"))], "training loss", "loss (mean per sample)",
         os.path.join(out, "loss.png"), args.smooth)
    plot(pyplot, [("tokens/s", throughput)], "throughput", "tokens per second (all ranks)",
         os.path.join(out, "throughput.png"), args.smooth)
    plot(pyplot, [("measured", [(s, 100 * v) for s, v in column(rows, "imbalance")]),
                  ("predicted", [(s, 100 * v) for s, v in column(rows, "imbalance_pred")])],
         "compute imbalance per step (1 - mean/max rank time)", "imbalance (%)",
         os.path.join(out, "imbalance.png"), args.smooth)


if __name__ == "__main__":
    main()
