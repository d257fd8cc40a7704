"""adb push / pull (the sync: service) against oxadbd.

The daemon runs on this machine, so its "device side" is just another
temporary directory; we check it directly with os.stat and sha256.
adb 29 sends mtime in seconds (DONE carries a u32) and the full st_mode in
SEND ("path,mode"), so we compare whole seconds and mode & 0o7777.
"""

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from harness import sha256_file, write_random
from treeutil import (BASE_MTIME, TREE_FILES, TREE_LINKS, UNICODE_DIR, UNICODE_FILE,
                      build_tree, describe, nonempty_dirs, all_dirs)

UMASK = 0o022  # the umask every adb client runs with in this suite (see harness)


def summary(r, n_files, n_skipped, verb="pushed"):
    word = "file" if n_files == 1 else "files"
    pat = rf"\b{n_files} {word} {verb}, {n_skipped} skipped\."
    assert re.search(pat, r.both), f"expected /{pat}/ in adb output: {r!r}"


@pytest.fixture
def remote(tmp_path) -> Path:
    """The 'device side' directory of this test."""
    d = tmp_path / "remote"
    d.mkdir()
    return d


@pytest.fixture
def local(tmp_path) -> Path:
    d = tmp_path / "local"
    d.mkdir()
    return d


# --- single files -------------------------------------------------------------

def test_push_pull_64mib(adb, local, remote, tmp_path):
    src = local / "big.bin"
    digest = write_random(src, 64 << 20)
    os.chmod(src, 0o640)
    os.utime(src, (BASE_MTIME, BASE_MTIME))

    dst = remote / "big.bin"
    r = adb("push", str(src), str(dst), timeout=180)
    assert r.rc == 0, r
    summary(r, 1, 0)
    assert f"({64 << 20} bytes in" in r.out, r
    st = os.stat(dst)
    assert st.st_size == 64 << 20
    assert sha256_file(dst) == digest
    assert stat.S_IMODE(st.st_mode) == 0o640, oct(st.st_mode)
    assert int(st.st_mtime) == BASE_MTIME

    back = tmp_path / "pulled.bin"
    r = adb("pull", "-a", str(dst), str(back), timeout=180)
    assert r.rc == 0, r
    summary(r, 1, 0, "pulled")
    st = os.stat(back)
    assert sha256_file(back) == digest
    assert stat.S_IMODE(st.st_mode) == 0o640, oct(st.st_mode)
    assert int(st.st_mtime) == BASE_MTIME


@pytest.mark.parametrize("mode", [0o640, 0o755, 0o751, 0o600, 0o664], ids=lambda m: f"{m:o}")
def test_push_keeps_exact_mode(adb, local, remote, mode):
    # The daemon applies the mode adb sends, not (mode & ~its umask): it runs
    # with umask 022 here, which would turn 0664 into 0644.
    src = local / f"m{mode:o}.bin"
    write_random(src, 1000)
    os.chmod(src, mode)
    r = adb("push", str(src), str(remote / src.name))
    assert r.rc == 0, r
    assert stat.S_IMODE(os.stat(remote / src.name).st_mode) == mode


def test_push_pull_empty_file(adb, local, remote, tmp_path):
    src = local / "zero"
    src.write_bytes(b"")
    os.chmod(src, 0o644)
    os.utime(src, (BASE_MTIME + 7, BASE_MTIME + 7))
    r = adb("push", str(src), str(remote / "zero"))
    assert r.rc == 0, r
    summary(r, 1, 0)
    st = os.stat(remote / "zero")
    assert stat.S_ISREG(st.st_mode) and st.st_size == 0
    assert int(st.st_mtime) == BASE_MTIME + 7

    back = tmp_path / "zero.back"
    back.write_bytes(b"stale content to be replaced")
    r = adb("pull", "-a", str(remote / "zero"), str(back))
    assert r.rc == 0, r
    summary(r, 1, 0, "pulled")
    assert back.read_bytes() == b""
    assert int(back.stat().st_mtime) == BASE_MTIME + 7


