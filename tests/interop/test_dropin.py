"""oxadb as a drop-in for adb 29's everyday commands.

`adb_script.sh` (an adb user's script) runs line by line against a fresh
oxadbd with Google's adb 29 and again with oxadb in its place; stdout,
whether stderr was written, and exit codes must match line by line, except
for the differences listed in KNOWN_DIFFERENCES with their reasons. Then
what adb's server would remember, without a server: `connect`ed devices and
background forwarders in oxadb's state file (wait-for-device, reconnect,
disconnect, concurrent connects, forward/--list/--remove/kill-server).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from echo import EchoServer, refused, roundtrip
from harness import AdbServer, Daemon, clean_env, free_port, resolve_oxadb

SCRIPT = Path(__file__).with_name("adb_script.sh")

# Script line -> (what may differ: "stdout", "stderr", "rc"; why).
KNOWN_DIFFERENCES = {
    "adb install $DIR/app.apk": (
        {"stdout", "stderr", "rc"},
        "adb 29 starts a push install and fails with 255, its message on "
        "stdout, once the APK is missing; oxadb refuses at once with one "
        "line on stderr and status 1: a Linux device has no package manager"),
    "adb pull /tmp/oxadb-dropin-$FWD.txt $DIR/missing.txt": (
        {"stdout", "stderr"},
        "adb 29 prints a failed pull's `adb: error: failed to stat remote "
        "object ...` on stdout (its progress line printer); oxadb prints "
        "errors on stderr, so `x=$(oxadb pull ...)` captures no error text"),
    "adb uninstall com.example.app": (
        {"rc"},
        "adb 29 runs `pm uninstall` on the device and exits with the shell's "
        "127 (pm: not found); oxadb refuses without asking the device (1)"),
}


def forwarder_pids(state_dir: Path) -> list[int]:
    """Live oxadb background forwarders using `state_dir`."""
    found = []
    want = f"OXADB_STATE_DIR={state_dir}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if b"__forwarder" not in cmdline:
                continue
            if want not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2:].split()[0] != "Z":
            found.append(int(entry))
    return found


class Oxadb:
    """oxadb with a private HOME and state directory, talking to devices
    directly (OXADB_DIRECT=1: the script's `start-server` must not start a
    server, since what is compared here is oxadb without one)."""

    def __init__(self, workdir: Path):
        self.home = workdir / "home"
        self.state_dir = workdir / "state"
        self.home.mkdir(parents=True, exist_ok=True)
        self.env = clean_env(HOME=str(self.home), OXADB_STATE_DIR=str(self.state_dir),
                             OXADB_DIRECT="1")
        for key in ("OXADB_NO_BURST", "OXADB_ZERO_COPY", "XDG_STATE_HOME"):
            self.env.pop(key, None)
        self.exe = str(resolve_oxadb().resolve())

    def __call__(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([self.exe, *args], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=self.env, timeout=timeout, text=True)

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([self.exe, *args], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=self.env, text=True)

    def state_lines(self) -> list[str]:
        path = self.state_dir / "state"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def oxadb(tmp_path):
    """oxadb with private state; every forwarder it started is gone after."""
    ox = Oxadb(tmp_path / "oxadb")
    yield ox
    leftover = forwarder_pids(ox.state_dir)
    ox("kill-server", timeout=30)
    for pid in forwarder_pids(ox.state_dir):
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"oxadb forwarders left running by the test: {leftover}"


# --- the script, adb and oxadb side by side -----------------------------------------

RATE = re.compile(r"\d+\.\d+ MB/s \(\d+ bytes in \d+\.\d+s\)")


def run_script(prefix: list[str], env: dict[str, str], values: dict[str, str],
               cwd: Path) -> list[tuple[str, int, str, str]]:
    results = []
    for line in SCRIPT.read_text().splitlines():
        if not line.startswith("adb "):
            continue
        words = line.removesuffix("#~").strip()
        for name, value in values.items():
            words = words.replace(f"${name}", value)
        argv = prefix + shlex.split(words)[1:]
        try:
            cp = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=str(cwd), timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`{' '.join(argv)}` did not finish within 60 s") from None
        out = cp.stdout.decode("utf-8", "replace")
        err = cp.stderr.decode("utf-8", "replace")
        # Longest first: the daemon's port is part of its serial.
        for name, value in sorted(values.items(), key=lambda kv: -len(kv[1])):
            out = out.replace(value, f"${name}")
        results.append((line, cp.returncode, RATE.sub("RATE", out), err))
    return results


def side(name: str, tmp_path: Path, fresh_daemon,
         extra_args: tuple[str, ...] = ()) -> tuple[Daemon, dict[str, str], Path]:
    """A daemon with a fake reboot command (and `extra_args`), and the
    script's values."""
    workdir = tmp_path / f"script-{name}"
    workdir.mkdir()
    (workdir / "hello.txt").write_text("hello from the host\n")
    record = workdir / "rebooted"
    reboot = workdir / "fake-reboot"
    reboot.write_text(f'#!/bin/sh\necho "reboot $*" >> {record}\n')
    reboot.chmod(0o755)
    d = fresh_daemon(name=name, args=("--reboot-command", str(reboot), *extra_args))
    values = {"SERIAL": d.serial, "DEAD": str(free_port()), "FWD": str(free_port()),
              "DIR": str(workdir), "PORT": str(d.port)}
    return d, values, record


