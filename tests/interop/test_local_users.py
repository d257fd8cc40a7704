"""Who gets in over loopback without a key (docs/security.md, "Threat model").

By default a loopback TCP peer needs no key only when its socket belongs to
root or to the daemon's own user (the daemon asks the kernel who owns the
connecting socket); every other local user must authenticate like a remote
host. These tests run as root and act as unprivileged users through uids no
account or process uses: adb runs under `setpriv`, raw sockets are opened by
a forked child that dropped to the uid. Each user's files live in a /tmp
directory of its own (pytest's tmp dirs are root-only), removed at the end.

  * adb 29 run by an unprivileged user (its own adb server, HOME, key) is
    `unauthorized` and gets no shell; root's adb gets `device` and a shell;
  * a raw client of that user gets AUTH TOKEN for its CNXN and its OPEN
    closes the connection; one that hung up before the daemon looked at its
    socket is not mistaken for root;
  * a daemon run by an unprivileged user lets that user and root in, and
    not another user;
  * `--trust-local-users` lets every local user in, warned at start;
  * a key trusted with `oxadbd trust-key` lets the user in;
  * the same on [::1] and on an IPv4-mapped listener;
  * `--keys` with `--no-auth` is refused, a port in use ends the daemon with
    status 1, both in one line; the log in a file has no colour codes (a
    terminal gets them).
"""

from __future__ import annotations

import contextlib
# Loaded now: a child that dropped to another uid cannot read the
# interpreter's library if it lives in root's home (pyenv), and
# socket.create_connection imports this codec on first use.
import encodings.idna  # noqa: F401
import grp
import json
import os
import pty
import pwd
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from adbproto import (A_AUTH, A_CNXN, A_OPEN, A_VERSION, MAX_PAYLOAD, RawClient, packet,
                      wait_closed)
from harness import (AdbServer, clean_env, free_port, resolve_oxadbd, setpriv, stop_process,
                     trust_key)

AUTH_TOKEN = 1


# --- unprivileged users -------------------------------------------------------

def _uids_in_use() -> set[int]:
    used = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith(("Uid:", "Gid:")):
                    used.update(int(x) for x in line.split()[1:])
        except OSError:
            pass  # the process exited while we looked
    return used


def _processes_of(uid: int) -> list[int]:
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Uid:") and int(line.split()[1]) == uid:
                    pids.append(int(status.parent.name))
        except (OSError, ValueError):
            pass
    return pids


