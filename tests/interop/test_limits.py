"""Resource limits of oxadbd (docs/security.md, "Limits"), each with a small setting:

  * `--max-streams`: OPENs beyond it are refused with CLSE and the
    connection goes on serving;
  * `--max-connections`: connections beyond it are closed at once, and a
    slot frees when a connection ends;
  * `--handshake-timeout`: a connection that sends no CNXN is closed;
  * `--stalled-stream-timeout`: a stream whose data the host never
    acknowledges is closed (CLSE) while the connection and its other
    streams go on.
"""

from __future__ import annotations

import socket
import time

from adbproto import A_CLSE, A_OKAY, A_OPEN, A_WRTE, RawClient, wait_closed


def test_opens_beyond_max_streams_are_refused(fresh_daemon):
    d = fresh_daemon(name="streams", args=("--max-streams", "4"))
    c = RawClient(d.port)
    c.connect()
    accepted, refused, remote = [], [], {}
    for local_id in range(1, 9):
        c.send(A_OPEN, local_id, 0, b"sync:\0")
        p = c.recv()
        assert p.arg1 == local_id, p
        assert p.command in (A_OKAY, A_CLSE), p
        if p.command == A_OKAY:
            accepted.append(local_id)
            remote[local_id] = p.arg0
        else:
            refused.append(local_id)
    assert accepted == [1, 2, 3, 4] and refused == [5, 6, 7, 8]
    assert d.wait_for_log(lambda t: "maximum of streams" in t, timeout=5)
    # Closing one frees a slot on the same connection.
    c.send(A_CLSE, 1, remote[1])
    deadline = time.monotonic() + 10
    local_id = 9
    while True:
        c.send(A_OPEN, local_id, 0, b"sync:\0")
        p = c.recv()
        while p.arg1 != local_id:  # our CLSE's echo for stream 1
            p = c.recv()
        if p.command == A_OKAY:
            break
        assert time.monotonic() < deadline, "the closed stream's slot was never freed"
        local_id += 1
        time.sleep(0.1)
    c.close()
    # Other connections were never affected.
    other = RawClient(d.port)
    other.connect()
    assert other.run_service("shell:echo still-serving") == b"still-serving\n"
    other.close()


def test_connections_beyond_max_connections_are_closed(fresh_daemon):
    d = fresh_daemon(name="conns", args=("--max-connections", "3"))
    held = [RawClient(d.port) for _ in range(3)]
    for c in held:
        c.connect()
    extra = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    assert wait_closed(extra, timeout=5) in ("eof", "reset")
    extra.close()
    assert d.wait_for_log(lambda t: "maximum of connections" in t, timeout=5)
    held.pop().close()
    deadline = time.monotonic() + 10
    while True:
        c = RawClient(d.port)
        try:
            c.connect(timeout=2)
            break
        except (ConnectionError, TimeoutError, OSError):
            c.close()
            assert time.monotonic() < deadline, "the freed slot was never reused"
            time.sleep(0.2)
    assert c.run_service("shell:echo reused") == b"reused\n"
    c.close()
    for c in held:
        c.close()


def test_a_connection_without_cnxn_is_closed_after_the_handshake_timeout(fresh_daemon):
    d = fresh_daemon(name="handshake", args=("--handshake-timeout", "1"))
    silent = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    started = time.monotonic()
    assert wait_closed(silent, timeout=6) in ("eof", "reset")
    assert 0.8 <= time.monotonic() - started <= 5
    silent.close()
    assert d.wait_for_log(lambda t: "no CNXN in time" in t, timeout=5)


def test_a_stream_the_host_stops_acknowledging_is_closed(fresh_daemon):
    d = fresh_daemon(name="stalled", args=("--stalled-stream-timeout", "2"))
    c = RawClient(d.port)
    c.connect()
    # Classic mode: one WRTE, then the daemon waits for our OKAY, which never comes.
    c.send(A_OPEN, 1, 0, b"exec:yes\0")
    p = c.recv()
    assert p.command == A_OKAY, p
    remote = p.arg0
    p = c.recv()
    assert p.command == A_WRTE, p
    started = time.monotonic()
    p = c.recv(timeout=10)
    assert (p.command, p.arg0, p.arg1) == (A_CLSE, remote, 1), p
    assert 1.5 <= time.monotonic() - started <= 6
    assert d.wait_for_log(lambda t: "granted no credit for too long" in t, timeout=5)
    # The connection itself goes on.
    assert c.run_service("shell:echo after") == b"after\n"
    c.close()
