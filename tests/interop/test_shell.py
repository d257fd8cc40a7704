"""`adb shell` (shell v2, raw, no pty: stdin is never a tty here) and `adb exec-out`."""

import hashlib

import pytest

from harness import write_random


def test_shell_echo(adb):
    r = adb("shell", "echo", "hello")
    assert r.rc == 0, r
    assert r.stdout == b"hello\n", r


@pytest.mark.parametrize("code", [0, 1, 42])
def test_shell_exit_status(adb, code):
    # adb 29 uses shell v2 when the device advertises shell_v2 and returns the
    # remote exit status as its own.
    r = adb("shell", f"exit {code}")
    assert r.rc == code, r


def test_shell_exit_status_of_last_command(adb):
    r = adb("shell", "echo before; false")
    assert r.rc == 1, r
    assert r.stdout == b"before\n", r


def test_shell_separates_stdout_and_stderr(adb):
    r = adb("shell", "echo out; echo err >&2")
    assert r.rc == 0, r
    assert r.stdout == b"out\n", r
    assert b"err\n" in r.stderr, r
    assert b"out" not in r.stderr, r


def test_shell_stdin_piped(adb):
    r = adb("shell", "cat", input=b"abc\n")
    assert r.rc == 0, r
    assert r.stdout == b"abc\n", r


def test_shell_stdin_eof_reaches_command(adb):
    # wc only prints once it has seen EOF on stdin: checks close-stdin is relayed.
    data = b"".join(b"line %d\n" % i for i in range(1000))
    r = adb("shell", "wc -l", input=data, timeout=30)
    assert r.rc == 0, r
    assert r.stdout.strip() == b"1000", r


def test_shell_binary_stdin_roundtrip(adb):
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value, includes NULs
    r = adb("shell", "cat", input=data, timeout=60)
    assert r.rc == 0, r
    assert len(r.stdout) == len(data), (len(r.stdout), r.stderr)
    assert r.stdout == data


def test_shell_command_runs_through_shell(adb):
    # `adb shell CMD` runs CMD through the daemon's shell (sh -c): expansions work.
    r = adb("shell", "a=4; b=5; echo $((a*b))")
    assert r.rc == 0, r
    assert r.stdout == b"20\n", r


def test_exec_out_16mib_byte_exact(adb, tmp_path):
    src = tmp_path / "blob.bin"
    digest = write_random(src, 16 << 20)
    r = adb("exec-out", "cat", str(src), timeout=120)
    assert r.rc == 0, r.stderr
    assert len(r.stdout) == 16 << 20, (len(r.stdout), r.stderr)
    assert hashlib.sha256(r.stdout).hexdigest() == digest


def test_exec_out_no_stdout_translation(adb):
    # exec: is a raw stream: no pty, so no \n -> \r\n translation.
    r = adb("exec-out", "printf 'a\\nb\\r\\n'")
    assert r.rc == 0, r
    assert r.stdout == b"a\nb\r\n", r


def test_shell_without_command_reads_script_from_stdin(adb):
    # No command and stdin not a tty: adb 29 asks for a raw (non-pty) shell
    # and feeds it our stdin; the shell's exit status comes back.
    r = adb("shell", input=b"echo from-stdin\nexit 3\n", timeout=30)
    assert r.rc == 3, r
    assert b"from-stdin\n" in r.stdout, r


def test_shell_forced_pty(adb):
    # -tt forces a pty even though stdin is not a terminal: output passes
    # through the pty line discipline (\n -> \r\n); the exit status still
    # comes back through shell v2.
    r = adb("shell", "-tt", "echo hi; exit 5", timeout=30)
    assert r.rc == 5, r
    assert r.stdout == b"hi\r\n", r
