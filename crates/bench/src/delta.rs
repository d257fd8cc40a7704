//! `delta`: updating an ext4 image on a device with `oxadb push --delta`,
//! beside pushing it whole with zstd, rsync over ssh and bmaptool's copy
//! over HTTP, on loopback and on an emulated link (`emulator.rs`: two
//! network namespaces, a rate, a round trip). The program builds two
//! versions of an image with `mkfs.ext4 -d` (the second with files
//! rewritten until about `--changed` percent of the image's blocks differ),
//! then, per link and interleaved, turns the device's copy of the first
//! version into the second: `push --delta` onto a target that has no index
//! (the device reads the old image), `push --delta` onto one whose index is
//! kept (the update back and forth), a whole `push -z zstd`, `rsync
//! --inplace` through an sshd of the program's own, and `bmaptool copy` of
//! the mapped blocks from Python's `http.server` (delta_peers.rs). The
//! reference for the bytes is the changed blocks compressed with zstd at
//! the same level as the delta's.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rand::{Rng, RngCore, SeedableRng};

use crate::delta_peers::{self, SshKeys, Tools};
use crate::delta_target::{DeviceTarget, LoopDevice, XfsVolume};
use crate::emulated::{ping_summary, run_bounded_cpu, Background};
use crate::emulator::{self, Emulator, LinkParams, Side, DEVICE_ADDR, HOST_ADDR};
use crate::{machine_description, median, parse_size, same_contents};

#[derive(clap::Args)]
pub(crate) struct DeltaArgs {
    /// Image size (suffixes K, M, G are powers of 1024).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Percent of the image's blocks the second version changes (about).
    #[arg(long, default_value_t = 5.0)]
    changed: f64,
    /// Runs of each way; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Links, comma-separated: loopback (everything on 127.0.0.1) and
    /// emulated (host 198.18.0.1 and device 198.18.0.2 in two network
    /// namespaces joined by the link emulator: --rate-mbit, --rtt-ms,
    /// 1500-byte frames, the kernel's default TCP buffers; needs root).
    #[arg(long, value_delimiter = ',', default_value = "loopback,emulated")]
    links: Vec<String>,
    /// Ways of turning the device's copy of the first version into the
    /// second, comma-separated: delta (`push --delta`, no index), delta-index
    /// (`push --delta` with the device's index kept), delta-base (`push
    /// --delta --base` the first version, no index), zstd (a whole `push -z
    /// zstd`), rsync (`rsync --inplace` over ssh), bmaptool (`bmaptool copy`
    /// over HTTP).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "delta,delta-index,delta-base,zstd,rsync,bmaptool"
    )]
    ways: Vec<String>,
    /// What the device's copy is, comma-separated: file (a regular file in
    /// --workdir), blockdev (a loop device over a file in --disk-dir,
    /// direct I/O, its cache dropped before each transfer: a board's
    /// partition, not in memory) and xfs-file (a regular file on XFS with
    /// reflinks, made on such a loop device, its pages dropped before each
    /// transfer).
    #[arg(long, value_delimiter = ',', default_value = "file,blockdev,xfs-file")]
    onto: Vec<String>,
    /// A directory on a disk for the block device's backing file.
    #[arg(long, default_value = "/var/tmp")]
    disk_dir: PathBuf,
    /// The emulated link's rate in Mbit/s (Ethernet wire rate, each direction).
    #[arg(long, default_value_t = 100.0)]
    rate_mbit: f64,
    /// The emulated link's round trip in milliseconds.
    #[arg(long, default_value_t = 20.0)]
    rtt_ms: f64,
    /// Seconds one transfer may take before it is killed (and the run fails).
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    #[arg(long, default_value = "target/release/oxadbd")]
    oxadbd: PathBuf,
    #[arg(long, default_value = "target/release/oxadb")]
    oxadb: PathBuf,
    /// A tmpfs directory for the images and the device's copies.
    #[arg(long, default_value = "/dev/shm")]
    workdir: PathBuf,
}

const BLOCK: usize = 4096;
// Pinned so both versions share them, as a reproducible build does.
const UUID: &str = "4a5b6c7d-1111-4222-8333-944455566677";
/// Where oxadbd, sshd and the HTTP server listen inside the namespaces,
/// which hold nothing else.
const EMULATED_DAEMON_PORT: u16 = 5555;
const EMULATED_SSH_PORT: u16 = 2222;
const EMULATED_HTTP_PORT: u16 = 8080;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    Delta,
    DeltaIndex,
    DeltaBase,
    Zstd,
    Rsync,
    Bmaptool,
}

impl Way {
    fn parse(text: &str) -> Result<Way> {
        Ok(match text {
            "delta" => Way::Delta,
            "delta-index" => Way::DeltaIndex,
            "delta-base" => Way::DeltaBase,
            "zstd" => Way::Zstd,
            "rsync" => Way::Rsync,
            "bmaptool" => Way::Bmaptool,
            _ => {
                bail!("unknown way {text:?}: expected delta, delta-index, delta-base, zstd, rsync or bmaptool")
            }
        })
    }

