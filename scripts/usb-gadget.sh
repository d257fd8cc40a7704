#!/usr/bin/env bash
# Sets up the USB gadget through which oxadbd serves ADB over USB (Linux
# configfs + FunctionFS), on a board with a USB device controller (UDC).
#
#   usb-gadget.sh setup [--serial S] [--ffs-dir DIR]   make gadget "oxadbd", mount FunctionFS "adb" on DIR
#   usb-gadget.sh bind [--ffs-dir DIR] [UDC]           attach it to UDC (default: the first in /sys/class/udc)
#   usb-gadget.sh unbind                               detach it from its UDC
#   usb-gadget.sh teardown                             unbind, unmount, remove the gadget
#
# The order on a board:  setup; start `oxadbd` on DIR; bind.  The kernel
# accepts the bind only once the daemon has written its USB descriptors to
# DIR/ep0 (that is when DIR/ep1 and DIR/ep2 appear), so bind waits for them
# (USB_GADGET_WAIT seconds, 10 by default). When the daemon closes ep0 (it
# exits or restarts) the kernel unbinds the gadget by itself: bind again once
# it is back. teardown needs the daemon stopped (it holds files in DIR).
# Every command is idempotent; setup refuses to change a bound gadget.
# Run as root.
#
# The gadget: Google's ADB ids (idVendor 0x18d1, idProduct 0x4ee7), USB 2.0
# (the kernel raises bcdUSB itself on a SuperSpeed controller), strings in
# English (manufacturer, product "oxadbd", serial number: --serial, else the
# first 16 characters of /etc/machine-id, else the host name), one
# configuration c.1 holding the FunctionFS function ffs.adb.
#   DIR defaults to /dev/usb-ffs/adb, as on Android.
set -euo pipefail

GADGET_NAME=oxadbd
CONFIGFS=/sys/kernel/config
GADGET="${CONFIGFS}/usb_gadget/${GADGET_NAME}"
FUNC=ffs.adb    # "ffs." + the FunctionFS instance name, "adb", which is also the mount's source
FFS_NAME=adb
DEFAULT_FFS_DIR=/dev/usb-ffs/adb
VENDOR=0x18d1
PRODUCT=0x4ee7
BCD_DEVICE=0x0100
MANUFACTURER=oxadb
PRODUCT_NAME=oxadbd
CONFIG_STRING="ADB"
MAX_POWER=500 # mA

die() {
    printf 'usb-gadget: %s\n' "$*" >&2
    exit 1
}
say() { printf 'usb-gadget: %s\n' "$*"; }

