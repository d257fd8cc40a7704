"""The transport protocol spoken directly, without adb in between."""

from adbproto import (A_CLSE, A_CNXN, A_OKAY, A_OPEN, A_VERSION, A_WRTE, MAX_PAYLOAD,
                      RawClient)


def test_cnxn_banner_and_features(fresh_daemon):
    d = fresh_daemon()
    c = RawClient(d.port)
    try:
        p = c.connect()
        assert p.command == A_CNXN
        assert p.arg0 == A_VERSION, hex(p.arg0)
        assert 4096 <= p.arg1 <= MAX_PAYLOAD * 256, p.arg1
        banner = p.data.rstrip(b"\0").decode()
        assert banner.startswith("device::"), banner
        props = dict(kv.split("=", 1) for kv in banner[len("device::"):].split(";") if "=" in kv)
        assert "ro.product.name" in props, banner
        feats = c.features()
        for f in ("shell_v2", "delayed_ack"):
            assert f in feats, f"{f} not advertised: {feats}"
    finally:
        c.close()


def test_exec_echo_classic_flow(fresh_daemon):
    d = fresh_daemon()
    c = RawClient(d.port)
    try:
        c.connect()  # we do not advertise delayed_ack: classic flow control
        c.send(A_OPEN, 7, 0, b"exec:echo hi\0")
        p = c.recv()
        assert p.command == A_OKAY and p.arg1 == 7 and p.arg0 != 0, p
        remote = p.arg0
        p = c.recv()
        assert p.command == A_WRTE and p.arg0 == remote and p.arg1 == 7, p
        assert p.data == b"hi\n", p
        c.send(A_OKAY, 7, remote)
        p = c.recv()
        assert p.command == A_CLSE and p.arg1 == 7, p
    finally:
        c.close()


def test_classic_mode_waits_for_okay(fresh_daemon):
    # In classic mode the daemon may have at most one unacknowledged WRTE per
    # stream: it must not send a second one before our OKAY.
    d = fresh_daemon()
    c = RawClient(d.port)
    try:
        c.connect()
        c.send(A_OPEN, 1, 0, b"exec:head -c 3000000 /dev/zero\0")
        p = c.recv()
        assert p.command == A_OKAY, p
        remote = p.arg0
        p = c.recv()
        assert p.command == A_WRTE and p.data, p
        total = len(p.data)
        # No OKAY yet: nothing more may arrive.
        try:
            extra = c.recv(timeout=1.0)
        except TimeoutError:
            extra = None
        assert extra is None, f"daemon sent {extra!r} before our OKAY"
        c.send(A_OKAY, 1, remote)
        while True:
            p = c.recv()
            if p.command == A_CLSE:
                break
            assert p.command == A_WRTE, p
            assert len(p.data) <= c.max_payload
            total += len(p.data)
            c.send(A_OKAY, 1, remote)
        assert total == 3000000
    finally:
        c.close()


def test_open_unknown_service_is_refused(fresh_daemon):
    d = fresh_daemon()
    c = RawClient(d.port)
    try:
        c.connect()
        c.send(A_OPEN, 3, 0, b"no-such-service:at all\0")
        p = c.recv()
        assert p.command == A_CLSE and p.arg1 == 3, p
        # The connection is still usable.
        assert c.run_service("exec:echo fine") == b"fine\n"
    finally:
        c.close()


def test_shell_v2_exit_packet(fresh_daemon):
    # shell,v2,raw: frames are [id u8][len u32 LE][data]; 1=stdout 2=stderr 3=exit.
    import struct

    d = fresh_daemon()
    c = RawClient(d.port)
    try:
        c.connect()
        out = c.run_service("shell,v2,raw:echo o; echo e >&2; exit 3")
        frames = []
        i = 0
        while i < len(out):
            fid, n = struct.unpack_from("<BI", out, i)
            frames.append((fid, out[i + 5:i + 5 + n]))
            i += 5 + n
        assert i == len(out), out
        stdout = b"".join(d_ for f, d_ in frames if f == 1)
        stderr = b"".join(d_ for f, d_ in frames if f == 2)
        exits = [d_ for f, d_ in frames if f == 3]
        assert stdout == b"o\n", frames
        assert stderr == b"e\n", frames
        assert exits == [b"\x03"], frames
    finally:
        c.close()


def test_late_packets_for_closed_stream_are_ignored(fresh_daemon):
    # adb 29 really does this: its stdin thread sends the shell-v2 close-stdin
    # frame (WRTE "\x04\0\0\0\0") when stdin hits EOF, which often arrives after
    # a quick command has exited and the daemon has already sent CLSE. OKAY and
    # CLSE cross in flight the same way. A daemon must ignore such packets for
    # a stream id it allocated and closed, not drop the whole connection.
    d = fresh_daemon()
    c = RawClient(d.port)
    try:
        c.connect()
        c.send(A_OPEN, 1, 0, b"shell,v2,raw:true\0")
        p = c.recv()
        assert p.command == A_OKAY and p.arg1 == 1, p
        remote = p.arg0
        while True:
            p = c.recv()
            if p.command == A_CLSE:
                break
            assert p.command == A_WRTE, p
            c.send(A_OKAY, 1, remote)
        # The stream is closed on the daemon's side; now the late packets.
        c.send(A_WRTE, 1, remote, b"\x04\x00\x00\x00\x00")
        c.send(A_OKAY, 1, remote)
        c.send(A_CLSE, 1, remote)
        c._next_id = 2
        assert c.run_service("exec:echo still connected") == b"still connected\n"
        mark_line = d.wait_for_log(lambda ln: "closing connection" in ln, timeout=0.5)
        assert mark_line is None, f"daemon closed a connection: {mark_line}"
    finally:
        c.close()
