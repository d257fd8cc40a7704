"""`oxadb server`: Google's adb 29 CLI against oxadb's adb host server.

One oxadbd and one `oxadb server -P PORT` (a private port, never 5037) for
the module; Debian's adb is pointed at it with `-P PORT`. Where it is
simple, the same command goes through Google's own adb server against the
same oxadbd and the outputs are compared:

  * the version handshake: adb keeps our server (the same process answers
    after every command);
  * connect (and connecting twice), devices and devices -l, get-state,
    get-serialno, an unknown serial's error;
  * shell output and exit statuses (also when the device closes the stream
    while adb still writes to it), push and pull of 16 MiB (sha256);
  * forward tcp:X tcp:Y, data through it, --list, --remove;
  * a lost device goes offline (a tracker sees it) and is reconnected;
  * a device that wants a key is kept `unauthorized` until it is trusted;
  * wait-for-device; disconnect; kill-server stops the server;
  * a second server on the same port exits 1 naming the port;
  * a client of another uid is refused, with a reason.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from echo import EchoServer, roundtrip
from harness import (ADB_TIMEOUT, AdbResult, Daemon, clean_env, free_port, resolve_oxadb, setpriv,
                     sha256_file, stop_process, trust_key, write_random)

NOBODY = 65534


def _request(port: int, text: bytes, timeout: float = 5.0) -> bytes:
    """One request on a fresh connection; everything the server sends until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"%04x" % len(text) + text)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


class OxadbServer:
    """`oxadb server -P PORT` with a private HOME and state directory;
    `tuning` goes before the command (e.g. `--open-timeout 3`)."""

    def __init__(self, workdir: Path, adb: str, tuning: tuple[str, ...] = ()):
        self.workdir = workdir
        self.tuning = tuning
        self.home = workdir / "home"
        (self.home / ".android").mkdir(parents=True, exist_ok=True)
        # A key made now (adb's keygen is quick): a debug build of oxadb
        # would take seconds to make one at the first connect.
        subprocess.run([adb, "keygen", str(self.home / ".android" / "adbkey")],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                       timeout=60, env=clean_env(HOME=str(self.home)))
        self.log_path = workdir / "oxadb-server.log"
        self.port = free_port()
        self.env = clean_env(HOME=str(self.home), OXADB_STATE_DIR=str(workdir / "state"))
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "OxadbServer":
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [str(resolve_oxadb()), *self.tuning, "server", "-P", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env,
                cwd=str(self.workdir))
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"oxadb server exited:\n{self.log()}"
            try:
                if _request(self.port, b"host:version", timeout=1) == b"OKAY00040029":
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"oxadb server did not answer within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


class Client:
    """Google's adb CLI pointed at a server's port (ours or Google's)."""

    def __init__(self, adb: str, port: int, home: Path):
        self.adb = adb
        self.port = port
        self.env = clean_env(HOME=str(home), TMPDIR=str(home), ADB_EMU="0", ADB_USB="0",
                             ADB_MDNS="0")

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([self.adb, "-P", str(self.port), *args],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=self.env)

    def __call__(self, *args: str, prefix: tuple[str, ...] = (), env: dict | None = None,
                 timeout: float = ADB_TIMEOUT) -> AdbResult:
        cmd = [*prefix, self.adb, "-P", str(self.port), *args]
        cp = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env or self.env, timeout=timeout)
        return AdbResult(list(args), cp)


@pytest.fixture(scope="module")
def device(oxadbd_bin, tmp_path_factory):
    d = Daemon(oxadbd_bin, tmp_path_factory.mktemp("oxadbd"))
    d.start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def server(adb_bin, tmp_path_factory):
    srv = OxadbServer(tmp_path_factory.mktemp("oxadb-server"), adb_bin).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def ours(adb_bin, server, device, tmp_path_factory) -> Client:
    client = Client(adb_bin, server.port, tmp_path_factory.mktemp("client-home"))
    r = client("connect", device.serial)
    assert r.rc == 0 and r.out.strip() == f"connected to {device.serial}", (r, server.log())
    return client


@pytest.fixture(scope="module")
def google(adb_server, device) -> Client:
    """Google's own server, connected to the same oxadbd."""
    adb_server.connect(device.serial)
    return Client(adb_server.adb, adb_server.port, adb_server.home)


def test_adb_keeps_our_server(ours, server):
    """adb checks the server's version before each command and kills one
    that differs: the same process must answer throughout."""
    pid = server.proc.pid
    for _ in range(3):
        assert ours("devices").rc == 0
        assert ours("get-state").out == "device\n"
    assert server.proc.poll() is None and server.proc.pid == pid
    assert _request(server.port, b"host:version") == b"OKAY00040029"
    assert "doesn't match" not in server.log()


