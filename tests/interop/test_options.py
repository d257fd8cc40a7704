"""oxadbd command-line options: --shell and --no-delayed-ack."""

from adbproto import RawClient


def test_shell_option_selects_the_shell(adb_server, fresh_daemon):
    default = fresh_daemon("default")
    bash = fresh_daemon("bash", args=("--shell", "/bin/bash"))
    for d in (default, bash):
        adb_server.connect(d.serial)
    try:
        probe = "echo ${BASH_VERSION:+is-bash}"
        r = adb_server.run("shell", probe, serial=bash.serial)
        assert r.rc == 0 and r.stdout == b"is-bash\n", r
        # The default is /bin/sh, which on Debian is dash, not bash.
        r = adb_server.run("shell", probe, serial=default.serial)
        assert r.rc == 0 and r.stdout == b"\n", r
    finally:
        for d in (default, bash):
            adb_server.disconnect(d.serial)


def test_no_delayed_ack_option_hides_the_feature(fresh_daemon):
    d = fresh_daemon(args=("--no-delayed-ack",))
    c = RawClient(d.port)
    try:
        c.connect()
        feats = c.features()
        assert "shell_v2" in feats, feats
        assert "delayed_ack" not in feats, feats
        assert c.run_service("exec:echo ok") == b"ok\n"
    finally:
        c.close()
