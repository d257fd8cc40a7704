//! What runs a connection: the state shared by its tasks and stream handles,
//! the read loop (transport to engine), the write loop (engine to sink) and
//! the timer loop (the engine's deadlines, `Connection::poll_timeout`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::Duration;

use bytes::BytesMut;
use oxadb_engine::{Event, StreamId};
use oxadb_wire::{Header, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::Notify;

use crate::auth::Authentication;
use crate::sink::{OutgoingPacket, PacketSink, ReadRanges};
use crate::ConnectionError;

#[derive(Default)]
pub(crate) struct StreamWakers {
    pub(crate) read: Option<Waker>,
    pub(crate) write: Option<Waker>,
    pub(crate) open: Option<Waker>,
    /// Result of our OPEN: `Some(true)` accepted, `Some(false)` refused.
    pub(crate) opened: Option<bool>,
}

pub(crate) struct State {
    pub(crate) engine: oxadb_engine::Connection,
    pub(crate) authentication: Authentication,
    /// The peer's address, for the authenticator's logs.
    pub(crate) label: String,
    /// The deadline the timer loop sleeps until (on the engine's clock): the
    /// engine's earliest when it was set, perhaps earlier than its
    /// earliest now (see `Shared::follow_deadline`).
    pub(crate) timer_deadline: Option<Duration>,
    pub(crate) streams: HashMap<StreamId, StreamWakers>,
    pub(crate) incoming: VecDeque<(StreamId, String)>,
    pub(crate) incoming_waker: Option<Waker>,
    pub(crate) connected_waker: Option<Waker>,
    pub(crate) closed: Option<ConnectionError>,
}

impl State {
    /// Turns engine events into task wake-ups.
    pub(crate) fn dispatch_events(&mut self) {
        while let Some(event) = self.engine.poll_event() {
            match event {
                Event::AuthChallenge { token, attempt } => {
                    self.authentication
                        .answer_challenge(&mut self.engine, &token, attempt)
                }
                Event::TokenNeeded => self.authentication.send_token(&mut self.engine),
                Event::AuthSignature { token, signature } => self.authentication.check_signature(
                    &mut self.engine,
                    &self.label,
                    &token,
                    &signature,
                ),
                Event::AuthPublicKey { key } => {
                    self.authentication
                        .consider_key(&mut self.engine, &self.label, &key)
                }
                Event::Connected => {
                    self.authentication.connected();
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
                Event::HandshakeTimedOut { stage, limit } => {
                    log_handshake_timeout(stage, limit);
                    // Closed locally, as `Connection::close` does; the
                    // timer loop, which fired it, stops the reader.
                    self.shut(ConnectionError::Closed);
                }
            }
        }
    }

    pub(crate) fn shut(&mut self, error: ConnectionError) {
        match (&self.closed, &error) {
            (None, _) => self.closed = Some(error),
            // A socket's pending error goes to whichever of the reader and
            // the writer asks first (SO_ERROR is cleared once reported); the
            // other sees a plain end of file. A dead peer is the cause.
            (Some(ConnectionError::PeerClosed), ConnectionError::PeerTimedOut(_)) => {
                self.closed = Some(error)
            }
            _ => {}
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

/// The one log line of a connection given up for a handshake deadline, in
/// the words and fields operators grep for (`timeout_s`, "closing
/// connection: no CNXN in time"), wherever the timeout is handled: here or
/// on the bare socket (`tls::negotiate`).
pub(crate) fn log_handshake_timeout(stage: oxadb_engine::HandshakeStage, limit: Duration) {
    tracing::warn!(timeout_s = limit.as_secs(), "closing connection: {stage}");
}

pub(crate) fn wake(slot: &mut Option<Waker>) {
    if let Some(waker) = slot.take() {
        waker.wake();
    }
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Wakes the writer task when the engine may have packets to send.
    pub(crate) transmit: Notify,
    /// Wakes the reader task when the connection is closed locally.
    pub(crate) close_requested: Notify,
    /// Wakes a reader waiting for the control backlog to shrink.
    pub(crate) drained: Notify,
    /// Wakes the timer loop when the engine's deadline moved earlier than
    /// the one it sleeps until, or the connection closed.
    pub(crate) deadline_moved: Notify,
    pub(crate) label: String,
    /// The engine's clock starts here: the connection's start, so that the
    /// handshake's deadlines count from it (`Config::handshake_timeout`).
    pub(crate) epoch: std::time::Instant,
    /// Whether the sink sends file ranges itself (`PacketSink::takes_file_ranges`).
    pub(crate) file_ranges: bool,
    /// Where reads and writes are reported, once the owner says
    /// (`Connection::report_activity_to`).
    pub(crate) activity: std::sync::OnceLock<crate::Activity>,
}

impl Shared {
    /// Reports that bytes moved (or the connection ended), if anyone listens.
    pub(crate) fn note_activity(&self) {
        if let Some(activity) = self.activity.get() {
            activity.note();
        }
    }

    /// Locks the engine and tells it the time, for its round-trip and rate
    /// measurements.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.engine.set_time(self.epoch.elapsed());
        state
    }

    pub(crate) fn after_engine_call(&self, state: &mut State) {
        state.dispatch_events();
        if state.engine.has_transmit() {
            self.transmit.notify_one();
        }
        self.follow_deadline(state);
    }

    /// Wakes the timer loop if the engine now wants it earlier than it
    /// sleeps. A deadline that moved later (a stream whose stall ended and
    /// began again, as happens on every round trip of a transfer) wakes
    /// nothing: the loop wakes at the old one, finds nothing due, and sleeps
    /// again until the new one, so a busy connection costs no timer resets.
    pub(crate) fn follow_deadline(&self, state: &mut State) {
        let Some(next) = state.engine.poll_timeout() else {
            return;
        };
        if state.timer_deadline.is_none_or(|armed| next < armed) {
            state.timer_deadline = Some(next);
            self.deadline_moved.notify_one();
        }
    }
}

/// Sleeps until the engine's deadline, calls `handle_timeout` and re-arms
/// from `poll_timeout`, until the connection is closed. The only timer of a
/// connection's protocol: the engine decides what is due.
pub(crate) async fn timer_loop(shared: Arc<Shared>) {
    loop {
        let deadline = {
            let state = shared.lock();
            if state.closed.is_some() {
                return;
            }
            state.timer_deadline
        };
        // A notification sent since the lock was released is kept as a
        // permit (`notify_one`), so this cannot miss a deadline moved meanwhile.
        let moved = shared.deadline_moved.notified();
        match deadline {
            None => {
                moved.await;
                continue;
            }
            Some(at) => {
                let wake = tokio::time::Instant::from_std(shared.epoch + at);
                tokio::select! {
                    () = tokio::time::sleep_until(wake) => {}
                    () = moved => continue,
                }
            }
        }
        let mut state = shared.lock();
        if state.closed.is_some() {
            return;
        }
        state.engine.handle_timeout(shared.epoch.elapsed());
        state.timer_deadline = state.engine.poll_timeout();
        shared.after_engine_call(&mut state);
        if state.closed.is_some() {
            // A handshake deadline gave the connection up: end the reader
            // and the writer as `Connection::close` does.
            shared.transmit.notify_one();
            shared.close_requested.notify_one();
            return;
        }
    }
}

/// Control packets queued for the peer beyond which the reader waits: far
/// more than any well-behaved peer causes (one OKAY per WRTE in flight).
const MAX_CONTROL_BACKLOG: usize = 4096;

/// Packets handled from one read after which the reader yields: far more
/// than a read of a bulk transfer brings (a few packets of up to 1 MiB).
const YIELD_AFTER_PACKETS: usize = 64;

/// Smallest read into the receive buffer: many small packets (OKAYs, 28
/// bytes) arrive in one syscall, and a payload at least this large is read
/// straight into place. An idle connection keeps this much, charged to the
/// memory budget (256 KiB each held 16 MiB for 64 connections).
pub(crate) const READ_CHUNK: usize = 64 * 1024;

pub(crate) async fn read_loop<R: AsyncRead + Unpin>(
    shared: &Arc<Shared>,
    mut reader: R,
) -> ConnectionError {
    // Payloads are split off this buffer and handed to streams as `Bytes`
    // without copying; fresh capacity is reserved as they are given away.
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    // Room for a whole packet of this size is made before its header is read
    // while large payloads keep coming (see `make_room`).
    let mut room_ahead = READ_CHUNK;
    // What the buffer holds beyond the payloads handed to streams (which
    // count their own) is charged to the memory budget.
    let mut holding =
        oxadb_engine::Holding::new(shared.lock().engine.config().memory_budget.clone());
    loop {
        // Every complete packet already read is handled under one lock: the
        // stream tasks and the writer contend for it, and a read often brings
        // several packets (a WRTE and OKAYs, or many OKAYs).
        let (need, backlogged, paused_until, packets) = {
            let mut state = shared.lock();
            if state.closed.is_some() {
                return ConnectionError::Closed;
            }
            let mut handled = false;
            let mut packets = 0usize;
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
                room_ahead = (total + HEADER_LEN).max(READ_CHUNK);
                let _ = buf.split_to(HEADER_LEN);
                let payload = buf.split_to(header.data_length as usize).freeze();
                if let Err(error) = state.engine.handle_packet(&header, payload) {
                    return error.into();
                }
                handled = true;
                packets += 1;
            };
            if handled {
                shared.after_engine_call(&mut state);
            }
            (
                need,
                state.engine.control_backlog() > MAX_CONTROL_BACKLOG,
                state.engine.reading_paused_until(),
                packets,
            )
        };
        // A peer that keeps sending what is refused or ignored is read at
        // the engine's pace for it (its burst, then 1024 a second): it waits
        // on TCP's back-pressure instead of taking the thread
        // (oxadb-engine `connection/pacing.rs`).
        if let Some(until) = paused_until {
            tokio::time::sleep_until((shared.epoch + until).into()).await;
        }
        // A read that brought many packets gives the thread up once, so
        // that a peer whose socket never runs dry (a flood of small packets,
        // 3,000 to a 64 KiB read) cannot keep its task running for a whole
        // scheduler budget while other connections wait.
        if packets >= YIELD_AFTER_PACKETS {
            tokio::task::yield_now().await;
        }
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
        let limit = make_room(&mut buf, need, room_ahead);
        holding.set(buf.capacity() as u64);
        let filled = reader
            .read_buf(&mut bytes::BufMut::limit(&mut buf, limit))
            .await;
        holding.set(buf.capacity() as u64);
        shared.note_activity();
        match filled {
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

/// Makes room in `buf` for the next read, which must bring it to `want`
/// bytes in total; returns how much to read. `room_ahead` is the size of
/// the last packet, made room for whenever the buffer holds no more than
/// part of a header. The room is made before the read waits, so that the
/// read buffer's charge to the memory budget includes it.
///
/// Small packets are read many at a time. For a large payload the read stops
/// at the end of its packet plus the next header: bytes of a following
/// payload left in the buffer would be copied when the next large payload's
/// room is reserved (`BytesMut::reserve` moves them: memmove was 3.4% of a
/// 1 GiB burst pull's client samples before this limit, 2.2% after). For the
/// same reason the next packet's room is made before its header arrives
/// while packets are large: made after, it moved a 256 KiB read with the
/// header, 6% of oxadbd's samples during a 1 GiB push.
fn make_room(buf: &mut BytesMut, want: usize, room_ahead: usize) -> usize {
    let missing = want.saturating_sub(buf.len());
    // A large packet is read to its end (plus the next header) into room made
    // once: asking for a whole READ_CHUNK near its end would move all of it.
    let limit = if want >= READ_CHUNK {
        missing + HEADER_LEN
    } else {
        READ_CHUNK
    };
    let room = if buf.len() < HEADER_LEN {
        limit.max(room_ahead)
    } else {
        limit
    };
    if buf.capacity() - buf.len() < room && !buf.try_reclaim(room) {
        // An allocation of exactly this size: `reserve` doubles a buffer it
        // can reclaim, and a packet sharing an allocation with the next keeps
        // both alive until both are read, which the budget cannot see (64
        // connections held 20 MiB more than was charged).
        let mut fresh = BytesMut::with_capacity(buf.len() + room);
        fresh.extend_from_slice(buf);
        *buf = fresh;
    }
    limit
}

/// Bytes written per batch: enough to fill a socket buffer in one writev.
const WRITE_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Slices per writev call; Linux caps iovecs at 1024.
const MAX_IOVECS: usize = 256;

pub(crate) async fn write_loop<S: PacketSink>(shared: Arc<Shared>, mut sink: S) {
    let mut batch: Vec<OutgoingPacket> = Vec::new();
    // Whether the batch holds our public key offer (host role).
    let mut offers_key = false;
    loop {
        {
            let mut state = shared.lock();
            if state.closed.is_some() {
                break;
            }
            let mut bytes = 0;
            while bytes < WRITE_BATCH_BYTES && 2 * (batch.len() + 1) <= MAX_IOVECS {
                let Some(mut packet) = state.engine.poll_outgoing() else {
                    break;
                };
                // A v1.0 peer checks a byte sum over the payload: file ranges
                // must be read to make it (streams avoid them then, see
                // `AdbStream::takes_file_ranges`).
                if state.engine.checksums() && packet.payload.has_file_ranges() {
                    if let Err(error) = packet.payload.read_in() {
                        tracing::debug!(peer = %shared.label, %error, "reading a file range failed");
                        state.shut(error.into());
                        break;
                    }
                }
                offers_key |= packet.command == oxadb_wire::Command::Auth
                    && packet.arg0 == oxadb_engine::AUTH_RSAPUBLICKEY;
                let header = state.engine.header_for_outgoing(&packet).encode();
                bytes += HEADER_LEN + packet.payload.len();
                batch.push(OutgoingPacket {
                    header,
                    payload: packet.payload,
                });
            }
            // Taking data out of send buffers may have unblocked writers,
            // and data left waiting for credit starts a stall's timer.
            state.dispatch_events();
            shared.follow_deadline(&mut state);
            if state.closed.is_some() {
                break;
            }
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
        if std::mem::take(&mut offers_key) {
            shared.lock().authentication.key_offer_written();
        }
        shared.drained.notify_one();
        shared.note_activity();
    }
    sink.shutdown().await;
}
