//! Async drivers that run an [`oxadb_engine::Connection`] over a byte transport
//! (TCP today), and [`AdbStream`], one ADB stream as `AsyncRead + AsyncWrite`.
//!
//! The engine sits behind one mutex shared by a reader task (socket to engine),
//! a writer task (engine to socket) and the stream handles, the shape quinn uses:
//! protocol logic stays in the engine, this crate only moves bytes and wakes tasks.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use oxadb_engine::{Config, Event, Read, Role, StreamId};
use oxadb_wire::{Header, HEADER_LEN};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::Notify;

pub use oxadb_engine::{AuthReply, Peer, StreamStats};

/// Why a connection ended.
#[derive(Debug, Error, Clone)]
pub enum ConnectionError {
    #[error("peer closed the connection")]
    PeerClosed,
    #[error("truncated packet header ({0} of 24 bytes) before EOF")]
    TruncatedHeader(usize),
    #[error("truncated payload of {command}: EOF after {got} of {expected} bytes")]
    TruncatedPayload {
        command: oxadb_wire::Command,
        got: usize,
        expected: usize,
    },
    #[error("{0}")]
    Header(#[from] oxadb_wire::HeaderError),
    #[error("{0}")]
    Protocol(#[from] oxadb_engine::ProtocolError),
    #[error("I/O error: {0}")]
    Io(Arc<io::Error>),
    #[error("connection closed locally")]
    Closed,
}

impl From<io::Error> for ConnectionError {
    fn from(error: io::Error) -> Self {
        ConnectionError::Io(Arc::new(error))
    }
}

impl ConnectionError {
    /// Whether this is a normal end rather than a fault.
    pub fn is_clean(&self) -> bool {
        matches!(self, ConnectionError::PeerClosed | ConnectionError::Closed)
    }
}

#[derive(Default)]
struct StreamWakers {
    read: Option<Waker>,
    write: Option<Waker>,
    open: Option<Waker>,
    /// Result of our OPEN: `Some(true)` accepted, `Some(false)` refused.
    opened: Option<bool>,
}

/// Answers a device's AUTH token (host role): `Some(reply)` to send, `None` to
/// stay silent (waiting for the user to accept the key on the device).
pub type AuthResponder = Box<dyn FnMut(&[u8], u32) -> Option<AuthReply> + Send>;

/// One packet ready for the wire: its encoded header and its payload.
pub struct OutgoingPacket {
    pub header: [u8; HEADER_LEN],
    pub payload: Bytes,
}

/// Where the writer task puts packets. A byte stream takes a whole batch in
/// one writev ([`StreamSink`]); USB keeps each header and each payload a
/// transfer of its own, because the host reads exactly 24 bytes for a header
/// and then exactly the payload (AOSP `docs/dev/zero_length_packet.md`).
pub trait PacketSink: Send + 'static {
    /// Writes every packet of `batch`, in order, and empties it.
    fn write_packets<'a>(
        &'a mut self,
        batch: &'a mut Vec<OutgoingPacket>,
    ) -> impl std::future::Future<Output = io::Result<()>> + Send + 'a;

    /// The connection ended: flush and close what can be.
    fn shutdown(&mut self) -> impl std::future::Future<Output = ()> + Send + '_;
}

/// A [`PacketSink`] over any byte stream (TCP, a pipe): packets are bytes in a row.
pub struct StreamSink<W>(pub W);

impl<W: AsyncWrite + Unpin + Send + 'static> PacketSink for StreamSink<W> {
    async fn write_packets(&mut self, batch: &mut Vec<OutgoingPacket>) -> io::Result<()> {
        write_all_vectored(&mut self.0, batch).await
    }

    async fn shutdown(&mut self) {
        let _ = self.0.shutdown().await;
    }
}

