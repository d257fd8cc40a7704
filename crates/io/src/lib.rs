//! Async drivers that run an [`oxadb_engine::Connection`] over a byte transport
//! (TCP, USB), and [`AdbStream`], one ADB stream as `AsyncRead + AsyncWrite`.
//!
//! The engine sits behind one mutex shared by a reader task (socket to engine),
//! a writer task (engine to socket) and the stream handles, the shape quinn uses:
//! protocol logic stays in the engine, this crate only moves bytes and wakes tasks.
//!
//! - [`connection`]: the [`Connection`] handle, its one constructor
//!   [`Connection::start`], and [`Incoming`] streams;
//! - `driver`: the shared state, the read loop, the write loop and the timer
//!   loop, which sleeps until the engine's next deadline (stalled streams,
//!   delayed AUTH tokens, the handshake's deadlines) and hands it back to
//!   the engine;
//! - [`stream`]: [`AdbStream`] and [`WriteChunk`];
//! - [`sink`]: where packets go ([`PacketSink`], [`StreamSink`]) and the
//!   copying path for file ranges ([`ReadRanges`]), and `tcp_sink`:
//!   [`TcpSink`], which keeps a TCP socket's send buffer full (`refill`,
//!   shared with TLS) and sends file ranges by `sendfile`;
//! - [`auth`]: both roles' authentication ([`Auth`], [`Authenticator`]);
//! - [`bulk_read`]: USB bulk reads as the driver's byte stream, for both
//!   ends ([`bulk_read::BulkReader`]);
//! - [`tls`]: STLS's TLS 1.3 on TCP, both roles ([`tls::negotiate`],
//!   certificates, the checks of the peer's certificate), and `tls_stream`:
//!   records over the socket after the handshake, read in large chunks and
//!   written with the same refill as plaintext (feature `tls`, on by
//!   default; without it `tls::negotiate` serves plaintext only);
//! - [`peer`]: dead-peer detection on TCP sockets ([`watch_peer`]);
//! - [`peer_owner`]: which uid owns a loopback peer's socket, for both
//!   binaries' local-user checks;
//! - [`process`]: per-process settings (allocator, memory budget) and the
//!   values both command lines parse;
//! - [`error_line`]: an error as both command lines print it.

use std::io;
use std::sync::Arc;

use thiserror::Error;

pub mod auth;
pub mod bulk_read;
pub mod connection;
mod driver;
pub mod error_line;
pub mod peer;
pub mod peer_owner;
pub mod pipe_range;
pub mod process;
mod refill;
pub mod sink;
pub mod stream;
mod tcp_sink;
pub mod tls;
#[cfg(feature = "tls")]
mod tls_stream;

pub use auth::{Auth, AuthResponder, Authenticator};
pub use connection::{tcp_halves, Connection, Incoming};
pub use oxadb_engine::{AuthReply, Peer, StreamStats};
pub use peer::{watch_peer, PeerTimeout, DEFAULT_PEER_TIMEOUT};
pub use process::{
    available_memory, default_budget_limits, format_size, parse_credit_mode, parse_size,
    release_free_memory, resident_bytes, tune_allocator, Activity,
};
pub use sink::{OutgoingPacket, PacketSink, ReadRanges, StreamSink};
pub use stream::{AdbStream, ReadChunk, WriteChunk};
pub use tcp_sink::TcpSink;

/// Why a connection ended.
#[derive(Debug, Error, Clone)]
pub enum ConnectionError {
    #[error("peer closed the connection")]
    PeerClosed,
    #[error("truncated packet header ({0} of 24 bytes) before EOF")]
    TruncatedHeader(usize),
    #[error("truncated payload of {command}: EOF after {got} of {expected} bytes")]
    TruncatedPayload {
        command: oxadb_wire::Command,
        got: usize,
        expected: usize,
    },
    #[error("{0}")]
    Header(#[from] oxadb_wire::HeaderError),
    #[error("{0}")]
    Protocol(#[from] oxadb_engine::ProtocolError),
    /// The kernel gave up on a silent peer (data or keepalive probes
    /// unanswered for the peer timeout, see [`peer`]): `ETIMEDOUT`, or
    /// `EHOSTUNREACH`/`ENETUNREACH` when a route or neighbour failed meanwhile.
    #[error("no answer from the peer within the peer timeout, link or peer down ({0})")]
    PeerTimedOut(Arc<io::Error>),
    #[error("I/O error: {0}")]
    Io(Arc<io::Error>),
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    #[error("connection closed locally")]
    Closed,
}

impl From<io::Error> for ConnectionError {
    fn from(error: io::Error) -> Self {
        // On a connected TCP socket these come only from the retransmission,
        // user and keepalive timers: ETIMEDOUT, or the last ICMP or neighbour
        // error seen meanwhile (unreachable errors are soft then, tcp(7)).
        if matches!(
            error.raw_os_error(),
            Some(libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH)
        ) {
            return ConnectionError::PeerTimedOut(Arc::new(error));
        }
        ConnectionError::Io(Arc::new(error))
    }
}

impl ConnectionError {
    /// Whether this is a normal end rather than a fault.
    pub fn is_clean(&self) -> bool {
        matches!(self, ConnectionError::PeerClosed | ConnectionError::Closed)
    }
}

#[cfg(test)]
mod tests;
