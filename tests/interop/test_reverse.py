"""`adb reverse` (Google adb 29, and adb 34 in burst mode) against oxadbd.

The test plays the device's app: it connects to the listener the daemon
made on 127.0.0.1 (or a unix socket), and the bytes come out of an echo
server on the host side, through a stream the daemon opened to the adb
server. Each test runs its own daemon, connected to the module's adb
server of each version (`peer`): adb 34 with `ADB_DELAYED_ACK=1`, so the
device-opened streams run in burst mode, which the daemon's `stream
closed` lines confirm.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from echo import EchoServer, answer_to, concurrent_echo, refused, roundtrip, unix_roundtrip
from harness import REPO, AdbServer, closed_streams, free_port

ADB34 = Path(os.environ.get("OXADB_ADB34") or REPO / "target" / "peers" / "adb-34" / "adb")
MIB = 1 << 20


@pytest.fixture(scope="module", params=["adb29", "adb34"])
def peer(request, adb_bin, tmp_path_factory):
    if request.param == "adb29":
        srv = AdbServer(adb_bin, tmp_path_factory.mktemp("adb29"))
    else:
        if not ADB34.exists():
            pytest.fail(f"Google adb 34 is not installed at {ADB34}: ./scripts/test.sh installs "
                        f"it (scripts/install-adb34.sh target/peers/adb-34)")
        srv = AdbServer(str(ADB34), tmp_path_factory.mktemp("adb34"))
        srv.env["ADB_DELAYED_ACK"] = "1"
    srv.name = request.param
    srv.start()
    yield srv
    srv.kill()


@pytest.fixture
def device(peer, fresh_daemon):
    """A daemon of this test's own, connected; `(daemon, adb)`."""
    d = fresh_daemon()
    peer.connect(d.serial)

    def adb(*args: str, **kw):
        return peer.run(*args, serial=d.serial, **kw)

    yield d, adb
    peer.disconnect(d.serial)


@pytest.fixture
def echo():
    servers: list[EchoServer] = []

    def make() -> EchoServer:
        srv = EchoServer.tcp()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.close()


def reverse(adb, *args: str):
    r = adb("reverse", *args)
    assert r.rc == 0, r
    return r


def listed(adb) -> list[str]:
    r = reverse(adb, "--list")
    return [line for line in r.out.splitlines() if line]


def test_tcp_relay_list_rebind_remove(device, echo):
    d, adb = device
    first, second = echo(), echo()
    a, b = free_port(), free_port()
    r = reverse(adb, f"tcp:{a}", f"tcp:{first.port}")
    assert r.out == "", r  # a port is printed only for tcp:0
    assert roundtrip(a, b"hello from the device app\n") == b"hello from the device app\n"
    assert first.accepted == 1
    reverse(adb, f"tcp:{b}", f"tcp:{second.port}")
    assert listed(adb) == [f"(reverse) tcp:{a} tcp:{first.port}",
                           f"(reverse) tcp:{b} tcp:{second.port}"]

    # --no-rebind on a bound LOCAL fails with adb's message; the first keeps working.
    r = adb("reverse", "--no-rebind", f"tcp:{a}", f"tcp:{second.port}")
    assert r.rc != 0 and "error: cannot rebind existing socket" in r.err, r
    assert roundtrip(a, b"still the first") == b"still the first"
    assert first.accepted == 2

    # A plain rebind replaces REMOTE for the connections accepted after it.
    reverse(adb, f"tcp:{a}", f"tcp:{second.port}")
    assert roundtrip(a, b"now the second") == b"now the second"
    assert (first.accepted, second.accepted) == (2, 1)
    assert listed(adb)[0] == f"(reverse) tcp:{a} tcp:{second.port}"

    reverse(adb, "--remove", f"tcp:{a}")
    assert refused(a)
    assert listed(adb) == [f"(reverse) tcp:{b} tcp:{second.port}"]
    r = adb("reverse", "--remove", f"tcp:{a}")
    assert r.rc != 0 and f"error: listener 'tcp:{a}' not found" in r.err, r

    reverse(adb, "--remove-all")
    assert listed(adb) == []
    assert refused(b)
    # The same port binds again at once: removal waits for the socket to close.
    reverse(adb, f"tcp:{a}", f"tcp:{first.port}")
    assert roundtrip(a, b"again") == b"again"


def test_tcp0_prints_the_port(device, echo):
    d, adb = device
    srv = echo()
    r = reverse(adb, "tcp:0", f"tcp:{srv.port}")
    port = int(r.out.strip())
    assert port > 0
    assert listed(adb) == [f"(reverse) tcp:{port} tcp:{srv.port}"]
    payload = os.urandom(MIB)
    assert roundtrip(port, payload, timeout=60) == payload
    # The listener is on loopback only (adbd would take every interface).
    line = d.wait_for_log(lambda l: "reverse: listening" in l and f"tcp:{port}" in l)
    assert line is not None
    with open("/proc/net/tcp") as f:
        rows = [row.split() for row in f.read().splitlines()[1:]]
    listening = [r[1] for r in rows if r[3] == "0A" and int(r[1].split(":")[1], 16) == port]
    assert listening == [f"0100007F:{port:04X}"], listening


