//! A link emulator on real kernel TCP: two network namespaces, each with a
//! TAP device, joined by a forwarder in this process that applies a rate, a
//! one-way delay, optional burst release and a drop-tail queue.
//!
//! netem is not available on the kernels this runs on, so the link is shaped
//! in userspace. Side a (the host) is 198.18.0.1/24, side b (the device)
//! 198.18.0.2/24; no other address is configured (IPv6 is turned off in both
//! namespaces so that not even link-local addresses appear), and traffic never
//! leaves the two namespaces.
//!
//! Everything created here is registered in a process-wide list and removed
//! on drop, on error and on SIGINT, SIGTERM or SIGHUP
//! ([`install_signal_cleanup`]).

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

/// Side a: the host, where the clients run.
pub const HOST_ADDR: &str = "198.18.0.1";
/// Side b: the device, where the daemon and the iperf3 server run.
pub const DEVICE_ADDR: &str = "198.18.0.2";
const PREFIX_LEN: u8 = 24;

// ---------------------------------------------------------------------------
// Cleanup: what this process created, removed on exit, error or signal.

struct Registry {
    /// Set once a signal arrived: nothing new may be started after it.
    stopping: bool,
    /// Our direct children (killed by pid, after checking they still are ours).
    children: Vec<u32>,
    /// Namespaces we created, with the TAP device in each.
    namespaces: Vec<(String, String)>,
    /// Files and directories we created.
    paths: Vec<PathBuf>,
    /// Loop devices a benchmark attached (`/dev/loopN`), detached first.
    loop_devices: Vec<String>,
    /// File systems a benchmark mounted, unmounted before that.
    mounts: Vec<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    stopping: false,
    children: Vec::new(),
    namespaces: Vec::new(),
    paths: Vec::new(),
    loop_devices: Vec::new(),
    mounts: Vec::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // A panic while holding the lock must not stop the cleanup.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and starts a thread
/// that waits for them and then removes everything registered and exits.
/// Must be called before any other thread is started: threads inherit the
/// mask, so the signals reach only the waiting thread, which can take locks
/// and run `ip` (a signal handler could not). Children get an empty mask from
/// `std::process::Command`, so they still receive Ctrl-C themselves.
pub fn install_signal_cleanup() -> Result<()> {
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, signal);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        ensure!(
            rc == 0,
            "pthread_sigmask: {}",
            std::io::Error::from_raw_os_error(rc)
        );
        set
    };
    std::thread::Builder::new()
        .name("signal-cleanup".into())
        .spawn(move || {
            let mut signal = 0;
            if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
                return;
            }
            eprintln!("signal {signal}: removing the emulator's namespaces, processes and files");
            cleanup_everything();
            std::process::exit(128 + signal);
        })?;
    Ok(())
}

