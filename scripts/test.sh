#!/usr/bin/env bash
# The test command of oxadb: ./scripts/test.sh
#
# On a fresh Debian 12 machine (run as root, or with sudo available) it
#   1. installs Debian's `adb` package (Google adb 29.0.6) if adb is missing,
#   2. installs a private copy of Google adb 34.0.5 (Debian 13's adb package,
#      pinned) under target/peers/adb-34 with scripts/install-adb34.sh, for
#      the compression and burst-mode interop tests,
#   3. installs the pinned Python test dependencies (pytest, adb-shell, adbutils),
#      and e2fsprogs and mount (mkfs.ext4, losetup) if missing,
#   4. installs Node.js and npm (Debian's nodejs and npm packages) if missing,
#      and the pinned Tango client and its adb server client (npm ci in
#      tests/interop/tango),
#   5. builds the workspace (release),
#   6. checks formatting,
#   7. runs clippy with warnings denied,
#   8. runs the Rust tests,
#   9. builds the static board binaries (aarch64: oxadbd and oxadb, armv7:
#      oxadbd; for both, the minimal oxadbd without TLS, pairing and mDNS)
#      with scripts/release.sh (pinned Zig from PyPI and
#      cargo-zigbuild into ~/.cache/oxadb-tools) and the amd64 and arm64 Debian packages with
#      scripts/package-deb.sh (pinned cargo-deb), installing Debian's
#      qemu-user-static (and systemd, for systemd-analyze) if missing,
#  10. runs the interop suite (tests/interop) of stock adb 29 and 34, Tango
#      and adb-shell against oxadbd, the static daemons under qemu-user and
#      the package installed into a scratch root,
#  11. fuzzes the packet, banner, sync, shell-v2, service-name, smart-socket and
#      oxadb-delta message parsers, and the host's reading of a device (its
#      connection engine, sync client and shell output reader), with cargo-fuzz
#      (scripts/fuzz.sh: pinned cargo-fuzz into target/tools, g++ if missing),
#      each target for FUZZ_SECONDS over a copy of its seed corpus in fuzz/corpus,
#  12. installs iperf3 and ping (Debian's iperf3 and iputils-ping) if missing
#      and runs a short `oxadb-bench emulated` (two network namespaces of its
#      own, a 10 ms link of 64 KiB offloaded frames, of plain 1500-byte frames
#      and of frames released in clumps): the link emulator, its cleanup and
#      the clients through it,
#  13. runs the USB tests in a qemu VM (scripts/usb-vm.sh: installs qemu,
#      busybox-static and kmod, fetches Debian's kernel package without
#      installing it) where dummy_hcd joins oxadbd's FunctionFS gadget to
#      Google adb 29 and oxadb as USB hosts (tests/usb/suite.sh), then the
#      power-cut test (tests/usb/powercut.sh: three boots on virtio disks,
#      ext4 and xfs; xfsprogs installed if missing).
# Any failure stops the run with a non-zero exit status. Nothing is skipped:
# a missing peer (adb, python, node, npm, cargo, oxadbd) is an error.
#
# Options (environment):
#   PYTEST_ARGS   extra arguments for pytest (e.g. "-k shell -x")
#   FUZZ_SECONDS  seconds each fuzz target runs (30 here; fuzz.sh's own default is 60)

set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"

ADB_WANT="29.0.6"
START=$SECONDS
PHASE=0
PHASES=13

phase() {
    PHASE=$((PHASE + 1))
    printf '\n==> [%d/%d] %s   (t=%ds)\n' "$PHASE" "$PHASES" "$*" "$((SECONDS - START))"
}

trap 'rc=$?; if [ $rc -ne 0 ]; then printf "\nFAILED in phase %d (exit %d) after %ds\n" "$PHASE" "$rc" "$((SECONDS - START))" >&2; fi' EXIT

DIE_PREFIX=ERROR
# shellcheck source=scripts/lib.sh
. "${REPO}/scripts/lib.sh"

# --------------------------------------------------------------------------------
phase "Google adb ${ADB_WANT} (Debian package adb)"
if ! command -v adb >/dev/null 2>&1; then
    echo "adb not found: installing Debian's adb package"
    apt_install adb
