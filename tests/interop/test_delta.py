"""`oxadb push --delta` against oxadbd: images rebuilt byte for byte.

Two versions of a 256 MiB ext4 image are built with `mkfs.ext4 -d` from a
tree of files (the second with files changed, added, deleted and moved);
the delta turns a regular file and a loop device holding the first into
the second, and sends a small part of the image to do it. Synthetic images
cover a zeroed region, a moved region, an appended and a shrunk image, a
destination that does not exist, and one changed on the device between two
deltas. A client killed mid-delta leaves a file destination as it was; on
a block device the next delta completes the image. docs/delta.md.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import stat
import struct
import subprocess
import time
from pathlib import Path

import pytest

from adbproto import ProtocolError, RawClient
from harness import clean_env, resolve_oxadb, sha256_file, write_random

MIB = 1024 * 1024
BLOCK = 4096
IMAGE = 256 * MIB
# The same UUID and directory hash seed in both versions, as a build
# system that pins them for reproducible images would give.
UUID = "4a5b6c7d-1111-4222-8333-944455566677"


def oxadb(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(resolve_oxadb()), *args], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                          env=clean_env(HOME=str(home)), text=True)


def delta(home: Path, serial: str, src: Path, dest: str, *flags: str) -> int:
    """Runs a delta push that must succeed; returns the bytes it sent."""
    cp = oxadb(home, "-s", serial, "push", "--delta", *flags, str(src), dest)
    assert cp.returncode == 0, (src, dest, cp.stdout, cp.stderr)
    found = re.search(r"(\d+) of (\d+) bytes sent", cp.stdout) or \
        re.search(r"to send +(\d+) bytes \([\d.]+% of (\d+) bytes\)", cp.stdout)
    assert found, cp.stdout
    assert int(found.group(2)) == src.stat().st_size, cp.stdout
    return int(found.group(1))


def make_tree(root: Path, seed: int, files: int = 60) -> None:
    rng = random.Random(seed)
    for i in range(files):
        sub = root / f"d{i % 5}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i}").write_bytes(rng.randbytes(rng.randrange(1, 1500) * 1024))


def mkfs(tree: Path, image: Path) -> None:
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", str(BLOCK), "-d", str(tree), "-U", UUID,
                    "-E", f"hash_seed={UUID}", str(image), f"{IMAGE // MIB}M"],
                   check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   env=clean_env(E2FSPROGS_FAKE_TIME="1700000000"))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[Path, Path]:
    """Two versions of an ext4 image: files changed, added, deleted, moved."""
    work = tmp_path_factory.mktemp("delta-images")
    tree = work / "tree"
    make_tree(tree, seed=1)
    v1 = work / "v1.img"
    mkfs(tree, v1)
    rng = random.Random(2)
    (tree / "d0" / "f0").write_bytes(rng.randbytes(700 * 1024))            # changed
    with open(tree / "d1" / "f1", "r+b") as f:                              # changed in place
        f.seek(100 * 1024)
        f.write(rng.randbytes(8 * 1024))
    (tree / "d2" / "f2").unlink()                                            # deleted
    (tree / "d3" / "f3").rename(tree / "d4" / "moved-f3")                    # moved
    (tree / "new").mkdir()
    (tree / "new" / "added").write_bytes(rng.randbytes(3 * MIB))            # added
    v2 = work / "v2.img"
    mkfs(tree, v2)
    assert sha256_file(v1) != sha256_file(v2)
    return v1, v2


def private_state(tmp_path: Path) -> tuple[str, ...]:
    """A state directory of the test's own: the delta indexes stay in it."""
    return ("--state-dir", str(tmp_path / "state"))


