"""`dev:`/`dev-raw:` (serial ports) and `framebuffer:` errors, on this machine.

A pseudo-terminal pair stands in for a board's UART: the test keeps the
master, hands the slave's path to the daemon in the service name, and
sends bytes both ways. adb 29.0.6 opens the service with its (unlisted)
`adb raw SERVICE` command, which relays stdin and stdout through the adb
server; oxadb with `oxadb raw SERVICE`. The framebuffer itself is tested in
the VM rig (tests/usb/devio-vm.sh, with the kernel's `vfb`); here only the
error when the configured device is missing. vsock is tested there too.
"""

from __future__ import annotations

import os
import select
import subprocess
import termios
import time

from harness import ADB_TIMEOUT, clean_env, resolve_oxadb

# Every byte value, and first the ones a cooked terminal would act on:
# CR (turned into NL), ^C (SIGINT), DEL (erase), ^D (EOF), ^S/^Q (flow
# control), ^Z (SIGTSTP), ^U (kill line), ^\\ (SIGQUIT).
SPECIAL = b"\r\x03\x7f\x04\x13\x11\x1a\x15\x1c\n"
PAYLOAD = SPECIAL + bytes(range(256)) + SPECIAL


def read_exact(fd: int, n: int, timeout: float = 10.0) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, left))
        if not ready:
            raise AssertionError(f"only {len(out)} of {n} bytes within {timeout}s: {out!r}")
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise AssertionError(f"EOF after {len(out)} of {n} bytes: {out!r}")
        out += chunk
    return out


def nothing_more(fd: int, wait: float = 0.3) -> bytes:
    """Whatever arrives on `fd` within `wait` seconds (b"" if nothing)."""
    ready, _, _ = select.select([fd], [], [], wait)
    return os.read(fd, 4096) if ready else b""


class Pty:
    def __init__(self):
        self.master, self.slave = os.openpty()
        self.path = os.ttyname(self.slave)

    def close(self):
        for fd in (self.master, self.slave):
            try:
                os.close(fd)
            except OSError:
                pass


def wait_raw(pty: Pty, timeout: float = 10.0) -> list:
    """The slave's termios once the daemon made it raw (no ICANON)."""
    deadline = time.monotonic() + timeout
    while True:
        attrs = termios.tcgetattr(pty.slave)
        if not attrs[3] & termios.ICANON or time.monotonic() > deadline:
            return attrs
        time.sleep(0.02)


def exchange(proc: subprocess.Popen, pty: Pty) -> None:
    """Both directions through a client relaying stdin/stdout, byte for byte."""
    attrs = wait_raw(pty)
    iflag, oflag, _cflag, lflag = attrs[:4]
    assert not lflag & (termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN), attrs
    assert not iflag & (termios.ICRNL | termios.IXON | termios.ISTRIP), attrs
    assert not oflag & termios.OPOST, attrs
    # Device to host: what the UART sends arrives unchanged.
    os.write(pty.master, PAYLOAD)
    got = read_exact(proc.stdout.fileno(), len(PAYLOAD))
    assert got == PAYLOAD, got
    # Host to device: unchanged too (no NL -> CRNL), and nothing echoed back.
    proc.stdin.write(PAYLOAD[::-1])
    proc.stdin.flush()
    got = read_exact(pty.master, len(PAYLOAD))
    assert got == PAYLOAD[::-1], got
    assert nothing_more(proc.stdout.fileno()) == b"", "the daemon's side echoed input"
    assert nothing_more(pty.master) == b""


