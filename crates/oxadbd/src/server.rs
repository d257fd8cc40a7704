//! Accepts host connections (TCP, USB) and dispatches the streams they open
//! to services. Every transport shares one [`Daemon`]: the engine
//! configuration (one memory budget per process, the handshake's deadlines),
//! the authenticator and the per-connection path (services).

use std::net::SocketAddr;
use std::sync::Arc;

use oxadb_engine::{Config, MemoryBudget};
use oxadb_ffs::{FfsError, Gadget};
use oxadb_io::{Auth, Authenticator, Connection, Incoming};
use oxadb_wire::service::{DeviceService, ServiceError, ServiceProblem};
use oxadb_wire::shell::ShellRequest;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::auth::KeyAuthenticator;
use crate::config::{DaemonConfig, Keyless};
use crate::peer_owner::{self, Owner};
use crate::services::command::{self, Route};
use crate::services::props::{Identity, Properties};
use crate::services::{delta, device, forward, framebuffer, reverse, serial, shell, sync, tcpip};

/// What every connection of the daemon shares, whatever its transport.
pub struct Daemon {
    config: Arc<DaemonConfig>,
    engine: Config,
    /// What every `sync:` stream is handed: the settings' and the journal.
    sync: sync::SyncSettings,
    /// Every connection's reads and writes, for trimming the allocator once
    /// they are quiet ([`Daemon::activity`]).
    activity: oxadb_io::Activity,
    authenticator: Option<Arc<dyn Authenticator>>,
    /// The daemon's effective uid: its loopback peers need no key by default.
    euid: u32,
    /// What `getprop` answers.
    properties: Properties,
    /// Where `oxadb-delta:` keeps the digests of what it built, once
    /// [`Daemon::keep_delta_indexes_in`] ran (docs/delta.md).
    delta_indexes: std::sync::OnceLock<crate::services::delta_index::IndexStore>,
    /// `tcpip:`/`usb:` requests to the TCP accept loop.
    switch: tcpip::Switch,
    /// [`serve_usb`] runs: `usb:` may close the TCP listener.
    serves_usb: std::sync::atomic::AtomicBool,
    /// Connection slots shared by the socket transports (TCP, vsock).
    slots: Arc<Semaphore>,
    /// The TCP listener's mDNS announcements, once [`Daemon::announce_mdns`] ran.
    #[cfg(feature = "mdns")]
    mdns: std::sync::OnceLock<crate::mdns::ConnectAnnouncer>,
    /// The daemon's TLS key and certificate, read or made at the first
    /// connection that gets TLS (`Err`: why there is none, logged then).
    #[cfg(feature = "tls")]
    tls_identity: std::sync::OnceLock<Result<oxadb_io::tls::TlsIdentity, String>>,
}

impl Daemon {
    /// A daemon serving with `config`; `journal` (opened at start, see
    /// docs/architecture.md, "transfer") records where pushes make temporary
    /// files, so that a killed daemon's are found at the next start.
    pub fn new(config: DaemonConfig, journal: Option<Arc<oxadb_transfer::Journal>>) -> Arc<Daemon> {
        let config = Arc::new(config);
        let mut engine = config.engine_config();
        // One budget for every connection: the limit is per process
        // (docs/flow-control.md, "Memory budget").
        engine.memory_budget = Some(Arc::new(MemoryBudget::new(config.memory_budget)));
        let authenticator: Option<Arc<dyn Authenticator>> = config.access.uses_keys().then(|| {
            Arc::new(KeyAuthenticator::new(
                config.access.keys.clone(),
                config.access.accept_new_keys,
            )) as Arc<dyn Authenticator>
        });
        let euid = rustix::process::geteuid().as_raw();
        let uname = rustix::system::uname();
        let machine = uname.machine().to_string_lossy();
        let properties = Properties::new(
            &Identity {
                product_name: &config.product_name,
                product_model: &config.product_model,
                product_device: &config.product_device,
                root: euid == 0,
                machine: &machine,
            },
            &config.device.properties,
        );
        let sync = sync::SyncSettings {
            storage: oxadb_transfer::Storage {
                durability: config.durability,
                journal,
            },
            zero_copy: config.zero_copy,
        };
        Arc::new(Daemon {
            slots: Arc::new(Semaphore::new(config.access.max_connections)),
            config,
            engine,
            sync,
            activity: oxadb_io::Activity::default(),
            authenticator,
            euid,
            properties,
            delta_indexes: std::sync::OnceLock::new(),
            switch: tcpip::Switch::default(),
            serves_usb: Default::default(),
            #[cfg(feature = "mdns")]
            mdns: Default::default(),
            #[cfg(feature = "tls")]
            tls_identity: std::sync::OnceLock::new(),
        })
    }

