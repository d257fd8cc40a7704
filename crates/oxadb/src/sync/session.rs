//! One `sync:` stream: the adapter that drives `oxadb_transfer::Client`, the
//! protocol's host machine, over it. The machine builds the requests and
//! reads the replies (docs/architecture.md, "transfer"); this file moves
//! bytes between it and the stream, waits for its events, and words its
//! errors as the library's. The requests are split by job, each file using
//! only this one: `metadata.rs` (stats and listings), `send.rs` (pipelined
//! pushes), `receive.rs` (pulls).

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use oxadb_io::{AdbStream, ReadChunk, ReadRanges, WriteChunk};
use oxadb_transfer::{Client, ClientError, ClientEvent, RequestError, Transmit, MAX_UNACKED};
use oxadb_wire::service::DeviceService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{show, transfer_error, SyncFeatures, SyncOpener, ZeroCopyStats};
use crate::byte_stream::BoxedStream;
use crate::device::Device;
use crate::error::{Error, Result};

/// Largest chunk taken from the stream at once.
const READ_MAX: usize = 1024 * 1024;
/// How long `quit` waits for the device to close the stream.
const QUIT_TIMEOUT: Duration = Duration::from_secs(10);

/// A session on the device's `sync:` service.
///
/// Requests go one at a time, except pushes: [`SyncSession::push_file`] waits
/// for the device's acknowledgement, while [`super::push`] pipelines many.
/// After a failed transfer the device ends the service; the session then
/// refuses further requests and a new one must be opened.
///
/// ```no_run
/// # async fn demo(device: &oxadb::Device) -> oxadb::Result<()> {
/// use oxadb::sync::{NoProgress, PullOptions, SyncSession};
///
/// let mut session = SyncSession::open(device).await?;
/// let stat = session.stat("/system/build.prop").await?;
/// println!("{} bytes, mode {:o}", stat.size, stat.mode);
/// for entry in session.list("/data/local/tmp").await? {
///     println!("{}", entry.name_lossy());
/// }
/// session
///     .pull_file(
///         "/system/build.prop",
///         std::path::Path::new("build.prop"),
///         &PullOptions::default(),
///         &mut NoProgress,
///     )
///     .await?;
/// session.quit().await?;
/// # Ok(())
/// # }
/// ```
pub struct SyncSession {
    pub(super) stream: SyncStream,
    pub(super) serial: String,
    /// Tells why the stream ended when the whole connection did (a device
    /// unplugged, a reset link) rather than the device closing the stream.
    /// None for a stream an adb server relays.
    connection: Option<oxadb_io::Connection>,
    pub(super) features: SyncFeatures,
    /// The protocol: requests queued, replies expected and read.
    pub(super) client: Client,
    /// What happened to the file ranges of this session's pushes.
    pub(super) ranges: std::sync::Arc<oxadb_wire::RangeCounters>,
    /// Plain pushes may send file data by `sendfile` ([`Device::zero_copy`]).
    pub(super) zero_copy: bool,
    /// How long a reply may keep us waiting with nothing arriving
    /// ([`crate::ConnectOptions::reply_timeout`]).
    reply_timeout: Option<Duration>,
}

impl SyncSession {
    /// Opens `sync:` on `device`, using the protocol extensions it advertises.
    pub async fn open(device: &Device) -> Result<SyncSession> {
        SyncSession::open_with(device, SyncFeatures::of(device)).await
    }

    /// Opens `sync:` on `device`, using only `features`.
    pub async fn open_with(device: &Device, features: SyncFeatures) -> Result<SyncSession> {
        let stream = device.open(&DeviceService::Sync).await?;
        Ok(SyncSession {
            stream: SyncStream::Adb(stream),
            serial: device.serial().to_string(),
            connection: Some(device.connection().clone()),
            features,
            client: Client::new(features.versions()),
            ranges: Default::default(),
            zero_copy: device.zero_copy(),
            reply_timeout: device.reply_timeout(),
        })
    }

