//! Connecting to a device and opening streams on it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::Instrument;

use oxadb_engine::{AuthReply, Config, MemoryBudget, Role};
use oxadb_io::{AdbStream, Auth, Connection, Peer};
use oxadb_wire::service::DeviceService;
use oxadb_wire::{feature, Banner};

use crate::error::{Error, Result};
use crate::first_bytes::{self, FirstBytes, Seen};
use crate::target::{self, Target};
use crate::usb::UsbDeviceInfo;

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
    /// from, shared by every connection given the same one; `None`: one of
    /// its own, sized from the memory available when it connects, like
    /// Linux's `tcp_mem` ([`oxadb_io::default_budget_limits`]).
    pub memory_budget: Option<Arc<MemoryBudget>>,
    /// Headroom for clumped deliveries in adaptive windows (docs/flow-control.md, "Headroom for clumps");
    /// switch off only to measure what it brings.
    pub ack_headroom: bool,
    /// How long a TCP device may stay silent before the connection is
    /// reported lost ([`oxadb_io::peer`]); `None`: the kernel's defaults.
    pub peer_timeout: Option<oxadb_io::PeerTimeout>,
    /// Send plain pushes' file data by `sendfile` where the connection can
    /// (plaintext TCP; docs/architecture.md, "Zero-copy transfers"). Off by
    /// default; the `oxadb` command turns it on unless told otherwise.
    pub zero_copy: bool,
    /// How long the device may take to answer an OPEN (OKAY or CLSE)
    /// before the open fails; `None`: for ever, as adb.
    pub open_timeout: Option<Duration>,
    /// How long a sync session waits with nothing arriving while the
    /// device owes it a reply (a stat, a listing, a pull's data, a push's
    /// OKAY after its last flush); `None`: for ever, as adb.
    pub reply_timeout: Option<Duration>,
}

/// [`ConnectOptions::open_timeout`]'s default: adbd answers an OPEN once
/// the service exists (a forked shell at worst), in milliseconds; Google's
/// adb waits for ever.
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// [`ConnectOptions::reply_timeout`]'s default, the daemon's limit for a
/// stream stalled by its host (docs/security.md, "Limits"): long enough for
/// the fsync that ends a large push onto slow flash; Google's adb waits for
/// ever.
pub const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(300);

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
            peer_timeout: Some(oxadb_io::DEFAULT_PEER_TIMEOUT),
            zero_copy: false,
            open_timeout: Some(DEFAULT_OPEN_TIMEOUT),
            reply_timeout: Some(DEFAULT_REPLY_TIMEOUT),
        }
    }
}

/// A connected device.
pub struct Device {
    connection: Connection,
    peer: Peer,
    serial: String,
    usb: Option<UsbDeviceInfo>,
    /// [`ConnectOptions::zero_copy`], for this device's sync sessions.
    zero_copy: bool,
    /// [`ConnectOptions::open_timeout`].
    open_timeout: Option<Duration>,
    /// [`ConnectOptions::reply_timeout`], for this device's sync sessions.
    reply_timeout: Option<Duration>,
}

/// What a brief connection tells of a device (`oxadb devices`).
#[derive(Debug, Clone)]
pub enum DeviceState {
    /// Connected: the device's banner.
    Device(Banner),
    /// It waits for its user to accept this host's key.
    Unauthorized,
    /// Another program holds its ADB interface (USB).
    Busy,
    /// This user may not open it (USB: a udev rule is missing).
    NoPermissions,
    /// No handshake: why.
    Offline(String),
}

impl DeviceState {
    /// The word Google's adb prints for it in `adb devices`.
    pub fn word(&self) -> &'static str {
        match self {
            DeviceState::Device(_) => "device",
            DeviceState::Unauthorized => "unauthorized",
            DeviceState::Busy => "busy",
            DeviceState::NoPermissions => "no permissions",
            DeviceState::Offline(_) => "offline",
        }
    }
}

