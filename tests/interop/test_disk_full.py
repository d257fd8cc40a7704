"""Full disks and failing writes on every push path, and on oxadb's pull.

Each filesystem is made by the test under tmp_path and unmounted at teardown,
even after a failure:
  * ENOSPC: a 2 MiB tmpfs;
  * EIO and EDQUOT: `faultfs.py`, a passthrough FUSE filesystem that fails
    writes past 1 MiB, or fsyncs of files over 1 MiB (every write succeeded,
    the data never reached storage: the push must not be told OKAY), with
    that errno. (A real quota, ext4 `-O quota` on a loop device, needs a
    kernel with CONFIG_QUOTA, which this one is built without: its mount
    says "The kernel was not built with CONFIG_QUOTA and CONFIG_QFMT_V2".)

Every failed push must: fail with adb's format (`failed to copy 'SRC' to
'DEST': remote ...`) and a message naming the destination and the cause,
leave the old destination intact, leave no `.oxadb-push.*` entry, and leave
the connection usable: a small push on the same adb connection (no new
`connection accepted` in the daemon's log) or in the same oxadb process
succeeds. Peers: adb 29 (single file, directory), adb 34 (compressed single
file and directory), oxadb (several files in one process, compressed, and
pulls into a full local filesystem).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import clean_env, resolve_oxadb, sha256_file, write_random
from test_adb34 import adb34_bin, _server  # noqa: F401  (adb34_bin is a fixture)

MIB = 1 << 20
BIG = 3 * MIB
OLD = b"the old version, which a failed push must leave alone\n" * 80
NEW_SMALL = b"a small file that fits\n" * 40
NOSPC = "No space left on device"
DQUOT = "Disk quota exceeded"
EIO = "Input/output error"
FAULTFS = Path(__file__).with_name("faultfs.py")


def run(*cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=timeout, text=True)


def unmount(d: Path) -> None:
    if run("umount", str(d)).returncode != 0:
        run("umount", "-l", str(d))
    assert not os.path.ismount(d), f"{d} is still mounted"


# --- filesystems ---------------------------------------------------------------

@pytest.fixture
def tmpfs_2m(tmp_path):
    d = tmp_path / "tmpfs"
    d.mkdir()
    r = run("mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(d))
    assert r.returncode == 0, f"mount tmpfs: {r.stdout}"
    try:
        yield d
    finally:
        unmount(d)


def _faultfs(tmp_path: Path, name: str, *args: str):
    backing, d = tmp_path / f"{name}-backing", tmp_path / name
    backing.mkdir()
    d.mkdir()
    proc = subprocess.Popen([sys.executable, str(FAULTFS), str(backing), str(d), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line == "ready", f"faultfs did not mount: {line} {proc.stdout.read()}"
        yield d
    finally:
        unmount(d)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def eio_write_fs(tmp_path):
    yield from _faultfs(tmp_path, "eio-write", "--fail-write-over", str(MIB))


@pytest.fixture
def eio_fsync_fs(tmp_path):
    yield from _faultfs(tmp_path, "eio-fsync", "--fail-fsync-over", str(MIB))


@pytest.fixture
def quota_fs(tmp_path):
    yield from _faultfs(tmp_path, "quota", "--fail-write-over", str(MIB), "--errno", "EDQUOT")


@pytest.fixture
def enospc_fsync_fs(tmp_path):
    """ENOSPC only at fsync: delayed allocation finding no blocks at writeback."""
    yield from _faultfs(tmp_path, "nospc-fsync", "--fail-fsync-over", str(MIB),
                        "--errno", "ENOSPC")


# --- peers -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def adb34(adb34_bin, tmp_path_factory):  # noqa: F811
    srv = _server(adb34_bin, tmp_path_factory.mktemp("adb34"))
    yield srv
    srv.kill()


class Peer:
    """One adb server connected to one daemon; `push` runs `adb -s SERIAL push`."""

    def __init__(self, server, daemon):
        self.server, self.daemon = server, daemon
        server.connect(daemon.serial)

    def __call__(self, *args: str, timeout: float = 60):
        return self.server.run(*args, serial=self.daemon.serial, timeout=timeout)

    def connections(self) -> int:
        return self.daemon.log_since(0).count(b"connection accepted")


def oxadb(daemon, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    home = tmp_path / "oxadb-home"
    home.mkdir(exist_ok=True)
    return subprocess.run([str(resolve_oxadb()), "-s", daemon.serial, *args],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=clean_env(HOME=str(home)),
                          timeout=60, text=True)


# --- checks ----------------------------------------------------------------------

def leftovers(d: Path, prefix: str = ".oxadb-") -> list[str]:
    return [str(p) for p in d.rglob("*") if p.name.startswith(prefix)]


def assert_failed_copy(text: str, src: Path, dest: Path, cause: str) -> None:
    """adb's format for a push the daemon refused, naming DEST and the cause."""
    head = f"failed to copy '{src}' to '{dest}': remote "
    assert head in text, text
    reason = text.split(head, 1)[1].splitlines()[0]
    assert f"'{dest}'" in reason and cause in reason, text


