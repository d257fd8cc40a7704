"""Dead peers: the link between oxadb and oxadbd is cut silently (no FIN, no
RST) in the middle of a push and of a pull; both ends must notice within the
peer timeout (docs/protocol.md, "Dead peers").

Each test makes two network namespaces, each with a TAP device (198.18.0.1
the device, 198.18.0.2 the host), joined by a small forwarder process that
paces frames to a few MB/s, so that a transfer is still running when the
link is cut. The kernels this runs on have no netem; the link is cut by
stopping the forwarder (SIGSTOP): frames are dropped once the TAP queues
fill, and the sockets see nothing, as after a power cut or a pulled cable.
A push is also cut by taking the host's interface down: no error reaches
the sockets then either, until the timeout, whose cause is then the route's
(ENETUNREACH, EHOSTUNREACH) rather than ETIMEDOUT. The forwarder is killed
by its pid and both namespaces removed at teardown, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import (Daemon, clean_env, resolve_oxadb, resolve_oxadbd, sha256_file, trust_key,
                     write_random)

# Short, so the tests are quick; the default (30 s) is derived the same way.
PEER_TIMEOUT = 5
# With T = 5 s: keepalive after 2 s of silence, every 1 s, 3 probes: 5 s;
# data unacknowledged: user timeout 5 s. One more second for the kernel's
# timers (RTO backoff is clamped to the user timeout, probes fire on whole
# seconds), and a margin for a loaded machine.
BOUND = PEER_TIMEOUT + 1
MARGIN = 5
DEVICE = "198.18.0.1"
PORT = 5555
SERIAL = f"{DEVICE}:{PORT}"
# Bytes per second each way: a 64 MiB transfer runs for about 16 s.
RATE = 4 << 20
SIZE = 64 << 20

# The forwarder: attaches to the TAP device in each namespace (setns, then
# TUNSETIFF), prints "ready", then copies frames both ways, paced to RATE.
FORWARDER = r"""
import ctypes, fcntl, os, select, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def attach(ns, name):
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), f"setns {ns}")
    os.close(fd)
    tap = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(tap, 0x400454CA, struct.pack("16sH", name.encode(), 0x0002 | 0x1000))
    return tap
a, b = attach(sys.argv[1], sys.argv[2]), attach(sys.argv[3], sys.argv[4])
rate = float(sys.argv[5])
peer, free = {a: b, b: a}, {a: 0.0, b: 0.0}
print("ready", flush=True)
while True:
    for fd in select.select([a, b], [], [])[0]:
        frame = os.read(fd, 70000)
        now = time.monotonic()
        free[fd] = max(free[fd], now) + len(frame) / rate
        if free[fd] > now:
            time.sleep(free[fd] - now)
        try:
            os.write(peer[fd], frame)
        except OSError:  # that side's interface is down: the frame is lost
            pass