def test_connect_twice(ours, device):
    r = ours("connect", device.serial)
    assert r.rc == 0 and r.out.strip() == f"already connected to {device.serial}", r


def test_connect_failure_is_adbs_words(ours):
    port = free_port()
    r = ours("connect", f"127.0.0.1:{port}")
    # adb exits 0 and prints why, as its own server does.
    assert r.rc == 0, r
    assert r.out.startswith(f"failed to connect to '127.0.0.1:{port}': Connection refused"), r
    assert f"127.0.0.1:{port}" not in ours("devices").out


def test_devices_match_googles(ours, google, device):
    for args in (("devices",), ("devices", "-l")):
        mine, theirs = ours(*args), google(*args)
        assert mine.rc == theirs.rc == 0, (mine, theirs)
        # Transport ids are each server's own count.
        strip = lambda text: re.sub(r"transport_id:\d+", "transport_id:N", text)
        assert strip(mine.out) == strip(theirs.out), (mine, theirs)
    assert f"{device.serial}\tdevice" in ours("devices").out
    assert re.search(rf"^{re.escape(device.serial)} +device product:\S+ model:\S+ device:\S+ "
                     rf"transport_id:\d+$", ours("devices", "-l").out, re.M)


def test_state_and_serial(ours, google, device):
    for args in (("get-state",), ("get-serialno",), ("get-devpath",),
                 ("-s", device.serial, "get-state"), ("-s", "nosuch:1", "get-state"),
                 ("-s", "nosuch:1", "shell", "true")):
        mine, theirs = ours(*args), google(*args)
        assert (mine.rc, mine.out, mine.err) == (theirs.rc, theirs.out, theirs.err), (mine, theirs)
    assert ours("get-serialno").out == f"{device.serial}\n"
    assert "device 'nosuch:1' not found" in ours("-s", "nosuch:1", "get-state").err


def test_shell(ours):
    r = ours("shell", "echo hi")
    assert (r.rc, r.out) == (0, "hi\n"), r
    r = ours("shell", "echo out; echo err >&2; exit 3")
    assert (r.rc, r.out, r.err) == (3, "out\n", "err\n"), r
    r = ours("shell", "exit 3")
    assert r.rc == 3, r


def test_exit_status_arrives_when_the_device_closes_first(ours):
    """adb sends shell v2's close-stdin while `exit 42` may already have
    ended on the device: the exit packet the device sent before its close
    must still reach adb (a race: many at once make it likely)."""
    def run(_: int) -> list[int]:
        return [ours("shell", "exit 42").rc for _ in range(30)]

    with ThreadPoolExecutor(6) as pool:
        codes = [rc for batch in pool.map(run, range(6)) for rc in batch]
    assert codes == [42] * len(codes), f"{len(codes) - codes.count(42)} of {len(codes)} lost"


def test_push_pull_16_mib(ours, tmp_path):
    src = tmp_path / "random.bin"
    digest = write_random(src, 16 << 20)
    remote = tmp_path / "on-device.bin"
    r = ours("push", str(src), str(remote))
    assert r.rc == 0, r
    assert sha256_file(remote) == digest
    back = tmp_path / "back.bin"
    r = ours("pull", str(remote), str(back))
    assert r.rc == 0, r
    assert sha256_file(back) == digest


def test_forward(ours, device):
    echo = EchoServer.tcp()
    local = free_port()
    try:
        r = ours("forward", f"tcp:{local}", f"tcp:{echo.port}")
        assert r.rc == 0, r
        # adb 29 prints the port of a new tcp: listener.
        assert r.out.strip() == str(local), r
        payload = os.urandom(1 << 20)
        assert roundtrip(local, payload) == payload
        r = ours("forward", "--list")
        assert r.rc == 0 and f"{device.serial} tcp:{local} tcp:{echo.port}\n" in r.out, r
        r = ours("forward", "--no-rebind", f"tcp:{local}", f"tcp:{echo.port}")
        assert r.rc == 1 and "cannot rebind existing socket" in r.err, r
        r = ours("forward", "--remove", f"tcp:{local}")
        assert r.rc == 0, r
        assert f"tcp:{local}" not in ours("forward", "--list").out
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex(("127.0.0.1", local)) != 0
        r = ours("forward", "--remove", f"tcp:{local}")
        assert r.rc == 1 and f"listener 'tcp:{local}' not found" in r.err, r
    finally:
        echo.close()


def test_second_server_on_the_port_exits_1(server):
    cp = subprocess.run([str(resolve_oxadb()), "server", "-P", str(server.port)],
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, env=server.env, timeout=30)
    out = cp.stdout.decode("utf-8", "replace")
    assert cp.returncode == 1, out
    assert f"port {server.port} is in use" in out, out
    assert server.proc.poll() is None


