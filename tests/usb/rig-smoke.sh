#!/usr/bin/env bash
# Proves the USB rig without oxadbd, inside the VM of scripts/usb-vm.sh:
#
#   scripts/usb-vm.sh run tests/usb/rig-smoke.sh [SPEED...]
#
# SPEED is full, high or super (default: all three): for each, dummy_hcd is
# reloaded with the parameters for that speed, then
#   1. scripts/usb-gadget.sh setup makes the ADB gadget and mounts FunctionFS,
#   2. tests/usb/ffs_stub.py writes ADB-interface descriptors to ep0 and
#      logs what arrives on bulk OUT (it never answers),
#   3. scripts/usb-gadget.sh bind attaches the gadget to dummy_udc.0,
#   4. the kernel's USB host side enumerates it: idVendor 18d1 in
#      /sys/bus/usb/devices, with the negotiated speed and the endpoints'
#      wMaxPacketSize reported,
#   5. Google adb 29 (a fresh server, HOME=/tmp/h) lists it in
#      `adb devices -l` and sends it CNXN: the stub must have received a
#      24-byte header starting with "CNXN",
# then everything is torn down. Logs go to $USB_VM_OUT/rig-smoke/<speed>/.
# Prints PASS or FAIL per speed and overall; exits 0 only if all passed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=tests/usb/lib.sh
. "${REPO}/tests/usb/lib.sh"
GADGET_SH="${REPO}/scripts/usb-gadget.sh"
STUB="${REPO}/tests/usb/ffs_stub.py"
FFS_DIR=/dev/usb-ffs/adb
SERIAL=rigsmoke0001
OUT="${USB_VM_OUT:-/tmp/usb-vm-out}/rig-smoke"

die() {
    printf 'rig-smoke: %s\n' "$*" >&2
    echo "FAIL"
    exit 1
}

# This reloads dummy_hcd and drives configfs: only in the throwaway VM.
[ "${USB_VM:-}" = 1 ] || die "run this inside the VM: scripts/usb-vm.sh run tests/usb/rig-smoke.sh"
for tool in adb python3 modprobe rmmod; do
    command -v "$tool" >/dev/null 2>&1 || die "\`$tool\` is missing in the VM (it is this machine's tree: install it here)"
done
adb_version="$(adb version 2>&1 | head -n1)"
echo "rig-smoke: $adb_version; kernel $(uname -r)"

STUB_PID=""
cleanup_speed() {
    # What one speed's run started, in reverse; errors reported, not fatal,
    # so that the next speed starts clean or the failure is visible.
    HOME=/tmp/h adb kill-server >/dev/null 2>&1 || true
    if [ -n "$STUB_PID" ]; then
        "$GADGET_SH" unbind >/dev/null || echo "rig-smoke: unbind failed"
        kill "$STUB_PID" 2>/dev/null || true
        wait "$STUB_PID" 2>/dev/null || true
        STUB_PID=""
    fi
    "$GADGET_SH" teardown >/dev/null || echo "rig-smoke: teardown failed"
}
trap cleanup_speed EXIT


# Prints "key=value" facts about the enumerated device; fails if there is none.
device_facts() {
    local d intf ep name
    for d in /sys/bus/usb/devices/*; do
        rd "$d/idVendor"
        [ "$REPLY" = 18d1 ] || continue
        name="${d##*/}"
        local line="device=${name}" f
        for f in idVendor idProduct version speed manufacturer product serial bMaxPower; do
            rd "$d/$f"
            line+=" ${f}=${REPLY// /}"
        done
        echo "$line"
        for intf in "$d/$name":*; do
            [ -d "$intf" ] || continue
            line="interface=${intf##*/}"
            for f in bInterfaceClass bInterfaceSubClass bInterfaceProtocol interface; do
                rd "$intf/$f"
                line+=" ${f}=${REPLY}"
            done
            echo "$line"
            for ep in "$intf"/ep_*; do
                line="endpoint"
                for f in bEndpointAddress direction type wMaxPacketSize; do
                    rd "$ep/$f"
                    line+=" ${f}=${REPLY}"
                done
                echo "$line"
            done
        done
        return 0
    done
    return 1
}

