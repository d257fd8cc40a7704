"""Process harness for the interop suite: a private oxadbd and a private adb server.

Nothing here touches anything outside the test's own temporary directories and
the loopback ports it picked:
  * oxadbd listens on a free 127.0.0.1 (or ::1) port and is stopped via its
    Popen object (also when it runs as another user through `setpriv`, which
    execs it: the Popen pid is the daemon's);
  * the adb server runs on a private port (`adb -P PORT`) with a private HOME
    (so ~/.android/adbkey lands in a temp dir) and a private TMPDIR (so the
    server log, adb.<uid>.log, does too), and is always stopped with
    `adb -P PORT kill-server`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ADB_VERSION = "29.0.6"

ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")

# Every adb invocation in the suite gets one of these as its timeout.
ADB_TIMEOUT = 60


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free loopback TCP port from the kernel's ephemeral range.

    The ephemeral range (32768+) never overlaps 5555..5585, which adb servers
    started without ADB_EMU=0 (other people's) poll for emulators: a daemon
    there would be auto-connected by them. `host` may be an IPv6 address
    (`::1`, `::ffff:127.0.0.1`); binding it fails loudly if it is unavailable.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    assert not 5554 <= port <= 5586
    return port


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def write_random(path: Path, size: int) -> str:
    """Write `size` random bytes to `path`, return their sha256."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(left, 4 << 20))
            f.write(chunk)
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def resolve_oxadbd() -> Path:
    raw = os.environ.get("OXADBD", "target/release/oxadbd")
    p = Path(raw)
    if not p.is_absolute():
        cand = Path.cwd() / p
        p = cand if cand.exists() else REPO / p
    return p


def resolve_oxadb() -> Path:
    """The host CLI: $OXADB, else the one built beside the daemon under test;
    missing is a failure."""
    exe = Path(os.environ["OXADB"]) if os.environ.get("OXADB") else resolve_oxadbd().parent / "oxadb"
    assert exe.exists(), f"oxadb not found at {exe}; build it with `cargo build --release`"
    return exe


_NO_SERVER: socket.socket | None = None


def no_server_port() -> int:
    """A loopback port where no adb server can ever answer: bound for the
    whole test session by this socket, which never listens (a connection
    is refused at once), so nothing else can take it."""
    global _NO_SERVER
    if _NO_SERVER is None:
        _NO_SERVER = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        _NO_SERVER.bind(("127.0.0.1", 0))
    return _NO_SERVER.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a test's commands: no ANDROID_/ADB_ settings of the
    machine, and ANDROID_ADB_SERVER_PORT at a port where no server answers
    (unless `extra` sets it), so `oxadb` talks to devices directly even when
    an adb server runs on the machine's 5037."""
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("ANDROID_", "ADB_", "OXADBD_")) or k in ("RUST_LOG", "OXADB_DIRECT"):
            del env[k]
    env["NO_COLOR"] = "1"
    env["LC_ALL"] = "C.UTF-8"
    env["ANDROID_ADB_SERVER_PORT"] = str(no_server_port())
    env.update(extra)
    return env


def strip_ansi(b: bytes) -> bytes:
    return ANSI.sub(b"", b)


def setpriv(uid: int, gid: int) -> tuple[str, ...]:
    """The argv prefix that runs a command as `uid`:`gid` with no
    supplementary groups (util-linux's setpriv execs it: same pid)."""
    return ("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups")


def is_oxadbd(pid: int) -> bool:
    """Whether `pid` runs oxadbd itself (a prefix such as setpriv execs it)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "oxadbd"
    except FileNotFoundError:
        return False


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid`, from /proc (empty once it has exited)."""
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return children
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return children


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL if `proc` has not exited within `timeout`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def trust_key(pub: Path, keys: Path) -> None:
    """`oxadbd trust-key PUB --keys KEYS`, which must succeed."""
    cp = subprocess.run([str(resolve_oxadbd()), "trust-key", str(pub), "--keys", str(keys)],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30,
                        env=clean_env())
    out = cp.stdout.decode("utf-8", "replace")
    assert cp.returncode == 0 and "trusted" in out, out


