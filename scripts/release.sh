#!/usr/bin/env bash
# Static release builds of oxadbd and oxadb for boards:
#
#   ./scripts/release.sh                 # all three targets
#   ./scripts/release.sh aarch64-unknown-linux-musl armv7-unknown-linux-musleabihf
#   PACKAGES=oxadbd ./scripts/release.sh armv7-unknown-linux-musleabihf
#   VARIANTS="default minimal" ./scripts/release.sh aarch64-unknown-linux-musl
#
# Targets: x86_64-unknown-linux-musl, aarch64-unknown-linux-musl and
# armv7-unknown-linux-musleabihf (hard float). Every binary is fully static
# (musl, no dynamic loader), built with the `dist` profile (Cargo.toml: size
# over speed outside the compressors, LTO, stripped) and linked by zig, which
# also cross-compiles the C in zstd-sys. Output: target/static/TARGET/NAME,
# each printed with its stripped size.
#
# VARIANTS (default: "default") lists the oxadbd builds to make: `default`,
# every feature (target/static/TARGET/oxadbd), and `minimal`, built with
# `--no-default-features`: no TLS, pairing or mDNS, for boards with little
# flash (target/static/TARGET/oxadbd-minimal; docs/architecture.md, "Cargo
# features"). oxadb has one variant, built with `default`.
#
# On a fresh machine it installs what it needs: Zig from
# PyPI (ziglang, pinned) and cargo-zigbuild from crates.io (pinned), both
# into ~/.cache/oxadb-tools (OXADB_TOOLS), and the
# `rust-src` component: the standard library is built from source for every
# target (`-Zbuild-std`, allowed on stable by RUSTC_BOOTSTRAP for this build
# only; rustup has no prebuilt armv7 musl std on some mirrors anyway), with
# the dist profile and std's `optimize_for_size`, and without its `backtrace`
# feature: a stripped binary has no symbols to name frames with. Built so,
# std's code in the daemon is 0.19 MiB smaller, the symbolizer (gimli,
# addr2line) gone (docs/benchmarks.md, "Static board builds: size and idle
# memory"). A panic still prints its message and location, and still
# unwinds only its own task.

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
read -r -a ASKED_VARIANTS <<<"${VARIANTS:-default}"
for variant in "${ASKED_VARIANTS[@]}"; do
    case "${variant}" in
        default | minimal) ;;
        *) die "unknown variant '${variant}' in VARIANTS (default, minimal)" ;;
    esac
done
# The minimal variant first: cargo leaves the last build in
# target/TARGET/dist/, where package-deb.sh's cargo deb takes oxadbd from.
VARIANTS=()
for variant in minimal default; do
    case " ${ASKED_VARIANTS[*]} " in
        *" ${variant} "*) VARIANTS+=("${variant}") ;;
    esac
done

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

mkdir -p target/static
SUMMARY=()
rustup component list --installed | grep '^rust-src' >/dev/null ||
    rustup component add rust-src || die "rustup component add rust-src failed"
BUILD_STD=(-Zbuild-std=std,panic_unwind -Zbuild-std-features=panic-unwind,optimize_for_size)
for target in "${TARGETS[@]}"; do
    env_name="CARGO_TARGET_$(printf '%s' "${target}" | tr 'a-z-' 'A-Z_')_RUSTFLAGS"
    mkdir -p "target/static/${target}"
    for variant in "${VARIANTS[@]}"; do
        # The minimal variant is oxadbd's alone; its file says which it is.
        if [ "${variant}" = minimal ]; then
            case " ${PACKAGES[*]} " in
                *" oxadbd "*) ;;
                *) continue ;;
            esac
            variant_packages=(oxadbd)
            FEATURE_ARGS=(--no-default-features)
            suffix="-minimal"
        else
            variant_packages=("${PACKAGES[@]}")
            FEATURE_ARGS=()
            suffix=""
        fi
        PACKAGE_ARGS=()
        for package in "${variant_packages[@]}"; do
            PACKAGE_ARGS+=(-p "${package}")
        done
        echo "==> ${target} (${variant}): ${variant_packages[*]}"
        # Without a prebuilt std there are no self-contained musl start files
        # either: Zig links its own musl and crt objects.
        env "${env_name}=-C link-self-contained=no" RUSTC_BOOTSTRAP=1 \
            cargo zigbuild "${BUILD_STD[@]}" --profile dist --target "${target}" \
            "${FEATURE_ARGS[@]}" "${PACKAGE_ARGS[@]}"
        for package in "${variant_packages[@]}"; do
            built="target/${target}/dist/${package}"
            [ -x "${built}" ] || die "${built} was not built"
            out="target/static/${target}/${package}${suffix}"
            cp "${built}" "${out}"
            python3 "${REPO}/scripts/elf-static.py" "${out}" || die "${out} is not a static executable"
            size=$(stat -c %s "${out}")
            SUMMARY+=("$(awk -v f="${out}" -v s="${size}" 'BEGIN { printf "%-62s %9d bytes  %5.2f MiB", f, s, s / 1048576 }')")
        done
    done
done

echo
echo "Static binaries (stripped):"
printf '  %s\n' "${SUMMARY[@]}"