/// Kills every registered child and every process left in our namespaces,
/// deletes the namespaces and removes the registered paths.
fn cleanup_everything() {
    let mut registry = registry();
    registry.stopping = true;
    let children: Vec<u32> = registry.children.drain(..).collect();
    for &pid in &children {
        kill_child(pid);
    }
    // Reap them (for a second at most) rather than leave zombies to init.
    let deadline = Instant::now() + Duration::from_secs(1);
    for &pid in &children {
        while Instant::now() < deadline {
            let mut status = 0;
            let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
            if rc != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let namespaces: Vec<(String, String)> = registry.namespaces.drain(..).collect();
    for (name, tap) in &namespaces {
        kill_processes_in(name);
        delete_namespace(name, tap);
    }
    for mount in registry.mounts.drain(..) {
        let _ = Command::new("umount").arg(&mount).status();
    }
    for device in registry.loop_devices.drain(..) {
        let _ = Command::new("losetup").arg("-d").arg(&device).status();
    }
    for path in registry.paths.drain(..) {
        let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
    }
}

/// Registers a directory or file to remove on a signal (normal exits remove
/// it themselves and call [`forget_path`]).
pub fn register_path(path: &Path) {
    registry().paths.push(path.to_path_buf());
}

pub fn forget_path(path: &Path) {
    registry().paths.retain(|p| p != path);
}

/// A loop device to detach on a signal, before the registered paths go.
pub fn register_loop_device(device: &str) {
    registry().loop_devices.push(device.to_string());
}

/// Detaches a registered loop device now.
pub fn detach_loop_device(device: &str) {
    registry().loop_devices.retain(|d| d != device);
    let _ = Command::new("losetup").arg("-d").arg(device).status();
}

/// A mount point to unmount on a signal, before the loop devices go.
pub fn register_mount(dir: &Path) {
    registry().mounts.push(dir.to_path_buf());
}

/// Unmounts a registered mount point now.
pub fn unmount(dir: &Path) {
    registry().mounts.retain(|d| d != dir);
    let _ = Command::new("umount").arg(dir).status();
}

/// Spawns `command` and registers the child so that a signal kills it. Refuses
/// once a signal arrived, so nothing outlives the cleanup.
pub fn spawn_registered(command: &mut Command) -> Result<Child> {
    let mut registry = registry();
    ensure!(!registry.stopping, "stopping: not starting {command:?}");
    let child = command
        .spawn()
        .with_context(|| format!("starting {command:?}"))?;
    registry.children.push(child.id());
    Ok(child)
}

/// Removes a child from the registry once it has been reaped.
pub fn forget_child(pid: u32) {
    registry().children.retain(|&p| p != pid);
}

/// The parent pid of a process, from /proc.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// SIGKILL to `pid` if it is still a child of this process: a reaped pid
/// may have been reused by someone else's process, which must not be hit.
pub fn kill_child(pid: u32) {
    if parent_of(pid) == Some(std::process::id()) {
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
}

/// The inode of a network namespace file: processes whose
/// `/proc/PID/ns/net` has it are in that namespace.
fn namespace_inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// SIGKILL to every process in namespace `name` (only this program starts
/// processes there, e.g. the adb server that `adb connect` forks). Returns how
/// many there were.
pub fn kill_processes_in(name: &str) -> usize {
    let pids = pids_in(name);
    for &pid in &pids {
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
    pids.len()
}

/// CPU seconds (user + system) of every process now in namespace `name`.
/// Processes that exited are not counted: reap them with `wait4` for theirs.
pub fn cpu_seconds_in(name: &str) -> f64 {
    // A process may exit between the two reads: it counts as nothing.
    pids_in(name)
        .into_iter()
        .map(|pid| crate::cpu_seconds(pid).unwrap_or(0.0))
        .sum()
}

/// The processes in namespace `name`, this one aside.
fn pids_in(name: &str) -> Vec<u32> {
    let Some(inode) = namespace_inode(&netns_path(name)) else {
        return Vec::new();
    };
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            (pid != me && namespace_inode(&entry.path().join("ns/net")) == Some(inode))
                .then_some(pid)
        })
        .collect()
}

fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

fn delete_namespace(name: &str, tap: &str) {
    // The TAP device first: it is persistent (`ip tuntap add`), and deleting
    // it explicitly does not depend on when the namespace itself goes away.
    let _ = Command::new("ip")
        .args(["-n", name, "link", "del", "dev", tap])
        .output();
    let _ = Command::new("ip").args(["netns", "del", name]).output();
}

// ---------------------------------------------------------------------------
// Namespaces.

/// Runs `f` on a new thread that has entered namespace `name`. The thread
/// ends with `f`, so no long-lived thread ever changes namespace; whatever
/// `f` opens (sockets, TAP fds) stays bound to the namespace it was opened in.
pub fn in_namespace<T: Send>(name: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                enter_namespace(name)?;
                f()
            })
            .join()
            .unwrap_or_else(|_| bail!("a thread in namespace {name} panicked"))
    })
}

