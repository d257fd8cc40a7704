#!/usr/bin/env bash
# Static release builds of oxadbd and oxadb for boards:
#
#   ./scripts/release.sh                 # all three targets
#   ./scripts/release.sh aarch64-unknown-linux-musl armv7-unknown-linux-musleabihf
#   PACKAGES=oxadbd ./scripts/release.sh armv7-unknown-linux-musleabihf
#
# Targets: x86_64-unknown-linux-musl, aarch64-unknown-linux-musl and
# armv7-unknown-linux-musleabihf (hard float). Every binary is fully static
# (musl, no dynamic loader), built with the `dist` profile (Cargo.toml: size
# over speed outside the compressors, LTO, stripped) and linked by zig, which
# also cross-compiles the C in zstd-sys. Output: target/static/TARGET/NAME,
# each printed with its stripped size.
#
# On a fresh machine it installs what it needs: Zig from
# PyPI (ziglang, pinned) and cargo-zigbuild from crates.io (pinned), both
# into ~/.cache/oxadb-tools (OXADB_TOOLS), and the
# Rust targets with `rustup target add`. Where rustup has no prebuilt
# standard library for a target (armv7 musl on some mirrors), it adds the
# `rust-src` component and builds std from source for that target
# (`-Zbuild-std`, allowed on stable by RUSTC_BOOTSTRAP for this build only).

set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
DIE_PREFIX="release.sh"
# shellcheck source=scripts/lib.sh
. "${REPO}/scripts/lib.sh"

ZIG_VERSION="0.15.2"
ZIGBUILD_VERSION="0.24.1"
# Pinned tools, kept between checkouts (each is checked for its version).
TOOLS="${OXADB_TOOLS:-${XDG_CACHE_HOME:-${HOME}/.cache}/oxadb-tools}"
DEFAULT_TARGETS=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl armv7-unknown-linux-musleabihf)
read -r -a PACKAGES <<<"${PACKAGES:-oxadbd oxadb}"

if [ "$#" -gt 0 ]; then
    TARGETS=("$@")
else
    TARGETS=("${DEFAULT_TARGETS[@]}")
fi
for target in "${TARGETS[@]}"; do
    case " ${DEFAULT_TARGETS[*]} " in
        *" ${target} "*) ;;
        *) die "unknown target '${target}' (one of: ${DEFAULT_TARGETS[*]})" ;;
    esac
done

command -v cargo >/dev/null 2>&1 || die "cargo is missing"
command -v rustup >/dev/null 2>&1 || die "rustup is missing (needed to add the musl targets)"
command -v python3 >/dev/null 2>&1 || die "python3 is missing (Zig comes from PyPI's ziglang package)"

# Zig, from PyPI, in a directory of its own that goes first on PATH.
ZIG_DIR="${TOOLS}/ziglang-${ZIG_VERSION}"
if ! [ -x "${ZIG_DIR}/ziglang/zig" ]; then
    echo "installing ziglang==${ZIG_VERSION} (PyPI) into ${ZIG_DIR}"
    PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
        python3 -m pip install -q --target "${ZIG_DIR}" "ziglang==${ZIG_VERSION}" ||
        die "installing ziglang==${ZIG_VERSION} from PyPI failed"
fi
mkdir -p "${TOOLS}/zig-bin"
ln -sf "${ZIG_DIR}/ziglang/zig" "${TOOLS}/zig-bin/zig"
[ "$("${TOOLS}/zig-bin/zig" version)" = "${ZIG_VERSION}" ] ||
    die "${TOOLS}/zig-bin/zig is not Zig ${ZIG_VERSION}"

ZIGBUILD="${TOOLS}/bin/cargo-zigbuild"
if ! { [ -x "${ZIGBUILD}" ] && "${ZIGBUILD}" --version 2>/dev/null | grep -q " ${ZIGBUILD_VERSION}\$"; }; then
    echo "installing cargo-zigbuild ${ZIGBUILD_VERSION} (crates.io) into ${TOOLS}"
    cargo install --locked --quiet --root "${TOOLS}" --version "${ZIGBUILD_VERSION}" cargo-zigbuild ||
        die "installing cargo-zigbuild ${ZIGBUILD_VERSION} failed"
fi
export PATH="${TOOLS}/zig-bin:${TOOLS}/bin:${PATH}"

PACKAGE_ARGS=()
for package in "${PACKAGES[@]}"; do
    PACKAGE_ARGS+=(-p "${package}")
done

mkdir -p target/static
SUMMARY=()
for target in "${TARGETS[@]}"; do
    echo "==> ${target}: ${PACKAGES[*]}"
    BUILD_STD=()
    if ! rustup target list --installed | grep -qx "${target}"; then
        if ! added="$(rustup target add "${target}" 2>&1)"; then
            echo "rustup has no standard library for ${target} ($(printf '%s\n' "${added}" | grep -m1 '^error' || true)): building it from source (rust-src)"
            rustup component add rust-src || die "rustup component add rust-src failed"
            BUILD_STD=(-Zbuild-std=std,panic_unwind)
        fi
    fi
    env_name="CARGO_TARGET_$(printf '%s' "${target}" | tr 'a-z-' 'A-Z_')_RUSTFLAGS"
    if [ "${#BUILD_STD[@]}" -gt 0 ]; then
        # Without a prebuilt std there are no self-contained musl start files
        # either: Zig links its own musl and crt objects.
        env "${env_name}=-C link-self-contained=no" RUSTC_BOOTSTRAP=1 \
            cargo zigbuild "${BUILD_STD[@]}" --profile dist --target "${target}" "${PACKAGE_ARGS[@]}"
    else
        cargo zigbuild --profile dist --target "${target}" "${PACKAGE_ARGS[@]}"
    fi
    mkdir -p "target/static/${target}"
    for package in "${PACKAGES[@]}"; do
        built="target/${target}/dist/${package}"
        [ -x "${built}" ] || die "${built} was not built"
        out="target/static/${target}/${package}"
        cp "${built}" "${out}"
        python3 "${REPO}/scripts/elf-static.py" "${out}" || die "${out} is not a static executable"
        size=$(stat -c %s "${out}")
        SUMMARY+=("$(awk -v f="${out}" -v s="${size}" 'BEGIN { printf "%-56s %9d bytes  %5.2f MiB", f, s, s / 1048576 }')")
    done
done

echo
echo "Static binaries (stripped):"
printf '  %s\n' "${SUMMARY[@]}"
