#!/usr/bin/env python3
"""block_table.py — the Wan-1.3B block against its PyTorch peer as a Markdown table (plain Python, no packages).

usage: tools/block_table.py ALDIT_JSON PEER_JSON [--label NAME]

ALDIT_JSON is what `aldit-bench --sections block --json FILE` writes and PEER_JSON what
`python3 tests/bench/peer_torch.py --sections block --json FILE` writes; run both in the same device call, on
the same GPU, so that the comparison counts (docs/PERFORMANCE.md). One row per S that both measured: aldit's
block time and its floor, aldit over the floor, the peer's eager and torch.compile times, the speed-up over
torch.compile, and issue 5's targets with whether this run meets them (speed-up >= 1.30 / 1.10 / 1.04 / 1.02
at S = 4096 / 16384 / 32760 / 75600; within 8% of the floor).
"""
import argparse
import json
import sys

SPEEDUP_TARGETS = {4096: 1.30, 16384: 1.10, 32760: 1.04, 75600: 1.02}
FLOOR_TARGET_PCT = 8.0


def load(path, key):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{path}: {e}")
    if key not in data:
        sys.exit(f"{path}: no '{key}' figures (run the block section with --json)")
    return data


def peer_times(peer):
    """{S: {mode: ms}} from the peer's block entries."""
    times = {}
    for entry in peer["block"]:
        times.setdefault(entry["S"], {})[entry["mode"]] = entry["ms"]
    return times


def rows(aldit, peer, label):
    times = peer_times(peer)
    for block in aldit["block"]:
        S = block["S"]
        if "ms" not in block or S not in times or "compile" not in times[S]:
            continue
        compiled = times[S]["compile"]
        speedup = compiled / block["ms"]
        target = SPEEDUP_TARGETS.get(S)
        target_text = f">= {target:.2f}x {'met' if speedup >= target else 'missed'}" if target else "-"
        floor_text = f"{block['over_floor_pct']:+.1f}% {'met' if block['over_floor_pct'] <= FLOOR_TARGET_PCT else 'missed'}"
        eager = times[S].get("eager")
        eager_text = f"{eager:.3f}" if eager is not None else "-"
        yield (f"| {label}{S} | {block['ms']:.3f} | {block['floor_ms']:.3f} | {floor_text} | {eager_text} | "
               f"{compiled:.3f} | {speedup:.3f}x | {target_text} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("aldit_json")
    parser.add_argument("peer_json")
    parser.add_argument("--label", default="", help="prefix of each row's S cell, e.g. 'call 3: '")
    args = parser.parse_args()
    aldit = load(args.aldit_json, "block")
    peer = load(args.peer_json, "block")
    if aldit.get("text_rows") != peer.get("text_rows"):
        sys.exit(f"text rows differ: {aldit.get('text_rows')} in {args.aldit_json}, {peer.get('text_rows')} in "
                 f"{args.peer_json}")
    print(f"aldit on {aldit.get('device', '?')}; peer: torch {peer.get('torch', '?')} on {peer.get('device', '?')}")
    print()
    print("| S | aldit block ms | floor ms | vs floor (<= +8%) | peer eager ms | peer torch.compile ms | "
          "aldit / compile | target |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows(aldit, peer, args.label):
        print(row)


if __name__ == "__main__":
    main()