/// Moves the calling thread into namespace `name` (setns affects only the
/// calling thread for network namespaces).
fn enter_namespace(name: &str) -> Result<()> {
    let file = File::open(netns_path(name)).with_context(|| format!("opening namespace {name}"))?;
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    ensure!(
        rc == 0,
        "setns into {name}: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

fn ip(args: &[&str]) -> Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    ensure!(
        output.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// `ip netns exec NAME sysctl -q -w KEY=VALUE` (net.* sysctls are per namespace).
fn sysctl_in(name: &str, key: &str, value: &str) -> Result<()> {
    ip(&[
        "netns",
        "exec",
        name,
        "sysctl",
        "-q",
        "-w",
        &format!("{key}={value}"),
    ])
}

fn read_sysctl_in(name: &str, key: &str) -> Result<String> {
    let output = Command::new("ip")
        .args(["netns", "exec", name, "sysctl", "-n", key])
        .output()?;
    ensure!(output.status.success(), "reading {key} in {name}");
    Ok(String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" "))
}

/// One side of the link.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Side {
    /// The host: 198.18.0.1, clients.
    A,
    /// The device: 198.18.0.2, daemon and servers.
    B,
}

// ---------------------------------------------------------------------------
// The link model and the forwarder.

/// How the link is shaped, the same in both directions.
#[derive(Clone, Copy, Debug)]
pub struct LinkParams {
    /// Wire rate in bytes per second; a frame occupies the link for
    /// `wire bytes / rate` after the previous one finishes.
    pub rate: f64,
    /// Added after a frame's last bit is on the wire: half the round trip.
    pub one_way: Duration,
    /// Release frames together at multiples of this interval (aggregation,
    /// as Wi-Fi and USB deliver), or one by one when `None`.
    pub burst: Option<Duration>,
    /// Bytes that may wait for the link; a frame beyond it is dropped (tail drop).
    pub queue_limit: u64,
}

impl LinkParams {
    /// The default queue: twice the bandwidth-delay product, plus 256 KiB so
    /// that a short round trip still holds a few 64 KiB offloaded frames.
    pub fn default_queue_limit(rate: f64, rtt: Duration) -> u64 {
        (2.0 * rate * rtt.as_secs_f64()) as u64 + (256 << 10)
    }
}

/// Ethernet bytes on the wire that a frame does not show: preamble and start
/// delimiter (8), frame check sequence (4) and the inter-frame gap (12).
pub const ETHERNET_FRAMING: u64 = 24;
/// Smallest Ethernet frame without its check sequence.
const ETHERNET_MIN: u64 = 60;
/// `struct virtio_net_hdr` ahead of every frame with IFF_VNET_HDR.
const VNET_HDR_LEN: usize = 10;
const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;

/// Bytes a frame (as read from the TAP device) occupies on an Ethernet wire
/// with a 1500-byte MTU, and how many 1500-byte frames that is. An offloaded
/// (GSO) frame counts as the segments it stands for, each with its own
/// headers and framing, so the link's rate means the same with and without
/// offloads.
fn wire_bytes(frame: &[u8], vnet: bool) -> (u64, u64) {
    if !vnet {
        return ((frame.len() as u64).max(ETHERNET_MIN) + ETHERNET_FRAMING, 1);
    }
    if frame.len() < VNET_HDR_LEN {
        return (ETHERNET_MIN + ETHERNET_FRAMING, 1);
    }
    let (header, ethernet) = frame.split_at(VNET_HDR_LEN);
    let gso_type = header[1];
    let gso_size = u64::from(u16::from_le_bytes([header[4], header[5]]));
    let len = ethernet.len() as u64;
    if gso_type == VIRTIO_NET_HDR_GSO_NONE || gso_size == 0 {
        return (len.max(ETHERNET_MIN) + ETHERNET_FRAMING, 1);
    }
    let headers = tcp_ipv4_header_len(ethernet)
        .unwrap_or_else(|| u64::from(u16::from_le_bytes([header[2], header[3]])))
        .min(len);
    let segments = (len - headers).div_ceil(gso_size).max(1);
    (
        len + (segments - 1) * headers + segments * ETHERNET_FRAMING,
        segments,
    )
}

/// Ethernet + IPv4 + TCP header bytes of a frame, when it is TCP over IPv4.
fn tcp_ipv4_header_len(ethernet: &[u8]) -> Option<u64> {
    if ethernet.get(12..14)? != [0x08, 0x00] {
        return None;
    }
    let ip_len = usize::from(ethernet.get(14)? & 0x0f) * 4;
    if *ethernet.get(14 + 9)? != 6 {
        return None;
    }
    let tcp_len = usize::from(ethernet.get(14 + ip_len + 12)? >> 4) * 4;
    Some((14 + ip_len + tcp_len) as u64)
}

/// Counters of one direction, cumulative since the start.
#[derive(Default)]
pub struct DirectionStats {
    /// Frames forwarded, as read (an offloaded frame counts once).
    frames: AtomicU64,
    /// The 1500-byte frames they stand for.
    segments: AtomicU64,
    wire_bytes: AtomicU64,
    /// 1500-byte frames dropped at the tail of the queue.
    drops: AtomicU64,
    write_errors: AtomicU64,
    /// How late frames were released after their due time, in total and at most.
    late_ns_sum: AtomicU64,
    late_ns_max: AtomicU64,
    /// Largest queue (bytes waiting for the link) seen.
    peak_backlog: AtomicU64,
}

/// A snapshot of [`DirectionStats`]; subtracting two gives one transfer's.
#[derive(Clone, Copy, Default, Debug)]
pub struct Counters {
    pub frames: u64,
    pub segments: u64,
    pub wire_bytes: u64,
    pub drops: u64,
    pub write_errors: u64,
    pub late_ns_sum: u64,
    /// Since the previous snapshot (peaks are reset by taking one).
    pub late_ns_max: u64,
    pub peak_backlog: u64,
}

impl DirectionStats {
    /// Cumulative counts; the peaks are since the previous snapshot.
    pub fn snapshot(&self) -> Counters {
        Counters {
            frames: self.frames.load(Ordering::Relaxed),
            segments: self.segments.load(Ordering::Relaxed),
            wire_bytes: self.wire_bytes.load(Ordering::Relaxed),
            drops: self.drops.load(Ordering::Relaxed),
            write_errors: self.write_errors.load(Ordering::Relaxed),
            late_ns_sum: self.late_ns_sum.load(Ordering::Relaxed),
            late_ns_max: self.late_ns_max.swap(0, Ordering::Relaxed),
            peak_backlog: self.peak_backlog.swap(0, Ordering::Relaxed),
        }
    }
}

impl Counters {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            frames: self.frames - earlier.frames,
            segments: self.segments - earlier.segments,
            wire_bytes: self.wire_bytes - earlier.wire_bytes,
            drops: self.drops - earlier.drops,
            write_errors: self.write_errors - earlier.write_errors,
            late_ns_sum: self.late_ns_sum - earlier.late_ns_sum,
            late_ns_max: self.late_ns_max,
            peak_backlog: self.peak_backlog,
        }
    }
}

