//! `server-neighbours`: does a well-behaved device keep its throughput
//! through `oxadb server` while misbehaving devices are connected to the
//! same server? One oxadbd on loopback (the good device) and one private
//! `oxadb server`; the misbehaving devices are listeners in this process
//! ([`crate::hostile`]), connected to the server with `oxadb connect`.
//!
//! Each round takes every case (a kind of misbehaving device, one of them
//! or `--count` of them) in rotating order: a push and a pull through the
//! server alone, then the same with the misbehaving devices connected and
//! misbehaving; the ratio of each to the alone one of the same direction
//! just before, in the same round, is what the tables give, with the
//! server's CPU time and peak resident set for each run. The kinds that
//! misbehave once per connection (every 3 s, when the server reconnects)
//! have each transfer started just before their next time.

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::hostile::{Count, Counts, Fleet, Kind};
use crate::{
    cpu_seconds, free_port, list_runs, machine_description, make_null_node, median,
    write_random_file,
};

#[derive(clap::Args)]
pub(crate) struct ServerNeighboursArgs {
    /// Bytes per push and per pull (suffixes K, M, G are powers of 1024).
    #[arg(long, default_value = "256M", value_parser = oxadb_io::parse_size)]
    size: u64,
    /// Rounds; medians are reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Kinds of misbehaving device, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "open-flood,stray-flood,reconnect,credit-flood"
    )]
    hostile: Vec<Kind>,
    /// Misbehaving devices in the larger case of each kind (the smaller is one).
    #[arg(long, default_value_t = 10)]
    count: usize,
    /// Seconds a fleet of misbehaving devices may live at most: their loops
    /// end by themselves then, even if the bench is stuck. A case whose
    /// loops reach it is flagged (its transfers were partly alone).
    #[arg(long, default_value_t = 1800)]
    phase_limit: u64,
    /// The server's async worker threads (OXADB_SERVER_THREADS; the
    /// server's default is one).
    #[arg(long)]
    server_threads: Option<usize>,
    /// Also print, for each case, where the CPU time went during the
    /// transfers: client, server (by thread), daemon, the misbehaving
    /// devices (this process) and the whole machine.
    #[arg(long)]
    detail: bool,
    #[arg(long, default_value = "target/release/oxadbd")]
    oxadbd: PathBuf,
    #[arg(long, default_value = "target/release/oxadb")]
    oxadb: PathBuf,
    /// A tmpfs directory for the data, the homes and the logs.
    #[arg(long, default_value = "/dev/shm")]
    workdir: PathBuf,
}

/// Processes this bench started and has not reaped yet: what Ctrl-C ends,
/// by pid. A pid stays listed until its process is reaped, so it never
/// names another process.
static LIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn live() -> MutexGuard<'static, Vec<u32>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A child process, ended (SIGKILL) and reaped when dropped.
struct Tracked {
    child: Option<Child>,
}

impl Tracked {
    fn spawn(command: &mut Command, what: &str) -> Result<Tracked> {
        // Listed under the lock it is spawned under: Ctrl-C cannot miss it.
        let mut live = live();
        let child = command
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        live.push(child.id());
        Ok(Tracked { child: Some(child) })
    }

    fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Whether the process has exited (it is not reaped here).
    fn exited(&self) -> Result<bool> {
        exited(self.id(), false)
    }

    /// Waits for the process to exit by itself, then reaps it: its status
    /// and CPU seconds (user + system).
    fn wait(mut self) -> Result<(ExitStatus, f64)> {
        use std::os::unix::process::ExitStatusExt;
        let child = self.child.take().context("waited twice")?;
        let pid = child.id();
        exited(pid, true)?;
        let mut live = live();
        let mut status = 0;
        // SAFETY: rusage is plain data, for which all zeroes is a value.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `status` and `usage` are ours to write; `pid` has exited
        // and is not reaped yet (the lock held keeps Ctrl-C off it).
        let rc = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
        ensure!(
            rc == pid as libc::pid_t,
            "wait4 {pid}: {}",
            std::io::Error::last_os_error()
        );
        live.retain(|&p| p != pid);
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Ok((
            ExitStatus::from_raw(status),
            seconds(usage.ru_utime) + seconds(usage.ru_stime),
        ))
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let mut live = live();
            let _ = child.kill();
            let _ = child.wait();
            live.retain(|&pid| pid != child.id());
        }
    }
}

