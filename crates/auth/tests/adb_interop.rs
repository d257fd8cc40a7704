//! Interop with Google adb 29 (`adb` on PATH is required: these tests fail,
//! never skip, without it).
//!
//! - keys adb makes (`adb keygen`) parse, and we reproduce its `.pub` file and
//!   its PEM byte for byte;
//! - adb reads the keys we make (`adb pubkey`);
//! - a real adb server answers a fake device's AUTH challenges with our
//!   generated `adbkey` and a vendor key, and sends the RSAPUBLICKEY payload we
//!   compute.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use oxadb_auth::{AuthorizedKeys, HostKeys, PrivateKey, PublicKey};

#[test]
fn adb_keygen_output_is_reproduced_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k");
    let key = common::adb_keygen(&path);

    let pem = std::fs::read_to_string(&path).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{pem}");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "adb writes its key 0600");
    // Our PKCS#8 encoding is the same bytes as adb's (BoringSSL's).
    assert_eq!(key.to_pem(), pem);

    let pub_file = std::fs::read(dir.path().join("k.pub")).unwrap();
    let pub_text = String::from_utf8(pub_file).unwrap();
    assert!(
        !pub_text.ends_with('\n') && !pub_text.ends_with('\0'),
        "adb writes adbkey.pub without a line end: {pub_text:?}"
    );
    let ours = key.public_key().to_adbkey_pub("tester@testhost");
    assert_eq!(ours, pub_text);

    let (encoded, comment) = pub_text.split_once(' ').unwrap();
    assert_eq!(comment, "tester@testhost");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    assert_eq!(raw, key.public_key().to_android_bytes());
    let parsed = PublicKey::from_android_bytes(&raw).unwrap();
    assert_eq!(parsed, key.public_key());
    assert_eq!(parsed.to_android_bytes(), raw);
    let (from_line, line_comment) = PublicKey::parse_adbkey_pub(&pub_text).unwrap();
    assert_eq!(
        (from_line, line_comment.as_str()),
        (parsed, "tester@testhost")
    );

    // A signature by adb's key, made by us, verifies.
    let signature = key.sign_token(&common::TOKEN).unwrap();
    assert!(key.public_key().verify_token(&common::TOKEN, &signature));
}

/// `adb pubkey FILE` prints the `adbkey.pub` line of a private key file.
fn adb_pubkey(path: &Path) -> String {
    let output = common::run(
        Command::new(common::adb())
            .arg("pubkey")
            .arg(path)
            .env("LOGNAME", "tester")
            .env("HOSTNAME", "testhost"),
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn adb_reads_our_generated_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = PrivateKey::generate().unwrap();
    let path = dir.path().join("ours");
    std::fs::write(&path, key.to_pem()).unwrap();
    assert_eq!(
        adb_pubkey(&path),
        format!("{}\n", key.public_key().to_adbkey_pub("tester@testhost"))
    );
}

// ---- A fake device for a real adb server ----

const A_CNXN: u32 = 0x4e58_4e43;
const A_AUTH: u32 = 0x4854_5541;
const AUTH_TOKEN: u32 = 1;
const AUTH_SIGNATURE: u32 = 2;
const AUTH_RSAPUBLICKEY: u32 = 3;

fn send_packet(stream: &mut TcpStream, command: u32, arg0: u32, arg1: u32, payload: &[u8]) {
    let checksum: u32 = payload.iter().map(|&b| u32::from(b)).sum();
    let mut packet = Vec::with_capacity(24 + payload.len());
    for word in [
        command,
        arg0,
        arg1,
        payload.len() as u32,
        checksum,
        command ^ 0xffff_ffff,
    ] {
        packet.extend_from_slice(&word.to_le_bytes());
    }
    packet.extend_from_slice(payload);
    stream.write_all(&packet).unwrap();
}

fn read_packet(stream: &mut TcpStream) -> (u32, u32, Vec<u8>) {
    let mut header = [0u8; 24];
    stream
        .read_exact(&mut header)
        .expect("a packet from the adb server");
    let word = |i: usize| u32::from_le_bytes(header[i * 4..i * 4 + 4].try_into().unwrap());
    assert_eq!(word(5), word(0) ^ 0xffff_ffff, "packet magic");
    let mut payload = vec![0u8; word(3) as usize];
    stream.read_exact(&mut payload).unwrap();
    (word(0), word(1), payload)
}

/// An adb server on its own port and `$HOME`, killed on drop.
struct AdbServer {
    port: u16,
    home: PathBuf,
    vendor_keys: String,
}

impl AdbServer {
    fn command(&self) -> Command {
        let mut command = Command::new(common::adb());
        command
            .arg("-P")
            .arg(self.port.to_string())
            .env("HOME", &self.home)
            .env("TMPDIR", &self.home)
            .env("LOGNAME", "tester")
            .env("HOSTNAME", "testhost")
            .env("ADB_VENDOR_KEYS", &self.vendor_keys)
            .env_remove("ANDROID_ADB_SERVER_PORT")
            .env_remove("ANDROID_ADB_SERVER_ADDRESS")
            .env_remove("ADB_TRACE")
            .stdin(Stdio::null());
        command
    }

    fn run_logged(&self, args: &[&str], log: &str) -> std::process::Child {
        let stdout = std::fs::File::create(self.home.join(format!("{log}.out"))).unwrap();
        let stderr = std::fs::File::create(self.home.join(format!("{log}.err"))).unwrap();
        self.command()
            .args(args)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|error| panic!("cannot run adb {args:?}: {error}"))
    }

    fn log(&self) -> String {
        let mut text = String::new();
        for name in ["start.err", "connect.out", "connect.err"] {
            let body = std::fs::read_to_string(self.home.join(name)).unwrap_or_default();
            text.push_str(&format!("--- {name}\n{body}"));
        }
        text
    }
}

