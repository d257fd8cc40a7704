"""Stopping and restarting the daemon in the middle of pushes (adb 29).

SIGKILL: the temporary files of the pushes in flight stay behind (the test
sees them), and a daemon restarted with the same --state-dir removes them
at start from its journal; the destinations keep their old content and the
host pushes again at once.

SIGTERM: pushes in flight get --stop-grace seconds to finish, the rest are
aborted; the daemon exits 0 within the grace period (plus the runtime's
short shutdown), each destination holds either the complete new file or its
old content, no temporary file is left, and a restarted daemon serves the
reconnecting host at once. A second signal during the grace stops at once.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness import ADB_TIMEOUT, sha256_file, write_random

SIZE = 256 << 20
TEMP = ".oxadb-push."


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Eight distinct 256 MiB random files (one random body, each with its own
    first MiB, so a destination cannot hold another push's file unnoticed);
    removed after the module."""
    base = tmp_path_factory.mktemp("restart-src")
    body = base / "body"
    write_random(body, SIZE)
    files = []
    for i in range(8):
        path = base / f"src{i}.bin"
        shutil.copyfile(body, path)
        with open(path, "r+b") as f:
            f.write(bytes([i]) * (1 << 20))
        files.append((path, sha256_file(path)))
    body.unlink()
    yield files
    shutil.rmtree(base)


def temps(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.startswith(TEMP))


def old_versions(directory: Path, n: int) -> list[tuple[Path, bytes]]:
    """`n` destinations holding an old version each."""
    directory.mkdir()
    dests = []
    for i in range(n):
        dest = directory / f"file{i}.bin"
        old = f"old version {i}\n".encode()
        dest.write_bytes(old)
        dests.append((dest, old))
    return dests


def start_pushes(adb_server, serial: str, pairs) -> list[subprocess.Popen]:
    return [adb_server.popen("push", str(src), str(dest), serial=serial) for src, dest in pairs]


