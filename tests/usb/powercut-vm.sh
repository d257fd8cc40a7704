#!/usr/bin/env bash
# One boot of the power-cut test, inside the VM of scripts/usb-vm.sh with two
# virtio disks (tests/usb/powercut.sh boots it three times on the same disks):
#
#   powercut-vm.sh mkfs push full     boot 1
#   powercut-vm.sh check full push none   boot 2
#   powercut-vm.sh check none         boot 3
#
# mkfs         ext4 on /dev/vda (mounted with noauto_da_alloc, so that ext4
#              does not flush a file renamed over another on its own) and xfs
#              on /dev/vdb; 20 old files of random sizes on each, synced.
# push LEVEL   oxadbd --durability LEVEL on loopback; 20 new files of random
#              sizes (1 KiB to 4 MiB, random content) replace the old ones on
#              both filesystems, f01-f10 with adb 29 and f11-f20 with oxadb,
#              over TCP; their sha256 (and the old ones') go to
#              $USB_VM_OUT/powercut/manifest-LEVEL.txt first. Right after the
#              last push reports success the VM is cut off without any sync
#              (sysrq b; usb-vm.sh runs qemu with -no-reboot, so it exits).
#              Periodic writeback is off, so only what the daemon flushed
#              reaches the disk.
# hold SECS    the next push waits SECS between its last success and the cut
#              (0 by default: for showing what a later cut leaves).
# check LEVEL  mounts both (journal replay), classifies each file against the
#              manifest: new, old, empty, missing or other (neither version),
#              and counts leftover temporary files (.oxadb-push.*). Results go
#              to $USB_VM_OUT/powercut/result-LEVEL.txt. For full anything but
#              20 new files and no leftover on each filesystem is a failure;
#              for none and rename what was lost is recorded, never a failure.
# Logs go to $USB_VM_OUT/powercut/. Prints PASS or FAIL (a push ends the VM
# after writing its status to $USB_VM_STATUS instead).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OXADB="${REPO}/target/release/oxadb"
OXADBD="${REPO}/target/release/oxadbd"
OUT="${USB_VM_OUT:-/tmp/usb-vm-out}/powercut"
LIMIT=120
PORT=40575
SERIAL="127.0.0.1:${PORT}"
FSES=(ext4 xfs)
declare -A DEV=([ext4]=/dev/vda [xfs]=/dev/vdb)
declare -A OPTS=([ext4]=noauto_da_alloc [xfs]=defaults)
NFILES=20
HOLD=0
export HOME=/tmp/home
unset ANDROID_SERIAL

die() {
    printf 'powercut-vm: %s\n' "$*" >&2
    echo "FAIL"
    exit 1
}

[ "${USB_VM:-}" = 1 ] || die "run this inside the VM: tests/usb/powercut.sh boots it"
[ -n "${USB_VM_STATUS:-}" ] || die "USB_VM_STATUS is not set (an older scripts/usb-vm.sh?)"
for exe in "$OXADB" "$OXADBD"; do
    [ -x "$exe" ] || die "$exe is missing: cargo build --release"
done
command -v adb >/dev/null || die "Google adb 29 is missing (scripts/usb-vm.sh prepare installs Debian's adb)"
mkdir -p "$HOME" "$OUT" /tmp/powercut

OK=1
pass() { echo "  ok: $*"; }
fail() {
    echo "  FAILED: $*"
    OK=0
}

# NAMES[i]: f01..f20 (no command substitution per name: each fork costs a
# tenth of a second under TCG).
NAMES=()
for ((i = 1; i <= NFILES; i++)); do printf -v 'NAMES[i]' 'f%02d' "$i"; done
declare -A SIZE

# CUR[fs/name]: the sha256 each destination has now ("-" when missing).
declare -A CUR

# hash_into PREFIX FILE...: CUR[PREFIX/basename] for each FILE (one process).
hash_into() {
    local prefix="$1" sum path
    shift
    while read -r sum path; do
        CUR["${prefix}/${path##*/}"]="$sum"
    done <<<"$(sha256sum "$@" 2>/dev/null)"
}