def finish(proc: subprocess.Popen) -> tuple[bytes, bytes]:
    """Closes the client's stdin (if still open) and waits for it to exit."""
    if proc.stdin is not None and proc.stdin.closed:
        proc.stdin = None
    try:
        return proc.communicate(timeout=ADB_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate(timeout=10)


def test_dev_raw_with_adb29(adb, daemon):
    pty = Pty()
    proc = adb.popen("raw", f"dev-raw:{pty.path}", stdin=subprocess.PIPE)
    try:
        exchange(proc, pty)
        # adb ends the stream when its stdin ends; the daemon closes the node.
        out, err = finish(proc)
        assert proc.returncode == 0, (out, err)
        line = daemon.wait_for_log(lambda l: "device stream ended" in l and pty.path in l)
        assert line is not None, "no `device stream ended` line for the pty"
        assert f"to_device={len(PAYLOAD)}" in line, line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        pty.close()


def test_dev_raw_with_oxadb(daemon, tmp_path):
    pty = Pty()
    proc = subprocess.Popen([str(resolve_oxadb()), "-s", daemon.serial, "raw",
                             f"dev-raw:{pty.path}"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env(HOME=str(tmp_path)))
    try:
        exchange(proc, pty)
        # The stream outlives oxadb's stdin (ADB has no half-close) ...
        proc.stdin.close()
        os.write(pty.master, b"after stdin ended\r")
        assert read_exact(proc.stdout.fileno(), 18) == b"after stdin ended\r"
        # ... until the device side ends: a pty's slave reads EIO once its
        # master is closed, which the daemon takes as the end of the stream.
        os.close(pty.master)
        out, err = finish(proc)
        assert proc.returncode == 0, (out, err)
        assert out == b"", out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        pty.close()


def test_dev_is_cooked(adb, daemon):
    """`dev:` leaves the terminal's settings alone, as adbd does: the line
    discipline echoes, waits for whole lines and turns NL into CR NL."""
    pty = Pty()
    proc = adb.popen("raw", f"dev:{pty.path}", stdin=subprocess.PIPE)
    try:
        # Nothing tells when the daemon has opened the node; a line written
        # before that would simply wait in the line discipline.
        os.write(pty.master, b"line one\n")
        assert read_exact(proc.stdout.fileno(), 9) == b"line one\n"
        assert read_exact(pty.master, 10) == b"line one\r\n"  # the echo
        assert termios.tcgetattr(pty.slave)[3] & termios.ICANON
        proc.stdin.write(b"to the board\n")
        proc.stdin.flush()
        assert read_exact(pty.master, 14) == b"to the board\r\n"
        out, err = finish(proc)
        assert proc.returncode == 0, (out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        pty.close()


def test_dev_on_a_node_without_poll(adb, daemon, tmp_path):
    """A regular file cannot be polled (epoll refuses it): the daemon reads
    and writes it on blocking threads instead; its end ends the stream."""
    plain = tmp_path / "plain"
    contents = b"\x00contents\r\n\xff"
    plain.write_bytes(contents)
    proc = adb.popen("raw", f"dev:{plain}", stdin=subprocess.PIPE)
    try:
        assert read_exact(proc.stdout.fileno(), len(contents)) == contents
        assert nothing_more(proc.stdout.fileno()) == b"", "more than the file's bytes"
        # The daemon closed the stream at the file's end: adb exits by itself.
        assert proc.wait(timeout=ADB_TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        finish(proc)


def test_unopenable_nodes_refuse_the_stream(adb, daemon, tmp_path):
    plain = tmp_path / "not-a-tty"
    plain.write_bytes(b"x")
    cases = [
        (f"dev:{tmp_path}/missing", f"dev: cannot open {tmp_path}/missing: "
                                    "No such file or directory (os error 2)"),
        (f"dev-raw:{plain}", f"dev-raw: cannot put {plain} into raw mode: "
                             "Inappropriate ioctl for device (os error 25)"),
    ]
    for service, message in cases:
        since = daemon.log_size()
        r = adb("raw", service)
        # adb 29 reports a refused OPEN as its generic `closed`.
        assert r.rc == 1 and "closed" in r.err, r
        line = daemon.wait_for_log(lambda l: "refusing device stream" in l, since=since)
        assert line is not None and message in line, line
    # The connection and the daemon go on serving.
    assert adb("shell", "echo", "still here").out == "still here\n"


def test_framebuffer_without_a_device_says_why(fresh_daemon, adb_server, tmp_path):
    config = tmp_path / "oxadbd.toml"
    missing = tmp_path / "no-fb0"
    config.write_text(f'framebuffer = "{missing}"\n')
    d = fresh_daemon(name="fb", args=("--config", str(config)))
    message = f"framebuffer: cannot open {missing}: No such file or directory (os error 2)\n"
    adb_server.connect(d.serial)
    try:
        # stdin stays open: adb raw ends the stream when its stdin ends.
        proc = adb_server.popen("raw", "framebuffer:", serial=d.serial, stdin=subprocess.PIPE)
        try:
            out = read_exact(proc.stdout.fileno(), len(message))
            assert out == message.encode()
            # adb exits once the daemon closed the stream.
            assert proc.wait(timeout=ADB_TIMEOUT) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            finish(proc)
    finally:
        adb_server.disconnect(d.serial)
    cp = subprocess.run([str(resolve_oxadb()), "-s", d.serial, "raw", "framebuffer:"],
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, timeout=ADB_TIMEOUT,
                        env=clean_env(HOME=str(tmp_path)))
    assert cp.returncode == 0 and cp.stdout == message.encode(), cp
    assert d.wait_for_log(lambda l: "framebuffer unavailable" in l and str(missing) in l)
