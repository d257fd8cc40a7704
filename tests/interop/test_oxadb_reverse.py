"""`oxadb reverse` against oxadbd, in burst mode (delayed_ack negotiated,
confirmed from the daemon's `stream closed` lines).

`oxadb reverse REMOTE LOCAL` stays in the foreground serving; it runs here
as a background process stopped with SIGINT (Ctrl-C). Reverses belong to
their connection, and every oxadb command is a connection of its own: a
second oxadb neither lists nor removes the first one's, which these tests
check too (`oxadb reverse --help` says so).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest

from echo import EchoServer, answer_to, concurrent_echo, refused, roundtrip, unix_roundtrip
from harness import closed_streams, free_port, resolve_oxadb, stop_process

MIB = 1 << 20


@pytest.fixture
def oxadb(tmp_path):
    """Runs `oxadb -s SERIAL ARGS...` with a private HOME; `.serve(...)`
    starts a foreground `oxadb reverse` in the background."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANDROID_", "OXADB_", "ADB_")) and k != "RUST_LOG"}
    env["HOME"] = str(home)
    running: list[subprocess.Popen] = []

    class Oxadb:
        def __call__(self, serial: str, *args: str, timeout: float = 60):
            return subprocess.run([str(resolve_oxadb()), "-s", serial, *args],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env, timeout=timeout, text=True)

        def serve(self, serial: str, *args: str) -> subprocess.Popen:
            proc = subprocess.Popen([str(resolve_oxadb()), "-s", serial, "reverse", *args],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env, text=True)
            running.append(proc)
            return proc

    yield Oxadb()
    for proc in running:
        stop_process(proc, timeout=5)


def wait_serving(proc: subprocess.Popen, timeout: float = 20) -> str:
    """Waits for `oxadb reverse`'s `reversing ...` line on stderr; returns it."""
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if line.startswith("reversing "):
            return line
        if not line and proc.poll() is not None:
            break
    rest = proc.stderr.read() if proc.poll() is not None else ""
    raise AssertionError(f"oxadb reverse did not start serving: rc={proc.poll()} "
                         f"stderr={line!r}{rest!r}")


def interrupt(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=10)


@pytest.fixture
def echo():
    servers: list[EchoServer] = []

    def make(family=socket.AF_INET, address=("127.0.0.1", 0)) -> EchoServer:
        srv = EchoServer(family, address)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.close()


def test_tcp0_burst_16_connections(fresh_daemon, oxadb, echo):
    d = fresh_daemon()
    srv = echo()
    proc = oxadb.serve(d.serial, "tcp:0", f"tcp:{srv.port}")
    port = int(proc.stdout.readline())
    assert f"reversing tcp:{port} on {d.serial} to tcp:{srv.port}" in wait_serving(proc)
    assert roundtrip(port, b"hello from the device app") == b"hello from the device app"
    concurrent_echo(port)
    assert srv.accepted == 17
    lines = closed_streams(d, service=f"tcp:{srv.port}", want=17)
    assert all(line["delayed_ack"] == "true" for line in lines), lines
    big = [line for line in lines if int(line["bytes_sent"]) == 8 * MIB]
    assert len(big) == 16 and all(int(line["bytes_received"]) == 8 * MIB for line in big), lines
    # Ctrl-C ends the connection, and with it the device's listener.
    assert interrupt(proc) == 130
    assert refused(port), f"127.0.0.1:{port} still accepts after oxadb reverse ended"


def test_unix_ends_both_sides(fresh_daemon, oxadb, echo, tmp_path):
    d = fresh_daemon()
    host_path = str(tmp_path / "host.sock")
    echo(socket.AF_UNIX, host_path)
    host_abstract = f"oxadb-test-host-{os.getpid()}-{time.monotonic_ns()}"
    echo(socket.AF_UNIX, "\0" + host_abstract)
    device_path = str(tmp_path / "device.sock")
    device_abstract = f"oxadb-test-device-{os.getpid()}-{time.monotonic_ns()}"

    first = oxadb.serve(d.serial, f"localfilesystem:{device_path}",
                        f"localabstract:{host_abstract}")
    wait_serving(first)
    second = oxadb.serve(d.serial, f"localabstract:{device_abstract}",
                         f"localfilesystem:{host_path}")
    wait_serving(second)
    payload = os.urandom(MIB)
    assert unix_roundtrip(device_path, payload, timeout=60) == payload
    assert unix_roundtrip("\0" + device_abstract, payload, timeout=60) == payload
    assert interrupt(first) == 130
    deadline = time.monotonic() + 5
    while os.path.exists(device_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(device_path), "the device's socket file outlived its listener"
    assert interrupt(second) == 130


def test_other_connections_see_nothing(fresh_daemon, oxadb, echo):
    d = fresh_daemon()
    srv, other = echo(), echo()
    a = free_port()
    proc = oxadb.serve(d.serial, f"tcp:{a}", f"tcp:{srv.port}")
    wait_serving(proc)
    assert roundtrip(a, b"one") == b"one"

    r = oxadb(d.serial, "reverse", "--list")
    # adb's format: the (empty) list, then a newline.
    assert (r.returncode, r.stdout) == (0, "\n"), r
    r = oxadb(d.serial, "reverse", "--remove", f"tcp:{a}")
    assert r.returncode == 1 and f"listener 'tcp:{a}' not found" in r.stderr, r
    r = oxadb(d.serial, "reverse", "--remove-all")
    assert r.returncode == 0, r
    # The same LOCAL from another connection is another listener, which
    # cannot bind the port the first one holds; --no-rebind changes nothing.
    r = oxadb(d.serial, "reverse", "--no-rebind", f"tcp:{a}", f"tcp:{other.port}")
    assert r.returncode == 1 and "cannot bind listener" in r.stderr, r
    assert roundtrip(a, b"still served") == b"still served"
    assert (srv.accepted, other.accepted) == (2, 0)
    assert proc.poll() is None
    assert interrupt(proc) == 130
    assert refused(a)


def test_refused_host_end_closes_the_app_socket(fresh_daemon, oxadb):
    d = fresh_daemon()
    dead, a = free_port(), free_port()
    proc = oxadb.serve(d.serial, f"tcp:{a}", f"tcp:{dead}")
    wait_serving(proc)
    assert answer_to(a) == b""
    assert proc.poll() is None, "oxadb reverse ended on one refused connection"
    assert interrupt(proc) == 130
    assert f"cannot connect to tcp:{dead}" in proc.stderr.read()


def test_bad_arguments(fresh_daemon, oxadb):
    d = fresh_daemon()
    r = oxadb(d.serial, "reverse", "tcp:1")
    assert r.returncode != 0 and "LOCAL" in r.stderr, r
    r = oxadb(d.serial, "reverse", "tcp:0", "jdwp:1")
    assert r.returncode == 1 and "unsupported host end \"jdwp:1\"" in r.stderr, r
    r = oxadb(d.serial, "reverse", "localreserved:x", "tcp:1")
    assert r.returncode == 1 and "cannot bind listener" in r.stderr, r
