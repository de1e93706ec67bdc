#!/usr/bin/env python3
"""ema_recompute.py — checks a run's /ema against the EMA recomputed from its per-step weights (tests/train_ema.sh).

    ema_recompute.py [--rtol R] INIT DECAY WARMUP CKPT_1 ... CKPT_N

INIT: the weights the EMA started at (a [model] init file); CKPT_k: the checkpoint of step k (every step).
ema_k = float32(d_k * ema_{k-1} + (1 - d_k) * w_k) in float64, d_k = DECAY, or with WARMUP = 1
min(DECAY, k / (9 + k)), each step from the stored /ema of the step before (from INIT at step 1).
Prints "same N" when every /ema tensor of every step equals the recomputation bit for bit, else "within R N"
when each tensor's largest difference is at most R times its largest |value| (--rtol R, default 0: bitwise)
and the worst relative difference, and "moved X": the largest |ema_N - w_N| relative to the largest |w_N|, which
shows the EMA is no copy of the weights. Exit 1 on a mismatch.
"""
import sys

import h5py
import numpy as np


def weights(group):
    return {name: np.asarray(item[()], np.float32) for name, item in group.items() if isinstance(item, h5py.Dataset)}


def main():
    args = sys.argv[1:]
    rtol = 0.0
    if args[:1] == ["--rtol"]:
        rtol, args = float(args[1]), args[2:]
    init, decay, warmup, paths = args[0], float(args[1]), args[2] == "1", args[3:]
    with h5py.File(init, "r") as f:
        ema = weights(f)
    worst, failed, last = 0.0, False, None
    for step, path in enumerate(paths, 1):
        d = min(decay, step / (9.0 + step)) if warmup else decay
        with h5py.File(path, "r") as f:
            w, stored = weights(f), weights(f["ema"])
        if set(stored) != set(ema):
            print(f"{path}: /ema holds {len(stored)} tensors, the weights {len(ema)}")
            return 1
        for name in ema:
            ema[name] = (d * ema[name].astype(np.float64) + (1.0 - d) * w[name].astype(np.float64)).astype(np.float32)
            if not np.array_equal(ema[name], stored[name]):
                diff = float(np.max(np.abs(ema[name].astype(np.float64) - stored[name])))
                scale = max(float(np.max(np.abs(stored[name]))), 1e-30)
                worst = max(worst, diff / scale)
                if diff > rtol * scale:
                    failed = True
                    print(f"{path}: /ema/{name} differs from the recomputation by up to {diff:.3g} ({diff / scale:.3g} of its largest value)")
            ema[name] = stored[name]   # the next step from the stored EMA: the check is per step
        last = w
    top = max(float(np.max(np.abs(v))) for v in last.values())
    moved = max(float(np.max(np.abs(ema[n].astype(np.float64) - last[n]))) for n in last) / top
    print(f"moved {moved:.3g}")
    if failed:
        return 1
    print(f"same {len(paths)}" if worst == 0.0 else f"within {rtol:g} {len(paths)} (worst {worst:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
