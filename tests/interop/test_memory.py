"""What the daemon's memory does under load (docs/benchmarks.md, "Daemon
memory after load" and "Daemon memory with stalled streams"; a 512 MiB board
can neither leave 100 MiB parked in its allocator nor let stalled streams
take several times its memory budget).

The daemon gives memory back once transfers end:

  * after eight `oxadb` clients have each pushed and pulled 8 MiB of random
    data ten times at once, the daemon's VmRSS is under IDLE_BOUND within
    IDLE_DEADLINE seconds of the last transfer ending;
  * the same after stalled streams came first: sixteen shells that sleep
    before reading 16 MiB pushed into each (what credit lets arrive is held
    while they sleep), then the same load.

Before the allocator kept one arena and trimmed itself when idle, the first
case left 98 MiB resident for good (baseline 5 MiB), and 429 MiB after a
stalled-stream run.

Stalled streams take no more than the budget plus 1 MiB each: STALLED_CONNS
`oxadb shell` clients, each its own connection, push STALLED_SIZE into
shells that sleep before reading, under `--memory-budget STALLED_BUDGET`;
the daemon's VmRSS, sampled every 20 ms, never grows by more than
STALLED_BUDGET + STALLED_CONNS x 1 MiB. Before everything a stream and a
connection hold was charged to the budget and packets were sized to it, 64
such connections under a 64 MiB budget grew it by 296 to 321 MiB.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from harness import clean_env, resolve_oxadb, sha256_file, write_random

MIB = 1 << 20
IDLE_BOUND = 16 * MIB
IDLE_DEADLINE = 10.0
CLIENTS = 8
ROUNDS = 10
SIZE = 8 * MIB
STALLED = 16
STALLED_SIZE = 16 * MIB
STALL_SECONDS = 3
STALLED_CONNS = 32
STALLED_BUDGET = 32 * MIB
STALLED_BYTES = 16 * MIB


def vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def oxadb(home: Path, port: int, *args: str, stdin=subprocess.DEVNULL, timeout: float = 60):
    cp = subprocess.run([str(resolve_oxadb()), "-s", f"127.0.0.1:{port}", *args], stdin=stdin,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                        env=clean_env(HOME=str(home)))
    assert cp.returncode == 0, f"oxadb {args}: rc={cp.returncode} stderr={cp.stderr[-500:]!r}"
    return cp


def run_threads(targets) -> None:
    """Runs each callable on its own thread; re-raises the first failure."""
    errors: list[BaseException] = []

    def wrap(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
        assert not t.is_alive(), "a client thread did not finish in 180 s"
    if errors:
        raise errors[0]


def push_pull_load(tmp: Path, port: int) -> None:
    """CLIENTS clients at once, each pushing and pulling SIZE bytes ROUNDS times."""

    def client(i: int):
        src = tmp / f"src-{i}"
        digest = write_random(src, SIZE)
        remote = tmp / f"remote-{i}"
        back = tmp / f"back-{i}"
        for _ in range(ROUNDS):
            oxadb(tmp, port, "push", "-q", str(src), str(remote))
            oxadb(tmp, port, "pull", "-q", str(remote), str(back))
            assert sha256_file(back) == digest, f"client {i}: pulled data differs"
            back.unlink()

    run_threads([lambda i=i: client(i) for i in range(CLIENTS)])


def stalled_streams(tmp: Path, port: int) -> None:
    """STALLED shells at once, each sleeping before it reads STALLED_SIZE bytes of stdin."""
    data = tmp / "stalled-input"
    write_random(data, STALLED_SIZE)

    def one():
        with open(data, "rb") as stdin:
            oxadb(tmp, port, "shell", f"sleep {STALL_SECONDS}; head -c {STALLED_SIZE} >/dev/null",
                  stdin=stdin)

    run_threads([one for _ in range(STALLED)])


def settles_under_bound(pid: int) -> tuple[bool, list[tuple[float, int]]]:
    """Samples VmRSS until it is under IDLE_BOUND or IDLE_DEADLINE passed."""
    start = time.monotonic()
    samples = []
    while True:
        elapsed = time.monotonic() - start
        rss = vm_rss(pid)
        samples.append((round(elapsed, 1), rss // 1024))
        if rss < IDLE_BOUND:
            return True, samples
        if elapsed > IDLE_DEADLINE:
            return False, samples
        time.sleep(0.2)


def check_settles(pid: int, what: str) -> None:
    ok, samples = settles_under_bound(pid)
    print(f"{what}: VmRSS (s, KiB) {samples[0]} .. {samples[-1]}")
    assert ok, (f"{what}: VmRSS still {samples[-1][1]} KiB {IDLE_DEADLINE} s after the last "
                f"transfer (bound {IDLE_BOUND // 1024} KiB); samples (s, KiB): {samples[::5]}")


def test_memory_goes_back_after_load(fresh_daemon, tmp_path):
    d = fresh_daemon(name="load")
    push_pull_load(tmp_path, d.port)
    check_settles(d.proc.pid, "after push/pull load")
    assert d.alive()


def test_memory_goes_back_after_stalled_streams_and_load(fresh_daemon, tmp_path):
    d = fresh_daemon(name="stalled")
    stalled_streams(tmp_path, d.port)
    push_pull_load(tmp_path, d.port)
    check_settles(d.proc.pid, "after stalled streams and push/pull load")
    assert d.alive()


def test_stalled_connections_stay_within_the_budget(fresh_daemon, tmp_path):
    d = fresh_daemon(name="budget", args=("--memory-budget", str(STALLED_BUDGET)))
    data = tmp_path / "input"
    write_random(data, STALLED_BYTES)
    pid = d.proc.pid
    baseline = vm_rss(pid)
    peak = [baseline]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], vm_rss(pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()

    def one():
        with open(data, "rb") as stdin:
            oxadb(tmp_path, d.port, "shell",
                  f"sleep {STALL_SECONDS}; head -c {STALLED_BYTES} >/dev/null", stdin=stdin)

    try:
        run_threads([one for _ in range(STALLED_CONNS)])
    finally:
        done.set()
        sampler.join()
    grown = peak[0] - baseline
    bound = STALLED_BUDGET + STALLED_CONNS * MIB
    print(f"baseline {baseline // 1024} KiB, peak {peak[0] // 1024} KiB, bound +{bound // 1024} KiB")
    assert grown <= bound, (f"{STALLED_CONNS} stalled connections grew the daemon by "
                            f"{grown // 1024} KiB, over budget + 1 MiB each = {bound // 1024} KiB")
    assert d.alive()
