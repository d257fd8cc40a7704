#!/usr/bin/env bash
# Measures, inside the VM of scripts/usb-vm.sh, how oxadbd's FunctionFS bulk
# transfers complete: transfers per wake-up and bytes per transfer, for a
# 32 MiB push and a 32 MiB pull by each host (Google adb 29, oxadb burst,
# oxadb classic). Not a test: it prints what the daemon logged when each
# session's endpoints closed (`endpoint closed: completions per wake-up`).
# These shapes, not the speeds (TCG), calibrate the simulator's usb3 model.
#
#   cargo build --release
#   scripts/usb-vm.sh run tests/usb/transfer-shapes.sh [SPEED]   # high (default) or super
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
GADGET_SH="${REPO}/scripts/usb-gadget.sh"
OXADB="${REPO}/target/release/oxadb"
OXADBD="${REPO}/target/release/oxadbd"
SERIAL=oxadbdshape01
OUT="${USB_VM_OUT:-/tmp/usb-vm-out}/transfer-shapes"
export HOME=/tmp/home
unset ANDROID_SERIAL
[ "${USB_VM:-}" = 1 ] || { echo "run inside the VM: scripts/usb-vm.sh run $0"; exit 1; }
mkdir -p "$HOME" "$OUT" /tmp/shape
case "${1:-high}" in
    high) params="is_high_speed=1 is_super_speed=0" ;;
    super) params="is_high_speed=1 is_super_speed=1" ;;
    *) echo "speed: high or super"; exit 1 ;;
esac
rmmod dummy_hcd 2>/dev/null || true
# shellcheck disable=SC2086
modprobe dummy_hcd $params || exit 1
head -c 32M /dev/urandom >/tmp/shape/random32

one() {
    # one LABEL COMMAND...: a fresh daemon session around one transfer.
    local label="$1" log="$OUT/${1// /-}.log"
    shift
    "$GADGET_SH" setup --serial "$SERIAL" >/dev/null || exit 1
    RUST_LOG=oxadb_ffs=debug,oxadbd=info "$OXADBD" --usb --no-auth >"$log" 2>&1 &
    local pid=$!
    "$GADGET_SH" bind >/dev/null || exit 1
    local i
    for ((i = 0; i < 100; i++)); do
        "$OXADB" devices 2>/dev/null | grep -q "^${SERIAL}"$'\tdevice' && break
        sleep 0.2
    done
    "$@" >/dev/null 2>&1 || echo "${label}: the transfer failed"
    adb kill-server >/dev/null 2>&1
    "$GADGET_SH" unbind >/dev/null
    sleep 0.5
    kill "$pid"
    wait "$pid" 2>/dev/null
    "$GADGET_SH" teardown >/dev/null
    # The session whose endpoints moved the most bytes is the transfer's.
    sed 's/\x1b\[[0-9;]*m//g' "$log" | grep 'completions per wake-up' |
        sed -E 's/.*path=([^ ]+) completions=([0-9]+) batches=([0-9]+) mean_batch=([0-9.]+) largest_batch=([0-9]+) mean_transfer_bytes=([0-9]+) short=([0-9]+).*/\2 \1 \3 \4 \5 \6 \7/' |
        sort -n | tail -n 2 | while read -r completions path batches mean largest bytes short; do
            printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "${path##*/}" \
                "$completions" "$batches" "$mean" "$largest" "$bytes" "$short"
        done
}

echo "| transfer | endpoint | completions | wake-ups | per wake-up | most at once | bytes per transfer | short |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
one "adb 29 push" adb -s "$SERIAL" push /tmp/shape/random32 /tmp/shape/dev
one "adb 29 pull" adb -s "$SERIAL" pull /tmp/shape/random32 /tmp/shape/back
one "oxadb burst push" "$OXADB" -s "$SERIAL" push /tmp/shape/random32 /tmp/shape/dev
one "oxadb burst pull" "$OXADB" -s "$SERIAL" pull /tmp/shape/random32 /tmp/shape/back
one "oxadb classic push" "$OXADB" --no-burst -s "$SERIAL" push /tmp/shape/random32 /tmp/shape/dev
one "oxadb classic pull" "$OXADB" --no-burst -s "$SERIAL" pull /tmp/shape/random32 /tmp/shape/back
rm -rf /tmp/shape
