#!/bin/busybox sh
# shellcheck shell=dash
# /init of the USB test VM's initramfs (built by scripts/usb-vm.sh; runs
# under static busybox, so POSIX sh only, no bash).
#
# Loads the modules in /modules/order, mounts this machine's tree (9p tag
# hostroot, read-only) on /newroot with the VM's own proc/sys/dev and tmpfs
# where programs write, mounts the control share (tag ctl: env, cmd.sh in,
# started and status out) and the output share (tag out), runs cmd.sh in a
# chroot with its output on ttyS1, writes its exit status to ctl/status and
# powers off. Any failure here is reported on the console and the VM powers
# off without a status, which scripts/usb-vm.sh reports as a failure.

/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

fatal() {
    echo "usb-vm init: FATAL: $*" >/dev/console
    sync
    poweroff -f
    sleep 60 # poweroff -f does not return; this is only in case it does
}

mount -t proc proc /proc || fatal "mount proc"
mount -t sysfs sysfs /sys || fatal "mount sysfs"
mount -t devtmpfs devtmpfs /dev || fatal "mount devtmpfs"
echo "usb-vm init: up after $(cut -d' ' -f1 /proc/uptime)s of kernel time" >/dev/console

# Every module but dummy_hcd now: it takes parameters from ctl/env.
while read -r m; do
    [ "$m" = dummy_hcd.ko ] && continue
    insmod "/modules/$m" || fatal "insmod $m failed"
done </modules/order

P9="trans=virtio,version=9p2000.L,msize=262144"
# cache=loose: the host tree does not change under a test run, and TCG makes
# every 9p round trip expensive. The shares written to are uncached.
mount -t 9p -o "$P9,ro,cache=loose" hostroot /newroot || fatal "mount 9p hostroot (this machine's /)"
mount -t 9p -o "$P9,cache=none" ctl /ctl || fatal "mount 9p ctl"
[ -r /ctl/env ] || fatal "/ctl/env is missing"
while IFS='=' read -r k v; do
    case "$k" in
        USB_VM_TREE) TREE="$v" ;;
        USB_VM_RUN) RUN="$v" ;;
        USB_VM_OUT) OUT="$v" ;;
        USB_VM_DUMMY_HCD) DUMMY="$v" ;;
    esac
done </ctl/env
{ [ -n "${TREE:-}" ] && [ -n "$RUN" ] && [ -n "$OUT" ]; } || fatal "/ctl/env lacks USB_VM_TREE, USB_VM_RUN or USB_VM_OUT"

# shellcheck disable=SC2086 # DUMMY is a list of module parameters
insmod /modules/dummy_hcd.ko $DUMMY || fatal "insmod dummy_hcd.ko $DUMMY failed"

R=/newroot
mount -t proc proc $R/proc || fatal "mount $R/proc"
mount -t sysfs sysfs $R/sys || fatal "mount $R/sys"
mount -t configfs configfs $R/sys/kernel/config || fatal "mount configfs on $R/sys/kernel/config"
mount -t devtmpfs devtmpfs $R/dev || fatal "mount $R/dev"
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts $R/dev/pts || fatal "mount $R/dev/pts"
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm || fatal "mount $R/dev/shm"
for d in /tmp /run /var/tmp; do
    mount -t tmpfs -o mode=1777 tmpfs "$R$d" || fatal "mount tmpfs on $R$d"
done
# The tree the run comes from, when a tmpfs above covered it (a CI clone
# under /tmp); elsewhere the root share already shows it.
case "$TREE/" in
    /tmp/* | /run/* | /var/tmp/*)
        mkdir -p "$R$TREE" || fatal "mkdir $R$TREE"
        mount -t 9p -o "$P9,ro,cache=loose" tree "$R$TREE" || fatal "mount 9p tree on $R$TREE"
        ;;
esac
mount -o bind /ctl "$R$RUN" || fatal "bind /ctl on $R$RUN"
mount -t 9p -o "$P9,cache=none" out "$R$OUT" || fatal "mount 9p out on $R$OUT"

ip link set lo up || fatal "ip link set lo up"
hostname usb-vm

# The script's output channel: raw, so newlines pass through unchanged.
stty -F /dev/ttyS1 raw -echo 2>/dev/null || true

touch /ctl/started
chroot $R /bin/bash "$RUN/cmd.sh" </dev/null >/dev/ttyS1 2>&1
status=$?
echo "$status" >/ctl/status
echo "usb-vm init: the script exited $status" >/dev/console
sync
poweroff -f
