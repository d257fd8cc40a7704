"""A hostile client under load, bounded in count and time
(docs/security.md, "Limits" and "Hostile input").

One daemon with small, stated limits:

    --max-connections 32 --max-streams 64 --handshake-timeout 2 --memory-budget 64M

A well-behaved client connects before the attack and keeps working during it
and after it: a background checker runs `exec:echo ok-N` every half second
on a long-lived raw connection, and also a fresh connection each time
(alternately a raw client running `shell:echo` and the `oxadb` binary running
`oxadb shell echo`), each with a deadline of PROBE_DEADLINE seconds.
Meanwhile the main thread attacks, phase by phase:

  a. random and mutated packets: 1500 connections x 12 packets (12 at a
     time): random 24-byte headers, valid headers with random fields, valid
     packets with bit flips in command/arg0/arg1/length/crc/magic/payload,
     CNXN followed by mutated OPEN/WRTE/OKAY/CLSE, random payloads, lengths
     up to MAX_PAYLOAD and beyond. Every garbage connection must be closed
     by the daemon; every connection the daemon closed must have its WARN
     `closing connection: <reason>` line; none is refused for the limit;
  b. an OPEN flood: one connection sends 5 x max-streams OPENs of `sync:`
     (a service that stays open without a process) in one burst: exactly
     the first max-streams are accepted, the rest refused (CLSE) with one
     log line each (WARN for the first 8 refusals and the 16th, 32nd..., DEBUG for the
     rest, so that a flood cannot flood the log), and the connection stays usable (a sync STAT on an
     accepted stream, then, once the streams are closed, a new stream);
  c. a connection flood: 2 x max-connections simultaneous connections each
     sending CNXN: exactly max-connections - 1 are served (the long-lived
     good connection holds the last slot), the others are closed at once
     with a `refusing connection` line; once released, a fresh client gets in;
  d. half-open and stalled connections: silent ones and ones stalled in a
     partial header before CNXN are closed by the handshake timeout (within
     [timeout - 0.3 s, timeout + 3 s]); after CNXN, ones stalled in a partial
     header and ones stalled in a max-size WRTE announced but half sent;
     stalled consumers that never read: `exec:head -c 50000000 /dev/zero` in
     classic mode and `exec:head -c 200000000 /dev/zero` in burst mode with a
     2 GiB credit grant. Held for STALL_HOLD seconds;
  e. maximum-size payloads: 4 connections at once each push 8 WRTEs of
     exactly the daemon's max payload (PACKET, 512 KiB: a quarter of each
     connection's share of the budget, docs/flow-control.md "Memory
     budget"; shell v2 stdin frames) into `wc -c` and get the right count
     back; a max-size OPEN (a PACKET-long service name) is refused and the
     connection goes on; WRTEs of PACKET + 1 after a CNXN offering 1 MiB,
     and of 4097 bytes after a CNXN that negotiated 4096, close their
     connection.

Throughout, a sampler reads the daemon's VmRSS and open descriptors every
100 ms. The bounds, from the daemon's own limits:

  RSS <= baseline + RSS_BOUND, RSS_BOUND = memory budget (64 MiB, for the
         data the test's streams receive)
       + max-connections x (PACKET + 24 + 64 KiB): each connection's
         read buffer holds at most one packet being received plus one read
         chunk (crates/io READ_CHUNK) = 18 MiB
       + 40 MiB slack: glibc keeps up to M_TOP_PAD = 16 MiB of freed heap,
         and each of the (at most 4) streams producing output at once may
         hold its 1 MiB send queue and its connection a 4 MiB write batch
       = about 122 MiB above baseline (measured: 9 to 12 MiB; 16 to 24 MiB
         with 1 MiB packets and 256 KiB read chunks);
         this bounds what this test's load may cost, not the daemon's worst
         case: each stream may hold a few packets the budget is charged for
         but cannot refuse (docs/security.md), and a classic stream three
         (its local buffer of two is not charged to the budget), times
         max-streams, times max-connections;
  fds <= baseline + max-connections (one socket each) + 1 (a connection
         being refused) + 4 per stream running a child (stdin, stdout,
         stderr or a pty, and a pidfd) x 8 (the most the test runs at once)
         + 8 slack = 73 above baseline (measured: 26 to 34);
  after the attack, with every hostile socket closed, the descriptors return
  to the baseline within 5 s and no child process of the daemon is left.

And at the end the daemon is alive and its log has no panic or abort.

Two further tests flood what the daemon must not buffer without limit: a
WRTE flood beyond the stream's credit (classic, and burst mode) into a
consumer that does not read, and packets whose replies the client never
reads. Each holds the daemon to a stated bound and stops sending as soon as
RSS exceeds it (or the daemon closes the connection, or stops reading).

The random choices come from SEED (print it; set HOSTILE_LOAD_SEED to
replay another run).
"""

from __future__ import annotations

import os
import random
import re
import socket
import struct
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from adbproto import (A_CLSE, A_CNXN, A_OKAY, A_OPEN, A_VERSION, A_WRTE, HEADER, MAX_PAYLOAD,
                      ProtocolError, RawClient, header, packet, wait_closed)
from harness import clean_env, resolve_oxadb

SEED = int(os.environ.get("HOSTILE_LOAD_SEED", "5005"))

MAX_CONNECTIONS = 32
MAX_STREAMS = 64
HANDSHAKE_TIMEOUT = 2
MEMORY_BUDGET = 64 << 20
LIMITS = ("--max-connections", str(MAX_CONNECTIONS), "--max-streams", str(MAX_STREAMS),
          "--handshake-timeout", str(HANDSHAKE_TIMEOUT), "--memory-budget", "64M")

