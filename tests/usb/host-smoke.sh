#!/usr/bin/env bash
# oxadb as a USB host, inside the VM of scripts/usb-vm.sh, against an oxadbd
# reached through tests/usb/ffs_bridge.py (a FunctionFS ADB function that
# relays to oxadbd over loopback TCP, sending as adbd does: header, then
# payload, never a zero-length packet):
#
#   cargo build --release
#   scripts/usb-vm.sh run tests/usb/host-smoke.sh [SPEED...]
#
# SPEED is full, high or super (default: all three). For each:
#   1. `oxadb devices -l` lists the gadget's serial as `device`;
#   2. `oxadb -s SERIAL shell echo hi`, and without -s (the only USB device);
#   3. push and pull of files whose sizes sit on packet boundaries, compared;
#      the bridge must have logged no FRAMING error (a missing ZLP);
#   4. with Google's adb server holding the interface, oxadb fails saying so;
#   5. unbinding the gadget in the middle of a pull fails the pull within a
#      few seconds, naming the device, and leaves no file behind.
# Logs go to $USB_VM_OUT/host-smoke/<speed>/. Prints PASS or FAIL per speed
# and overall; exits 0 only if all passed.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=tests/usb/lib.sh
. "${REPO}/tests/usb/lib.sh"
GADGET_SH="${REPO}/scripts/usb-gadget.sh"
BRIDGE="${REPO}/tests/usb/ffs_bridge.py"
OXADB="${REPO}/target/release/oxadb"
OXADBD="${REPO}/target/release/oxadbd"
FFS_DIR=/dev/usb-ffs/adb
SERIAL=oxadbhost0001
PORT=5599
OUT="${USB_VM_OUT:-/tmp/usb-vm-out}/host-smoke"
export HOME=/tmp/home
unset ANDROID_SERIAL

die() {
    printf 'host-smoke: %s\n' "$*" >&2
    echo "FAIL"
    exit 1
}

[ "${USB_VM:-}" = 1 ] || die "run this inside the VM: scripts/usb-vm.sh run tests/usb/host-smoke.sh"
for exe in "$OXADB" "$OXADBD"; do
    [ -x "$exe" ] || die "$exe is missing: cargo build --release"
done
mkdir -p "$HOME"

BRIDGE_PID=""
DAEMON_PID=""
cleanup_speed() {
    adb kill-server >/dev/null 2>&1 || true
    if [ -n "$BRIDGE_PID" ]; then
        "$GADGET_SH" unbind >/dev/null 2>&1 || true
        kill "$BRIDGE_PID" 2>/dev/null || true
        wait "$BRIDGE_PID" 2>/dev/null || true
        BRIDGE_PID=""
    fi
    if [ -n "$DAEMON_PID" ]; then
        kill "$DAEMON_PID" 2>/dev/null || true
        wait "$DAEMON_PID" 2>/dev/null || true
        DAEMON_PID=""
    fi
    "$GADGET_SH" teardown >/dev/null || echo "host-smoke: teardown failed"
}
trap cleanup_speed EXIT

check() {
    # check WHAT COMMAND...: runs it, says ok or FAILED with its output.
    local what="$1"
    shift
    local output
    if output="$("$@" 2>&1)"; then
        echo "  ok: ${what}"
        return 0
    fi
    echo "  FAILED: ${what}"
    printf '    %s\n' "${output//$'\n'/$'\n'    }"
    return 1
}

wait_listed() {
    local i
    for ((i = 0; i < 100; i++)); do
        "$OXADB" devices 2>/dev/null | grep -q "^${SERIAL}"$'\t' && return 0
        sleep 0.1
    done
    return 1
}

