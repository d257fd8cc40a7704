//! `oxadb pull` against a scripted device: with oxadbd's `oxadb_recv_ahead`
//! feature the `RCV2` goes in the same write as the `STA2`, before its reply
//! (one round trip less, docs/protocol.md "Pulls in two round trips");
//! without it, only after the reply, as adb does.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};

use oxadb_wire::sync::{self as wire, StatV2, SyncHeader};
use oxadb_wire::{Banner, Command as Cmd, Packet, MAX_PAYLOAD};

mod scripted;
use scripted::{next_write, read_packet, send};

const DEVICE_ID: u32 = 7;
const CONTENT: &[u8] = b"hello";

fn expect_okay(socket: &mut TcpStream) {
    assert_eq!(read_packet(socket).command, Cmd::Okay);
}

/// Runs `oxadb pull /remote/file LOCAL` against a device whose banner has
/// `features`; returns the host's first sync write (the requests it sent
/// before any reply).
fn pull_with(features: &[&str]) -> Vec<u8> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let home = tempfile::tempdir().unwrap();
    let local = home.path().join("pulled");
    let features: Vec<String> = features.iter().map(|f| f.to_string()).collect();
    let device = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        assert_eq!(read_packet(&mut socket).command, Cmd::Cnxn);
        let mut banner = Banner::new("device");
        banner.features = features;
        let cnxn = Packet::new(
            Cmd::Cnxn,
            0x0100_0001,
            MAX_PAYLOAD,
            banner.encode().into_bytes(),
        );
        send(&mut socket, cnxn);
        let open = read_packet(&mut socket);
        assert_eq!(open.command, Cmd::Open);
        assert_eq!(&open.payload[..], b"sync:\0");
        let host_id = open.arg0;
        let okay = || Packet::new(Cmd::Okay, DEVICE_ID, host_id, Vec::new());
        let write = |payload: Vec<u8>| Packet::new(Cmd::Wrte, DEVICE_ID, host_id, payload);
        send(&mut socket, okay());

        let (first, _) = next_write(&mut socket);
        send(&mut socket, okay());
        let stat = StatV2 {
            mode: libc::S_IFREG | 0o644,
            size: CONTENT.len() as u64,
            ..StatV2::default()
        }
        .encode(wire::ID_STAT_V2)
        .to_vec();
        let mut data = SyncHeader::new(wire::ID_DATA, CONTENT.len() as u32)
            .encode()
            .to_vec();
        data.extend_from_slice(CONTENT);
        data.extend_from_slice(&wire::encode_done(0));
        if first.windows(4).any(|w| w == b"RCV2") {
            // Both replies in one WRTE: no flow control allows two in flight.
            send(&mut socket, write([stat, data].concat()));
        } else {
            send(&mut socket, write(stat));
            let (recv, okays) = next_write(&mut socket);
            assert!(recv.starts_with(b"RCV2"), "{recv:?}");
            if okays == 0 {
                expect_okay(&mut socket);
            }
            send(&mut socket, okay());
            send(&mut socket, write(data));
        }
        let (quit, _) = next_write(&mut socket);
        assert!(quit.starts_with(b"QUIT"), "{quit:?}");
        send(&mut socket, okay());
        send(
            &mut socket,
            Packet::new(Cmd::Clse, DEVICE_ID, host_id, Vec::new()),
        );
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest);
        first
    });
    let output = Command::new(env!("CARGO_BIN_EXE_oxadb"))
        .args(["-s", &addr.to_string(), "pull", "/remote/file"])
        .arg(&local)
        .env("HOME", home.path())
        .env_remove("ADB_VENDOR_KEYS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let first = device.join().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(std::fs::read(&local).unwrap(), CONTENT);
    first
}

#[test]
fn with_recv_ahead_the_recv_goes_with_the_stat() {
    let first = pull_with(&["shell_v2", "stat_v2", "sendrecv_v2", "oxadb_recv_ahead"]);
    assert!(first.starts_with(b"STA2"), "{first:?}");
    let recv_at = 8 + b"/remote/file".len();
    assert_eq!(&first[recv_at..recv_at + 4], b"RCV2", "{first:?}");
}

#[test]
fn without_it_the_recv_waits_for_the_stat_reply() {
    let first = pull_with(&["shell_v2", "stat_v2", "sendrecv_v2"]);
    assert_eq!(first, [&b"STA2\x0c\0\0\0"[..], b"/remote/file"].concat());
}
