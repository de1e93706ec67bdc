#!/usr/bin/env python3
"""tensorboard_metrics.py — an aldit run's metrics.jsonl as TensorBoard scalars, once or following the run.

usage: tools/tensorboard_metrics.py RUN_DIR [--logdir DIR] [--follow] [--interval S] [--stop-after S]

Reads RUN_DIR/metrics.jsonl (or a metrics file named directly) and writes TensorBoard event files into DIR
(default RUN_DIR/tensorboard): train/loss, train/lr, train/grad_norm, throughput/samples_per_s and tokens_per_s
(per step, over all ranks), throughput/model_tflops_per_s, balance/imbalance and imbalance_pred, time/step_s,
data_wait_s, comm_s, memory/mem_peak_gib and mem_pred_gib, and on the steps that validated val/loss,
val/loss_sigma_<σ> for each level of [eval] sigmas, and with an EMA val/loss_ema and val/loss_ema_sigma_<σ>.
Then `tensorboard --logdir DIR`.

With --follow it keeps reading as the run appends (every --interval seconds, default 5) until interrupted, or
until the file has not grown for --stop-after seconds. A resumed run rewrites the lines after its checkpoint's
step: when a step comes again (the file shrank, or a step not after the last one written appears), the scalars
from that step on are purged (SummaryWriter's purge_step) and written anew, so TensorBoard shows each step once.
Running the tool again on the same folder writes every step again, purging the earlier pass's events from the
file's first step on.

Needs torch and tensorboard (tools/requirements.txt). Exit status: 0, 1 on an unreadable metrics file, 2 on
usage errors.
"""
import argparse
import json
import math
import os
import sys
import time

GIB = float(1 << 30)


def metrics_path(run):
    if os.path.isdir(run):
        return os.path.join(run, "metrics.jsonl")
    return run


def read_lines(path, offset):
    """Whole lines from byte `offset` on: (rows, new offset). A last line without its newline (being written) is
    left for the next read."""
    rows = []
    with open(path, "rb") as metrics:
        metrics.seek(offset)
        data = metrics.read()
    end = data.rfind(b"\n")
    if end < 0:
        return rows, offset
    for number, line in enumerate(data[:end].split(b"\n")):
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path}: byte {offset}: line {number + 1} read here is not JSON: {error}") from None
    return rows, offset + end + 1


def finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value)


def scalars(row):
    """(tag, value) pairs of one metrics line."""
    out = []

    def put(tag, value, scale=1.0):
        if finite(value):
            out.append((tag, float(value) * scale))

    put("train/loss", row.get("loss"))
    put("train/lr", row.get("lr"))
    put("train/grad_norm", row.get("grad_norm"))
    step_s = row.get("step_s")
    if finite(step_s) and step_s > 0:
        put("throughput/samples_per_s", row.get("samples"), 1.0 / step_s)
        put("throughput/tokens_per_s", row.get("tokens"), 1.0 / step_s)
        put("throughput/model_tflops_per_s", row.get("model_flops"), 1e-12 / step_s)
    put("balance/imbalance", row.get("imbalance"))
    put("balance/imbalance_pred", row.get("imbalance_pred"))
    for key in ("step_s", "data_wait_s", "comm_s", "compute_s_max"):
        put("time/" + key, row.get(key))
    put("memory/mem_peak_gib", row.get("mem_peak"), 1.0 / GIB)
    put("memory/mem_pred_gib", row.get("mem_pred"), 1.0 / GIB)
    put("val/loss", row.get("val_loss"))
    put("val/loss_ema", row.get("val_loss_ema"))
    sigmas = row.get("val_sigmas") or []
    for name, key in (("val/loss_sigma_", "val_loss_sigma"), ("val/loss_ema_sigma_", "val_loss_ema_sigma")):
        for sigma, value in zip(sigmas, row.get(key) or []):
            put(f"{name}{sigma:g}", value)
    return out


class Follower:
    """Writes the metrics file's rows as they come; purges and rewrites from a step that comes again."""

    def __init__(self, path, logdir, writer_class):
        self.path, self.logdir, self.writer_class = path, logdir, writer_class
        os.makedirs(logdir, exist_ok=True)
        self.last_step, self.offset, self.size = None, 0, 0
        self.writer = None

    def open_writer(self, purge_step):
        if self.writer:
            self.writer.close()
        self.writer = self.writer_class(log_dir=self.logdir, purge_step=purge_step)

    def poll(self):
        """Read what is new; returns the number of rows written."""
        try:
            size = os.path.getsize(self.path)
        except OSError as error:
            raise SystemExit(f"{self.path}: {error.strerror}") from None
        if size < self.size:  # the run rewrote its file (a resume dropped the lines after its checkpoint)
            self.offset = 0
        self.size = size
        rows, self.offset = read_lines(self.path, self.offset)
        written = 0
        for row in rows:
            step = row.get("step")
            if not isinstance(step, int):
                continue
            # the first step written (events of an earlier pass over the folder from it on are dropped), or a step
            # that comes again after a resume
            if self.writer is None or step <= self.last_step:
                self.open_writer(purge_step=step)
            for tag, value in scalars(row):
                self.writer.add_scalar(tag, value, step)
            self.last_step = step
            written += 1
        if written:
            self.writer.flush()
        return written

    def close(self):
        if self.writer:
            self.writer.close()


def main():
    parser = argparse.ArgumentParser(description="aldit metrics.jsonl -> TensorBoard scalars")
    parser.add_argument("run", help="the run folder ([run] dir) or its metrics file")
    parser.add_argument("--logdir", help="where the event files go (default: RUN/tensorboard)")
    parser.add_argument("--follow", action="store_true", help="keep reading as the run appends")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between reads with --follow")
    parser.add_argument("--stop-after", type=float, default=0.0,
                        help="with --follow: stop when the file has not grown for this many seconds (0: never)")
    args = parser.parse_args()
    path = metrics_path(args.run)
    if not os.path.isfile(path):
        print(f"tensorboard_metrics.py: {path}: no such metrics file", file=sys.stderr)
        return 1
    run_dir = os.path.dirname(os.path.abspath(path))
    logdir = args.logdir or os.path.join(run_dir, "tensorboard")
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as error:
        print(f"tensorboard_metrics.py: needs torch and tensorboard (pip install -r tools/requirements.txt): {error}",
              file=sys.stderr)
        return 2
    follower = Follower(path, logdir, SummaryWriter)
    try:
        total = follower.poll()
        grown = time.monotonic()
        while args.follow:
            time.sleep(args.interval)
            written = follower.poll()
            total += written
            if written:
                grown = time.monotonic()
            elif args.stop_after > 0 and time.monotonic() - grown > args.stop_after:
                break
    except KeyboardInterrupt:
        pass
    finally:
        follower.close()
    print(f"tensorboard_metrics.py: {total} step(s) written to {logdir} (last step {follower.last_step})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
