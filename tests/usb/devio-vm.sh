#!/usr/bin/env bash
# vsock and framebuffer: inside the VM of scripts/usb-vm.sh, which has the
# kernel modules this machine's kernel may not load (vsock_loopback, vfb).
#
#   cargo build --release
#   scripts/usb-vm.sh run tests/usb/devio-vm.sh
#
# 1. vsock: `vsock_loopback` gives this kernel a vsock transport to itself
#    (CID 1). oxadbd listens on `--listen 127.0.0.1:PORT,vsock:PORT` with
#    authentication on (the default: a vsock peer is never a loopback peer).
#    oxadb over `-s vsock:1:PORT` is `unauthorized` until its key is trusted
#    with `oxadbd trust-key`, then runs shell (with exit codes) and pushes
#    and pulls a 16 MiB random file, sha256 compared on both sides. Google
#    adb 29 and 34 also take `adb connect vsock:1:PORT` (their socket_spec
#    has vsock) and run shell and a 16 MiB push over it.
# 2. framebuffer: `vfb` (vfb_enable=1, 320x240, 32 bpp) is a framebuffer in
#    memory; fbcon is unbound from it so that nothing else draws. fb_check.py
#    draws a known pattern through /dev/fbN, and `framebuffer:` read with
#    `oxadb raw` (over vsock) and with `adb raw` (adb 29, over TCP) must give
#    the kernel's width, height, bpp and channel layout and the same pixels;
#    `oxadb framebuffer FILE` must write them as a PPM image.
# Logs go to $USB_VM_OUT/devio/. Prints PASS or FAIL; exits 0 only on PASS.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OXADB="${REPO}/target/release/oxadb"
OXADBD="${REPO}/target/release/oxadbd"
ADB34="${OXADB_ADB34:-${REPO}/target/peers/adb-34/adb}"
OUT="${USB_VM_OUT:-/tmp/usb-vm-out}/devio"
LIMIT=60
TCP_PORT=40555
VSOCK_PORT=5555
VSERIAL="vsock:1:${VSOCK_PORT}"
export HOME=/tmp/home
unset ANDROID_SERIAL

die() {
    printf 'devio-vm: %s\n' "$*" >&2
    echo "FAIL"
    exit 1
}

[ "${USB_VM:-}" = 1 ] || die "run this inside the VM: scripts/usb-vm.sh run tests/usb/devio-vm.sh"
for exe in "$OXADB" "$OXADBD"; do
    [ -x "$exe" ] || die "$exe is missing: cargo build --release"
done
command -v adb >/dev/null || die "Google adb 29 is missing (scripts/usb-vm.sh prepare installs Debian's adb)"
[ -x "$ADB34" ] || die "Google adb 34 is missing at ${ADB34} (scripts/install-adb34.sh target/peers/adb-34)"
mkdir -p "$HOME" "$OUT"

OK=1
# shellcheck source=tests/usb/lib.sh
. "${REPO}/tests/usb/lib.sh"

DAEMON_PID=""
cleanup() {
    adb kill-server >/dev/null 2>&1 || true
    "$ADB34" -P 5038 kill-server >/dev/null 2>&1 || true
    if [ -n "$DAEMON_PID" ]; then
        kill "$DAEMON_PID" 2>/dev/null || true
        wait "$DAEMON_PID" 2>/dev/null || true
        DAEMON_PID=""
    fi
    rm -rf /tmp/devio
}
trap cleanup EXIT

# push_pull NAME CLIENT...: 16 MiB pushed (sha256 checked on the device) and
# pulled back (checked here).
push_pull() {
    local name="$1" start
    shift
    rm -rf "/tmp/devio/device-${name}" "/tmp/devio/host-${name}"
    mkdir -p "/tmp/devio/host-${name}"
    start=$SECONDS
    if timeout "$LIMIT" "$@" push /tmp/devio/random16 "/tmp/devio/device-${name}/random16" \
        >"$OUT/${name}-push.txt" 2>&1 &&
        [ "$(sha "/tmp/devio/device-${name}/random16")" = "$RANDOM_SHA" ]; then
        pass "${name}: push 16 MiB, sha256 matches ($((SECONDS - start)) s)"
    else
        fail "${name}: push 16 MiB: $(tail -n3 "$OUT/${name}-push.txt")"
    fi
    start=$SECONDS
    if timeout "$LIMIT" "$@" pull "/tmp/devio/device-${name}/random16" "/tmp/devio/host-${name}/random16" \
        >"$OUT/${name}-pull.txt" 2>&1 &&
        [ "$(sha "/tmp/devio/host-${name}/random16")" = "$RANDOM_SHA" ]; then
        pass "${name}: pull 16 MiB, sha256 matches ($((SECONDS - start)) s)"
    else
        fail "${name}: pull 16 MiB: $(tail -n3 "$OUT/${name}-pull.txt")"
    fi
}

