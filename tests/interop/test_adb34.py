"""Google adb 34.0.5 (Debian 13's `adb` package) against oxadbd.

adb 34 is Google's own implementation of SND2/RCV2 with brotli, lz4 and zstd,
which Debian 12's adb 29 predates and no published Tango version implements:
here a compressed framing that only oxadb understood would fail. It also
speaks `delayed_ack` when `ADB_DELAYED_ACK=1` is set (AOSP renamed the
variable `ADB_BURST_MODE` in 2025), a second independent burst-mode client
beside Tango.

./scripts/test.sh installs a private copy with scripts/install-adb34.sh into
target/peers/adb-34 (or set OXADB_ADB34 to an adb 34 wrapper). Each test runs
its own daemon (`fresh_daemon`, RUST_LOG=debug): the daemon's `SND2 setup` /
`RCV2 setup` lines show the flags adb chose and its `stream closed` lines the
bytes that crossed the wire, so the tests check that compression really
happened, not only that the files arrived intact.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from harness import REPO, AdbServer, closed_streams, sha256_file, write_random

ADB34_VERSION = "34.0.5"
MIB = 1 << 20
SIZE = 8 * MIB
# The SND2/RCV2 flag of each algorithm (AOSP file_sync_protocol.h).
FLAGS = {"brotli": 0x1, "lz4": 0x2, "zstd": 0x4}
BASE_MTIME = 1_600_000_000


@pytest.fixture(scope="module")
def adb34_bin() -> str:
    adb = Path(os.environ.get("OXADB_ADB34") or REPO / "target" / "peers" / "adb-34" / "adb")
    if not adb.exists():
        pytest.fail(f"Google adb {ADB34_VERSION} is not installed at {adb}: ./scripts/test.sh "
                    f"installs it (scripts/install-adb34.sh target/peers/adb-34)")
    out = subprocess.run([str(adb), "version"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=30).stdout.decode("utf-8", "replace")
    if f"Version {ADB34_VERSION}" not in out:
        pytest.fail(f"{adb} is not adb {ADB34_VERSION}: `adb version` says:\n{out}")
    return str(adb)


def _server(adb: str, workdir: Path, **env: str):
    srv = AdbServer(adb, workdir)
    srv.env.update(env)
    srv.start()
    return srv


@pytest.fixture(scope="module")
def server(adb34_bin, tmp_path_factory):
    srv = _server(adb34_bin, tmp_path_factory.mktemp("adb34"))
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def burst_server(adb34_bin, tmp_path_factory):
    srv = _server(adb34_bin, tmp_path_factory.mktemp("adb34burst"), ADB_DELAYED_ACK="1")
    yield srv
    srv.kill()


def _connected(srv: AdbServer, fresh_daemon, args: tuple[str, ...] = ()):
    d = fresh_daemon(args=args)
    srv.connect(d.serial)
    return d


def _text_file(path: Path, size: int) -> str:
    """Compressible data: numbered lines of text."""
    line_no = 0
    chunks = []
    total = 0
    while total < size:
        line = f"line {line_no} of a compressible file, {line_no * 7919 % 1000:03d}\n"
        chunks.append(line)
        total += len(line)
        line_no += 1
    data = "".join(chunks).encode()[:size]
    path.write_bytes(data)
    return sha256_file(path)


def _setup_flags(d, request: str, since: int) -> list[int]:
    """The flags of every `SND2 setup` / `RCV2 setup` line the daemon logged since `since`."""
    flags = []
    for line in d.log_since(since).decode("utf-8", "replace").splitlines():
        if f"{request} setup" in line:
            value = line.split("flags=", 1)[1].split()[0]
            flags.append(int(value, 16))
    return flags


def _last_sync_stream(d, since_count: int) -> dict[str, str]:
    lines = closed_streams(d, service="sync:", want=since_count + 1)
    return lines[since_count]


def test_adb34_lists_oxadbd_with_its_compression_features(server, fresh_daemon):
    d = _connected(server, fresh_daemon)
    assert server.devices().get(d.serial) == "device"
    r = server.run("features", serial=d.serial)
    assert r.rc == 0, r
    features = set(r.out.split())
    for want in ("shell_v2", "sendrecv_v2", "sendrecv_v2_brotli", "sendrecv_v2_lz4",
                 "sendrecv_v2_zstd", "sendrecv_v2_dry_run_send"):
        assert want in features, (want, r.out)


def test_adb34_shell_v2_keeps_stderr_apart_and_returns_the_exit_status(server, fresh_daemon):
    d = _connected(server, fresh_daemon)
    r = server.run("shell", "echo out; echo err >&2; exit 7", serial=d.serial)
    assert r.rc == 7, r
    assert r.out == "out\n" and r.err == "err\n", r


@pytest.mark.parametrize("algorithm", sorted(FLAGS))
def test_adb34_compressed_push_and_pull_arrive_intact_and_compressed(
        algorithm, server, fresh_daemon, tmp_path):
    d = _connected(server, fresh_daemon)
    remote = tmp_path / "remote"
    remote.mkdir()
    text, noise = tmp_path / "text.txt", tmp_path / "noise.bin"
    text_digest = _text_file(text, SIZE)
    noise_digest = write_random(noise, SIZE)
    os.chmod(text, 0o640)
    os.utime(text, (BASE_MTIME, BASE_MTIME))

    # Push: adb compresses, oxadbd decodes.
    mark = d.log_size()
    streams = len(closed_streams(d, service="sync:", want=0, timeout=0))
    r = server.run("push", "-z", algorithm, str(text), str(noise), f"{remote}/",
                   serial=d.serial)
    assert r.rc == 0 and "2 files pushed" in r.out, r
    assert _setup_flags(d, "SND2", mark) == [FLAGS[algorithm]] * 2, d.log_since(mark)
    assert sha256_file(remote / "text.txt") == text_digest
    assert sha256_file(remote / "noise.bin") == noise_digest
    st = os.stat(remote / "text.txt")
    assert stat.S_IMODE(st.st_mode) == 0o640, oct(st.st_mode)
    assert int(st.st_mtime) == BASE_MTIME
    pushed = _last_sync_stream(d, streams)
    # Both files went over one sync stream: the text must have shrunk on the
    # wire, so well under the 16 MiB of the two files crossed it.
    assert int(pushed["bytes_received"]) < SIZE + SIZE // 4, pushed

    # Pull: oxadbd compresses, adb decodes.
    back = tmp_path / "back"
    back.mkdir()
    mark = d.log_size()
    streams = len(closed_streams(d, service="sync:", want=0, timeout=0))
    r = server.run("pull", "-a", "-z", algorithm, str(remote / "text.txt"), str(back / "text.txt"),
                   serial=d.serial)
    assert r.rc == 0 and "1 file pulled" in r.out, r
    assert _setup_flags(d, "RCV2", mark) == [FLAGS[algorithm]], d.log_since(mark)
    assert sha256_file(back / "text.txt") == text_digest
    assert int(os.stat(back / "text.txt").st_mtime) == BASE_MTIME
    pulled = _last_sync_stream(d, streams)
    assert int(pulled["bytes_sent"]) < SIZE // 4, pulled

    r = server.run("pull", "-z", algorithm, str(remote / "noise.bin"), str(back / "noise.bin"),
                   serial=d.serial)
    assert r.rc == 0, r
    assert sha256_file(back / "noise.bin") == noise_digest


def test_adb34_compressed_directory_push_and_pull(server, fresh_daemon, tmp_path):
    d = _connected(server, fresh_daemon)
    tree = tmp_path / "tree"
    (tree / "sub" / "deeper").mkdir(parents=True)
    digests = {}
    for i, rel in enumerate(["a.txt", "sub/b.bin", "sub/deeper/c.txt", "empty"]):
        path = tree / rel
        if rel == "empty":
            path.write_bytes(b"")
        elif rel.endswith(".bin"):
            write_random(path, 300_000 + i)
        else:
            _text_file(path, 500_000 + i)
        digests[rel] = sha256_file(path)
    remote = tmp_path / "remote"
    remote.mkdir()
    r = server.run("push", "-z", "any", str(tree), str(remote), serial=d.serial)
    assert r.rc == 0 and "4 files pushed" in r.out, r
    assert all(flag in FLAGS.values() for flag in _setup_flags(d, "SND2", 0)), \
        "`-z any` should pick one of the algorithms oxadbd offers"
    back = tmp_path / "back"
    r = server.run("pull", "-z", "zstd", str(remote / "tree"), str(back), serial=d.serial)
    assert r.rc == 0 and "4 files pulled" in r.out, r
    for rel, digest in digests.items():
        assert sha256_file(remote / "tree" / rel) == digest, rel
        assert sha256_file(back / rel) == digest, rel


def test_adb34_interrupted_compressed_push_keeps_the_old_destination(server, fresh_daemon,
                                                                     tmp_path):
    """adb killed in the middle of a brotli push: the destination keeps its old
    contents, the daemon drops its temporary file and keeps serving."""
    d = _connected(server, fresh_daemon)
    remote = tmp_path / "remote"
    remote.mkdir()
    victim = remote / "victim.bin"
    old_digest = write_random(victim, MIB)
    # 2 GiB sparse: cheap to read, and even compressed it cannot finish in the
    # moment the test needs to see it start.
    source = tmp_path / "huge.bin"
    with open(source, "wb") as f:
        f.truncate(2 << 30)
    proc = server.popen("push", "-z", "brotli", str(source), str(victim), serial=d.serial)
    try:
        deadline = time.monotonic() + 30
        debris: list[str] = []
        while time.monotonic() < deadline and proc.poll() is None:
            debris = [p.name for p in remote.iterdir() if p.name != "victim.bin"]
            if debris and any((remote / n).stat().st_size > MIB for n in debris
                              if (remote / n).exists()):
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"adb push finished before it could be interrupted: {proc}"
        assert debris, "the daemon wrote no temporary file within 30 s"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    assert _setup_flags(d, "SND2", 0) == [FLAGS["brotli"]]
    assert sha256_file(victim) == old_digest, "an interrupted push modified the destination"
    deadline = time.monotonic() + 10
    while sorted(p.name for p in remote.iterdir()) != ["victim.bin"] and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(p.name for p in remote.iterdir()) == ["victim.bin"], "debris left behind"
    r = server.run("shell", "echo still here", serial=d.serial)
    assert r.rc == 0 and r.out == "still here\n", r


@pytest.mark.parametrize("credit", ["adaptive", "aosp"])
def test_adb34_burst_mode_push_and_pull_run_with_delayed_acks(credit, burst_server,
                                                              fresh_daemon, tmp_path):
    d = _connected(burst_server, fresh_daemon, args=("--credit", credit))
    r = burst_server.run("features", serial=d.serial)
    assert "delayed_ack" in r.out.split(), r
    local = tmp_path / "data.bin"
    digest = write_random(local, 32 * MIB)
    remote = tmp_path / "remote.bin"
    streams = len(closed_streams(d, service="sync:", want=0, timeout=0))
    r = burst_server.run("push", "-z", "none", str(local), str(remote), serial=d.serial)
    assert r.rc == 0, r
    assert sha256_file(remote) == digest
    pushed = _last_sync_stream(d, streams)
    assert pushed["delayed_ack"] == "true", pushed
    assert int(pushed["bytes_received"]) >= 32 * MIB, pushed
    back = tmp_path / "back.bin"
    r = burst_server.run("pull", "-z", "none", str(remote), str(back), serial=d.serial)
    assert r.rc == 0, r
    assert sha256_file(back) == digest
    pulled = _last_sync_stream(d, streams + 1)
    assert pulled["delayed_ack"] == "true", pulled
    assert int(pulled["bytes_sent"]) >= 32 * MIB, pulled
    if credit == "adaptive":
        # The adaptive window is what the daemon granted; it is logged per stream.
        assert "window" in pushed and int(pushed["window"]) <= 32 * MIB, pushed
