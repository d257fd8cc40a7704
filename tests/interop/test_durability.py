"""Durable pushes: adb 29 pushes under each `--durability` level, with the
daemon run under strace to see the order of its fsync and rename calls.

full   : fsync(temp file) < rename(temp -> destination) < fsync(directory)
rename : fsync(temp file) < rename, no directory fsync
none   : no fsync at all (adbd's behaviour)
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

# `fsync(7</dir/.oxadb-push.1.0>) = 0` and `rename("/dir/.oxadb-push.1.0", "/dir/f") = 0`
# (strace -y names the descriptors' paths).
FSYNC = re.compile(r'fsync\(\d+<([^>]*)>\)\s+= 0')
RENAME = re.compile(r'rename(?:at2?)?\((?:[^,]+, )?"([^"]*)", (?:[^,]+, )?"([^"]*)"')


def strace_bin() -> str:
    exe = shutil.which("strace")
    if exe is None:
        pytest.fail("strace not on PATH (scripts/test.sh installs Debian's strace package)")
    return exe


def traced_push(fresh_daemon, adb_server, tmp_path: Path, level: str | None):
    """Pushes one file under `level` (None: the default) into a fresh
    directory; returns (destination, the trace's fsync/rename events)."""
    trace = tmp_path / f"strace-{level}.txt"
    args = ("--durability", level) if level else ()
    d = fresh_daemon(f"durable-{level}", args=args,
                     prefix=(strace_bin(), "-f", "-y", "-qq", "-o", str(trace),
                             "-e", "trace=fsync,fdatasync,rename,renameat,renameat2"))
    adb_server.connect(d.serial)
    src = tmp_path / f"src-{level}"
    src.write_bytes(os.urandom(300_000))
    dest_dir = tmp_path / f"dest-{level}"
    dest_dir.mkdir()
    dest = dest_dir / "pushed.bin"
    dest.write_bytes(b"old")
    r = adb_server.run("push", str(src), str(dest), serial=d.serial)
    assert r.rc == 0, r
    assert dest.read_bytes() == src.read_bytes()
    adb_server.disconnect(d.serial)
    d.stop()  # strace writes out its trace as it ends
    events = []
    for line in trace.read_text().splitlines():
        if m := FSYNC.search(line):
            events.append(("fsync", m.group(1)))
        elif m := RENAME.search(line):
            events.append(("rename", m.group(1), m.group(2)))
    return dest, [e for e in events if str(dest_dir) in e[-1]]


def check_full(dest: Path, events, prefix: str = ".oxadb-push."):
    renames = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == str(dest)]
    assert len(renames) == 1, events
    at = renames[0]
    temp = events[at][1]
    assert Path(temp).name.startswith(prefix), events
    assert ("fsync", temp) in events[:at], f"no fsync of {temp} before the rename: {events}"
    assert ("fsync", str(dest.parent)) in events[at + 1:], \
        f"no fsync of {dest.parent} after the rename: {events}"
    return at


@pytest.mark.parametrize("level", [None, "full"])
def test_full_syncs_file_then_renames_then_syncs_directory(fresh_daemon, adb_server, tmp_path,
                                                           level):
    dest, events = traced_push(fresh_daemon, adb_server, tmp_path, level)
    check_full(dest, events)


def test_rename_syncs_the_file_only(fresh_daemon, adb_server, tmp_path):
    dest, events = traced_push(fresh_daemon, adb_server, tmp_path, "rename")
    renames = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == str(dest)]
    assert len(renames) == 1, events
    temp = events[renames[0]][1]
    assert ("fsync", temp) in events[:renames[0]], events
    assert ("fsync", str(dest.parent)) not in events, events


def test_none_syncs_nothing(fresh_daemon, adb_server, tmp_path):
    dest, events = traced_push(fresh_daemon, adb_server, tmp_path, "none")
    assert [e[0] for e in events] == ["rename"], events