/// Longest sleep without new frames: how soon a stop is noticed.
const IDLE_WAIT: Duration = Duration::from_millis(20);
/// Frames read per wake-up before due frames are released again.
const READ_BATCH: usize = 64;
/// Largest frame: a 64 KiB offloaded frame with its virtio header and
/// Ethernet, IP and TCP headers.
const MAX_FRAME: usize = 65536 + 256;

/// One direction: frames read from `input` are written to `output` when the
/// link model says they arrive.
///
/// Deliveries are in arrival order (the delay is the same for every frame
/// and the link serializes them in order), so the timer queue is a FIFO of
/// due times: the earliest is always at the front. The thread sleeps in
/// `ppoll` until that time or until a frame arrives, with a 1 us timer slack
/// so that the sleep ends on time; it never spins.
fn forward(
    input: &OwnedFd,
    output: &OwnedFd,
    vnet: bool,
    params: &Mutex<LinkParams>,
    stats: &DirectionStats,
    stop: &AtomicBool,
) {
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64, 0u64, 0u64, 0u64) };
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut scratch = vec![0u8; MAX_FRAME];
    // When the link finishes serializing what it has accepted so far.
    let mut link_free = Instant::now();
    let epoch = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let p = *params.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while let Some((due, _)) = queue.front() {
            if *due > now {
                break;
            }
            let (due, frame) = queue.pop_front().expect("front exists");
            let rc = unsafe { libc::write(output.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
            if rc < 0 {
                stats.write_errors.fetch_add(1, Ordering::Relaxed);
            }
            let late = Instant::now().saturating_duration_since(due).as_nanos() as u64;
            stats.late_ns_sum.fetch_add(late, Ordering::Relaxed);
            stats.late_ns_max.fetch_max(late, Ordering::Relaxed);
        }
        let wait = queue
            .front()
            .map_or(IDLE_WAIT, |(due, _)| due.saturating_duration_since(now))
            .min(IDLE_WAIT);
        if !wait.is_zero() && !readable_within(input.as_raw_fd(), wait) {
            continue;
        }
        for _ in 0..READ_BATCH {
            let n = unsafe {
                libc::read(
                    input.as_raw_fd(),
                    scratch.as_mut_ptr().cast(),
                    scratch.len(),
                )
            };
            if n <= 0 {
                // EAGAIN: nothing more for now (errors are retried after the next wait).
                break;
            }
            let frame = &scratch[..n as usize];
            let arrival = Instant::now();
            let (wire, segments) = wire_bytes(frame, vnet);
            // Bytes still waiting for the link: its busy time left, at its rate.
            let backlog =
                (link_free.saturating_duration_since(arrival).as_secs_f64() * p.rate) as u64;
            if backlog + wire > p.queue_limit {
                stats.drops.fetch_add(segments, Ordering::Relaxed);
                continue;
            }
            stats
                .peak_backlog
                .fetch_max(backlog + wire, Ordering::Relaxed);
            link_free = link_free.max(arrival) + Duration::from_secs_f64(wire as f64 / p.rate);
            let mut due = link_free + p.one_way;
            if let Some(burst) = p.burst {
                // Round up to the next release instant.
                let since = due.duration_since(epoch).as_nanos();
                let step = burst.as_nanos().max(1);
                due = epoch + Duration::from_nanos((since.div_ceil(step) * step) as u64);
            }
            stats.frames.fetch_add(1, Ordering::Relaxed);
            stats.segments.fetch_add(segments, Ordering::Relaxed);
            stats.wire_bytes.fetch_add(wire, Ordering::Relaxed);
            // A copy of exactly the frame's size: queues hold many small frames
            // (ACKs), which must not each keep a 64 KiB buffer.
            queue.push_back((due, frame.to_vec()));
        }
    }
}

