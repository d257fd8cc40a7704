"""The Debian packages of oxadbd (scripts/package-deb.sh): the amd64 and
arm64 packages' contents, and for amd64 its units (systemd-analyze verify), an install into a scratch root
whose installed binary and config serve adb 29, and an upgrade that keeps a
changed config and keys file.

scripts/test.sh builds target/deb/oxadbd_0.1.0-1_{amd64,arm64}.deb first; this test
builds the revision-2 package it upgrades to. Nothing here touches the
machine's own dpkg database or services: installs go into a scratch root
with `dpkg --root` (maintainer scripts see DPKG_ROOT and leave systemd
alone).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import _drop_daemon, _new_daemon
from harness import REPO

DEB_DIR = REPO / "target" / "deb"
VERSION = "0.1.0"


def run(*cmd: str, **kw) -> subprocess.CompletedProcess:
    cp = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, **kw)
    assert cp.returncode == 0, f"`{' '.join(cmd)}` failed:\n{cp.stdout.decode(errors='replace')}"
    return cp


def package(revision: int, arch: str = "amd64") -> Path:
    deb = DEB_DIR / f"oxadbd_{VERSION}-{revision}_{arch}.deb"
    if revision > 1:
        # Always made anew from the current build, never an older leftover.
        deb.unlink(missing_ok=True)
    if not deb.exists():
        if revision == 1:
            pytest.fail(f"{deb} is missing: build it with `scripts/package-deb.sh {arch}`")
        run(str(REPO / "scripts" / "package-deb.sh"), "amd64",
            env={**os.environ, "DEB_REVISION": str(revision), "PACKAGES": "oxadbd"})
    assert deb.exists(), deb
    return deb


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_package_contents(arch):
    deb = package(1, arch)
    listing = run("dpkg-deb", "-c", str(deb)).stdout.decode()
    modes = {}
    for line in listing.splitlines():
        fields = line.split()
        modes[fields[-1].lstrip(".")] = fields[0]
    expected = {
        "/usr/bin/oxadbd": "-rwxr-xr-x",
        "/etc/oxadbd/oxadbd.toml": "-rw-r--r--",
        "/etc/oxadbd/adb_keys": "-rw-------",
        "/lib/systemd/system/oxadbd.service": "-rw-r--r--",
        "/lib/systemd/system/oxadbd-usb-gadget.service": "-rw-r--r--",
        "/usr/lib/oxadbd/usb-gadget.sh": "-rwxr-xr-x",
        "/usr/share/doc/oxadbd/README.Debian": "-rw-r--r--",
    }
    for path, mode in expected.items():
        assert modes.get(path) == mode, f"{path}: {modes.get(path)} in\n{listing}"
    fields = run("dpkg-deb", "-f", str(deb), "Package", "Architecture", "Version").stdout.decode()
    assert "Package: oxadbd" in fields and f"Architecture: {arch}" in fields, fields
    info = Path(run("mktemp", "-d").stdout.decode().strip())
    try:
        run("dpkg-deb", "-e", str(deb), str(info))
        conffiles = (info / "conffiles").read_text().split()
        assert sorted(conffiles) == ["/etc/oxadbd/adb_keys", "/etc/oxadbd/oxadbd.toml"]
        for script in ("postinst", "prerm", "postrm"):
            assert "DPKG_ROOT" in (info / script).read_text(), script
    finally:
        shutil.rmtree(info)
    # The binary is static: it runs on any Debian release.
    extracted = Path(run("mktemp", "-d").stdout.decode().strip())
    try:
        run("dpkg-deb", "-x", str(deb), str(extracted))
        run("python3", str(REPO / "scripts" / "elf-static.py"), str(extracted / "usr/bin/oxadbd"))
    finally:
        shutil.rmtree(extracted)


def test_units_verify(tmp_path):
    root = tmp_path / "root"
    run("dpkg-deb", "-x", str(package(1)), str(root))
    units = root / "lib/systemd/system"
    # The units' dependencies (sysinit.target, network-online.target...) are
    # the machine's: copy them beside ours so verify resolves them in the root.
    for unit in Path("/lib/systemd/system").iterdir():
        target = units / unit.name
        if not target.exists() and not unit.is_dir():
            shutil.copy2(unit, target, follow_symlinks=False)
    run("systemd-analyze", "verify", f"--root={root}",
        "/lib/systemd/system/oxadbd.service", "/lib/systemd/system/oxadbd-usb-gadget.service")
    unit = (units / "oxadbd.service").read_text()
    assert "ExecStart=/usr/bin/oxadbd --config /etc/oxadbd/oxadbd.toml" in unit
    assert "Restart=on-failure" in unit and "After=network-online.target" in unit
    # The push journal's directory, and room for the stop grace (5 s + 2 s).
    assert "StateDirectory=oxadbd" in unit and "TimeoutStopSec=15s" in unit


def dpkg_root(root: Path, deb: Path) -> None:
    run("dpkg", f"--root={root}", "--force-script-chrootless", "--force-not-root", "-i", str(deb))


def installed_daemon(root: Path, workdir: Path, adb_server):
    exe = root / "usr/bin/oxadbd"
    d = _new_daemon(exe, workdir, args=("--config", str(root / "etc/oxadbd/oxadbd.toml"),
                                        "--keys", str(root / "etc/oxadbd/adb_keys")))
    adb_server.connect(d.serial)
    return d


def test_install_serves_adb_and_upgrade_keeps_config_and_keys(tmp_path, adb_server):
    root = tmp_path / "root"
    admin = root / "var/lib/dpkg"
    (admin / "info").mkdir(parents=True)
    (admin / "updates").mkdir()
    (admin / "status").touch()
    (admin / "available").touch()
    dpkg_root(root, package(1))

    keys = root / "etc/oxadbd/adb_keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    d = installed_daemon(root, tmp_path / "first", adb_server)
    try:
        r = adb_server.run("shell", "echo installed; exit 5", serial=d.serial)
        assert r.rc == 5 and r.out.strip() == "installed", r
    finally:
        adb_server.disconnect(d.serial)
        _drop_daemon(d)

    config = root / "etc/oxadbd/oxadbd.toml"
    config.write_text(config.read_text() + '\nproduct-model = "keptonupgrade"\n')
    key_line = "QAAAAfakekeyforthetest= owner@board\n"
    keys.write_text(key_line)
    dpkg_root(root, package(2))
    status = (admin / "status").read_text()
    assert f"Version: {VERSION}-2" in status, status
    assert 'product-model = "keptonupgrade"' in config.read_text()
    assert keys.read_text() == key_line
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600

    d = installed_daemon(root, tmp_path / "second", adb_server)
    try:
        listing = adb_server.run("devices", "-l").out
        line = next((l for l in listing.splitlines() if l.startswith(d.serial)), "")
        assert "model:keptonupgrade" in line, listing
    finally:
        adb_server.disconnect(d.serial)
        _drop_daemon(d)
