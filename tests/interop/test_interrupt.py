"""A push killed mid-transfer must leave the old destination intact and no debris.

We SIGKILL the `adb push` client. Its socket to the adb server closes, the
server closes the sync stream (CLSE) towards the daemon, and the daemon must
then drop the half-written temporary file without touching the destination.
"""

import os
import signal
import time

from harness import sha256_file, write_random


def _snapshot(d):
    out = {}
    for name in os.listdir(d):
        try:
            st = os.lstat(os.path.join(d, name))
        except FileNotFoundError:
            continue
        out[name] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def test_killed_push_keeps_old_destination(adb_server, fresh_daemon, tmp_path):
    d = fresh_daemon()
    adb_server.connect(d.serial)
    try:
        remote = tmp_path / "remote"
        remote.mkdir()
        victim = remote / "victim.bin"
        old_digest = write_random(victim, 1 << 20)
        before = _snapshot(remote)

        # 1 GiB sparse source: reading it costs nothing, and the transfer
        # cannot finish in the few milliseconds we need to notice it started.
        src = tmp_path / "huge.bin"
        with open(src, "wb") as f:
            f.truncate(1 << 30)

        proc = adb_server.popen("push", str(src), str(victim), serial=d.serial)
        started = None
        saw = {}
        deadline = time.monotonic() + 20
        try:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                saw = _snapshot(remote)
                extra = {n: v for n, v in saw.items() if n != "victim.bin"}
                changed = saw.get("victim.bin") != before["victim.bin"]
                if extra or changed:
                    if started is None:
                        started = time.monotonic()
                    # Let some data land (a few MiB, or 300 ms) before killing.
                    if any(v[1] > (4 << 20) for v in extra.values()) or \
                            time.monotonic() - started > 0.3:
                        break
                time.sleep(0.005)
            assert proc.poll() is None, (
                "adb push finished before it could be interrupted: "
                f"rc={proc.returncode} out={proc.stdout.read()!r} err={proc.stderr.read()!r}")
            assert started is not None, (
                "the daemon wrote nothing in the destination directory within 20s "
                f"of the push starting (listing: {saw})")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            proc.stdout.close()
            proc.stderr.close()

        # The destination was never replaced...
        assert sha256_file(victim) == old_digest, "destination was modified by an aborted push"
        # ...and the daemon cleans up its temporary file within a bounded time.
        deadline = time.monotonic() + 10
        listing = sorted(os.listdir(remote))
        while listing != ["victim.bin"] and time.monotonic() < deadline:
            time.sleep(0.1)
            listing = sorted(os.listdir(remote))
        assert listing == ["victim.bin"], f"debris left after aborted push: {listing}"
        assert sha256_file(victim) == old_digest

        # The connection survived the aborted stream.
        r = adb_server.run("shell", "echo alive", serial=d.serial)
        assert r.stdout == b"alive\n", r
        assert d.alive()
    finally:
        adb_server.disconnect(d.serial)


def test_killed_push_of_new_file_leaves_nothing(adb_server, fresh_daemon, tmp_path):
    d = fresh_daemon()
    adb_server.connect(d.serial)
    try:
        remote = tmp_path / "remote"
        remote.mkdir()
        src = tmp_path / "huge.bin"
        with open(src, "wb") as f:
            f.truncate(1 << 30)
        proc = adb_server.popen("push", str(src), str(remote / "new.bin"), serial=d.serial)
        deadline = time.monotonic() + 20
        started = None
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                names = os.listdir(remote)
                if names:
                    started = started or time.monotonic()
                    if time.monotonic() - started > 0.3:
                        break
                time.sleep(0.005)
            assert proc.poll() is None, "adb push finished before it could be interrupted"
            assert started is not None, "the daemon wrote nothing within 20s"
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            proc.stdout.close()
            proc.stderr.close()
        deadline = time.monotonic() + 10
        while os.listdir(remote) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert os.listdir(remote) == [], "a killed push left a file behind"
        r = adb_server.run("shell", "echo alive", serial=d.serial)
        assert r.stdout == b"alive\n", r
    finally:
        adb_server.disconnect(d.serial)


def test_daemon_stopped_mid_push_leaves_nothing(adb_server, fresh_daemon, tmp_path):
    """SIGTERM to oxadbd during a push, with no grace period: it removes the
    push's temporary file and leaves the previous destination intact before
    it exits (a grace period is test_restart.py's)."""
    d = fresh_daemon(args=("--stop-grace", "0"))
    adb_server.connect(d.serial)
    remote = tmp_path / "remote"
    remote.mkdir()
    victim = remote / "victim.bin"
    old_digest = write_random(victim, 1 << 20)
    src = tmp_path / "huge.bin"
    with open(src, "wb") as f:
        f.truncate(1 << 30)
    proc = adb_server.popen("push", str(src), str(victim), serial=d.serial)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            if any(n.startswith(".oxadb-push.") for n in os.listdir(remote)):
                break
            time.sleep(0.005)
        assert proc.poll() is None, "adb push finished before the daemon could be stopped"
        assert any(n.startswith(".oxadb-push.") for n in os.listdir(remote)), \
            "the push never started"
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=15) == 0, "oxadbd did not exit cleanly on SIGTERM"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    assert sorted(os.listdir(remote)) == ["victim.bin"], \
        f"debris left after the daemon stopped: {os.listdir(remote)}"
    assert sha256_file(victim) == old_digest
    assert b"SIGTERM: exiting" in d.log_since(0)