impl Drop for AdbServer {
    fn drop(&mut self) {
        let _ = self
            .command()
            .arg("kill-server")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

trait OkChild {
    fn wait_ok(self, what: &str, server: &AdbServer);
}

impl OkChild for std::process::Child {
    fn wait_ok(mut self, what: &str, server: &AdbServer) {
        let status = self.wait().unwrap();
        assert!(status.success(), "adb {what}: {status}\n{}", server.log());
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn adb_server_authenticates_with_our_keys() {
    let home = tempfile::tempdir().unwrap();
    let android_dir = home.path().join(".android");
    // Our generated adbkey, where adb looks for it ($HOME/.android).
    let keys = HostKeys::load(&android_dir, None).unwrap();
    let ours = keys.keys()[0].public_key();
    // A vendor key in a directory named by ADB_VENDOR_KEYS.
    let vendor_dir = home.path().join("vendor");
    std::fs::create_dir(&vendor_dir).unwrap();
    let vendor = common::adb_keygen(&vendor_dir.join("v.adb_key")).public_key();

    let authorized = AuthorizedKeys::parse(&format!(
        "{}\n{}\n",
        std::fs::read_to_string(keys.public_key_path()).unwrap(),
        vendor.to_adbkey_pub("vendor@key")
    ));
    assert_eq!(authorized.keys().len(), 2);

    let device = TcpListener::bind("127.0.0.1:0").unwrap();
    let device_port = device.local_addr().unwrap().port();
    let server = AdbServer {
        port: free_port(),
        home: home.path().to_path_buf(),
        vendor_keys: vendor_dir.display().to_string(),
    };
    server
        .run_logged(&["start-server"], "start")
        .wait_ok("start-server", &server);
    let mut connect =
        server.run_logged(&["connect", &format!("127.0.0.1:{device_port}")], "connect");

    device.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stream = loop {
        match device.accept() {
            Ok((stream, _)) => break stream,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    Instant::now() < deadline,
                    "adb server did not connect\n{}",
                    server.log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => panic!("accept: {error}"),
        }
    };
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();

    let (command, _, banner) = read_packet(&mut stream);
    assert_eq!(command, A_CNXN, "the host opens with CNXN");
    assert!(banner.starts_with(b"host::"), "{banner:?}");

    // Challenge until the host gives up signing and offers its public key.
    let mut signers = Vec::new();
    let payload = loop {
        assert!(signers.len() <= 4, "too many signatures: {signers:?}");
        let token: [u8; 20] = std::array::from_fn(|i| (i as u8) * 7 + signers.len() as u8);
        send_packet(&mut stream, A_AUTH, AUTH_TOKEN, 0, &token);
        let (command, arg0, payload) = read_packet(&mut stream);
        assert_eq!(command, A_AUTH);
        match arg0 {
            AUTH_SIGNATURE => {
                let (key, comment) = authorized
                    .verify(&token, &payload)
                    .expect("adb's signature verifies with one of the offered keys");
                let from_ours = keys.keys().iter().any(|k| {
                    k.public_key() == *key && k.public_key().verify_token(&token, &payload)
                });
                signers.push((comment.clone(), from_ours));
            }
            AUTH_RSAPUBLICKEY => break payload,
            other => panic!("unexpected AUTH type {other}"),
        }
    };
    drop(stream);
    let _ = connect.kill();
    let _ = connect.wait();

    // Both keys were tried, each once (adb orders them by fingerprint).
    let mut comments: Vec<&str> = signers.iter().map(|(c, _)| c.as_str()).collect();
    comments.sort();
    assert_eq!(comments.len(), 2, "{signers:?}");
    assert!(comments.contains(&"vendor@key"), "{signers:?}");
    assert!(
        signers.iter().any(|(_, from_ours)| *from_ours),
        "{signers:?}"
    );

    // The RSAPUBLICKEY payload: adbkey.pub text of adbkey, then a NUL.
    let expected = format!("{}\0", ours.to_adbkey_pub("tester@testhost"));
    assert_eq!(String::from_utf8_lossy(&payload), expected);
    // Ours has the same form (our user@host comes from the environment).
    let our_payload = keys.public_key_payload();
    assert_eq!(our_payload.last(), Some(&0));
    let (key, _) = PublicKey::parse_adbkey_pub(std::str::from_utf8(&our_payload).unwrap()).unwrap();
    assert_eq!(key, ours);
    assert_eq!(
        our_payload,
        format!("{}\0", ours.to_adbkey_pub(&oxadb_auth::default_comment())).into_bytes()
    );
}
