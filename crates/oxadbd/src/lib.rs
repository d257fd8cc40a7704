//! oxadbd: a Linux ADB daemon that stock adb clients use unchanged.
//!
//! [`server::serve`] accepts host connections; [`services`] implements what
//! hosts open on them.
pub mod auth;
pub mod config;
pub mod flags;
pub mod mdns;
#[cfg(feature = "pairing")]
pub mod pair;
/// Shared with the host's adb server (`oxadb server`), which serves only its own user.
pub use oxadb_io::peer_owner;
pub mod server;
pub mod services;
pub mod settings;
pub mod stop;
pub mod tls;
