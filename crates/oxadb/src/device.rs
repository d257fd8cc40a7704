//! Connecting to a device and opening streams on it.

use std::sync::Arc;
use std::time::Duration;

use oxadb_engine::{AuthReply, Config, MemoryBudget, Role};
use oxadb_io::{AdbStream, Connection, Peer};
use oxadb_wire::{feature, Banner};

use crate::error::{Error, Result};

/// Environment variable that turns burst mode off (any value but `0`), like `--no-burst`.
pub const NO_BURST_ENV: &str = "OXADB_NO_BURST";

pub use oxadb_engine::CreditMode;

/// How to connect.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Flow control: `Classic` does not offer `delayed_ack`; `Aosp` and
    /// `Adaptive` (the default) offer it and differ in how this side grants
    /// credit for what it receives. Burst mode needs the device's offer too.
    pub credit: CreditMode,
    /// Answer AUTH challenges with the keys in `~/.android` (and `ADB_VENDOR_KEYS`).
    pub authenticate: bool,
    /// How long to wait for TCP connect plus the CNXN exchange.
    pub timeout: Duration,
    /// The receive-memory budget this connection's adaptive windows draw
    /// from; `None` shares the process-wide one ([`oxadb_io::process_budget`],
    /// sized from available memory like Linux's `tcp_mem`).
    pub memory_budget: Option<Arc<MemoryBudget>>,
    /// Headroom for clumped deliveries in adaptive windows (seed 004);
    /// switch off only to measure what it brings.
    pub ack_headroom: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        let burst_disabled = std::env::var_os(NO_BURST_ENV).is_some_and(|v| v != "0");
        ConnectOptions {
            credit: if burst_disabled {
                CreditMode::Classic
            } else {
                CreditMode::Adaptive
            },
            authenticate: true,
            timeout: Duration::from_secs(10),
            memory_budget: None,
            ack_headroom: true,
        }
    }
}

/// A connected device.
pub struct Device {
    connection: Connection,
    peer: Peer,
    serial: String,
}

impl Device {
    /// Connects to `addr` (`host:port`; port 5555 when omitted) and completes
    /// the handshake, answering authentication challenges with our keys.
    pub async fn connect(addr: &str, options: &ConnectOptions) -> Result<Device> {
        let serial = if addr.contains(':') {
            addr.to_string()
        } else {
            format!("{addr}:5555")
        };
        let mut banner = Banner::new("host");
        banner.features = feature::IMPLEMENTED.iter().map(|f| f.to_string()).collect();
        if options.credit.delayed_ack() {
            banner.features.push(feature::DELAYED_ACK.to_string());
        }
        let mut config = Config::new(Role::Host, banner);
        config.credit_policy = options.credit.policy();
        config.memory_budget = Some(
            options
                .memory_budget
                .clone()
                .unwrap_or_else(oxadb_io::process_budget),
        );
        config.ack_headroom = options.ack_headroom;
        let connect_error = |source| Error::Connect {
            addr: serial.clone(),
            source,
        };
        let socket = tokio::time::timeout(options.timeout, tokio::net::TcpStream::connect(&serial))
            .await
            .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
            .map_err(connect_error)?;
        let (auth, key_path) = if options.authenticate {
            let keys = oxadb_auth::HostKeys::load_default()?;
            let key_path = keys.public_key_path().display().to_string();
            (Some(auth_responder(keys)), key_path)
        } else {
            (None, String::new())
        };
        let (connection, run) =
            Connection::start_tcp_with_auth(socket, config, auth).map_err(connect_error)?;
        tokio::spawn(run);
        let peer = match tokio::time::timeout(options.timeout, connection.connected()).await {
            Ok(Ok(peer)) => peer,
            Ok(Err(error)) => {
                return Err(Error::ConnectionLost {
                    addr: serial,
                    reason: error.to_string(),
                })
            }
            Err(_) if connection.awaiting_authorization() => {
                connection.close();
                return Err(Error::Unauthorized {
                    addr: serial,
                    key_path,
                });
            }
            Err(_) => {
                connection.close();
                return Err(Error::HandshakeTimeout {
                    addr: serial,
                    seconds: options.timeout.as_secs(),
                });
            }
        };
        tracing::debug!(serial, banner = %peer.banner.encode(), delayed_ack = peer.delayed_ack, "connected");
        Ok(Device {
            connection,
            peer,
            serial,
        })
    }

    /// The `host:port` this device was reached at.
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// The device's CNXN banner (product properties and features).
    pub fn banner(&self) -> &Banner {
        &self.peer.banner
    }

    pub fn features(&self) -> &[String] {
        &self.peer.banner.features
    }

    pub fn has_feature(&self, name: &str) -> bool {
        self.peer.banner.has_feature(name)
    }

    /// Whether streams run with delayed-ack credit (both sides offered it).
    pub fn burst_mode(&self) -> bool {
        self.peer.delayed_ack
    }

    /// Negotiated maximum payload per packet.
    pub fn max_payload(&self) -> u32 {
        self.peer.max_payload
    }

    /// Opens a stream to a service, e.g. `shell,v2,raw:ls` or `sync:`.
    pub async fn open(&self, service: &str) -> Result<AdbStream> {
        self.connection
            .open(service)
            .await
            .map_err(|error| match error.kind() {
                std::io::ErrorKind::ConnectionRefused => Error::ServiceRefused {
                    addr: self.serial.clone(),
                    service: service.to_string(),
                },
                _ => Error::ConnectionLost {
                    addr: self.serial.clone(),
                    reason: error.to_string(),
                },
            })
    }

    /// Ends the connection.
    pub fn close(&self) {
        self.connection.close();
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.connection.close();
    }
}

/// AOSP's order: sign with each key in turn; once all were refused, offer the
/// first public key for the user to accept; after that, wait silently.
fn auth_responder(keys: oxadb_auth::HostKeys) -> oxadb_io::AuthResponder {
    Box::new(move |token: &[u8], attempt: u32| {
        let index = attempt as usize - 1;
        if let Some(key) = keys.keys().get(index) {
            match key.sign_token(token) {
                Ok(signature) => return Some(AuthReply::Signature(signature.into())),
                Err(error) => tracing::warn!(%error, "signing AUTH token failed"),
            }
        }
        if index == keys.keys().len() {
            return Some(AuthReply::PublicKey(keys.public_key_payload().into()));
        }
        None
    })
}
