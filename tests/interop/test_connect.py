"""`adb connect` / `adb devices` / `adb get-state` against a fresh oxadbd."""

import subprocess
import time

import pytest

from harness import clean_env


def test_connect_devices_get_state(adb_server, fresh_daemon):
    d = fresh_daemon()
    r = adb_server.run("connect", d.serial, timeout=30)
    assert r.rc == 0, r
    assert f"connected to {d.serial}" in r.out, r

    # The transport comes up asynchronously after the TCP connect: poll.
    deadline = time.monotonic() + 20
    listing = ""
    while time.monotonic() < deadline:
        listing = adb_server.run("devices", timeout=20).out
        if f"{d.serial}\tdevice" in listing.splitlines():
            break
        time.sleep(0.1)
    assert f"{d.serial}\tdevice" in listing.splitlines(), listing

    r = adb_server.run("get-state", serial=d.serial, timeout=20)
    assert r.rc == 0, r
    assert r.out.strip() == "device", r

    r = adb_server.run("disconnect", d.serial, timeout=20)
    assert r.rc == 0, r
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and d.serial in adb_server.devices():
        time.sleep(0.1)
    assert d.serial not in adb_server.devices()
    assert d.alive(), "daemon died after the client disconnected"


def test_devices_long_listing_shows_product(adb_server, fresh_daemon):
    d = fresh_daemon()
    adb_server.connect(d.serial)
    try:
        r = adb_server.run("devices", "-l", timeout=20)
        lines = [ln for ln in r.out.splitlines() if ln.startswith(d.serial)]
        assert len(lines) == 1, r
        # adb 29 prints the banner properties it understood (product/model/device)
        # and the transport id; a banner it cannot parse leaves only transport_id.
        assert " device " in lines[0] + " ", lines[0]
        assert "product:" in lines[0], lines[0]
        assert "transport_id:" in lines[0], lines[0]
    finally:
        adb_server.disconnect(d.serial)


@pytest.mark.parametrize("addr", ["0.0.0.0:0", "[::]:0", "192.0.2.1:5555"])
def test_refuses_non_loopback_listen_without_auth(oxadbd_bin, tmp_path, addr):
    # The daemon gives a root shell: beyond loopback it must not listen
    # without authentication unless told --insecure. It must exit with an
    # error naming the problem before binding anything (192.0.2.1 is
    # TEST-NET-1: nothing is sent anywhere either way).
    env = clean_env()
    env.pop("RUST_BACKTRACE", None)
    cp = subprocess.run([str(oxadbd_bin), "--listen", addr, "--no-auth"],
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, timeout=15, env=env, cwd=tmp_path)
    assert cp.returncode != 0, cp
    msg = (cp.stdout + cp.stderr).decode("utf-8", "replace")
    assert "without authentication" in msg and "--insecure" in msg, msg
    assert "listening on" not in msg, msg
