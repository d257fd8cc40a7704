"""A shell the host hangs up on: adb 29's client (shell protocol v2, and v1
with `-x`) and oxadb interrupted with Ctrl-C (SIGINT) or killed mid-command.
The command's process group gets SIGHUP, so a `trap ... HUP` runs while the
shell still waits on stdin; a process that ignores it is killed a few seconds
later (oxadbd's `KILL_AFTER_HANGUP`); one that left the group (`setsid nohup`)
keeps running."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from harness import clean_env, resolve_oxadb

# oxadbd's grace after the hang-up is 3 s; allow for a loaded machine.
KILL_DEADLINE = 15.0


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_for_file(path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            text = open(path).read().strip()
            if text:
                return text
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written within {timeout}s")


CLIENTS = {
    "adb-v2-sigint": ((), signal.SIGINT),
    "adb-v1-sigint": (("-x",), signal.SIGINT),
    "adb-v2-killed": ((), signal.SIGKILL),
    "adb-v1-killed": (("-x",), signal.SIGKILL),
    "oxadb-sigint": (None, signal.SIGINT),
}


@pytest.mark.parametrize("client_id", list(CLIENTS))
def test_hang_up_runs_the_trap_kills_the_stubborn_and_spares_the_detached(
        adb_server, daemon, tmp_path, client_id):
    shell_args, sig = CLIENTS[client_id]
    hup = tmp_path / "hup"
    stubborn = tmp_path / "stubborn.pid"
    detached = tmp_path / "detached.pid"
    script = (
        f"trap 'echo HUP > {hup}' HUP; "
        # Ignores SIGHUP (kept across exec): only the later SIGKILL ends it.
        f"sh -c 'trap \"\" HUP; echo $$ > {stubborn}; exec sleep 300' & "
        # Leaves the process group: no signal of the stream's reaches it.
        f"setsid nohup sh -c 'echo $$ > {detached}; exec sleep 300' >/dev/null 2>&1 & "
        "echo ready; read x"
    )
    # stdin stays open: the remote `read` waits until the hang-up.
    if shell_args is None:
        client = subprocess.Popen([str(resolve_oxadb()), "-s", daemon.serial, "shell", script],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=clean_env(HOME=str(tmp_path)))
    else:
        client = adb_server.popen("shell", *shell_args, script, serial=daemon.serial,
                                  stdin=subprocess.PIPE)
    detached_pid = None
    try:
        stubborn_pid = int(wait_for_file(stubborn))
        detached_pid = int(wait_for_file(detached))
        assert alive(stubborn_pid) and alive(detached_pid)
        assert client.stdout.readline() == b"ready\n"
        client.send_signal(sig)
        client.wait(timeout=10)

        # The shell is hung up on while `read` waits (v1 too: a v1 client
        # never closes the stream to end stdin, so a close is a hang-up).
        assert wait_for_file(hup, timeout=10) == "HUP"
        # Still there shortly after the hang-up: it ignored SIGHUP...
        time.sleep(0.5)
        assert alive(stubborn_pid), "the SIGHUP-ignoring process died before the grace period"
        # ... and killed once the grace period is over.
        deadline = time.monotonic() + KILL_DEADLINE
        while alive(stubborn_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(stubborn_pid), f"pid {stubborn_pid} outlived its stream by {KILL_DEADLINE}s"
        assert alive(detached_pid), "a process that left the group (setsid nohup) was killed"
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(timeout=10)
        for pid_file in (stubborn, detached):
            try:
                pid = int(open(pid_file).read().strip())
            except (FileNotFoundError, ValueError):
                continue
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