/// Device role: decides who may connect (`oxadbd --auth`). Called with the
/// connection's engine locked, so each call must be quick (an RSA-2048
/// verification is about 50 us).
pub trait Authenticator: Send + Sync {
    /// A fresh, unpredictable token (20 bytes, as adbd sends).
    fn token(&self) -> Bytes;
    /// Whether `signature` signs `token` with a trusted key.
    fn verify(&self, peer: &str, token: &[u8], signature: &[u8]) -> bool;
    /// The host offers `key` (adb's base64 public key text, NUL-terminated)
    /// after its signatures failed: whether to trust it without proof.
    fn offer_key(&self, peer: &str, key: &[u8]) -> bool;
    /// How long to wait before the next token after `failures` refused
    /// signatures on this connection (rate-limits guessing).
    fn retry_delay(&self, failures: u32) -> std::time::Duration;
}

struct State {
    engine: oxadb_engine::Connection,
    auth: Option<AuthResponder>,
    authenticator: Option<Arc<dyn Authenticator>>,
    /// Signatures refused on this connection.
    auth_failures: u32,
    /// The peer's address, for the authenticator's logs.
    label: String,
    /// A refused signature's next token waits this long (set by
    /// `dispatch_events`, taken by the reader, which owns a handle to spawn with).
    token_delay: Option<std::time::Duration>,
    /// The device challenged us and we have no more answers: it is "unauthorized"
    /// until its user accepts our public key.
    awaiting_user: bool,
    streams: HashMap<StreamId, StreamWakers>,
    incoming: VecDeque<(StreamId, String)>,
    incoming_waker: Option<Waker>,
    connected_waker: Option<Waker>,
    closed: Option<ConnectionError>,
}

impl State {
    /// Turns engine events into task wake-ups.
    fn dispatch_events(&mut self) {
        while let Some(event) = self.engine.poll_event() {
            match event {
                Event::AuthChallenge { token, attempt } => {
                    let reply = self.auth.as_mut().and_then(|auth| auth(&token, attempt));
                    // Once our public key is offered (or nothing is left to
                    // offer) only the device's user can let us in.
                    self.awaiting_user = !matches!(reply, Some(AuthReply::Signature(_)));
                    if let Some(reply) = reply {
                        self.engine.send_auth(reply);
                    }
                }
                Event::TokenNeeded => self.send_token(),
                Event::AuthSignature { token, signature } => {
                    let peer = self.label.clone();
                    let trusted = self
                        .authenticator
                        .as_ref()
                        .is_some_and(|auth| auth.verify(&peer, &token, &signature));
                    if trusted {
                        self.engine.authorize();
                    } else {
                        self.auth_failures += 1;
                        let delay = self
                            .authenticator
                            .as_ref()
                            .map_or(std::time::Duration::ZERO, |auth| {
                                auth.retry_delay(self.auth_failures)
                            });
                        if delay.is_zero() {
                            self.send_token();
                        } else {
                            self.token_delay = Some(delay);
                        }
                    }
                }
                Event::AuthPublicKey { key } => {
                    let peer = self.label.clone();
                    if self
                        .authenticator
                        .as_ref()
                        .is_some_and(|auth| auth.offer_key(&peer, &key))
                    {
                        self.engine.authorize();
                    }
                }
                Event::Connected => {
                    self.awaiting_user = false;
                    if let Some(waker) = self.connected_waker.take() {
                        waker.wake();
                    }
                }
                Event::OpenRequest { id, service } => {
                    self.incoming.push_back((id, service));
                    if let Some(waker) = self.incoming_waker.take() {
                        waker.wake();
                    }
                }
                Event::Opened(id) | Event::Refused(id) => {
                    let wakers = self.streams.entry(id).or_default();
                    wakers.opened = Some(matches!(event, Event::Opened(_)));
                    wake(&mut wakers.open);
                    wake(&mut wakers.write);
                }
                Event::Readable(id) => {
                    if let Some(wakers) = self.streams.get_mut(&id) {
                        wake(&mut wakers.read);
                    }
                }
                Event::Writable(id) => {
                    if let Some(wakers) = self.streams.get_mut(&id) {
                        wake(&mut wakers.write);
                    }
                }
                Event::Closed(id) => {
                    if let Some(wakers) = self.streams.get_mut(&id) {
                        wake(&mut wakers.read);
                        wake(&mut wakers.write);
                    }
                }
            }
        }
    }

