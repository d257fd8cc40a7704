"""Hostile input on one connection closes that connection, and only that one.

For every case: a fresh daemon; an adb server connection and a raw, well
behaved client are set up BEFORE the hostile connection; after it the daemon
must have closed the hostile socket within a few seconds, logged at WARN a
line with `closing connection` and the reason, and both good connections
must still work.
"""

import socket
import time

import pytest

from adbproto import (A_CNXN, A_OPEN, A_VERSION, A_WRTE, MAX_PAYLOAD, RawClient, header,
                      packet, wait_closed)


def _bad_magic(c):
    c.sock.sendall(header(A_WRTE, 1, 1, b"", magic=0xDEADBEEF))


def _oversize(c):
    n = c.max_payload + 1
    c.sock.sendall(header(A_WRTE, 1, 1, b"", length=n))
    try:  # the daemon should close on the header alone; send the body anyway
        c.sock.settimeout(5)
        c.sock.sendall(b"\0" * n)
    except OSError:
        pass


def _unknown_command(c):
    c.sock.sendall(packet(0x5A5A5A5A, 0, 0))


def _open_before_cnxn(c):
    c.sock.sendall(packet(A_OPEN, 1, 0, b"exec:echo nope\0"))


def _wrte_unknown_stream(c):
    # A stream id the daemon never handed out (not merely one it closed: see
    # test_raw_protocol.py::test_late_packets_for_closed_stream_are_ignored).
    c.sock.sendall(packet(A_WRTE, 1, 0x7FFFFFF0, b"data for nobody"))


def _truncated_header(c):
    c.sock.sendall(packet(A_WRTE, 1, 1, b"xyz")[:10])
    c.sock.shutdown(socket.SHUT_WR)


def _truncated_payload(c):
    c.sock.sendall(header(A_WRTE, 1, 1, b"", length=100) + b"\0" * 50)
    c.sock.shutdown(socket.SHUT_WR)


# name -> (do CNXN first?, action, reason phrase in the WARN log line)
CASES = {
    "bad_magic": (True, _bad_magic, "bad magic"),
    "data_length_over_max": (True, _oversize, "exceeds max payload"),
    "unknown_command": (True, _unknown_command, "unknown command"),
    "open_before_cnxn": (False, _open_before_cnxn, "before CNXN"),
    "wrte_unknown_stream": (True, _wrte_unknown_stream, "unknown stream"),
    "truncated_header_then_eof": (True, _truncated_header, "truncated"),
    "truncated_payload_then_eof": (True, _truncated_payload, "truncated"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_input_closes_only_that_connection(case, adb_server, fresh_daemon):
    handshake, action, reason = CASES[case]
    d = fresh_daemon()
    adb_server.connect(d.serial)
    good = RawClient(d.port)
    bad = None
    try:
        good.connect()
        assert good.run_service("exec:echo before") == b"before\n"

        mark = d.log_size()
        bad = RawClient(d.port)
        if handshake:
            bad.connect()
        action(bad)
        how = wait_closed(bad.sock, timeout=5)
        assert how in ("eof", "reset")

        line = d.wait_for_log(
            lambda ln: "closing connection" in ln and reason in ln and "WARN" in ln,
            since=mark, timeout=5)
        assert line, (f"no WARN line with 'closing connection' and {reason!r} in the log:\n"
                      + d.log_since(mark).decode("utf-8", "replace"))

        # The daemon did not die and the other connections are unaffected.
        assert d.alive(), "daemon exited"
        assert good.run_service("exec:echo ok") == b"ok\n"
        r = adb_server.run("shell", "echo via adb", serial=d.serial)
        assert r.rc == 0 and r.stdout == b"via adb\n", r
        assert adb_server.devices().get(d.serial) == "device"
    finally:
        good.close()
        if bad:
            bad.close()
        adb_server.disconnect(d.serial)


def test_many_hostile_connections_in_a_row(fresh_daemon):
    """Every hostile case, back to back, against one daemon with one good client."""
    d = fresh_daemon()
    good = RawClient(d.port)
    try:
        good.connect()
        for _round in range(3):
            for name, (handshake, action, reason) in CASES.items():
                bad = RawClient(d.port)
                try:
                    if handshake:
                        bad.connect()
                    action(bad)
                    wait_closed(bad.sock, timeout=5)
                finally:
                    bad.close()
            assert good.run_service("exec:echo alive") == b"alive\n"
        assert d.alive()
    finally:
        good.close()


def test_garbage_before_handshake(fresh_daemon):
    d = fresh_daemon()
    good = RawClient(d.port)
    try:
        good.connect()
        s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
        try:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_closed(s, timeout=5)
        finally:
            s.close()
        assert good.run_service("exec:echo ok") == b"ok\n"
    finally:
        good.close()


def test_silent_connection_does_not_block_others(fresh_daemon):
    # A client that connects and sends nothing must not stall other clients.
    d = fresh_daemon()
    idle = [socket.create_connection(("127.0.0.1", d.port), timeout=5) for _ in range(5)]
    try:
        c = RawClient(d.port)
        try:
            t = time.monotonic()
            c.connect()
            assert c.run_service("exec:echo ok") == b"ok\n"
            assert time.monotonic() - t < 10
        finally:
            c.close()
    finally:
        for s in idle:
            s.close()


def test_cnxn_with_small_max_payload_is_respected(fresh_daemon):
    # A host that asks for 4 KiB packets must never get a bigger WRTE.
    from adbproto import A_OKAY, A_CLSE

    d = fresh_daemon()
    c = RawClient(d.port)
    try:
        c.send(A_CNXN, A_VERSION, 4096, b"host::\0")
        p = c.recv()
        assert p.command == A_CNXN, p
        c.max_payload = MAX_PAYLOAD  # accept anything so we can see violations
        c.send(A_OPEN, 1, 0, b"exec:head -c 100000 /dev/zero\0")
        total = 0
        remote = None
        while True:
            p = c.recv()
            if p.command == A_OKAY and remote is None:
                remote = p.arg0
                continue
            if p.command == A_CLSE:
                break
            assert p.command == A_WRTE, p
            assert len(p.data) <= 4096, f"WRTE of {len(p.data)} bytes to a 4 KiB host"
            total += len(p.data)
            c.send(A_OKAY, 1, remote)
        assert total == 100000
    finally:
        c.close()
