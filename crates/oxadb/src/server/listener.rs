//! The server's port: bound on loopback (every interface only when asked;
//! AOSP `socket_spec.cpp` socket_spec_listen and `sysdeps/posix/network.cpp`
//! say which), each connection checked against who may use the server, then served by
//! its own task until `host:kill`.
//!
//! Whoever reaches the port controls every device the server holds, so a
//! client must be this user or root unless the server was started to serve
//! any user: the kernel says who owns a loopback peer's socket
//! (`oxadb_io::peer_owner`, as oxadbd decides who needs no key). A peer
//! that is not on loopback has no owner to ask and is refused too.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use oxadb_io::peer_owner::{self, Owner};
use oxadb_wire::smart_socket::fail;
use prost::Message as _;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use super::forward::Forwards;
use super::mdns::Discovery;
use super::registry::Registry;
use super::socket_spec::ListenHost;
use super::Shared;
use crate::ConnectOptions;

/// adb's default server port (AOSP `adb.h` DEFAULT_ADB_PORT).
pub const DEFAULT_PORT: u16 = 5037;

/// Who may use the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The user running it, and root.
    OwnUser,
    /// Anyone who reaches the port.
    AnyUser,
}

/// How to run a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub port: u16,
    /// The host of adb's `-L tcp:HOST:PORT` ([`ListenHost::Unnamed`] for
    /// `tcp:PORT`).
    pub host: ListenHost,
    /// Listen on every interface (adb's `-a`), not only loopback: for an
    /// unnamed host only, as adb's.
    pub all_interfaces: bool,
    pub access: Access,
    /// How every device is connected.
    pub connect: ConnectOptions,
    /// Find USB devices and follow them being plugged in and out
    /// (off with `ADB_USB=0`, as Google's server: [`super::usb::enabled_by_env`]).
    pub usb: bool,
}

/// The port could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address}: {}", describe(.cause, .address))]
pub struct BindError {
    pub address: SocketAddr,
    pub cause: std::io::Error,
}

fn describe(cause: &std::io::Error, address: &SocketAddr) -> String {
    match cause.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "port {} is in use (another adb server? `adb kill-server` stops Google's)",
            address.port()
        ),
        _ => cause.to_string(),
    }
}

/// A bound server, ready to [`Server::run`].
pub struct Server {
    listener: TcpListener,
    access: Access,
    usb: bool,
    shared: Arc<Shared>,
}

impl Server {
    pub async fn bind(config: ServerConfig) -> Result<Server, BindError> {
        let listener = listen(config.host, config.all_interfaces, config.port)?;
        let registry = Registry::new(config.connect.clone());
        let forwards = Forwards::new(registry.clone());
        let mdns = Discovery::start(registry.clone());
        let status =
            super::status::server_status(&config.connect, config.usb, mdns.is_on()).encode_to_vec();
        Ok(Server {
            listener,
            access: config.access,
            usb: config.usb,
            shared: Arc::new(Shared {
                registry,
                forwards,
                mdns,
                stop: tokio::sync::Notify::new(),
                status,
            }),
        })
    }

    /// Where it listens (the port bound, for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// What its clients share: its transports and forwards.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Serves until a client sends `host:kill`.
    pub async fn run(self) {
        let own_uid = rustix::process::geteuid().as_raw();
        let usb = self
            .usb
            .then(|| tokio::spawn(super::usb::watch(self.shared.registry.clone())));
        self.serve(own_uid).await;
        if let Some(usb) = usb {
            usb.abort();
        }
    }

    async fn serve(&self, own_uid: u32) {
        loop {
            let (socket, peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of descriptors and the like: pause, go on.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = self.shared.stop.notified() => return,
            };
            if let Err(refusal) = self.admit(&socket, peer, own_uid) {
                tracing::warn!(%peer, %refusal, "client refused");
                tokio::spawn(refuse(socket, refusal));
                continue;
            }
            let _ = socket.set_nodelay(true);
            tokio::spawn(super::client::serve(self.shared.clone(), socket));
        }
    }

