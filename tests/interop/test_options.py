"""oxadbd command-line options: --shell, --no-delayed-ack, --credit and
--memory-budget (the opening grant and the packet size)."""

import struct
import subprocess

from adbproto import A_OKAY, A_OPEN, RawClient
from harness import sha256_file, write_random


def test_shell_option_selects_the_shell(adb_server, fresh_daemon):
    default = fresh_daemon("default")
    bash = fresh_daemon("bash", args=("--shell", "/bin/bash"))
    for d in (default, bash):
        adb_server.connect(d.serial)
    try:
        probe = "echo ${BASH_VERSION:+is-bash}"
        r = adb_server.run("shell", probe, serial=bash.serial)
        assert r.rc == 0 and r.stdout == b"is-bash\n", r
        # The default is /bin/sh, which on Debian is dash, not bash.
        r = adb_server.run("shell", probe, serial=default.serial)
        assert r.rc == 0 and r.stdout == b"\n", r
    finally:
        for d in (default, bash):
            adb_server.disconnect(d.serial)


def test_no_delayed_ack_option_hides_the_feature(fresh_daemon):
    d = fresh_daemon(args=("--no-delayed-ack",))
    c = RawClient(d.port)
    try:
        c.connect()
        feats = c.features()
        assert "shell_v2" in feats, feats
        assert "delayed_ack" not in feats, feats
        assert c.run_service("exec:echo ok") == b"ok\n"
    finally:
        c.close()


def _initial_grant(port: int, opener_credit: int) -> int:
    """Opens a stream in burst mode and returns the credit the daemon grants."""
    c = RawClient(port)
    try:
        c.connect(banner=b"host::features=shell_v2,delayed_ack\0")
        assert "delayed_ack" in c.features(), c.features()
        c.send(A_OPEN, 1, opener_credit, b"exec:cat\0")
        p = c.recv()
        assert p.command == A_OKAY and p.arg1 == 1, p
        assert len(p.data) == 4, f"burst-mode OKAY must carry an i32 grant: {p!r}"
        return struct.unpack("<i", p.data)[0]
    finally:
        c.close()


def test_credit_option_selects_the_grant(fresh_daemon):
    aosp = fresh_daemon("aosp", args=("--credit", "aosp"))
    adaptive = fresh_daemon("adaptive")
    # AOSP grants a fixed 32 MiB; the adaptive window starts at two packets
    # (the 1 MiB maximum payload negotiated above).
    assert _initial_grant(aosp.port, 1 << 20) == 32 << 20
    assert _initial_grant(adaptive.port, 1 << 20) == 2 << 20
    classic = fresh_daemon("classic", args=("--credit", "classic"))
    c = RawClient(classic.port)
    try:
        c.connect(banner=b"host::features=shell_v2,delayed_ack\0")
        assert "delayed_ack" not in c.features(), c.features()
    finally:
        c.close()


def test_bad_credit_value_is_refused_with_the_choices(oxadbd_bin):
    r = subprocess.run([str(oxadbd_bin), "--credit", "fast", "--listen", "127.0.0.1:0"],
                       capture_output=True, timeout=30)
    assert r.returncode != 0
    assert b"unknown credit mode 'fast'" in r.stderr, r.stderr
    assert b"classic, aosp or adaptive" in r.stderr, r.stderr


def _max_payload(port: int) -> int:
    """The max payload the daemon answers a 1 MiB CNXN with."""
    c = RawClient(port)
    try:
        return c.connect().arg1
    finally:
        c.close()


def test_memory_budget_sizes_packets_and_the_opening_grant_and_is_logged(fresh_daemon):
    # A packet is at most a quarter of what each of the 64 connections served
    # may take of the budget (docs/flow-control.md, "Memory budget"): 4 MiB
    # gives 16 KiB, raised to the 64 KiB minimum; the opening grant is two
    # packets.
    small = fresh_daemon("small", args=("--memory-budget", "4M"))
    assert _max_payload(small.port) == 64 << 10
    assert _initial_grant(small.port, 1 << 20) == 128 << 10
    # The settings are logged once at start (at debug), sizes in binary units.
    line = small.wait_for_log(lambda l: "DEBUG" in l and " settings " in l)
    assert line and "memory_budget=4 MiB" in line and "per_stream_cap=512 KiB" in line, line
    assert "max_payload=64 KiB" in line, line
    middle = fresh_daemon("middle", args=("--memory-budget", "64M"))
    assert _max_payload(middle.port) == 256 << 10
    assert _initial_grant(middle.port, 1 << 20) == 512 << 10
    # Fewer connections leave each a larger share.
    fewer = fresh_daemon("fewer", args=("--memory-budget", "64M", "--max-connections", "16"))
    assert _max_payload(fewer.port) == 1 << 20
    roomy = fresh_daemon("roomy", args=("--memory-budget", "1G"))
    assert _max_payload(roomy.port) == 1 << 20
    assert _initial_grant(roomy.port, 1 << 20) == 2 << 20


def test_adb29_pushes_and_pulls_in_the_small_packets_of_a_small_budget(adb_server, fresh_daemon,
                                                                         tmp_path):
    """adb 29 (classic) keeps to the 64 KiB payload a 16 MiB budget offers."""
    d = fresh_daemon("small", args=("--memory-budget", "16M"))
    adb_server.connect(d.serial)
    try:
        line = d.wait_for_log(lambda l: "host connected" in l, timeout=10)
        assert line and "max_payload=65536" in line, line
        src = tmp_path / "src.bin"
        digest = write_random(src, 16 << 20)
        remote = tmp_path / "remote.bin"
        r = adb_server.run("push", str(src), str(remote), serial=d.serial, timeout=120)
        assert r.rc == 0, r
        assert sha256_file(remote) == digest
        back = tmp_path / "back.bin"
        r = adb_server.run("pull", str(remote), str(back), serial=d.serial, timeout=120)
        assert r.rc == 0, r
        assert sha256_file(back) == digest
        # A larger WRTE would have closed the connection with a WARN line.
        assert not d.wait_for_log(lambda l: "closing connection" in l, timeout=0.1)
    finally:
        adb_server.disconnect(d.serial)


def test_bad_memory_budget_is_refused_naming_the_value(oxadbd_bin):
    r = subprocess.run([str(oxadbd_bin), "--memory-budget", "lots", "--listen", "127.0.0.1:0"],
                       capture_output=True, timeout=30)
    assert r.returncode != 0
    assert b'bad size "lots"' in r.stderr, r.stderr
