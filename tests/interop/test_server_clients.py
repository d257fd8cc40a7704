"""Real adb server clients against `oxadb server`: Python's adbutils (what
uiautomator2 and many scripts use) and Tango's AdbServerClient over
@yume-chan/adb-server-node-tcp (web and Electron tools), both pinned
(tests/requirements.txt, tests/interop/tango/package.json).

Each test runs against `oxadb server` and against Google's adb 29 server,
each with its own oxadbd, so a failure on ours alone is our server's, not
the test's: device list, track-devices across an oxadbd stop and restart
(device, then offline or gone, then device), shell exit statuses, 64 MiB of
random data pushed and pulled (sha256), forward and reverse to an echo
server. Tango has no forward command (its server client opens device
sockets itself): it opens `tcp:ECHO` on the device through the server,
which is the device half of a forward.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import adbutils
import pytest

from echo import EchoServer, roundtrip
from harness import AdbServer, Daemon, clean_env, free_port, sha256_file, write_random
from test_server import OxadbServer

TANGO_DIR = Path(__file__).with_name("tango")
TANGO_CLIENT = TANGO_DIR / "tango_server_client.mjs"
PUSH_SIZE = 64 << 20
TIMEOUT = 90


@dataclass
class Served:
    """One adb server (ours or Google's) and the oxadbd it holds."""
    kind: str
    port: int
    device: Daemon


@pytest.fixture(scope="module", params=["oxadb", "google"])
def served(request, adb_bin, oxadbd_bin, tmp_path_factory, monkeypatch_module):
    # adbutils runs `adb start-server` (port 5037) when no server answers:
    # never here, where a server that went away is a failure.
    monkeypatch_module.setenv("ADBUTILS_ADB_PATH", "/bin/false")
    workdir = tmp_path_factory.mktemp(f"served-{request.param}")
    device = Daemon(oxadbd_bin, workdir / "oxadbd", rust_log=None).start()
    if request.param == "oxadb":
        server = OxadbServer(workdir / "server", adb_bin).start()
        port, stop = server.port, server.stop
    else:
        server = AdbServer(adb_bin, workdir / "server").start()
        port, stop = server.port, server.kill
    try:
        client = adbutils.AdbClient(host="127.0.0.1", port=port, socket_timeout=TIMEOUT)
        assert client.connect(device.serial, timeout=20) == f"connected to {device.serial}"
        _wait_state(client, device.serial, "device")
        yield Served(request.param, port, device)
    finally:
        stop()
        device.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def echo():
    server = EchoServer.tcp()
    yield server
    server.close()


@pytest.fixture(scope="module")
def payload(tmp_path_factory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("payload") / "random.bin"
    return path, write_random(path, PUSH_SIZE)


def _states(client: adbutils.AdbClient) -> dict[str, str]:
    return {info.serial: info.state for info in client.list()}


def _wait_state(client: adbutils.AdbClient, serial: str, want: str | None,
                timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (got := _states(client).get(serial)) != want:
        assert time.monotonic() < deadline, f"{serial} is {got!r}, not {want!r}, after {timeout}s"
        time.sleep(0.1)


def _state_waiter(items: queue.Queue, state_of, serial: str, history: list[str]):
    """`until(states, timeout)`: takes tracker events from `items` until
    `serial`'s state (`state_of(event)`, None for an event about another
    device) is one of `states`, recording each state in `history`."""

    def until(states: set[str], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"{serial} never reached {states}: {history}"
            try:
                item = items.get(timeout=left)
            except queue.Empty:
                continue
            state = state_of(item)
            if state is None:
                continue
            history.append(state)
            if state in states:
                return

    return until


def _outage(served: Served, until) -> None:
    """Stops the device and starts it again on the same port. Our server
    says `offline` at once, so `until` waits for it before the restart;
    Google's adb 29 keeps listing the device as it was while it retries (its
    ReconnectHandler, every 10 s: AOSP `transport.cpp`) and shows `offline`
    only as the retry succeeds, so there the restart comes after a second."""
    port = served.device.port
    served.device.stop()
    try:
        if served.kind == "oxadb":
            until({"offline", "absent"})
        else:
            time.sleep(1)
    finally:
        served.device.start(port=port)


def _seen_in_order(history: list[str], wanted: list[set[str]]) -> bool:
    """Whether `history` passes through each set of states in turn."""
    at = 0
    for state in history:
        if at < len(wanted) and state in wanted[at]:
            at += 1
    return at == len(wanted)


# --- adbutils ---------------------------------------------------------------------

@pytest.fixture
def au(served) -> adbutils.AdbClient:
    return adbutils.AdbClient(host="127.0.0.1", port=served.port, socket_timeout=TIMEOUT)


def test_adbutils_device_list(au, served):
    assert served.device.serial in [d.serial for d in au.device_list()]
    assert _states(au)[served.device.serial] == "device"
    assert au.server_version() == 41
    assert au.device(served.device.serial).get_state() == "device"


def test_adbutils_track_devices_across_a_restart(au, served):
    serial = served.device.serial
    events: queue.Queue = queue.Queue()
    tracker = adbutils.AdbClient(host="127.0.0.1", port=served.port, socket_timeout=TIMEOUT)

    def track():
        try:
            for event in tracker.track_devices():
                events.put(event)
        except Exception as e:  # the end of the module's server ends it
            events.put(e)

    threading.Thread(target=track, daemon=True).start()
    history: list[str] = []

    def state_of(event) -> str | None:
        assert not isinstance(event, Exception), (event, history)
        if event.serial != serial:
            return None
        return event.status if event.present else "absent"

    until = _state_waiter(events, state_of, serial, history)

    until({"device"})
    _outage(served, until)
    if history[-1] not in ("offline", "absent"):
        until({"offline", "absent"}, timeout=40)
    until({"device"})
    assert _seen_in_order(history, [{"device"}, {"offline", "absent"}, {"device"}]), history
    r = au.device(serial).shell2("echo back", v2=True)
    assert (r.returncode, r.output) == (0, "back\n"), r


def test_adbutils_shell_exit_status(au, served):
    d = au.device(served.device.serial)
    r = d.shell2("echo out; echo err >&2; exit 3", v2=True)
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n"), r
    assert d.shell2("exit 42", v2=True).returncode == 42
    # The shell v1 service, adbutils' default: its own exit marker.
    r = d.shell2("echo hi; false")
    assert (r.returncode, r.output) == (1, "hi\n"), r
    assert d.shell("echo plain") == "plain"


def test_adbutils_push_pull_64_mib(au, served, payload, tmp_path):
    src, digest = payload
    d = au.device(served.device.serial)
    remote = tmp_path / "on-device.bin"
    assert d.sync.push(src, str(remote)) == PUSH_SIZE
    assert sha256_file(remote) == digest
    back = tmp_path / "back.bin"
    assert d.sync.pull(str(remote), back) == PUSH_SIZE
    assert sha256_file(back) == digest


def test_adbutils_forward(au, served, echo):
    d = au.device(served.device.serial)
    local = free_port()
    d.forward(f"tcp:{local}", f"tcp:{echo.port}")
    try:
        data = bytes(range(256)) * 4096
        assert roundtrip(local, data) == data
        items = [(f.serial, f.local, f.remote) for f in d.forward_list()]
        assert (served.device.serial, f"tcp:{local}", f"tcp:{echo.port}") in items, items
    finally:
        d.forward_remove(f"tcp:{local}")
    assert f"tcp:{local}" not in [f.local for f in d.forward_list()]


def test_adbutils_reverse(au, served, echo):
    d = au.device(served.device.serial)
    remote = free_port()
    d.reverse(f"tcp:{remote}", f"tcp:{echo.port}")
    try:
        # The device is this machine: its reverse listener is on loopback.
        data = bytes(range(256)) * 4096
        assert roundtrip(remote, data) == data
        items = [(r.remote, r.local) for r in d.reverse_list()]
        assert (f"tcp:{remote}", f"tcp:{echo.port}") in items, items
    finally:
        d.reverse_remove(f"tcp:{remote}")
    assert f"tcp:{remote}" not in [r.remote for r in d.reverse_list()]


# --- Tango's AdbServerClient ---------------------------------------------------------

@pytest.fixture(scope="session")
def node() -> str:
    exe = shutil.which("node")
    assert exe, "node is not installed (scripts/test.sh installs Debian's nodejs)"
    assert (TANGO_DIR / "node_modules" / "@yume-chan" / "adb-server-node-tcp").is_dir(), (
        "Tango's server client is not installed: `npm ci` in tests/interop/tango "
        "(scripts/test.sh does)")
    return exe


def _tango(node: str, port: int, *args: str) -> object:
    cp = subprocess.run([node, str(TANGO_CLIENT), "--port", str(port), "--timeout", str(TIMEOUT),
                         *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, timeout=TIMEOUT + 30, cwd=str(TANGO_DIR),
                        env=clean_env())
    out = cp.stdout.decode("utf-8", "replace")
    try:
        doc = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise AssertionError(f"tango: no JSON (rc {cp.returncode}): {out!r} {cp.stderr!r}") from None
    assert cp.returncode == 0 and doc["ok"], (args, doc, cp.stderr.decode("utf-8", "replace"))
    return doc["result"]


def test_tango_device_list(node, served):
    devices = _tango(node, served.port, "devices")
    assert {"serial": served.device.serial, "state": "device"}.items() <= \
        next(d for d in devices if d["serial"] == served.device.serial).items(), devices


def test_tango_track_devices_across_a_restart(node, served):
    serial = served.device.serial
    proc = subprocess.Popen([node, str(TANGO_CLIENT), "--port", str(served.port), "--timeout",
                             str(TIMEOUT), "track"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(TANGO_DIR),
                            env=clean_env())
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    history: list[str] = []

    def state_of(line) -> str:
        listed = json.loads(line)
        assert isinstance(listed, list), listed
        return next((d["state"] for d in listed if d["serial"] == serial), "absent")

    until = _state_waiter(lines, state_of, serial, history)

    try:
        until({"device"})
        _outage(served, until)
        if history[-1] not in ("offline", "absent"):
            until({"offline", "absent"}, timeout=40)
        until({"device"})
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read()
    assert _seen_in_order(history, [{"device"}, {"offline", "absent"}, {"device"}]), history
    r = _tango(node, served.port, "shell", serial, "echo back")
    assert (r["exit_code"], r["stdout"]) == (0, "back\n"), r


def test_tango_shell_exit_status(node, served):
    r = _tango(node, served.port, "shell", served.device.serial, "echo out; echo err >&2; exit 3")
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (3, "out\n", "err\n"), r


def test_tango_push_pull_64_mib(node, served, payload, tmp_path):
    src, digest = payload
    remote = tmp_path / "on-device.bin"
    r = _tango(node, served.port, "push", served.device.serial, str(src), str(remote))
    assert (r["bytes"], r["sha256"]) == (PUSH_SIZE, digest), r
    assert sha256_file(remote) == digest
    back = tmp_path / "back.bin"
    r = _tango(node, served.port, "pull", served.device.serial, str(remote), str(back))
    assert (r["bytes"], r["sha256"]) == (PUSH_SIZE, digest), r
    assert sha256_file(back) == digest


def test_tango_device_socket_to_an_echo_server(node, served, echo):
    r = _tango(node, served.port, "socket", served.device.serial, f"tcp:{echo.port}",
               str(4 << 20))
    assert r == {"sent": 4 << 20, "echoed": 4 << 20, "equal": True}, r


def test_tango_reverse(node, served, echo):
    serial = served.device.serial
    device_port = free_port()
    r = _tango(node, served.port, "reverse", serial, f"tcp:{device_port}", f"tcp:{echo.port}")
    # adbd lists a reverse as `(reverse) DEVICE HOST`; Tango calls the device
    # end localName.
    assert {"localName": f"tcp:{device_port}", "remoteName": f"tcp:{echo.port}"} in \
        [{k: x[k] for k in ("localName", "remoteName")} for x in r["list"]], r
    # The device is this machine: its reverse listener is on loopback.
    data = bytes(range(256)) * 4096
    assert roundtrip(device_port, data) == data
    r = _tango(node, served.port, "reverse-remove", serial, f"tcp:{device_port}")
    assert all(x["localName"] != f"tcp:{device_port}" for x in r["list"]), r
