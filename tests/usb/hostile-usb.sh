#!/usr/bin/env bash
# A USB device that opens streams to its host unasked, inside the VM of
# scripts/usb-vm.sh: tests/interop/hostile_device.py (the scripted device
# of the interop suite) behind tests/usb/ffs_bridge.py, a FunctionFS ADB
# function, so that the host meets it over real bulk endpoints.
#
#   cargo build --release
#   scripts/usb-vm.sh run tests/usb/hostile-usb.sh [SPEED...]
#
# SPEED is full, high or super (default: high). Right after each handshake
# the device opens tcp:, localfilesystem:, localabstract:, localreserved:
# and unknown specs naming endpoints that listen on the host
# (tests/usb/host_endpoints.py). For each speed:
#   1. oxadb directly over USB: every spec is refused (CLSE), nothing
#      connects on the host, a WARN line names the device's serial and the
#      spec, and the device still serves a shell;
#   2. `oxadb server` holding the device: the same, in the server's log,
#      and Google's adb 29 through the server reaches the device; then
#      `adb reverse tcp:9000 tcp:PORT` lets the device open exactly that
#      spec, which reaches the host's TCP endpoint and nothing else.
# Logs go to $USB_VM_OUT/hostile-usb/<speed>/. Prints PASS or FAIL per speed
# and overall; exits 0 only if all passed.
set -uo pipefail
shopt -s extglob

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=tests/usb/lib.sh
. "${REPO}/tests/usb/lib.sh"
GADGET_SH="${REPO}/scripts/usb-gadget.sh"
BRIDGE="${REPO}/tests/usb/ffs_bridge.py"
DEVICE="${REPO}/tests/interop/hostile_device.py"
ENDPOINTS="${REPO}/tests/usb/host_endpoints.py"
OXADB="${REPO}/target/release/oxadb"
FFS_DIR=/dev/usb-ffs/adb
SERIAL=hostile0001
# Private ports (inside the VM, but never adb's 5037 in a test).
DEVICE_PORT=5610
HOST_PORT=5611
SERVER_PORT=5043
SOCKET=/tmp/hostile-host.sock
ABSTRACT=oxadb-hostile-usb
SPECS=("tcp:${HOST_PORT}" "localfilesystem:${SOCKET}" "localabstract:${ABSTRACT}"
    "localreserved:${ABSTRACT}" "tcp:127.0.0.1:${HOST_PORT}" "jdwp:1" "no-such-spec")
OUT="${USB_VM_OUT:-/tmp/usb-vm-out}/hostile-usb"
LIMIT=60
export HOME=/tmp/home NO_COLOR=1
unset ANDROID_SERIAL ADB_USB

die() {
    printf 'hostile-usb: %s\n' "$*" >&2
    echo "FAIL"
    exit 1
}

[ "${USB_VM:-}" = 1 ] || die "run this inside the VM: scripts/usb-vm.sh run tests/usb/hostile-usb.sh"
[ -x "$OXADB" ] || die "$OXADB is missing: cargo build --release"
command -v adb >/dev/null || die "Google adb 29 is missing (scripts/usb-vm.sh prepare installs Debian's adb)"
mkdir -p "$HOME"

