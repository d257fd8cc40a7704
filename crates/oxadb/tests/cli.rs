//! The `oxadb` binary against an in-process oxadbd, in burst and classic mode:
//! shell exit codes and stream separation, exec-out, features, get-state,
//! forward and errors.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use oxadbd::config::{CreditMode, DaemonConfig};

mod in_process;

/// Starts a daemon on its own runtime thread; returns its address.
fn start_daemon(delayed_ack: bool) -> SocketAddr {
    in_process::start_daemon(move |addr| DaemonConfig {
        credit: if delayed_ack {
            CreditMode::Adaptive
        } else {
            CreditMode::Classic
        },
        ..DaemonConfig::with_defaults(addr).unwrap()
    })
}

fn oxadb(addr: SocketAddr, burst: bool, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_oxadb"));
    command.arg("-s").arg(addr.to_string());
    if !burst {
        command.arg("--no-burst");
    }
    let home = tempfile::tempdir().unwrap();
    command
        .args(args)
        .env("HOME", home.path())
        .env_remove("ANDROID_SERIAL")
        .stdin(Stdio::null());
    let output = command.output().unwrap();
    drop(home);
    output
}

fn modes() -> Vec<(bool, bool)> {
    // (daemon offers delayed_ack, host asks for burst): burst only in the first.
    vec![(true, true), (true, false), (false, true)]
}

#[test]
fn shell_exit_codes_and_streams() {
    for (daemon_burst, host_burst) in modes() {
        let addr = start_daemon(daemon_burst);
        for code in [0, 1, 42] {
            let output = oxadb(addr, host_burst, &["shell", &format!("exit {code}")]);
            assert_eq!(output.status.code(), Some(code), "{output:?}");
        }
        let output = oxadb(addr, host_burst, &["shell", "echo out; echo err >&2"]);
        assert_eq!(output.stdout, b"out\n");
        assert_eq!(output.stderr, b"err\n");
        assert_eq!(output.status.code(), Some(0));
    }
}

#[test]
fn shell_forwards_stdin() {
    let addr = start_daemon(true);
    let home = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_oxadb"))
        .args(["-s", &addr.to_string(), "shell", "cat; exit 7"])
        .env("HOME", home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut stdin = child.stdin.take().unwrap();
    let writer = {
        let data = data.clone();
        std::thread::spawn(move || stdin.write_all(&data).unwrap())
    };
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_eq!(output.status.code(), Some(7));
    assert!(output.stdout == data, "stdin did not come back intact");
}

#[test]
fn exec_out_is_binary_safe() {
    for (daemon_burst, host_burst) in modes() {
        let addr = start_daemon(daemon_burst);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        let data: Vec<u8> = (0..5_000_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let output = oxadb(
            addr,
            host_burst,
            &["exec-out", "cat", path.to_str().unwrap()],
        );
        assert_eq!(output.status.code(), Some(0));
        assert!(output.stdout == data, "exec-out output differs");
    }
}

#[test]
fn features_state_and_burst_negotiation() {
    let addr = start_daemon(true);
    let output = oxadb(addr, true, &["features"]);
    let features = String::from_utf8(output.stdout).unwrap();
    assert!(features.lines().any(|f| f == "shell_v2"), "{features}");
    assert!(features.lines().any(|f| f == "delayed_ack"), "{features}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("burst mode (delayed_ack): on"));
    let output = oxadb(addr, false, &["features"]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("burst mode (delayed_ack): off"));
    let classic = start_daemon(false);
    let output = oxadb(classic, true, &["features"]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("burst mode (delayed_ack): off"));

    let output = oxadb(addr, true, &["get-state"]);
    assert_eq!(output.stdout, b"device\n");
    assert_eq!(output.status.code(), Some(0));
}

#[test]
fn unreachable_device_is_a_clear_error() {
    let port = StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let output = oxadb(port, true, &["get-state"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&port.to_string()), "{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
}

#[test]
fn forward_relays_both_ways() {
    for (daemon_burst, host_burst) in modes() {
        let addr = start_daemon(daemon_burst);
        let echo = StdListener::bind("127.0.0.1:0").unwrap();
        let echo_port = echo.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for socket in echo.incoming() {
                let mut socket = socket.unwrap();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    loop {
                        match socket.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => socket.write_all(&buf[..n]).unwrap(),
                        }
                    }
                });
            }
        });
        let local_port = StdListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let home = tempfile::tempdir().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_oxadb"));
        command.args(["-s", &addr.to_string()]);
        if !host_burst {
            command.arg("--no-burst");
        }
        let mut child = command
            .args([
                "forward",
                &format!("tcp:{local_port}"),
                &format!("tcp:{echo_port}"),
            ])
            .env("HOME", home.path())
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Generous: a forwarder re-executes the debug binary, which a loaded
        // 2-core machine can take seconds to start; only a hang should fail.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut socket = loop {
            match StdStream::connect(("127.0.0.1", local_port)) {
                Ok(socket) => break socket,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(error) => panic!("forward did not start listening: {error}"),
            }
        };
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
        let mut reader = socket.try_clone().unwrap();
        let expected = data.len();
        let collector = std::thread::spawn(move || {
            let mut got = vec![0u8; expected];
            reader.read_exact(&mut got).unwrap();
            got
        });
        socket.write_all(&data).unwrap();
        assert!(collector.join().unwrap() == data, "forwarded bytes differ");
        drop(socket);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

