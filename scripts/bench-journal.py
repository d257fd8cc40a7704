#!/usr/bin/env python3
"""The cost of oxadbd's push journal (--state-dir): Google adb pushing trees
of small files (4 KiB) into a disk-backed directory, with and without a
state directory (`--no-state-dir`), at --durability full (the default) and none, runs
interleaved, the median of --runs each. The journal writes once per new
directory, so the trees differ in how many directories hold the files:
1000 files in 1 directory, and in 100 directories of 10. `sync` runs
before every push (untimed).

    OXADBD=target/release/oxadbd python3 scripts/bench-journal.py \
        --dir /var/tmp/oxadb-journal-bench --runs 5

Needs adb (Debian's adb 29) on PATH. Prints a table; it is not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "interop"))
from harness import AdbServer, Daemon, resolve_oxadbd, which_adb  # noqa: E402

SETUPS = tuple(os.environ.get("SETUPS", "full,full+journal,none,none+journal").split(","))
TREES = {"1000 files, 1 dir": (1, 1000), "1000 files, 100 dirs": (100, 10)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/oxadb-journal-bench"))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    args.dir.mkdir(parents=True, exist_ok=True)
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(args.dir)], capture_output=True,
                        text=True).stdout.strip()
    if fs in ("tmpfs", "ramfs"):
        sys.exit(f"{args.dir} is on {fs}: fsync is free there; use a disk-backed directory")
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=args.dir))
    sources = {}
    for case, (dirs, files) in TREES.items():
        root = work / f"src-{dirs}"
        for d in range(dirs):
            sub = root / f"d{d:03}"
            sub.mkdir(parents=True)
            for i in range(files):
                (sub / f"f{i:04}").write_bytes(os.urandom(4096))
        sources[case] = root

    srv = AdbServer(which_adb(), work / "adbsrv")
    srv.start()
    daemons = {}
    try:
        for setup in SETUPS:
            level, _, journal = setup.partition("+")
            # Without --no-state-dir the daemon would journal into its default
            # state directory and the baseline would pay the same cost.
            extra = (("--state-dir", str(work / f"state-{level}")) if journal
                     else ("--no-state-dir",))
            d = Daemon(resolve_oxadbd(), work / f"daemon-{setup}",
                       args=("--durability", level, *extra), rust_log="info")
            d.start()
            srv.connect(d.serial)
            daemons[setup] = d
        times: dict[tuple[str, str], list[float]] = {}
        for run in range(args.runs):
            for setup in SETUPS:
                for case, src in sources.items():
                    dest = work / f"dest-{setup}-{run}-{len(times)}"
                    dest.mkdir()
                    subprocess.run(["sync"], check=True)
                    start = time.monotonic()
                    r = srv.run("push", str(src), str(dest), serial=daemons[setup].serial,
                                timeout=600)
                    took = time.monotonic() - start
                    if r.rc != 0:
                        sys.exit(f"push failed: {r}")
                    times.setdefault((case, setup), []).append(took)
                    shutil.rmtree(dest)
        print(f"filesystem {fs} at {args.dir}; medians of {args.runs} runs (seconds)")
        print(f"{'case':<22}" + "".join(f"{s:>14}" for s in SETUPS))
        for case in TREES:
            med = {s: statistics.median(times[(case, s)]) for s in SETUPS}
            print(f"{case:<22}" + "".join(f"{med[s]:>14.3f}" for s in SETUPS))
    finally:
        for d in daemons.values():
            d.stop()
        srv.kill()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