def wait_for_temps(directory: Path, n: int, pushes, timeout: float = 30.0) -> list[Path]:
    """Waits until `n` temporary files exist in `directory` (every push is
    writing); fails if a push ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = temps(directory)
        if len(found) >= n:
            return found
        for p in pushes:
            if p.poll() is not None:
                pytest.fail(f"a push ended before all were in flight: rc={p.returncode} "
                            f"{p.communicate()}")
        time.sleep(0.01)
    pytest.fail(f"only {temps(directory)} in flight after {timeout}s")


def reap(pushes) -> list[int]:
    codes = []
    for p in pushes:
        try:
            p.communicate(timeout=ADB_TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
        codes.append(p.returncode)
    return codes


def push_now(adb_server, d, tmp_path: Path, directory: Path) -> None:
    """The host is served again at once: reconnect, push, check."""
    adb_server.connect(d.serial)
    small = tmp_path / "after-restart.txt"
    small.write_bytes(b"served after the restart\n")
    r = adb_server.run("push", str(small), str(directory / "after.txt"), serial=d.serial)
    assert r.rc == 0, r
    assert (directory / "after.txt").read_bytes() == small.read_bytes()
    assert temps(directory) == []


def test_sigkill_leftovers_are_removed_at_restart(fresh_daemon, adb_server, sources, tmp_path):
    state = tmp_path / "state"
    d = fresh_daemon("kill", args=("--state-dir", str(state)))
    adb_server.connect(d.serial)
    directory = tmp_path / "dest"
    dests = old_versions(directory, 4)
    pushes = start_pushes(adb_server, d.serial,
                          [(src, dest) for (src, _), (dest, _) in zip(sources, dests)])
    try:
        left = wait_for_temps(directory, 4, pushes)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(timeout=10)
    finally:
        reap(pushes)
    # What a killed daemon leaves today: its temporary files, beside the destinations.
    assert len(temps(directory)) == 4, temps(directory)
    assert all(p.exists() for p in left)
    journals = list(state.glob("pending-dirs.*"))
    assert len(journals) == 1, journals

    since = d.log_size()
    d.start(port=d.port)
    # Removed before the daemon listens.
    assert temps(directory) == []
    for dest, old in dests:
        assert dest.read_bytes() == old, dest
    log = d.log_since(since).decode("utf-8", "replace")
    assert "removed 4 temporary files left by a stopped daemon" in log, log
    for p in left:
        assert str(p) in log
    # The dead daemon's journal is gone; the new one has its own.
    assert [j for j in state.glob("pending-dirs.*")] == [state / f"pending-dirs.{d.proc.pid}"]
    push_now(adb_server, d, tmp_path, directory)


def stop_line(d, since: int) -> str:
    line = d.wait_for_log(lambda l: "exiting;" in l, since=since, timeout=1)
    assert line is not None, d.log_since(since).decode("utf-8", "replace")
    return line


# 2 s: too short for eight 256 MiB pushes here, so most (or all) are aborted;
# 60 s: every push finishes, and the daemon exits as soon as the last has.
@pytest.mark.parametrize("grace", [2, 60])
def test_sigterm_finishes_or_aborts_pushes_in_flight(fresh_daemon, adb_server, sources, tmp_path,
                                                     grace):
    state = tmp_path / "state"
    d = fresh_daemon("term", args=("--state-dir", str(state), "--stop-grace", str(grace)))
    adb_server.connect(d.serial)
    directory = tmp_path / "dest"
    dests = old_versions(directory, 8)
    pushes = start_pushes(adb_server, d.serial,
                          [(src, dest) for (src, _), (dest, _) in zip(sources, dests)])
    try:
        wait_for_temps(directory, 8, pushes)
        since = d.log_size()
        d.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        rc = d.proc.wait(timeout=grace + 30)
        took = time.monotonic() - sent
    finally:
        codes = reap(pushes)
    assert rc == 0, d.log_since(since)
    # The grace, then at most the runtime's 2 s for blocking threads.
    assert took <= grace + 3, f"exited {took:.1f}s after SIGTERM with a {grace}s grace"
    if grace == 60:
        # It waited for the pushes, not for the whole grace.
        assert took < grace / 2, f"exited {took:.1f}s after SIGTERM: pushes took that long?"
    assert temps(directory) == []
    complete, untouched = 0, 0
    for (dest, old), (_src, digest) in zip(dests, sources):
        if dest.stat().st_size == SIZE and sha256_file(dest) == digest:
            complete += 1
        else:
            assert dest.read_bytes() == old, f"{dest} is neither the new file nor the old one"
            untouched += 1
    line = stop_line(d, since)
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    assert fields["in_flight"] == "8", line
    assert int(fields["aborted"]) == untouched, (line, complete, untouched)
    assert int(fields["finished"]) == complete, (line, complete, untouched)
    # Nothing was left unfinished: the journal went with the daemon, unless
    # pushes were aborted (their threads may still have been writing).
    if untouched == 0:
        assert list(state.glob("pending-dirs.*")) == []
    if grace == 60:
        assert (complete, untouched) == (8, 0), line
        # Each host was told its push arrived before the daemon went.
        assert codes == [0] * 8, codes
    print(f"SIGTERM after {took:.2f}s: {complete} pushes finished, {untouched} aborted")

    d.start(port=d.port)
    push_now(adb_server, d, tmp_path, directory)


def test_second_signal_stops_at_once(fresh_daemon, adb_server, sources, tmp_path):
    grace = 60
    d = fresh_daemon("twice", args=("--state-dir", str(tmp_path / "state"),
                                    "--stop-grace", str(grace)))
    adb_server.connect(d.serial)
    directory = tmp_path / "dest"
    dests = old_versions(directory, 2)
    pushes = start_pushes(adb_server, d.serial,
                          [(src, dest) for (src, _), (dest, _) in zip(sources, dests)])
    try:
        wait_for_temps(directory, 2, pushes)
        since = d.log_size()
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        d.proc.send_signal(signal.SIGINT)
        rc = d.proc.wait(timeout=grace / 2)
    finally:
        reap(pushes)
    assert rc == 0
    assert temps(directory) == []
    line = stop_line(d, since)
    assert "SIGTERM then SIGINT" in line, line
    for (dest, old), (_src, digest) in zip(dests, sources):
        assert dest.read_bytes() == old or sha256_file(dest) == digest, dest
