//! `oxadb-bench`: benchmark programs. They print tables for `docs/benchmarks.md`;
//! they are not tests and assert nothing about speed.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::{Parser, Subcommand};
use rand::{RngCore, SeedableRng};

mod delta;
mod delta_peers;
mod delta_target;
mod emulated;
mod emulated_report;
mod emulator;
mod forward_loopback;
mod hostile;
mod memory;
mod receive_paths;
mod server_neighbours;
mod shell_latency;
mod simulate;
mod splice_relay;
mod stream;

#[derive(Parser)]
#[command(about = "oxadb benchmark programs (they print tables; they are not tests)")]
struct Args {
    #[command(subcommand)]
    command: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Google adb pushing and pulling random data through oxadbd over loopback,
    /// interleaved with raw single-stream TCP loopback runs.
    AdbLoopback(AdbLoopback),
    /// One ADB stream between two oxadb engines over loopback TCP (no
    /// services, no files), burst and classic, beside raw TCP.
    StreamLoopback {
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        size: u64,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Which transfers: raw, burst, classic (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "raw,burst,classic")]
        only: Vec<String>,
    },
    /// The floor under any pull: a file copied over loopback TCP into tmpfs
    /// with each receive path Linux offers (read + write, splice, mmap),
    /// interleaved with raw TCP.
    ReceivePaths {
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        size: u64,
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// A tmpfs directory for the source and the copy.
        #[arg(long, default_value = "/dev/shm")]
        workdir: PathBuf,
    },
    /// Many streams pushing into consumers that sleep before reading: the
    /// daemon's peak memory under each credit policy and a memory budget.
    StreamMemory {
        #[arg(long, default_value = "target/release/oxadbd")]
        oxadbd: PathBuf,
        /// Credit policies to run, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "aosp,adaptive")]
        credits: Vec<String>,
        /// The daemon's `--memory-budget`.
        #[arg(long, default_value = "64M", value_parser = parse_size)]
        budget: u64,
        #[arg(long, default_value_t = 64)]
        streams: usize,
        /// Open N connections with one stream each instead of `--streams`
        /// streams on one connection.
        #[arg(long, value_name = "N", conflicts_with = "streams")]
        connections: Option<usize>,
        /// Bytes pushed into each stream.
        #[arg(long, default_value = "32M", value_parser = parse_size)]
        per_stream: u64,
        /// Seconds each consumer sleeps before reading.
        #[arg(long, default_value_t = 8.0)]
        stall_seconds: f64,
    },
    /// Every credit policy on every modelled link (loopback, USB 3, Wi-Fi,
    /// WAN) with fast, slow and stalling consumers, in the deterministic
    /// link simulator: virtual time, two real engines, no sockets.
    Simulate {
        /// Bytes pushed per run.
        #[arg(long, default_value = "256M", value_parser = parse_size)]
        size: u64,
        /// Write each run's buffered-bytes time series here as CSV.
        #[arg(long)]
        series_dir: Option<PathBuf>,
    },
    /// iperf3, Google adb 29 and oxadb (classic, aosp, adaptive) over an
    /// emulated link on real kernel TCP: two network namespaces joined by a
    /// userspace forwarder (rate, round trip, tail-drop queue). Needs root,
    /// iproute2, iperf3 and adb.
    Emulated(Box<emulated::EmulatedArgs>),
    /// One transfer of random data through `oxadb forward` and through
    /// `oxadb reverse` against oxadbd on loopback, both directions, with
    /// the ratio reverse / forward from the same run.
    ForwardLoopback(forward_loopback::ForwardLoopbackArgs),
    /// `shell true` start to exit through Google's adb server, through
    /// `oxadb server` and with `oxadb` alone, against oxadbd on loopback.
    ShellLatency(shell_latency::ShellLatencyArgs),
    /// An ext4 image updated on a device with `push --delta` (without and
    /// with the device's index), a whole `push -z zstd`, `rsync --inplace`
    /// over ssh and `bmaptool copy` over HTTP, on loopback and on an
    /// emulated link: time, bytes on the wire, device CPU (docs/delta.md).
    /// Installs openssh-server, rsync and bmap-tools when missing.
    Delta(delta::DeltaArgs),
    /// Pushes and pulls through `oxadb server` to oxadbd on loopback, alone
    /// and with misbehaving devices connected to the same server (OPEN and
    /// stray-packet floods, reconnection loops, WRTE beyond credit): the
    /// good device's throughput ratio, the server's CPU time and memory.
    ServerNeighbours(server_neighbours::ServerNeighboursArgs),
}

