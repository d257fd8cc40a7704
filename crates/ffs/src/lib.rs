//! oxadbd's USB transport: an ADB function on Linux FunctionFS.

pub mod descriptors;
pub mod event;

pub use event::{Event, SetupRequest};
