//! `emulated`: iperf3, Google adb 29 and oxadb (classic, aosp, adaptive)
//! pushing and pulling over an emulated link (rate, round trip, tail-drop
//! queue) on real kernel TCP between two network namespaces
//! (`emulator.rs`), interleaved, with the kernel's TCP buffers sized for the
//! bandwidth-delay product and, in extra rows, with the kernel's defaults.
//! Every row runs on each link kind: 64 KiB offloaded frames (what a
//! virtual NIC hands over), plain 1500-byte frames (what Ethernet and Wi-Fi
//! deliver), and 1500-byte frames released in clumps (Wi-Fi-like
//! aggregation, which makes acknowledgements arrive in bursts); see
//! docs/benchmarks.md, "Long links with 1500-byte frames". `--namespaces`
//! runs the same rows over two namespaces another emulator joined, as a
//! cross-check of this one.
//!
//! Side a (198.18.0.1) runs every client; side b (198.18.0.2) runs oxadbd,
//! listening on 198.18.0.2:5555 itself (`--insecure`: the namespace is the
//! benchmark's own; TLS as the daemon offers it beyond loopback), and the
//! iperf3 server.
//!
//! Every row reports CPU seconds per GiB moved on each side: the client
//! process (and, for adb, its server), and everything in namespace b (the
//! daemon, or iperf3's server).

use std::fs::File;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use oxadb_io::parse_size;

use crate::emulator::{self, Counters, Emulator, LinkParams, Side, DEVICE_ADDR, ETHERNET_FRAMING};

#[derive(clap::Args)]
pub struct EmulatedArgs {
    /// Bytes per transfer (suffixes K, M, G are powers of 1024).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub(crate) size: u64,
    /// Runs of each transfer; medians are reported.
    #[arg(long, default_value_t = 1)]
    pub(crate) runs: usize,
    /// Round trips to emulate, in milliseconds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
    pub(crate) rtts: Vec<f64>,
    /// Link rate in Mbit/s (Ethernet wire rate, each direction).
    #[arg(long, default_value_t = 1000.0)]
    pub(crate) rate_mbit: f64,
    /// Link kinds, comma-separated, each running every row: offload (64 KiB
    /// TSO frames through the TAP devices), plain (1500-byte frames, no
    /// offloads), clumped (1500-byte frames released together every
    /// --clump-ms, both directions).
    #[arg(long, value_delimiter = ',', default_value = "offload,plain,clumped")]
    pub(crate) links: Vec<String>,
    /// The clumped link's release interval in milliseconds (an 802.11ac
    /// aggregate lasts at most about 5.5 ms).
    #[arg(long, default_value_t = 4.0)]
    pub(crate) clump_ms: f64,
    /// Two existing namespaces (host side with 198.18.0.1, device side with
    /// 198.18.0.2) joined by another link emulator, instead of links of our
    /// own: the same rows, as a cross-check. Give the link's round trip
    /// with --rtts and its rate with --rate-mbit; adb is not run there.
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 1,
        value_name = "HOST_NS,DEVICE_NS"
    )]
    pub(crate) namespaces: Option<Vec<String>>,
    /// Tail-drop queue in bytes [default: 2 x bandwidth-delay product + 256 KiB].
    #[arg(long, value_parser = parse_size)]
    pub(crate) queue_limit: Option<u64>,
    /// Maximum of net.ipv4.tcp_rmem and tcp_wmem in both namespaces (at least
    /// twice the largest bandwidth-delay product: 6.25 MB at 1 Gbit/s x 50 ms).
    #[arg(long, default_value = "32M", value_parser = parse_size)]
    pub(crate) buffers: u64,
    /// tcp_rmem maximum for the default-buffer rows [default: what a new
    /// namespace gets from the kernel, 32 MiB on Debian 12's 6.x kernels].
    #[arg(long, value_parser = parse_size)]
    pub(crate) small_rmem: Option<u64>,
    /// tcp_wmem maximum for the default-buffer rows [default: what a new
    /// namespace gets, 4 MiB].
    #[arg(long, value_parser = parse_size)]
    pub(crate) small_wmem: Option<u64>,
    /// TCP congestion control in both namespaces (e.g. cubic) [default: the
    /// one a new namespace gets, the host's].
    #[arg(long)]
    pub(crate) congestion_control: Option<String>,
    /// Transfers, comma-separated: iperf3, adb (Google's adb 29 CLI and
    /// server), adb34-burst (Google's adb 34 CLI and server with burst mode
    /// on, --adb34), adb-oxadb-server (Google's adb 29 CLI through `oxadb
    /// server`), oxadb-classic, oxadb-aosp, oxadb-adaptive.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "iperf3,adb,oxadb-classic,oxadb-aosp,oxadb-adaptive"
    )]
    pub(crate) clients: Vec<String>,
    /// Transfers repeated with the kernel's default buffers (empty: none).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "iperf3,oxadb-aosp,oxadb-adaptive"
    )]
    pub(crate) small_clients: Vec<String>,
    /// Where oxadb's pulls go: node (the private device node, so that the
    /// figure is the transport's, as a push's) or tmpfs (a new file, compared
    /// with the source; this VM's tmpfs page allocation is erratic). Google's
    /// adb always pulls into tmpfs: it replaces its destination.
    #[arg(long, value_enum, default_value = "node")]
    pub(crate) pull_into: Target,
    /// The daemon's --tls (off, on, required) [default: the daemon's own,
    /// TLS offered beyond loopback, which oxadb takes].
    #[arg(long)]
    pub(crate) daemon_tls: Option<String>,
    #[arg(long, default_value = "target/release/oxadbd")]
    pub(crate) oxadbd: PathBuf,
    #[arg(long, default_value = "target/release/oxadb")]
    pub(crate) oxadb: PathBuf,
    /// Google's adb (Debian's adb 29 by default).
    #[arg(long, default_value = "adb")]
    pub(crate) adb: PathBuf,
    /// Google's adb 34 for adb34-burst (scripts/install-adb34.sh puts it here).
    #[arg(long, default_value = "target/peers/adb-34/adb")]
    pub(crate) adb34: PathBuf,
    #[arg(long, default_value = "iperf3")]
    pub(crate) iperf3: PathBuf,
    /// A tmpfs directory for the data (the pull destination must be tmpfs).
    #[arg(long, default_value = "/dev/shm")]
    pub(crate) workdir: PathBuf,
}

