//! The daemon over USB, with in-memory endpoints standing in for FunctionFS:
//! services work, an unplug ends the connection (a push in progress leaves
//! no temporary file and the destination untouched), the next ENABLE
//! serves a new host, and a USB host can close the TCP listener (`usb:`)
//! and open another (`tcpip:PORT`).

use std::path::Path;
use std::time::Duration;

use oxadb_engine::{Config, Role};
use oxadb_ffs::fake::{FakeGadget, FakeUsb};
use oxadb_ffs::Event;
use oxadb_io::{Auth, Connection, StreamSink};
use oxadb_wire::sync as wire;
use oxadb_wire::Banner;
use oxadbd::config::{parse_listen, Access, AccessFlags, BudgetLimits, DaemonConfig, FileConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn daemon_config(require_auth: bool) -> DaemonConfig {
    let listen = parse_listen("127.0.0.1:0").unwrap();
    DaemonConfig {
        memory_budget: BudgetLimits::from_limit(64 << 20),
        access: Access::resolve(
            listen,
            &AccessFlags {
                auth: Some(require_auth),
                usb: true,
                ..AccessFlags::default()
            },
            &FileConfig::default(),
        )
        .unwrap(),
        ..DaemonConfig::with_defaults(listen).unwrap()
    }
}

async fn host_over(usb: &FakeUsb, seed: u64) -> Connection {
    let (stream, _checker) = usb.attach_host(512, seed);
    let (reader, writer) = tokio::io::split(stream);
    let (connection, run) = Connection::start(
        reader,
        StreamSink(writer),
        Config::new(Role::Host, Banner::new("host")),
        "host",
        Auth::None,
    );
    tokio::spawn(run);
    tokio::time::timeout(Duration::from_secs(10), connection.connected())
        .await
        .expect("the daemon answers CNXN over USB")
        .expect("connected");
    connection
}

async fn exec(host: &Connection, command: &str) -> String {
    let mut stream = host.open(&format!("exec:{command}")).await.unwrap();
    let mut output = String::new();
    stream.read_to_string(&mut output).await.unwrap();
    output
}

fn temp_files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".oxadb-push."))
        .collect()
}

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
async fn unplugged_mid_push_then_replugged() {
    let daemon = oxadbd::server::Daemon::new(daemon_config(false), None);
    let (gadget, mut control) = FakeGadget::new(Some(11));
    let server = tokio::spawn(oxadbd::server::serve_usb(gadget, daemon));
    control.send(Event::Bind);
    control.send(Event::Enable);
    let usb = control.next_usb().await.unwrap();
    let host = host_over(&usb, 1).await;
    assert_eq!(exec(&host, "echo hi").await, "hi\n");

    // A push, cut off by the cable before DONE.
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("precious");
    std::fs::write(&dest, b"old content").unwrap();
    let mut sync = host.open("sync:").await.unwrap();
    let request = wire::SyncRequest {
        id: wire::ID_SEND_V1,
        path: format!("{},33188", dest.display()).into_bytes(),
    };
    sync.write_all(&request.encode().unwrap()).await.unwrap();
    sync.write_all(&wire::encode_data(&vec![7u8; 60_000]).unwrap())
        .await
        .unwrap();
    eventually("the push has a temporary file", || {
        !temp_files_in(dir.path()).is_empty()
    })
    .await;
    usb.fail(libc::ESHUTDOWN);
    control.send(Event::Disable);
    eventually("the temporary file is removed", || {
        temp_files_in(dir.path()).is_empty()
    })
    .await;
    assert_eq!(std::fs::read(&dest).unwrap(), b"old content");
    eventually("the endpoints are released", || usb.endpoints_alive() == 0).await;
    assert!(host.closed().is_some() || exec_fails(&host).await);

    // Plugged in again: a new host is served.
    control.send(Event::Enable);
    let usb = control.next_usb().await.unwrap();
    let host = host_over(&usb, 2).await;
    assert_eq!(exec(&host, "echo again").await, "again\n");
    server.abort();
}

/// The old host's connection is dead: opening a stream fails or hangs.
async fn exec_fails(host: &Connection) -> bool {
    !matches!(
        tokio::time::timeout(Duration::from_millis(200), host.open("exec:true")).await,
        Ok(Ok(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usb_host_must_authenticate_when_auth_is_on() {
    let daemon = oxadbd::server::Daemon::new(daemon_config(true), None);
    let (gadget, mut control) = FakeGadget::new(None);
    let server = tokio::spawn(oxadbd::server::serve_usb(gadget, daemon));
    control.send(Event::Enable);
    let usb = control.next_usb().await.unwrap();
    let (stream, _checker) = usb.attach_host(512, 3);
    let (reader, writer) = tokio::io::split(stream);
    // A host without keys: the device challenges it and never lets it in.
    let (connection, run) = Connection::start(
        reader,
        StreamSink(writer),
        Config::new(Role::Host, Banner::new("host")),
        "host",
        Auth::None,
    );
    tokio::spawn(run);
    let outcome = tokio::time::timeout(Duration::from_millis(500), connection.connected()).await;
    assert!(
        outcome.is_err(),
        "a host without a trusted key is not connected"
    );
    server.abort();
}

async fn answer(host: &Connection, service: &str) -> String {
    let mut stream = host.open(service).await.unwrap();
    let mut output = String::new();
    stream.read_to_string(&mut output).await.unwrap();
    output
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usb_host_closes_the_tcp_listener_and_opens_another() {
    let daemon = oxadbd::server::Daemon::new(daemon_config(false), None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp = listener.local_addr().unwrap();
    let (gadget, mut control) = FakeGadget::new(None);
    let usb_server = tokio::spawn(oxadbd::server::serve_usb(gadget, daemon.clone()));
    let tcp_server = tokio::spawn(oxadbd::server::serve_tcp_switchable(Some(listener), daemon));
    control.send(Event::Enable);
    let usb = control.next_usb().await.unwrap();
    let host = host_over(&usb, 4).await;
    // `adb usb`: TCP closes, the USB host keeps its connection.
    assert_eq!(answer(&host, "usb:").await, "restarting in USB mode\n");
    assert!(tokio::net::TcpStream::connect(tcp).await.is_err());
    assert_eq!(exec(&host, "echo still").await, "still\n");
    // `adb tcpip PORT`: TCP again, on the same address, at PORT.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    assert_eq!(
        answer(&host, &format!("tcpip:{port}")).await,
        format!("restarting in TCP mode port: {port}\n")
    );
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the daemon listens on the new port");
    usb_server.abort();
    tcp_server.abort();
}
