//! The [`Connection`] handle: one constructor, [`Connection::start`], for
//! every transport and role; and [`Incoming`], a stream the peer opens.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use oxadb_engine::{Config, Peer, Role, StreamId};
use tokio::io::AsyncRead;
use tokio::sync::Notify;
use tracing::Instrument;

use crate::auth::{Auth, Authentication};
use crate::driver::{read_loop, timer_loop, write_loop, Shared, State, StreamWakers};
use crate::sink::PacketSink;
use crate::stream::AdbStream;
use crate::tcp_sink::TcpSink;
use crate::tls::TcpTransport;
use crate::ConnectionError;

/// The future that drives a connection started by [`Connection::start_tcp`]
/// (spawn it); it ends with why the connection ended.
pub type ConnectionRun = Pin<Box<dyn std::future::Future<Output = ConnectionError> + Send>>;

/// A running connection. Cheap to clone; the connection ends when the peer
/// goes away, on a protocol error, or when [`Connection::close`] is called.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
}

/// A stream the peer asked to open, waiting for [`Incoming::accept`] or [`Incoming::refuse`].
pub struct Incoming {
    shared: Arc<Shared>,
    id: StreamId,
    service: String,
    answered: bool,
}

impl Incoming {
    pub fn service(&self) -> &str {
        &self.service
    }

    pub fn id(&self) -> StreamId {
        self.id
    }

    /// Whether the peer's CNXN named `feature`: a service offered only to
    /// peers that asked for it checks this before accepting.
    pub fn peer_has_feature(&self, feature: &str) -> bool {
        let state = self.shared.lock();
        state
            .engine
            .peer()
            .is_some_and(|peer| peer.banner.has_feature(feature))
    }

    pub fn accept(mut self) -> AdbStream {
        self.answered = true;
        let mut state = self.shared.lock();
        state.streams.entry(self.id).or_default();
        // Can only fail if the connection was reset meanwhile; the stream then reads EOF.
        let _ = state.engine.accept(self.id);
        self.shared.after_engine_call(&mut state);
        drop(state);
        AdbStream {
            shared: self.shared.clone(),
            id: self.id,
        }
    }

    pub fn refuse(mut self) {
        self.answered = true;
        let mut state = self.shared.lock();
        let _ = state.engine.refuse(self.id);
        self.shared.after_engine_call(&mut state);
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if !self.answered {
            let mut state = self.shared.lock();
            let _ = state.engine.refuse(self.id);
            self.shared.after_engine_call(&mut state);
        }
    }
}

impl Connection {
    /// Starts driving `config`'s engine: bytes come in through `reader` (a
    /// byte stream, even over USB, where the device's bulk-out transfers are
    /// read back to back) and packets go out through `sink` ([`StreamSink`](crate::StreamSink)
    /// around any byte writer; [`tcp_halves`] makes both of a TCP stream).
    /// `label` names the peer in logs. `auth` says who authenticates: the host
    /// answering a device's AUTH tokens, or the device letting hosts in
    /// (with `config.require_auth`). Returns the handle and a future that
    /// completes when the connection ends (spawn it).
    pub fn start<R, S>(
        reader: R,
        sink: S,
        config: Config,
        label: impl Into<String>,
        auth: Auth,
    ) -> (
        Connection,
        impl std::future::Future<Output = ConnectionError>,
    )
    where
        R: AsyncRead + Unpin + Send + 'static,
        S: PacketSink,
    {
        Connection::start_engine(
            reader,
            sink,
            oxadb_engine::Connection::new(config),
            std::time::Instant::now(),
            label,
            auth,
        )
    }