def test_push_over_existing_file_replaces_it(adb, local, remote):
    dst = remote / "f.bin"
    dst.write_bytes(b"old" * 100000)
    src = local / "f.bin"
    digest = write_random(src, 12345)
    r = adb("push", str(src), str(dst))
    assert r.rc == 0, r
    assert sha256_file(dst) == digest
    assert dst.stat().st_size == 12345  # truncated, not overwritten in place
    assert sorted(os.listdir(remote)) == ["f.bin"]


def test_push_into_existing_dir_uses_basename(adb, local, remote):
    src = local / "name with space.txt"
    src.write_bytes(b"payload\n")
    r = adb("push", str(src), str(remote) + "/")
    assert r.rc == 0, r
    assert (remote / "name with space.txt").read_bytes() == b"payload\n"


def test_push_creates_missing_parent_dirs(adb, local, remote):
    src = local / "x.bin"
    digest = write_random(src, 70_000)
    dst = remote / "a" / "b c" / "ü" / "x.bin"
    r = adb("push", str(src), str(dst))
    assert r.rc == 0, r
    assert sha256_file(dst) == digest


def test_pull_without_a_uses_local_umask_and_now(adb, remote, tmp_path):
    src = remote / "r.bin"
    digest = write_random(src, 5000)
    os.chmod(src, 0o751)
    os.utime(src, (BASE_MTIME, BASE_MTIME))
    back = tmp_path / "r.back"
    r = adb("pull", str(src), str(back))
    assert r.rc == 0, r
    assert sha256_file(back) == digest
    # Without -a adb 29 creates the file 0644 (& ~umask) and leaves mtime alone.
    assert stat.S_IMODE(back.stat().st_mode) == 0o644
    assert int(back.stat().st_mtime) != BASE_MTIME


# --- trees ----------------------------------------------------------------------

def test_push_tree(adb, local, remote):
    want = build_tree(local / "tree")
    r = adb("push", str(local / "tree"), str(remote / "tree"), timeout=120)
    assert r.rc == 0, r
    n = len(TREE_FILES) + len(TREE_LINKS)
    summary(r, n, 0)

    got = describe(remote / "tree")
    assert set(got) == set(want), (sorted(got), sorted(want))
    for rel, (kind, what, mode, mtime) in want.items():
        gk, gw, gm, gt = got[rel]
        if kind == "file":
            assert gk == "file", (rel, got[rel])
            assert gw == what, f"{rel}: content differs"
            assert gm == mode, f"{rel}: mode {oct(gm)} != {oct(mode)}"
            assert gt == mtime, f"{rel}: mtime {gt} != {mtime}"
        else:
            # adb 29 pushes a symlink found inside a directory as a symlink
            # (SEND with S_IFLNK mode, the target as data).
            assert gk == "link", f"{rel}: expected a symlink, got {got[rel]}"
            assert gw == what, f"{rel}: link target {gw!r} != {what!r}"
    # The relative link resolves inside the pushed tree.
    assert (remote / "tree" / "links" / "to_a").read_bytes() == (local / "tree" / "a.bin").read_bytes()
    # adb 29 never sends directories, only files: empty ones are not created,
    # all others are (as parents of what was sent).
    assert nonempty_dirs(remote / "tree") == nonempty_dirs(local / "tree")
    assert (remote / "tree" / UNICODE_DIR / UNICODE_FILE).is_file()


def test_push_symlink_keeps_its_own_mtime(adb, local, remote):
    # adb 29 sends the symlink's lstat mtime in DONE; adbd advertising
    # fixed_push_symlink_timestamp sets it on the link itself (lutimes).
    build_tree(local / "tree", files={"t.bin": (10, 0o644)}, links={"l": "t.bin"},
               empty_dirs=[])
    want = describe(local / "tree")["l"]
    r = adb("push", str(local / "tree"), str(remote / "tree"))
    assert r.rc == 0, r
    got = describe(remote / "tree")["l"]
    assert got[0] == "link" and got[1] == "t.bin", got
    assert got[3] == want[3], f"symlink mtime {got[3]} != {want[3]}"


