"""`oxadb server` as a drop-in for Google's adb 29 and adb 34 servers, by an adb user's script.

`adb_script.sh` (test_dropin.py's script) runs line by line with Google's
adb 29 CLI twice, each time against a fresh oxadbd: once through Google's
own adb 29 server, once through `oxadb server`, both on private ports with
private HOMEs. stdout, whether stderr was written, and exit codes must match
line by line (a line ending in `#~` compares no stdout). adb 34's CLI does
the same through Google's adb 34 server and ours, each paired with its
daemon first and the daemon requiring TLS.

The script begins with `adb start-server` and ends with `adb kill-server`.
adb starts Google's server when no server answers on its port, so `oxadb
server` is started before the run: `adb start-server` then finds it (it
asks `host:version`) and the comparison covers every line, the first
included. The script has no line after `kill-server`, so no restart is
needed; the test checks that our server answered throughout (it exits 0
at `kill-server`, never earlier, and no Google server was started in its
place: adb's server would have written its log to the client's TMPDIR).
"""

from __future__ import annotations

import os
import subprocess
import time

from echo import EchoServer
from harness import AdbServer
from test_adb34 import adb34_bin  # noqa: F401  (fixture)
from test_dropin import run_script, side
from test_pair import PairWindow
from test_server import Client, OxadbServer


def run_through_both(adb_bin, fresh_daemon, tmp_path, prepare=None):
    """The script through Google's server (`adb_bin`'s own) and through
    `oxadb server`, each against a fresh daemon. `prepare(server_argv, env,
    name)`, if given, runs first against each server and returns the
    daemon's extra arguments. Returns both sides' lines, our server, its
    client's HOME and each side's daemon and reboot record."""
    echo = EchoServer.tcp()
    try:
        google = AdbServer(adb_bin, tmp_path / "adbsrv")
        try:
            google.start()
            prefix = [adb_bin, "-P", str(google.port)]
            extra = prepare(prefix, google.env, "google") if prepare else ()
            google_daemon, values, _ = side("google", tmp_path, fresh_daemon, extra)
            values["ECHO"] = str(echo.port)
            with_google = run_script(prefix, google.env, values, tmp_path)
        finally:
            google.kill()
        ours = OxadbServer(tmp_path / "oxadb-server", adb_bin)
        client_home = tmp_path / "client-home"
        client_home.mkdir()
        client = Client(adb_bin, ours.port, client_home)
        ours.start()
        try:
            prefix = [adb_bin, "-P", str(ours.port)]
            extra = prepare(prefix, client.env, "ours") if prepare else ()
            our_daemon, values, record = side("ours", tmp_path, fresh_daemon, extra)
            values["ECHO"] = str(echo.port)
            with_ours = run_script(prefix, client.env, values, tmp_path)
            # The script's last line, `adb kill-server`, stopped our server.
            assert ours.proc.wait(timeout=10) == 0, ours.log()
        finally:
            ours.stop()
    finally:
        echo.close()
    assert "stopping: a client asked" in ours.log(), ours.log()
    google_log = client_home / f"adb.{os.getuid()}.log"
    assert not google_log.exists(), (
        f"Google's adb server was started in place of ours:\n{google_log.read_text()}")
    assert len(with_google) == len(with_ours) >= 40
    problems = []
    for (line, rc_g, out_g, err_g), (_, rc_o, out_o, err_o) in zip(with_google, with_ours):
        compared = {"rc": (rc_g, rc_o), "stderr": (bool(err_g), bool(err_o))}
        if not line.endswith("#~"):
            compared["stdout"] = (out_g, out_o)
        for aspect, (g, o) in compared.items():
            if g != o:
                problems.append(f"{line}: {aspect}: Google's server {g!r}, oxadb server {o!r} "
                                f"(stdout: {out_g!r} / {out_o!r}; "
                                f"stderr: {err_g!r} / {err_o!r})")
    assert not problems, "\n".join(problems) + "\n--- oxadb server log:\n" + ours.log()[-6000:]
    return (google_daemon, our_daemon), record


def wait_for_reboots(record) -> None:
    """The script's reboots went through the server to the device's reboot
    command (which oxadbd runs a second after answering)."""
    deadline = time.monotonic() + 20
    while not record.exists() or record.read_text().count("\n") < 2:
        assert time.monotonic() < deadline, "the reboots did not reach the reboot command"
        time.sleep(0.05)
    assert record.read_text() == "reboot \nreboot bootloader\n"


def test_adb_script_runs_the_same_through_oxadb_server(adb_bin, fresh_daemon, tmp_path):
    _, record = run_through_both(adb_bin, fresh_daemon, tmp_path)
    wait_for_reboots(record)


def test_adb34_script_runs_the_same_through_oxadb_server_to_a_paired_tls_device(
        adb34_bin, oxadbd_bin, fresh_daemon, tmp_path):  # noqa: F811
    """adb 34's CLI, each server paired with the daemon first (`adb pair`
    through it, which only adb 34 has) and the daemon requiring TLS: every
    line of the script then runs over TLS, through Google's adb 34 server
    and through ours."""
    def pair(prefix, env, name):
        window = PairWindow(oxadbd_bin, tmp_path / f"pair-{name}")
        try:
            cp = subprocess.run([*prefix, "pair", window.address, window.code],
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                env=env, timeout=60)
            assert cp.returncode == 0 and "Successfully paired" in cp.stdout, cp
            rc, out, err = window.finish()
            assert rc == 0, (out, err)
        finally:
            window.stop()
        return ("--auth", "--keys", str(window.keys), "--tls", "required")

    daemons, record = run_through_both(adb34_bin, fresh_daemon, tmp_path, prepare=pair)
    for daemon in daemons:
        text = daemon.log_since(0).decode("utf-8", "replace")
        assert "TLS 1.3 established" in text, text[-3000:]
        assert "host authenticated" not in text, text[-3000:]
    wait_for_reboots(record)