fi
command -v adb >/dev/null 2>&1 || die "adb is still not on PATH after installing the adb package"
# test_durability.py traces the daemon's fsync/rename calls.
if ! command -v strace >/dev/null 2>&1; then
    echo "strace not found: installing Debian's strace package"
    apt_install strace
fi
command -v strace >/dev/null 2>&1 || die "strace is still not on PATH after installing the strace package"
# test_delta.py builds ext4 images (mkfs.ext4 -d, e2fsprogs) and writes
# them onto loop devices (losetup, mount).
if ! command -v mkfs.ext4 >/dev/null 2>&1 || ! command -v losetup >/dev/null 2>&1; then
    echo "mkfs.ext4 or losetup not found: installing Debian's e2fsprogs and mount packages"
    apt_install e2fsprogs mount
fi
command -v mkfs.ext4 >/dev/null 2>&1 || die "mkfs.ext4 is still not on PATH after installing e2fsprogs"
command -v losetup >/dev/null 2>&1 || die "losetup is still not on PATH after installing mount"
# test_disk_full.py mounts tests/interop/faultfs.py through fusepy, which loads libfuse2.
# grep reads the whole list (no -q): with pipefail, `grep -q` quitting at the first
# match can kill ldconfig with SIGPIPE and fail the pipeline although the library is there.
if ! ldconfig -p | grep 'libfuse\.so\.2' >/dev/null; then
    echo "libfuse.so.2 not found: installing Debian's libfuse2 package"
    apt_install libfuse2
fi
ldconfig -p | grep 'libfuse\.so\.2' >/dev/null || die "libfuse.so.2 is still missing after installing the libfuse2 package"
[ -c /dev/fuse ] || die "/dev/fuse is missing (needed by test_disk_full.py's FUSE filesystem)"
ADB_VERSION_TEXT="$(adb version 2>&1)" || die "\`adb version\` failed: ${ADB_VERSION_TEXT}"
echo "${ADB_VERSION_TEXT}"
case "${ADB_VERSION_TEXT}" in
    *"${ADB_WANT}"*) ;;
    *) die "the interop suite needs adb ${ADB_WANT} (Debian 12's adb package); \`adb version\` says: ${ADB_VERSION_TEXT}" ;;
esac
for tool in mount umount chattr; do
    command -v "$tool" >/dev/null 2>&1 || die "\`$tool\` is missing (needed by the read-only destination tests)"
done

# --------------------------------------------------------------------------------
phase "Google adb 34.0.5 (Debian 13 package, private copy in target/peers/adb-34)"
ADB34="${REPO}/target/peers/adb-34/adb"
if ! { [ -x "${ADB34}" ] && "${ADB34}" version 2>/dev/null | grep -q "Version 34.0.5"; }; then
    scripts/install-adb34.sh "${REPO}/target/peers/adb-34" ||
        die "installing Google adb 34.0.5 (scripts/install-adb34.sh) failed"
fi
ADB34_VERSION_TEXT="$("${ADB34}" version 2>&1)" || die "\`${ADB34} version\` failed: ${ADB34_VERSION_TEXT}"
echo "${ADB34_VERSION_TEXT}"
case "${ADB34_VERSION_TEXT}" in
    *"Version 34.0.5"*) ;;
    *) die "${ADB34} is not adb 34.0.5: ${ADB34_VERSION_TEXT}" ;;
esac
export OXADB_ADB34="${ADB34}"

# --------------------------------------------------------------------------------
phase "Python test dependencies (tests/requirements.txt)"
command -v python3 >/dev/null 2>&1 || die "python3 is missing"
python3 -m pip --version >/dev/null 2>&1 || die "pip is missing for python3 (python3 -m pip)"
PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    python3 -m pip install -q -r tests/requirements.txt
python3 -m pytest --version
# test_server_clients.py drives oxadb server with adbutils.
python3 -c "import adbutils" || die "adbutils is not importable after installing tests/requirements.txt"

