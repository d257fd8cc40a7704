"""Host authentication (`oxadbd --auth`) against real clients and raw packets.

The last two tests run the daemon on 198.18.0.1 inside a network namespace
they create and remove (root is required, as for the emulated-link phase).

  * Google adb 29 with its own key (a fresh HOME), adb-shell (PyPI) with a key
    from its own keygen, and oxadb with its key are each refused by a daemon
    whose keys file lacks their key, and let in once `oxadbd trust-key` adds
    it (no daemon restart: the file is read at every attempt);
  * over raw packets: a signature by an untrusted key, a signature of an
    earlier token (on the same connection and on another one), a public key
    not in the file, a trusted public key offered without a signature, and
    streams opened before authentication are all refused;
  * `--accept-new-keys` trusts and records an offered key;
  * the daemon refuses to listen beyond loopback without authentication
    unless `--insecure` is given.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from adbproto import A_AUTH, A_CNXN, A_OPEN, A_VERSION, MAX_PAYLOAD, RawClient, wait_closed
from harness import AdbServer, clean_env, resolve_oxadb, resolve_oxadbd, trust_key

from adb_shell.adb_device import AdbDeviceTcp
from adb_shell.auth.keygen import keygen
from adb_shell.auth.sign_pythonrsa import PythonRSASigner

AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3


def auth_daemon(fresh_daemon, tmp_path: Path, *extra: str):
    keys = tmp_path / "etc" / "adb_keys"
    d = fresh_daemon(name="auth", args=("--auth", "--keys", str(keys), *extra))
    return d, keys


def make_signer(tmp_path: Path, name: str) -> tuple[PythonRSASigner, Path]:
    path = tmp_path / name / "adbkey"
    path.parent.mkdir(parents=True)
    keygen(str(path))
    return PythonRSASigner.FromRSAKeyPath(str(path)), Path(str(path) + ".pub")


def test_adb29_is_unauthorized_until_its_key_is_trusted(adb_bin, fresh_daemon, tmp_path):
    d, keys = auth_daemon(fresh_daemon, tmp_path)
    srv = AdbServer(adb_bin, tmp_path / "adb")
    try:
        srv.start()
        srv.run("connect", d.serial, timeout=20)
        srv.wait_state(d.serial, "unauthorized")
        r = srv.run("shell", "echo hi", serial=d.serial, timeout=20)
        assert r.rc != 0 and "unauthorized" in r.both, r
        assert d.wait_for_log(lambda t: "unauthorized host" in t, timeout=10), \
            "the daemon did not log the refused key"
        pub = srv.home / ".android" / "adbkey.pub"
        assert pub.exists(), "adb made no key in its fresh HOME"
        trust_key(pub, keys)
        srv.disconnect(d.serial)
        srv.connect(d.serial)
        r = srv.run("shell", "echo authorized; exit 3", serial=d.serial, timeout=20)
        assert r.rc == 3 and r.out.strip() == "authorized", r
        assert b"host authenticated" in d.log_since(0)
    finally:
        srv.kill()


def test_adb_shell_is_refused_until_its_key_is_trusted(fresh_daemon, tmp_path):
    d, keys = auth_daemon(fresh_daemon, tmp_path)
    signer, pub = make_signer(tmp_path, "adb-shell")
    refused = AdbDeviceTcp("127.0.0.1", d.port, default_transport_timeout_s=10.0)
    try:
        with pytest.raises(Exception):
            refused.connect(rsa_keys=[signer], auth_timeout_s=2.0)
        assert not refused.available
    finally:
        refused.close()
    trust_key(pub, keys)
    dev = AdbDeviceTcp("127.0.0.1", d.port, default_transport_timeout_s=10.0)
    try:
        assert dev.connect(rsa_keys=[signer], auth_timeout_s=10.0) is True
        assert dev.shell("echo via adb-shell") == "via adb-shell\n"
    finally:
        dev.close()


def run_oxadb(home: Path, serial: str, *args: str, timeout: float = 60.0):
    cp = subprocess.run([str(resolve_oxadb()), "-s", serial, *args], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, timeout=timeout, env=clean_env(HOME=str(home)))
    return cp.returncode, cp.stdout.decode("utf-8", "replace"), cp.stderr.decode(
        "utf-8", "replace")


def test_oxadb_is_unauthorized_until_its_key_is_trusted(fresh_daemon, tmp_path):
    d, keys = auth_daemon(fresh_daemon, tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    rc, out, err = run_oxadb(home, d.serial, "get-state")
    assert rc != 0 and "unauthorized" in err, (rc, out, err)
    trust_key(home / ".android" / "adbkey.pub", keys)
    rc, out, err = run_oxadb(home, d.serial, "shell", "echo via oxadb")
    assert (rc, out) == (0, "via oxadb\n"), err


def test_oxadb_keygen_makes_a_key_the_daemon_can_trust(fresh_daemon, tmp_path):
    d, keys = auth_daemon(fresh_daemon, tmp_path)
    key = tmp_path / "made" / "adbkey"
    key.parent.mkdir()
    cp = subprocess.run([str(resolve_oxadb()), "keygen", str(key)], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, timeout=60, env=clean_env())
    assert cp.returncode == 0, cp.stdout
    assert (key.stat().st_mode & 0o777) == 0o600
    again = subprocess.run([str(resolve_oxadb()), "keygen", str(key)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60, env=clean_env())
    assert again.returncode != 0 and str(key) in again.stdout.decode(), "overwrote a key"
    trust_key(Path(str(key) + ".pub"), keys)
    # The generated key is a real adb key: adb-shell signs with it.
    signer = PythonRSASigner.FromRSAKeyPath(str(key))
    dev = AdbDeviceTcp("127.0.0.1", d.port, default_transport_timeout_s=10.0)
    try:
        assert dev.connect(rsa_keys=[signer], auth_timeout_s=10.0) is True
        assert dev.shell("echo keygen") == "keygen\n"
    finally:
        dev.close()


def challenge(port: int) -> tuple[RawClient, bytes]:
    c = RawClient(port)
    c.send(A_CNXN, A_VERSION, MAX_PAYLOAD, b"host::\0")
    p = c.recv()
    assert (p.command, p.arg0, len(p.data)) == (A_AUTH, AUTH_TOKEN, 20), p
    return c, p.data


def next_token(c: RawClient, previous: bytes) -> bytes:
    p = c.recv(timeout=15)
    assert (p.command, p.arg0) == (A_AUTH, AUTH_TOKEN), f"expected a new token, got {p!r}"
    assert p.data != previous, "a token was reused"
    return p.data


def assert_silent(c: RawClient, seconds: float = 1.5) -> None:
    with pytest.raises(TimeoutError):
        p = c.recv(timeout=seconds)
        raise AssertionError(f"expected no answer, got {p!r}")


def test_wrong_replayed_and_untrusted_signatures_are_refused(fresh_daemon, tmp_path):
    d, keys = auth_daemon(fresh_daemon, tmp_path)
    trusted, trusted_pub = make_signer(tmp_path, "trusted")
    stranger, _ = make_signer(tmp_path, "stranger")
    trust_key(trusted_pub, keys)

    c, t1 = challenge(d.port)
    # A key not in the file.
    c.send(A_AUTH, AUTH_SIGNATURE, 0, stranger.Sign(t1))
    t2 = next_token(c, t1)
    # The trusted key, but signing the earlier token: a replay.
    c.send(A_AUTH, AUTH_SIGNATURE, 0, trusted.Sign(t1))
    t3 = next_token(c, t2)
    # Garbage of a signature's size.
    c.send(A_AUTH, AUTH_SIGNATURE, 0, os.urandom(256))
    t4 = next_token(c, t3)
    # Public keys: one not in the file, then the trusted one without proof.
    c.send(A_AUTH, AUTH_RSAPUBLICKEY, 0, stranger.GetPublicKey().encode() + b"\0")
    assert_silent(c)
    c.send(A_AUTH, AUTH_RSAPUBLICKEY, 0, trusted.GetPublicKey().encode() + b"\0")
    assert_silent(c)
    # The right signature of the current token lets the host in.
    c.send(A_AUTH, AUTH_SIGNATURE, 0, trusted.Sign(t4))
    p = c.recv()
    assert p.command == A_CNXN, p
    c.close()

    # A valid signature captured on one connection is worthless on another.
    a, ta = challenge(d.port)
    b, tb = challenge(d.port)
    captured = trusted.Sign(ta)
    b.send(A_AUTH, AUTH_SIGNATURE, 0, captured)
    next_token(b, tb)
    a.send(A_AUTH, AUTH_SIGNATURE, 0, captured)
    assert a.recv().command == A_CNXN
    a.close()
    b.close()
    log = d.log_since(0).decode("utf-8", "replace")
    assert log.count("AUTH signature matches no trusted key") >= 4, log[-3000:]
    assert "offered a trusted key without a valid signature" in log


def test_streams_before_authentication_are_refused(fresh_daemon, tmp_path):
    d, _keys = auth_daemon(fresh_daemon, tmp_path)
    # OPEN after CNXN, while the token is outstanding.
    c, _token = challenge(d.port)
    c.send(A_OPEN, 1, 0, b"shell:echo leaked\0")
    assert wait_closed(c.sock) in ("eof", "reset")
    c.close()
    # OPEN with no CNXN at all.
    raw = RawClient(d.port)
    raw.send(A_OPEN, 1, 0, b"shell:echo leaked\0")
    assert wait_closed(raw.sock) in ("eof", "reset")
    raw.close()
    # Each line is written once its connection is closed: wait, do not race.
    for why in ("OPEN before authentication", "OPEN before CNXN"):
        assert d.wait_for_log(lambda line: why in line, timeout=10), \
            d.log_since(0).decode("utf-8", "replace")[-3000:]
    log = d.log_since(0).decode("utf-8", "replace")
    assert "leaked" not in log
    assert d.alive()


def test_accept_new_keys_trusts_and_records_an_offered_key(fresh_daemon, tmp_path):
    d, keys = auth_daemon(fresh_daemon, tmp_path, "--accept-new-keys")
    signer, _ = make_signer(tmp_path, "newcomer")
    c, token = challenge(d.port)
    c.send(A_AUTH, AUTH_SIGNATURE, 0, signer.Sign(token))
    next_token(c, token)
    c.send(A_AUTH, AUTH_RSAPUBLICKEY, 0, signer.GetPublicKey().encode() + b"\0")
    assert c.recv().command == A_CNXN
    c.close()
    recorded = keys.read_text()
    assert signer.GetPublicKey().split()[0] in recorded
    assert b"--accept-new-keys" in d.log_since(0)
    # Recorded: the next connection signs its way in.
    c, token = challenge(d.port)
    c.send(A_AUTH, AUTH_SIGNATURE, 0, signer.Sign(token))
    assert c.recv().command == A_CNXN
    c.close()


def test_beyond_loopback_needs_auth_or_insecure(tmp_path):
    cp = subprocess.run([str(resolve_oxadbd()), "--listen", "198.18.0.1:5555", "--no-auth"],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30,
                        env=clean_env(), cwd=str(tmp_path))
    out = cp.stdout.decode("utf-8", "replace")
    assert cp.returncode != 0, out
    assert "refusing to listen on 198.18.0.1:5555 without authentication" in out, out
    assert "--insecure" in out, out


NETNS_PROBE = r"""
import socket, struct, sys
s = socket.create_connection(("198.18.0.1", 5555), timeout=10)
banner = b"host::\0"
cmd = 0x4E584E43
s.sendall(struct.pack("<6I", cmd, 0x01000001, 1 << 20, len(banner), sum(banner), cmd ^ 0xFFFFFFFF) + banner)
head = b""
while len(head) < 24:
    chunk = s.recv(24 - len(head))
    if not chunk:
        sys.exit("closed")
    head += chunk
