"""`oxadb server`'s mDNS discovery, pairing and TLS devices, driven by
Google's adb 34 CLI (test_adb34.py installs it; adb 29 has no `pair` nor
`mdns`).

Each test makes two network namespaces joined by a veth pair
(test_mdns.py's Link: 198.18.0.1 the device, 198.18.0.2 the host) and
removes them at teardown. oxadbd (and its `oxadbd pair` window) runs in
the device namespace and announces itself there; `oxadb server` and the
adb CLI run in the host namespace, the CLI reaching the server on that
namespace's loopback.

  * `adb mdns check` names the discovery; `adb mdns services` lists the
    pairing window, then the daemon's two services, in adb's lines;
  * `adb pair ADDR CODE` through the server: adb's answer, the GUID
    recorded in ~/.android/adb_known_hosts.pb; a wrong code is refused
    as Google's server refuses it (FAIL after OKAY, which adb 34's client
    misreads);
  * the paired daemon, started next with TLS required, is connected by
    the server as soon as its `_adb-tls-connect._tcp` service is seen,
    listed under the service name, and `adb shell` works over TLS;
    `adb connect IP:PORT` to it works over TLS too;
  * an unpaired device is seen (also by `track-mdns-services`, adb's
    protobuf) but not connected by itself, and
    `adb connect INSTANCE._adb-tls-connect._tcp` connects it by name.

Google's adb 34 server is not compared here: Debian's build has no mDNS
backend (test_mdns.py's docstring), so its `mdns` answers are empty.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from harness import (ADB_TIMEOUT, AdbResult, clean_env, free_port, resolve_oxadb,
                     resolve_oxadbd, stop_process, trust_key)
from test_adb34 import adb34_bin  # noqa: F401  (fixture)
from test_mdns import DEVICE, PORT, SERIAL, Link, config_file, instance_in, start_daemon

PAIRING_PORT = 37123
# A service is seen within a second or two on a quiet link; generous
# bounds for a loaded machine.
SEEN_WITHIN = 20.0
CONNECT = "_adb-tls-connect._tcp"
PLAIN = "_adb._tcp"
PAIRING = "_adb-tls-pairing._tcp"


class NsServer:
    """`oxadb server -P PORT` in the host namespace, with a private HOME
    whose key adb 34 made; the adb CLI runs there too."""

    def __init__(self, link: Link, workdir: Path, adb: str):
        self.link = link
        self.adb = adb
        self.home = workdir / "home"
        (self.home / ".android").mkdir(parents=True)
        cp = subprocess.run([adb, "keygen", str(self.home / ".android" / "adbkey")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60,
                            env=clean_env(HOME=str(self.home)))
        assert cp.returncode == 0, cp.stdout
        self.port = free_port()
        self.log_path = workdir / "oxadb-server.log"
        self.env = clean_env(HOME=str(self.home), TMPDIR=str(self.home),
                             OXADB_STATE_DIR=str(workdir / "state"), RUST_LOG="info",
                             ADB_EMU="0", ADB_USB="0")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", link.host_ns, str(resolve_oxadb()), "server",
                 "-P", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env)
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, f"oxadb server exited:\n{self.log()}"
            r = self("version", timeout=10)
            if r.rc == 0:
                break
            assert time.monotonic() < deadline, f"no server:\n{r}\n{self.log()}"
            time.sleep(0.2)

    def __call__(self, *args: str, timeout: float = ADB_TIMEOUT) -> AdbResult:
        cmd = ["ip", "netns", "exec", self.link.host_ns, self.adb, "-P", str(self.port), *args]
        cp = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=self.env, timeout=timeout)
        return AdbResult(list(args), cp)

    def log(self) -> str:
        return self.log_path.read_text("utf-8", "replace")

    def wait_for(self, args: tuple[str, ...], line: str, present: bool = True,
                 timeout: float = SEEN_WITHIN) -> str:
        """Runs `adb ARGS` until its output has `line` (or, with
        `present=False`, no longer has it)."""
        deadline = time.monotonic() + timeout
        while True:
            r = self(*args)
            assert r.rc == 0, (r, self.log())
            if (line in r.out.splitlines()) == present:
                return r.out
            if time.monotonic() > deadline:
                raise AssertionError(f"adb {' '.join(args)} never {'had' if present else 'lost'} "
                                     f"{line!r}:\n{r.out}\n{self.log()[-4000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        stop_process(self.proc)


class PairingWindow:
    """`oxadbd pair` on DEVICE:PAIRING_PORT in the device namespace, with
    the daemon's keys, config and state directory (so it sends the
    daemon's mDNS instance name as its GUID), open for `seconds`."""

    def __init__(self, link: Link, tmp_path: Path, seconds: int = 60):
        (tmp_path / "state").mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", link.dev_ns, str(resolve_oxadbd()), "pair",
             "--listen", f"{DEVICE}:{PAIRING_PORT}", "--timeout", str(seconds),
             "--max-failures", "3", "--failure-delay", "0",
             "--keys", str(tmp_path / "adb_keys"), "--state-dir", str(tmp_path / "state"),
             "--config", str(config_file(tmp_path))],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=clean_env(RUST_LOG="info"))
        line = self.proc.stdout.readline().decode()
        assert line.startswith("pairing code: "), (line, self.proc.stderr.read1().decode())
        self.code = line.removeprefix("pairing code: ").strip()
        self.wrong_code = f"{(int(self.code) + 1) % 1000000:06d}"

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            stop_process(self.proc)
        return rc, self.proc.stderr.read().decode("utf-8", "replace")

    def stop(self) -> None:
        stop_process(self.proc)