    fn send_token(&mut self) {
        if let Some(auth) = &self.authenticator {
            let token = auth.token();
            self.engine.send_auth_token(token);
        }
    }

    fn shut(&mut self, error: ConnectionError) {
        if self.closed.is_none() {
            self.closed = Some(error);
        }
        for wakers in self.streams.values_mut() {
            wake(&mut wakers.read);
            wake(&mut wakers.write);
            wake(&mut wakers.open);
        }
        wake(&mut self.incoming_waker);
        wake(&mut self.connected_waker);
    }
}

fn wake(slot: &mut Option<Waker>) {
    if let Some(waker) = slot.take() {
        waker.wake();
    }
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the writer task when the engine may have packets to send.
    transmit: Notify,
    /// Wakes the reader task when the connection is closed locally.
    close_requested: Notify,
    /// Wakes a reader waiting for the control backlog to shrink.
    drained: Notify,
    label: String,
    /// The engine's clock starts here.
    epoch: std::time::Instant,
}

impl Shared {
    /// Locks the engine and tells it the time, for its round-trip and rate
    /// measurements.
    fn lock(&self) -> MutexGuard<'_, State> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.engine.set_time(self.epoch.elapsed());
        state
    }

    fn after_engine_call(&self, state: &mut State) {
        state.dispatch_events();
        if state.engine.has_transmit() {
            self.transmit.notify_one();
        }
    }
}

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
    /// Starts driving `config`'s engine over `reader`/`writer`. Returns the
    /// handle and a future that completes when the connection ends (spawn it).
    pub fn start<R, W>(
        reader: R,
        writer: W,
        config: Config,
        label: impl Into<String>,
    ) -> (
        Connection,
        impl std::future::Future<Output = ConnectionError>,
    )
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        Connection::start_with_auth(reader, writer, config, label, None)
    }

    /// Device role with [`Config::require_auth`](oxadb_engine::Config): hosts
    /// are let in by `authenticator`.
    pub fn start_device<R, W>(
        reader: R,
        writer: W,
        config: Config,
        label: impl Into<String>,
        authenticator: Option<Arc<dyn Authenticator>>,
    ) -> (
        Connection,
        impl std::future::Future<Output = ConnectionError>,
    )
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        Connection::start_packets(
            reader,
            StreamSink(writer),
            config,
            label,
            None,
            authenticator,
        )
    }

    /// Like [`Connection::start`], answering AUTH challenges with `auth` (host role).
    pub fn start_with_auth<R, W>(
        reader: R,
        writer: W,
        config: Config,
        label: impl Into<String>,
        auth: Option<AuthResponder>,
    ) -> (
        Connection,
        impl std::future::Future<Output = ConnectionError>,
    )
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        Connection::start_packets(reader, StreamSink(writer), config, label, auth, None)
    }

    /// The general form: bytes come in through `reader` (a byte stream, even
    /// over USB, where the device's bulk-out transfers are read back to back)
    /// and packets go out through `sink`. `auth` answers a device's AUTH
    /// challenges (host role); `authenticator` lets hosts in (device role
    /// with `config.require_auth`).
    pub fn start_packets<R, S>(
        reader: R,
        sink: S,
        config: Config,
        label: impl Into<String>,
        auth: Option<AuthResponder>,
        authenticator: Option<Arc<dyn Authenticator>>,
    ) -> (
        Connection,
        impl std::future::Future<Output = ConnectionError>,
    )
    where
        R: AsyncRead + Unpin + Send + 'static,
        S: PacketSink,
    {
        let label = label.into();
        let engine = oxadb_engine::Connection::new(config);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                engine,
                auth,
                authenticator,
                auth_failures: 0,
                label: label.clone(),
                token_delay: None,
                awaiting_user: false,
                streams: HashMap::new(),
                incoming: VecDeque::new(),
                incoming_waker: None,
                connected_waker: None,
                closed: None,
            }),
            transmit: Notify::new(),
            close_requested: Notify::new(),
            drained: Notify::new(),
            label,
            epoch: std::time::Instant::now(),
        });
        if shared.lock().engine.has_transmit() {
            shared.transmit.notify_one();
        }
        let connection = Connection {
            shared: shared.clone(),
        };
        let stalled_timeout = shared.lock().engine.config().stalled_stream_timeout;
        let run = async move {
            let writer_task = tokio::spawn(write_loop(shared.clone(), sink));
            let sweeper =
                stalled_timeout.map(|limit| tokio::spawn(sweep_stalled(shared.clone(), limit)));
            let error = tokio::select! {
                error = read_loop(&shared, reader) => error,
                _ = shared.close_requested.notified() => ConnectionError::Closed,
            };
            let error = {
                let mut state = shared.lock();
                state.shut(error);
                state.closed.clone().expect("just set")
            };
            if let Some(sweeper) = sweeper {
                sweeper.abort();
            }
            // Wake the writer so it sees `closed` and exits, dropping the socket.
            shared.transmit.notify_one();
            let _ = writer_task.await;
            error
        };
        (connection, run)
    }

    /// Runs over a TCP stream, with Nagle off: ADB's OKAYs are tiny and latency-bound.
    pub fn start_tcp(
        stream: tokio::net::TcpStream,
        config: Config,
    ) -> io::Result<(
        Connection,
        impl std::future::Future<Output = ConnectionError>,
    )> {
        Connection::start_tcp_with_auth(stream, config, None)
    }

    /// Device role over TCP (Nagle off), hosts let in by `authenticator`
    /// when `config.require_auth` is set.
    pub fn start_tcp_device(
        stream: tokio::net::TcpStream,
        config: Config,
        authenticator: Option<Arc<dyn Authenticator>>,
    ) -> io::Result<(
        Connection,
        impl std::future::Future<Output = ConnectionError>,
    )> {
        let (reader, writer, label) = tcp_halves(stream)?;
        Ok(Connection::start_device(
            reader,
            writer,
            config,
            label,
            authenticator,
        ))
    }

    /// Like [`Connection::start_tcp`], answering AUTH challenges with `auth` (host role).
    pub fn start_tcp_with_auth(
        stream: tokio::net::TcpStream,
        config: Config,
        auth: Option<AuthResponder>,
    ) -> io::Result<(
        Connection,
        impl std::future::Future<Output = ConnectionError>,
    )> {
        let (reader, writer, label) = tcp_halves(stream)?;
        Ok(Connection::start_with_auth(
            reader, writer, config, label, auth,
        ))
    }

    /// Device role: the host sent CNXN and has not authenticated yet.
    pub fn awaiting_auth(&self) -> bool {
        self.shared.lock().engine.awaiting_auth()
    }

    /// Whether the device refused our keys and waits for its user to accept ours.
    pub fn awaiting_authorization(&self) -> bool {
        self.shared.lock().awaiting_user
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
                    format!("device refused to open service {service:?}"),
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

/// A TCP stream's halves and its peer's address, Nagle off: ADB's OKAYs are
/// tiny and latency-bound.
fn tcp_halves(
    stream: tokio::net::TcpStream,
) -> io::Result<(
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf,
    String,
)> {
    stream.set_nodelay(true)?;
    let label = stream.peer_addr()?.to_string();
    let (reader, writer) = stream.into_split();
    Ok((reader, writer, label))
}

/// Closes streams stalled on the peer's credit for `limit`, checking four
/// times per `limit` (at least every second).
async fn sweep_stalled(shared: Arc<Shared>, limit: std::time::Duration) {
    let period = (limit / 4).max(std::time::Duration::from_secs(1));
    loop {
        tokio::time::sleep(period).await;
        let mut state = shared.lock();
        if state.closed.is_some() {
            return;
        }
        if !state.engine.abort_stalled_streams(limit).is_empty() {
            shared.after_engine_call(&mut state);
        }
    }
}

/// Control packets queued for the peer beyond which the reader waits: far
/// more than any well-behaved peer causes (one OKAY per WRTE in flight).
const MAX_CONTROL_BACKLOG: usize = 4096;

/// Smallest read into the receive buffer: many small packets (OKAYs) arrive in
/// one syscall, and a large payload is read straight into place.
const READ_CHUNK: usize = 256 * 1024;

async fn read_loop<R: AsyncRead + Unpin>(shared: &Arc<Shared>, mut reader: R) -> ConnectionError {
    // Payloads are split off this buffer and handed to streams as `Bytes`
    // without copying; fresh capacity is reserved as they are given away.
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        // Every complete packet already read is handled under one lock: the
        // stream tasks and the writer contend for it, and a read often brings
        // several packets (a WRTE and OKAYs, or many OKAYs).
        let (need, backlogged) = {
            let mut state = shared.lock();
            if state.closed.is_some() {
                return ConnectionError::Closed;
            }
            let mut handled = false;
            let need = loop {
                if buf.len() < HEADER_LEN {
                    break HEADER_LEN;
                }
                let raw: [u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("header length");
                let header = match Header::decode(&raw, state.engine.max_incoming_payload()) {
                    Ok(header) => header,
                    Err(error) => return error.into(),
                };
                let total = HEADER_LEN + header.data_length as usize;
                if buf.len() < total {
                    break total;
                }
                let _ = buf.split_to(HEADER_LEN);
                let payload = buf.split_to(header.data_length as usize).freeze();
                if let Err(error) = state.engine.handle_packet(&header, payload) {
                    return error.into();
                }
                handled = true;
            };
            if handled {
                shared.after_engine_call(&mut state);
                if let Some(delay) = state.token_delay.take() {
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let mut state = shared.lock();
                        if state.closed.is_none() && state.engine.awaiting_auth() {
                            state.send_token();
                            shared.after_engine_call(&mut state);
                        }
                    });
                }
            }
            (need, state.engine.control_backlog() > MAX_CONTROL_BACKLOG)
        };
        // Every packet we read may owe the peer an answer (an OKAY, a CLSE);
        // a peer that sends without reading would grow that queue without
        // limit (4.4 million refused OPENs: 224 MiB). Read on once it drains.
        // The common case checked that under the lock above, for free.
        if backlogged {
            loop {
                let drained = shared.drained.notified();
                tokio::pin!(drained);
                drained.as_mut().enable();
                if shared.lock().engine.control_backlog() <= MAX_CONTROL_BACKLOG {
                    break;
                }
                drained.await;
            }
        }
        match fill(&mut reader, &mut buf, need).await {
            Ok(0) if buf.is_empty() => return ConnectionError::PeerClosed,
            Ok(0) if buf.len() < HEADER_LEN => return ConnectionError::TruncatedHeader(buf.len()),
            Ok(0) => {
                let raw: [u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("header length");
                let header = Header::decode(&raw, u32::MAX).expect("validated above");
                return ConnectionError::TruncatedPayload {
                    command: header.command,
                    got: buf.len() - HEADER_LEN,
                    expected: header.data_length as usize,
                };
            }
            Ok(_) => {}
            Err(error) => return error.into(),
        }
    }
}

