//! Misbehaving devices for `server-neighbours`: TCP listeners on loopback
//! that answer the host's CNXN as a device does, without authentication,
//! then misbehave in one of four ways ([`Kind`]) once told to. Every loop
//! here is bounded in packets and in time and also ends when told to, so a
//! fleet left behind stops by itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use oxadb_wire::packet::VERSION_SKIP_CHECKSUM;
use oxadb_wire::{Banner, Command, Header, Packet, HEADER_LEN, MAX_PAYLOAD};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How a device misbehaves once its fleet is told to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// Opens streams on the host it never asked for, as fast as the socket
    /// takes them; the host refuses each with CLSE.
    OpenFlood,
    /// OKAY and CLSE for streams that do not exist, as fast as it can.
    StrayFlood,
    /// Answers CNXN, then sends a malformed header: the host drops the
    /// connection and connects again 3 s later.
    Reconnect,
    /// Answers the shell the bench opens on it with WRTEs far beyond the
    /// credit the host granted, which the host takes for a protocol error.
    CreditFlood,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::OpenFlood => "open-flood",
            Kind::StrayFlood => "stray-flood",
            Kind::Reconnect => "reconnect",
            Kind::CreditFlood => "credit-flood",
        }
    }
}

/// What a fleet's devices do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Answer CNXN and nothing more (while the bench connects them).
    Behave,
    Misbehave,
    /// Stop sending; connections end when the host closes them.
    Stop,
}

/// Packets one device connection sends at most in one phase: more than an
/// hour at the rates seen here (the phase's time limit comes first), but a
/// bound.
const MAX_PACKETS: u64 = 50_000_000_000;
/// Bytes of WRTE a credit flood sends beyond the credit the host granted.
const BEYOND_CREDIT: u64 = 64 << 20;
/// Connections one listener accepts at most in one phase (a reconnection
/// every 3 s: 20 a minute).
const MAX_CONNECTIONS: u64 = 1_000;
/// Packets encoded per socket write in the floods: one write of 25 to
/// 45 KiB costs this process far less than the host pays to parse them.
const BATCH: usize = 1024;
/// How long a connection waits for the host's CNXN, and for the host to
/// close it once told to stop.
const GRACE: Duration = Duration::from_secs(10);

/// What a fleet's devices counted, since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// CNXNs answered: the first connection and every reconnection.
    Connections,
    OpensSent,
    /// OKAYs and CLSEs for streams that do not exist.
    StraySent,
    MalformedSent,
    WrtesSent,
    WrteBytesSent,
    /// The host's answers, by command.
    ClsesReceived,
    OkaysReceived,
    OpensReceived,
    OtherReceived,
    /// Shells the bench opened on the devices through the server.
    ShellsOpened,
    /// Loops that ended on their own bound, not at the phase's end.
    Bounded,
}

const COUNTS: usize = 12;

pub(crate) struct Counters {
    counts: [AtomicU64; COUNTS],
    epoch: std::time::Instant,
    /// When the last CNXN was answered, in ns since `epoch`.
    last_connection: AtomicU64,
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            counts: Default::default(),
            epoch: std::time::Instant::now(),
            last_connection: AtomicU64::new(0),
        }
    }
}

impl Counters {
    pub(crate) fn add(&self, count: Count, n: u64) {
        self.counts[count as usize].fetch_add(n, Ordering::Relaxed);
    }

    fn connected(&self) {
        self.add(Count::Connections, 1);
        let now = self.epoch.elapsed().as_nanos() as u64;
        self.last_connection.store(now, Ordering::Relaxed);
    }

