"""`oxadb server`: the host requests beyond adb 29's, against real peers.

Reuses test_server.py's `server` (an `oxadb server -P PORT`), `device` and
`ours` (adb 29's CLI on it, connected to the device). Google's adb 34.0.5
(test_adb34.py's `adb34_bin`) runs as the reference server where it serves
the request; python's protobuf (an implementation independent of prost)
decodes what adb 34 cannot serve yet (proto lists and server-status are
newer than 34.0.5):

  * track-devices-proto-binary: adb.proto.Devices, one message per change;
  * track-devices-proto-text: what protobuf's text format prints for it;
  * server-status: AdbServerStatus, with what is true of this server;
  * attach / detach, reconnect-offline: adb 34's CLI gets the same output
    from our server as from Google's, for the same oxadbd;
  * -L tcp:PORT, tcp:localhost:PORT, tcp:[::1]:PORT and -a bind what adb
    34's server binds; another host name is refused by both;
  * host:connect:vsock:... answers as adb 34's server does.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from harness import AdbServer, clean_env, free_port, resolve_oxadb, stop_process
from test_adb34 import adb34_bin  # noqa: F401 (fixture)
from test_server import Client, _request, device, ours, server  # noqa: F401 (fixtures)


# --- adb_host.proto's messages, built at run time (no protoc) ---------------

def _messages():
    """Devices and AdbServerStatus as AOSP `proto/adb_host.proto` declares them."""
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="adb_host_test.proto", package="adb.proto",
                                           syntax="proto3")

    def enum(parent, name, values):
        e = parent.enum_type.add(name=name)
        for number, value in enumerate(values):
            e.value.add(name=value, number=number)

    def field(msg, name, number, kind, type_name=None, repeated=False, optional=False):
        fd = msg.field.add(name=name, number=number, type=kind,
                           label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if type_name:
            fd.type_name = type_name
        if optional:
            fd.proto3_optional = True
            fd.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=f"_{name}")

    enum(f, "ConnectionState", ["ANY", "CONNECTING", "AUTHORIZING", "UNAUTHORIZED",
                                "NOPERMISSION", "DETACHED", "OFFLINE", "BOOTLOADER", "DEVICE",
                                "HOST", "RECOVERY", "SIDELOAD", "RESCUE"])
    enum(f, "ConnectionType", ["UNKNOWN", "USB", "SOCKET"])
    d = f.message_type.add(name="Device")
    for name, number, kind, type_name in [
            ("serial", 1, F.TYPE_STRING, None),
            ("state", 2, F.TYPE_ENUM, ".adb.proto.ConnectionState"),
            ("bus_address", 3, F.TYPE_STRING, None), ("product", 4, F.TYPE_STRING, None),
            ("model", 5, F.TYPE_STRING, None), ("device", 6, F.TYPE_STRING, None),
            ("connection_type", 7, F.TYPE_ENUM, ".adb.proto.ConnectionType"),
            ("negotiated_speed", 8, F.TYPE_INT64, None), ("max_speed", 9, F.TYPE_INT64, None),
            ("transport_id", 10, F.TYPE_INT64, None)]:
        field(d, name, number, kind, type_name)
    field(f.message_type.add(name="Devices"), "device", 1, F.TYPE_MESSAGE, ".adb.proto.Device",
          repeated=True)
    s = f.message_type.add(name="AdbServerStatus")
    enum(s, "UsbBackend", ["UNKNOWN_USB", "NATIVE", "LIBUSB", "USB_DISABLED"])
    enum(s, "MdnsBackend", ["UNKNOWN_MDNS", "BONJOUR", "OPENSCREEN", "LIBADBMDNS",
                            "MDNS_DISABLED"])
    for name, number, kind, type_name, optional in [
            ("usb_backend", 1, F.TYPE_ENUM, ".adb.proto.AdbServerStatus.UsbBackend", False),
            ("usb_backend_forced", 2, F.TYPE_BOOL, None, False),
            ("mdns_backend", 3, F.TYPE_ENUM, ".adb.proto.AdbServerStatus.MdnsBackend", False),
            ("mdns_backend_forced", 4, F.TYPE_BOOL, None, False),
            ("version", 5, F.TYPE_STRING, None, False), ("build", 6, F.TYPE_STRING, None, False),
            ("executable_absolute_path", 7, F.TYPE_STRING, None, False),
            ("log_absolute_path", 8, F.TYPE_STRING, None, False),
            ("os", 9, F.TYPE_STRING, None, False),
            ("trace_level", 10, F.TYPE_STRING, None, True),
            ("burst_mode", 11, F.TYPE_BOOL, None, True),
            ("mdns_enabled", 12, F.TYPE_BOOL, None, True),
            ("keystore_path", 13, F.TYPE_STRING, None, True),
            ("known_hosts_path", 14, F.TYPE_STRING, None, True)]:
        field(s, name, number, kind, type_name, optional=optional)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    get = lambda name: message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    return get("adb.proto.Devices"), get("adb.proto.AdbServerStatus")


Devices, AdbServerStatus = _messages()


# --- raw smart-socket helpers ------------------------------------------------

class Tracker:
    """A `host:track-devices*` connection: the OKAY, then one message per read."""

    def __init__(self, port: int, request: bytes):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(b"%04x" % len(request) + request)
        assert self._exact(4) == b"OKAY"

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, f"tracker closed after {out!r}"
            out += chunk
        return out

    def next(self) -> bytes:
        return self._exact(int(self._exact(4), 16))

    def close(self) -> None:
        self.sock.close()


def _okay_payload(reply: bytes) -> bytes:
    assert reply[:4] == b"OKAY", reply
    length = int(reply[4:8], 16)
    assert len(reply) == 8 + length, reply
    return reply[8:]


def _transport_id(client: Client, serial: str) -> int:
    line = next(l for l in client("devices", "-l").out.splitlines() if l.startswith(serial + " "))
    return int(re.search(r"transport_id:(\d+)$", line).group(1))


def _banner_fields(client: Client, serial: str) -> dict[str, str]:
    line = next(l for l in client("devices", "-l").out.splitlines() if l.startswith(serial + " "))
    return dict(re.findall(r"(product|model|device):(\S+)", line))


# --- proto device lists -----------------------------------------------------

def test_track_devices_proto_binary_is_adbs_devices_message(ours, server, device, fresh_daemon):
    tracker = Tracker(server.port, b"host:track-devices-proto-binary")
    try:
        first = Devices.FromString(tracker.next())
        assert [d.serial for d in first.device] == [device.serial], first
        d = first.device[0]
        states = Devices.DESCRIPTOR.file.enum_types_by_name
        assert states["ConnectionState"].values_by_number[d.state].name == "DEVICE"
        assert states["ConnectionType"].values_by_number[d.connection_type].name == "SOCKET"
        assert d.transport_id == _transport_id(ours, device.serial)
        assert {"product": d.product, "model": d.model,
                "device": d.device} == _banner_fields(ours, device.serial)
        assert (d.bus_address, d.negotiated_speed, d.max_speed) == ("", 0, 0)
        # A change sends the whole list again, in adb's order (by serial).
        other = fresh_daemon("second")  # started, and stopped at teardown
        assert ours("connect", other.serial).out.strip() == f"connected to {other.serial}"
        try:
            deadline = time.monotonic() + 20
            while True:
                listed = Devices.FromString(tracker.next())
                states_now = {x.serial: x.state for x in listed.device}
                if states_now.get(other.serial) == 8:
                    break
                assert time.monotonic() < deadline, listed
            assert [x.serial for x in listed.device] == sorted([device.serial, other.serial])
        finally:
            assert ours("disconnect", other.serial).rc == 0
        gone = Devices.FromString(tracker.next())
        assert [x.serial for x in gone.device] == [device.serial], gone
    finally:
        tracker.close()


def test_track_devices_proto_text_is_protobufs_text_format(ours, server, device):
    binary = Tracker(server.port, b"host:track-devices-proto-binary")
    text = Tracker(server.port, b"host:track-devices-proto-text")
    try:
        decoded = Devices.FromString(binary.next())
        printed = text.next().decode()
        assert printed == text_format.MessageToString(decoded), printed
        assert f'  serial: "{device.serial}"\n  state: DEVICE\n' in printed
        assert printed.startswith("device {\n") and printed.endswith("}\n")
        assert text_format.Parse(printed, Devices()) == decoded
    finally:
        binary.close()
        text.close()


# --- server-status --------------------------------------------------------------

def test_server_status_says_what_this_server_is(server):
    status = AdbServerStatus.FromString(_okay_payload(_request(server.port, b"host:server-status")))
    enums = AdbServerStatus.DESCRIPTOR.enum_types_by_name
    # USB watched through usbfs (no ADB_USB=0 for this server): adb's native backend.
    assert enums["UsbBackend"].values_by_number[status.usb_backend].name == "NATIVE"
    # Browsing (no ADB_MDNS=0) with mdns-sd, a backend adb has no name for.
    assert enums["MdnsBackend"].values_by_number[status.mdns_backend].name == "UNKNOWN_MDNS"
    assert not status.usb_backend_forced and not status.mdns_backend_forced
    assert Path(status.executable_absolute_path) == resolve_oxadb().resolve()
    # Its stderr is the test's log file.
    assert Path(status.log_absolute_path) == server.log_path.resolve()
    uname = os.uname()
    assert status.os == f"{uname.sysname} {uname.release} ({uname.machine})"
    version = subprocess.run([str(resolve_oxadb()), "--version"], stdout=subprocess.PIPE,
                             timeout=30).stdout.decode().split()[-1]
    assert status.version == version and status.build == f"oxadb-{version}"
    assert status.HasField("burst_mode") and status.burst_mode
    assert status.HasField("mdns_enabled") and status.mdns_enabled
    assert status.keystore_path == str(server.home / ".android" / "adbkey")
    assert status.known_hosts_path == str(server.home / ".android" / "adb_known_hosts.pb")
    assert not status.HasField("trace_level")


# --- against Google's adb 34 server --------------------------------------------

@pytest.fixture(scope="module")
def google34(adb34_bin, tmp_path_factory):  # noqa: F811
    srv = AdbServer(adb34_bin, tmp_path_factory.mktemp("adb34-requests"))
    srv.start()
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def ours34(adb34_bin, server, ours, tmp_path_factory) -> Client:  # noqa: F811
    """adb 34's CLI pointed at our server (already connected by `ours`)."""
    return Client(adb34_bin, server.port, tmp_path_factory.mktemp("client34-home"))