/// Reads more into `buf`, which must reach `want` bytes in total.
///
/// Small packets are read many at a time. For a large payload the read stops
/// at the end of its packet plus the next header: bytes of a following
/// payload left in the buffer would be copied when the next large payload's
/// room is reserved (`BytesMut::reserve` moves them: memmove was 3.4% of a
/// 1 GiB burst pull's client samples before this limit, 2.2% after).
async fn fill<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
    want: usize,
) -> io::Result<usize> {
    let missing = want.saturating_sub(buf.len());
    let limit = if missing >= READ_CHUNK {
        missing + HEADER_LEN
    } else {
        READ_CHUNK
    };
    if buf.capacity() - buf.len() < limit {
        buf.reserve(limit);
    }
    let mut limited = bytes::BufMut::limit(&mut *buf, limit);
    reader.read_buf(&mut limited).await
}

/// Bytes written per batch: enough to fill a socket buffer in one writev.
const WRITE_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Slices per writev call; Linux caps iovecs at 1024.
const MAX_IOVECS: usize = 256;

async fn write_loop<S: PacketSink>(shared: Arc<Shared>, mut sink: S) {
    let mut batch: Vec<OutgoingPacket> = Vec::new();
    loop {
        {
            let mut state = shared.lock();
            if state.closed.is_some() {
                break;
            }
            let mut bytes = 0;
            while bytes < WRITE_BATCH_BYTES && 2 * (batch.len() + 1) <= MAX_IOVECS {
                let Some(packet) = state.engine.poll_transmit() else {
                    break;
                };
                let header = state.engine.header_for(&packet).encode();
                bytes += HEADER_LEN + packet.payload.len();
                batch.push(OutgoingPacket {
                    header,
                    payload: packet.payload,
                });
            }
            // Taking data out of send buffers may have unblocked writers.
            state.dispatch_events();
        }
        if batch.is_empty() {
            shared.transmit.notified().await;
            continue;
        }
        if let Err(error) = sink.write_packets(&mut batch).await {
            tracing::debug!(peer = %shared.label, %error, "write failed");
            shared.lock().shut(error.into());
            break;
        }
        shared.drained.notify_one();
    }
    sink.shutdown().await;
}

