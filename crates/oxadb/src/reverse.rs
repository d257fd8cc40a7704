//! `adb reverse` from the host: the device listens (`reverse:forward:` and
//! friends, answered as adbd's `adb.cpp` handle_forward_request does) and
//! opens a stream to the host for every connection it accepts, naming the
//! host-side spec as the service. [`Device::next_incoming`] hands those
//! streams out; [`HostEnd`] connects them on this machine.
//!
//! Reverse listeners belong to the connection that made them: the device
//! lists and removes only this connection's, and drops them all when it ends.

use std::io;

use oxadb_io::Incoming;
use oxadb_wire::service::{DeviceService, ForwardRequest, ServiceProblem};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use crate::error::{Error, Result};
use crate::Device;

/// One reverse listener as the device lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReverseEntry {
    /// The device-side spec (`tcp:0` shows as the port bound).
    pub device: String,
    /// The host-side spec the device opens for each connection.
    pub host: String,
}

impl Device {
    /// Asks the device to listen on `device_spec` (`tcp:PORT`, `tcp:0`,
    /// `localabstract:NAME`, `localfilesystem:PATH`) and open `host_spec`
    /// on this connection for every connection it accepts. With
    /// `no_rebind`, a `device_spec` this connection already listens on is an
    /// error instead of being pointed at `host_spec`. Returns the port the
    /// device chose for `tcp:0`.
    pub async fn reverse_forward(
        &self,
        device_spec: &str,
        host_spec: &str,
        no_rebind: bool,
    ) -> Result<Option<u16>> {
        let request = DeviceService::Reverse(ForwardRequest::Forward {
            local: device_spec.to_string(),
            remote: host_spec.to_string(),
            no_rebind,
        });
        let rest = self.reverse_request(&request).await?;
        if rest.is_empty() {
            return Ok(None);
        }
        let port = protocol_string(&rest)
            .and_then(|text| text.parse::<u16>().ok())
            .ok_or_else(|| reply_error(self.serial(), &request.to_string(), &rest))?;
        Ok(Some(port))
    }

    /// This connection's reverse listeners, in the order they were made.
    pub async fn reverse_list(&self) -> Result<Vec<ReverseEntry>> {
        let request = DeviceService::Reverse(ForwardRequest::List);
        let reply = self.reverse_reply(&request).await?;
        let text = protocol_string(&reply)
            .ok_or_else(|| reply_error(self.serial(), &request.to_string(), &reply))?;
        Ok(text
            .lines()
            .filter_map(|line| {
                // `<name> <device spec> <host spec>`; the name is `(reverse)`.
                let mut fields = line.splitn(3, ' ');
                let _name = fields.next()?;
                Some(ReverseEntry {
                    device: fields.next()?.to_string(),
                    host: fields.next()?.to_string(),
                })
            })
            .collect())
    }

    /// Removes this connection's listener on `device_spec`.
    pub async fn reverse_remove(&self, device_spec: &str) -> Result<()> {
        let kill = ForwardRequest::Kill(device_spec.to_string());
        self.reverse_request(&DeviceService::Reverse(kill))
            .await
            .map(drop)
    }

    /// Removes all of this connection's listeners.
    pub async fn reverse_remove_all(&self) -> Result<()> {
        self.reverse_request(&DeviceService::Reverse(ForwardRequest::KillAll))
            .await
            .map(drop)
    }

    /// The next stream the device opens to this host (`adb reverse`), to be
    /// accepted or refused; `None` once the connection has ended. Nothing
    /// is answered until it is taken from here: a host that asked for no
    /// reverse should refuse what it did not ask for.
    pub async fn next_incoming(&self) -> Option<Incoming> {
        self.connection().next_incoming().await
    }

    /// Sends `request`, expects `OKAY`, returns what follows it.
    async fn reverse_request(&self, request: &DeviceService) -> Result<Vec<u8>> {
        let reply = self.reverse_reply(request).await?;
        match reply.strip_prefix(b"OKAY") {
            Some(rest) => Ok(rest.to_vec()),
            None => Err(reply_error(self.serial(), &request.to_string(), &reply)),
        }
    }

    /// The whole reply to `request`: the device closes the stream after it.
    async fn reverse_reply(&self, request: &DeviceService) -> Result<Vec<u8>> {
        let mut stream = self.open(request).await?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await.map_err(|error| {
            Error::io(
                format!("{}: reading the reply to {request}", self.serial()),
                error,
            )
        })?;
        Ok(reply)
    }
}

