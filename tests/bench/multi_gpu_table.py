#!/usr/bin/env python3
"""multi_gpu_table.py — the Markdown tables of tests/bench/multi_gpu.sh from the run folders it leaves in WORK.

usage: tests/bench/multi_gpu_table.py --work WORK --issue 21|22 --ngpu N --sections strategies,shard,wan14b,wan14b_fixed

Reads, per run LABEL: WORK/LABEL.status ("RC SECONDS NOTE...", written by multi_gpu.sh), WORK/LABEL.log (its
stdout and stderr: the start-up lines `model`, `store`, `state`, `capacity`), WORK/LABEL/metrics.jsonl and
WORK/LABEL.gpu_peak (the largest memory.used in MiB over the GPUs while it ran, where nvidia-smi was there).
Per Wan-14B section SECTION: WORK/SECTION.search ("sim K" and "K RC" lines: aldit-sim's guess and each
`aldit --check` in order) and WORK/SECTION.layers (the layers trained). A run that failed, timed out or was not
run is a row saying so (with its log's last line). Plain Python (tools/runs_table.py and plot_metrics.py's
reader); exits 0 whatever the runs did (multi_gpu.sh decides its own status).
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from runs_table import header, row, summarise  # noqa: E402  (the tools folder, above)
from plot_metrics import read_metrics  # noqa: E402

# Per issue: global's measured imbalance at most, global / equal_tokens at least, N GPUs / 1 GPU at least,
# model TFLOP/s per GPU at least (None: no target).
TARGETS = {21: (0.01, 1.25, 1.95, None), 22: (0.02, 1.6, 7.6, 450.0)}
SHARDS = ("none", "optimizer", "gradients", "full")


def cell(text):
    return str(text).replace("|", "\\|")


def last_line(log):
    """The log's most telling line: its first diagnostic (an error, or an aldit: line; for "aldit: N error(s) in the
    deck" the line before it, which names the key), else its last line that is not MPI's banner."""
    try:
        with open(log, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "no log"
    for i, line in enumerate(lines):
        if "MPI" in line or line.startswith("aldit: checkpoint"):
            continue
        if re.search(r"\berror\b", line, re.I) or line.startswith("aldit:"):
            if re.match(r"aldit: \d+ errors? in the deck", line) and i > 0:
                line = lines[i - 1]
            return line[:200]
    for line in reversed(lines):
        if not set(line) <= set("-=") and "MPI" not in line and not line.startswith(("Process name", "Exit code")):
            return line[:200]
    return "empty log"


def size(n):
    """Bytes as GiB, MiB or KiB, whichever reads best."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= 0.1 * scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 1024:.1f} KiB"


def rate(value):
    """TFLOP/s: one decimal where it is large, three significant digits where it is small (CPU runs)."""
    return "-" if value is None else (f"{value:.1f}" if value >= 10 else f"{value:.3g}")


class Run:
    """One run of the script: its status, log, metrics (rows, or None) and start-up lines."""

    def __init__(self, work, label):
        self.label = label
        alias = os.path.join(work, label + ".alias")  # shard none: the strategies' run of the same deck
        if os.path.exists(alias):
            with open(alias) as f:
                self.label = f.read().strip()
        base = os.path.join(work, self.label)
        self.log = base + ".log"
        self.status, self.seconds, self.note = None, None, ""
        try:
            with open(base + ".status") as f:
                fields = f.read().split(None, 2)
            self.status, self.seconds = int(fields[0]), float(fields[1])
            self.note = fields[2].strip() if len(fields) > 2 else ""
        except (OSError, ValueError, IndexError):
            pass
        self.rows = None
        metrics = os.path.join(base, "metrics.jsonl")
        if self.status == 0 and os.path.exists(metrics) and os.path.getsize(metrics) > 0:
            self.rows = read_metrics(metrics)
        self.gpu_peak_mib = None
        try:
            with open(base + ".gpu_peak") as f:
                self.gpu_peak_mib = float(f.read().strip())
        except (OSError, ValueError):
            pass
        self.text = ""
        try:
            with open(self.log, errors="replace") as f:
                self.text = f.read(200000)
        except OSError:
            pass

    def ok(self):
        return self.rows is not None

    def why(self):
        """What happened to a run without a table row of numbers."""
        if self.status is None or self.status < 0:
            return self.note or "not run"
        if self.status == 0:
            return f"exit 0 after {self.seconds:.1f} s but no metrics lines"
        what = self.note or f"failed: exit {self.status}"
        progress = [line for line in self.text.splitlines() if line.startswith("step ")]
        told = f"last progress line: {progress[-1][:160]}" if progress and self.note.startswith("timed out") else None
        return f"{what} after {self.seconds:.1f} s: {told or last_line(self.log)}"

    def startup(self, key, pattern):
        """A group of the start-up line `key` (e.g. state) matched by `pattern`, or None."""
        for line in self.text.splitlines():
            if line.strip().startswith(key + " "):
                found = re.search(pattern, line)
                if found:
                    return found.group(1)
        return None

    def summary(self, skip=0):
        rows = self.rows[skip:]
        return summarise(os.path.join(self.label, "metrics.jsonl"), rows, 989.0) if rows else None

    def tflops_per_gpu(self, skip=0):
        rows = self.rows[skip:]
        if not rows:
            return None
        return sum(r["model_flops"] for r in rows) / sum(r["step_s"] for r in rows) / rows[0]["ranks"] / 1e12

    def gpu_peak(self):
        return "-" if self.gpu_peak_mib is None else f"{self.gpu_peak_mib / 1024:.1f}"


def failure_row(run, columns):
    return f"| {run.label} | {cell(run.why())} |" + " |" * (columns - 2)


def verdict(name, value, ok, shown):
    if value is None:
        return f"- {name}: not measured (a run is missing)"
    return f"- {name}: {shown} — {'met' if ok else 'NOT met'}"


def strategies(work, issue, ngpu):
    labels = [f"global_{ngpu}gpu", f"equal_tokens_{ngpu}gpu", f"dual_{ngpu}gpu", "global_1gpu"]
    runs = {label: Run(work, label) for label in labels}
    max_imbalance, over_equal, over_one, _ = TARGETS[issue]
    base = runs["global_1gpu"].summary() if runs["global_1gpu"].ok() else None
    print(f"### The strategies on {ngpu} GPUs and the 1-GPU baseline (issue {issue})\n")
    for skip, title in ((0, "whole epoch"), (1, "from step 2 on (--skip-steps 1)")):
        print(f"{title}:\n")
        one = runs["global_1gpu"].summary(skip) if base else None
        print(header(one is not None))
        for label in labels:
            run = runs[label]
            summary = run.summary(skip) if run.ok() else None
            if summary is None:
                print(failure_row(run, 13 + (one is not None)))
            else:
                print(row(summary, one["samples_per_s"] if one else None))
        print()
    got = {label: runs[label].summary() if runs[label].ok() else None for label in labels}
    glob, equal = got[f"global_{ngpu}gpu"], got[f"equal_tokens_{ngpu}gpu"]
    print(f"Targets (issue {issue}):")
    value = glob["imbalance"] if glob else None
    print(verdict(f"global measured imbalance <= {100 * max_imbalance:g}%", value,
                  value is not None and value <= max_imbalance, value is not None and f"{100 * value:.2f}%"))
    value = glob["samples_per_s"] / equal["samples_per_s"] if glob and equal else None
    print(verdict(f"global >= {over_equal:g}x the samples/s of equal_tokens", value,
                  value is not None and value >= over_equal, value is not None and f"{value:.3f}x"))
    value = glob["samples_per_s"] / base["samples_per_s"] if glob and base else None
    print(verdict(f"{ngpu} GPUs >= {over_one:g}x the samples/s of 1 GPU (global)", value,
                  value is not None and value >= over_one, value is not None and f"{value:.3f}x"))
    print()


def shard(work, issue, ngpu):
    runs = [(mode, Run(work, f"shard_{mode}")) for mode in SHARDS]
    none = dict(runs)["none"]
    none_rate = none.summary()["samples_per_s"] if none.ok() else None
    print(f"### `[train] shard` on {ngpu} GPUs, the same samples (issue {issue})\n")
    print("| shard | run | steps | time (s) | samples/s | vs none | within 3% of none | state per rank | "
          "peak activations | budget | GPU peak (nvidia-smi, GiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, run in runs:
        if not run.ok():
            print(f"| {mode} " + failure_row(run, 10))
            continue
        s = run.summary()
        ratio = s["samples_per_s"] / none_rate if none_rate else None
        state = run.startup("state", r"(\d[\d.]* [KMGT]?i?B) per rank") or "-"
        peak = size(max(r["mem_peak"] for r in run.rows))
        budget = size(max(r["mem_budget"] for r in run.rows))
        within = "-" if ratio is None or mode == "none" else ("yes" if ratio >= 0.97 else "NO")
        print(f"| {mode} | {run.label} | {s['steps']} | {s['time_s']:.2f} | {s['samples_per_s']:.1f} | "
              f"{'-' if ratio is None else f'{ratio:.3f}x'} | {within} | {state} | {peak} | {budget} | "
              f"{run.gpu_peak()} |")
    print()


def search_lines(work, section):
    sim, checks = None, []
    try:
        with open(os.path.join(work, section + ".search")) as f:
            for line in f:
                fields = line.split()
                if len(fields) == 2 and fields[0] == "sim":
                    sim = fields[1]
                elif len(fields) == 2:
                    checks.append((int(fields[0]), int(fields[1])))
    except (OSError, ValueError):
        pass
    return sim, checks


def wan14b(work, issue, ngpu, section):
    target = TARGETS[issue][3]
    fixed = section == "wan14b_fixed"
    print(f"### Wan-14B dims, `shard = full`, {ngpu} GPUs, {'fixed-length' if fixed else 'mixed'} samples "
          f"(issue {issue})\n")
    sim, checks = search_lines(work, section)
    if checks or sim:
        tried = ", ".join(f"{k}: exit {rc}" for k, rc in checks) or "none"
        print(f"Layer search: aldit-sim's guess {sim or '-'}; `aldit --check` {tried}.\n")
    layers = None
    try:
        with open(os.path.join(work, section + ".layers")) as f:
            layers = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    print("| run | layers | parameters | GPUs | steps | tokens | longest sample in the store | capacity (tokens per "
          "micro-batch) | time (s) | model TFLOP/s per GPU | from step 2 | state per rank | peak activations / budget "
          "| GPU peak (nvidia-smi, GiB) |" + (f" >= {target:g} |" if target else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if target else ""))
    columns = 14 + (target is not None)
    if layers is None:
        print(f"| {section} | no layer count passed `aldit --check` (see {section}.search and the check logs) |"
              + " |" * (columns - 2))
        print()
        return
    run = Run(work, f"{section}_{layers}l")
    if not run.ok():
        print(failure_row(run, columns))
        print()
        return
    tflops, later = run.tflops_per_gpu(), run.tflops_per_gpu(1)
    params = run.startup("model", r"; (\d+) parameters")
    params = "-" if not params else (f"{int(params) / 1e9:.2f} B" if int(params) >= 1e8 else f"{int(params):,}")
    longest = run.startup("store", r"\(\d+ to (\d+) per sample\)") or "-"
    capacity = run.startup("capacity", r"up to (\d+) tokens") or "-"
    state = run.startup("state", r"(\d[\d.]* [KMGT]?i?B) per rank") or "-"
    peak = size(max(r["mem_peak"] for r in run.rows))
    budget = size(max(r["mem_budget"] for r in run.rows))
    tokens = sum(r["tokens"] for r in run.rows)
    met = "" if not target else f" {'yes' if tflops >= target else 'NO'} |"
    print(f"| {run.label} | {layers} | {params} | {run.rows[0]['ranks']} | {len(run.rows)} | {tokens:,} | "
          f"{longest} | {capacity} | {sum(r['step_s'] for r in run.rows):.2f} | {rate(tflops)} | {rate(later)} | "
          f"{state} | {peak} / {budget} | {run.gpu_peak()} |{met}")
    print()


def main():
    parser = argparse.ArgumentParser(description="the tables of tests/bench/multi_gpu.sh")
    parser.add_argument("--work", required=True)
    parser.add_argument("--issue", type=int, choices=sorted(TARGETS), required=True)
    parser.add_argument("--ngpu", type=int, required=True)
    parser.add_argument("--sections", required=True)
    args = parser.parse_args()
    for section in args.sections.split(","):
        if section == "strategies":
            strategies(args.work, args.issue, args.ngpu)
        elif section == "shard":
            shard(args.work, args.issue, args.ngpu)
        elif section in ("wan14b", "wan14b_fixed"):
            wan14b(args.work, args.issue, args.ngpu, section)
        else:
            sys.exit(f"--sections: unknown section {section} (strategies, shard, wan14b, wan14b_fixed)")


if __name__ == "__main__":
    main()
