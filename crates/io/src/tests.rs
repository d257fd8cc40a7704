//! Driver tests: a host engine and a device engine over real loopback TCP.

use super::*;
use bytes::Bytes;
use oxadb_engine::{Config, Role};
use oxadb_wire::{feature, Banner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A connection over a TCP stream, no authentication.
fn start_tcp(
    socket: TcpStream,
    config: Config,
) -> (
    Connection,
    impl std::future::Future<Output = ConnectionError>,
) {
    let (reader, sink, label) = tcp_halves(socket).unwrap();
    Connection::start(reader, sink, config, label, Auth::None)
}

fn config(role: Role, delayed_ack: bool) -> Config {
    let mut banner = Banner::new(if role == Role::Host { "host" } else { "device" });
    if delayed_ack {
        banner.features.push(feature::DELAYED_ACK.into());
    }
    Config::new(role, banner)
}

/// A device whose every stream echoes what it reads; returns its address.
async fn echo_device(delayed_ack: bool) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let (connection, run) = start_tcp(socket, config(Role::Device, delayed_ack));
            tokio::spawn(run);
            tokio::spawn(async move {
                while let Some(incoming) = connection.next_incoming().await {
                    if incoming.service() == "refuse:" {
                        incoming.refuse();
                        continue;
                    }
                    let mut stream = incoming.accept();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 100_000];
                        loop {
                            let n = stream.read(&mut buf).await.unwrap();
                            if n == 0 {
                                break;
                            }
                            stream.write_all(&buf[..n]).await.unwrap();
                        }
                    });
                }
            });
        }
    });
    addr
}

async fn host(addr: std::net::SocketAddr, delayed_ack: bool) -> Connection {
    let socket = TcpStream::connect(addr).await.unwrap();
    let (connection, run) = start_tcp(socket, config(Role::Host, delayed_ack));
    tokio::spawn(run);
    connection.connected().await.unwrap();
    connection
}