/// adb's length-prefixed string (four hex digits, then the bytes).
fn protocol_string(bytes: &[u8]) -> Option<String> {
    let len = usize::from_str_radix(std::str::from_utf8(bytes.get(..4)?).ok()?, 16).ok()?;
    let text = bytes.get(4..4 + len)?;
    Some(String::from_utf8_lossy(text).into_owned())
}

/// `FAIL` and its message, or a reply that makes no sense.
fn reply_error(serial: &str, request: &str, reply: &[u8]) -> Error {
    match reply.strip_prefix(b"FAIL").and_then(protocol_string) {
        Some(message) => Error::Reverse {
            request: request.to_string(),
            message,
        },
        None => Error::protocol(
            serial,
            "reverse",
            format!(
                "unexpected reply to {request}: {:?}",
                String::from_utf8_lossy(&reply[..reply.len().min(64)])
            ),
        ),
    }
}

/// A host-side end of a reverse forward, what the device names when it
/// opens a stream: `tcp:PORT` (127.0.0.1), `localabstract:NAME` or
/// `localfilesystem:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEnd {
    Tcp(u16),
    LocalAbstract(String),
    LocalFilesystem(String),
}

/// A connected host-side socket.
pub trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

impl HostEnd {
    pub fn parse(spec: &str) -> std::result::Result<HostEnd, String> {
        let invalid_port =
            || format!("invalid port in {spec:?}: expected tcp:PORT with PORT 1-65535");
        match DeviceService::parse(spec) {
            Ok(DeviceService::Tcp { host: None, port }) => Ok(HostEnd::Tcp(port.get())),
            // This machine's loopback only: no host to name.
            Ok(DeviceService::Tcp { host: Some(_), .. }) => Err(invalid_port()),
            Err(error) if matches!(error.problem, ServiceProblem::TcpPort(_)) => {
                Err(invalid_port())
            }
            Ok(DeviceService::LocalAbstract(name)) if !name.is_empty() => {
                Ok(HostEnd::LocalAbstract(name))
            }
            Ok(DeviceService::LocalFilesystem(path)) if !path.is_empty() => {
                Ok(HostEnd::LocalFilesystem(path))
            }
            _ => Err(format!(
                "unsupported host end {spec:?}: expected tcp:PORT, localabstract:NAME or localfilesystem:PATH"
            )),
        }
    }

    /// Connects to this end on this machine.
    pub async fn connect(&self) -> io::Result<Box<dyn Socket>> {
        Ok(match self {
            HostEnd::Tcp(port) => {
                let socket = tokio::net::TcpStream::connect(("127.0.0.1", *port)).await?;
                socket.set_nodelay(true)?;
                Box::new(socket)
            }
            HostEnd::LocalFilesystem(path) => {
                Box::new(tokio::net::UnixStream::connect(path).await?)
            }
            HostEnd::LocalAbstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                // A unix connect does not wait for the peer to accept.
                let socket = std::os::unix::net::UnixStream::connect_addr(&addr)?;
                socket.set_nonblocking(true)?;
                Box::new(tokio::net::UnixStream::from_std(socket)?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies() {
        assert_eq!(protocol_string(b"000512345"), Some("12345".into()));
        assert_eq!(protocol_string(b"0000"), Some(String::new()));
        assert_eq!(protocol_string(b"0009short"), None);
        let error = reply_error("d", "r", b"FAIL001dcannot rebind existing socket");
        assert_eq!(error.to_string(), "r: cannot rebind existing socket");
        assert!(matches!(
            reply_error("d", "r", b"WHAT"),
            Error::Protocol { .. }
        ));
    }

    #[test]
    fn host_ends() {
        assert_eq!(HostEnd::parse("tcp:80"), Ok(HostEnd::Tcp(80)));
        assert!(HostEnd::parse("tcp:0").is_err());
        assert!(HostEnd::parse("tcp:host:80").is_err());
        assert_eq!(
            HostEnd::parse("localabstract:x"),
            Ok(HostEnd::LocalAbstract("x".into()))
        );
        assert_eq!(
            HostEnd::parse("localfilesystem:/s"),
            Ok(HostEnd::LocalFilesystem("/s".into()))
        );
        assert!(HostEnd::parse("jdwp:1").is_err());
    }
}
