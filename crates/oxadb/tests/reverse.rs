//! The reverse-forwarding library API against an in-process `oxadbd`, over
//! one connection (what one `oxadb` command cannot show): rebinding,
//! `norebind`, list order, removal, tcp:0, the streams the device opens,
//! and that a second connection sees none of the first one's listeners.

use std::time::Duration;

use oxadb::{ConnectOptions, CreditMode, Device, Error, ReverseEntry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn daemon() -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listen = listener.local_addr().unwrap();
    let config = oxadbd::config::DaemonConfig {
        credit: CreditMode::Adaptive,
        ..oxadbd::config::DaemonConfig::with_defaults(listen).unwrap()
    };
    (
        listen.to_string(),
        tokio::spawn(oxadbd::server::serve(listener, config)),
    )
}

async fn connect(addr: &str) -> Device {
    let options = ConnectOptions {
        credit: CreditMode::Adaptive,
        authenticate: false,
        timeout: Duration::from_secs(10),
        memory_budget: None,
        ack_headroom: true,
        ..Default::default()
    };
    Device::connect(addr, &options).await.unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn entry(device: &str, host: &str) -> ReverseEntry {
    ReverseEntry {
        device: device.into(),
        host: host.into(),
    }
}

/// Connects to the device-side port and expects the device's stream to
/// `host_spec` to arrive at `device`; answers it with `reply`.
async fn one_connection(device: &Device, port: u16, host_spec: &str, reply: &[u8]) {
    let mut app = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    app.write_all(b"ping").await.unwrap();
    let incoming = device.next_incoming().await.expect("an incoming stream");
    assert_eq!(incoming.service(), host_spec);
    let mut stream = incoming.accept();
    let mut got = [0u8; 4];
    stream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping");
    stream.write_all(reply).await.unwrap();
    let mut back = vec![0u8; reply.len()];
    app.read_exact(&mut back).await.unwrap();
    assert_eq!(back, reply);
}

#[tokio::test]
async fn reverses_on_one_connection() {
    let (addr, server) = daemon().await;
    let device = connect(&addr).await;
    assert!(device.burst_mode());
    let (a, b) = (free_port(), free_port());
    let (tcp_a, tcp_b) = (format!("tcp:{a}"), format!("tcp:{b}"));

    assert_eq!(
        device
            .reverse_forward(&tcp_a, "tcp:1001", false)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        device
            .reverse_forward(&tcp_b, "tcp:1002", false)
            .await
            .unwrap(),
        None
    );
    let port = device
        .reverse_forward("tcp:0", "tcp:1003", false)
        .await
        .unwrap()
        .expect("tcp:0 reports its port");
    let tcp_0 = format!("tcp:{port}");
    assert_eq!(
        device.reverse_list().await.unwrap(),
        [
            entry(&tcp_a, "tcp:1001"),
            entry(&tcp_b, "tcp:1002"),
            entry(&tcp_0, "tcp:1003")
        ]
    );
    one_connection(&device, a, "tcp:1001", b"first").await;
    one_connection(&device, port, "tcp:1003", b"zero").await;

    // norebind keeps the first REMOTE; a plain rebind replaces it in place.
    match device.reverse_forward(&tcp_a, "tcp:2001", true).await {
        Err(Error::Reverse { message, .. }) => assert_eq!(message, "cannot rebind existing socket"),
        other => panic!("norebind: {other:?}"),
    }
    one_connection(&device, a, "tcp:1001", b"kept").await;
    device
        .reverse_forward(&tcp_a, "tcp:2001", false)
        .await
        .unwrap();
    assert_eq!(
        device.reverse_list().await.unwrap()[0],
        entry(&tcp_a, "tcp:2001")
    );
    one_connection(&device, a, "tcp:2001", b"rebound").await;

    // A second connection has a list of its own and cannot remove ours.
    let other = connect(&addr).await;
    assert_eq!(other.reverse_list().await.unwrap(), []);
    match other.reverse_remove(&tcp_a).await {
        Err(Error::Reverse { message, .. }) => {
            assert_eq!(message, format!("listener '{tcp_a}' not found"))
        }
        other => panic!("remove from another connection: {other:?}"),
    }
    other.reverse_remove_all().await.unwrap();
    assert_eq!(device.reverse_list().await.unwrap().len(), 3);
    drop(other);

    device.reverse_remove(&tcp_b).await.unwrap();
    assert!(TcpStream::connect(("127.0.0.1", b)).await.is_err());
    assert_eq!(
        device.reverse_list().await.unwrap(),
        [entry(&tcp_a, "tcp:2001"), entry(&tcp_0, "tcp:1003")]
    );
    device.reverse_remove_all().await.unwrap();
    assert_eq!(device.reverse_list().await.unwrap(), []);
    assert!(TcpStream::connect(("127.0.0.1", a)).await.is_err());

    // The connection's end closes its listeners.
    device
        .reverse_forward(&tcp_a, "tcp:1001", false)
        .await
        .unwrap();
    device.close();
    drop(device);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", a)).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "127.0.0.1:{a} still accepts after the connection ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.abort();
}

#[tokio::test]
async fn a_refused_stream_closes_the_device_side_socket() {
    let (addr, server) = daemon().await;
    let device = connect(&addr).await;
    let a = free_port();
    device
        .reverse_forward(&format!("tcp:{a}"), "tcp:1", false)
        .await
        .unwrap();
    let mut app = TcpStream::connect(("127.0.0.1", a)).await.unwrap();
    device
        .next_incoming()
        .await
        .expect("an incoming stream")
        .refuse();
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), app.read(&mut buf))
        .await
        .expect("the device closes the app's socket");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    server.abort();
}