    /// Keeps the digests of images `oxadb-delta:` builds in `dir` (made
    /// when first needed), so the next delta onto the same target need not
    /// read it. Without it every delta reads its old image.
    pub fn keep_delta_indexes_in(&self, dir: std::path::PathBuf) {
        let _ = self
            .delta_indexes
            .set(crate::services::delta_index::IndexStore::new(dir));
    }

    /// Announce the TCP listener over mDNS wherever it is (docs/protocol.md,
    /// "mDNS"), under the instance name kept in `state_dir`. Call before
    /// serving TCP.
    #[cfg(feature = "mdns")]
    pub fn announce_mdns(&self, state_dir: Option<&std::path::Path>) {
        let device = crate::mdns::DeviceInfo::from_properties(&self.properties, state_dir);
        // `_adb-tls-connect._tcp` promises TLS: not with `--tls off`, nor from
        // a build without it.
        let tls_offered = self.config.access.tls.may_use_tls();
        let _ = self
            .mdns
            .set(crate::mdns::ConnectAnnouncer::new(device, tls_offered));
    }

    /// Withdraw the mDNS announcements (goodbye packets), e.g. before exiting.
    #[cfg(feature = "mdns")]
    pub fn withdraw_mdns(&self) {
        if let Some(mdns) = self.mdns.get() {
            mdns.listening(None);
        }
    }

    /// The TCP listener is now at `local`: move the announcements along.
    fn tcp_listening(&self, listener: Option<&TcpListener>) {
        #[cfg(feature = "mdns")]
        if let Some(mdns) = self.mdns.get() {
            mdns.listening(listener.and_then(|l| l.local_addr().ok()));
        }
        #[cfg(not(feature = "mdns"))]
        let _ = listener;
    }

    /// The TLS server side for a host that must (`needs_key`) or need not
    /// show a trusted key: made per connection, so the CA hints follow the
    /// keys file.
    #[cfg(feature = "tls")]
    fn tls_side(&self, needs_key: bool) -> Result<oxadb_io::tls::TlsSide, String> {
        let identity = self
            .tls_identity
            .get_or_init(|| {
                crate::tls::load_or_create_identity(&self.config.access.tls)
                    .map_err(|error| error.to_string())
            })
            .as_ref()?;
        let check = (needs_key && self.authenticator.is_some()).then(|| {
            crate::tls::KeysFileCheck::new(self.config.access.keys.clone())
                as Arc<dyn oxadb_io::tls::ClientKeyCheck>
        });
        oxadb_io::tls::server_config(identity, check)
            .map(oxadb_io::tls::TlsSide::Device)
            .map_err(|error| error.to_string())
    }

