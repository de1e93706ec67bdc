#!/usr/bin/env python3
"""runs_table.py — one Markdown table row per aldit run from its metrics.jsonl (plain Python, no packages).

usage: tools/runs_table.py RUN_A/metrics.jsonl [RUN_B/metrics.jsonl ...] [--peak-tflops 989] [--skip-steps 0]
                           [--baseline RUN]

Per run (labelled by its run folder's name), over its steps (the first --skip-steps left out): steps,
measured imbalance (mean over steps of 1 - mean/max per-rank compute time) and the balancer's predicted
one, time (sum of step_s), samples/s, tokens/s per GPU, MFU (model_flops / (time x ranks x peak)), peak
memory against the budget (largest mem_peak / mem_budget), data-wait share (sum of data_wait_s / time)
and the share of exposed communication (comm_s / time); the rank error spread, the mean over steps of
the largest minus the smallest per-rank prediction error (rank_compute_s / rank_pred_s - 1: what
unbalances the ranks; an error common to all ranks does not; "-" without those arrays); the bias,
predicted over measured compute per step (the ranks' sums of rank_pred_s over rank_compute_s; without those
arrays compute_s_pred over compute_s_max), as its mean (least–largest) over the steps: a bias common to all
ranks does not unbalance them but makes the balancer misjudge a step's length; and with --baseline RUN, each
run's samples/s over that run's.
"""
import argparse
import os
import sys

from plot_metrics import read_metrics  # the same folder; needs no matplotlib


def summarise(path, rows, peak_tflops):
    missing = [key for key in ("model_flops", "ranks") if key not in rows[0]]
    if missing:
        sys.exit(f"{path}: metrics lines without {', '.join(missing)} (written by an older aldit)")
    time_s = sum(row["step_s"] for row in rows)
    samples = sum(row["samples"] for row in rows)
    tokens = sum(row["tokens"] for row in rows)
    ranks = rows[0]["ranks"]
    flops = sum(row["model_flops"] for row in rows)
    return {
        "run": os.path.basename(os.path.dirname(os.path.abspath(path))),
        "ranks": ranks,
        "steps": len(rows),
        "imbalance": sum(row["imbalance"] for row in rows) / len(rows),
        "imbalance_pred": sum(row["imbalance_pred"] for row in rows) / len(rows),
        "time_s": time_s,
        "samples_per_s": samples / time_s,
        "tokens_per_s_per_gpu": tokens / time_s / ranks,
        "mfu": flops / (time_s * ranks * peak_tflops * 1e12),
        "mem": max(row["mem_peak"] / row["mem_budget"] for row in rows),
        "data_wait": sum(row["data_wait_s"] for row in rows) / time_s,
        "comm": sum(row["comm_s"] for row in rows) / time_s,
        "samples": samples,
        "rank_error_spread": rank_error_spread(rows),
        "bias": prediction_bias(rows),
    }


def prediction_bias(rows):
    """(mean, least, largest) over steps of predicted / measured compute; None where nothing was measured."""
    ratios = []
    for row in rows:
        measured, predicted = row.get("rank_compute_s"), row.get("rank_pred_s")
        if measured and predicted:
            m, p = sum(measured), sum(predicted)
        else:
            m, p = row.get("compute_s_max", 0.0), row.get("compute_s_pred", 0.0)
        if m > 0 and p > 0:
            ratios.append(p / m)
    return (sum(ratios) / len(ratios), min(ratios), max(ratios)) if ratios else None


def rank_error_spread(rows):
    """Mean over steps of max - min of the ranks' relative prediction errors; None without per-rank arrays."""
    spreads = []
    for row in rows:
        measured, predicted = row.get("rank_compute_s"), row.get("rank_pred_s")
        if not measured or not predicted:
            return None
        errors = [m / p - 1.0 for m, p in zip(measured, predicted) if p > 0]
        if errors:
            spreads.append(max(errors) - min(errors))
    return sum(spreads) / len(spreads) if spreads else None


def header(with_baseline):
    """The table's header and rule (with_baseline: the "vs baseline" column too)."""
    return ("| run | GPUs | steps | samples | imbalance measured (predicted) | time (s) | samples/s | tokens/s per GPU "
            "| MFU | peak mem / budget | data wait | comm | rank error spread | predicted / measured |"
            + (" vs baseline |" if with_baseline else "") + "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if with_baseline else ""))


def row(r, baseline=None):
    """One run's row from summarise(); with `baseline` (samples/s) its ratio to it."""
    spread = "-" if r["rank_error_spread"] is None else f"{100 * r['rank_error_spread']:.1f}%"
    ratio = f" {r['samples_per_s'] / baseline:.3f}x |" if baseline else ""
    bias = "-" if r["bias"] is None else f"{r['bias'][0]:.3f} ({r['bias'][1]:.3f}–{r['bias'][2]:.3f})"
    return (f"| {r['run']} | {r['ranks']} | {r['steps']} | {r['samples']} | {100 * r['imbalance']:.1f}% "
            f"({100 * r['imbalance_pred']:.1f}%) | {r['time_s']:.2f} | {r['samples_per_s']:.1f} | "
            f"{r['tokens_per_s_per_gpu']:,.0f} | {100 * r['mfu']:.1f}% | {100 * r['mem']:.1f}% | "
            f"{100 * r['data_wait']:.2f}% | {100 * r['comm']:.2f}% | {spread} | {bias} |{ratio}")


def main():
    parser = argparse.ArgumentParser(description="a Markdown table of aldit runs from their metrics.jsonl")
    parser.add_argument("metrics", nargs="+")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak per GPU (H100/H200: 989)")
    parser.add_argument("--skip-steps", type=int, default=0, help="leave out each run's first N steps")
    parser.add_argument("--baseline", help="the run (folder name) whose samples/s the others are compared with")
    args = parser.parse_args()
    summaries = []
    for path in args.metrics:
        rows = read_metrics(path)[args.skip_steps:]
        if not rows:
            sys.exit(f"{path}: no steps after the first {args.skip_steps}")
        summaries.append(summarise(path, rows, args.peak_tflops))
    baseline = None
    if args.baseline:
        matches = [r for r in summaries if r["run"] == args.baseline]
        if not matches:
            sys.exit(f"--baseline {args.baseline}: no such run among {', '.join(r['run'] for r in summaries)}")
        baseline = matches[0]["samples_per_s"]
    print(header(baseline is not None))
    for r in summaries:
        print(row(r, baseline))


if __name__ == "__main__":
    main()