mount_all() {
    local fs
    modprobe -a virtio_blk ext4 xfs || die "modprobe virtio_blk ext4 xfs failed"
    for fs in "${FSES[@]}"; do
        for ((i = 0; i < 50; i++)); do
            [ -b "${DEV[$fs]}" ] && break
            sleep 0.1
        done
        [ -b "${DEV[$fs]}" ] || die "${DEV[$fs]} did not appear (is USB_VM_DISK set with two images?)"
        mkdir -p "/run/powercut/$fs"
    done
}

mount_fs() {
    local fs="$1"
    mount -t "$fs" -o "${OPTS[$fs]}" "${DEV[$fs]}" "/run/powercut/$fs" ||
        die "mount -t $fs -o ${OPTS[$fs]} ${DEV[$fs]} /run/powercut/$fs failed: $(dmesg | tail -n 5)"
}

# random_files DIR: f01..f20 of random sizes (1 KiB to 4 MiB), random content.
random_files() {
    local dir="$1" i size
    rm -rf "$dir"
    mkdir -p "$dir"
    for ((i = 1; i <= NFILES; i++)); do
        size=$((1024 + SRANDOM % (4 * 1048576 - 1024 + 1)))
        SIZE["${NAMES[i]}"]="$size"
        head -c "$size" /dev/urandom >"$dir/${NAMES[i]}" || die "writing $dir/${NAMES[i]} failed"
    done
}

do_mkfs() {
    local fs i start=$SECONDS
    rm -rf "$OUT"
    mkdir -p "$OUT"
    mount_all
    mkfs.ext4 -q -F "${DEV[ext4]}" >"$OUT/mkfs-ext4.txt" 2>&1 || die "mkfs.ext4 ${DEV[ext4]}: $(cat "$OUT/mkfs-ext4.txt")"
    mkfs.xfs -q -f "${DEV[xfs]}" >"$OUT/mkfs-xfs.txt" 2>&1 || die "mkfs.xfs ${DEV[xfs]}: $(cat "$OUT/mkfs-xfs.txt")"
    pass "mkfs.ext4 and mkfs.xfs ($((SECONDS - start)) s)"
    random_files /tmp/powercut/old
    for fs in "${FSES[@]}"; do
        mount_fs "$fs"
        cp /tmp/powercut/old/f* "/run/powercut/$fs/" || die "copying the old versions to $fs failed"
    done
    sync
    hash_into old /tmp/powercut/old/f*
    for fs in "${FSES[@]}"; do
        for ((i = 1; i <= NFILES; i++)); do CUR["$fs/${NAMES[i]}"]="${CUR[old/${NAMES[i]}]}"; done
    done
    pass "mkfs: ext4 on ${DEV[ext4]} (${OPTS[ext4]}), xfs on ${DEV[xfs]}, ${NFILES} old files each, synced ($((SECONDS - start)) s)"
}

