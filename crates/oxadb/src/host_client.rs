//! A client of an adb host server (Google's adb server or `oxadb server`) on
//! its smart socket, as adb's CLI is one (AOSP `client/adb_client.cpp`):
//! host requests (`host:version`, `host-serial:S:get-state`...) and device
//! services opened through the server (`host:tport:...`, then the service),
//! whose sockets are then plain byte streams to the device. docs/server.md.

use std::net::SocketAddr;
use std::time::Duration;

use oxadb_wire::smart_socket::{self, Status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{Error, Result};

/// The port adb's server listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 5037;

/// How long a server has to answer `host:version` before it counts as none.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Which device a request is for, as adb's `-s`, `-t`, `-d`, `-e` choose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Serial(String),
    TransportId(u64),
    Usb,
    Local,
    Any,
}

impl Selector {
    /// The prefix of a per-device host request (`PREFIX:get-state`).
    pub fn host_prefix(&self) -> String {
        match self {
            Selector::Serial(serial) => format!("host-serial:{serial}"),
            Selector::TransportId(id) => format!("host-transport-id:{id}"),
            Selector::Usb => "host-usb".to_string(),
            Selector::Local => "host-local".to_string(),
            Selector::Any => "host".to_string(),
        }
    }

    /// The request that switches a connection to the device: `tport` forms,
    /// which answer the transport id, except `-t`, which names it already
    /// (`switch_socket_transport` in AOSP `client/adb_client.cpp`).
    fn switch_request(&self) -> String {
        match self {
            Selector::Serial(serial) => format!("host:tport:serial:{serial}"),
            Selector::TransportId(id) => format!("host:transport-id:{id}"),
            Selector::Usb => "host:tport:usb".to_string(),
            Selector::Local => "host:tport:local".to_string(),
            Selector::Any => "host:tport:any".to_string(),
        }
    }
}

/// An adb host server's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostServer {
    pub addr: SocketAddr,
}

impl HostServer {
    pub fn new(addr: SocketAddr) -> HostServer {
        HostServer { addr }
    }

    fn error(&self, message: impl Into<String>) -> Error {
        Error::Server {
            addr: self.addr.to_string(),
            message: message.into(),
        }
    }

