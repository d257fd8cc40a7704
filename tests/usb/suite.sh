#!/usr/bin/env bash
# The USB part of the test command, in one VM boot (scripts/usb-vm.sh run
# tests/usb/suite.sh): usb-interop.sh (Google adb and oxadb against oxadbd over
# dummy_hcd) at high and super speed, the
# daemon's own checks (unplug cycles, fd and thread counts) at full speed,
# the host driver's packet-edge and claimed-interface checks at high
# speed, `oxadb server` with the gadget as a USB device (server-usb.sh: adb
# 29 and 34 through it, unauthorized then authorized, hotplug) at high
# speed, a USB device that opens streams to its host unasked (hostile-usb.sh:
# oxadb directly and through its server refuse them, a reverse's spec
# alone is relayed) at high speed, and vsock and `framebuffer:` (devio-vm.sh, 37 s of the 290 s on a busy machine). Each
# script prints PASS or FAIL; this exits non-zero if any failed.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
failed=()
run() {
    local start=$SECONDS
    echo "##### $*"
    "$@" || failed+=("$*")
    echo "##### $* took $((SECONDS - start)) s"
}
run "$HERE/usb-interop.sh" high super
run "$HERE/daemon-smoke.sh" full
run "$HERE/host-smoke.sh" high
run "$HERE/server-usb.sh" high
run "$HERE/hostile-usb.sh" high
run "$HERE/devio-vm.sh"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "USB suite FAILED: ${failed[*]}"
    exit 1
fi
echo "USB suite passed"
