//! The handshake's deadlines as hosts see them, on real sockets and the fake
//! USB function: over TCP a host has `handshake_timeout` from accept to send
//! CNXN and `auth_timeout` from accept to authenticate; over USB CNXN has no
//! deadline and `auth_timeout` counts from the host's CNXN
//! (docs/security.md, "Limits"). Each timeout is logged once, in the words
//! and fields operators grep for.

use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use oxadb_engine::{Config, Role};
use oxadb_ffs::fake::FakeGadget;
use oxadb_ffs::Event;
use oxadb_io::{Auth, Connection, StreamSink};
use oxadb_wire::packet::VERSION_SKIP_CHECKSUM;
use oxadb_wire::{Banner, Command, Packet, MAX_PAYLOAD};
use oxadbd::config::{parse_listen, Access, AccessFlags, BudgetLimits, DaemonConfig, FileConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Everything the tests' daemons log, as the daemon's own log shows it.
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_log() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(|| LogWriter)
            .init()
    });
}

/// The lines logged so far about connections whose log names `peer`
/// (the tests run at once, each with its own peers).
fn log_lines(peer: &str) -> Vec<String> {
    String::from_utf8_lossy(&LOG.lock().unwrap())
        .lines()
        .filter(|line| line.contains(peer))
        .map(str::to_string)
        .collect()
}

/// The one "closing connection" line about `peer`, which must say `what`
/// with `timeout_s`.
fn assert_logged_once(peer: &str, what: &str, timeout_s: u64) {
    let closing: Vec<String> = log_lines(peer)
        .into_iter()
        .filter(|line| line.contains("closing connection"))
        .collect();
    assert_eq!(closing.len(), 1, "{closing:#?}");
    assert!(
        closing[0].contains(&format!("closing connection: {what}"))
            && closing[0].contains(&format!("timeout_s={timeout_s}"))
            && closing[0].contains("WARN"),
        "{closing:#?}"
    );
}

/// A daemon that asks every host for a key, with the given deadlines.
fn daemon_config(handshake_timeout: Duration, auth_timeout: Duration) -> DaemonConfig {
    let listen = parse_listen("127.0.0.1:0").unwrap();
    let mut access = Access::resolve(
        listen,
        &AccessFlags {
            auth: Some(true),
            usb: true,
            ..AccessFlags::default()
        },
        &FileConfig::default(),
    )
    .unwrap();
    access.handshake_timeout = handshake_timeout;
    access.auth_timeout = auth_timeout;
    DaemonConfig {
        memory_budget: BudgetLimits::from_limit(64 << 20),
        access,
        ..DaemonConfig::with_defaults(listen).unwrap()
    }
}

async fn serve_tcp(config: DaemonConfig) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let daemon = oxadbd::server::Daemon::new(config, None);
    let server = tokio::spawn(async move {
        let _ = oxadbd::server::serve_tcp(listener, daemon).await;
    });
    (address, server)
}

fn cnxn() -> Vec<u8> {
    let packet = Packet::new(
        Command::Cnxn,
        VERSION_SKIP_CHECKSUM,
        MAX_PAYLOAD,
        b"host::features=shell_v2,sendrecv_v2\0".to_vec(),
    );
    let mut bytes = packet.header(true).encode().to_vec();
    bytes.extend_from_slice(&packet.payload);
    bytes
}

/// Reads (and drops) what the daemon sends until it closes the socket;
/// whether it sent anything.
async fn read_until_closed(socket: &mut tokio::net::TcpStream) -> bool {
    let mut got = false;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(20), socket.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return got,
            Ok(Ok(_)) => got = true,
            Err(_) => panic!("the daemon kept the connection open for 20 s"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_host_without_cnxn_is_closed_at_the_handshake_timeout() {
    capture_log();
    let (address, server) = serve_tcp(daemon_config(
        Duration::from_millis(800),
        Duration::from_secs(60),
    ))
    .await;
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let connected = Instant::now();
    assert!(!read_until_closed(&mut socket).await, "nothing was sent");
    let after = connected.elapsed();
    // The upper bound only tells the deadline from the 60 s auth limit: a
    // loaded 2-core runner may be seconds late.
    assert!(
        after >= Duration::from_millis(700) && after < Duration::from_secs(30),
        "closed after {after:?}"
    );
    let peer = format!("peer={}", socket.local_addr().unwrap());
    assert_logged_once(&peer, "no CNXN in time", 0);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_host_that_never_authenticates_is_closed_at_the_auth_timeout_from_accept() {
    // CNXN well in time, 3 s after accept; authentication is due 4 s after
    // accept (7 s if it counted from CNXN, 14 s if it waited for the
    // handshake timeout first): margins of seconds for a loaded runner.
    capture_log();
    let (address, server) = serve_tcp(daemon_config(
        Duration::from_secs(10),
        Duration::from_secs(4),
    ))
    .await;
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let connected = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    socket.write_all(&cnxn()).await.unwrap();
    assert!(read_until_closed(&mut socket).await, "an AUTH token came");
    let after = connected.elapsed();
    assert!(
        after >= Duration::from_millis(3900) && after < Duration::from_millis(6500),
        "closed after {after:?}"
    );
    let peer = format!("peer={}", socket.local_addr().unwrap());
    assert_logged_once(&peer, "the host did not authenticate in time", 4);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_usb_cnxn_has_no_deadline_and_authentication_counts_from_it() {
    let handshake_timeout = Duration::from_millis(300);
    let auth_timeout = Duration::from_secs(1);
    capture_log();
    let daemon = oxadbd::server::Daemon::new(daemon_config(handshake_timeout, auth_timeout), None);
    let (gadget, mut control) = FakeGadget::new(None);
    let server = tokio::spawn(oxadbd::server::serve_usb(gadget, daemon));
    control.send(Event::Enable);
    let usb = control.next_usb().await.unwrap();
    // Far beyond both limits with no host: the connection waits.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(usb.endpoints_alive(), 2, "no deadline before CNXN");

    // A host without keys sends CNXN and is challenged, never let in.
    let (stream, _checker) = usb.attach_host(512, 5);
    let (reader, writer) = tokio::io::split(stream);
    let (host, run) = Connection::start(
        reader,
        StreamSink(writer),
        Config::new(Role::Host, Banner::new("host")),
        "host",
        Auth::None,
    );
    let sent_cnxn = Instant::now();
    tokio::spawn(run);
    while usb.endpoints_alive() > 0 {
        assert!(
            sent_cnxn.elapsed() < Duration::from_secs(10),
            "still open 10 s after CNXN"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = sent_cnxn.elapsed();
    assert!(
        after >= auth_timeout - Duration::from_millis(100) && after < Duration::from_secs(10),
        "closed {after:?} after CNXN"
    );
    assert!(host.peer().is_none(), "never connected");
    assert_logged_once("usb", "the host did not authenticate in time", 1);
    server.abort();
}
