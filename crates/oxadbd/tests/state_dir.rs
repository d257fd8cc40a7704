//! The `oxadbd` binary run by a user who may not make /var/lib/oxadbd (the
//! README's first command without sudo): it keeps its push journal in that
//! user's state directory, made with mode 0700, and says so. Run as root,
//! the test runs the daemon as nobody (65534) through util-linux's
//! `setpriv`, which execs it (the child's pid is the daemon's).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const NOBODY: u32 = 65534;

/// A daemon run as a user who may not make /var/lib/oxadbd (nobody, when
/// the test runs as root) with `home` as HOME and `extra` arguments, and its
/// log lines up to "listening on". Returns the child, the lines and whether
/// it runs as nobody.
fn start_as_user(home: &Path, extra: &[&str]) -> (std::process::Child, Vec<String>, bool) {
    let root = rustix::process::geteuid().is_root();
    let mut command = if root {
        rustix::fs::chown(
            home,
            Some(rustix::process::Uid::from_raw(NOBODY)),
            Some(rustix::process::Gid::from_raw(NOBODY)),
        )
        .unwrap();
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={NOBODY}"))
            .arg(format!("--regid={NOBODY}"))
            .arg("--clear-groups")
            .arg(env!("CARGO_BIN_EXE_oxadbd"));
        command
    } else {
        Command::new(env!("CARGO_BIN_EXE_oxadbd"))
    };
    let keys = home.join("adb_keys");
    let mut daemon = command
        .args(["--listen", "127.0.0.1:0", "--no-mdns", "--keys"])
        .arg(&keys)
        .args(extra)
        .env("HOME", home)
        .env_remove("XDG_STATE_HOME")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .current_dir(home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, log) = mpsc::channel();
    let stderr = daemon.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|line: &String| line.contains("listening on"))
    {
        match log.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = daemon.kill();
                let _ = daemon.wait();
                panic!("oxadbd did not start: {seen:#?}");
            }
        }
    }
    (daemon, seen, root)
}

/// Sends SIGTERM once the daemon catches it (its handler comes just after
/// "listening on") and waits for a clean exit.
fn stop(daemon: &mut std::process::Child) {
    let status = format!("/proc/{}/status", daemon.id());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !catches_sigterm(&std::fs::read_to_string(&status).unwrap()) {
        assert!(std::time::Instant::now() < deadline, "no SIGTERM handler");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill(2) on the child's pid; it is not reaped before the wait below.
    assert_eq!(
        unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    assert!(daemon.wait().unwrap().success());
}

#[test]
fn a_user_daemon_keeps_its_journal_in_its_own_state_directory() {
    let home = tempfile::tempdir().unwrap();
    let (mut daemon, seen, root) = start_as_user(home.path(), &[]);

    let state = home.path().join(".local/state/oxadbd");
    let said = seen
        .iter()
        .find(|line| line.contains("state directory"))
        .unwrap_or_else(|| panic!("no state directory line: {seen:#?}"));
    assert!(
        said.contains(&format!(
            "using this user's state directory {} (",
            state.display()
        )),
        "{said}"
    );
    assert!(said.contains("'/var/lib/oxadbd'"), "{said}");
    assert!(!seen.iter().any(|line| line.contains("no state directory")));
    let md = std::fs::metadata(&state).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o700);
    let user = if root {
        NOBODY
    } else {
        rustix::process::geteuid().as_raw()
    };
    assert_eq!(md.uid(), user);
    let journal = state.join(format!("pending-dirs.{}", daemon.id()));
    assert!(journal.exists(), "{:?}", entries(&state));

    // A clean stop with nothing unfinished takes its journal along.
    stop(&mut daemon);
    assert!(entries(&state).is_empty(), "{:?}", entries(&state));
}

#[test]
fn no_state_dir_keeps_no_journal_anywhere() {
    let home = tempfile::tempdir().unwrap();
    let (mut daemon, seen, _) = start_as_user(home.path(), &["--no-state-dir"]);
    assert!(
        seen.iter()
            .any(|line| line.contains("no state directory (--no-state-dir)")),
        "{seen:#?}"
    );
    assert!(!seen
        .iter()
        .any(|line| line.contains("using this user's state directory")));
    // The user's state directory, the fallback without the flag, is not made.
    assert!(!home.path().join(".local/state/oxadbd").exists());
    stop(&mut daemon);
}

/// Whether a `/proc/PID/status` text has SIGTERM among the caught signals
/// (`SigCgt`, a mask with bit N-1 for signal N).
fn catches_sigterm(status: &str) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}
