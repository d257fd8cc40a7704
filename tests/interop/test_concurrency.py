"""Many streams at once on one connection, and several connections at once."""

import os
import threading

from adbproto import RawClient
from harness import AdbServer, sha256_file, write_random


def _run_threads(fns, timeout=180):
    errors = []

    def wrap(fn):
        try:
            fn()
        except BaseException as e:  # collected and re-raised below
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if errors:
        raise errors[0]


def test_parallel_shells_and_pushes_one_adb_server(adb, daemon, tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    local = tmp_path / "local"
    local.mkdir()
    digests = {}
    for i in range(3):
        digests[i] = write_random(local / f"p{i}.bin", (3 << 20) + i)

    def shells(k):
        def fn():
            for j in range(5):
                r = adb("shell", f"echo {k}-{j}; echo e{k} >&2; exit {j}")
                assert r.stdout == f"{k}-{j}\n".encode(), r
                assert f"e{k}".encode() in r.stderr, r
                assert r.rc == j, r
        return fn

    def push(i):
        def fn():
            r = adb("push", str(local / f"p{i}.bin"), str(remote / f"p{i}.bin"), timeout=120)
            assert r.rc == 0, r
        return fn

    def raw_client():
        c = RawClient(daemon.port)
        try:
            c.connect()
            for j in range(10):
                assert c.run_service(f"exec:echo raw{j}") == f"raw{j}\n".encode()
        finally:
            c.close()

    _run_threads([shells(k) for k in range(4)] + [push(i) for i in range(3)] + [raw_client])
    for i, dg in digests.items():
        assert sha256_file(remote / f"p{i}.bin") == dg


def test_two_adb_servers_one_daemon(adb_bin, adb_server, daemon, tmp_path):
    other = AdbServer(adb_bin, tmp_path / "second-server")
    try:
        other.start()
        other.connect(daemon.serial)

        def via(server, tag):
            def fn():
                for j in range(5):
                    r = server.run("shell", f"echo {tag}{j}", serial=daemon.serial)
                    assert r.stdout == f"{tag}{j}\n".encode(), r
            return fn

        data = os.urandom(2 << 20)
        src = tmp_path / "two.bin"
        src.write_bytes(data)

        def pull_exec(server):
            def fn():
                r = server.run("exec-out", "cat", str(src), serial=daemon.serial, timeout=60)
                assert r.stdout == data
            return fn

        _run_threads([via(adb_server, "a"), via(other, "b"), pull_exec(adb_server),
                      pull_exec(other)])
        # Disconnecting one host leaves the other connection working.
        other.disconnect(daemon.serial)
        r = adb_server.run("shell", "echo still", serial=daemon.serial)
        assert r.stdout == b"still\n", r
    finally:
        other.kill()


def test_many_streams_on_one_raw_connection(daemon):
    # Several OPENs outstanding at once on a single transport, answered in any order.
    from adbproto import A_CLSE, A_OKAY, A_OPEN, A_WRTE

    c = RawClient(daemon.port)
    try:
        c.connect()
        n = 8
        for i in range(1, n + 1):
            c.send(A_OPEN, i, 0, f"exec:echo stream{i}\0".encode())
        out = {i: b"" for i in range(1, n + 1)}
        remote = {}
        closed = set()
        while len(closed) < n:
            p = c.recv(timeout=15)
            assert p.arg1 in out, p
            if p.command == A_OKAY:
                remote.setdefault(p.arg1, p.arg0)
            elif p.command == A_WRTE:
                out[p.arg1] += p.data
                c.send(A_OKAY, p.arg1, p.arg0)
            elif p.command == A_CLSE:
                closed.add(p.arg1)
            else:
                raise AssertionError(p)
        assert len(set(remote.values())) == n, f"daemon reused stream ids: {remote}"
        for i in range(1, n + 1):
            assert out[i] == f"stream{i}\n".encode(), (i, out[i])
    finally:
        c.close()