#[test]
fn interrupted_pull_leaves_no_temporary_file() {
    let addr = start_daemon(true);
    let source_dir = tempfile::tempdir().unwrap();
    let source = source_dir.path().join("big.bin");
    let data: Vec<u8> = (0..256u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    std::fs::write(&source, &data).unwrap();
    let dest_dir = tempfile::tempdir().unwrap();
    let dest = dest_dir.path().join("big.bin");
    std::fs::write(&dest, b"previous contents").unwrap();
    let home = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_oxadb"))
        .args([
            "-s",
            &addr.to_string(),
            "pull",
            source.to_str().unwrap(),
            dest.to_str().unwrap(),
        ])
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let temp_files = || -> Vec<_> {
        std::fs::read_dir(dest_dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".oxadb-pull."))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while temp_files().is_empty() {
        assert!(Instant::now() < deadline, "the pull never started");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the pull finished before it could be interrupted"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    assert!(
        temp_files().is_empty(),
        "a temporary pull file was left behind"
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"previous contents");
}

#[test]
fn push_and_pull_print_stream_stats_on_request() {
    for (daemon_burst, host_burst) in modes() {
        let addr = start_daemon(daemon_burst);
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("data.bin");
        std::fs::write(&source, vec![0x5a; 3 << 20]).unwrap();
        let remote = dir.path().join("remote.bin");
        let output = oxadb(
            addr,
            host_burst,
            &[
                "push",
                "--stats",
                source.to_str().unwrap(),
                remote.to_str().unwrap(),
            ],
        );
        assert!(output.status.success(), "{output:?}");
        let text = String::from_utf8_lossy(&output.stdout);
        let burst = daemon_burst && host_burst;
        let mode = if burst {
            "flow control delayed_ack (burst mode)"
        } else {
            "flow control classic (one packet in flight)"
        };
        assert!(text.contains(mode), "{text}");
        // Three MiB of file data went out, plus the sync framing.
        let sent: u64 = text
            .split("sent ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no byte count in {text}"));
        assert!((3 << 20..(3 << 20) + 4096).contains(&sent), "{text}");
        assert!(text.contains("blocked on credit "), "{text}");
        assert_eq!(text.contains("our receive window "), burst, "{text}");

        let back = dir.path().join("back.bin");
        let output = oxadb(
            addr,
            host_burst,
            &[
                "pull",
                "--stats",
                remote.to_str().unwrap(),
                back.to_str().unwrap(),
            ],
        );
        assert!(output.status.success(), "{output:?}");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.contains(" bytes in "), "{text}");
        assert_eq!(std::fs::read(&back).unwrap().len(), 3 << 20);
        // Without --stats nothing but the summary is printed.
        let output = oxadb(
            addr,
            host_burst,
            &["pull", remote.to_str().unwrap(), back.to_str().unwrap()],
        );
        assert!(!String::from_utf8_lossy(&output.stdout).contains("stream stats"));
    }
}
