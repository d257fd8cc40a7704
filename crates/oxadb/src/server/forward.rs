//! `adb forward` in the server: listeners on this machine, each relaying
//! every connection it accepts to a new stream on its device (AOSP
//! `adb_listeners.cpp`, `adb.cpp` handle_forward_request). A listener
//! belongs to a transport and goes with it; while the device is offline
//! its connections are closed at once.

use std::sync::{Arc, Mutex, MutexGuard};

use oxadb_wire::service::ForwardRequest;
use oxadb_wire::smart_socket::{fail, message, OKAY};
use tokio::net::{TcpListener, UnixListener};
use tokio::task::AbortHandle;

use super::registry::{Registry, TransportId, TransportInfo};

/// Where a listener's connections go; a rebind changes it in place.
#[derive(Debug, Clone)]
struct Target {
    transport: TransportId,
    serial: String,
    remote: String,
}

struct Listener {
    /// As listed: `tcp:PORT` (the port bound, for `tcp:0`),
    /// `localfilesystem:PATH`, `localabstract:NAME`.
    local: String,
    target: Arc<Mutex<Target>>,
    accept: AbortHandle,
    /// The socket file a `localfilesystem:` listener made.
    socket_file: Option<String>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.accept.abort();
        if let Some(path) = &self.socket_file {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The server's forward listeners, in the order they were made.
pub struct Forwards {
    registry: Arc<Registry>,
    listeners: Mutex<Vec<Listener>>,
}

/// Why a forward was not installed, in adb's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallError {
    CannotRebind,
    CannotBind(String),
}

impl InstallError {
    pub fn message(&self) -> String {
        match self {
            InstallError::CannotRebind => "cannot rebind existing socket".to_string(),
            InstallError::CannotBind(why) => format!("cannot bind listener: {why}"),
        }
    }
}

impl Forwards {
    pub fn new(registry: Arc<Registry>) -> Arc<Forwards> {
        Arc::new(Forwards {
            registry,
            listeners: Mutex::new(Vec::new()),
        })
    }

    /// Drops the listeners of transports that are gone (as adb's server
    /// does when a transport is removed).
    fn prune(&self) -> MutexGuard<'_, Vec<Listener>> {
        let mut listeners = lock(&self.listeners);
        listeners.retain(|l| self.registry.contains(lock(&l.target).transport));
        listeners
    }

    /// `list-forward`'s text: `SERIAL LOCAL REMOTE` lines.
    pub fn list(&self) -> String {
        format_list(self.prune().iter().map(|l| {
            let target = lock(&l.target);
            (
                target.serial.clone(),
                l.local.clone(),
                target.remote.clone(),
            )
        }))
    }

    /// `forward:[norebind:]LOCAL;REMOTE` for `transport`: the port bound
    /// when a new `tcp:` listener was made (adb prints it), `None` when an
    /// existing listener was pointed elsewhere.
    pub async fn install(
        self: &Arc<Self>,
        local: &str,
        remote: &str,
        transport: &TransportInfo,
        no_rebind: bool,
    ) -> Result<Option<u16>, InstallError> {
        let target = Target {
            transport: transport.id,
            serial: transport.serial.clone(),
            remote: remote.to_string(),
        };
        if let Some(existing) = self.prune().iter().find(|l| l.local == local) {
            if no_rebind {
                return Err(InstallError::CannotRebind);
            }
            *lock(&existing.target) = target;
            return Ok(None);
        }
        let bound = Bound::bind(local).await.map_err(InstallError::CannotBind)?;
        let target = Arc::new(Mutex::new(target));
        let (local, port, socket_file) = match &bound {
            Bound::Tcp(listener) => {
                let port = listener
                    .local_addr()
                    .map(|a| a.port())
                    .map_err(|e| InstallError::CannotBind(e.to_string()))?;
                (format!("tcp:{port}"), Some(port), None)
            }
            Bound::Unix(_, file) => (local.to_string(), None, file.clone()),
        };
        let accept = tokio::spawn(serve(bound, self.registry.clone(), target.clone()));
        let mut listeners = lock(&self.listeners);
        if listeners.iter().any(|l| l.local == local) {
            // Another client bound the same name meanwhile (`tcp:0` never does).
            accept.abort();
            return Err(InstallError::CannotRebind);
        }
        listeners.push(Listener {
            local,
            target,
            accept: accept.abort_handle(),
            socket_file,
        });
        Ok(port)
    }

