//! Forward targets: `tcp:PORT`, `tcp:HOST:PORT`, `localabstract:NAME` and
//! `localfilesystem:PATH`, which `adb forward` opens on the device side.

use std::io;

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
    /// Parses a forward service name; `None` if it is not one.
    pub fn parse(service: &str) -> Option<Result<Target, String>> {
        if let Some(rest) = service.strip_prefix("tcp:") {
            // `tcp:PORT` means the device's own loopback; `tcp:HOST:PORT` names a host.
            let (host, port) = match rest.rsplit_once(':') {
                Some((host, port)) => (host.to_string(), port),
                None => ("127.0.0.1".to_string(), rest),
            };
            return Some(match port.parse::<u16>() {
                Ok(port) if port != 0 => Ok(Target::Tcp { host, port }),
                _ => Err(format!("invalid port in {service:?}")),
            });
        }
        if let Some(name) = service.strip_prefix("localabstract:") {
            return Some(Ok(Target::LocalAbstract(name.to_string())));
        }
        if let Some(path) = service.strip_prefix("localfilesystem:") {
            return Some(Ok(Target::LocalFilesystem(path.to_string())));
        }
        None
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
    fn parses_targets() {
        assert_eq!(
            Target::parse("tcp:8080"),
            Some(Ok(Target::Tcp {
                host: "127.0.0.1".into(),
                port: 8080
            }))
        );
        assert_eq!(
            Target::parse("tcp:localhost:22"),
            Some(Ok(Target::Tcp {
                host: "localhost".into(),
                port: 22
            }))
        );
        assert!(matches!(Target::parse("tcp:x"), Some(Err(_))));
        assert!(matches!(Target::parse("tcp:0"), Some(Err(_))));
        assert_eq!(
            Target::parse("localabstract:foo"),
            Some(Ok(Target::LocalAbstract("foo".into())))
        );
        assert_eq!(
            Target::parse("localfilesystem:/tmp/s"),
            Some(Ok(Target::LocalFilesystem("/tmp/s".into())))
        );
        assert_eq!(Target::parse("shell:"), None);
    }
}