def test_adb_script_runs_the_same_with_oxadb(adb_bin, fresh_daemon, oxadb, tmp_path):
    echo = EchoServer.tcp()
    try:
        server = AdbServer(adb_bin, tmp_path / "adbsrv")
        try:
            server.start()
            d, values, _ = side("adb", tmp_path, fresh_daemon)
            values["ECHO"] = str(echo.port)
            with_adb = run_script([adb_bin, "-P", str(server.port)], server.env, values,
                                  tmp_path)
        finally:
            server.kill()
        d, values, record = side("oxadb", tmp_path, fresh_daemon)
        values["ECHO"] = str(echo.port)
        with_oxadb = run_script([oxadb.exe], oxadb.env, values, tmp_path)
    finally:
        echo.close()
    assert len(with_adb) >= 40
    problems = []
    for (line, rc_a, out_a, err_a), (_, rc_o, out_o, err_o) in zip(with_adb, with_oxadb):
        compared = {"rc": (rc_a, rc_o), "stderr": (bool(err_a), bool(err_o))}
        if not line.endswith("#~"):
            compared["stdout"] = (out_a, out_o)
        allowed = KNOWN_DIFFERENCES.get(line, (set(), ""))[0]
        for aspect, (a, o) in compared.items():
            if aspect in allowed and a == o:
                problems.append(f"{line}: {aspect} no longer differs ({a!r}); "
                                f"drop it from KNOWN_DIFFERENCES")
            elif aspect not in allowed and a != o:
                problems.append(f"{line}: {aspect}: adb {a!r}, oxadb {o!r} "
                                f"(stderr: adb {err_a!r}, oxadb {err_o!r})")
    assert not problems, "\n".join(problems)
    # The reboots really reached the device's reboot command.
    deadline = time.monotonic() + 20
    while record.exists() is False or record.read_text().count("\n") < 2:
        assert time.monotonic() < deadline, "oxadb reboot did not run the reboot command"
        time.sleep(0.05)
    assert record.read_text() == "reboot \nreboot bootloader\n"


# --- connected devices without a server ------------------------------------------------