    /// A session on a `sync:` service already opened on `stream`, any byte
    /// stream (e.g. the socket an adb host server relays it on), using only
    /// `features`; `serial` names the device in errors. It waits for a reply
    /// for [`crate::device::DEFAULT_REPLY_TIMEOUT`] with nothing arriving
    /// unless told otherwise ([`SyncSession::with_reply_timeout`]).
    pub fn over_stream(stream: BoxedStream, serial: &str, features: SyncFeatures) -> SyncSession {
        SyncSession {
            stream: SyncStream::Plain(stream),
            serial: serial.to_string(),
            connection: None,
            features,
            client: Client::new(features.versions()),
            ranges: Default::default(),
            zero_copy: false,
            reply_timeout: Some(crate::device::DEFAULT_REPLY_TIMEOUT),
        }
    }

    /// Waits at most `limit` for a reply with nothing arriving (`None`:
    /// for ever).
    pub fn with_reply_timeout(mut self, limit: Option<Duration>) -> SyncSession {
        self.reply_timeout = limit;
        self
    }

    /// Flow-control statistics of the session's stream so far.
    pub fn stream_stats(&self) -> Option<crate::StreamStats> {
        self.stream.stats()
    }

    /// What happened to the file data of this session's plain pushes so far
    /// (sent by `sendfile` or read into memory).
    pub fn zero_copy_stats(&self) -> ZeroCopyStats {
        let (files, sendfile_bytes, copied_bytes, fallbacks) = self.ranges.snapshot();
        ZeroCopyStats {
            enabled: self.zero_copy,
            files,
            sendfile_bytes,
            copied_bytes,
            fallbacks,
        }
    }

