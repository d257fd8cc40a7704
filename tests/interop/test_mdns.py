"""mDNS announcements (docs/protocol.md, "mDNS"), seen by an independent
browser: python-zeroconf (mdns_browser.py) in another network namespace.

Each test makes two network namespaces joined by a veth pair with
multicast on (198.18.0.1 the device, 198.18.0.2 the host), runs oxadbd in
the first and the browser in the second, and removes both namespaces at
teardown whatever happened; every process it started is ended by its pid.

Debian's adb 34 is no help here: its build has no mDNS backend (no
`_adb-tls-connect` string anywhere in it or its libraries); `adb mdns check`
prints an empty line and `adb mdns services` only its header, with the
daemon announcing on the same link. So it is not used.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from harness import Daemon, clean_env, resolve_oxadb, resolve_oxadbd, stop_process, trust_key

DEVICE = "198.18.0.1"
HOST = "198.18.0.2"
PORT = 5555
CONNECT = "_adb-tls-connect._tcp.local."
PLAIN = "_adb._tcp.local."
PAIRING = "_adb-tls-pairing._tcp.local."
SERIAL = "OXMDNS1"
MODEL = "mdns-board"
# Browsers see a new service within a second on a quiet link (the
# responder's first announcements, or its answer to the browser's query);
# a withdrawn one at once (goodbye). Generous bounds for a loaded machine.
SEEN_WITHIN = 10.0
# How long "nothing is announced" is watched for: a browser queries at
# once and again after a second, and a responder announces at once.
QUIET_FOR = 4.0
BROWSER = Path(__file__).with_name("mdns_browser.py")


def run(*cmd: str) -> None:
    cp = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    assert cp.returncode == 0, (cmd, cp.stdout.decode("utf-8", "replace"))


class Link:
    """Two namespaces joined by a veth pair, multicast on."""

    def __init__(self, tag: str):
        base = f"oxmdns-{os.getpid()}-{tag}"
        self.dev_ns, self.host_ns = f"{base}-d", f"{base}-h"
        self.made: list[str] = []

    def up(self) -> "Link":
        for ns in (self.dev_ns, self.host_ns):
            run("ip", "netns", "add", ns)
            self.made.append(ns)
        run("ip", "link", "add", "v0", "netns", self.dev_ns, "type", "veth",
            "peer", "name", "v1", "netns", self.host_ns)
        for ns, dev, addr in ((self.dev_ns, "v0", DEVICE), (self.host_ns, "v1", HOST)):
            run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            run("ip", "-n", ns, "link", "set", "dev", dev, "multicast", "on", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run("ip", "-n", ns, "route", "add", "224.0.0.0/4", "dev", dev)
        return self

    def down(self) -> None:
        for ns in self.made:
            subprocess.run(["ip", "netns", "delete", ns], timeout=30)
        self.made = []


class Browser:
    """mdns_browser.py in the host namespace; events arrive on a queue."""

    def __init__(self, link: Link, *types: str):
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", link.host_ns, sys.executable, str(BROWSER), HOST, *types],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.events: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        self.pending: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        ready = self.events.get(timeout=30)
        assert ready == {"event": "ready"}, ready

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put({"event": "exit"})

    def wait(self, event: str, type_: str, timeout: float = SEEN_WITHIN) -> dict:
        """The first `event` of `type_` not taken yet (events of other
        types stay for later waits)."""
        for got in self.pending:
            if got["event"] == event and got.get("type") == type_:
                self.pending.remove(got)
                return got
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                got = self.events.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise AssertionError(
                    f"the browser saw no {event} of {type_} within {timeout}s; "
                    f"it saw: {self.seen}") from None
            self.seen.append(got)
            if got["event"] == "exit":
                err = self.proc.stderr.read().decode("utf-8", "replace")
                raise AssertionError(f"the browser exited: {err}")
            if got["event"] == event and got.get("type") == type_:
                return got
            self.pending.append(got)

    def nothing_for(self, seconds: float) -> list[dict]:
        """Every event not taken yet, and those seen in `seconds` more."""
        deadline = time.monotonic() + seconds
        got, self.pending = self.pending, []
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(event)
            got.append(event)
        return got

    def stop(self) -> None:
        stop_process(self.proc, timeout=5)


@contextlib.contextmanager
def namespaces(tag: str):
    link = Link(tag)
    browser = None
    try:
        link.up()
        browser = Browser(link, CONNECT, PLAIN, PAIRING)
        yield link, browser
    finally:
        if browser is not None:
            browser.stop()
        link.down()


def config_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "oxadbd.toml"
    path.write_text(f'product-model = "{MODEL}"\n{extra}\n[properties]\n"ro.serialno" = "{SERIAL}"\n')
    return path


def start_daemon(link: Link, tmp_path: Path, *args: str, host: str = DEVICE,
                 extra: str = "") -> Daemon:
    """oxadbd in the device namespace on HOST:5555, with a config file
    (`extra` added to it) and a state directory under `tmp_path`."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    daemon = Daemon(resolve_oxadbd(), tmp_path / "daemon", host=host,
                    prefix=("ip", "netns", "exec", link.dev_ns),
                    args=("--keys", str(tmp_path / "adb_keys"), "--state-dir", str(state),
                          "--config", str(config_file(tmp_path, extra)), *args))
    return daemon.start(port=PORT)