    /// Whether the TCP connection from `peer` to `local` must authenticate,
    /// and why, for its log line. Fails closed: a peer whose owner cannot
    /// be found needs a key.
    fn tcp_needs_key(&self, local: SocketAddr, peer: SocketAddr) -> (bool, String) {
        let loopback = peer_owner::is_loopback(peer.ip());
        match self.config.access.keyless {
            Keyless::Everyone => (false, "no key needed: authentication is off".into()),
            Keyless::Nobody => (true, "key required (--auth)".into()),
            Keyless::LocalUsers if loopback => (
                false,
                "no key needed: loopback peer (--trust-local-users)".into(),
            ),
            Keyless::LocalUsers | Keyless::LocalOwners if !loopback => {
                (true, "key required: not a loopback peer".into())
            }
            Keyless::LocalUsers | Keyless::LocalOwners => match peer_owner::peer_owner(local, peer)
            {
                Ok(Owner::Uid(uid)) if uid == 0 || uid == self.euid => (
                    false,
                    format!("no key needed: loopback peer owned by uid {uid}"),
                ),
                Ok(Owner::Uid(uid)) => (
                    true,
                    format!("key required: loopback peer owned by uid {uid}"),
                ),
                Ok(Owner::NotEstablished(state)) => (
                    true,
                    format!(
                        "key required: the peer's socket is no longer established ({}), \
                         so its owner is unknown",
                        peer_owner::state_name(state)
                    ),
                ),
                Ok(Owner::Missing) => (
                    true,
                    "key required: the kernel lists no socket for this peer, so its owner \
                     is unknown"
                        .into(),
                ),
                Err(error) => {
                    tracing::warn!(
                        %peer,
                        %error,
                        "could not find who owns this loopback connection; asking it for a key"
                    );
                    (true, "key required: owner unknown".into())
                }
            },
        }
    }

    pub fn config(&self) -> &DaemonConfig {
        &self.config
    }

    /// What the daemon's connections report their reads and writes to: the
    /// binary trims the allocator once it is quiet
    /// ([`oxadb_io::Activity::trim_when_idle`]).
    pub fn activity(&self) -> oxadb_io::Activity {
        self.activity.clone()
    }
}

/// Serves every connection accepted on `listener` until the task is dropped
/// (without a journal: for daemons in tests).
pub async fn serve(listener: TcpListener, config: DaemonConfig) -> std::io::Result<()> {
    serve_tcp(listener, Daemon::new(config, None)).await
}

/// Serves TCP connections for `daemon` until the task is dropped.
pub async fn serve_tcp(listener: TcpListener, daemon: Arc<Daemon>) -> std::io::Result<()> {
    serve_tcp_switchable(Some(listener), daemon).await
}

/// Serves TCP connections for `daemon` on `listener`, which hosts may move
/// to another port or close (`tcpip:`, `usb:`); with `None`, until a host
/// asks for TCP. Runs until the task is dropped.
pub async fn serve_tcp_switchable(
    mut listener: Option<TcpListener>,
    daemon: Arc<Daemon>,
) -> std::io::Result<()> {
    let config = daemon.config.clone();
    let slots = daemon.slots.clone();
    let mut switch = daemon.switch.take_receiver();
    daemon.tcp_listening(listener.as_ref());
    loop {
        let accepted = tokio::select! {
            accepted = accept(listener.as_ref()) => accepted,
            Some((request, reply)) = async {
                match switch.as_mut() {
                    Some(switch) => switch.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                let usb = daemon.serves_usb.load(std::sync::atomic::Ordering::Relaxed);
                let text = tcpip::apply(request, &mut listener, config.listen.ip(), usb).await;
                daemon.tcp_listening(listener.as_ref());
                let _ = reply.send(text);
                continue;
            }
        };
        let (socket, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // EMFILE and friends: keep serving the connections we have.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(
                %peer,
                max_connections = config.access.max_connections,
                "refusing connection: the daemon serves its maximum of connections"
            );
            drop(socket);
            continue;
        };
        if let Err(error) = oxadb_io::watch_peer(&socket, config.access.peer_timeout) {
            tracing::warn!(%peer, %error, "could not set up dead-peer detection (keepalive, TCP_USER_TIMEOUT)");
        }
        // Decided before the first byte is read, while the peer's socket is
        // still connected (a closed one's owner is not reported faithfully).
        let (needs_key, why) = match socket.local_addr() {
            Ok(local) => daemon.tcp_needs_key(local, peer),
            Err(error) => (true, format!("key required: no local address ({error})")),
        };
        let (tls, tls_why) = config
            .access
            .tls
            .for_peer(peer_owner::is_loopback(peer.ip()));
        tracing::info!(%peer, key = %why, tls = tls_why, "connection accepted");
        let span = tracing::info_span!("connection", %peer);
        tokio::spawn(
            start_tcp_connection(daemon.clone(), socket, peer, needs_key, tls, slot)
                .instrument(span),
        );
    }
}

