"""adb-shell (PyPI, pure Python, pinned in tests/requirements.txt) against oxadbd.

adb-shell is an independent host implementation with its own quirks, unlike
adb 29 and Tango:
  * its CNXN is the old protocol version 0x01000000 with the banner
    `host::<hostname>\\0` and no features at all, so the daemon must fall back
    to classic flow control, plain `shell:` (no shell protocol v2, hence no
    exit status in its API) and sync v1 (SEND/RECV/STAT/LIST);
  * it verifies the data checksum of every packet it receives, so the daemon
    must send real checksums to a 0x01000000 host;
  * it is configured with an RSA key made by its own `keygen`. oxadbd does
    not ask for authentication yet, so the key is offered but never used: the
    tests assert the connection works with a key configured.
Each test runs its own daemon (`fresh_daemon`, RUST_LOG=debug).
"""

from __future__ import annotations

import os
import stat
import time

import pytest

from harness import sha256_file, write_random

# A missing adb-shell fails the collection of this module (never a skip).
try:
    import adb_shell
    from adb_shell.adb_device import AdbDeviceTcp
    from adb_shell.auth.keygen import keygen
    from adb_shell.auth.sign_pythonrsa import PythonRSASigner
except ImportError as e:
    raise ImportError(
        f"adb-shell is not installed ({e}); run `python3 -m pip install -r "
        f"tests/requirements.txt` (./scripts/test.sh does)") from e

ADB_SHELL_VERSION = "0.4.4"
MIB = 1 << 20
# adb-shell's own timeouts, in seconds (every call gets them).
TRANSPORT_TIMEOUT = 10.0
READ_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def signer(tmp_path_factory) -> PythonRSASigner:
    assert adb_shell.__version__ == ADB_SHELL_VERSION, (
        f"adb-shell {adb_shell.__version__} is installed, tests/requirements.txt pins "
        f"{ADB_SHELL_VERSION}")
    keydir = tmp_path_factory.mktemp("adbshell-key")
    path = keydir / "adbkey"
    keygen(str(path))
    assert path.exists() and (keydir / "adbkey.pub").exists()
    pub = (keydir / "adbkey.pub").read_text()
    assert len(pub.split()[0]) > 500, pub  # base64 of the 524-byte Android RSA key
    return PythonRSASigner.FromRSAKeyPath(str(path))


@pytest.fixture
def device(fresh_daemon, signer):
    """A fresh daemon and an adb-shell connection to it (with an RSA key)."""
    d = fresh_daemon()
    dev = AdbDeviceTcp("127.0.0.1", d.port, default_transport_timeout_s=TRANSPORT_TIMEOUT)
    try:
        assert dev.connect(rsa_keys=[signer], auth_timeout_s=10.0,
                           read_timeout_s=READ_TIMEOUT) is True
        assert dev.available
        yield d, dev
    finally:
        dev.close()


def closed_stream_lines(d, want: int, timeout: float = 10.0) -> list[str]:
    def lines():
        return [line for line in d.log_since(0).decode("utf-8", "replace").splitlines()
                if "stream closed" in line]
    deadline = time.monotonic() + timeout
    got = lines()
    while len(got) < want and time.monotonic() < deadline:
        time.sleep(0.05)
        got = lines()
    assert len(got) >= want, f"expected {want} `stream closed` lines in {d.log_path}: {got}"
    return got


def test_connect_with_key_classic_host(device):
    d, dev = device
    line = d.wait_for_log(lambda l: "host connected" in l, timeout=5)
    assert line is not None, f"no `host connected` line in {d.log_path}"
    # adb-shell offers no features: no delayed_ack, no shell_v2.
    assert "delayed_ack=false" in line, line
    assert dev.shell("echo hi", read_timeout_s=READ_TIMEOUT) == "hi\n"
    lines = closed_stream_lines(d, 1)
    assert all("delayed_ack=false" in l for l in lines), lines


