#!/usr/bin/env bash
# A throwaway VM with a real USB stack, for the USB tests of oxadb.
#
#   scripts/usb-vm.sh prepare                 install, download the kernel, build the initramfs
#   scripts/usb-vm.sh run SCRIPT [ARGS...]    prepare, then run SCRIPT as root inside the VM
#
# Run as root on Debian 12 (bookworm). The VM is Debian's own kernel under
# qemu-system-x86_64 (TCG: no KVM needed) with dummy_hcd, which connects a USB
# device controller (for a FunctionFS gadget made through configfs) to a USB
# host controller in the same kernel, so a gadget daemon and a USB host (adb,
# oxadb) talk over real bulk endpoints.
#
# prepare (idempotent; a repeated run only checks):
#   1. installs qemu-system-x86, busybox-static, kmod, xz-utils, adb and
#      python3 with apt when dpkg says they are missing (`apt-get update` at
#      most once, only if needed);
#   2. resolves which linux-image-6.1.*-amd64 package Debian's
#      linux-image-amd64 depends on (or takes USB_VM_KERNEL_PKG=NAME=VERSION),
#      `apt-get download`s it and unpacks it with `dpkg -x` into
#      target/usb-vm/kernel: the kernel is never installed on this machine;
#      the package used is recorded in target/usb-vm/kernel.pkg and kept
#      (remove target/usb-vm to move to a newer one);
#   3. builds target/usb-vm/initramfs.img: static busybox, scripts/usb-vm-init.sh
#      as /init, and the modules the VM needs with their dependencies
#      (decompressed if the package ships them compressed).
#
# run boots the VM (no network device at all) with this machine's / shared
# read-only over virtio-9p, and runs SCRIPT (a path on this machine, relative
# to the current directory) chrooted into that tree: same paths, same
# programs, tmpfs on /tmp, /run and /var/tmp, HOME=/tmp/home, loopback up,
# configfs on /sys/kernel/config, devtmpfs on /dev (so /dev/bus/usb appears),
# and every module of the package loadable with plain `modprobe` (kmod, told
# where the modules are through MODPROBE_OPTIONS). The working directory is
# the current one. In the VM:
#   USB_VM=1
#   USB_VM_OUT      target/usb-vm/out, writable, shared with this machine
#                   (same path on both sides): results and logs
#   USB_VM_KERNEL   target/usb-vm/kernel (the unpacked package)
# SCRIPT's stdout and stderr (merged) come out on this script's stdout; the
# kernel console goes to target/usb-vm/run/console.log. The exit status is
# SCRIPT's. A VM that panics, hangs or ends without reporting a status is a
# failure (exit 1, or 124 on the time limit) with the console's tail shown.
#
# Environment:
#   USB_VM_TIMEOUT     seconds qemu may run before it is killed (300)
#   USB_VM_DUMMY_HCD   parameters for dummy_hcd when the VM loads it at boot,
#                      e.g. "is_super_speed=1" (none: the module's defaults)
#   USB_VM_MEM, USB_VM_CPUS   qemu -m and -smp (1024, 2)
#   USB_VM_KERNEL_PKG  NAME=VERSION of the kernel package, instead of resolving it
#   USB_VM_KEEP_OUT=1  keep target/usb-vm/out from the previous run (emptied by default)
#   USB_VM_DISK        raw disk images (PATH[:PATH...]) the VM gets as virtio
#                      disks /dev/vda, /dev/vdb... (modprobe virtio_blk in the
#                      VM); they keep what the guest wrote across boots. A
#                      script that ends the VM itself (a power cut with
#                      sysrq) writes its exit status to $USB_VM_STATUS first.
set -euo pipefail

DIE_PREFIX=usb-vm
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VMDIR="${REPO}/target/usb-vm"
KDIR="${VMDIR}/kernel"
INITRD="${VMDIR}/initramfs.img"
RUNDIR="${VMDIR}/run"
OUTDIR="${VMDIR}/out"

