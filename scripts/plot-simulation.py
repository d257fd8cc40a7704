#!/usr/bin/env python3
"""Plots for docs/benchmarks.md from the link simulator's CSV output.

    cargo build --release
    target/release/oxadb-bench simulate --series-dir /tmp/oxadb-sim
    python3 -m pip install -r scripts/plot-requirements.txt
    python3 scripts/plot-simulation.py /tmp/oxadb-sim docs/img

Writes sim-throughput-vs-rtt.png (every policy on a 1 Gbit/s link against
the round trip) and sim-buffered-LINK-CONSUMER.png (bytes the device held
unread over time, every policy) for the slow and stalling consumers.
"""

import csv
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICIES = ["classic", "aosp", "adaptive"]


def throughput_vs_rtt(series: Path, out: Path) -> Path:
    by_policy = defaultdict(list)
    with open(series / "rtt-sweep.csv") as f:
        for row in csv.DictReader(f):
            by_policy[row["policy"]].append((float(row["rtt_ms"]), float(row["mb_per_s"])))
    fig, ax = plt.subplots(figsize=(7, 4))
    for policy in POLICIES:
        points = sorted(by_policy[policy])
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("round trip (ms)")
    ax.set_ylabel("push throughput (MB/s)")
    ax.set_title("Simulated push, 1 Gbit/s link, fast consumer")
    ax.axhline(125, color="grey", linestyle=":", label="link rate")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    path = out / "sim-throughput-vs-rtt.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def buffered_over_time(series: Path, out: Path, link: str, consumer: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for policy in POLICIES:
        times, values = [], []
        with open(series / f"{link}-{policy}-{consumer}.csv") as f:
            for row in csv.DictReader(f):
                times.append(int(row["time_ns"]) / 1e6)
                values.append(int(row["buffered_bytes"]) / (1 << 20))
        ax.step(times, values, where="post", label=policy)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("held unread by the device (MiB)")
    ax.set_title(f"Simulated push over {link}, {consumer} consumer")
    ax.legend()
    ax.grid(True, alpha=0.3)
    path = out / f"sim-buffered-{link}-{consumer}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    series, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    written = [throughput_vs_rtt(series, out)]
    for link, consumer in [("usb3", "stalling"), ("usb3", "slow"), ("wifi", "slow")]:
        written.append(buffered_over_time(series, out, link, consumer))
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
