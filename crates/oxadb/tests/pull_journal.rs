//! A killed `oxadb pull` leaves its temporary file beside the destination;
//! the next pull into the same directory removes it (found through the
//! killed process's journal in the state directory), never the file of a
//! pull still running, and the destination keeps its old content.
//!
//! The held pull is served by a scripted device that sends part of a file
//! and then nothing; the other pulls by an in-process oxadbd.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oxadb_wire::sync::{self as wire, StatV2, SyncHeader};
use oxadb_wire::{Banner, Command as Cmd, Packet, MAX_PAYLOAD};
use oxadbd::config::DaemonConfig;

mod in_process;
mod scripted;
use scripted::{next_write, read_packet, send};

const DEVICE_ID: u32 = 7;
/// What the held pull receives of the file before the device goes quiet.
const SENT: usize = 4096;

fn start_daemon() -> SocketAddr {
    in_process::start_daemon(|addr| DaemonConfig::with_defaults(addr).unwrap())
}

/// `oxadb -s ADDR pull REMOTE LOCAL` with `home` as HOME, so that its state
/// directory is `home/.local/state/oxadb`.
fn pull_command(addr: SocketAddr, home: &Path, remote: &str, local: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_oxadb"));
    command
        .args(["-s", &addr.to_string(), "pull", remote])
        .arg(local)
        .env("HOME", home)
        .env_remove("XDG_STATE_HOME")
        .env_remove("OXADB_STATE_DIR")
        .env_remove("ANDROID_SERIAL")
        .env_remove("ADB_VENDOR_KEYS")
        .stdin(Stdio::null());
    command
}

fn pull(addr: SocketAddr, home: &Path, remote: &Path, local: &Path) -> Output {
    let output = pull_command(addr, home, remote.to_str().unwrap(), local)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    output
}

/// A device that answers one pull with the stat of a 1 MiB file and its
/// first [`SENT`] bytes, then holds the connection open, silent, until
/// `release` says so.
fn holding_device(listener: TcpListener, release: mpsc::Receiver<()>) {
    let (mut socket, _) = listener.accept().unwrap();
    assert_eq!(read_packet(&mut socket).command, Cmd::Cnxn);
    let mut banner = Banner::new("device");
    banner.features = ["shell_v2", "stat_v2", "sendrecv_v2"]
        .map(String::from)
        .to_vec();
    let cnxn = Packet::new(
        Cmd::Cnxn,
        0x0100_0001,
        MAX_PAYLOAD,
        banner.encode().into_bytes(),
    );
    send(&mut socket, cnxn);
    let open = read_packet(&mut socket);
    assert_eq!(&open.payload[..], b"sync:\0");
    let host_id = open.arg0;
    let okay = || Packet::new(Cmd::Okay, DEVICE_ID, host_id, Vec::new());
    let write = |payload: Vec<u8>| Packet::new(Cmd::Wrte, DEVICE_ID, host_id, payload);
    send(&mut socket, okay());
    let (stat_request, _) = next_write(&mut socket);
    assert!(stat_request.starts_with(b"STA2"), "{stat_request:?}");
    send(&mut socket, okay());
    let stat = StatV2 {
        mode: libc::S_IFREG | 0o644,
        size: 1 << 20,
        ..StatV2::default()
    };
    send(&mut socket, write(stat.encode(wire::ID_STAT_V2).to_vec()));
    let (recv, _) = next_write(&mut socket);
    assert!(recv.starts_with(b"RCV2"), "{recv:?}");
    send(&mut socket, okay());
    let mut data = SyncHeader::new(wire::ID_DATA, SENT as u32)
        .encode()
        .to_vec();
    data.extend((0..SENT).map(|i| i as u8));
    send(&mut socket, write(data));
    // Silent from here on; the socket stays open until the test is done.
    let _ = release.recv();
}

fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".oxadb-pull.")
        })
        .collect();
    found.sort();
    found
}

fn journals(state: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(state) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("pending-dirs."))
        .collect();
    names.sort();
    names
}

/// Waits until the held pull wrote what it was sent to its temporary file.
fn wait_for_partial_file(dir: &Path, child: &mut Child) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let [temp] = &temp_files(dir)[..] {
            if std::fs::metadata(temp).is_ok_and(|md| md.len() == SENT as u64) {
                return temp.clone();
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            panic!("the held pull ended ({status}): {stderr}");
        }
        assert!(Instant::now() < deadline, "the held pull never started");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_killed_pulls_temporary_file_goes_at_the_next_pull_into_its_directory() {
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join(".local/state/oxadb");
    let dest_dir = tempfile::tempdir().unwrap();
    let dest = dest_dir.path().join("held.bin");
    std::fs::write(&dest, b"previous contents").unwrap();
    let source_dir = tempfile::tempdir().unwrap();
    let source = source_dir.path().join("small.bin");
    std::fs::write(&source, b"served by oxadbd").unwrap();
    let daemon = start_daemon();

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let device_addr = listener.local_addr().unwrap();
    let (release, released) = mpsc::channel();
    let device = std::thread::spawn(move || holding_device(listener, released));
    let mut held = pull_command(device_addr, home.path(), "/remote/big.bin", &dest)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let temp = wait_for_partial_file(dest_dir.path(), &mut held);
    let held_journal = format!("pending-dirs.{}", held.id());
    assert_eq!(journals(&state), std::slice::from_ref(&held_journal));
    let md = std::fs::metadata(&state).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o777,
        0o700
    );

    // A pull into the same directory while the held one runs leaves its file.
    pull(
        daemon,
        home.path(),
        &source,
        &dest_dir.path().join("one.bin"),
    );
    assert_eq!(temp_files(dest_dir.path()), std::slice::from_ref(&temp));
    assert_eq!(
        journals(&state),
        std::slice::from_ref(&held_journal),
        "the finished pull took its journal along"
    );

    // Killed: nothing removes its file, and its journal stays behind.
    held.kill().unwrap();
    held.wait().unwrap();
    release.send(()).unwrap();
    device.join().unwrap();
    assert_eq!(temp_files(dest_dir.path()), std::slice::from_ref(&temp));
    assert_eq!(std::fs::metadata(&temp).unwrap().len(), SENT as u64);
    assert_eq!(journals(&state), [held_journal]);

    // The next pull into the directory removes it; the destination is untouched.
    pull(
        daemon,
        home.path(),
        &source,
        &dest_dir.path().join("two.bin"),
    );
    assert_eq!(temp_files(dest_dir.path()), Vec::<PathBuf>::new());
    assert_eq!(std::fs::read(&dest).unwrap(), b"previous contents");
    assert_eq!(
        std::fs::read(dest_dir.path().join("two.bin")).unwrap(),
        b"served by oxadbd"
    );
    assert_eq!(journals(&state), Vec::<String>::new());
}