def assert_clean_and_usable(peer: Peer, d: Path, old: Path, connections: int,
                            tmp_path: Path) -> None:
    assert old.read_bytes() == OLD, "the old destination changed"
    assert leftovers(d) == [], leftovers(d)
    small = tmp_path / "small.txt"
    small.write_bytes(NEW_SMALL)
    r = peer("push", str(small), str(d / "after.txt"))
    assert r.rc == 0, r
    assert (d / "after.txt").read_bytes() == NEW_SMALL
    assert peer.connections() == connections, "adb reconnected"


def single_file(peer: Peer, d: Path, tmp_path: Path, cause: str, *push_args: str) -> None:
    old = d / "target.bin"
    old.write_bytes(OLD)
    src = tmp_path / "big.bin"
    write_random(src, BIG)
    connections = peer.connections()
    r = peer("push", *push_args, str(src), str(old))
    assert r.rc != 0, r
    assert_failed_copy(r.both, src, old, cause)
    assert_clean_and_usable(peer, d, old, connections, tmp_path)


def directory(peer: Peer, d: Path, tmp_path: Path, cause: str, *push_args: str) -> None:
    """A tree whose middle file does not fit: the files before it arrive whole
    (each is atomic), the one that failed keeps its old version."""
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_bytes(b"a" * 1000)
    write_random(tree / "sub" / "big.bin", BIG)
    (tree / "z.txt").write_bytes(b"z" * 1000)
    (d / "tree" / "sub").mkdir(parents=True)
    old = d / "tree" / "sub" / "big.bin"
    old.write_bytes(OLD)
    connections = peer.connections()
    r = peer("push", *push_args, str(tree), str(d))
    assert r.rc != 0, r
    assert_failed_copy(r.both, tree / "sub" / "big.bin", old, cause)
    for name in ("a.txt", "z.txt"):
        got = d / "tree" / name
        assert not got.exists() or got.read_bytes() == (tree / name).read_bytes(), name
    assert_clean_and_usable(peer, d, old, connections, tmp_path)


# --- ENOSPC ----------------------------------------------------------------------

def test_adb29_push_into_a_full_tmpfs(adb_server, fresh_daemon, tmpfs_2m, tmp_path):
    single_file(Peer(adb_server, fresh_daemon()), tmpfs_2m, tmp_path, NOSPC)


def test_adb29_directory_push_into_a_full_tmpfs(adb_server, fresh_daemon, tmpfs_2m, tmp_path):
    directory(Peer(adb_server, fresh_daemon()), tmpfs_2m, tmp_path, NOSPC)


@pytest.mark.parametrize("algorithm", ["brotli", "lz4", "zstd"])
def test_adb34_compressed_push_into_a_full_tmpfs(algorithm, adb34, fresh_daemon, tmpfs_2m,
                                                 tmp_path):
    d = fresh_daemon()
    peer = Peer(adb34, d)
    mark = d.log_size()
    single_file(peer, tmpfs_2m, tmp_path, NOSPC, "-z", algorithm)
    assert b"SND2 setup" in d.log_since(mark), "adb 34 did not use SND2"