class Daemon:
    """One oxadbd process on a free loopback port; stderr+stdout go to a file.

    `host` is the loopback address to listen on (`127.0.0.1`, `::1`,
    `::ffff:127.0.0.1`); `prefix` runs the daemon through another program
    (e.g. `setpriv(...)`, to run it as another user); `env` adds to its
    environment.
    """

    def __init__(self, exe: Path, workdir: Path, name: str = "oxadbd",
                 args: tuple[str, ...] = (), rust_log: str | None = "debug",
                 host: str = "127.0.0.1", prefix: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        self.exe = exe
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{name}.log"
        self.args = tuple(args)
        self.rust_log = rust_log
        self.host = host
        self.prefix = tuple(prefix)
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def listen(self) -> str:
        """The --listen address, as the daemon prints it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def serial(self) -> str:
        """What adb connects to: a mapped address is reached over IPv4."""
        host = self.host.removeprefix("::ffff:")
        host = f"[{host}]" if ":" in host else host
        return f"{host}:{self.port}"

    @property
    def connect_host(self) -> str:
        """The address a raw socket connects to."""
        return self.host.removeprefix("::ffff:")

    def start(self, timeout: float = 20.0, port: int | None = None) -> "Daemon":
        """Starts on a free port, or on `port` (e.g. to restart on the same
        address; then a port race is a failure, not retried)."""
        if not self.exe.exists():
            raise AssertionError(
                f"oxadbd binary not found at {self.exe} (set OXADBD or run "
                f"`cargo build --release -p oxadbd`)")
        env = clean_env(**self.env)
        if self.rust_log:
            env["RUST_LOG"] = self.rust_log
        last_err = ""
        for _attempt in range(3 if port is None else 1):
            self.port = port if port is not None else free_port(self.host)
            start_at = self.log_size()
            log = open(self.log_path, "ab")
            try:
                self.proc = subprocess.Popen(
                    [*self.prefix, str(self.exe), "--listen", self.listen, *self.args],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    env=env, cwd=str(self.workdir), umask=0o022)
            finally:
                log.close()
            want = f"listening on {self.listen}".encode()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                text = self.log_since(start_at)
                if want in text:
                    return self
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
            text = self.log_since(start_at).decode("utf-8", "replace")
            rc = self.proc.poll()
            self._stop_proc()
            last_err = f"exit status {rc}; log:\n{text}"
            if rc is not None and "in use" in text.lower():
                continue  # lost a port race; try another port
            break
        raise AssertionError(
            f"oxadbd did not print 'listening on {self.listen}' within {timeout}s: {last_err}")

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_since(self, offset: int = 0) -> bytes:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return strip_ansi(f.read())
        except FileNotFoundError:
            return b""

    def wait_for_log(self, predicate, since: int = 0, timeout: float = 5.0) -> str | None:
        """Poll the log until a line satisfies `predicate(line)`; return it or None."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log_since(since).decode("utf-8", "replace").splitlines():
                if predicate(line):
                    return line
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _stop_proc(self) -> None:
        if self.proc is None:
            return
        # A wrapper that forks (strace -f) leaves its child running when it
        # is told to stop itself: stop the daemon under it first, by pid.
        if self.prefix and not is_oxadbd(self.proc.pid):
            daemons = [c for c in child_pids(self.proc.pid) if is_oxadbd(c)]
            for child in daemons:
                try:
                    os.kill(child, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            if daemons:
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        stop_process(self.proc, timeout=5)

    def stop(self) -> None:
        self._stop_proc()


class AdbResult:
    def __init__(self, args: list[str], cp: subprocess.CompletedProcess):
        self.args = args
        self.rc = cp.returncode
        self.stdout: bytes = cp.stdout or b""
        self.stderr: bytes = cp.stderr or b""

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    @property
    def both(self) -> str:
        return self.out + self.err

    def __repr__(self) -> str:
        return (f"<adb {' '.join(self.args)} rc={self.rc} stdout={self.stdout[:2000]!r} "
                f"stderr={self.stderr[:2000]!r}>")


class AdbServer:
    """A private Google adb server: own port, own HOME, own TMPDIR.

    With `user=(uid, gid)` every adb command (the server included) runs as
    that user through setpriv; `workdir` must then be reachable by it, and
    its HOME and TMPDIR are made its own.
    """

    def __init__(self, adb: str, workdir: Path, user: tuple[int, int] | None = None):
        self.adb = adb
        self.workdir = workdir
        self.user = user
        self.home = workdir / "home"
        self.tmp = workdir / "tmp"
        self.home.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        if user is not None:
            for d in (workdir, self.home, self.tmp):
                os.chown(d, *user)
        self.prefix = setpriv(*user) if user is not None else ()
        self.port = free_port()
        # ADB_EMU=0: no scan of 127.0.0.1:5555..5585 for emulators (it would
        # attach any other adbd on the machine, e.g. an oxadbd on its default
        # port); ADB_USB=0: no USB scanning. `adb connect` works regardless.
        self.env = clean_env(HOME=str(self.home), TMPDIR=str(self.tmp),
                             ADB_EMU="0", ADB_USB="0", ADB_MDNS="0")
        self.started = False

    @property
    def log_path(self) -> Path:
        uid = self.user[0] if self.user is not None else os.getuid()
        return self.tmp / f"adb.{uid}.log"

    def argv(self, *args: str, serial: str | None = None) -> list[str]:
        cmd = [*self.prefix, self.adb, "-P", str(self.port)]
        if serial:
            cmd += ["-s", serial]
        return cmd + list(args)

    def run(self, *args: str, serial: str | None = None, timeout: float = ADB_TIMEOUT,
            input: bytes | None = None, cwd: str | None = None) -> AdbResult:
        cmd = self.argv(*args, serial=serial)
        try:
            cp = subprocess.run(
                cmd, input=input, stdin=None if input is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env,
                timeout=timeout, cwd=cwd or str(self.workdir), umask=0o022)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(
                f"`{' '.join(cmd)}` did not finish within {timeout}s; "
                f"stdout={e.stdout!r:.2000} stderr={e.stderr!r:.2000}") from None
        return AdbResult(cmd[len(self.prefix) + (3 if not serial else 5):], cp)

    def popen(self, *args: str, serial: str | None = None, **kw) -> subprocess.Popen:
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen(self.argv(*args, serial=serial), env=self.env,
                                cwd=str(self.workdir), umask=0o022, **kw)

    def start(self) -> "AdbServer":
        r = self.run("start-server", timeout=60)
        self.started = True
        if r.rc != 0:
            raise AssertionError(f"adb start-server failed: {r!r}\nlog:\n{self.log_text()}")
        return self

    def connect(self, serial: str, timeout: float = 20.0) -> AdbResult:
        r = self.run("connect", serial, timeout=timeout)
        if r.rc != 0 or f"connected to {serial}" not in r.out:
            raise AssertionError(f"adb connect {serial} failed: {r!r}")
        self.wait_device(serial, timeout=timeout)
        return r

    def devices(self) -> dict[str, str]:
        r = self.run("devices", timeout=20)
        found = {}
        for line in r.out.splitlines()[1:]:
            if "\t" in line:
                s, state = line.split("\t", 1)
                found[s] = state.strip()
        return found

    def wait_device(self, serial: str, timeout: float = 20.0) -> None:
        self.wait_state(serial, "device", timeout)

    def wait_state(self, serial: str, want: str, timeout: float = 20.0) -> None:
        """Waits until `adb devices` lists `serial` as `want` (e.g. `unauthorized`)."""
        deadline = time.monotonic() + timeout
        last = {}
        while time.monotonic() < deadline:
            last = self.devices()
            if last.get(serial) == want:
                return
            time.sleep(0.1)
        raise AssertionError(
            f"{serial} did not reach state {want!r} within {timeout}s; adb devices: {last}")

    def disconnect(self, serial: str) -> None:
        self.run("disconnect", serial, timeout=20)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        if not self.started:
            return
        try:
            self.run("kill-server", timeout=20)
        except AssertionError:
            pass
        # kill-server returns before the server has exited; wait for the port to close.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex(("127.0.0.1", self.port)) != 0:
                    break
            time.sleep(0.1)
        self.started = False


def which_adb() -> str:
    adb = shutil.which("adb")
    if not adb:
        raise AssertionError("`adb` is not installed (Debian package `adb` 29.0.6); "
                             "run ./scripts/test.sh, which installs it")
    return adb


# Fields of the daemon's debug lines: key=value pairs.
FIELD = re.compile(r"(\w+)=(\S+)")


def closed_streams(daemon, local_port: int | None = None, service: str | None = None,
                   want: int = 1, timeout: float = 10.0) -> list[dict[str, str]]:
    """The daemon's `stream closed` lines, parsed into their key=value fields.

    `local_port` (the client's end of the TCP connection, logged by the daemon
    as `peer=127.0.0.1:PORT` in the connection span) and `service` narrow the
    lines down; both need the line to carry its spans, which the line of a
    shell stream closed by its process exiting does not (it is logged outside
    the connection/stream spans). Each test runs its own daemon, so without
    them every line belongs to the test's connections. Waits until at least
    `want` lines match.
    """
    peer = f"peer=127.0.0.1:{local_port}}}" if local_port is not None else None

    def lines() -> list[dict[str, str]]:
        found = []
        for line in daemon.log_since(0).decode("utf-8", "replace").splitlines():
            if "stream closed" not in line:
                continue
            if peer is not None and peer not in line:
                continue
            if service is not None and f"service={service}" not in line:
                continue
            found.append(dict(FIELD.findall(line.split("stream closed", 1)[1])))
        return found

    deadline = time.monotonic() + timeout
    got = lines()
    while len(got) < want and time.monotonic() < deadline:
        time.sleep(0.05)
        got = lines()
    assert len(got) >= want, (
        f"expected {want} `stream closed` line(s) ({peer=}, {service=}) in "
        f"{daemon.log_path}, found {got}")
    return got