/// Whether child `pid` has exited, waiting for it if `block`; the child is
/// left unreaped (WNOWAIT), so its pid stays its own until it is.
fn exited(pid: u32, block: bool) -> Result<bool> {
    let flags = libc::WEXITED | libc::WNOWAIT | if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: siginfo_t is plain data, for which all zeroes is a value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is ours to write; `pid` is a child of this process
        // that nothing has reaped (see `Tracked`).
        let rc = unsafe { libc::waitid(libc::P_PID, pid, &mut info, flags) };
        if rc == 0 {
            // SAFETY: waitid filled `info`; si_pid is 0 when WNOHANG found
            // the child still running.
            return Ok(unsafe { info.si_pid() } != 0);
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            bail!("waitid {pid}: {error}");
        }
    }
}

/// Runs `command` to completion, its output to `log`; returns the output.
fn run_logged(command: &mut Command, what: &str, log: &Path) -> Result<String> {
    let out = File::create(log)?;
    command
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    let (status, _) = Tracked::spawn(command, what)?.wait()?;
    let text = std::fs::read_to_string(log).unwrap_or_default();
    ensure!(status.success(), "{what} failed: {text}");
    Ok(text)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Push,
    Pull,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::Push => "push",
            Direction::Pull => "pull",
        }
    }
}

/// One push or pull.
#[derive(Debug, Clone)]
struct Sample {
    seconds: f64,
    mbps: f64,
    /// The server's user + system time during the transfer.
    server_cpu: f64,
    /// The server's peak resident set during the transfer (VmHWM, reset
    /// before it).
    server_peak: u64,
    /// This process's CPU time: the misbehaving devices'.
    hostile_cpu: f64,
    /// The client's and the daemon's CPU time.
    client_cpu: f64,
    daemon_cpu: f64,
    /// CPU time the whole machine was busy (all cores, every process).
    machine_busy: f64,
    /// What the misbehaving devices counted during the transfer.
    counts: Counts,
    /// The server's CPU time by thread name during the transfer.
    threads: Vec<(String, f64)>,
}

/// The good device, the server and the paths of one session.
struct Session {
    dir: PathBuf,
    home: PathBuf,
    oxadb: PathBuf,
    source: PathBuf,
    /// The push destination, a private /dev/null on the device side.
    device_null: PathBuf,
    /// The pull destination, another one on the host side.
    host_null: PathBuf,
    size: u64,
    server_port: u16,
    serial: String,
    // Ended before the directory is removed (fields drop in order).
    server: Tracked,
    daemon: Tracked,
    runtime: tokio::runtime::Runtime,
}