def test_attach_and_detach_answer_as_googles(ours34, google34, device):
    google34.connect(device.serial)
    theirs_client = Client(google34.adb, google34.port, google34.home)
    # adb 34 words the refusal as its libusb-only code did; adb since 35
    # (AOSP transport.cpp today) says "attach/detach not supported", with
    # a "!" for detach, which is what we answer.
    newer = {"attach/detach only implemented for libusb backend\n":
             {"attach": "attach/detach not supported\n",
              "detach": "attach/detach not supported!\n"}}
    for args in (("-s", device.serial, "attach"), ("-s", device.serial, "detach"),
                 ("-s", "nosuch:1", "attach"), ("-s", "nosuch:1", "detach")):
        mine, theirs = ours34(*args), theirs_client(*args)
        expected_err = theirs.err
        for old, words in newer.items():
            expected_err = expected_err.replace(old, words[args[-1]])
        assert (mine.rc, mine.out, mine.err) == (theirs.rc, theirs.out, expected_err), \
            (mine, theirs)
    assert ours34("-s", device.serial, "detach").err == \
        "adb: failed to detach: attach/detach not supported!\n"
    # Refused: the device stays in use.
    assert ours34("-s", device.serial, "get-state").out == "device\n"


def _wait_state(client: Client, serial: str, want: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        r = client("devices")
        if f"{serial}\t{want}" in r.out:
            return
        assert time.monotonic() < deadline, f"{serial} not {want}: {r!r}"
        time.sleep(0.1)


def test_reconnect_offline_answers_as_googles_and_reconnects_now(ours34, google34,
                                                                 fresh_daemon):
    d = fresh_daemon("offline")  # started, and stopped at teardown
    google34.connect(d.serial)
    theirs_client = Client(google34.adb, google34.port, google34.home)
    assert ours34("connect", d.serial).out.strip() == f"connected to {d.serial}"
    try:
        # Nothing offline: an empty answer from both.
        mine, theirs = ours34("reconnect", "offline"), theirs_client("reconnect", "offline")
        assert (mine.rc, mine.out, mine.err) == (theirs.rc, theirs.out, theirs.err), (mine, theirs)
        port = d.port
        d.stop()
        _wait_state(ours34, d.serial, "offline")
        _wait_state(theirs_client, d.serial, "offline")
        mine, theirs = ours34("reconnect", "offline"), theirs_client("reconnect", "offline")
        assert (mine.rc, mine.out, mine.err) == (theirs.rc, theirs.out, theirs.err), (mine, theirs)
        assert f"reconnecting {d.serial}\n" in mine.out, mine
        # Back at once, not at the next attempt (every 3 s): twice, so that
        # a scheduled attempt landing in the window cannot pass it alone.
        for _ in range(2):
            d.start(port=port)
            assert _request(ours34.port, b"host:reconnect-offline") == \
                b"OKAY%04x" % len(f"reconnecting {d.serial}") + f"reconnecting {d.serial}".encode()
            _wait_state(ours34, d.serial, "device", timeout=1.5)
            d.stop()
            _wait_state(ours34, d.serial, "offline")
    finally:
        ours34("disconnect", d.serial)
        theirs_client("disconnect", d.serial)


# --- -L and -a ---------------------------------------------------------------------

def _listening(port: int) -> set[str]:
    """The addresses listening on TCP `port`, from /proc/net/tcp and tcp6."""
    found = set()
    for name, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            address, hexport = fields[1].split(":")
            if fields[3] != "0A" or int(hexport, 16) != port:
                continue
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            family = socket.AF_INET if width == 8 else socket.AF_INET6
            found.add(socket.inet_ntop(family, raw))
    return found


def _version_at(host: str, port: int) -> bytes:
    """`host:version` at host:port: everything until the server closes."""
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"000chost:version")
        out = b""
        while chunk := s.recv(64):
            out += chunk
        return out


