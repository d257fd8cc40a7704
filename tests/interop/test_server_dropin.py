"""`oxadb server` as a drop-in for Google's adb 29 server, by an adb user's script.

`adb_script.sh` (test_dropin.py's script) runs line by line with Google's
adb 29 CLI twice, each time against a fresh oxadbd: once through Google's
own adb 29 server, once through `oxadb server`, both on private ports with
private HOMEs. stdout, whether stderr was written, and exit codes must match
line by line (a line ending in `#~` compares no stdout).

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
import time

from echo import EchoServer
from harness import AdbServer
from test_dropin import run_script, side
from test_server import Client, OxadbServer


def test_adb_script_runs_the_same_through_oxadb_server(adb_bin, fresh_daemon, tmp_path):
    echo = EchoServer.tcp()
    try:
        google = AdbServer(adb_bin, tmp_path / "adbsrv")
        try:
            google.start()
            _, values, _ = side("google", tmp_path, fresh_daemon)
            values["ECHO"] = str(echo.port)
            with_google = run_script([adb_bin, "-P", str(google.port)], google.env, values,
                                     tmp_path)
        finally:
            google.kill()
        ours = OxadbServer(tmp_path / "oxadb-server", adb_bin)
        client_home = tmp_path / "client-home"
        client_home.mkdir()
        client = Client(adb_bin, ours.port, client_home)
        ours.start()
        try:
            _, values, record = side("ours", tmp_path, fresh_daemon)
            values["ECHO"] = str(echo.port)
            with_ours = run_script([adb_bin, "-P", str(ours.port)], client.env, values,
                                   tmp_path)
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
    # The reboots went through our server to the device's reboot command
    # (which oxadbd runs a second after answering).
    deadline = time.monotonic() + 20
    while not record.exists() or record.read_text().count("\n") < 2:
        assert time.monotonic() < deadline, "the reboots did not reach the reboot command"
        time.sleep(0.05)
    assert record.read_text() == "reboot \nreboot bootloader\n"