impl Drop for Session {
    fn drop(&mut self) {
        // The processes first (the fields would drop after this body).
        drop(std::mem::replace(&mut self.server, Tracked { child: None }));
        drop(std::mem::replace(&mut self.daemon, Tracked { child: None }));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Session {
    /// `oxadb` as a client of the private server, with a private home and
    /// state.
    fn oxadb(&self) -> Command {
        let mut command = Command::new(&self.oxadb);
        command
            .env("HOME", &self.home)
            .env("OXADB_STATE_DIR", self.dir.join("state"))
            .env_remove("ANDROID_SERIAL")
            .env_remove("OXADB_DIRECT")
            .env_remove("ADB_SERVER_SOCKET")
            .args(["-P", &self.server_port.to_string()]);
        command
    }

    fn server_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.server_port))
    }

    fn transfer(&self, direction: Direction, fleet: Option<&Fleet>) -> Result<Sample> {
        let mut command = self.oxadb();
        command.args(["-s", &self.serial, direction.name(), "-q", "-z", "none"]);
        let destination = match direction {
            Direction::Push => &self.device_null,
            Direction::Pull => &self.host_null,
        };
        command.arg(&self.source).arg(destination);
        let log = self.dir.join("client.log");
        let out = File::create(&log)?;
        command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let server = self.server.id();
        reset_peak_rss(server)?;
        let counts_before = fleet.map(|f| f.counters.snapshot());
        let threads_before = thread_cpu(server);
        let server_before = cpu_seconds(server)?;
        let daemon_before = cpu_seconds(self.daemon.id())?;
        let own_before = cpu_seconds(std::process::id())?;
        let machine_before = machine_busy()?;
        let start = Instant::now();
        let (status, client_cpu) = Tracked::spawn(&mut command, "oxadb")?.wait()?;
        let seconds = start.elapsed().as_secs_f64();
        let machine_busy = machine_busy()? - machine_before;
        let server_cpu = cpu_seconds(server)? - server_before;
        let daemon_cpu = cpu_seconds(self.daemon.id())? - daemon_before;
        let hostile_cpu = cpu_seconds(std::process::id())? - own_before;
        let threads = thread_cpu_since(&threads_before, &thread_cpu(server));
        let server_peak = peak_rss(server)?;
        let counts = match (fleet, counts_before) {
            (Some(fleet), Some(before)) => fleet.counters.snapshot().since(&before),
            _ => Counts::default(),
        };
        ensure!(
            status.success(),
            "oxadb {} failed: {}",
            direction.name(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        ensure!(
            std::fs::symlink_metadata(destination)?
                .file_type()
                .is_char_device(),
            "oxadb {} replaced the device node {}",
            direction.name(),
            destination.display()
        );
        Ok(Sample {
            seconds,
            mbps: self.size as f64 / seconds / 1e6,
            server_cpu,
            server_peak,
            hostile_cpu,
            client_cpu,
            daemon_cpu,
            machine_busy,
            counts,
            threads,
        })
    }

    /// Starts `count` misbehaving devices of `kind`, connects each to the
    /// server while they still behave, then lets them misbehave.
    fn start_fleet(&self, kind: Kind, count: usize, limit: Duration) -> Result<Fleet> {
        let mut fleet = Fleet::start(
            self.runtime.handle(),
            kind,
            count,
            limit,
            self.server_addr(),
        )?;
        for port in &fleet.ports {
            let serial = format!("127.0.0.1:{port}");
            let text = run_logged(
                self.oxadb().args(["connect", &serial]),
                "oxadb connect",
                &self.dir.join("connect.log"),
            )?;
            ensure!(
                text.contains("connected to"),
                "oxadb connect {serial}: {text}"
            );
        }
        fleet.misbehave();
        // Floods are at full rate at once; a reconnecting device (and a
        // credit flood, one per reconnection) has a cycle of 3 s, over
        // which the fleet's devices are spread.
        std::thread::sleep(match kind {
            Kind::OpenFlood | Kind::StrayFlood => Duration::from_secs(1),
            Kind::Reconnect | Kind::CreditFlood => Duration::from_millis(3_500),
        });
        Ok(fleet)
    }

    /// Stops the fleet, disconnects its devices from the server and checks
    /// that only the good device is left.
    fn end_fleet(&self, fleet: Fleet) -> Result<()> {
        fleet.stop();
        for port in &fleet.ports {
            run_logged(
                self.oxadb()
                    .args(["disconnect", &format!("127.0.0.1:{port}")]),
                "oxadb disconnect",
                &self.dir.join("disconnect.log"),
            )?;
        }
        let bounded = fleet.counters.snapshot().get(Count::Bounded);
        if bounded > 0 {
            eprintln!("warning: {bounded} hostile loops ended on their bounds");
        }
        fleet.finish(Duration::from_secs(15));
        let devices = run_logged(
            self.oxadb().arg("devices"),
            "oxadb devices",
            &self.dir.join("devices.log"),
        )?;
        let listed: Vec<&str> = devices.lines().filter(|l| l.contains('\t')).collect();
        ensure!(
            listed.len() == 1 && listed[0].starts_with(&self.serial),
            "the server lists other devices than the good one: {devices}"
        );
        ensure!(!self.server.exited()?, "oxadb server exited");
        ensure!(!self.daemon.exited()?, "oxadbd exited");
        Ok(())
    }
}

/// Resets `pid`'s peak resident set (VmHWM) to its current one (Linux
/// `proc(5)`, clear_refs: "5").
fn reset_peak_rss(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("resetting the peak RSS of {pid}"))
}

/// `pid`'s peak resident set (VmHWM) in bytes.
fn peak_rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .context("no VmHWM")?
        .parse()?;
    Ok(kib * 1024)
}

/// CPU seconds the machine has been busy, all cores together (proc(5)'s
/// /proc/stat: every field of the `cpu` line but idle and iowait).
fn machine_busy() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<f64>())
        .collect::<Result<_, _>>()?;
    ensure!(ticks.len() >= 5, "short /proc/stat cpu line");
    // guest and guest_nice (9th, 10th) are counted in user and nice already.
    let busy: f64 = ticks.iter().take(8).sum::<f64>() - ticks[3] - ticks[4];
    // SAFETY: sysconf has no preconditions.
    Ok(busy / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// CPU seconds of each thread of `pid`: (tid, name, seconds).
fn thread_cpu(pid: u32) -> Vec<(u32, String, f64)> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let tid: u32 = task.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            let name = stat[stat.find('(')? + 1..stat.rfind(')')?].to_string();
            let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
            // utime and stime, the 14th and 15th fields of proc(5)'s stat.
            let used =
                fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
            Some((tid, name, used / ticks))
        })
        .collect()
}