/// Runs a TCP connection's first packets on the bare socket (CNXN, and STLS
/// and the TLS handshake when `tls` asks for them, within the engine's
/// handshake deadline), then the connection. A host refused for TLS is
/// logged here.
async fn start_tcp_connection(
    daemon: Arc<Daemon>,
    socket: tokio::net::TcpStream,
    peer: SocketAddr,
    needs_key: bool,
    tls: oxadb_engine::Tls,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    if let Err(error) = socket.set_nodelay(true) {
        tracing::warn!(%error, "could not set up connection");
        return;
    }
    let mut engine = daemon.engine.clone();
    engine.require_auth = needs_key && daemon.authenticator.is_some();
    engine.tls = tls;
    #[cfg(feature = "tls")]
    let side = if tls == oxadb_engine::Tls::Off {
        None
    } else {
        match daemon.tls_side(needs_key) {
            Ok(side) => Some(side),
            Err(error) => {
                tracing::warn!("closing connection: TLS is wanted but unavailable: {error}");
                return;
            }
        }
    };
    // `Access::resolve` let no TLS mode but `off` through.
    #[cfg(not(feature = "tls"))]
    let side: Option<oxadb_io::tls::TlsSide> = None;
    let mut engine = oxadb_engine::Connection::new(engine);
    // Time zero of the engine's clock: the handshake's deadlines count from
    // here, on the bare socket and in the driver alike.
    let started = std::time::Instant::now();
    let transport =
        match oxadb_io::tls::negotiate(socket, &mut engine, side.as_ref(), started).await {
            Ok(transport) => transport,
            // A handshake deadline passed: `negotiate` logged which.
            Err(oxadb_io::ConnectionError::Closed) => return,
            Err(error) => {
                tracing::warn!("closing connection: {error}");
                return;
            }
        };
    if transport.is_tls() {
        tracing::info!("TLS 1.3 established: everything after STLS is encrypted");
    }
    let auth = match (&daemon.authenticator, needs_key, transport.is_tls()) {
        // The TLS handshake checked the host's certificate instead of AUTH.
        (Some(authenticator), true, false) => Auth::Device(authenticator.clone()),
        _ => Auth::None,
    };
    let (connection, run) =
        match Connection::start_tcp(transport, engine, started, peer.to_string(), auth) {
            Ok(running) => running,
            Err(error) => {
                tracing::warn!(%error, "could not set up connection");
                return;
            }
        };
    tokio::spawn(run_until_closed(run, slot).in_current_span());
    dispatch(connection, daemon).await;
}

/// Drives a connection to its end, then frees its slot and logs how it ended.
async fn run_until_closed(
    run: impl std::future::Future<Output = oxadb_io::ConnectionError>,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let error = run.await;
    drop(slot);
    if error.is_clean() {
        tracing::info!("connection closed: {error}");
    } else {
        tracing::warn!("closing connection: {error}");
    }
}

/// Starts a connection accepted on a socket transport and its dispatcher;
/// `slot` is held until the connection ends.
#[allow(clippy::too_many_arguments)]
fn start_connection<R, S>(
    daemon: &Arc<Daemon>,
    reader: R,
    sink: S,
    label: String,
    needs_key: bool,
    why: String,
    peer: &dyn std::fmt::Display,
    slot: tokio::sync::OwnedSemaphorePermit,
) where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    S: oxadb_io::PacketSink,
{
    let mut engine = daemon.engine.clone();
    engine.require_auth = needs_key && daemon.authenticator.is_some();
    let auth = match (&daemon.authenticator, needs_key) {
        (Some(authenticator), true) => Auth::Device(authenticator.clone()),
        _ => Auth::None,
    };
    let (connection, run) = Connection::start(reader, sink, engine, label, auth);
    tracing::info!(%peer, key = %why, "connection accepted");
    let span = tracing::info_span!("connection", %peer);
    tokio::spawn(run_until_closed(run, slot).instrument(span.clone()));
    tokio::spawn(dispatch(connection, daemon.clone()).instrument(span));
}