def test_wait_for_device_returns_once_the_daemon_starts(oxadbd_bin, oxadb, tmp_path):
    port = free_port()
    waiter = oxadb.popen("-s", f"127.0.0.1:{port}", "wait-for-device")
    d = Daemon(oxadbd_bin, tmp_path / "late")
    try:
        time.sleep(2)
        assert waiter.poll() is None, f"wait-for-device returned with no device: {waiter.communicate()}"
        d.start(port=port)
        out, err = waiter.communicate(timeout=20)
        assert (waiter.returncode, out, err) == (0, "", "")
        # The same for the transport-qualified form, at once now.
        r = oxadb("-s", d.serial, "wait-for-local-device", timeout=20)
        assert (r.returncode, r.stdout) == (0, ""), r
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
        d.stop()


def test_reconnect_after_a_daemon_restart(fresh_daemon, oxadb):
    d = fresh_daemon()
    r = oxadb("connect", d.serial)
    assert (r.returncode, r.stdout) == (0, f"connected to {d.serial}\n"), r
    port = d.port
    d.stop()
    r = oxadb("reconnect")
    assert (r.returncode, r.stdout) == (0, f"reconnecting {d.serial} [offline]\n\n"), r
    d.start(port=port)
    r = oxadb("reconnect")
    assert (r.returncode, r.stdout) == (0, f"reconnecting {d.serial} [device]\n\n"), r
    r = oxadb("shell", "echo", "back")
    assert (r.returncode, r.stdout) == (0, "back\n"), r


def test_disconnect_forgets_the_device(fresh_daemon, oxadb):
    d = fresh_daemon()
    assert oxadb("connect", d.serial).returncode == 0
    r = oxadb("get-serialno")
    assert (r.returncode, r.stdout) == (0, f"{d.serial}\n"), r
    r = oxadb("disconnect", d.serial)
    assert (r.returncode, r.stdout) == (0, f"disconnected {d.serial}\n"), r
    assert oxadb.state_lines() == []
    # The next -s-less command no longer picks it (it goes to the default).
    r = oxadb("get-serialno", timeout=30)
    assert d.serial not in r.stdout + r.stderr, r
    r = oxadb("devices", timeout=30)
    assert d.serial not in r.stdout, r


def test_concurrent_connects_all_land_in_the_state_file(fresh_daemon, oxadb):
    daemons = [fresh_daemon(name=f"d{i}") for i in range(8)]
    procs = [oxadb.popen("connect", d.serial) for d in daemons]
    for d, proc in zip(daemons, procs):
        out, err = proc.communicate(timeout=60)
        assert (proc.returncode, out) == (0, f"connected to {d.serial}\n"), err
    assert sorted(oxadb.state_lines()) == sorted(f"device {d.serial}" for d in daemons)
    r = oxadb("devices", timeout=60)
    for d in daemons:
        assert f"{d.serial}\tdevice\n" in r.stdout, r
    # Several connected devices: a command must be told which one, as adb.
    r = oxadb("shell", "true")
    assert r.returncode == 1 and "more than one device/emulator" in r.stderr, r


# --- background forwarders ----------------------------------------------------------------

