//! Helpers shared by the integration tests: external tools (Google adb,
//! openssl) are required, never optional: a missing tool fails the test.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use oxadb_auth::PrivateKey;

/// The absolute path of `name` on `PATH`; panics with a clear message when
/// it is missing.
pub fn tool(name: &str, why: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "`{name}` is not on PATH ({}); {why}",
        std::env::var("PATH").unwrap_or_default()
    );
}

pub fn adb() -> PathBuf {
    tool(
        "adb",
        "these tests need Google adb 29 (Debian package `adb`, installed by scripts/test.sh)",
    )
}

pub fn openssl() -> PathBuf {
    tool(
        "openssl",
        "these tests check signatures with the openssl command (Debian package `openssl`)",
    )
}

/// Runs `command`, panicking with its output when it fails.
pub fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("cannot run {command:?}: {error}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `adb keygen <path>` with a fixed `user@host` (LOGNAME=tester,
/// HOSTNAME=testhost): writes `path` and `path.pub`. Returns the parsed key.
pub fn adb_keygen(path: &Path) -> PrivateKey {
    run(Command::new(adb())
        .arg("keygen")
        .arg(path)
        .env("LOGNAME", "tester")
        .env("HOSTNAME", "testhost"));
    let pem = std::fs::read_to_string(path).expect("adb keygen wrote the key");
    PrivateKey::from_pem(&pem)
        .unwrap_or_else(|error| panic!("our parser rejects adb's key {}: {error}", path.display()))
}

/// A fixed 20-byte AUTH token (any 20 bytes will do).
pub const TOKEN: [u8; 20] = *b"0123456789abcdefghij";