# The modules the VM loads at boot, in this order (their dependencies are
# added in front by modprobe's resolution). dummy_hcd comes last and
# separately, with USB_VM_DUMMY_HCD's parameters.
BOOT_MODULES=(virtio_pci 9pnet_virtio 9p configfs usbcore libcomposite usb_f_fs)
# Packages from the Debian archive: the VM (qemu-system-x86), the
# initramfs (busybox-static; kmod's depmod and modprobe resolve modules, and
# modprobe runs in the VM too; xz-utils unpacks the kernel image), and the
# USB tests that run in the VM on this machine's tree (adb 29, python3 for
# tests/usb/ffs_stub.py; xfsprogs for tests/usb/powercut-vm.sh's mkfs.xfs).
HOST_PACKAGES=(qemu-system-x86 busybox-static kmod xz-utils adb python3 xfsprogs)

usage() {
    sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    echo "(see the comment at the top of scripts/usb-vm.sh for details)" >&2
    exit 2
}

log() { printf 'usb-vm: %s\n' "$*" >&2; }

APT_UPDATED=0
apt_update_once() {
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        apt-get update || die "apt-get update failed"
        APT_UPDATED=1
    fi
}

# ---------------------------------------------------------------------------
install_host_packages() {
    local missing=() p
    for p in "${HOST_PACKAGES[@]}"; do
        if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]; then
            missing+=("$p")
        fi
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${missing[*]}"
        # A first try with the package lists as they are; `apt-get update`
        # only when that fails (no lists yet, or stale ones).
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; then
            apt_update_once
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" ||
                die "apt-get install ${missing[*]} failed"
        fi
    fi
    local tool
    for tool in qemu-system-x86_64 depmod modprobe xz apt-get; do
        command -v "$tool" >/dev/null 2>&1 || die "\`$tool\` is missing after installing ${HOST_PACKAGES[*]}"
    done
    [ -x /bin/busybox ] || die "/bin/busybox is missing (Debian package busybox-static)"
    # The initramfs has nothing else to run it with: it must be static.
    if LC_ALL=C ldd /bin/busybox >/dev/null 2>&1; then
        die "/bin/busybox is dynamically linked: install busybox-static (not busybox)"
    fi
}

# Prints NAME=VERSION of the concrete kernel image package.
resolve_kernel_pkg() {
    if [ -n "${USB_VM_KERNEL_PKG:-}" ]; then
        case "$USB_VM_KERNEL_PKG" in
            linux-image-*=*) echo "$USB_VM_KERNEL_PKG"; return ;;
            *) die "USB_VM_KERNEL_PKG must be NAME=VERSION (e.g. linux-image-6.1.0-56-amd64=6.1.192-2), not '$USB_VM_KERNEL_PKG'" ;;
        esac
    fi
    local rec dep
    # The candidate version's own record ("Depends: linux-image-6.1.0-56-amd64 (= 6.1.192-2)").
    rec="$(apt-cache show --no-all-versions linux-image-amd64 2>/dev/null || true)"
    if [ -z "$rec" ]; then
        apt_update_once
        rec="$(apt-cache show --no-all-versions linux-image-amd64 2>/dev/null || true)"
    fi
    [ -n "$rec" ] || die "apt knows no linux-image-amd64 package (is Debian 12's main archive in the apt sources?)"
    dep="$(sed -n 's/^Depends: *\(linux-image-[^ ,]*-amd64\) *(= *\([^)]*\)).*/\1=\2/p' <<<"$rec" | head -n1)"
    case "$dep" in
        linux-image-6.1.*-amd64=*) echo "$dep" ;;
        "") die "cannot find the linux-image-*-amd64 dependency of linux-image-amd64 in: $(grep -E '^(Version|Depends):' <<<"$rec" | tr '\n' ' ')" ;;
        *) die "linux-image-amd64 depends on ${dep}, not a 6.1 kernel: this rig is made for Debian 12's 6.1 (set USB_VM_KERNEL_PKG to override)" ;;
    esac
}