    /// The session in `slot`, or a new one when there is none or the device
    /// ended it (a failed transfer ends adbd's sync service).
    pub(crate) async fn reuse_or_open<'a>(
        slot: &'a mut Option<SyncSession>,
        device: &dyn SyncOpener,
        features: SyncFeatures,
    ) -> Result<&'a mut SyncSession> {
        if slot.as_ref().is_none_or(SyncSession::is_ended) {
            *slot = None;
            *slot = Some(device.open_sync(features).await?);
        }
        Ok(slot.as_mut().expect("a session"))
    }

    /// The protocol extensions this session uses.
    pub fn features(&self) -> SyncFeatures {
        self.features
    }

    /// Whether the device ended the service (after a failed transfer) or the
    /// stream broke; such a session refuses further requests.
    pub fn is_ended(&self) -> bool {
        self.client.ended().is_some()
    }

    /// Waits for outstanding push acknowledgements, ends the service with
    /// `QUIT` and waits for the device to close the stream.
    pub async fn quit(mut self) -> Result<()> {
        if self.is_ended() {
            return Ok(());
        }
        self.collect_acks(true).await?;
        self.client.quit().map_err(|e| self.request_error(e))?;
        self.flush().await?;
        let _ = tokio::time::timeout(QUIT_TIMEOUT, async {
            while let Ok(Some(_)) = self.stream.read_chunk(READ_MAX).await {}
        })
        .await;
        Ok(())
    }

    // ----- the stream -----

    /// Writes what the machine queued: requests as bytes, a push's batches
    /// appended by reference (their buffers go back to the reading thread's
    /// pool once sent; file ranges go by `sendfile`).
    /// A device that takes none of it for the reply timeout (grants no
    /// credit, reads nothing) fails the write.
    pub(super) async fn write_queued(&mut self) -> std::io::Result<()> {
        while let Some(transmit) = self.client.poll_transmit() {
            let write = async {
                match transmit {
                    Transmit::Bytes(bytes) => self.stream.write_all(&bytes).await,
                    Transmit::Batch(batch) => self.stream.write_payload(batch).await,
                }
            };
            match self.reply_timeout {
                Some(limit) => tokio::time::timeout(limit, write).await.map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the device took nothing for {} s", limit.as_secs_f64()),
                    )
                })??,
                None => write.await?,
            }
        }
        Ok(())
    }

    /// [`SyncSession::write_queued`] for a request with a reply.
    pub(super) async fn flush(&mut self) -> Result<()> {
        if let Err(error) = self.write_queued().await {
            return Err(self.stream_error(&error));
        }
        Ok(())
    }

    /// [`SyncSession::write_queued`] for push data: when the device closed
    /// the stream, its `FAIL` says why.
    pub(super) async fn write_push(&mut self) -> Result<()> {
        if let Err(error) = self.write_queued().await {
            self.collect_acks(true).await?;
            return Err(self.stream_error(&error));
        }
        Ok(())
    }

    /// Waits for more of the stream and gives it to the machine; a device
    /// that sends nothing for the reply timeout ends the session.
    async fn read(&mut self) -> Result<()> {
        let read = self.stream.read_chunk(READ_MAX);
        let read = match self.reply_timeout {
            Some(limit) => match tokio::time::timeout(limit, read).await {
                Ok(read) => read,
                Err(_) => {
                    let waiting_for = self.client.awaited().unwrap_or_default();
                    self.client.end("the device stopped replying");
                    return Err(Error::ReplyTimeout {
                        addr: self.serial.clone(),
                        waiting_for,
                        seconds: limit.as_secs_f64(),
                    });
                }
            },
            None => read.await,
        };
        match read {
            Ok(Some(chunk)) => self.client.handle_input(chunk),
            Ok(None) => self.client.handle_eof(),
            Err(error) => return Err(self.stream_error(&error)),
        }
        Ok(())
    }

    /// Gives the machine what already arrived, without waiting; false if
    /// nothing had.
    async fn read_arrived(&mut self) -> Result<bool> {
        let stream = &mut self.stream;
        let polled = std::future::poll_fn(|cx| {
            let read = stream.read_chunk(READ_MAX);
            let mut read = std::pin::pin!(read);
            Poll::Ready(match read.as_mut().poll(cx) {
                Poll::Ready(result) => Some(result),
                Poll::Pending => None,
            })
        })
        .await;
        match polled {
            None => Ok(false),
            Some(Ok(Some(chunk))) => {
                self.client.handle_input(chunk);
                Ok(true)
            }
            Some(Ok(None)) => {
                self.client.handle_eof();
                Ok(true)
            }
            Some(Err(error)) => Err(self.stream_error(&error)),
        }
    }

    /// An event that arrived whole, if one did.
    fn poll_event(&mut self) -> Result<Option<ClientEvent>> {
        self.client
            .poll_event()
            .map_err(|error| self.client_error(error))
    }

    /// The next reply (or piece of one), waiting for it.
    pub(super) async fn next_event(&mut self) -> Result<ClientEvent> {
        loop {
            if let Some(event) = self.poll_event()? {
                return Ok(event);
            }
            if !self.client.awaits_reply() {
                return Err(self.protocol_error("waited for a reply no request asked for"));
            }
            // A reply may have asked for another request (adb's stat
            // fallback without STA2), which goes before waiting.
            self.flush().await?;
            self.read().await?;
        }
    }

    /// Before a request with a reply: the answers to earlier pushes come first.
    pub(super) async fn settle(&mut self) -> Result<()> {
        if self.client.pending_acks() == 0 {
            Ok(())
        } else {
            self.collect_acks(true).await
        }
    }

    /// Reads the device's answers to finished pushes: all of them when
    /// `block`, else only what already arrived (unless too many are pending).
    pub(crate) async fn collect_acks(&mut self, block: bool) -> Result<()> {
        while let Some((local, remote)) = self.client.oldest_push() {
            let context = (local.to_string(), remote.to_string());
            let wait = block || self.client.pending_acks() > MAX_UNACKED;
            match self.next_ack(wait).await {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                Err(error) => {
                    return Err(match error {
                        Error::Transfer { .. } => error,
                        other => transfer_error(format!(
                            "failed to copy '{}' to '{}': {other}",
                            context.0, context.1
                        )),
                    })
                }
            }
        }
        Ok(())
    }

    /// Consumes one `OKAY` (true), or finds not enough data without `wait`
    /// (false); a `FAIL` becomes adb's "failed to copy" error.
    async fn next_ack(&mut self, wait: bool) -> Result<bool> {
        loop {
            match self.poll_event()? {
                Some(ClientEvent::Acked) => return Ok(true),
                Some(ClientEvent::PushFailed {
                    local,
                    remote,
                    message,
                }) => {
                    return Err(transfer_error(format!(
                        "failed to copy '{local}' to '{remote}': remote {message}"
                    )))
                }
                Some(other) => return Err(self.unexpected(&other)),
                None => {}
            }
            if wait {
                self.read().await?;
            } else if !self.read_arrived().await? {
                return Ok(false);
            }
        }
    }

    // ----- errors -----

    pub(super) fn stream_error(&mut self, error: &std::io::Error) -> Error {
        self.client.end("the stream broke");
        Error::ConnectionLost {
            addr: self.serial.clone(),
            reason: format!("sync stream: {error}"),
        }
    }

    /// The error for a stream that ended under us: the connection's end if
    /// that is what ended it.
    fn stream_ended(&self) -> Error {
        Error::ConnectionLost {
            addr: self.serial.clone(),
            reason: match self.connection.as_ref().and_then(|c| c.closed()) {
                Some(error) if !error.is_clean() => error.to_string(),
                _ => "the device closed the sync stream".to_string(),
            },
        }
    }

    fn client_error(&self, error: ClientError) -> Error {
        match error {
            ClientError::Protocol(message) => Error::protocol(&self.serial, "sync", message),
            ClientError::Closed => self.stream_ended(),
        }
    }

    pub(super) fn protocol_error(&mut self, message: &str) -> Error {
        self.client.end("protocol error");
        Error::protocol(&self.serial, "sync", message)
    }

    /// A reply the machine read for another request than the one waited
    /// for: this adapter's bug, not the device's.
    pub(super) fn unexpected(&mut self, event: &ClientEvent) -> Error {
        self.protocol_error(&format!("a reply out of turn: {event:?}"))
    }

    /// Refuses a request on a session that can't be used any more.
    pub(super) fn usable(&self) -> Result<()> {
        match self.client.ended() {
            None => Ok(()),
            Some(reason) => Err(self.request_error(RequestError::Ended(reason.to_string()))),
        }
    }

    /// A request that could not be made.
    pub(super) fn request_error(&self, error: RequestError) -> Error {
        match error {
            RequestError::Path { path, error } => Error::Remote {
                path: show(&path).into_owned(),
                message: error.to_string(),
            },
            other => Error::protocol(&self.serial, "sync", other.to_string()),
        }
    }

    /// A push or pull that could not be asked for: the path did not fit.
    pub(super) fn transfer_request_error(
        &self,
        error: RequestError,
        local: &std::path::Path,
        remote: &[u8],
    ) -> Error {
        match error {
            RequestError::Path { error, .. } => transfer_error(format!(
                "failed to copy '{}' to '{}': {error}",
                local.display(),
                show(remote)
            )),
            other => self.request_error(other),
        }
    }
}