def test_unix_device_sides(device, tmp_path, echo):
    d, adb = device
    srv = echo()
    name = f"oxadb-reverse-test-{os.getpid()}-{time.monotonic_ns()}"
    reverse(adb, f"localabstract:{name}", f"tcp:{srv.port}")
    assert unix_roundtrip("\0" + name, b"abstract") == b"abstract"
    path = str(tmp_path / "app.sock")
    reverse(adb, f"localfilesystem:{path}", f"tcp:{srv.port}")
    payload = os.urandom(MIB)
    assert unix_roundtrip(path, payload, timeout=60) == payload
    assert listed(adb) == [f"(reverse) localabstract:{name} tcp:{srv.port}",
                           f"(reverse) localfilesystem:{path} tcp:{srv.port}"]
    reverse(adb, "--remove", f"localfilesystem:{path}")
    assert not os.path.exists(path)
    reverse(adb, "--remove-all")
    with socket.socket(socket.AF_UNIX) as s:
        assert s.connect_ex("\0" + name) != 0


def test_refused_on_the_host_closes_the_app_socket(device):
    d, adb = device
    dead = free_port()  # nothing listens there on the host
    a = free_port()
    reverse(adb, f"tcp:{a}", f"tcp:{dead}")
    assert answer_to(a) == b""
    r = adb("shell", "echo ok")
    assert r.stdout == b"ok\n", r


def test_16_connections_8mib_each(device, peer, echo):
    d, adb = device
    srv = echo()
    a = free_port()
    reverse(adb, f"tcp:{a}", f"tcp:{srv.port}")
    concurrent_echo(a)
    assert srv.accepted == 16
    lines = closed_streams(d, service=f"tcp:{srv.port}", want=16)
    burst = peer.name == "adb34"
    assert all(line["delayed_ack"] == str(burst).lower() for line in lines), lines
    assert all(int(line["bytes_sent"]) == 8 * MIB == int(line["bytes_received"])
               for line in lines), lines


def test_listeners_go_with_the_connection(peer, fresh_daemon, echo):
    d = fresh_daemon()
    peer.connect(d.serial)
    srv = echo()
    a = free_port()
    r = peer.run("reverse", f"tcp:{a}", f"tcp:{srv.port}", serial=d.serial)
    assert r.rc == 0, r
    assert roundtrip(a, b"before") == b"before"
    peer.disconnect(d.serial)
    assert refused(a), f"127.0.0.1:{a} still accepts after adb disconnect"
    assert d.wait_for_log(lambda l: "listeners closed" in l) is not None
    # A new connection starts with no reverses of its own.
    peer.connect(d.serial)
    r = peer.run("reverse", "--list", serial=d.serial)
    assert r.rc == 0 and r.out.strip() == "", r
    peer.disconnect(d.serial)


def test_bad_requests(device):
    d, adb = device
    r = adb("reverse", "--remove", "tcp:1")
    assert r.rc != 0 and "error: listener 'tcp:1' not found" in r.err, r
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = adb("reverse", f"tcp:{port}", "tcp:1")
    assert r.rc != 0 and "error: cannot bind listener:" in r.err and "in use" in r.err, r
    r = adb("reverse", "localreserved:x", "tcp:1")
    assert r.rc != 0 and "error: cannot bind listener:" in r.err and "localreserved:x" in r.err, r
    assert listed(adb) == []
    r = adb("shell", "echo ok")
    assert r.stdout == b"ok\n", r


def test_another_connection_neither_lists_nor_removes(adb_server, fresh_daemon, echo,
                                                      tmp_path):
    """adb 29 and adb 34 connected to the same daemon at once: two
    connections, each with its own reverses (adbd's are per transport)."""
    if not ADB34.exists():
        pytest.fail(f"Google adb 34 is not installed at {ADB34}")
    other = AdbServer(str(ADB34), tmp_path / "adb34")
    other.start()
    try:
        d = fresh_daemon()
        adb_server.connect(d.serial)
        other.connect(d.serial)
        srv = echo()
        a = free_port()
        r = adb_server.run("reverse", f"tcp:{a}", f"tcp:{srv.port}", serial=d.serial)
        assert r.rc == 0, r
        r = other.run("reverse", "--list", serial=d.serial)
        assert r.rc == 0 and r.out.strip() == "", r
        r = other.run("reverse", "--remove", f"tcp:{a}", serial=d.serial)
        assert r.rc != 0 and f"listener 'tcp:{a}' not found" in r.err, r
        r = other.run("reverse", "--remove-all", serial=d.serial)
        assert r.rc == 0, r
        # The same port from the other connection would be a second listener.
        r = other.run("reverse", f"tcp:{a}", "tcp:1", serial=d.serial)
        assert r.rc != 0 and "cannot bind listener" in r.err, r
        assert roundtrip(a, b"untouched") == b"untouched"
        r = adb_server.run("reverse", "--list", serial=d.serial)
        assert [l for l in r.out.splitlines() if l] == [f"(reverse) tcp:{a} tcp:{srv.port}"], r
        # One connection ending leaves the other's listeners alone.
        other.disconnect(d.serial)
        assert roundtrip(a, b"still") == b"still"
        adb_server.disconnect(d.serial)
        assert refused(a)
    finally:
        other.kill()