fetch_kernel() {
    local pkg name version deb
    # The package once resolved and unpacked stays (the pin, recorded in
    # kernel.pkg) until target/usb-vm is removed or USB_VM_KERNEL_PKG names
    # another one: the kernel does not change under the tests when Debian
    # publishes a new one.
    if [ -f "${VMDIR}/kernel.pkg" ] && [ -f "${KDIR}/.unpacked" ] &&
        { [ -z "${USB_VM_KERNEL_PKG:-}" ] || [ "$(cat "${VMDIR}/kernel.pkg")" = "$USB_VM_KERNEL_PKG" ]; }; then
        return
    fi
    pkg="$(resolve_kernel_pkg)"
    name="${pkg%%=*}"
    version="${pkg#*=}"
    log "kernel package ${name} ${version}"
    rm -rf "${VMDIR}/dl" "$KDIR" "$INITRD" "${VMDIR}/kernel.pkg"
    mkdir -p "${VMDIR}/dl"
    # apt-get download drops privileges to _apt when it can; the directory
    # under target/ may not be reachable for it, so it runs as root here.
    if ! (cd "${VMDIR}/dl" && apt-get -o APT::Sandbox::User=root download "${name}=${version}"); then
        apt_update_once
        (cd "${VMDIR}/dl" && apt-get -o APT::Sandbox::User=root download "${name}=${version}") ||
            die "apt-get download ${name}=${version} failed"
    fi
    deb="$(find "${VMDIR}/dl" -maxdepth 1 -name "${name}_*.deb" | head -n1)"
    [ -n "$deb" ] || die "apt-get download left no ${name}_*.deb in ${VMDIR}/dl"
    mkdir -p "$KDIR"
    dpkg -x "$deb" "$KDIR" || die "dpkg -x $deb failed"
    # The .deb is no longer needed once unpacked (70 MB).
    rm -rf "${VMDIR}/dl"
    touch "${KDIR}/.unpacked"
    echo "$pkg" >"${VMDIR}/kernel.pkg"
}

# The kernel release (the directory name under lib/modules).
kernel_release() {
    local d
    d="$(find "${KDIR}/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n1)"
    [ -n "$d" ] || die "no lib/modules/<release> in ${KDIR} (broken unpack? rm -rf ${VMDIR} and retry)"
    basename "$d"
}

build_initramfs() {
    local kver stamp
    kver="$(kernel_release)"
    [ -f "${KDIR}/boot/vmlinuz-${kver}" ] || die "${KDIR}/boot/vmlinuz-${kver} is missing"
    # Rebuilt when the kernel package, the module list or the init script changes.
    stamp="$(cat "${VMDIR}/kernel.pkg"; echo "${BOOT_MODULES[*]}"; sha256sum "${REPO}/scripts/usb-vm-init.sh" /bin/busybox)"
    if [ -f "$INITRD" ] && [ -f "${INITRD}.stamp" ] && [ "$(cat "${INITRD}.stamp")" = "$stamp" ]; then
        return
    fi
    log "building the initramfs for ${kver}"
    # modules.dep is not in the package (the postinst runs depmod): make it,
    # inside the unpacked tree only. modprobe in the VM uses it too.
    depmod -b "$KDIR" "$kver" || die "depmod -b ${KDIR} ${kver} failed"

    local stage="${VMDIR}/initramfs.d"
    rm -rf "$stage"
    mkdir -p "$stage"/{bin,dev,proc,sys,newroot,ctl,modules}
    cp /bin/busybox "$stage/bin/busybox"
    cp "${REPO}/scripts/usb-vm-init.sh" "$stage/init"
    chmod 755 "$stage/init"
    # The kernel opens /dev/console for init before anything is mounted.
    mknod -m 600 "$stage/dev/console" c 5 1

    # Dependencies first, each module once, in load order; dummy_hcd last.
    local lines mod path base seen=" "
    : >"$stage/modules/order"
    for mod in "${BOOT_MODULES[@]}" dummy_hcd; do
        lines="$(modprobe -d "$KDIR" -S "$kver" --show-depends "$mod")" ||
            die "modprobe cannot resolve module ${mod} in ${KDIR}/lib/modules/${kver}"
        while read -r kind path _; do
            [ "$kind" = insmod ] || continue # "builtin NAME": nothing to load
            base="$(basename "$path")"
            case "$seen" in *" $base "*) continue ;; esac
            seen="${seen}${base} "
            # busybox insmod takes plain .ko files only: decompress.
            case "$base" in
                *.ko) cp "$path" "$stage/modules/$base" ;;
                *.ko.xz) base="${base%.xz}"; xz -dc "$path" >"$stage/modules/$base" || die "xz -d $path failed (is xz-utils installed?)" ;;
                *.ko.zst) base="${base%.zst}"; zstd -qdc "$path" >"$stage/modules/$base" || die "zstd -d $path failed (is zstd installed?)" ;;
                *.ko.gz) base="${base%.gz}"; gzip -dc "$path" >"$stage/modules/$base" || die "gzip -d $path failed" ;;
                *) die "unknown module file type: $path" ;;
            esac
            echo "$base" >>"$stage/modules/order"
        done <<<"$lines"
    done
    grep -qx dummy_hcd.ko "$stage/modules/order" || die "dummy_hcd.ko did not make it into the initramfs"

    (cd "$stage" && find . | busybox cpio -o -H newc 2>/dev/null) | gzip -1 >"${INITRD}.tmp" ||
        die "packing the initramfs failed"
    mv "${INITRD}.tmp" "$INITRD"
    echo "$stamp" >"${INITRD}.stamp"
    rm -rf "$stage"
}