MIB = 1 << 20
# The daemon's max payload under LIMITS: a quarter of each connection's share
# of the budget (docs/flow-control.md, "Memory budget").
PACKET = MEMORY_BUDGET // (4 * MAX_CONNECTIONS)
READ_CHUNK = 64 * 1024  # crates/io: smallest read into a connection's buffer
RSS_BOUND = MEMORY_BUDGET + MAX_CONNECTIONS * (PACKET + 24 + READ_CHUNK) + 40 * MIB
CHILD_STREAMS = 8        # most streams with a child process the test runs at once
FD_BOUND = MAX_CONNECTIONS + 1 + 4 * CHILD_STREAMS + 8

PROBE_DEADLINE = 8.0     # seconds for each well-behaved call
PROBE_INTERVAL = 0.5
STALL_HOLD = 3.0
TOTAL_DEADLINE = 120.0   # the whole attack, as a backstop (it takes about 15 s)

# The header fields mutations flip bits in, in wire order.
FIELDS = ["command", "arg0", "arg1", "length", "crc", "magic"]
COMMANDS = [A_CNXN, A_OPEN, A_OKAY, A_WRTE, A_CLSE]

_BLOB = random.Random(SEED).randbytes(MAX_PAYLOAD + 4096)


def blob(rng: random.Random, n: int) -> bytes:
    """n pseudo-random bytes (a slice of one pre-made random block)."""
    off = rng.randrange(0, len(_BLOB) - n + 1)
    return _BLOB[off:off + n]


def hexname(rng: random.Random, n: int) -> bytes:
    # Service names of hex digits only: never a real service, and the
    # daemon's log (which quotes refused names) cannot spell "panic".
    return b"zz-" + rng.randbytes(n).hex().encode()


# --- the daemon's resources ---------------------------------------------------

def proc_stats(pid: int) -> tuple[int, int, int]:
    """(VmRSS bytes, open fds, open sockets) of process `pid`."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
                break
    fds = socks = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        fds += 1
        socks += target.startswith("socket:")
    return rss, fds, socks


def children_of(pid: int) -> list[str]:
    """`pid comm state` of the processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses.
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2:].split()
        if int(rest[1]) == pid:
            found.append(f"{entry} {comm} {rest[0]}")
    return found


def warn_closing_reasons(text: str) -> Counter:
    """Counts of `closing connection: <reason>` WARN lines, by reason kind."""
    kinds = Counter()
    for line in text.splitlines():
        if "WARN" not in line or "closing connection:" not in line:
            continue
        reason = line.split("closing connection:", 1)[1].strip()
        reason = re.sub(r"0x[0-9a-f]+|\d+", "N", reason)
        kinds[reason[:60]] += 1
    return kinds


class Sampler(threading.Thread):
    """Samples the daemon's RSS and descriptors every 100 ms; keeps the peaks."""

    def __init__(self, pid: int, phase):
        super().__init__(daemon=True)
        self.pid = pid
        self.phase = phase
        self.stop = threading.Event()
        self.peak_rss = (0, "")
        self.peak_fds = (0, "")
        self.samples = 0
        self.error = None

    def run(self):
        try:
            while not self.stop.is_set() and self.samples < 100000:
                rss, fds, _ = proc_stats(self.pid)
                self.samples += 1
                if rss > self.peak_rss[0]:
                    self.peak_rss = (rss, self.phase())
                if fds > self.peak_fds[0]:
                    self.peak_fds = (fds, self.phase())
                self.stop.wait(0.1)
        except (OSError, ValueError) as e:  # the daemon died
            self.error = repr(e)


# --- the well-behaved client ----------------------------------------------------

def oxadb_shell(port: int, cmd: str, timeout: float = PROBE_DEADLINE) -> str:
    cp = subprocess.run([str(resolve_oxadb()), "-s", f"127.0.0.1:{port}", "shell", cmd],
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, timeout=timeout, env=clean_env())
    if cp.returncode != 0:
        raise AssertionError(f"oxadb shell {cmd!r}: rc={cp.returncode} stderr={cp.stderr[:500]!r}")
    return cp.stdout.decode("utf-8", "replace")


def fresh_probe(port: int, n: int) -> None:
    """One complete well-behaved session on a new connection."""
    want = f"ok-{n}"
    if n % 2:
        out = oxadb_shell(port, f"echo {want}")
    else:
        c = RawClient(port, timeout=PROBE_DEADLINE)
        try:
            c.connect(timeout=PROBE_DEADLINE)
            out = c.run_service(f"shell:echo {want}", timeout=PROBE_DEADLINE).decode()
        finally:
            c.close()
    if out.strip() != want:
        raise AssertionError(f"fresh probe: expected {want!r}, got {out!r}")


class Checker(threading.Thread):
    """Uses the good client every half second; records every failure."""

    def __init__(self, port: int, good: RawClient, phase):
        super().__init__(daemon=True)
        self.port = port
        self.good = good
        self.phase = phase
        self.stop = threading.Event()
        # Held while probing a fresh connection; phase c takes it to keep
        # its connection count exact.
        self.fresh_lock = threading.Lock()
        self.failures: list[str] = []
        self.done = Counter()
        self.slowest = (0.0, "")

    def _timed(self, what: str, fn) -> None:
        t = time.monotonic()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - every failure is reported
            self.failures.append(f"[{self.phase()}] {what}: {e!r} after "
                                 f"{time.monotonic() - t:.2f}s")
            return
        took = time.monotonic() - t
        self.done[what] += 1
        if took > self.slowest[0]:
            self.slowest = (took, f"{what} in {self.phase()}")
        if took > PROBE_DEADLINE:
            self.failures.append(f"[{self.phase()}] {what} took {took:.2f}s")

    def run(self):
        n = 0
        while not self.stop.is_set() and n < 1000:
            n += 1

            def long_lived(n=n):
                out = self.good.run_service(f"exec:echo ok-{n}", timeout=PROBE_DEADLINE)
                if out != f"ok-{n}\n".encode():
                    raise AssertionError(f"long-lived: got {out!r}")

            self._timed("long-lived", long_lived)
            if self.failures and "long-lived" in self.failures[-1]:
                return  # the connection's state is unknown now; report it
            with self.fresh_lock:
                self._timed("fresh", lambda n=n: fresh_probe(self.port, n))
            self.stop.wait(PROBE_INTERVAL)


