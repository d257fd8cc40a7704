"""A device that misbehaves on purpose, against oxadb directly and through
`oxadb server` (tests/interop/hostile_device.py plays it over loopback TCP).

A device is not trusted by its host (docs/security.md, "The host's side"):

  * it reaches no host port or socket that no reverse forward of its
    connection asked for: every `tcp:`, `localfilesystem:`, `localabstract:`,
    `localreserved:` and unknown spec it opens is answered CLSE at once and
    logged at WARN with its serial and the spec, nothing connects on the
    host, and the device and the server go on; the host-side spec of a
    reverse asked for (by Google's adb 29 through the server, or by `oxadb
    reverse`) is connected and relayed;
  * every other misbehaviour ends in a clear error within its stated limit,
    without a panic, a file outside the destination or memory past a bound:
    a FAIL of 4 GiB, a FAIL that stops half way, a sync service that says
    nothing, an OPEN never answered, a stat of 10 bytes and 20 MB of data, a
    listing with `../`, absolute, NUL-bearing and 5,000-byte names, endless
    nesting, shell exit packets of the wrong size and 4 GiB shell frames, a
    bad magic, a 1 MiB banner, packets for streams that never existed, 40
    MB written ignoring credit;
  * ten such devices on one server leave a real oxadbd on it working.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness import (Daemon, clean_env, free_port, resolve_oxadb, sha256_file, stop_process,
                     write_random)
from hostile_device import GOOD_FILE, HostileDevice
from test_server import Client, OxadbServer

MODES = ("direct", "server")

# The limits the server runs with here: docs/security.md states the
# defaults (30 s for an OPEN, 300 s of silence for a sync reply) and the
# flags; the tests shorten them to keep the suite quick.
OPEN_TIMEOUT = 3
REPLY_TIMEOUT = 3

# Peak RSS of one oxadb command against a hostile device: the 20 MB pull
# and the 40 MB written ignoring credit stay within this (docs/security.md).
RSS_BOUND_KIB = 48 << 10


@pytest.fixture(scope="module")
def device(oxadbd_bin, tmp_path_factory):
    d = Daemon(oxadbd_bin, tmp_path_factory.mktemp("oxadbd"), rust_log=None)
    d.start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def server(adb_bin, tmp_path_factory):
    srv = OxadbServer(tmp_path_factory.mktemp("oxadb-server"), adb_bin,
                      tuning=("--open-timeout", str(OPEN_TIMEOUT))).start()
    yield srv
    srv.stop()
    assert "panicked" not in srv.log(), srv.log()[-4000:]


@pytest.fixture(scope="module")
def real(adb_bin, server, device, tmp_path_factory) -> Client:
    """Google's adb 29 CLI on our server, with the real oxadbd connected."""
    client = Client(adb_bin, server.port, tmp_path_factory.mktemp("client-home"))
    r = client("connect", device.serial)
    assert r.rc == 0 and r.out.strip() == f"connected to {device.serial}", (r, server.log())
    return client


class Run:
    """One finished oxadb command: exit status, output, time, peak RSS."""

    def __init__(self, argv, rc, out, err, seconds, maxrss_kib):
        self.argv, self.rc, self.out, self.err = argv, rc, out, err
        self.seconds, self.maxrss_kib = seconds, maxrss_kib

    def __repr__(self) -> str:
        return (f"<{' '.join(self.argv)} rc={self.rc} {self.seconds:.2f}s "
                f"rss={self.maxrss_kib}KiB out={self.out[-600:]!r} err={self.err[-1500:]!r}>")