/// Waits up to `timeout` (nanosecond resolution, unlike poll's milliseconds)
/// for `fd` to be readable.
fn readable_within(fd: RawFd, timeout: Duration) -> bool {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let spec = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    let rc = unsafe { libc::ppoll(&mut pollfd, 1, &spec, std::ptr::null()) };
    rc > 0
}

/// Opens TAP device `dev` of namespace `ns` (the fd must be opened and
/// attached inside the namespace that holds the device), non-blocking.
fn open_tap(ns: &str, dev: &str, vnet: bool) -> Result<OwnedFd> {
    in_namespace(ns, || {
        let tun = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .context("opening /dev/net/tun")?;
        let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
        for (slot, byte) in request.ifr_name.iter_mut().zip(dev.bytes()) {
            *slot = byte as libc::c_char;
        }
        let mut flags = libc::IFF_TAP | libc::IFF_NO_PI;
        if vnet {
            flags |= libc::IFF_VNET_HDR;
        }
        request.ifr_ifru.ifru_flags = flags as libc::c_short;
        let rc = unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut request) };
        ensure!(
            rc == 0,
            "TUNSETIFF {dev} in {ns}: {}",
            std::io::Error::last_os_error()
        );
        if vnet {
            // Let the kernel hand us (and take from us) 64 KiB TCP frames with
            // partial checksums, as a virtual NIC does: one read instead of 45.
            let offloads = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;
            let rc = unsafe {
                libc::ioctl(
                    tun.as_raw_fd(),
                    libc::TUNSETOFFLOAD,
                    offloads as libc::c_ulong,
                )
            };
            ensure!(
                rc == 0,
                "TUNSETOFFLOAD {dev}: {}",
                std::io::Error::last_os_error()
            );
        }
        let fd: OwnedFd = tun.into();
        let rc = unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK)
        };
        ensure!(rc == 0, "O_NONBLOCK: {}", std::io::Error::last_os_error());
        Ok(fd)
    })
}

// ---------------------------------------------------------------------------
// The emulator.