# --- raw connections ----------------------------------------------------------

class Sockets:
    """Every socket the test opens, so that all are closed at the end."""

    def __init__(self, port: int):
        self.port = port
        self.all: list[socket.socket] = []
        self.lock = threading.Lock()

    def open(self, timeout: float = 5.0) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.lock:
            self.all.append(s)
        return s

    def close_all(self) -> None:
        with self.lock:
            for s in self.all:
                try:
                    s.close()
                except OSError:
                    pass
            self.all.clear()


def cnxn(s: socket.socket, banner: bytes = b"host::\0", max_payload: int = MAX_PAYLOAD,
         timeout: float = 5.0) -> tuple[int, bytes]:
    """Handshake on a raw socket; returns (negotiated max payload, leftover bytes)."""
    s.sendall(packet(A_CNXN, A_VERSION, max_payload, banner))
    buf = read_packet(s, timeout)
    cmd, _a0, a1, _len, data, rest = buf
    assert cmd == A_CNXN, f"expected CNXN, got {cmd:#x}"
    return a1, rest


def read_packet(s: socket.socket, timeout: float, buf: bytes = b""):
    """Reads one packet: (command, arg0, arg1, length, payload, leftover)."""
    deadline = time.monotonic() + timeout
    need = HEADER.size
    while True:
        if len(buf) >= HEADER.size:
            cmd, a0, a1, length, _crc, _magic = HEADER.unpack(buf[:HEADER.size])
            need = HEADER.size + length
        if len(buf) >= need and len(buf) >= HEADER.size:
            return cmd, a0, a1, length, buf[HEADER.size:need], buf[need:]
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete packet within {timeout}s ({len(buf)} bytes)")
        s.settimeout(left)
        chunk = s.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed by the daemon")
        buf += chunk


def outcome(s: socket.socket, wait: float) -> str:
    """'daemon-closed' if the daemon ends the connection within `wait` s, else 'open'."""
    try:
        wait_closed(s, timeout=wait)
        return "daemon-closed"
    except TimeoutError:
        return "open"
    except OSError:
        return "daemon-closed"


def peek_open(s: socket.socket) -> bool:
    """Whether the daemon has not closed `s`, without consuming anything."""
    s.settimeout(0)  # with a timeout Python would wait for data first
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def flip(value: int, rng: random.Random, bits: int = 32) -> int:
    for _ in range(rng.randint(1, 3)):
        value ^= 1 << rng.randrange(bits)
    return value & 0xFFFFFFFF


