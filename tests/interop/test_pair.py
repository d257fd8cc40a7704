"""Wireless-debugging pairing: `oxadbd pair` against Google adb 34's
`adb pair` (BoringSSL's SPAKE2 and TLS 1.3, AOSP pairing_connection/) and
against `oxadb pair`.

`oxadbd pair` prints a random code and its address; the host that proves the
code gets its key appended to the keys file (and to KEYS.paired). Wrong codes
are delayed (--failure-delay) and the window closes after --max-failures.
Once paired, adb 34 and oxadb each run shell and a 16 MiB push and pull by
sha256 over TLS against `--tls required` (the marker check through a
recording relay, as in test_tls.py). adb 29 has no `adb pair`, so the adb
peer here is adb 34 (test_adb34.py's fixture installs and checks it).
"""

from __future__ import annotations

import os
import secrets
import selectors
import socket
import subprocess
import time
from pathlib import Path

import pytest

from harness import AdbServer, clean_env, resolve_oxadb, sha256_file, stop_process, write_random
from test_adb34 import adb34_bin  # noqa: F401  (fixture)
from test_tls import Relay

MIB = 1 << 20
SIZE = 16 * MIB

FAILURE_DELAY = 1.5


class PairWindow:
    """One `oxadbd pair` process on a loopback port, its three lines read."""

    def __init__(self, exe: Path, workdir: Path, *args: str):
        workdir.mkdir(parents=True, exist_ok=True)
        self.keys = workdir / "keys" / "adb_keys"
        self.proc = subprocess.Popen(
            [str(exe), "pair", "--listen", "127.0.0.1:0", "--keys", str(self.keys),
             "--guid", "adb-test-0xpair", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=clean_env(RUST_LOG="info"), cwd=str(workdir))
        self._buf = b""
        self.lines = [self._line(20) for _ in range(3)]
        assert self.lines[0].startswith("pairing code: "), self.lines
        self.code = self.lines[0].removeprefix("pairing code: ")
        assert len(self.code) == 6 and self.code.isdigit(), self.lines
        assert self.lines[1].startswith("pairing address: 127.0.0.1:"), self.lines
        self.address = self.lines[1].removeprefix("pairing address: ")
        assert self.lines[2] == f"WIFI:T:ADB;S:adb-test-0xpair;P:{self.code};;", self.lines

    def _line(self, timeout: float) -> str:
        # Each line must arrive on its own, flushed: read the pipe's fd with
        # a deadline (no buffered reader that could hold later lines).
        while b"\n" not in self._buf:
            sel = selectors.DefaultSelector()
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            chunk = os.read(self.proc.stdout.fileno(), 4096) if sel.select(timeout) else b""
            sel.close()
            if not chunk:
                stop_process(self.proc)
                raise AssertionError(f"oxadbd pair printed no line within {timeout}s: "
                                     f"{self.proc.stderr.read()!r}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    @property
    def wrong_code(self) -> str:
        return f"{(int(self.code) + 1) % 1_000_000:06d}"

    def finish(self, timeout: float = 30) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_process(self.proc)
            raise AssertionError(f"oxadbd pair did not exit within {timeout}s") from None
        return self.proc.returncode, (self._buf + out).decode(), err.decode()

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def pair_window(oxadbd_bin, tmp_path):
    made: list[PairWindow] = []

    def make(*args: str) -> PairWindow:
        w = PairWindow(oxadbd_bin, tmp_path / f"pair{len(made)}", *args)
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop()


@pytest.fixture
def adb34(adb34_bin, tmp_path):  # noqa: F811
    srv = AdbServer(adb34_bin, tmp_path / "adb34")
    srv.start()
    yield srv
    srv.kill()


def key_of(pub_line: str) -> str:
    return pub_line.split()[0]


def test_adb34_pairs_and_connects(pair_window, adb34, fresh_daemon, tmp_path):
    w = pair_window("--max-failures", "1")
    # A peer that does not speak TLS closes only its own connection and is
    # no guess: with a limit of one failure, the window stays open.
    host, port = w.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as junk:
        junk.sendall(b"GET / HTTP/1.0\r\n\r\n")
        junk.settimeout(10)
        # The daemon ends this connection (an alert, then EOF).
        while junk.recv(4096):
            pass
    r = adb34.run("pair", w.address, w.code)
    assert r.rc == 0, r
    assert f"Successfully paired to {w.address} [guid=adb-test-0xpair]" in r.out, r
    rc, out, err = w.finish()
    assert rc == 0, (out, err)
    assert f"key added to {w.keys}" in out, out
    assert "pairing attempt failed" in err and "TLS handshake" in err, err
    host_key = key_of((adb34.home / ".android" / "adbkey.pub").read_text())
    assert [key_of(line) for line in w.keys.read_text().splitlines()] == [host_key]
    paired = w.keys.with_name("adb_keys.paired").read_text().splitlines()
    assert [key_of(line) for line in paired] == [host_key]

    # The paired key lets that host in over TLS where TLS is required (the
    # default beyond loopback once a host is paired; asked for here, since
    # loopback stays plaintext by default). A relay records every byte: a
    # marker sent through the shell never crosses in the clear after STLS.
    d = fresh_daemon(args=("--auth", "--keys", str(w.keys), "--tls", "required"))
    relay = Relay(d.port)
    serial = f"127.0.0.1:{relay.port}"
    marker = f"OXADB-PAIRED-MARKER-{secrets.token_hex(8)}"
    try:
        adb34.connect(serial)
        r = adb34.run("shell", "echo", marker, serial=serial)
        assert (r.rc, r.out) == (0, marker + "\n"), r
        src = tmp_path / "src.bin"
        digest = write_random(src, SIZE)
        remote = tmp_path / "remote.bin"
        r = adb34.run("push", str(src), str(remote), serial=serial)
        assert r.rc == 0, r
        assert sha256_file(remote) == digest
        back = tmp_path / "back.bin"
        r = adb34.run("pull", str(remote), str(back), serial=serial)
        assert r.rc == 0, r
        assert sha256_file(back) == digest
        adb34.disconnect(serial)
        text = d.log_since(0).decode("utf-8", "replace")
        assert text.count("TLS 1.3 established") == 1, text[-3000:]
        assert "host authenticated" not in text, text[-3000:]
        captured = relay.captured()
        stls = captured.find(b"STLS")
        assert stls >= 0 and b"\x16\x03" in captured[stls:], captured[:2000]
        assert marker.encode() not in captured, "the marker crossed in the clear"
    finally:
        relay.close()


def assert_refused(r) -> None:
    """adb 34's server answers a failed pairing with FAIL after OKAY
    (services.cpp pair_service), which its client misreads: it exits 1 with
    "protocol fault (couldn't read status message)" rather than the
    "Failed: Wrong password..." text."""
    assert r.rc != 0, r
    assert "Successfully" not in r.both, r


def test_adb34_wrong_codes_are_delayed_then_close_the_window(pair_window, adb34):
    w = pair_window("--max-failures", "3", "--failure-delay", str(FAILURE_DELAY))
    r = adb34.run("pair", w.address, w.wrong_code)
    assert_refused(r)
    # The next attempt waits out the delay before its handshake.
    started = time.monotonic()
    r = adb34.run("pair", w.address, w.wrong_code)
    took = time.monotonic() - started
    assert_refused(r)
    assert took >= FAILURE_DELAY * 0.9, f"second attempt took {took:.2f}s"
    # Even the right code is refused once the limit is reached.
    r = adb34.run("pair", w.address, w.wrong_code)
    assert_refused(r)
    rc, out, err = w.finish()
    assert rc != 0, (out, err)
    assert out.count("wrong pairing code from 127.0.0.1:") == 2, out
    assert "pairing closed: 3 wrong codes" in out, out
    assert "pairing window closed after 3 wrong codes" in err, err
    assert not w.keys.exists()
    # The window is closed: the right code finds no listener.
    r = adb34.run("pair", w.address, w.code)
    assert_refused(r)


def test_window_times_out(pair_window):
    w = pair_window("--timeout", "1")
    rc, out, err = w.finish(timeout=20)
    assert rc != 0
    assert "pairing window closed after 1 s without a pairing" in err, err
    assert not w.keys.exists()


def run_oxadb(home: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(resolve_oxadb()), *args], input=input,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=clean_env(HOME=str(home)), timeout=60)


def test_oxadb_pairs_then_works_over_tls(pair_window, fresh_daemon, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    w = pair_window()
    # No code on the command line: asked for on stdin, as adb does.
    r = run_oxadb(home, "pair", w.address, input=f"{w.code}\n".encode())
    assert r.returncode == 0, r
    assert f"Successfully paired to {w.address} [guid=adb-test-0xpair]" in r.stdout.decode(), r
    # Recorded as adb records it (AdbKnownHosts { HostInfo { guid } }), so
    # that a host server connects the device when it sees it over mDNS.
    guid = b"adb-test-0xpair"
    known = (home / ".android" / "adb_known_hosts.pb").read_bytes()
    assert known == bytes([0x0a, len(guid) + 2, 0x0a, len(guid)]) + guid, known
    rc, out, err = w.finish()
    assert rc == 0, (out, err)
    host_key = key_of((home / ".android" / "adbkey.pub").read_text())
    assert [key_of(line) for line in w.keys.read_text().splitlines()] == [host_key]

    # Paired, oxadb works over TLS against a daemon that requires it.
    d = fresh_daemon(args=("--auth", "--keys", str(w.keys), "--tls", "required"))
    r = run_oxadb(home, "-s", d.serial, "shell", "echo via oxadb")
    assert (r.returncode, r.stdout) == (0, b"via oxadb\n"), r
    src = tmp_path / "src.bin"
    digest = write_random(src, SIZE)
    remote = tmp_path / "remote.bin"
    r = run_oxadb(home, "-s", d.serial, "push", str(src), str(remote))
    assert r.returncode == 0, r
    assert sha256_file(remote) == digest
    back = tmp_path / "back.bin"
    r = run_oxadb(home, "-s", d.serial, "pull", str(remote), str(back))
    assert r.returncode == 0, r
    assert sha256_file(back) == digest
    text = d.log_since(0).decode("utf-8", "replace")
    assert text.count("TLS 1.3 established") == 3, text[-3000:]


def test_oxadb_wrong_code_is_one_line(pair_window, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    w = pair_window("--failure-delay", "0")
    r = run_oxadb(home, "pair", w.address, w.wrong_code)
    err = r.stderr.decode()
    assert r.returncode != 0, r
    assert err.count("\n") == 1, err
    assert f"pairing with {w.address}" in err and "wrong pairing code" in err, err
    w.stop()
    assert not w.keys.exists()