@pytest.fixture(scope="module")
def users():
    """Two (uid, gid) pairs no account, group or process uses."""
    if os.geteuid() != 0:
        pytest.fail("test_local_users.py acts as other users: it must run as root "
                    "(./scripts/test.sh runs the suite as root)")
    for tool in ("setpriv",):
        if shutil.which(tool) is None:
            pytest.fail(f"`{tool}` is missing (Debian package util-linux)")
    used = _uids_in_use()
    start = 59000 + os.getpid() % 900
    free = [u for u in range(start, start + 200) if u not in used][:2]
    assert len(free) == 2, f"no two unused uids in {start}..{start + 200}"
    made = [(u, u) for u in free]
    yield made
    # Only processes of these uids are ours: an adb server that outlived
    # `kill-server` is ended by its pid.
    for uid, _ in made:
        for pid in _processes_of(uid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def user_dir():
    """Factory: a fresh /tmp directory owned by a user; removed at teardown."""
    made: list[Path] = []

    def make(user: tuple[int, int]) -> Path:
        d = Path(tempfile.mkdtemp(prefix="oxadb-local-user-"))
        os.chown(d, *user)
        made.append(d)
        return d

    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def as_user(user: tuple[int, int], fn, *args):
    """Runs fn(*args) in a forked child that dropped to `user`; returns its
    JSON-serializable result, or raises with the child's error."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            signal.alarm(60)
            os.setgroups([])
            os.setresgid(user[1], user[1], user[1])
            os.setresuid(user[0], user[0], user[0])
            assert (os.geteuid(), os.getuid()) == (user[0], user[0])
            result = {"ok": fn(*args)}
        except BaseException as e:  # report everything to the parent
            result = {"error": f"{type(e).__name__}: {e}"}
        try:
            data = json.dumps(result).encode()
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    result = json.loads(data or b'{"error": "the child died without a word"}')
    if "error" in result:
        raise AssertionError(f"as uid {user[0]}: {result['error']}")
    return result["ok"]


@contextlib.contextmanager
def user_adb(adb_bin: str, workdir: Path, user: tuple[int, int]):
    """An adb server started by `user`, with its HOME under `workdir`."""
    srv = AdbServer(adb_bin, workdir / "adb", user=user)
    try:
        srv.start()
        yield srv
    finally:
        srv.kill()


# --- probes -------------------------------------------------------------------

def cnxn_then_open(host: str, port: int, service: str) -> dict:
    """CNXN, the daemon's first answer, then OPEN `service`: what happened."""
    c = RawClient(port, host=host)
    try:
        c.send(A_CNXN, A_VERSION, MAX_PAYLOAD, b"host::\0")
        p = c.recv()
        out = {"command": p.command, "arg0": p.arg0, "len": len(p.data)}
        c.send(A_OPEN, 1, 0, service.encode() + b"\0")
        try:
            out["after_open"] = wait_closed(c.sock)
        except TimeoutError:
            out["after_open"] = "still open"
        return out
    finally:
        c.close()


def send_and_hang_up(host: str, port: int, service: str) -> int:
    """CNXN and OPEN at once, then close before any answer; returns the
    client's port."""
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(packet(A_CNXN, A_VERSION, MAX_PAYLOAD, b"host::\0")
                  + packet(A_OPEN, 1, 0, service.encode() + b"\0"))
        return s.getsockname()[1]


def proc_tcp_entry(local_port: int, remote_port: int) -> tuple[int, int] | None:
    """(state, uid) of the 127.0.0.1 socket with these ports in /proc/net/tcp."""
    lo = f"{int.from_bytes(socket.inet_aton('127.0.0.1'), 'little'):08X}"
    want = (f"{lo}:{local_port:04X}", f"{lo}:{remote_port:04X}")
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if (f[1], f[2]) == want:
            return int(f[3], 16), int(f[7])
    return None


def assert_refused_raw(d, user, marker: Path) -> None:
    got = as_user(user, cnxn_then_open, d.connect_host, d.port, f"shell:touch {marker}")
    assert (got["command"], got["arg0"], got["len"]) == (A_AUTH, AUTH_TOKEN, 20), got
    assert got["after_open"] in ("eof", "reset"), got
    assert d.wait_for_log(lambda l: "OPEN before authentication" in l, timeout=10), \
        "the daemon did not log the refused OPEN"
    assert not marker.exists(), "an unauthenticated OPEN ran"


def assert_root_raw_gets_in(d) -> None:
    c = RawClient(d.port, host=d.connect_host)
    try:
        c.connect()
        assert c.run_service("exec:id -u") == b"0\n"
    finally:
        c.close()


def assert_unauthorized_adb(srv: AdbServer, d, uid: int) -> None:
    r = srv.run("connect", d.serial, timeout=20)
    assert f"failed to authenticate to {d.serial}" in r.out, r
    srv.wait_state(d.serial, "unauthorized")
    r = srv.run("shell", "echo leaked", serial=d.serial, timeout=20)
    assert r.rc != 0 and "unauthorized" in r.both and "leaked" not in r.out, r
    assert d.wait_for_log(
        lambda l: "connection accepted" in l
        and f"key required: loopback peer owned by uid {uid}" in l, timeout=10), \
        f"the daemon did not log uid {uid} as needing a key"


def assert_device(srv: AdbServer, d, want_uid: int) -> None:
    srv.connect(d.serial)
    r = srv.run("shell", "id -u", serial=d.serial, timeout=20)
    assert r.rc == 0 and r.out == f"{want_uid}\n", r
    srv.disconnect(d.serial)


# --- tests --------------------------------------------------------------------

def test_an_unprivileged_users_adb_is_unauthorized_and_roots_is_not(
        adb_bin, adb_server, fresh_daemon, users, user_dir):
    user = users[0]
    home = user_dir(user)
    d = fresh_daemon("default", args=("--keys", str(home / "adb_keys")))
    line = d.wait_for_log(lambda l: "listening on" in l)
    assert "loopback peers owned by root: no key needed; others: key required" in line, line
    assert "oxadbd trust-key ~/.android/adbkey.pub" in line, line
    with user_adb(adb_bin, home, user) as srv:
        assert_unauthorized_adb(srv, d, user[0])
    # Root's own adb server: in without a key, with a root shell.
    assert_device(adb_server, d, 0)
    assert d.wait_for_log(
        lambda l: "connection accepted" in l and "no key needed: loopback peer owned by uid 0" in l)


def test_an_unprivileged_raw_client_gets_a_token_and_no_stream(fresh_daemon, users, user_dir):
    user = users[0]
    home = user_dir(user)
    d = fresh_daemon("raw", args=("--keys", str(home / "adb_keys")))
    assert_refused_raw(d, user, home / "ran-without-a-key")
    assert_root_raw_gets_in(d)


def test_a_peer_that_hung_up_before_the_lookup_is_not_taken_for_root(
        fresh_daemon, users, user_dir):
    # A closed socket lingers as a TIME_WAIT entry (FIN_WAIT2 at first),
    # which the kernel reports as root's: the daemon must not read that as a
    # root peer and run what the peer sent before hanging up. The daemon is
    # stopped until the kernel lists the user's socket that way.
    user = users[0]
    home = user_dir(user)
    marker = home / "ran-as-root"
    d = fresh_daemon("stopped", args=("--keys", str(home / "adb_keys")))
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        client_port = as_user(user, send_and_hang_up, d.connect_host, d.port,
                              f"shell:touch {marker}")
        deadline = time.monotonic() + 10
        entry = proc_tcp_entry(client_port, d.port)
        while entry is None or entry[1] != 0:
            assert time.monotonic() < deadline, \
                f"the kernel never listed the hung-up socket as root's: (state, uid) {entry}"
            time.sleep(0.05)
            entry = proc_tcp_entry(client_port, d.port)
        assert entry[0] in (5, 6), f"not FIN_WAIT2 or TIME_WAIT: {entry}"
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    line = d.wait_for_log(lambda l: "connection accepted" in l, timeout=10)
    assert line and "key required" in line, line
    assert "no longer established" in line or "lists no socket" in line, line
    assert d.wait_for_log(lambda l: "OPEN before authentication" in l
                          or "connection closed" in l or "closing connection" in l, timeout=10)
    time.sleep(0.5)
    assert not marker.exists(), "the hung-up peer's OPEN ran"
    assert d.alive()


def test_a_daemon_run_by_a_user_lets_that_user_and_root_in(
        adb_bin, adb_server, fresh_daemon, users, user_dir):
    owner, other = users
    owner_home = user_dir(owner)
    other_home = user_dir(other)
    # HOME: the shell starts there, and the uid has no passwd entry to name one.
    d = fresh_daemon("as-user", args=("--keys", str(owner_home / "adb_keys")),
                     prefix=setpriv(*owner), env={"HOME": str(owner_home)})
    line = d.wait_for_log(lambda l: "listening on" in l)
    assert f"loopback peers owned by root or uid {owner[0]}: no key needed" in line, line
    with user_adb(adb_bin, owner_home, owner) as srv:
        assert_device(srv, d, owner[0])
    # Root is trusted by the rule too (it can become any user).
    assert_device(adb_server, d, owner[0])
    # Anyone else is not.
    assert_refused_raw(d, other, other_home / "ran-without-a-key")


def test_trust_local_users_lets_every_local_user_in_and_warns(
        adb_bin, fresh_daemon, users, user_dir):
    user = users[0]
    home = user_dir(user)
    d = fresh_daemon("trusting", args=("--trust-local-users", "--keys", str(home / "adb_keys")))
    line = d.wait_for_log(lambda l: "WARN" in l and "--trust-local-users" in l)
    assert line and "WITHOUT a key" in line, d.log_since(0)
    with user_adb(adb_bin, home, user) as srv:
        assert_device(srv, d, 0)
    assert d.wait_for_log(lambda l: "no key needed: loopback peer (--trust-local-users)" in l)


def test_a_key_trusted_with_trust_key_lets_the_user_in(
        adb_bin, fresh_daemon, users, user_dir, tmp_path):
    user = users[0]
    home = user_dir(user)
    keys = tmp_path / "etc" / "adb_keys"
    d = fresh_daemon("keyed", args=("--keys", str(keys)))
    with user_adb(adb_bin, home, user) as srv:
        assert_unauthorized_adb(srv, d, user[0])
        pub = srv.home / ".android" / "adbkey.pub"
        assert pub.exists(), "adb made no key in the user's HOME"
        trust_key(pub, keys)
        srv.disconnect(d.serial)
        srv.connect(d.serial)
        r = srv.run("shell", "echo with-a-key; id -u", serial=d.serial, timeout=20)
        assert r.rc == 0 and r.out == "with-a-key\n0\n", r
    assert d.wait_for_log(lambda l: "host authenticated" in l)


@pytest.mark.parametrize("host", ["::1", "::ffff:127.0.0.1"])
def test_ipv6_and_mapped_loopback_behave_the_same(
        adb_bin, adb_server, fresh_daemon, users, user_dir, host):
    # ::1 must exist (free_port binds it and fails loudly otherwise); a
    # listener on ::ffff:127.0.0.1 sees IPv4 clients as mapped addresses.
    user = users[0]
    home = user_dir(user)
    d = fresh_daemon("v6", args=("--keys", str(home / "adb_keys")), host=host)
    with user_adb(adb_bin, home, user) as srv:
        assert_unauthorized_adb(srv, d, user[0])
    assert_refused_raw(d, user, home / "ran-without-a-key")
    assert_device(adb_server, d, 0)
    assert_root_raw_gets_in(d)


def refused_start(tmp_path, *args: str) -> list[str]:
    """Starts oxadbd with `args`, which must make it exit with status 1;
    returns its stderr lines."""
    cp = subprocess.run([str(resolve_oxadbd()), *args],
                        stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                        env=clean_env(), cwd=str(tmp_path))
    err = cp.stderr.decode("utf-8", "replace")
    assert cp.returncode == 1, (cp.returncode, err)
    return err.splitlines()


def test_keys_with_no_auth_is_refused_in_one_line(tmp_path):
    err = refused_start(tmp_path, "--listen", "127.0.0.1:0", "--no-auth",
                        "--keys", str(tmp_path / "adb_keys"))
    assert err == [
        "oxadbd: error: --keys cannot be used with --no-auth: no host is asked for a key, "
        "so the keys file is never read; drop one of them"], err


def test_a_port_in_use_ends_the_daemon_with_one_line_and_status_1(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = refused_start(tmp_path, "--listen", f"127.0.0.1:{port}",
                            "--keys", str(tmp_path / "adb_keys"))
    assert err == [
        f"oxadbd: error: listening on 127.0.0.1:{port}: Address already in use (os error 98)"
    ], err


def _start_logging_to(stderr, tmp_path: Path, port: int) -> subprocess.Popen:
    env = clean_env(RUST_LOG="debug")
    env.pop("NO_COLOR")  # colour must depend on the terminal, not on NO_COLOR
    return subprocess.Popen([str(resolve_oxadbd()), "--listen", f"127.0.0.1:{port}",
                             "--keys", str(tmp_path / "adb_keys")],
                            stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                            env=env, cwd=str(tmp_path))


def test_a_log_file_has_no_colour_codes_and_a_terminal_does(tmp_path):
    port = free_port()
    log = tmp_path / "oxadbd.log"
    with open(log, "wb") as out:
        proc = _start_logging_to(out, tmp_path, port)
    try:
        deadline = time.monotonic() + 20
        while f"listening on 127.0.0.1:{port}".encode() not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_bytes()
            time.sleep(0.05)
        # A connection adds spans and fields, which are coloured too on a terminal.
        c = RawClient(port)
        c.connect()
        c.close()
        deadline = time.monotonic() + 10
        while b"connection closed" not in log.read_bytes():
            assert time.monotonic() < deadline, log.read_bytes()
            time.sleep(0.05)
    finally:
        stop_process(proc)
    text = log.read_bytes()
    assert b"connection accepted" in text and b"\x1b" not in text, text[:2000]

    # The same daemon with stderr on a terminal: coloured.
    port = free_port()
    master, slave = pty.openpty()
    try:
        proc = _start_logging_to(slave, tmp_path, port)
        os.close(slave)
        slave = -1
        seen = b""
        deadline = time.monotonic() + 20
        try:
            while b"listening on" not in seen:
                assert time.monotonic() < deadline, seen
                ready, _, _ = select.select([master], [], [], 0.5)
                if ready:
                    seen += os.read(master, 65536)
        finally:
            stop_process(proc)
        assert b"\x1b[" in seen, seen
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