/// The stream under a session: an ADB stream of a direct connection (read
/// without copying, file ranges sent by `sendfile`), or any other byte
/// stream, read into new buffers and written from them.
pub(super) enum SyncStream {
    Adb(AdbStream),
    Plain(BoxedStream),
}

impl SyncStream {
    fn stats(&self) -> Option<crate::StreamStats> {
        match self {
            SyncStream::Adb(stream) => stream.stats(),
            SyncStream::Plain(_) => None,
        }
    }

    async fn read_chunk(&mut self, max: usize) -> std::io::Result<Option<bytes::Bytes>> {
        match self {
            SyncStream::Adb(stream) => ReadChunk::read_chunk(stream, max).await,
            SyncStream::Plain(stream) => {
                let mut chunk = bytes::BytesMut::with_capacity(max.min(256 * 1024));
                Ok(match stream.read_buf(&mut chunk).await? {
                    0 => None,
                    _ => Some(chunk.freeze()),
                })
            }
        }
    }

    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            SyncStream::Adb(stream) => stream.write_all(bytes).await,
            SyncStream::Plain(stream) => stream.write_all(bytes).await,
        }
    }

    async fn write_payload(&mut self, payload: oxadb_wire::Payload) -> std::io::Result<()> {
        match self {
            SyncStream::Adb(stream) => stream.write_payload(payload, true).await,
            SyncStream::Plain(stream) => {
                let bytes = payload.read_into_bytes()?;
                stream.write_all(&bytes).await
            }
        }
    }

    /// Whether file ranges leave by `sendfile` rather than being read here.
    pub(super) fn takes_file_ranges(&self) -> bool {
        match self {
            SyncStream::Adb(stream) => stream.takes_file_ranges(),
            SyncStream::Plain(_) => false,
        }
    }
}