def test_adb34_compressed_directory_push_into_a_full_tmpfs(adb34, fresh_daemon, tmpfs_2m,
                                                           tmp_path):
    d = fresh_daemon()
    directory(Peer(adb34, d), tmpfs_2m, tmp_path, NOSPC, "-z", "zstd")
    assert b"SND2 setup" in d.log_since(0), "adb 34 did not use SND2"


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_oxadb_pushes_the_files_that_fit_in_one_process(compression, fresh_daemon, tmpfs_2m,
                                                        tmp_path):
    d = fresh_daemon()
    (tmpfs_2m / "big.bin").write_bytes(OLD)
    big, small = tmp_path / "big.bin", tmp_path / "small.txt"
    write_random(big, BIG)
    small.write_bytes(NEW_SMALL)
    r = oxadb(d, tmp_path, "push", "-z", compression, str(big), str(small), f"{tmpfs_2m}/")
    assert r.returncode != 0, r
    dest = tmpfs_2m / "big.bin"
    assert_failed_copy(r.stdout + r.stderr, big, dest, NOSPC)
    assert dest.read_bytes() == OLD
    assert (tmpfs_2m / "small.txt").read_bytes() == NEW_SMALL
    assert leftovers(tmpfs_2m) == []
    assert d.log_since(0).count(b"connection accepted") == 1


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_oxadb_pull_into_a_full_local_tmpfs(compression, fresh_daemon, tmpfs_2m, tmp_path):
    d = fresh_daemon()
    remote = tmp_path / "remote"
    remote.mkdir()
    write_random(remote / "big.bin", BIG)
    (remote / "small.txt").write_bytes(NEW_SMALL)
    local = tmpfs_2m / "big.bin"
    local.write_bytes(OLD)
    r = oxadb(d, tmp_path, "pull", "-z", compression, str(remote / "big.bin"),
              str(remote / "small.txt"), str(tmpfs_2m))
    assert r.returncode != 0, r
    out = r.stdout + r.stderr
    assert str(local) in out and NOSPC in out, out
    assert local.read_bytes() == OLD
    assert (tmpfs_2m / "small.txt").read_bytes() == NEW_SMALL
    assert leftovers(tmpfs_2m) == []
    if compression != "none":
        assert b"RCV2 setup" in d.log_since(0), "oxadb did not pull with RCV2"


def test_oxadb_tree_pull_into_a_full_local_tmpfs(fresh_daemon, tmpfs_2m, tmp_path):
    """The tree's big file does not fit: the files pulled before it are whole,
    its old local version is kept."""
    d = fresh_daemon()
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_bytes(b"a" * 1000)
    write_random(tree / "sub" / "big.bin", BIG)
    (tmpfs_2m / "tree" / "sub").mkdir(parents=True)
    old = tmpfs_2m / "tree" / "sub" / "big.bin"
    old.write_bytes(OLD)
    r = oxadb(d, tmp_path, "pull", str(tree), str(tmpfs_2m))
    assert r.returncode != 0, r
    out = r.stdout + r.stderr
    assert f"'{old}'" in out and NOSPC in out, out
    assert old.read_bytes() == OLD
    got = tmpfs_2m / "tree" / "a.txt"
    assert not got.exists() or got.read_bytes() == b"a" * 1000
    assert leftovers(tmpfs_2m) == []


# --- EDQUOT ----------------------------------------------------------------------

def test_adb29_push_over_quota(adb_server, fresh_daemon, quota_fs, tmp_path):
    single_file(Peer(adb_server, fresh_daemon()), quota_fs, tmp_path, DQUOT)


def test_adb34_compressed_directory_push_over_quota(adb34, fresh_daemon, quota_fs, tmp_path):
    d = fresh_daemon()
    directory(Peer(adb34, d), quota_fs, tmp_path, DQUOT, "-z", "lz4")
    assert b"SND2 setup" in d.log_since(0), "adb 34 did not use SND2"


def test_adb29_push_whose_fsync_finds_no_space(adb_server, fresh_daemon, enospc_fsync_fs,
                                                tmp_path):
    d = fresh_daemon()
    single_file(Peer(adb_server, d), enospc_fsync_fs, tmp_path, NOSPC)
    assert b"couldn't sync" in d.log_since(0), "the failure was not the fsync's"


# --- EIO -------------------------------------------------------------------------