/// Writes `batch` with as few writev calls as the writer allows.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    writer: &mut W,
    batch: &mut Vec<OutgoingPacket>,
) -> io::Result<()> {
    // Each packet is up to two slices: its header, then its payload; `done`
    // counts bytes of the batch already written.
    let mut done = 0usize;
    let total: usize = batch.iter().map(|p| HEADER_LEN + p.payload.len()).sum();
    while done < total {
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(2 * batch.len());
        let mut skip = done;
        for packet in batch.iter() {
            for part in [&packet.header[..], &packet.payload[..]] {
                if part.is_empty() {
                    continue;
                }
                if skip >= part.len() {
                    skip -= part.len();
                    continue;
                }
                slices.push(IoSlice::new(&part[skip..]));
                skip = 0;
            }
        }
        let written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        done += written;
    }
    batch.clear();
    Ok(())
}

/// One ADB stream. Reads return what the peer sent (EOF once it closed the
/// stream); writes queue data for WRTE packets under the stream's credit;
/// shutdown or drop closes the stream (ADB has no half-close).
pub struct AdbStream {
    shared: Arc<Shared>,
    id: StreamId,
}

impl AdbStream {
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The stream's counters so far.
    pub fn stats(&self) -> Option<StreamStats> {
        self.shared.lock().engine.stream_stats(self.id)
    }