def test_push_toplevel_symlink_sends_target_content(adb, local, remote):
    # A symlink given directly on the command line is stat()ed, not lstat()ed:
    # adb 29 sends the target's content as a regular file.
    target = local / "target.bin"
    digest = write_random(target, 3000)
    os.chmod(target, 0o640)
    (local / "link").symlink_to("target.bin")
    r = adb("push", str(local / "link"), str(remote / "link"))
    assert r.rc == 0, r
    st = os.lstat(remote / "link")
    assert stat.S_ISREG(st.st_mode), oct(st.st_mode)
    assert sha256_file(remote / "link") == digest
    assert stat.S_IMODE(st.st_mode) == 0o640


def test_pull_tree(adb, remote, tmp_path):
    want = build_tree(remote / "tree")
    dst = tmp_path / "pulled"
    r = adb("pull", "-a", str(remote / "tree"), str(dst), timeout=120)
    assert r.rc == 0, r
    n = len(TREE_FILES) + len(TREE_LINKS)
    summary(r, n, 0, "pulled")

    got = describe(dst)
    assert set(got) == set(want), (sorted(got), sorted(want))
    for rel, (kind, what, mode, mtime) in want.items():
        gk, gw, gm, gt = got[rel]
        if kind == "file":
            assert gk == "file", (rel, got[rel])
            assert gw == what, f"{rel}: content differs"
            assert gm == mode & ~UMASK, f"{rel}: mode {oct(gm)} != {oct(mode & ~UMASK)}"
            assert gt == mtime, f"{rel}: mtime {gt} != {mtime}"
        else:
            # adb 29 pulls a symlink as a regular file holding the target's
            # content (it stat()s the link, then RECVs through it).
            assert gk == "file", f"{rel}: expected a regular file, got {got[rel]}"
            assert gw == want["a.bin"][1], f"{rel}: content is not the link target's"
            # ...and, with -a, stamps it with mtime 0 and mode 0777 & ~umask
            # (S_IFLNK|0777 from the LIS2 entry, which must come from lstat()).
            assert (gm, gt) == (0o777 & ~UMASK, 0), f"{rel}: {oct(gm)} mtime {gt}"
    # adb 29 creates every directory it lists on pull, empty ones included.
    assert all_dirs(dst) == all_dirs(remote / "tree")


def test_pull_into_existing_dir_nests_basename(adb, remote, tmp_path):
    build_tree(remote / "t2", files={"x/y.bin": (1000, 0o644)}, links={}, empty_dirs=[])
    dst = tmp_path / "existing"
    dst.mkdir()
    r = adb("pull", str(remote / "t2"), str(dst))
    assert r.rc == 0, r
    assert (dst / "t2" / "x" / "y.bin").read_bytes() == (remote / "t2" / "x" / "y.bin").read_bytes()


# --- push --sync -------------------------------------------------------------

def test_push_sync_skips_unchanged(adb, local, remote):
    files = {"one.bin": (1000, 0o644), "d/two.bin": (200_000, 0o640), "d/e/three.bin": (0, 0o600)}
    build_tree(local / "s", files=files, links={}, empty_dirs=[])
    # The destination exists, so adb 29 pushes the directory INTO it (remote/s),
    # like cp -r; every run below therefore targets the same remote/s.
    r = adb("push", str(local / "s"), str(remote))
    assert r.rc == 0, r
    summary(r, 3, 0)
    assert (remote / "s" / "d" / "e" / "three.bin").is_file()

    r = adb("push", "--sync", str(local / "s"), str(remote))
    assert r.rc == 0, r
    summary(r, 0, 3)

    # Change one file (same size, new content and mtime): only it is pushed.
    changed = local / "s" / "d" / "two.bin"
    digest = write_random(changed, 200_000)
    os.utime(changed, (BASE_MTIME + 123_456, BASE_MTIME + 123_456))
    r = adb("push", "--sync", str(local / "s"), str(remote))
    assert r.rc == 0, r
    summary(r, 1, 2)
    assert sha256_file(remote / "s" / "d" / "two.bin") == digest
    assert int(os.stat(remote / "s" / "d" / "two.bin").st_mtime) == BASE_MTIME + 123_456
    assert not (remote / "s" / "s").exists()