def test_shell_output_and_exit_status(device):
    d, dev = device
    # Plain `shell:` merges stderr into stdout and has no exit status; the shell reports it.
    out = dev.shell("echo out; echo err >&2; (exit 42); echo rc=$?", read_timeout_s=READ_TIMEOUT)
    assert out == "out\nerr\nrc=42\n", repr(out)
    out = dev.shell("sh -c 'exit 3'; echo rc=$?", read_timeout_s=READ_TIMEOUT)
    assert out == "rc=3\n", repr(out)
    raw = dev.shell("printf 'a\\0b\\377'", decode=False, read_timeout_s=READ_TIMEOUT)
    assert raw == b"a\0b\xff", raw
    # Several WRTEs under classic flow control, each checksummed.
    big = dev.exec_out("head -c 3000000 /dev/zero | tr '\\0' x", decode=False,
                       read_timeout_s=READ_TIMEOUT)
    assert big == b"x" * 3000000, (len(big), big[:64])
    # Output of streaming_shell arrives as it is produced.
    chunks = list(dev.streaming_shell("for i in 1 2 3; do echo line$i; done",
                                      read_timeout_s=READ_TIMEOUT))
    assert "".join(chunks) == "line1\nline2\nline3\n", chunks


def test_push_pull_random_file(device, tmp_path):
    d, dev = device
    size = 6 * MIB + 12345
    src = tmp_path / "src.bin"
    digest = write_random(src, size)
    remote = tmp_path / "remote" / "pushed.bin"
    remote.parent.mkdir()
    mtime = 1300000000
    dev.push(str(src), str(remote), st_mode=stat.S_IFREG | 0o640, mtime=mtime,
             transport_timeout_s=TRANSPORT_TIMEOUT, read_timeout_s=READ_TIMEOUT)
    assert sha256_file(remote) == digest, "the daemon-side file differs from what adb-shell sent"
    st = os.stat(remote)
    assert (st.st_size, st.st_mode & 0o7777, int(st.st_mtime)) == (size, 0o640, mtime), st
    assert dev.stat(str(remote), read_timeout_s=READ_TIMEOUT) == (stat.S_IFREG | 0o640, size, mtime)

    pulled = tmp_path / "pulled.bin"
    dev.pull(str(remote), str(pulled), transport_timeout_s=TRANSPORT_TIMEOUT,
             read_timeout_s=READ_TIMEOUT)
    assert sha256_file(pulled) == digest, "the pulled file differs from the daemon-side file"
    lines = closed_stream_lines(d, 3)
    assert all("delayed_ack=false" in l for l in lines), lines


def test_non_ascii_file_name(device, tmp_path):
    d, dev = device
    src = tmp_path / "src.bin"
    digest = write_random(src, 2 * MIB + 7)
    rdir = tmp_path / "remote"
    rdir.mkdir()
    name = "données-файл-文件 ✓.bin"
    remote = rdir / name
    dev.push(str(src), str(remote), transport_timeout_s=TRANSPORT_TIMEOUT,
             read_timeout_s=READ_TIMEOUT)
    assert os.listdir(rdir) == [name], os.listdir(rdir)
    assert sha256_file(remote) == digest
    mode, size, _mtime = dev.stat(str(remote), read_timeout_s=READ_TIMEOUT)
    assert stat.S_ISREG(mode) and size == 2 * MIB + 7, (mode, size)
    entries = {bytes(f.filename).decode("utf-8"): f
               for f in dev.list(str(rdir), read_timeout_s=READ_TIMEOUT)}
    assert set(entries) == {".", "..", name}, entries
    assert entries[name].size == 2 * MIB + 7, entries[name]
    back = tmp_path / "back ✓.bin"
    dev.pull(str(remote), str(back), transport_timeout_s=TRANSPORT_TIMEOUT,
             read_timeout_s=READ_TIMEOUT)
    assert sha256_file(back) == digest
    assert dev.shell(f"cat '{remote}' | wc -c", read_timeout_s=READ_TIMEOUT).strip() == \
        str(2 * MIB + 7)


def test_missing_remote_file(device, tmp_path):
    d, dev = device
    missing = tmp_path / "no-such-file"
    assert dev.stat(str(missing), read_timeout_s=READ_TIMEOUT) == (0, 0, 0)
    with pytest.raises(Exception) as e:
        dev.pull(str(missing), str(tmp_path / "out.bin"), transport_timeout_s=TRANSPORT_TIMEOUT,
                 read_timeout_s=READ_TIMEOUT)
    # The daemon's FAIL reason travels to adb-shell's exception, and the
    # connection stays usable afterwards.
    assert "No such file" in str(e.value) or "ENOENT" in str(e.value), repr(e.value)
    assert dev.shell("echo still-here", read_timeout_s=READ_TIMEOUT) == "still-here\n"