run_speed() {
    local speed="$1" dir
    dir="${OUT}/${speed}"
    mkdir -p "$dir"
    load_dummy_hcd "$speed" || return 1

    "$GADGET_SH" setup --serial "$SERIAL" --ffs-dir "$FFS_DIR" || return 1
    python3 "$STUB" "$FFS_DIR" >"$dir/stub.log" 2>&1 &
    STUB_PID=$!
    local i
    for ((i = 0; i < 50; i++)); do
        grep -q READY "$dir/stub.log" 2>/dev/null && break
        kill -0 "$STUB_PID" 2>/dev/null || { echo "the stub died:"; cat "$dir/stub.log"; return 1; }
        sleep 0.1
    done
    grep -q READY "$dir/stub.log" || { echo "the stub did not get ready in 5 s:"; cat "$dir/stub.log"; return 1; }
    "$GADGET_SH" bind || return 1

    # Enumeration by the kernel's hub driver.
    local facts=""
    for ((i = 0; i < 100; i++)); do
        facts="$(device_facts)" && break
        sleep 0.1
    done
    [ -n "$facts" ] || { echo "no USB device with idVendor 18d1 in /sys/bus/usb/devices after 10 s"; return 1; }
    printf '  %s\n' "${facts//$'\n'/$'\n'  }"
    rd /sys/class/udc/dummy_udc.0/current_speed
    echo "  dummy_udc.0 current_speed=${REPLY}"
    echo "$facts" >"$dir/device.txt"
    ls -l /dev/bus/usb/*/* >"$dir/dev-bus-usb.txt" 2>&1 || true

    # Google adb: a fresh server with its own HOME (adbkey) in tmpfs.
    rm -rf /tmp/h
    mkdir -p /tmp/h
    HOME=/tmp/h adb start-server >"$dir/adb-start.txt" 2>&1 || { echo "adb start-server failed:"; cat "$dir/adb-start.txt"; return 1; }
    local listed=""
    for ((i = 0; i < 50; i++)); do
        listed="$(HOME=/tmp/h adb devices -l 2>&1 | grep -F "$SERIAL" || true)"
        [ -n "$listed" ] && break
        sleep 0.2
    done
    HOME=/tmp/h adb devices -l >"$dir/adb-devices.txt" 2>&1 || true
    # adb waits for CNXN's answer; give the stub's log time to fill.
    for ((i = 0; i < 50; i++)); do
        grep -q '^ep1 packet CNXN' "$dir/stub.log" && break
        sleep 0.2
    done
    cp /tmp/adb.*.log "$dir/" 2>/dev/null || true

    local ok=1
    if [ -n "$listed" ]; then
        echo "  adb devices -l: ${listed}"
    else
        echo "  adb devices -l does not list ${SERIAL}:"
        sed 's/^/    /' "$dir/adb-devices.txt"
        ok=0
    fi
    # The 24-byte header, magic "CNXN" (434e584e) at offset 0.
    if grep -q '^ep1 24 434e584e' "$dir/stub.log"; then
        echo "  stub got: $(grep -m1 '^ep1 packet CNXN' "$dir/stub.log")"
        local payload
        payload="$(grep -m1 '^ep1 text' "$dir/stub.log" | cut -c10- || true)"
        [ -z "$payload" ] || echo "  stub got payload: ${payload}"
    else
        echo "  the stub received no 24-byte CNXN header; its log:"
        sed 's/^/    /' "$dir/stub.log"
        ok=0
    fi
    echo "  stub events: $(grep '^event' "$dir/stub.log" | cut -d' ' -f2 | tr '\n' ' ')"
    cleanup_speed
    [ "$ok" = 1 ]
}

run_speeds "full high super" "$@"
