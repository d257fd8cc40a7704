#!/usr/bin/env bash
# Fuzzes the parsers of what a peer sends with cargo-fuzz (libFuzzer): the wire
# formats, and the host's reading of a device (connection engine, sync client,
# shell output): bash scripts/fuzz.sh
#
# Builds the targets of fuzz/ (docs/fuzzing.md says what each asserts) and runs
# each for FUZZ_SECONDS over a copy of its committed seed corpus (fuzz/corpus/
# <target>), made under target/fuzz-runs/ so that the inputs a run finds never
# dirty the repo. A crash, a failed assertion, a hang or running out of memory
# fails the run, naming the target; the input is kept in fuzz/artifacts/<target>/
# and printed.
#
# Needs cargo (stable is enough: RUSTC_BOOTSTRAP=1 lets it take the -Z flags
# cargo-fuzz passes) and a C++ compiler for libFuzzer (Debian's g++ is installed
# if there is none). cargo-fuzz itself is installed from crates.io, pinned, into
# target/tools.
#
# Options (environment):
#   FUZZ_SECONDS  seconds per target (60)
#   FUZZ_TARGETS  the targets to run, space-separated (all of them)
#   FUZZ_JOBS     how many targets run at once (the number of CPUs, at most 4)

set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"

DIE_PREFIX="FUZZ FAILED"
# shellcheck source=scripts/lib.sh
. "${REPO}/scripts/lib.sh"

CARGO_FUZZ_VERSION="0.13.2"
TOOLS="${REPO}/target/tools"
CARGO_FUZZ="${TOOLS}/bin/cargo-fuzz"
BUILD_DIR="${REPO}/target/fuzz"
RUNS="${REPO}/target/fuzz-runs"
TRIPLE="x86_64-unknown-linux-gnu"
SECONDS_EACH="${FUZZ_SECONDS:-60}"
TARGETS="${FUZZ_TARGETS:-packet_header banner sync_request shell_frame service smart_socket delta_message host_connection sync_client shell_output}"
JOBS="${FUZZ_JOBS:-$(nproc)}"
[ "${JOBS}" -le 4 ] || JOBS=4

# Longest input per target: enough for several frames and a v1-size (4 KiB)
# payload; longer inputs only slow the search down.
max_len() {
    case "$1" in
        packet_header | banner) echo 8192 ;;
        # Requests, then a listing entry with the longest name a host takes
        # (4096 bytes) arriving whole.
        sync_client) echo 8192 ;;
        # Dozens of packets and host actions; many shell frames.
        host_connection | shell_output) echo 4096 ;;
        *) echo 4096 ;;
    esac
}

case "${SECONDS_EACH}" in
    '' | *[!0-9]*) die "FUZZ_SECONDS must be a number of seconds, not '${SECONDS_EACH}'" ;;
esac
for target in ${TARGETS}; do
    [ -f "fuzz/fuzz_targets/${target}.rs" ] || die "no fuzz target '${target}' in fuzz/fuzz_targets"
done
command -v cargo >/dev/null 2>&1 || die "cargo is missing"

# ---- tools ---------------------------------------------------------------------
if ! command -v c++ >/dev/null 2>&1; then
    echo "no C++ compiler (libFuzzer is C++): installing Debian's g++"
    apt_install g++
fi
command -v c++ >/dev/null 2>&1 || die "c++ is still missing after installing g++"

if ! "${CARGO_FUZZ}" --version 2>/dev/null | grep -qx "cargo-fuzz ${CARGO_FUZZ_VERSION}"; then
    echo "installing cargo-fuzz ${CARGO_FUZZ_VERSION} into ${TOOLS}"
    CARGO_TARGET_DIR="${REPO}/target/tools-build" \
        cargo install cargo-fuzz --version "${CARGO_FUZZ_VERSION}" --locked --root "${TOOLS}" ||
        die "cargo install cargo-fuzz ${CARGO_FUZZ_VERSION} failed"
fi
"${CARGO_FUZZ}" --version