async fn echo_round_trip(connection: &Connection, len: usize, seed: u8) {
    let stream = connection.open("echo:").await.unwrap();
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let (mut reader, mut writer) = tokio::io::split(stream);
    let expected = data.clone();
    let send = tokio::spawn(async move {
        writer.write_all(&data).await.unwrap();
        writer
    });
    let mut got = vec![0u8; len];
    reader.read_exact(&mut got).await.unwrap();
    assert!(got == expected, "echoed bytes differ");
    drop(send.await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_echo_in_both_modes() {
    for delayed_ack in [false, true] {
        let addr = echo_device(true).await;
        let connection = host(addr, delayed_ack).await;
        assert_eq!(connection.peer().unwrap().delayed_ack, delayed_ack);
        echo_round_trip(&connection, 8 * 1024 * 1024 + 3, 1).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_streams() {
    let addr = echo_device(true).await;
    let connection = host(addr, true).await;
    let tasks: Vec<_> = (0..32u8)
        .map(|i| {
            let connection = connection.clone();
            tokio::spawn(async move { echo_round_trip(&connection, 300_000 + i as usize, i).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_open_is_an_error() {
    let addr = echo_device(false).await;
    let connection = host(addr, false).await;
    let error = match connection.open("refuse:").await {
        Err(error) => error,
        Ok(_) => panic!("open of a refused service succeeded"),
    };
    assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused);
    echo_round_trip(&connection, 10, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_magic_ends_only_that_connection() {
    let addr = echo_device(true).await;
    let good = host(addr, true).await;
    let mut bad = TcpStream::connect(addr).await.unwrap();
    bad.write_all(&[0x55u8; 24]).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), bad.read(&mut buf))
        .await
        .expect("device did not close the bad connection")
        .unwrap_or(0);
    assert_eq!(n, 0);
    echo_round_trip(&good, 1000, 9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_chunks_flow_under_credit() {
    // Chunks shorter than a packet (one WRTE each) and close to a packet.
    for (delayed_ack, chunk_len, chunks) in [
        (true, 64 * 1024, 2000),
        (false, 64 * 1024, 500),
        (true, 15 * (65536 + 8), 300),
        (false, 15 * (65536 + 8), 100),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let device = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let (connection, run) = start_tcp(socket, config(Role::Device, delayed_ack));
            tokio::spawn(run);
            let mut stream = connection.next_incoming().await.unwrap().accept();
            for i in 0..chunks {
                let chunk = Bytes::from(vec![i as u8; chunk_len]);
                tokio::time::timeout(std::time::Duration::from_secs(5), stream.write_chunk(chunk))
                    .await
                    .unwrap_or_else(|_| panic!("write_chunk {i} stalled"))
                    .unwrap();
            }
            stream.write_all(b"end").await.unwrap();
        });
        let connection = host(addr, delayed_ack).await;
        let stream = connection.open("source:").await.unwrap();
        let mut total = 0usize;
        while let Some(chunk) = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            stream.read_chunk(64 * 1024),
        )
        .await
        .expect("read stalled")
        .unwrap()
        {
            total += chunk.len();
        }
        assert_eq!(total, chunk_len * chunks + 3);
        device.await.unwrap();
    }
}

/// Everything a connection holds is charged to the memory budget: what its
/// stream received and nobody read (beyond a window's worth: the floor and
/// the sender's overshoot too), and its read buffer; all of it comes back
/// when the connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_is_charged_unread_data_and_the_read_buffer() {
    use std::time::{Duration, Instant};
    let budget = std::sync::Arc::new(oxadb_engine::MemoryBudget::new(
        oxadb_engine::BudgetLimits::from_limit(64 << 20),
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let device_budget = budget.clone();
    let device = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let mut config = config(Role::Device, true);
        config.memory_budget = Some(device_budget);
        let (connection, run) = start_tcp(socket, config);
        let run = tokio::spawn(run);
        // Accepted and never read.
        let stream = connection.next_incoming().await.unwrap().accept();
        (connection, stream, run)
    });
    let connection = host(addr, true).await;
    let mut stream = connection.open("sink:").await.unwrap();
    let (device_connection, device_stream, device_run) = device.await.unwrap();
    let writer = tokio::spawn(async move {
        let _ = stream.write_all(&vec![7u8; 8 << 20]).await;
        stream
    });
    // Wait for arrivals to stop: the window is full.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut received = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = device_stream.stats().unwrap().bytes_received;
        if now == received && now > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "data kept arriving: {now} bytes");
        received = now;
    }
    let committed = budget.committed();
    assert!(
        committed >= received + crate::driver::READ_CHUNK as u64,
        "{committed} bytes charged for {received} unread and a read buffer"
    );
    assert!(
        received >= 2 << 20,
        "{received} bytes arrived; the opening window is two packets"
    );
    drop(device_stream);
    device_connection.close();
    connection.close();
    let _ = device_run.await;
    drop(writer.await.unwrap());
    assert_eq!(budget.committed(), 0, "everything charged came back");
}

/// How late the driver may act on the engine's deadlines: tokio's timer
/// rounds up to a millisecond, and the machine may be loaded. A check on a
/// fixed period of a second would miss it.
const TIMER_MARGIN: std::time::Duration = std::time::Duration::from_millis(150);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_stalled_on_credit_is_closed_at_the_limit() {
    use std::time::{Duration, Instant};
    let limit = Duration::from_millis(400);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let device = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let mut config = config(Role::Device, true);
        config.stalled_stream_timeout = Some(limit);
        let (connection, run) = start_tcp(socket, config);
        tokio::spawn(run);
        let mut stream = connection.next_incoming().await.unwrap().accept();
        // More than the host's opening window (two packets): the rest waits
        // for credit the host never grants, from a moment after the start.
        let started = Instant::now();
        let error = stream
            .write_all(&vec![7u8; 16 << 20])
            .await
            .expect_err("the write outlived its stream");
        (started.elapsed(), error, stream.stats(), connection)
    });
    let connection = host(addr, true).await;
    let mut stream = connection.open("source:").await.unwrap();
    let (stalled_for, error, stats, device_connection) = device.await.unwrap();
    assert!(
        stalled_for >= limit && stalled_for < limit + TIMER_MARGIN,
        "closed after {stalled_for:?}, the limit is {limit:?}"
    );
    assert_eq!(error.kind(), io::ErrorKind::BrokenPipe, "{error}");
    assert_eq!(stats, None, "the stream is gone");
    // The host got the CLSE: what arrived, then the end.
    let mut received = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut received))
        .await
        .expect("no CLSE reached the host")
        .unwrap();
    assert!(received.len() >= 1 << 20 && received.len() < 16 << 20);
    assert!(received.iter().all(|&b| b == 7));
    assert!(
        device_connection.closed().is_none(),
        "the connection goes on"
    );
    assert!(connection.closed().is_none());
}