def test_new_directories_are_synced_into_their_parents(fresh_daemon, adb_server, tmp_path):
    """A push that makes missing parents (fixed_push_mkdir) flushes each new entry."""
    trace = tmp_path / "strace-mkdir.txt"
    d = fresh_daemon("durable-mkdir",
                     prefix=(strace_bin(), "-f", "-y", "-qq", "-o", str(trace),
                             "-e", "trace=fsync,rename"))
    adb_server.connect(d.serial)
    src = tmp_path / "src"
    src.write_bytes(b"x" * 1000)
    root = tmp_path / "tree"
    root.mkdir()
    dest = root / "a" / "b" / "f"
    r = adb_server.run("push", str(src), str(dest), serial=d.serial)
    assert r.rc == 0, r
    adb_server.disconnect(d.serial)
    d.stop()
    synced = [m.group(1) for m in map(FSYNC.search, trace.read_text().splitlines()) if m]
    for directory in (root / "a" / "b", root / "a", root):
        assert str(directory) in synced, synced


def test_bad_durability_is_refused_naming_the_value(oxadbd_bin, tmp_path):
    import subprocess
    cp = subprocess.run([str(oxadbd_bin), "--durability", "sometimes", "--listen",
                         "127.0.0.1:1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        timeout=30)
    out = cp.stdout.decode()
    assert cp.returncode != 0 and "sometimes" in out and "full, rename or none" in out, out
    conf = tmp_path / "oxadbd.toml"
    conf.write_text('durability = "maybe"\n')
    cp = subprocess.run([str(oxadbd_bin), "--config", str(conf), "--listen", "127.0.0.1:1"],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    out = cp.stdout.decode()
    assert cp.returncode != 0 and "maybe" in out and str(conf) in out, out


def traced_pull(daemon, tmp_path: Path, level: str, remote: Path, local: Path):
    """`oxadb --durability LEVEL pull REMOTE LOCAL` under strace; returns the
    fsync/rename events."""
    import subprocess
    from harness import clean_env, resolve_oxadb
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    trace = tmp_path / f"pull-strace-{level}.txt"
    cp = subprocess.run([strace_bin(), "-f", "-y", "-qq", "-o", str(trace),
                         "-e", "trace=fsync,fdatasync,rename,renameat,renameat2",
                         str(resolve_oxadb()), "--durability", level, "-s", daemon.serial,
                         "pull", str(remote), str(local)],
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        env=clean_env(HOME=str(home)), timeout=60, text=True)
    assert cp.returncode == 0, cp
    events = []
    for line in trace.read_text().splitlines():
        if m := FSYNC.search(line):
            events.append(("fsync", m.group(1)))
        elif m := RENAME.search(line):
            events.append(("rename", m.group(1), m.group(2)))
    return events


@pytest.mark.parametrize("level", ["full", "none"])
def test_oxadb_pull_is_durable_on_the_host(fresh_daemon, tmp_path, level):
    d = fresh_daemon(f"pull-{level}")
    remote = tmp_path / "remote.bin"
    remote.write_bytes(os.urandom(200_000))
    local_dir = tmp_path / f"local-{level}"
    local_dir.mkdir()
    local = local_dir / "pulled.bin"
    events = traced_pull(d, tmp_path, level, remote, local)
    assert local.read_bytes() == remote.read_bytes()
    events = [e for e in events if str(local_dir) in e[-1]]
    if level == "none":
        assert [e[0] for e in events] == ["rename"], events
        return
    at = check_full(local, events, ".oxadb-pull.")
    assert Path(events[at][1]).name.startswith(".oxadb-pull."), events


def test_oxadb_pull_of_a_tree_syncs_the_directories_it_made(fresh_daemon, tmp_path):
    d = fresh_daemon("pull-tree")
    remote = tmp_path / "remote-tree"
    (remote / "sub").mkdir(parents=True)
    (remote / "sub" / "f").write_bytes(b"f" * 1000)
    local_root = tmp_path / "local-root"
    local_root.mkdir()
    events = traced_pull(d, tmp_path, "full", remote, local_root / "copy")
    synced = [e[1] for e in events if e[0] == "fsync"]
    for directory in (local_root / "copy" / "sub", local_root / "copy", local_root):
        assert str(directory) in synced, events