    fn label(self, tools: &Tools) -> String {
        match self {
            Way::Delta => "push --delta, no index".into(),
            Way::DeltaIndex => "push --delta, index kept".into(),
            Way::DeltaBase => "push --delta --base (no index)".into(),
            Way::Zstd => "push -z zstd (whole image)".into(),
            Way::Rsync => format!(
                "rsync --inplace over ssh ({})",
                if tools.rsync_zstd { "zstd" } else { "zlib" }
            ),
            Way::Bmaptool => format!(
                "bmaptool copy over HTTP ({})",
                if tools.bmaptool_zstd {
                    "zstd image"
                } else {
                    "raw image"
                }
            ),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum LinkKind {
    Loopback,
    Emulated,
}

impl LinkKind {
    fn parse(text: &str) -> Result<LinkKind> {
        Ok(match text {
            "loopback" => LinkKind::Loopback,
            "emulated" => LinkKind::Emulated,
            _ => bail!("unknown link {text:?}: expected loopback or emulated"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            LinkKind::Loopback => "loopback",
            LinkKind::Emulated => "emulated",
        }
    }
}

/// Where the two sides run: both in this namespace on 127.0.0.1, or in the
/// emulator's namespaces a (host) and b (device).
struct Link {
    kind: LinkKind,
    emu: Option<Emulator>,
}

impl Link {
    fn command(&self, side: Side, program: impl AsRef<OsStr>) -> Command {
        match &self.emu {
            Some(emu) => emu.command(side, program),
            None => Command::new(program),
        }
    }

    fn host(&self, program: impl AsRef<OsStr>) -> Command {
        self.command(Side::A, program)
    }

    fn device(&self, program: impl AsRef<OsStr>) -> Command {
        self.command(Side::B, program)
    }

    fn host_addr(&self) -> &'static str {
        match self.kind {
            LinkKind::Loopback => "127.0.0.1",
            LinkKind::Emulated => HOST_ADDR,
        }
    }

    fn device_addr(&self) -> &'static str {
        match self.kind {
            LinkKind::Loopback => "127.0.0.1",
            LinkKind::Emulated => DEVICE_ADDR,
        }
    }

    /// A port to listen on: any free one on loopback; a fixed one in the
    /// emulator's namespaces, where nothing else listens.
    fn port(&self, emulated: u16) -> Result<u16> {
        match self.kind {
            LinkKind::Loopback => crate::free_port(),
            LinkKind::Emulated => Ok(emulated),
        }
    }

    /// Ethernet bytes the emulated link has carried so far, both directions.
    fn link_bytes(&self) -> Option<u64> {
        let emu = self.emu.as_ref()?;
        Some(emu.snapshot().iter().map(|c| c.wire_bytes).sum())
    }
}

/// Removes the work directory on the way out, however the run ends (a
/// signal: the emulator's cleanup, with which it is registered).
struct Workdir(PathBuf);

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        emulator::forget_path(&self.0);
    }
}

/// The files every link shares.
struct Files {
    dir: PathBuf,
    v1: PathBuf,
    v2: PathBuf,
    /// The device's copy of the image, which each way updates.
    target: PathBuf,
    /// Where the whole push writes.
    whole: PathBuf,
    /// oxadb's HOME: its key, never the machine's.
    home: PathBuf,
    bmap: PathBuf,
    /// The directory http.server serves, and the image in it bmaptool fetches.
    served_dir: PathBuf,
    served: PathBuf,
}

/// What one transfer took.
struct Measured {
    seconds: f64,
    /// Bytes on the wire as the table reports them: the link's counters on
    /// the emulated link, what the tool reports on loopback.
    wire: u64,
    /// What the tool reports (for the progress lines).
    tool_bytes: u64,
    device_cpu: f64,
}

/// Whose CPU time is the device's for one transfer.
enum DeviceCpu {
    /// A server that stays (oxadbd, sshd): its own time and its reaped
    /// children's (sshd's session processes and the rsync receiver).
    Server(u32),
    /// The command itself runs on the device (bmaptool), with its children.
    Command,
}

pub(crate) fn delta(args: DeltaArgs) -> Result<()> {
    // First, before any thread exists: every later thread inherits the mask.
    emulator::install_signal_cleanup()?;
    ensure!(args.runs >= 1, "--runs must be at least 1");
    ensure!(
        args.changed > 0.0 && args.changed < 50.0,
        "--changed is a percentage above 0 and below 50"
    );
    ensure!(args.rate_mbit > 0.0, "--rate-mbit must be positive");
    ensure!(
        args.rtt_ms > 0.0 && args.rtt_ms <= 1000.0,
        "--rtt-ms must be in (0, 1000]"
    );
    let links: Vec<LinkKind> = args
        .links
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| LinkKind::parse(l))
        .collect::<Result<_>>()?;
    let ways: Vec<Way> = args
        .ways
        .iter()
        .filter(|w| !w.is_empty())
        .map(|w| Way::parse(w))
        .collect::<Result<_>>()?;
    let onto: Vec<&str> = args
        .onto
        .iter()
        .filter(|o| !o.is_empty())
        .map(|o| match o.as_str() {
            "file" | "blockdev" | "xfs-file" => Ok(o.as_str()),
            _ => Err(anyhow::anyhow!(
                "unknown target {o:?}: expected file, blockdev or xfs-file"
            )),
        })
        .collect::<Result<_>>()?;
    ensure!(!onto.is_empty(), "--onto is empty");
    ensure!(!links.is_empty(), "--links is empty");
    ensure!(!ways.is_empty(), "--ways is empty");
    if links.contains(&LinkKind::Emulated) {
        ensure!(
            unsafe { libc::geteuid() } == 0,
            "the emulated link creates network namespaces: run as root"
        );
    }
    let absolute = |path: &Path| {
        std::fs::canonicalize(path)
            .with_context(|| format!("{} (build with cargo build --release)", path.display()))
    };
    let oxadbd = absolute(&args.oxadbd)?;
    let oxadb = absolute(&args.oxadb)?;

