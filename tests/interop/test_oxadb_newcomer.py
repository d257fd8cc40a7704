"""oxadb as a newcomer meets it: its error messages, help and progress bar.

Errors: each is one line (`oxadb: error: ...`) naming the device or path,
each cause once, exit status 1 (adb's for a failed command); checked for a
refused port, an invalid port, an unknown bare serial (in a private network
namespace, so the host-name lookup leaves no trace beyond it), a device that
goes away mid-`shell` (shell protocol v2: oxadbd killed; v1: a fake device
without `shell_v2` that hangs up), mid-`exec-out` and mid-`pull`, peers that
are no ADB daemon (an SSH banner, an HTTP answer, a hang-up, a reset: told at once,
not after the 10 s CNXN timeout), an `unauthorized` device, and a HOME where
no key can be kept (fine for a daemon that asks for none).

Help: the flow-control flags appear once, under "Tuning" in the top-level
help, and still work before the command; `pull --help` names REMOTE and
LOCAL only.

README: its first block keeps the two set-up commands, and its quick
start's five lines run as printed against a fresh daemon.

Progress: push and pull of 8 MiB in a pseudo-terminal 60 and 120 columns
wide, slowed by a FIFO read 256 KiB per 0.1 s (the daemon writes pushes
into an existing FIFO, oxadb pulls into one): no line reaches the width,
the file name is on every frame, no ETA before a rate is known.
"""

from __future__ import annotations

import fcntl
import os
import pty
import pwd
import re
import select
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path

import pytest

from adbproto import A_CLSE, A_CNXN, A_OKAY, A_OPEN, A_VERSION, A_WRTE, HEADER, MAX_PAYLOAD, packet
from harness import ANSI, REPO, clean_env, free_port, resolve_oxadb, write_random

TUNING_FLAGS = ("--no-burst", "--credit", "--memory-budget", "--no-ack-headroom", "--zero-copy",
                "--no-zero-copy")


def oxadb(home: Path, *args: str, timeout: float = 60, prefix: tuple[str, ...] = (),
          **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, str(resolve_oxadb()), *args], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                          env=clean_env(HOME=str(home), **env))