/// Where oxadbd listens inside namespace b (on DEVICE_ADDR).
pub(crate) const DAEMON_PORT: u16 = 5555;
const IPERF3_PORT: u16 = 5201;
/// TCP payload per 1500-byte frame with timestamps, and what that frame
/// occupies on the wire (IP and TCP 52, Ethernet 14, framing 24).
pub(crate) const MSS: f64 = 1448.0;
pub(crate) const SEGMENT_WIRE: f64 = MSS + 52.0 + 14.0 + ETHERNET_FRAMING as f64;

/// What one packet carries under classic flow control: a push fills the
/// 1 MiB payload; oxadbd's pull packets are whole DATA frames, 15 of
/// 64 KiB + 8 (983,160 bytes).
pub(crate) fn packet_payload(push: bool) -> f64 {
    use oxadb_wire::sync::{HEADER_LEN, SYNC_DATA_MAX};
    let max = oxadb_wire::MAX_PAYLOAD as usize;
    if push {
        max as f64
    } else {
        let frame = HEADER_LEN + SYNC_DATA_MAX;
        ((max / frame) * frame) as f64
    }
}

/// Stop-and-wait: one packet per round trip plus its own serialization.
pub(crate) fn stop_and_wait_mb_s(push: bool, rtt: Duration, rate: f64) -> f64 {
    let payload = packet_payload(push);
    let serialization = payload * SEGMENT_WIRE / MSS / rate;
    payload / (rtt.as_secs_f64() + serialization) / 1e6
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Client {
    Iperf3,
    Adb(AdbVia),
    Oxadb(&'static str),
}

/// Google's adb CLI and the server it talks to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum AdbVia {
    /// adb 29 and its own server (classic: it predates burst mode).
    Google29,
    /// adb 34 and its own server with burst mode asked for (adb 34 reads
    /// `ADB_DELAYED_ACK`, later releases `ADB_BURST_MODE`).
    Google34Burst,
    /// adb 29's CLI through `oxadb server`, which holds the device with
    /// oxadb's defaults (burst mode, adaptive credit).
    OxadbServer,
}

impl Client {
    fn parse(text: &str) -> Result<Client> {
        Ok(match text {
            "iperf3" => Client::Iperf3,
            "adb" => Client::Adb(AdbVia::Google29),
            "adb34-burst" => Client::Adb(AdbVia::Google34Burst),
            "adb-oxadb-server" => Client::Adb(AdbVia::OxadbServer),
            "oxadb-classic" => Client::Oxadb("classic"),
            "oxadb-aosp" => Client::Oxadb("aosp"),
            "oxadb-adaptive" => Client::Oxadb("adaptive"),
            _ => bail!(
                "unknown transfer {text:?}: expected iperf3, adb, adb34-burst, adb-oxadb-server, oxadb-classic, oxadb-aosp or oxadb-adaptive"
            ),
        })
    }

    /// Row labels: the push direction (a to b) first.
    fn labels(self) -> [String; 2] {
        match self {
            Client::Iperf3 => ["iperf3 a→b".into(), "iperf3 b→a (-R)".into()],
            Client::Adb(AdbVia::Google29) => ["adb 29 push".into(), "adb 29 pull".into()],
            Client::Adb(AdbVia::Google34Burst) => {
                ["adb 34 burst push".into(), "adb 34 burst pull".into()]
            }
            Client::Adb(AdbVia::OxadbServer) => [
                "adb 29 via oxadb server push".into(),
                "adb 29 via oxadb server pull".into(),
            ],
            Client::Oxadb(credit) => [
                format!("oxadb {credit} push"),
                format!("oxadb {credit} pull"),
            ],
        }
    }
}

/// Where a transfer's bytes go.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub(crate) enum Target {
    /// The private character device node (1, 3).
    Node,
    /// A new file in tmpfs, compared with the source afterwards.
    #[value(name = "tmpfs")]
    File,
}

/// One transfer's outcome.
struct Measured {
    /// MB/s as the tool reports it: iperf3's receiver, or the client's
    /// `(N bytes in T s)`, which leaves out process start and connecting.
    rate: f64,
    /// Wall time of the client process, start to exit.
    wall: Duration,
    /// Both directions of the link during the transfer.
    link: [Counters; 2],
    /// `oxadb --stats` lines.
    stats: Vec<String>,
    /// CPU seconds of the client side: the client process and whatever else
    /// ran in namespace a (adb's server).
    client_cpu: f64,
    /// CPU seconds of everything in namespace b: the daemon or iperf3's server.
    device_cpu: f64,
}

/// One table row and its runs.
pub(crate) struct Row {
    pub(crate) label: String,
    pub(crate) push: bool,
    pub(crate) small: bool,
    pub(crate) rates: Vec<f64>,
    pub(crate) walls: Vec<f64>,
    pub(crate) drops: Vec<u64>,
    pub(crate) stats: Vec<Vec<String>>,
    /// CPU seconds per GiB moved: client side, device side.
    pub(crate) client_cpu: Vec<f64>,
    pub(crate) device_cpu: Vec<f64>,
}

