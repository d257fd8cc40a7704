//! `reverse:` services: `adb reverse` as Android's adbd serves it
//! (`daemon/services.cpp` reverse_service, `adb.cpp` handle_forward_request,
//! `adb_listeners.cpp`). A listener on the device turns every connection it
//! accepts into a stream the daemon opens to the host, naming the host-side
//! spec (e.g. `tcp:8080`) as the service; the host connects it there.
//!
//! The listeners belong to the connection that asked for them: another
//! connection neither lists nor removes them, and they close when their
//! connection ends.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oxadb_io::{AdbStream, Connection};
use oxadb_wire::service::{ForwardError, ForwardRequest};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::forward::{self, Socket};

/// One connection's reverse listeners, in the order they were made (the
/// order `reverse:list-forward` reports, as adbd's listener list).
pub struct Reverses {
    connection: Connection,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    listeners: Vec<Listener>,
    /// Set once the connection ended: a request still in flight then makes nothing.
    closed: bool,
}

struct Listener {
    /// The device-side spec as listed: `tcp:0` is replaced by the port bound.
    local: String,
    /// The host-side spec; a rebind replaces it for the connections accepted after.
    remote: Arc<Mutex<String>>,
    task: JoinHandle<()>,
    /// A `localfilesystem:` socket's path, removed with the listener.
    socket_file: Option<SocketFile>,
}