    async fn connect(&self) -> Result<TcpStream> {
        let stream = TcpStream::connect(self.addr)
            .await
            .map_err(|cause| Error::Connect {
                addr: format!("the adb server at {}", self.addr),
                cause,
            })?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// The server's version (adb's `ADB_SERVER_VERSION`, 41 today), or
    /// `None` when nothing listens there or what listens does not answer as
    /// an adb server within a moment.
    pub async fn version(&self) -> Option<u32> {
        let answer = tokio::time::timeout(PROBE_TIMEOUT, self.query("host:version")).await;
        match answer {
            Ok(Ok(text)) => match u32::from_str_radix(&text, 16) {
                Ok(version) => Some(version),
                Err(_) => {
                    tracing::debug!(addr = %self.addr, text, "not an adb server's version");
                    None
                }
            },
            Ok(Err(error)) => {
                tracing::debug!(addr = %self.addr, %error, "no adb server");
                None
            }
            Err(_) => {
                tracing::debug!(addr = %self.addr, "no answer to host:version");
                None
            }
        }
    }

    /// Sends `request` on a new connection and reads its status: the
    /// connection after `OKAY`, the server's message as the error after `FAIL`.
    pub async fn request(&self, request: &str) -> Result<TcpStream> {
        let mut stream = self.connect().await?;
        self.send(&mut stream, request).await?;
        self.status(&mut stream).await?;
        Ok(stream)
    }

    /// A request whose answer is one length-prefixed message (adb's `adb_query`).
    pub async fn query(&self, request: &str) -> Result<String> {
        let mut stream = self.request(request).await?;
        self.message(&mut stream).await
    }

    /// `host:kill`: the server answers `OKAY` and stops.
    pub async fn kill(&self) -> Result<()> {
        self.request("host:kill").await.map(drop)
    }

    /// Opens `service` on the device `selector` picks, through the server:
    /// the returned socket carries the service's bytes both ways.
    pub async fn open(&self, selector: &Selector, service: &str) -> Result<TcpStream> {
        let mut stream = self.connect().await?;
        self.send(&mut stream, &selector.switch_request()).await?;
        self.status(&mut stream).await?;
        if !matches!(selector, Selector::TransportId(_)) {
            // The transport id the server chose (8 bytes, little-endian).
            let mut id = [0u8; 8];
            stream
                .read_exact(&mut id)
                .await
                .map_err(|e| self.error(format!("failed to read transport id from server: {e}")))?;
        }
        self.send(&mut stream, service).await?;
        self.status(&mut stream).await?;
        Ok(stream)
    }

    pub(crate) async fn send(&self, stream: &mut TcpStream, request: &str) -> Result<()> {
        let framed = smart_socket::encode_request(request)
            .map_err(|e| self.error(format!("bad request {request:?}: {e}")))?;
        stream
            .write_all(&framed)
            .await
            .map_err(|e| self.error(format!("write failure during connection: {e}")))
    }

    /// Reads `OKAY`, or `FAIL` and its message, which becomes the error.
    pub async fn status(&self, stream: &mut TcpStream) -> Result<()> {
        let mut status = [0u8; 4];
        stream
            .read_exact(&mut status)
            .await
            .map_err(|e| self.error(format!("protocol fault (couldn't read status): {e}")))?;
        match Status::parse(status) {
            Some(Status::Okay) => Ok(()),
            Some(Status::Fail) => {
                let message = self.message(stream).await?;
                Err(Error::ServerFail(message))
            }
            None => Err(self.error(format!(
                "protocol fault (status {:02x} {:02x} {:02x} {:02x}?!)",
                status[0], status[1], status[2], status[3]
            ))),
        }
    }

    /// One message: four hex digits of length, then the text.
    pub async fn message(&self, stream: &mut TcpStream) -> Result<String> {
        let mut length = [0u8; 4];
        stream
            .read_exact(&mut length)
            .await
            .map_err(|e| self.error(format!("protocol fault (couldn't read length): {e}")))?;
        let length = std::str::from_utf8(&length)
            .ok()
            .and_then(|hex| usize::from_str_radix(hex, 16).ok())
            .ok_or_else(|| self.error(format!("protocol fault (bad length {length:?})")))?;
        let mut text = vec![0u8; length];
        stream
            .read_exact(&mut text)
            .await
            .map_err(|e| self.error(format!("protocol fault (couldn't read message): {e}")))?;
        Ok(String::from_utf8_lossy(&text).into_owned())
    }
}

/// A device behind an adb host server: every service is opened through the
/// server with the same selector, as adb's CLI opens each one.
#[derive(Debug, Clone)]
pub struct ServerDevice {
    server: HostServer,
    selector: Selector,
    serial: String,
    features: Vec<String>,
    /// How long its sync sessions wait for a reply with nothing arriving
    /// ([`crate::ConnectOptions::reply_timeout`]).
    reply_timeout: Option<std::time::Duration>,
}

impl ServerDevice {
    /// Asks the server for the device's serial and features; fails with the
    /// server's words when there is no such device (or more than one).
    pub async fn select(server: HostServer, selector: Selector) -> Result<ServerDevice> {
        let prefix = selector.host_prefix();
        let serial = server.query(&format!("{prefix}:get-serialno")).await?;
        let features = server.query(&format!("{prefix}:features")).await?;
        Ok(ServerDevice {
            server,
            selector,
            serial,
            features: features
                .split(',')
                .filter(|f| !f.is_empty())
                .map(str::to_string)
                .collect(),
            reply_timeout: Some(crate::device::DEFAULT_REPLY_TIMEOUT),
        })
    }

    /// Its sync sessions wait at most `limit` for a reply with nothing
    /// arriving (`None`: for ever).
    pub fn with_reply_timeout(mut self, limit: Option<std::time::Duration>) -> ServerDevice {
        self.reply_timeout = limit;
        self
    }

    /// How long its sync sessions wait for a reply with nothing arriving.
    pub fn reply_timeout(&self) -> Option<std::time::Duration> {
        self.reply_timeout
    }

    pub fn server(&self) -> HostServer {
        self.server
    }

    pub fn selector(&self) -> &Selector {
        &self.selector
    }

    pub fn serial(&self) -> &str {
        &self.serial
    }

    pub fn features(&self) -> &[String] {
        &self.features
    }

    pub fn has_feature(&self, name: &str) -> bool {
        self.features.iter().any(|f| f == name)
    }

    /// Opens `service` on the device; the socket then carries its bytes.
    pub async fn open_text(&self, service: &str) -> Result<TcpStream> {
        self.server.open(&self.selector, service).await
    }

    pub async fn open(&self, service: &oxadb_wire::service::DeviceService) -> Result<TcpStream> {
        self.open_text(&service.to_string()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_use_adbs_requests() {
        let serial = Selector::Serial("127.0.0.1:5555".into());
        assert_eq!(serial.host_prefix(), "host-serial:127.0.0.1:5555");
        assert_eq!(serial.switch_request(), "host:tport:serial:127.0.0.1:5555");
        assert_eq!(
            Selector::TransportId(3).host_prefix(),
            "host-transport-id:3"
        );
        assert_eq!(
            Selector::TransportId(3).switch_request(),
            "host:transport-id:3"
        );
        assert_eq!(Selector::Usb.switch_request(), "host:tport:usb");
        assert_eq!(Selector::Local.host_prefix(), "host-local");
        assert_eq!(Selector::Any.host_prefix(), "host");
        assert_eq!(Selector::Any.switch_request(), "host:tport:any");
    }
}
