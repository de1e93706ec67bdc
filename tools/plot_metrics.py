#!/usr/bin/env python3
"""plot_metrics.py — turn an aldit metrics.jsonl into PNG curves of loss, throughput and imbalance.

usage: tools/plot_metrics.py RUN_DIR/metrics.jsonl [--out DIR] [--smooth N]
       tools/plot_metrics.py --compare RUN_A/metrics.jsonl RUN_B/metrics.jsonl ... --out DIR

Writes loss.png (the training loss and, where the run validated ([eval] store), the validation loss
against it, and with [train] ema_decay the EMA weights' validation loss beside it), throughput.png and
imbalance.png into DIR (default: the metrics file's folder), and with validations also val_sigma.png (the
validation loss at each noise level of [eval] sigmas; the EMA's dashed in the same colour). With
--compare (runs over the same samples, e.g. one per balance strategy; each labelled by its run folder's
name) it writes compare_progress.png (samples done against elapsed step time) and compare_imbalance.png.
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


def plot(pyplot, series, title, ylabel, path, smooth, marked=()):
    """Curves of (label, points); those in `series` smoothed, those in `marked` (label, points[, dashed]) drawn
    as they are, with markers; a dashed one takes the colour of the marked curve before it."""
    figure, axes = pyplot.subplots(figsize=(8, 4.5))
    for label, points in series:
        if not points:
            continue
        steps, values = zip(*points)
        axes.plot(steps, values, alpha=0.35 if smooth > 1 else 1.0, linewidth=1, label=label)
        if smooth > 1:
            axes.plot(steps, moving_mean(list(values), smooth), linewidth=2, label=f"{label} (mean of {smooth})")
    colour = None
    for label, points, *dashed in marked:
        if not points:
            continue
        steps, values = zip(*points)
        if dashed and dashed[0]:
            axes.plot(steps, values, marker="s", linestyle="--", linewidth=1.5, color=colour, label=label)
        else:
            colour = axes.plot(steps, values, marker="o", linewidth=2, label=label)[0].get_color()
    axes.set_xlabel("step")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(ncol=3 if len(series) + len(marked) > 6 else 1, fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
    print(f"wrote {path}")


def plot_validation_levels(pyplot, rows, path):
    """The validation loss at each noise level against the step (val_sigmas, val_loss_sigma of the metrics lines)."""
    levels, ema_levels = {}, {}
    for row in rows:
        for key, into in (("val_loss_sigma", levels), ("val_loss_ema_sigma", ema_levels)):
            for sigma, loss in zip(row.get("val_sigmas") or [], row.get(key) or []):
                if loss is not None:
                    into.setdefault(sigma, []).append((row["step"], loss))
    curves = []
    for sigma, points in sorted(levels.items()):
        curves.append((f"sigma {sigma:g}", points))
        if sigma in ema_levels:
            curves.append((f"sigma {sigma:g}, EMA", ema_levels[sigma], True))
    title = "validation loss at each noise level" + (" (EMA weights dashed)" if ema_levels else "")
    plot(pyplot, [], title, "loss (mean per sample)", path, 1, curves)


def compare(pyplot, paths, out):
    runs = [(os.path.basename(os.path.dirname(os.path.abspath(path))), read_metrics(path)) for path in paths]
    figure, axes = pyplot.subplots(figsize=(8, 4.5))
    for label, rows in runs:
        elapsed, done, times, samples = 0.0, 0, [0.0], [0]
        for row in rows:
            elapsed += row["step_s"]
            done += row["samples"]
            times.append(elapsed)
            samples.append(done)
        axes.plot(times, samples, marker=".", label=f"{label}: {done / elapsed:.1f} samples/s")
    axes.set_xlabel("elapsed step time (s)")
    axes.set_ylabel("samples done")
    axes.set_title("progress through the same samples")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path = os.path.join(out, "compare_progress.png")
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
    print(f"wrote {path}")
    plot(pyplot, [(label, [(s, 100 * v) for s, v in column(rows, "imbalance")]) for label, rows in runs],
         "measured compute imbalance per step (1 - mean/max rank time)", "imbalance (%)",
         os.path.join(out, "compare_imbalance.png"), 1)


def main():
    parser = argparse.ArgumentParser(description="PNG curves of an aldit metrics.jsonl")
    parser.add_argument("metrics", nargs="+", help="metrics.jsonl written by aldit (several with --compare)")
    parser.add_argument("--compare", action="store_true", help="overlay runs over the same samples")
    parser.add_argument("--out", help="folder for the PNGs (default: the metrics file's folder)")
    parser.add_argument("--smooth", type=int, default=10, help="moving-mean window in steps (1 = none)")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        sys.exit("plot_metrics.py needs matplotlib: pip install matplotlib")

    out = args.out or os.path.dirname(os.path.abspath(args.metrics[0]))
    os.makedirs(out, exist_ok=True)
    if args.compare:
        compare(pyplot, args.metrics, out)
        return
    if len(args.metrics) > 1:
        sys.exit("plot_metrics.py: several metrics files need --compare")
    rows = read_metrics(args.metrics[0])
    throughput = [(row["step"], row["tokens"] / row["step_s"]) for row in rows if row.get("step_s")]
    validation = column(rows, "val_loss")
    plot(pyplot, [("training loss", column(rows, "loss"))],
         "training and validation loss" if validation else "training loss", "loss (mean per sample)",
         os.path.join(out, "loss.png"), args.smooth,
         [("validation loss (fixed noise levels and noise)", validation),
          ("validation loss, EMA weights", column(rows, "val_loss_ema"))])
    if validation:
        plot_validation_levels(pyplot, rows, os.path.join(out, "val_sigma.png"))
    plot(pyplot, [("tokens/s", throughput)], "throughput", "tokens per second (all ranks)",
         os.path.join(out, "throughput.png"), args.smooth)
    plot(pyplot, [("measured", [(s, 100 * v) for s, v in column(rows, "imbalance")]),
                  ("predicted", [(s, 100 * v) for s, v in column(rows, "imbalance_pred")])],
         "compute imbalance per step (1 - mean/max rank time)", "imbalance (%)",
         os.path.join(out, "imbalance.png"), args.smooth)


if __name__ == "__main__":
    main()