    /// `killforward:LOCAL`; `Err` is adb's message.
    pub fn remove(&self, local: &str) -> Result<(), String> {
        let mut listeners = self.prune();
        match listeners.iter().position(|l| l.local == local) {
            Some(at) => {
                listeners.remove(at);
                Ok(())
            }
            None => Err(format!("listener '{local}' not found")),
        }
    }

    /// `killforward-all`.
    pub fn remove_all(&self) {
        lock(&self.listeners).clear();
    }

    /// The reply to a forwarding request (AOSP `adb.cpp`
    /// handle_forward_request, host side: a first `OKAY` for the request,
    /// a second for its status, then the port a new `tcp:` listener got).
    pub async fn answer(
        self: &Arc<Self>,
        request: &ForwardRequest,
        transport: Option<&TransportInfo>,
    ) -> Vec<u8> {
        let twice = || [OKAY.as_slice(), OKAY.as_slice()].concat();
        match (request, transport) {
            (ForwardRequest::List, _) => {
                let mut reply = OKAY.to_vec();
                reply.extend_from_slice(&message(&self.list()));
                reply
            }
            (ForwardRequest::KillAll, _) => {
                self.remove_all();
                twice()
            }
            (ForwardRequest::Kill(local), Some(_)) => match self.remove(local) {
                Ok(()) => twice(),
                Err(error) => fail(&error),
            },
            (
                ForwardRequest::Forward {
                    local,
                    remote,
                    no_rebind,
                },
                Some(transport),
            ) => match self.install(local, remote, transport, *no_rebind).await {
                Ok(port) => {
                    let mut reply = twice();
                    if let Some(port) = port {
                        reply.extend_from_slice(&message(&port.to_string()));
                    }
                    reply
                }
                Err(error) => fail(&error.message()),
            },
            (_, None) => fail(super::host::NO_DEVICES),
        }
    }
}

/// `list-forward`'s lines (AOSP `adb_listeners.cpp` format_listeners).
pub fn format_list(entries: impl Iterator<Item = (String, String, String)>) -> String {
    entries
        .map(|(serial, local, remote)| format!("{serial} {local} {remote}\n"))
        .collect()
}

enum Bound {
    Tcp(TcpListener),
    /// And the socket file to remove, for `localfilesystem:`.
    Unix(UnixListener, Option<String>),
}

impl Bound {
    /// Binds LOCAL as adb's server does: `tcp:PORT` on 127.0.0.1 (AOSP
    /// `socket_spec.cpp`), a unix socket at a path or an abstract name.
    async fn bind(local: &str) -> Result<Bound, String> {
        if let Some(port) = local.strip_prefix("tcp:") {
            let port: u16 = port
                .parse()
                .map_err(|_| format!("invalid port in {local:?}"))?;
            let listener = TcpListener::bind(("127.0.0.1", port))
                .await
                .map_err(|e| format!("cannot bind to 127.0.0.1:{port}: {e}"))?;
            return Ok(Bound::Tcp(listener));
        }
        if let Some(path) = local.strip_prefix("localfilesystem:") {
            let listener =
                UnixListener::bind(path).map_err(|e| format!("cannot bind to {path}: {e}"))?;
            return Ok(Bound::Unix(listener, Some(path.to_string())));
        }
        if let Some(name) = local.strip_prefix("localabstract:") {
            use std::os::linux::net::SocketAddrExt;
            let bind = || -> std::io::Result<UnixListener> {
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                let listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
                listener.set_nonblocking(true)?;
                UnixListener::from_std(listener)
            };
            return bind()
                .map(|listener| Bound::Unix(listener, None))
                .map_err(|e| format!("cannot bind to {local}: {e}"));
        }
        Err(format!("unsupported local spec {local:?}"))
    }
}

