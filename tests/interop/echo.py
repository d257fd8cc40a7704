"""Small echo servers (TCP on 127.0.0.1, and unix sockets) run in threads."""

from __future__ import annotations

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
