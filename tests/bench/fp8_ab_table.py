#!/usr/bin/env python3
"""fp8_ab_table.py — issue 34's accuracy A/B (tests/bench/fp8_ab.sh): the validation losses of the bf16 runs and of
each FP8 arm's runs (one metrics.jsonl per seed, the seeds in the same order in every arm), per validation step that
every run has reached, as one table per arm, the verdict by issue 34's rule, and optionally a PNG of the curves.
Plain Python (json); the PNG needs matplotlib (without it the table says so and no PNG is written).

usage: tests/bench/fp8_ab_table.py --bf16 METRICS... --arm NAME METRICS... [--arm NAME METRICS...] [--png FILE]
           [--json FILE] [--floor F] [--sigma-factor K]

The rule (issue 34, item 3), at every validation step: bound = max(F, (max - min of the bf16 seeds' val_loss) /
their mean), F = 0.25% (--floor 0.0025); the arm passes the step when its seeds' mean val_loss is within the bound of
the bf16 mean, |fp8 - bf16| / bf16 <= bound, and no noise level is worse by more than K = 3 times the bound
((fp8 - bf16) / bf16 of the means of val_loss_sigma at that sigma <= K bound). An arm passes when every step passes.
The metrics are aldit's (docs/running.md, Metrics): the lines with val_loss, val_sigmas and val_loss_sigma; a step
written twice counts by its last line (a resumed run's). A null val_loss (not finite) fails its step.

Both arms of a seed must have trained the same steps: every step both reached with the same samples, tokens and
micro-batches (the balancer pinned, tests/bench/fp8_ab.sh), else the comparison is refused as bad input.

Exit status: 0 every arm passes; 1 an arm fails; 2 bad input (a file missing or unreadable, a line not JSON, no
validation step common to all runs, other sigmas in one run, the arms of a seed trained on different steps).
"""
import argparse
import json
import math
import sys


def bad_input(message):
    print(f"fp8_ab_table.py: {message}", file=sys.stderr)
    sys.exit(2)


STEP_KEYS = ("samples", "tokens", "micro_batches")  # what the balancer gave a step: the same in both arms of a seed