    let dir = args
        .workdir
        .join(format!("oxadb-bench-delta-{}", std::process::id()));
    ensure!(!dir.exists(), "{} already exists", dir.display());
    std::fs::create_dir_all(&dir)?;
    emulator::register_path(&dir);
    let dir = Workdir(dir);
    let (rsync, bmaptool) = (ways.contains(&Way::Rsync), ways.contains(&Way::Bmaptool));
    delta_peers::install_missing(
        rsync,
        bmaptool,
        onto.contains(&"xfs-file"),
        &dir.0.join("apt.log"),
    )?;
    let tools = delta_peers::inspect(rsync, bmaptool, &dir.0)?;

    let files = Files {
        dir: dir.0.clone(),
        v1: dir.0.join("v1.img"),
        v2: dir.0.join("v2.img"),
        target: dir.0.join("device/rootfs.img"),
        whole: dir.0.join("device/whole.img"),
        home: dir.0.join("home"),
        bmap: dir.0.join("v2.bmap"),
        served_dir: dir.0.join("served"),
        served: dir.0.join("served").join(if tools.bmaptool_zstd {
            "v2.img.zst"
        } else {
            "v2.img"
        }),
    };
    std::fs::create_dir_all(&files.home)?;
    std::fs::create_dir_all(dir.0.join("device"))?;
    eprintln!("building two ext4 images of {} MiB", args.size >> 20);
    build_images(&dir.0, &files.v1, &files.v2, args.size, args.changed)?;
    let (changed_blocks, changed_zstd) = changed_blocks(&files.v1, &files.v2)?;
    let blocks = args.size as usize / BLOCK;
    let keys = if rsync {
        Some(SshKeys::make(&dir.0.join("ssh"))?)
    } else {
        None
    };
    let _privsep = if rsync {
        Some(delta_peers::PrivsepDir::ensure()?)
    } else {
        None
    };
    if bmaptool {
        delta_peers::create_bmap(&files.v2, &files.bmap, &dir.0.join("bmaptool-create.log"))?;
        std::fs::create_dir_all(&files.served_dir)?;
        if tools.bmaptool_zstd {
            compress_zstd(&files.v2, &files.served)?;
        } else {
            std::fs::hard_link(&files.v2, &files.served)?;
        }
    }

    println!("Machine: {}", machine_description());
    println!(
        "Image: ext4, {} MiB ({blocks} blocks of 4 KiB); {changed_blocks} blocks changed ({:.1}%), \
         {changed_zstd} bytes as zstd level 3; {} runs of each way, interleaved",
        args.size >> 20,
        changed_blocks as f64 * 100.0 / blocks as f64,
        args.runs
    );
    print_tools(&ways, &tools, &files)?;
    for &kind in &links {
        for &name in &onto {
            let target = match name {
                "blockdev" => {
                    DeviceTarget::BlockDevice(LoopDevice::attach(&args.disk_dir, args.size)?)
                }
                // Room for the image, the one built beside it and rsync's.
                "xfs-file" => DeviceTarget::ReflinkFile(XfsVolume::make(
                    &args.disk_dir,
                    3 * args.size + (512 << 20),
                    &files.dir.join("xfs"),
                )?),
                _ => DeviceTarget::File(files.target.clone()),
            };
            let link = Link {
                kind,
                emu: match kind {
                    LinkKind::Loopback => None,
                    LinkKind::Emulated => Some(Emulator::start(emulated_params(&args), false)?),
                },
            };
            let mut session = Session::start(
                &args,
                &files,
                &tools,
                keys.as_ref(),
                link,
                &target,
                [&oxadbd, &oxadb],
            )?;
            let description = session.describe()?;
            let mut results: Vec<Vec<Measured>> = ways.iter().map(|_| Vec::new()).collect();
            for run in 0..args.runs {
                // Rotate the order: a slow spell of this shared machine should
                // hit every way, not always the same one.
                for step in 0..ways.len() {
                    let which = (run + step) % ways.len();
                    let measured = session.measure(ways[which])?;
                    eprintln!(
                        "{} {} run {} {:>40}: {:.3} s, {} bytes on the wire ({} as the tool reports), device CPU {:.2} s",
                        kind.name(),
                        target_name(&target),
                        run + 1,
                        ways[which].label(&tools),
                        measured.seconds,
                        measured.wire,
                        measured.tool_bytes,
                        measured.device_cpu
                    );
                    results[which].push(measured);
                }
            }
            ensure!(
                !session.daemon.exited(),
                "oxadbd exited during the benchmark"
            );
            drop(session);
            println!();
            println!("Onto: {}", target_description(&target, &args));
            print_link(kind, &description, &ways, &results, &tools, changed_zstd);
        }
    }
    Ok(())
}