# An uncompressed vmlinux from the bzImage, booted through its PVH entry
# point: under TCG the bzImage's own xz decompression takes ~6 s of the boot.
# The same kernel either way; if the payload cannot be found the bzImage is
# booted (slower), and that is said.
extract_vmlinux() {
    local kver bz off
    kver="$(kernel_release)"
    bz="${KDIR}/boot/vmlinuz-${kver}"
    [ -f "${VMDIR}/vmlinux" ] && [ "${VMDIR}/vmlinux" -nt "$bz" ] && return
    rm -f "${VMDIR}/vmlinux"
    grep -qx 'CONFIG_PVH=y' "${KDIR}/boot/config-${kver}" || {
        log "NOTE: ${kver} lacks CONFIG_PVH: booting the bzImage (decompression adds seconds)"
        return
    }
    # The payload is xz for Debian 12's kernels (CONFIG_KERNEL_XZ); its
    # offset is that of the first xz stream magic, FD 37 7A 58 5A 00. (xz
    # reads from a process substitution: it stops at the stream's end, and a
    # pipe would fail on tail's SIGPIPE under pipefail.)
    off="$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$bz" | head -n1 | cut -d: -f1 || true)"
    if [ -n "$off" ] && xz -dc --single-stream <(tail -c +"$((off + 1))" "$bz") >"${VMDIR}/vmlinux.tmp" &&
        [ "$(head -c 4 "${VMDIR}/vmlinux.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
        mv "${VMDIR}/vmlinux.tmp" "${VMDIR}/vmlinux"
    else
        rm -f "${VMDIR}/vmlinux.tmp"
        log "NOTE: no xz-compressed ELF found in ${bz}: booting the bzImage (decompression adds seconds)"
    fi
}

prepare() {
    [ "$(id -u)" -eq 0 ] || die "run as root (apt, qemu's 9p export of /, mknod for the initramfs)"
    command -v dpkg-query >/dev/null 2>&1 || die "dpkg-query is missing: this needs Debian 12"
    mkdir -p "$VMDIR"
    # One prepare or VM at a time per tree: they share target/usb-vm (run/
    # and out/ too). The lock is held until this script (and its qemu) ends.
    exec 9>"${VMDIR}/.lock"
    flock -n 9 || die "another scripts/usb-vm.sh is using ${VMDIR} (lock ${VMDIR}/.lock)"
    install_host_packages
    fetch_kernel
    build_initramfs
    extract_vmlinux
    log "ready: $(cat "${VMDIR}/kernel.pkg"), ${INITRD}"
}