mkdir -p /tmp/devio
head -c 16M /dev/urandom >/tmp/devio/random16
RANDOM_SHA="$(sha /tmp/devio/random16)"

echo "=== vsock (vsock_loopback, CID 1)"
modprobe vsock_loopback || die "modprobe vsock_loopback failed"

echo "=== framebuffer (vfb)"
# 320x240 at 32 bpp needs 300 KiB; the module's default memory is 1 MiB.
modprobe vfb vfb_enable=1 mode_option=320x240-32 || die "modprobe vfb failed"
FB=""
for d in /sys/class/graphics/fb[0-9]*; do
    name=""
    read -r name <"$d/name" 2>/dev/null || true
    [ "$name" = "Virtual FB" ] && FB="/dev/${d##*/}"
done
[ -n "$FB" ] && [ -c "$FB" ] || die "vfb registered no /dev/fbN (names: $(cat /sys/class/graphics/fb*/name 2>&1))"
# fbcon takes every new framebuffer and would draw its console (and a
# blinking cursor) over the pattern.
for vt in /sys/class/vtconsole/vtcon*; do
    grep -q "frame buffer" "$vt/name" 2>/dev/null && echo 0 >"$vt/bind"
done
geometry="$(python3 "${REPO}/tests/usb/fb_check.py" draw "$FB")" || die "drawing into ${FB} failed"
pass "pattern drawn into ${FB} (${geometry})"

# The daemon: TCP on loopback and vsock, keys required over vsock.
KEYS="$OUT/adb_keys"
rm -f "$KEYS"
RUST_LOG=debug "$OXADBD" --listen "127.0.0.1:${TCP_PORT},vsock:${VSOCK_PORT}" --keys "$KEYS" \
    --framebuffer "$FB" >"$OUT/oxadbd.log" 2>&1 &
DAEMON_PID=$!
for ((i = 0; i < 100; i++)); do
    grep -q "listening on" "$OUT/oxadbd.log" && break
    kill -0 "$DAEMON_PID" 2>/dev/null || break
    sleep 0.1
done
line="$(grep -m1 "listening on" "$OUT/oxadbd.log")" || die "oxadbd did not start: $(tail -5 "$OUT/oxadbd.log")"
case "$line" in
    *"listening on 127.0.0.1:${TCP_PORT} and vsock:${VSOCK_PORT};"*) pass "oxadbd: ${line#*INFO oxadbd: }" ;;
    *) fail "start line: ${line}" ;;
esac

# oxadb has no key until it first needs one; adb makes its own at start.
got="$(timeout "$LIMIT" "$OXADB" -s "$VSERIAL" get-state 2>&1)"
case "$got" in
    *"${VSERIAL}: device unauthorized"*) pass "oxadb over ${VSERIAL} without a trusted key: unauthorized" ;;
    *) fail "oxadb over ${VSERIAL} without a trusted key: '${got}'" ;;
esac
grep -q "peer=vsock:1:.*key=key required: a vsock peer" "$OUT/oxadbd.log" &&
    pass "the daemon asked the vsock peer for a key" || fail "no 'key required: a vsock peer' in the log"
"$OXADBD" trust-key "$HOME/.android/adbkey.pub" --keys "$KEYS" >/dev/null || die "trust-key failed"

expect_output "oxadb over ${VSERIAL}: shell" "hello vsock" "$OXADB" -s "$VSERIAL" shell echo hello vsock
timeout "$LIMIT" "$OXADB" -s "$VSERIAL" shell 'exit 3' >/dev/null 2>&1
rc=$?
[ "$rc" = 3 ] && pass "oxadb over ${VSERIAL}: shell exit code 3" || fail "oxadb shell 'exit 3' exited ${rc}"
push_pull oxadb "$OXADB" -s "$VSERIAL"

