//! A deterministic link simulator for oxadb's flow control.
//!
//! Two real engines (`oxadb-engine`) push data to each other over modelled
//! links: no sockets, no threads, no wall clock, only a discrete-event loop
//! in virtual nanoseconds. It shows how the credit policies (classic
//! stop-and-wait, AOSP's fixed 32 MiB, the adaptive window) behave on links
//! we cannot plug in: USB 3, Wi-Fi, a long-haul WAN.
//!
//! ```
//! use oxadb_engine::CreditMode;
//! use oxadb_sim::{run, Consumer, Link, Scenario};
//!
//! let outcome = run(&Scenario::new(Link::wan(), Consumer::Fast, CreditMode::Aosp, 8 << 20));
//! assert!(outcome.completed);
//! ```

// This crate needs no unsafe code. Forbidden here, not in the workspace's
// lints, which every member shares (root Cargo.toml).
#![forbid(unsafe_code)]

pub mod link;
pub mod reference_cases;
pub mod scenario;
mod simulator;

pub use link::Link;
pub use reference_cases::{reference_cases, ReferenceCase};
pub use scenario::{Consumer, Outcome, Scenario, StreamOutcome, SLOW_TICK_NS};
pub use simulator::run;
