"""`oxadb server` under load and abuse, driven by Google's adb 29 CLI.

One `oxadb server -P PORT` (a private port) for the module, as in
test_server.py:

  * 16 adb clients push 64 MiB each to one device at once: all arrive
    sha256-correct;
  * a client SIGKILLed mid-push harms neither the other pushes nor the
    device connection;
  * the device killed mid-push: that client gets adb's error instead of
    hanging, and the server keeps serving another device;
  * the device SIGKILLed while a push's bytes arrive: adb prints the same
    error and exits as through Google's adb 29 server, and another device
    pushes through the same server during and after;
  * malformed smart-socket requests (AOSP docs/dev/services.md: 4 hex
    digits of length, then the request) get `FAIL` or a close, and a client
    that stalls mid-request blocks nobody.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness import AdbResult, Daemon, sha256_file, write_random
# test_server's `server` and `ours` fixtures, used as they are; `ours`
# connects to this module's own `device` (no debug log) below.
from test_server import Client, _request, ours, server  # noqa: F401

CLIENTS = 16
PUSH_SIZE = 64 << 20
CLIENT_TIMEOUT = 50.0


@pytest.fixture(scope="module")
def device(oxadbd_bin, tmp_path_factory):
    # No debug log: 1 GiB of pushes would write it line by line.
    d = Daemon(oxadbd_bin, tmp_path_factory.mktemp("oxadbd"), rust_log=None)
    d.start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[tuple[Path, str]]:
    """16 files of distinct random data, made once for the module."""
    root = tmp_path_factory.mktemp("sources")
    return [(root / f"src{i}.bin", write_random(root / f"src{i}.bin", PUSH_SIZE))
            for i in range(CLIENTS)]


def _device_sha256(client: Client, serial: str, path: Path) -> str:
    r = client("-s", serial, "shell", f"sha256sum {path}", timeout=CLIENT_TIMEOUT)
    assert r.rc == 0, r
    return r.out.split()[0]


def _state_of(client: Client, serial: str) -> str | None:
    for line in client("devices").out.splitlines()[1:]:
        fields = line.split("\t")
        if len(fields) == 2 and fields[0] == serial:
            return fields[1]
    return None


def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"{what} not within {timeout}s")


def test_sixteen_clients_push_at_once(ours, device, sources, tmp_path):
    start = time.monotonic()

    def push(i: int):
        src, _ = sources[i]
        return ours("push", str(src), str(tmp_path / f"dst{i}.bin"), timeout=CLIENT_TIMEOUT)

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(push, range(CLIENTS)))
    elapsed = time.monotonic() - start
    for r in results:
        assert r.rc == 0, r
    for i, (_, digest) in enumerate(sources):
        assert sha256_file(tmp_path / f"dst{i}.bin") == digest, i
    # And as the device sees them, through the server.
    assert _device_sha256(ours, device.serial, tmp_path / "dst0.bin") == sources[0][1]
    assert elapsed < 60, f"16 pushes of 64 MiB took {elapsed:.1f}s"


def test_a_killed_client_harms_no_other(ours, device, sources, tmp_path):
    # The victim's file is large (8 GiB: seconds even at 3 GB/s; sparse, to
    # spare the disk) so that it is surely still pushing when it is killed.
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(8 << 30)
    victim = ours.popen("push", str(big), str(tmp_path / "victim.bin"))
    others = [ours.popen("push", str(sources[i][0]), str(tmp_path / f"other{i}.bin"))
              for i in range(1, 4)]
    try:
        # Zeros may be written sparsely, so the destination's size says
        # nothing yet: the push is given a moment to be under way.
        time.sleep(1.0)
        assert victim.poll() is None, "the 8 GiB push ended within a second"
        victim.send_signal(signal.SIGKILL)
        # Killed while it ran, not after it was done.
        assert victim.wait(timeout=10) == -signal.SIGKILL
        for p in others:
            _, err = p.communicate(timeout=CLIENT_TIMEOUT)
            assert p.returncode == 0, err
    finally:
        for p in (victim, *others):
            if p.poll() is None:
                p.kill()
                p.wait()
    for i in range(1, 4):
        assert sha256_file(tmp_path / f"other{i}.bin") == sources[i][1], i
    assert _state_of(ours, device.serial) == "device"
    r = ours("push", str(sources[5][0]), str(tmp_path / "after.bin"), timeout=CLIENT_TIMEOUT)
    assert r.rc == 0, r
    assert sha256_file(tmp_path / "after.bin") == sources[5][1]


def test_a_killed_device_fails_its_client(ours, device, fresh_daemon, server, sources, tmp_path):
    doomed = fresh_daemon("doomed", rust_log=None)
    r = ours("connect", doomed.serial)
    assert r.out.strip() == f"connected to {doomed.serial}", r
    # 64 MiB crosses loopback in well under a second: the daemon is frozen
    # before the push starts, so that it surely dies with the push unfinished
    # (the client has opened its sync service and is sending into the server).
    doomed.proc.send_signal(signal.SIGSTOP)
    pusher = ours.popen("-s", doomed.serial, "push", str(sources[0][0]),
                        str(tmp_path / "doomed.bin"))
    try:
        time.sleep(1.5)
        assert pusher.poll() is None, "the push ended with its device frozen"
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait(timeout=10)
        out, err = pusher.communicate(timeout=20)
    finally:
        if pusher.poll() is None:
            pusher.kill()
            pusher.wait()
    assert pusher.returncode != 0, (out, err)
    # adb 29 prints this failure on stdout: `adb: error: connect failed: closed`.
    assert b"error" in out + err, ("no error from adb", out, err)
    assert server.proc.poll() is None, server.log()
    _wait_until(lambda: _state_of(ours, doomed.serial) in (None, "offline"), 15,
                f"{doomed.serial} offline or gone")
    # The other device, through the same server, still works.
    r = ours("-s", device.serial, "shell", "echo alive")
    assert (r.rc, r.out) == (0, "alive\n"), r
    r = ours("-s", device.serial, "push", str(sources[1][0]), str(tmp_path / "survivor.bin"),
             timeout=CLIENT_TIMEOUT)
    assert r.rc == 0, r
    assert sha256_file(tmp_path / "survivor.bin") == sources[1][1]
    ours("disconnect", doomed.serial)


@pytest.fixture(scope="module")
def big_source(tmp_path_factory) -> Path:
    """1 GiB of random data: a push still under way when its first MiBs land."""
    path = tmp_path_factory.mktemp("big") / "big.bin"
    write_random(path, 1 << 30)
    return path


RATE = re.compile(r"\d+\.\d+ MB/s \(\d+ bytes in \d+\.\d+s\)")


def _landed(directory: Path) -> int:
    """Bytes in `directory` (oxadbd writes a push to a hidden temporary file)."""
    return sum(entry.stat().st_size for entry in os.scandir(directory))


def _push_and_kill(client: Client, doomed: Daemon, source: Path, destination: Path,
                   alongside=None) -> tuple[int, str, str]:
    """`adb push` to `doomed`, SIGKILLed once 4 MiB have landed; adb's exit
    status, stdout and stderr with the rate and the destination made
    constant. `alongside` runs while the push does, across the kill."""
    destination.mkdir()
    pusher = client.popen("-s", doomed.serial, "push", str(source), str(destination / "big.bin"))
    try:
        deadline = time.monotonic() + 30
        while _landed(destination) < 4 << 20:
            assert pusher.poll() is None, ("the push ended before 4 MiB landed",
                                           pusher.communicate())
            assert time.monotonic() < deadline, "4 MiB did not land within 30 s"
            time.sleep(0.002)
        worker = threading.Thread(target=alongside) if alongside else None
        if worker:
            worker.start()
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait(timeout=10)
        # Killed while the push was under way, not after it was done.
        assert _landed(destination) < source.stat().st_size
        out, err = pusher.communicate(timeout=CLIENT_TIMEOUT)
        if worker:
            worker.join(timeout=CLIENT_TIMEOUT)
            assert not worker.is_alive()
    finally:
        if pusher.poll() is None:
            pusher.kill()
            pusher.wait()
    text = lambda b: RATE.sub("RATE", b.decode("utf-8", "replace")).replace(
        str(destination), "$DST")
    return pusher.returncode, text(out), text(err)


def test_a_device_killed_mid_push_fails_adb_as_googles_server_does(
        ours, server, device, adb_server, fresh_daemon, big_source, sources, tmp_path):
    # Google's adb 29 server, its own doomed daemon: what adb should say.
    google = Client(adb_server.adb, adb_server.port, adb_server.home)
    doomed = fresh_daemon("doomed-google", rust_log=None)
    adb_server.connect(doomed.serial)
    theirs = _push_and_kill(google, doomed, big_source, tmp_path / "google")
    google("disconnect", doomed.serial)

    doomed = fresh_daemon("doomed-ours", rust_log=None)
    r = ours("connect", doomed.serial)
    assert r.out.strip() == f"connected to {doomed.serial}", r
    during: list[AdbResult] = []

    def push_to_the_other_device():
        during.append(ours("-s", device.serial, "push", str(sources[2][0]),
                           str(tmp_path / "during.bin"), timeout=CLIENT_TIMEOUT))

    mine = _push_and_kill(ours, doomed, big_source, tmp_path / "ours",
                          alongside=push_to_the_other_device)
    assert mine[0] != 0 and "adb: error: failed to copy" in mine[1], mine
    assert mine == theirs, (mine, theirs)
    assert server.proc.poll() is None, server.log()
    # The other device pushed through the same server across the kill...
    assert len(during) == 1 and during[0].rc == 0, during
    assert sha256_file(tmp_path / "during.bin") == sources[2][1]
    # ...and still does after it.
    _wait_until(lambda: _state_of(ours, doomed.serial) in (None, "offline"), 15,
                f"{doomed.serial} offline or gone")
    r = ours("-s", device.serial, "push", str(sources[3][0]), str(tmp_path / "after.bin"),
             timeout=CLIENT_TIMEOUT)
    assert r.rc == 0, r
    assert sha256_file(tmp_path / "after.bin") == sources[3][1]
    ours("disconnect", doomed.serial)


def _raw(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Sends `data` as is, then reads until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            # The server answered and closed with the rest of `data` unread:
            # the reset can come before this shutdown.
            return b""
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return out
            if not chunk:
                return out
            out += chunk


def _is_fail_or_close(reply: bytes) -> bool:
    if reply == b"":
        return True
    if not reply.startswith(b"FAIL") or len(reply) < 8:
        return False
    length = int(reply[4:8], 16)
    return length > 0 and len(reply) == 8 + length


@pytest.mark.parametrize("data", [
    pytest.param(b"zzzzhost:version", id="non-hex-length"),
    pytest.param(b"0000", id="zero-length"),
    pytest.param(b"%04x" % 0xffff + b"x" * 16, id="oversize-length"),
    pytest.param(b"", id="nothing"),
    pytest.param(b"0013host:nosuch-service", id="unknown-host-service"),
    pytest.param(b"0008shell:id", id="device-service-without-transport"),
    pytest.param(b"00", id="half-a-length"),
])
def test_malformed_requests_fail_cleanly(ours, server, device, data):
    pid = server.proc.pid
    reply = _raw(server.port, data)
    assert _is_fail_or_close(reply), reply
    assert server.proc.poll() is None and server.proc.pid == pid, server.log()
    r = ours("devices")
    assert r.rc == 0 and f"{device.serial}\tdevice" in r.out, r
    assert _request(server.port, b"host:version") == b"OKAY00040029"


def test_known_failures_carry_a_message(server, ours):
    for text in (b"host:nosuch-service", b"shell:id"):
        reply = _request(server.port, text)
        assert reply.startswith(b"FAIL") and len(reply) > 8, (text, reply)


def test_a_length_over_max_payload_is_refused(server, ours, device):
    """A 4-hex-digit length tops out at 0xffff, but a client may still send
    that much: the server must not wait for a request it will never take."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"ffff" + b"h" * 0xffff)
        s.shutdown(socket.SHUT_WR)
        reply = b""
        try:
            while chunk := s.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass
    assert _is_fail_or_close(reply), reply
    assert f"{device.serial}\tdevice" in ours("devices").out


def test_a_stalled_client_blocks_nobody(server, ours, device):
    stalled = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
               for _ in range(4)]
    try:
        stalled[0].sendall(b"00")                 # half a length
        stalled[1].sendall(b"000c")               # a length, no request
        stalled[2].sendall(b"000chost:")          # part of a request
        # stalled[3] sends nothing at all
        start = time.monotonic()
        r = ours("devices", timeout=10)
        assert r.rc == 0 and f"{device.serial}\tdevice" in r.out, r
        r = ours("-s", device.serial, "shell", "echo through", timeout=10)
        assert (r.rc, r.out) == (0, "through\n"), r
        assert time.monotonic() - start < 5
    finally:
        for s in stalled:
            s.close()
    assert _request(server.port, b"host:version") == b"OKAY00040029"
