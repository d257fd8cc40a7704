#!/usr/bin/env python3
"""The cost of oxadbd's --durability levels: Google adb pushing (a) one
1 GiB file and (b) a directory of 1000 small files (4 KiB each) into a
directory on a disk-backed filesystem, runs of the levels interleaved, the
median of --runs each. `sync` runs before every push (untimed) so one run's
writeback does not land in the next. With --allow-tmpfs the directory may be
on tmpfs, where fsync is free: the row that shows what the levels cost
beyond the storage itself.

    OXADBD=target/release/oxadbd python3 scripts/bench-durability.py \
        --dir /var/tmp/oxadb-durability-bench --runs 5
    OXADBD=target/release/oxadbd python3 scripts/bench-durability.py \
        --dir /dev/shm/oxadb-durability-bench --allow-tmpfs --runs 5

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

LEVELS = ("full", "rename", "none")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/oxadb-durability-bench"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--allow-tmpfs", action="store_true",
                    help="measure on tmpfs too (fsync is free there)")
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--file-size", type=int, default=4096)
    args = ap.parse_args()

    args.dir.mkdir(parents=True, exist_ok=True)
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(args.dir)], capture_output=True,
                        text=True).stdout.strip()
    if fs in ("tmpfs", "ramfs") and not args.allow_tmpfs:
        sys.exit(f"{args.dir} is on {fs}: fsync is free there; use a disk-backed directory")
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=args.dir))
    src_big = work / "big.bin"
    with open(src_big, "wb") as f:
        for _ in range(args.big_mib):
            f.write(os.urandom(1 << 20))
    src_tree = work / "tree"
    src_tree.mkdir()
    for i in range(args.files):
        (src_tree / f"f{i:04}").write_bytes(os.urandom(args.file_size))

    srv = AdbServer(which_adb(), work / "adbsrv")
    srv.start()
    daemons = {}
    try:
        for level in LEVELS:
            d = Daemon(resolve_oxadbd(), work / f"daemon-{level}", args=("--durability", level),
                       rust_log="info")
            d.start()
            srv.connect(d.serial)
            daemons[level] = d
        big = f"{args.big_mib} MiB file" if args.big_mib % 1024 else f"{args.big_mib // 1024} GiB file"
        small = f"{args.files} files"
        times: dict[tuple[str, str], list[float]] = {}
        for run in range(args.runs):
            for level in LEVELS:
                for case, src in ((big, src_big), (small, src_tree)):
                    dest = work / f"dest-{level}-{run}-{case[0]}"
                    if case == small:
                        dest.mkdir()
                    subprocess.run(["sync"], check=True)
                    start = time.monotonic()
                    r = srv.run("push", str(src), str(dest), serial=daemons[level].serial,
                                timeout=600)
                    took = time.monotonic() - start
                    if r.rc != 0:
                        sys.exit(f"push failed: {r}")
                    times.setdefault((case, level), []).append(took)
                    shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        print(f"filesystem {fs} at {args.dir}; medians of {args.runs} runs (seconds)")
        print(f"{'case':<14}" + "".join(f"{lvl:>10}" for lvl in LEVELS) + "   full/none")
        for case in (big, small):
            med = {lvl: statistics.median(times[(case, lvl)]) for lvl in LEVELS}
            print(f"{case:<14}" + "".join(f"{med[lvl]:>10.3f}" for lvl in LEVELS)
                  + f"{med['full'] / med['none']:>12.2f}")
    finally:
        for d in daemons.values():
            d.stop()
        srv.kill()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
