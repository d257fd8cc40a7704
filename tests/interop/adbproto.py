"""A tiny, independent encoder/decoder for the ADB transport protocol.

Written from the protocol description (24-byte header of six little-endian
u32: command, arg0, arg1, data_length, data_crc32, magic = command ^
0xffffffff, then data_length bytes of payload), NOT from the daemon's code,
so that the raw-socket tests check the daemon against an outside view.
"""

from __future__ import annotations

import socket
import struct
import time

A_CNXN = 0x4E584E43
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_WRTE = 0x45545257
A_CLSE = 0x45534C43
A_AUTH = 0x48545541
A_STLS = 0x534C5453

A_VERSION = 0x01000001
MAX_PAYLOAD = 1024 * 1024

HEADER = struct.Struct("<6I")

NAMES = {
    A_CNXN: "CNXN",
    A_OPEN: "OPEN",
    A_OKAY: "OKAY",
    A_WRTE: "WRTE",
    A_CLSE: "CLSE",
    A_AUTH: "AUTH",
    A_STLS: "STLS",
}


def checksum(data: bytes) -> int:
    # The legacy "crc" is the byte sum; version 0x01000001 peers skip the
    # check, but sending the right value keeps us valid for both kinds.
    return sum(data) & 0xFFFFFFFF


def header(command: int, arg0: int, arg1: int, data: bytes = b"", *,
           length: int | None = None, magic: int | None = None) -> bytes:
    if length is None:
        length = len(data)
    if magic is None:
        magic = command ^ 0xFFFFFFFF
    return HEADER.pack(command, arg0, arg1, length, checksum(data), magic)


def packet(command: int, arg0: int, arg1: int, data: bytes = b"", **kw) -> bytes:
    return header(command, arg0, arg1, data, **kw) + data


class Packet:
    __slots__ = ("command", "arg0", "arg1", "data")

    def __init__(self, command: int, arg0: int, arg1: int, data: bytes):
        self.command = command
        self.arg0 = arg0
        self.arg1 = arg1
        self.data = data

    @property
    def name(self) -> str:
        return NAMES.get(self.command, f"0x{self.command:08x}")

    def __repr__(self) -> str:
        shown = self.data[:64]
        more = "..." if len(self.data) > 64 else ""
        return f"<{self.name} {self.arg0:#x} {self.arg1:#x} {len(self.data)}B {shown!r}{more}>"


class ProtocolError(AssertionError):
    pass


class RawClient:
    """A well-behaved (classic-mode) ADB host speaking to the daemon directly."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout)
        self.max_payload = MAX_PAYLOAD
        self.banner = b""
        self.version = 0
        self._next_id = 1
        self._buf = b""
        self.stale = 0  # packets seen for streams that were already finished

    # --- low level ---------------------------------------------------------
    def send(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        self.sock.sendall(packet(command, arg0, arg1, data))

    def _read_exact(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out waiting for {n} bytes (have {len(self._buf)})")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise ConnectionError(
                    f"connection closed by daemon while waiting for {n} bytes "
                    f"(have {len(self._buf)})")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def recv(self, timeout: float = 10.0) -> Packet:
        deadline = time.monotonic() + timeout
        raw = self._read_exact(HEADER.size, deadline)
        command, arg0, arg1, length, _crc, magic = HEADER.unpack(raw)
        if magic != command ^ 0xFFFFFFFF:
            raise ProtocolError(f"daemon sent bad magic: {raw.hex()}")
        if length > self.max_payload:
            raise ProtocolError(f"daemon sent {length}-byte payload > max {self.max_payload}")
        data = self._read_exact(length, deadline) if length else b""
        return Packet(command, arg0, arg1, data)

    # --- handshake ---------------------------------------------------------
    def connect(self, banner: bytes = b"host::\0", timeout: float = 10.0) -> Packet:
        self.send(A_CNXN, A_VERSION, MAX_PAYLOAD, banner)
        p = self.recv(timeout)
        if p.command != A_CNXN:
            raise ProtocolError(f"expected CNXN from daemon, got {p!r}")
        self.version = p.arg0
        self.max_payload = min(MAX_PAYLOAD, p.arg1)
        self.banner = p.data
        return p

    def features(self) -> list[str]:
        text = self.banner.rstrip(b"\0").decode("utf-8", "replace")
        for part in text.split("::", 1)[-1].split(";"):
            if part.startswith("features="):
                return [f for f in part[len("features="):].split(",") if f]
        return []

    # --- streams -----------------------------------------------------------
    def run_service(self, service: str, stdin: bytes = b"", timeout: float = 15.0) -> bytes:
        """OPEN a service, ACK every WRTE, return everything written until CLSE."""
        local_id = self._next_id
        self._next_id += 1
        self.send(A_OPEN, local_id, 0, service.encode() + b"\0")
        deadline = time.monotonic() + timeout
        remote_id = None
        out = bytearray()
        while True:
            p = self.recv(max(0.01, deadline - time.monotonic()))
            if p.command in (A_OKAY, A_CLSE) and 0 < p.arg1 < local_id:
                # A late OKAY/CLSE for one of our earlier, finished streams
                # (the protocol allows these races); not for this stream.
                self.stale += 1
                continue
            if p.command == A_OKAY and remote_id is None:
                if p.arg1 != local_id:
                    raise ProtocolError(f"OKAY for wrong stream: {p!r} (ours {local_id})")
                remote_id = p.arg0
                if remote_id == 0:
                    raise ProtocolError(f"OKAY with remote id 0: {p!r}")
                if stdin:
                    self.send(A_WRTE, local_id, remote_id, stdin)
                continue
            if p.command == A_OKAY:
                continue  # ACK of our stdin write
            if p.command == A_WRTE:
                if p.arg1 != local_id:
                    raise ProtocolError(f"WRTE for wrong stream: {p!r} (ours {local_id})")
                if remote_id is None:
                    raise ProtocolError(f"WRTE before OKAY: {p!r}")
                out += p.data
                self.send(A_OKAY, local_id, remote_id)
                continue
            if p.command == A_CLSE:
                if p.arg1 != local_id:
                    raise ProtocolError(f"CLSE for wrong stream: {p!r} (ours {local_id})")
                if remote_id is None:
                    raise ProtocolError(f"service {service!r} refused (CLSE before OKAY)")
                return bytes(out)
            raise ProtocolError(f"unexpected packet {p!r}")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def wait_closed(sock: socket.socket, timeout: float = 5.0) -> str:
    """Read and discard until the peer closes. Returns 'eof' or 'reset'.

    Raises TimeoutError if the connection is still open after `timeout`.
    """
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("daemon did not close the connection")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return "reset"
        except socket.timeout:
            raise TimeoutError("daemon did not close the connection") from None
        if not chunk:
            return "eof"