/// What one round trip gave.
pub(crate) struct RttResult {
    pub(crate) rtt: Duration,
    pub(crate) params: LinkParams,
    pub(crate) ping: String,
    /// How the ping compares with the configured round trip.
    pub(crate) ping_verdict: &'static str,
    pub(crate) rows: Vec<Row>,
    /// Link totals over the round trip's transfers.
    pub(crate) frames: u64,
    /// The 1500-byte frames they stand for (more when offloads are on).
    pub(crate) segments: u64,
    /// 1500-byte frames dropped.
    pub(crate) drops: u64,
    pub(crate) late_sum_ns: u64,
    pub(crate) late_max_ns: u64,
    pub(crate) peak_backlog: u64,
}

/// A background process (daemon, server), killed and reaped on drop.
pub(crate) struct Background {
    child: Option<Child>,
}

impl Background {
    /// Starts `command` and waits until it listens on `port` (stopped again
    /// if it does not).
    pub(crate) fn spawn_listening(
        command: &mut Command,
        port: u16,
        timeout: Duration,
        what: &str,
    ) -> Result<Background> {
        let mut background = Background {
            child: Some(emulator::spawn_registered(command)?),
        };
        wait_listening(
            background.child.as_mut().expect("started"),
            port,
            timeout,
            what,
        )?;
        Ok(background)
    }

    /// The process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it has exited (it is then reaped).
    pub(crate) fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|child| !matches!(child.try_wait(), Ok(None)))
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL.
    pub(crate) fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        if let Ok(None) = child.try_wait() {
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        emulator::forget_child(pid);
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

/// Waits until the process `child` (inside a namespace) has a TCP socket
/// listening on `port`, reading its namespace's table from /proc/PID/net/tcp.
fn wait_listening(child: &mut Child, port: u16, timeout: Duration, what: &str) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let wanted = format!(":{port:04X}");
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited before listening ({status})");
        }
        let table = std::fs::read_to_string(format!("/proc/{}/net/tcp", child.id()))?;
        let listening = table.lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[1].ends_with(&wanted) && fields[3] == "0A"
        });
        if listening {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{what} was not listening on port {port} after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `(N bytes in T s)` from adb's or oxadb's summary line: MB/s and N. The
/// last line where it parses (oxadb's `--stats` lines say "bytes in N packets").
fn reported_rate(text: &str) -> Option<(f64, u64)> {
    text.lines().rev().find_map(|line| {
        let inner = line.trim_end().strip_suffix("s)")?;
        let inner = &inner[inner.rfind('(')? + 1..];
        let (bytes, seconds) = inner.split_once(" bytes in ")?;
        let bytes: u64 = bytes.trim().parse().ok()?;
        let seconds: f64 = seconds.trim().parse().ok()?;
        (seconds > 0.0).then(|| (bytes as f64 / seconds / 1e6, bytes))
    })
}

/// `rtt min/avg/max/mdev = a/b/c/d ms` from ping.
pub(crate) fn ping_summary(text: &str) -> Option<[f64; 4]> {
    let line = text.lines().find(|l| l.contains("min/avg/max"))?;
    // Beyond 200 ms (ping's -i) a ", pipe 2" follows: pings in flight at once.
    let numbers = line.split('=').nth(1)?.split(',').next()?;
    let numbers = numbers.trim().trim_end_matches("ms").trim();
    let values: Vec<f64> = numbers
        .split('/')
        .map(|v| v.trim().parse().ok())
        .collect::<Option<_>>()?;
    values.try_into().ok()
}

struct Bench<'a> {
    args: &'a EmulatedArgs,
    emu: Emulator,
    dir: PathBuf,
    source: PathBuf,
    null_node: PathBuf,
    pulled: PathBuf,
    oxadbd: PathBuf,
    oxadb: PathBuf,
    serial: String,
    /// Limit for one transfer at the current round trip.
    timeout: Duration,
    adb_sessions: usize,
}