do_check() {
    local level="$1" fs i n sum size kind
    local manifest="$OUT/manifest-${level}.txt"
    [ -s "$manifest" ] || die "no manifest ${manifest}: the push of ${level} did not get that far"
    mount_all
    local -A NEW OLD CLIENT NEWSIZE
    while read -r fs n client old new size _; do
        NEWSIZE["$fs/$n"]="$size"
        NEW["$fs/$n"]="$new"
        OLD["$fs/$n"]="$old"
        CLIENT["$fs/$n"]="$client"
    done <"$manifest"
    : >"$OUT/result-${level}.txt"
    for fs in "${FSES[@]}"; do
        mount_fs "$fs"
        local -A count=([new]=0 [old]=0 [empty]=0 [missing]=0 [other]=0)
        local files=() temps=()
        for ((i = 1; i <= NFILES; i++)); do
            [ -e "/run/powercut/$fs/${NAMES[i]}" ] && files+=("/run/powercut/$fs/${NAMES[i]}")
            CUR["$fs/${NAMES[i]}"]="-"
        done
        [ "${#files[@]}" -eq 0 ] || hash_into "$fs" "${files[@]}"
        for ((i = 1; i <= NFILES; i++)); do
            n="${NAMES[i]}"
            sum="${CUR[$fs/$n]}"
            if [ "$sum" = "-" ]; then
                kind=missing
            elif [ "$sum" = "${NEW[$fs/$n]}" ]; then
                kind=new
            elif [ "$sum" = "${OLD[$fs/$n]}" ]; then
                kind=old
            else
                size=$(stat -c %s "/run/powercut/$fs/$n")
                if [ "$size" = 0 ]; then kind=empty; else kind=other; fi
            fi
            count[$kind]=$((count[$kind] + 1))
            # other: its size beside the new version's, and whether it is all zeros
            if [ "$kind" = other ]; then
                if cmp -s -n "$size" "/run/powercut/$fs/$n" /dev/zero; then
                    kind="other size=${size} of ${NEWSIZE[$fs/$n]}, all zeros"
                else
                    kind="other size=${size} of ${NEWSIZE[$fs/$n]}, not all zeros"
                fi
            fi
            echo "$fs $n ${CLIENT[$fs/$n]} $kind" >>"$OUT/detail-${level}.txt"
        done
        for f in "/run/powercut/$fs"/.oxadb-push.*; do [ -e "$f" ] && temps+=("$f"); done
        echo "$level $fs new=${count[new]} old=${count[old]} empty=${count[empty]} missing=${count[missing]} other=${count[other]} temp=${#temps[@]}" |
            tee -a "$OUT/result-${level}.txt"
        if [ "$level" = full ]; then
            if [ "${count[new]}" = "$NFILES" ] && [ "${#temps[@]}" = 0 ]; then
                pass "full, $fs: all ${NFILES} files have the new content after the cut, no temporary file left"
            else
                fail "full, $fs: $(tail -n1 "$OUT/result-${level}.txt") (per file: $OUT/detail-${level}.txt)"
            fi
        elif [ "${count[new]}" = "$NFILES" ]; then
            echo "  NOTE: ${level}, $fs: nothing lost this time (the cut came after the kernel wrote everything back)"
        else
            echo "  ${level}, $fs: $((NFILES - count[new])) of ${NFILES} files lost their new content (recorded, not a failure)"
        fi
        unset count
    done
}

DAEMON_PID=""
stop_daemon() {
    adb kill-server >/dev/null 2>&1 || true
    if [ -n "$DAEMON_PID" ]; then
        kill "$DAEMON_PID" 2>/dev/null || true
        wait "$DAEMON_PID" 2>/dev/null || true
        DAEMON_PID=""
    fi
}
trap stop_daemon EXIT