    /// Reads the next received chunk without copying it; `None` at EOF.
    pub async fn read_chunk(&mut self, max: usize) -> io::Result<Option<Bytes>> {
        std::future::poll_fn(|cx| self.poll_read_chunk(cx, max)).await
    }

    fn poll_read_chunk(&self, cx: &mut Context<'_>, max: usize) -> Poll<io::Result<Option<Bytes>>> {
        let mut state = self.shared.lock();
        match state.engine.read(self.id, max) {
            Ok(Read::Data(chunk)) => {
                self.shared.after_engine_call(&mut state);
                Poll::Ready(Ok(Some(chunk)))
            }
            Ok(Read::Eof) | Err(_) => Poll::Ready(Ok(None)),
            Ok(Read::WouldBlock) => {
                if state.closed.is_some() {
                    return Poll::Ready(Ok(None));
                }
                if let Some(wakers) = state.streams.get_mut(&self.id) {
                    wakers.read = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

/// A writer that can take owned chunks without copying them; the sync
/// service uses it so file data read into a buffer goes out as the WRTE
/// payload itself.
pub trait WriteChunk: AsyncWrite + Unpin {
    fn write_chunk(
        &mut self,
        data: Bytes,
    ) -> impl std::future::Future<Output = io::Result<()>> + Send;
}

impl WriteChunk for AdbStream {
    async fn write_chunk(&mut self, data: Bytes) -> io::Result<()> {
        let mut data = Some(data);
        std::future::poll_fn(|cx| {
            let mut state = self.shared.lock();
            if let Some(error) = &state.closed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    format!("{}: connection ended: {error}", self.id),
                )));
            }
            if !state.engine.is_writable(self.id) && !state.engine.is_closed(self.id) {
                if let Some(wakers) = state.streams.get_mut(&self.id) {
                    wakers.write = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
            let chunk = data.take().expect("polled after completion");
            match state.engine.write_bytes(self.id, chunk) {
                Ok(()) => {
                    self.shared.after_engine_call(&mut state);
                    Poll::Ready(Ok(()))
                }
                Err(error) => Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, error))),
            }
        })
        .await
    }
}

