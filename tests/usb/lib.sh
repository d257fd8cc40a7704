# shellcheck shell=bash
# What the in-VM USB scripts share (sourced, not run): the dummy_hcd speed
# switch, a fork-free file read, and the loop that runs each speed and sums
# up, and the checks that print `ok:` or `FAILED:` lines. The sourcing
# script sets OK=1 and LIMIT (seconds per command), and defines `die`,
# `run_speed SPEED` and
# `cleanup_speed`, and may define `after_failed_speed SPEED` (extra output
# after a speed failed).

# rd FILE: the file's first line in $REPLY, without a fork (each process
# costs a tenth of a second under TCG).
rd() {
    REPLY=""
    read -r REPLY 2>/dev/null <"$1" || true
}

# load_dummy_hcd SPEED: reloads dummy_hcd so that the gadget enumerates at
# SPEED (full, high or super) and announces it.
load_dummy_hcd() {
    local speed="$1" params
    case "$speed" in
        full) params="is_high_speed=0 is_super_speed=0" ;;
        high) params="is_high_speed=1 is_super_speed=0" ;;
        super) params="is_high_speed=1 is_super_speed=1" ;;
        *) die "unknown speed '$speed' (full, high or super)" ;;
    esac
    echo
    echo "=== ${speed} speed: dummy_hcd ${params}"
    { rmmod dummy_hcd 2>/dev/null || [ ! -d /sys/module/dummy_hcd ]; } || { echo "cannot unload dummy_hcd"; return 1; }
    # shellcheck disable=SC2086 # a list of module parameters
    modprobe dummy_hcd $params || { echo "modprobe dummy_hcd $params failed"; return 1; }
}

# run_speeds "DEFAULT SPEEDS" [SPEED...]: run_speed for each SPEED given (the
# defaults when none), PASS or FAIL per speed and overall; exits 1 if any failed.
run_speeds() {
    local defaults="$1" speed
    shift
    local speeds=("$@") failed=()
    # shellcheck disable=SC2206 # a space-separated list of speeds
    [ "${#speeds[@]}" -gt 0 ] || speeds=($defaults)
    for speed in "${speeds[@]}"; do
        if run_speed "$speed"; then
            echo "PASS: ${speed} speed"
        else
            echo "FAIL: ${speed} speed"
            if declare -F after_failed_speed >/dev/null; then after_failed_speed "$speed"; fi
            failed+=("$speed")
            cleanup_speed
        fi
    done
    echo
    if [ "${#failed[@]}" -eq 0 ]; then
        echo "PASS (${speeds[*]})"
    else
        echo "FAIL (${failed[*]} of ${speeds[*]})"
        exit 1
    fi
}

# pass WHAT / fail WHAT: one check's line; a failure clears OK.
pass() { echo "  ok: $*"; }
fail() {
    echo "  FAILED: $*"
    OK=0
}

# expect_output WHAT EXPECTED COMMAND...: the command's output (stdout and
# stderr) must be EXPECTED, within LIMIT seconds.
expect_output() {
    local what="$1" expected="$2" got
    shift 2
    got="$(timeout "$LIMIT" "$@" 2>&1)"
    if [ "$got" = "$expected" ]; then pass "$what"; else fail "$what: got '${got}'"; fi
}

# expect_status WHAT STATUS COMMAND...: the command's exit status.
expect_status() {
    local what="$1" expected="$2" rc
    shift 2
    timeout "$LIMIT" "$@" >/dev/null 2>&1
    rc=$?
    if [ "$rc" = "$expected" ]; then pass "$what (exit ${rc})"; else fail "$what: exit ${rc}, expected ${expected}"; fi
}

sha() { sha256sum "$1" | cut -d' ' -f1; }