def _start_listening(argv: list[str], port: int, env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    deadline = time.monotonic() + 20
    while not _listening(port):
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("flags", [("-L", "tcp:{port}"), ("-L", "tcp:localhost:{port}"),
                                   ("-L", "tcp:[::1]:{port}"), ("-a", "-P", "{port}"),
                                   ("-a", "-L", "tcp:localhost:{port}")])
def test_server_sockets_bind_as_googles(flags, adb34_bin, server, tmp_path):  # noqa: F811
    bound = {}
    for who in ("ours", "google"):
        port = free_port()
        args = [a.format(port=port) for a in flags]
        env = clean_env(HOME=str(server.home), TMPDIR=str(tmp_path), ADB_EMU="0", ADB_USB="0",
                        ADB_MDNS="0")
        if who == "ours":
            argv = [str(resolve_oxadb()), "server", *args]
        else:
            argv = [adb34_bin, *args, "server", "nodaemon"]
        proc = _start_listening(argv, port, env, tmp_path / f"{who}.log")
        try:
            bound[who] = _listening(port)
            # adb 34's CLI reaches it by the same spec (over IPv6 for ::1).
            spec = [a.format(port=port) for a in flags if a != "-a"]
            r = subprocess.run([adb34_bin, *spec, "devices"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env, timeout=30)
            assert r.returncode == 0 and b"List of devices attached" in r.stdout, (who, r)
            for host in ("127.0.0.1", "::1"):
                if {"0.0.0.0", "::"} & bound[who] or host in bound[who]:
                    assert _version_at(host, port) == b"OKAY00040029", (who, host)
        finally:
            stop_process(proc)
    assert bound["ours"] == bound["google"], bound
    if "-a" in flags and "-P" in flags:
        assert bound["ours"] == {"::"}
        assert "-a: listening on every interface" in (tmp_path / "ours.log").read_text()


def test_server_socket_on_another_host_is_refused_as_googles(adb34_bin, server, tmp_path):  # noqa: F811
    env = clean_env(HOME=str(server.home), TMPDIR=str(tmp_path), ADB_EMU="0", ADB_USB="0",
                    ADB_MDNS="0")
    for argv in ([str(resolve_oxadb()), "server"], [adb34_bin]):
        spec = f"tcp:127.0.0.1:{free_port()}"
        tail = [] if argv[0] != adb34_bin else ["server", "nodaemon"]
        r = subprocess.run([*argv, "-L", spec, *tail], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, env=env, timeout=30)
        assert r.returncode != 0, r
        assert b"listening on specified hostname currently unsupported" in r.stdout, r


# --- vsock ----------------------------------------------------------------------------

def test_vsock_connect_answers_as_googles(server, google34):
    for address in ("vsock:x:1", "vsock:1:y", "vsock:1:2:3", "vsock:1:0"):
        request = f"host:connect:{address}".encode()
        mine, theirs = _request(server.port, request), _request(google34.port, request)
        assert mine == theirs, (address, mine, theirs)
    # No vsock transport to itself on this machine (no vsock_loopback):
    # the connect fails in the words of adb's socket_spec_connect.
    address = f"vsock:1:{free_port()}"
    reply = _request(server.port, f"host:connect:{address}".encode(), timeout=30)
    assert reply == _ok(f"could not connect to vsock address '{address}'"), reply


def _ok(text: str) -> bytes:
    return b"OKAY%04x" % len(text) + text.encode()