run_speed() {
    local speed="$1" dir ok=1
    dir="${OUT}/${speed}"
    mkdir -p "$dir"
    load_dummy_hcd "$speed" || return 1

    "$OXADBD" --listen "127.0.0.1:${PORT}" --product-model "USB rig" >"$dir/oxadbd.log" 2>&1 &
    DAEMON_PID=$!
    "$GADGET_SH" setup --serial "$SERIAL" --ffs-dir "$FFS_DIR" >/dev/null || return 1
    python3 "$BRIDGE" "$FFS_DIR" "127.0.0.1:${PORT}" >"$dir/bridge.log" 2>&1 &
    BRIDGE_PID=$!
    local i
    for ((i = 0; i < 50; i++)); do
        grep -q READY "$dir/bridge.log" 2>/dev/null && break
        sleep 0.1
    done
    grep -q READY "$dir/bridge.log" || { echo "the bridge did not start:"; cat "$dir/bridge.log"; return 1; }
    "$GADGET_SH" bind >/dev/null || return 1
    wait_listed || { echo "oxadb devices never listed ${SERIAL}"; "$OXADB" -v devices -l; return 1; }

    local listed
    listed="$("$OXADB" devices -l 2>&1)"
    echo "$listed" >"$dir/devices.txt"
    if grep -q "^${SERIAL} .*device usb:.* model:USB_rig" <<<"$listed"; then
        echo "  ok: devices -l: $(grep "^${SERIAL}" <<<"$listed")"
    else
        echo "  FAILED: devices -l:"
        printf '    %s\n' "${listed//$'\n'/$'\n'    }"
        ok=0
    fi
    local got
    got="$("$OXADB" -s "$SERIAL" shell echo hi 2>&1)"
    [ "$got" = hi ] && echo "  ok: -s ${SERIAL} shell echo hi" || { echo "  FAILED: shell echo hi: ${got}"; ok=0; }
    got="$("$OXADB" shell echo only 2>&1)"
    [ "$got" = only ] && echo "  ok: shell without -s takes the only USB device" || { echo "  FAILED: shell without -s: ${got}"; ok=0; }
    local path
    path="$(grep "^${SERIAL}" <<<"$listed" | grep -o 'usb:[0-9.-]*' | head -n1)"
    got="$("$OXADB" -s "$path" shell echo bypath 2>&1)"
    [ "$got" = bypath ] && echo "  ok: -s ${path}" || { echo "  FAILED: -s ${path}: ${got}"; ok=0; }

    # Sizes on and around every bulk packet size and the 1 MiB payload.
    local files=/tmp/files size
    rm -rf "$files"
    mkdir -p "$files/remote" "$files/back"
    for size in 0 1 24 63 64 65 511 512 513 1024 16384 65536 1048576 1048600 5242880; do
        head -c "$size" /dev/urandom >"$files/f$size"
    done
    if check "push of 15 files" "$OXADB" -s "$SERIAL" push "$files"/f* "$files/remote/" &&
        check "pull of them back" "$OXADB" -s "$SERIAL" pull "$files/remote/." "$files/back/"; then
        for size in 0 1 24 63 64 65 511 512 513 1024 16384 65536 1048576 1048600 5242880; do
            cmp -s "$files/f$size" "$files/back/f$size" || { echo "  FAILED: f$size differs after push and pull"; ok=0; }
        done
    else
        ok=0
    fi
    if grep -q FRAMING "$dir/bridge.log"; then
        echo "  FAILED: the device saw reads cross packet boundaries:"
        grep FRAMING "$dir/bridge.log" | head -5 | sed 's/^/    /'
        ok=0
    else
        echo "  ok: every device read ended with its header or payload (ZLPs where needed)"
    fi

    # Another program holding the interface.
    rm -rf /tmp/h && mkdir -p /tmp/h
    HOME=/tmp/h adb start-server >/dev/null 2>&1
    for ((i = 0; i < 50; i++)); do
        HOME=/tmp/h adb devices 2>/dev/null | grep -q "$SERIAL" && break
        sleep 0.2
    done
    # oxadb goes through the server that answers on 5037, which holds the
    # device; --direct tries the interface itself and is told who has it.
    got="$("$OXADB" -s "$SERIAL" shell echo hi 2>&1)"
    if [ "$got" = hi ]; then
        echo "  ok: with adb's server running, through it: ${got}"
    else
        echo "  FAILED: with adb's server running, through it: ${got}"
        ok=0
    fi
    got="$("$OXADB" --direct -s "$SERIAL" shell echo hi 2>&1)"
    if grep -q "claimed by another program" <<<"$got"; then
        echo "  ok: with adb's server running, --direct: ${got}"
    else
        echo "  FAILED: with adb's server running, --direct: ${got}"
        ok=0
    fi
    HOME=/tmp/h adb kill-server >/dev/null 2>&1
    sleep 0.5

    # Unplug in the middle of a pull (a slow bus gets a smaller file).
    local big=64000000
    [ "$speed" = full ] && big=4000000
    head -c "$big" /dev/zero >"$files/remote/big"
    rm -rf "$files/unplug" && mkdir -p "$files/unplug"
    "$OXADB" -s "$SERIAL" pull "$files/remote/big" "$files/unplug/" >"$dir/unplug.txt" 2>&1 &
    local pull_pid=$! start=$SECONDS
    sleep 0.5
    "$GADGET_SH" unbind >/dev/null
    local rc=0
    for ((i = 0; i < 150; i++)); do
        kill -0 "$pull_pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pull_pid" 2>/dev/null; then
        echo "  FAILED: the pull still runs 15 s after the unplug"
        kill "$pull_pid"
        ok=0
    else
        wait "$pull_pid"
        rc=$?
        got="$(cat "$dir/unplug.txt")"
        if [ "$rc" != 0 ] && grep -q "$SERIAL" <<<"$got" && [ -z "$(ls -A "$files/unplug")" ]; then
            echo "  ok: unplug mid-pull: exit ${rc} after $((SECONDS - start)) s, no file left: ${got}"
        else
            echo "  FAILED: unplug mid-pull: exit ${rc}, left: $(ls -A "$files/unplug"): ${got}"
            ok=0
        fi
    fi
    cleanup_speed
    [ "$ok" = 1 ]
}

run_speeds "full high super" "$@"
