//! The adb host server (`oxadb::server`) against an in-process `oxadbd`,
//! driven by a raw client speaking the smart-socket framing: the version,
//! device lists, transport switches and their errors, a device service
//! relayed, `track-devices` seeing a device come and go, and `host:kill`.

use std::time::Duration;

use oxadb::server::{Access, ListenHost, Server, ServerConfig};
use oxadb::{ConnectOptions, CreditMode};
use oxadb_wire::smart_socket::{decode_message, encode_request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn daemon() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listen = listener.local_addr().unwrap();
    let config = oxadbd::config::DaemonConfig {
        credit: CreditMode::Adaptive,
        ..oxadbd::config::DaemonConfig::with_defaults(listen).unwrap()
    };
    tokio::spawn(oxadbd::server::serve(listener, config));
    listen.to_string()
}

async fn server() -> (u16, tokio::task::JoinHandle<()>) {
    let server = Server::bind(ServerConfig {
        port: 0,
        host: ListenHost::Unnamed,
        all_interfaces: false,
        access: Access::OwnUser,
        connect: ConnectOptions {
            authenticate: false,
            ..ConnectOptions::default()
        },
        usb: false,
    })
    .await
    .unwrap();
    let port = server.local_addr().unwrap().port();
    (port, tokio::spawn(server.run()))
}

async fn send(port: u16, request: &str) -> TcpStream {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    socket
        .write_all(&encode_request(request).unwrap())
        .await
        .unwrap();
    socket
}

async fn read_exactly(socket: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    tokio::time::timeout(Duration::from_secs(10), socket.read_exact(&mut buf))
        .await
        .expect("the server answers")
        .unwrap();
    buf
}

async fn read_message(socket: &mut TcpStream) -> String {
    let mut framed = read_exactly(socket, 4).await;
    let length = usize::from_str_radix(std::str::from_utf8(&framed).unwrap(), 16).unwrap();
    framed.extend(read_exactly(socket, length).await);
    let (body, _) = decode_message(&framed).unwrap().unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

/// One request, the whole answer until the server closes.
async fn ask(port: u16, request: &str) -> String {
    let mut socket = send(port, request).await;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut out))
        .await
        .expect("the server closes")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn serves_adbs_requests_against_a_device() {
    let device = daemon().await;
    let (port, running) = server().await;

    assert_eq!(ask(port, "host:version").await, "OKAY00040029");
    assert_eq!(ask(port, "host:devices").await, "OKAY0000");
    assert_eq!(
        ask(port, "host:transport-any").await,
        "FAIL001ano devices/emulators found"
    );
    assert_eq!(
        ask(port, "exec:echo hi").await,
        "FAIL001ddevice offline (no transport)"
    );
    assert_eq!(
        ask(port, "host:frobnicate").await,
        "FAIL0021unknown host service 'frobnicate'"
    );

    // A tracker sees the device arrive and leave.
    let mut tracker = send(port, "host:track-devices").await;
    assert_eq!(read_exactly(&mut tracker, 4).await, b"OKAY");
    assert_eq!(read_message(&mut tracker).await, "");

    let mut connect = send(port, &format!("host:connect:{device}")).await;
    assert_eq!(read_exactly(&mut connect, 4).await, b"OKAY");
    assert_eq!(
        read_message(&mut connect).await,
        format!("connected to {device}")
    );
    // Connecting, then connected.
    let mut seen = read_message(&mut tracker).await;
    if seen == format!("{device}\tconnecting\n") {
        seen = read_message(&mut tracker).await;
    }
    assert_eq!(seen, format!("{device}\tdevice\n"));
    assert_eq!(
        ask(port, &format!("host:connect:{device}")).await,
        format!("OKAY{:04x}already connected to {device}", 21 + device.len())
    );

    let long = ask(port, "host:devices-l").await;
    assert!(long.starts_with("OKAY"), "{long}");
    assert!(long.contains(&format!("{device:<22} device")), "{long}");
    assert!(long.ends_with(" transport_id:1\n"), "{long}");
    assert_eq!(
        ask(port, &format!("host-serial:{device}:get-state")).await,
        "OKAY0006device"
    );

    // A transport switch answers the id, then a device service is relayed.
    let mut shell = send(port, "host:tport:any").await;
    assert_eq!(
        read_exactly(&mut shell, 12).await,
        b"OKAY\x01\0\0\0\0\0\0\0"
    );
    shell
        .write_all(&encode_request("exec:echo hi").unwrap())
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), shell.read_to_end(&mut out))
        .await
        .expect("the stream ends")
        .unwrap();
    assert_eq!(out, b"OKAYhi\n");

    assert_eq!(
        ask(port, &format!("host:disconnect:{device}")).await,
        format!("OKAY{:04x}disconnected {device}", 13 + device.len())
    );
    assert_eq!(read_message(&mut tracker).await, "");
    assert_eq!(
        ask(port, &format!("host:disconnect:{device}")).await,
        format!("FAIL{:04x}no such device '{device}'", 17 + device.len())
    );

    assert_eq!(ask(port, "host:kill").await, "OKAY");
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the server stops on host:kill")
        .unwrap();
}
