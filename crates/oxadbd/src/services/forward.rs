//! Forward targets: `tcp:PORT`, `tcp:HOST:PORT`, `localabstract:NAME` and
//! `localfilesystem:PATH`, which `adb forward` opens on the device side.

use std::io;
use std::num::NonZeroU16;

use oxadb_io::AdbStream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

/// Where a forward service connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tcp { host: String, port: u16 },
    LocalAbstract(String),
    LocalFilesystem(String),
}

impl Target {
    /// `tcp:PORT` means the device's own loopback; `tcp:HOST:PORT` names a host.
    pub fn tcp(host: Option<String>, port: NonZeroU16) -> Target {
        Target::Tcp {
            host: host.unwrap_or_else(|| "127.0.0.1".to_string()),
            port: port.get(),
        }
    }

    /// Connects to the target.
    pub async fn connect(&self) -> io::Result<Box<dyn Socket>> {
        Ok(match self {
            Target::Tcp { host, port } => {
                let stream = TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                Box::new(stream)
            }
            Target::LocalFilesystem(path) => Box::new(UnixStream::connect(path).await?),
            Target::LocalAbstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                // Connecting a unix socket does not block on a peer; std then hands it to tokio.
                let stream = std::os::unix::net::UnixStream::connect_addr(&addr)?;
                stream.set_nonblocking(true)?;
                Box::new(UnixStream::from_std(stream)?)
            }
        })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
            Target::LocalAbstract(name) => write!(f, "localabstract:{name}"),
            Target::LocalFilesystem(path) => write!(f, "localfilesystem:{path}"),
        }
    }
}

pub trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

/// Relays bytes both ways until either side ends. ADB streams have no
/// half-close, so the first EOF (or error) in either direction ends both.
pub async fn relay(stream: AdbStream, socket: Box<dyn Socket>) -> io::Result<(u64, u64)> {
    let (mut adb_read, mut adb_write) = tokio::io::split(stream);
    let (mut socket_read, mut socket_write) = tokio::io::split(socket);
    let mut to_socket = 0u64;
    let mut to_adb = 0u64;
    let result = tokio::select! {
        r = tokio::io::copy(&mut adb_read, &mut socket_write) => r.map(|n| to_socket = n),
        r = tokio::io::copy(&mut socket_read, &mut adb_write) => r.map(|n| to_adb = n),
    };
    // Dropping the halves closes the socket and, after queued data, the ADB stream.
    result.map(|()| (to_socket, to_adb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcp_target_without_a_host_is_loopback() {
        let port = NonZeroU16::new(8080).unwrap();
        assert_eq!(
            Target::tcp(None, port),
            Target::Tcp {
                host: "127.0.0.1".into(),
                port: 8080
            }
        );
        assert_eq!(
            Target::tcp(Some("localhost".into()), port).to_string(),
            "tcp:localhost:8080"
        );
    }
}