/// The USB devices present when `serial` may name one (not for `host:port`),
/// then [`target::choose`]. A failure to list USB devices only matters when
/// `serial` names nothing else (a `usb:` path, a serial with colons).
pub async fn resolve(serial: Option<&str>) -> Result<Target> {
    let usb = if target::needs_usb_list(serial) {
        match crate::usb::list_devices().await {
            Ok(devices) => devices,
            Err(error) if !target::requires_usb(serial) => {
                tracing::debug!(%error, "no USB devices");
                Vec::new()
            }
            Err(error) => return Err(error),
        }
    } else {
        Vec::new()
    };
    let chosen = target::choose(serial, &usb)?;
    if let (Some(word), Target::Tcp(addr)) = (serial, &chosen) {
        // A bare word no USB device has is tried as a host name; when it is
        // not one either, say both instead of only the DNS failure.
        if target::is_bare_word(word) {
            if let Err(error) = tokio::net::lookup_host(addr.as_str()).await {
                return Err(Error::NoSuchSerial {
                    serial: word.to_string(),
                    cause: error.to_string(),
                });
            }
        }
    }
    Ok(chosen)
}

impl Device {
    /// Connects to the device `serial` names (`-s`, `ANDROID_SERIAL`): a USB
    /// serial or `usb:` path, or `host:port` over TCP; with `None`, the only
    /// USB device present, or [`target::DEFAULT_TCP`] when there is none
    /// (see [`target::choose`]).
    pub async fn connect_serial(serial: Option<&str>, options: &ConnectOptions) -> Result<Device> {
        let target = resolve(serial).await?;
        Device::connect_target(&target, options).await
    }

    pub async fn connect_target(target: &Target, options: &ConnectOptions) -> Result<Device> {
        match target {
            Target::Tcp(addr) => Device::connect(addr, options).await,
            Target::Vsock(spec) => Device::connect_vsock(spec, options, true).await,
            Target::Usb(device) => Device::connect_usb(device, options).await,
        }
    }

    /// Connects to `addr` (`host:port`; port 5555 when omitted) and completes
    /// the handshake, answering authentication challenges with our keys.
    pub async fn connect(addr: &str, options: &ConnectOptions) -> Result<Device> {
        Device::connect_tcp(addr, options, true).await
    }

    /// As [`Device::connect`], but a device that does not accept our keys
    /// is [`Error::Unauthorized`] at once instead of after waiting for its
    /// user to accept the key we offered (adb's `connect` does not wait).
    pub async fn connect_unattended(addr: &str, options: &ConnectOptions) -> Result<Device> {
        Device::connect_tcp(addr, options, false).await
    }