def _peak_rss_kib(pid: int) -> int | None:
    """VmHWM of a running process (its peak RSS since exec), in KiB."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def run_oxadb(argv: list[str], env: dict, workdir: Path, timeout: float = 30) -> Run:
    """Runs oxadb with its output in files, its peak RSS sampled from
    /proc every 5 ms (wait4's ru_maxrss would count the pytest process it
    was forked from), and a hard limit: a command still running after
    `timeout` is killed and fails the test."""
    out_path, err_path = workdir / "out.txt", workdir / "err.txt"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        started = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                cwd=str(workdir))
    peak = 0
    deadline = started + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        # A zombie has no VmHWM: the last reading before the exit stands.
        peak = max(peak, _peak_rss_kib(proc.pid) or 0)
        time.sleep(0.005)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    seconds = time.monotonic() - started
    result = Run(argv, proc.returncode, out_path.read_text("utf-8", "replace"),
                 err_path.read_text("utf-8", "replace"), seconds, peak)
    assert seconds < timeout, f"still running after {timeout}s (killed): {result!r}"
    assert "panicked" not in result.err, result
    return result


class Host:
    """oxadb against one hostile device, directly or through the server."""

    def __init__(self, mode: str, server: OxadbServer, workdir: Path):
        self.mode = mode
        self.server = server
        # Its own directory: a test's other files are what it checks.
        self.workdir = workdir / "oxadb"
        home = self.workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        if mode == "direct":
            # clean_env points the server port where none answers.
            self.env = clean_env(HOME=str(home))
            self.prefix: list[str] = []
        else:
            self.env = clean_env(HOME=str(home))
            self.prefix = ["-P", str(server.port)]

    def attach(self, hostile: HostileDevice) -> None:
        if self.mode == "server":
            r = self.oxadb("connect", hostile.serial)
            assert r.rc == 0, r

    def detach(self, hostile: HostileDevice) -> None:
        if self.mode == "server":
            self.oxadb("disconnect", hostile.serial)

    def oxadb(self, *args: str, tuning: tuple[str, ...] = (), serial: str | None = None,
              timeout: float = 30) -> Run:
        argv = [str(resolve_oxadb()), *tuning, *self.prefix]
        if serial:
            argv += ["-s", serial]
        return run_oxadb(argv + list(args), self.env, self.workdir, timeout)


@pytest.fixture(params=MODES)
def host(request, server, real, device, tmp_path) -> Host:
    yield Host(request.param, server, tmp_path)
    # Whatever the device did, the server and the real device go on.
    if request.param == "server":
        assert server.proc.poll() is None, server.log()[-4000:]
        r = real("-s", device.serial, "shell", "echo still here")
        assert r.rc == 0 and r.out == "still here\n", (r, server.log()[-4000:])


class Endpoints:
    """Host-side endpoints a device must not reach: a TCP port, a Unix
    socket in the filesystem and an abstract one, each counting accepts."""

    def __init__(self, workdir: Path):
        self.accepted: list[str] = []
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.port = self.tcp.getsockname()[1]
        self.path = workdir / "host.sock"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(str(self.path))
        self.unix.listen(8)
        self.abstract_name = f"oxadb-hostile-test-{os.getpid()}-{self.port}"
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + self.abstract_name)
        self.abstract.listen(8)
        self.received: list[bytes] = []
        for name, sock in (("tcp", self.tcp), ("unix", self.unix), ("abstract", self.abstract)):
            threading.Thread(target=self._accept, args=(name, sock), daemon=True).start()

    def _accept(self, name: str, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self.accepted.append(name)
            conn.settimeout(10)
            try:
                self.received.append(conn.recv(100))
                conn.sendall(b"hello from the host")
                time.sleep(0.5)
            except OSError:
                pass
            conn.close()

    def unasked_specs(self) -> tuple[str, ...]:
        return (f"tcp:{self.port}", f"localfilesystem:{self.path}",
                f"localabstract:{self.abstract_name}", f"localreserved:{self.abstract_name}",
                f"tcp:127.0.0.1:{self.port}", "jdwp:1", "shell:", "no-such-spec")

    def close(self) -> None:
        for sock in (self.tcp, self.unix, self.abstract):
            sock.close()


@pytest.mark.parametrize("burst", [False, True], ids=["classic", "burst"])
def test_a_device_reaches_no_host_port_or_socket_no_reverse_asked_for(
        host, server, burst, tmp_path):
    endpoints = Endpoints(tmp_path)
    specs = endpoints.unasked_specs()
    try:
        with HostileDevice("open-unasked", specs, burst=burst) as hostile:
            host.attach(hostile)
            # Right after the handshake the device opens every spec: each
            # is refused (CLSE), none reaches the host.
            if host.mode == "direct":
                r = host.oxadb("shell", "echo", serial=hostile.serial)
                assert r.rc == 0 and r.out == "hostile\n", r
                log = r.err
            refused = hostile.wait_for("refused", len(specs), timeout=10)
            if host.mode == "server":
                r = host.oxadb("shell", "echo", serial=hostile.serial)
                assert r.rc == 0 and r.out == "hostile\n", r
                log = server.log()
            assert sorted(refused) == sorted(specs), hostile.events
            assert hostile.seen("accepted") == [], hostile.events
            assert endpoints.accepted == [], endpoints.accepted
            for spec in specs:
                assert any(hostile.serial in line and f"service={spec}" in line
                           and "WARN" in line and "refusing the device's OPEN" in line
                           for line in log.splitlines()), (spec, log[-4000:])
            host.detach(hostile)
    finally:
        endpoints.close()


def test_the_host_spec_of_a_reverse_asked_for_is_relayed_and_nothing_else(
        host, server, real, tmp_path):
    endpoints = Endpoints(tmp_path)
    unasked = tuple(s for s in endpoints.unasked_specs() if s != f"tcp:{endpoints.port}")
    try:
        with HostileDevice("open-unasked", unasked) as hostile:
            host.attach(hostile)
            asked = f"tcp:{endpoints.port}"
            if host.mode == "server":
                # Google's CLI asks our server; the server relays the request.
                r = real("-s", hostile.serial, "reverse", "tcp:9000", asked)
                assert r.rc == 0, (r, server.log()[-3000:])
                reverse = None
            else:
                # Without a server, oxadb serves the reverse until stopped.
                reverse = subprocess.Popen(
                    [str(resolve_oxadb()), "-s", hostile.serial, "reverse", "tcp:9000", asked],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    env=host.env)
            try:
                assert hostile.wait_for("accepted", 1, timeout=10) == [asked], hostile.events
                # The unasked specs, opened again beside it, are still refused.
                hostile.wait_for("refused", 2 * len(unasked), timeout=10)
                assert hostile.wait_for("received", 1, timeout=10) == [b"hello from the host"]
                deadline = time.monotonic() + 10
                while not endpoints.received and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert endpoints.accepted == ["tcp"], endpoints.accepted
                assert endpoints.received == [b"hello from the device"], endpoints.received
            finally:
                if reverse is not None:
                    stop_process(reverse)
            host.detach(hostile)
    finally:
        endpoints.close()


def _no_temporaries(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.startswith(".oxadb")]


# (scenario, device options, oxadb tuning, command, exit status, error text, limit in s)
CASES = [
    ("sync-fail-huge", {}, (), ("pull", "/f", "{dest}/f"), 1,
     "sync protocol: FAIL message of 4294967295 bytes (the limit is 65536)", 5),
    ("sync-fail-stall", {}, ("--reply-timeout", str(REPLY_TIMEOUT)), ("pull", "/f", "{dest}/f"), 1,
     f"no reply to the pull of '/f' (DATA, DONE or FAIL) within {REPLY_TIMEOUT} s",
     REPLY_TIMEOUT + 5),
    ("sync-silent", {}, ("--reply-timeout", str(REPLY_TIMEOUT)), ("pull", "/f", "{dest}/f"), 1,
     f"no reply to the STA2 of '/f' within {REPLY_TIMEOUT} s", REPLY_TIMEOUT + 5),
    ("open-silent", {}, ("--open-timeout", str(OPEN_TIMEOUT)), ("shell", "true"), 1,
     f"no answer to the OPEN of service \"shell,v2,TERM=xterm,raw:true\" within {OPEN_TIMEOUT} s",
     OPEN_TIMEOUT + 5),
    ("shell-exit-empty", {}, (), ("shell", "true"), 1,
     "shell protocol: exit packet of 0 bytes (an exit status is 1 byte)", 5),
    ("shell-bad-frame", {}, (), ("shell", "true"), 1,
     "shell protocol: shell frame payload of 4294967295 bytes exceeds the limit", 5),
    ("sync-names", {"bad_names": (b"../escape",)}, (), ("pull", "/d", "{dest}/d"), 1,
     "refusing to pull '/d': the device sent the invalid file name \"../escape\"", 5),
    ("sync-names", {"bad_names": (b"/abs",)}, (), ("pull", "/d", "{dest}/d"), 1,
     "the device sent the invalid file name \"/abs\"", 5),
    ("sync-names", {"bad_names": (b"a\0b",)}, (), ("pull", "/d", "{dest}/d"), 1,
     "the device sent the invalid file name \"a\\0b\"", 5),
    ("sync-names", {"bad_names": (b"x" * 5000,)}, (), ("pull", "/d", "{dest}/d"), 1,
     "listing '/d': entry name of 5000 bytes", 5),
    ("sync-loop", {}, (), ("pull", "/d", "{dest}/d"), 1,
     "more than 256 directory levels", 20),
    # Whether the host's OKAY left before the next WRTE arrived decides
    # which; either way the command ends at once and says why.
    ("credit-flood", {}, (), ("shell", "true"), 1,
     ("beyond its credit", "ended without an exit status"), 10),
    ("credit-flood", {"burst": True}, (), ("shell", "true"), 1,
     ("beyond its credit", "ended without an exit status"), 10),
    ("sync-data-long", {"burst": True}, (), ("pull", "/f", "{dest}/f"), 0, "", 10),
]


@pytest.mark.parametrize("scenario,options,tuning,command,rc,message,limit", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_misbehaviour_ends_in_a_clear_error_within_its_limit(
        host, scenario, options, tuning, command, rc, message, limit, tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    outside_before = sorted(p.name for p in tmp_path.iterdir())
    with HostileDevice(scenario, **options) as hostile:
        host.attach(hostile)
        argv = [part.format(dest=dest) for part in command]
        r = host.oxadb(*argv, tuning=tuning, serial=hostile.serial, timeout=limit + 30)
        host.detach(hostile)
    messages = (message,) if isinstance(message, str) else message
    assert r.rc == rc and any(m in r.err for m in messages), r
    assert r.seconds < limit, r
    assert r.maxrss_kib < RSS_BOUND_KIB, r
    # Nothing written beside the destination, no temporary file left in it.
    assert sorted(p.name for p in tmp_path.iterdir()) == outside_before
    for directory, _, _ in os.walk(dest):
        assert _no_temporaries(Path(directory)) == [], list(os.walk(dest))
    if scenario.startswith("sync-fail"):
        assert list(dest.iterdir()) == [], "a failed pull left its destination"


def test_more_data_than_the_stat_said_is_kept_and_said(host, tmp_path):
    dest = tmp_path / "f"
    with HostileDevice("sync-data-long") as hostile:
        host.attach(hostile)
        r = host.oxadb("pull", "-a", "/f", str(dest), serial=hostile.serial)
        host.detach(hostile)
    assert r.rc == 0, r
    assert ("'/f': the device sent 20971520 bytes where its stat said 10 (the file grew while it "
            "was pulled, or the device misreports its size)") in r.err, r
    assert dest.stat().st_size == 20 << 20
    assert r.maxrss_kib < RSS_BOUND_KIB, r


@pytest.mark.parametrize("scenario,message", [
    ("bad-magic", "bad magic 0xdeadbeef"),
    ("huge-banner", "banner longer than 65536 bytes"),
    ("stray-flood", "to unknown stream"),
])
def test_a_broken_connection_ends_at_once_and_only_its_own(host, server, scenario, message):
    with HostileDevice(scenario) as hostile:
        if host.mode == "direct":
            r = host.oxadb("shell", "true", serial=hostile.serial, timeout=20)
            assert r.rc == 1 and message in r.err and r.seconds < 5, r
            return
        connect = host.oxadb("connect", hostile.serial)
        if "failed to connect" in connect.out:
            # Broken before the handshake ended: not kept, as adb's server
            # keeps none (AOSP client/transport_emulator.cpp connect_device).
            assert message in connect.out, connect
            assert host.oxadb("shell", "true", serial=hostile.serial).rc != 0
            return
        # Kept, and tried again every 3 s (AOSP transport.cpp
        # ReconnectHandler); each attempt ends the same way.
        deadline = time.monotonic() + 15
        while hostile.connections < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hostile.connections >= 2, "the server did not try the device again"
        r = host.oxadb("shell", "true", serial=hostile.serial, timeout=20)
        assert r.rc != 0 and r.seconds < 5, r
        host.detach(hostile)
    assert message in server.log(), server.log()[-3000:]


def test_ten_misbehaving_devices_leave_a_real_one_working(server, real, device, tmp_path):
    """Ten hostile devices on the server at once, probing and breaking
    their connections, while a real oxadbd pushes and pulls through it."""
    host = Host("server", server, tmp_path)
    endpoints = Endpoints(tmp_path)
    scenarios = ["open-unasked"] * 4 + ["bad-magic", "stray-flood", "credit-flood",
                                        "shell-bad-frame", "open-silent", "sync-silent"]
    hostiles = [HostileDevice(s, endpoints.unasked_specs()).start() for s in scenarios]
    try:
        for hostile in hostiles:
            host.attach(hostile)
        # Keep them busy: shells and pulls on each, left to fail.
        busy = [subprocess.Popen([str(resolve_oxadb()), "-P", str(server.port), "-s", h.serial,
                                  "shell", "true"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env=host.env) for h in hostiles]
        source = tmp_path / "source.bin"
        digest = write_random(source, 16 << 20)
        serial = device.serial
        r = real("-s", serial, "push", str(source), f"{device.workdir}/pushed.bin")
        assert r.rc == 0, (r, server.log()[-3000:])
        assert sha256_file(Path(device.workdir) / "pushed.bin") == digest
        pulled = tmp_path / "pulled.bin"
        r = real("-s", serial, "pull", f"{device.workdir}/pushed.bin", str(pulled))
        assert r.rc == 0 and sha256_file(pulled) == digest, r
        for proc in busy:
            stop_process(proc)
        assert endpoints.accepted == [], endpoints.accepted
        assert server.proc.poll() is None
    finally:
        for hostile in hostiles:
            host.detach(hostile)
            hostile.stop()
        endpoints.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_pull_interrupted_while_the_device_stalls_leaves_nothing_and_says_nothing(
        host, sig, tmp_path):
    """Ctrl-C while a device holds a pull half way: the temporary file goes,
    and nothing is said about removing it twice."""
    dest = tmp_path / "dest"
    dest.mkdir()
    with HostileDevice("sync-fail-stall") as hostile:
        host.attach(hostile)
        proc = subprocess.Popen([str(resolve_oxadb()), *host.prefix, "-s", hostile.serial,
                                 "pull", "/f", str(dest / "f")], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=host.env)
        hostile.wait_for("opened", 1, timeout=10)
        time.sleep(0.5)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=10)
        host.detach(hostile)
    assert proc.returncode == 128 + sig, err
    assert err == b"", err
    assert list(dest.iterdir()) == []
