#!/usr/bin/env python3
"""A test-only FunctionFS ADB function that relays to an oxadbd over TCP, so
that a USB host (oxadb, Google adb) can be tested over real bulk endpoints
before oxadbd serves USB itself.

    ffs_bridge.py FFS_DIR HOST:PORT

Writes the descriptors of ffs_stub.py to FFS_DIR/ep0, prints "READY", then:
  * host to device: every read of ep1 (bulk OUT) is one transfer, read into
    a 16 KiB buffer as AOSP's adbd does; its bytes go to the TCP connection.
    A transfer holding a CNXN header starts a new TCP connection (adbd resets
    its transport on CNXN). Each read is checked against the ADB framing: a
    read that holds more than one header, or runs from a payload into the
    next header, means a zero-length packet was missing; it is logged as
    "FRAMING ..." (and relayed anyway).
  * device to host: each packet read from TCP goes to ep2 (bulk IN) as adbd
    sends it: the 24-byte header as one write, then the payload in writes of
    at most 16 KiB, never a zero-length packet.
Standard library only. Stops on SIGTERM.
"""

import os
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ffs_stub import descriptors, strings, watch_ep0, say  # noqa: E402

HEADER = 24
A_CNXN = 0x4E584E43
WRITE_SIZE = 16384


def parse_header(data):
    """(command, payload length) of a 24-byte ADB header, or None."""
    if len(data) != HEADER:
        return None
    cmd, _arg0, _arg1, length, _check, magic = struct.unpack("<6I", data)
    if magic != cmd ^ 0xFFFFFFFF:
        return None
    return cmd, length


def recv_exact(sock, n):
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            return None
        out += chunk
    return bytes(out)


class Bridge:
    def __init__(self, bulk_in, address):
        self.bulk_in = bulk_in
        self.address = address
        self.sock = None
        self.lock = threading.Lock()
        self.payload_left = 0  # framing check of host-to-device reads

    def reconnect(self):
        with self.lock:
            if self.sock is not None:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self.sock.close()
            host, port = self.address.rsplit(":", 1)
            sock = socket.create_connection((host, int(port)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = sock
        threading.Thread(target=self.to_host, args=(sock,), daemon=True).start()
        say("tcp connected")

    def to_host(self, sock):
        while True:
            header = recv_exact(sock, HEADER)
            if header is None:
                say("tcp closed")
                return
            _cmd, length = parse_header(header) or (None, 0)
            payload = recv_exact(sock, length) if length else b""
            if payload is None:
                say("tcp closed mid-payload")
                return
            try:
                os.write(self.bulk_in, header)
                for i in range(0, len(payload), WRITE_SIZE):
                    os.write(self.bulk_in, payload[i:i + WRITE_SIZE])
            except OSError as e:
                say(f"ep2 write: {e}")
                return

    def check_framing(self, data):
        """Logs a read of ep1 that crosses a header/payload boundary."""
        if self.payload_left:
            if len(data) > self.payload_left:
                say(f"FRAMING: a read of {len(data)} bytes runs {len(data) - self.payload_left} "
                    "bytes past its payload (no zero-length packet?)")
                self.payload_left = 0
            else:
                self.payload_left -= len(data)
            return
        parsed = parse_header(data[:HEADER]) if len(data) >= HEADER else None
        if parsed is None:
            say(f"FRAMING: a read of {len(data)} bytes where a header was due")
            return
        if len(data) != HEADER:
            say(f"FRAMING: a header read of {len(data)} bytes (no zero-length packet?)")
        self.payload_left = parsed[1]

    def from_host(self, bulk_out):
        while True:
            try:
                data = os.read(bulk_out, WRITE_SIZE)
            except OSError as e:
                # ESHUTDOWN while the function is disabled: wait for ENABLE.
                say(f"ep1 read: {e}")
                self.payload_left = 0
                threading.Event().wait(0.2)
                continue
            if not data:
                continue
            parsed = parse_header(data) if len(data) == HEADER else None
            if parsed and parsed[0] == A_CNXN:
                self.payload_left = 0
                self.reconnect()
            self.check_framing(data)
            with self.lock:
                sock = self.sock
            if sock is None:
                say(f"ep1 {len(data)} bytes before any CNXN: dropped")
                continue
            try:
                sock.sendall(data)
            except OSError as e:
                say(f"tcp send: {e}")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: ffs_bridge.py FFS_DIR HOST:PORT")
    ffs, address = sys.argv[1], sys.argv[2]
    ep0 = os.open(os.path.join(ffs, "ep0"), os.O_RDWR)
    os.write(ep0, descriptors())
    os.write(ep0, strings())
    threading.Thread(target=watch_ep0, args=(ep0,), daemon=True).start()
    bulk_out = os.open(os.path.join(ffs, "ep1"), os.O_RDONLY)
    bulk_in = os.open(os.path.join(ffs, "ep2"), os.O_WRONLY)
    say("READY")
    Bridge(bulk_in, address).from_host(bulk_out)


if __name__ == "__main__":
    main()