    async fn connect_tcp(
        addr: &str,
        options: &ConnectOptions,
        wait_for_user: bool,
    ) -> Result<Device> {
        let serial = if addr.contains(':') {
            addr.to_string()
        } else {
            format!("{addr}:5555")
        };
        let mut config = host_config(options);
        let connect_error = |cause| Error::Connect {
            addr: serial.clone(),
            cause,
        };
        // Keys first: making one takes a while (seconds in a debug build),
        // which must not eat into the device's time limit for our CNXN.
        let (auth, keys) = host_auth(options);
        let tls = host_tls(options, &serial);
        if tls.is_some() {
            config.tls = oxadb_engine::Tls::On;
        }
        // A reset once connected (the connect's own SO_ERROR check may see it
        // already) is a peer that accepted and hung up without a byte.
        let setup_error = |cause: std::io::Error| match cause.kind() {
            std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::NotConnected
            | std::io::ErrorKind::BrokenPipe => Error::NotAdb {
                addr: serial.clone(),
                got: first_bytes::describe(&[]),
            },
            _ => connect_error(cause),
        };
        let socket = tokio::time::timeout(options.timeout, tokio::net::TcpStream::connect(&serial))
            .await
            .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
            .map_err(setup_error)?;
        oxadb_io::watch_peer(&socket, options.peer_timeout).map_err(setup_error)?;
        socket.set_nodelay(true).map_err(setup_error)?;
        let label = socket.peer_addr().map_err(setup_error)?.to_string();
        // CNXN, and STLS and the TLS handshake if the device asks for TLS
        // (docs/protocol.md, "STLS"); any other answer is left for the driver.
        let mut engine = oxadb_engine::Connection::new(config);
        let started = std::time::Instant::now();
        let transport = tokio::time::timeout(
            options.timeout,
            oxadb_io::tls::negotiate(socket, &mut engine, tls.as_ref(), started),
        )
        .await
        .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
        .map_err(|error| connect_error(std::io::Error::other(error.to_string())))?;
        let (connection, seen) = match transport {
            oxadb_io::tls::TcpTransport::Plain(socket) => {
                // A peer that hung up on our CNXN (reset, so the socket is no
                // longer connected) sent nothing an ADB daemon would.
                let (reader, sink, _) = oxadb_io::tcp_halves(socket).map_err(setup_error)?;
                let (reader, seen) = FirstBytes::new(reader);
                let (connection, run) =
                    Connection::start_engine(reader, sink, engine, started, label, auth);
                spawn_connection(run, &serial);
                (connection, Some(seen))
            }
            tls @ oxadb_io::tls::TcpTransport::Tls { .. } => {
                tracing::debug!(device = %serial, "TLS 1.3 established");
                let (connection, run) = Connection::start_tcp(tls, engine, started, label, auth)
                    .map_err(connect_error)?;
                spawn_connection(run, &serial);
                (connection, None)
            }
        };
        handshake(connection, serial, None, keys, seen, options, wait_for_user).await
    }

    /// Connects to `vsock:CID[:PORT]` (another virtual machine, the host of
    /// this one with CID 2, or this machine with CID 1 and `vsock_loopback`)
    /// and completes the handshake, answering authentication challenges.
    pub async fn connect_vsock(
        spec: &str,
        options: &ConnectOptions,
        wait_for_user: bool,
    ) -> Result<Device> {
        let serial = spec.to_string();
        let connect_error = |cause| Error::Connect {
            addr: serial.clone(),
            cause,
        };
        let (cid, port) = target::parse_vsock(spec)
            .map_err(|message| connect_error(std::io::Error::other(message)))?;
        let address = tokio_vsock::VsockAddr::new(cid, port);
        let (auth, keys) = host_auth(options);
        let socket =
            tokio::time::timeout(options.timeout, tokio_vsock::VsockStream::connect(address))
                .await
                .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
                .map_err(connect_error)?;
        let (reader, writer) = socket.into_split();
        let (reader, seen) = FirstBytes::new(reader);
        let config = host_config(options);
        let (connection, run) = Connection::start(
            reader,
            oxadb_io::StreamSink(writer),
            config,
            serial.clone(),
            auth,
        );
        spawn_connection(run, &serial);
        handshake(
            connection,
            serial,
            None,
            keys,
            Some(seen),
            options,
            wait_for_user,
        )
        .await
    }

    /// Claims `device`'s ADB interface and completes the handshake over its
    /// bulk endpoints, answering authentication challenges with our keys.
    pub async fn connect_usb(device: &UsbDeviceInfo, options: &ConnectOptions) -> Result<Device> {
        Device::connect_usb_inner(device, options, true).await
    }

    /// As [`Device::connect_usb`], but a device that does not accept our
    /// keys is [`Error::Unauthorized`] at once (the adb server's way: it
    /// lists the device as `unauthorized` and tries again).
    pub async fn connect_usb_unattended(
        device: &UsbDeviceInfo,
        options: &ConnectOptions,
    ) -> Result<Device> {
        Device::connect_usb_inner(device, options, false).await
    }