DEVICE_PID="" BRIDGE_PID="" ENDPOINTS_PID="" SERVER_PID=""
stop() {
    local pid="$1"
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup_speed() {
    if [ -n "$SERVER_PID" ]; then
        adb -P "$SERVER_PORT" kill-server >/dev/null 2>&1 || true
        stop "$SERVER_PID"
        SERVER_PID=""
    fi
    "$GADGET_SH" unbind >/dev/null 2>&1 || true
    stop "$BRIDGE_PID"
    stop "$DEVICE_PID"
    stop "$ENDPOINTS_PID"
    BRIDGE_PID="" DEVICE_PID="" ENDPOINTS_PID=""
    rm -f "$SOCKET"
    "$GADGET_SH" teardown >/dev/null || echo "hostile-usb: teardown failed"
}
trap cleanup_speed EXIT

OK=1

# The checks read the logs with bash alone: every fork costs about a second
# under TCG on a busy machine.

# has FILE PATTERN: a line of FILE matches the glob PATTERN (whole line).
has() {
    local line
    while IFS= read -r line; do
        # shellcheck disable=SC2053 # PATTERN is a glob on purpose
        [[ $line == $2 ]] && return 0
    done <"$1" 2>/dev/null
    return 1
}

# wait_for FILE PATTERN: until `has FILE PATTERN` (10 s at most).
wait_for() {
    local i
    for ((i = 0; i < 100; i++)); do
        has "$1" "$2" && return 0
        sleep 0.1
    done
    return 1
}

# all_refused WHAT: every spec has a `refused SPEC` line in the device's
# log, none an `accepted` one, and no endpoint accepted a connection.
all_refused() {
    local spec missing=()
    for spec in "${SPECS[@]}"; do
        wait_for "$DIR/device.log" "refused ${spec}" || missing+=("$spec")
    done
    if [ "${#missing[@]}" -eq 0 ]; then pass "$1: every unasked spec refused"; else fail "$1: not refused: ${missing[*]}"; fi
    if has "$DIR/device.log" 'accepted *'; then fail "$1: the host accepted a stream: see $DIR/device.log"; else pass "$1: the host accepted none"; fi
    if has "$DIR/endpoints.log" 'accepted *'; then fail "$1: a host endpoint was reached: see $DIR/endpoints.log"; else pass "$1: no host endpoint reached"; fi
}

# logged WHAT LOG: a WARN line naming the serial and each spec.
logged() {
    local spec missing=()
    for spec in "${SPECS[@]}"; do
        has "$2" "* WARN device{serial=${SERIAL}}: *refusing the device's OPEN* service=${spec}" || missing+=("$spec")
    done
    if [ "${#missing[@]}" -eq 0 ]; then pass "$1: a WARN line with the serial for each spec"; else fail "$1: no WARN line for: ${missing[*]}"; fi
}

# enumerated: until the host's USB stack lists the gadget (10 s at most).
enumerated() {
    local i dev
    for ((i = 0; i < 100; i++)); do
        for dev in /sys/bus/usb/devices/*/serial; do
            rd "$dev"
            [ "$REPLY" = "$SERIAL" ] && return 0
        done
        sleep 0.1
    done
    return 1
}

run_speed() {
    local speed="$1" got
    DIR="${OUT}/${speed}"
    mkdir -p "$DIR"
    OK=1
    load_dummy_hcd "$speed" || return 1

    rm -f "$SOCKET"
    python3 "$ENDPOINTS" "$HOST_PORT" "$SOCKET" "$ABSTRACT" >"$DIR/endpoints.log" 2>&1 &
    ENDPOINTS_PID=$!
    python3 "$DEVICE" open-unasked "$DEVICE_PORT" "${SPECS[@]}" >"$DIR/device.log" 2>&1 &
    DEVICE_PID=$!
    wait_for "$DIR/endpoints.log" "READY*" || { echo "the endpoints did not start: $(cat "$DIR/endpoints.log")"; return 1; }
    wait_for "$DIR/device.log" "READY*" || { echo "the device did not start: $(cat "$DIR/device.log")"; return 1; }
    "$GADGET_SH" setup --serial "$SERIAL" --ffs-dir "$FFS_DIR" >/dev/null || return 1
    python3 "$BRIDGE" "$FFS_DIR" "127.0.0.1:${DEVICE_PORT}" >"$DIR/bridge.log" 2>&1 &
    BRIDGE_PID=$!
    wait_for "$DIR/bridge.log" "READY*" || { echo "the bridge did not start: $(cat "$DIR/bridge.log")"; return 1; }
    "$GADGET_SH" bind >/dev/null || return 1

    # 1. oxadb directly.
    enumerated || { echo "the gadget was never enumerated"; return 1; }
    got="$(timeout "$LIMIT" "$OXADB" -s "$SERIAL" shell echo 2>"$DIR/direct.err")"
    if [ "$got" = hostile ]; then pass "direct: the device still serves a shell"; else fail "direct: shell gave '${got}': $(cat "$DIR/direct.err")"; fi
    all_refused direct
    logged direct "$DIR/direct.err"

    # 2. oxadb server holding it, Google's adb 29 as its client.
    "$OXADB" server -P "$SERVER_PORT" >"$DIR/server.log" 2>&1 &
    SERVER_PID=$!
    # adb's wait-for reads the server's device list until the device is up.
    timeout 20 adb -P "$SERVER_PORT" -s "$SERIAL" wait-for-usb-device >/dev/null 2>&1 ||
        fail "server: the device never came up: see $DIR/server.log"
    got="$(timeout "$LIMIT" adb -P "$SERVER_PORT" -s "$SERIAL" shell echo 2>&1)"
    if [ "$got" = hostile ]; then pass "server: adb 29 reaches the device"; else fail "server: adb shell gave '${got}'"; fi
    all_refused server
    logged server "$DIR/server.log"
    if timeout "$LIMIT" adb -P "$SERVER_PORT" -s "$SERIAL" reverse tcp:9000 "tcp:${HOST_PORT}" >"$DIR/reverse.txt" 2>&1; then
        pass "server: adb reverse tcp:9000 tcp:${HOST_PORT}"
    else
        fail "server: adb reverse failed: $(cat "$DIR/reverse.txt")"
    fi
    if wait_for "$DIR/device.log" "accepted tcp:${HOST_PORT}" && wait_for "$DIR/endpoints.log" "accepted tcp" &&
        wait_for "$DIR/device.log" "received b'hello from the host'"; then
        pass "server: the reverse's host spec reached the host's TCP endpoint, both ways"
    else
        fail "server: the reverse did not connect: see $DIR/device.log and $DIR/endpoints.log"
    fi
    # The device opens its specs again after the request; tcp:HOST_PORT,
    # one of them, is now asked for: only it may connect, to TCP only.
    if ! has "$DIR/device.log" "accepted !(tcp:${HOST_PORT})" && ! has "$DIR/endpoints.log" 'accepted !(tcp)'; then
        pass "server: nothing but the reverse's spec was connected"
    else
        fail "server: more than the reverse connected: see $DIR/device.log and $DIR/endpoints.log"
    fi
    kill -0 "$SERVER_PID" 2>/dev/null && pass "server: still running" || fail "server: exited: see $DIR/server.log"
    if has "$DIR/server.log" '*panicked*' || has "$DIR/direct.err" '*panicked*'; then fail "a panic: see $DIR"; fi

    cleanup_speed
    [ "$OK" = 1 ]
}

run_speeds "high" "$@"