/// In-memory pipes (tests) take chunks by copying them.
impl WriteChunk for tokio::io::DuplexStream {
    async fn write_chunk(&mut self, data: Bytes) -> io::Result<()> {
        self.write_all(&data).await
    }
}

impl AsyncRead for AdbStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        match self.poll_read_chunk(cx, buf.remaining()) {
            Poll::Ready(Ok(Some(chunk))) => {
                buf.put_slice(&chunk);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Ok(None)) => Poll::Ready(Ok(())),
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for AdbStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut state = self.shared.lock();
        if let Some(error) = &state.closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("{}: connection ended: {error}", self.id),
            )));
        }
        match state.engine.write(self.id, data) {
            Ok(0) if !data.is_empty() => {
                if let Some(wakers) = state.streams.get_mut(&self.id) {
                    wakers.write = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            Ok(n) => {
                self.shared.after_engine_call(&mut state);
                Poll::Ready(Ok(n))
            }
            Err(error) => Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, error))),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Queued data goes out under credit on its own; nothing to wait for.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.shared.lock();
        state.engine.close(self.id);
        self.shared.after_engine_call(&mut state);
        Poll::Ready(Ok(()))
    }
}

impl Drop for AdbStream {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.engine.close(self.id);
        state.streams.remove(&self.id);
        self.shared.after_engine_call(&mut state);
    }
}

#[cfg(test)]
mod tests;

/// Tunes glibc's allocator for bulk transfers; call once at process start.
///
/// Packet payloads are 64 KiB to 1 MiB and come and go thousands of times a
/// second. Above glibc's mmap threshold each one is a fresh mmap, so every
/// transfer pays page faults and kernel page zeroing (about 15% of the
/// daemon's CPU in a 1 GiB push, measured with perf); served from the heap they
/// reuse warm memory. The trim threshold bounds what an idle process keeps.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TOP_PAD, 16 << 20);
    }
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The default receive-memory budget of a process: Linux's `tcp_mem`
/// proportions of the memory available at start (3/32 of it as the hard
/// limit; 48 MiB on a board with 512 MiB free). Without /proc, a small board
/// is assumed rather than a large server.
pub fn default_budget_limits() -> oxadb_engine::BudgetLimits {
    oxadb_engine::BudgetLimits::from_available_memory(available_memory().unwrap_or(256 << 20))
}

/// The budget every connection of this process shares unless told otherwise.
pub fn process_budget() -> Arc<oxadb_engine::MemoryBudget> {
    static BUDGET: std::sync::OnceLock<Arc<oxadb_engine::MemoryBudget>> =
        std::sync::OnceLock::new();
    BUDGET
        .get_or_init(|| Arc::new(oxadb_engine::MemoryBudget::new(default_budget_limits())))
        .clone()
}

/// A credit mode as `--credit` and the `credit` config key spell it:
/// `classic`, `aosp` or `adaptive` (the names [`CreditMode`] displays).
///
/// [`CreditMode`]: oxadb_engine::CreditMode
pub fn parse_credit_mode(text: &str) -> Result<oxadb_engine::CreditMode, String> {
    use oxadb_engine::CreditMode;
    [CreditMode::Classic, CreditMode::Aosp, CreditMode::Adaptive]
        .into_iter()
        .find(|mode| mode.to_string() == text)
        .ok_or_else(|| format!("unknown credit mode '{text}' (expected classic, aosp or adaptive)"))
}

/// A size such as `65536`, `64K`, `64M` or `1G` (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("bad size {text:?}: expected a number with an optional K, M or G"))?;
    let shift = match unit.trim_end_matches(['i', 'B']) {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        _ => return Err(format!("bad size unit in {text:?}: expected K, M or G")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("size {text:?} is too large"))
}
