//! An adb host server: what Google's `adb` CLI, Android Studio and other
//! tools talk to on port 5037, serving them with oxadb's connections
//! (burst mode and adaptive credit). docs/server.md says what is served.
//!
//! - [`listener`]: binding the port, accepting, and refusing other users;
//! - [`client`]: one client connection, request by request;
//! - [`host`]: what each host request answers (no I/O);
//! - [`registry`]: the transports, their ids and states, reconnection;
//! - [`usb`]: USB devices, added and removed as they are plugged in;
//! - [`forward`]: `adb forward`'s listeners;
//! - [`mdns`]: mDNS discovery and auto-connection of paired devices;
//! - [`pair`]: pairing (`host:pair:`);
//! - [`proto`]: adb's protobuf messages (proto device lists, status);
//! - [`status`]: what `host:server-status` says of this server;
//! - [`socket_spec`]: the server's own socket as `-L` names it.
//!
//! Bytes go between clients and devices through [`crate::relay`].

pub mod client;
pub mod forward;
pub mod host;
pub mod listener;
pub mod mdns;
pub mod pair;
pub mod proto;
pub mod registry;
pub mod socket_spec;
pub mod status;
pub mod usb;

use std::sync::Arc;

use oxadb_io::AdbStream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;

pub use listener::{Access, BindError, Server, ServerConfig};
pub use registry::{Registry, State, TransportId, TransportInfo};
pub use socket_spec::{ListenHost, ListenSpec};

/// What every client task of one server shares.
pub struct Shared {
    pub registry: Arc<Registry>,
    pub forwards: Arc<forward::Forwards>,
    pub mdns: Arc<mdns::Discovery>,
    /// Notified by `host:kill`.
    pub stop: Notify,
    /// `host:server-status`'s answer, serialized.
    pub status: Vec<u8>,
}

/// [`crate::relay::relay`], logging how it ended.
async fn relay<S>(socket: S, stream: AdbStream)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    log_relay_end(crate::relay::relay(socket, stream).await);
}

/// [`crate::relay::relay_tcp`], logging how it ended.
async fn relay_tcp(socket: &mut tokio::net::TcpStream, stream: AdbStream) {
    log_relay_end(crate::relay::relay_tcp(socket, stream).await);
}

fn log_relay_end(ended: std::io::Result<(u64, u64)>) {
    match ended {
        Ok((to_client, to_device)) => tracing::debug!(to_client, to_device, "relay ended"),
        Err(error) => tracing::debug!(%error, "relay ended"),
    }
}