usage() {
    sed -n '5,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# write_attr VALUE FILE: writes only when the file does not already say
# VALUE, so that a repeated setup leaves a bound gadget alone. A failed write
# names the file and the kernel's reason (bash's message, then ours). No
# subshells: every fork counts on a slow board or an emulated CPU.
write_attr() {
    local value="$1" file="$2" cur=""
    read -r cur 2>/dev/null <"$file" || true
    [ "$cur" = "$value" ] && return 0
    # The kernel takes most of these while bound but the host would not see
    # them until the next enumeration: refuse rather than half-apply.
    [ -z "${BOUND:-}" ] || die "the gadget is bound to ${BOUND}: unbind before changing ${file} ('${cur}' -> '${value}')"
    printf '%s\n' "$value" >"$file" || die "cannot write '${value}' to ${file} (the kernel's reason is above)"
}

make_dir() {
    local err
    [ -d "$1" ] && return 0
    err="$(mkdir "$1" 2>&1)" || die "cannot create ${1}: ${err##*: }"
}

remove_dir() {
    local err
    [ -d "$1" ] || return 0
    err="$(rmdir "$1" 2>&1)" || die "cannot remove ${1}: ${err##*: }"
}

load_module() {
    # Built in, or loaded already: nothing to do.
    [ -d "/sys/module/$1" ] && return 0
    command -v modprobe >/dev/null 2>&1 || die "kernel module $1 is not loaded and modprobe is missing (Debian package kmod)"
    modprobe "$1" || die "modprobe $1 failed: this kernel needs CONFIG_USB_LIBCOMPOSITE and CONFIG_USB_CONFIGFS_F_FS (module names libcomposite, usb_f_fs)"
}

# The directory where FunctionFS instance "adb" is mounted, if it is.
ffs_mountpoint() {
    local src mp type rest
    while read -r src mp type rest; do
        if [ "$type" = functionfs ] && [ "$src" = "$FFS_NAME" ]; then
            echo "${mp//\\040/ }" # /proc/mounts writes a space as \040
            return 0
        fi
    done </proc/mounts
}

ensure_configfs() {
    local src mp type rest mounted=0
    while read -r src mp type rest; do
        if [ "$mp" = "$CONFIGFS" ] && [ "$type" = configfs ]; then mounted=1; fi
    done </proc/mounts
    if [ "$mounted" = 0 ]; then
        [ -d "$CONFIGFS" ] || die "${CONFIGFS} does not exist: is this kernel built with CONFIG_CONFIGFS_FS?"
        mount -t configfs configfs "$CONFIGFS" || die "cannot mount configfs on ${CONFIGFS}"
    fi
    [ -d "${CONFIGFS}/usb_gadget" ] || die "${CONFIGFS}/usb_gadget is missing although libcomposite is loaded"
}

default_serial() {
    local id=""
    read -r id 2>/dev/null </etc/machine-id || true
    if [ -n "$id" ]; then
        echo "${id:0:16}"
    else
        echo "${HOSTNAME:-$(uname -n)}"
    fi
}

BOUND="" # set by setup: the UDC the gadget is bound to, if it is

bound_udc() {
    local udc=""
    read -r udc 2>/dev/null <"$GADGET/UDC" || true
    echo "$udc"
}

cmd_setup() {
    local serial="" ffs_dir="$DEFAULT_FFS_DIR"
    while [ "$#" -gt 0 ]; do
        case "$1" in
            --serial) [ "$#" -ge 2 ] || usage; serial="$2"; shift 2 ;;
            --ffs-dir) [ "$#" -ge 2 ] || usage; ffs_dir="$2"; shift 2 ;;
            *) usage ;;
        esac
    done
    [ -n "$serial" ] || serial="$(default_serial)"
    case "$serial" in *[!A-Za-z0-9._:-]*) die "serial '$serial' has characters adb does not expect (use letters, digits, . _ : -)" ;; esac

    load_module libcomposite
    load_module usb_f_fs
    ensure_configfs
    BOUND="$(bound_udc)"

    make_dir "$GADGET"
    write_attr "$VENDOR" "$GADGET/idVendor"
    write_attr "$PRODUCT" "$GADGET/idProduct"
    write_attr "$BCD_DEVICE" "$GADGET/bcdDevice"
    write_attr 0x0200 "$GADGET/bcdUSB"
    make_dir "$GADGET/strings/0x409"
    write_attr "$MANUFACTURER" "$GADGET/strings/0x409/manufacturer"
    write_attr "$PRODUCT_NAME" "$GADGET/strings/0x409/product"
    write_attr "$serial" "$GADGET/strings/0x409/serialnumber"

    make_dir "$GADGET/configs/c.1"
    write_attr "$MAX_POWER" "$GADGET/configs/c.1/MaxPower"
    make_dir "$GADGET/configs/c.1/strings/0x409"
    write_attr "$CONFIG_STRING" "$GADGET/configs/c.1/strings/0x409/configuration"

    make_dir "$GADGET/functions/$FUNC"
    if [ ! -L "$GADGET/configs/c.1/$FUNC" ]; then
        ln -s "$GADGET/functions/$FUNC" "$GADGET/configs/c.1/$FUNC" ||
            die "cannot link $GADGET/functions/$FUNC into $GADGET/configs/c.1"
    fi

    local mp
    mp="$(ffs_mountpoint)"
    if [ -z "$mp" ]; then
        mkdir -p "$ffs_dir" || die "cannot create ${ffs_dir}"
        mount -t functionfs "$FFS_NAME" "$ffs_dir" || die "cannot mount functionfs '${FFS_NAME}' on ${ffs_dir}"
    elif [ "$mp" != "$(realpath -m "$ffs_dir")" ]; then
        die "functionfs '${FFS_NAME}' is already mounted on ${mp}, not ${ffs_dir} (teardown first, or use --ffs-dir ${mp})"
    fi
    if [ -n "$BOUND" ]; then
        say "gadget ${GADGET_NAME} set up (serial ${serial}) and bound to ${BOUND}"
    else
        say "gadget ${GADGET_NAME} ready (serial ${serial}); FunctionFS on ${ffs_dir}: start the daemon there, then bind"
    fi
}