/// The two namespaces, their TAP devices and the forwarder between them.
pub struct Emulator {
    names: [String; 2],
    taps: [String; 2],
    /// Namespaces another link emulator made ([`Emulator::attach`]): no
    /// forwarder of ours, nothing in them killed or removed, and the
    /// sysctls we change put back: (namespace, key, value before).
    external: Option<Vec<(String, String, String)>>,
    params: Arc<Mutex<LinkParams>>,
    /// a→b (host to device) and b→a.
    pub stats: [Arc<DirectionStats>; 2],
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Emulator {
    /// Creates `oxemu-PID-a` and `oxemu-PID-b`, a TAP device in each with its
    /// address, and starts forwarding. Refuses if either name exists.
    pub fn start(params: LinkParams, offload: bool) -> Result<Emulator> {
        let pid = std::process::id();
        let names = [format!("oxemu-{pid}-a"), format!("oxemu-{pid}-b")];
        let taps = ["tapa".to_string(), "tapb".to_string()];
        for name in &names {
            ensure!(
                !netns_path(name).exists(),
                "network namespace {name} already exists: not touching it"
            );
        }
        let mut emulator = Emulator {
            names: names.clone(),
            taps: taps.clone(),
            external: None,
            params: Arc::new(Mutex::new(params)),
            stats: Default::default(),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
        };
        let mut fds = Vec::new();
        for ((name, tap), addr) in names.iter().zip(&taps).zip([HOST_ADDR, DEVICE_ADDR]) {
            // `ip netns add` fails if the name exists, so what we register is ours.
            ip(&["netns", "add", name])?;
            registry().namespaces.push((name.clone(), tap.clone()));
            sysctl_in(name, "net.ipv6.conf.all.disable_ipv6", "1")?;
            sysctl_in(name, "net.ipv6.conf.default.disable_ipv6", "1")?;
            let mut add = vec!["-n", name, "tuntap", "add", "dev", tap, "mode", "tap"];
            if offload {
                add.push("vnet_hdr");
            }
            ip(&add)?;
            ip(&[
                "-n",
                name,
                "addr",
                "add",
                &format!("{addr}/{PREFIX_LEN}"),
                "dev",
                tap,
            ])?;
            ip(&["-n", name, "link", "set", tap, "up"])?;
            ip(&["-n", name, "link", "set", "lo", "up"])?;
            fds.push(Arc::new(open_tap(name, tap, offload)?));
        }
        for (direction, (input, output)) in [(0, 1), (1, 0)].into_iter().enumerate() {
            let (input, output) = (fds[input].clone(), fds[output].clone());
            let params = emulator.params.clone();
            let stats = emulator.stats[direction].clone();
            let stop = emulator.stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("link-{}", ["a-to-b", "b-to-a"][direction]))
                .spawn(move || forward(&input, &output, offload, &params, &stats, &stop))?;
            emulator.threads.push(thread);
        }
        Ok(emulator)
    }

    /// Uses two namespaces that another link emulator made and joined (a
    /// cross-check of ours): `names[0]` must hold 198.18.0.1 and
    /// `names[1]` 198.18.0.2. Their `tcp_rmem` and `tcp_wmem` are put back
    /// on drop; nothing else of theirs is touched.
    pub fn attach(names: [String; 2]) -> Result<Emulator> {
        let mut saved = Vec::new();
        for (name, addr) in names.iter().zip([HOST_ADDR, DEVICE_ADDR]) {
            ensure!(
                netns_path(name).exists(),
                "network namespace {name} does not exist (start the other emulator first)"
            );
            let output = Command::new("ip")
                .args(["-n", name, "-4", "-o", "addr", "show"])
                .output()
                .context("running ip (iproute2)")?;
            let text = String::from_utf8_lossy(&output.stdout);
            ensure!(
                text.contains(&format!("inet {addr}/")),
                "namespace {name} has no address {addr}: {text}"
            );
            for key in [
                "net.ipv4.tcp_rmem",
                "net.ipv4.tcp_wmem",
                "net.ipv4.tcp_congestion_control",
            ] {
                saved.push((name.clone(), key.to_string(), read_sysctl_in(name, key)?));
            }
        }
        Ok(Emulator {
            names,
            taps: [String::new(), String::new()],
            external: Some(saved),
            params: Arc::new(Mutex::new(LinkParams {
                rate: 0.0,
                one_way: Duration::ZERO,
                burst: None,
                queue_limit: 0,
            })),
            stats: Default::default(),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
        })
    }

    /// Whether the link is another emulator's ([`Emulator::attach`]): its
    /// counters are not ours to read.
    pub fn is_external(&self) -> bool {
        self.external.is_some()
    }

    pub fn name(&self, side: Side) -> &str {
        &self.names[side as usize]
    }

    pub fn set_params(&self, params: LinkParams) {
        *self.params.lock().unwrap_or_else(|e| e.into_inner()) = params;
    }

    /// `ip netns exec NAME program`: `program` runs inside the namespace.
    pub fn command(&self, side: Side, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", self.name(side)])
            .arg(program);
        command
    }

    /// Sets `net.ipv4.tcp_rmem` and `tcp_wmem` (min default max) in both namespaces.
    pub fn set_tcp_buffers(&self, rmem: [u64; 3], wmem: [u64; 3]) -> Result<()> {
        let text = |v: [u64; 3]| format!("{} {} {}", v[0], v[1], v[2]);
        for name in &self.names {
            sysctl_in(name, "net.ipv4.tcp_rmem", &text(rmem))?;
            sysctl_in(name, "net.ipv4.tcp_wmem", &text(wmem))?;
        }
        Ok(())
    }