impl Bench<'_> {
    /// Runs `command` to completion within `timeout` (killed by pid when it
    /// overruns), stdout and stderr into a file: a pipe could be held open
    /// by a process it forked (adb's server). Returns the wall time and output.
    fn run_bounded(
        &self,
        command: &mut Command,
        timeout: Duration,
        what: &str,
    ) -> Result<(Duration, String)> {
        let (elapsed, text, _) = self.run_bounded_cpu(command, timeout, what)?;
        Ok((elapsed, text))
    }

    /// `run_bounded`, also returning the command's CPU seconds.
    fn run_bounded_cpu(
        &self,
        command: &mut Command,
        timeout: Duration,
        what: &str,
    ) -> Result<(Duration, String, f64)> {
        run_bounded_cpu(command, timeout, what, &self.dir.join("output.txt"))
    }

    /// Runs one transfer command and checks its result, which went into
    /// `into`: the device node must still be one (Google's adb replaces a
    /// pull destination), a pulled file must equal the source.
    fn transfer(&self, command: &mut Command, into: Target, what: &str) -> Result<Measured> {
        if into == Target::File {
            let _ = std::fs::remove_file(&self.pulled);
        }
        let before = self.emu.snapshot();
        let cpu_before = self.side_cpu();
        let (wall, text, cpu) = self.run_bounded_cpu(command, self.timeout, what)?;
        let cpu_after = self.side_cpu();
        let after = self.emu.snapshot();
        let (rate, bytes) =
            reported_rate(&text).with_context(|| format!("{what}: no rate in {text:?}"))?;
        ensure!(
            bytes == self.args.size,
            "{what} reports {bytes} bytes, not {}",
            self.args.size
        );
        if into == Target::Node {
            let kind = std::fs::symlink_metadata(&self.null_node)?.file_type();
            ensure!(kind.is_char_device(), "{what} replaced the device node");
        } else {
            let size = std::fs::metadata(&self.pulled)?.len();
            ensure!(size == self.args.size, "{what}: pulled {size} bytes");
            ensure!(
                crate::same_contents(&self.source, &self.pulled)?,
                "{what}: the pulled file differs from the source"
            );
        }
        let stats = text
            .lines()
            .skip_while(|l| !l.starts_with("stream stats"))
            .map(str::to_string)
            .collect();
        Ok(Measured {
            rate,
            wall,
            link: [after[0].since(&before[0]), after[1].since(&before[1])],
            stats,
            client_cpu: cpu + cpu_after[0] - cpu_before[0],
            device_cpu: cpu_after[1] - cpu_before[1],
        })
    }

    /// CPU seconds of the processes in namespaces a and b.
    fn side_cpu(&self) -> [f64; 2] {
        [self.emu.cpu_seconds(Side::A), self.emu.cpu_seconds(Side::B)]
    }

    fn iperf3(&self, reverse: bool) -> Result<Measured> {
        let log = File::create(self.dir.join("iperf3-server.txt"))?;
        // The server runs until stopped, so that its CPU time can be read.
        let mut server = Background::spawn_listening(
            self.emu
                .command(Side::B, &self.args.iperf3)
                .args(["-s", "-B", DEVICE_ADDR, "-p"])
                .arg(IPERF3_PORT.to_string())
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
            IPERF3_PORT,
            Duration::from_secs(5),
            "the iperf3 server",
        )?;
        let before = self.emu.snapshot();
        let cpu_before = self.side_cpu();
        let mut client = self.emu.command(Side::A, &self.args.iperf3);
        client
            .args(["-c", DEVICE_ADDR, "-J", "-p"])
            .arg(IPERF3_PORT.to_string())
            .arg("-n")
            .arg(self.args.size.to_string());
        if reverse {
            client.arg("-R");
        }
        let (wall, text, cpu) = self.run_bounded_cpu(&mut client, self.timeout, "iperf3")?;
        let cpu_after = self.side_cpu();
        let after = self.emu.snapshot();
        server.stop(Duration::from_secs(3));
        let json: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("iperf3 output: {text}"))?;
        let bits = json["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .with_context(|| format!("no receiver bits_per_second in iperf3's output: {text}"))?;
        Ok(Measured {
            rate: bits / 8.0 / 1e6,
            wall,
            link: [after[0].since(&before[0]), after[1].since(&before[1])],
            stats: Vec::new(),
            client_cpu: cpu + cpu_after[0] - cpu_before[0],
            device_cpu: cpu_after[1] - cpu_before[1],
        })
    }

    /// oxadbd inside namespace b on DEVICE_ADDR with `credit`, without
    /// authentication: only this benchmark's namespace a can reach it.
    fn start_daemon(&self, credit: &str) -> Result<Background> {
        // Appended to: `tls_connections` counts over the link's whole run.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("oxadbd-{credit}.log")))?;
        Background::spawn_listening(
            self.emu
                .command(Side::B, &self.oxadbd)
                .arg("--listen")
                .arg(format!("{DEVICE_ADDR}:{DAEMON_PORT}"))
                .args(["--insecure", "--no-auth", "--credit", credit])
                // The key and certificate TLS makes on first use: in our
                // directory, not the machine's /etc/oxadbd.
                .arg("--tls-key")
                .arg(self.dir.join("tls_key.pem"))
                .arg("--tls-cert")
                .arg(self.dir.join("tls_cert.pem"))
                .args(
                    self.args
                        .daemon_tls
                        .iter()
                        .flat_map(|mode| ["--tls", mode.as_str()]),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log),
            DAEMON_PORT,
            Duration::from_secs(10),
            "oxadbd",
        )
    }

    fn oxadb(&self, credit: &str, push: bool) -> Result<Measured> {
        let mut command = self.emu.command(Side::A, &self.oxadb);
        command
            .env("HOME", self.dir.join("oxadb-home"))
            .env_remove("ANDROID_SERIAL")
            .env_remove("OXADB_NO_BURST")
            .args(["-s", &self.serial, "--credit", credit]);
        // Compression off: random data would only pay for it.
        let into = if push {
            Target::Node
        } else {
            self.args.pull_into
        };
        let destination = match into {
            Target::Node => &self.null_node,
            Target::File => &self.pulled,
        };
        command
            .arg(if push { "push" } else { "pull" })
            .args(["-z", "none", "--stats"])
            .arg(&self.source)
            .arg(destination);
        let what = format!("oxadb {credit} {}", if push { "push" } else { "pull" });
        self.transfer(&mut command, into, &what)
    }

    /// Connections the daemons took, and how many of them moved to TLS,
    /// from their logs (removed: the next link starts afresh).
    fn tls_connections(&self) -> (usize, usize) {
        let mut counts = (0, 0);
        for credit in ["classic", "aosp", "adaptive"] {
            let path = self.dir.join(format!("oxadbd-{credit}.log"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            counts.0 += text.matches("connection accepted").count();
            counts.1 += text.matches("TLS 1.3 established").count();
            let _ = std::fs::remove_file(&path);
        }
        counts
    }

    /// Checks the whole path (client, link, daemon) once, and lets
    /// oxadb create its key in its private HOME before anything is timed.
    fn warm_up(&self) -> Result<()> {
        let _daemon = self.start_daemon("adaptive")?;
        let (_, text) = self.run_bounded(
            self.emu
                .command(Side::A, &self.oxadb)
                .env("HOME", self.dir.join("oxadb-home"))
                .args(["-s", &self.serial, "get-state"]),
            Duration::from_secs(20),
            "oxadb get-state through the emulated link",
        )?;
        ensure!(text.trim() == "device", "oxadb get-state: {text}");
        Ok(())
    }

    /// Google adb with a private server inside namespace a: connect, push,
    /// pull, kill-server, and whatever is left of the server is killed.
    fn adb_session(&mut self, via: AdbVia) -> Result<[Measured; 2]> {
        self.adb_sessions += 1;
        let home = self.dir.join(format!("adb-home-{}", self.adb_sessions));
        let tmp = self.dir.join(format!("adb-tmp-{}", self.adb_sessions));
        std::fs::create_dir_all(&home)?;
        std::fs::create_dir_all(&tmp)?;
        // Namespace a is empty: any port is free there.
        let port = crate::free_port()?;
        let program = match via {
            AdbVia::Google34Burst => &self.args.adb34,
            AdbVia::Google29 | AdbVia::OxadbServer => &self.args.adb,
        };
        let adb = |args: &[&str]| {
            let mut command = self.emu.command(Side::A, program);
            if via == AdbVia::Google34Burst {
                command
                    .env("ADB_DELAYED_ACK", "1")
                    .env("ADB_BURST_MODE", "1");
            }
            command
                .env("HOME", &home)
                .env("TMPDIR", &tmp)
                .env("ADB_EMU", "0")
                .env("ADB_USB", "0")
                .env("ADB_MDNS", "0")
                .env_remove("ANDROID_SERIAL")
                .arg("-P")
                .arg(port.to_string())
                .args(args);
            command
        };
        let short = Duration::from_secs(20);
        // Ours answers on the port before adb looks, so adb starts none.
        let _oxadb_server = match via {
            AdbVia::OxadbServer => Some(Background::spawn_listening(
                self.emu
                    .command(Side::A, &self.oxadb)
                    .env("HOME", self.dir.join("oxadb-home"))
                    .args(["server", "-P", &port.to_string()])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(File::create(self.dir.join("oxadb-server.log"))?),
                port,
                short,
                "oxadb server",
            )?),
            _ => None,
        };
        let label = match via {
            AdbVia::Google29 => "adb 29",
            AdbVia::Google34Burst => "adb 34 burst",
            AdbVia::OxadbServer => "adb 29 via oxadb server",
        };
        let result = (|| -> Result<[Measured; 2]> {
            let (_, text) =
                self.run_bounded(&mut adb(&["connect", &self.serial]), short, "adb connect")?;
            ensure!(text.contains("connected to"), "adb connect: {text}");
            self.run_bounded(
                &mut adb(&["-s", &self.serial, "wait-for-device"]),
                short,
                "adb wait-for-device",
            )?;
            let source = self.source.to_str().context("non-UTF-8 path")?;
            let null_node = self.null_node.to_str().context("non-UTF-8 path")?;
            let pulled = self.pulled.to_str().context("non-UTF-8 path")?;
            let push = self.transfer(
                &mut adb(&["-s", &self.serial, "push", source, null_node]),
                Target::Node,
                &format!("{label} push"),
            )?;
            let pull = self.transfer(
                // Never into the node: adb replaces what it pulls into.
                &mut adb(&["-s", &self.serial, "pull", source, pulled]),
                Target::File,
                &format!("{label} pull"),
            )?;
            Ok([push, pull])
        })();
        let _ = self.run_bounded(&mut adb(&["kill-server"]), short, "adb kill-server");
        let left = self.emu.kill_processes(Side::A);
        if left > 0 {
            eprintln!("killed {left} process(es) left in namespace a after adb kill-server");
        }
        result
    }
}

/// Runs `command` to completion within `timeout` (killed by pid when it
/// overruns), stdout and stderr into `out_path`: a pipe could be held open
/// by a process it forked (adb's server). Returns the wall time, the output
/// and the command's CPU seconds (its reaped children included).
pub(crate) fn run_bounded_cpu(
    command: &mut Command,
    timeout: Duration,
    what: &str,
    out_path: &Path,
) -> Result<(Duration, String, f64)> {
    let out = File::create(out_path)?;
    command
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    let start = Instant::now();
    let child = emulator::spawn_registered(command)?;
    let pid = child.id();
    let fired = Arc::new(AtomicBool::new(false));
    let (done, wait_done) = std::sync::mpsc::channel::<()>();
    let watchdog = {
        let fired = fired.clone();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait_done.recv_timeout(timeout)
            {
                fired.store(true, Ordering::Relaxed);
                emulator::kill_child(pid);
            }
        })
    };
    let waited = crate::wait_rusage(&child);
    let elapsed = start.elapsed();
    drop(done);
    let _ = watchdog.join();
    emulator::forget_child(pid);
    let (status, cpu) = waited?;
    let text = std::fs::read_to_string(out_path).unwrap_or_default();
    ensure!(
        !fired.load(Ordering::Relaxed),
        "{what} timed out after {timeout:?}: {text}"
    );
    ensure!(status.success(), "{what} failed ({status}): {text}");
    Ok((elapsed, text, cpu))
}

