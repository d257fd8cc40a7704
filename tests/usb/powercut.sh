#!/usr/bin/env bash
# Power cut: pushed files survive a VM cut off right after the push reported
# success (--durability full), and the same test shows what --durability none
# loses. Runs on this machine as root and boots the VM of scripts/usb-vm.sh
# three times on the same two virtio disks (raw images under
# target/usb-vm/powercut/, made afresh each run):
#
#   cargo build --release
#   sudo tests/usb/powercut.sh
#
#   boot 1  mkfs (ext4 noauto_da_alloc, xfs), old files, push full, cut
#   boot 2  check full (a failure unless all 20 files are new on both),
#           push none, cut
#   boot 3  check none (recorded, never a failure)
#
# The steps are tests/usb/powercut-vm.sh's; results in
# target/usb-vm/out/powercut/ (result-LEVEL.txt, detail-LEVEL.txt, logs).
# Prints the table of files new/old/empty/missing per level and filesystem,
# then PASS or FAIL; exits 0 only on PASS.
#
# Environment: POWERCUT_TIMEOUT, seconds each boot may take (180);
# POWERCUT_NONE_HOLD, seconds between the last `none` push and its cut (0).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
IMAGES="${REPO}/target/usb-vm/powercut"
OUT="${REPO}/target/usb-vm/out/powercut"

die() {
    printf 'powercut: %s\n' "$*" >&2
    echo "FAIL"
    exit 1
}

[ "$(id -u)" -eq 0 ] || die "run as root (scripts/usb-vm.sh needs it)"
cd "$REPO" || die "cd $REPO"
rm -rf "$IMAGES"
mkdir -p "$IMAGES"
# Sparse: only what the guest writes takes space. xfs needs 300 MB at least.
if ! truncate -s 256M "${IMAGES}/ext4.img" || ! truncate -s 320M "${IMAGES}/xfs.img"; then
    die "cannot make the disk images in ${IMAGES}"
fi

failed=()
boot() {
    local start=$SECONDS
    echo "##### boot: $*"
    # KEEP_OUT: each boot reads what the previous one recorded (and the USB
    # suite's logs, when it ran first, stay).
    USB_VM_DISK="${IMAGES}/ext4.img:${IMAGES}/xfs.img" USB_VM_KEEP_OUT=1 \
        USB_VM_TIMEOUT="${POWERCUT_TIMEOUT:-180}" \
        bash scripts/usb-vm.sh run tests/usb/powercut-vm.sh "$@" || failed+=("$*")
    echo "##### boot: $* took $((SECONDS - start)) s"
}

start=$SECONDS
boot mkfs push full
# Without boot 1's push there is nothing to check.
[ "${#failed[@]}" -eq 0 ] || die "boot 1 failed (mkfs push full): see the output above and ${OUT}"
boot check full hold "${POWERCUT_NONE_HOLD:-0}" push none
boot check none

echo
echo "Files after the cut, of 20 per filesystem (new: the pushed content; old: the"
echo "version it replaced; empty; missing; other: neither; temp: .oxadb-push.* left):"
printf '%-12s %-6s %5s %5s %6s %8s %6s %5s\n' durability fs new old empty missing other temp
for level in full none; do
    if [ ! -s "${OUT}/result-${level}.txt" ]; then
        printf '%-12s (no result: see %s)\n' "$level" "$OUT"
        continue
    fi
    while read -r lvl fs rest; do
        declare -A c=()
        for kv in $rest; do c[${kv%%=*}]=${kv#*=}; done
        printf '%-12s %-6s %5s %5s %6s %8s %6s %5s\n' "$lvl" "$fs" "${c[new]}" "${c[old]}" "${c[empty]}" "${c[missing]}" "${c[other]}" "${c[temp]}"
        unset c
    done <"${OUT}/result-${level}.txt"
done
echo "(3 boots in $((SECONDS - start)) s)"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAIL: ${failed[*]} (the disk images stay in ${IMAGES} for a look)"
    exit 1
fi
rm -rf "$IMAGES"
echo "PASS"
