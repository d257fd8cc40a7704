#!/usr/bin/env bash
# oxadbd over real USB with Google adb, inside the VM of scripts/usb-vm.sh:
#
#   cargo build --release -p oxadbd
#   scripts/usb-vm.sh run tests/usb/daemon-smoke.sh [SPEED...]
#
# SPEED is full, high or super (default: high). For each, dummy_hcd is
# reloaded for that speed, scripts/usb-gadget.sh sets up the gadget,
# `oxadbd --usb --no-auth --usb-gadget ...` writes its descriptors and binds
# the gadget itself, then with adb 29 (a fresh server, HOME=/tmp/h):
#   1. `adb devices` lists the serial as "device"; `adb shell echo hi` says hi;
#   2. push and pull files at packet-size edges and a large one, compared;
#      a push cut by an unplug leaves no temporary file and no destination;
#   3. the UDC is unbound and bound again (unplug, replug) CYCLES times, and
#      the adb server killed and restarted, idle and while the device
#      streams to it: each time adb reconnects;
#   4. the daemon's open fds and threads are the same after the cycles as
#      after the first connection (nothing leaks per connection);
#   (and, when target/release/oxadb is built, oxadb's own USB host driver:
#   shell, and a 20 MB push and pull in burst mode;)
#   5. SIGTERM stops the daemon, which leaves the gadget unbound.
# Logs go to $USB_VM_OUT/daemon-smoke/<speed>/. Prints PASS or FAIL per
# speed and overall; exits 0 only if all passed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=tests/usb/lib.sh
. "${REPO}/tests/usb/lib.sh"
GADGET_SH="${REPO}/scripts/usb-gadget.sh"
OXADBD="${OXADBD:-${REPO}/target/release/oxadbd}"
OXADB="${OXADB:-${REPO}/target/release/oxadb}" # optional: its USB host driver is tried too
GADGET=/sys/kernel/config/usb_gadget/oxadbd
FFS_DIR=/dev/usb-ffs/adb
SERIAL=oxadbdsmoke01
CYCLES="${CYCLES:-3}"
OUT="${USB_VM_OUT:-/tmp/usb-vm-out}/daemon-smoke"
export HOME=/tmp/h

die() {
    printf 'daemon-smoke: %s\n' "$*" >&2
    echo "FAIL"
    exit 1
}

[ "${USB_VM:-}" = 1 ] || die "run this inside the VM: scripts/usb-vm.sh run tests/usb/daemon-smoke.sh"
[ -x "$OXADBD" ] || die "no ${OXADBD}: cargo build --release -p oxadbd first"
for tool in adb modprobe rmmod cmp; do
    command -v "$tool" >/dev/null 2>&1 || die "\`$tool\` is missing in the VM"
done
echo "daemon-smoke: $(adb version 2>&1 | head -n1); kernel $(uname -r)"

DAEMON_PID=""
cleanup_speed() {
    adb kill-server >/dev/null 2>&1 || true
    if [ -n "$DAEMON_PID" ]; then
        kill "$DAEMON_PID" 2>/dev/null || true
        wait "$DAEMON_PID" 2>/dev/null || true
        DAEMON_PID=""
    fi
    "$GADGET_SH" teardown >/dev/null || echo "daemon-smoke: teardown failed"
}
trap cleanup_speed EXIT


# Waits until adb lists our serial as usable ("device").
wait_device() {
    local i line
    for ((i = 0; i < 150; i++)); do
        while read -r line; do
            if [ "$line" = "${SERIAL}	device" ]; then return 0; fi
        done <<<"$(adb devices 2>/dev/null)" # no /dev/fd in the VM: no <(...)
        sleep 0.2
    done
    echo "  adb does not list ${SERIAL} as a device after 30 s:"
    adb devices 2>&1 | sed 's/^/    /'
    return 1
}

shell_says() {
    local got
    got="$(timeout 30 adb -s "$SERIAL" shell echo "$1" 2>&1)" || true
    if [ "$got" != "$1" ]; then
        echo "  adb shell echo $1 said: ${got}"
        return 1
    fi
}