# AddressSanitizer needs its runtime in the toolchain (rustup ships it with
# stable and nightly alike); without it, fuzz uninstrumented rather than not at all.
SANITIZER=address
if ! compgen -G "$(rustc --print sysroot)/lib/rustlib/${TRIPLE}/lib/librustc-*_rt.asan.a" >/dev/null; then
    echo "warning: this toolchain has no AddressSanitizer runtime: fuzzing with -s none"
    SANITIZER=none
fi

# ---- build -----------------------------------------------------------------------
# One build for all targets (release, with debug assertions and overflow checks);
# the runs below start the binaries directly so several can run at once.
BUILD_START=$SECONDS
RUSTC_BOOTSTRAP=1 "${CARGO_FUZZ}" build --fuzz-dir fuzz --target-dir "${BUILD_DIR}" \
    --sanitizer "${SANITIZER}" ||
    die "building the fuzz targets failed (cargo fuzz build)"
echo "built in $((SECONDS - BUILD_START)) s (sanitizer: ${SANITIZER})"
BIN_DIR="${BUILD_DIR}/${TRIPLE}/release"

# ---- runs ------------------------------------------------------------------------
run_target() {
    local target="$1" dir="${RUNS}/$1"
    rm -rf "${dir}"
    mkdir -p "${dir}/artifacts"
    cp -R "fuzz/corpus/${target}" "${dir}/corpus"
    local rc=0
    "${BIN_DIR}/${target}" "${dir}/corpus" \
        -max_total_time="${SECONDS_EACH}" -max_len="$(max_len "${target}")" \
        -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="${dir}/artifacts/" >"${dir}/log" 2>&1 || rc=$?
    echo "${rc}" >"${dir}/rc"
}

echo "running ${TARGETS// /, } for ${SECONDS_EACH} s each, ${JOBS} at a time (logs in ${RUNS})"
mkdir -p "${RUNS}"
for target in ${TARGETS}; do
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS}" ]; do
        wait -n || true
    done
    run_target "${target}" &
done
wait

FAILED=()
for target in ${TARGETS}; do
    dir="${RUNS}/${target}"
    rc="$(cat "${dir}/rc" 2>/dev/null || echo missing)"
    # libFuzzer's closing line: "#<runs> DONE cov: <edges> ft: <features> corp: ... exec/s: <n> ..."
    done_line="$(grep -E '^#[0-9]+[[:space:]]+DONE' "${dir}/log" | tail -n 1 || true)"
    artifacts=("${dir}"/artifacts/*)
    if [ "${rc}" = 0 ] && [ -n "${done_line}" ] && [ ! -e "${artifacts[0]}" ]; then
        printf '%-15s ok   %s\n' "${target}" "${done_line}"
        continue
    fi
    FAILED+=("${target}")
    printf '\n%-15s FAILED (exit %s); the end of %s:\n' "${target}" "${rc}" "${dir}/log" >&2
    grep -E -A 4 "panicked at|ERROR: libFuzzer|ERROR: AddressSanitizer" "${dir}/log" | head -n 20 >&2 || true
    tail -n 5 "${dir}/log" >&2
    for artifact in "${artifacts[@]}"; do
        [ -e "${artifact}" ] || continue
        mkdir -p "fuzz/artifacts/${target}"
        cp "${artifact}" "fuzz/artifacts/${target}/"
        kept="fuzz/artifacts/${target}/$(basename "${artifact}")"
        printf '\ninput kept in %s (%d bytes); reproduce with\n  %s %s\n' \
            "${kept}" "$(wc -c <"${artifact}")" "${BIN_DIR}/${target}" "${kept}" >&2
        if command -v xxd >/dev/null 2>&1; then
            xxd "${artifact}" | head -n 64 >&2
        else
            od -A x -t x1z "${artifact}" | head -n 64 >&2
        fi
    done
done

[ "${#FAILED[@]}" -eq 0 ] || die "fuzz target(s) ${FAILED[*]} failed: fix the bug, add a unit test beside the code at fault, and move the input into fuzz/corpus/<target>/regress-<what>"
echo "all ${TARGETS// /, } ran clean"
