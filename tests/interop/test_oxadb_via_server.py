"""`oxadb` through an adb host server: Google's adb 29 and 34 servers, and
`oxadb server` (adb 34 from scripts/install-adb34.sh, or $OXADB_ADB34).

For each server (own private port, never 5037), with one oxadbd that only the
server is connected to (oxadb's state file stays empty):

  * `oxadb connect` makes the server connect; `oxadb devices` prints the
    server's list as `adb devices` does; get-serialno without -s names the
    server's device (directly, it would be 127.0.0.1:5555);
  * shell's output and exit status, `-t ID` picking the device;
  * push and pull of 16 MiB (sha256), through the socket the server relays;
  * forward tcp:0 to an echo server: the server holds it (`adb forward
    --list` shows it), data goes through, --no-rebind, --remove;
  * reverse: the device's listener outlives the command (the server holds
    it), data goes through, --list, --no-rebind, --remove;
  * wait-for-device (-s, -e), get-devpath as adb prints it;
  * `--direct` and OXADB_DIRECT=1 beside the running server connect directly.

And `oxadb start-server` on a private port: a background `oxadb server` that
Google's adb CLI then uses, its log in $TMPDIR/oxadb.$UID.log; `oxadb
kill-server` stops it (the port closes). A server of another version is
left running (adb would replace it); `oxadb kill-server` stops Google's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from echo import EchoServer, roundtrip
from harness import (AdbResult, AdbServer, clean_env, free_port, resolve_oxadb,
                     sha256_file, write_random)
from test_adb34 import adb34_bin  # noqa: F401 (the fixture: adb 34, or a loud failure)
from test_server import OxadbServer, _request, device  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def oxadb_server(adb_bin, tmp_path_factory):
    srv = OxadbServer(tmp_path_factory.mktemp("oxadb-server"), adb_bin).start()
    yield srv
    srv.stop()


class Oxadb:
    """`oxadb` pointed at a server's port by ANDROID_ADB_SERVER_PORT, with a
    private HOME and an empty state directory of its own."""

    def __init__(self, port: int, workdir: Path):
        self.port = port
        self.state = workdir / "state"
        self.home = workdir / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.env = clean_env(HOME=str(self.home), OXADB_STATE_DIR=str(self.state),
                             ANDROID_ADB_SERVER_PORT=str(port))

    def __call__(self, *args: str, env: dict | None = None, timeout: float = 120) -> AdbResult:
        cp = subprocess.run([str(resolve_oxadb()), *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env or self.env, timeout=timeout)
        return AdbResult(list(args), cp)


@pytest.fixture(scope="module")
def adb34_server(adb34_bin, tmp_path_factory):
    srv = AdbServer(adb34_bin, tmp_path_factory.mktemp("adb34"))
    try:
        srv.start()
        yield srv
    finally:
        srv.kill()


@pytest.fixture(scope="module", params=["google-adb-29", "google-adb-34", "oxadb-server"])
def via(request, device, tmp_path_factory):
    """(oxadb through the server, Google's adb CLI on the same server)."""
    if request.param == "google-adb-29":
        server: AdbServer = request.getfixturevalue("adb_server")
        port, adb = server.port, server.adb
    elif request.param == "google-adb-34":
        server = request.getfixturevalue("adb34_server")
        port, adb = server.port, server.adb
    else:
        port = request.getfixturevalue("oxadb_server").port
        adb = request.getfixturevalue("adb_bin")
    oxadb = Oxadb(port, tmp_path_factory.mktemp("oxadb-client"))
    r = oxadb("connect", device.serial)
    assert r.rc == 0 and r.out.strip() in (f"connected to {device.serial}",
                                           f"already connected to {device.serial}"), r
    # The server holds the device: oxadb's own state has none.
    assert not (oxadb.state / "state").exists() or device.serial not in (
        oxadb.state / "state").read_text()
    google_cli = lambda *args: AdbResult(list(args), subprocess.run(  # noqa: E731
        [adb, "-P", str(port), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=clean_env(HOME=str(oxadb.home), ADB_EMU="0", ADB_USB="0"),
        timeout=60))
    deadline = time.monotonic() + 20
    while f"{device.serial}\tdevice" not in google_cli("devices").out:
        assert time.monotonic() < deadline, google_cli("devices")
        time.sleep(0.1)
    return oxadb, google_cli


def test_devices_and_serial_are_the_servers(via, device):
    oxadb, adb = via
    ours, theirs = oxadb("devices"), adb("devices")
    assert ours.rc == 0 and ours.out == theirs.out, (ours, theirs)
    assert f"{device.serial}\tdevice\n" in ours.out
    ours, theirs = oxadb("devices", "-l"), adb("devices", "-l")
    assert ours.rc == 0 and ours.out == theirs.out, (ours, theirs)
    # No -s: the server's only device, not the direct default 127.0.0.1:5555.
    r = oxadb("get-serialno")
    assert r.rc == 0 and r.out == f"{device.serial}\n", r
    r = oxadb("-s", device.serial, "get-state")
    assert r.rc == 0 and r.out == "device\n", r
    r = oxadb("-s", "127.0.0.1:1", "get-state")
    assert r.rc == 1 and "device '127.0.0.1:1' not found" in r.err, r
    # Directly, the same command knows no such device.
    r = oxadb("--direct", "devices")
    assert r.rc == 0 and device.serial not in r.out, r


def test_shell_exit_status(via, device):
    oxadb, _ = via
    r = oxadb("-s", device.serial, "shell", "echo out; echo err >&2; exit 7")
    assert (r.rc, r.out, r.err) == (7, "out\n", "err\n"), r
    r = oxadb("shell", "exit 0")
    assert r.rc == 0, r
    r = oxadb("exec-out", "printf '\\000\\001\\002'")
    assert r.rc == 0 and r.stdout == b"\x00\x01\x02", r


def test_transport_id_picks_the_device(via, device):
    oxadb, adb = via
    line = next(line for line in adb("devices", "-l").out.splitlines()
                if line.startswith(device.serial))
    transport_id = line.rsplit("transport_id:", 1)[1].split()[0]
    r = oxadb("-t", transport_id, "shell", "echo by-id")
    assert r.rc == 0 and r.out == "by-id\n", r
    r = oxadb("-t", "999999", "get-state")
    assert r.rc == 1 and "999999" in r.err, r


def test_push_pull_16_mib(via, device, tmp_path):
    oxadb, _ = via
    src = tmp_path / "blob"
    digest = write_random(src, 16 << 20)
    # The daemon runs as this user: its files are this machine's.
    remote = str(tmp_path / "on-device.bin")
    r = oxadb("push", str(src), remote)
    assert r.rc == 0 and "1 file pushed" in r.out, r
    back = tmp_path / "back"
    r = oxadb("pull", remote, str(back))
    assert r.rc == 0 and "1 file pulled" in r.out, r
    assert sha256_file(remote) == digest
    assert sha256_file(back) == digest


def test_push_delta_goes_through_oxadb_server_and_falls_back_through_googles(via, device,
                                                                             tmp_path, request):
    """`oxadb server` negotiates oxadb_delta with oxadbd and relays the
    stream; Google's servers do not, so the whole file is pushed, and oxadb
    says so."""
    oxadb, _ = via
    old, new = tmp_path / "old.img", tmp_path / "new.img"
    write_random(old, 8 << 20)
    data = bytearray(old.read_bytes())
    data[4096 * 100:4096 * 110] = os.urandom(4096 * 10)
    new.write_bytes(bytes(data))
    remote = tmp_path / "on-device.img"
    remote.write_bytes(old.read_bytes())
    r = oxadb("push", "--delta", str(new), str(remote))
    assert r.rc == 0 and sha256_file(remote) == sha256_file(new), r
    if request.node.callspec.params["via"] == "oxadb-server":
        assert "1 file pushed as a delta" in r.out and "does not offer" not in r.err, r
        sent = int(r.out.split(" of ")[0].rsplit(" ", 1)[1])
        assert sent < 100 * 1024, r
    else:
        assert "does not offer oxadb_delta" in r.err and "1 file pushed" in r.out, r


def test_forward_is_held_by_the_server(via, device):
    oxadb, adb = via
    echo = EchoServer.tcp()
    try:
        r = oxadb("forward", "tcp:0", f"tcp:{echo.port}")
        assert r.rc == 0 and r.out.strip().isdigit(), r
        local = int(r.out.strip())
        payload = os.urandom(1 << 20)
        assert roundtrip(local, payload) == payload
        line = f"{device.serial} tcp:{local} tcp:{echo.port}"
        assert line in oxadb("forward", "--list").out
        assert line in adb("forward", "--list").out
        r = oxadb("forward", "--no-rebind", f"tcp:{local}", f"tcp:{echo.port}")
        assert r.rc == 1 and "cannot rebind existing socket" in r.err, r
        r = oxadb("forward", "--remove", f"tcp:{local}")
        assert r.rc == 0, r
        assert line not in adb("forward", "--list").out
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex(("127.0.0.1", local)) != 0
        r = oxadb("forward", "--remove", f"tcp:{local}")
        assert r.rc == 1 and f"listener 'tcp:{local}' not found" in r.err, r
    finally:
        echo.close()


def test_reverse_is_held_by_the_server(via, device):
    """The device's listener outlives the `oxadb reverse` that made it: the
    server's connection holds it, and the server connects what it accepts
    to this machine."""
    oxadb, adb = via
    echo = EchoServer.tcp()
    remote = free_port()
    try:
        r = oxadb("reverse", f"tcp:{remote}", f"tcp:{echo.port}")
        assert r.rc == 0, r
        payload = os.urandom(256 << 10)
        assert roundtrip(remote, payload) == payload
        line = f"tcp:{remote} tcp:{echo.port}"
        assert line in oxadb("reverse", "--list").out
        assert line in adb("reverse", "--list").out
        r = oxadb("reverse", "--no-rebind", f"tcp:{remote}", f"tcp:{echo.port}")
        assert r.rc == 1 and "cannot rebind existing socket" in r.err, r
        r = oxadb("reverse", "--remove", f"tcp:{remote}")
        assert r.rc == 0, r
        assert line not in adb("reverse", "--list").out
        assert _port_closed(remote)
    finally:
        oxadb("reverse", "--remove-all")
        echo.close()


def test_wait_for_device_and_devpath(via, device):
    oxadb, adb = via
    for args in (("wait-for-device",), ("-s", device.serial, "wait-for-any-device"),
                 ("-e", "wait-for-device")):
        r = oxadb(*args, timeout=30)
        assert r.rc == 0, r
    ours, theirs = oxadb("get-devpath"), adb("get-devpath")
    assert ours.rc == 0 and ours.out == theirs.out, (ours, theirs)


def test_direct_beside_a_running_server(via, device):
    oxadb, _ = via
    r = oxadb("--direct", "-s", device.serial, "shell", "echo direct; exit 3")
    assert (r.rc, r.out) == (3, "direct\n"), r
    env = dict(oxadb.env, OXADB_DIRECT="1")
    r = oxadb("-s", device.serial, "get-serialno", env=env)
    assert r.rc == 0 and r.out == f"{device.serial}\n", r
    # -t only means something to a server.
    r = oxadb("--direct", "-t", "1", "get-state")
    assert r.rc == 1 and "--direct (or OXADB_DIRECT) uses none" in r.err, r
    # And where no server answers (the harness's port), -t says so.
    r = oxadb("-t", "1", "get-state", env=clean_env(HOME=str(oxadb.home)))
    assert r.rc == 1 and "no adb server answers at tcp:" in r.err, r


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_start_server_serves_googles_cli_and_kill_server_stops_it(adb_bin, device, tmp_path):
    port = free_port()
    tmpdir, home = tmp_path / "tmp", tmp_path / "home"
    tmpdir.mkdir()
    (home / ".android").mkdir(parents=True)
    env = clean_env(HOME=str(home), TMPDIR=str(tmpdir), OXADB_STATE_DIR=str(tmp_path / "state"))
    oxadb = [str(resolve_oxadb()), "-P", str(port)]
    adb_env = clean_env(HOME=str(home), TMPDIR=str(tmpdir), ADB_EMU="0", ADB_USB="0")
    try:
        cp = subprocess.run([*oxadb, "start-server"], stdin=subprocess.DEVNULL,
                            capture_output=True, env=env, timeout=60)
        assert cp.returncode == 0, cp
        assert cp.stderr.decode().splitlines() == [
            f"* daemon not running; starting now at tcp:{port}",
            "* daemon started successfully"], cp
        # It was detached: start-server returned while the server answers.
        assert _request(port, b"host:version") == b"OKAY00040029"
        log = tmpdir / f"oxadb.{os.getuid()}.log"
        assert log.exists(), list(tmpdir.iterdir())
        # Google's CLI keeps it (same version) and uses it.
        adb = lambda *a: subprocess.run([adb_bin, "-P", str(port), *a],  # noqa: E731
                                        stdin=subprocess.DEVNULL, capture_output=True,
                                        env=adb_env, timeout=60)
        cp = adb("connect", device.serial)
        assert cp.returncode == 0 and f"connected to {device.serial}" in cp.stdout.decode(), cp
        cp = adb("devices")
        assert cp.returncode == 0 and f"{device.serial}\tdevice" in cp.stdout.decode(), cp
        cp = adb("-s", device.serial, "shell", "echo via-started")
        assert cp.stdout == b"via-started\n", cp
        # A second start-server finds it and says nothing.
        cp = subprocess.run([*oxadb, "start-server"], stdin=subprocess.DEVNULL,
                            capture_output=True, env=env, timeout=60)
        assert (cp.returncode, cp.stderr) == (0, b""), cp
        cp = subprocess.run([*oxadb, "kill-server"], stdin=subprocess.DEVNULL,
                            capture_output=True, env=env, timeout=60)
        assert cp.returncode == 0, cp
        assert _port_closed(port)
        assert "oxadb server listening" in log.read_text()
    finally:
        if not _port_closed(port):
            _request(port, b"host:kill")


def test_start_server_leaves_a_server_of_another_version_running(tmp_path):
    """adb replaces a server of another version; oxadb says what answers and
    leaves it: someone else's tools may depend on it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    answered = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                request = conn.recv(64)
                answered.append(request)
                # Version 40 (0x28): an adb server other than adb 29+'s 41.
                conn.sendall(b"OKAY00040028")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        env = clean_env(HOME=str(tmp_path), TMPDIR=str(tmp_path),
                        OXADB_STATE_DIR=str(tmp_path / "state"))
        cp = subprocess.run([str(resolve_oxadb()), "-P", str(port), "start-server"],
                            stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=60)
        assert cp.returncode == 0, cp
        err = cp.stderr.decode()
        assert "version 40" in err and "left running" in err, cp
        assert b"000chost:version" in answered and not any(b"kill" in r for r in answered), \
            answered
        assert not (tmp_path / f"oxadb.{os.getuid()}.log").exists()
    finally:
        try:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        listener.close()
        thread.join(timeout=5)


def test_kill_server_stops_googles_server(adb_bin, tmp_path):
    server = AdbServer(adb_bin, tmp_path / "adb").start()
    try:
        env = clean_env(HOME=str(tmp_path), ANDROID_ADB_SERVER_PORT=str(server.port),
                        OXADB_STATE_DIR=str(tmp_path / "state"))
        cp = subprocess.run([str(resolve_oxadb()), "kill-server"], stdin=subprocess.DEVNULL,
                            capture_output=True, env=env, timeout=60)
        assert cp.returncode == 0, cp
        # oxadb waited for the port to close.
        assert _port_closed(server.port)
        # With no server left, kill-server still succeeds (and clears its state).
        cp = subprocess.run([str(resolve_oxadb()), "kill-server"], stdin=subprocess.DEVNULL,
                            capture_output=True, env=env, timeout=60)
        assert cp.returncode == 0, cp
    finally:
        server.kill()
