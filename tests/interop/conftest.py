"""Fixtures for the interop suite: Google's adb 29 (classic mode) against oxadbd.

Scopes:
  * `adb_server`  - one private adb server per test module;
  * `daemon`      - one oxadbd per test module, already `adb connect`ed;
  * `fresh_daemon`- a factory for per-test daemons where isolation matters
                    (hostile input, interrupted transfers), each logging to its
                    own file under the test's tmp dir.
On a failing test the slice of every live daemon's log written during that
test, and the adb server log, are attached to the report.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness import ADB_VERSION, AdbServer, Daemon, resolve_oxadbd, which_adb

_LIVE_DAEMONS: list[Daemon] = []
_LIVE_SERVERS: list[AdbServer] = []


@pytest.fixture(scope="session")
def adb_bin() -> str:
    adb = which_adb()
    out = subprocess.run([adb, "version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=30).stdout.decode("utf-8", "replace")
    if ADB_VERSION not in out:
        pytest.fail(f"this suite targets adb {ADB_VERSION}; `adb version` says:\n{out}")
    return adb


@pytest.fixture(scope="session")
def oxadbd_bin() -> Path:
    exe = resolve_oxadbd()
    if not exe.exists():
        pytest.fail(f"oxadbd binary not found at {exe}; set OXADBD or build it with "
                    f"`cargo build --release -p oxadbd`")
    return exe


def _new_daemon(exe: Path, workdir: Path, **kw) -> Daemon:
    d = Daemon(exe, workdir, **kw)
    _LIVE_DAEMONS.append(d)
    d.start()
    return d


def _drop_daemon(d: Daemon) -> None:
    d.stop()
    if d in _LIVE_DAEMONS:
        _LIVE_DAEMONS.remove(d)


@pytest.fixture(scope="module")
def adb_server(adb_bin, tmp_path_factory):
    srv = AdbServer(adb_bin, tmp_path_factory.mktemp("adbsrv"))
    _LIVE_SERVERS.append(srv)
    try:
        srv.start()
        yield srv
    finally:
        srv.kill()
        _LIVE_SERVERS.remove(srv)


@pytest.fixture(scope="module")
def daemon(oxadbd_bin, adb_server, tmp_path_factory):
    """A module-wide oxadbd, connected to the module's adb server."""
    d = _new_daemon(oxadbd_bin, tmp_path_factory.mktemp("oxadbd"))
    try:
        adb_server.connect(d.serial)
        yield d
    finally:
        try:
            adb_server.disconnect(d.serial)
        except AssertionError:
            pass
        _drop_daemon(d)


@pytest.fixture
def fresh_daemon(oxadbd_bin, tmp_path):
    """Factory: start a daemon private to this test (stopped at teardown)."""
    made: list[Daemon] = []

    def make(name: str = "oxadbd", args: tuple[str, ...] = (), **kw) -> Daemon:
        """`kw`: `host`, `prefix`, `env`, `rust_log` (see harness.Daemon)."""
        d = _new_daemon(oxadbd_bin, tmp_path / f"daemon-{name}-{len(made)}", name=name,
                        args=args, **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        _drop_daemon(d)


class Adb:
    """adb bound to one server and one device serial."""

    def __init__(self, server: AdbServer, serial: str):
        self.server = server
        self.serial = serial

    def __call__(self, *args: str, **kw):
        return self.server.run(*args, serial=self.serial, **kw)

    def popen(self, *args: str, **kw):
        return self.server.popen(*args, serial=self.serial, **kw)


@pytest.fixture(scope="module")
def adb(adb_server, daemon) -> Adb:
    return Adb(adb_server, daemon.serial)


# --- failure diagnostics ------------------------------------------------------

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    item._daemon_marks = {id(d): d.log_size() for d in _LIVE_DAEMONS}
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call" or not rep.failed:
        return
    marks = getattr(item, "_daemon_marks", {})
    for d in _LIVE_DAEMONS:
        text = d.log_since(marks.get(id(d), 0)).decode("utf-8", "replace")
        if len(text) > 20000:
            text = "...(cut)...\n" + text[-20000:]
        rep.sections.append((f"oxadbd log {d.log_path} (port {d.port}, this test)", text))
    for s in _LIVE_SERVERS:
        text = s.log_text()
        if len(text) > 8000:
            text = "...(cut)...\n" + text[-8000:]
        rep.sections.append((f"adb server log {s.log_path}", text))


# --- no silent skips ------------------------------------------------------------

_SKIPPED: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped:
        _SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if _SKIPPED and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _SKIPPED:
        terminalreporter.write_line(
            f"ERROR: {len(_SKIPPED)} test(s) skipped; this suite allows no skips: "
            + ", ".join(_SKIPPED), red=True)