#[derive(Parser)]
struct AdbLoopback {
    /// Bytes per transfer (suffixes K, M, G are powers of 1024).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Runs of each transfer; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// The daemon under test.
    #[arg(long, default_value = "target/release/oxadbd")]
    oxadbd: PathBuf,
    /// Extra arguments for the daemon (e.g. `--no-delayed-ack`).
    #[arg(long, allow_hyphen_values = true)]
    daemon_arg: Vec<String>,
    /// The adb client (Debian's adb 29 by default).
    #[arg(long, default_value = "adb")]
    adb: PathBuf,
    /// The oxadb client.
    #[arg(long, default_value = "target/release/oxadb")]
    oxadb: PathBuf,
    /// Clients to measure, comma-separated: adb (Google's CLI and server),
    /// adb-oxadb-server (Google's CLI through `oxadb server`, which holds
    /// the device with oxadb's defaults), oxadb (burst mode with the
    /// adaptive window), oxadb-aosp (burst mode with AOSP's fixed 32 MiB
    /// credit), oxadb-classic. The host pushes by sendfile by default; an
    /// oxadb client with `-copy` appended (`oxadb-copy`) pushes by reading
    /// the file (`--no-zero-copy`; its push row only), and one with `-zc`
    /// (`oxadb-zc`) takes the zero-copy path on both ends (against a
    /// second daemon started with `--zero-copy`, whose pulls then go by
    /// sendfile too), so the paths are compared in one run.
    #[arg(long, value_delimiter = ',', default_value = "adb,oxadb,oxadb-classic")]
    clients: Vec<String>,
    /// A tmpfs directory for the data (the pull destination must be tmpfs).
    #[arg(long, default_value = "/dev/shm")]
    workdir: PathBuf,
}

use oxadb_io::parse_size;

fn main() -> Result<()> {
    // The same allocator settings as oxadbd and oxadb.
    oxadb_io::tune_allocator();
    match Args::parse().command {
        Bench::AdbLoopback(args) => adb_loopback(args),
        Bench::StreamLoopback { size, runs, only } => stream_loopback(size, runs, &only),
        Bench::ReceivePaths {
            size,
            runs,
            workdir,
        } => receive_paths::receive_paths(size, runs, &workdir),
        Bench::StreamMemory {
            oxadbd,
            credits,
            budget,
            streams,
            connections,
            per_stream,
            stall_seconds,
        } => memory::stream_memory(
            &oxadbd,
            &credits,
            budget,
            connections.unwrap_or(streams),
            if connections.is_some() {
                memory::Spread::ConnectionEach
            } else {
                memory::Spread::OneConnection
            },
            per_stream,
            std::time::Duration::from_secs_f64(stall_seconds),
        ),
        Bench::Simulate { size, series_dir } => simulate::simulate(size, series_dir.as_deref()),
        Bench::Emulated(args) => {
            let measured = emulated::emulated(*args)?;
            emulated_report::print(
                &measured.args,
                &measured.oxadb,
                &measured.oxadbd,
                &measured.runs,
            );
            Ok(())
        }
        Bench::ForwardLoopback(args) => forward_loopback::forward_loopback(args),
        Bench::ShellLatency(args) => shell_latency::shell_latency(args),
        Bench::Delta(args) => delta::delta(args),
        Bench::ServerNeighbours(args) => server_neighbours::server_neighbours(args),
    }
}

/// Processes and files of one benchmark session, cleaned up on drop.
struct Session {
    dir: PathBuf,
    daemon: Child,
    /// The daemon of the `-zc` clients (`--zero-copy`), if any.
    zero_copy_daemon: Option<Child>,
    adb: PathBuf,
    adb_port: u16,
    serial: String,
    /// `oxadb server` for the `adb-oxadb-server` client, and its port.
    oxadb_server: Option<(Child, u16)>,
}

impl Session {
    fn adb(&self) -> Command {
        let mut command = Command::new(&self.adb);
        command
            .env("HOME", self.dir.join("home"))
            .arg("-P")
            .arg(self.adb_port.to_string());
        command
    }

    fn adb_device(&self) -> Command {
        let mut command = self.adb();
        command.arg("-s").arg(&self.serial);
        command
    }

