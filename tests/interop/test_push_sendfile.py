"""oxadb's pushes over TCP send file data by sendfile unless told otherwise.

The default, `--no-zero-copy` and `OXADB_ZERO_COPY=0` are each checked by
what `push --stats` reports and by the bytes that arrive. A source that
shrinks while its data is already framed (the kernel's sendfile finds its
end too soon) fails with one error line naming the local path and the
cause; the daemon writes nothing it did not get and serves the next
command. The push is held part way by a FIFO that the test stops reading,
so the file is truncated while most of it is still unsent.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness import clean_env, resolve_oxadb, sha256_file, write_random


def host_env(home: Path, **env: str) -> dict[str, str]:
    """oxadb's environment: HOME, `env`, and no OXADB_ZERO_COPY but `env`'s."""
    environment = clean_env(HOME=str(home))
    environment.pop("OXADB_ZERO_COPY", None)
    environment.update(env)
    return environment


def oxadb(home: Path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(resolve_oxadb()), *args], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                          env=host_env(home, **env), text=True)


@pytest.fixture
def home(tmp_path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


SIZE = 3 * 1024 * 1024 + 7


@pytest.mark.parametrize("how,flags,env,by_sendfile", [
    ("default", (), {}, True),
    ("--zero-copy", ("--zero-copy",), {}, True),
    ("--no-zero-copy", ("--no-zero-copy",), {}, False),
    ("OXADB_ZERO_COPY=0", (), {"OXADB_ZERO_COPY": "0"}, False),
    ("--no-zero-copy over OXADB_ZERO_COPY=1", ("--no-zero-copy",), {"OXADB_ZERO_COPY": "1"}, False),
])
def test_push_sends_by_sendfile_unless_told_not_to(fresh_daemon, home, tmp_path,
                                                   how, flags, env, by_sendfile):
    d = fresh_daemon("push", rust_log=None)
    src = tmp_path / "src.bin"
    digest = write_random(src, SIZE)
    dest = tmp_path / "dest.bin"
    cp = oxadb(home, *flags, "-s", d.serial, "push", "--stats", str(src), str(dest), **env)
    assert cp.returncode == 0, (how, cp.stderr)
    assert sha256_file(dest) == digest, how
    if by_sendfile:
        assert f"zero-copy: 1 files sent as file ranges, {SIZE} bytes by sendfile, 0 read into memory" \
            in cp.stdout + cp.stderr, (how, cp.stdout, cp.stderr)
    else:
        assert "zero-copy: off" in cp.stdout + cp.stderr, (how, cp.stdout, cp.stderr)


def test_a_source_that_shrinks_mid_push_fails_naming_it(fresh_daemon, home, tmp_path):
    d = fresh_daemon("shrink", rust_log=None)
    src = tmp_path / "rotated.log"
    write_random(src, 64 * 1024 * 1024)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    push = subprocess.Popen([str(resolve_oxadb()), "-s", d.serial, "push", str(src), str(fifo)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=host_env(home), text=True)
    try:
        # Take 1 MiB, then stop reading: the daemon's writes block on the
        # FIFO, credit stops, and the host holds the rest of the file.
        reader = os.open(fifo, os.O_RDONLY)
        taken = 0
        while taken < 1024 * 1024:
            chunk = os.read(reader, 1024 * 1024 - taken)
            assert chunk, "the FIFO closed before 1 MiB arrived"
            taken += len(chunk)
        time.sleep(0.5)
        assert push.poll() is None, "the push ended while the FIFO was not read"
        os.truncate(src, 0)
        drained = [taken]

        def drain():
            while chunk := os.read(reader, 1024 * 1024):
                drained[0] += len(chunk)

        draining = threading.Thread(target=drain, daemon=True)
        draining.start()
        out, err = push.communicate(timeout=30)
        draining.join(timeout=30)
        os.close(reader)
    finally:
        if push.poll() is None:
            push.kill()
            push.wait()
    assert push.returncode == 1, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("oxadb: error: "), err
    assert f"'{src}' shrank while being sent" in lines[0], err
    assert drained[0] < 64 * 1024 * 1024, "the whole file arrived although it was truncated"
    # Only that connection ended: the daemon serves the next command.
    cp = oxadb(home, "-s", d.serial, "shell", "echo", "still", "serving")
    assert cp.returncode == 0 and cp.stdout == "still serving\n", cp
