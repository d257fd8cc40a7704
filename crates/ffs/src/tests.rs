//! The transfer logic and the connection lifecycle over in-memory endpoints.

use std::time::Duration;

use bytes::Bytes;
use oxadb_engine::{Config, Role};
use oxadb_io::{Auth, Connection, OutgoingPacket, PacketSink, StreamSink};
use oxadb_wire::{feature, Banner, Command, Packet};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::bulk::{bulk_pair, READ_DEPTH, WRITE_DEPTH, WRITE_SIZE};
use crate::fake::{FakeGadget, FakeUsb};
use crate::{serve, Event};

const ESHUTDOWN: i32 = libc::ESHUTDOWN;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

fn packet(payload_len: usize, seed: u8) -> OutgoingPacket {
    let packet = Packet::new(Command::Wrte, 1, 2, pattern(payload_len, seed));
    OutgoingPacket {
        header: packet.header(false).encode(),
        payload: packet.payload.into(),
    }
}

/// Takes `count` bulk-in transfers as the host.
async fn take(usb: &FakeUsb, count: usize) -> Vec<Bytes> {
    let mut transfers = Vec::new();
    for _ in 0..count {
        transfers.push(usb.receive().await.expect("a transfer"));
    }
    transfers
}

#[tokio::test]
async fn a_packet_is_a_header_transfer_then_payload_transfers() {
    let usb = FakeUsb::new();
    let (bulk_out, bulk_in) = usb.endpoints();
    let (_reader, mut sink) = bulk_pair(bulk_out, bulk_in);
    let lengths = [0usize, 1, 24, 1024, 16_384, 16_385, 40_000, 1 << 20];
    let mut batch: Vec<_> = lengths
        .iter()
        .enumerate()
        .map(|(i, &len)| packet(len, i as u8))
        .collect();
    let expected: Vec<(Vec<u8>, Vec<u8>)> = batch
        .iter()
        .map(|p| (p.header.to_vec(), p.payload.as_bytes().unwrap().to_vec()))
        .collect();
    let host = {
        let usb = usb.clone();
        tokio::spawn(async move {
            let mut shapes = Vec::new();
            for (header, payload) in expected {
                let got = take(&usb, 1).await;
                assert_eq!(got[0][..], header[..], "the header is one transfer");
                let mut sizes = Vec::new();
                let mut received = Vec::new();
                while received.len() < payload.len() {
                    let transfer = take(&usb, 1).await.remove(0);
                    sizes.push(transfer.len());
                    received.extend_from_slice(&transfer);
                }
                assert!(received == payload, "payload bytes differ");
                shapes.push(sizes);
            }
            shapes
        })
    };
    sink.write_packets(&mut batch).await.unwrap();
    assert!(batch.is_empty());
    let shapes = host.await.unwrap();
    let full = WRITE_SIZE;
    assert_eq!(
        shapes,
        vec![
            vec![],
            vec![1],
            vec![24],
            vec![1024],
            vec![full],
            vec![full, 1],
            vec![full, full, 40_000 - 2 * full],
            vec![full; (1 << 20) / full],
        ]
    );
    // Nothing else was sent: in particular no zero-length packets.
    assert_eq!(
        usb.transfers_in(),
        lengths.len() + shapes.iter().flatten().count()
    );
    assert!(usb.max_writes_in_flight() <= WRITE_DEPTH);
    assert_eq!(usb.max_writes_in_flight(), WRITE_DEPTH, "the queue is used");
}

#[tokio::test]
async fn the_reader_reassembles_any_transfer_boundaries_in_order() {
    for seed in 0..8u64 {
        let usb = FakeUsb::new();
        usb.shuffle_completions(seed);
        let (bulk_out, bulk_in) = usb.endpoints();
        let (mut reader, _sink) = bulk_pair(bulk_out, bulk_in);
        let data = pattern(300_000, seed as u8);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut at = 0;
        // A halt cleared before any data cancels queued reads with EPIPE.
        usb.send(Vec::new());
        while at < data.len() {
            let len = rng.random_range(1..40_000).min(data.len() - at);
            usb.send(data[at..at + len].to_vec());
            if oxadb_wire::usb::host_needs_zlp(len, 512) {
                usb.send(Vec::new());
            }
            at += len;
        }
        let mut got = Vec::new();
        while got.len() < data.len() {
            let mut buffer = vec![0u8; rng.random_range(1..100_000)];
            let n = reader.read(&mut buffer).await.unwrap();
            assert!(n > 0, "a ZLP is not an EOF");
            got.extend_from_slice(&buffer[..n]);
        }
        assert!(got == data, "seed {seed}: bytes differ or are out of order");
    }
}