    /// Google's CLI talking to `oxadb server` about the device.
    fn adb_through_oxadb_server(&self) -> Command {
        let port = self.oxadb_server.as_ref().expect("oxadb server").1;
        let mut command = Command::new(&self.adb);
        command
            .env("HOME", self.dir.join("home"))
            .arg("-P")
            .arg(port.to_string())
            .arg("-s")
            .arg(&self.serial);
        command
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.adb().arg("kill-server").output();
        if let Some((server, _)) = &mut self.oxadb_server {
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        if let Some(daemon) = &mut self.zero_copy_daemon {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn run_checked(command: &mut Command, what: &str) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {what}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(output.status.success(), "{what} failed: {text}");
    Ok(text)
}

fn write_random_file(path: &Path, size: u64) -> Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x0a_db);
    let mut file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut block = vec![0u8; 8 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        rng.fill_bytes(&mut block[..n]);
        file.write_all(&block[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// A private /dev/null (character device 1, 3) at `path`: Google's adb
/// replaces a pull destination, so the real node must never be a target;
/// pushes go into this one.
fn make_null_node(path: &Path) -> Result<()> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    let rc = unsafe { libc::mknod(c_path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    ensure!(
        rc == 0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are 14th and 15th.
    let rest = &stat[stat.rfind(')').context("bad /proc stat")? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// One single-stream TCP transfer over loopback, 1 MiB writes and reads.
/// Accepts one connection and reads it to EOF, 1 MiB at a time, handing each
/// read to `each`; returns the bytes received.
fn receive_all(listener: &TcpListener, mut each: impl FnMut(&[u8]) -> Result<()>) -> Result<u64> {
    let (mut socket, _) = listener.accept()?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = socket.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        each(&buf[..n])?;
        total += n as u64;
    }
}

fn raw_tcp(size: u64) -> Result<Duration> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let receiver = std::thread::spawn(move || receive_all(&listener, |_| Ok(())));
    let mut block = vec![0u8; 1 << 20];
    rand::rngs::StdRng::seed_from_u64(1).fill_bytes(&mut block);
    let start = Instant::now();
    let mut socket = TcpStream::connect(addr)?;
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        socket.write_all(&block[..n])?;
        left -= n as u64;
    }
    drop(socket);
    let received = receiver.join().expect("receiver thread")?;
    let elapsed = start.elapsed();
    ensure!(received == size, "raw TCP moved {received} of {size} bytes");
    Ok(elapsed)
}

/// What a push into a device node does at the least, over raw TCP: the
/// source file read 1 MiB at a time and sent, the receiver discarding it.
fn raw_tcp_file_send(source: &Path, relayed: bool) -> Result<Duration> {
    send_file_timed(source, "raw TCP from the file", relayed, |listener| {
        receive_all(&listener, |_| Ok(()))
    })
}

/// What a pull does at the least, over raw TCP: one thread reads the source
/// file and sends it, another receives it into a new file beside the pull
/// destination (1 MiB at a time, four copies and a page allocation per 4 KiB
/// on tmpfs, no protocol).
fn raw_tcp_file_copy(source: &Path, dest: &Path, relayed: bool) -> Result<Duration> {
    let dest = dest.to_path_buf();
    send_file_timed(source, "raw TCP file copy", relayed, move |listener| {
        let mut out = File::create(&dest)?;
        receive_all(&listener, |data| Ok(out.write_all(data)?))
    })
}

/// Times `source` sent over a loopback connection to `receive` (run on a
/// thread of its own with the listener; returns the bytes it got), and checks
/// that every byte arrived. `relayed` puts a [`splice_relay`] in between, as
/// a host server sits between adb's CLI and the device.
fn send_file_timed(
    source: &Path,
    what: &str,
    relayed: bool,
    receive: impl FnOnce(TcpListener) -> Result<u64> + Send + 'static,
) -> Result<Duration> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut addr = listener.local_addr()?;
    let start = Instant::now();
    let receiver = std::thread::spawn(move || receive(listener));
    let relay = if relayed {
        let (relay_addr, relay) = splice_relay::start(addr)?;
        addr = relay_addr;
        Some(relay)
    } else {
        None
    };
    let size = send_file(source, addr)?;
    if let Some(relay) = relay {
        let moved = relay.join().expect("relay thread")?;
        ensure!(
            moved == size,
            "{what}: the relay moved {moved} of {size} bytes"
        );
    }
    let received = receiver.join().expect("receiver thread")?;
    let elapsed = start.elapsed();
    ensure!(received == size, "{what} moved {received} of {size} bytes");
    Ok(elapsed)
}

/// The sender side of every file copy over raw TCP: reads `source` 1 MiB at
/// a time and writes it to a new connection to `addr`, which it then closes.
/// Returns the file's size.
fn send_file(source: &Path, addr: std::net::SocketAddr) -> Result<u64> {
    let mut file = File::open(source)?;
    let size = file.metadata()?.len();
    let mut socket = TcpStream::connect(addr)?;
    let mut block = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut block)?;
        if n == 0 {
            return Ok(size);
        }
        socket.write_all(&block[..n])?;
    }
}

fn same_contents(a: &Path, b: &Path) -> Result<bool> {
    let (mut a, mut b) = (File::open(a)?, File::open(b)?);
    let (mut x, mut y) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
    loop {
        let n = a.read(&mut x)?;
        if n == 0 {
            return Ok(b.read(&mut y)? == 0);
        }
        b.read_exact(&mut y[..n])?;
        if x[..n] != y[..n] {
            return Ok(false);
        }
    }
}

/// Run figures for a table cell: `1234, 1301, 1187`.
fn list_runs(rates: &[f64]) -> String {
    rates
        .iter()
        .map(|r| format!("{r:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

fn machine_description() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores, {cpu}, Linux {}", kernel.trim())
}

/// Runs `command` to completion; returns its wall time and its own CPU seconds.
fn timed_child(command: &mut Command, what: &str) -> Result<(Duration, f64)> {
    let start = Instant::now();
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let (output, cpu) = child.wait_with_output_rusage()?;
    let elapsed = start.elapsed();
    ensure!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((elapsed, cpu))
}

/// `wait_with_output` that also returns the child's CPU seconds (from wait4).
trait WaitRusage {
    fn wait_with_output_rusage(self) -> Result<(std::process::Output, f64)>;
}

impl WaitRusage for Child {
    fn wait_with_output_rusage(mut self) -> Result<(std::process::Output, f64)> {
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let mut out_pipe = self.stdout.take();
        let mut err_pipe = self.stderr.take();
        let err_thread = std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(pipe) = err_pipe.as_mut() {
                let _ = pipe.read_to_end(&mut buf);
            }
            buf
        });
        if let Some(pipe) = out_pipe.as_mut() {
            pipe.read_to_end(&mut stdout)?;
        }
        stderr.extend(err_thread.join().expect("stderr reader"));
        let (status, cpu) = wait_rusage(&self)?;
        Ok((
            std::process::Output {
                status,
                stdout,
                stderr,
            },
            cpu,
        ))
    }
}

/// Waits for `child` with wait4: its exit status and CPU seconds (user +
/// system, its reaped children included). `child` must not be waited again.
fn wait_rusage(child: &Child) -> Result<(std::process::ExitStatus, f64)> {
    use std::os::unix::process::ExitStatusExt;
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let rc = loop {
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if rc >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break rc;
        }
    };
    ensure!(rc == pid, "wait4: {}", std::io::Error::last_os_error());
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((
        std::process::ExitStatus::from_raw(status),
        seconds(usage.ru_utime) + seconds(usage.ru_stime),
    ))
}

/// The adb server's pid for our private port (it does the transfer work for the adb client).
fn adb_server_pid(port: u16) -> Option<u32> {
    let wanted = format!("tcp:{port}");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            let has = |s: &str| args.contains(&s.as_bytes());
            (has("fork-server") && has(&wanted)).then_some(pid)
        })
}