# Google adb: both have vsock in their socket_spec; each needs its key trusted.
for client in adb29 adb34; do
    if [ "$client" = adb29 ]; then adbc=(adb); else adbc=("$ADB34" -P 5038); fi
    HOME="/tmp/devio/home-${client}"
    mkdir -p "$HOME"
    export HOME
    timeout "$LIMIT" "${adbc[@]}" start-server >/dev/null 2>&1 || fail "${client}: start-server"
    "$OXADBD" trust-key "$HOME/.android/adbkey.pub" --keys "$KEYS" >/dev/null || fail "${client}: trust-key"
    got="$(timeout "$LIMIT" "${adbc[@]}" connect "$VSERIAL" 2>&1)"
    if [ "$got" = "connected to ${VSERIAL}" ]; then
        pass "${client}: adb connect ${VSERIAL}"
        for ((i = 0; i < 50; i++)); do
            "${adbc[@]}" devices 2>/dev/null | grep -q "^${VSERIAL}"$'\tdevice$' && break
            sleep 0.2
        done
        expect_output "${client} over ${VSERIAL}: shell" "hello ${client}" "${adbc[@]}" -s "$VSERIAL" shell echo hello "$client"
        push_pull "$client" "${adbc[@]}" -s "$VSERIAL"
    else
        fail "${client}: adb connect ${VSERIAL}: '${got}'"
    fi
    timeout "$LIMIT" "${adbc[@]}" kill-server >/dev/null 2>&1
done
HOME=/tmp/home
export HOME

# framebuffer: through oxadb over vsock, and adb 29's `adb raw` over TCP
# (its stdin, a FIFO this script holds open, never ends: adb raw ends the
# stream when stdin ends).
if timeout "$LIMIT" "$OXADB" -s "$VSERIAL" raw framebuffer: </dev/null >"$OUT/fb-oxadb.raw" 2>"$OUT/fb-oxadb.err" &&
    got="$(python3 "${REPO}/tests/usb/fb_check.py" check "$FB" "$OUT/fb-oxadb.raw" 2>&1)"; then
    pass "oxadb raw framebuffer: over vsock: ${got}"
else
    fail "oxadb raw framebuffer: $(cat "$OUT/fb-oxadb.err") ${got:-}"
fi
if timeout "$LIMIT" "$OXADB" -s "$VSERIAL" framebuffer "$OUT/fb-oxadb.ppm" 2>"$OUT/fb-oxadb-ppm.err" &&
    got="$(python3 "${REPO}/tests/usb/fb_check.py" ppm "$FB" "$OUT/fb-oxadb.ppm" 2>&1)"; then
    pass "oxadb framebuffer FILE: ${got}"
else
    fail "oxadb framebuffer FILE: $(cat "$OUT/fb-oxadb-ppm.err") ${got:-}"
fi
HOME=/tmp/devio/home-adb29
export HOME
"$OXADBD" trust-key "$HOME/.android/adbkey.pub" --keys "$KEYS" >/dev/null
timeout "$LIMIT" adb connect "127.0.0.1:${TCP_PORT}" >/dev/null 2>&1
sleep 0.5
mkfifo /tmp/devio/stdin
exec 7<>/tmp/devio/stdin
if timeout "$LIMIT" adb -s "127.0.0.1:${TCP_PORT}" raw framebuffer: <&7 \
    >"$OUT/fb-adb29.raw" 2>"$OUT/fb-adb29.err" &&
    got="$(python3 "${REPO}/tests/usb/fb_check.py" check "$FB" "$OUT/fb-adb29.raw" 2>&1)"; then
    pass "adb 29 raw framebuffer: over TCP: ${got}"
else
    fail "adb 29 raw framebuffer: $(cat "$OUT/fb-adb29.err") ${got:-}"
fi
exec 7>&-
HOME=/tmp/home
export HOME

kill -0 "$DAEMON_PID" 2>/dev/null && pass "oxadbd still running" || fail "oxadbd exited"
if grep -q "panicked" "$OUT/oxadbd.log"; then fail "oxadbd panicked: $(grep -m1 panicked "$OUT/oxadbd.log")"; fi
cleanup
if [ "$OK" = 1 ]; then echo "PASS"; else echo "FAIL"; exit 1; fi