# Counts of the daemon's open fds and threads, "FDS THREADS".
resources() {
    local fds=(/proc/"$DAEMON_PID"/fd/*) tasks=(/proc/"$DAEMON_PID"/task/*)
    echo "${#fds[@]} ${#tasks[@]}"
}

push_pull() {
    local dir="$1" size name
    mkdir -p "$dir/files" /tmp/oxadbd-smoke
    # Edges of the device's 16 KiB reads and of every speed's packet size,
    # and a file large enough to keep several transfers in flight.
    for size in 0 1 23 24 25 63 64 65 511 512 513 1023 1024 1025 16383 16384 16385 65536 1048576 1048577 7340033; do
        name="$dir/files/f$size"
        head -c "$size" /dev/urandom >"$name"
        if ! timeout 120 adb -s "$SERIAL" push "$name" "/tmp/oxadbd-smoke/f$size" >>"$dir/push.log" 2>&1; then
            echo "  push of ${size} bytes failed:"
            tail -n 3 "$dir/push.log" | sed 's/^/    /'
            return 1
        fi
        cmp -s "$name" "/tmp/oxadbd-smoke/f$size" || { echo "  pushed ${size} bytes arrived different"; return 1; }
        rm -f "$name.back"
        if ! timeout 120 adb -s "$SERIAL" pull "/tmp/oxadbd-smoke/f$size" "$name.back" >>"$dir/pull.log" 2>&1; then
            echo "  pull of ${size} bytes failed:"
            tail -n 3 "$dir/pull.log" | sed 's/^/    /'
            return 1
        fi
        cmp -s "$name" "$name.back" || { echo "  pulled ${size} bytes arrived different"; return 1; }
    done
    echo "  push/pull of 21 sizes (0 B to 7 MiB) round-tripped"
}

run_speed() {
    local speed="$1" dir i
    dir="${OUT}/${speed}"
    mkdir -p "$dir"
    load_dummy_hcd "$speed" || return 1
    "$GADGET_SH" setup --serial "$SERIAL" --ffs-dir "$FFS_DIR" >/dev/null || return 1

    RUST_LOG="${RUST_LOG:-info}" "$OXADBD" --usb --no-auth --ffs-dir "$FFS_DIR" \
        --usb-gadget "$GADGET" >"$dir/oxadbd.log" 2>&1 &
    DAEMON_PID=$!
    for ((i = 0; i < 100; i++)); do
        rd "$GADGET/UDC"
        [ -n "$REPLY" ] && break
        kill -0 "$DAEMON_PID" 2>/dev/null || { echo "  oxadbd died:"; sed 's/^/    /' "$dir/oxadbd.log"; return 1; }
        sleep 0.1
    done
    [ -n "$REPLY" ] || { echo "  oxadbd did not bind the gadget in 10 s:"; sed 's/^/    /' "$dir/oxadbd.log"; return 1; }
    grep -q "ready for UDC bind" "$dir/oxadbd.log" || { echo "  no 'ready for UDC bind' in the log"; return 1; }
    echo "  oxadbd bound the gadget to ${REPLY}"

    rm -rf "$HOME" && mkdir -p "$HOME"
    adb start-server >"$dir/adb-start.txt" 2>&1 || { echo "  adb start-server failed"; return 1; }
    wait_device || return 1
    shell_says hi || return 1
    echo "  adb devices: ${SERIAL} device; adb shell echo hi: hi"
    local before
    before="$(resources)"

    push_pull "$dir" || return 1

    # Unplugged in the middle of a push: no temporary file may stay behind.
    head -c 150000000 /dev/zero >/tmp/bigpush
    adb -s "$SERIAL" push /tmp/bigpush /tmp/oxadbd-smoke/bigpush >"$dir/push-cut.log" 2>&1 &
    local pusher=$!
    for ((i = 0; i < 100; i++)); do
        local temps=(/tmp/oxadbd-smoke/.oxadb-push.*)
        [ -e "${temps[0]}" ] && break
        sleep 0.05
    done
    [ -e "${temps[0]}" ] || { echo "  the push never started a temporary file"; return 1; }
    "$GADGET_SH" unbind >/dev/null || return 1
    wait "$pusher" 2>/dev/null || true
    rm -f /tmp/bigpush
    for ((i = 0; i < 50; i++)); do
        temps=(/tmp/oxadbd-smoke/.oxadb-push.*)
        [ -e "${temps[0]}" ] || break
        sleep 0.1
    done
    [ ! -e "${temps[0]}" ] || { echo "  unplugged mid-push: ${temps[*]} left behind"; return 1; }
    [ ! -e /tmp/oxadbd-smoke/bigpush ] || { echo "  unplugged mid-push: the destination exists"; return 1; }
    "$GADGET_SH" bind >/dev/null || return 1
    wait_device || return 1
    echo "  unplugged mid-push: no temporary file left, no destination"

    for ((i = 1; i <= CYCLES; i++)); do
        "$GADGET_SH" unbind >/dev/null || return 1
        sleep 0.5
        "$GADGET_SH" bind >/dev/null || return 1
        wait_device || return 1
        shell_says "cycle$i" || return 1
    done
    echo "  unplugged and replugged ${CYCLES} times: adb reconnected each time"
    adb kill-server >/dev/null 2>&1 || true
    adb start-server >>"$dir/adb-start.txt" 2>&1 || { echo "  adb start-server failed"; return 1; }
    wait_device || return 1
    shell_says restarted || return 1
    echo "  adb server restarted: reconnected"
    # Killed while the device streams: it still has transfers queued for
    # the old server; the new one must get a clean session anyway.
    adb -s "$SERIAL" exec-out cat /dev/zero >/dev/null 2>"$dir/stream-killed.log" &
    local streamer=$!
    sleep 1
    adb kill-server >/dev/null 2>&1 || true
    wait "$streamer" 2>/dev/null || true
    adb start-server >>"$dir/adb-start.txt" 2>&1 || { echo "  adb start-server failed"; return 1; }
    wait_device || return 1
    shell_says afterkill || return 1
    echo "  adb server killed mid-stream and restarted: reconnected"

    # A connection being replaced holds its old endpoints and eventfds for a
    # moment (CI saw 16 fds, then 14 a moment later): wait up to 5 s for the
    # counts to settle; a leak never does.
    local after
    for ((i = 0; i < 50; i++)); do
        after="$(resources)"
        [ "$before" = "$after" ] && break
        sleep 0.1
    done
    echo "  daemon fds/threads after the first connection: ${before}; after the cycles: ${after}"
    [ "$before" = "$after" ] || { echo "  the daemon's fds or threads changed"; ls -l /proc/"$DAEMON_PID"/fd >"$dir/fds.txt" 2>&1; return 1; }

    adb kill-server >/dev/null 2>&1 || true
    if [ -x "$OXADB" ]; then
        # oxadb's own USB host driver (no adb server) against the daemon,
        # with burst mode (delayed_ack) on both sides.
        local got
        got="$(timeout 30 "$OXADB" -s "$SERIAL" shell echo viaoxadb 2>&1)" || true
        [ "$got" = viaoxadb ] || { echo "  oxadb -s ${SERIAL} shell echo viaoxadb said: ${got}"; return 1; }
        head -c 20000001 /dev/urandom >/tmp/oxadb-big
        timeout 120 "$OXADB" -s "$SERIAL" push /tmp/oxadb-big /tmp/oxadbd-smoke/oxadb-big >"$dir/oxadb.log" 2>&1 || { echo "  oxadb push failed:"; tail -n 3 "$dir/oxadb.log"; return 1; }
        timeout 120 "$OXADB" -s "$SERIAL" pull /tmp/oxadbd-smoke/oxadb-big /tmp/oxadb-big.back >>"$dir/oxadb.log" 2>&1 || { echo "  oxadb pull failed:"; tail -n 3 "$dir/oxadb.log"; return 1; }
        cmp -s /tmp/oxadb-big /tmp/oxadbd-smoke/oxadb-big && cmp -s /tmp/oxadb-big /tmp/oxadb-big.back || { echo "  oxadb push/pull of 20 MB differ"; return 1; }
        rm -f /tmp/oxadb-big /tmp/oxadb-big.back /tmp/oxadbd-smoke/oxadb-big
        echo "  oxadb (USB host, burst mode): shell, push and pull of 20 MB"
    fi
    kill "$DAEMON_PID"
    wait "$DAEMON_PID" 2>/dev/null || true
    DAEMON_PID=""
    rd "$GADGET/UDC"
    [ -z "$REPLY" ] || { echo "  the gadget is still bound to ${REPLY} after oxadbd exited"; return 1; }
    echo "  SIGTERM: oxadbd exited and the gadget was unbound"
    grep -E "WARN|ERROR" "$dir/oxadbd.log" | sed 's/^/  log: /' | head -n 20 || true
    cleanup_speed
}

# The daemon's log says why a speed failed.
after_failed_speed() {
    echo "  log: ${OUT}/$1/oxadbd.log"
    tail -n 30 "${OUT}/$1/oxadbd.log" 2>/dev/null | sed 's/^/    /'
}

run_speeds "high" "$@"
