"""STLS: TLS 1.3 on TCP connections (`oxadbd --tls`), against Google adb 34
(which answers STLS), adb 29 (which cannot) and oxadb.

  * adb 34 whose key `oxadbd trust-key` added (no pairing: the daemon checks
    the certificate's key against the keys file, as adbd does) connects to
    `--tls required`; the daemon logs TLS; shell and a 16 MiB push and pull
    work;
  * a relay between adb 34 and the daemon records every byte both ways: a
    marker sent with `adb shell echo MARKER` never crosses in the clear
    after STLS, while with `--tls off` it does (the capture works);
  * adb 29 is refused by `--tls required` (the log says why) and served in
    plaintext by `--tls on` (the log says so);
  * adb 34 with a key the daemon does not know is refused;
  * oxadb speaks TLS to `--tls required`: shell, push and pull.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from harness import (REPO, AdbServer, clean_env, free_port, resolve_oxadb, sha256_file,
                     trust_key, write_random)

ADB34_VERSION = "34.0.5"
MIB = 1 << 20
SIZE = 16 * MIB
STLS = b"STLS"


@pytest.fixture(scope="module")
def adb34_bin() -> str:
    adb = Path(os.environ.get("OXADB_ADB34") or REPO / "target" / "peers" / "adb-34" / "adb")
    if not adb.exists():
        pytest.fail(f"Google adb {ADB34_VERSION} is not installed at {adb}: ./scripts/test.sh "
                    f"installs it (scripts/install-adb34.sh target/peers/adb-34)")
    return str(adb)


@pytest.fixture(scope="module")
def adb34(adb34_bin, tmp_path_factory):
    srv = AdbServer(adb34_bin, tmp_path_factory.mktemp("adb34tls"))
    srv.start()
    yield srv
    srv.kill()


def tls_daemon(fresh_daemon, tmp_path: Path, mode: str, trusted: list[Path], name="tls"):
    """A daemon that asks every host for a key (`--auth`, so loopback is no
    exception) with `--tls MODE` and the given adbkey.pub files trusted."""
    keys = tmp_path / f"etc-{name}" / "adb_keys"
    for pub in trusted:
        trust_key(pub, keys)
    return fresh_daemon(name=name, args=("--auth", "--keys", str(keys), "--tls", mode))


def adb_pub(srv: AdbServer) -> Path:
    pub = srv.home / ".android" / "adbkey.pub"
    assert pub.exists(), f"adb start-server made no key at {pub}"
    return pub


class Relay:
    """A TCP relay on loopback that records every byte both ways."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.to_device = bytearray()
        self.to_host = bytearray()
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, self.to_device),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.to_host),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bytearray):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self.lock:
                    record += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def captured(self) -> bytes:
        with self.lock:
            return bytes(self.to_device) + b"\n--\n" + bytes(self.to_host)

    def close(self):
        self.listener.close()
        for s in self.sockets:
            s.close()


def test_adb34_shell_push_pull_over_tls_required(adb34, fresh_daemon, tmp_path):
    d = tls_daemon(fresh_daemon, tmp_path, "required", [adb_pub(adb34)])
    adb34.connect(d.serial)
    try:
        assert d.wait_for_log(lambda t: "TLS 1.3 established" in t, timeout=10), \
            d.log_since(0)[-3000:]
        r = adb34.run("shell", "echo out; echo err >&2; exit 3", serial=d.serial)
        assert (r.rc, r.out, r.err) == (3, "out\n", "err\n"), r
        src = tmp_path / "src.bin"
        digest = write_random(src, SIZE)
        remote = tmp_path / "remote.bin"
        r = adb34.run("push", str(src), str(remote), serial=d.serial)
        assert r.rc == 0, r
        assert sha256_file(remote) == digest
        back = tmp_path / "back.bin"
        r = adb34.run("pull", str(remote), str(back), serial=d.serial)
        assert r.rc == 0, r
        assert sha256_file(back) == digest
        # One connection, and it was the TLS one: nothing fell back to AUTH.
        text = d.log_since(0).decode("utf-8", "replace")
        assert text.count("TLS 1.3 established") == 1, text[-3000:]
        assert "host authenticated" not in text, text[-3000:]
    finally:
        adb34.disconnect(d.serial)


@pytest.mark.parametrize("mode", ["required", "off"])
def test_marker_never_crosses_in_the_clear_after_stls(mode, adb34, fresh_daemon, tmp_path):
    d = tls_daemon(fresh_daemon, tmp_path, mode, [adb_pub(adb34)], name=f"cap-{mode}")
    relay = Relay(d.port)
    serial = f"127.0.0.1:{relay.port}"
    marker = f"OXADB-TLS-MARKER-{secrets.token_hex(8)}"
    try:
        adb34.connect(serial)
        r = adb34.run("shell", "echo", marker, serial=serial)
        assert r.rc == 0 and r.out == marker + "\n", r
        adb34.disconnect(serial)
        captured = relay.captured()
        if mode == "off":
            # The capture sees plaintext: the shell command and its output.
            assert captured.count(marker.encode()) >= 2, captured[:2000]
            assert STLS not in captured
        else:
            stls = captured.find(STLS)
            assert stls >= 0, captured[:2000]
            # A TLS record (handshake, content type 22) follows STLS.
            assert b"\x16\x03" in captured[stls:], captured[:2000]
            assert marker.encode() not in captured, "marker crossed in the clear"
            assert b"TERM=xterm" not in captured, "the service name crossed in the clear"
    finally:
        relay.close()