fn target_name(target: &DeviceTarget) -> &'static str {
    match target {
        DeviceTarget::File(_) => "file",
        DeviceTarget::BlockDevice(_) => "blockdev",
        DeviceTarget::ReflinkFile(_) => "xfs-file",
    }
}

fn target_description(target: &DeviceTarget, args: &DeltaArgs) -> String {
    match target {
        DeviceTarget::File(path) => format!(
            "a regular file, {} (the delta builds the new one beside it and renames it over)",
            path.display()
        ),
        DeviceTarget::BlockDevice(_) => format!(
            "a block device, {} (a loop device with direct I/O over a file in {}, on disk; \
             its cache dropped before each transfer, as a partition the board has not read; \
             written in place; the whole push goes to a file all the same)",
            target.path().display(),
            args.disk_dir.display()
        ),
        DeviceTarget::ReflinkFile(_) => format!(
            "a regular file on XFS with reflinks, {} (XFS made on a loop device with direct \
             I/O over a file in {}, on disk; the file's pages dropped before each transfer; \
             the delta builds the new one beside it, sharing the unchanged blocks, and \
             renames it over)",
            target.path().display(),
            args.disk_dir.display()
        ),
    }
}

/// The emulated link: plain 1500-byte frames one by one, the default queue.
fn emulated_params(args: &DeltaArgs) -> LinkParams {
    let rate = args.rate_mbit * 1e6 / 8.0;
    let rtt = Duration::from_secs_f64(args.rtt_ms / 1e3);
    LinkParams {
        rate,
        one_way: rtt / 2,
        burst: None,
        queue_limit: LinkParams::default_queue_limit(rate, rtt),
    }
}

/// The servers of one link and what the ways run there.
struct Session<'a> {
    args: &'a DeltaArgs,
    files: &'a Files,
    tools: &'a Tools,
    keys: Option<&'a SshKeys>,
    oxadb: PathBuf,
    serial: String,
    timeout: Duration,
    // Dropped before the link: the servers are stopped by pid before the
    // namespaces go.
    daemon: Background,
    sshd: Option<(Background, u16)>,
    http: Option<(Background, u16)>,
    target: &'a DeviceTarget,
    link: Link,
}

