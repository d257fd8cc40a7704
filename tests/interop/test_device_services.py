"""Android's device services on an oxadbd device, with Google's adb 29 and
adb 34: `adb logcat` served from the system log (dump, follow, Ctrl-C),
`getprop`/`setprop`, `adb reboot` running the configured command,
`adb root`/`unroot`/`remount`/`disable-verity` answered in adbd's words,
and `adb tcpip` moving the daemon's listener (or refused by the config).

Each test runs its own daemon (`fresh_daemon`): reboot and tcpip change it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from harness import AdbServer, free_port
from test_adb34 import adb34_bin  # noqa: F401  (the adb 34 fixture)

PEERS = ["adb29", "adb34"]


@pytest.fixture(scope="module")
def adb34_server(adb34_bin, tmp_path_factory):  # noqa: F811
    srv = AdbServer(adb34_bin, tmp_path_factory.mktemp("adb34"))
    srv.start()
    yield srv
    srv.kill()


@pytest.fixture(params=PEERS)
def srv(request, adb_server) -> AdbServer:
    """The adb server of the peer under test."""
    if request.param == "adb29":
        return adb_server
    return request.getfixturevalue("adb34_server")


@pytest.fixture
def device(srv, fresh_daemon):
    """Factory: a daemon of this test with `args`, connected to `srv`."""
    made = []

    def make(*args: str):
        d = fresh_daemon(args=args)
        srv.connect(d.serial)
        made.append(d)
        return d

    yield make
    for d in made:
        srv.disconnect(d.serial)


# --- the system log -------------------------------------------------------------

def write_marker(text: str) -> str:
    """Writes `text` to the system log oxadbd reads on this machine (the same
    order it looks in: journald, a syslog file, the kernel log) and says
    where. Fails when it can write nowhere."""
    if Path("/run/systemd/journal/socket").exists() or any(
            Path(f).exists() for f in ("/var/log/syslog", "/var/log/messages")):
        subprocess.run(["logger", "-t", "oxadbtest", text], check=True, timeout=10)
        return "logger"
    try:
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<6>{text}\n")
    except OSError as e:
        pytest.fail(f"no journal, no syslog file, and /dev/kmsg is not writable ({e}): "
                    f"this machine has no system log the test can write a marker to")
    return "/dev/kmsg"


def children(pid: int) -> list[tuple[int, str]]:
    """The live (not zombie) children of `pid`, with their command names."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append((int(entry), comm))
    return found


def test_logcat_dump_shows_a_marker(srv, device):
    d = device()
    marker = f"oxadb-logcat-dump-{uuid.uuid4().hex[:12]}"
    where = write_marker(marker)
    r = srv.run("logcat", "-d", serial=d.serial, timeout=60)
    assert r.rc == 0, r
    assert marker in r.out, f"marker written to {where} not in `adb logcat -d`: {r!r}"
    # -t N: the last lines only, ending with the marker.
    r = srv.run("logcat", "-t", "3", serial=d.serial, timeout=60)
    assert r.rc == 0 and marker in r.out and len(r.out.splitlines()) <= 3, r
    # Clearing is refused, with a reason and logcat's failure status.
    r = srv.run("logcat", "-c", serial=d.serial)
    assert r.rc == 1, r
    assert r.err.startswith("logcat: -c (clear) is not supported"), r
    # A tag filter without a journal is refused clearly (or served by it).
    r = srv.run("logcat", "-d", "-s", "oxadbtest", serial=d.serial, timeout=60)
    if where == "logger" and Path("/run/systemd/journal/socket").exists():
        assert r.rc == 0 and marker in r.out, r
    else:
        assert r.rc == 1 and "tag filters need the systemd journal" in r.err, r