# push LEVEL: ends the VM (sysrq b) when every push succeeded; returns otherwise.
do_push() {
    local level="$1" fs i n
    case "$level" in full | rename | none) ;; *) die "unknown durability level '$level'" ;; esac
    # Only the daemon's flushes may bring the new data to the disk: no
    # periodic writeback, dirty pages never expire, no background writeback
    # below half of memory (40 MiB per filesystem stays far below).
    sysctl -q -w vm.dirty_writeback_centisecs=0 vm.dirty_expire_centisecs=360000 \
        vm.dirty_background_ratio=50 vm.dirty_ratio=80 || die "sysctl vm.dirty_* failed"
    echo 1 >/proc/sys/kernel/sysrq || die "cannot enable sysrq"
    random_files /tmp/powercut/new
    hash_into new /tmp/powercut/new/f*
    local manifest="$OUT/manifest-${level}.txt"
    : >"$manifest"
    for fs in "${FSES[@]}"; do
        for ((i = 1; i <= NFILES; i++)); do
            n="${NAMES[i]}"
            if [ "$i" -le $((NFILES / 2)) ]; then client=adb29; else client=oxadb; fi
            echo "$fs $n $client ${CUR[$fs/$n]:--} ${CUR[new/$n]} ${SIZE[$n]}" >>"$manifest"
        done
    done

    "$OXADBD" --listen "$SERIAL" --durability "$level" >"$OUT/oxadbd-${level}.log" 2>&1 &
    DAEMON_PID=$!
    for ((i = 0; i < 100; i++)); do
        grep -q "listening on" "$OUT/oxadbd-${level}.log" && break
        kill -0 "$DAEMON_PID" 2>/dev/null || break
        sleep 0.1
    done
    grep -q "listening on" "$OUT/oxadbd-${level}.log" || die "oxadbd did not start: $(tail -5 "$OUT/oxadbd-${level}.log")"
    # Root on loopback needs no key (oxadbd's default).
    timeout "$LIMIT" adb connect "$SERIAL" >"$OUT/adb-connect.txt" 2>&1
    for ((i = 0; i < 50; i++)); do
        adb devices 2>/dev/null | grep -q "^${SERIAL}"$'\tdevice$' && break
        sleep 0.2
    done
    adb devices 2>/dev/null | grep -q "^${SERIAL}"$'\tdevice$' ||
        die "adb 29 does not see ${SERIAL} as a device: $(cat "$OUT/adb-connect.txt"; adb devices 2>&1)"

    local first=() second=() start=$SECONDS
    for ((i = 1; i <= NFILES; i++)); do
        if [ "$i" -le $((NFILES / 2)) ]; then first+=("/tmp/powercut/new/${NAMES[i]}"); else second+=("/tmp/powercut/new/${NAMES[i]}"); fi
    done
    for fs in "${FSES[@]}"; do
        timeout "$LIMIT" adb -s "$SERIAL" push "${first[@]}" "/run/powercut/$fs/" >"$OUT/push-${level}-adb29-${fs}.txt" 2>&1 ||
            { fail "adb 29 push to $fs (${level}): $(tail -n 3 "$OUT/push-${level}-adb29-${fs}.txt")"; return 1; }
    done
    for fs in "${FSES[@]}"; do
        timeout "$LIMIT" "$OXADB" -s "$SERIAL" push -q "${second[@]}" "/run/powercut/$fs/" >"$OUT/push-${level}-oxadb-${fs}.txt" 2>&1 ||
            { fail "oxadb push to $fs (${level}): $(tail -n 3 "$OUT/push-${level}-oxadb-${fs}.txt")"; return 1; }
    done
    if [ "$HOLD" != 0 ]; then
        echo "  holding ${HOLD} s before the cut"
        sleep "$HOLD"
    fi
    # The cut: status first (init never gets to write it), then reset the
    # machine at once, without sync or unmount.
    local msg="pushed ${NFILES} files to each of ${FSES[*]} with --durability ${level} ($((SECONDS - start)) s); cutting the power"
    echo "  $msg"
    echo "$msg" >"$OUT/cut-${level}.txt"
    if [ "$OK" = 1 ]; then echo 0 >"$USB_VM_STATUS"; else echo 1 >"$USB_VM_STATUS"; fi
    echo b >/proc/sysrq-trigger
    sleep 30
    die "sysrq b did not reset the VM"
}

while [ "$#" -gt 0 ]; do
    case "$1" in
        mkfs) echo "=== mkfs"; do_mkfs; shift ;;
        check) [ "$#" -ge 2 ] || die "check needs a level"; echo "=== check ${2}"; do_check "$2"; shift 2 ;;
        hold)
            [[ "${2:-}" =~ ^[0-9]+$ ]] || die "hold needs a number of seconds, not '${2:-}'"
            HOLD="$2"
            shift 2
            ;;
        push) [ "$#" -ge 2 ] || die "push needs a level"; echo "=== push ${2}"; do_push "$2" || break; shift 2 ;;
        *) die "unknown step '$1' (mkfs, check LEVEL, hold SECS, push LEVEL)" ;;
    esac
done
stop_daemon
if [ "$OK" = 1 ]; then echo "PASS"; else echo "FAIL"; exit 1; fi
