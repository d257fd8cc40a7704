#!/usr/bin/env bash
# What each crate adds to the static oxadbd, as scripts/release.sh builds it:
#
#   ./scripts/bloat.sh                                   # aarch64, every default feature
#   ./scripts/bloat.sh aarch64-unknown-linux-musl --no-default-features
#   ./scripts/bloat.sh armv7-unknown-linux-musleabihf -n 40
#
# Runs cargo-bloat (crates.io, pinned, installed into ~/.cache/oxadb-tools
# like release.sh's tools) with `--crates` on the `dist-syms` profile: the
# dist profile with its symbols kept, so the same code as the shipped binary
# (cargo bloat reads symbols; it cannot measure a stripped file). Further
# arguments go to cargo bloat. cargo bloat runs `cargo build`; a wrapper
# named cargo, first on PATH for this run only, turns that into release.sh's
# `cargo zigbuild` with the standard library built from source.
# docs/benchmarks.md, "Static board builds: size and idle memory".

set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
DIE_PREFIX="bloat.sh"
# shellcheck source=scripts/lib.sh
. "${REPO}/scripts/lib.sh"

BLOAT_VERSION="0.12.1"
TOOLS="${OXADB_TOOLS:-${XDG_CACHE_HOME:-${HOME}/.cache}/oxadb-tools}"
TARGET="${1:-aarch64-unknown-linux-musl}"
[ "$#" -gt 0 ] && shift

# release.sh installs Zig and cargo-zigbuild; build nothing but its tools.
[ -x "${TOOLS}/bin/cargo-zigbuild" ] && [ -x "${TOOLS}/zig-bin/zig" ] ||
    die "run scripts/release.sh ${TARGET} once first (it installs Zig and cargo-zigbuild)"
BLOAT="${TOOLS}/bin/cargo-bloat"
if ! { [ -x "${BLOAT}" ] && "${BLOAT}" bloat --version 2>/dev/null | grep -Eq "(^| )${BLOAT_VERSION}\$"; }; then
    echo "installing cargo-bloat ${BLOAT_VERSION} (crates.io) into ${TOOLS}"
    cargo install --locked --quiet --root "${TOOLS}" --version "${BLOAT_VERSION}" cargo-bloat ||
        die "installing cargo-bloat ${BLOAT_VERSION} failed"
fi

SHIM="$(mktemp -d)"
trap 'rm -rf "${SHIM}"' EXIT
REAL_CARGO="$(command -v cargo)"
env_name="CARGO_TARGET_$(printf '%s' "${TARGET}" | tr 'a-z-' 'A-Z_')_RUSTFLAGS"
cat >"${SHIM}/cargo" <<EOF
#!/bin/sh
if [ "\$1" = build ]; then
    shift
    CARGO="${REAL_CARGO}" RUSTC_BOOTSTRAP=1 ${env_name}="-C link-self-contained=no" \\
        exec "${TOOLS}/bin/cargo-zigbuild" zigbuild \\
        -Zbuild-std=std,panic_unwind -Zbuild-std-features=panic-unwind,optimize_for_size "\$@"
fi
exec "${REAL_CARGO}" "\$@"
EOF
chmod +x "${SHIM}/cargo"
export PATH="${SHIM}:${TOOLS}/zig-bin:${TOOLS}/bin:${PATH}"
"${BLOAT}" bloat --profile dist-syms --target "${TARGET}" -p oxadbd --bin oxadbd --crates "$@"
