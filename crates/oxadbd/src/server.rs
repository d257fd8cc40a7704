//! Accepts host connections and dispatches the streams they open to services.

use std::sync::Arc;
use std::time::Duration;

use oxadb_engine::{Config, MemoryBudget, Role};
use oxadb_io::{Authenticator, Connection, Incoming};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::auth::KeyAuthenticator;
use crate::config::DaemonConfig;
use crate::services::{forward, shell, sync};

/// Serves every connection accepted on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, config: DaemonConfig) -> std::io::Result<()> {
    let config = Arc::new(config);
    // The banner already leaves `delayed_ack` out when it is switched off.
    let mut engine_config = Config::new(Role::Device, config.banner());
    engine_config.credit_policy = config.credit.policy();
    // One budget for every connection: the limit is per process (seed 003).
    engine_config.memory_budget = Some(Arc::new(MemoryBudget::new(config.memory_budget)));
    engine_config.ack_headroom = config.ack_headroom;
    engine_config.require_auth = config.access.require_auth;
    engine_config.max_streams = config.access.max_streams;
    engine_config.stalled_stream_timeout = config.access.stalled_stream_timeout;
    let authenticator: Option<Arc<dyn Authenticator>> = config.access.require_auth.then(|| {
        Arc::new(KeyAuthenticator::new(
            config.access.keys.clone(),
            config.access.accept_new_keys,
        )) as Arc<dyn Authenticator>
    });
    let slots = Arc::new(Semaphore::new(config.access.max_connections));
    loop {
        let (socket, peer) = match listener.accept().await {
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
        keep_alive(&socket);
        let (connection, run) = match Connection::start_tcp_device(
            socket,
            engine_config.clone(),
            authenticator.clone(),
        ) {
            Ok(started) => started,
            Err(error) => {
                tracing::warn!(%peer, %error, "could not set up connection");
                continue;
            }
        };
        tracing::info!(%peer, "connection accepted");
        let span = tracing::info_span!("connection", %peer);
        tokio::spawn(
            async move {
                let error = run.await;
                drop(slot);
                if error.is_clean() {
                    tracing::info!("connection closed: {error}");
                } else {
                    tracing::warn!("closing connection: {error}");
                }
            }
            .instrument(span.clone()),
        );
        let config = config.clone();
        tokio::spawn(dispatch(connection, config).instrument(span));
    }
}

/// TCP keepalive, so that a host that vanished (cable pulled, laptop shut)
/// does not hold a connection slot forever: probes after 60 s of silence,
/// every 10 s, 6 unanswered close it (about 2 minutes).
fn keep_alive(socket: &tokio::net::TcpStream) {
    use rustix::net::sockopt;
    let result = sockopt::set_socket_keepalive(socket, true)
        .and_then(|()| sockopt::set_tcp_keepidle(socket, Duration::from_secs(60)))
        .and_then(|()| sockopt::set_tcp_keepintvl(socket, Duration::from_secs(10)))
        .and_then(|()| sockopt::set_tcp_keepcnt(socket, 6));
    if let Err(error) = result {
        tracing::debug!(%error, "could not enable TCP keepalive");
    }
}

/// Waits for the host's CNXN (and its authentication, when required) within
/// the configured timeouts; closes the connection otherwise.
async fn handshake(connection: &Connection, config: &DaemonConfig) -> bool {
    let accepted = tokio::time::Instant::now();
    let access = &config.access;
    let outcome = match tokio::time::timeout(access.handshake_timeout, connection.connected()).await
    {
        Ok(outcome) => outcome,
        Err(_) if connection.awaiting_auth() => {
            match tokio::time::timeout_at(accepted + access.auth_timeout, connection.connected())
                .await
            {
                Ok(outcome) => outcome,
                Err(_) => {
                    tracing::warn!(
                        timeout_s = access.auth_timeout.as_secs(),
                        "closing connection: the host did not authenticate in time"
                    );
                    connection.close();
                    return false;
                }
            }
        }
        Err(_) => {
            tracing::warn!(
                timeout_s = access.handshake_timeout.as_secs(),
                "closing connection: no CNXN in time"
            );
            connection.close();
            return false;
        }
    };
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

/// A connection's refused OPENs, logged at WARN the 1st, 2nd, 4th... time
/// and at DEBUG otherwise: a host can ask for nonsense as fast as it likes.
#[derive(Default)]
struct Refusals(std::sync::atomic::AtomicU64);

impl Refusals {
    fn loud(&self) -> bool {
        (self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1).is_power_of_two()
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

async fn dispatch(connection: Connection, config: Arc<DaemonConfig>) {
    if !handshake(&connection, &config).await {
        return;
    }
    let refusals = Arc::new(Refusals::default());
    while let Some(incoming) = connection.next_incoming().await {
        let config = config.clone();
        let refusals = refusals.clone();
        let span =
            tracing::info_span!("stream", id = incoming.id().0, service = %incoming.service());
        tokio::spawn(open_service(incoming, config, refusals).instrument(span));
    }
}

/// Answers one OPEN: starts the service or refuses the stream.
async fn open_service(incoming: Incoming, config: Arc<DaemonConfig>, refusals: Arc<Refusals>) {
    let service = incoming.service().to_string();
    tracing::debug!("open");
    if service.starts_with("shell") || service.starts_with("exec:") {
        let request = match oxadb_wire::shell::ShellRequest::parse(&service) {
            Ok(request) => request,
            Err(error) => {
                refusal!(refusals, %error, "refusing malformed shell request");
                incoming.refuse();
                return;
            }
        };
        let stream = incoming.accept();
        let shell_config = shell::ShellConfig {
            login_shell: config.shell.clone(),
        };
        if let Err(error) = shell::serve(stream, request, &shell_config).await {
            tracing::warn!(%error, "shell service failed");
        }
    } else if service == "sync:" {
        let stream = incoming.accept();
        if let Err(error) = sync::serve(stream).await {
            tracing::warn!(%error, "sync service failed");
        }
    } else if let Some(target) = forward::Target::parse(&service) {
        let target = match target {
            Ok(target) => target,
            Err(error) => {
                refusal!(refusals, %error, "refusing forward");
                incoming.refuse();
                return;
            }
        };
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
    } else if let Some(message) = unsupported_android_service(&service) {
        // Answer in words, as adbd does for requests it cannot honour.
        let mut stream = incoming.accept();
        let _ = stream.write_all(message.as_bytes()).await;
        let _ = stream.shutdown().await;
    } else {
        refusal!(refusals, "refusing unknown service");
        incoming.refuse();
    }
}

/// Android-only services get a readable explanation instead of a bare refusal.
fn unsupported_android_service(service: &str) -> Option<String> {
    let name = service.split(':').next().unwrap_or(service);
    let text = match name {
        "root" if rustix::process::geteuid().is_root() => "adbd is already running as root\n",
        "root" | "unroot" => "oxadbd cannot change the user it runs as\n",
        "reboot" => "oxadbd does not reboot the device; use `adb shell reboot` if you mean it\n",
        "remount" => "remount is Android-specific; use `adb shell mount -o remount,rw PATH`\n",
        "tcpip" | "usb" => "oxadbd's transport is chosen by its command line, not by adb\n",
        "enable-verity" | "disable-verity" => "verity is Android-specific\n",
        _ => return None,
    };
    Some(text.to_string())
}