def test_adb29_refused_by_required_and_plaintext_with_on(adb_bin, fresh_daemon, tmp_path):
    srv = AdbServer(adb_bin, tmp_path / "adb29")
    try:
        srv.start()
        pub = adb_pub(srv)
        d = tls_daemon(fresh_daemon, tmp_path, "required", [pub], name="req")
        srv.run("connect", d.serial, timeout=20)
        line = d.wait_for_log(
            lambda t: "TLS is required (--tls required) and the host cannot do it" in t,
            timeout=10)
        assert line and "closing connection" in line, d.log_since(0)[-3000:]
        r = srv.run("shell", "echo hi", serial=d.serial, timeout=20)
        assert r.rc != 0, r
        assert b"TLS 1.3 established" not in d.log_since(0)
        srv.disconnect(d.serial)

        d = tls_daemon(fresh_daemon, tmp_path, "on", [pub], name="on")
        srv.connect(d.serial)
        r = srv.run("shell", "echo hi", serial=d.serial, timeout=20)
        assert r.rc == 0 and r.out.strip() == "hi", r
        text = d.log_since(0).decode("utf-8", "replace")
        assert "host gets plaintext (--tls on)" in text, text[-3000:]
        assert "host authenticated" in text, text[-3000:]
        assert "TLS 1.3 established" not in text
        srv.disconnect(d.serial)
    finally:
        srv.kill()


def test_adb34_with_an_unknown_key_is_refused(adb34_bin, adb34, fresh_daemon, tmp_path):
    # The daemon trusts the module's adb 34 key, not this server's.
    d = tls_daemon(fresh_daemon, tmp_path, "required", [adb_pub(adb34)], name="unknown")
    srv = AdbServer(adb34_bin, tmp_path / "stranger")
    try:
        srv.start()
        srv.run("connect", d.serial, timeout=20)
        line = d.wait_for_log(lambda t: "TLS handshake failed" in t, timeout=10)
        assert line and "RSA key is not in" in line, d.log_since(0)[-3000:]
        r = srv.run("shell", "echo hi", serial=d.serial, timeout=20)
        assert r.rc != 0, r
        assert b"TLS 1.3 established" not in d.log_since(0)
        srv.disconnect(d.serial)
    finally:
        srv.kill()


def run_oxadb(home: Path, serial: str, *args: str, timeout: float = 60.0):
    cp = subprocess.run([str(resolve_oxadb()), "-s", serial, *args], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, timeout=timeout, env=clean_env(HOME=str(home)))
    return cp.returncode, cp.stdout.decode("utf-8", "replace"), cp.stderr.decode(
        "utf-8", "replace")


def test_oxadb_shell_push_pull_over_tls_required(fresh_daemon, tmp_path):
    home = tmp_path / "home"
    (home / ".android").mkdir(parents=True)
    cp = subprocess.run([str(resolve_oxadb()), "keygen", str(home / ".android" / "adbkey")],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60,
                        env=clean_env(HOME=str(home)))
    assert cp.returncode == 0, cp.stdout
    d = tls_daemon(fresh_daemon, tmp_path, "required", [home / ".android" / "adbkey.pub"])
    rc, out, err = run_oxadb(home, d.serial, "shell", "echo via oxadb")
    assert (rc, out) == (0, "via oxadb\n"), err
    assert d.wait_for_log(lambda t: "TLS 1.3 established" in t, timeout=10)
    src = tmp_path / "src.bin"
    digest = write_random(src, SIZE)
    remote = tmp_path / "remote.bin"
    rc, out, err = run_oxadb(home, d.serial, "push", str(src), str(remote))
    assert rc == 0, err
    assert sha256_file(remote) == digest
    back = tmp_path / "back.bin"
    rc, out, err = run_oxadb(home, d.serial, "pull", str(remote), str(back))
    assert rc == 0, err
    assert sha256_file(back) == digest
    text = d.log_since(0).decode("utf-8", "replace")
    assert text.count("TLS 1.3 established") == 3, text[-3000:]
    assert "host authenticated" not in text and "closing connection" not in text, text[-3000:]

    # Another key: the daemon refuses its certificate, and oxadb says so.
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    rc, out, err = run_oxadb(stranger, d.serial, "shell", "echo hi")
    assert rc != 0, (rc, out, err)
    line = d.wait_for_log(lambda t: "RSA key is not in" in t, timeout=10)
    assert line and "TLS handshake failed" in line, d.log_since(0)[-3000:]
    assert "certificate" in err or "TLS" in err, err


def test_adb34_presents_the_key_the_daemon_hints_at(adb34_bin, fresh_daemon, tmp_path):
    """adb 34 with two keys presents its first one unless the device's CA
    list names another (AOSP tls/adb_ca_list.cpp): only the second is
    trusted here, so the connection works only if the daemon's hints do."""
    vendor = tmp_path / "vendor" / "adbkey"
    vendor.parent.mkdir()
    cp = subprocess.run([str(resolve_oxadb()), "keygen", str(vendor)], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, timeout=60)
    assert cp.returncode == 0, cp.stdout
    srv = AdbServer(adb34_bin, tmp_path / "two-keys")
    srv.env["ADB_VENDOR_KEYS"] = str(vendor)
    try:
        srv.start()
        d = tls_daemon(fresh_daemon, tmp_path, "required", [Path(str(vendor) + ".pub")],
                       name="hints")
        srv.connect(d.serial)
        r = srv.run("shell", "echo hinted", serial=d.serial)
        assert r.rc == 0 and r.out == "hinted\n", r
        text = d.log_since(0).decode("utf-8", "replace")
        assert "TLS 1.3 established" in text and "TLS handshake failed" not in text, \
            text[-3000:]
        srv.disconnect(d.serial)
    finally:
        srv.kill()
