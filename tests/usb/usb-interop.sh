#!/usr/bin/env bash
# USB interoperability, inside the VM of scripts/usb-vm.sh: oxadbd as a
# FunctionFS gadget on dummy_hcd, Google adb 29 and oxadb as USB hosts.
#
#   cargo build --release
#   scripts/usb-vm.sh run tests/usb/usb-interop.sh [SPEED...]
#
# SPEED is full, high or super (default: high and super). For each, with
# authentication on (oxadbd's default over USB; the host's key trusted with
# `oxadbd trust-key`):
#   1. Google adb 29 lists the gadget as `device`, runs shell with exit
#      codes, pushes and pulls a 32 MiB random file (sha256 compared on both
#      sides) and pushes a directory tree;
#   2. oxadb does the same in burst mode and in classic mode (--no-burst),
#      and says which one it ran;
#   3. the UDC is unbound in the middle of an oxadb push and of an adb push:
#      each client fails within 20 s (no hang), no file is left at the
#      destination, the same daemon process stays up, and after rebinding a
#      new session works (shell, and a verified push).
# Logs go to $USB_VM_OUT/usb-interop/<speed>/. Prints PASS or FAIL per speed
# and overall; exits 0 only if all passed.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=tests/usb/lib.sh
. "${REPO}/tests/usb/lib.sh"
GADGET_SH="${REPO}/scripts/usb-gadget.sh"
OXADB="${REPO}/target/release/oxadb"
OXADBD="${REPO}/target/release/oxadbd"
FFS_DIR=/dev/usb-ffs/adb
SERIAL=oxadbdvm0001
OUT="${USB_VM_OUT:-/tmp/usb-vm-out}/usb-interop"
# Every client command gets a time limit: a hang is a failure, not a stall.
LIMIT=60
export HOME=/tmp/home
unset ANDROID_SERIAL

die() {
    printf 'usb-interop: %s\n' "$*" >&2
    echo "FAIL"
    exit 1
}

[ "${USB_VM:-}" = 1 ] || die "run this inside the VM: scripts/usb-vm.sh run tests/usb/usb-interop.sh"
for exe in "$OXADB" "$OXADBD"; do
    [ -x "$exe" ] || die "$exe is missing: cargo build --release"
done
command -v adb >/dev/null || die "Google adb is missing (scripts/usb-vm.sh prepare installs Debian's adb)"
mkdir -p "$HOME"

DAEMON_PID=""
cleanup_speed() {
    adb kill-server >/dev/null 2>&1 || true
    "$GADGET_SH" unbind >/dev/null 2>&1 || true
    if [ -n "$DAEMON_PID" ]; then
        kill "$DAEMON_PID" 2>/dev/null || true
        wait "$DAEMON_PID" 2>/dev/null || true
        DAEMON_PID=""
    fi
    "$GADGET_SH" teardown >/dev/null || echo "usb-interop: teardown failed"
}
trap cleanup_speed EXIT

OK=1

# transfer_checks CLIENT_NAME CLIENT...: shell with exit codes, a 32 MiB
# random file pushed and pulled back with sha256 compared, a directory push.
transfer_checks() {
    local name="$1" dev="/tmp/device/${1}" host="/tmp/host/${1}" got
    shift
    rm -rf "$dev" "$host"
    mkdir -p "$dev" "$host"
    expect_output "${name}: shell echo" "hello usb" "$@" shell echo hello usb
    expect_status "${name}: shell exit code" 3 "$@" shell 'exit 3'
    local start=$SECONDS
    if timeout "$LIMIT" "$@" push /tmp/random32 "$dev/random32" >"$DIR/${name}-push.txt" 2>&1; then
        got="$(timeout "$LIMIT" "$@" shell sha256sum "$dev/random32" 2>&1 | cut -d' ' -f1)"
        if [ "$got" = "$RANDOM_SHA" ]; then
            pass "${name}: push 32 MiB, sha256 on the device matches ($((SECONDS - start)) s; $(tail -n1 "$DIR/${name}-push.txt"))"
        else
            fail "${name}: push 32 MiB: device sha256 '${got}' != ${RANDOM_SHA}"
        fi
    else
        fail "${name}: push 32 MiB: $(tail -n3 "$DIR/${name}-push.txt")"
    fi
    start=$SECONDS
    if timeout "$LIMIT" "$@" pull "$dev/random32" "$host/random32" >"$DIR/${name}-pull.txt" 2>&1 &&
        [ "$(sha "$host/random32")" = "$RANDOM_SHA" ]; then
        pass "${name}: pull 32 MiB, sha256 matches ($((SECONDS - start)) s; $(tail -n1 "$DIR/${name}-pull.txt"))"
    else
        fail "${name}: pull 32 MiB: $(tail -n3 "$DIR/${name}-pull.txt")"
    fi
    if timeout "$LIMIT" "$@" push /tmp/tree "$dev/" >"$DIR/${name}-dir.txt" 2>&1 &&
        diff -r /tmp/tree "$dev/tree" >/dev/null; then
        pass "${name}: directory push ($(find /tmp/tree -type f | wc -l) files, identical)"
    else
        fail "${name}: directory push: $(tail -n3 "$DIR/${name}-dir.txt"; diff -r /tmp/tree "$dev/tree" 2>&1 | head -3)"
    fi
}

