#!/usr/bin/env bash
# Debian packages of oxadbd, from the static builds of scripts/release.sh:
#
#   ./scripts/package-deb.sh                  # amd64, arm64 and armhf
#   ./scripts/package-deb.sh amd64
#
# Each package holds /usr/bin/oxadbd (static: it runs on any Debian release),
# oxadbd.service (enabled and started on install), oxadbd-usb-gadget.service
# with /usr/lib/oxadbd/usb-gadget.sh (for the board owner to enable), a
# commented /etc/oxadbd/oxadbd.toml and an empty /etc/oxadbd/adb_keys (mode
# 0600), both conffiles. Output: target/deb/oxadbd_VERSION-REVISION_ARCH.deb
# (REVISION: $DEB_REVISION, 1 by default), each printed with its size.
# cargo-deb (crates.io, pinned) goes into ~/.cache/oxadb-tools (OXADB_TOOLS).

set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
DIE_PREFIX="package-deb.sh"
# shellcheck source=scripts/lib.sh
. "${REPO}/scripts/lib.sh"

CARGO_DEB_VERSION="3.8.0"
DEB_REVISION="${DEB_REVISION:-1}"
# Pinned tools, kept between checkouts (each is checked for its version).
TOOLS="${OXADB_TOOLS:-${XDG_CACHE_HOME:-${HOME}/.cache}/oxadb-tools}"

target_of() {
    case "$1" in
        amd64) echo x86_64-unknown-linux-musl ;;
        arm64) echo aarch64-unknown-linux-musl ;;
        armhf) echo armv7-unknown-linux-musleabihf ;;
        *) die "unknown architecture '$1' (amd64, arm64 or armhf)" ;;
    esac
}

if [ "$#" -gt 0 ]; then ARCHES=("$@"); else ARCHES=(amd64 arm64 armhf); fi
for arch in "${ARCHES[@]}"; do target_of "${arch}" >/dev/null; done

CARGO_DEB="${TOOLS}/bin/cargo-deb"
if ! { [ -x "${CARGO_DEB}" ] && "${CARGO_DEB}" --version 2>/dev/null | grep -q "${CARGO_DEB_VERSION}"; }; then
    echo "installing cargo-deb ${CARGO_DEB_VERSION} (crates.io) into ${TOOLS}"
    cargo install --locked --quiet --root "${TOOLS}" --version "${CARGO_DEB_VERSION}" cargo-deb ||
        die "installing cargo-deb ${CARGO_DEB_VERSION} failed"
fi
export PATH="${TOOLS}/bin:${PATH}"

mkdir -p target/deb
BUILT=()
for arch in "${ARCHES[@]}"; do
    target="$(target_of "${arch}")"
    # PACKAGES as the caller's release.sh run had it (both binaries unless
    # set): the same feature set, so a target already built is not rebuilt.
    scripts/release.sh "${target}"
    out="$(cargo deb -p oxadbd --no-build --no-strip --profile dist --target "${target}" \
        --deb-revision "${DEB_REVISION}" --output target/deb 2>&1 | tail -n 1)" ||
        die "cargo deb for ${arch} failed: ${out}"
    [ -f "${out}" ] || die "cargo deb for ${arch} did not report a package: ${out}"
    BUILT+=("$(awk -v f="${out}" -v s="$(stat -c %s "${out}")" 'BEGIN { printf "%-48s %9d bytes", f, s }')")
done

echo
echo "Debian packages:"
printf '  %s\n' "${BUILT[@]}"
