"""A scripted ADB device that misbehaves on purpose, for testing hosts.

A device is not trusted by the host that connects to it (a phone on a
shared network, a board running code under test). This one listens on a
loopback TCP port, answers a host's CNXN without asking for a key (classic
flow control unless told to offer `delayed_ack`) and then plays one
scenario:

  open-unasked   opens streams to the host that no reverse forward asked
                 for (the specs given), right after the handshake and again
                 after every `reverse:forward:` request, beside the host-side
                 spec of that request, on which it says hello;
  open-silent    never answers the host's OPENs;
  sync-fail-huge a pull's RECV is answered with a FAIL whose length is
                 0xFFFFFFFF, a short reason, then silence;
  sync-fail-stall the same with a length of 100 and 10 bytes of it;
  sync-silent    the sync service answers nothing at all;
  sync-data-long a STAT says 10 bytes and the RECV sends 20 MB of DATA;
  sync-names     a listing holds `../`, absolute, NUL-bearing and 5,000-byte
                 names beside one good file;
  sync-loop      every directory holds a directory `d` (endless nesting);
  shell-exit-empty shell v2 output, then an exit packet of 0 bytes;
  shell-bad-frame  a shell v2 frame announcing 4 GiB;
  stray-flood    OKAYs and CLSEs for streams that never existed, then
                 serves as `open-unasked` with no specs;
  credit-flood   writes 40 MB on a shell stream without waiting for OKAYs;
  bad-magic      a packet with a broken magic right after the handshake;
  huge-banner    a CNXN whose banner is 1 MiB.

Everything the device sees and does is appended to `events` as
(what, detail) pairs: ("refused", SPEC) when the host answered its OPEN
with CLSE, ("accepted", SPEC) with OKAY, ("received", DATA) for what came
back on an accepted stream, ("opened", SERVICE) for each host OPEN.

Run as a program (`hostile_device.py [--burst] SCENARIO PORT [SPEC...]`) it prints
`READY` and then one line per event, for tests that run the device in
another process (the USB VM bridges it to a gadget with ffs_bridge.py).
With `burst=True` it offers `delayed_ack` and, when the host does too,
grants and spends credit as burst mode does. Standard library only.
Written from the protocol description
(docs/protocol.md, AOSP `protocol.txt`), not from the host's code.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time

A_CNXN = 0x4E584E43
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_WRTE = 0x45545257
A_CLSE = 0x45534C43
A_VERSION = 0x01000001
MAX_PAYLOAD = 1 << 20
# What the device grants the host per stream in burst mode (OPEN.arg1, the
# OKAY that accepts a stream, and each acknowledgement's payload).
GRANT = 16 << 20
HEADER = struct.Struct("<6I")

FEATURES = "shell_v2,cmd,stat_v2,ls_v2,sendrecv_v2,fixed_push_mkdir,abb_exec"
BANNER = ("device::ro.product.name=hostile;ro.product.model=hostile;"
          f"ro.product.device=hostile;features={FEATURES}").encode()

SCENARIOS = (
    "open-unasked", "open-silent", "sync-fail-huge", "sync-fail-stall", "sync-silent",
    "sync-data-long", "sync-names", "sync-loop", "shell-exit-empty", "shell-bad-frame",
    "stray-flood", "credit-flood", "bad-magic", "huge-banner",
)

# Names a hostile listing offers (sync-names), beside the good `ok`.
BAD_NAMES = (b"../escape", b"/abs", b"a\0b", b"x" * 5000)
GOOD_FILE = b"good file\n"


def _packet(command: int, arg0: int, arg1: int, data: bytes = b"", magic: int | None = None) -> bytes:
    if magic is None:
        magic = command ^ 0xFFFFFFFF
    return HEADER.pack(command, arg0, arg1, len(data), sum(data) & 0xFFFFFFFF, magic) + data


def _sync(ident: bytes, length: int) -> bytes:
    return ident + struct.pack("<I", length)


def _stat_v2(ident: bytes, mode: int, size: int, ino: int) -> bytes:
    # id, error, dev, ino, mode, nlink, uid, gid, size, atime, mtime, ctime
    return ident + struct.pack("<IQQIIIIQqqq", 0, 1, ino, mode, 1, 0, 0, size, 0, 0, 0)


def _stat_v1(mode: int, size: int) -> bytes:
    return b"STAT" + struct.pack("<III", mode, size, 0)


def _dent(v2: bool, mode: int, size: int, name: bytes, ino: int = 2) -> bytes:
    if v2:
        return (b"DNT2" + struct.pack("<IQQIIIIQqqqI", 0, 1, ino, mode, 1, 0, 0, size, 0, 0, 0,
                                      len(name)) + name)
    return b"DENT" + struct.pack("<IIII", mode, size, 0, len(name)) + name


S_IFREG, S_IFDIR = 0o100000, 0o040000


class _Stream:
    """One stream of a connection, as the device sees it."""

    def __init__(self, local: int, remote: int, service: str):
        self.local = local
        self.remote = remote
        self.service = service
        self.inbox = b""
        self.arrived = threading.Condition()
        self.closed = False
        # Classic mode: the last WRTE was acknowledged.
        self.acked = threading.Event()
        self.acked.set()
        # Burst mode: bytes the host still lets us send.
        self.credit = 0
        self.credit_changed = threading.Condition()

    def add_credit(self, amount: int) -> None:
        with self.credit_changed:
            self.credit += amount
            self.credit_changed.notify_all()

    def take(self, n: int) -> bytes | None:
        """The next `n` bytes the host wrote; None once the stream closed."""
        with self.arrived:
            while len(self.inbox) < n:
                if self.closed:
                    return None
                self.arrived.wait(1)
            out, self.inbox = self.inbox[:n], self.inbox[n:]
            return out


class HostileDevice:
    """The device: `start()` it, point a host at `serial`, `stop()` it."""

    def __init__(self, scenario: str, specs: tuple[str, ...] = (), port: int = 0,
                 bad_names: tuple[bytes, ...] = BAD_NAMES, burst: bool = False):
        assert scenario in SCENARIOS, scenario
        self.scenario = scenario
        # Offer `delayed_ack` (burst mode, as Tango and adb 34 speak it).
        self.burst = burst
        self.specs = tuple(specs)
        self.bad_names = tuple(bad_names)
        self.events: list[tuple[str, object]] = []
        self.on_event = None
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self.serial = f"127.0.0.1:{self.port}"
        self.connections = 0
        self._stopping = False
        self._sockets: list[socket.socket] = []

    # --- life ---------------------------------------------------------------
    def start(self) -> "HostileDevice":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping = True
        for s in [self._listener, *self._sockets]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def __enter__(self) -> "HostileDevice":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def record(self, what: str, detail: object) -> None:
        with self._lock:
            self.events.append((what, detail))
        if self.on_event is not None:
            self.on_event(what, detail)

    def seen(self, what: str) -> list[object]:
        with self._lock:
            return [d for w, d in self.events if w == what]

    def wait_for(self, what: str, count: int, timeout: float) -> list[object]:
        """The first `count` details of event `what`, waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.seen(what)
            if len(got) >= count:
                return got
            time.sleep(0.02)
        raise AssertionError(f"the device saw {len(self.seen(what))} {what!r} events within "
                             f"{timeout}s, not {count}; all events: {self.events[-40:]}")

    def _accept(self) -> None:
        while not self._stopping:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self._sockets.append(sock)
            threading.Thread(target=_Connection(self, sock).run, daemon=True).start()