/// Refuses every signature, asking for a delay from the second on.
struct Refuser;

const RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(300);

impl Authenticator for Refuser {
    fn token(&self) -> Bytes {
        Bytes::from_static(&[9; 20])
    }
    fn verify(&self, _: &str, _: &[u8], _: &[u8]) -> bool {
        false
    }
    fn offer_key(&self, _: &str, _: &[u8]) -> bool {
        false
    }
    fn retry_delay(&self, failures: u32) -> std::time::Duration {
        if failures >= 2 {
            RETRY_DELAY
        } else {
            std::time::Duration::ZERO
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_signature_gets_the_next_token_after_the_delay() {
    use std::time::Instant;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let device = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let mut config = config(Role::Device, true);
        config.require_auth = true;
        let (reader, sink, label) = tcp_halves(socket).unwrap();
        let (connection, run) =
            Connection::start(reader, sink, config, label, Auth::Device(Arc::new(Refuser)));
        tokio::spawn(run);
        connection
    });
    // The host signs three tokens, then has nothing left to offer.
    let (arrivals_tx, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    let responder: AuthResponder = Box::new(move |_token, attempt| {
        arrivals_tx.send((attempt, Instant::now())).unwrap();
        (attempt <= 3).then(|| AuthReply::Signature(Bytes::from_static(b"sig")))
    });
    let (reader, sink, label) = tcp_halves(TcpStream::connect(addr).await.unwrap()).unwrap();
    let (connection, run) = Connection::start(
        reader,
        sink,
        config(Role::Host, true),
        label,
        Auth::Host(responder),
    );
    tokio::spawn(run);
    let device = device.await.unwrap();
    let mut times = Vec::new();
    for expected in 1..=4 {
        let (attempt, at) =
            tokio::time::timeout(std::time::Duration::from_secs(5), arrivals.recv())
                .await
                .expect("no token came")
                .unwrap();
        assert_eq!(attempt, expected);
        times.push(at);
    }
    // One refusal without a delay, then two with.
    assert!(
        times[1] - times[0] < TIMER_MARGIN,
        "{:?}",
        times[1] - times[0]
    );
    for pair in times[1..].windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= RETRY_DELAY && gap < RETRY_DELAY + TIMER_MARGIN,
            "a token {gap:?} after the refusal, the delay is {RETRY_DELAY:?}"
        );
    }
    assert!(connection.awaiting_authorization());
    assert!(device.awaiting_auth());
}

#[test]
fn sizes_take_binary_suffixes() {
    assert_eq!(parse_size("65536"), Ok(65536));
    assert_eq!(parse_size("64K"), Ok(64 << 10));
    assert_eq!(parse_size("64M"), Ok(64 << 20));
    assert_eq!(parse_size("2GiB"), Ok(2 << 30));
    assert!(parse_size("12X").unwrap_err().contains("unit"));
    assert!(parse_size("").is_err());
}

#[test]
fn sizes_print_in_binary_units() {
    assert_eq!(format_size(67_108_864), "64 MiB");
    assert_eq!(format_size(3 << 29), "1.5 GiB");
    assert_eq!(format_size(512 << 10), "512 KiB");
    assert_eq!(format_size(1023), "1023 B");
    assert_eq!(format_size(0), "0 B");
    assert_eq!(format_size(1536), "1.5 KiB");
}

#[tokio::test]
async fn a_connection_reports_reads_and_writes_only_to_the_activity_it_was_given() {
    let addr = echo_device(false).await;
    let connection = host(addr, false).await;
    let activity = Activity::default();
    let other = Activity::default();
    echo_round_trip(&connection, 1000, 1).await;
    assert_eq!(activity.count(), 0, "nothing reported before it was asked");
    connection.report_activity_to(&activity);
    connection.report_activity_to(&other);
    echo_round_trip(&connection, 1000, 2).await;
    // At least the echo's request written and its reply read.
    assert!(activity.count() >= 2, "{}", activity.count());
    assert_eq!(other.count(), 0, "the first activity given stays");
}