fn check_tool(program: &Path, arg: &str, hint: &str) -> Result<String> {
    let output = Command::new(program)
        .arg(arg)
        .output()
        .with_context(|| format!("{} is not available: {hint}", program.display()))?;
    ensure!(
        output.status.success(),
        "{} {arg} failed: {hint}",
        program.display()
    );
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// One kind of link, every row of which runs on each (`--links`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Link {
    /// 64 KiB offloaded frames through the TAP devices (IFF_VNET_HDR with
    /// TSO), each charged as the 1500-byte frames it stands for.
    Offload,
    /// 1500-byte frames, one by one.
    Plain,
    /// 1500-byte frames released together every `--clump-ms`, both ways.
    Clumped,
    /// Another emulator's namespaces (`--namespaces`).
    External,
}

impl Link {
    fn parse(text: &str) -> Result<Link> {
        Ok(match text {
            "offload" => Link::Offload,
            "plain" => Link::Plain,
            "clumped" => Link::Clumped,
            _ => bail!("unknown link {text:?}: expected offload, plain or clumped"),
        })
    }

    /// The heading of the link's tables.
    pub(crate) fn describe(self, args: &EmulatedArgs) -> String {
        match self {
            Link::Offload => "64 KiB offloaded frames (TSO through the TAP devices)".into(),
            Link::Plain => "plain 1500-byte frames, no offloads".into(),
            Link::Clumped => format!(
                "1500-byte frames released in clumps every {} ms, both ways (acknowledgements arrive in bursts, as over Wi-Fi)",
                args.clump_ms
            ),
            Link::External => format!(
                "another emulator's namespaces {} (1500-byte frames as it forwards them)",
                args.namespaces.as_deref().unwrap_or_default().join(" and ")
            ),
        }
    }
}

