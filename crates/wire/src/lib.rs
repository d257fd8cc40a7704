//! ADB wire formats. No I/O: everything here turns bytes into values and back,
//! so it can be unit-tested and fuzzed on its own.

// This crate needs no unsafe code. Forbidden here, not in the workspace's
// lints, which every member shares (root Cargo.toml).
#![forbid(unsafe_code)]

pub mod banner;
pub mod compression;
pub mod mdns;
pub mod packet;
pub mod payload;
pub mod service;
pub mod shell;
pub mod smart_socket;
pub mod sync;
pub mod usb;

pub use banner::{feature, Banner, BannerError};
pub use packet::{Command, Header, HeaderError, Packet, HEADER_LEN, MAX_PAYLOAD};
pub use payload::{FileRange, Part, Payload, RangeCounters, RangeSource};
