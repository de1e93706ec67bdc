#!/usr/bin/env python3
"""tensorboard_metrics.py — a run's metrics.jsonl as TensorBoard scalars, once or following the run as it trains.

    python3 tools/tensorboard_metrics.py run/metrics.jsonl --follow &     # writes run/tensorboard
    tensorboard --logdir run/tensorboard

Each line's numbers become scalars at its step: train/loss, train/lr, train/grad_norm; val/loss and val/loss_ema
with one curve per noise level (val/loss_sigma/0.1, val/loss_ema_sigma/0.1, ...); throughput/tokens_per_s and
throughput/samples_per_s (over step_s); balance/imbalance and balance/imbalance_pred; and every other number of
the line under run/ (mem_peak, data_wait_s, ...). Per-rank lists are left out.

Resumes: a resumed run keeps the lines up to its checkpoint and writes the later steps again. Each time this
tool starts, and whenever it finds the file rewritten, it marks a restart at the first step it writes (a
SessionLog START event), so that TensorBoard drops the older points from that step on and each step shows once.

--follow reads the lines the run appends every --interval seconds (a torn last line waits for its end) until
Ctrl-C, or until --idle seconds pass without a new line. Needs the tensorboard package
(tools/requirements.txt), not TensorFlow.
"""
import argparse
import json
import math
import os
import sys
import time


def fail(message, status=2):
    print(f"tensorboard_metrics: {message}", file=sys.stderr)
    sys.exit(status)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("metrics", help="metrics.jsonl written by aldit, or the run folder ([run] dir) holding it")
    parser.add_argument("--logdir", help="TensorBoard folder (default: tensorboard beside the metrics file)")
    parser.add_argument("--follow", action="store_true", help="keep reading the lines the run appends")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between reads with --follow")
    parser.add_argument("--idle", type=float, default=0.0,
                        help="with --follow: stop after this many seconds without a new line (0: never)")
    args = parser.parse_args()
    if os.path.isdir(args.metrics):
        args.metrics = os.path.join(args.metrics, "metrics.jsonl")
    if not args.follow and not os.path.isfile(args.metrics):
        parser.error(f"{args.metrics}: no such file")
    if args.interval <= 0 or args.idle < 0:
        parser.error("--interval must be positive and --idle at least 0")
    args.logdir = args.logdir or os.path.join(os.path.dirname(os.path.abspath(args.metrics)), "tensorboard")
    return args


def number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def scalars(line):
    """(tag, value) of one metrics line."""
    named = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "val_loss": "val/loss",
             "val_loss_ema": "val/loss_ema", "imbalance": "balance/imbalance",
             "imbalance_pred": "balance/imbalance_pred"}
    out = []
    for key, value in line.items():
        if key == "step" or not number(value):
            continue
        out.append((named.get(key, "run/" + key), float(value)))
    seconds = line.get("step_s")
    if number(seconds) and seconds > 0:
        for key in ("tokens", "samples"):
            if number(line.get(key)):
                out.append((f"throughput/{key}_per_s", line[key] / seconds))
    sigmas = line.get("val_sigmas") or []
    for key, tag in (("val_loss_sigma", "val/loss_sigma"), ("val_loss_ema_sigma", "val/loss_ema_sigma")):
        for sigma, value in zip(sigmas, line.get(key) or []):
            if number(sigma) and number(value):
                out.append((f"{tag}/{sigma:g}", float(value)))
    return out


class Board:
    """The event file this run of the tool writes, and the last step it wrote."""

    def __init__(self, logdir):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        self.Event, self.SessionLog, self.Summary = Event, SessionLog, Summary
        os.makedirs(logdir, exist_ok=True)
        self.writer = EventFileWriter(logdir)
        self.last_step = None     # None: a restart is marked before the next step written

    def restart(self):
        self.last_step = None

    def write(self, line):
        step = line.get("step")
        if not isinstance(step, int):
            return
        now = time.time()
        if self.last_step is None or step <= self.last_step:
            self.writer.add_event(self.Event(wall_time=now, step=step,
                                             session_log=self.SessionLog(status=self.SessionLog.START)))
        values = [self.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars(line)]
        self.writer.add_event(self.Event(wall_time=now, step=step, summary=self.Summary(value=values)))
        self.last_step = step

    def close(self):
        self.writer.flush()
        self.writer.close()


class Reader:
    """The whole lines appended to the metrics file since the last read; rewritten files are read again."""

    def __init__(self, path):
        self.path, self.offset, self.last_line = path, 0, b""

    def rewritten(self, f, size):
        if size < self.offset:
            return True
        if not self.last_line:
            return False
        f.seek(self.offset - len(self.last_line))
        return f.read(len(self.last_line)) != self.last_line

    def read(self, board):
        """Writes the new lines to the board; returns how many."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return 0
        with f:
            size = os.fstat(f.fileno()).st_size
            if self.rewritten(f, size):
                self.offset, self.last_line = 0, b""
                board.restart()
            f.seek(self.offset)
            chunk = f.read(size - self.offset)
        lines = chunk.split(b"\n")[:-1]   # the last piece is a torn line or empty
        for raw in lines:
            self.offset += len(raw) + 1
            self.last_line = raw + b"\n"
            try:
                board.write(json.loads(raw))
            except ValueError:
                print(f"tensorboard_metrics: {self.path}: a line that is not JSON left out", file=sys.stderr)
        return len(lines)


def main():
    args = parse_args()
    try:
        board = Board(args.logdir)
    except ImportError:
        fail("needs tensorboard: python3 -m pip install -r tools/requirements.txt", 1)
    reader = Reader(args.metrics)
    total = reader.read(board)
    last_new = time.time()
    try:
        while args.follow and not (args.idle > 0 and time.time() - last_new >= args.idle):
            board.writer.flush()
            time.sleep(args.interval)
            new = reader.read(board)
            total += new
            if new:
                last_new = time.time()
    except KeyboardInterrupt:
        pass
    board.close()
    print(f"tensorboard_metrics: {total} lines of {args.metrics} in {args.logdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