    /// Whether the client at `peer` may use the server; `Err` says why not.
    fn admit(&self, socket: &TcpStream, peer: SocketAddr, own_uid: u32) -> Result<(), String> {
        if self.access == Access::AnyUser {
            return Ok(());
        }
        let local = socket.local_addr().map_err(|e| e.to_string())?;
        let owner = if peer_owner::is_loopback(peer.ip()) {
            peer_owner::peer_owner(local, peer).map_err(|e| e.to_string())?
        } else {
            Owner::Missing
        };
        match owner {
            Owner::Uid(uid) if uid == own_uid || uid == 0 => Ok(()),
            Owner::Uid(uid) => Err(format!(
                "this oxadb server serves uid {own_uid} and root only, not uid {uid} (start it with --any-user to serve every user)"
            )),
            Owner::NotEstablished(state) => Err(format!(
                "the client's socket is {}, so its owner is unknown",
                peer_owner::state_name(state)
            )),
            Owner::Missing => Err(format!(
                "no local owner found for {peer} (this oxadb server serves uid {own_uid} and root only; --any-user serves every client)"
            )),
        }
    }
}

/// Whether the server listens on every interface with this host and `-a`.
pub fn listens_everywhere(host: ListenHost, all_interfaces: bool) -> bool {
    host == ListenHost::Unnamed && all_interfaces
}

/// Binds as adb's server does: every interface is `[::]` taking IPv4 too
/// (libcutils socket_inaddr_any_server), 0.0.0.0 where the machine has no
/// IPv6; loopback is 127.0.0.1, and ::1 only where IPv4 is unavailable
/// (network_loopback_server preferring IPv4) or asked for by name.
fn listen(host: ListenHost, all_interfaces: bool, port: u16) -> Result<TcpListener, BindError> {
    let v4 = |ip: Ipv4Addr| SocketAddr::from((ip, port));
    let v6 = |ip: Ipv6Addr| SocketAddr::from((ip, port));
    let (first, fallback) = if listens_everywhere(host, all_interfaces) {
        (v6(Ipv6Addr::UNSPECIFIED), Some(v4(Ipv4Addr::UNSPECIFIED)))
    } else if host == ListenHost::Ipv6Loopback {
        (v6(Ipv6Addr::LOCALHOST), None)
    } else {
        (v4(Ipv4Addr::LOCALHOST), Some(v6(Ipv6Addr::LOCALHOST)))
    };
    match bind_one(first) {
        Err(cause) if fallback.is_some() && family_unavailable(&cause) => {
            let address = fallback.unwrap_or(first);
            bind_one(address).map_err(|cause| BindError { address, cause })
        }
        result => result.map_err(|cause| BindError {
            address: first,
            cause,
        }),
    }
}

/// The address family or address is missing on this machine.
fn family_unavailable(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)
    )
}

fn bind_one(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if address.ip() == Ipv6Addr::UNSPECIFIED {
        // IPv4 clients too, whatever net.ipv6.bindv6only says.
        rustix::net::sockopt::set_ipv6_v6only(&socket, false)?;
    }
    socket.bind(address)?;
    socket.listen(1024)
}

/// Tells a refused client why, as a `FAIL` (adb prints `error: WHY`):
/// after its request, since closing on unread bytes would reset the
/// connection and lose the answer.
async fn refuse(mut socket: TcpStream, why: String) {
    use tokio::io::AsyncReadExt;
    let wait = std::time::Duration::from_secs(1);
    let mut request = [0u8; 1024];
    let _ = tokio::time::timeout(wait, socket.read(&mut request)).await;
    let _ = socket.write_all(&fail(&why)).await;
    let _ = socket.shutdown().await;
    let _ = tokio::time::timeout(wait, socket.read(&mut request)).await;
}