/// Accepts until aborted; each connection gets a stream on the target's
/// device, or is closed at once when it is not online.
async fn serve(bound: Bound, registry: Arc<Registry>, target: Arc<Mutex<Target>>) {
    loop {
        let accepted = match &bound {
            Bound::Tcp(listener) => listener.accept().await.and_then(|(socket, _)| {
                socket.set_nodelay(true)?;
                Ok(Accepted::Tcp(socket))
            }),
            Bound::Unix(listener, _) => listener
                .accept()
                .await
                .map(|(socket, _)| Accepted::Unix(socket)),
        };
        let socket = match accepted {
            Ok(socket) => socket,
            Err(error) => {
                tracing::warn!(%error, "forward listener: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let target = lock(&target).clone();
        let registry = registry.clone();
        tokio::spawn(async move {
            let Some(device) = registry.device(target.transport) else {
                tracing::debug!(serial = %target.serial, "forward: device not online");
                return;
            };
            match device.open_text(&target.remote).await {
                // A TCP client's bytes are spliced to the device (`relay_tcp`).
                Ok(stream) => match socket {
                    Accepted::Tcp(mut socket) => super::relay_tcp(&mut socket, stream).await,
                    Accepted::Unix(socket) => super::relay(socket, stream).await,
                },
                Err(error) => tracing::debug!(%error, "forward: device refused"),
            }
        });
    }
}

/// A connection to a forward listener.
enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_adbs_lines() {
        let entries = vec![
            (
                "127.0.0.1:5555".to_string(),
                "tcp:8000".to_string(),
                "tcp:80".to_string(),
            ),
            (
                "10.0.0.2:5555".to_string(),
                "localfilesystem:/tmp/s".to_string(),
                "localabstract:x".to_string(),
            ),
        ];
        assert_eq!(
            format_list(entries.into_iter()),
            "127.0.0.1:5555 tcp:8000 tcp:80\n10.0.0.2:5555 localfilesystem:/tmp/s localabstract:x\n"
        );
        assert_eq!(format_list(std::iter::empty()), "");
        assert_eq!(
            InstallError::CannotRebind.message(),
            "cannot rebind existing socket"
        );
    }

    #[tokio::test]
    async fn forwards_bind_list_rebind_and_go() {
        let registry = Registry::new(crate::ConnectOptions::default());
        let forwards = Forwards::new(registry.clone());
        // No transport 1 in the registry: listeners of unknown transports
        // are pruned, so the list and removal see nothing.
        let transport = TransportInfo {
            id: 1,
            kind: super::super::registry::Kind::Tcp,
            serial: "127.0.0.1:5555".into(),
            state: super::super::registry::State::Device,
            devpath: String::new(),
            product: String::new(),
            model: String::new(),
            device: String::new(),
            features: Vec::new(),
        };
        let port = forwards
            .install("tcp:0", "tcp:80", &transport, false)
            .await
            .unwrap()
            .expect("a port");
        assert_ne!(port, 0);
        assert_eq!(forwards.list(), "");
        assert_eq!(
            forwards.remove(&format!("tcp:{port}")),
            Err(format!("listener 'tcp:{port}' not found"))
        );
        let reply = forwards
            .answer(&ForwardRequest::Kill("tcp:1".into()), Some(&transport))
            .await;
        assert_eq!(reply, fail("listener 'tcp:1' not found"));
        assert_eq!(
            forwards.answer(&ForwardRequest::KillAll, None).await,
            b"OKAYOKAY"
        );
        assert_eq!(
            forwards.answer(&ForwardRequest::List, None).await,
            b"OKAY0000"
        );
    }
}
