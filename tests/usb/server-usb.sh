#!/usr/bin/env bash
# `oxadb server` with a USB device, inside the VM of scripts/usb-vm.sh:
# Google's adb CLI (29, and 34 from target/peers/adb-34) -> `oxadb server -P
# PORT` -> USB (dummy_hcd) -> oxadbd as a FunctionFS gadget.
#
#   cargo build --release -p oxadb -p oxadbd
#   scripts/install-adb34.sh target/peers/adb-34
#   scripts/usb-vm.sh run tests/usb/server-usb.sh [SPEED...]
#
# SPEED is full, high or super (default: high). For each:
#   1. with authentication on and the host's key not trusted yet, the
#      server lists the gadget `unauthorized` and adb's commands fail with
#      adb's words; once the key is trusted the server's retry gets it
#      (`wait-for-usb-device` returns) without replugging;
#   2. `adb devices -l` shows it as adb does (`usb:BUS-PORT`, model,
#      transport_id), `get-devpath`, `-d` and `-s SERIAL` reach it, `-e`
#      does not; shell with exit status; a push and a pull with sha256
#      compared; adb 34's CLI does the same through the same server;
#   3. hotplug: the UDC is unbound and bound again, twice: the device
#      leaves `adb track-devices` within a second of the unbind
#      (`wait-for-usb-disconnect` returns), is listed again within a second
#      of the bind and is `device` again soon after, under a new
#      transport id (as adb's server numbers a replugged device), and works;
#   4. a second server with ADB_USB=0 (Google's server's switch) lists no
#      USB device while the first one holds the gadget.
# Logs go to $USB_VM_OUT/server-usb/<speed>/. Prints PASS or FAIL per speed
# and overall; exits 0 only if all passed.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=tests/usb/lib.sh
. "${REPO}/tests/usb/lib.sh"
GADGET_SH="${REPO}/scripts/usb-gadget.sh"
OXADB="${REPO}/target/release/oxadb"
OXADBD="${REPO}/target/release/oxadbd"
ADB34="${REPO}/target/peers/adb-34/adb"
STAMP="${REPO}/tests/usb/track_stamp.py"
# usb-gadget.sh's gadget: the replug writes its UDC file itself, so that the
# time taken is the write's, not the script's (forks are slow under TCG).
UDC_FILE=/sys/kernel/config/usb_gadget/oxadbd/UDC
FFS_DIR=/dev/usb-ffs/adb
SERIAL=oxadbdsrv0001
# Private ports (inside the VM, but never adb's 5037 in a test).
PORT=5041
PORT_NO_USB=5042
OUT="${USB_VM_OUT:-/tmp/usb-vm-out}/server-usb"
LIMIT=60
# Microseconds: a device must leave, and be listed again, this soon.
WITHIN_US=1000000
# Listed again to `device`: the handshake (an RSA signature under TCG) too.
DEVICE_WITHIN_US=3000000
export HOME=/tmp/home
unset ANDROID_SERIAL ADB_USB

die() {
    printf 'server-usb: %s\n' "$*" >&2
    echo "FAIL"
    exit 1
}

[ "${USB_VM:-}" = 1 ] || die "run this inside the VM: scripts/usb-vm.sh run tests/usb/server-usb.sh"
for exe in "$OXADB" "$OXADBD"; do
    [ -x "$exe" ] || die "$exe is missing: cargo build --release -p oxadb -p oxadbd"
done
command -v adb >/dev/null || die "Google adb 29 is missing (scripts/usb-vm.sh prepare installs Debian's adb)"
[ -x "$ADB34" ] || die "Google adb 34 is missing at ${ADB34} (scripts/install-adb34.sh target/peers/adb-34)"
mkdir -p "$HOME"