/// A client name without its `-zc` or `-copy` suffix.
fn client_base(client: &str) -> &str {
    client
        .strip_suffix("-zc")
        .or_else(|| client.strip_suffix("-copy"))
        .unwrap_or(client)
}

/// What one row of `adb-loopback` measures.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Transfer {
    RawTcp,
    /// The source file read and sent over raw TCP, the receiver discarding
    /// it: the floor under a push into the device node (or a pull into one).
    RawFileSend,
    /// The copies a pull cannot avoid, over raw TCP: the floor under any pull.
    RawFileCopy,
    /// [`Transfer::RawFileSend`] through a splice relay: the ceiling for a
    /// push through any host server.
    RelayedFileSend,
    /// [`Transfer::RawFileCopy`] through a splice relay: the ceiling for a
    /// pull through any host server.
    RelayedFileCopy,
    Client {
        client: String,
        kind: Kind,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Into the private character device node.
    Push,
    /// Into a new tmpfs file.
    Pull,
    /// Into the private character device node, written in place (oxadb only:
    /// adb replaces a device node it pulls into).
    PullToDevice,
}

impl Transfer {
    fn name(&self) -> String {
        match self {
            Transfer::RawTcp => "raw TCP".to_string(),
            Transfer::RawFileSend => "raw TCP from the file".to_string(),
            Transfer::RawFileCopy => "raw TCP file copy".to_string(),
            Transfer::RelayedFileSend => "raw TCP from the file, relayed".to_string(),
            Transfer::RelayedFileCopy => "raw TCP file copy, relayed".to_string(),
            Transfer::Client { client, kind } => {
                let kind = match kind {
                    Kind::Push => "push",
                    Kind::Pull => "pull",
                    Kind::PullToDevice => "pull to device",
                };
                format!("{client} {kind}")
            }
        }
    }
}