def test_push_sync_single_file(adb, local, remote):
    src = local / "f"
    write_random(src, 500)
    os.utime(src, (BASE_MTIME, BASE_MTIME))
    r = adb("push", "--sync", str(src), str(remote / "f"))
    assert r.rc == 0, r
    summary(r, 1, 0)
    r = adb("push", "--sync", str(src), str(remote / "f"))
    assert r.rc == 0, r
    summary(r, 0, 1)


# --- errors -------------------------------------------------------------------

def test_push_missing_local_file(adb, local, remote):
    r = adb("push", str(local / "does-not-exist"), str(remote / "x"))
    assert r.rc != 0, r
    assert "No such file or directory" in r.both, r
    assert not (remote / "x").exists()


def test_pull_missing_remote_file(adb, remote, tmp_path):
    r = adb("pull", str(remote / "nope.bin"), str(tmp_path / "nope.bin"))
    assert r.rc != 0, r
    assert "No such file or directory" in r.both, r
    assert not (tmp_path / "nope.bin").exists()


def test_pull_missing_remote_file_inside_missing_dir(adb, remote, tmp_path):
    r = adb("pull", str(remote / "no" / "such" / "dir" / "f"), str(tmp_path / "f"))
    assert r.rc != 0, r
    assert "No such file or directory" in r.both, r


@pytest.fixture
def readonly_dir(tmp_path):
    """A read-only directory that stops root: a tmpfs mounted ro (or chattr +i)."""
    d = tmp_path / "ro"
    d.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             timeout=30)
    if mounted.returncode == 0:
        try:
            yield d, "Read-only file system"
        finally:
            u = subprocess.run(["umount", str(d)], timeout=30)
            if u.returncode != 0:
                subprocess.run(["umount", "-l", str(d)], timeout=30)
        return
    immut = subprocess.run(["chattr", "+i", str(d)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=30)
    if immut.returncode != 0:
        pytest.fail("cannot make a read-only directory: mount said "
                    f"{mounted.stdout!r}, chattr said {immut.stdout!r}")
    try:
        yield d, "Operation not permitted"
    finally:
        subprocess.run(["chattr", "-i", str(d)], timeout=30)


def test_push_into_readonly_destination(adb, local, readonly_dir):
    d, cause = readonly_dir
    src = local / "small.bin"
    write_random(src, 1000)
    r = adb("push", str(src), str(d / "small.bin"))
    assert r.rc != 0, r
    assert cause in r.both, r
    assert not (d / "small.bin").exists()
    # The sync session failed, not the connection: the device still works.
    r = adb("shell", "echo still here")
    assert r.stdout == b"still here\n", r


def test_push_large_into_readonly_destination(adb, local, readonly_dir):
    d, cause = readonly_dir
    src = local / "large.bin"
    write_random(src, 4 << 20)
    r = adb("push", str(src), str(d / "large.bin"), timeout=60)
    assert r.rc != 0, r
    assert cause in r.both, r
    r = adb("shell", "echo still here")
    assert r.stdout == b"still here\n", r


def test_ls_lists_modes_sizes_mtimes(adb, remote):
    build_tree(remote / "t", files={"a.bin": (1234, 0o640), "b c ü": (0, 0o751)},
               links={"l": "a.bin"}, empty_dirs=["d"])
    r = adb("ls", str(remote / "t"))
    assert r.rc == 0, r
    rows = {}
    for line in r.out.splitlines():
        mode, size, mtime, name = line.split(" ", 3)
        rows[name] = (int(mode, 16), int(size, 16), int(mtime, 16))
    # (AOSP adbd also lists "." and ".."; adb itself ignores them.)
    assert set(rows) - {".", ".."} == {"a.bin", "b c ü", "l", "d"}, rows
    a = os.stat(remote / "t" / "a.bin")
    assert rows["a.bin"] == (a.st_mode, 1234, int(a.st_mtime)), rows["a.bin"]
    assert rows["b c ü"][0] == stat.S_IFREG | 0o751
    assert stat.S_ISLNK(rows["l"][0]), oct(rows["l"][0])  # lstat, not stat
    assert stat.S_ISDIR(rows["d"][0])
