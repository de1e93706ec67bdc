#!/usr/bin/env python3
"""clock_summary.py — the GPU's clocks and power over the phases of a benchmark run (plain Python, no packages).

usage: tools/clock_summary.py SMI_CSV MARKS [--min-watts W]

SMI_CSV is what this writes beside the runs (one line every 50 ms):
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv -lms 50 > smi.csv &
MARKS holds one line per phase boundary, "EPOCH_SECONDS LABEL", e.g. after each run
    echo "$(date +%s.%N) block K=8" >> marks.txt
(and one line before the first run). Each phase runs from one mark to the next and takes the later mark's label.
Per phase, over the samples drawing more than --min-watts (default 300 W: the GPU at work, not between runs):
the median and 10th-percentile SM clock, the median and 90th-percentile power, and the share of samples in which
the software power cap (clock event reason 0x4) was active. docs/PERFORMANCE.md, "Session 7", used it.
"""
import argparse
import csv
import datetime
import sys

SW_POWER_CAP = 0x4


def parse_samples(path):
    """(epoch seconds, SM MHz, watts, event reasons) per sample line; the header and odd lines are skipped."""
    samples = []
    with open(path, newline="") as handle:
        for row in csv.reader(handle):
            if len(row) < 4 or "MHz" not in row[1]:
                continue
            try:
                stamp = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
                epoch = stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
                samples.append((epoch, int(row[1].split()[0]), float(row[2].split()[0]), int(row[3].strip(), 16)))
            except ValueError:
                continue
    return samples


def parse_marks(path):
    marks = []
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            fields = line.split(None, 1)
            if not fields:
                continue
            try:
                marks.append((float(fields[0]), fields[1].strip() if len(fields) > 1 else f"phase {number}"))
            except ValueError:
                sys.exit(f"clock_summary.py: {path}:{number}: expected 'EPOCH_SECONDS LABEL', got {line.strip()!r}")
    return sorted(marks)


def quantile(values, fraction):
    return values[min(len(values) - 1, int(fraction * len(values)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("smi_csv")
    parser.add_argument("marks")
    parser.add_argument("--min-watts", type=float, default=300.0)
    args = parser.parse_args()
    samples, marks = parse_samples(args.smi_csv), parse_marks(args.marks)
    if not samples:
        sys.exit(f"clock_summary.py: {args.smi_csv}: no samples (expected nvidia-smi's csv with timestamp, "
                 "clocks.sm, power.draw, clocks_event_reasons.active)")
    if len(marks) < 2:
        sys.exit(f"clock_summary.py: {args.marks}: needs at least two marks (a phase runs from one to the next)")
    print(f"{'phase':<32} {'samples':>7} {'SM MHz med':>10} {'p10':>5} {'W med':>6} {'p90':>5} {'power-capped':>12}")
    for (start, _), (end, label) in zip(marks, marks[1:]):
        busy = [s for s in samples if start <= s[0] < end and s[2] > args.min_watts]
        if not busy:
            print(f"{label:<32} {0:>7}")
            continue
        clocks, watts = sorted(s[1] for s in busy), sorted(s[2] for s in busy)
        capped = sum(1 for s in busy if s[3] & SW_POWER_CAP) / len(busy)
        print(f"{label:<32} {len(busy):>7} {quantile(clocks, 0.5):>10} {quantile(clocks, 0.1):>5} "
              f"{quantile(watts, 0.5):>6.0f} {quantile(watts, 0.9):>5.0f} {100 * capped:>11.0f}%")


if __name__ == "__main__":
    main()