    /// How long ago the last CNXN was answered.
    fn since_last_connection(&self) -> Duration {
        let last = Duration::from_nanos(self.last_connection.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    pub(crate) fn snapshot(&self) -> Counts {
        Counts(std::array::from_fn(|i| {
            self.counts[i].load(Ordering::Relaxed)
        }))
    }
}

/// A copy of [`Counters`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts([u64; COUNTS]);

impl Counts {
    pub(crate) fn get(&self, count: Count) -> u64 {
        self.0[count as usize]
    }

    /// What was counted between `before` and this snapshot.
    pub(crate) fn since(&self, before: &Counts) -> Counts {
        Counts(std::array::from_fn(|i| self.0[i] - before.0[i]))
    }

    pub(crate) fn add(&mut self, other: &Counts) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine += theirs;
        }
    }
}

/// `count` misbehaving devices of one kind, each on a listener of its own.
pub(crate) struct Fleet {
    pub(crate) kind: Kind,
    pub(crate) ports: Vec<u16>,
    pub(crate) counters: Arc<Counters>,
    phase: watch::Sender<Phase>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    runtime: tokio::runtime::Handle,
    /// The adb server the devices are connected to (credit-flood's shells).
    server: std::net::SocketAddr,
    deadline: Instant,
}

impl Fleet {
    /// Listens for `count` devices; every loop of theirs ends by `limit`.
    pub(crate) fn start(
        runtime: &tokio::runtime::Handle,
        kind: Kind,
        count: usize,
        limit: Duration,
        server: std::net::SocketAddr,
    ) -> Result<Fleet> {
        let (phase, _) = watch::channel(Phase::Behave);
        let counters = Arc::new(Counters::default());
        let deadline = Instant::now() + limit;
        let mut ports = Vec::new();
        let mut tasks = Vec::new();
        for i in 0..count {
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            listener.set_nonblocking(true)?;
            ports.push(listener.local_addr()?.port());
            let device = Device {
                kind,
                phase: phase.subscribe(),
                counters: counters.clone(),
                deadline,
                stagger: match kind {
                    Kind::Reconnect => stagger(i, count),
                    _ => Duration::ZERO,
                },
            };
            tasks.push(runtime.spawn(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => device.listen(listener).await,
                    Err(error) => eprintln!("hostile device: listener: {error}"),
                }
            }));
        }
        Ok(Fleet {
            kind,
            ports,
            counters,
            phase,
            tasks,
            runtime: runtime.clone(),
            server,
            deadline,
        })
    }

    /// Every device misbehaves from now on. For credit-flood the bench
    /// opens shells on them through the server, which the floods answer.
    pub(crate) fn misbehave(&mut self) {
        self.phase.send_replace(Phase::Misbehave);
        if self.kind != Kind::CreditFlood {
            return;
        }
        for (i, port) in self.ports.iter().enumerate() {
            self.tasks.push(self.runtime.spawn(keep_opening_shells(
                self.server,
                format!("127.0.0.1:{port}"),
                self.counters.clone(),
                stagger(i, self.ports.len()),
                self.deadline,
                self.phase.subscribe(),
            )));
        }
    }

    /// How long until the fleet's next misbehaviour, for the kinds that
    /// misbehave once per connection: the host reconnects 3 s after it
    /// dropped a connection, each device misbehaves as soon as it is
    /// connected again, and the fleet's devices are spread over those 3 s.
    /// `None` for the floods, which never pause.
    pub(crate) fn next_misbehaviour_in(&self) -> Option<Duration> {
        match self.kind {
            Kind::OpenFlood | Kind::StrayFlood => None,
            Kind::Reconnect | Kind::CreditFlood => {
                let spacing = RECONNECT_INTERVAL / self.ports.len().max(1) as u32;
                Some(spacing.saturating_sub(self.counters.since_last_connection()))
            }
        }
    }

    /// Stops sending; what is still connected ends when the host closes it
    /// (or after [`GRACE`]).
    pub(crate) fn stop(&self) {
        self.phase.send_replace(Phase::Stop);
    }

    /// Waits for every device of the fleet to end, at most `limit`; the
    /// rest are aborted.
    pub(crate) fn finish(mut self, limit: Duration) {
        self.stop();
        let tasks = std::mem::take(&mut self.tasks);
        let aborts: Vec<_> = tasks.iter().map(|t| t.abort_handle()).collect();
        let _ = self.runtime.block_on(async {
            tokio::time::timeout(limit, async {
                for task in tasks {
                    let _ = task.await;
                }
            })
            .await
        });
        for abort in aborts {
            abort.abort();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.phase.send_replace(Phase::Stop);
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Between a dropped connection and the host's next attempt (AOSP
/// `transport.cpp` ReconnectHandler, as `oxadb server` does).
const RECONNECT_INTERVAL: Duration = Duration::from_secs(3);

/// Device `i` of `n`'s share of the 3 s between reconnections, so that a
/// fleet's reconnections (and credit floods, one per reconnection) are
/// spread over the interval rather than all at once.
fn stagger(i: usize, n: usize) -> Duration {
    RECONNECT_INTERVAL * i as u32 / n.max(1) as u32
}

/// One misbehaving device: its listener and every connection made to it.
struct Device {
    kind: Kind,
    phase: watch::Receiver<Phase>,
    counters: Arc<Counters>,
    deadline: Instant,
    stagger: Duration,
}

impl Device {
    async fn listen(self, listener: TcpListener) {
        let mut connections = JoinSet::new();
        let mut accepted = 0u64;
        let mut stop = self.phase.clone();
        loop {
            tokio::select! {
                result = listener.accept() => {
                    let Ok((socket, _)) = result else { continue };
                    accepted += 1;
                    if accepted > MAX_CONNECTIONS {
                        self.counters.add(Count::Bounded, 1);
                        break;
                    }
                    // Only the first connection waits its share of the
                    // interval; reconnections keep the offset it gave.
                    let stagger = if accepted == 1 { self.stagger } else { Duration::ZERO };
                    let connection = Connection {
                        kind: self.kind,
                        phase: self.phase.clone(),
                        counters: self.counters.clone(),
                        deadline: self.deadline,
                        stagger,
                    };
                    connections.spawn(async move {
                        if let Err(error) = connection.serve(socket).await {
                            log_unexpected(&error);
                        }
                    });
                }
                _ = stop.wait_for(|p| *p == Phase::Stop) => break,
                () = tokio::time::sleep_until(self.deadline) => {
                    self.counters.add(Count::Bounded, 1);
                    break;
                }
            }
        }
        drop(listener);
        // Connections end once the host closes them; none outlives GRACE.
        let _ = tokio::time::timeout(GRACE, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        connections.abort_all();
    }
}

/// Most hostile connections end in an error, the host closing them; only
/// other errors are worth a line.
fn log_unexpected(error: &std::io::Error) {
    use std::io::ErrorKind::*;
    if !matches!(
        error.kind(),
        ConnectionReset | BrokenPipe | UnexpectedEof | TimedOut
    ) {
        eprintln!("hostile device: {error}");
    }
}

struct Connection {
    kind: Kind,
    phase: watch::Receiver<Phase>,
    counters: Arc<Counters>,
    deadline: Instant,
    stagger: Duration,
}

impl Connection {
    async fn serve(mut self, socket: TcpStream) -> std::io::Result<()> {
        socket.set_nodelay(true)?;
        let (read, mut write) = socket.into_split();
        let mut read = BufReader::with_capacity(64 << 10, read);
        // The host speaks first and the device answers its CNXN with its
        // own (AOSP `adb.cpp` handle_new_connection, send_connect).
        tokio::time::timeout(GRACE, async {
            loop {
                let (header, _) = read_packet(&mut read).await?;
                if header.command == Command::Cnxn {
                    return Ok::<_, std::io::Error>(());
                }
            }
        })
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)??;
        write.write_all(&device_cnxn(self.kind)).await?;
        self.counters.connected();
        // The host's packets are read and counted all along, so that its
        // answers never back up; OPENs go to the credit flood.
        let (opens, mut opened) = mpsc::channel(16);
        let reader = tokio::spawn(count_packets(
            read,
            self.counters.clone(),
            opens,
            self.deadline,
        ));
        let result = self.misbehave(&mut write, &mut opened).await;
        // Stay connected until the host closes the connection, within GRACE.
        let _ = tokio::time::timeout(GRACE, reader).await;
        result
    }

    /// Waits for the phase to allow misbehaving; false when it ended first.
    async fn wait_for_misbehaving(&mut self) -> bool {
        let phase = self
            .phase
            .wait_for(|p| *p != Phase::Behave)
            .await
            .map_or(Phase::Stop, |p| *p);
        phase == Phase::Misbehave
    }

    fn going_on(&self, sent: u64) -> bool {
        if sent >= MAX_PACKETS || Instant::now() >= self.deadline {
            self.counters.add(Count::Bounded, 1);
            return false;
        }
        *self.phase.borrow() == Phase::Misbehave
    }

    async fn misbehave(
        &mut self,
        write: &mut OwnedWriteHalf,
        opened: &mut mpsc::Receiver<(u32, u32)>,
    ) -> std::io::Result<()> {
        if !self.wait_for_misbehaving().await {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(self.stagger) => {}
            _ = self.phase.wait_for(|p| *p == Phase::Stop) => return Ok(()),
        }
        match self.kind {
            Kind::OpenFlood => self.open_flood(write).await,
            Kind::StrayFlood => self.stray_flood(write).await,
            Kind::Reconnect => {
                // A header whose magic is not its command's complement:
                // the host must drop the connection (AOSP `transport.cpp`
                // check_header), and reconnects 3 s later (ReconnectHandler).
                let mut raw = Header {
                    command: Command::Okay,
                    arg0: 1,
                    arg1: 1,
                    data_length: 0,
                    data_crc32: 0,
                }
                .encode();
                raw[HEADER_LEN - 4..].copy_from_slice(&0u32.to_le_bytes());
                write.write_all(&raw).await?;
                self.counters.add(Count::MalformedSent, 1);
                Ok(())
            }
            Kind::CreditFlood => loop {
                let open = tokio::select! {
                    open = opened.recv() => open,
                    _ = self.phase.wait_for(|p| *p == Phase::Stop) => None,
                };
                let Some((remote, credit)) = open else {
                    return Ok(());
                };
                self.credit_flood(write, remote, credit).await?;
            },
        }
    }

    /// OPENs for services the host never asked for, from every family a
    /// reverse forward could name and some no one has heard of. Under
    /// delayed_ack an OPEN's arg1 is the opener's credit (AOSP `sockets.cpp`
    /// connect_to_remote); a mismatch would be refused for that instead.
    async fn open_flood(&mut self, write: &mut OwnedWriteHalf) -> std::io::Result<()> {
        // Ports and paths nothing serves, should a host connect after all.
        let services: [&[u8]; 6] = [
            b"tcp:1\0",
            b"tcp:127.0.0.1:1\0",
            b"localfilesystem:/nonexistent/oxadb-bench\0",
            b"localabstract:oxadb-bench-nonexistent\0",
            b"frobnicate:now\0",
            b"jdwp:1\0",
        ];
        let mut next_id = 1u32;
        let mut sent = 0u64;
        let mut batch = Vec::with_capacity(BATCH * 64);
        while self.going_on(sent) {
            batch.clear();
            for i in 0..BATCH {
                let service = services[i % services.len()];
                push_packet(&mut batch, Command::Open, next_id, 256 << 10, service);
                next_id = next_id.checked_add(1).unwrap_or(1);
            }
            if !self.write_or_stop(write, &batch).await? {
                break;
            }
            sent += BATCH as u64;
            self.counters.add(Count::OpensSent, BATCH as u64);
        }
        Ok(())
    }

    /// OKAYs naming local id 0, which no stream has, and CLSEs naming ids
    /// the host never allocated: both ignored. (An OKAY naming a nonzero
    /// id never allocated is a protocol error that ends the connection,
    /// docs/protocol.md "Streams": the `reconnect` kind's case.)
    async fn stray_flood(&mut self, write: &mut OwnedWriteHalf) -> std::io::Result<()> {
        let credit = (MAX_PAYLOAD as i32).to_le_bytes();
        let mut id = 1u32;
        let mut sent = 0u64;
        let mut batch = Vec::with_capacity(BATCH * HEADER_LEN + BATCH * 2);
        while self.going_on(sent) {
            batch.clear();
            for _ in 0..BATCH / 2 {
                push_packet(&mut batch, Command::Okay, id, 0, &credit);
                push_packet(&mut batch, Command::Clse, id, id | 0x4000_0000, b"");
                id = (id % 0x3fff_ffff) + 1;
            }
            if !self.write_or_stop(write, &batch).await? {
                break;
            }
            sent += BATCH as u64;
            self.counters.add(Count::StraySent, BATCH as u64);
        }
        Ok(())
    }

    /// Accepts the host's OPEN (granting it credit in the OKAY's payload,
    /// AOSP `adb.cpp` handle_packet A_OPEN) and writes WRTEs until it has
    /// sent [`BEYOND_CREDIT`] more than the host's grant in the OPEN.
    async fn credit_flood(
        &mut self,
        write: &mut OwnedWriteHalf,
        remote: u32,
        credit: u32,
    ) -> std::io::Result<()> {
        const LOCAL: u32 = 1;
        let grant = (MAX_PAYLOAD as i32).to_le_bytes();
        let mut okay = Vec::new();
        push_packet(&mut okay, Command::Okay, LOCAL, remote, &grant);
        write.write_all(&okay).await?;
        // One packet, written again and again: the ids never change.
        let mut wrte = Vec::new();
        push_packet(
            &mut wrte,
            Command::Wrte,
            LOCAL,
            remote,
            &vec![0x5a; 256 << 10],
        );
        let payload = (wrte.len() - HEADER_LEN) as u64;
        let limit = u64::from(credit) + BEYOND_CREDIT;
        let mut sent = 0u64;
        let mut packets = 0u64;
        while sent < limit && self.going_on(packets) {
            if !self.write_or_stop(write, &wrte).await? {
                break;
            }
            sent += payload;
            packets += 1;
            self.counters.add(Count::WrtesSent, 1);
            self.counters.add(Count::WrteBytesSent, payload);
        }
        Ok(())
    }

    /// Writes `bytes` unless the phase ends first; false if it did.
    async fn write_or_stop(
        &mut self,
        write: &mut OwnedWriteHalf,
        bytes: &[u8],
    ) -> std::io::Result<bool> {
        tokio::select! {
            result = write.write_all(bytes) => result.map(|()| true),
            _ = self.phase.wait_for(|p| *p == Phase::Stop) => Ok(false),
            () = tokio::time::sleep_until(self.deadline) => Ok(false),
        }
    }
}

/// Appends one packet, header and payload, to `out`.
fn push_packet(out: &mut Vec<u8>, command: Command, arg0: u32, arg1: u32, payload: &[u8]) {
    let header = Header {
        command,
        arg0,
        arg1,
        data_length: payload.len() as u32,
        data_crc32: 0,
    };
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
}

/// The device's CNXN: the version without checksums, adb's largest
/// payload and a banner offering delayed_ack (AOSP `adb.cpp` send_connect).
fn device_cnxn(kind: Kind) -> Vec<u8> {
    let mut banner = Banner::new("device");
    banner.properties = vec![
        ("ro.product.name".into(), "oxadb-bench".into()),
        ("ro.product.model".into(), kind.name().into()),
        ("ro.product.device".into(), "hostile".into()),
    ];
    banner.features = ["shell_v2", "cmd", "delayed_ack"]
        .iter()
        .map(|f| f.to_string())
        .collect();
    Packet::new(
        Command::Cnxn,
        VERSION_SKIP_CHECKSUM,
        MAX_PAYLOAD,
        banner.encode().into_bytes(),
    )
    .to_bytes(false)
    .to_vec()
}

async fn read_packet<R: AsyncRead + Unpin>(read: &mut R) -> std::io::Result<(Header, Vec<u8>)> {
    let mut raw = [0u8; HEADER_LEN];
    read.read_exact(&mut raw).await?;
    let header = Header::decode(&raw, MAX_PAYLOAD)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let mut payload = vec![0u8; header.data_length as usize];
    read.read_exact(&mut payload).await?;
    Ok((header, payload))
}

/// Reads the host's packets until it closes the connection (or the
/// fleet's deadline), counting them; OPENs (remote id, credit) are passed
/// on. Parsed from large reads, not read packet by packet: the host's
/// answers to a flood are as many packets as the flood.
async fn count_packets<R: AsyncRead + Unpin>(
    mut read: R,
    counters: Arc<Counters>,
    opens: mpsc::Sender<(u32, u32)>,
    deadline: Instant,
) {
    let mut buf = vec![0u8; 256 << 10];
    let mut filled = 0;
    // Payload bytes of the last packet still to come.
    let mut skip = 0usize;
    loop {
        let n = tokio::select! {
            result = read.read(&mut buf[filled..]) => match result {
                Ok(n) if n > 0 => n,
                _ => return,
            },
            () = tokio::time::sleep_until(deadline) => {
                counters.add(Count::Bounded, 1);
                return;
            }
        };
        filled += n;
        let mut at = skip.min(filled);
        skip -= at;
        while skip == 0 && filled - at >= HEADER_LEN {
            let raw: &[u8; HEADER_LEN] = buf[at..at + HEADER_LEN].try_into().expect("a header");
            let Ok(header) = Header::decode(raw, MAX_PAYLOAD) else {
                return;
            };
            at += HEADER_LEN;
            let count = match header.command {
                Command::Clse => Count::ClsesReceived,
                Command::Okay => Count::OkaysReceived,
                Command::Open => {
                    let _ = opens.try_send((header.arg0, header.arg1));
                    Count::OpensReceived
                }
                _ => Count::OtherReceived,
            };
            counters.add(count, 1);
            let length = header.data_length as usize;
            let here = length.min(filled - at);
            at += here;
            skip = length - here;
        }
        buf.copy_within(at..filled, 0);
        filled -= at;
    }
}

/// Opens `shell:true` on the credit-flooding device `serial` through the
/// server at `server` again and again while it is online, each time
/// reading what the server relays until it closes; bounded in attempts and
/// by `deadline`, and ended with the phase. The first attempt waits
/// `stagger`.
async fn keep_opening_shells(
    server: std::net::SocketAddr,
    serial: String,
    counters: Arc<Counters>,
    stagger: Duration,
    deadline: Instant,
    mut phase: watch::Receiver<Phase>,
) {
    const ATTEMPTS: u32 = 10_000;
    // While the device is offline (3 s after each flood), tries every
    // 100 ms: the flood follows its reconnection closely.
    const RETRY: Duration = Duration::from_millis(100);
    let server = oxadb::host_client::HostServer::new(server);
    let selector = oxadb::host_client::Selector::Serial(serial);
    let opening = async {
        tokio::time::sleep(stagger).await;
        for _ in 0..ATTEMPTS {
            if let Ok(mut stream) = server.open(&selector, "shell:true").await {
                counters.add(Count::ShellsOpened, 1);
                let mut sink = vec![0u8; 256 << 10];
                let _ = tokio::time::timeout(GRACE, async {
                    while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                })
                .await;
            }
            tokio::time::sleep(RETRY).await;
        }
        counters.add(Count::Bounded, 1);
    };
    tokio::select! {
        () = opening => {}
        _ = phase.wait_for(|p| *p == Phase::Stop) => {}
        () = tokio::time::sleep_until(deadline) => counters.add(Count::Bounded, 1),
    }
}
