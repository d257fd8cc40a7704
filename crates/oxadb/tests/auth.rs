//! `oxadb` answering a device's AUTH challenges, against a scripted device that
//! verifies the signatures with the host's real key: signature first, then the
//! public key once the signature is refused, and a clear "unauthorized" error
//! when the device never accepts.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use oxadb_auth::PrivateKey;
use oxadb_wire::{Banner, Command as Cmd, Packet, MAX_PAYLOAD};

mod scripted;
use scripted::{read_packet, send};

const AUTH_TOKEN: u32 = 1;
const AUTH_SIGNATURE: u32 = 2;
const AUTH_RSAPUBLICKEY: u32 = 3;

fn token(seed: u8) -> Vec<u8> {
    (0..20)
        .map(|i| seed.wrapping_mul(31).wrapping_add(i))
        .collect()
}

fn host_key(home: &Path) -> PrivateKey {
    let pem = std::fs::read_to_string(home.join(".android/adbkey")).unwrap();
    PrivateKey::from_pem(&pem).unwrap()
}

/// Runs `oxadb get-state` against a device scripted by `device`.
fn run_against(
    device: impl FnOnce(TcpStream, &Path) + Send + 'static,
) -> (Output, tempfile::TempDir) {
    let (output, home, _addr) = run_command(&["get-state"], device);
    (output, home)
}

/// Runs `oxadb -s ADDR ARGS...` against a device scripted by `device`.
fn run_command(
    args: &[&str],
    device: impl FnOnce(TcpStream, &Path) + Send + 'static,
) -> (Output, tempfile::TempDir, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let home = tempfile::tempdir().unwrap();
    let home_path = home.path().to_path_buf();
    let script = std::thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        device(socket, &home_path);
    });
    let output = Command::new(env!("CARGO_BIN_EXE_oxadb"))
        .args(["-s", &addr.to_string()])
        .args(args)
        .env("HOME", home.path())
        .env_remove("ADB_VENDOR_KEYS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    script.join().unwrap();
    (output, home, addr.to_string())
}

fn device_cnxn() -> Packet {
    let mut banner = Banner::new("device");
    banner.features.push("shell_v2".into());
    Packet::new(
        Cmd::Cnxn,
        0x0100_0001,
        MAX_PAYLOAD,
        banner.encode().into_bytes(),
    )
}

#[test]
fn signs_the_token_with_its_adbkey() {
    let (output, _home) = run_against(|mut socket, home| {
        assert_eq!(read_packet(&mut socket).command, Cmd::Cnxn);
        send(&mut socket, Packet::new(Cmd::Auth, AUTH_TOKEN, 0, token(1)));
        let reply = read_packet(&mut socket);
        assert_eq!((reply.command, reply.arg0), (Cmd::Auth, AUTH_SIGNATURE));
        let key = host_key(home).public_key();
        assert!(
            key.verify_token(&token(1), &reply.payload),
            "signature does not verify"
        );
        send(&mut socket, device_cnxn());
        // The host closes once get-state is done.
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest);
    });
    assert_eq!(output.stdout, b"device\n", "{output:?}");
    assert_eq!(output.status.code(), Some(0));
}

#[test]
fn offers_its_public_key_when_the_signature_is_refused() {
    let (output, home) = run_against(|mut socket, home| {
        read_packet(&mut socket);
        send(&mut socket, Packet::new(Cmd::Auth, AUTH_TOKEN, 0, token(2)));
        assert_eq!(read_packet(&mut socket).arg0, AUTH_SIGNATURE);
        // Refuse: a new token, as adbd does.
        send(&mut socket, Packet::new(Cmd::Auth, AUTH_TOKEN, 0, token(3)));
        let offer = read_packet(&mut socket);
        assert_eq!((offer.command, offer.arg0), (Cmd::Auth, AUTH_RSAPUBLICKEY));
        let text = std::str::from_utf8(&offer.payload).unwrap();
        assert!(text.ends_with('\0'), "payload is NUL-terminated");
        let (key, _comment) =
            oxadb_auth::PublicKey::parse_adbkey_pub(text.trim_end_matches('\0')).unwrap();
        assert_eq!(key, host_key(home).public_key());
        // The user accepts the key on the device.
        send(&mut socket, device_cnxn());
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest);
    });
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let public = std::fs::read_to_string(home.path().join(".android/adbkey.pub")).unwrap();
    assert!(!public.is_empty());
}

#[test]
fn unauthorized_device_is_a_clear_error() {
    let (output, _home) = run_against(|mut socket, _home| {
        read_packet(&mut socket);
        send(&mut socket, Packet::new(Cmd::Auth, AUTH_TOKEN, 0, token(4)));
        assert_eq!(read_packet(&mut socket).arg0, AUTH_SIGNATURE);
        send(&mut socket, Packet::new(Cmd::Auth, AUTH_TOKEN, 0, token(5)));
        assert_eq!(read_packet(&mut socket).arg0, AUTH_RSAPUBLICKEY);
        // Nobody accepts the key: wait for the host to give up.
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest);
    });
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unauthorized"), "{stderr}");
    assert!(stderr.contains("adbkey.pub"), "{stderr}");
}

#[test]
fn devices_shows_unauthorized_without_waiting_for_the_user() {
    // Timed from the key offer: making the fresh HOME's adbkey before it
    // takes seconds in a debug build.
    let offered = std::sync::Arc::new(std::sync::Mutex::new(None));
    let offered_at = offered.clone();
    let (output, _home, addr) = run_command(&["devices"], move |mut socket, _home| {
        read_packet(&mut socket);
        send(&mut socket, Packet::new(Cmd::Auth, AUTH_TOKEN, 0, token(6)));
        assert_eq!(read_packet(&mut socket).arg0, AUTH_SIGNATURE);
        send(&mut socket, Packet::new(Cmd::Auth, AUTH_TOKEN, 0, token(7)));
        assert_eq!(read_packet(&mut socket).arg0, AUTH_RSAPUBLICKEY);
        *offered_at.lock().unwrap() = Some(std::time::Instant::now());
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest);
    });
    let started = offered.lock().unwrap().expect("the key was offered");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("List of devices attached\n{addr}\tunauthorized\n\n")
    );
    // The probe's handshake timeout is 3 s; the key offer ends it at once.
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}

#[test]
fn devices_lists_a_tcp_device_that_answers() {
    let (output, _home, addr) = run_command(&["devices", "-l"], |mut socket, _home| {
        read_packet(&mut socket);
        let mut banner = Banner::new("device");
        banner
            .properties
            .push(("ro.product.model".into(), "Pixel 9".into()));
        send(
            &mut socket,
            Packet::new(
                Cmd::Cnxn,
                0x0100_0001,
                MAX_PAYLOAD,
                banner.encode().into_bytes(),
            ),
        );
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest);
    });
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("List of devices attached\n{addr:<22} device model:Pixel_9\n\n")
    );
}
