"""The static board builds (scripts/release.sh) on foreign CPUs, under
Debian's qemu-user-static: the aarch64 and armv7 daemons serve Google adb 29
on loopback, and the aarch64 oxadb drives the native daemon. The minimal
aarch64 daemon (`VARIANTS=minimal`: no TLS, pairing or mDNS) serves adb 29
too, and refuses what it was built without, naming the cargo feature.

The binaries come from target/static/TARGET/ (OXADB_STATIC_DIR overrides);
scripts/test.sh builds them first. A missing binary or qemu is a failure.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import _drop_daemon, _new_daemon
from echo import EchoServer
from harness import REPO, AdbServer, clean_env, free_port, sha256_file, write_random

STATIC_DIR = Path(os.environ.get("OXADB_STATIC_DIR", REPO / "target" / "static"))
# (target triple, qemu binary, ELF e_machine)
ARCHES = {
    "aarch64": ("aarch64-unknown-linux-musl", "qemu-aarch64-static", 0xB7),
    "armv7": ("armv7-unknown-linux-musleabihf", "qemu-arm-static", 0x28),
}
SIZE = 16 << 20


def static_file(arch: str, name: str) -> Path:
    """target/static/TARGET/NAME, checked to be a static executable for `arch`."""
    target, _, machine = ARCHES[arch]
    exe = STATIC_DIR / target / name
    if not exe.exists():
        variants = ' VARIANTS="default minimal"' if name.endswith("-minimal") else ""
        pytest.fail(f"{exe} is missing: build it with `{variants.strip()}"
                    f"{' ' if variants else ''}scripts/release.sh {target}`")
    header = exe.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", f"{exe} is not an ELF file"
    assert int.from_bytes(header[18:20], "little") == machine, f"{exe} is not an {arch} binary"
    check = subprocess.run(["python3", str(REPO / "scripts" / "elf-static.py"), str(exe)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert check.returncode == 0, check.stdout.decode()
    return exe


def static_binary(arch: str, name: str) -> tuple[Path, str]:
    """A static executable for `arch` and the qemu-user binary that runs it."""
    exe = static_file(arch, name)
    qemu = ARCHES[arch][1]
    qemu_path = shutil.which(qemu)
    if qemu_path is None:
        pytest.fail(f"{qemu} is missing: install Debian's qemu-user-static")
    return exe, qemu_path


@pytest.fixture(params=sorted(ARCHES))
def foreign_daemon(request, tmp_path, adb_server):
    exe, qemu = static_binary(request.param, "oxadbd")
    d = _new_daemon(exe, tmp_path / "daemon", prefix=(qemu,),
                    args=("--keys", str(tmp_path / "adb_keys")))
    try:
        adb_server.connect(d.serial, timeout=60)
        yield d
    finally:
        adb_server.disconnect(d.serial)
        _drop_daemon(d)


def test_adb29_against_the_static_daemon(foreign_daemon, adb_server, tmp_path):
    serial = foreign_daemon.serial
    r = adb_server.run("shell", "echo static; exit 3", serial=serial, timeout=60)
    assert r.rc == 3, r
    assert r.out.strip() == "static", r

    source = tmp_path / "random.bin"
    digest = write_random(source, SIZE)
    pushed = tmp_path / "pushed.bin"
    r = adb_server.run("push", str(source), str(pushed), serial=serial, timeout=120)
    assert r.rc == 0, r
    assert sha256_file(pushed) == digest

    pulled = tmp_path / "pulled.bin"
    r = adb_server.run("pull", str(pushed), str(pulled), serial=serial, timeout=120)
    assert r.rc == 0, r
    assert sha256_file(pulled) == digest

    echo = EchoServer.tcp()
    try:
        local = free_port()
        r = adb_server.run("forward", f"tcp:{local}", f"tcp:{echo.address[1]}",
                           serial=serial, timeout=60)
        assert r.rc == 0, r
        payload = os.urandom(256 * 1024)
        with socket.create_connection(("127.0.0.1", local), timeout=30) as s:
            # No half-close: ADB streams have none, so read the echo back whole.
            s.sendall(payload)
            got = bytearray()
            while len(got) < len(payload):
                chunk = s.recv(65536)
                assert chunk, f"forward closed after {len(got)} of {len(payload)} echoed bytes"
                got += chunk
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(payload).hexdigest()
    finally:
        adb_server.run("forward", "--remove-all", serial=serial, timeout=30)
        echo.close()


def test_static_aarch64_oxadb_against_the_native_daemon(daemon, tmp_path):
    exe, qemu = static_binary("aarch64", "oxadb")
    home = tmp_path / "home"
    (home / ".android").mkdir(parents=True)
    env = clean_env(HOME=str(home))

    def oxadb(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([qemu, str(exe), "-s", daemon.serial, *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              timeout=120)

    r = oxadb("shell", "echo from-aarch64; exit 4")
    assert r.returncode == 4, r
    assert r.stdout.decode().strip() == "from-aarch64", r

    source = tmp_path / "random.bin"
    digest = write_random(source, SIZE)
    pushed = tmp_path / "pushed.bin"
    r = oxadb("push", str(source), str(pushed))
    assert r.returncode == 0, r
    assert sha256_file(pushed) == digest
    pulled = tmp_path / "pulled.bin"
    r = oxadb("pull", str(pushed), str(pulled))
    assert r.returncode == 0, r
    assert sha256_file(pulled) == digest


def test_minimal_aarch64_daemon_serves_and_names_what_it_lacks(adb_server, tmp_path):
    exe, qemu = static_binary("aarch64", "oxadbd-minimal")
    env = clean_env()
    # Each flag of a feature left out is an error naming the feature, never ignored.
    for args, feature in [(("--tls", "on"), "tls"), (("--tls-key", str(tmp_path / "k")), "tls"),
                          (("pair",), "pairing")]:
        r = subprocess.run([qemu, str(exe), "--listen", "127.0.0.1:0", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=60)
        err = r.stderr.decode()
        assert r.returncode != 0, (args, err)
        assert "built without" in err and f"(cargo feature `{feature}`)" in err, (args, err)
    config = tmp_path / "mdns.toml"
    config.write_text("mdns = true\n")
    r = subprocess.run([qemu, str(exe), "--config", str(config)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=60)
    assert r.returncode != 0 and "(cargo feature `mdns`)" in r.stderr.decode(), r

    d = _new_daemon(exe, tmp_path / "daemon", prefix=(qemu,),
                    args=("--keys", str(tmp_path / "adb_keys")))
    try:
        adb_server.connect(d.serial, timeout=60)
        r = adb_server.run("shell", "echo minimal; exit 5", serial=d.serial, timeout=60)
        assert r.rc == 5, r
        assert r.out.strip() == "minimal", r
    finally:
        adb_server.disconnect(d.serial)
        _drop_daemon(d)