"""


def run(*cmd: str) -> None:
    cp = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    assert cp.returncode == 0, (cmd, cp.stdout.decode("utf-8", "replace"))


class Link:
    """Two namespaces with a TAP device each, joined by the forwarder."""

    def __init__(self, tag: str):
        base = f"oxdeadpeer-{os.getpid()}-{tag}"
        self.dev_ns, self.host_ns = f"{base}-d", f"{base}-h"
        self.made: list[str] = []
        self.forwarder: subprocess.Popen | None = None

    def up(self) -> "Link":
        for ns, addr in ((self.dev_ns, DEVICE), (self.host_ns, "198.18.0.2")):
            run("ip", "netns", "add", ns)
            self.made.append(ns)
            run("ip", "-n", ns, "tuntap", "add", "dev", "tap0", "mode", "tap")
            # Large frames: fewer for the forwarder to copy.
            run("ip", "-n", ns, "link", "set", "tap0", "mtu", "16000")
            run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "tap0")
            run("ip", "-n", ns, "link", "set", "tap0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        self.forwarder = subprocess.Popen(
            [sys.executable, "-c", FORWARDER, self.dev_ns, "tap0", self.host_ns, "tap0",
             str(RATE)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        assert self.forwarder.stdout.readline() == b"ready\n", self.forwarder.poll()
        return self

    def cut(self, how: str = "pause") -> None:
        """`pause`: stops the forwarder, so that from now on no frame
        crosses, either way, and neither socket is told; `down`: takes the
        host's interface down (a cable pulled on the host's side)."""
        if how == "pause":
            self.forwarder.send_signal(signal.SIGSTOP)
        else:
            run("ip", "-n", self.host_ns, "link", "set", "tap0", "down")

    def down(self) -> None:
        if self.forwarder is not None:
            self.forwarder.kill()
            self.forwarder.wait(timeout=10)
            self.forwarder = None
        for ns in self.made:
            subprocess.run(["ip", "netns", "delete", ns], timeout=30)
        self.made = []


@contextlib.contextmanager
def device_and_host(tmp_path: Path, tag: str):
    """oxadbd in the device namespace (peer timeout 5 s, the host's key
    trusted) and a HOME for oxadb with that key; yields (link, daemon, home)."""
    home = tmp_path / "home"
    (home / ".android").mkdir(parents=True)
    key = home / ".android" / "adbkey"
    cp = subprocess.run([str(resolve_oxadb()), "keygen", str(key)], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, timeout=60, env=clean_env(HOME=str(home)))
    assert cp.returncode == 0, cp.stdout
    keys = tmp_path / "adb_keys"
    trust_key(Path(f"{key}.pub"), keys)
    link = Link(tag)
    daemon = None
    try:
        link.up()
        daemon = Daemon(resolve_oxadbd(), tmp_path / "daemon", host=DEVICE,
                        prefix=("ip", "netns", "exec", link.dev_ns),
                        args=("--keys", str(keys), "--peer-timeout", str(PEER_TIMEOUT)))
        daemon.start(port=PORT)
        yield link, daemon, home
    finally:
        if daemon is not None:
            daemon.stop()
        link.down()


def oxadb_in(link: Link, home: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", link.host_ns, str(resolve_oxadb()), "-s", SERIAL,
         "--peer-timeout", str(PEER_TIMEOUT), *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=clean_env(HOME=str(home)))


def temps(directory: Path, prefix: str) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.startswith(prefix)]


def wait_mid_transfer(directory: Path, prefix: str, proc: subprocess.Popen) -> None:
    """Until a temporary file in `directory` holds 4 MiB: the transfer runs."""
    deadline = time.monotonic() + 30
    while True:
        grown = [p for p in temps(directory, prefix) if p.stat().st_size >= 4 << 20]
        if grown:
            size = grown[0].stat().st_size
            assert size < SIZE, f"{grown[0]} already complete ({size} bytes): link too fast"
            return
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"no transfer under way in {directory}"
        time.sleep(0.05)


def wait_exit(proc: subprocess.Popen, cut_at: float) -> tuple[float, str]:
    """oxadb's exit, in seconds after the cut, and its stderr."""
    try:
        _out, err = proc.communicate(timeout=BOUND + MARGIN)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
        raise AssertionError(f"oxadb still running {BOUND + MARGIN} s after the cut: {err!r}")
    return time.monotonic() - cut_at, err.decode("utf-8", "replace")


def assert_lost_connection(proc: subprocess.Popen, elapsed: float, err: str) -> None:
    assert proc.returncode == 1, (proc.returncode, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"oxadb: error: lost the connection to {SERIAL}: no answer from "
                               "the peer within the peer timeout"), err
    assert elapsed <= BOUND + MARGIN, (elapsed, err)


def wait_daemon_closed(daemon: Daemon, since: int, cut_at: float) -> float:
    """Seconds from the cut to the daemon's log of the connection's end,
    which must name the cause."""
    line = daemon.wait_for_log(lambda l: "closing connection" in l, since=since,
                               timeout=BOUND + MARGIN + 1)
    assert line is not None, daemon.log_since(since).decode("utf-8", "replace")
    elapsed = time.monotonic() - cut_at
    assert "no answer from the peer within the peer timeout, link or peer down (" in line, line
    assert elapsed <= BOUND + MARGIN, (elapsed, line)
    return elapsed