# ---------------------------------------------------------------------------
QEMU_PID=""
cleanup() {
    # Only the qemu this script started, by its pid.
    if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
        kill "$QEMU_PID" 2>/dev/null || true
        sleep 1
        kill -9 "$QEMU_PID" 2>/dev/null || true
    fi
}

show_console_tail() {
    if [ -s "${RUNDIR}/console.log" ]; then
        echo "----- last lines of ${RUNDIR}/console.log -----" >&2
        tail -n 40 "${RUNDIR}/console.log" | tr -d '\r' >&2
        echo "-----" >&2
    else
        echo "(the console log ${RUNDIR}/console.log is empty)" >&2
    fi
}

# seconds_since T0 T1 (microseconds): "12.3"
seconds_since() {
    local d=$((($2 - $1) / 100000))
    echo "$((d / 10)).$((d % 10))"
}

run_vm() {
    [ "$#" -ge 1 ] || usage
    local script="$1"
    shift
    [ -e "$script" ] || die "no such script: $script"
    { [ -f "$script" ] && [ -x "$script" ]; } ||
        die "$script is not an executable file (chmod +x it; it runs through its #! line)"
    script="$(realpath "$script")"
    # The VM puts its own tmpfs (and proc, sys, dev) over these: what this
    # machine has there is not visible inside.
    # This tree is shared on its own (tag tree) and mounted over them, so a
    # checkout under /tmp (a CI clone) works; other paths there do not.
    local p tree
    tree="$(realpath "$REPO")"
    for p in "$script" "$(pwd -P)"; do
        case "$p/" in
            "$tree"/*) ;;
            /tmp/* | /run/* | /var/tmp/* | /dev/* | /proc/* | /sys/*)
                die "$p is under /tmp, /run, /var/tmp, /dev, /proc or /sys, which the VM covers with its own: use a path in this tree (${tree}) or elsewhere" ;;
        esac
    done

    prepare
    local kver timeout
    kver="$(kernel_release)"
    timeout="${USB_VM_TIMEOUT:-300}"
    case "$timeout" in '' | *[!0-9]*) die "USB_VM_TIMEOUT must be a number of seconds, not '$timeout'" ;; esac

    # cache=writeback: what the guest wrote reaches the image (the host's page
    # cache, which outlives qemu) and the guest's flushes become fdatasync on
    # it; what sat in the guest's own page cache is lost when the guest is cut
    # off (sysrq b with -no-reboot ends qemu), as on a power cut.
    local drives=() disks=() disk
    [ -z "${USB_VM_DISK:-}" ] || IFS=: read -ra disks <<<"$USB_VM_DISK"
    for disk in "${disks[@]}"; do
        [ -f "$disk" ] || die "USB_VM_DISK: ${disk} is not a regular file (make one with truncate -s SIZE)"
        drives+=(-drive "file=$(realpath "$disk"),if=virtio,format=raw,cache=writeback")
    done

    # A fresh control directory: the command for init, and what init reports.
    rm -rf "$RUNDIR"
    mkdir -p "$RUNDIR"
    if [ "${USB_VM_KEEP_OUT:-0}" != 1 ]; then rm -rf "$OUTDIR"; fi
    mkdir -p "$OUTDIR"

    # Init reads env (plain NAME=value lines, no quoting) before the chroot;
    # the chrooted bash runs cmd.sh.
    cat >"${RUNDIR}/env" <<EOF
USB_VM_TREE=${tree}
USB_VM_RUN=${RUNDIR}
USB_VM_OUT=${OUTDIR}
USB_VM_KERNEL=${KDIR}
USB_VM_DUMMY_HCD=${USB_VM_DUMMY_HCD:-}
EOF
    {
        echo "# written by scripts/usb-vm.sh; run by the VM's init in the chroot"
        printf 'cd %q || exit 127\n' "$(pwd)"
        printf 'export USB_VM=1 USB_VM_OUT=%q USB_VM_KERNEL=%q USB_VM_STATUS=%q\n' "$OUTDIR" "$KDIR" "${RUNDIR}/status"
        printf 'export MODPROBE_OPTIONS=%q\n' "-d ${KDIR}"
        echo 'export HOME=/tmp/home TMPDIR=/tmp LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1'
        echo 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
        # shellcheck disable=SC2016 # expanded in the VM
        echo 'mkdir -p "$HOME"'
        printf 'exec %q' "$script"
        local a
        for a in "$@"; do printf ' %q' "$a"; done
        echo
    } >"${RUNDIR}/cmd.sh"

    local accel=tcg kernel="${VMDIR}/vmlinux"
    [ -f "$kernel" ] || kernel="${KDIR}/boot/vmlinuz-${kver}"
    trap cleanup EXIT
    trap 'cleanup; exit 130' INT TERM
    # Times in microseconds, from bash's clock: no process per check.
    local t0=${EPOCHREALTIME/./}
    # stdin from /dev/null: the stdio chardev then leaves the terminal alone.
    qemu-system-x86_64 \
        -machine pc,accel="$accel" -m "${USB_VM_MEM:-1024}" -smp "${USB_VM_CPUS:-2}" \
        -nographic -nodefaults -no-reboot -monitor none -nic none \
        -kernel "$kernel" -initrd "$INITRD" \
        -append "console=ttyS0 panic=-1 oops=panic loglevel=6 rdinit=/init" \
        -serial "file:${RUNDIR}/console.log" \
        -chardev "stdio,id=out,signal=off,logfile=${RUNDIR}/output.log" -serial chardev:out \
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
        -virtfs "local,path=${tree},mount_tag=tree,security_model=none,readonly=on,multidevs=remap" \
        -virtfs "local,path=${RUNDIR},mount_tag=ctl,security_model=none" \
        -virtfs "local,path=${OUTDIR},mount_tag=out,security_model=none" \
        "${drives[@]}" </dev/null &
    QEMU_PID=$!

    # Wait for qemu, watching the clock; init touches run/started just
    # before it runs the script (that is the boot time).
    local now boot="" limit=$((t0 + timeout * 1000000)) pid="$QEMU_PID"
    while kill -0 "$QEMU_PID" 2>/dev/null; do
        now=${EPOCHREALTIME/./}
        if [ -z "$boot" ] && [ -e "${RUNDIR}/started" ]; then
            boot=$(seconds_since "$t0" "$now")
        fi
        if [ "$now" -gt "$limit" ]; then
            cleanup
            wait "$QEMU_PID" 2>/dev/null || true
            QEMU_PID=""
            show_console_tail
            printf '\nusb-vm: the VM did not finish within USB_VM_TIMEOUT=%ss: qemu (pid %s) was killed\n' "$timeout" "$pid" >&2
            exit 124
        fi
        sleep 0.2
    done
    local qrc=0
    wait "$QEMU_PID" || qrc=$?
    QEMU_PID=""
    local total
    total=$(seconds_since "$t0" "${EPOCHREALTIME/./}")
    [ -n "$boot" ] || { [ -e "${RUNDIR}/started" ] && boot="<${total}"; } || boot="never"

    if [ ! -s "${RUNDIR}/status" ]; then
        show_console_tail
        die "the VM ended (qemu exit ${qrc}) without reporting the script's exit status: see ${RUNDIR}/console.log (script started: ${boot})"
    fi
    local status
    status="$(cat "${RUNDIR}/status")"
    case "$status" in '' | *[!0-9]*) die "the VM reported a strange status '${status}' in ${RUNDIR}/status" ;; esac
    log "$(basename "$script") exited ${status}; boot ${boot}s, total ${total}s (console: ${RUNDIR}/console.log, output: ${RUNDIR}/output.log)"
    return "$status"
}

case "${1:-}" in
    prepare) [ "$#" -eq 1 ] || usage; prepare ;;
    run) shift; run_vm "$@" ;;
    *) usage ;;
esac