# --------------------------------------------------------------------------------
phase "Node.js and Tango (npm ci in tests/interop/tango)"
NODE_PKGS=()
command -v node >/dev/null 2>&1 || NODE_PKGS+=(nodejs)
command -v npm >/dev/null 2>&1 || NODE_PKGS+=(npm)
if [ "${#NODE_PKGS[@]}" -gt 0 ]; then
    echo "missing: ${NODE_PKGS[*]}: installing Debian's ${NODE_PKGS[*]} package(s)"
    apt_install "${NODE_PKGS[@]}"
fi
command -v node >/dev/null 2>&1 || die "node is still not on PATH after installing the nodejs package"
command -v npm >/dev/null 2>&1 || die "npm is still not on PATH after installing the npm package"
NODE_VERSION_TEXT="$(node --version 2>&1)" || die "\`node --version\` failed: ${NODE_VERSION_TEXT}"
NODE_MAJOR="${NODE_VERSION_TEXT#v}"
NODE_MAJOR="${NODE_MAJOR%%.*}"
case "${NODE_MAJOR}" in
    '' | *[!0-9]*) die "cannot parse \`node --version\`: ${NODE_VERSION_TEXT}" ;;
esac
[ "${NODE_MAJOR}" -ge 18 ] || die "Tango needs Node.js >= 18 (Debian 12 has 18); \`node --version\` says ${NODE_VERSION_TEXT}"
echo "node ${NODE_VERSION_TEXT}, npm $(npm --version)"
(cd tests/interop/tango && npm ci --no-audit --no-fund) ||
    die "\`npm ci\` failed in tests/interop/tango (pinned in its package-lock.json)"
# test_server_clients.py drives oxadb server with Tango's server client.
[ -f tests/interop/tango/node_modules/@yume-chan/adb-server-node-tcp/package.json ] ||
    die "@yume-chan/adb-server-node-tcp is missing after \`npm ci\` in tests/interop/tango"

# --------------------------------------------------------------------------------
phase "cargo build --release --workspace"
command -v cargo >/dev/null 2>&1 || die "cargo is missing"
cargo build --release --workspace
[ -x target/release/oxadbd ] || die "target/release/oxadbd was not built"

# --------------------------------------------------------------------------------
phase "cargo fmt --all -- --check"
cargo fmt --all -- --check

# --------------------------------------------------------------------------------
phase "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# --------------------------------------------------------------------------------
phase "cargo test --workspace --release"
cargo test --workspace --release

# --------------------------------------------------------------------------------
phase "board builds: static aarch64 and armv7 binaries (scripts/release.sh), the amd64 and arm64 .debs (scripts/package-deb.sh)"
BOARD_PKGS=()
command -v qemu-aarch64-static >/dev/null 2>&1 || BOARD_PKGS+=(qemu-user-static)
command -v systemd-analyze >/dev/null 2>&1 || BOARD_PKGS+=(systemd)
if [ "${#BOARD_PKGS[@]}" -gt 0 ]; then
    echo "missing: ${BOARD_PKGS[*]}: installing Debian's package(s)"
    apt_install "${BOARD_PKGS[@]}"
fi
for tool in qemu-aarch64-static qemu-arm-static systemd-analyze dpkg-deb; do
    command -v "$tool" >/dev/null 2>&1 || die "\`$tool\` is still missing (test_static_qemu.py and test_deb.py need it)"
done
# What the interop suite runs under qemu (test_static_qemu.py): both daemons,
# and the aarch64 host CLI; the amd64 package wraps the x86_64 daemon. The
# minimal daemons are for test_static_size.py's limits (and one run under
# qemu); each adds one link of oxadbd to the phase.
VARIANTS="default minimal" scripts/release.sh aarch64-unknown-linux-musl || die "the static aarch64 build failed"
VARIANTS="default minimal" PACKAGES=oxadbd scripts/release.sh armv7-unknown-linux-musleabihf || die "the static armv7 build failed"
scripts/package-deb.sh arm64 || die "building the arm64 package failed"
# The amd64 package needs only the x86_64 daemon (test_deb.py builds its
# second revision with the same PACKAGES).
PACKAGES=oxadbd scripts/package-deb.sh amd64 || die "building the amd64 package failed"