def read_validations(path):
    """{step: (val_loss, [val_loss_sigma]), ...}, the sigmas and {step: (samples, tokens, micro_batches)} of a metrics
    file."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        bad_input(f"cannot read {path}: {e.strerror}")
    points, sigmas, shapes = {}, None, {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad_input(f"{path}:{number}: not a JSON line")
        if "step" in record:
            shapes[int(record["step"])] = tuple(record.get(key) for key in STEP_KEYS)
        if "val_loss" not in record:
            continue
        if "step" not in record or "val_sigmas" not in record or "val_loss_sigma" not in record:
            bad_input(f"{path}:{number}: a validation line without step, val_sigmas or val_loss_sigma")
        if sigmas is not None and record["val_sigmas"] != sigmas:
            bad_input(f"{path}:{number}: val_sigmas {record['val_sigmas']}, earlier {sigmas}")
        sigmas = record["val_sigmas"]
        to_float = lambda v: math.nan if v is None else float(v)  # noqa: E731
        points[int(record["step"])] = (to_float(record["val_loss"]), [to_float(v) for v in record["val_loss_sigma"]])
    return points, sigmas, shapes


def check_same_steps(name, bf16_paths, arm_paths, shapes_of):
    """Both arms of a seed must have trained the same steps (samples, tokens, micro-batches of every step both
    reached): else the A/B compares unlike runs, and it says where."""
    for seed, (ref, got) in enumerate(zip(bf16_paths, arm_paths), 1):
        a, b = shapes_of[ref], shapes_of[got]
        for step in sorted(set(a) & set(b)):
            if a[step] != b[step]:
                bad_input(f"seed {seed}: {got} step {step} trained {dict(zip(STEP_KEYS, b[step]))}, but {ref} "
                          f"{dict(zip(STEP_KEYS, a[step]))}: the arms did not see the same steps (balancer not pinned?)")


def mean(values):
    return sum(values) / len(values)


def compare_arm(bf16, arm, steps, floor, sigma_factor):
    """Rows of the table for one arm: per step the bf16 mean and spread, the arm's mean, the difference, the bound, the
    worst sigma and the verdict."""
    rows = []
    for step in steps:
        ref = [run[step][0] for run in bf16]
        got = [run[step][0] for run in arm]
        ref_mean, got_mean = mean(ref), mean(got)
        spread = max(ref) - min(ref)
        bound = max(floor, spread / ref_mean) if ref_mean > 0 else math.nan
        diff = (got_mean - ref_mean) / ref_mean if ref_mean > 0 else math.nan
        pairs = [(g - r) / r for g, r in zip(got, ref) if r > 0]
        n_sigmas = len(bf16[0][step][1])
        worst_sigma, worst = None, -math.inf
        for level in range(n_sigmas):
            r = mean([run[step][1][level] for run in bf16])
            g = mean([run[step][1][level] for run in arm])
            d = (g - r) / r if r > 0 else math.nan
            if not d <= worst:  # NaN counts as the worst
                worst_sigma, worst = level, d
        ok = abs(diff) <= bound and worst <= sigma_factor * bound  # False for any NaN
        rows.append({"step": step, "bf16_mean": ref_mean, "bf16_spread": spread, "bf16_spread_rel": spread / ref_mean
                     if ref_mean > 0 else math.nan, "mean": got_mean, "diff_rel": diff, "bound_rel": bound,
                     "pair_max_rel": max(pairs, key=abs) if pairs else math.nan, "worst_sigma_index": worst_sigma,
                     "worst_sigma_rel": worst, "pass": bool(ok)})
    return rows


def percent(value, signed=False):
    if value is None or math.isnan(value):
        return "nan"
    return f"{value * 100:+.3f}%" if signed else f"{value * 100:.3f}%"


def print_table(name, rows, sigmas, n_bf16, n_arm, floor, sigma_factor):
    print(f"### {name} against bf16: validation loss, means over {n_arm} and {n_bf16} seeds; bound = max({percent(floor)}, "
          f"bf16 spread / bf16 mean), no sigma worse than {sigma_factor:g}x the bound")
    print()
    print(f"| step | bf16 mean | bf16 spread (max - min) | {name} mean | {name} - bf16 | bound | largest seed pair "
          f"| worst sigma | verdict |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|:---|")
    for r in rows:
        sigma = "-" if r["worst_sigma_index"] is None else f"{sigmas[r['worst_sigma_index']]:g}"
        print(f"| {r['step']} | {r['bf16_mean']:.6f} | {r['bf16_spread']:.6f} ({percent(r['bf16_spread_rel'])}) "
              f"| {r['mean']:.6f} | {percent(r['diff_rel'], True)} | {percent(r['bound_rel'])} "
              f"| {percent(r['pair_max_rel'], True)} | {sigma}: {percent(r['worst_sigma_rel'], True)} "
              f"| {'PASS' if r['pass'] else 'FAIL'} |")
    failed = [r["step"] for r in rows if not r["pass"]]
    print()
    if failed:
        print(f"{name}: FAIL at step{'s' if len(failed) > 1 else ''} {', '.join(str(s) for s in failed)}")
    else:
        print(f"{name}: PASS at every one of the {len(rows)} validation steps")
    print()


def plot(path, steps, bf16, arms, tables):
    """Left: every run's validation loss (bf16 solid, arms dashed, a colour per seed); right: each arm's mean
    difference to bf16 in percent, with the bound's band."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError as e:
        return f"no PNG: matplotlib does not import ({e})"
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["--", ":", "-."]
    for seed, run in enumerate(bf16):
        left.plot(steps, [run[s][0] for s in steps], "-", color=colours[seed % len(colours)], label=f"bf16 seed {seed + 1}")
    for index, (name, runs) in enumerate(arms):
        for seed, run in enumerate(runs):
            left.plot(steps, [run[s][0] for s in steps], styles[index % len(styles)], color=colours[seed % len(colours)],
                      label=f"{name} seed {seed + 1}")
    left.set_xlabel("step")
    left.set_ylabel("val_loss")
    left.set_title("validation loss (fixed sigmas and noise)")
    left.legend(fontsize=7)
    bound = [r["bound_rel"] * 100 for r in tables[0][1]] if tables else []
    if bound:
        right.fill_between(steps, [-b for b in bound], bound, color="0.85", label="bound: max(0.25%, bf16 spread)")
    for index, (name, rows) in enumerate(tables):
        right.plot(steps, [r["diff_rel"] * 100 for r in rows], "o" + styles[index % len(styles)], label=f"{name} - bf16")
    right.axhline(0, color="0.5", linewidth=0.8)
    right.set_xlabel("step")
    right.set_ylabel("mean difference to bf16 (%)")
    right.set_title("FP8 arm against bf16")
    right.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return f"curves: {path}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bf16", nargs="+", required=True, metavar="METRICS", help="the bf16 runs' metrics.jsonl")
    parser.add_argument("--arm", nargs="+", action="append", required=True, metavar="NAME METRICS",
                        help="an FP8 arm's name and its runs' metrics.jsonl (seeds in the order of --bf16)")
    parser.add_argument("--png", help="write the curves here (needs matplotlib)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--floor", type=float, default=0.0025, help="the bound's floor (relative; default 0.0025)")
    parser.add_argument("--sigma-factor", type=float, default=3.0, help="a sigma may be worse by this times the bound")
    args = parser.parse_args()
    for arm in args.arm:
        if len(arm) < 2:
            bad_input(f"--arm {arm[0]}: needs a name and at least one metrics file")

    sigmas_of, shapes_of = {}, {}

    def load(path):
        points, sigmas, shapes = read_validations(path)
        if not points:
            bad_input(f"{path}: no validation line (val_loss)")
        sigmas_of[path], shapes_of[path] = sigmas, shapes
        return points
    bf16 = [load(path) for path in args.bf16]
    arms = [(arm[0], [load(path) for path in arm[1:]]) for arm in args.arm]
    if len({json.dumps(s) for s in sigmas_of.values()}) != 1:
        bad_input("the runs were validated at different sigmas: " +
                  "; ".join(f"{p}: {s}" for p, s in sigmas_of.items()))
    sigmas = next(iter(sigmas_of.values()))
    for arm in args.arm:
        check_same_steps(arm[0], args.bf16, arm[1:], shapes_of)
    runs = bf16 + [run for _, arm_runs in arms for run in arm_runs]
    steps = sorted(set.intersection(*(set(run) for run in runs)))
    if not steps:
        bad_input("no validation step common to every run")
    longest = max(max(run) for run in runs)
    if steps[-1] < longest:
        print(f"(steps up to {steps[-1]}, the last every run has reached; the furthest run is at {longest})")
        print()

    tables = [(name, compare_arm(bf16, arm_runs, steps, args.floor, args.sigma_factor)) for name, arm_runs in arms]
    for name, rows in tables:
        print_table(name, rows, sigmas, len(bf16), len(dict(arms)[name]), args.floor, args.sigma_factor)
    passed = all(r["pass"] for _, rows in tables for r in rows)
    print(f"A/B: {'PASS' if passed else 'FAIL'} (issue 34's rule; {len(steps)} validation steps, last {steps[-1]})")
    if args.png:
        print(plot(args.png, steps, bf16, arms, tables))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sigmas": sigmas, "floor": args.floor, "sigma_factor": args.sigma_factor, "pass": passed,
                       "arms": {name: rows for name, rows in tables}}, f, indent=1)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