def one_error(cp: subprocess.CompletedProcess) -> str:
    """The failed command's single error line; checks exit status 1 and that
    no cause is repeated (`...: X: X`)."""
    err = cp.stderr.decode("utf-8", "replace")
    assert cp.returncode == 1, (cp.returncode, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("oxadb: error: "), err
    parts = [p.strip() for p in lines[0].removeprefix("oxadb: error: ").split(": ")]
    repeated = [p for p in set(parts) if len(p) > 6 and parts.count(p) > 1]
    assert not repeated, f"cause repeated: {err}"
    return lines[0]


@pytest.fixture
def home(tmp_path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


# --- errors -----------------------------------------------------------------

def test_a_refused_port_is_named_with_its_cause_once(home):
    port = free_port()
    line = one_error(oxadb(home, "-s", f"127.0.0.1:{port}", "shell", "true"))
    assert line == (f"oxadb: error: cannot connect to 127.0.0.1:{port}: "
                    "Connection refused (os error 111); nothing listens there: is the daemon "
                    "running (`oxadbd --listen ADDR:PORT` on the device)?"), line


def test_an_invalid_port_says_so_without_looking_at_usb(home):
    line = one_error(oxadb(home, "-s", "127.0.0.1:99999", "shell", "true"))
    assert line == ("oxadb: error: invalid port 99999 in serial '127.0.0.1:99999' "
                    "(a TCP port is 1 to 65535)"), line


def test_an_unknown_bare_serial_names_usb_and_host_name(home):
    # A private network namespace: the name lookup cannot leave it.
    cp = oxadb(home, "-s", "R58M123ABC", "shell", "true", prefix=("unshare", "--net"))
    line = one_error(cp)
    assert line.startswith("oxadb: error: no device with serial R58M123ABC (no USB device has "
                           "it, and it is not a host name: "), line


def _started(proc: subprocess.Popen, want: bytes, timeout: float = 20) -> None:
    """Reads proc's stdout until `want` arrived."""
    deadline = time.monotonic() + timeout
    got = b""
    while want not in got:
        assert time.monotonic() < deadline, f"no {want!r} in {got!r}"
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, f"stdout closed before {want!r}: {got!r}"
            got += chunk


@pytest.mark.parametrize("command", ["shell", "exec-out"])
def test_a_daemon_dying_mid_command_fails_it_naming_the_device(fresh_daemon, home, command):
    d = fresh_daemon("dies", rust_log=None)
    proc = subprocess.Popen([str(resolve_oxadb()), "-s", d.serial, command,
                             "echo started; sleep 30"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(HOME=str(home)))
    try:
        _started(proc, b"started")
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(timeout=10)
        _out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    cp = subprocess.CompletedProcess(proc.args, proc.returncode, b"", err)
    line = one_error(cp)
    assert line.startswith(f"oxadb: error: lost the connection to {d.serial}: "), line


def test_a_daemon_dying_mid_pull_fails_it_naming_the_device(fresh_daemon, home, tmp_path):
    d = fresh_daemon("dies-pull", args=("--memory-budget", "4M"), rust_log=None)
    src = tmp_path / "source.bin"
    write_random(src, 16 << 20)
    fifo = tmp_path / "pulled.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([str(resolve_oxadb()), "-s", d.serial, "--memory-budget", "1M",
                             "pull", str(src), str(fifo)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(HOME=str(home)))
    try:
        with open(fifo, "rb") as reader:
            assert len(reader.read(1 << 20)) == 1 << 20
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait(timeout=10)
            while reader.read(1 << 20):
                pass
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    line = one_error(subprocess.CompletedProcess(proc.args, proc.returncode, b"", err))
    assert line.startswith(f"oxadb: error: lost the connection to {d.serial}: "), line


class FakeV1Device:
    """A device without shell_v2 (so `shell:` is v1: no exit status): it
    answers one shell OPEN with `partial` and then hangs up, or, with
    `clean`, closes the stream and keeps the connection as adbd does."""

    def __init__(self, clean: bool):
        self.clean = clean
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def _recv(conn: socket.socket) -> tuple[int, int, int, bytes]:
        def exact(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                chunk = conn.recv(n - len(buf))
                if not chunk:
                    raise ConnectionError("host closed")
                buf += chunk
            return buf
        command, arg0, arg1, length, _crc, _magic = HEADER.unpack(exact(HEADER.size))
        return command, arg0, arg1, exact(length) if length else b""

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(20)
        try:
            assert self._recv(conn)[0] == A_CNXN
            conn.sendall(packet(A_CNXN, A_VERSION, MAX_PAYLOAD,
                                b"device::ro.product.name=fake;features=cmd\0"))
            while True:
                command, host_id, _, data = self._recv(conn)
                if command == A_OPEN:
                    break
            conn.sendall(packet(A_OKAY, 7, host_id))
            conn.sendall(packet(A_WRTE, 7, host_id, b"partial\n"))
            if not self.clean:
                return
            while self._recv(conn)[0] != A_OKAY:
                pass
            conn.sendall(packet(A_CLSE, 7, host_id))
            while True:
                self._recv(conn)
        except (ConnectionError, OSError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.listener.close()
        self.thread.join(timeout=10)


@pytest.mark.parametrize("clean", [False, True], ids=["hangs-up", "closes-stream"])
def test_shell_v1_tells_a_lost_connection_from_an_end(home, clean):
    fake = FakeV1Device(clean)
    try:
        cp = oxadb(home, "-s", f"127.0.0.1:{fake.port}", "shell", "echo partial", timeout=30)
    finally:
        fake.close()
    assert cp.stdout == b"partial\n", cp
    if clean:
        assert cp.returncode == 0 and cp.stderr == b"", cp
    else:
        line = one_error(cp)
        assert line == (f"oxadb: error: lost the connection to 127.0.0.1:{fake.port}: "
                        "the device closed the connection"), line


@pytest.mark.parametrize("reply,got", [
    (b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", 'got "SSH-2.0-OpenSSH_9.2p1 Debian-2\\r\\n"'),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", 'got "HTTP/1.1 400 Bad Request\\r\\n\\r\\n"'),
    (b"", "it closed the connection without sending anything"),
    (None, "it closed the connection without sending anything"),
], ids=["ssh", "http", "hang-up", "reset"])
def test_a_peer_that_is_no_adb_daemon_is_told_at_once(home, reply, got):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            if reply is None:
                # An abortive close: a reset that may reach us before or
                # during our CNXN (the hang-up above races the same way).
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            if reply.startswith(b"HTTP"):
                conn.recv(4096)
            conn.sendall(reply)
            if reply:
                time.sleep(3)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        # Well inside the 10 s CNXN timeout the old message came after.
        cp = oxadb(home, "-s", f"127.0.0.1:{port}", "shell", "true", timeout=8)
    finally:
        thread.join(timeout=10)
        listener.close()
    line = one_error(cp)
    assert line == f"oxadb: error: 127.0.0.1:{port} does not speak ADB ({got})", line


def test_unauthorized_says_how_to_trust_the_key(fresh_daemon, home, tmp_path):
    keys = tmp_path / "adb_keys"
    keys.write_text("")
    d = fresh_daemon("auth", args=("--auth", "--keys", str(keys)))
    line = one_error(oxadb(home, "-s", d.serial, "get-state"))
    pub = home / ".android" / "adbkey.pub"
    assert pub.exists()
    assert line.startswith(f"oxadb: error: {d.serial}: device unauthorized: "), line
    assert f"`oxadbd trust-key {pub}`" in line and "Android device" in line, line


def test_without_a_usable_home_a_keyless_daemon_still_works(fresh_daemon, tmp_path):
    d = fresh_daemon("keyless")
    not_a_dir = tmp_path / "home-is-a-file"
    not_a_dir.write_text("")
    cp = oxadb(not_a_dir, "-s", d.serial, "shell", "echo ok")
    assert (cp.returncode, cp.stdout, cp.stderr) == (0, b"ok\n", b""), cp
    keys = tmp_path / "adb_keys"
    keys.write_text("")
    asks = fresh_daemon("asks", args=("--auth", "--keys", str(keys)))
    # Told as soon as the device asks, not after the CNXN timeout.
    line = one_error(oxadb(not_a_dir, "-s", asks.serial, "shell", "echo ok", timeout=8))
    assert line.startswith(f"oxadb: error: {asks.serial}: device unauthorized and this host has "
                           f"no key to offer ({not_a_dir}/.android/adbkey: "), line
    assert "Not a directory (os error 20)" in line and "HOME" in line, line


# --- help -------------------------------------------------------------------

def _help(home: Path, *args: str) -> str:
    cp = oxadb(home, *args, "--help")
    assert cp.returncode == 0, cp
    return cp.stdout.decode()


def test_tuning_flags_are_in_the_top_level_help_only(home):
    top = _help(home)
    assert "\nTuning" in top, top
    tuning = top.split("\nTuning", 1)[1]
    for flag in TUNING_FLAGS:
        assert top.count(flag + " ") + top.count(flag + "\n") >= 1 and flag in tuning, flag
    for command in ("shell", "push", "pull", "exec-out", "devices", "version", "keygen",
                    "forward", "reverse", "raw", "features"):
        text = _help(home, command)
        shown = [flag for flag in TUNING_FLAGS if flag in text]
        assert not shown, f"{command} --help lists {shown}"


def test_tuning_flags_work_before_the_command(fresh_daemon, home):
    d = fresh_daemon("tuning", rust_log=None)
    cp = oxadb(home, "--no-burst", "-s", d.serial, "features")
    assert cp.returncode == 0 and b"burst mode (delayed_ack): off" in cp.stderr, cp
    cp = oxadb(home, "--credit", "aosp", "--memory-budget", "16M", "--no-ack-headroom",
               "--zero-copy", "-s", d.serial, "features")
    assert cp.returncode == 0 and b"burst mode (delayed_ack): on" in cp.stderr, cp
    cp = oxadb(home, "--no-zero-copy", "-s", d.serial, "features")
    assert cp.returncode == 0 and b"burst mode (delayed_ack): on" in cp.stderr, cp


def test_pull_help_names_each_argument_once(home):
    text = _help(home, "pull")
    assert "Usage: oxadb pull [OPTIONS] REMOTE... [LOCAL]" in text, text
    assert "<PATH>" not in text and "<REMOTE>..." in text, text


# --- progress bar -------------------------------------------------------------

def _in_pty(argv: list[str], cols: int, env: dict[str, str], timeout: float = 60):
    """Runs argv with stderr on a pseudo-terminal `cols` wide; returns
    (exit status, stdout, what the terminal received)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, env=env)
    os.close(slave)
    screen = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                screen += chunk
            elif proc.poll() is not None:
                break
        out = proc.stdout.read()
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return proc.returncode, out, screen


def _slow_reader(path: Path, done: list[int]) -> threading.Thread:
    def read() -> None:
        total = 0
        with open(path, "rb") as f:
            while chunk := f.read(256 << 10):
                total += len(chunk)
                time.sleep(0.1)
        done.append(total)
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("cols", [60, 120])
@pytest.mark.parametrize("direction", ["push", "pull"])
def test_the_progress_bar_fits_the_terminal(fresh_daemon, home, tmp_path, direction, cols):
    d = fresh_daemon("progress", args=("--memory-budget", "4M"), rust_log=None)
    # A long directory, so that 60 columns must cut the path.
    deep = tmp_path / "a-rather-long-directory-name" / "and-another-level"
    deep.mkdir(parents=True)
    size = 8 << 20
    src = deep / f"{direction}-source.bin"
    write_random(src, size)
    fifo = deep / f"{direction}-target.fifo"
    os.mkfifo(fifo)
    # The bar shows the destination for a push and the source for a pull.
    shown = fifo.name if direction == "push" else src.name
    done: list[int] = []
    reader = _slow_reader(fifo, done)
    argv = [str(resolve_oxadb()), "-s", d.serial, "--memory-budget", "1M", direction,
            str(src), str(fifo)]
    rc, out, screen = _in_pty(argv, cols, clean_env(HOME=str(home), TERM="xterm"))
    reader.join(timeout=30)
    assert rc == 0 and done == [size], (rc, out, screen[-500:], done)
    assert b"1 file" in out, out
    # No line wrapped: indicatif moves the cursor up to redraw wrapped lines.
    assert b"\x1b[1A" not in screen, screen[-2000:]
    frames = [ANSI.sub(b"", f).decode("utf-8").rstrip()
              for f in re.split(rb"\r|\n|\x1b\[2K", screen)]
    frames = [f for f in frames if f]
    assert len(frames) >= 2, frames
    for frame in frames:
        assert len(frame) < cols, (cols, frame)
        assert frame.endswith(shown), (shown, frame)
    # The first frame comes before any rate: no ETA there (nor "ETA 0s").
    assert "ETA" not in frames[0], frames[:3]
    assert any("ETA" in f for f in frames[1:]), frames
    if cols >= 120:
        assert all(f.startswith("[") for f in frames), frames[:3]
    else:
        assert all("…" in f for f in frames), frames[:3]


# --- the README's quick start ---------------------------------------------------

def readme_quick_start() -> list[str]:
    """The command lines of README.md's quick start: the first `sh` block
    after "**Quick start**", read from the README itself."""
    text = (REPO / "README.md").read_text()
    assert "**Quick start**" in text, "README.md has no quick start"
    after = text.split("**Quick start**", 1)[1]
    block = re.search(r"```sh\n(.*?)```", after, re.S)
    assert block, "no sh block after the quick start"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 5, lines
    return lines


def test_the_readme_first_block_keeps_its_two_set_up_commands():
    text = (REPO / "README.md").read_text()
    first = re.search(r"```sh\n(.*?)```", text, re.S).group(1).splitlines()
    assert [line.split("#")[0].strip() for line in first] == [
        "cargo run --release --bin oxadbd", "./scripts/test.sh"], first


def test_the_readme_quick_start_works_as_printed(fresh_daemon, home, tmp_path):
    """Runs the quick start's lines in one bash, in the repository, against a
    fresh daemon. Substituted, and nothing else: the README's port 5555 by
    the daemon's free port, `/tmp/` by this test's directory (the device is
    this machine: parallel runs must not share files), and
    `$PWD/target/release` by the directory of the oxadb under test ($OXADB,
    the same directory by default)."""
    d = fresh_daemon("readme", rust_log=None)
    lines = readme_quick_start()
    device_tmp = tmp_path / "device-tmp"
    device_tmp.mkdir()
    script = ["set -euo pipefail"]
    for number, line in enumerate(lines):
        assert "127.0.0.1:5555" in line or "5555" not in line, line
        line = (line.replace("127.0.0.1:5555", d.serial)
                .replace("/tmp/", f"{device_tmp}/")
                .replace("$PWD/target/release", str(resolve_oxadb().parent)))
        script += [f"echo '::line {number}'", line]
    cp = subprocess.run(["bash", "-c", "\n".join(script)], cwd=REPO, stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
                        env=clean_env(HOME=str(home)))
    out = cp.stdout.decode("utf-8", "replace")
    assert cp.returncode == 0, out
    parts = re.split(r"^::line (\d+)\n", out, flags=re.M)[1:]
    said = {int(parts[i]): parts[i + 1] for i in range(0, len(parts), 2)}
    assert sorted(said) == list(range(len(lines))), out
    user = pwd.getpwuid(os.getuid())
    shell_line = next(i for i, line in enumerate(lines) if " shell " in line)
    assert said[shell_line] == f"{user.pw_name}\n{user.pw_dir}\n", said[shell_line]
    push_line = next(i for i, line in enumerate(lines) if " push " in line)
    pull_line = next(i for i, line in enumerate(lines) if " pull " in line)
    assert "1 file pushed" in said[push_line], said[push_line]
    assert "1 file pulled" in said[pull_line], said[pull_line]
    copies = sorted(device_tmp.iterdir())
    assert len(copies) == 2, copies
    for copy in copies:
        assert copy.read_bytes() == (REPO / "README.md").read_bytes(), copy