@pytest.fixture
def home(tmp_path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


class Loop:
    """A loop device over a copy of `image`, detached at the end."""

    def __init__(self, backing: Path, image: Path, size: int = IMAGE):
        shutil.copyfile(image, backing)
        with open(backing, "r+b") as f:
            f.truncate(size)
        self.backing = backing
        self.device = subprocess.run(["losetup", "-f", "--show", str(backing)], check=True,
                                     stdout=subprocess.PIPE, text=True).stdout.strip()

    def first(self, length: int) -> bytes:
        with open(self.device, "rb") as f:
            return f.read(length)

    def close(self) -> None:
        subprocess.run(["losetup", "-d", self.device], check=True)


def test_an_ext4_image_onto_a_file(fresh_daemon, home, tmp_path, images):
    v1, v2 = images
    d = fresh_daemon("delta-file", args=private_state(tmp_path), rust_log=None)
    dest = tmp_path / "device" / "rootfs.img"
    dest.parent.mkdir()
    shutil.copyfile(v1, dest)

    # A dry run plans and changes nothing.
    planned = delta(home, d.serial, v2, str(dest), "-n")
    assert sha256_file(dest) == sha256_file(v1)

    sent = delta(home, d.serial, v2, str(dest))
    assert sha256_file(dest) == sha256_file(v2)
    # The plan's bytes, give or take how the WANTs split: the host asks as
    # its hashing and the device's index meet, which timing decides.
    assert abs(sent - planned) <= planned // 200, (sent, planned)
    # The changes are about 4 MiB of file data and the metadata around them.
    assert sent < IMAGE // 20, f"sent {sent} bytes of {IMAGE}"
    assert [p.name for p in dest.parent.iterdir()] == ["rootfs.img"], "a temporary file was left"

    # Onto the same image again: nothing but the operations that keep it.
    assert delta(home, d.serial, v2, str(dest)) < 64 * 1024
    # And back: the old version's blocks are mostly still there.
    back = delta(home, d.serial, v1, str(dest))
    assert sha256_file(dest) == sha256_file(v1)
    assert back < IMAGE // 20


def test_an_ext4_image_onto_a_loop_device(fresh_daemon, home, tmp_path, images):
    v1, v2 = images
    d = fresh_daemon("delta-loop", args=private_state(tmp_path), rust_log=None)
    loop = Loop(tmp_path / "backing.img", v1, size=IMAGE + 8 * MIB)
    try:
        sent = delta(home, d.serial, v2, loop.device)
        assert loop.first(IMAGE) == v2.read_bytes()
        assert sent < IMAGE // 20, f"sent {sent} bytes of {IMAGE}"
        delta(home, d.serial, v1, loop.device)
        assert loop.first(IMAGE) == v1.read_bytes()
    finally:
        loop.close()


@pytest.mark.parametrize("onto", ["file", "block device"])
def test_a_base_sends_blocks_that_changed_a_little_as_xor(fresh_daemon, home, tmp_path, onto):
    """A byte changed in every eighth block of 16 MiB of random data: as new
    data each such block costs 4 KiB; as the XOR with the base's old block
    (the device's digests confirm the base) a few bytes."""
    size = 16 * MIB
    old = bytearray(os.urandom(size))
    new = bytearray(old)
    for block in range(0, size // BLOCK, 8):
        new[block * BLOCK + 123] ^= 0xA5
    base, image = tmp_path / "base.img", tmp_path / "new.img"
    base.write_bytes(old)
    image.write_bytes(new)
    d = fresh_daemon("delta-xor", args=private_state(tmp_path), rust_log=None)
    loop = None
    if onto == "file":
        dest = tmp_path / "dest.img"
        target = str(dest)
        reset = lambda: dest.write_bytes(old)  # noqa: E731
        content = lambda: dest.read_bytes()  # noqa: E731
    else:
        loop = Loop(tmp_path / "backing.img", base, size=size)
        target = loop.device
        reset = lambda: write_node(loop.device, old)  # noqa: E731
        content = lambda: loop.first(size)  # noqa: E731
    try:
        reset()
        plain = delta(home, d.serial, image, target, "-n")
        cp = oxadb(home, "-s", d.serial, "push", "--delta", "-n", "--base", str(base),
                   str(image), target)
        assert cp.returncode == 0 and "blocks as XOR with the base" in cp.stdout, cp.stdout
        with_base = delta(home, d.serial, image, target, "--base", str(base))
        assert content() == bytes(new)
        assert plain > (size // BLOCK // 8) * BLOCK // 2, plain
        assert with_base * 20 < plain, (with_base, plain)
        # A base that is not what the device holds changes nothing but the
        # bytes: no block of it has the device's digest, so none is XORed.
        reset()
        wrong = tmp_path / "wrong.img"
        wrong.write_bytes(os.urandom(size))
        sent = delta(home, d.serial, image, target, "--base", str(wrong))
        assert content() == bytes(new)
        assert sent > plain // 2, (sent, plain)
    finally:
        if loop:
            loop.close()


def write_node(node: str, data: bytes) -> None:
    with open(node, "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def blocks(rng: random.Random, count: int) -> bytearray:
    return bytearray(rng.randbytes(count * BLOCK))


def synthetic(case: str) -> tuple[bytes, bytes]:
    """An old and a new image for `case`."""
    rng = random.Random(case)
    old = blocks(rng, 2048)
    new = bytearray(old)
    if case == "zeroed region":
        new[100 * BLOCK:900 * BLOCK] = bytes(800 * BLOCK)
    elif case == "moved region":
        new[1500 * BLOCK:1800 * BLOCK] = old[10 * BLOCK:310 * BLOCK]
        new[10 * BLOCK:310 * BLOCK] = blocks(rng, 300)
    elif case == "swapped regions":
        new[0:500 * BLOCK] = old[1000 * BLOCK:1500 * BLOCK]
        new[1000 * BLOCK:1500 * BLOCK] = old[0:500 * BLOCK]
    elif case == "appended":
        new += rng.randbytes(123 * BLOCK + 77)
    elif case == "shrunk":
        new = new[:1000 * BLOCK + 99]
    else:
        raise AssertionError(case)
    return bytes(old), bytes(new)


# What each case may send at most, beyond what it must.
CASES = {
    "zeroed region": 0,
    "moved region": 300 * BLOCK,
    "swapped regions": 0,
    "appended": 123 * BLOCK + 77,
    "shrunk": 99,
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("onto", ["file", "block device"])
def test_synthetic_changes(fresh_daemon, home, tmp_path, case, onto):
    old, new = synthetic(case)
    new_path = tmp_path / "new.img"
    new_path.write_bytes(new)
    d = fresh_daemon("delta-synthetic", args=private_state(tmp_path), rust_log=None)
    if onto == "file":
        dest = tmp_path / "dest.img"
        dest.write_bytes(old)
        sent = delta(home, d.serial, new_path, str(dest))
        assert dest.read_bytes() == new
    else:
        old_path = tmp_path / "old.img"
        old_path.write_bytes(old)
        loop = Loop(tmp_path / "backing.img", old_path, size=len(old) + len(new))
        try:
            sent = delta(home, d.serial, new_path, loop.device)
            assert loop.first(len(new)) == new
        finally:
            loop.close()
    # Operations cost tens of bytes; the digests go the other way.
    assert sent <= CASES[case] + 4096, f"{case}: sent {sent}"


def test_new_data_goes_while_a_cold_partition_is_still_read(fresh_daemon, home, tmp_path,
                                                           images):
    """A loop device with direct I/O over a file on disk, its cache dropped:
    the daemon reads it as a board reads a partition, and the host, which
    has digested its image long before, sends the new data the index
    already allows meanwhile; the image is still byte-identical."""
    v1, v2 = images
    d = fresh_daemon("delta-cold", args=private_state(tmp_path), rust_log=None)
    disk = Path("/var/tmp") / f"oxadb-test-delta-{os.getpid()}.disk"
    shutil.copyfile(v1, disk)
    try:
        device = subprocess.run(["losetup", "-f", "--show", "--direct-io=on", str(disk)],
                                check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
        try:
            subprocess.run(["blockdev", "--flushbufs", device], check=True)
            cp = oxadb(home, "-s", d.serial, "push", "--delta", str(v2), device)
            assert cp.returncode == 0, cp.stderr
            early = re.search(r"; (\d+) blocks sent while the device still read", cp.stdout)
            assert early and int(early.group(1)) > 0, cp.stdout
            with open(device, "rb") as f:
                assert f.read(IMAGE) == v2.read_bytes()
        finally:
            subprocess.run(["losetup", "-d", device], check=True)
    finally:
        disk.unlink()


def test_a_destination_that_does_not_exist_gets_the_whole_image(fresh_daemon, home, tmp_path,
                                                               images):
    v1, _ = images
    d = fresh_daemon("delta-absent", args=private_state(tmp_path), rust_log=None)
    dest = tmp_path / "nothing-yet" / "rootfs.img"
    dest.parent.mkdir()
    sent = delta(home, d.serial, v1, str(dest))
    assert sha256_file(dest) == sha256_file(v1)
    # Compressed, and the free space of the filesystem as ZERO operations.
    assert sent < IMAGE // 2


def test_a_destination_changed_on_the_device_is_not_trusted(fresh_daemon, home, tmp_path, images):
    v1, v2 = images
    d = fresh_daemon("delta-changed", args=private_state(tmp_path), rust_log=None)
    dest = tmp_path / "rootfs.img"
    shutil.copyfile(v1, dest)
    delta(home, d.serial, v2, str(dest))
    # Something on the device writes into the image between two deltas.
    with open(dest, "r+b") as f:
        for offset in (0, 5 * MIB + 17, IMAGE - 3000):
            f.seek(offset)
            f.write(os.urandom(2000))
    delta(home, d.serial, v2, str(dest))
    assert sha256_file(dest) == sha256_file(v2)


def start_delta(home: Path, serial: str, src: Path, dest: str) -> subprocess.Popen:
    return subprocess.Popen([str(resolve_oxadb()), "-s", serial, "push", "--delta", str(src),
                             dest], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env(HOME=str(home)))


def kill_when(proc: subprocess.Popen, ready, what: str) -> None:
    """SIGKILLs `proc` as soon as `ready()` holds; fails if it ended first."""
    deadline = time.monotonic() + 60
    while not ready():
        assert proc.poll() is None, f"the delta ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within 60 s"
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)


def test_a_client_killed_mid_delta_leaves_the_old_file(fresh_daemon, home, tmp_path, images):
    v1, _ = images
    d = fresh_daemon("delta-kill-file", args=private_state(tmp_path), rust_log=None)
    dest_dir = tmp_path / "device"
    dest_dir.mkdir()
    dest = dest_dir / "rootfs.img"
    shutil.copyfile(v1, dest)
    # All new, incompressible data: the delta takes a while.
    new = tmp_path / "random.img"
    write_random(new, IMAGE)
    proc = start_delta(home, d.serial, new, str(dest))
    kill_when(proc, lambda: any(p.name.startswith(".oxadb-push.") for p in dest_dir.iterdir()),
              "the temporary file appeared")
    assert sha256_file(dest) == sha256_file(v1)
    # The daemon sees the stream end and removes its temporary file.
    deadline = time.monotonic() + 10
    while [p.name for p in dest_dir.iterdir()] != ["rootfs.img"]:
        assert time.monotonic() < deadline, list(dest_dir.iterdir())
        time.sleep(0.05)
    # And serves the next delta.
    delta(home, d.serial, new, str(dest))
    assert sha256_file(dest) == sha256_file(new)


def test_an_interrupted_delta_on_a_block_device_is_completed_by_the_next(fresh_daemon, home,
                                                                        tmp_path, images):
    v1, _ = images
    d = fresh_daemon("delta-kill-loop", args=private_state(tmp_path), rust_log=None)
    new = tmp_path / "random.img"
    write_random(new, IMAGE)
    head = new.read_bytes()[:BLOCK]
    loop = Loop(tmp_path / "backing.img", v1)
    try:
        proc = start_delta(home, d.serial, new, loop.device)
        # New data is written in block order: the first block changes first.
        kill_when(proc, lambda: loop.first(BLOCK) == head, "the first block was written")
        assert loop.first(IMAGE) != new.read_bytes(), "the delta finished before the kill"
        delta(home, d.serial, new, loop.device)
        assert loop.first(IMAGE) == new.read_bytes()
    finally:
        loop.close()


def frame(tag: bytes, body: bytes = b"") -> bytes:
    return struct.pack("<I", len(tag) + len(body)) + tag + body


def fail_message(out: bytes) -> str:
    """The FAIL message a device's reply ends with (after INDEX and DIGESTS, if any)."""
    while out:
        length = struct.unpack("<I", out[:4])[0]
        tag, body, out = out[4:5], out[5:4 + length], out[4 + length:]
        if tag == b"F":
            return body.decode()
    raise AssertionError("no FAIL in the reply")


def test_only_hosts_that_negotiated_it_get_the_service(fresh_daemon, tmp_path):
    d = fresh_daemon("delta-negotiation", args=private_state(tmp_path), rust_log=None)
    stock = RawClient(d.port)
    try:
        stock.connect(b"host::features=shell_v2,cmd\0")
        assert "oxadb_delta" not in stock.features(), stock.features()
        with pytest.raises(ProtocolError, match="refused"):
            stock.run_service("oxadb-delta:")
    finally:
        stock.close()
    asking = RawClient(d.port)
    try:
        asking.connect(b"host::features=shell_v2,oxadb_delta\0")
        assert "oxadb_delta" in asking.features(), asking.features()
    finally:
        asking.close()


@pytest.mark.parametrize("what,sent,expected", [
    ("an unknown message", frame(b"Q"), "unknown delta message tag 0x51"),
    ("an oversized frame", struct.pack("<I", 64 << 20) + b"R", "larger than"),
    ("a relative path", frame(b"B", struct.pack("<IQI", 4096, 10, 0o644) + b"rel/img"),
     "'rel/img' is not an absolute path"),
    ("a bad block size", frame(b"B", struct.pack("<IQI", 3000, 10, 0o644) + b"/x"),
     "block size 3000"),
    ("an operation first", frame(b"Z", struct.pack("<QQ", 0, 1)), "did not start with BEGIN"),
    ("a want of regions the image lacks",
     frame(b"B", struct.pack("<IQI", 4096, 10, 0o644) + b"/nonexistent-oxadb-delta-test/img") +
     frame(b"W", b"\x01" + struct.pack("<QQ", 5, 1)),
     "the host wants 1 regions from 5; the old image has 0"),
    ("a bad want flag",
     frame(b"B", struct.pack("<IQI", 4096, 10, 0o644) + b"/nonexistent-oxadb-delta-test/img") +
     frame(b"W", b"\x07"), "last flag 7"),
])
def test_malformed_requests_fail_the_delta_and_nothing_else(fresh_daemon, tmp_path, what, sent,
                                                            expected):
    d = fresh_daemon("delta-malformed", args=private_state(tmp_path), rust_log=None)
    client = RawClient(d.port)
    try:
        client.connect(b"host::features=shell_v2,oxadb_delta\0")
        message = fail_message(client.run_service("oxadb-delta:", stdin=sent))
        assert expected in message, (what, message)
        # The connection and the daemon go on.
        assert client.run_service("shell:echo still") == b"still\n"
    finally:
        client.close()


def test_operations_outside_the_image_fail_and_leave_the_file(fresh_daemon, tmp_path):
    d = fresh_daemon("delta-bounds", args=private_state(tmp_path), rust_log=None)
    dest = tmp_path / "dest.img"
    dest.write_bytes(os.urandom(8 * BLOCK))
    before = sha256_file(dest)
    begin = frame(b"B", struct.pack("<IQI", BLOCK, 8 * BLOCK, 0o644) + str(dest).encode())
    wants_nothing = frame(b"W", b"\x01")
    copy_past_the_end = frame(b"C", struct.pack("<QQQ", 0, 7, 5))
    client = RawClient(d.port)
    try:
        client.connect(b"host::features=oxadb_delta\0")
        message = fail_message(client.run_service(
            "oxadb-delta:", stdin=begin + wants_nothing + copy_past_the_end))
        assert str(dest) in message and "reads past the old image" in message, message
    finally:
        client.close()
    assert sha256_file(dest) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".oxadb-push.")] == []


KEPT = "the index kept from the last delta still holds"


@pytest.mark.parametrize("onto", ["file", "block device"])
def test_the_next_delta_uses_the_index_unless_the_target_changed(fresh_daemon, home, tmp_path,
                                                                 images, onto):
    v1, v2 = images
    d = fresh_daemon("delta-index", args=("--state-dir", str(tmp_path / "state")),
                     rust_log="info")
    loop = None
    if onto == "file":
        dest = tmp_path / "rootfs.img"
        shutil.copyfile(v1, dest)
        target = str(dest)
        content = lambda: dest.read_bytes()  # noqa: E731
    else:
        loop = Loop(tmp_path / "backing.img", v1)
        target = loop.device
        content = lambda: loop.first(IMAGE)  # noqa: E731
    kept = lambda: d.log_path.read_text("utf-8", "replace").count(KEPT)  # noqa: E731
    try:
        delta(home, d.serial, v2, target)
        assert content() == v2.read_bytes() and kept() == 0
        # Nothing touched it since: the digests come from the index.
        delta(home, d.serial, v1, target)
        assert content() == v1.read_bytes() and kept() == 1
        assert len(list((tmp_path / "state" / "delta-index").iterdir())) == 1
        # Something else writes to it: the index no longer describes it.
        fd = os.open(target, os.O_WRONLY)
        try:
            os.pwrite(fd, os.urandom(3 * BLOCK), 40 * BLOCK + 100)
            os.fsync(fd)
        finally:
            os.close(fd)
        delta(home, d.serial, v2, target)
        assert content() == v2.read_bytes() and kept() == 1
    finally:
        if loop:
            loop.close()


def test_a_write_left_in_the_page_cache_by_another_node_is_seen(fresh_daemon, home, tmp_path,
                                                               images):
    """A write through another node of the same device, kept open so that
    no close flushes it: the daemon flushes the device before reading its
    write count, the count moves, and the index is not used."""
    v1, v2 = images
    d = fresh_daemon("delta-dirty", args=private_state(tmp_path), rust_log="info")
    loop = Loop(tmp_path / "backing.img", v1)
    try:
        delta(home, d.serial, v2, loop.device)
        image = v2.read_bytes()
        # A block the image has (not a zero one, which a delta sends as ZERO anyway).
        block = next(i for i in range(1, IMAGE // BLOCK)
                     if any(image[i * BLOCK:(i + 1) * BLOCK]))
        alias = tmp_path / "alias"
        os.mknod(alias, 0o600 | stat.S_IFBLK, os.stat(loop.device).st_rdev)
        fd = os.open(alias, os.O_WRONLY)
        try:
            os.pwrite(fd, os.urandom(BLOCK), block * BLOCK)
            delta(home, d.serial, v2, loop.device)
        finally:
            os.close(fd)
        assert d.log_path.read_text("utf-8", "replace").count(KEPT) == 0
        assert loop.first(IMAGE) == v2.read_bytes()
    finally:
        loop.close()


def test_a_target_rewritten_behind_its_node_fails_the_index_sample(fresh_daemon, home, tmp_path,
                                                                  images):
    """The loop device's backing file rewritten directly, as a whole disk
    written over a partition: the device's own write count does not move,
    so the key holds; the blocks the daemon samples before trusting the
    index differ, and it reads the device instead."""
    v1, v2 = images
    d = fresh_daemon("delta-behind", args=private_state(tmp_path), rust_log="info")
    loop = Loop(tmp_path / "backing.img", v1)
    try:
        delta(home, d.serial, v2, loop.device)
        with open(loop.backing, "r+b") as f:
            f.write(os.urandom(IMAGE))
            f.flush()
            os.fsync(f.fileno())
        # Drop the loop device's cached pages: its reads now see the file.
        subprocess.run(["blockdev", "--flushbufs", loop.device], check=True)
        assert loop.first(BLOCK * 4) != v2.read_bytes()[:BLOCK * 4]
        delta(home, d.serial, v2, loop.device)
        log = d.log_path.read_text("utf-8", "replace")
        assert "no longer matches the index kept for it" in log, log
        assert log.count(KEPT) == 0
        assert loop.first(IMAGE) == v2.read_bytes()
        # The index the second delta kept holds again.
        delta(home, d.serial, v1, loop.device)
        assert d.log_path.read_text("utf-8", "replace").count(KEPT) == 1
        assert loop.first(IMAGE) == v1.read_bytes()
    finally:
        loop.close()