class _Connection:
    def __init__(self, device: HostileDevice, sock: socket.socket):
        self.device = device
        self.scenario = device.scenario
        self.sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.send_lock = threading.Lock()
        self.buf = b""
        self.streams: dict[int, _Stream] = {}   # by the host's id
        self.opening: dict[int, str] = {}        # our OPENs awaiting an answer, by our id
        self.mine: dict[int, _Stream] = {}       # streams we opened, by our id
        self.next_id = 1
        self.max_payload = MAX_PAYLOAD
        self.burst = False

    # --- wire -----------------------------------------------------------------
    def send(self, command: int, arg0: int, arg1: int, data: bytes = b"", **kw) -> None:
        with self.send_lock:
            self.sock.sendall(_packet(command, arg0, arg1, data, **kw))

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the host closed the connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self) -> tuple[int, int, int, bytes]:
        command, arg0, arg1, length, _crc, _magic = HEADER.unpack(self._read(HEADER.size))
        return command, arg0, arg1, self._read(length) if length else b""

    def run(self) -> None:
        try:
            self._run()
        except (OSError, ConnectionError):
            pass
        finally:
            try:
                self.sock.close()
            except OSError:
                pass

    def _run(self) -> None:
        command, _version, max_payload, banner = self.recv()
        if command != A_CNXN:
            return
        self.max_payload = min(max_payload, MAX_PAYLOAD)
        self.burst = self.device.burst and b"delayed_ack" in banner
        features = FEATURES + (",delayed_ack" if self.device.burst else "")
        banner = BANNER.replace(FEATURES.encode(), features.encode())
        if self.scenario == "huge-banner":
            self.send(A_CNXN, A_VERSION, MAX_PAYLOAD, b"device::" + b"x" * (MAX_PAYLOAD - 8))
            self._drain()
            return
        self.send(A_CNXN, A_VERSION, MAX_PAYLOAD, banner)
        if self.scenario == "bad-magic":
            self.send(A_OKAY, 1, 1, magic=0xDEADBEEF)
            self._drain()
            return
        if self.scenario == "stray-flood":
            for i in range(10_000):
                self.send(A_OKAY if i % 2 else A_CLSE, 1000 + i, 2000 + i)
        self.open_specs(self.device.specs)
        while True:
            command, arg0, arg1, data = self.recv()
            if command == A_OPEN:
                self.on_host_open(arg0, arg1, data.rstrip(b"\0").decode("utf-8", "replace"))
            elif command == A_OKAY:
                self.on_okay(arg0, arg1, data)
            elif command == A_WRTE:
                self.on_write(arg0, arg1, data)
            elif command == A_CLSE:
                self.on_close(arg0, arg1)

    def _drain(self) -> None:
        while self.sock.recv(1 << 16):
            pass

    # --- streams we open --------------------------------------------------------
    def open_specs(self, specs) -> None:
        for spec in specs:
            ident = self.next_id
            self.next_id += 1
            self.opening[ident] = spec
            self.send(A_OPEN, ident, GRANT if self.burst else 0, spec.encode() + b"\0")

    def okay(self, local: int, remote: int, grant: int) -> None:
        """OKAY, with the bytes granted or acknowledged in burst mode."""
        self.send(A_OKAY, local, remote, struct.pack("<i", grant) if self.burst else b"")

    def on_okay(self, host_id: int, our_id: int, payload: bytes) -> None:
        granted = struct.unpack("<i", payload)[0] if len(payload) == 4 else 0
        spec = self.opening.pop(our_id, None)
        if spec is not None:
            stream = _Stream(our_id, host_id, spec)
            stream.add_credit(granted)
            self.mine[our_id] = stream
            self.device.record("accepted", spec)
            self.write(stream, b"hello from the device")
            return
        stream = self.mine.get(our_id) or self._by_local(our_id)
        if stream is not None:
            stream.add_credit(granted)
            stream.acked.set()

    def _by_local(self, our_id: int) -> _Stream | None:
        for stream in self.streams.values():
            if stream.local == our_id:
                return stream
        return None

    def on_close(self, host_id: int, our_id: int) -> None:
        spec = self.opening.pop(our_id, None)
        if spec is not None:
            self.device.record("refused", spec)
            return
        if our_id in self.mine:
            del self.mine[our_id]
            return
        stream = self.streams.pop(host_id, None)
        if stream is not None:
            with stream.arrived:
                stream.closed = True
                stream.arrived.notify_all()

    # --- streams the host opens -------------------------------------------------------
    def on_host_open(self, host_id: int, credit: int, service: str) -> None:
        self.device.record("opened", service)
        if self.scenario == "open-silent":
            return
        ident = self.next_id
        self.next_id += 1
        stream = _Stream(ident, host_id, service)
        stream.add_credit(credit)
        if service.startswith("reverse:"):
            self.okay(ident, host_id, GRANT)
            self.write_all(stream, b"OKAY")
            self.send(A_CLSE, ident, host_id)
            if service.startswith("reverse:forward:"):
                pair = service[len("reverse:forward:"):]
                pair = pair[len("norebind:"):] if pair.startswith("norebind:") else pair
                host_spec = pair.split(";", 1)[1] if ";" in pair else ""
                self.open_specs((host_spec, *self.device.specs))
            return
        if service.startswith("shell") or service.startswith("exec:"):
            self.streams[host_id] = stream
            self.okay(ident, host_id, GRANT)
            threading.Thread(target=self.serve_shell, args=(stream,), daemon=True).start()
            return
        if service == "sync:":
            self.streams[host_id] = stream
            self.okay(ident, host_id, GRANT)
            threading.Thread(target=self.serve_sync, args=(stream,), daemon=True).start()
            return
        self.send(A_CLSE, 0, host_id)

    def on_write(self, host_id: int, our_id: int, data: bytes) -> None:
        mine = self.mine.get(our_id)
        if mine is not None:
            self.okay(our_id, mine.remote, len(data))
            self.device.record("received", data)
            return
        stream = self.streams.get(host_id)
        if stream is None:
            return
        self.okay(stream.local, host_id, len(data))
        with stream.arrived:
            stream.inbox += data
            stream.arrived.notify_all()

    def write(self, stream: _Stream, data: bytes) -> None:
        """One WRTE in classic mode, after the last one was acknowledged; in
        burst mode as many as the host's credit asks for."""
        if self.burst:
            # As much as the credit allows, the rest once more is granted.
            while data:
                with stream.credit_changed:
                    if not stream.credit_changed.wait_for(lambda: stream.credit > 0, 30):
                        raise ConnectionError("the host granted no credit for 30 s")
                    piece, data = data[:stream.credit], data[stream.credit:]
                    stream.credit -= len(piece)
                self.send(A_WRTE, stream.local, stream.remote, piece)
            return
        if not stream.acked.wait(30):
            raise ConnectionError("the host acknowledged nothing for 30 s")
        stream.acked.clear()
        self.send(A_WRTE, stream.local, stream.remote, data)

    def write_all(self, stream: _Stream, data: bytes) -> None:
        step = self.max_payload
        for at in range(0, len(data), step):
            self.write(stream, data[at:at + step])

    # --- shell ----------------------------------------------------------------------------
    def serve_shell(self, stream: _Stream) -> None:
        try:
            self._serve_shell(stream)
        except (OSError, ConnectionError):
            pass  # the host closed the connection: what a flood is answered with

    def _serve_shell(self, stream: _Stream) -> None:
        v2 = stream.service.startswith("shell,v2")
        if self.scenario == "credit-flood":
            size = self.max_payload - 5
            chunk = b"\1" + struct.pack("<I", size) + b"x" * size if v2 else b"x" * size
            for _ in range((40 << 20) // len(chunk)):
                self.send(A_WRTE, stream.local, stream.remote, chunk)
            self.send(A_CLSE, stream.local, stream.remote)
            return
        if not v2:
            self.write_all(stream, b"hostile\n")
        elif self.scenario == "shell-exit-empty":
            self.write_all(stream, b"\1" + struct.pack("<I", 8) + b"hostile\n" + b"\3\0\0\0\0")
        elif self.scenario == "shell-bad-frame":
            self.write_all(stream, b"\1" + struct.pack("<I", 0xFFFFFFFF) + b"hostile\n")
            return
        else:
            self.write_all(stream, b"\1" + struct.pack("<I", 8) + b"hostile\n" + b"\3\1\0\0\0\0")
        self.send(A_CLSE, stream.local, stream.remote)

    # --- sync -----------------------------------------------------------------------------
    def serve_sync(self, stream: _Stream) -> None:
        try:
            self._serve_sync(stream)
        except (OSError, ConnectionError):
            pass

    def _serve_sync(self, stream: _Stream) -> None:
        """Answers the host's requests one by one until the stream ends."""
        while True:
            head = stream.take(8)
            if head is None:
                return
            ident, length = head[:4], struct.unpack("<I", head[4:])[0]
            if ident == b"QUIT":
                self.send(A_CLSE, stream.local, stream.remote)
                return
            # RCV2 and SND2 carry a setup frame after the path.
            setup = {b"RCV2": 8, b"SND2": 12}.get(ident, 0)
            rest = stream.take(length + setup)
            if rest is None:
                return
            self.answer_sync(stream, ident, rest[:length])

    def answer_sync(self, stream: _Stream, ident: bytes, path: bytes) -> None:
        if self.scenario == "sync-silent":
            return
        is_dir = self.scenario in ("sync-names", "sync-loop") and not path.endswith(b"ok")
        mode, size = (S_IFDIR | 0o755, 4096) if is_dir else (S_IFREG | 0o644, 10)
        if ident in (b"STA2", b"LST2"):
            # A directory of its own at every depth: endless nesting, no loop.
            ino = len(path.split(b"/"))
            self.write_all(stream, _stat_v2(ident, mode, size, ino))
        elif ident == b"STAT":
            self.write_all(stream, _stat_v1(mode, size))
        elif ident in (b"LIST", b"LIS2"):
            v2 = ident == b"LIS2"
            if self.scenario == "sync-loop":
                depth = len(path.split(b"/"))
                entries = [_dent(v2, S_IFDIR | 0o755, 4096, b"d", ino=depth + 1)]
            else:
                entries = [_dent(v2, S_IFREG | 0o644, len(GOOD_FILE), b"ok")]
                entries += [_dent(v2, S_IFREG | 0o644, 3, name) for name in self.device.bad_names]
            # DONE is an entry of zeros after its id (v1: 16 bytes, v2: 72).
            done = b"DONE" + b"\0" * (72 if v2 else 16)
            self.write_all(stream, b"".join(entries) + done)
        elif ident in (b"RECV", b"RCV2"):
            self.answer_recv(stream)

    def answer_recv(self, stream: _Stream) -> None:
        if self.scenario == "sync-fail-huge":
            self.write_all(stream, _sync(b"FAIL", 0xFFFFFFFF) + b"short")
        elif self.scenario == "sync-fail-stall":
            self.write_all(stream, _sync(b"FAIL", 100) + b"x" * 10)
        elif self.scenario == "sync-data-long":
            chunk = _sync(b"DATA", 65536) + b"\xa5" * 65536
            frames = (20 << 20) // 65536
            per_write = max(1, self.max_payload // len(chunk))
            for at in range(0, frames, per_write):
                self.write(stream, chunk * min(per_write, frames - at))
            self.write_all(stream, _sync(b"DONE", 0))
        else:
            self.write_all(stream, _sync(b"DATA", len(GOOD_FILE)) + GOOD_FILE + _sync(b"DONE", 0))


def main(argv: list[str]) -> int:
    burst = "--burst" in argv
    argv = [arg for arg in argv if arg != "--burst"]
    if len(argv) < 3 or argv[1] not in SCENARIOS:
        print(f"usage: {argv[0]} [--burst] SCENARIO PORT [SPEC...]; scenarios: "
              f"{', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    device = HostileDevice(argv[1], tuple(argv[3:]), port=int(argv[2]), burst=burst)

    def say(what, detail):
        print(what, detail if isinstance(detail, str) else repr(detail), flush=True)

    device.on_event = say
    device.start()
    print("READY", device.port, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        device.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