TRACK_CLIENT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
s.sendall(b"%04x" % len(b"host:track-mdns-services") + b"host:track-mdns-services")
def exactly(n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "closed"
        out += chunk
    return out
assert exactly(4) == b"OKAY"
sys.stdout.write(exactly(int(exactly(4), 16)).hex())
"""


def proto_fields(data: bytes) -> list[tuple[int, bytes | int]]:
    """A protobuf message's (field, value): bytes for length-delimited
    fields, ints for varints (all MdnsServices holds)."""
    def varint(at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7f) << shift
            shift += 7
            if not byte & 0x80:
                return value, at
    out, at = [], 0
    while at < len(data):
        key, at = varint(at)
        if key & 7 == 2:
            size, at = varint(at)
            out.append((key >> 3, data[at:at + size]))
            at += size
        else:
            assert key & 7 == 0, key
            value, at = varint(at)
            out.append((key >> 3, value))
    return out


@pytest.fixture
def net(adb34_bin, tmp_path):  # noqa: F811
    """The namespaces, and what was started in them (stopped by pid at the end)."""
    link = Link(f"srv{tmp_path.name[-6:]}")
    started: list = []
    try:
        link.up()
        yield link, started
    finally:
        for thing in reversed(started):
            thing.stop()
        link.down()


def test_pair_then_auto_connect_over_tls(net, adb34_bin, tmp_path):  # noqa: F811
    link, started = net
    server = NsServer(link, tmp_path / "server", adb34_bin)
    started.append(server)
    r = server("mdns", "check")
    assert (r.rc, r.out) == (0, "mdns daemon version [oxadb mdns-sd discovery 0.21]\n"), r

    window = PairingWindow(link, tmp_path)
    started.append(window)
    instance = instance_in(tmp_path)
    # adb prints its header, then the server's lines.
    out = server.wait_for(("mdns", "services"),
                          f"{instance}\t{PAIRING}\t{DEVICE}:{PAIRING_PORT}")
    assert out.splitlines()[0] == "List of discovered mdns services", out

    # A wrong code: FAIL after OKAY, as Google's server answers, which
    # adb 34's client misreads (test_pair.py assert_refused).
    r = server("pair", f"{DEVICE}:{PAIRING_PORT}", window.wrong_code)
    assert r.rc != 0 and "Successfully" not in r.both, r
    assert "protocol fault" in r.err, r
    known = server.home / ".android" / "adb_known_hosts.pb"
    assert not known.exists()

    r = server("pair", f"{DEVICE}:{PAIRING_PORT}", window.code)
    assert (r.rc, r.out) == (
        0, f"Successfully paired to {DEVICE}:{PAIRING_PORT} [guid={instance}]\n"), (r, server.log())
    rc, err = window.finish()
    assert rc == 0, err
    # adb's protobuf: AdbKnownHosts { HostInfo { guid } }.
    guid = instance.encode()
    assert known.read_bytes() == bytes([0x0a, len(guid) + 2, 0x0a, len(guid)]) + guid
    server.wait_for(("mdns", "services"), f"{instance}\t{PAIRING}\t{DEVICE}:{PAIRING_PORT}",
                    present=False)

    # The paired daemon requires TLS; once announced, the server connects it.
    daemon = start_daemon(link, tmp_path, "--auth", "--tls", "required")
    started.append(daemon)
    name = f"{instance}.{CONNECT}"
    server.wait_for(("devices",), f"{name}\tdevice")
    out = server("mdns", "services").out
    assert f"{instance}\t{CONNECT}\t{DEVICE}:{PORT}" in out.splitlines(), out
    assert f"{instance}\t{PLAIN}\t{DEVICE}:{PORT}" in out.splitlines(), out
    r = server("-s", name, "shell", "echo", "over-mdns-tls")
    assert (r.rc, r.out) == (0, "over-mdns-tls\n"), (r, server.log())

    # host:connect: to the same daemon's address: TLS again.
    r = server("connect", f"{DEVICE}:{PORT}")
    assert (r.rc, r.out) == (0, f"connected to {DEVICE}:{PORT}\n"), (r, server.log())
    r = server("-s", f"{DEVICE}:{PORT}", "shell", "echo", "over-connect-tls")
    assert (r.rc, r.out) == (0, "over-connect-tls\n"), (r, server.log())
    log = daemon.log_since(0).decode("utf-8", "replace")
    assert log.count("TLS 1.3 established") >= 2, log[-3000:]
    assert "host authenticated" not in log, log[-3000:]


def test_unpaired_device_is_seen_not_connected_then_connected_by_name(net, adb34_bin,
                                                                       tmp_path):  # noqa: F811
    link, started = net
    server = NsServer(link, tmp_path / "server", adb34_bin)
    started.append(server)
    trust_key(server.home / ".android" / "adbkey.pub", tmp_path / "adb_keys")
    daemon = start_daemon(link, tmp_path, "--auth")
    started.append(daemon)
    instance = instance_in(tmp_path)
    assert instance.startswith(f"adb-{SERIAL}-")
    server.wait_for(("mdns", "services"), f"{instance}\t{CONNECT}\t{DEVICE}:{PORT}")
    server.wait_for(("mdns", "services"), f"{instance}\t{PLAIN}\t{DEVICE}:{PORT}")
    # track-mdns-services: adb's MdnsServices (AOSP proto/adb_host.proto):
    # tcp = 1, tls = 2 (known_device absent: not paired), each wrapping an
    # MdnsService (instance 1, service 2, ipv4 4, port 6, model 7, api 8,
    # version 11).
    cp = subprocess.run(["ip", "netns", "exec", link.host_ns, "python3", "-c", TRACK_CLIENT,
                         str(server.port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        timeout=60)
    assert cp.returncode == 0, cp.stderr
    services = proto_fields(bytes.fromhex(cp.stdout.decode()))
    kinds = sorted(field for field, _ in services)
    assert kinds == [1, 2], services
    for kind, wrapper in services:
        inner = proto_fields(wrapper)
        assert [f for f, _ in inner] == [1], inner
        fields = dict(proto_fields(inner[0][1]))
        assert fields[1] == instance.encode(), fields
        assert fields[2] == (PLAIN if kind == 1 else CONNECT).encode(), fields
        assert (fields[4], fields[6]) == (DEVICE.encode(), PORT), fields
        assert (fields[7], fields[8], fields[11]) == (b"mdns-board", b"31", b"1"), fields

    # Seen, but not paired: not connected by itself.
    time.sleep(2)
    r = server("devices")
    assert r.out == "List of devices attached\n\n", (r, server.log())

    name = f"{instance}.{CONNECT}"
    r = server("connect", name)
    assert (r.rc, r.out) == (0, f"connected to {name}\n"), (r, server.log())
    r = server("devices")
    assert f"{name}\tdevice" in r.out.splitlines(), r
    r = server("-s", name, "shell", "echo", "by-name")
    assert (r.rc, r.out) == (0, "by-name\n"), r
    r = server("disconnect", name)
    assert (r.rc, r.out) == (0, f"disconnected {name}\n"), r