/// The next connection on `listener`; never, without one.
async fn accept(
    listener: Option<&TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// Serves vsock connections (another virtual machine, or the host of this
/// one; AOSP's adbd listens on `vsock:PORT` beside TCP) for `daemon` until
/// the task is dropped. No vsock peer is a loopback peer whose owner the
/// kernel can name, so every one must authenticate unless authentication is
/// off; the handshake's deadlines are TCP's.
pub async fn serve_vsock(
    listener: tokio_vsock::VsockListener,
    daemon: Arc<Daemon>,
) -> std::io::Result<()> {
    let max_connections = daemon.config.access.max_connections;
    loop {
        let (socket, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "vsock accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let peer = format!("vsock:{}:{}", peer.cid(), peer.port());
        let Ok(slot) = daemon.slots.clone().try_acquire_owned() else {
            tracing::warn!(
                %peer,
                max_connections,
                "refusing connection: the daemon serves its maximum of connections"
            );
            drop(socket);
            continue;
        };
        let (needs_key, why) = if daemon.authenticator.is_some() {
            (true, "key required: a vsock peer".to_string())
        } else {
            (false, "no key needed: authentication is off".to_string())
        };
        let (reader, writer) = socket.into_split();
        let label = peer.clone();
        start_connection(
            &daemon,
            reader,
            oxadb_io::StreamSink(writer),
            label,
            needs_key,
            why,
            &peer,
            slot,
        );
    }
}

/// Serves ADB over a USB function (FunctionFS, or a fake in tests) for
/// `daemon`: one connection per time the host enables the function. A USB
/// host must authenticate when the daemon requires it, like any other.
/// Returns only when the function's control endpoint fails.
pub async fn serve_usb<G: Gadget>(gadget: G, daemon: Arc<Daemon>) -> Result<(), FfsError> {
    daemon
        .serves_usb
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let serving = daemon.clone();
    let mut engine = daemon.engine.clone();
    // The function is enabled as soon as the cable is in, and the host's adb
    // server may start any time later: CNXN has no deadline, and
    // `auth_timeout` counts from the host's CNXN.
    engine.handshake_timeout = None;
    oxadb_ffs::serve(
        gadget,
        engine,
        daemon.authenticator.clone(),
        move |connection| {
            let span = tracing::info_span!("connection", peer = "usb");
            tokio::spawn(dispatch(connection, serving.clone()).instrument(span));
        },
    )
    .await
}

fn log_connected(outcome: Result<oxadb_io::Peer, oxadb_io::ConnectionError>) -> bool {
    match outcome {
        Ok(peer) => {
            tracing::info!(
                banner = %peer.banner.encode(),
                delayed_ack = peer.delayed_ack,
                max_payload = peer.max_payload,
                "host connected"
            );
            true
        }
        Err(_) => false,
    }
}

/// A connection's refused OPENs, logged at WARN the first 8 times and then
/// the 16th, 32nd... ([`oxadb_engine::worth_a_warning`]), at DEBUG
/// otherwise: a host can ask for nonsense as fast as it likes.
#[derive(Default)]
struct Refusals(std::sync::atomic::AtomicU64);

impl Refusals {
    fn loud(&self) -> bool {
        oxadb_engine::worth_a_warning(self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1)
    }
}

macro_rules! refusal {
    ($refusals:expr, $($arg:tt)+) => {
        if $refusals.loud() {
            tracing::warn!($($arg)+);
        } else {
            tracing::debug!($($arg)+);
        }
    };
}

async fn dispatch(connection: Connection, daemon: Arc<Daemon>) {
    connection.report_activity_to(&daemon.activity);
    // The engine closes a connection whose handshake misses a deadline
    // (`Config::handshake_timeout`, `auth_timeout`), and logs it.
    if !log_connected(connection.connected().await) {
        return;
    }
    let refusals = Arc::new(Refusals::default());
    // Reverse listeners live as long as this connection (adbd removes a
    // transport's listeners when it disconnects, `adb_listeners.cpp`).
    let reverses = reverse::Reverses::new(connection.clone());
    while let Some(incoming) = connection.next_incoming().await {
        if crate::stop::stopping() {
            refusal!(refusals, service = %incoming.service(), "refusing stream: oxadbd is stopping");
            incoming.refuse();
            continue;
        }
        let daemon = daemon.clone();
        let refusals = refusals.clone();
        let reverses = reverses.clone();
        let span =
            tracing::info_span!("stream", id = incoming.id().0, service = %incoming.service());
        tokio::spawn(open_service(incoming, daemon, refusals, reverses).instrument(span));
    }
    reverses.close().await;
}

/// Answers one OPEN: starts the service or refuses the stream. Service
/// names are parsed by `DeviceService` (oxadb-wire) only; what a malformed
/// one gets is decided in [`answer_malformed`].
async fn open_service(
    incoming: Incoming,
    daemon: Arc<Daemon>,
    refusals: Arc<Refusals>,
    reverses: Arc<reverse::Reverses>,
) {
    let config = &daemon.config;
    tracing::debug!("open");
    let service = match DeviceService::parse(incoming.service()) {
        Ok(service) => service,
        Err(error) => return answer_malformed(incoming, error, &refusals, &reverses).await,
    };
    match service {
        DeviceService::Shell(shell) => serve_shell(incoming, shell.into(), &daemon).await,
        DeviceService::Exec(command) => {
            serve_shell(incoming, ShellRequest::exec(command), &daemon).await
        }
        DeviceService::Sync => {
            let stream = incoming.accept();
            if let Err(error) = sync::serve(stream, daemon.sync.clone()).await {
                tracing::warn!(%error, "sync service failed");
            }
        }
        DeviceService::Delta if incoming.peer_has_feature(oxadb_wire::feature::OXADB_DELTA) => {
            let storage = daemon.sync.storage.clone();
            let indexes = daemon.delta_indexes.get().cloned();
            if let Err(error) = delta::serve(incoming.accept(), storage, indexes).await {
                tracing::warn!(%error, "delta service failed");
            }
        }
        DeviceService::Delta => {
            refusal!(
                refusals,
                "refusing oxadb-delta: the host did not negotiate oxadb_delta"
            );
            incoming.refuse();
        }
        DeviceService::Reverse(request) => {
            if let Err(error) = reverses.serve(incoming.accept(), Ok(request)).await {
                tracing::debug!(%error, "reverse: could not send the reply");
            }
        }
        DeviceService::Tcp { host, port } => {
            serve_forward(incoming, forward::Target::tcp(host, port), &refusals).await
        }
        DeviceService::LocalAbstract(name) => {
            serve_forward(incoming, forward::Target::LocalAbstract(name), &refusals).await
        }
        DeviceService::LocalFilesystem(path) => {
            serve_forward(incoming, forward::Target::LocalFilesystem(path), &refusals).await
        }
        DeviceService::Dev { path, raw } => {
            // Opened (and made raw) before answering: a node that cannot be is
            // a refused OPEN, as in adbd.
            let node = match serial::Request::new(&path, raw)
                .and_then(|request| serial::open(&request).map_err(|e| e.to_string()))
            {
                Ok(node) => node,
                Err(error) => {
                    refusal!(refusals, %error, "refusing device stream");
                    incoming.refuse();
                    return;
                }
            };
            match forward::relay(incoming.accept(), node).await {
                Ok((to_device, from_device)) => {
                    tracing::debug!(to_device, from_device, "device stream ended")
                }
                Err(error) => tracing::debug!(%error, "device stream ended with an error"),
            }
        }
        DeviceService::Framebuffer => {
            if let Err(error) = framebuffer::serve(incoming.accept(), &config.framebuffer).await {
                tracing::debug!(%error, "framebuffer stream ended with an error");
            }
        }
        DeviceService::Reboot(target) => {
            let command = device::reboot_command(config.device.reboot_command.as_deref());
            device::reboot(incoming.accept(), &target, command).await;
        }
        DeviceService::TcpIp(port) => {
            let request = tcpip::Request::Tcp(port.get());
            serve_switch(incoming, request, &daemon).await;
        }
        DeviceService::Usb => serve_switch(incoming, tcpip::Request::Usb, &daemon).await,
        DeviceService::Root
        | DeviceService::Unroot
        | DeviceService::Remount(_)
        | DeviceService::EnableVerity
        | DeviceService::DisableVerity => {
            // Answer in words, as adbd does for requests it cannot honour.
            if let Some(message) = device::answer(&service, daemon.euid == 0) {
                answer_text(incoming, message).await;
            }
        }
        // Android's: no reserved socket namespace, Java debugger, binder
        // shell or benchmark services on a Linux device.
        DeviceService::LocalReserved(_)
        | DeviceService::Local(_)
        | DeviceService::Jdwp(_)
        | DeviceService::TrackJdwp
        | DeviceService::TrackApp
        | DeviceService::Abb(_)
        | DeviceService::AbbExec(_)
        | DeviceService::Sink(_)
        | DeviceService::Source(_) => {
            refusal!(refusals, "refusing a service oxadbd does not serve");
            incoming.refuse();
        }
    }
}

/// A service name that did not parse: `tcpip:` and `reverse:` answer in
/// adbd's words on an accepted stream, anything else is refused.
async fn answer_malformed(
    incoming: Incoming,
    error: ServiceError,
    refusals: &Refusals,
    reverses: &reverse::Reverses,
) {
    match error.problem {
        ServiceProblem::TcpipPort(port) => answer_text(incoming, &tcpip::invalid_port(&port)).await,
        ServiceProblem::Forward(malformed) => {
            if let Err(error) = reverses.serve(incoming.accept(), Err(malformed)).await {
                tracing::debug!(%error, "reverse: could not send the reply");
            }
        }
        ServiceProblem::Unknown => {
            refusal!(refusals, "refusing unknown service");
            incoming.refuse();
        }
        _ => {
            refusal!(refusals, %error, "refusing malformed service");
            incoming.refuse();
        }
    }
}

/// `shell`/`exec:`: a line oxadbd serves itself, or the login shell.
async fn serve_shell(incoming: Incoming, mut request: ShellRequest, daemon: &Daemon) {
    let path = std::env::var("PATH").unwrap_or_else(|_| shell::DEFAULT_PATH.into());
    match command::route(&request.command, &daemon.properties, &path) {
        Route::Shell => {}
        Route::Replace(line) => {
            tracing::debug!(command = %line, "served by the system log");
            request.command = line;
        }
        Route::Answer(answer) => {
            tracing::debug!(status = answer.status, "answered by oxadbd itself");
            let stream = incoming.accept();
            shell::answer(
                stream,
                &request,
                &answer.stdout,
                &answer.stderr,
                answer.status,
            )
            .await;
            return;
        }
    }
    let stream = incoming.accept();
    let shell_config = shell::ShellConfig {
        login_shell: daemon.config.shell.clone(),
    };
    if let Err(error) = shell::serve(stream, request, &shell_config).await {
        tracing::warn!(%error, "shell service failed");
    }
}

/// `tcp:`, `localabstract:`, `localfilesystem:`: connects, then relays.
async fn serve_forward(incoming: Incoming, target: forward::Target, refusals: &Refusals) {
    // Connect before answering: a failed connect is a refused OPEN, as in adbd.
    let socket = match target.connect().await {
        Ok(socket) => socket,
        Err(error) => {
            refusal!(refusals, %target, %error, "forward target unreachable; refusing stream");
            incoming.refuse();
            return;
        }
    };
    match forward::relay(incoming.accept(), socket).await {
        Ok((to_target, from_target)) => {
            tracing::debug!(%target, to_target, from_target, "forward ended")
        }
        Err(error) => tracing::debug!(%target, %error, "forward ended with an error"),
    }
}

/// `tcpip:PORT`, `usb:`: asks the TCP accept loop, answers in words.
async fn serve_switch(incoming: Incoming, request: tcpip::Request, daemon: &Daemon) {
    daemon
        .switch
        .serve(incoming.accept(), request, daemon.config.device.allow_tcpip)
        .await
}

/// Accepts the stream, writes `text` and closes it.
async fn answer_text(incoming: Incoming, text: &str) {
    let mut stream = incoming.accept();
    let _ = stream.write_all(text.as_bytes()).await;
    let _ = stream.shutdown().await;
}