    /// [`Connection::start`] with an engine that has already exchanged its
    /// first packets ([`tls::negotiate`](crate::tls::negotiate)) on a clock
    /// that started at `started`, which goes on; events it queued meanwhile
    /// are handled first.
    pub fn start_engine<R, S>(
        reader: R,
        sink: S,
        engine: oxadb_engine::Connection,
        started: std::time::Instant,
        label: impl Into<String>,
        auth: Auth,
    ) -> (
        Connection,
        impl std::future::Future<Output = ConnectionError>,
    )
    where
        R: AsyncRead + Unpin + Send + 'static,
        S: PacketSink,
    {
        let label = label.into();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                engine,
                authentication: Authentication::new(auth),
                label: label.clone(),
                timer_deadline: None,
                streams: HashMap::new(),
                incoming: VecDeque::new(),
                incoming_waker: None,
                connected_waker: None,
                closed: None,
            }),
            transmit: Notify::new(),
            close_requested: Notify::new(),
            drained: Notify::new(),
            deadline_moved: Notify::new(),
            label,
            epoch: started,
            file_ranges: sink.takes_file_ranges(),
            activity: std::sync::OnceLock::new(),
        });
        {
            let mut state = shared.lock();
            shared.after_engine_call(&mut state);
        }
        let connection = Connection {
            shared: shared.clone(),
        };
        let run = async move {
            let writer_task = tokio::spawn(write_loop(shared.clone(), sink));
            // In the span the caller gave this future: a handshake timeout
            // is logged from the timer loop.
            let timer_task = tokio::spawn(timer_loop(shared.clone()).in_current_span());
            let error = tokio::select! {
                error = read_loop(&shared, reader) => error,
                _ = shared.close_requested.notified() => ConnectionError::Closed,
            };
            let error = {
                let mut state = shared.lock();
                state.shut(error);
                state.closed.clone().expect("just set")
            };
            // Wake the writer so it sees `closed` and exits, dropping the
            // socket, and the timer loop so it exits too.
            shared.transmit.notify_one();
            shared.deadline_moved.notify_one();
            let _ = writer_task.await;
            let _ = timer_task.await;
            // The writer may have found the real cause after the reader's end
            // of file (`State::shut`).
            let closed = shared.lock().closed.clone();
            closed.unwrap_or(error)
        };
        (connection, run)
    }

    /// Starts a TCP connection after [`tls::negotiate`](crate::tls::negotiate)
    /// (the engine's clock going on from `started`, the instant given to
    /// it): a plaintext socket keeps [`TcpSink`]'s fast paths (file ranges by
    /// `sendfile`); a TLS one copies every payload into TLS records
    /// (`tls_stream`). Both keep the socket's send buffer full. `label`
    /// names the peer in logs.
    pub fn start_tcp(
        transport: TcpTransport,
        engine: oxadb_engine::Connection,
        started: std::time::Instant,
        label: String,
        auth: Auth,
    ) -> io::Result<(Connection, ConnectionRun)> {
        Ok(match transport {
            TcpTransport::Plain(stream) => {
                let (reader, sink, _) = tcp_halves(stream)?;
                let (connection, run) =
                    Connection::start_engine(reader, sink, engine, started, label, auth);
                (connection, Box::pin(run))
            }
            #[cfg(feature = "tls")]
            TcpTransport::Tls { socket, session } => {
                socket.set_nodelay(true)?;
                let (reader, sink) = crate::tls_stream::split(socket, *session);
                let (connection, run) =
                    Connection::start_engine(reader, sink, engine, started, label, auth);
                (connection, Box::pin(run))
            }
        })
    }

    /// Reports this connection's reads and writes to `activity` from now on
    /// (the daemon's idle trimming, [`Activity::trim_when_idle`]); the first
    /// call counts, later ones change nothing.
    ///
    /// [`Activity::trim_when_idle`]: crate::Activity::trim_when_idle
    pub fn report_activity_to(&self, activity: &crate::Activity) {
        let _ = self.shared.activity.set(activity.clone());
    }

    /// Device role: the host sent CNXN and has not authenticated yet.
    pub fn awaiting_auth(&self) -> bool {
        self.shared.lock().engine.awaiting_auth()
    }

    /// Whether the device refused our keys and waits for its user to accept ours.
    pub fn awaiting_authorization(&self) -> bool {
        self.shared.lock().authentication.awaiting_user()
    }

    /// Who the peer is (its address), for logs.
    pub fn label(&self) -> &str {
        &self.shared.label
    }

    pub fn role(&self) -> Role {
        self.shared.lock().engine.role()
    }

    /// The peer's banner and the negotiated parameters, once connected.
    pub fn peer(&self) -> Option<Peer> {
        self.shared.lock().engine.peer().cloned()
    }

    /// Why the connection ended, if it has.
    pub fn closed(&self) -> Option<ConnectionError> {
        self.shared.lock().closed.clone()
    }

    /// Waits for the CNXN exchange to complete.
    pub async fn connected(&self) -> Result<Peer, ConnectionError> {
        std::future::poll_fn(|cx| {
            let mut state = self.shared.lock();
            if let Some(peer) = state.engine.peer() {
                return Poll::Ready(Ok(peer.clone()));
            }
            if let Some(error) = &state.closed {
                return Poll::Ready(Err(error.clone()));
            }
            state.connected_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// The next stream the peer wants to open; `None` once the connection ended.
    pub async fn next_incoming(&self) -> Option<Incoming> {
        std::future::poll_fn(|cx| {
            let mut state = self.shared.lock();
            if let Some((id, service)) = state.incoming.pop_front() {
                return Poll::Ready(Some(Incoming {
                    shared: self.shared.clone(),
                    id,
                    service,
                    answered: false,
                }));
            }
            if state.closed.is_some() {
                return Poll::Ready(None);
            }
            state.incoming_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Opens a stream to `service` and waits for the peer to accept it.
    pub async fn open(&self, service: &str) -> io::Result<AdbStream> {
        let id = {
            let mut state = self.shared.lock();
            let id = state
                .engine
                .open(service)
                .map_err(|e| io::Error::new(io::ErrorKind::NotConnected, e))?;
            state.streams.insert(id, StreamWakers::default());
            self.shared.after_engine_call(&mut state);
            id
        };
        // From here the stream handle owns the id: dropping it closes the stream.
        let stream = AdbStream {
            shared: self.shared.clone(),
            id,
        };
        std::future::poll_fn(|cx| {
            let mut state = self.shared.lock();
            let closed = state.closed.clone();
            let wakers = state.streams.entry(id).or_default();
            match wakers.opened {
                Some(true) => Poll::Ready(Ok(())),
                Some(false) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("the peer refused to open service {service:?}"),
                ))),
                None => match closed {
                    Some(error) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("opening {service:?}: {error}"),
                    ))),
                    None => {
                        wakers.open = Some(cx.waker().clone());
                        Poll::Pending
                    }
                },
            }
        })
        .await?;
        Ok(stream)
    }

    /// Ends the connection: the socket is closed and every stream sees EOF.
    pub fn close(&self) {
        let mut state = self.shared.lock();
        state.shut(ConnectionError::Closed);
        self.shared.transmit.notify_one();
        self.shared.close_requested.notify_one();
    }
}

/// A TCP stream ready for [`Connection::start`]: its read half, its write
/// half as a [`TcpSink`] and its peer's address (the label), with Nagle
/// off: ADB's OKAYs are tiny and latency-bound.
pub fn tcp_halves(
    stream: tokio::net::TcpStream,
) -> io::Result<(tokio::net::tcp::OwnedReadHalf, TcpSink, String)> {
    stream.set_nodelay(true)?;
    let label = stream.peer_addr()?.to_string();
    let (reader, writer) = stream.into_split();
    Ok((reader, TcpSink::new(writer), label))
}