PAIRING_OPEN_FOR = 4


def pairing_window(link: Link, tmp_path: Path, port: int) -> subprocess.Popen:
    """`oxadbd pair` on DEVICE:`port` in the device namespace, with the
    daemon's config and state directory; nobody pairs, so its window closes
    after PAIRING_OPEN_FOR seconds (exit 1), which withdraws the announcement."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", link.dev_ns, str(resolve_oxadbd()), "pair",
         "--listen", f"{DEVICE}:{port}", "--timeout", str(PAIRING_OPEN_FOR),
         "--keys", str(tmp_path / "adb_keys"), "--state-dir", str(tmp_path / "state"),
         "--config", str(config_file(tmp_path))],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=clean_env(RUST_LOG="info", NO_COLOR="1"))
    line = proc.stdout.readline().decode()
    assert line.startswith("pairing code: "), (line, proc.stderr.read1().decode())
    return proc


def window_closed(proc: subprocess.Popen) -> None:
    """Waits for the pairing window to close by itself: exit 1, saying so."""
    try:
        rc = proc.wait(timeout=PAIRING_OPEN_FOR + 15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode()
    assert rc == 1, (rc, err)


def instance_in(tmp_path: Path) -> str:
    name = (tmp_path / "state" / "mdns-instance").read_text().strip()
    assert name.startswith(f"adb-{SERIAL}-") and len(name) == len(f"adb-{SERIAL}-") + 6, name
    return name


def test_connect_service_announced_with_port_address_and_txt_then_withdrawn(tmp_path):
    with namespaces("connect") as (link, browser):
        daemon = start_daemon(link, tmp_path)
        try:
            connect = browser.wait("add", CONNECT)
            plain = browser.wait("add", PLAIN)
            name = instance_in(tmp_path)
            # adbd's instance name, TXT records (daemon/mdns.cpp) and the
            # listener's port and address.
            for found, type_ in ((connect, CONNECT), (plain, PLAIN)):
                assert found["name"] == f"{name}.{type_}", found
                assert found["port"] == PORT, found
                assert found["addresses"] == [DEVICE], found
                assert found["txt"] == {"v": "1", "name": MODEL, "api": "31"}, found
        finally:
            daemon.stop()
        # SIGTERM sends goodbyes: browsers forget it at once, not after the TTL.
        assert browser.wait("remove", CONNECT)["name"] == f"{name}.{CONNECT}"
        assert browser.wait("remove", PLAIN)["name"] == f"{name}.{PLAIN}"
        assert "mDNS: withdrawn" in daemon.log_since().decode()


def test_tls_off_announces_only_the_plain_service(tmp_path):
    # `_adb-tls-connect._tcp` promises TLS: a daemon that never offers it
    # (--tls off) announces `_adb._tcp` alone.
    with namespaces("tlsoff") as (link, browser):
        daemon = start_daemon(link, tmp_path, "--tls", "off")
        try:
            plain = browser.wait("add", PLAIN)
            assert plain["port"] == PORT, plain
            later = browser.nothing_for(2.0)
            assert not [e for e in later if e.get("type") == CONNECT or
                        CONNECT in e.get("name", "")], later
        finally:
            daemon.stop()


def test_no_mdns_flag_config_key_and_loopback_listener_announce_nothing(tmp_path):
    cases = [("--no-mdns", ("--no-mdns",), "", DEVICE),
             ("mdns = false", (), "mdns = false", DEVICE),
             ("loopback", (), "", "127.0.0.1")]
    with namespaces("quiet") as (link, browser):
        for i, (case, args, extra, host) in enumerate(cases):
            work = tmp_path / str(i)
            work.mkdir()
            daemon = start_daemon(link, work, *args, host=host, extra=extra)
            try:
                seen = browser.nothing_for(QUIET_FOR)
                assert seen == [], (case, seen)
                log = daemon.log_since().decode()
                assert "mDNS: announced" not in log, (case, log)
                if case == "loopback":
                    assert "mDNS: nothing announced: the listener is on loopback" in log, log
                if i == 0:
                    # The browser works: a pairing announcement made beside
                    # the quiet daemon is seen, so "nothing" is the daemon's doing.
                    window = pairing_window(link, work, 37001)
                    try:
                        assert browser.wait("add", PAIRING)["port"] == 37001
                    finally:
                        window_closed(window)
                    browser.wait("remove", PAIRING)
            finally:
                daemon.stop()


def test_pairing_service_only_while_its_guard_is_held(tmp_path):
    with namespaces("pairing") as (link, browser):
        daemon = start_daemon(link, tmp_path)
        try:
            connect = browser.wait("add", CONNECT)
            browser.wait("add", PLAIN)
            window = pairing_window(link, tmp_path, 37123)
            try:
                pairing = browser.wait("add", PAIRING)
                # A host that paired looks for the connect service under the
                # pairing service's instance name (client/transport_mdns.cpp):
                # `oxadbd pair`, a process of its own, announces the daemon's name.
                name = instance_in(tmp_path)
                assert pairing["name"] == f"{name}.{PAIRING}", pairing
                assert connect["name"] == f"{name}.{CONNECT}", connect
                assert pairing["port"] == 37123, pairing
                assert pairing["addresses"] == [DEVICE], pairing
                assert pairing["txt"]["v"] == "1", pairing
            finally:
                # The window closing drops the guard: a goodbye, then exit.
                window_closed(window)
            assert browser.wait("remove", PAIRING)["name"] == f"{name}.{PAIRING}"
            # The daemon's services stay.
            later = browser.nothing_for(1.0)
            assert not [e for e in later if e["event"] == "remove"], later
        finally:
            daemon.stop()


def test_announcement_follows_the_listener_moved_by_tcpip(tmp_path):
    home = tmp_path / "home"
    (home / ".android").mkdir(parents=True)
    key = home / ".android" / "adbkey"
    cp = subprocess.run([str(resolve_oxadb()), "keygen", str(key)], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, timeout=60, env=clean_env(HOME=str(home)))
    assert cp.returncode == 0, cp.stdout
    trust_key(Path(f"{key}.pub"), tmp_path / "adb_keys")
    with namespaces("tcpip") as (link, browser):
        daemon = start_daemon(link, tmp_path)
        try:
            assert browser.wait("add", CONNECT)["port"] == PORT
            cp = subprocess.run(
                ["ip", "netns", "exec", link.host_ns, str(resolve_oxadb()), "-s",
                 f"{DEVICE}:{PORT}", "tcpip", "5556"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30,
                env=clean_env(HOME=str(home)))
            assert cp.returncode == 0, cp.stdout
            browser.wait("remove", CONNECT)
            moved = browser.wait("add", CONNECT)
            assert moved["port"] == 5556, moved
            assert moved["addresses"] == [DEVICE], moved
        finally:
            daemon.stop()
