#!/usr/bin/env bash
# Installs a private copy of Google adb 34.0.5 (Debian 13's `adb` package,
# version 1:34.0.5-12) into DIR, for the compression interop tests: it is the
# reference implementation of SND2/RCV2 with brotli, lz4 and zstd, which
# Debian 12's adb 29 predates.
#
#   scripts/install-adb34.sh DIR      ->  DIR/adb (a wrapper), DIR/root/...
#
# Nothing is installed system-wide except Debian 12's `patchelf` if missing:
# apt downloads the package and its dependency closure from the Debian 13
# (trixie) archive with a private state directory, verifying the archive
# signature with the keys Debian 12's debian-archive-keyring ships, and the
# packages are unpacked under DIR/root. adb runs on trixie's own glibc and
# libraries: its interpreter is set to DIR/root's loader and the wrapper sets
# LD_LIBRARY_PATH. (adb re-executes /proc/self/exe to start its server, so the
# loader cannot simply be run in front of it.)
set -euo pipefail

ADB34_PACKAGE_VERSION="1:34.0.5-12"
DIR="${1:?usage: install-adb34.sh DIR}"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

DIE_PREFIX=install-adb34
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v apt-get >/dev/null 2>&1 || die "apt-get is missing (this needs a Debian machine)"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is missing"
[ -r "$KEYRING" ] || die "$KEYRING is missing (Debian package debian-archive-keyring)"
if ! command -v patchelf >/dev/null 2>&1; then
    echo "patchelf not found: installing Debian's patchelf package"
    apt_install patchelf
fi

rm -rf "$DIR"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
APTDIR="$DIR/apt"
mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial" "$APTDIR/preferences.d" "$DIR/root"
echo "deb [signed-by=$KEYRING] http://deb.debian.org/debian trixie main" >"$APTDIR/sources.list"
: >"$APTDIR/status"
APT_OPTS=(
    -o "Dir::State::Lists=$APTDIR/lists"
    -o "Dir::State::status=$APTDIR/status"
    -o "Dir::Etc::SourceList=$APTDIR/sources.list"
    -o "Dir::Etc::SourceParts=$APTDIR/sources.list.d"
    -o "Dir::Etc::Preferences=$APTDIR/preferences"
    -o "Dir::Etc::PreferencesParts=$APTDIR/preferences.d"
    -o "Dir::Cache=$APTDIR/cache"
    -o "APT::Architecture=amd64"
    -o "APT::Architectures=amd64"
    -o "APT::Install-Recommends=false"
    -o "Debug::NoLocking=1"
)
apt-get "${APT_OPTS[@]}" update ||
    die "apt-get update of the Debian 13 (trixie) index failed"
apt-get "${APT_OPTS[@]}" install --download-only -y "adb=${ADB34_PACKAGE_VERSION}" ||
    die "downloading adb=${ADB34_PACKAGE_VERSION} and its dependencies from trixie failed"
for deb in "$APTDIR"/cache/archives/*.deb; do
    dpkg-deb -x "$deb" "$DIR/root"
done

LIBS="$DIR/root/usr/lib/x86_64-linux-gnu"
BIN="$DIR/root/usr/lib/android-sdk/platform-tools/adb"
[ -x "$BIN" ] || die "the adb package did not contain $BIN"
[ -x "$LIBS/ld-linux-x86-64.so.2" ] || die "trixie's libc6 did not contain $LIBS/ld-linux-x86-64.so.2"
patchelf --set-interpreter "$LIBS/ld-linux-x86-64.so.2" "$BIN"
cat >"$DIR/adb" <<EOF
#!/bin/sh
# Google adb ${ADB34_PACKAGE_VERSION} from Debian 13, on its own libraries (see scripts/install-adb34.sh).
LD_LIBRARY_PATH="$LIBS:$LIBS/android" exec "$BIN" "\$@"
EOF
chmod +x "$DIR/adb"
rm -rf "$APTDIR"
"$DIR/adb" version