/// CPU seconds used by thread name between two [`thread_cpu`] readings.
fn thread_cpu_since(
    before: &[(u32, String, f64)],
    after: &[(u32, String, f64)],
) -> Vec<(String, f64)> {
    let mut by_name: Vec<(String, f64)> = Vec::new();
    for (tid, name, used) in after {
        let earlier = before
            .iter()
            .find(|(t, _, _)| t == tid)
            .map_or(0.0, |b| b.2);
        match by_name.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 += used - earlier,
            None => by_name.push((name.clone(), used - earlier)),
        }
    }
    by_name
}

/// Starts `oxadbd` on loopback `port` with its state and keys in `dir`,
/// and waits until it listens.
fn start_daemon(oxadbd: &Path, port: u16, dir: &Path) -> Result<Tracked> {
    let log = dir.join("oxadbd.log");
    // Loopback peers of the daemon's own user need no key (`--auth` would
    // ask for one); the keys file is a private, empty one all the same.
    let keys = dir.join("adb_keys");
    std::fs::write(&keys, "")?;
    let daemon = Tracked::spawn(
        Command::new(oxadbd)
            .env("HOME", dir.join("daemon-home"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--state-dir")
            .arg(dir.join("oxadbd-state"))
            .arg("--keys")
            .arg(&keys)
            .arg("--no-mdns")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?),
        "oxadbd",
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)?.contains("listening on") {
        ensure!(
            Instant::now() < deadline && !daemon.exited()?,
            "oxadbd did not start: {}",
            std::fs::read_to_string(&log)?
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(daemon)
}

/// `oxadb server -P port` with a private home, without USB or mDNS
/// discovery (nothing but loopback), once it answers.
fn start_server(
    oxadb: &Path,
    home: &Path,
    port: u16,
    dir: &Path,
    threads: Option<usize>,
) -> Result<Tracked> {
    let log = dir.join("oxadb-server.log");
    let mut command = Command::new(oxadb);
    if let Some(threads) = threads {
        command.env("OXADB_SERVER_THREADS", threads.to_string());
    }
    let server = Tracked::spawn(
        command
            .env("HOME", home)
            .env("ADB_USB", "0")
            .env("ADB_MDNS", "0")
            .env_remove("ADB_SERVER_SOCKET")
            .args(["server", "-P", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?),
        "oxadb server",
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        ensure!(
            Instant::now() < deadline && !server.exited()?,
            "oxadb server did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(server)
}

/// One case's runs in one direction: (alone just before, with neighbours).
type Pairs = Vec<(Sample, Sample)>;

pub(crate) fn server_neighbours(args: ServerNeighboursArgs) -> Result<()> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    ensure!(args.count >= 1, "--count must be at least 1");
    ensure!(!args.hostile.is_empty(), "--hostile names no kind");
    let dir = args
        .workdir
        .join(format!("oxadb-bench-neighbours-{}", std::process::id()));
    let home = dir.join("home");
    std::fs::create_dir_all(home.join(".android"))?;
    std::fs::create_dir_all(dir.join("device"))?;
    std::fs::create_dir_all(dir.join("host"))?;
    // The misbehaving devices' runtime: one worker, so that they cannot
    // take both cores from the server, the daemon and the client.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("hostile")
        .enable_all()
        .build()?;
    {
        let dir = dir.clone();
        runtime.spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                let live = live();
                for &pid in live.iter() {
                    // SAFETY: kill has no memory effects; every pid in LIVE
                    // is an unreaped child of ours, so it names that child.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
                let _ = std::fs::remove_dir_all(&dir);
                eprintln!("interrupted: ended {} processes", live.len());
                std::process::exit(130);
            }
        });
    }
    let result = run(&args, dir.clone(), home, runtime);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(
    args: &ServerNeighboursArgs,
    dir: PathBuf,
    home: PathBuf,
    runtime: tokio::runtime::Runtime,
) -> Result<()> {
    let source = dir.join("random.bin");
    eprintln!("writing {} random bytes to {}", args.size, source.display());
    write_random_file(&source, args.size)?;
    let device_null = dir.join("device").join("null");
    let host_null = dir.join("host").join("null");
    make_null_node(&device_null)?;
    make_null_node(&host_null)?;
    // The key first: made on first use, it would cost the first connect.
    run_logged(
        Command::new(&args.oxadb)
            .arg("keygen")
            .arg(home.join(".android").join("adbkey")),
        "oxadb keygen",
        &dir.join("keygen.log"),
    )?;
    let device_port = free_port()?;
    let daemon = start_daemon(&args.oxadbd, device_port, &dir)?;
    let server_port = free_port()?;
    let server = start_server(&args.oxadb, &home, server_port, &dir, args.server_threads)?;
    eprintln!(
        "oxadb server pid {}, oxadbd pid {}",
        server.id(),
        daemon.id()
    );
    let session = Session {
        dir: dir.clone(),
        home,
        oxadb: args.oxadb.clone(),
        source,
        device_null,
        host_null,
        size: args.size,
        server_port,
        serial: format!("127.0.0.1:{device_port}"),
        server,
        daemon,
        runtime,
    };
    let text = run_logged(
        session.oxadb().args(["connect", &session.serial]),
        "oxadb connect",
        &dir.join("connect.log"),
    )?;
    ensure!(text.contains("connected to"), "oxadb connect: {text}");

    let mut cases: Vec<(Kind, usize)> = Vec::new();
    for &kind in &args.hostile {
        cases.push((kind, 1));
        if args.count > 1 {
            cases.push((kind, args.count));
        }
    }
    let limit = Duration::from_secs(args.phase_limit);
    let directions = [Direction::Push, Direction::Pull];
    // results[direction][case]
    let mut results: Vec<Vec<Pairs>> = vec![vec![Vec::new(); cases.len()]; 2];
    for round in 0..args.runs {
        for step in 0..cases.len() {
            // Rotate the order every round: a slow spell of the machine
            // should hit every case, not always the same.
            let which = (round + step) % cases.len();
            let (kind, count) = cases[which];
            let order = if (round + step) % 2 == 0 {
                directions
            } else {
                [Direction::Pull, Direction::Push]
            };
            let mut alone = Vec::new();
            for direction in order {
                alone.push(session.transfer(direction, None)?);
            }
            let fleet = session.start_fleet(kind, count, limit)?;
            let mut with = Vec::new();
            for direction in order {
                // A device that misbehaves once per connection does so every
                // 3 s: each transfer starts just before the next time, so
                // that it is measured with one inside it (the transfers are
                // shorter than 3 s).
                if let Some(next) = fleet.next_misbehaviour_in() {
                    std::thread::sleep(next.saturating_sub(Duration::from_millis(200)));
                }
                with.push(session.transfer(direction, Some(&fleet))?);
            }
            session.end_fleet(fleet)?;
            for ((direction, alone), with) in order.iter().zip(alone).zip(with) {
                eprintln!(
                    "round {} {:>12} x{:<3} {}: alone {:6.0} MB/s, with {:6.0} MB/s ({:.2}); server CPU {:.2} s / {:.2} s",
                    round + 1,
                    kind.name(),
                    count,
                    direction.name(),
                    alone.mbps,
                    with.mbps,
                    with.mbps / alone.mbps,
                    alone.server_cpu,
                    with.server_cpu
                );
                let d = directions
                    .iter()
                    .position(|x| x == direction)
                    .expect("a direction");
                results[d][which].push((alone, with));
            }
        }
    }
    drop(session);

    println!("Machine: {}", machine_description());
    println!(
        "{} MiB of random data per push and per pull through `oxadb server` (`-z none`) to oxadbd on loopback; \
         {} rounds, each taking every case in rotating order: alone, then with the misbehaving devices; \
         ratios are to the alone run just before, in the same round",
        args.size >> 20,
        args.runs
    );
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    for (d, direction) in directions.iter().enumerate() {
        println!();
        println!("{}:", direction.name());
        println!();
        println!("| neighbours | count | runs (MB/s) | median MB/s | ratios to alone | median ratio | at least 0.9 | server CPU s | server peak RSS MiB |");
        println!("|---|---:|---|---:|---|---:|---|---:|---:|");
        let alone: Vec<&Sample> = results[d].iter().flatten().map(|(a, _)| a).collect();
        let mut rates: Vec<f64> = alone.iter().map(|s| s.mbps).collect();
        let mut cpu: Vec<f64> = alone.iter().map(|s| s.server_cpu).collect();
        let peak = alone.iter().map(|s| s.server_peak).max().unwrap_or(0);
        println!(
            "| none (alone, every round) | 0 | {} runs | {:.0} | - | 1.00 | - | {:.2} | {:.1} |",
            rates.len(),
            median(&mut rates),
            median(&mut cpu),
            mib(peak)
        );
        for (which, &(kind, count)) in cases.iter().enumerate() {
            let pairs = &results[d][which];
            let rates: Vec<f64> = pairs.iter().map(|(_, w)| w.mbps).collect();
            let ratios: Vec<f64> = pairs.iter().map(|(a, w)| w.mbps / a.mbps).collect();
            let mut cpu: Vec<f64> = pairs.iter().map(|(_, w)| w.server_cpu).collect();
            let peak = pairs.iter().map(|(_, w)| w.server_peak).max().unwrap_or(0);
            let ratio = median(&mut ratios.clone());
            println!(
                "| {} | {} | {} | {:.0} | {} | {:.2} | {} | {:.2} | {:.1} |",
                kind.name(),
                count,
                list_runs(&rates),
                median(&mut rates.clone()),
                ratios
                    .iter()
                    .map(|r| format!("{r:.2}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                ratio,
                if ratio >= 0.9 { "yes" } else { "no" },
                median(&mut cpu),
                mib(peak)
            );
        }
    }

    // What the misbehaving devices did during the transfers (both
    // directions, every round).
    println!();
    println!("What the misbehaving devices did during the measured transfers (push and pull, all rounds):");
    println!();
    println!("| neighbours | count | seconds | OPEN sent | refused (CLSE back) | stray OKAY + CLSE sent | CNXN answered | malformed sent | shells opened | WRTE MiB sent | their CPU s per s | loops ended on a bound |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (which, &(kind, count)) in cases.iter().enumerate() {
        let mut total = Counts::default();
        let mut seconds = 0.0;
        let mut cpu = 0.0;
        for pairs in &results {
            for (_, with) in &pairs[which] {
                total.add(&with.counts);
                seconds += with.seconds;
                cpu += with.hostile_cpu;
            }
        }
        println!(
            "| {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {:.0} | {:.2} | {} |",
            kind.name(),
            count,
            seconds,
            total.get(Count::OpensSent),
            total.get(Count::ClsesReceived),
            total.get(Count::StraySent),
            total.get(Count::Connections),
            total.get(Count::MalformedSent),
            total.get(Count::ShellsOpened),
            mib(total.get(Count::WrteBytesSent)),
            cpu / seconds,
            total.get(Count::Bounded)
        );
    }

    if args.detail {
        println!();
        println!("CPU seconds per transfer, medians, alone / with the misbehaving devices:");
        println!();
        println!("| neighbours | count | direction | client | server | oxadbd | misbehaving devices | whole machine | server by thread, with them |");
        println!("|---|---:|---|---|---|---|---|---|---|");
        for (which, &(kind, count)) in cases.iter().enumerate() {
            for (d, direction) in directions.iter().enumerate() {
                let pairs = &results[d][which];
                let alone: Vec<&Sample> = pairs.iter().map(|(a, _)| a).collect();
                let with: Vec<&Sample> = pairs.iter().map(|(_, w)| w).collect();
                let both = |value: fn(&Sample) -> f64| {
                    let middle = |samples: &[&Sample]| {
                        median(&mut samples.iter().map(|s| value(s)).collect::<Vec<_>>())
                    };
                    format!("{:.2} / {:.2}", middle(&alone), middle(&with))
                };
                println!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    kind.name(),
                    count,
                    direction.name(),
                    both(|s| s.client_cpu),
                    both(|s| s.server_cpu),
                    both(|s| s.daemon_cpu),
                    both(|s| s.hostile_cpu),
                    both(|s| s.machine_busy),
                    threads_cell(&with)
                );
            }
        }
    }
    Ok(())
}

/// `name: s, name: s` of the median CPU seconds per thread name.
fn threads_cell(samples: &[&Sample]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for sample in samples {
        for (name, _) in &sample.threads {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    names
        .iter()
        .map(|name| {
            let mut values: Vec<f64> = samples
                .iter()
                .map(|s| {
                    s.threads
                        .iter()
                        .filter(|(n, _)| n == name)
                        .map(|(_, v)| v)
                        .sum()
                })
                .collect();
            format!("{name}: {:.2}", median(&mut values))
        })
        .collect::<Vec<_>>()
        .join(", ")
}
