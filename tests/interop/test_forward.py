"""`adb forward`: host port -> daemon -> tcp:PORT / localfilesystem:PATH."""

import os
import socket
import time

import pytest

from echo import EchoServer, answer_to, roundtrip
from harness import free_port


@pytest.fixture
def tcp_echo():
    srv = EchoServer.tcp()
    yield srv
    srv.close()


@pytest.fixture
def unix_echo(tmp_path):
    srv = EchoServer.unix(str(tmp_path / "echo.sock"))
    yield srv
    srv.close()


def _forward(adb, local_port, remote):
    r = adb("forward", f"tcp:{local_port}", remote)
    assert r.rc == 0, r
    return r


def _forward_list(adb):
    r = adb("forward", "--list")
    assert r.rc == 0, r
    return r.out


def _remove(adb, local_port):
    r = adb("forward", "--remove", f"tcp:{local_port}")
    assert r.rc == 0, r


def _refused(port):
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_forward_tcp_echo(adb, tcp_echo):
    lp = free_port()
    _forward(adb, lp, f"tcp:{tcp_echo.port}")
    try:
        assert f"tcp:{lp} tcp:{tcp_echo.port}" in _forward_list(adb)
        assert roundtrip(lp, b"hello through adb\n") == b"hello through adb\n"
        # A second, independent connection through the same forward.
        assert roundtrip(lp, b"again") == b"again"
        assert tcp_echo.accepted == 2
    finally:
        _remove(adb, lp)
    assert f"tcp:{lp} " not in _forward_list(adb)
    assert _refused(lp)


def test_forward_tcp_1mib_roundtrip(adb, tcp_echo):
    lp = free_port()
    _forward(adb, lp, f"tcp:{tcp_echo.port}")
    try:
        payload = os.urandom(1 << 20)
        got = roundtrip(lp, payload, timeout=60)
        assert len(got) == len(payload)
        assert got == payload
    finally:
        _remove(adb, lp)


def test_forward_localfilesystem_echo(adb, unix_echo, tmp_path):
    lp = free_port()
    path = str(tmp_path / "echo.sock")
    _forward(adb, lp, f"localfilesystem:{path}")
    try:
        assert f"tcp:{lp} localfilesystem:{path}" in _forward_list(adb)
        assert roundtrip(lp, b"via unix socket") == b"via unix socket"
        payload = os.urandom(1 << 20)
        assert roundtrip(lp, payload, timeout=60) == payload
        assert unix_echo.accepted == 2
    finally:
        _remove(adb, lp)
    assert _refused(lp)


def test_forward_to_closed_port_closes_local_socket(adb):
    # Nothing listens on `dead`: the daemon refuses the stream and adb closes
    # our local connection; the device connection itself stays healthy.
    dead = free_port()
    lp = free_port()
    _forward(adb, lp, f"tcp:{dead}")
    try:
        assert answer_to(lp) == b""
    finally:
        _remove(adb, lp)
    r = adb("shell", "echo ok")
    assert r.stdout == b"ok\n", r


def test_forward_concurrent_connections(adb, tcp_echo):
    import threading

    lp = free_port()
    _forward(adb, lp, f"tcp:{tcp_echo.port}")
    try:
        payloads = [os.urandom(200_000 + i) for i in range(6)]
        results = [None] * len(payloads)
        errors = []

        def run(i):
            try:
                results[i] = roundtrip(lp, payloads[i], timeout=60)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(payloads))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        assert not errors, errors
        for i, p in enumerate(payloads):
            assert results[i] == p, f"connection {i} got wrong data"
    finally:
        _remove(adb, lp)
    # Give the daemon a moment and check nothing leaked into a broken state.
    time.sleep(0.1)
    r = adb("shell", "echo ok")
    assert r.stdout == b"ok\n", r