def test_adb29_push_onto_a_failing_disk(adb_server, fresh_daemon, eio_write_fs, tmp_path):
    single_file(Peer(adb_server, fresh_daemon()), eio_write_fs, tmp_path, EIO)


def test_adb34_compressed_push_onto_a_failing_disk(adb34, fresh_daemon, eio_write_fs, tmp_path):
    single_file(Peer(adb34, fresh_daemon()), eio_write_fs, tmp_path, EIO, "-z", "brotli")


def test_adb29_push_whose_fsync_fails_is_not_okayed(adb_server, fresh_daemon, eio_fsync_fs,
                                                     tmp_path):
    d = fresh_daemon()
    peer = Peer(adb_server, d)
    single_file(peer, eio_fsync_fs, tmp_path, EIO)
    assert b"couldn't sync" in d.log_since(0), "the failure was not the fsync's"


def test_oxadb_directory_push_whose_fsync_fails(fresh_daemon, eio_fsync_fs, tmp_path):
    d = fresh_daemon()
    tree = tmp_path / "tree"
    tree.mkdir()
    write_random(tree / "big.bin", BIG)
    (tree / "small.txt").write_bytes(NEW_SMALL)
    (eio_fsync_fs / "tree").mkdir()
    old = eio_fsync_fs / "tree" / "big.bin"
    old.write_bytes(OLD)
    r = oxadb(d, tmp_path, "push", "-z", "lz4", str(tree), str(eio_fsync_fs))
    assert r.returncode != 0, r
    assert_failed_copy(r.stdout + r.stderr, tree / "big.bin", old, EIO)
    assert old.read_bytes() == OLD
    assert leftovers(eio_fsync_fs) == []


def test_oxadb_pull_whose_local_fsync_fails(fresh_daemon, eio_fsync_fs, tmp_path):
    d = fresh_daemon()
    remote = tmp_path / "remote.bin"
    write_random(remote, BIG)
    local = eio_fsync_fs / "pulled.bin"
    local.write_bytes(OLD)
    r = oxadb(d, tmp_path, "pull", str(remote), str(local))
    assert r.returncode != 0, r
    out = r.stdout + r.stderr
    assert str(local) in out and EIO in out, out
    assert local.read_bytes() == OLD
    assert leftovers(eio_fsync_fs) == []


# --- destinations written in place ---------------------------------------------

def test_adb29_push_into_a_full_device_node(adb_server, fresh_daemon, tmp_path):
    """A character device is written in place (adbd does too): a private
    /dev/full node (1, 7) answers every write with ENOSPC."""
    d = tmp_path / "dev"
    d.mkdir()
    node = d / "full"
    r = run("mknod", str(node), "c", "1", "7")
    assert r.returncode == 0, r.stdout
    peer = Peer(adb_server, fresh_daemon())
    src = tmp_path / "big.bin"
    write_random(src, BIG)
    connections = peer.connections()
    r = peer("push", str(src), str(node))
    assert r.rc != 0, r
    assert_failed_copy(r.both, src, node, NOSPC)
    assert node.is_char_device() and os.major(node.stat().st_rdev) == 1
    assert sorted(p.name for p in d.iterdir()) == ["full"]
    small = tmp_path / "small.txt"
    small.write_bytes(NEW_SMALL)
    r = peer("push", str(small), str(d / "after.txt"))
    assert r.rc == 0, r
    assert peer.connections() == connections, "adb reconnected"


@pytest.fixture
def bound_file(tmpfs_2m, tmp_path):
    """A file of the full tmpfs bind-mounted onto a file of a roomy directory:
    it cannot be renamed over (EBUSY), so the daemon copies a finished push
    into it, as a bind-mounted /etc/hosts in a container."""
    inner = tmpfs_2m / "config"
    inner.write_bytes(OLD)
    roomy = tmp_path / "roomy"
    roomy.mkdir()
    bound = roomy / "config"
    bound.write_bytes(b"")
    r = run("mount", "--bind", str(inner), str(bound))
    assert r.returncode == 0, r.stdout
    try:
        yield bound
    finally:
        unmount(bound)