/// Starts oxadbd on `port` with `args`, logging to `log`, and waits until it listens.
fn start_daemon(oxadbd: &Path, port: u16, args: &[String], log: &Path) -> Result<Child> {
    let daemon = Command::new(oxadbd)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {}", oxadbd.display()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(log)?.contains("listening on") {
        ensure!(
            Instant::now() < deadline,
            "oxadbd did not start: {}",
            std::fs::read_to_string(log)?
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(daemon)
}

fn adb_loopback(args: AdbLoopback) -> Result<()> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    for client in &args.clients {
        let base = client_base(client);
        ensure!(
            [
                "adb",
                "adb-oxadb-server",
                "oxadb",
                "oxadb-aosp",
                "oxadb-classic"
            ]
            .contains(&base)
                && !(base.starts_with("adb") && base != client),
            "unknown client {client:?}: expected adb, adb-oxadb-server, oxadb, oxadb-aosp or \
             oxadb-classic, the oxadb ones optionally with -zc or -copy"
        );
    }
    let uses_adb = args.clients.iter().any(|c| c.starts_with("adb"));
    let uses_oxadb_server = args.clients.iter().any(|c| c == "adb-oxadb-server");
    let uses_zero_copy = args.clients.iter().any(|c| c.ends_with("-zc"));
    let adb_version = if uses_adb {
        run_checked(Command::new(&args.adb).arg("version"), "adb version")?
    } else {
        String::new()
    };
    let dir = args
        .workdir
        .join(format!("oxadb-bench-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("home"))?;
    let source = dir.join("random.bin");
    let pulled = dir.join("pulled.bin");
    let null_node = dir.join("null");
    eprintln!("writing {} random bytes to {}", args.size, source.display());
    write_random_file(&source, args.size)?;
    make_null_node(&null_node)?;

    let port = free_port()?;
    let daemon = start_daemon(
        &args.oxadbd,
        port,
        &args.daemon_arg,
        &dir.join("oxadbd.log"),
    )?;
    let mut session = Session {
        dir: dir.clone(),
        daemon,
        zero_copy_daemon: None,
        adb: args.adb.clone(),
        adb_port: free_port()?,
        serial: format!("127.0.0.1:{port}"),
        oxadb_server: None,
    };
    let oxadb_home = dir.join("oxadb-home");
    std::fs::create_dir_all(&oxadb_home)?;
    std::fs::create_dir_all(oxadb_home.join(".android"))?;
    // The key first: made on first use, it would cost the first transfer
    // about 0.35 CPU s (an RSA-2048 key).
    run_checked(
        Command::new(&args.oxadb)
            .arg("keygen")
            .arg(oxadb_home.join(".android").join("adbkey")),
        "oxadb keygen",
    )?;
    let oxadb_server = if uses_oxadb_server {
        let server_port = free_port()?;
        let server = start_oxadb_server(&args.oxadb, &oxadb_home, server_port, &dir)?;
        let pid = server.id();
        session.oxadb_server = Some((server, server_port));
        let connected = run_checked(
            Command::new(&args.adb).env("HOME", dir.join("home")).args([
                "-P",
                &server_port.to_string(),
                "connect",
                &session.serial,
            ]),
            "adb connect through oxadb server",
        )?;
        ensure!(connected.contains("connected"), "adb connect: {connected}");
        let state = run_checked(
            session.adb_through_oxadb_server().arg("get-state"),
            "adb get-state through oxadb server",
        )?;
        ensure!(state.trim() == "device", "device state is {state:?}");
        Some(pid)
    } else {
        None
    };
    let zero_copy_serial = if uses_zero_copy {
        let port = free_port()?;
        let mut daemon_args = args.daemon_arg.clone();
        daemon_args.push("--zero-copy".to_string());
        let log = dir.join("oxadbd-zero-copy.log");
        session.zero_copy_daemon = Some(start_daemon(&args.oxadbd, port, &daemon_args, &log)?);
        format!("127.0.0.1:{port}")
    } else {
        String::new()
    };
    let adb_server = if args.clients.iter().any(|c| c == "adb") {
        run_checked(session.adb().arg("start-server"), "adb start-server")?;
        let connected = run_checked(
            session.adb().arg("connect").arg(&session.serial),
            "adb connect",
        )?;
        ensure!(connected.contains("connected"), "adb connect: {connected}");
        let state = run_checked(session.adb_device().arg("get-state"), "adb get-state")?;
        ensure!(state.trim() == "device", "device state is {state:?}");
        Some(adb_server_pid(session.adb_port).context("finding the adb server process")?)
    } else {
        None
    };

    // Transfers: raw TCP (from memory and from the file), push and pulls for
    // each client, the raw file copy.
    let mut transfers = vec![Transfer::RawTcp, Transfer::RawFileSend];
    if uses_oxadb_server {
        transfers.push(Transfer::RelayedFileSend);
    }
    for client in &args.clients {
        let kinds: &[Kind] = if client.starts_with("adb") {
            &[Kind::Push, Kind::Pull]
        } else if client.ends_with("-copy") {
            // The host's copying push; its pulls are the plain client's.
            &[Kind::Push]
        } else {
            &[Kind::Push, Kind::Pull, Kind::PullToDevice]
        };
        for &kind in kinds {
            transfers.push(Transfer::Client {
                client: client.clone(),
                kind,
            });
        }
    }
    if uses_oxadb_server {
        transfers.push(Transfer::RelayedFileCopy);
    }
    transfers.push(Transfer::RawFileCopy);
    let names: Vec<String> = transfers.iter().map(Transfer::name).collect();
    let count = transfers.len();
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); count];
    let mut daemon_cpu: Vec<Vec<f64>> = vec![Vec::new(); count];
    let mut client_cpu: Vec<Vec<f64>> = vec![Vec::new(); count];
    let mut server_cpu: Vec<Vec<f64>> = vec![Vec::new(); count];
    let pid = session.daemon.id();
    let zero_copy_pid = session.zero_copy_daemon.as_ref().map(Child::id);
    for run in 0..args.runs {
        // Interleave and rotate the order: the machine is noisy, and a slow
        // spell should hit every transfer, not one.
        for step in 0..count {
            let which = (run + step) % count;
            let (elapsed, cpu, server_used, daemon) = match &transfers[which] {
                Transfer::RawTcp => (raw_tcp(args.size)?, 0.0, 0.0, 0.0),
                Transfer::RawFileSend | Transfer::RelayedFileSend => {
                    let relayed = transfers[which] == Transfer::RelayedFileSend;
                    (raw_tcp_file_send(&source, relayed)?, 0.0, 0.0, 0.0)
                }
                Transfer::RawFileCopy | Transfer::RelayedFileCopy => {
                    let relayed = transfers[which] == Transfer::RelayedFileCopy;
                    let _ = std::fs::remove_file(&pulled);
                    let elapsed = raw_tcp_file_copy(&source, &pulled, relayed)?;
                    ensure!(
                        same_contents(&source, &pulled)?,
                        "raw TCP file copy: copied file differs"
                    );
                    (elapsed, 0.0, 0.0, 0.0)
                }
                Transfer::Client { client, kind } => {
                    let zero_copy = client.ends_with("-zc");
                    let base = client_base(client);
                    let daemon_pid = if zero_copy {
                        zero_copy_pid.expect("a zero-copy daemon")
                    } else {
                        pid
                    };
                    let mut command = if base == "adb" {
                        session.adb_device()
                    } else if base == "adb-oxadb-server" {
                        session.adb_through_oxadb_server()
                    } else {
                        let mut command = Command::new(&args.oxadb);
                        let serial = if zero_copy {
                            &zero_copy_serial
                        } else {
                            &session.serial
                        };
                        command.env("HOME", &oxadb_home).arg("-s").arg(serial);
                        if base == "oxadb-aosp" {
                            command.args(["--credit", "aosp"]);
                        }
                        if base == "oxadb-classic" {
                            command.arg("--no-burst");
                        }
                        if zero_copy {
                            command.arg("--zero-copy");
                        }
                        if client.ends_with("-copy") {
                            command.arg("--no-zero-copy");
                        }
                        command
                    };
                    // The server's work is counted on its own.
                    let server = match base {
                        "adb" => adb_server,
                        "adb-oxadb-server" => oxadb_server,
                        _ => None,
                    };
                    let server_before = match server {
                        Some(server) => cpu_seconds(server)?,
                        None => 0.0,
                    };
                    let _ = std::fs::remove_file(&pulled);
                    match kind {
                        Kind::Push => command.arg("push").arg(&source).arg(&null_node),
                        Kind::Pull => command.arg("pull").arg(&source).arg(&pulled),
                        Kind::PullToDevice => command.arg("pull").arg(&source).arg(&null_node),
                    };
                    let daemon_before = cpu_seconds(daemon_pid)?;
                    let (elapsed, cpu) = timed_child(&mut command, &names[which])?;
                    let daemon = cpu_seconds(daemon_pid)? - daemon_before;
                    let server_used = match server {
                        Some(server) => cpu_seconds(server)? - server_before,
                        None => 0.0,
                    };
                    if *kind == Kind::Pull {
                        ensure!(
                            same_contents(&source, &pulled)?,
                            "{}: pulled file differs",
                            names[which]
                        );
                    } else {
                        let node = std::fs::symlink_metadata(&null_node)?.file_type();
                        ensure!(
                            node.is_char_device(),
                            "{} replaced the device node",
                            names[which]
                        );
                    }
                    (elapsed, cpu, server_used, daemon)
                }
            };
            let secs = elapsed.as_secs_f64();
            eprintln!(
                "run {} {:>28}: {:8.1} MB/s",
                run + 1,
                names[which],
                args.size as f64 / secs / 1e6
            );
            seconds[which].push(secs);
            daemon_cpu[which].push(daemon);
            client_cpu[which].push(cpu);
            server_cpu[which].push(server_used);
        }
    }
    if session.daemon.try_wait()?.is_some() {
        bail!("oxadbd exited during the benchmark");
    }
    if let Some((server, _)) = &mut session.oxadb_server {
        if server.try_wait()?.is_some() {
            bail!("oxadb server exited during the benchmark");
        }
    }
    if let Some(daemon) = &mut session.zero_copy_daemon {
        if daemon.try_wait()?.is_some() {
            bail!("the zero-copy oxadbd exited during the benchmark");
        }
    }

    let gib = args.size as f64 / (1u64 << 30) as f64;
    let rate = |s: &f64| args.size as f64 / s / 1e6;
    println!("Machine: {}", machine_description());
    if uses_adb {
        println!(
            "Client: {}",
            adb_version.lines().nth(1).unwrap_or("adb").trim()
        );
    }
    println!(
        "Transfer: {} MiB of random data per run, {} runs, interleaved; daemon args: {:?}",
        args.size >> 20,
        args.runs,
        args.daemon_arg
    );
    println!();
    println!("| transfer | runs (MB/s) | median MB/s | vs raw TCP | vs raw TCP from the file | vs raw file copy | vs adb 29 | client CPU s/GiB | server CPU s/GiB | oxadbd CPU s/GiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let medians: Vec<f64> = seconds
        .iter()
        .map(|s| median(&mut s.iter().map(rate).collect::<Vec<_>>()))
        .collect();
    let per_gib = |values: &[f64]| median(&mut values.iter().map(|c| c / gib).collect::<Vec<_>>());
    let index_of = |client: &str, kind: Kind| {
        transfers.iter().position(|t| {
            *t == Transfer::Client {
                client: client.to_string(),
                kind,
            }
        })
    };
    let raw_tcp_index = 0;
    let raw_file_send = 1;
    let raw_file_copy = count - 1;
    for which in 0..count {
        let runs = seconds[which]
            .iter()
            .map(|s| format!("{:.0}", rate(s)))
            .collect::<Vec<_>>()
            .join(", ");
        // Pushes and pulls into the device node read the file and discard
        // what arrives, as the raw send from the file does.
        let versus_file_send = match &transfers[which] {
            Transfer::RawFileSend => "1.00".to_string(),
            Transfer::RelayedFileSend
            | Transfer::Client {
                kind: Kind::Push | Kind::PullToDevice,
                ..
            } => format!("{:.2}", medians[which] / medians[raw_file_send]),
            _ => "-".to_string(),
        };
        let (client, server, daemon, versus_adb, versus_file_copy) = match &transfers[which] {
            Transfer::RawTcp | Transfer::RawFileSend | Transfer::RelayedFileSend => (
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".to_string(),
            ),
            Transfer::RawFileCopy | Transfer::RelayedFileCopy => (
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("{:.2}", medians[which] / medians[raw_file_copy]),
            ),
            Transfer::Client { client, kind } => (
                format!("{:.2}", per_gib(&client_cpu[which])),
                if client_base(client).starts_with("adb") {
                    format!("{:.2}", per_gib(&server_cpu[which]))
                } else {
                    "-".to_string()
                },
                format!("{:.2}", per_gib(&daemon_cpu[which])),
                index_of("adb", *kind).map_or("-".to_string(), |a| {
                    format!("{:.2}", medians[which] / medians[a])
                }),
                if *kind == Kind::Push {
                    "-".to_string()
                } else {
                    format!("{:.2}", medians[which] / medians[raw_file_copy])
                },
            ),
        };
        println!(
            "| {} | {} | {:.0} | {:.2} | {} | {} | {} | {} | {} | {} |",
            names[which],
            runs,
            medians[which],
            medians[which] / medians[raw_tcp_index],
            versus_file_send,
            versus_file_copy,
            versus_adb,
            client,
            server,
            daemon
        );
    }

    // Google's CLI through oxadb's server against oxadb alone, against
    // Google's own server and against the relayed raw transfer that no
    // server can beat, from the same run: ratios of medians.
    if uses_oxadb_server {
        let floor_of = |kind: Kind| {
            let floor = match kind {
                Kind::Push => Transfer::RelayedFileSend,
                _ => Transfer::RelayedFileCopy,
            };
            transfers.iter().position(|t| *t == floor)
        };
        println!();
        println!(
            "| adb CLI through oxadb server / | oxadb direct | adb 29 server | relayed raw floor |"
        );
        println!("|---|---|---|---|");
        for kind in [Kind::Push, Kind::Pull] {
            let Some(through) = index_of("adb-oxadb-server", kind) else {
                continue;
            };
            let versus = |other: Option<usize>| {
                other.map_or("-".to_string(), |other| {
                    format!("{:.2}", medians[through] / medians[other])
                })
            };
            println!(
                "| {} | {} | {} | {} |",
                transfers[through].name(),
                versus(index_of("oxadb", kind)),
                versus(index_of("adb", kind)),
                versus(floor_of(kind))
            );
        }
        // What the server's throughput goals ask for, beside what a relay
        // that does nothing but splice reached in the same run.
        println!();
        println!("| MB/s, medians of this run | push | pull |");
        println!("|---|---|---|");
        let row = |what: &str, value: &dyn Fn(Kind) -> Option<f64>| {
            let cell = |kind| value(kind).map_or("-".to_string(), |v| format!("{v:.0}"));
            println!("| {what} | {} | {} |", cell(Kind::Push), cell(Kind::Pull));
        };
        row("relayed raw floor", &|kind| {
            floor_of(kind).map(|i| medians[i])
        });
        row("adb CLI through oxadb server", &|kind| {
            index_of("adb-oxadb-server", kind).map(|i| medians[i])
        });
        row("0.9 x oxadb direct", &|kind| {
            index_of("oxadb", kind).map(|i| 0.9 * medians[i])
        });
        row("2 x adb 29 server", &|kind| {
            index_of("adb", kind).map(|i| 2.0 * medians[i])
        });
    }

    // Zero-copy against copying, from the same run: ratios of medians.
    let pairs: Vec<&String> = args
        .clients
        .iter()
        .filter(|c| args.clients.contains(&format!("{c}-zc")))
        .collect();
    if !pairs.is_empty() {
        println!();
        println!("| zero-copy / copying | MB/s | client CPU | oxadbd CPU |");
        println!("|---|---|---|---|");
        for client in pairs {
            for kind in [Kind::Push, Kind::Pull, Kind::PullToDevice] {
                let (Some(zero), Some(copy)) = (
                    index_of(&format!("{client}-zc"), kind),
                    index_of(client, kind),
                ) else {
                    continue;
                };
                let ratio = |values: &[Vec<f64>]| per_gib(&values[zero]) / per_gib(&values[copy]);
                println!(
                    "| {} | {:.2} | {:.2} | {:.2} |",
                    transfers[zero].name(),
                    medians[zero] / medians[copy],
                    ratio(&client_cpu),
                    ratio(&daemon_cpu)
                );
            }
        }
    }
    Ok(())
}

fn stream_loopback(size: u64, runs: usize, only: &[String]) -> Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let names = ["raw TCP", "stream, burst", "stream, classic"];
    let mut rates: [Vec<f64>; 3] = Default::default();
    // Both ends run in this process: its CPU per GiB is theirs together.
    let mut cpu: [Vec<f64>; 3] = Default::default();
    let gib = size as f64 / (1u64 << 30) as f64;
    for run in 0..runs {
        for step in 0..3 {
            let which = (run + step) % 3;
            if !only
                .iter()
                .any(|o| names[which].contains(o.as_str()) || (o == "raw" && which == 0))
            {
                continue;
            }
            let cpu_before = cpu_seconds(std::process::id())?;
            let elapsed = match which {
                0 => raw_tcp(size)?,
                1 => runtime.block_on(stream::one_stream(size, true))?,
                _ => runtime.block_on(stream::one_stream(size, false))?,
            };
            cpu[which].push((cpu_seconds(std::process::id())? - cpu_before) / gib);
            let rate = size as f64 / elapsed.as_secs_f64() / 1e6;
            eprintln!("run {} {:>15}: {rate:8.1} MB/s", run + 1, names[which]);
            rates[which].push(rate);
        }
    }
    println!("Machine: {}", machine_description());
    println!(
        "Transfer: {} MiB per run, {runs} runs, interleaved",
        size >> 20
    );
    println!();
    println!("| transfer | runs (MB/s) | median MB/s | vs raw TCP | CPU s/GiB, both ends |");
    println!("|---|---|---|---|---|");
    let raw = if rates[0].is_empty() {
        f64::NAN
    } else {
        median(&mut rates[0].clone())
    };
    let measured: Vec<usize> = (0..3).filter(|&w| !rates[w].is_empty()).collect();
    for which in measured {
        let runs = list_runs(&rates[which]);
        let med = median(&mut rates[which]);
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} |",
            names[which],
            runs,
            med,
            med / raw,
            median(&mut cpu[which])
        );
    }
    Ok(())
}

/// `oxadb server -P PORT` with `home`'s key, logging to `dir`, once it
/// answers.
fn start_oxadb_server(oxadb: &Path, home: &Path, port: u16, dir: &Path) -> Result<Child> {
    let log = dir.join(format!("oxadb-server-{port}.log"));
    let mut server = Command::new(oxadb)
        .env("HOME", home)
        .args(["server", "-P", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting {} server", oxadb.display()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if server.try_wait()?.is_some() || Instant::now() > deadline {
            let _ = server.kill();
            let _ = server.wait();
            bail!(
                "oxadb server did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(server)
}