#[tokio::test]
async fn a_disabled_endpoint_fails_both_directions_naming_the_file() {
    let usb = FakeUsb::new();
    let (bulk_out, bulk_in) = usb.endpoints();
    let (mut reader, mut sink) = bulk_pair(bulk_out, bulk_in);
    usb.send(b"abc".to_vec());
    let mut buffer = [0u8; 16];
    assert_eq!(reader.read(&mut buffer).await.unwrap(), 3);
    // Fill the bulk-in queue, then the host goes away.
    let mut batch: Vec<_> = (0..WRITE_DEPTH).map(|i| packet(0, i as u8)).collect();
    sink.write_packets(&mut batch).await.unwrap();
    usb.fail(ESHUTDOWN);
    let error = reader.read(&mut buffer).await.unwrap_err().to_string();
    assert!(error.starts_with("fake/ep1: reading: "), "{error}");
    let error = sink
        .write_packets(&mut vec![packet(5, 0)])
        .await
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("fake/ep2: writing: "), "{error}");
}

#[tokio::test]
async fn an_epipe_after_data_is_an_error() {
    let usb = FakeUsb::new();
    let (bulk_out, bulk_in) = usb.endpoints();
    let (mut reader, _sink) = bulk_pair(bulk_out, bulk_in);
    usb.send(b"x".to_vec());
    let mut buffer = [0u8; 4];
    assert_eq!(reader.read(&mut buffer).await.unwrap(), 1);
    usb.fail(libc::EPIPE);
    assert!(reader.read(&mut buffer).await.is_err());
}

#[tokio::test]
async fn the_writer_stops_waiting_once_the_reader_is_gone() {
    let usb = FakeUsb::new();
    let (bulk_out, bulk_in) = usb.endpoints();
    let (reader, mut sink) = bulk_pair(bulk_out, bulk_in);
    // The host reads nothing: the queue fills and the writer waits.
    let writer = tokio::spawn(async move {
        let mut batch: Vec<_> = (0..4).map(|i| packet(1 << 20, i)).collect();
        sink.write_packets(&mut batch).await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!writer.is_finished());
    drop(reader);
    let error = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("the writer gives up")
        .unwrap()
        .unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionAborted);
    assert_eq!(usb.endpoints_alive(), 0);
}

fn config(role: Role) -> Config {
    let mut banner = Banner::new(if role == Role::Host { "host" } else { "device" });
    banner.features.push(feature::DELAYED_ACK.into());
    Config::new(role, banner)
}