cmd_bind() {
    local ffs_dir="" udc="" wait="${USB_GADGET_WAIT:-10}"
    while [ "$#" -gt 0 ]; do
        case "$1" in
            --ffs-dir) [ "$#" -ge 2 ] || usage; ffs_dir="$2"; shift 2 ;;
            -*) usage ;;
            *) [ -z "$udc" ] || usage; udc="$1"; shift ;;
        esac
    done
    case "$wait" in '' | *[!0-9]*) die "USB_GADGET_WAIT must be a whole number of seconds, not '$wait'" ;; esac
    [ -d "$GADGET" ] || die "no gadget at ${GADGET}: run \`usb-gadget.sh setup\` first"
    [ -n "$ffs_dir" ] || ffs_dir="$(ffs_mountpoint)"
    [ -n "$ffs_dir" ] || die "functionfs '${FFS_NAME}' is not mounted: run \`usb-gadget.sh setup\` first"

    if [ -z "$udc" ]; then
        [ -d /sys/class/udc ] || die "/sys/class/udc is missing: no USB device controller driver is loaded"
        local u
        for u in /sys/class/udc/*; do
            [ -e "$u" ] && udc="${u##*/}" && break
        done
        [ -n "$udc" ] || die "/sys/class/udc is empty: no USB device controller (load its driver, or dummy_hcd for a test)"
    fi
    [ -e "/sys/class/udc/$udc" ] || die "no USB device controller ${udc} in /sys/class/udc (there: $(printf '%s ' /sys/class/udc/*))"

    local cur
    cur="$(bound_udc)"
    if [ "$cur" = "$udc" ]; then
        say "already bound to ${udc}"
        return 0
    fi
    [ -z "$cur" ] || die "the gadget is bound to ${cur}, not ${udc}: unbind first"

    # The kernel refuses the bind until the daemon has written its
    # descriptors and strings to ep0, which is when ep1 and ep2 appear.
    local deadline=$((SECONDS + wait)) err=""
    while :; do
        if [ -e "$ffs_dir/ep1" ] && [ -e "$ffs_dir/ep2" ]; then
            if err="$( { printf '%s\n' "$udc" >"$GADGET/UDC"; } 2>&1)"; then
                say "bound to ${udc}"
                return 0
            fi
            err="${err##*: }"
        fi
        [ "$SECONDS" -lt "$deadline" ] || break
        sleep 0.2
    done
    if [ ! -e "$ffs_dir/ep1" ]; then
        die "no ${ffs_dir}/ep1 after ${wait}s: the daemon has not written its descriptors to ${ffs_dir}/ep0 (is it running on ${ffs_dir}?)"
    fi
    die "writing ${udc} to ${GADGET}/UDC failed for ${wait}s: ${err} (is ${udc} taken by another gadget? $(grep -l . "$CONFIGFS"/usb_gadget/*/UDC 2>/dev/null | tr '\n' ' '))"
}

cmd_unbind() {
    [ "$#" -eq 0 ] || usage
    [ -d "$GADGET" ] || return 0
    [ -n "$(bound_udc)" ] || return 0
    write_attr "" "$GADGET/UDC"
    say "unbound"
}

cmd_teardown() {
    [ "$#" -eq 0 ] || usage
    cmd_unbind
    local mp err
    mp="$(ffs_mountpoint)"
    if [ -n "$mp" ]; then
        err="$(umount "$mp" 2>&1)" || die "cannot unmount ${mp}: ${err##*: } (stop the daemon that holds its files first)"
        rmdir "$mp" 2>/dev/null || true # ours to remove when empty; kept if anything else lives there
    fi
    if [ -d "$GADGET" ]; then
        # The reverse of setup: links out of configurations, then
        # configurations, functions, strings, and the gadget itself.
        if [ -L "$GADGET/configs/c.1/$FUNC" ]; then
            rm "$GADGET/configs/c.1/$FUNC" || die "cannot remove ${GADGET}/configs/c.1/${FUNC}"
        fi
        remove_dir "$GADGET/configs/c.1/strings/0x409"
        remove_dir "$GADGET/configs/c.1"
        remove_dir "$GADGET/functions/$FUNC"
        remove_dir "$GADGET/strings/0x409"
        remove_dir "$GADGET"
    fi
    say "torn down"
}

[ "$#" -ge 1 ] || usage
[ "$(id -u)" -eq 0 ] || die "run as root (configfs and mounts)"
cmd="$1"
shift
case "$cmd" in
    setup) cmd_setup "$@" ;;
    bind) cmd_bind "$@" ;;
    unbind) cmd_unbind "$@" ;;
    teardown) cmd_teardown "$@" ;;
    -h | --help | help) usage ;;
    *) usage ;;
esac
