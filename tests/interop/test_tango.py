"""Tango (@yume-chan/adb 2.6.4, an independent TypeScript ADB host) against oxadbd.

Unlike adb 29, Tango negotiates `delayed_ack` (burst mode): its OPEN carries a
32 MiB window in arg1 and every OKAY a 4-byte byte count. The client is
`tango/tango_client.mjs` (see its header), installed by ./scripts/test.sh with
`npm ci` from the pinned package-lock.json; each call is one fresh ADB
connection and prints one JSON document.

Each test runs its own daemon (`fresh_daemon`, RUST_LOG=debug), whose log has
one `stream closed` line per stream with `delayed_ack=..`, `okays_sent=..`,
`bytes_received=..`: the delayed_ack checks read the daemon's own account of
each transfer, and compare it with what Tango saw on the wire.

Compression (SND2/RCV2 with brotli/lz4/zstd) is not covered here: no published
Tango version implements it (2.6.4 sends SND2 with flags 0 or DryRun only and
pulls with RECV v1). Google's adb 34 checks it instead (test_adb34.py).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import closed_streams, sha256_file, write_random

TANGO_DIR = Path(__file__).resolve().parent / "tango"
CLIENT = TANGO_DIR / "tango_client.mjs"
TANGO_VERSION = "2.6.4"
MIB = 1 << 20
BIG = 64 * MIB
DELAYED_ACK_WINDOW = 32 * MIB  # what Tango (like AOSP's adb) grants in OPEN.arg1

# --- the client ---------------------------------------------------------------------

@pytest.fixture(scope="session")
def node() -> str:
    node = shutil.which("node")
    if not node:
        pytest.fail("`node` is not installed; ./scripts/test.sh installs Debian's nodejs and npm "
                    "and runs `npm ci` in tests/interop/tango")
    out = subprocess.run([node, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=30).stdout.decode().strip()
    major = int(out.lstrip("v").split(".")[0])
    if major < 18:
        pytest.fail(f"Tango needs Node.js >= 18, `node --version` says {out}")
    pkg = TANGO_DIR / "node_modules" / "@yume-chan" / "adb" / "package.json"
    if not pkg.exists():
        pytest.fail(f"{pkg} is missing: run `npm ci --no-audit --no-fund` in {TANGO_DIR} "
                    f"(./scripts/test.sh does)")
    version = json.loads(pkg.read_text())["version"]
    if version != TANGO_VERSION:
        pytest.fail(f"@yume-chan/adb {version} is installed in {TANGO_DIR}/node_modules, "
                    f"the tests pin {TANGO_VERSION}: run `npm ci` there")
    return node


def tango(node: str, port: int, *commands: list[str], host_delayed_ack: bool = True,
          parallel: bool = False, timeout: float = 90.0) -> dict:
    """Run tango_client.mjs with `commands` over one connection; return its JSON."""
    argv = [node, str(CLIENT), "--port", str(port), "--timeout", str(int(timeout) - 5)]
    if not host_delayed_ack:
        argv.append("--no-delayed-ack")
    if parallel:
        argv.append("--parallel")
    for i, cmd in enumerate(commands):
        if i:
            argv.append("--")
        argv += cmd
    try:
        cp = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, timeout=timeout, cwd=str(TANGO_DIR))
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"tango_client did not finish within {timeout}s: "
                             f"stdout={e.stdout!r:.3000} stderr={e.stderr!r:.3000}") from None
    text = cp.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        out = json.loads(text[-1])
    except (IndexError, json.JSONDecodeError):
        raise AssertionError(f"tango_client printed no JSON (exit {cp.returncode}): "
                             f"stdout={cp.stdout!r:.3000} stderr={cp.stderr!r:.3000}") from None
    assert cp.returncode == 0 and out.get("ok"), (
        f"tango_client failed (exit {cp.returncode}): {out.get('error')}\n"
        f"stderr={cp.stderr!r:.3000}\nconnection={out.get('connection')}")
    return out


def b64(s: str) -> bytes:
    return base64.b64decode(s)


def results(out: dict) -> list[dict]:
    return out["results"]


# --- tests ----------------------------------------------------------------------------

def test_connect_negotiates_delayed_ack(node, fresh_daemon):
    d = fresh_daemon()
    out = tango(node, d.port, ["features"], ["shell", "echo hi"])
    feats, shell = results(out)
    for f in ("shell_v2", "stat_v2", "ls_v2", "sendrecv_v2", "delayed_ack"):
        assert f in feats["device_features"], feats
    assert feats["delayed_ack"] is True and feats["can_use"]["delayed_ack"] is True, feats
    assert feats["max_payload"] == MIB, feats
    # The key is offered, never asked for: oxadbd does not require auth yet.
    assert out["credentials"]["keys_generated"] == 1, out["credentials"]
    conn = out["connection"]
    assert conn["cnxnReceived"].startswith("device::"), conn
    # Tango opened the stream with a delayed-ack window, and every OKAY the
    # daemon sent carried the 4-byte count delayed_ack requires.
    assert conn["openArg1"] == [DELAYED_ACK_WINDOW], conn
    assert set(conn["okayPayloadSizesReceived"]) == {"4"}, conn
    assert b64(shell["stdout_b64"]) == b"hi\n" and shell["exit_code"] == 0, shell
    line, = closed_streams(d)  # this daemon's only stream
    assert line["delayed_ack"] == "true", line


def test_shell_v2_exit_code_and_stderr(node, fresh_daemon):
    d = fresh_daemon()
    data = bytes(range(256)) * 64 + b"\0tail\n"
    out = tango(node, d.port,
                ["shell", "echo out; echo err >&2; exit 42"],
                ["shell", "printf 'a\\0b'; printf 'c\\0d' >&2; exit 7"],
                ["shell", "cat", "--stdin-b64", base64.b64encode(data).decode()],
                ["shell", "wc -c", "--stdin-b64", ""])
    r42, rnul, rcat, rwc = results(out)
    assert (b64(r42["stdout_b64"]), b64(r42["stderr_b64"]), r42["exit_code"]) == \
        (b"out\n", b"err\n", 42), r42
    assert (b64(rnul["stdout_b64"]), b64(rnul["stderr_b64"]), rnul["exit_code"]) == \
        (b"a\0b", b"c\0d", 7), rnul
    # stdin travels as shell-v2 frames and its close ends `cat`.
    assert b64(rcat["stdout_b64"]) == data and rcat["exit_code"] == 0, rcat
    assert b64(rwc["stdout_b64"]).strip() == b"0" and rwc["exit_code"] == 0, rwc
    lines = closed_streams(d, want=4)  # this daemon's four streams
    assert len(lines) == 4 and all(line["delayed_ack"] == "true" for line in lines), lines


def test_pty_with_term_and_window_size(node, fresh_daemon):
    """`shell,v2,pty,TERM=..:`: a pty, the TERM, the window-size frame, stdin, exit code."""
    d = fresh_daemon()
    out = tango(node, d.port,
                ["pty", 'read x; tty; echo "TERM=$TERM"; stty size; exit 3',
                 "--term", "xterm-256color", "--resize", "40x100",
                 "--input-b64", base64.b64encode(b"go\n").decode()])
    r, = results(out)
    text = b64(r["output_b64"]).decode("utf-8", "replace")
    lines = text.replace("\r\n", "\n").splitlines()
    assert lines[0] == "go", lines  # the pty echoes the input
    assert lines[1].startswith("/dev/pts/"), lines
    assert lines[2:] == ["TERM=xterm-256color", "40 100"], lines
    assert r["exit_code"] == 3, r


def _check_push(d, out, remote: Path, digest: str, delayed_ack: bool) -> dict[str, str]:
    push, = results(out)
    assert push["bytes"] == BIG and push["sha256"] == digest, push
    assert push["send_v2"] is True, push  # oxadbd offers sendrecv_v2: Tango sends SND2
    if delayed_ack:
        # The daemon's first OKAY grants Tango a window, as AOSP's adbd does.
        assert out["connection"]["deviceInitialCredit"][0] > 0, out["connection"]
    assert remote.exists(), f"{remote} was not created"
    assert remote.stat().st_size == BIG
    assert sha256_file(remote) == digest, "the daemon-side file differs from what Tango sent"
    line, = closed_streams(d, out["local_port"], service="sync:")
    assert line["delayed_ack"] == str(delayed_ack).lower(), line
    assert int(line["bytes_received"]) >= BIG, line
    return line


def _check_pull(d, out, local: Path, digest: str, delayed_ack: bool) -> dict[str, str]:
    pull, = results(out)
    assert pull["bytes"] == BIG and pull["sha256"] == digest, pull
    assert sha256_file(local) == digest, "the pulled file differs from the daemon-side file"
    line, = closed_streams(d, out["local_port"], service="sync:")
    assert line["delayed_ack"] == str(delayed_ack).lower(), line
    assert int(line["bytes_sent"]) >= BIG, line
    return line


def _check_wire(out: dict, delayed_ack: bool) -> None:
    conn = out["connection"]
    if delayed_ack:
        assert conn["openArg1"] == [DELAYED_ACK_WINDOW], conn
        assert set(conn["okayPayloadSizesReceived"]) == {"4"}, conn
        assert set(conn["okayPayloadSizesSent"]) == {"4"}, conn
    else:
        assert conn["openArg1"] == [0], conn
        assert set(conn["okayPayloadSizesReceived"]) == {"0"}, conn
        assert set(conn["okayPayloadSizesSent"]) == {"0"}, conn
        # Classic flow control: never a second WRTE before the OKAY.
        assert conn["maxWrtesInFlight"] <= 1, conn


def test_push_64mib_with_delayed_ack(node, fresh_daemon, tmp_path):
    d = fresh_daemon()
    src = tmp_path / "src.bin"
    digest = write_random(src, BIG)
    remote = tmp_path / "remote" / "pushed.bin"
    remote.parent.mkdir()
    out = tango(node, d.port, ["push", str(src), str(remote)])
    _check_push(d, out, remote, digest, delayed_ack=True)
    _check_wire(out, delayed_ack=True)


def test_pull_64mib_with_delayed_ack(node, fresh_daemon, tmp_path):
    d = fresh_daemon()
    remote = tmp_path / "remote.bin"
    digest = write_random(remote, BIG)
    local = tmp_path / "pulled.bin"
    out = tango(node, d.port, ["pull", str(remote), str(local)])
    _check_pull(d, out, local, digest, delayed_ack=True)
    _check_wire(out, delayed_ack=True)


def test_small_budget_packets_with_delayed_ack(node, fresh_daemon, tmp_path):
    """A 16 MiB budget offers 64 KiB payloads (docs/flow-control.md, "Memory
    budget"): Tango keeps to them pushing, and the daemon pulling."""
    d = fresh_daemon("small", args=("--memory-budget", "16M"))
    size = 16 * MIB
    src = tmp_path / "src.bin"
    digest = write_random(src, size)
    remote = tmp_path / "remote.bin"
    back = tmp_path / "back.bin"
    out = tango(node, d.port, ["features"], ["push", str(src), str(remote)],
                ["pull", str(remote), str(back)])
    feats, push, pull = results(out)
    assert feats["max_payload"] == 64 << 10 and feats["delayed_ack"] is True, feats
    assert push["sha256"] == digest and sha256_file(remote) == digest, push
    assert pull["sha256"] == digest and sha256_file(back) == digest, pull
    conn = out["connection"]
    assert 0 < conn["maxWrtePayloadSent"] <= 64 << 10, conn
    assert 0 < conn["maxWrtePayloadReceived"] <= 64 << 10, conn
    assert conn["openArg1"] == [DELAYED_ACK_WINDOW] * 2, conn
    assert set(conn["okayPayloadSizesReceived"]) == {"4"}, conn


def test_no_delayed_ack_daemon_runs_the_same_transfers_classic(node, fresh_daemon, tmp_path):
    """Control: `--no-delayed-ack` hides the feature; the same transfers log delayed_ack=false."""
    d = fresh_daemon("classic", args=("--no-delayed-ack",))
    src = tmp_path / "src.bin"
    digest = write_random(src, BIG)
    remote = tmp_path / "remote.bin"

    out = tango(node, d.port, ["features"])
    feats, = results(out)
    assert "delayed_ack" not in feats["device_features"], feats
    assert feats["delayed_ack"] is False, feats

    out = tango(node, d.port, ["push", str(src), str(remote)])
    _check_push(d, out, remote, digest, delayed_ack=False)
    _check_wire(out, delayed_ack=False)

    local = tmp_path / "pulled.bin"
    out = tango(node, d.port, ["pull", str(remote), str(local)])
    line = _check_pull(d, out, local, digest, delayed_ack=False)
    _check_wire(out, delayed_ack=False)
    # Classic: the host acknowledges every WRTE with its own OKAY.
    assert int(line["okays_received"]) >= int(line["packets_sent"]), line


def test_host_without_delayed_ack_gets_classic_streams(node, fresh_daemon, tmp_path):
    """The daemon offers delayed_ack but must not use it when the host does not."""
    d = fresh_daemon()
    remote = tmp_path / "remote.bin"
    digest = write_random(remote, 4 * MIB)
    local = tmp_path / "pulled.bin"
    out = tango(node, d.port, ["features"], ["pull", str(remote), str(local)],
                host_delayed_ack=False)
    feats, pull = results(out)
    assert "delayed_ack" in feats["device_features"] and feats["delayed_ack"] is False, feats
    assert pull["sha256"] == digest and sha256_file(local) == digest, pull
    assert out["connection"]["openArg1"] == [0], out["connection"]
    assert set(out["connection"]["okayPayloadSizesReceived"]) == {"0"}, out["connection"]
    line, = closed_streams(d, out["local_port"], service="sync:")
    assert line["delayed_ack"] == "false", line


def test_stat_list_and_non_ascii_names(node, fresh_daemon, tmp_path):
    d = fresh_daemon()
    src = tmp_path / "src.bin"
    digest = write_random(src, 3 * MIB + 17)
    rdir = tmp_path / "remote"
    rdir.mkdir()
    remote = rdir / "grüße-文件 ñ.bin"
    mtime = 1234567890
    out = tango(node, d.port,
                ["push", str(src), str(remote), "--mode", "640", "--mtime", str(mtime)],
                ["stat", str(remote)],
                ["ls", str(rdir)],
                ["pull", str(remote), str(tmp_path / "back.bin")])
    push, stat, ls, pull = results(out)
    assert push["sha256"] == digest and sha256_file(remote) == digest, push
    st = os.stat(remote)
    assert (st.st_mode & 0o7777, int(st.st_mtime)) == (0o640, mtime), st
    for s in (stat["stat"], stat["lstat"]):
        assert (s["mode"], s["size"], s["mtime"]) == (0o100640, 3 * MIB + 17, mtime), stat
    names = {e["name"]: e for e in ls["entries"]}
    assert remote.name in names, names
    assert names[remote.name]["size"] == 3 * MIB + 17, names
    assert pull["sha256"] == digest, pull


def test_send_v2_dry_run_touches_nothing(node, fresh_daemon, tmp_path):
    """SND2 with the DryRun flag (sendrecv_v2_dry_run_send): data consumed, OKAY, no file."""
    d = fresh_daemon()
    src = tmp_path / "src.bin"
    digest = write_random(src, 2 * MIB)
    rdir = tmp_path / "remote"
    rdir.mkdir()
    out = tango(node, d.port, ["push", str(src), str(rdir / "dry.bin"), "--dry-run"])
    dry, = results(out)
    assert dry["sha256"] == digest and dry["send_v2"] is True, dry
    assert sorted(os.listdir(rdir)) == [], "a dry-run SND2 left something behind"
    # The same connection stays usable for a real push after a dry run.
    out = tango(node, d.port, ["push", str(src), str(rdir / "dry.bin"), "--dry-run"],
                ["push", str(src), str(rdir / "real.bin")])
    assert sorted(os.listdir(rdir)) == ["real.bin"], os.listdir(rdir)
    assert sha256_file(rdir / "real.bin") == digest


def test_slow_reader_pull_stops_at_the_credit(node, fresh_daemon, tmp_path):
    """A pulling host that stops reading stops acknowledging; the daemon must
    stop sending once the 32 MiB it was granted in OPEN.arg1 are used up
    (overshooting by at most one packet), and resume when credit returns."""
    d = fresh_daemon()
    remote = tmp_path / "remote.bin"
    digest = write_random(remote, BIG)
    local = tmp_path / "pulled.bin"
    out = tango(node, d.port, ["pull", str(remote), str(local), "--stall-ms", "2000"])
    pull, = results(out)
    assert pull["sha256"] == digest and sha256_file(local) == digest, pull
    conn = out["connection"]
    unacked = conn["maxDeviceBytesUnacked"]
    assert unacked <= DELAYED_ACK_WINDOW + MIB, (
        f"the daemon had {unacked} bytes unacknowledged on the stream, more than the "
        f"{DELAYED_ACK_WINDOW}-byte window plus one packet: {conn}")
    # The stall was real: the window filled up while Tango was not reading.
    assert unacked >= DELAYED_ACK_WINDOW // 2, conn
    line, = closed_streams(d, out["local_port"], service="sync:")
    assert line["delayed_ack"] == "true" and int(line["bytes_sent"]) >= BIG, line


def test_parallel_streams_with_delayed_ack(node, fresh_daemon, tmp_path):
    """Pushes, pulls and shells at once on one connection, each on its own credit."""
    d = fresh_daemon()
    size = 24 * MIB
    a = tmp_path / "a.bin"
    b = tmp_path / "b.bin"
    da = write_random(a, size)
    db = write_random(b, size)
    out = tango(node, d.port,
                ["push", str(a), str(tmp_path / "a.pushed")],
                ["push", str(b), str(tmp_path / "b.pushed")],
                ["pull", str(a), str(tmp_path / "a.pulled")],
                ["shell", f"cat '{b}'; echo done >&2; exit 9", "--digest"],
                parallel=True)
    pa, pb, la, sh = results(out)
    assert (pa["sha256"], pb["sha256"], la["sha256"]) == (da, db, da), results(out)
    assert sha256_file(tmp_path / "a.pushed") == da
    assert sha256_file(tmp_path / "b.pushed") == db
    assert sha256_file(tmp_path / "a.pulled") == da
    assert (sh["stdout_bytes"], sh["stdout_sha256"]) == (size, db), sh
    assert (b64(sh["stderr_b64"]), sh["exit_code"]) == (b"done\n", 9), sh
    assert sorted(out["connection"]["openArg1"]) == [DELAYED_ACK_WINDOW] * 4, out["connection"]
    lines = closed_streams(d, want=4)  # this daemon's four streams
    assert len(lines) == 4 and all(line["delayed_ack"] == "true" for line in lines), lines