def test_other_users_are_refused(ours, server, adb_bin):
    home = Path(tempfile.mkdtemp(prefix="oxadb-nobody-"))
    try:
        os.chown(home, NOBODY, NOBODY)
        env = clean_env(HOME=str(home), TMPDIR=str(home), ADB_EMU="0", ADB_USB="0")
        r = ours("devices", prefix=setpriv(NOBODY, NOBODY), env=env)
        assert r.rc != 0, r
        assert f"not uid {NOBODY}" in r.both, r
        # Still serving its own user.
        assert ours("get-state").out == "device\n"
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert f"uid {NOBODY}" in server.log()


def _wait_listed(client: Client, line: str, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        out = client("devices").out
        if line in out.splitlines():
            return out
        time.sleep(0.1)
    raise AssertionError(f"{line!r} not listed within {timeout}s: {out!r}")


def test_a_lost_device_goes_offline_and_comes_back(ours, fresh_daemon, server):
    """The connection ends: `offline`, as adb's; the daemon back on the same
    port: reconnected (adb's server retries every 3 s)."""
    other = fresh_daemon("lost")
    r = ours("connect", other.serial)
    assert r.out.strip() == f"connected to {other.serial}", r
    tracker = ours.popen("track-devices")
    try:
        port = other.port
        other.stop()
        _wait_listed(ours, f"{other.serial}\toffline")
        r = ours("-s", other.serial, "get-state")
        assert r.rc == 1 and "device offline" in r.err, r
        other.start(port=port)
        _wait_listed(ours, f"{other.serial}\tdevice")
        assert ours("-s", other.serial, "shell", "echo back").out == "back\n"
    finally:
        tracker.terminate()
        seen, _ = tracker.communicate(timeout=10)
    # The tracker saw it go offline and come back.
    text = seen.decode("utf-8", "replace")
    assert f"{other.serial}\toffline" in text and f"{other.serial}\tdevice" in text, text
    r = ours("disconnect", other.serial)
    assert r.out == f"disconnected {other.serial}\n", r


def test_an_unauthorized_device_is_kept_until_trusted(ours, google, fresh_daemon, server,
                                                      tmp_path):
    """A daemon that wants a key it does not have: adb's `failed to
    authenticate`, listed `unauthorized` with adb's error text (the same as
    Google's server gives); once the key is trusted, the next attempt
    connects it."""
    keys = tmp_path / "adb_keys"
    keys.write_text("")
    strict = fresh_daemon("strict", args=("--auth", "--keys", str(keys)))
    r = ours("connect", strict.serial)
    assert (r.rc, r.out) == (0, f"failed to authenticate to {strict.serial}\n"), r
    _wait_listed(ours, f"{strict.serial}\tunauthorized")
    mine = ours("-s", strict.serial, "get-state")
    google("connect", strict.serial)
    theirs = google("-s", strict.serial, "get-state")
    google("disconnect", strict.serial)
    assert mine.rc == theirs.rc == 1, (mine, theirs)
    assert mine.err == theirs.err, (mine, theirs)
    assert "device unauthorized." in mine.err
    trust_key(server.home / ".android" / "adbkey.pub", keys)
    _wait_listed(ours, f"{strict.serial}\tdevice")
    assert ours("-s", strict.serial, "shell", "echo trusted").out == "trusted\n"
    assert ours("disconnect", strict.serial).rc == 0


def test_wait_for_device(ours, device):
    r = ours("wait-for-device", timeout=20)
    assert r.rc == 0, r
    r = ours("-s", device.serial, "wait-for-local-device", timeout=20)
    assert r.rc == 0, r


def test_disconnect(ours, google, device):
    """Last: it leaves the server without a device."""
    r = ours("disconnect", device.serial)
    assert (r.rc, r.out) == (0, f"disconnected {device.serial}\n"), r
    assert ours("devices").out == "List of devices attached\n\n"
    r = ours("get-state")
    theirs_text = "no devices/emulators found"
    assert r.rc == 1 and theirs_text in r.err, r
    r = ours("disconnect", device.serial)
    assert r.rc == 1 and f"no such device '{device.serial}'" in r.err, r


def test_kill_server_stops_it(ours, server):
    """Last: `adb kill-server` (host:kill) ends the server, status 0; as with
    adb's server, the port is free by the time the command returns (adb
    waits for the socket to close), so a server started next can have it."""
    r = ours("kill-server")
    assert r.rc == 0, r
    # At once, as the next server would (adb's sets SO_REUSEADDR too).
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", server.port))
        again.listen()
    assert server.proc.wait(timeout=10) == 0, server.log()