def test_adb29_push_over_a_bind_mounted_file_on_a_full_disk(adb_server, fresh_daemon,
                                                            bound_file, tmp_path):
    peer = Peer(adb_server, fresh_daemon())
    src = tmp_path / "big.bin"
    write_random(src, BIG)
    connections = peer.connections()
    r = peer("push", str(src), str(bound_file))
    assert r.rc != 0, r
    assert_failed_copy(r.both, src, bound_file, NOSPC)
    assert bound_file.read_bytes() == OLD, "the old content of the bound file changed"
    assert leftovers(bound_file.parent) == []
    small = tmp_path / "small.txt"
    small.write_bytes(NEW_SMALL)
    r = peer("push", str(small), str(bound_file))
    assert r.rc == 0, r
    assert bound_file.read_bytes() == NEW_SMALL
    assert peer.connections() == connections, "adb reconnected"


@pytest.fixture
def tmpfs_few_inodes(tmp_path):
    d = tmp_path / "few-inodes"
    d.mkdir()
    r = run("mount", "-t", "tmpfs", "-o", "size=8m,nr_inodes=8,mode=0755", "tmpfs", str(d))
    assert r.returncode == 0, f"mount tmpfs: {r.stdout}"
    try:
        yield d
    finally:
        unmount(d)


def test_adb29_directory_push_out_of_inodes(adb_server, fresh_daemon, tmpfs_few_inodes,
                                            tmp_path):
    """No inode left for a directory or a temporary file: ENOSPC from mkdir or
    open, each naming its path."""
    peer = Peer(adb_server, fresh_daemon())
    tree = tmp_path / "tree"
    for i in range(6):
        (tree / f"d{i}").mkdir(parents=True)
        (tree / f"d{i}" / "f.txt").write_bytes(b"x" * 100)
    connections = peer.connections()
    r = peer("push", str(tree), str(tmpfs_few_inodes))
    assert r.rc != 0, r
    assert "failed to copy" in r.both and NOSPC in r.both, r
    reason = r.both.split(": remote ", 1)[1].splitlines()[0]
    assert (reason.startswith("couldn't create file '")
            or reason.startswith("couldn't create directory '")), r
    assert str(tmpfs_few_inodes) in reason, r
    assert leftovers(tmpfs_few_inodes) == []
    for f in tmpfs_few_inodes.rglob("f.txt"):
        assert f.read_bytes() == b"x" * 100
    small = tmp_path / "small.txt"
    small.write_bytes(NEW_SMALL)
    r = peer("push", str(small), str(tmp_path / "after.txt"))
    assert r.rc == 0, r
    assert peer.connections() == connections, "adb reconnected"


@pytest.fixture
def immutable_dir_on_full_tmpfs(tmpfs_2m):
    """A directory root may not add to (chattr +i) holding a writable file:
    oxadb, like adb, then overwrites the file in place instead of renaming a
    temporary file over it."""
    d = tmpfs_2m / "locked"
    d.mkdir()
    (d / "pulled.bin").write_bytes(OLD)
    r = run("chattr", "+i", str(d))
    assert r.returncode == 0, r.stdout
    try:
        yield d
    finally:
        run("chattr", "-i", str(d))


def test_oxadb_pull_overwriting_in_place_on_a_full_disk(fresh_daemon, immutable_dir_on_full_tmpfs,
                                                        tmp_path):
    d = fresh_daemon()
    remote = tmp_path / "remote.bin"
    write_random(remote, BIG)
    local = immutable_dir_on_full_tmpfs / "pulled.bin"
    r = oxadb(d, tmp_path, "pull", str(remote), str(local))
    assert r.returncode != 0, r
    out = r.stdout + r.stderr
    assert f"cannot write '{local}': {NOSPC}" in out, out
    assert local.read_bytes() == OLD, "the file was overwritten before the space was known"
    # A file that fits is written in place, its old tail cut off.
    small = tmp_path / "small.txt"
    small.write_bytes(b"new")
    r = oxadb(d, tmp_path, "pull", str(small), str(local))
    assert r.returncode == 0, r
    assert local.read_bytes() == b"new"
    assert sorted(p.name for p in immutable_dir_on_full_tmpfs.iterdir()) == ["pulled.bin"]