/// Why a request failed: the text goes to adb after `FAIL`, which prints it
/// as `error: TEXT`. The texts adb users and tools match on are adbd's
/// (`adb.cpp` handle_forward_request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl Reverses {
    pub fn new(connection: Connection) -> Arc<Reverses> {
        Arc::new(Reverses {
            connection,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves one `reverse:` stream: answers `request` (what followed
    /// `reverse:`, or why it did not parse) and closes the stream, as
    /// adbd's socketpair service does.
    pub async fn serve(
        &self,
        mut stream: AdbStream,
        request: Result<ForwardRequest, ForwardError>,
    ) -> io::Result<()> {
        let reply = match request {
            Ok(request) => self.handle(request).await,
            Err(malformed) => Err(Failure(malformed.to_string())),
        };
        let bytes = match reply {
            Ok(body) => body,
            Err(Failure(message)) => {
                tracing::info!(%message, "reverse request failed");
                let mut bytes = b"FAIL".to_vec();
                bytes.extend_from_slice(&length_prefixed(&message));
                bytes
            }
        };
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    }

    /// Carries out `request`; `Ok` holds the reply's bytes.
    pub async fn handle(&self, request: ForwardRequest) -> Result<Vec<u8>, Failure> {
        match request {
            // adbd sends the list without an OKAY before it (that one is the host server's).
            ForwardRequest::List => Ok(length_prefixed(&self.list())),
            ForwardRequest::KillAll => {
                let removed = std::mem::take(&mut self.state().listeners);
                let count = removed.len();
                stop_all(removed).await;
                tracing::info!(count, "reverse: removed every listener");
                Ok(b"OKAY".to_vec())
            }
            ForwardRequest::Kill(local) => {
                let removed = {
                    let mut state = self.state();
                    let index = state.listeners.iter().position(|l| l.local == local);
                    index.map(|i| state.listeners.remove(i))
                };
                match removed {
                    Some(listener) => {
                        stop_all(vec![listener]).await;
                        tracing::info!(%local, "reverse: listener removed");
                        Ok(b"OKAY".to_vec())
                    }
                    None => Err(Failure(format!("listener '{local}' not found"))),
                }
            }
            ForwardRequest::Forward {
                local,
                remote,
                no_rebind,
            } => self.install(local, remote, no_rebind).await,
        }
    }

    /// `<name> <local> <remote>\n` per listener. Entries from `adb reverse`
    /// carry `(reverse)` where a host-side forward lists the device serial
    /// (`adb_listeners.cpp` format_listeners).
    pub fn list(&self) -> String {
        let state = self.state();
        let mut text = String::new();
        for listener in &state.listeners {
            let remote = listener.remote.lock().unwrap_or_else(|e| e.into_inner());
            text.push_str(&format!("(reverse) {} {}\n", listener.local, remote));
        }
        text
    }

    async fn install(
        &self,
        local: String,
        remote: String,
        no_rebind: bool,
    ) -> Result<Vec<u8>, Failure> {
        {
            let state = self.state();
            if state.closed {
                return Err(Failure("the connection is closing".into()));
            }
            if let Some(existing) = state.listeners.iter().find(|l| l.local == local) {
                if no_rebind {
                    return Err(Failure("cannot rebind existing socket".into()));
                }
                let mut current = existing.remote.lock().unwrap_or_else(|e| e.into_inner());
                tracing::info!(%local, from = %current, to = %remote, "reverse: listener rebound");
                *current = remote;
                return Ok(b"OKAY".to_vec());
            }
        }
        let spec = Spec::parse(&local)
            .map_err(|error| Failure(format!("cannot bind listener: {error}")))?;
        let (bound, socket_file) = spec
            .listen()
            .await
            .map_err(|error| Failure(format!("cannot bind listener: {error}")))?;
        let resolved = match (&spec, &bound) {
            (Spec::Tcp { port: 0, .. }, Bound::Tcp(listener)) => {
                listener.local_addr().ok().map(|a| a.port())
            }
            _ => None,
        };
        let listed = match resolved {
            Some(port) => format!("tcp:{port}"),
            None => local.clone(),
        };
        let remote = Arc::new(Mutex::new(remote));
        let span = tracing::info_span!("reverse", local = %listed);
        let task = tokio::spawn(
            accept_loop(bound, remote.clone(), self.connection.clone()).instrument(span),
        );
        let listener = Listener {
            local: listed.clone(),
            remote: remote.clone(),
            task,
            socket_file,
        };
        let refused = {
            let mut state = self.state();
            if state.closed {
                Some(listener)
            } else {
                state.listeners.push(listener);
                None
            }
        };
        if let Some(listener) = refused {
            // The connection ended while we were binding.
            stop_all(vec![listener]).await;
            return Err(Failure("the connection is closing".into()));
        }
        tracing::info!(
            local = %listed,
            remote = %remote.lock().unwrap_or_else(|e| e.into_inner()),
            "reverse: listening"
        );
        let mut reply = b"OKAY".to_vec();
        if let Some(port) = resolved {
            // adb prints the port it reads after OKAY (`adb reverse tcp:0 ...`).
            reply.extend_from_slice(&length_prefixed(&port.to_string()));
        }
        Ok(reply)
    }

    /// Closes every listener: the connection ended. Requests still in
    /// flight install nothing after this.
    pub async fn close(&self) {
        let removed = {
            let mut state = self.state();
            state.closed = true;
            std::mem::take(&mut state.listeners)
        };
        if !removed.is_empty() {
            tracing::info!(
                count = removed.len(),
                "reverse: connection ended, listeners closed"
            );
        }
        stop_all(removed).await;
    }
}

/// Stops the listeners and waits until their sockets are closed, so that
/// the same spec can be bound again as soon as the reply is read.
async fn stop_all(listeners: Vec<Listener>) {
    for listener in listeners {
        listener.task.abort();
        let _ = listener.task.await;
        drop(listener.socket_file);
    }
}

/// adb's length-prefixed string: four hex digits, then the bytes.
fn length_prefixed(text: &str) -> Vec<u8> {
    // adb's protocol strings cannot say more than 0xffff bytes.
    let text = &text.as_bytes()[..text.len().min(0xffff)];
    let mut bytes = format!("{:04x}", text.len()).into_bytes();
    bytes.extend_from_slice(text);
    bytes
}

/// A device-side spec `adb reverse` may listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    Tcp { ip: std::net::IpAddr, port: u16 },
    LocalAbstract(String),
    LocalFilesystem(String),
}

impl Spec {
    /// Parses a device-side spec. `tcp:PORT` listens on 127.0.0.1 only:
    /// Android's adbd would listen on every interface, which on a Linux
    /// device on a network would hand the host's service to anyone who can
    /// reach the device (docs/security.md). `tcp:localhost:PORT`,
    /// `tcp:127.0.0.1:PORT` and `tcp:[::1]:PORT` name a loopback address
    /// explicitly; other addresses are refused, as adbd refuses them.
    pub fn parse(spec: &str) -> Result<Spec, String> {
        if let Some(rest) = spec.strip_prefix("tcp:") {
            let (host, port) = match rest.rsplit_once(':') {
                Some((host, port)) => (Some(host), port),
                None => (None, rest),
            };
            let port: u16 = port
                .parse()
                .map_err(|_| format!("bad port number in {spec:?}"))?;
            let ip = match host {
                None | Some("localhost" | "127.0.0.1") => Ipv4Addr::LOCALHOST.into(),
                Some("[::1]" | "::1") => Ipv6Addr::LOCALHOST.into(),
                Some(other) => {
                    return Err(format!(
                    "cannot listen on {other:?} in {spec:?}: reverse listeners bind loopback only"
                ))
                }
            };
            return Ok(Spec::Tcp { ip, port });
        }
        if let Some(name) = spec.strip_prefix("localabstract:") {
            if name.is_empty() {
                return Err(format!("empty socket name in {spec:?}"));
            }
            return Ok(Spec::LocalAbstract(name.to_string()));
        }
        if let Some(path) = spec.strip_prefix("localfilesystem:") {
            if path.is_empty() {
                return Err(format!("empty socket path in {spec:?}"));
            }
            return Ok(Spec::LocalFilesystem(path.to_string()));
        }
        if spec.starts_with("localreserved:") || spec.starts_with("local:") {
            return Err(format!(
                "cannot listen on {spec:?}: Android's reserved socket namespace does not exist on Linux"
            ));
        }
        Err(format!(
            "unknown socket specification {spec:?}: expected tcp:PORT, localabstract:NAME or localfilesystem:PATH"
        ))
    }

    async fn listen(&self) -> io::Result<(Bound, Option<SocketFile>)> {
        Ok(match self {
            Spec::Tcp { ip, port } => (
                Bound::Tcp(TcpListener::bind(SocketAddr::new(*ip, *port)).await?),
                None,
            ),
            Spec::LocalAbstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                let listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
                listener.set_nonblocking(true)?;
                (Bound::Unix(UnixListener::from_std(listener)?), None)
            }
            Spec::LocalFilesystem(path) => {
                remove_stale_socket(path).await?;
                let listener = UnixListener::bind(path)
                    .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
                let file = SocketFile::of(path);
                (Bound::Unix(listener), file)
            }
        })
    }
}

/// adbd unlinks whatever is at a `localfilesystem:` path before binding;
/// we remove only a socket nobody listens on, so that neither a file nor
/// another connection's live listener is taken away.
async fn remove_stale_socket(path: &str) -> io::Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{path} exists and is not a socket"),
        ));
    }
    match tokio::net::UnixStream::connect(path).await {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{path}: a process is listening on it"),
        )),
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path)
        }
        Err(error) => Err(io::Error::new(error.kind(), format!("{path}: {error}"))),
    }
}