print(hex(struct.unpack("<6I", head)[0]), struct.unpack("<6I", head)[1])
"""


@contextlib.contextmanager
def netns_daemon(tmp_path: Path, name: str, *args: str, keys: bool = True):
    """oxadbd on 198.18.0.1:5555 inside a namespace of its own (with a
    private keys file unless `keys` is false); yields the namespace and the
    log path, removes both."""
    ns = f"oxauth-{os.getpid()}-{name}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    log = tmp_path / f"{name}.log"
    proc = None
    try:
        for cmd in (["ip", "-n", ns, "link", "set", "lo", "up"],
                    ["ip", "-n", ns, "addr", "add", "198.18.0.1/24", "dev", "lo"]):
            subprocess.run(cmd, check=True, timeout=30)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, str(resolve_oxadbd()), "--listen", "198.18.0.1:5555",
                 *(("--keys", str(tmp_path / "adb_keys")) if keys else ()), *args],
                stdout=out, stderr=subprocess.STDOUT, env=clean_env(), cwd=str(tmp_path))
        deadline = time.monotonic() + 20
        while b"listening on 198.18.0.1:5555" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield ns, log
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        subprocess.run(["ip", "netns", "delete", ns], timeout=30)


def first_answer(ns: str) -> str:
    cp = subprocess.run(["ip", "netns", "exec", ns, "python3", "-c", NETNS_PROBE],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    return cp.stdout.decode("utf-8", "replace").strip()


def test_beyond_loopback_auth_is_on_by_default(tmp_path):
    with netns_daemon(tmp_path, "default") as (ns, log):
        # AUTH (0x48545541), TOKEN: no CNXN for a host without a key.
        assert first_answer(ns) == f"{hex(A_AUTH)} {AUTH_TOKEN}", log.read_text()
        assert "WITHOUT authentication" not in log.read_text()


def test_insecure_beyond_loopback_warns_at_start(tmp_path):
    # No keys file: with --insecure alone no host is asked for one, and
    # giving one anyway is refused.
    with netns_daemon(tmp_path, "insecure", "--insecure", keys=False) as (ns, log):
        assert first_answer(ns) == f"{hex(A_CNXN)} {A_VERSION}", log.read_text()
        text = log.read_text()
        assert "WARN" in text and "WITHOUT authentication" in text, text