    async fn connect_usb_inner(
        device: &UsbDeviceInfo,
        options: &ConnectOptions,
        wait_for_user: bool,
    ) -> Result<Device> {
        let (reader, sink) = crate::usb::open(device).await?;
        Device::connect_over_usb(reader, sink, device, options, wait_for_user).await
    }

    /// The handshake over a claimed interface's halves (or test fakes).
    pub(crate) async fn connect_over_usb<R, S>(
        reader: R,
        sink: S,
        device: &UsbDeviceInfo,
        options: &ConnectOptions,
        wait_for_user: bool,
    ) -> Result<Device>
    where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
        S: oxadb_io::PacketSink,
    {
        let config = host_config(options);
        let (auth, keys) = host_auth(options);
        let (connection, run) = Connection::start(reader, sink, config, device.label(), auth);
        spawn_connection(run, &device.serial);
        handshake(
            connection,
            device.serial.clone(),
            Some(device.clone()),
            keys,
            None,
            options,
            wait_for_user,
        )
        .await
    }

    /// Connects briefly to tell the device's state, without waiting for its
    /// user to accept our key (that shows as `Unauthorized` at once).
    pub async fn probe(target: &Target, options: &ConnectOptions) -> DeviceState {
        let result = match target {
            Target::Tcp(addr) => Device::connect_tcp(addr, options, false).await,
            Target::Vsock(spec) => Device::connect_vsock(spec, options, false).await,
            Target::Usb(device) => Device::connect_usb_inner(device, options, false).await,
        };
        match result {
            Ok(device) => {
                let banner = device.peer.banner.clone();
                device.close();
                DeviceState::Device(banner)
            }
            Err(Error::Unauthorized { .. }) => DeviceState::Unauthorized,
            Err(Error::UsbClaimed { .. }) => DeviceState::Busy,
            Err(Error::UsbPermission { .. }) => DeviceState::NoPermissions,
            Err(error) => DeviceState::Offline(error.to_string()),
        }
    }

    /// The USB device this connection runs over, if it does.
    pub fn usb(&self) -> Option<&UsbDeviceInfo> {
        self.usb.as_ref()
    }

    /// The `host:port` this device was reached at, or its USB serial.
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