@pytest.mark.parametrize("how", ["pause", "down"])
def test_a_push_over_a_cut_link_fails_on_both_ends_within_the_peer_timeout(tmp_path, how):
    source = tmp_path / "source.bin"
    write_random(source, SIZE)
    remote = tmp_path / "remote"
    remote.mkdir()
    old = remote / "target.bin"
    old.write_bytes(b"the old content\n")
    old_hash = sha256_file(old)
    with device_and_host(tmp_path, f"p{how[0]}") as (link, daemon, home):
        since = daemon.log_size()
        proc = oxadb_in(link, home, "push", str(source), str(old))
        try:
            wait_mid_transfer(remote, ".oxadb-push.", proc)
            link.cut(how)
            cut_at = time.monotonic()
            daemon_elapsed = wait_daemon_closed(daemon, since, cut_at)
            elapsed, err = wait_exit(proc, cut_at)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert_lost_connection(proc, elapsed, err)
        # The unfinished push is gone with its connection; the old file stays.
        deadline = time.monotonic() + 2
        while temps(remote, ".oxadb-push.") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert temps(remote, ".oxadb-push.") == [], list(remote.iterdir())
        assert sha256_file(old) == old_hash
        assert daemon.alive(), daemon.log_since(since)
        print(f"push ({how}): daemon closed {daemon_elapsed:.1f} s, oxadb exited {elapsed:.1f} s "
              f"after the cut (peer timeout {PEER_TIMEOUT} s)")


def test_a_pull_over_a_cut_link_fails_on_both_ends_within_the_peer_timeout(tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    source = remote / "source.bin"
    write_random(source, SIZE)
    local = tmp_path / "local"
    local.mkdir()
    old = local / "pulled.bin"
    old.write_bytes(b"the old content\n")
    old_hash = sha256_file(old)
    with device_and_host(tmp_path, "l") as (link, daemon, home):
        since = daemon.log_size()
        proc = oxadb_in(link, home, "pull", str(source), str(old))
        try:
            wait_mid_transfer(local, ".oxadb-pull.", proc)
            link.cut()
            cut_at = time.monotonic()
            elapsed, err = wait_exit(proc, cut_at)
            daemon_elapsed = wait_daemon_closed(daemon, since, cut_at)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert_lost_connection(proc, elapsed, err)
        assert temps(local, ".oxadb-pull.") == [], list(local.iterdir())
        assert sha256_file(old) == old_hash
        assert daemon.alive(), daemon.log_since(since)
        print(f"pull: oxadb exited {elapsed:.1f} s, daemon closed {daemon_elapsed:.1f} s "
              f"after the cut (peer timeout {PEER_TIMEOUT} s)")


def test_an_idle_shell_over_a_cut_link_is_hung_up_and_fails_within_the_peer_timeout(tmp_path):
    # Nothing waits to be sent either way: keepalive is what notices.
    hup = tmp_path / "hup"
    # stderr to a file: the shell reports the `sleep` the hang-up killed,
    # and that report must not die of SIGPIPE before the trap runs.
    script = (f"exec 2>{tmp_path / 'stderr'}; trap 'echo hup > {hup}; exit 0' HUP; "
              "echo started; while :; do sleep 0.1; done")
    with device_and_host(tmp_path, "s") as (link, daemon, home):
        since = daemon.log_size()
        proc = oxadb_in(link, home, "shell", script)
        try:
            assert proc.stdout.readline() == b"started\n", proc.poll()
            time.sleep(0.5)
            link.cut()
            cut_at = time.monotonic()
            daemon_elapsed = wait_daemon_closed(daemon, since, cut_at)
            deadline = time.monotonic() + 5
            while not hup.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert hup.exists(), daemon.log_since(since).decode("utf-8", "replace")
            assert hup.read_text() == "hup\n"
            elapsed, err = wait_exit(proc, cut_at)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert_lost_connection(proc, elapsed, err)
        assert daemon.alive(), daemon.log_since(since)
        print(f"idle shell: daemon closed {daemon_elapsed:.1f} s, oxadb exited {elapsed:.1f} s "
              f"after the cut (peer timeout {PEER_TIMEOUT} s)")
