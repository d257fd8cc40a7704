//! Errors of key handling. Each names where the key came from (a file path,
//! or a description such as "PEM text" for in-memory input) and the cause.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A key file or directory could not be read, created or written.
    /// The cause is in the message, so it is not also the `source()`
    /// (chain printers would show it twice).
    #[error("{}: cannot {action}: {cause}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        cause: std::io::Error,
    },
    /// The text is not a usable RSA private key in PEM form.
    #[error("{origin}: not a usable adb RSA private key: {reason}")]
    PrivateKey { origin: String, reason: String },
    /// An Android public key (binary struct, base64 or `adbkey.pub` line) is malformed.
    #[error("{origin}: invalid Android public key: {reason}")]
    PublicKey { origin: String, reason: String },
    /// Generating a new key failed.
    #[error("{origin}: cannot generate an RSA-2048 key: {reason}")]
    Generate { origin: String, reason: String },
    /// An AUTH token that is not 20 bytes (a SHA-1 digest's size).
    #[error("{origin}: cannot sign an AUTH token of {len} bytes: adb tokens are 20 bytes")]
    TokenLength { origin: String, len: usize },
    /// The RSA signing operation failed.
    #[error("{origin}: cannot sign the AUTH token: {reason}")]
    Sign { origin: String, reason: String },
    /// `adb_known_hosts.pb` is not the protobuf adb writes.
    #[error("{}: not an adb known-hosts file: {reason}", path.display())]
    KnownHosts { path: PathBuf, reason: String },
    /// Neither `$HOME` nor the password database gives a home directory.
    #[error("cannot find the home directory for ~/.android: $HOME is unset and uid {uid} has no password entry")]
    NoHomeDir { uid: u32 },
}