def test_background_forwarders(fresh_daemon, oxadb):
    d = fresh_daemon()
    echo = EchoServer.tcp()
    try:
        a, b = free_port(), free_port()
        r = oxadb("-s", d.serial, "forward", f"tcp:{a}", f"tcp:{echo.port}", timeout=30)
        assert (r.returncode, r.stdout, r.stderr) == (0, f"{a}\n", ""), r
        r = oxadb("-s", d.serial, "forward", f"tcp:{b}", f"tcp:{echo.port}", timeout=30)
        assert r.returncode == 0, r
        assert roundtrip(a, b"through the background forwarder") == \
            b"through the background forwarder"
        assert roundtrip(b, b"and the second") == b"and the second"
        r = oxadb("forward", "--list")
        assert (r.returncode, r.stdout) == (
            0, f"{d.serial} tcp:{a} tcp:{echo.port}\n{d.serial} tcp:{b} tcp:{echo.port}\n\n"), r
        pids = forwarder_pids(oxadb.state_dir)
        assert len(pids) == 2, pids
        r = oxadb("-s", d.serial, "forward", "--no-rebind", f"tcp:{a}", f"tcp:{echo.port}")
        assert (r.returncode, r.stderr) == (1, "adb: error: cannot rebind existing socket\n"), r
        r = oxadb("forward", "--remove", f"tcp:{a}")
        assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r
        assert refused(a)
        assert len(forwarder_pids(oxadb.state_dir)) == 1
        r = oxadb("forward", "--remove", f"tcp:{a}")
        assert (r.returncode, r.stderr) == (1, f"adb: error: listener 'tcp:{a}' not found\n"), r
        assert roundtrip(b, b"still there") == b"still there"
        # tcp:0: the port printed is the one listed and removed, as adb 29 does.
        r = oxadb("-s", d.serial, "forward", "tcp:0", f"tcp:{echo.port}", timeout=30)
        assert r.returncode == 0, r
        c = int(r.stdout)
        assert roundtrip(c, b"any port") == b"any port"
        assert f"{d.serial} tcp:{c} tcp:{echo.port}\n" in oxadb("forward", "--list").stdout
        r = oxadb("forward", "--remove", f"tcp:{c}")
        assert (r.returncode, r.stderr) == (0, ""), r
        assert refused(c)
        r = oxadb("kill-server")
        assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r
        assert forwarder_pids(oxadb.state_dir) == []
        assert refused(b)
        r = oxadb("forward", "--list")
        assert (r.returncode, r.stdout) == (0, "\n"), r
        # A forwarder whose device goes away ends by itself and is pruned.
        r = oxadb("-s", d.serial, "forward", f"tcp:{a}", f"tcp:{echo.port}", timeout=30)
        assert r.returncode == 0, r
        d.stop()
        deadline = time.monotonic() + 20
        while forwarder_pids(oxadb.state_dir):
            assert time.monotonic() < deadline, "the forwarder outlived its device"
            time.sleep(0.1)
        assert oxadb("forward", "--list").stdout == "\n"
    finally:
        echo.close()


def test_forward_foreground_keeps_serving_until_ctrl_c(fresh_daemon, oxadb):
    d = fresh_daemon()
    echo = EchoServer.tcp()
    proc = None
    try:
        a = free_port()
        proc = oxadb.popen("-s", d.serial, "forward", "--foreground", f"tcp:{a}",
                           f"tcp:{echo.port}")
        line = proc.stderr.readline()
        assert line.startswith(f"forwarding 127.0.0.1:{a} "), line
        assert roundtrip(a, b"foreground") == b"foreground"
        assert oxadb("forward", "--list").stdout == "\n", "a foreground forward is not recorded"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) in (0, 130)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        echo.close()


def test_usage_errors_exit_1_and_help_exits_0(oxadb):
    for args in (["forward"], ["shell", "-e"], ["--no-such-flag"], ["frobnicate"],
                 ["connect"], ["tcpip", "abc"]):
        r = oxadb(*args)
        assert r.returncode == 1 and r.stderr, (args, r)
    for args in (["--help"], ["--version"], ["forward", "--help"]):
        r = oxadb(*args)
        assert r.returncode == 0 and r.stdout, (args, r)


def test_connect_to_a_device_that_refuses_the_key_as_adb(adb_bin, fresh_daemon, oxadb,
                                                         tmp_path):
    keys = tmp_path / "adb_keys"
    keys.write_text("")
    d = fresh_daemon(args=("--auth", "--keys", str(keys)))
    server = AdbServer(adb_bin, tmp_path / "adbsrv")
    try:
        server.start()
        want = server.run("connect", d.serial)
        listed = server.devices()
    finally:
        server.kill()
    assert (want.rc, want.out) == (0, f"failed to authenticate to {d.serial}\n"), want
    assert listed == {d.serial: "unauthorized"}
    r = oxadb("connect", d.serial, timeout=30)
    assert (r.returncode, r.stdout) == (want.rc, want.out), r
    r = oxadb("devices", timeout=30)
    assert r.stdout == f"List of devices attached\n{d.serial}\tunauthorized\n\n", r