def test_logcat_follows_and_ends_on_ctrl_c(srv, device):
    d = device()
    client = srv.popen("logcat", serial=d.serial)
    try:
        # The reader the daemon started stands for logcat.
        deadline = time.monotonic() + 20
        while not children(d.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        readers = children(d.proc.pid)
        assert readers, "oxadbd started no log reader for `adb logcat`"
        marker = f"oxadb-logcat-follow-{uuid.uuid4().hex[:12]}"
        os.set_blocking(client.stdout.fileno(), False)
        seen = b""
        deadline = time.monotonic() + 20
        written = False
        while marker.encode() not in seen and time.monotonic() < deadline:
            if not written:
                # Written after the reader started: only following shows it.
                write_marker(marker)
                written = True
            time.sleep(0.1)
            seen += client.stdout.read() or b""
        assert marker.encode() in seen, f"`adb logcat` did not show a new line: {seen[-2000:]!r}"
        client.send_signal(signal.SIGINT)
        client.wait(timeout=10)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(timeout=10)
    # The host closed the stream: the reader is hung up on, nothing is left.
    deadline = time.monotonic() + 10
    while children(d.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not children(d.proc.pid), f"left behind: {children(d.proc.pid)}"
    for pid, _ in readers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in open(f"/proc/{pid}/stat").read()


# --- properties -------------------------------------------------------------------

def test_getprop_answers_and_setprop_fails(srv, device, tmp_path):
    config = tmp_path / "oxadbd.toml"
    config.write_text('[properties]\nvendor.site = "lab 7"\n"ro.build.version.sdk" = "33"\n')
    d = device("--config", str(config), "--product-model", "Model T")
    r = srv.run("shell", "getprop", "ro.product.model", serial=d.serial)
    assert (r.rc, r.out) == (0, "Model T\n"), r
    r = srv.run("shell", "getprop", "vendor.site", serial=d.serial)
    assert (r.rc, r.out) == (0, "lab 7\n"), r
    r = srv.run("shell", "getprop", "no.such.property", serial=d.serial)
    assert (r.rc, r.out) == (0, "\n"), r
    r = srv.run("shell", "getprop", serial=d.serial)
    assert r.rc == 0, r
    lines = r.out.splitlines()
    assert all(re.fullmatch(r"\[[^\]]+\]: \[.*\]", line) for line in lines), r
    listed = dict(re.fullmatch(r"\[([^\]]+)\]: \[(.*)\]", line).groups() for line in lines)
    assert listed["ro.product.model"] == "Model T"
    assert listed["vendor.site"] == "lab 7"
    assert listed["ro.build.version.sdk"] == "33"
    assert listed["sys.boot_completed"] == "1"
    abi = {"x86_64": "x86_64", "aarch64": "arm64-v8a"}.get(os.uname().machine)
    if abi:
        assert listed["ro.product.cpu.abi"] == abi
    assert lines == sorted(lines)
    r = srv.run("shell", "setprop", "x", "y", serial=d.serial)
    assert r.rc == 1, r
    assert r.err.startswith("setprop: cannot set 'x' to 'y': oxadbd's properties are read-only"), r


# --- reboot, root, remount, verity ---------------------------------------------

def test_reboot_runs_the_configured_command_after_adb_returns(srv, device, tmp_path):
    record = tmp_path / "rebooted"
    script = tmp_path / "fake-reboot"
    script.write_text(f'#!/bin/sh\necho "$*|$OXADBD_REBOOT_TARGET" >> {record}\n')
    script.chmod(0o755)
    d = device("--reboot-command", f"{script} --now")
    r = srv.run("reboot", serial=d.serial)
    assert (r.rc, r.out) == (0, ""), r
    # The command runs once the stream has ended, not before adb returned.
    assert not record.exists(), "the reboot command ran before adb returned"
    deadline = time.monotonic() + 20
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert record.read_text() == "--now|\n"
    r = srv.run("reboot", "bootloader", serial=d.serial)
    assert (r.rc, r.out) == (0, ""), r
    deadline = time.monotonic() + 20
    while record.read_text().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert record.read_text() == "--now|\n--now bootloader|bootloader\n"


def test_reboot_turned_off_is_refused(srv, device):
    d = device("--reboot-command", "")
    r = srv.run("reboot", serial=d.serial)
    assert (r.rc, r.out) == (
        0, "reboot is turned off on this device (oxadbd's reboot-command is empty)\n"), r


# adbd's answers on an eng build (adbd always root) and a user build (never).
ROOT_ANSWERS = {
    True: {
        "root": "adbd is already running as root\n",
        "unroot": "adbd cannot run as non root: oxadbd keeps the user it was started as\n",
        "remount": "remount is not needed: oxadbd does not mount partitions read-only; use "
                   "`adb shell mount -o remount,rw PATH` for a read-only mount\n",
        "disable-verity": "verity not enabled - ENG build\n",
        "enable-verity": "verity not enabled - ENG build\n",
    },
    False: {
        "root": "adbd cannot run as root in production builds\n",
        "unroot": "adbd not running as root\n",
        "remount": 'Not running as root. Try "adb root" first.\n',
        "disable-verity": "verity cannot be disabled/enabled - USER build\n",
        "enable-verity": "verity cannot be disabled/enabled - USER build\n",
    },
}


def test_root_remount_and_verity_answer_as_adbd(srv, device):
    d = device()
    for command, text in ROOT_ANSWERS[os.geteuid() == 0].items():
        r = srv.run(command, serial=d.serial, timeout=30)
        # No "restarting": adb neither waits for the device nor fails.
        assert (r.rc, r.out, r.err) == (0, text, ""), r
    r = srv.run("shell", "echo", "still here", serial=d.serial)
    assert (r.rc, r.out) == (0, "still here\n"), r


# --- tcpip -----------------------------------------------------------------------

def refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_tcpip_moves_the_listener(srv, device):
    d = device()
    port = free_port()
    r = srv.run("tcpip", str(port), serial=d.serial)
    assert (r.rc, r.out) == (0, f"restarting in TCP mode port: {port}\n"), r
    assert refused(d.port), f"the old port {d.port} still accepts connections"
    serial = f"127.0.0.1:{port}"
    srv.connect(serial)
    try:
        r = srv.run("shell", "echo", "moved", serial=serial)
        assert (r.rc, r.out) == (0, "moved\n"), r
        r = srv.run("usb", serial=serial)
        assert (r.rc, r.out) == (0, "oxadbd serves no USB gadget here (start it with --usb); "
                                    f"staying in TCP mode on {serial}\n"), r
        assert not refused(port)
    finally:
        srv.disconnect(serial)


def test_tcpip_refused_by_the_config(srv, device):
    d = device("--no-tcpip")
    port = free_port()
    r = srv.run("tcpip", str(port), serial=d.serial)
    assert (r.rc, r.out) == (0, "oxadbd does not let hosts move its TCP listener "
                                "(allow-tcpip = false); it stays where it was started\n"), r
    assert refused(port) and not refused(d.port)
    r = srv.run("shell", "echo", "unmoved", serial=d.serial)
    assert (r.rc, r.out) == (0, "unmoved\n"), r


def test_real_logcat_and_getprop_on_the_path_run_instead(adb_server, fresh_daemon, tmp_path):
    """On an Android-like system the device's own programs answer."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("logcat", "getprop"):
        program = bindir / name
        program.write_text(f'#!/bin/sh\necho "real {name}: $*"\n')
        program.chmod(0o755)
    d = fresh_daemon(env={"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"})
    adb_server.connect(d.serial)
    try:
        r = adb_server.run("logcat", "-d", serial=d.serial)
        assert (r.rc, r.out) == (0, "real logcat: -d\n"), r
        r = adb_server.run("shell", "getprop", "ro.product.model", serial=d.serial)
        assert (r.rc, r.out) == (0, "real getprop: ro.product.model\n"), r
    finally:
        adb_server.disconnect(d.serial)
