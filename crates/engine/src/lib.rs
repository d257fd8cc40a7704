//! Sans-I/O ADB connection engine, shared by the host and daemon roles.
//!
//! No sockets, no threads, no clocks: drivers (see the `oxadb-io` crate) feed
//! packets in, take packets out, tell the engine the time and wake it when
//! its next deadline comes (`Connection::poll_timeout`, `handle_timeout`),
//! which keeps the protocol logic, timers included, testable and
//! deterministic.

// This crate needs no unsafe code. Forbidden here, not in the workspace's
// lints, which every member shares (root Cargo.toml).
#![forbid(unsafe_code)]

pub mod budget;
pub mod connection;
pub mod credit;
pub mod recent_samples;
pub mod send_queue;

pub use budget::{BudgetLimits, Holding, MemoryBudget, Pressure, MIN_PACKET};
pub use connection::{
    host_supports_tls, worth_a_warning, AuthReply, Config, Connection, Event, HandshakeStage,
    Outgoing, Peer, ProtocolError, Read, Role, StreamError, StreamId, StreamStats, Tls,
    AUTH_RSAPUBLICKEY, AUTH_SIGNATURE, AUTH_TOKEN, DEFAULT_MAX_STREAMS, MISBEHAVIOUR_BURST,
    MISBEHAVIOUR_PER_SECOND, STLS_VERSION,
};
pub use credit::{CreditMode, CreditPolicy, AOSP_INITIAL_CREDIT, MAX_ADAPTIVE_WINDOW};
pub use recent_samples::RecentSamples;

#[cfg(test)]
mod tests;