/// A device connection whose streams echo what they read.
fn echo(connection: Connection) {
    tokio::spawn(async move {
        while let Some(incoming) = connection.next_incoming().await {
            let mut stream = incoming.accept();
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 100_000];
                loop {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if stream.write_all(&buffer[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
}

/// A host connection over `usb`, and the framing checker's task.
async fn host_over(usb: &FakeUsb, seed: u64) -> (Connection, tokio::task::JoinHandle<Vec<String>>) {
    let (stream, checker) = usb.attach_host(512, seed);
    let (reader, writer) = tokio::io::split(stream);
    let (connection, run) = Connection::start(
        reader,
        StreamSink(writer),
        config(Role::Host),
        "host",
        Auth::None,
    );
    tokio::spawn(run);
    tokio::time::timeout(Duration::from_secs(10), connection.connected())
        .await
        .expect("CNXN answered")
        .expect("connected");
    (connection, checker)
}

async fn echo_round_trip(connection: &Connection, len: usize, seed: u8) {
    let stream = connection.open("echo:").await.unwrap();
    let data = pattern(len, seed);
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
async fn the_engine_runs_over_usb_transfers() {
    let usb = FakeUsb::new();
    usb.shuffle_completions(42);
    let (bulk_out, bulk_in) = usb.endpoints();
    let (reader, sink) = bulk_pair(bulk_out, bulk_in);
    let (device, run) = Connection::start(reader, sink, config(Role::Device), "usb", Auth::None);
    tokio::spawn(run);
    echo(device.clone());
    let (host, checker) = host_over(&usb, 7).await;
    let streams: Vec<_> = (0..3u8)
        .map(|i| {
            let host = host.clone();
            tokio::spawn(
                async move { echo_round_trip(&host, 3 * 1024 * 1024 + i as usize, i).await },
            )
        })
        .collect();
    for stream in streams {
        stream.await.unwrap();
    }
    device.close();
    let errors = checker.await.unwrap();
    assert!(errors.is_empty(), "framing errors: {errors:?}");
    assert!(usb.max_writes_in_flight() <= WRITE_DEPTH);
}

/// Waits (briefly) for `check` to hold.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_enable_starts_a_fresh_connection_and_disable_ends_it() {
    let (gadget, mut control) = FakeGadget::new(Some(3));
    let (connections, mut started) = tokio::sync::mpsc::unbounded_channel();
    let server = tokio::spawn(serve(
        gadget,
        config(Role::Device),
        None,
        move |connection| {
            echo(connection.clone());
            let _ = connections.send(connection);
        },
    ));
    control.send(Event::Bind);
    for round in 0..5u8 {
        control.send(Event::Enable);
        let usb = control.next_usb().await.unwrap();
        let device = started.recv().await.unwrap();
        let (host, checker) = host_over(&usb, round as u64).await;
        echo_round_trip(&host, 200_000 + round as usize, round).await;
        // Unplugged: the kernel fails the transfers, then ep0 says DISABLE.
        usb.fail(ESHUTDOWN);
        control.send(if round % 2 == 0 {
            Event::Disable
        } else {
            Event::Unbind
        });
        eventually("the connection's endpoints are released", || {
            usb.endpoints_alive() == 0
        })
        .await;
        assert!(device.closed().is_some());
        assert!(checker.await.unwrap().is_empty());
    }
    // ENABLE without DISABLE (a bus reset) replaces the connection.
    control.send(Event::Enable);
    let first = control.next_usb().await.unwrap();
    let old = started.recv().await.unwrap();
    control.send(Event::Enable);
    let second = control.next_usb().await.unwrap();
    let _new = started.recv().await.unwrap();
    assert!(old.closed().is_some());
    assert_eq!(first.endpoints_alive(), 0);
    assert_eq!(second.endpoints_alive(), 2);
    let (host, _checker) = host_over(&second, 99).await;
    echo_round_trip(&host, 10_000, 9).await;
    assert!(!server.is_finished());
    drop(control);
    let result = tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap();
    assert!(result.is_err(), "serve ends when ep0 does");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_fails_while_enabled_is_restarted() {
    let (gadget, mut control) = FakeGadget::new(None);
    let server = tokio::spawn(serve(gadget, config(Role::Device), None, echo));
    control.send(Event::Enable);
    let usb = control.next_usb().await.unwrap();
    // Garbage instead of a packet header: a protocol error ends the connection.
    usb.send(vec![0x55; 24]);
    let next = tokio::time::timeout(Duration::from_secs(5), control.next_usb())
        .await
        .expect("a new connection")
        .unwrap();
    eventually("the failed connection's endpoints are released", || {
        usb.endpoints_alive() == 0
    })
    .await;
    let (host, checker) = host_over(&next, 5).await;
    echo_round_trip(&host, 50_000, 5).await;
    control.send(Event::Disable);
    eventually("disabled", || next.endpoints_alive() == 0).await;
    drop(host);
    assert!(checker.await.unwrap().is_empty());
    // Disabled: nothing restarts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(control.next_usb().now_or_never_is_none());
    server.abort();
}

/// `next_usb` without waiting.
trait NowOrNever {
    fn now_or_never_is_none(self) -> bool;
}

impl<F: std::future::Future> NowOrNever for F {
    fn now_or_never_is_none(self) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut future = std::pin::pin!(self);
        future.as_mut().poll(&mut cx).is_pending()
    }
}

#[tokio::test]
async fn reads_stay_queued_while_the_engine_is_busy() {
    // With every buffer handed back, all READ_DEPTH reads are queued again.
    let usb = FakeUsb::new();
    let (bulk_out, bulk_in) = usb.endpoints();
    let (mut reader, _sink) = bulk_pair(bulk_out, bulk_in);
    for i in 0..3 * READ_DEPTH {
        usb.send(vec![i as u8; 100]);
    }
    let mut buffer = vec![0u8; 100 * 3 * READ_DEPTH];
    let mut got = 0;
    while got < buffer.len() {
        got += reader.read(&mut buffer[got..]).await.unwrap();
    }
    for (i, chunk) in buffer.chunks(100).enumerate() {
        assert!(chunk.iter().all(|&b| b == i as u8));
    }
}