impl<'a> Session<'a> {
    fn start(
        args: &'a DeltaArgs,
        files: &'a Files,
        tools: &'a Tools,
        keys: Option<&'a SshKeys>,
        link: Link,
        target: &'a DeviceTarget,
        [oxadbd, oxadb]: [&Path; 2],
    ) -> Result<Session<'a>> {
        let name = link.kind.name();
        let port = link.port(EMULATED_DAEMON_PORT)?;
        let mut daemon = link.device(oxadbd);
        daemon
            .arg("--listen")
            .arg(format!("{}:{port}", link.device_addr()))
            .arg("--state-dir")
            .arg(files.dir.join(format!("state-{name}")));
        if link.kind == LinkKind::Emulated {
            // The namespace is the benchmark's own; TLS as the daemon offers
            // it beyond loopback, with a key made in the work dir.
            daemon
                .args(["--insecure", "--no-auth", "--tls-key"])
                .arg(files.dir.join("tls_key.pem"))
                .arg("--tls-cert")
                .arg(files.dir.join("tls_cert.pem"));
        }
        daemon
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(
                files.dir.join(format!("oxadbd-{name}.log")),
            )?);
        let daemon =
            Background::spawn_listening(&mut daemon, port, Duration::from_secs(10), "oxadbd")?;
        let sshd = match keys {
            Some(keys) => {
                let port = link.port(EMULATED_SSH_PORT)?;
                let config = keys.write_config(name, link.device_addr(), port)?;
                let sshd = delta_peers::start_sshd(
                    link.device(delta_peers::SSHD),
                    &config,
                    port,
                    &files.dir.join(format!("sshd-{name}.log")),
                )?;
                Some((sshd, port))
            }
            None => None,
        };
        // Only the ways asked for had their tools inspected.
        let http = if tools.bmaptool_version.is_empty() {
            None
        } else {
            let port = link.port(EMULATED_HTTP_PORT)?;
            let server = delta_peers::start_http_server(
                link.host(delta_peers::PYTHON),
                link.host_addr(),
                port,
                &files.served_dir,
                &files.dir.join(format!("http-{name}.log")),
            )?;
            Some((server, port))
        };
        let session = Session {
            args,
            files,
            tools,
            keys,
            oxadb: oxadb.to_path_buf(),
            serial: format!("{}:{port}", link.device_addr()),
            timeout: Duration::from_secs(args.timeout),
            daemon,
            sshd,
            http,
            target,
            link,
        };
        session.warm_up()?;
        Ok(session)
    }

    /// Checks each path once before anything is timed: oxadb makes its key,
    /// ssh learns the host key, the emulated link resolves its neighbours.
    fn warm_up(&self) -> Result<()> {
        let short = Duration::from_secs(30);
        let (_, text, _) = run_bounded_cpu(
            self.oxadb_command().arg("get-state"),
            short,
            "oxadb get-state",
            &self.output_path(),
        )?;
        ensure!(text.trim() == "device", "oxadb get-state: {text}");
        if let (Some(keys), Some((_, port))) = (self.keys, &self.sshd) {
            let mut ssh = self.link.host("ssh");
            ssh.args(keys.ssh_command(*port).split_whitespace().skip(1))
                .arg(format!("root@{}", self.link.device_addr()))
                .arg("true");
            run_bounded_cpu(
                &mut ssh,
                short,
                "ssh to the benchmark's sshd",
                &self.output_path(),
            )?;
        }
        Ok(())
    }

    fn output_path(&self) -> PathBuf {
        self.files.dir.join("output.txt")
    }

    /// The link's description for the report; on the emulated link, with
    /// a ping that checks the round trip.
    fn describe(&self) -> Result<String> {
        let Some(emu) = &self.link.emu else {
            return Ok("loopback: host and device are this machine's 127.0.0.1 \
                       (oxadbd, sshd and http.server listen there; oxadb over plain TCP, \
                       as oxadbd offers no TLS on loopback)"
                .into());
        };
        let params = emulated_params(self.args);
        let (_, text, _) = run_bounded_cpu(
            emu.command(Side::A, "ping").args([
                "-q",
                "-n",
                "-c",
                "5",
                "-i",
                "0.2",
                "-W",
                "5",
                DEVICE_ADDR,
            ]),
            Duration::from_secs(20),
            "ping",
            &self.output_path(),
        )?;
        let [min, avg, max, _] = ping_summary(&text).with_context(|| format!("ping: {text}"))?;
        // The minimum: a shared machine that deschedules the forwarder adds
        // to single pings, never takes away.
        let verdict = if (min - self.args.rtt_ms).abs() <= (0.1 * self.args.rtt_ms).max(0.2) {
            "minimum within 10%"
        } else {
            "minimum OFF by more than 10%"
        };
        Ok(format!(
            "emulated: {} Mbit/s Ethernet wire rate each way, {} ms round trip (ping min/avg/max \
             {min:.2}/{avg:.2}/{max:.2} ms, {verdict}), plain 1500-byte frames (no offloads), released one \
             by one, tail-drop queue {} bytes; host {HOST_ADDR} in namespace a, device \
             {DEVICE_ADDR} in namespace b; TCP buffers as the kernel gives a new namespace ({}), \
             congestion control {}; oxadb over TLS (oxadbd offers it beyond loopback)",
            self.args.rate_mbit,
            self.args.rtt_ms,
            params.queue_limit,
            emu.tcp_buffers()?,
            emu.sysctl("net.ipv4.tcp_congestion_control")?
        ))
    }

    /// oxadb on the host side, talking to this link's daemon.
    fn oxadb_command(&self) -> Command {
        let mut command = self.link.host(&self.oxadb);
        command
            .env("HOME", &self.files.home)
            .env_remove("ANDROID_SERIAL")
            .args(["-s", &self.serial]);
        command
    }

    /// Runs one transfer; returns its wall time, its output, the device's
    /// CPU seconds and the bytes the emulated link carried meanwhile.
    fn run(
        &self,
        command: &mut Command,
        device: DeviceCpu,
        what: &str,
    ) -> Result<(f64, String, f64, Option<u64>)> {
        let link_before = self.link.link_bytes();
        let server_before = match device {
            DeviceCpu::Server(pid) => cpu_with_reaped_children(pid)?,
            DeviceCpu::Command => 0.0,
        };
        let (elapsed, text, command_cpu) =
            run_bounded_cpu(command, self.timeout, what, &self.output_path())?;
        let device_cpu = match device {
            DeviceCpu::Server(pid) => {
                // sshd's session processes end just after the client: their
                // time reaches sshd when it reaps them.
                if !wait_childless(pid, Duration::from_secs(10)) {
                    eprintln!("{what}: the device's server still had children after 10 s");
                }
                cpu_with_reaped_children(pid)? - server_before
            }
            DeviceCpu::Command => command_cpu,
        };
        let link_bytes = match (link_before, self.link.link_bytes()) {
            (Some(before), Some(after)) => Some(after - before),
            _ => None,
        };
        Ok((elapsed.as_secs_f64(), text, device_cpu, link_bytes))
    }

    fn daemon_pid(&self) -> Result<u32> {
        self.daemon.pid().context("oxadbd is not running")
    }

    /// `oxadb push EXTRA SOURCE DEST`.
    fn push(&self, extra: &[&str], source: &Path, dest: &Path) -> Result<Measured> {
        let mut command = self.oxadb_command();
        command.arg("push").args(extra).arg(source).arg(dest);
        let what = format!("oxadb push {}", extra.join(" "));
        let (seconds, text, device_cpu, link_bytes) =
            self.run(&mut command, DeviceCpu::Server(self.daemon_pid()?), &what)?;
        let tool_bytes = bytes_on_wire(&text)?;
        Ok(Measured {
            seconds,
            wire: link_bytes.unwrap_or(tool_bytes),
            tool_bytes,
            device_cpu,
        })
    }

    /// The first version on the device's target, as nothing has read it
    /// since and no index fits it ([`DeviceTarget::reset_to`]).
    fn fresh_target(&self) -> Result<()> {
        self.target.reset_to(&self.files.v1)
    }

    fn measure(&self, way: Way) -> Result<Measured> {
        let files = self.files;
        let target = self.target.path();
        match way {
            Way::Delta => {
                self.fresh_target()?;
                let measured = self.push(&["--delta"], &files.v2, &target)?;
                ensure!(
                    same_contents(&target, &files.v2)?,
                    "the delta built another image"
                );
                Ok(measured)
            }
            Way::DeltaBase => {
                self.fresh_target()?;
                let base = files.v1.display().to_string();
                let measured = self.push(&["--delta", "--base", &base], &files.v2, &target)?;
                ensure!(
                    same_contents(&target, &files.v2)?,
                    "the delta built another image"
                );
                Ok(measured)
            }
            Way::DeltaIndex => {
                // The target as the last delta left it: its index holds. The
                // update back to the first version is the one timed.
                self.fresh_target()?;
                self.push(&["--delta"], &files.v2, &target)?;
                self.target.drop_cache()?;
                let measured = self.push(&["--delta"], &files.v1, &target)?;
                ensure!(
                    same_contents(&target, &files.v1)?,
                    "the delta built another image"
                );
                Ok(measured)
            }
            Way::Zstd => {
                let _ = std::fs::remove_file(&files.whole);
                let measured = self.push(&["-z", "zstd", "--stats"], &files.v2, &files.whole)?;
                ensure!(
                    same_contents(&files.whole, &files.v2)?,
                    "the push wrote another image"
                );
                Ok(measured)
            }
            Way::Rsync => {
                self.fresh_target()?;
                let (keys, (sshd, port)) = (
                    self.keys.context("no ssh keys")?,
                    self.sshd.as_ref().context("no sshd")?,
                );
                let mut command = self.link.host("rsync");
                command
                    .env("HOME", &files.home)
                    .env_remove("SSH_AUTH_SOCK")
                    .args(rsync_options(self.tools))
                    // rsync writes into a block device only when told to.
                    .args(self.target.is_block_device().then_some("--write-devices"))
                    .arg("-e")
                    .arg(keys.ssh_command(*port))
                    .arg(&files.v2)
                    .arg(format!(
                        "root@{}:{}",
                        self.link.device_addr(),
                        target.display()
                    ));
                let sshd_pid = sshd.pid().context("sshd is not running")?;
                let (seconds, text, device_cpu, link_bytes) =
                    self.run(&mut command, DeviceCpu::Server(sshd_pid), "rsync")?;
                ensure!(
                    same_contents(&target, &files.v2)?,
                    "rsync built another image"
                );
                let tool_bytes = delta_peers::rsync_bytes(&text)?;
                Ok(Measured {
                    seconds,
                    wire: link_bytes.unwrap_or(tool_bytes),
                    tool_bytes,
                    device_cpu,
                })
            }
            Way::Bmaptool => {
                self.fresh_target()?;
                let (_, port) = self.http.as_ref().context("no http.server")?;
                let mut command = self.link.device("bmaptool");
                command
                    // Straight to the host side: no proxy of the machine's.
                    .env_remove("http_proxy")
                    .env_remove("HTTP_PROXY")
                    .env_remove("all_proxy")
                    .env_remove("ALL_PROXY")
                    .env("no_proxy", "*")
                    .args(["copy", "--bmap"])
                    .arg(&files.bmap)
                    .arg(self.served_url(*port))
                    .arg(&target);
                let (seconds, _, device_cpu, link_bytes) =
                    self.run(&mut command, DeviceCpu::Command, "bmaptool copy")?;
                ensure!(
                    same_contents(&target, &files.v2)?,
                    "bmaptool built another image"
                );
                // It reads the whole image, mapped or not: the body is the file.
                let tool_bytes = std::fs::metadata(&files.served)?.len();
                Ok(Measured {
                    seconds,
                    wire: link_bytes.unwrap_or(tool_bytes),
                    tool_bytes,
                    device_cpu,
                })
            }
        }
    }

    fn served_url(&self, port: u16) -> String {
        let name = self
            .files
            .served
            .file_name()
            .and_then(OsStr::to_str)
            .unwrap_or_default();
        format!("http://{}:{port}/{name}", self.link.host_addr())
    }
}