/// The socket file a `localfilesystem:` listener made, removed with it
/// unless something else has been put at the path since.
struct SocketFile {
    path: String,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    fn of(path: &str) -> Option<SocketFile> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        Some(SocketFile {
            path: path.to_string(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if meta.dev() == self.dev && meta.ino() == self.ino {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

enum Bound {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Bound {
    async fn accept(&self) -> io::Result<Box<dyn Socket>> {
        Ok(match self {
            Bound::Tcp(listener) => {
                let (socket, _) = listener.accept().await?;
                socket.set_nodelay(true)?;
                Box::new(socket)
            }
            Bound::Unix(listener) => Box::new(listener.accept().await?.0),
        })
    }
}

/// Accepts connections until aborted; each becomes a stream opened to the host.
async fn accept_loop(bound: Bound, remote: Arc<Mutex<String>>, connection: Connection) {
    loop {
        let socket = match bound.accept().await {
            Ok(socket) => socket,
            Err(error) => {
                // EMFILE and friends: the listener stays, as adbd's does.
                tracing::warn!(%error, "reverse: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let remote = remote.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let connection = connection.clone();
        let span = tracing::info_span!("stream", service = %remote);
        tokio::spawn(
            async move {
                // A refused OPEN (nothing listens on the host side, or the
                // host does not allow it) closes the accepted socket.
                let stream = match connection.open(&remote).await {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::info!(%error, "reverse: host did not open the stream; closing the accepted connection");
                        return;
                    }
                };
                match forward::relay(stream, socket).await {
                    Ok((to_socket, to_host)) => {
                        tracing::debug!(to_socket, to_host, "reverse connection ended")
                    }
                    Err(error) => tracing::debug!(%error, "reverse connection ended with an error"),
                }
            }
            .instrument(span),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_specs_bind_loopback() {
        assert_eq!(
            Spec::parse("tcp:8080"),
            Ok(Spec::Tcp {
                ip: Ipv4Addr::LOCALHOST.into(),
                port: 8080
            })
        );
        assert_eq!(
            Spec::parse("tcp:[::1]:0"),
            Ok(Spec::Tcp {
                ip: Ipv6Addr::LOCALHOST.into(),
                port: 0
            })
        );
        assert!(Spec::parse("tcp:0.0.0.0:80").is_err());
        assert!(Spec::parse("tcp:70000").is_err());
        assert!(Spec::parse("localreserved:x").is_err());
        assert!(Spec::parse("jdwp:1").is_err());
    }

    #[test]
    fn protocol_strings() {
        assert_eq!(length_prefixed("12345"), b"000512345");
        assert_eq!(length_prefixed(""), b"0000");
    }
}
