"""Small echo servers (TCP on 127.0.0.1, and unix sockets) run in threads."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time


class EchoServer:
    def __init__(self, family: int, address):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_INET:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(address)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.address = self.sock.getsockname()
        self.accepted = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        t = threading.Thread(target=self._accept_loop, daemon=True)
        t.start()
        self._threads.append(t)

    @classmethod
    def tcp(cls) -> "EchoServer":
        return cls(socket.AF_INET, ("127.0.0.1", 0))

    @classmethod
    def unix(cls, path: str) -> "EchoServer":
        if os.path.exists(path):
            os.unlink(path)
        return cls(socket.AF_UNIX, path)

    @property
    def port(self) -> int:
        return self.address[1]

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self._conns.append(conn)
            t = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(60)
        try:
            while not self._stop.is_set():
                data = conn.recv(65536)
                if not data:
                    return
                conn.sendall(data)
        except OSError:
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass
        with self._lock:
            for c in self._conns:
                try:
                    c.close()
                except OSError:
                    pass
        for t in self._threads:
            t.join(timeout=2)


def roundtrip(port: int, payload: bytes, timeout: float = 30.0) -> bytes:
    """Send payload through 127.0.0.1:port while reading; return what came back.

    The answer is read BEFORE closing: ADB streams have no half-close, so a
    shutdown(SHUT_WR) would tear the whole stream down.
    """
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.settimeout(timeout)
    got = bytearray()
    err: list[BaseException] = []

    def writer():
        try:
            view = memoryview(payload)
            for i in range(0, len(view), 65536):
                s.sendall(view[i:i + 65536])
        except BaseException as e:  # reported by the caller
            err.append(e)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(payload):
            if time.monotonic() > deadline:
                raise TimeoutError(f"echo returned {len(got)} of {len(payload)} bytes")
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    finally:
        t.join(timeout=timeout)
        s.close()
    if err:
        raise err[0]
    return bytes(got)


MIB = 1 << 20


def sha256_echo(port: int, size: int, seed: int, timeout: float = 120) -> tuple[str, str]:
    """Sends `size` random bytes through 127.0.0.1:port while reading the
    echo; returns (sha256 sent, sha256 received)."""
    sent, got = hashlib.sha256(), hashlib.sha256()
    block = os.urandom(MIB)
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.settimeout(timeout)
    errors: list[BaseException] = []

    def writer():
        try:
            for i in range(size // MIB):
                # Each MiB differs: a relay that repeated or dropped one would show.
                chunk = bytes([seed, i & 0xff]) + block[2:]
                sent.update(chunk)
                s.sendall(chunk)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    received = 0
    try:
        while received < size:
            chunk = s.recv(1 << 18)
            if not chunk:
                break
            got.update(chunk)
            received += len(chunk)
    finally:
        t.join(timeout)
        s.close()
    if errors:
        raise errors[0]
    assert received == size, f"connection {seed}: echoed {received} of {size} bytes"
    return sent.hexdigest(), got.hexdigest()


def concurrent_echo(port: int, count: int = 16, size: int = 8 * MIB) -> None:
    results: list = [None] * count

    def run(i):
        try:
            results[i] = sha256_echo(port, size, i)
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for i, result in enumerate(results):
        assert isinstance(result, tuple), f"connection {i}: {result!r}"
        assert result[0] == result[1], f"connection {i}: sha256 differs"


def refused(port: int, timeout: float = 5.0) -> bool:
    """Whether connecting to 127.0.0.1:port is refused (waits for it a little)."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            s.settimeout(2)
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def answer_to(port: int, timeout: float = 10.0) -> bytes:
    """What a listener on 127.0.0.1:port replies to one message before it
    closes the connection (b"" when it closes, or resets, without a word):
    a forward or reverse whose far end is unreachable."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.settimeout(timeout)
        try:
            s.sendall(b"anyone?")
            return s.recv(100)
        except (ConnectionResetError, BrokenPipeError):
            return b""


def unix_roundtrip(address, payload: bytes, timeout: float = 30) -> bytes:
    """`roundtrip` through a unix socket (a path, or "\\0NAME" for an abstract one)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(address)
    writer = threading.Thread(target=s.sendall, args=(payload,), daemon=True)
    writer.start()
    got = bytearray()
    with s:
        while len(got) < len(payload):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        writer.join(timeout)
    return bytes(got)