    /// Sets one net.* sysctl in both namespaces.
    pub fn set_sysctl(&self, key: &str, value: &str) -> Result<()> {
        for name in &self.names {
            sysctl_in(name, key, value)?;
        }
        Ok(())
    }

    /// One sysctl as both namespaces report it: `value`, or `a: x; b: y`
    /// when they differ.
    pub fn sysctl(&self, key: &str) -> Result<String> {
        let a = read_sysctl_in(&self.names[0], key)?;
        let b = read_sysctl_in(&self.names[1], key)?;
        Ok(if a == b { a } else { format!("a: {a}; b: {b}") })
    }

    /// `tcp_rmem` and `tcp_wmem` (min default max) in namespace a: before any
    /// `set_tcp_buffers`, what the kernel gives a new namespace.
    pub fn tcp_buffer_values(&self) -> Result<([u64; 3], [u64; 3])> {
        let values = |key: &str| -> Result<[u64; 3]> {
            let text = read_sysctl_in(&self.names[0], key)?;
            let numbers: Vec<u64> = text
                .split_whitespace()
                .map(|v| v.parse().with_context(|| format!("{key}: {text:?}")))
                .collect::<Result<_>>()?;
            numbers
                .try_into()
                .map_err(|_| anyhow::anyhow!("{key}: expected three numbers, got {text:?}"))
        };
        Ok((values("net.ipv4.tcp_rmem")?, values("net.ipv4.tcp_wmem")?))
    }

    /// `tcp_rmem` and `tcp_wmem` as the namespaces report them, for the output.
    pub fn tcp_buffers(&self) -> Result<String> {
        let mut parts = Vec::new();
        for (name, side) in self.names.iter().zip(["a", "b"]) {
            parts.push(format!(
                "{side}: tcp_rmem {}, tcp_wmem {}",
                read_sysctl_in(name, "net.ipv4.tcp_rmem")?,
                read_sysctl_in(name, "net.ipv4.tcp_wmem")?
            ));
        }
        Ok(parts.join("; "))
    }

    /// Kills whatever still runs in one side's namespace (never in another
    /// emulator's namespaces, where it may not be ours).
    pub fn kill_processes(&self, side: Side) -> usize {
        if self.is_external() {
            return 0;
        }
        kill_processes_in(self.name(side))
    }

    /// CPU seconds of every process now in one side's namespace.
    pub fn cpu_seconds(&self, side: Side) -> f64 {
        cpu_seconds_in(self.name(side))
    }

    /// Both directions' counters.
    pub fn snapshot(&self) -> [Counters; 2] {
        [self.stats[0].snapshot(), self.stats[1].snapshot()]
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Some(saved) = &self.external {
            for (name, key, value) in saved {
                let _ = sysctl_in(name, key, value);
            }
            return;
        }
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        let mut registry = registry();
        for (name, tap) in self.names.iter().zip(&self.taps) {
            kill_processes_in(name);
            delete_namespace(name, tap);
            registry.namespaces.retain(|(n, _)| n != name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_frames_count_their_ethernet_framing() {
        assert_eq!(wire_bytes(&[0u8; 1514], false), (1538, 1));
        assert_eq!(wire_bytes(&[0u8; 42], false), (84, 1));
    }

    #[test]
    fn offloaded_frames_count_as_their_segments() {
        // virtio header: GSO TCPv4, hdr_len 66, gso_size 1448.
        let mut frame = vec![0u8; VNET_HDR_LEN + 66 + 2 * 1448 + 100];
        frame[1] = 1;
        frame[2..4].copy_from_slice(&66u16.to_le_bytes());
        frame[4..6].copy_from_slice(&1448u16.to_le_bytes());
        let eth = &mut frame[VNET_HDR_LEN..];
        eth[12] = 0x08;
        eth[14] = 0x45;
        eth[14 + 9] = 6;
        eth[14 + 20 + 12] = 8 << 4; // 32-byte TCP header (timestamps)
                                    // Three segments: each 66 header bytes and 24 of framing.
        assert_eq!(
            wire_bytes(&frame, true),
            ((66 + 2 * 1448 + 100) + 2 * 66 + 3 * ETHERNET_FRAMING, 3)
        );
    }
}