    /// Whether plain pushes to this device may go by `sendfile`
    /// ([`ConnectOptions::zero_copy`]).
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// How long this device's sync sessions wait for a reply with nothing
    /// arriving ([`ConnectOptions::reply_timeout`]).
    pub fn reply_timeout(&self) -> Option<Duration> {
        self.reply_timeout
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
    pub async fn open(&self, service: &DeviceService) -> Result<AdbStream> {
        self.open_text(&service.to_string()).await
    }

    /// Opens a stream to a service named in text as given, unchecked
    /// (`oxadb raw SERVICE`: what a user typed goes to the device as is).
    pub async fn open_text(&self, service: &str) -> Result<AdbStream> {
        let open = self.connection.open(service);
        let opened = match self.open_timeout {
            // Dropping the unanswered open closes its stream (CLSE).
            Some(limit) => {
                tokio::time::timeout(limit, open)
                    .await
                    .map_err(|_| Error::OpenTimeout {
                        addr: self.serial.clone(),
                        service: service.to_string(),
                        seconds: limit.as_secs_f64(),
                    })?
            }
            None => open.await,
        };
        opened.map_err(|error| match error.kind() {
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

    pub(crate) fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Whether the connection has ended (the device went away or closed it).
    pub fn connection_closed(&self) -> bool {
        self.connection.closed().is_some()
    }

    /// Why the connection ended, if it ended without this side closing it
    /// (the device went away mid-command): the error to report.
    pub fn lost(&self) -> Option<Error> {
        lost(&self.connection, &self.serial)
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

/// Runs a device's connection in a span that names the device, so that
/// what the engine logs of it (an OPEN refused because no reverse forward
/// names it, a packet out of place) says which device it was.
fn spawn_connection<F>(run: F, serial: &str)
where
    F: std::future::Future<Output = oxadb_io::ConnectionError> + Send + 'static,
{
    tokio::spawn(run.instrument(tracing::warn_span!("device", serial = %serial)));
}

/// The engine configuration of a host connection, from `options`.
fn host_config(options: &ConnectOptions) -> Config {
    let mut banner = Banner::new("host");
    banner.features = feature::IMPLEMENTED.iter().map(|f| f.to_string()).collect();
    // oxadbd offers `oxadb-delta:` only to hosts that name it.
    banner.features.push(feature::OXADB_DELTA.to_string());
    let mut config = Config::new(Role::Host, banner);
    config.set_credit_mode(options.credit);
    config.memory_budget = Some(
        options
            .memory_budget
            .clone()
            .unwrap_or_else(|| Arc::new(MemoryBudget::new(oxadb_io::default_budget_limits()))),
    );
    config.ack_headroom = options.ack_headroom;
    config
}

/// [`Device::lost`] for a connection and the name it is reached by.
pub(crate) fn lost(connection: &Connection, serial: &str) -> Option<Error> {
    use oxadb_io::ConnectionError;
    let reason = match connection.closed()? {
        ConnectionError::Closed => return None,
        ConnectionError::PeerClosed => "the device closed the connection".to_string(),
        error => error.to_string(),
    };
    Some(Error::ConnectionLost {
        addr: serial.to_string(),
        reason,
    })
}

/// What became of the host keys. Keys that cannot be loaded or made (no
/// writable HOME) fail only a device that asks for one: a device that
/// needs no key works without a usable `~/.android`.
#[derive(Debug, Default)]
struct KeyStatus {
    /// `adbkey.pub`, for the "unauthorized" message.
    public_key_path: String,
    /// Why there are no keys, set once a device asked for one.
    failure: Option<String>,
}

type Keys = Arc<Mutex<KeyStatus>>;

fn key_status(keys: &Keys) -> std::sync::MutexGuard<'_, KeyStatus> {
    keys.lock().unwrap_or_else(|e| e.into_inner())
}

/// The AUTH responder for `options` and what it learns of the keys. The
/// keys are loaded (`adbkey` made if missing) here, before the handshake's
/// clock runs, as making one takes a while.
fn host_auth(options: &ConnectOptions) -> (Auth, Keys) {
    let status = Arc::new(Mutex::new(KeyStatus {
        public_key_path: "~/.android/adbkey.pub".to_string(),
        failure: None,
    }));
    if !options.authenticate {
        return (Auth::None, status);
    }
    let keys = oxadb_auth::HostKeys::load_default().map_err(|error| error.to_string());
    if let Ok(keys) = &keys {
        key_status(&status).public_key_path = keys.public_key_path().display().to_string();
    } else if let Ok(dir) = oxadb_auth::default_android_dir() {
        key_status(&status).public_key_path = dir.join("adbkey.pub").display().to_string();
    }
    (Auth::Host(auth_responder(keys, status.clone())), status)
}

/// The TLS client side for a device at `serial` that sends STLS: our
/// certificate carries our first adb key (the one the device trusts, as
/// adb's does: AOSP client/auth.cpp), and the device's certificate is
/// checked by [`device_cert_check`]. `None` without keys: STLS then ends
/// the connection.
fn host_tls(options: &ConnectOptions, serial: &str) -> Option<oxadb_io::tls::TlsSide> {
    if !options.authenticate {
        return None;
    }
    let keys = oxadb_auth::HostKeys::load_default().ok()?;
    let key = keys.keys().first()?;
    let identity = match oxadb_io::tls::TlsIdentity::self_signed_rsa(key.to_pkcs8_der()) {
        Ok(identity) => identity,
        Err(error) => {
            tracing::warn!(key = key.origin(), %error, "no TLS certificate for our key");
            return None;
        }
    };
    match oxadb_io::tls::client_config(&identity, device_cert_check(serial)) {
        Ok(config) => Some(oxadb_io::tls::TlsSide::Host(config)),
        Err(error) => {
            tracing::warn!(%error, "no TLS client configuration");
            None
        }
    }
}

/// How a device's TLS certificate is checked. adb accepts any: trust in a
/// device comes from pairing (AOSP transport.cpp sets a verify callback that
/// returns 1). The seam for pairing: once `oxadb pair` records a device's
/// certificate, return a check that pins it for `serial` here.
pub fn device_cert_check(_serial: &str) -> Arc<dyn oxadb_io::tls::DeviceCertCheck> {
    Arc::new(oxadb_io::tls::AnyDevice)
}

/// Waits for the CNXN exchange on a started connection, whatever carries it.
/// Without `wait_for_user` an AUTH exchange that needs the device's user
/// ends at once as unauthorized.
async fn handshake(
    connection: Connection,
    serial: String,
    usb: Option<UsbDeviceInfo>,
    keys: Keys,
    seen: Option<Seen>,
    options: &ConnectOptions,
    wait_for_user: bool,
) -> Result<Device> {
    // Polled, as the connection has no wake-up for these: a device that asked
    // for a key we do not have, or (probes only) one that waits for its user.
    let stuck = async {
        loop {
            if key_status(&keys).failure.is_some()
                || (!wait_for_user && connection.awaiting_authorization())
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let outcome = tokio::select! {
        result = tokio::time::timeout(options.timeout, connection.connected()) => result.ok(),
        () = stuck => None,
    };
    let peer = match outcome {
        Some(Ok(peer)) => peer,
        Some(Err(error)) => {
            let first = seen.map(|seen| seen.lock().unwrap_or_else(|e| e.into_inner()).clone());
            if let Some(first) = first.filter(|first| not_adb(first, &error)) {
                return Err(Error::NotAdb {
                    addr: serial,
                    got: first_bytes::describe(&first),
                });
            }
            return Err(Error::ConnectionLost {
                addr: serial,
                reason: error.to_string(),
            });
        }
        None if key_status(&keys).failure.is_some() => {
            connection.close();
            let why = key_status(&keys).failure.take().unwrap_or_default();
            return Err(Error::NoKey { addr: serial, why });
        }
        None if connection.awaiting_authorization() => {
            connection.close();
            return Err(Error::Unauthorized {
                addr: serial,
                key_path: key_status(&keys).public_key_path.clone(),
            });
        }
        None => {
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
        usb,
        zero_copy: options.zero_copy,
        open_timeout: options.open_timeout,
        reply_timeout: options.reply_timeout,
    })
}

/// Whether a handshake that ended with `error` after the peer sent `first`
/// met something else than an ADB daemon: bytes that start no ADB packet,
/// a packet header that is none, or a hang-up before any byte.
fn not_adb(first: &[u8], error: &oxadb_io::ConnectionError) -> bool {
    use oxadb_io::ConnectionError;
    match error {
        ConnectionError::Header(_) => true,
        ConnectionError::PeerClosed | ConnectionError::TruncatedHeader(_) => {
            first.is_empty() || !first_bytes::plausible(first)
        }
        ConnectionError::Io(io) => {
            !first_bytes::plausible(first)
                || (first.is_empty()
                    && matches!(
                        io.kind(),
                        std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::BrokenPipe
                            | std::io::ErrorKind::UnexpectedEof
                    ))
        }
        _ => false,
    }
}

/// AOSP's order: sign with each key in turn; once all were refused, offer the
/// first public key for the user to accept; after that, wait silently.
/// Without keys (`Err`: why) the first challenge ends the handshake with why.
fn auth_responder(
    keys: std::result::Result<oxadb_auth::HostKeys, String>,
    status: Keys,
) -> oxadb_io::AuthResponder {
    Box::new(move |token: &[u8], attempt: u32| {
        let keys = match &keys {
            Ok(keys) => keys,
            Err(why) => {
                key_status(&status).failure = Some(why.clone());
                return None;
            }
        };
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