# --------------------------------------------------------------------------------
phase "interop: stock adb ${ADB_WANT} and 34.0.5, Tango and adb-shell against oxadbd (pytest tests/interop)"
export OXADBD="${REPO}/target/release/oxadbd"
# test_auth.py runs a daemon on 198.18.0.1 in a namespace of its own (and the
# emulated-link phase needs namespaces too): `ip` comes with iproute2.
if ! command -v ip >/dev/null 2>&1; then
    echo "missing: ip: installing Debian's iproute2"
    apt_install iproute2
fi
command -v ip >/dev/null 2>&1 || die "ip is still missing after installing iproute2"
# shellcheck disable=SC2086
python3 -m pytest tests/interop -v ${PYTEST_ARGS:-}

# --------------------------------------------------------------------------------
# 30 s per target keeps the whole suite under 15 minutes with the USB VM;
# longer runs: FUZZ_SECONDS=600 bash scripts/fuzz.sh (docs/fuzzing.md).
export FUZZ_SECONDS="${FUZZ_SECONDS:-30}"
phase "fuzz: 10 cargo-fuzz targets, ${FUZZ_SECONDS} s each (scripts/fuzz.sh)"
bash scripts/fuzz.sh

# --------------------------------------------------------------------------------
phase "emulated links: oxadb-bench emulated, 16 MiB at 10 ms over offloaded, plain 1500-byte and clumped frames (namespaces of its own)"
EMU_PKGS=()
command -v iperf3 >/dev/null 2>&1 || EMU_PKGS+=(iperf3)
command -v ping >/dev/null 2>&1 || EMU_PKGS+=(iputils-ping)
if [ "${#EMU_PKGS[@]}" -gt 0 ]; then
    echo "missing: ${EMU_PKGS[*]}: installing Debian's package(s)"
    apt_install "${EMU_PKGS[@]}"
fi
# Namespaces of other runs on this machine are not ours to judge: compare counts.
EMU_NS_BEFORE="$(ip netns list | grep -c '^oxemu-' || true)"
EMU_OUT="$(as_root target/release/oxadb-bench emulated --size 16M --rtts 10 \
    --clients iperf3,adb,oxadb-classic,oxadb-adaptive --small-clients oxadb-adaptive)" ||
    die "oxadb-bench emulated failed"
printf '%s\n' "${EMU_OUT}" | grep -A 14 '^### .* link, round trip'
# Every link kind ran; the two that release frames one by one keep the round trip.
for link in Offload Plain Clumped; do
    grep -q "^### ${link} link, round trip 10 ms" <<<"${EMU_OUT}" ||
        die "oxadb-bench emulated printed no table for the ${link} link"
done
[ "$(printf '%s\n' "${EMU_OUT}" | grep -c '^Ping .*: within 10%')" -eq 2 ] ||
    die "the offload and plain links' ping round trips are not both within 10% of 10 ms"
if [ "$(ip netns list | grep -c '^oxemu-' || true)" -gt "${EMU_NS_BEFORE}" ]; then
    die "oxadb-bench emulated left network namespaces behind: $(ip netns list)"
fi

# --------------------------------------------------------------------------------
phase "USB: oxadbd as a FunctionFS gadget, adb 29 and oxadb (and oxadb server) as hosts, over dummy_hcd in a qemu VM (tests/usb/suite.sh); power cut after pushes (tests/usb/powercut.sh)"
as_root bash scripts/usb-vm.sh prepare
# The suite took 290 s (boot included) under TCG on a busy 2-core machine
# before server-usb.sh (about 100 s more) and hostile-usb.sh (about 65 s
# more), past usb-vm.sh's default of 300 s.
as_root env USB_VM_TIMEOUT="${USB_VM_TIMEOUT:-600}" bash scripts/usb-vm.sh run tests/usb/suite.sh || die "the USB tests failed in the VM (tests/usb/suite.sh; logs in target/usb-vm)"
# Pushed files after a power cut, per durability level: three boots of about
# 60 s together on an idle 2-core machine (each boot has its own limit).
as_root env POWERCUT_TIMEOUT="${POWERCUT_TIMEOUT:-180}" bash tests/usb/powercut.sh || die "the power-cut test failed (tests/usb/powercut.sh; results in target/usb-vm/out/powercut)"

printf '\nAll %d phases passed in %ds\n' "$PHASES" "$((SECONDS - START))"