/// Everything one link gave.
pub(crate) struct LinkRun {
    pub(crate) link: Link,
    pub(crate) results: Vec<RttResult>,
    pub(crate) texts: ReportTexts,
    /// The namespaces, host side first.
    pub(crate) names: [String; 2],
}

/// What [`emulated`] measured, for `emulated_report` to print.
pub(crate) struct EmulatedResults {
    pub(crate) args: EmulatedArgs,
    pub(crate) oxadb: PathBuf,
    pub(crate) oxadbd: PathBuf,
    pub(crate) runs: Vec<LinkRun>,
}

pub(crate) fn emulated(args: EmulatedArgs) -> Result<EmulatedResults> {
    // First, before any thread exists: every later thread inherits the mask.
    emulator::install_signal_cleanup()?;
    ensure!(args.runs >= 1, "--runs must be at least 1");
    ensure!(!args.rtts.is_empty(), "--rtts is empty");
    ensure!(
        args.rtts.iter().all(|&r| r > 0.0 && r <= 1000.0),
        "round trips must be in (0, 1000] ms"
    );
    ensure!(args.rate_mbit > 0.0, "--rate-mbit must be positive");
    ensure!(args.clump_ms > 0.0, "--clump-ms must be positive");
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "the emulator creates network namespaces: run as root"
    );
    let clients: Vec<Client> = args
        .clients
        .iter()
        .filter(|c| !c.is_empty())
        .map(|c| Client::parse(c))
        .collect::<Result<_>>()?;
    let small_clients: Vec<Client> = args
        .small_clients
        .iter()
        .filter(|c| !c.is_empty())
        .map(|c| Client::parse(c))
        .collect::<Result<_>>()?;
    let uses = |c: Client| clients.contains(&c) || small_clients.contains(&c);
    let links: Vec<Link> = match &args.namespaces {
        Some(names) => {
            ensure!(
                names.len() == 2,
                "--namespaces takes two names: the host side's and the device side's"
            );
            ensure!(
                args.rtts.len() == 1,
                "--namespaces: give the other emulator's round trip as the one value of --rtts"
            );
            // adb's server outlives its client; in namespaces that are not
            // ours it could not be told from processes we must not end.
            ensure!(
                !clients
                    .iter()
                    .chain(&small_clients)
                    .any(|c| matches!(c, Client::Adb(_))),
                "--namespaces: adb's server cannot be cleaned up in namespaces this program did not make; leave adb out of --clients"
            );
            vec![Link::External]
        }
        None => args
            .links
            .iter()
            .map(|l| Link::parse(l))
            .collect::<Result<_>>()?,
    };
    ensure!(!links.is_empty(), "--links is empty");
    check_tool(Path::new("ip"), "-V", "apt-get install iproute2")?;
    check_tool(Path::new("ping"), "-V", "apt-get install iputils-ping")?;
    let iperf3_version = if uses(Client::Iperf3) {
        check_tool(&args.iperf3, "--version", "apt-get install iperf3")?
    } else {
        String::new()
    };
    let mut adb_version = String::new();
    if uses(Client::Adb(AdbVia::Google29)) || uses(Client::Adb(AdbVia::OxadbServer)) {
        adb_version += &check_tool(&args.adb, "version", "apt-get install adb")?;
    }
    if uses(Client::Adb(AdbVia::Google34Burst)) {
        adb_version += &check_tool(
            &args.adb34,
            "version",
            "scripts/install-adb34.sh target/peers/adb-34",
        )?;
    }
    let absolute = |path: &Path| {
        std::fs::canonicalize(path)
            .with_context(|| format!("{} (build with cargo build --release)", path.display()))
    };
    let oxadbd = absolute(&args.oxadbd)?;
    let oxadb = absolute(&args.oxadb)?;

    let dir = args.workdir.join(format!("oxemu-{}", std::process::id()));
    ensure!(!dir.exists(), "{} already exists", dir.display());
    std::fs::create_dir_all(dir.join("oxadb-home"))?;
    emulator::register_path(&dir);
    let result = (|| -> Result<Vec<LinkRun>> {
        let source = dir.join("random.bin");
        eprintln!("writing {} random bytes to {}", args.size, source.display());
        crate::write_random_file(&source, args.size)?;
        let null_node = dir.join("null");
        crate::make_null_node(&null_node)?;
        let mut runs = Vec::new();
        for &link in &links {
            let bench = Bench {
                args: &args,
                emu: open_link(&args, link)?,
                dir: dir.clone(),
                pulled: dir.join("pulled.bin"),
                source: source.clone(),
                null_node: null_node.clone(),
                oxadbd: oxadbd.clone(),
                oxadb: oxadb.clone(),
                serial: format!("{DEVICE_ADDR}:{DAEMON_PORT}"),
                timeout: Duration::ZERO,
                adb_sessions: 0,
            };
            let texts = ReportTexts {
                adb_version: adb_version.clone(),
                iperf3_version: iperf3_version.clone(),
                ..ReportTexts::default()
            };
            runs.push(run_link(bench, link, &clients, &small_clients, texts)?);
        }
        ensure!(
            std::fs::metadata("/dev/null")?.file_type().is_char_device(),
            "/dev/null is no longer a character device"
        );
        Ok(runs)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    emulator::forget_path(&dir);
    Ok(EmulatedResults {
        runs: result?,
        args,
        oxadb,
        oxadbd,
    })
}

/// The link's shape at round trip `rtt`.
fn params_for(args: &EmulatedArgs, link: Link, rtt: Duration) -> LinkParams {
    let rate = args.rate_mbit * 1e6 / 8.0;
    LinkParams {
        rate,
        one_way: rtt / 2,
        burst: (link == Link::Clumped).then(|| Duration::from_secs_f64(args.clump_ms / 1e3)),
        queue_limit: args
            .queue_limit
            .unwrap_or_else(|| LinkParams::default_queue_limit(rate, rtt)),
    }
}

fn round_trips(args: &EmulatedArgs) -> Vec<Duration> {
    args.rtts
        .iter()
        .map(|ms| Duration::from_secs_f64(ms / 1e3))
        .collect()
}

/// Our own two namespaces joined by our forwarder, or another emulator's.
fn open_link(args: &EmulatedArgs, link: Link) -> Result<Emulator> {
    match (link, &args.namespaces) {
        (Link::External, Some(names)) => Emulator::attach([names[0].clone(), names[1].clone()]),
        _ => Emulator::start(
            params_for(args, link, round_trips(args)[0]),
            link == Link::Offload,
        ),
    }
}

/// Every round trip on one link, with the TCP buffers and congestion
/// control the arguments ask for.
fn run_link(
    mut bench: Bench,
    link: Link,
    clients: &[Client],
    small_clients: &[Client],
    mut texts: ReportTexts,
) -> Result<LinkRun> {
    let args = bench.args;
    let (mut small, mut small_w) = bench.emu.tcp_buffer_values()?;
    if let Some(max) = args.small_rmem {
        small[2] = max;
    }
    if let Some(max) = args.small_wmem {
        small_w[2] = max;
    }
    let big = [small[0], small[1], args.buffers];
    let big_w = [small_w[0], small_w[1], args.buffers];
    if let Some(name) = &args.congestion_control {
        // A namespace other than the host's may only pick what the host
        // allows (net.ipv4.tcp_allowed_congestion_control), which this
        // program leaves alone.
        bench
            .emu
            .set_sysctl("net.ipv4.tcp_congestion_control", name)
            .with_context(|| {
                let allowed =
                    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
                        .unwrap_or_default();
                format!(
                    "--congestion-control {name}: namespaces may use only what the host allows: {}",
                    allowed.trim()
                )
            })?;
    }
    texts.congestion = bench.emu.sysctl("net.ipv4.tcp_congestion_control")?;
    bench.emu.set_tcp_buffers(small, small_w)?;
    texts.small_buffers = bench.emu.tcp_buffers()?;
    bench.emu.set_tcp_buffers(big, big_w)?;
    texts.buffers = bench.emu.tcp_buffers()?;
    bench.warm_up()?;
    let mut results = Vec::new();
    for rtt in round_trips(args) {
        results.push(run_rtt(
            &mut bench,
            rtt,
            params_for(args, link, rtt),
            clients,
            small_clients,
            [big, big_w, small, small_w],
        )?);
    }
    texts.tls = bench.tls_connections();
    Ok(LinkRun {
        link,
        results,
        texts,
        names: [
            bench.emu.name(Side::A).to_string(),
            bench.emu.name(Side::B).to_string(),
        ],
    })
}

/// Every run of every transfer at one round trip, interleaved.
fn run_rtt(
    bench: &mut Bench,
    rtt: Duration,
    params: LinkParams,
    clients: &[Client],
    small_clients: &[Client],
    [big, big_w, small, small_w]: [[u64; 3]; 4],
) -> Result<RttResult> {
    let ms = rtt.as_secs_f64() * 1e3;
    bench.emu.set_params(params);
    // Slowest expected transfer: stop-and-wait, or a 1 MiB window per round trip.
    let slowest =
        stop_and_wait_mb_s(false, rtt, params.rate).min((1 << 20) as f64 / rtt.as_secs_f64() / 1e6);
    bench.timeout = Duration::from_secs(30)
        + Duration::from_secs_f64(4.0 * bench.args.size as f64 / 1e6 / slowest);

    // The first ping resolves the neighbour (one more round trip): not counted.
    let ping = |count: &str| {
        let mut command = bench.emu.command(Side::A, "ping");
        command.args(["-q", "-n", "-c", count, "-i", "0.2", "-W", "5", DEVICE_ADDR]);
        bench.run_bounded(&mut command, Duration::from_secs(20), "ping")
    };
    ping("1")?;
    let (_, text) = ping("5")?;
    let [min, avg, max, mdev] = ping_summary(&text).with_context(|| format!("ping: {text}"))?;
    let ping_verdict = if params.burst.is_some() {
        // Each direction waits for the next release: up to one interval more.
        "not checked: burst release adds up to one interval each way"
    } else if (min - ms).abs() <= (0.1 * ms).max(0.2) {
        // The minimum: a shared VM that deschedules the forwarder adds
        // milliseconds to single pings (worst release seen: 19 ms late),
        // never takes any away.
        "within 10% (or 0.2 ms) of the configured round trip (minimum)"
    } else {
        "OFF by more than 10% (and 0.2 ms) from the configured round trip (minimum)"
    };
    let ping_text = format!("min/avg/max/mdev = {min:.3}/{avg:.3}/{max:.3}/{mdev:.3} ms");
    eprintln!("RTT {ms} ms: ping {ping_text} ({ping_verdict})");

    let mut rows: Vec<Row> = Vec::new();
    let row_of = |rows: &mut Vec<Row>, label: &str, push: bool, small: bool| -> usize {
        if let Some(i) = rows
            .iter()
            .position(|r| r.label == label && r.small == small)
        {
            return i;
        }
        rows.push(Row {
            label: label.to_string(),
            push,
            small,
            rates: Vec::new(),
            walls: Vec::new(),
            drops: Vec::new(),
            stats: Vec::new(),
            client_cpu: Vec::new(),
            device_cpu: Vec::new(),
        });
        rows.len() - 1
    };
    // Rows in display order, whatever order the runs take.
    for &client in clients {
        for (i, label) in client.labels().iter().enumerate() {
            row_of(&mut rows, label, i == 0, false);
        }
    }
    for &client in small_clients {
        for (i, label) in client.labels().iter().enumerate() {
            row_of(&mut rows, label, i == 0, true);
        }
    }
    let mut totals = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let size = bench.args.size;
    let mut record =
        |rows: &mut Vec<Row>, label: &str, push: bool, small: bool, m: Measured, run: usize| {
            let i = row_of(rows, label, push, small);
            let drops = m.link[0].drops + m.link[1].drops;
            eprintln!(
                "RTT {ms} ms run {} {:>22}{}: {:7.1} MB/s (wall {:.2} s), drops {drops}",
                run + 1,
                label,
                if small { ", default buffers" } else { "" },
                m.rate,
                m.wall.as_secs_f64()
            );
            let row = &mut rows[i];
            row.rates.push(m.rate);
            row.walls.push(size as f64 / m.wall.as_secs_f64() / 1e6);
            row.drops.push(drops);
            row.stats.push(m.stats);
            let gib = size as f64 / (1u64 << 30) as f64;
            row.client_cpu.push(m.client_cpu / gib);
            row.device_cpu.push(m.device_cpu / gib);
            for c in &m.link {
                totals.0 += c.frames;
                totals.1 += c.drops;
                totals.2 += c.late_ns_sum;
                totals.3 = totals.3.max(c.late_ns_max);
                totals.4 = totals.4.max(c.peak_backlog);
                totals.5 += c.segments;
            }
        };
    for run in 0..bench.args.runs {
        for phase_small in [false, true] {
            let list = if phase_small { small_clients } else { clients };
            if list.is_empty() {
                continue;
            }
            if phase_small {
                bench.emu.set_tcp_buffers(small, small_w)?;
            }
            // Rotate the order: a slow spell of this shared machine should
            // hit every transfer, not always the same one.
            for step in 0..list.len() {
                let client = list[(run + step) % list.len()];
                let [push_label, pull_label] = client.labels();
                let measured: [Measured; 2] = match client {
                    Client::Iperf3 => [bench.iperf3(false)?, bench.iperf3(true)?],
                    Client::Adb(via) => {
                        // adb 29 has no burst mode: classic whatever the daemon
                        // offers. With burst mode each end grants its own
                        // credit: the daemon its default.
                        let credit = match via {
                            AdbVia::Google29 => "classic",
                            AdbVia::Google34Burst | AdbVia::OxadbServer => "adaptive",
                        };
                        let _daemon = bench.start_daemon(credit)?;
                        bench.adb_session(via)?
                    }
                    Client::Oxadb(credit) => {
                        let _daemon = bench.start_daemon(credit)?;
                        [bench.oxadb(credit, true)?, bench.oxadb(credit, false)?]
                    }
                };
                let [push, pull] = measured;
                record(&mut rows, &push_label, true, phase_small, push, run);
                record(&mut rows, &pull_label, false, phase_small, pull, run);
            }
            if phase_small {
                bench.emu.set_tcp_buffers(big, big_w)?;
            }
        }
    }
    let (frames, drops, late_sum_ns, late_max_ns, peak_backlog, segments) = totals;
    Ok(RttResult {
        rtt,
        params,
        ping: ping_text,
        ping_verdict,
        rows,
        frames,
        segments,
        drops,
        late_sum_ns,
        late_max_ns,
        peak_backlog,
    })
}

/// What the report quotes from the tools and the namespaces.
#[derive(Default)]
pub(crate) struct ReportTexts {
    pub(crate) buffers: String,
    pub(crate) small_buffers: String,
    pub(crate) congestion: String,
    pub(crate) adb_version: String,
    pub(crate) iperf3_version: String,
    /// Connections to oxadbd, and how many of them TLS carried.
    pub(crate) tls: (usize, usize),
}

#[cfg(test)]
mod tests {
    #[test]
    fn ping_summary_reads_short_and_long_round_trips() {
        let short = "rtt min/avg/max/mdev = 50.1/50.2/50.3/0.1 ms\n";
        assert_eq!(super::ping_summary(short), Some([50.1, 50.2, 50.3, 0.1]));
        let long = "rtt min/avg/max/mdev = 302.850/303.952/305.115/0.814 ms, pipe 2\n";
        assert_eq!(
            super::ping_summary(long),
            Some([302.85, 303.952, 305.115, 0.814])
        );
    }
}