def mutate(pkt: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Flips 1-3 bits in one header field, or in the payload.

    A WRTE payload's first byte stays 0, so that it never becomes a valid
    sync request; flips of an OPEN's `sync:` or `zz-<hex>` cannot spell
    another service (that takes more than 3 bits)."""
    fields = list(HEADER.unpack(pkt[:HEADER.size]))
    payload = bytearray(pkt[HEADER.size:])
    first = 1 if fields[0] == A_WRTE else 0
    choices = FIELDS + (["payload"] if len(payload) > first else [])
    which = rng.choice(choices)
    if which == "payload":
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(first, len(payload))
            payload[i] ^= 1 << rng.randrange(8)
    else:
        i = FIELDS.index(which)
        fields[i] = flip(fields[i], rng)
    return HEADER.pack(*fields) + bytes(payload), which


def random_length(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.55:
        return rng.randrange(0, 64)
    if r < 0.75:
        return rng.randrange(64, MAX_PAYLOAD + 1)
    if r < 0.9:
        return MAX_PAYLOAD
    return rng.randrange(MAX_PAYLOAD + 1, 1 << 32)


# --- phase a: random and mutated packets ----------------------------------------

def one_fuzz_connection(sockets: Sockets, index: int, per_conn: int) -> tuple[str, str, int]:
    """Returns (kind, outcome, packets sent)."""
    rng = random.Random(f"{SEED}-a-{index}")
    kind = rng.choice(["garbage", "random-fields", "mutated-cnxn", "post-cnxn",
                       "post-cnxn", "post-cnxn-stream", "post-cnxn-stream"])
    s = sockets.open()
    sent = 0
    try:
        if kind == "garbage":
            # Random 24-byte headers, some with random payload bytes after.
            data = b"".join(rng.randbytes(24) + (blob(rng, rng.randrange(0, 200))
                                                  if rng.random() < 0.3 else b"")
                            for _ in range(per_conn))
            s.sendall(data)
            sent = per_conn
            return kind, outcome(s, 3.0), sent
        local, remote = 0, 0
        if kind in ("post-cnxn", "post-cnxn-stream"):
            cnxn(s)
            sent += 1
            if kind == "post-cnxn-stream":
                s.sendall(packet(A_OPEN, 1, 0, b"sync:\0"))
                sent += 1
                cmd, a0, a1, _l, _d, _rest = read_packet(s, 5.0)
                assert cmd == A_OKAY and a1 == 1, f"sync: not accepted: {cmd:#x}"
                local, remote = 1, a0
        elif kind == "mutated-cnxn":
            pkt, _ = mutate(packet(A_CNXN, A_VERSION, MAX_PAYLOAD, b"host::\0"), rng)
            s.sendall(pkt)
            sent += 1
        while sent < per_conn:
            if kind == "random-fields":
                # A valid command and magic, random everything else.
                cmd = rng.choice(COMMANDS)
                length = random_length(rng)
                hdr = HEADER.pack(cmd, rng.getrandbits(32), rng.getrandbits(32), length,
                                  rng.getrandbits(32), cmd ^ 0xFFFFFFFF)
                body = blob(rng, length) if length <= MAX_PAYLOAD else b""
                pkt = hdr + body
            else:
                pkt = template(rng, local, remote)
                if rng.random() < 0.4:
                    pkt, _ = mutate(pkt, rng)
            s.sendall(pkt)
            sent += 1
        return kind, outcome(s, 0.3), sent
    except ConnectionError:  # reset, broken pipe, or EOF while reading a reply
        return kind, "daemon-closed", sent
    except socket.timeout:  # the daemon stopped reading, or did not answer
        return kind, "timeout", sent
    finally:
        s.close()


def template(rng: random.Random, local: int, remote: int) -> bytes:
    """A valid post-CNXN packet: OPEN, WRTE, OKAY or CLSE."""
    cmd = rng.choice([A_OPEN, A_OPEN, A_WRTE, A_WRTE, A_OKAY, A_CLSE])
    if cmd == A_OPEN:
        name = b"sync:" if rng.random() < 0.3 else hexname(rng, rng.randrange(1, 40))
        return packet(A_OPEN, rng.randrange(2, 1000), 0, name + b"\0")
    if cmd == A_WRTE:
        n = rng.choice([0, 1, 8, rng.randrange(0, 4096), rng.randrange(0, MAX_PAYLOAD + 1),
                        MAX_PAYLOAD])
        data = bytearray(blob(rng, n))
        if data:
            data[0] = 0  # never a valid sync request
        return packet(A_WRTE, local or 1, remote or rng.randrange(1, 10), bytes(data))
    if cmd == A_OKAY:
        return packet(A_OKAY, local or 1, remote or rng.randrange(1, 10))
    return packet(A_CLSE, local or 1, remote or rng.randrange(1, 10))


def phase_fuzz(d, sockets: Sockets, n_conns: int = 1500, per_conn: int = 12,
               workers: int = 12, deadline_s: float = 45.0) -> dict:
    mark = d.log_size()
    deadline = time.monotonic() + deadline_s
    results: list[tuple[str, str, int]] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(n_conns))

    def worker():
        while time.monotonic() < deadline:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            try:
                r = one_fuzz_connection(sockets, i, per_conn)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(f"connection {i}: {e!r}")
                continue
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic() + 10))
    assert not any(t.is_alive() for t in threads), "phase a: workers still running"
    assert not errors, f"phase a: {len(errors)} connection(s) failed oddly: {errors[:10]}"
    assert len(results) == n_conns, (
        f"phase a: only {len(results)} of {n_conns} connections done within {deadline_s}s")

    by = Counter((k, o) for k, o, _ in results)
    packets = sum(n for _, _, n in results)
    closed = sum(1 for _, o, _ in results if o == "daemon-closed")
    garbage_open = by[("garbage", "open")] + by[("garbage", "timeout")]
    assert garbage_open == 0, f"phase a: {garbage_open} garbage connection(s) not closed: {by}"
    assert by_outcome(results, "timeout") == 0, (
        f"phase a: the daemon stopped reading or answering on some connection(s): {by}")

    # Every connection the daemon closed has its WARN line with the reason.
    def reasons() -> Counter:
        return warn_closing_reasons(d.log_since(mark).decode("utf-8", "replace"))
    t_end = time.monotonic() + 5
    while protocol_errors(reasons()) < closed and time.monotonic() < t_end:
        time.sleep(0.1)
    why = reasons()
    assert protocol_errors(why) >= closed, (
        f"phase a: {closed} connections closed by the daemon but only "
        f"{protocol_errors(why)} WARN 'closing connection' lines for protocol errors: {why}")
    refused = d.log_since(mark).count(b"refusing connection")
    assert refused == 0, f"phase a: {refused} connection(s) refused at <= 14 at once"
    return {"connections": len(results), "packets": packets, "daemon_closed": closed,
            "by_kind_outcome": dict(sorted(by.items())), "warn_reasons": dict(why)}


def protocol_errors(why: Counter) -> int:
    """WARN closings the daemon decided on: not the ones our own close caused
    (a reset, or EOF inside a packet)."""
    return sum(n for reason, n in why.items() if not reason.startswith(("I/O error", "truncated")))


def by_outcome(results, name: str) -> int:
    return sum(1 for _, o, _ in results if o == name)


# --- phase b: OPEN flood ------------------------------------------------------

def phase_open_flood(d, port: int, tmp_path: Path) -> dict:
    mark = d.log_size()
    c = RawClient(port)
    try:
        c.connect()
        n = 5 * MAX_STREAMS
        c.sock.sendall(b"".join(packet(A_OPEN, i, 0, b"sync:\0") for i in range(1, n + 1)))
        accepted: dict[int, int] = {}
        refused: set[int] = set()
        deadline = time.monotonic() + 20
        while len(accepted) + len(refused) < n:
            assert time.monotonic() < deadline, (
                f"phase b: {len(accepted)} OKAY + {len(refused)} CLSE of {n} OPENs in 20 s")
            p = c.recv(max(0.1, deadline - time.monotonic()))
            if p.command == A_OKAY:
                accepted[p.arg1] = p.arg0
            elif p.command == A_CLSE and p.arg0 == 0:
                refused.add(p.arg1)
            else:
                raise AssertionError(f"phase b: unexpected {p!r}")
        assert sorted(accepted) == list(range(1, MAX_STREAMS + 1)), (
            f"phase b: accepted {len(accepted)} streams (want ids 1..{MAX_STREAMS}): "
            f"{sorted(accepted)[:10]}...")
        assert refused == set(range(MAX_STREAMS + 1, n + 1)), (
            f"phase b: refused {len(refused)} (want {n - MAX_STREAMS})")
        line = "refusing OPEN: the connection already has its maximum of streams"
        t_end = time.monotonic() + 5
        while d.log_since(mark).count(line.encode()) < n - MAX_STREAMS and time.monotonic() < t_end:
            time.sleep(0.1)
        logged = d.log_since(mark).count(line.encode())
        assert logged == n - MAX_STREAMS, f"phase b: {logged} '{line}' lines, want {n - MAX_STREAMS}"

        # Still full: more OPENs are refused, the connection stays up.
        c.sock.sendall(b"".join(packet(A_OPEN, i, 0, b"sync:\0") for i in range(n + 1, n + 11)))
        more = [c.recv(5) for _ in range(10)]
        assert all(p.command == A_CLSE and p.arg0 == 0 for p in more), f"phase b: {more}"

        # An accepted stream serves requests: STAT the test's tmp dir.
        path = str(tmp_path).encode()
        c.send(A_WRTE, 1, accepted[1], b"STAT" + struct.pack("<I", len(path)) + path)
        got_okay = got_stat = False
        while not (got_okay and got_stat):
            p = c.recv(5)
            if p.command == A_OKAY and p.arg1 == 1:
                got_okay = True
            elif p.command == A_WRTE and p.arg1 == 1:
                assert p.data[:4] == b"STAT" and len(p.data) == 16, f"phase b: {p!r}"
                mode = struct.unpack("<I", p.data[4:8])[0]
                assert mode & 0o170000 == 0o040000, f"phase b: STAT mode {mode:o}"
                c.send(A_OKAY, 1, accepted[1])
                got_stat = True
            else:
                raise AssertionError(f"phase b: unexpected {p!r} while STATing")

        # Close every stream; each gets its CLSE answer, then a new stream works.
        c.sock.sendall(b"".join(packet(A_CLSE, lid, rid) for lid, rid in accepted.items()))
        closed: set[int] = set()
        deadline = time.monotonic() + 10
        while closed != set(accepted):
            assert time.monotonic() < deadline, (
                f"phase b: {len(closed)} of {len(accepted)} streams answered CLSE")
            p = c.recv(max(0.1, deadline - time.monotonic()))
            if p.command == A_CLSE:
                closed.add(p.arg1)
        c._next_id = 10_000
        deadline = time.monotonic() + 5
        while True:
            try:
                out = c.run_service("exec:echo after-open-flood", timeout=PROBE_DEADLINE)
                break
            except ProtocolError as e:  # refused: a slot is freed just after the CLSE
                assert "refused" in str(e) and time.monotonic() < deadline, f"phase b: {e}"
                time.sleep(0.1)
        assert out == b"after-open-flood\n", f"phase b: {out!r}"
        return {"opens": n + 10, "accepted": len(accepted), "refused": len(refused) + 10}
    finally:
        c.close()


# --- phase c: connection flood --------------------------------------------------

def wait_sockets(d, want: int, timeout: float, what: str) -> int:
    deadline = time.monotonic() + timeout
    while True:
        socks = proc_stats(d.proc.pid)[2]
        if socks <= want:
            return socks
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: the daemon holds {socks} sockets after "
                                 f"{timeout}s, want <= {want}")
        time.sleep(0.05)


def phase_connection_flood(d, sockets: Sockets, checker: Checker, base_socks: int) -> dict:
    with checker.fresh_lock:
        # Only the long-lived good connection may be left from earlier phases.
        wait_sockets(d, base_socks, 10, "phase c (before)")
        time.sleep(0.5)  # the slot is freed just after the socket is closed
        mark = d.log_size()
        n = 2 * MAX_CONNECTIONS
        conns = [sockets.open() for _ in range(n)]
        for s in conns:
            s.sendall(packet(A_CNXN, A_VERSION, MAX_PAYLOAD, b"host::\0"))
        served, refused = [], []
        t0 = time.monotonic()
        for s in conns:
            try:
                cmd = read_packet(s, 5.0)[0]
                assert cmd == A_CNXN, f"phase c: {cmd:#x}"
                served.append(s)
            except (ConnectionError, OSError):
                refused.append(s)
        took = time.monotonic() - t0
        assert len(served) == MAX_CONNECTIONS - 1, (
            f"phase c: {len(served)} of {n} connections served, want {MAX_CONNECTIONS - 1} "
            f"(max {MAX_CONNECTIONS}, one slot held by the good client)")
        logged = d.log_since(mark).count(b"refusing connection: the daemon serves its maximum")
        assert logged == len(refused), f"phase c: {logged} refusal lines for {len(refused)}"

        # Full: a well-behaved newcomer is turned away too, the old one works on.
        probe = RawClient(d.port, timeout=5)
        try:
            with pytest.raises((ConnectionError, OSError)):
                probe.connect(timeout=5)
        finally:
            probe.close()

        for s in served:
            s.close()
        for s in refused:
            s.close()
        wait_sockets(d, base_socks, 5, "phase c (release)")
        time.sleep(0.5)
        fresh_probe(d.port, 0)
        fresh_probe(d.port, 1)
        return {"opened": n, "served": len(served), "refused": len(refused) + 1,
                "answered_in_s": round(took, 2)}


# --- phase d: half-open and stalled connections -----------------------------------

def phase_stalls(d, sockets: Sockets) -> dict:
    mark = d.log_size()
    pid = d.proc.pid
    rss0 = proc_stats(pid)[0]
    # Before CNXN: silent, and stalled inside a header. The handshake timeout closes them.
    timed: list[tuple[socket.socket, float, str]] = []
    for _ in range(6):
        timed.append((sockets.open(), time.monotonic(), "silent"))
    for _ in range(4):
        s = sockets.open()
        t = time.monotonic()
        s.sendall(packet(A_CNXN, A_VERSION, MAX_PAYLOAD, b"host::\0")[:10])
        timed.append((s, t, "partial header before CNXN"))

    stalled = []
    # After CNXN: stalled inside a header.
    for _ in range(4):
        s = sockets.open()
        cnxn(s)
        s.sendall(header(A_WRTE, 1, 1, b"", length=100)[:10])
        stalled.append(s)
    # After CNXN: a max-size WRTE announced, half of it sent.
    for _ in range(4):
        s = sockets.open()
        cnxn(s)
        s.sendall(packet(A_OPEN, 1, 0, b"sync:\0"))
        cmd, rid, _a1, _l, _dt, _r = read_packet(s, 5)
        assert cmd == A_OKAY, f"phase d: sync: refused ({cmd:#x})"
        s.sendall(header(A_WRTE, 1, rid, b"", length=PACKET) + _BLOB[:PACKET // 2])
        stalled.append(s)
    # Stalled consumers: streams with much output, never read nor acknowledged.
    s = sockets.open()
    s.sendall(packet(A_CNXN, A_VERSION, MAX_PAYLOAD, b"host::\0")
              + packet(A_OPEN, 1, 0, b"exec:head -c 50000000 /dev/zero\0"))
    stalled.append(s)
    s = sockets.open()
    s.sendall(packet(A_CNXN, A_VERSION, MAX_PAYLOAD, b"host::features=delayed_ack\0")
              + packet(A_OPEN, 1, 0x7FFFFFFF, b"exec:head -c 200000000 /dev/zero\0"))
    stalled.append(s)

    # The handshake timeout closes the first group, not before it expires.
    closings = []
    for s, t, what in timed:
        how = outcome(s, max(0.1, t + HANDSHAKE_TIMEOUT + 3 - time.monotonic()))
        after = time.monotonic() - t
        assert how == "daemon-closed", (
            f"phase d: {what} connection still open {after:.1f}s after accept "
            f"(handshake timeout {HANDSHAKE_TIMEOUT}s)")
        assert after >= HANDSHAKE_TIMEOUT - 0.3, (
            f"phase d: {what} connection closed after {after:.2f}s, before the "
            f"{HANDSHAKE_TIMEOUT}s handshake timeout")
        closings.append(after)
        s.close()
    t_end = time.monotonic() + 3
    line = b"closing connection: no CNXN in time"
    while d.log_since(mark).count(line) < len(timed) and time.monotonic() < t_end:
        time.sleep(0.1)
    logged = d.log_since(mark).count(line)
    assert logged >= len(timed), f"phase d: {logged} 'no CNXN in time' lines for {len(timed)}"

    # Hold the stalls while the checker keeps probing.
    time.sleep(STALL_HOLD)
    still_open = sum(1 for s in stalled if peek_open(s))
    rss1 = proc_stats(pid)[0]
    for s in stalled:
        s.close()
    return {"handshake_closed": len(timed),
            "closed_after_s": f"{min(closings):.2f}..{max(closings):.2f}",
            "stalled": len(stalled), "stalled_still_open": still_open,
            "rss_delta_mib_while_stalled": round((rss1 - rss0) / MIB, 1)}


# --- phase e: maximum-size payloads ---------------------------------------------------

def push_max_wrtes(port: int, count: int) -> int:
    """Sends `count` WRTEs of exactly PACKET into `wc -c`; returns its count."""
    c = RawClient(port)
    try:
        c.connect()
        assert c.max_payload == PACKET, f"phase e: the daemon offers {c.max_payload}"
        c.send(A_OPEN, 1, 0, b"shell,v2,raw:wc -c\0")
        p = c.recv(5)
        assert p.command == A_OKAY and p.arg1 == 1, f"phase e: wc refused: {p!r}"
        rid = p.arg0
        chunk = PACKET - 5
        frame = bytes([0]) + struct.pack("<I", chunk) + _BLOB[:chunk]
        assert len(frame) == PACKET
        out = bytearray()
        for _ in range(count):
            c.send(A_WRTE, 1, rid, frame)
            while True:  # classic: wait for the OKAY before the next WRTE
                p = c.recv(PROBE_DEADLINE)
                if p.command == A_OKAY:
                    break
                assert p.command == A_WRTE, f"phase e: {p!r}"
                out += p.data
                c.send(A_OKAY, 1, rid)
        c.send(A_WRTE, 1, rid, bytes([4]) + struct.pack("<I", 0))  # close stdin
        deadline = time.monotonic() + PROBE_DEADLINE
        while True:
            p = c.recv(max(0.1, deadline - time.monotonic()))
            if p.command == A_WRTE:
                out += p.data
                c.send(A_OKAY, 1, rid)
            elif p.command == A_CLSE:
                break
        frames, stdout, status = bytes(out), b"", None
        while frames:
            fid, n = frames[0], struct.unpack("<I", frames[1:5])[0]
            data, frames = frames[5:5 + n], frames[5 + n:]
            if fid == 1:
                stdout += data
            elif fid == 3:
                status = data[0]
        assert status == 0, f"phase e: wc exit status {status}, stdout {stdout!r}"
        return int(stdout.split()[0])
    finally:
        c.close()


def phase_max_payloads(d, sockets: Sockets) -> dict:
    mark = d.log_size()
    counts, errors = [], []

    def pusher():
        try:
            counts.append(push_max_wrtes(d.port, 8))
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=pusher, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(counts) == 4, f"phase e: pushes failed: {errors}"
    want = 8 * (PACKET - 5)
    assert counts == [want] * 4, f"phase e: wc -c said {counts}, want {want} each"

    # A max-size OPEN: refused (no such service), the connection goes on.
    c = RawClient(d.port)
    try:
        c.connect()
        name = b"zz-" + b"ab" * ((PACKET - 4) // 2)
        name = name[:PACKET - 1] + b"\0"
        assert len(name) == PACKET
        c.send(A_OPEN, 1, 0, name)
        p = c.recv(5)
        assert p.command == A_CLSE and p.arg0 == 0 and p.arg1 == 1, f"phase e: {p!r}"
        c._next_id = 2
        assert c.run_service("exec:echo after-max-open") == b"after-max-open\n"
    finally:
        c.close()

    # One byte over the limit closes the connection: the daemon's own, and a
    # smaller one the host asked for.
    over = 0
    for asked, limit in [(MAX_PAYLOAD, PACKET)] * 3 + [(4096, 4096)] * 3:
        length = limit + 1
        s = sockets.open()
        got, _ = cnxn(s, max_payload=asked)
        assert got == limit, f"phase e: negotiated {got}, asked {asked}"
        try:
            s.sendall(header(A_WRTE, 1, 1, b"", length=length))
            s.sendall(_BLOB[:length])
        except OSError:
            pass
        assert outcome(s, 5) == "daemon-closed", f"phase e: WRTE of {length} > {limit} kept"
        s.close()
        over += 1
    t_end = time.monotonic() + 3
    while d.log_since(mark).count(b"exceeds max payload") < over and time.monotonic() < t_end:
        time.sleep(0.1)
    logged = d.log_since(mark).count(b"exceeds max payload")
    assert logged >= over, f"phase e: {logged} 'exceeds max payload' lines for {over}"
    return {"max_wrtes_pushed": 4 * 8, "bytes_counted": sum(counts), "oversize_closed": over}


# --- the test -------------------------------------------------------------------

# What Rust and glibc print when a process panics or aborts ("abort" alone
# would match strerror(ECONNABORTED), "Software caused connection abort").
PANIC = re.compile(rb"panicked|\bpanic\b|fatal runtime error|memory allocation of .* failed|"
                   rb"aborting|SIGABRT|core dumped|RUST_BACKTRACE", re.IGNORECASE)


def test_hostile_load(fresh_daemon, tmp_path):
    t_start = time.monotonic()
    print(f"\nhostile load: SEED={SEED} (set HOSTILE_LOAD_SEED to replay)")
    d = fresh_daemon(name="hostile-load", args=LIMITS)
    pid = d.proc.pid
    phase = ["setup"]
    sockets = Sockets(d.port)
    good = RawClient(d.port, timeout=PROBE_DEADLINE)
    sampler = checker = None
    report: dict = {}
    try:
        good.connect()
        # Warm up what the daemon sets up lazily (process spawning, signal
        # handling, the blocking pool) so the baseline is the steady state.
        assert good.run_service("exec:echo warm") == b"warm\n"
        fresh_probe(d.port, 0)
        fresh_probe(d.port, 1)
        time.sleep(0.3)
        base_rss, base_fds, base_socks = proc_stats(pid)
        print(f"baseline (good client connected): RSS {base_rss / MIB:.1f} MiB, "
              f"{base_fds} fds, {base_socks} sockets; bounds: RSS +{RSS_BOUND / MIB:.0f} MiB, "
              f"fds +{FD_BOUND}")

        sampler = Sampler(pid, lambda: phase[0])
        sampler.start()
        checker = Checker(d.port, good, lambda: phase[0])
        checker.start()

        def run(name: str, fn, *args):
            assert time.monotonic() - t_start < TOTAL_DEADLINE, f"out of time before {name}"
            phase[0] = name
            t = time.monotonic()
            mark = d.log_size()
            try:
                result = fn(*args)
            except AssertionError as e:
                tail = d.log_since(mark).decode("utf-8", "replace")[-4000:]
                raise AssertionError(f"{e}\n--- daemon log tail ({name}) ---\n{tail}") from None
            result["seconds"] = round(time.monotonic() - t, 1)
            report[name] = result
            print(f"{name}: {result}")
            assert d.alive(), f"the daemon exited during {name}: {d.proc.returncode}"
            assert not checker.failures, f"good client failed during {name}: {checker.failures}"

        run("a-fuzz", phase_fuzz, d, sockets)
        run("b-open-flood", phase_open_flood, d, d.port, tmp_path)
        run("c-connection-flood", phase_connection_flood, d, sockets, checker, base_socks)
        run("d-stalls", phase_stalls, d, sockets)
        run("e-max-payloads", phase_max_payloads, d, sockets)

        phase[0] = "after"
        checker.stop.set()
        checker.join(2 * PROBE_DEADLINE + 5)
        assert not checker.is_alive(), "the checker is stuck"
        assert not checker.failures, f"good client failures: {checker.failures}"
        assert checker.done["long-lived"] >= 10 and checker.done["fresh"] >= 10, (
            f"too few probes ran during the attack: {dict(checker.done)}")
        # The good client, after: its old connection and new ones.
        assert good.run_service("exec:echo after") == b"after\n"
        fresh_probe(d.port, 1000)
        fresh_probe(d.port, 1001)

        sockets.close_all()
        sampler.stop.set()
        sampler.join(5)
        peak_rss, peak_rss_phase = sampler.peak_rss
        peak_fds, peak_fds_phase = sampler.peak_fds
        print(f"peaks over {sampler.samples} samples: RSS {peak_rss / MIB:.1f} MiB "
              f"(+{(peak_rss - base_rss) / MIB:.1f}, bound +{RSS_BOUND / MIB:.0f}) in "
              f"{peak_rss_phase}; fds {peak_fds} (+{peak_fds - base_fds}, bound +{FD_BOUND}) "
              f"in {peak_fds_phase}; slowest probe {checker.slowest[0]:.2f}s "
              f"({checker.slowest[1]}); probes {dict(checker.done)}")
        assert sampler.error is None, f"sampling failed (daemon gone?): {sampler.error}"
        assert peak_rss - base_rss <= RSS_BOUND, (
            f"RSS peaked at {peak_rss / MIB:.1f} MiB in {peak_rss_phase}: "
            f"{(peak_rss - base_rss) / MIB:.1f} MiB over the baseline, bound "
            f"{RSS_BOUND / MIB:.0f} MiB; phases: {report}")
        assert peak_fds - base_fds <= FD_BOUND, (
            f"open descriptors peaked at {peak_fds} in {peak_fds_phase}: "
            f"{peak_fds - base_fds} over the baseline {base_fds}, bound {FD_BOUND}")

        # No leak: descriptors back to the baseline, no child left.
        deadline = time.monotonic() + 5
        while True:
            rss, fds, socks = proc_stats(pid)
            kids = children_of(pid)
            if (fds <= base_fds and not kids) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        names = sorted(os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd"))
        assert fds <= base_fds, (
            f"descriptors leaked: {fds} open 5 s after the attack, baseline {base_fds}: {names}")
        assert not kids, f"child processes left 5 s after the attack: {kids}"
        print(f"after: RSS {rss / MIB:.1f} MiB, {fds} fds, {socks} sockets; "
              f"total {time.monotonic() - t_start:.1f}s")

        assert d.alive(), f"the daemon exited: {d.proc.returncode}"
        log = d.log_since(0)
        bad = [ln for ln in log.splitlines() if PANIC.search(ln)]
        assert not bad, f"panic/abort in the daemon log: {bad[:5]}"
    finally:
        if checker is not None:
            checker.stop.set()
            checker.join(2 * PROBE_DEADLINE + 5)
        if sampler is not None:
            sampler.stop.set()
        sockets.close_all()
        good.close()


# --- floods the daemon must not buffer without limit ------------------------------

def flood_until_bound(d, s: socket.socket, chunk: bytes, max_bytes: int, bound: int,
                      seconds: float) -> tuple[str, int, int]:
    """Sends `chunk` repeatedly (never reading) until the daemon closes the
    connection, stops reading (TCP backpressure for 3 s), its RSS exceeds
    baseline + `bound`, `max_bytes` went out, or `seconds` passed.
    Returns (how it ended, bytes sent, peak RSS over the baseline)."""
    base = proc_stats(d.proc.pid)[0]
    peak = 0
    sent = 0
    deadline = time.monotonic() + seconds
    s.settimeout(3)
    how = "sent all"
    while sent < max_bytes:
        if time.monotonic() >= deadline:
            how = "out of time"
            break
        try:
            s.sendall(chunk)
        except socket.timeout:
            how = "daemon stopped reading"
            break
        except OSError:
            how = "daemon closed"
            break
        sent += len(chunk)
        peak = max(peak, proc_stats(d.proc.pid)[0] - base)
        if peak > bound:
            how = "bound exceeded"
            break
    time.sleep(0.3)
    if d.alive():
        peak = max(peak, proc_stats(d.proc.pid)[0] - base)
    return how, sent, peak


@pytest.mark.parametrize("mode", ["classic", "delayed_ack"])
def test_wrte_beyond_credit_is_not_buffered_without_limit(fresh_daemon, mode):
    """A host that ignores flow control, writing into a stream whose consumer
    (`sleep`) never reads, may not make the daemon hold more than the stream's
    credit. Bound: the memory budget (64 MiB) + 32 MiB (the stream's own
    local buffer of two packets, a read buffer, allocator slack). A daemon may close
    the connection (a protocol violation) or stop reading it; it may not
    buffer what it was sent: the flood goes on up to 4x the bound."""
    d = fresh_daemon(name=f"wrte-flood-{mode}", args=LIMITS)
    bound = MEMORY_BUDGET + 32 * MIB
    good = RawClient(d.port)
    c = RawClient(d.port)
    try:
        good.connect()
        assert good.run_service("exec:echo before") == b"before\n"
        if mode == "classic":
            c.connect()
            c.send(A_OPEN, 1, 0, b"exec:sleep 30\0")
        else:
            c.connect(banner=b"host::features=delayed_ack\0")
            c.send(A_OPEN, 1, MAX_PAYLOAD, b"exec:sleep 30\0")
        p = c.recv(5)
        assert p.command == A_OKAY, p
        grant = struct.unpack("<i", p.data)[0] if p.data else None
        chunk = packet(A_WRTE, 1, p.arg0, _BLOB[:PACKET])
        how, sent, peak = flood_until_bound(d, c.sock, chunk, 4 * bound, bound, 30)
        print(f"\n{mode}: granted {grant}; sent {sent / MIB:.0f} MiB of WRTEs without "
              f"waiting; ended: {how}; daemon RSS +{peak / MIB:.0f} MiB (bound "
              f"{bound / MIB:.0f} MiB)")
        assert d.alive(), "the daemon died"
        assert peak <= bound, (
            f"{mode}: the daemon buffered a WRTE flood beyond the stream's credit "
            f"(granted {grant}): {sent / MIB:.0f} MiB sent without waiting for OKAYs into "
            f"`sleep` (never reads), RSS +{peak / MIB:.0f} MiB > bound {bound / MIB:.0f} MiB "
            f"({how})")
        c.close()
        assert good.run_service("exec:echo after") == b"after\n"
    finally:
        c.close()
        good.close()


def test_unread_replies_are_not_buffered_without_limit(fresh_daemon):
    """A host that sends packets the daemon answers (empty WRTEs on an open
    `sync:` stream: one OKAY each) and never reads the answers. Once the
    socket buffers are full the daemon must stop reading (or close the
    connection) rather than queue answers without limit. Bound: 64 MiB."""
    d = fresh_daemon(name="unread-replies", args=LIMITS)
    bound = 64 * MIB
    good = RawClient(d.port)
    c = RawClient(d.port)
    try:
        good.connect()
        c.connect()
        c.send(A_OPEN, 1, 0, b"sync:\0")
        p = c.recv(5)
        assert p.command == A_OKAY, p
        chunk = packet(A_WRTE, 1, p.arg0) * 40000  # 960,000 bytes: 40,000 OKAYs owed
        how, sent, peak = flood_until_bound(d, c.sock, chunk, 4 * bound, bound, 30)
        print(f"\nsent {sent // 24} empty WRTEs ({sent / MIB:.0f} MiB), never read the "
              f"OKAYs; ended: {how}; daemon RSS +{peak / MIB:.0f} MiB")
        assert d.alive(), "the daemon died"
        assert peak <= bound, (
            f"the daemon queued replies without limit: {sent // 24} empty WRTEs "
            f"({sent / MIB:.0f} MiB) whose OKAYs the host never read, RSS "
            f"+{peak / MIB:.0f} MiB > bound {bound / MIB:.0f} MiB ({how})")
        c.close()
        assert good.run_service("exec:echo after") == b"after\n"
    finally:
        c.close()
        good.close()
