#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/<name>).

Each seed is a real frame or an edge case of it, laid out the way its target
reads its input (see the comment at the top of each fuzz_targets/*.rs).
Run it again after changing a layout; files it does not write (reproducers
of fixed crashes, named regress-*) are left alone.
"""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

GOOGLE_HOST_BANNER = (
    b"host::features=shell_v2,cmd,stat_v2,ls_v2,fixed_push_mkdir,apex,abb,"
    b"fixed_push_symlink_timestamp,abb_exec,remount_shell,track_app,sendrecv_v2,"
    b"sendrecv_v2_brotli,sendrecv_v2_lz4,sendrecv_v2_zstd,sendrecv_v2_dry_run_send,"
    b"openscreen_mdns,delayed_ack"
)
OXADBD_BANNER = (
    b"device::ro.product.name=debian;ro.product.model=QEMU Virtual Machine;"
    b"ro.product.device=builder;features=shell_v2,stat_v2,ls_v2,fixed_push_mkdir,"
    b"fixed_push_symlink_timestamp,sendrecv_v2,sendrecv_v2_brotli,sendrecv_v2_lz4,"
    b"sendrecv_v2_zstd,sendrecv_v2_dry_run_send,delayed_ack"
)

MAX_PAYLOAD = 1024 * 1024
MAX_PAYLOAD_V1 = 4096
VERSION_CHECKSUMMED = 0x01000000
VERSION_SKIP_CHECKSUM = 0x01000001


def write(target, name, data):
    directory = os.path.join(HERE, "corpus", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


def u32(*values):
    return struct.pack("<%dI" % len(values), *values)


# ---- packet_header: u32 max payload, then packets -------------------------


def packet(command, arg0, arg1, payload=b"", checksum=False, length=None, magic=None):
    cmd = struct.unpack("<I", command)[0]
    crc = sum(payload) & 0xFFFFFFFF if checksum else 0
    length = len(payload) if length is None else length
    magic = cmd ^ 0xFFFFFFFF if magic is None else magic
    return u32(cmd, arg0, arg1, length, crc, magic) + payload


def packets():
    t = "packet_header"
    write(t, "cnxn-google-host", u32(MAX_PAYLOAD)
          + packet(b"CNXN", VERSION_SKIP_CHECKSUM, MAX_PAYLOAD, GOOGLE_HOST_BANNER))
    write(t, "cnxn-v1-checksummed", u32(MAX_PAYLOAD_V1)
          + packet(b"CNXN", VERSION_CHECKSUMMED, MAX_PAYLOAD_V1, b"host::\0", checksum=True))
    write(t, "cnxn-device-reply", u32(MAX_PAYLOAD)
          + packet(b"CNXN", VERSION_SKIP_CHECKSUM, MAX_PAYLOAD, OXADBD_BANNER))
    write(t, "auth-token", u32(MAX_PAYLOAD_V1) + packet(b"AUTH", 1, 0, bytes(range(20))))
    write(t, "stls", u32(MAX_PAYLOAD_V1) + packet(b"STLS", 0x01000000, 0))
    write(t, "open-okay-wrte-clse", u32(MAX_PAYLOAD)
          + packet(b"OPEN", 1, 0, b"shell,v2,raw:ls -l\0")
          + packet(b"OKAY", 7, 1)
          + packet(b"WRTE", 7, 1, b"\x01\x05\x00\x00\x00hello")
          + packet(b"OKAY", 1, 7)
          + packet(b"CLSE", 7, 1))
    # delayed_ack: OKAY carries the receiver's credit as a u32 payload.
    write(t, "okay-with-credit", u32(MAX_PAYLOAD)
          + packet(b"OPEN", 3, 262144, b"sync:\0")
          + packet(b"OKAY", 9, 3, u32(262144)))
    write(t, "wrte-checksummed-max-v1", u32(MAX_PAYLOAD_V1)
          + packet(b"WRTE", 1, 2, bytes([0xFF]) * MAX_PAYLOAD_V1, checksum=True))
    write(t, "bad-magic", u32(MAX_PAYLOAD) + packet(b"OKAY", 1, 2, magic=0))
    write(t, "obsolete-sync-command", u32(MAX_PAYLOAD) + packet(b"SYNC", 1, 0))
    write(t, "payload-over-limit", u32(MAX_PAYLOAD_V1)
          + packet(b"WRTE", 1, 2, length=MAX_PAYLOAD_V1 + 1))
    write(t, "truncated-payload", u32(MAX_PAYLOAD) + packet(b"WRTE", 1, 2, length=100) + b"abc")
    write(t, "truncated-header", u32(MAX_PAYLOAD) + packet(b"OKAY", 1, 2)[:23])


# ---- banner: the CNXN payload ----------------------------------------------


def banners():
    t = "banner"
    write(t, "google-host", GOOGLE_HOST_BANNER)
    write(t, "google-host-nul", GOOGLE_HOST_BANNER + b"\0")
    write(t, "oxadbd-device", OXADBD_BANNER)
    write(t, "adb29-host-no-features", b"host::\0")
    # Old adbd: ';'-terminated properties, no features.
    write(t, "old-device", b"device::ro.product.name=a;ro.product.model=b;ro.product.device=c;")
    write(t, "bootloader", b"bootloader:0123456789ab:")
    write(t, "sideload", b"sideload::features=cmd")
    write(t, "odd-items", b"device:ser:=;novalue;k=v=w;features=;;features=a,,b,:x")
    write(t, "malformed", b"host:features=shell_v2")


# ---- sync_request: the host's side of a sync: stream, or device replies ----


def req(tag, path):
    return tag + u32(len(path)) + path


def data(payload):
    return b"DATA" + u32(len(payload)) + payload


def done(value):
    return b"DONE" + u32(value)


QUIT = b"QUIT" + u32(0)


def stat_v2(tag, error=0, dev=66306, ino=1234, mode=0o100644, nlink=1, uid=2000,
            gid=2000, size=5, atime=1700000000, mtime=1700000001, ctime=1700000002):
    return tag + struct.pack("<IQQIIIIQqqq", error, dev, ino, mode, nlink, uid, gid,
                             size, atime, mtime, ctime)


def syncs():
    t = "sync_request"
    write(t, "stat-lst2-sta2-quit",
          req(b"STAT", b"/data/local/tmp") + req(b"LST2", b"/sdcard/link")
          + req(b"STA2", b"/sdcard/link") + QUIT)
    write(t, "list-lis2", req(b"LIST", b"/data/local/tmp") + req(b"LIS2", b"/") + QUIT)
    write(t, "send-v1", req(b"SEND", b"/data/local/tmp/a.txt,33188")
          + data(b"hello\n") + data(b"world\n") + done(1700000000) + QUIT)
    write(t, "send-v1-octal-mode-nul", req(b"SEND", b"/x,y/file,0100755\0") + done(0))
    write(t, "send-v1-hex-mode", req(b"SEND", b"/x, 0x81a4") + data(b"") + done(7))
    write(t, "send-v1-bad-mode", req(b"SEND", b"/tmp/f,rw-r--r--") + done(0))
    write(t, "send-v1-symlink", req(b"SEND", b"/tmp/l,41471") + data(b"target") + done(1))
    write(t, "snd2-lz4", req(b"SND2", b"/data/local/tmp/b.bin")
          + u32(0x32444E53, 0o100644, 2) + data(b"\x04\x22\x4d\x18") + done(1700000000))
    write(t, "snd2-zstd-dry-run", req(b"SND2", b"/x") + u32(0x32444E53, 0o100600, 0x80000004)
          + data(b"\x28\xb5\x2f\xfd") + done(0))
    write(t, "snd2-two-compressions", req(b"SND2", b"/x") + u32(0x32444E53, 0o644, 3))
    write(t, "recv-v1-rcv2-brotli", req(b"RECV", b"/system/build.prop")
          + req(b"RCV2", b"/system/build.prop") + u32(0x32564352, 1) + QUIT)
    write(t, "rcv2-dry-run", req(b"RCV2", b"/x") + u32(0x32564352, 0x80000000))
    write(t, "path-too-long", b"STAT" + u32(1025) + b"/" * 16)
    write(t, "data-too-long", req(b"SEND", b"/x,420") + b"DATA" + u32(65537) + b"abc")
    write(t, "unknown-request", req(b"XYZW", b"/") + QUIT)
    # Device replies, as the host reads them.
    write(t, "reply-stat-v1", b"STAT" + u32(0o100644, 5, 1700000000))
    write(t, "reply-sta2", stat_v2(b"STA2"))
    write(t, "reply-lst2-enoent", stat_v2(b"LST2", error=2, dev=0, ino=0, mode=0, nlink=0,
                                          uid=0, gid=0, size=0, atime=0, mtime=0, ctime=0))
    write(t, "reply-list", b"DENT" + u32(0o40755, 4096, 1700000000, 3) + b"dir"
          + b"DENT" + u32(0o100644, 5, 1700000000, 5) + b"a.txt" + b"DONE" + bytes(16))
    write(t, "reply-lis2", stat_v2(b"DNT2") + u32(5) + b"a.txt"
          + stat_v2(b"DNT2", mode=0o120777) + u32(4) + b"link" + b"DONE" + bytes(72))


# ---- shell_frame: a control byte, then shell protocol frames ----------------


def frame(kind, payload):
    return bytes([kind]) + u32(len(payload)) + payload


STDIN, STDOUT, STDERR, EXIT, CLOSE_STDIN, WINDOW = range(6)


def shells():
    t = "shell_frame"
    # Control byte: low nibble + 1 = bytes per read, top bit = 64-byte payload limit.
    write(t, "host-stdin-window-close", bytes([0x00]) + frame(STDIN, b"ls -l\n")
          + frame(WINDOW, b"25x80,640x400\0") + frame(CLOSE_STDIN, b""))
    write(t, "device-stdout-stderr-exit", bytes([0x06]) + frame(STDOUT, b"total 0\n")
          + frame(STDERR, b"ls: /x: No such file or directory\n") + frame(EXIT, b"\x01"))
    write(t, "unknown-and-invalid-ids", bytes([0x0F]) + frame(9, b"future") + frame(255, b"")
          + frame(EXIT, b"\x00\x00"))
    write(t, "over-small-limit", bytes([0x80]) + frame(STDIN, b"a" * 64)
          + bytes([STDIN]) + u32(65))
    write(t, "huge-length", bytes([0x03]) + bytes([STDOUT]) + u32(0xFFFFFFFF))
    write(t, "partial-frame", bytes([0x01]) + frame(STDOUT, b"whole") + bytes([STDOUT]) + u32(10) + b"part")
    # The stream is also read as a window-size payload and as a service name.
    write(t, "window-size", bytes([0x00]) + b"40x120,0x0\0")
    write(t, "window-size-sscanf", bytes([0x00]) + b" 40x+120, 0x0junk")
    write(t, "service-shell-v2-pty", bytes([0x00]) + b"shell,v2,TERM=xterm-256color,pty:\0")
    write(t, "service-shell-v2-raw", bytes([0x00]) + b"shell,v2,raw:echo a:b")
    write(t, "service-shell-v1", bytes([0x00]) + b"shell:ls")
    write(t, "service-exec", bytes([0x00]) + b"exec:cat /proc/version")


# ---- service: a service name, read as a device's and as a host server's ------


SERVICES = {
    # What hosts open on a device.
    "shell-v1": b"shell:ls -l",
    "shell-interactive": b"shell:",
    "shell-v2-pty": b"shell,v2,TERM=xterm-256color,pty:",
    "shell-v2-raw": b"shell,v2,TERM=dumb,raw:echo a:b,c",
    "shell-any-order": b"shell,raw,,future,TERM=,v2:id",
    "shell-no-colon": b"shell,v2",
    "logcat": b"shell,v2,TERM=xterm:export ANDROID_LOG_TAGS=\"''\"; exec logcat '-d'",
    "exec": b"exec:cat > /tmp/f",
    "sync": b"sync:",
    "tcp-port": b"tcp:8080",
    "tcp-host-port": b"tcp:localhost:22",
    "tcp-ipv6": b"tcp:fe80::1:22",
    "tcp-bad-port": b"tcp:22:localhost",
    "local-sockets": b"localabstract:chrome_devtools_remote",
    "localfilesystem": b"localfilesystem:/run/x.sock",
    "localreserved": b"localreserved:x",
    "local": b"local:/dev/socket/x",
    "dev": b"dev:/dev/ttyS0",
    "dev-raw": b"dev-raw:/dev/ttyUSB0",
    "jdwp": b"jdwp:1234",
    "track": b"track-jdwp",
    "reverse-forward": b"reverse:forward:norebind:tcp:0;localabstract:x",
    "reverse-bad-forward": b"reverse:forward:tcp:1;*smartsocket*",
    "reverse-kill": b"reverse:killforward:tcp:8080",
    "reverse-list": b"reverse:list-forward",
    "framebuffer": b"framebuffer:",
    "reboot": b"reboot:bootloader",
    "remount": b"remount:-R",
    "root": b"root",
    "verity": b"disable-verity:",
    "tcpip": b"tcpip:5555",
    "tcpip-zero": b"tcpip:0",
    "usb": b"usb:",
    "abb": b"abb:package\0list\0packages",
    "sink": b"sink:1048576",
    # What clients ask an adb server.
    "host-version": b"host:version",
    "host-track-devices": b"host:track-devices-proto-binary",
    "host-transport": b"host:transport:127.0.0.1:5555",
    "host-tport": b"host:tport:serial:emulator-5554",
    "host-transport-id": b"host-transport-id:7:get-state",
    "host-serial-port": b"host-serial:127.0.0.1:5555:get-serialno",
    "host-serial-ipv6": b"host-serial:[::1]:5555:forward:tcp:1;tcp:2",
    "host-serial-usb": b"host-serial:usb:1-2.3:get-devpath",
    "host-serial-vsock": b"host-serial:vsock:3:5555:get-state",
    "host-serial-tcp": b"host-serial:tcp:10.0.0.1:5555:wait-for-any-device",
    "host-serial-empty-port": b"host-serial:abc::get-state",
    "host-usb": b"host-usb:killforward-all",
    "host-local": b"host-local:list-forward",
    "host-connect": b"host:connect:192.168.1.2:5555",
    "host-disconnect-all": b"host:disconnect:",
    "host-pair": b"host:pair:123456:192.168.1.2:37000",
    "host-mdns": b"host:mdns:services",
    "host-emulator": b"host:emulator:5554",
}


def services():
    for name, text in SERVICES.items():
        write("service", name, text)


# ---- smart_socket: a client's bytes to an adb server --------------------------


def request(text):
    return b"%04x" % len(text) + text


def smart_sockets():
    t = "smart_socket"
    # What Google's adb client sends: a version check; a transport switch
    # then a device service and the first bytes of its stream.
    write(t, "version", request(b"host:version"))
    write(t, "tport-then-shell",
          request(b"host:tport:serial:127.0.0.1:5555") + request(b"shell,v2,raw:echo hi"))
    write(t, "transport-then-sync",
          request(b"host:transport-any") + request(b"sync:") + b"STAT\x04\x00\x00\x00/tmp")
    write(t, "upper-case-length", b"000C" + b"host:devices")
    write(t, "forward", request(b"host-serial:127.0.0.1:5555:forward:norebind:tcp:0;tcp:80"))
    write(t, "cut", request(b"host:track-devices-l")[:9])
    write(t, "empty", b"0000")
    write(t, "not-hex", b"0x10host:version")
    write(t, "not-utf8", b"0002\xff\xfe")


def delta_frame(tag, body=b""):
    return struct.pack("<I", 1 + len(body)) + tag + body


def deltas():
    t = "delta_message"
    begin = delta_frame(b"B", struct.pack("<IQI", 4096, 1 << 30, 0o644) + b"/data/rootfs.img")
    copy = delta_frame(b"C", struct.pack("<QQQ", 10, 900, 64))
    zero = delta_frame(b"Z", struct.pack("<QQ", 74, 300))
    raw = delta_frame(b"R", struct.pack("<QIB", 374, 16, 0) + bytes(range(16)))
    end = delta_frame(b"E", bytes(32))
    # The first byte is the size of the pieces the stream arrives in.
    write(t, "whole-delta", b"\xff" + begin + copy + zero + raw + end)
    write(t, "byte-by-byte", b"\x00" + begin + copy + end)
    write(t, "digests", b"\x10" + delta_frame(b"D", struct.pack("<Q", 0) + bytes(64)))
    write(t, "index", b"\x07" + delta_frame(b"I", struct.pack("<BQ", 2, 1 << 32)))
    write(t, "fail", b"\x03" + delta_frame(b"F", b"couldn't open '/x': No such file"))
    write(t, "too-large", b"\x03" + struct.pack("<I", 64 << 20) + b"R")
    write(t, "cut", b"\x05" + begin[:11])


# ---- host_connection: the host's engine against a device -------------------
#
# A byte of host configuration, a byte choosing the device's CNXN, then
# operations (fuzz_targets/host_connection.rs): 0 and a raw packet; a framed
# packet (opcode by command, ids, payload); 4 open; 5 accept, 135 refuse;
# 6 write; 7 read; 8 close; 9 let time pass.

HOST_CLASSIC, HOST_AOSP, HOST_ADAPTIVE = 0x00, 0x01, 0x02
HOST_STALL_TIMEOUT = 0x20
DEVICE_1M_DELAYED_ACK = 0x07
DEVICE_64_CLASSIC = 0x00
DEVICE_4K_V1_CHECKSUMMED = 0x0A

# Indexes into SPECS in the target.
SPEC = {"tcp:8080": 0, "tcp:9000": 1, "tcp:1": 2, "localabstract:x": 3, "": 5,
        "*smartsocket*": 6, "tcp:1;tcp:2": 7, "norebind:tcp:1": 8, "tcp:8080\0": 9}
FRAMED = {b"OPEN": 2, b"OKAY": 32, b"WRTE": 72, b"CLSE": 102, b"CNXN": 162,
          b"AUTH": 192, b"STLS": 232}


def device(command, arg0, arg1, payload=b"", checksum=False):
    """A device packet as the wire carries it."""
    return bytes([0]) + packet(command, arg0, arg1, payload, checksum=checksum)


def framed(command, arg0, arg1, payload=b""):
    """A device packet the target frames: small ids, a short payload."""
    assert arg0 < 0xF0 and arg1 < 0xF0 and len(payload) < 0xC0
    return bytes([FRAMED[command], arg0, arg1, len(payload)]) + payload


def reverse(device_spec, host_spec, norebind=False):
    return bytes([4, 1 if norebind else 0, SPEC[device_spec], SPEC[host_spec]])


def kill(device_spec=None):
    return bytes([4, 3]) if device_spec is None else bytes([4, 2, SPEC[device_spec]])


def host_open(other):
    # OTHER_SERVICES in the target: 0 is "shell,v2,raw:id".
    return bytes([4, 5, other])


def accept(pick=0):
    return bytes([5, pick])


def refuse(pick=0):
    return bytes([135, pick])


def write_stream(pick, data):
    return bytes([6, pick, len(data)]) + data


def read_stream(pick, quarter_max=64):
    return bytes([7, pick, quarter_max])


def close_stream(pick):
    return bytes([8, pick])


def wait(tens_of_ms):
    return bytes([9, tens_of_ms])


def host_connections():
    t = "host_connection"
    # adb reverse in burst mode: the device's OKAY to the reverse (with
    # credit), its OPEN of the host side, data both ways, CLSE.
    write(t, "reverse-tcp-8080-burst", bytes([HOST_ADAPTIVE, DEVICE_1M_DELAYED_ACK])
          + reverse("tcp:9000", "tcp:8080")
          + device(b"OKAY", 100, 1, u32(1 << 20))
          + device(b"OPEN", 101, 1 << 20, b"tcp:8080\0")
          + accept()
          + device(b"WRTE", 101, 2, b"GET / HTTP/1.0\r\n\r\n")
          + read_stream(1) + write_stream(1, b"HTTP/1.0 200 OK\r\n\r\n")
          + device(b"OKAY", 101, 2, u32(19))
          + device(b"CLSE", 101, 2) + read_stream(1) + close_stream(1))
    # Classic: the device tries the host before and after the reverse, and
    # after it was killed; norebind and kill-all.
    write(t, "open-before-and-after-reverse", bytes([HOST_CLASSIC, DEVICE_64_CLASSIC])
          + device(b"OPEN", 7, 0, b"tcp:8080\0")
          + reverse("tcp:9000", "tcp:8080") + device(b"OKAY", 8, 1)
          + device(b"OPEN", 9, 0, b"tcp:8080\0") + refuse()
          + reverse("tcp:9000", "localabstract:x", norebind=True)
          + device(b"OPEN", 10, 0, b"localabstract:x\0")
          + kill("tcp:9000") + device(b"OPEN", 11, 0, b"tcp:8080\0")
          + reverse("tcp:1", "tcp:1") + kill()
          + device(b"OPEN", 12, 0, b"tcp:1\0"))
    # A device OPEN of the device-side spec, of a spec with arg1 set in
    # classic mode, with remote id 0, and not UTF-8.
    write(t, "odd-opens", bytes([HOST_CLASSIC, DEVICE_64_CLASSIC])
          + reverse("tcp:9000", "tcp:8080")
          + device(b"OPEN", 5, 0, b"tcp:9000\0")
          + device(b"OPEN", 6, 4096, b"tcp:8080\0")
          + device(b"OPEN", 0, 0, b"tcp:8080\0")
          + device(b"OPEN", 7, 0, b"tcp:80\xff\0")
          + device(b"OPEN", 8, 0, b"tcp:8080\0\0\0"))
    # The host's own stream: OKAY, data both ways, CLSE, then a late WRTE.
    write(t, "shell-stream", bytes([HOST_CLASSIC, DEVICE_64_CLASSIC])
          + host_open(0) + device(b"OKAY", 40, 1)
          + write_stream(0, b"x" * 100)
          + device(b"OKAY", 40, 1)
          + device(b"WRTE", 40, 1, b"uid=0(root)\n")
          + read_stream(0, 1) + read_stream(0)
          + device(b"CLSE", 40, 1) + close_stream(0)
          + device(b"WRTE", 40, 1, b"late"))
    # The same, framed by the target.
    write(t, "framed-packets", bytes([HOST_AOSP | 0x04 | 0x08, DEVICE_1M_DELAYED_ACK])
          + host_open(1) + framed(b"OKAY", 3, 1, u32(64))
          + write_stream(0, b"y" * 200)
          + framed(b"OKAY", 3, 1, u32(128))
          + framed(b"WRTE", 3, 1, b"z" * 100)
          + framed(b"CLSE", 3, 1) + framed(b"CLSE", 0, 1))
    # A device that restarts (a second CNXN), then sends AUTH and STLS.
    write(t, "second-cnxn-auth-stls", bytes([HOST_ADAPTIVE, DEVICE_1M_DELAYED_ACK])
          + host_open(0) + reverse("tcp:1", "tcp:1")
          + device(b"CNXN", 0x01000001, 4096, OXADBD_BANNER)
          + device(b"OPEN", 3, 0, b"tcp:1\0")
          + device(b"AUTH", 1, 0, bytes(range(20)))
          + device(b"STLS", 0x01000000, 0))
    # Protocol 1.0: payloads checksummed.
    write(t, "v1-checksummed", bytes([HOST_CLASSIC, DEVICE_4K_V1_CHECKSUMMED])
          + host_open(0)
          + device(b"OKAY", 9, 1)
          + device(b"WRTE", 9, 1, b"checksummed", checksum=True)
          + read_stream(0)
          + device(b"WRTE", 9, 1, b"wrong sum"))
    # Classic: a second WRTE before the host's OKAY; burst: beyond credit.
    write(t, "wrte-beyond-credit", bytes([HOST_CLASSIC | 0x04, DEVICE_64_CLASSIC])
          + host_open(0) + device(b"OKAY", 9, 1)
          + device(b"WRTE", 9, 1, b"a" * 64) + device(b"WRTE", 9, 1, b"b"))
    write(t, "burst-beyond-credit", bytes([HOST_ADAPTIVE | 0x40, DEVICE_1M_DELAYED_ACK])
          + host_open(0) + device(b"OKAY", 9, 1, u32(0))
          + device(b"WRTE", 9, 1, b"a" * 1500))
    # A stream whose data waits for credit until the stall timer closes it.
    write(t, "stalled-stream", bytes([HOST_CLASSIC | HOST_STALL_TIMEOUT, DEVICE_64_CLASSIC])
          + host_open(0) + device(b"OKAY", 9, 1)
          + write_stream(0, b"s" * 100) + wait(50) + wait(60))
    # Streams the device may open at most: three.
    write(t, "max-streams", bytes([HOST_CLASSIC | 0x10, DEVICE_64_CLASSIC])
          + reverse("tcp:1", "tcp:8080")
          + b"".join(device(b"OPEN", i, 0, b"tcp:8080\0") for i in range(20, 25)))
    write(t, "unknown-stream", bytes([HOST_CLASSIC, DEVICE_64_CLASSIC])
          + device(b"OKAY", 5, 77))
    write(t, "bad-magic", bytes([HOST_CLASSIC, DEVICE_64_CLASSIC])
          + device(b"OKAY", 1, 2)[:-4] + b"\0\0\0\0")


# ---- sync_client: the host's sync session reading a device's replies -------
#
# A byte of options (bits: STA2/LST2, LIS2, SND2/RCV2, RECV ahead of the STAT
# reply, then the end of the stream), a count of requests, the requests, a
# byte choosing chunk sizes (0: all at once), then the replies.

V1, STAT2, LS2, SENDRECV2, AHEAD, EOF = 0, 1, 2, 4, 8, 0x10
V2 = STAT2 | LS2 | SENDRECV2
# Paths in the target: 0 /data/local/tmp/f, 1 /sdcard, 2 /x, 3 "", 4 at the
# limit, 5 past it.
LSTAT, STAT_, LIST_, PUSH, STAT_FOR_PULL, PULL, PULL_ABANDONED, QUIT_ = range(8)
DROP_AHEAD = 0x87


def sync_op(kind, path=2, high=0):
    return bytes([kind | path << 3 | high << 6])


def sync_push(data, path=2, symlink=False, dry_run=False):
    high = (1 if symlink else 0) | (2 if dry_run else 0)
    return sync_op(PUSH, path, high) + bytes([len(data)]) + data


def session(options, requests, replies, sizes=0):
    return bytes([options, len(requests)]) + b"".join(requests) + bytes([sizes]) + replies


def fail(message, length=None):
    return b"FAIL" + u32(len(message) if length is None else length) + message


def dent_v1(mode, size, mtime, name, length=None):
    return b"DENT" + u32(mode, size, mtime, len(name) if length is None else length) + name


def dent_v2(name, error=0, mode=0o100644):
    return stat_v2(b"DNT2", error=error, mode=mode) + u32(len(name)) + name


def sync_clients():
    t = "sync_client"
    write(t, "v2-stat-list-push-pull", session(V2 | AHEAD, [
        sync_op(LSTAT), sync_op(STAT_), sync_op(LIST_, 1), sync_push(b"hello"),
        sync_op(STAT_FOR_PULL, 0), sync_op(PULL, 0), sync_op(QUIT_)],
        stat_v2(b"LST2", mode=0o120777) + stat_v2(b"STA2")
        + dent_v2(b".", mode=0o40755) + dent_v2(b"..", mode=0o40755)
        + dent_v2(b"a.txt") + dent_v2(b"gone", error=2) + b"DONE" + bytes(72)
        + b"OKAY" + u32(0)
        + stat_v2(b"STA2", size=3) + data(b"abc") + data(b"") + done(0)))
    # Odd names a device may send: adb lists them as they come.
    write(t, "v2-listing-odd-names", session(V2, [sync_op(LIST_, 3)],
          dent_v2(b"") + dent_v2(b"a/b") + dent_v2(b"../../etc") + dent_v2(b"x\0y")
          + dent_v2(b"n" * 300) + b"DONE" + bytes(72), sizes=0x35))
    write(t, "v1-listing-odd-names", session(V1, [sync_op(LIST_)],
          dent_v1(0o40755, 4096, 1700000000, b".") + dent_v1(0o40755, 4096, 0, b"..")
          + dent_v1(0o100644, 5, 0, b"") + dent_v1(0o100644, 5, 0, b"a/b")
          + dent_v1(0o100644, 5, 0, b"x\0y") + b"DONE" + bytes(16), sizes=0x01))
    write(t, "v1-name-too-long", session(V1, [sync_op(LIST_)],
          dent_v1(0o100644, 5, 0, b"n" * 16, length=4097)))
    # Without STA2 a symlink is asked about again, as "path/".
    write(t, "v1-stat-symlink", session(V1, [sync_op(STAT_), sync_op(LSTAT)],
          b"STAT" + u32(0o120777, 9, 7) + b"STAT" + u32(0o40755, 4096, 7)
          + b"STAT" + u32(0, 0, 0), sizes=0x07))
    write(t, "v1-stat-symlink-at-limit", session(V1, [sync_op(STAT_, 4)],
          b"STAT" + u32(0o120777, 9, 7)))
    write(t, "v2-lstat-enoent", session(V2, [sync_op(LSTAT, 5), sync_op(LSTAT)],
          stat_v2(b"LST2", error=2, mode=0, size=0)))
    write(t, "v1-push-fail-then-requests", session(V1, [
        sync_push(b"data", symlink=True), sync_push(b"more"), sync_op(LSTAT)],
        fail(b"couldn't create file: Read-only file system") + b"OKAY" + u32(0)))
    write(t, "v1-pull", session(V1, [sync_op(PULL, 0)],
          data(b"x" * 300) + data(b"y" * 5) + done(0), sizes=0x21))
    # A FAIL announcing 4 GiB: an error at its header, for a push and a pull.
    write(t, "push-fail-4gib", session(V2, [sync_push(b"")],
          fail(b"short", length=0xFFFFFFFF)))
    write(t, "pull-fail-4gib", session(V2, [sync_op(PULL)],
          fail(b"short", length=0xFFFFFFFF)))
    write(t, "pull-fail-over-limit", session(V1, [sync_op(PULL)],
          fail(b"", length=65537) + b"x" * 64))
    write(t, "pull-data-over-limit", session(V1, [sync_op(PULL)],
          b"DATA" + u32(65537) + b"x" * 64))
    write(t, "pull-fail", session(V2 | EOF, [sync_op(PULL, 1, 3)],
          data(b"part") + fail(b"open failed: Permission denied")))
    write(t, "okay-with-length", session(V2, [sync_push(b"a")], b"OKAY" + u32(5)))
    # The RECV went ahead: pulled, pulled as another path, given up.
    write(t, "recv-ahead", session(V2 | AHEAD, [
        sync_op(STAT_FOR_PULL), sync_op(PULL)],
        stat_v2(b"STA2", size=2) + data(b"hi") + done(0)))
    write(t, "recv-ahead-other-path", session(V2 | AHEAD, [
        sync_op(STAT_FOR_PULL), sync_op(PULL, 1), sync_op(LSTAT)],
        stat_v2(b"STA2")))
    write(t, "recv-ahead-dropped", session(V2 | AHEAD, [
        sync_op(STAT_FOR_PULL), sync_op(PULL_ABANDONED), bytes([DROP_AHEAD])],
        stat_v2(b"STA2")))
    write(t, "dry-run-v1", session(V1, [sync_push(b"", dry_run=True)], b""))
    # The stream ends in the middle of a reply.
    write(t, "eof-mid-reply", session(V2 | EOF, [sync_op(STAT_)], stat_v2(b"STA2")[:40]))
    write(t, "reply-to-something-else", session(V2, [sync_op(LSTAT)], stat_v2(b"STA2")))
    write(t, "replies-nobody-asked-for", session(V2, [], b"OKAY" + u32(0) + done(0)))


# ---- shell_output: the device's side of a shell v2 stream -------------------


def shell_outputs():
    t = "shell_output"
    # Control byte: low nibble + 1 = bytes per read.
    write(t, "stdout-stderr-exit", bytes([0x00]) + frame(STDOUT, b"total 0\n")
          + frame(STDERR, b"ls: /x: No such file or directory\n") + frame(EXIT, b"\x01"))
    write(t, "exit-empty", bytes([0x02]) + frame(STDOUT, b"out") + frame(EXIT, b""))
    write(t, "exit-two-bytes", bytes([0x03]) + frame(EXIT, b"\x00\x00"))
    write(t, "after-exit", bytes([0x01]) + frame(EXIT, b"\x00") + frame(STDOUT, b"late"))
    write(t, "host-kinds-and-unknown-ids", bytes([0x0F]) + frame(STDIN, b"echoed?")
          + frame(CLOSE_STDIN, b"") + frame(WINDOW, b"24x80,0x0") + frame(9, b"future")
          + frame(255, b"") + frame(STDOUT, b"") + frame(EXIT, b"\x7f"))
    write(t, "huge-length", bytes([0x04]) + frame(STDOUT, b"a") + bytes([STDERR]) + u32(0xFFFFFFFF))
    write(t, "length-at-limit", bytes([0x00]) + bytes([STDOUT]) + u32(16 * 1024 * 1024) + b"abc")
    write(t, "length-over-limit", bytes([0x00]) + bytes([STDOUT]) + u32(16 * 1024 * 1024 + 1))
    write(t, "partial-frame", bytes([0x05]) + frame(STDOUT, b"whole") + bytes([STDOUT]) + u32(10) + b"part")


if __name__ == "__main__":
    packets()
    banners()
    syncs()
    shells()
    services()
    smart_sockets()
    deltas()
    host_connections()
    sync_clients()
    shell_outputs()