wait_adb_device() {
    local i
    for ((i = 0; i < 100; i++)); do
        adb devices 2>/dev/null | grep -q "^${SERIAL}"$'\tdevice$' && return 0
        sleep 0.2
    done
    return 1
}

wait_oxadb_device() {
    local i
    for ((i = 0; i < 100; i++)); do
        "$OXADB" devices 2>/dev/null | grep -q "^${SERIAL}"$'\tdevice' && return 0
        sleep 0.2
    done
    return 1
}

# unplug_mid_push NAME CLIENT...: unbinds the UDC as soon as a push of
# /tmp/big has started writing on the device; the client must fail within 20 s and leave nothing behind; after
# rebinding, the daemon (same pid) serves a new session.
unplug_mid_push() {
    local name="$1" dest="/tmp/device/unplug-${1}"
    shift
    rm -rf "$dest"
    mkdir -p "$dest"
    timeout "$LIMIT" "$@" push /tmp/big "$dest/big" >"$DIR/${name}-unplug.txt" 2>&1 &
    local pid=$! start=$SECONDS i
    # Unplug as soon as the daemon has started writing (its temporary file
    # appears): a fixed delay let a fast run finish first (super speed, 1.4 s).
    for ((i = 0; i < 200; i++)); do
        local temps=("$dest"/.oxadb-push.*)
        [ -e "${temps[0]}" ] && break
        sleep 0.05
    done
    [ -e "${temps[0]}" ] || fail "${name}: the push never started a temporary file in ${dest}"
    "$GADGET_SH" unbind >/dev/null
    for ((i = 0; i < 200; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        fail "${name}: push still running 20 s after the unplug"
        kill "$pid" 2>/dev/null
    fi
    wait "$pid"
    local rc=$?
    local left
    left="$(ls -A "$dest")"
    if [ "$rc" != 0 ] && [ -z "$left" ]; then
        pass "${name}: unplug mid-push: exit ${rc} after $((SECONDS - start)) s, nothing left in ${dest}: $(tail -n1 "$DIR/${name}-unplug.txt")"
    else
        fail "${name}: unplug mid-push: exit ${rc}, left '${left}': $(tail -n2 "$DIR/${name}-unplug.txt")"
    fi
    kill -0 "$DAEMON_PID" 2>/dev/null && pass "oxadbd (pid ${DAEMON_PID}) still running" || fail "oxadbd exited on the unplug"
    "$GADGET_SH" bind >/dev/null || fail "rebind after the unplug"
}

run_speed() {
    local speed="$1"
    DIR="${OUT}/${speed}"
    OK=1
    mkdir -p "$DIR"
    load_dummy_hcd "$speed" || return 1

    # adb makes its key on first start; the daemon trusts it (auth is on by
    # default over USB), and oxadb uses the same ~/.android/adbkey.
    adb start-server >/dev/null 2>&1 || { echo "adb start-server failed"; return 1; }
    [ -f "$HOME/.android/adbkey.pub" ] || { echo "adb made no key in $HOME/.android"; return 1; }
    local keys="$DIR/adb_keys"
    rm -f "$keys"
    "$OXADBD" trust-key "$HOME/.android/adbkey.pub" --keys "$keys" >/dev/null || { echo "trust-key failed"; return 1; }

    "$GADGET_SH" setup --serial "$SERIAL" --ffs-dir "$FFS_DIR" >/dev/null || return 1
    RUST_LOG=info "$OXADBD" --usb --ffs-dir "$FFS_DIR" --keys "$keys" --product-model "USB VM" \
        >"$DIR/oxadbd.log" 2>&1 &
    DAEMON_PID=$!
    "$GADGET_SH" bind >/dev/null || { echo "bind failed:"; tail -5 "$DIR/oxadbd.log"; return 1; }

    # 1. Google adb 29.
    if wait_adb_device; then
        pass "adb devices: $(adb devices | grep "^${SERIAL}")"
    else
        fail "adb never listed ${SERIAL} as device: $(adb devices -l 2>&1 | tail -n +2)"
        return 1
    fi
    transfer_checks adb adb -s "$SERIAL"
    # Google adb's server holds the interface; oxadb needs it next.
    unplug_mid_push adb adb -s "$SERIAL"
    if wait_adb_device; then
        expect_output "adb: new session after rebind" "again" adb -s "$SERIAL" shell echo again
    else
        fail "adb: no device 20 s after rebinding"
    fi
    adb kill-server >/dev/null 2>&1
    sleep 0.5

    # 2. oxadb, burst then classic.
    wait_oxadb_device || fail "oxadb devices never listed ${SERIAL} as device"
    local mode
    mode="$(timeout "$LIMIT" "$OXADB" -s "$SERIAL" features 2>&1 >/dev/null)"
    [ "$mode" = "burst mode (delayed_ack): on" ] && pass "oxadb: ${mode}" || fail "oxadb features: ${mode}"
    transfer_checks oxadb-burst "$OXADB" -s "$SERIAL"
    mode="$(timeout "$LIMIT" "$OXADB" --no-burst -s "$SERIAL" features 2>&1 >/dev/null)"
    [ "$mode" = "burst mode (delayed_ack): off" ] && pass "oxadb --no-burst: ${mode}" || fail "oxadb --no-burst features: ${mode}"
    transfer_checks oxadb-classic "$OXADB" --no-burst -s "$SERIAL"

    # 3. Unplug in the middle of an oxadb push, then a new session.
    unplug_mid_push oxadb "$OXADB" -s "$SERIAL"
    if wait_oxadb_device; then
        expect_output "oxadb: new session after rebind" "again" "$OXADB" -s "$SERIAL" shell echo again
        if timeout "$LIMIT" "$OXADB" -s "$SERIAL" push /tmp/random32 /tmp/device/after >/dev/null 2>&1 &&
            [ "$(sha /tmp/device/after)" = "$RANDOM_SHA" ]; then
            pass "oxadb: 32 MiB push after rebind, sha256 matches"
        else
            fail "oxadb: push after rebind"
        fi
    else
        fail "oxadb: no device 20 s after rebinding"
    fi
    if grep -q "panicked" "$DIR/oxadbd.log"; then fail "oxadbd panicked: $(grep -m1 panicked "$DIR/oxadbd.log")"; fi
    cleanup_speed
    [ "$OK" = 1 ]
}

# Test data, shared by every speed: incompressible, so no layer flatters it.
head -c 32M /dev/urandom >/tmp/random32
RANDOM_SHA="$(sha /tmp/random32)"
head -c 96M /dev/urandom >/tmp/big
rm -rf /tmp/tree
mkdir -p /tmp/tree/a/b /tmp/tree/empty-dir-sibling /tmp/tree/c
for size in 0 1 511 512 513 16384 65536 1048576 1048600; do
    head -c "$size" /dev/urandom >"/tmp/tree/a/f${size}"
done
head -c 3000000 /dev/urandom >/tmp/tree/a/b/deep
echo "text" >/tmp/tree/c/note.txt
rmdir /tmp/tree/empty-dir-sibling

# The VM's tmpfs is shared with whatever runs next in the same boot.
remove_test_data() { rm -rf /tmp/random32 /tmp/big /tmp/tree /tmp/device /tmp/host; }
trap 'cleanup_speed; remove_test_data' EXIT

run_speeds "high super" "$@"
