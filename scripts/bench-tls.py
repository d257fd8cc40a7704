#!/usr/bin/env python3
"""What TLS (STLS, `oxadbd --tls required`) costs beside plaintext
(`--tls off`): oxadb pushing a file into a device node and pulling it into
tmpfs over loopback, runs of the two modes interleaved, the median of --runs
each, with the CPU seconds per GiB of oxadb (user + system, from wait4) and of
oxadbd (/proc/PID/stat before and after).

    OXADBD=target/release/oxadbd OXADB=target/release/oxadb \
        python3 scripts/bench-tls.py --dir /dev/shm/oxadb-tls-bench --runs 3

Both daemons run with --auth and the client's key trusted, so the plaintext
connection authenticates with AUTH and the TLS one with its certificate.
Prints a table; it is not a test.
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
from harness import Daemon, clean_env, resolve_oxadb, resolve_oxadbd, trust_key  # noqa: E402

MODES = ("off", "required")
CLK = os.sysconf("SC_CLK_TCK")


def daemon_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and the child's CPU seconds (user + system)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    err = proc.stderr.read().decode("utf-8", "replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}): {err}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/dev/shm/oxadb-tls-bench"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mib", type=int, default=1024)
    args = ap.parse_args()

    args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=args.dir))
    daemons: list[Daemon] = []
    try:
        src = work / "src.bin"
        with open(src, "wb") as f:
            for _ in range(args.mib):
                f.write(os.urandom(1 << 20))
        null = work / "null"
        os.mknod(null, 0o600 | 0o020000, os.makedev(1, 3))
        home = work / "home"
        (home / ".android").mkdir(parents=True)
        env = clean_env(HOME=str(home))
        oxadb = str(resolve_oxadb())
        subprocess.run([oxadb, "keygen", str(home / ".android" / "adbkey")], env=env,
                       check=True, capture_output=True)
        keys = work / "etc" / "adb_keys"
        trust_key(home / ".android" / "adbkey.pub", keys)
        by_mode = {}
        for mode in MODES:
            d = Daemon(resolve_oxadbd(), work / f"d-{mode}", name=mode, rust_log="info",
                       args=("--auth", "--keys", str(keys), "--tls", mode))
            d.start()
            daemons.append(d)
            by_mode[mode] = d
        gib = args.mib / 1024
        rows: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        for run in range(args.runs):
            for mode in MODES:
                d = by_mode[mode]
                for kind in ("push", "pull"):
                    dest = work / "pulled.bin"
                    if kind == "push":
                        argv = [oxadb, "-s", d.serial, "push", str(src), str(null)]
                    else:
                        argv = [oxadb, "-s", d.serial, "pull", str(src), str(dest)]
                    before = daemon_cpu(d.proc.pid)
                    wall, client = timed(argv, env)
                    daemon = daemon_cpu(d.proc.pid) - before
                    if kind == "pull":
                        dest.unlink()
                    rows.setdefault((kind, mode), []).append(
                        (args.mib * (1 << 20) / wall / 1e6, client / gib, daemon / gib))
            print(f"run {run + 1} of {args.runs} done", file=sys.stderr)
        for mode in MODES:
            log = by_mode[mode].log_since(0).decode("utf-8", "replace")
            established = log.count("TLS 1.3 established")
            want = 2 * args.runs if mode == "required" else 0
            if established != want:
                sys.exit(f"--tls {mode}: {established} TLS connections, expected {want}")
        print(f"| transfer | --tls | runs (MB/s) | median MB/s | oxadb CPU s/GiB | "
              f"oxadbd CPU s/GiB |")
        print("|---|---|---|---|---|---|")
        for kind in ("push", "pull"):
            for mode in MODES:
                r = rows[(kind, mode)]
                runs = ", ".join(f"{x[0]:.0f}" for x in r)
                med = [statistics.median(x[i] for x in r) for i in range(3)]
                print(f"| {kind} 1 GiB | {mode} | {runs} | {med[0]:.0f} | {med[1]:.2f} | "
                      f"{med[2]:.2f} |")
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