DAEMON_PID="" SERVER_PID="" TRACK_PID=""
stop() {
    local pid="$1"
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup_speed() {
    if [ -n "$SERVER_PID" ]; then
        adb -P "$PORT" kill-server >/dev/null 2>&1 || true
        stop "$SERVER_PID"
        SERVER_PID=""
    fi
    # After the server: bash waits for the whole pipeline, and its adb
    # track-devices ends only when the server does.
    stop "$TRACK_PID"
    TRACK_PID=""
    "$GADGET_SH" unbind >/dev/null 2>&1 || true
    stop "$DAEMON_PID"
    DAEMON_PID=""
    "$GADGET_SH" teardown >/dev/null || echo "server-usb: teardown failed"
}

OK=1

now_us() { REPLY="${EPOCHREALTIME/./}"; }

# track_after SINCE_US WANT: microseconds from SINCE_US to the first
# track-devices message from then on in which the device is gone, listed
# (any state) or `device` (WANT: gone, listed, device); waits up to 10 s.
track_after() {
    local since="$1" want="$2" i got
    for ((i = 0; i < 50; i++)); do
        got="$(awk -v t0="$since" -v s="$SERIAL " -v want="$want" '
            $1 >= t0 {
                listed = index($0, s) > 0
                if ((want == "gone" && !listed) || (want == "listed" && listed) ||
                    (want == "device" && index($0, s "device") > 0)) { print $1 - t0; exit }
            }' "$DIR/track.txt")"
        [ -n "$got" ] && { echo "$got"; return 0; }
        sleep 0.2
    done
    return 1
}

# wait_listening PORT: until a server accepts on PORT (10 s at most). An
# adb command before that would start Google's own server on the port.
wait_listening() {
    local i
    for ((i = 0; i < 100; i++)); do
        if { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null; then
            exec 3>&-
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# wait_in_background WHAT: runs adb -P PORT WHAT (20 s at most) in the
# background, its pid in $REPLY; once it ends, its status and the time
# (microseconds) are in $DIR/WHAT.
wait_in_background() {
    rm -f "$DIR/$1"
    (
        timeout 20 adb -P "$PORT" "$1"
        rc=$?
        echo "$rc ${EPOCHREALTIME/./}" >"$DIR/$1"
    ) &
    REPLY=$!
}

# waited WHAT SINCE_US: after wait_in_background WHAT ended, the
# microseconds from SINCE_US to its end; fails if it failed.
waited() {
    local rc at
    read -r rc at <"$DIR/$1" || return 1
    [ "$rc" = 0 ] || return 1
    echo $((at - $2))
}

# transport_id: the device's transport_id in `adb devices -l`.
transport_id() {
    adb -P "$PORT" devices -l 2>/dev/null | sed -n "s/^${SERIAL} .*transport_id:\([0-9]*\)$/\1/p"
}

# replug N: unbinds and binds the gadget, timing when the server's clients
# see it leave and come back.
replug() {
    local n="$1" before after t_unbind t_bind took
    before="$(transport_id)"
    # Started first: adb's wait returns when the server says so.
    wait_in_background wait-for-usb-disconnect
    local waiter=$REPLY
    sleep 1
    local udc
    rd "$UDC_FILE"
    udc="$REPLY"
    [ -n "$udc" ] || fail "replug ${n}: the gadget is not bound"
    now_us
    t_unbind=$REPLY
    printf '\n' >"$UDC_FILE" || fail "replug ${n}: unbind"
    wait "$waiter"
    if took="$(waited wait-for-usb-disconnect "$t_unbind")"; then
        [ "$took" -le "$WITHIN_US" ] && pass "replug ${n}: wait-for-usb-disconnect returned ${took} us after the unbind" ||
            fail "replug ${n}: wait-for-usb-disconnect took ${took} us"
    else
        fail "replug ${n}: wait-for-usb-disconnect did not return"
    fi
    if took="$(track_after "$t_unbind" gone)"; then
        [ "$took" -le "$WITHIN_US" ] && pass "replug ${n}: gone from track-devices ${took} us after the unbind" ||
            fail "replug ${n}: gone from track-devices only ${took} us after the unbind"
    else
        fail "replug ${n}: still in track-devices after the unbind: $(tail -n2 "$DIR/track.txt")"
    fi

    wait_in_background wait-for-usb-device
    waiter=$REPLY
    sleep 1
    now_us
    t_bind=$REPLY
    printf '%s\n' "$udc" >"$UDC_FILE" || fail "replug ${n}: bind to ${udc}"
    if took="$(track_after "$t_bind" listed)"; then
        [ "$took" -le "$WITHIN_US" ] && pass "replug ${n}: listed in track-devices ${took} us after the bind" ||
            fail "replug ${n}: listed in track-devices only ${took} us after the bind"
    else
        fail "replug ${n}: not in track-devices after the bind: $(tail -n2 "$DIR/track.txt")"
    fi
    wait "$waiter"
    if took="$(waited wait-for-usb-device "$t_bind")"; then
        [ "$took" -le "$DEVICE_WITHIN_US" ] && pass "replug ${n}: wait-for-usb-device returned ${took} us after the bind" ||
            fail "replug ${n}: wait-for-usb-device took ${took} us"
    else
        fail "replug ${n}: wait-for-usb-device did not return"
    fi
    after="$(transport_id)"
    [ -n "$before" ] && [ -n "$after" ] && [ "$before" != "$after" ] &&
        pass "replug ${n}: transport_id ${before} -> ${after}" ||
        fail "replug ${n}: transport_id '${before}' -> '${after}'"
    expect_output "replug ${n}: shell after the bind" "back ${n}" adb -P "$PORT" -d shell echo back "$n"
}

run_speed() {
    local speed="$1" line
    DIR="${OUT}/${speed}"
    OK=1
    mkdir -p "$DIR" /tmp/device /tmp/host
    load_dummy_hcd "$speed" || return 1

    # The host key (made without a server), not trusted by the daemon yet.
    [ -f "$HOME/.android/adbkey" ] || { mkdir -p "$HOME/.android" && adb keygen "$HOME/.android/adbkey" >/dev/null 2>&1; } ||
        { echo "adb keygen failed"; return 1; }
    local keys="$DIR/adb_keys"
    rm -f "$keys"
    : >"$keys"

    RUST_LOG=info,oxadb::server=debug "$OXADB" server -P "$PORT" >"$DIR/server.log" 2>&1 &
    SERVER_PID=$!
    wait_listening "$PORT" || { echo "oxadb server is not listening on ${PORT}:"; tail -5 "$DIR/server.log"; return 1; }
    # stdbuf: adb's stdout to a pipe is otherwise flushed only when full.
    stdbuf -o0 adb -P "$PORT" track-devices 2>"$DIR/track.err" | python3 "$STAMP" >"$DIR/track.txt" &
    TRACK_PID=$!

    "$GADGET_SH" setup --serial "$SERIAL" --ffs-dir "$FFS_DIR" >/dev/null || return 1
    RUST_LOG=info "$OXADBD" --usb --ffs-dir "$FFS_DIR" --keys "$keys" --product-model "USB VM" \
        >"$DIR/oxadbd.log" 2>&1 &
    DAEMON_PID=$!
    "$GADGET_SH" bind >/dev/null || { echo "bind failed:"; tail -5 "$DIR/oxadbd.log"; return 1; }

    # 1. Unauthorized, then authorized by the retry.
    local i
    for ((i = 0; i < 50; i++)); do
        adb -P "$PORT" devices 2>/dev/null | grep -q "^${SERIAL}"$'\tunauthorized$' && break
        sleep 0.2
    done
    line="$(adb -P "$PORT" devices 2>&1 | grep "^${SERIAL}")"
    [ "$line" = "${SERIAL}"$'\tunauthorized' ] && pass "adb devices: unauthorized before the key is trusted" ||
        fail "adb devices: '${line}', expected unauthorized: $(adb -P "$PORT" devices 2>&1)"
    line="$(timeout "$LIMIT" adb -P "$PORT" -d shell echo no 2>&1)"
    case "$line" in
        *"device unauthorized"*) pass "adb -d shell while unauthorized: $(head -n1 <<<"$line")" ;;
        *) fail "adb -d shell while unauthorized: '${line}'" ;;
    esac
    "$OXADBD" trust-key "$HOME/.android/adbkey.pub" --keys "$keys" >/dev/null || fail "trust-key"
    if timeout 10 adb -P "$PORT" wait-for-usb-device; then
        pass "authorized by the server's retry once the key is trusted"
    else
        fail "still not a device 10 s after the key was trusted: $(adb -P "$PORT" devices 2>&1)"
        return 1
    fi

    # 2. Listing, selectors, shell, push and pull.
    line="$(adb -P "$PORT" devices -l 2>&1 | grep "^${SERIAL}")"
    if [[ "$line" =~ ^${SERIAL}\ +device\ usb:[0-9]+-[0-9.]+\ product:[^\ ]+\ model:USB_VM\ device:[^\ ]+\ transport_id:[0-9]+$ ]]; then
        pass "adb devices -l: ${line}"
    else
        fail "adb devices -l: '${line}'"
    fi
    local devpath
    devpath="$(timeout "$LIMIT" adb -P "$PORT" -d get-devpath 2>&1)"
    [[ "$devpath" =~ ^usb:[0-9]+-[0-9.]+$ ]] && [[ "$line" == *" ${devpath} "* ]] &&
        pass "adb -d get-devpath: ${devpath}" || fail "adb -d get-devpath: '${devpath}'"
    expect_output "adb -d get-serialno" "$SERIAL" adb -P "$PORT" -d get-serialno
    expect_output "adb -s SERIAL shell echo" "hello usb" adb -P "$PORT" -s "$SERIAL" shell echo hello usb
    expect_output "adb -s DEVPATH shell echo" "by path" adb -P "$PORT" -s "$devpath" shell echo by path
    expect_status "adb -d shell exit status" 3 adb -P "$PORT" -d shell 'exit 3'
    line="$(timeout "$LIMIT" adb -P "$PORT" -e shell echo 2>&1)"
    case "$line" in
        *"no emulators found"*) pass "adb -e: ${line}" ;;
        *) fail "adb -e: '${line}', expected no emulators found" ;;
    esac
    local start=$SECONDS
    if timeout "$LIMIT" adb -P "$PORT" -d push /tmp/random "/tmp/device/random" >"$DIR/push.txt" 2>&1 &&
        [ "$(sha /tmp/device/random)" = "$RANDOM_SHA" ]; then
        pass "adb -d push 16 MiB, sha256 matches ($((SECONDS - start)) s; $(tail -n1 "$DIR/push.txt"))"
    else
        fail "adb -d push: $(tail -n3 "$DIR/push.txt")"
    fi
    start=$SECONDS
    if timeout "$LIMIT" adb -P "$PORT" -d pull /tmp/device/random /tmp/host/random >"$DIR/pull.txt" 2>&1 &&
        [ "$(sha /tmp/host/random)" = "$RANDOM_SHA" ]; then
        pass "adb -d pull 16 MiB, sha256 matches ($((SECONDS - start)) s; $(tail -n1 "$DIR/pull.txt"))"
    else
        fail "adb -d pull: $(tail -n3 "$DIR/pull.txt")"
    fi
    rm -f /tmp/host/random
    expect_output "adb 34 -d shell echo" "hello 34" "$ADB34" -P "$PORT" -d shell echo hello 34
    expect_status "adb 34 -d shell exit status" 7 "$ADB34" -P "$PORT" -d shell 'exit 7'
    if timeout "$LIMIT" "$ADB34" -P "$PORT" -d pull /tmp/device/random /tmp/host/random >"$DIR/pull34.txt" 2>&1 &&
        [ "$(sha /tmp/host/random)" = "$RANDOM_SHA" ]; then
        pass "adb 34 -d pull 16 MiB, sha256 matches"
    else
        fail "adb 34 -d pull: $(tail -n3 "$DIR/pull34.txt")"
    fi

    # 3. Hotplug.
    replug 1
    replug 2

    # 4. ADB_USB=0: no USB for that server.
    ADB_USB=0 RUST_LOG=info "$OXADB" server -P "$PORT_NO_USB" >"$DIR/server-no-usb.log" 2>&1 &
    local no_usb=$!
    if wait_listening "$PORT_NO_USB"; then
        # Let a USB scan, were there one, find the device.
        sleep 1
        expect_output "ADB_USB=0 server: no USB device listed" "List of devices attached" \
            env ADB_USB=0 adb -P "$PORT_NO_USB" devices
        grep -q "no USB\|USB device found" "$DIR/server-no-usb.log" &&
            fail "ADB_USB=0 server looked at USB: $(grep -m1 USB "$DIR/server-no-usb.log")"
    else
        fail "ADB_USB=0 server is not listening on ${PORT_NO_USB}"
    fi
    ADB_USB=0 adb -P "$PORT_NO_USB" kill-server >/dev/null 2>&1
    stop "$no_usb"
    expect_output "the first server still has it" "still" adb -P "$PORT" -d shell echo still

    if grep -q "panicked" "$DIR/server.log" "$DIR/oxadbd.log"; then fail "a panic: $(grep -m1 panicked "$DIR/server.log" "$DIR/oxadbd.log")"; fi
    cleanup_speed
    [ "$OK" = 1 ]
}

after_failed_speed() {
    echo "  server log tail:"
    tail -n 15 "${OUT}/${1}/server.log" 2>/dev/null | sed 's/^/    /'
}

head -c 16M /dev/urandom >/tmp/random
RANDOM_SHA="$(sha /tmp/random)"
remove_test_data() { rm -rf /tmp/random /tmp/device /tmp/host; }
trap 'cleanup_speed; remove_test_data' EXIT

run_speeds "high" "$@"
