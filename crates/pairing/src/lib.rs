//! ADB wireless pairing (`adb pair`): a six-digit code proven with SPAKE2
//! inside TLS 1.3, then each side's identity sent encrypted with the key
//! SPAKE2 gave (AOSP `pairing_connection/`, `pairing_auth/`).

// This crate needs no unsafe code. Forbidden here, not in the workspace's
// lints, which every member shares (root Cargo.toml).
#![forbid(unsafe_code)]

pub mod connection;
pub mod format;
pub mod spake2;

pub use connection::{client_config, ephemeral_identity, pair, serve, server_config, PairError};
pub use format::PeerInfo;

/// SPAKE2 names, NUL included (`sizeof` of the C strings in
/// pairing_auth/pairing_auth.cpp): the host is alice, the device bob.
pub const CLIENT_NAME: &[u8] = b"adb pair client\0";
pub const SERVER_NAME: &[u8] = b"adb pair server\0";