/// rsync's options: in place, by its delta algorithm even where it would
/// copy whole, every time, compressed, with the byte counts.
fn rsync_options(tools: &Tools) -> Vec<&'static str> {
    let mut options = vec![
        "--inplace",
        "--no-whole-file",
        "--ignore-times",
        "--compress",
    ];
    if tools.rsync_zstd {
        options.push("--compress-choice=zstd");
    }
    options.push("--stats");
    options
}

/// `image` compressed with zstd level 3 (the zstd program's default) into `into`.
fn compress_zstd(image: &Path, into: &Path) -> Result<()> {
    let mut input = std::fs::File::open(image)?;
    let mut encoder = zstd::Encoder::new(std::fs::File::create(into)?, 3)?;
    encoder.include_contentsize(true)?;
    encoder.set_pledged_src_size(Some(std::fs::metadata(image)?.len()))?;
    std::io::copy(&mut input, &mut encoder)?;
    encoder.finish()?;
    Ok(())
}

/// CPU seconds (user + system) of a process and of the children it has
/// reaped, theirs included.
fn cpu_with_reaped_children(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("process {pid} is gone"))?;
    // Fields after the parenthesised name: utime, stime, cutime, cstime are
    // the 14th to 17th.
    let rest = &stat[stat.rfind(')').context("bad /proc stat")? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let mut ticks = 0.0;
    for field in &fields[11..15] {
        ticks += field.parse::<f64>()?;
    }
    Ok(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// Waits until `pid` has no child process, `timeout` at most.
fn wait_childless(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let has_child = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| {
                let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                    return false;
                };
                let parent = stat
                    .rfind(')')
                    .and_then(|end| stat[end + 2..].split_whitespace().nth(1))
                    .and_then(|p| p.parse::<u32>().ok());
                parent == Some(pid)
            });
        if !has_child {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The tools' versions and the commands the rsync and bmaptool ways run.
fn print_tools(ways: &[Way], tools: &Tools, files: &Files) -> Result<()> {
    if ways.contains(&Way::Rsync) {
        println!(
            "rsync: {}; {}; run on the host side as `rsync {} -e \"ssh -F none -i KEY -p PORT \
             -o IdentitiesOnly=yes -o IdentityAgent=none -o StrictHostKeyChecking=no \
             -o UserKnownHostsFile=FILE -o GlobalKnownHostsFile=FILE -o BatchMode=yes \
             -o LogLevel=ERROR\" v2.img root@DEVICE:TARGET`, against an sshd of the benchmark's \
             own on the device side (`sshd -D -e -f CONFIG`: its own host key, authorized_keys \
             and config in the work dir, listening on the device's address only){}",
            tools.rsync_version,
            tools.ssh_version,
            rsync_options(tools).join(" "),
            if tools.rsync_zstd {
                ""
            } else {
                "; this rsync has no zstd: zlib compression"
            }
        );
    }
    if ways.contains(&Way::Bmaptool) {
        let served = std::fs::metadata(&files.served)?.len();
        println!(
            "bmaptool: {}; `bmaptool create` made the bmap of v2 ({} bytes, read from the work dir \
             by the device side, not fetched); run on the device side as `bmaptool copy --bmap \
             v2.bmap http://HOST:PORT/{} TARGET`, from `python3 -m http.server` on the host side; \
             {}",
            tools.bmaptool_version,
            std::fs::metadata(&files.bmap)?.len(),
            files
                .served
                .file_name()
                .and_then(OsStr::to_str)
                .unwrap_or_default(),
            if tools.bmaptool_zstd {
                format!("it fetches v2 compressed with zstd level 3 ({served} bytes), all of it, and writes the mapped blocks")
            } else {
                format!(
                    "this bmaptool cannot read .zst images: it fetches the raw v2 ({served} bytes), all of it, and writes the mapped blocks"
                )
            }
        );
    }
    Ok(())
}

/// One link's table and ratios.
fn print_link(
    kind: LinkKind,
    description: &str,
    ways: &[Way],
    results: &[Vec<Measured>],
    tools: &Tools,
    changed_zstd: usize,
) {
    println!();
    println!("Link: {description}");
    let oxadb = ways
        .iter()
        .any(|w| matches!(w, Way::Delta | Way::DeltaIndex | Way::DeltaBase | Way::Zstd));
    let (rsync, bmaptool) = (ways.contains(&Way::Rsync), ways.contains(&Way::Bmaptool));
    let mut bytes = Vec::new();
    let mut cpu = Vec::new();
    match kind {
        LinkKind::Loopback => {
            if oxadb {
                bytes.push(
                    "oxadb's, what the ADB stream carried both ways (the delta's summary line, \
                     `push --stats`)",
                );
                cpu.push("oxadbd's");
            }
            if rsync {
                bytes.push(
                    "rsync's, \"Total bytes sent\" plus \"Total bytes received\" of `--stats` \
                     (rsync's protocol inside ssh: without ssh's encryption, framing and handshake)",
                );
                cpu.push(
                    "the benchmark's sshd's with the session processes and rsync receivers it reaped",
                );
            }
            if bmaptool {
                bytes.push(
                    "bmaptool's, the size of the file http.server served (the HTTP body: bmaptool \
                     reads the whole image; without the request, the headers, and what crossed \
                     of the response bmaptool 3.6 opens first and drops)",
                );
                cpu.push("bmaptool's with its children (the zstd decompressor)");
            }
            println!(
                "Bytes on the wire, as the tools report them: {}.",
                bytes.join("; ")
            );
            println!("Device CPU s: {}; user + system.", cpu.join("; "));
        }
        LinkKind::Emulated => {
            println!(
                "Bytes on the wire: the emulator's link counters, both directions: every Ethernet \
                 frame with its Ethernet, IP and TCP headers and 24 bytes of preamble, check \
                 sequence and gap; so TCP handshakes and acknowledgements count, and TLS (oxadb), \
                 ssh (rsync) and HTTP (bmaptool, both of the responses it asks for) overheads."
            );
            if oxadb {
                cpu.push("oxadbd");
            }
            if rsync {
                cpu.push("sshd with the session processes and rsync receivers it reaped");
            }
            if bmaptool {
                cpu.push("bmaptool with its children");
            }
            println!(
                "Device CPU s: every process in namespace b ({}); user + system.",
                cpu.join("; ")
            );
        }
    }
    println!();
    println!(
        "| way | runs (s) | median s | bytes on the wire | vs changed blocks, zstd | device CPU s |"
    );
    println!("|---|---|---|---|---|---|");
    for (way, runs) in ways.iter().zip(results) {
        let seconds: Vec<f64> = runs.iter().map(|m| m.seconds).collect();
        let listed: Vec<String> = seconds.iter().map(|s| format!("{s:.3}")).collect();
        let bytes = median(&mut runs.iter().map(|m| m.wire as f64).collect::<Vec<_>>());
        println!(
            "| {} | {} | {:.3} | {:.0} | {:.2} | {:.2} |",
            way.label(tools),
            listed.join(", "),
            median(&mut seconds.clone()),
            bytes,
            bytes / changed_zstd.max(1) as f64,
            median(&mut runs.iter().map(|m| m.device_cpu).collect::<Vec<_>>())
        );
    }
    let time = |wanted: Way| {
        ways.iter()
            .position(|&w| w == wanted)
            .map(|i| median(&mut results[i].iter().map(|m| m.seconds).collect::<Vec<_>>()))
    };
    println!();
    for (over, under, text) in [
        (
            Way::Zstd,
            Way::Delta,
            "whole zstd push / delta without index",
        ),
        (Way::Rsync, Way::Delta, "rsync / delta without index"),
        (Way::Bmaptool, Way::Delta, "bmaptool / delta without index"),
        (
            Way::Delta,
            Way::DeltaIndex,
            "delta without index / delta with index",
        ),
    ] {
        if let (Some(a), Some(b)) = (time(over), time(under)) {
            println!("- {text} (median times): {:.2}", a / b);
        }
    }
}

/// Bytes both ways, from `push --delta`'s summary or `push --stats`.
fn bytes_on_wire(text: &str) -> Result<u64> {
    let number_before = |marker: &str| -> Option<u64> {
        let end = text.find(marker)?;
        text[..end].rsplit(' ').next()?.parse().ok()
    };
    let number_after = |marker: &str| -> Option<u64> {
        let start = text.find(marker)? + marker.len();
        text[start..].split(' ').next()?.parse().ok()
    };
    if let (Some(sent), Some(received)) = (
        number_before(" of "),
        text.find("bytes sent (")
            .and_then(|_| number_before(" received, in ")),
    ) {
        return Ok(sent + received);
    }
    match (number_after("  sent "), number_after("received ")) {
        (Some(sent), Some(received)) => Ok(sent + received),
        _ => bail!("no byte counts in oxadb's output: {text}"),
    }
}

/// A tree of random files filling about 40% of an image of `size`, the
/// first image built from it, then files rewritten (same sizes, new bytes)
/// until about `changed` percent of the image is, and the second image.
fn build_images(dir: &Path, v1: &Path, v2: &Path, size: u64, changed: f64) -> Result<()> {
    let tree = dir.join("tree");
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut files = Vec::new();
    let mut filled = 0u64;
    while filled < size * 2 / 5 {
        let len = rng.random_range(16..4096) as u64 * 1024;
        let path = tree
            .join(format!("d{}", files.len() % 16))
            .join(format!("f{}", files.len()));
        std::fs::create_dir_all(path.parent().expect("a parent"))?;
        write_random(&path, len, &mut rng)?;
        files.push((path, len));
        filled += len;
    }
    mkfs(&tree, v1, size)?;
    let mut rewritten = 0u64;
    let goal = (size as f64 * changed / 100.0) as u64;
    while rewritten < goal {
        let (path, len) = &files[rng.random_range(0..files.len())];
        write_random(path, *len, &mut rng)?;
        rewritten += len;
    }
    mkfs(&tree, v2, size)?;
    std::fs::remove_dir_all(&tree)?;
    Ok(())
}

fn write_random(path: &Path, len: u64, rng: &mut impl RngCore) -> Result<()> {
    let mut data = vec![0u8; len as usize];
    rng.fill_bytes(&mut data);
    std::fs::write(path, data)?;
    Ok(())
}

fn mkfs(tree: &Path, image: &Path, size: u64) -> Result<()> {
    run_bounded_cpu(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096", "-U", UUID, "-E"])
            .arg(format!("hash_seed={UUID}"))
            .arg("-d")
            .arg(tree)
            .arg(image)
            .arg(format!("{}k", size / 1024))
            .env("E2FSPROGS_FAKE_TIME", "1700000000"),
        Duration::from_secs(600),
        "mkfs.ext4 (Debian's e2fsprogs)",
        &image.with_extension("mkfs.txt"),
    )?;
    let _ = std::fs::remove_file(image.with_extension("mkfs.txt"));
    Ok(())
}

/// How many blocks differ, and their new bytes compressed with zstd at
/// level 3 in 1 MiB pieces, as `push --delta` sends them.
fn changed_blocks(v1: &Path, v2: &Path) -> Result<(usize, usize)> {
    let (old, new) = (std::fs::read(v1)?, std::fs::read(v2)?);
    let mut changed = Vec::new();
    let mut count = 0;
    for (i, block) in new.chunks(BLOCK).enumerate() {
        if old.get(i * BLOCK..(i + 1) * BLOCK) != Some(block) {
            changed.extend_from_slice(block);
            count += 1;
        }
    }
    let compressed: usize = changed
        .chunks(1 << 20)
        .map(|piece| zstd::bulk::compress(piece, 3).map(|c| c.len().min(piece.len())))
        .sum::<std::io::Result<usize>>()?;
    Ok((count, compressed))
}
