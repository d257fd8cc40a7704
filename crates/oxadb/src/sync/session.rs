//! One `sync:` stream and the requests it carries.

use std::collections::VecDeque;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use oxadb_io::AdbStream;
use oxadb_wire::sync::{self as wire, SyncHeader, SyncRequest, TransferFlags, HEADER_LEN};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::codec::FrameReader;
use super::local::{commit_attributes, PulledAttributes};
use super::{
    describe_io, show, strerror, transfer_error, Progress, PullOptions, PushOptions, RemoteEntry,
    RemoteStat, SyncFeatures, TransferSummary, SYNC_DATA_MAX,
};
use crate::device::Device;
use crate::error::{Error, Result};
use oxadb_transfer::{Chunk, ChunkReader, Destination, Policy, ReceiveError, SendError};

/// Largest chunk taken from the stream at once.
const READ_MAX: usize = 1024 * 1024;
/// Pushes in flight before waiting for acknowledgements (adb's limit).
const MAX_UNACKED: usize = 128;
/// Pulled payload pieces queued for the writing thread.
const PULL_QUEUE_DEPTH: usize = 64;
/// Longest entry name accepted in a listing.
const MAX_NAME_LEN: usize = 4096;
/// How long `quit` waits for the device to close the stream.
const QUIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a `stat` failed on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatFailure {
    /// `stat_v2` reports the errno (Linux numbering).
    Errno(u32),
    /// A `STAT` (v1) reply of zeroes: the path does not exist or can't be read.
    Unknown,
}

impl StatFailure {
    pub(crate) fn is_not_found(self) -> bool {
        matches!(
            self,
            StatFailure::Unknown | StatFailure::Errno(2 /* ENOENT */)
        )
    }

    pub(crate) fn describe(self) -> String {
        match self {
            StatFailure::Errno(errno) => strerror(errno as i32),
            StatFailure::Unknown => "does not exist".to_string(),
        }
    }
}

pub(crate) type StatReply = std::result::Result<RemoteStat, StatFailure>;

/// How a push sends its data.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendMode {
    pub compression: wire::Compression,
    pub dry_run: bool,
}

/// What a push sends.
pub(crate) enum Content {
    /// Small files and symlink targets: sent in one write with the request.
    Bytes(Vec<u8>),
    /// Read and framed on a blocking thread.
    File(std::fs::File),
}

/// A file or symlink to push.
pub(crate) struct Upload<'a> {
    pub local: &'a Path,
    pub remote: &'a [u8],
    /// Full `st_mode`: `S_IFLNK` makes the device create a symlink.
    pub mode: u32,
    pub mtime: u32,
    /// Size for progress reports.
    pub size: u64,
    pub content: Content,
}

/// What a push needs to know about a local regular file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalFile {
    pub size: u64,
    /// Full `st_mode`.
    pub mode: u32,
    pub mtime: i64,
}

impl LocalFile {
    pub(crate) fn of(metadata: &std::fs::Metadata) -> LocalFile {
        use std::os::unix::fs::MetadataExt;
        LocalFile {
            size: metadata.size(),
            mode: metadata.mode(),
            mtime: metadata.mtime(),
        }
    }
}

/// A push sent but not yet acknowledged, named for error messages.
struct Unacked {
    local: String,
    remote: String,
}

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
    stream: AdbStream,
    serial: String,
    /// Tells why the stream ended when the whole connection did (a device
    /// unplugged, a reset link) rather than the device closing the stream.
    connection: oxadb_io::Connection,
    features: SyncFeatures,
    /// Received bytes not consumed yet.
    inbox: VecDeque<Bytes>,
    inbox_len: usize,
    unacked: VecDeque<Unacked>,
    /// Why the service can't be used any more, once it can't.
    ended: Option<String>,
}

impl SyncSession {
    /// Opens `sync:` on `device`, using the protocol extensions it advertises.
    pub async fn open(device: &Device) -> Result<SyncSession> {
        SyncSession::open_with(device, SyncFeatures::of(device)).await
    }

    /// Opens `sync:` on `device`, using only `features`.
    pub async fn open_with(device: &Device, features: SyncFeatures) -> Result<SyncSession> {
        let stream = device.open("sync:").await?;
        Ok(SyncSession {
            stream,
            serial: device.serial().to_string(),
            connection: device.connection().clone(),
            features,
            inbox: VecDeque::new(),
            inbox_len: 0,
            unacked: VecDeque::new(),
            ended: None,
        })
    }

    /// Flow-control statistics of the session's stream so far.
    pub fn stream_stats(&self) -> Option<crate::StreamStats> {
        self.stream.stats()
    }

    /// The protocol extensions this session uses.
    /// The session in `slot`, or a new one when there is none or the device
    /// ended it (a failed transfer ends adbd's sync service).
    pub(crate) async fn reuse_or_open<'a>(
        slot: &'a mut Option<SyncSession>,
        device: &Device,
        features: SyncFeatures,
    ) -> Result<&'a mut SyncSession> {
        if slot.as_ref().is_none_or(SyncSession::is_ended) {
            *slot = None;
            *slot = Some(SyncSession::open_with(device, features).await?);
        }
        Ok(slot.as_mut().expect("a session"))
    }

    pub fn features(&self) -> SyncFeatures {
        self.features
    }

    /// Whether the device ended the service (after a failed transfer) or the
    /// stream broke; such a session refuses further requests.
    pub fn is_ended(&self) -> bool {
        self.ended.is_some()
    }

    /// Metadata of `path`, following symlinks (`STA2`; with only `STAT`, a
    /// symlink is reported as a directory or a file of size 0, as adb does).
    pub async fn stat(&mut self, path: impl AsRef<[u8]>) -> Result<RemoteStat> {
        let path = path.as_ref();
        let reply = self.stat_follow(path).await?;
        reply.map_err(|failure| remote_error(path, failure))
    }

    /// Metadata of `path` itself (`LST2`, or `STAT` without `stat_v2`).
    pub async fn lstat(&mut self, path: impl AsRef<[u8]>) -> Result<RemoteStat> {
        let path = path.as_ref();
        let reply = self.lstat_raw(path).await?;
        reply.map_err(|failure| remote_error(path, failure))
    }

    /// The entries of directory `path` (`LIS2`, or `LIST` without `ls_v2`),
    /// `.` and `..` included. The device answers an unreadable or missing
    /// directory with an empty listing.
    pub async fn list(&mut self, path: impl AsRef<[u8]>) -> Result<Vec<RemoteEntry>> {
        let path = path.as_ref();
        self.settle().await?;
        let v2 = self.features.ls_v2;
        let id = if v2 {
            wire::ID_LIST_V2
        } else {
            wire::ID_LIST_V1
        };
        let request = self.request(id, path)?;
        self.write(&request).await?;
        let mut entries = Vec::new();
        loop {
            let fixed = if v2 {
                self.read_vec(wire::DENT_V2_LEN).await?
            } else {
                self.read_vec(wire::DENT_V1_LEN).await?
            };
            let id = u32::from_le_bytes(fixed[0..4].try_into().expect("4 bytes"));
            if id == wire::ID_DONE {
                return Ok(entries);
            }
            let expected = if v2 {
                wire::ID_DENT_V2
            } else {
                wire::ID_DENT_V1
            };
            if id != expected {
                return Err(self.protocol_error(format!(
                    "listing '{}': expected {} or DONE, got {}",
                    show(path),
                    wire::id_name(expected),
                    wire::id_name(id)
                )));
            }
            let name_at = if v2 { 72 } else { 16 };
            let name_len =
                u32::from_le_bytes(fixed[name_at..name_at + 4].try_into().expect("4")) as usize;
            if name_len > MAX_NAME_LEN {
                return Err(self.protocol_error(format!(
                    "listing '{}': entry name of {name_len} bytes",
                    show(path)
                )));
            }
            let mut whole = fixed;
            whole.extend_from_slice(&self.read_vec(name_len).await?);
            let parsed = if v2 {
                wire::parse_dent_v2(&whole)
            } else {
                wire::parse_dent_v1(&whole)
            };
            let (dent, _) = parsed.map_err(|e| self.protocol_error(e.to_string()))?;
            if dent.stat.error != 0 {
                tracing::debug!(
                    "sync: listing '{}': entry {:?}: {}",
                    show(path),
                    String::from_utf8_lossy(&dent.name),
                    strerror(dent.stat.error as i32)
                );
                continue;
            }
            entries.push(RemoteEntry {
                name: dent.name,
                stat: RemoteStat::from_v2(&dent.stat),
            });
        }
    }

    /// Pushes the regular file `local` (symlinks followed) to exactly `remote`
    /// and waits for the device to confirm it. With `options.sync` an
    /// unchanged file (same size and mtime on the device) is skipped.
    pub async fn push_file(
        &mut self,
        local: &Path,
        remote: impl AsRef<[u8]>,
        options: &PushOptions,
        progress: &mut dyn Progress,
    ) -> Result<TransferSummary> {
        let started = Instant::now();
        let remote = remote.as_ref();
        if options.dry_run && !self.features.dry_run_send {
            return Err(transfer_error(
                "dry-run not supported by the device".to_string(),
            ));
        }
        let metadata = tokio::fs::metadata(local).await.map_err(|e| {
            transfer_error(format!(
                "cannot stat '{}': {}",
                local.display(),
                describe_io(&e)
            ))
        })?;
        if !metadata.is_file() {
            return Err(transfer_error(format!(
                "cannot push '{}': not a regular file",
                local.display()
            )));
        }
        let mut summary = TransferSummary::default();
        if options.sync && self.unchanged(remote, &metadata).await? {
            summary.files_skipped = 1;
        } else {
            let mode = SendMode {
                compression: self.features.resolve(options.compression),
                dry_run: options.dry_run,
            };
            let bytes = self
                .send_regular(local, remote, LocalFile::of(&metadata), mode, progress)
                .await?;
            self.collect_acks(true).await?;
            summary.files_transferred = 1;
            summary.bytes = bytes;
        }
        summary.elapsed = started.elapsed();
        Ok(summary)
    }

    /// Pulls `remote` into exactly the path `local`, through a temporary file
    /// renamed into place at the end (an existing non-regular `local`, such as
    /// a device node, is written in place). With `options.preserve` the file
    /// gets the remote mtime and mode.
    pub async fn pull_file(
        &mut self,
        remote: impl AsRef<[u8]>,
        local: &Path,
        options: &PullOptions,
        progress: &mut dyn Progress,
    ) -> Result<TransferSummary> {
        let started = Instant::now();
        let remote = remote.as_ref();
        let (attributes, size) = if options.preserve {
            let stat = self.stat(remote).await?;
            (
                Some(PulledAttributes {
                    mode: stat.mode,
                    mtime: stat.mtime,
                }),
                Some(stat.size),
            )
        } else {
            (None, None)
        };
        let compression = self.features.resolve(options.compression);
        let bytes = self
            .receive(remote, local, size, compression, attributes, progress)
            .await?;
        Ok(TransferSummary {
            files_transferred: 1,
            files_skipped: 0,
            bytes,
            elapsed: started.elapsed(),
            stream: self.stream_stats(),
        })
    }

    /// Waits for outstanding push acknowledgements, ends the service with
    /// `QUIT` and waits for the device to close the stream.
    pub async fn quit(mut self) -> Result<()> {
        if self.ended.is_some() {
            return Ok(());
        }
        self.collect_acks(true).await?;
        let request = self.request(wire::ID_QUIT, b"")?;
        self.write(&request).await?;
        let _ = tokio::time::timeout(QUIT_TIMEOUT, async {
            while let Ok(Some(_)) = self.stream.read_chunk(READ_MAX).await {}
        })
        .await;
        Ok(())
    }

    // ----- stat -----

    pub(crate) async fn lstat_raw(&mut self, path: &[u8]) -> Result<StatReply> {
        self.settle().await?;
        let id = if self.features.stat_v2 {
            wire::ID_LSTAT_V2
        } else {
            wire::ID_LSTAT_V1
        };
        let request = self.request(id, path)?;
        self.write(&request).await?;
        self.read_stat_reply(id, path).await
    }

    /// `stat` following symlinks; emulated with `STAT` like adb's fallback.
    pub(crate) async fn stat_follow(&mut self, path: &[u8]) -> Result<StatReply> {
        self.settle().await?;
        if self.features.stat_v2 {
            let request = self.request(wire::ID_STAT_V2, path)?;
            self.write(&request).await?;
            return self.read_stat_reply(wire::ID_STAT_V2, path).await;
        }
        let mut stat = match self.lstat_raw(path).await? {
            Ok(stat) => stat,
            failed => return Ok(failed),
        };
        if stat.is_symlink() {
            // "path/" resolves only if the link points at a directory.
            let mut as_dir = path.to_vec();
            as_dir.push(b'/');
            let kind = if self.lstat_raw(&as_dir).await?.is_ok() {
                libc::S_IFDIR
            } else {
                libc::S_IFREG
            };
            stat.mode = (stat.mode & !libc::S_IFMT) | kind;
            stat.size = 0;
        }
        Ok(Ok(stat))
    }

    /// `lstat`s of many paths, pipelined in batches like adb's `--sync` check.
    pub(crate) async fn lstat_many(&mut self, paths: &[&[u8]]) -> Result<Vec<StatReply>> {
        self.settle().await?;
        let id = if self.features.stat_v2 {
            wire::ID_LSTAT_V2
        } else {
            wire::ID_LSTAT_V1
        };
        let mut replies = Vec::with_capacity(paths.len());
        for batch in paths.chunks(MAX_UNACKED) {
            let mut requests = Vec::new();
            for path in batch {
                requests.extend_from_slice(&self.request(id, path)?);
            }
            self.write(&requests).await?;
            for path in batch {
                replies.push(self.read_stat_reply(id, path).await?);
            }
        }
        Ok(replies)
    }

    async fn read_stat_reply(&mut self, id: u32, path: &[u8]) -> Result<StatReply> {
        if id == wire::ID_LSTAT_V1 {
            let bytes = self.read_vec(wire::STAT_V1_LEN).await?;
            let (reply_id, stat) = wire::StatV1::parse(&bytes).expect("a full reply");
            if reply_id != id {
                return Err(self.unexpected_reply("STAT", reply_id, path));
            }
            if stat == wire::StatV1::default() {
                return Ok(Err(StatFailure::Unknown));
            }
            return Ok(Ok(RemoteStat {
                mode: stat.mode,
                size: u64::from(stat.size),
                mtime: i64::from(stat.mtime),
                ctime: i64::from(stat.mtime),
                ..RemoteStat::default()
            }));
        }
        let bytes = self.read_vec(wire::STAT_V2_LEN).await?;
        let (reply_id, stat) = wire::StatV2::parse(&bytes).expect("a full reply");
        if reply_id != id {
            return Err(self.unexpected_reply(&wire::id_name(id), reply_id, path));
        }
        if stat.error != 0 {
            return Ok(Err(StatFailure::Errno(stat.error)));
        }
        Ok(Ok(RemoteStat::from_v2(&stat)))
    }

    /// Whether `remote` has the size and mtime of the local file (`--sync`).
    pub(crate) async fn unchanged(
        &mut self,
        remote: &[u8],
        metadata: &std::fs::Metadata,
    ) -> Result<bool> {
        use std::os::unix::fs::MetadataExt;
        Ok(match self.lstat_raw(remote).await? {
            Ok(stat) => stat.size == metadata.size() && stat.mtime == metadata.mtime(),
            Err(_) => false,
        })
    }

    // ----- push -----

    /// Sends the regular file `local` without waiting for the acknowledgement.
    pub(crate) async fn send_regular(
        &mut self,
        local: &Path,
        remote: &[u8],
        file: LocalFile,
        mode: SendMode,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        let size = file.size;
        let content = if size < SYNC_DATA_MAX as u64 {
            let data = tokio::fs::read(local).await.map_err(|e| {
                transfer_error(format!(
                    "failed to read all of '{}': {}",
                    local.display(),
                    describe_io(&e)
                ))
            })?;
            Content::Bytes(data)
        } else {
            let file = std::fs::File::open(local).map_err(|e| {
                transfer_error(format!(
                    "opening '{}' locally failed: {}",
                    local.display(),
                    describe_io(&e)
                ))
            })?;
            Content::File(file)
        };
        let upload = Upload {
            local,
            remote,
            mode: file.mode,
            mtime: file.mtime as u32,
            size,
            content,
        };
        self.send(upload, mode, progress).await
    }

    /// Sends one push (request, data, `DONE`); the acknowledgement is
    /// collected later. Returns the file bytes sent (before compression).
    pub(crate) async fn send(
        &mut self,
        upload: Upload<'_>,
        mode: SendMode,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        self.usable()?;
        let local_name = upload.local.display().to_string();
        let remote_name = show(upload.remote).into_owned();
        progress.start(&remote_name, Some(upload.size));
        let result = self.send_inner(upload, mode, progress).await;
        progress.finish();
        result.map_err(|error| match error {
            Error::Transfer { .. } => error,
            other => transfer_error(format!(
                "failed to copy '{local_name}' to '{remote_name}': {other}"
            )),
        })
    }

    async fn send_inner(
        &mut self,
        upload: Upload<'_>,
        mode: SendMode,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        let Upload {
            local,
            remote,
            mode: file_mode,
            mtime,
            content,
            ..
        } = upload;
        match content {
            Content::Bytes(data) => {
                // Small data is never worth compressing (nor does adb).
                let mode = SendMode {
                    compression: wire::Compression::None,
                    ..mode
                };
                let mut message = self.send_request(local, remote, file_mode, mode)?;
                message.reserve(2 * HEADER_LEN + data.len());
                message.extend_from_slice(&wire::encode_data_header(data.len()));
                message.extend_from_slice(&data);
                message.extend_from_slice(&wire::encode_done(mtime));
                self.expect_ack(local, remote);
                self.write_push(&message).await?;
                progress.advance(data.len() as u64);
                self.collect_acks(false).await?;
                Ok(data.len() as u64)
            }
            Content::File(file) => {
                let request = self.send_request(local, remote, file_mode, mode)?;
                self.expect_ack(local, remote);
                self.write_push(&request).await?;
                let mut reader = FrameReader::start(file, mode.compression);
                let mut sent = 0;
                while let Some(batch) = reader.next().await {
                    self.write_push(&batch).await?;
                    // Dropped, the batch's buffer goes back to the reading thread's pool.
                    drop(batch);
                    let read = reader.newly_read();
                    sent += read;
                    progress.advance(read);
                    // A FAIL for this push (say, no space) stops it early.
                    self.collect_acks(false).await?;
                }
                let read = reader.newly_read();
                sent += read;
                progress.advance(read);
                match reader.finish().await {
                    Ok(()) => {}
                    Err(failure) => {
                        // Without DONE the device discards what it got; this
                        // stream can't continue, so end it.
                        self.end("a push was abandoned halfway");
                        let message = match failure {
                            SendError::Read(e) => format!(
                                "reading '{}' locally failed: {}",
                                local.display(),
                                describe_io(&e)
                            ),
                            SendError::Compress(e) => format!(
                                "compressing '{}' locally failed: {}",
                                local.display(),
                                describe_io(&e)
                            ),
                            SendError::Stopped => {
                                format!("reading '{}' locally stopped", local.display())
                            }
                        };
                        return Err(transfer_error(message));
                    }
                }
                self.write_push(&wire::encode_done(mtime)).await?;
                self.collect_acks(false).await?;
                Ok(sent)
            }
        }
    }

    fn send_request(
        &mut self,
        local: &Path,
        remote: &[u8],
        file_mode: u32,
        mode: SendMode,
    ) -> Result<Vec<u8>> {
        if self.features.sendrecv_v2 {
            let mut message = self.path_request(wire::ID_SEND_V2, remote, local, remote)?;
            let setup = wire::SendV2Setup {
                id: wire::ID_SEND_V2,
                mode: file_mode,
                flags: TransferFlags {
                    compression: mode.compression,
                    dry_run: mode.dry_run,
                }
                .to_flags(),
            };
            message.extend_from_slice(&setup.encode());
            Ok(message)
        } else {
            if mode.dry_run {
                return Err(transfer_error(
                    "dry-run not supported by the device".to_string(),
                ));
            }
            let mut spec = remote.to_vec();
            spec.extend_from_slice(format!(",{file_mode}").as_bytes());
            self.path_request(wire::ID_SEND_V1, &spec, local, remote)
        }
    }

    /// A request whose path is checked against the protocol's limit.
    fn path_request(&self, id: u32, path: &[u8], local: &Path, remote: &[u8]) -> Result<Vec<u8>> {
        SyncRequest {
            id,
            path: path.to_vec(),
        }
        .encode()
        .map_err(|e| {
            transfer_error(format!(
                "failed to copy '{}' to '{}': {e}",
                local.display(),
                show(remote)
            ))
        })
    }

    fn expect_ack(&mut self, local: &Path, remote: &[u8]) {
        self.unacked.push_back(Unacked {
            local: local.display().to_string(),
            remote: show(remote).into_owned(),
        });
    }

    /// Writes push data; when the device closed the stream, its `FAIL` says why.
    async fn write_push(&mut self, bytes: &[u8]) -> Result<()> {
        if let Err(error) = self.stream.write_all(bytes).await {
            self.collect_acks(true).await?;
            return Err(self.stream_error(&error));
        }
        Ok(())
    }

    /// Reads the device's answers to finished pushes: all of them when
    /// `block`, else only what already arrived (unless too many are pending).
    pub(crate) async fn collect_acks(&mut self, block: bool) -> Result<()> {
        while let Some(front) = self.unacked.front() {
            let context = (front.local.clone(), front.remote.clone());
            let wait = block || self.unacked.len() > MAX_UNACKED;
            match self.next_ack(wait).await {
                Ok(true) => {
                    self.unacked.pop_front();
                }
                Ok(false) => return Ok(()),
                Err(error) => {
                    self.unacked.clear();
                    return Err(match error {
                        Error::Transfer { .. } => error,
                        other => transfer_error(format!(
                            "failed to copy '{}' to '{}': {other}",
                            context.0, context.1
                        )),
                    });
                }
            }
        }
        Ok(())
    }

    /// Consumes one `OKAY` (true), or finds not enough data without `wait`
    /// (false); a `FAIL` becomes adb's "failed to copy" error.
    async fn next_ack(&mut self, wait: bool) -> Result<bool> {
        loop {
            if let Some(header) = self.peek_header() {
                match header.id {
                    wire::ID_OKAY => {
                        self.consume(HEADER_LEN);
                        if header.len != 0 {
                            return Err(self.protocol_error(format!(
                                "OKAY with a message length of {}",
                                header.len
                            )));
                        }
                        return Ok(true);
                    }
                    wire::ID_FAIL => {
                        let len = header.len as usize;
                        if len > SYNC_DATA_MAX {
                            return Err(self.protocol_error(format!("FAIL message of {len} bytes")));
                        }
                        if self.inbox_len >= HEADER_LEN + len {
                            self.consume(HEADER_LEN);
                            let message = self.take_vec(len);
                            let failed = self.unacked.pop_front().expect("a pending push");
                            self.end("the device reported a failed push");
                            return Err(transfer_error(format!(
                                "failed to copy '{}' to '{}': remote {}",
                                failed.local,
                                failed.remote,
                                String::from_utf8_lossy(&message)
                            )));
                        }
                    }
                    other => {
                        return Err(self.protocol_error(format!(
                            "unexpected response to a push: {}",
                            wire::id_name(other)
                        )))
                    }
                }
            }
            if wait {
                self.fill().await?;
            } else if !self.poll_fill().await? {
                return Ok(false);
            }
        }
    }

    // ----- pull -----

    /// Pulls `remote` into `local`; returns the file bytes written.
    pub(crate) async fn receive(
        &mut self,
        remote: &[u8],
        local: &Path,
        size: Option<u64>,
        compression: wire::Compression,
        attributes: Option<PulledAttributes>,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        self.usable()?;
        self.settle().await?;
        let remote_name = show(remote).into_owned();
        progress.start(&remote_name, size);
        let result = self
            .receive_inner(remote, local, compression, attributes, progress)
            .await;
        progress.finish();
        result.map_err(|error| match error {
            Error::Transfer { .. } => error,
            other => transfer_error(format!(
                "failed to copy '{remote_name}' to '{}': {other}",
                local.display()
            )),
        })
    }

    async fn receive_inner(
        &mut self,
        remote: &[u8],
        local: &Path,
        compression: wire::Compression,
        attributes: Option<PulledAttributes>,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        let request = if self.features.sendrecv_v2 {
            let mut request = self.path_request(wire::ID_RECV_V2, remote, local, remote)?;
            let setup = wire::RecvV2Setup {
                id: wire::ID_RECV_V2,
                flags: compression.flag(),
            };
            request.extend_from_slice(&setup.encode());
            request
        } else {
            self.path_request(wire::ID_RECV_V1, remote, local, remote)?
        };
        let compression = if self.features.sendrecv_v2 {
            compression
        } else {
            wire::Compression::None
        };

        let target_path = local.to_path_buf();
        let target =
            tokio::task::spawn_blocking(move || Destination::open(&target_path, &Policy::HOST))
                .await
                .map_err(|e| Error::io("pull", std::io::Error::other(e)))?
                .map_err(|e| {
                    transfer_error(format!(
                        "cannot create '{}': {}",
                        local.display(),
                        describe_io(&e.error)
                    ))
                })?;
        if let Err(error) = self.stream.write_all(&request).await {
            // Dropping the destination discards its temporary file.
            drop(target);
            return Err(self.stream_error(&error));
        }

        let written = Arc::new(AtomicU64::new(0));
        let mut sink = PullSink::new(
            target,
            compression,
            attributes,
            local,
            &show(remote),
            written.clone(),
        );
        let mut reported = 0;
        let outcome = loop {
            let header = match self.read_header().await {
                Ok(header) => header,
                Err(error) => break Err(error),
            };
            match header.id {
                wire::ID_DATA => {
                    let len = match header.data_len() {
                        Ok(len) => len,
                        Err(e) => break Err(self.protocol_error(e.to_string())),
                    };
                    let mut left = len;
                    let mut failed = None;
                    while left > 0 {
                        if self.inbox_len == 0 {
                            if let Err(error) = self.fill().await {
                                failed = Some(error);
                                break;
                            }
                        }
                        let piece = self.take_piece(left);
                        left -= piece.len();
                        // A failed write is reported after DONE: reading on
                        // keeps the session usable for the next request.
                        sink.data(piece).await;
                    }
                    if let Some(error) = failed {
                        break Err(error);
                    }
                    let now = written.load(Ordering::Relaxed);
                    progress.advance(now - reported);
                    reported = now;
                }
                wire::ID_DONE => {
                    sink.done().await;
                    break Ok(());
                }
                wire::ID_FAIL => {
                    let len = (header.len as usize).min(SYNC_DATA_MAX);
                    let message = match self.read_vec(len).await {
                        Ok(message) => String::from_utf8_lossy(&message).into_owned(),
                        Err(error) => break Err(error),
                    };
                    self.end("the device reported a failed pull");
                    break Err(transfer_error(format!(
                        "failed to copy '{}' to '{}': remote {message}",
                        show(remote),
                        local.display()
                    )));
                }
                other => {
                    break Err(self.protocol_error(format!(
                        "expected DATA, DONE or FAIL, got {}",
                        wire::id_name(other)
                    )))
                }
            }
        };
        let written_result = sink.finish(local).await;
        let total = written.load(Ordering::Relaxed);
        progress.advance(total - reported);
        outcome?;
        match written_result {
            Ok(()) => Ok(total),
            Err(Some(message)) => Err(transfer_error(message)),
            Err(None) => Err(transfer_error(format!(
                "failed to copy '{}' to '{}': transfer stopped",
                show(remote),
                local.display()
            ))),
        }
    }

    // ----- stream helpers -----

    /// Before a request with a reply: the answers to earlier pushes come first.
    async fn settle(&mut self) -> Result<()> {
        if self.unacked.is_empty() {
            Ok(())
        } else {
            self.collect_acks(true).await
        }
    }

    fn usable(&self) -> Result<()> {
        match &self.ended {
            None => Ok(()),
            Some(reason) => Err(Error::Protocol(format!(
                "{}: this sync session can't be used any more: {reason}",
                self.serial
            ))),
        }
    }

    fn end(&mut self, reason: &str) {
        if self.ended.is_none() {
            self.ended = Some(reason.to_string());
        }
    }

    fn request(&self, id: u32, path: &[u8]) -> Result<Vec<u8>> {
        self.usable()?;
        SyncRequest {
            id,
            path: path.to_vec(),
        }
        .encode()
        .map_err(|e| Error::Remote {
            path: show(path).into_owned(),
            message: e.to_string(),
        })
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        if let Err(error) = self.stream.write_all(bytes).await {
            return Err(self.stream_error(&error));
        }
        Ok(())
    }

    fn stream_error(&mut self, error: &std::io::Error) -> Error {
        self.end("the stream broke");
        Error::ConnectionLost {
            addr: self.serial.clone(),
            reason: format!("sync stream: {error}"),
        }
    }

    fn protocol_error(&mut self, message: String) -> Error {
        self.end("protocol error");
        Error::Protocol(format!("{}: {message}", self.serial))
    }

    fn unexpected_reply(&mut self, expected: &str, got: u32, path: &[u8]) -> Error {
        self.protocol_error(format!(
            "expected a {expected} reply for '{}', got {}",
            show(path),
            wire::id_name(got)
        ))
    }

    fn push_chunk(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.inbox_len += chunk.len();
            self.inbox.push_back(chunk);
        }
    }

    /// The error for a stream that ended under us: the connection's end if
    /// that is what ended it.
    fn stream_ended(&self) -> Error {
        Error::ConnectionLost {
            addr: self.serial.clone(),
            reason: match self.connection.closed() {
                Some(error) if !error.is_clean() => error.to_string(),
                _ => "the device closed the sync stream".to_string(),
            },
        }
    }

    /// Waits for more data; the end of the stream is an error here.
    async fn fill(&mut self) -> Result<()> {
        match self.stream.read_chunk(READ_MAX).await {
            Ok(Some(chunk)) => {
                self.push_chunk(chunk);
                Ok(())
            }
            Ok(None) => {
                self.end("the device closed the stream");
                Err(self.stream_ended())
            }
            Err(error) => Err(self.stream_error(&error)),
        }
    }

    /// Takes data that already arrived, without waiting; false if none had.
    async fn poll_fill(&mut self) -> Result<bool> {
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
                self.push_chunk(chunk);
                Ok(true)
            }
            Some(Ok(None)) => {
                self.end("the device closed the stream");
                Err(self.stream_ended())
            }
            Some(Err(error)) => Err(self.stream_error(&error)),
        }
    }

    fn peek_header(&self) -> Option<SyncHeader> {
        if self.inbox_len < HEADER_LEN {
            return None;
        }
        let mut bytes = [0u8; HEADER_LEN];
        let mut filled = 0;
        for chunk in &self.inbox {
            let take = (HEADER_LEN - filled).min(chunk.len());
            bytes[filled..filled + take].copy_from_slice(&chunk[..take]);
            filled += take;
            if filled == HEADER_LEN {
                break;
            }
        }
        SyncHeader::parse(&bytes).ok()
    }

    fn consume(&mut self, mut amount: usize) {
        while amount > 0 {
            let front = self.inbox.front_mut().expect("enough buffered data");
            let take = amount.min(front.len());
            front.advance(take);
            if front.is_empty() {
                self.inbox.pop_front();
            }
            self.inbox_len -= take;
            amount -= take;
        }
    }

    /// Copies out `len` buffered bytes (which must be there).
    fn take_vec(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let front = self.inbox.front_mut().expect("enough buffered data");
            let take = (len - out.len()).min(front.len());
            out.extend_from_slice(&front[..take]);
            front.advance(take);
            if front.is_empty() {
                self.inbox.pop_front();
            }
            self.inbox_len -= take;
        }
        out
    }

    /// Up to `max` buffered bytes (at least one must be there), without copying.
    fn take_piece(&mut self, max: usize) -> Bytes {
        let front = self.inbox.front_mut().expect("buffered data");
        let piece = if front.len() <= max {
            self.inbox.pop_front().expect("a front chunk")
        } else {
            front.split_to(max)
        };
        self.inbox_len -= piece.len();
        piece
    }

    async fn read_vec(&mut self, len: usize) -> Result<Vec<u8>> {
        while self.inbox_len < len {
            self.fill().await?;
        }
        Ok(self.take_vec(len))
    }

    async fn read_header(&mut self) -> Result<SyncHeader> {
        let bytes = self.read_vec(HEADER_LEN).await?;
        Ok(SyncHeader::parse(&bytes).expect("a full header"))
    }
}

fn remote_error(path: &[u8], failure: StatFailure) -> Error {
    Error::Remote {
        path: show(path).into_owned(),
        message: failure.describe(),
    }
}

/// Where a pull's data goes.
///
/// A blocking thread by default, so that a slow destination (a FIFO, a
/// terminal, a throttled disk) never stalls the runtime. A plain pull into a
/// regular file on a current-thread runtime (the CLI's) writes in the
/// receiving task instead: each piece is written while still in cache and no
/// thread hand-off happens per piece (1 GiB pulled into tmpfs: client CPU
/// 0.74 -> 0.58 s/GiB and 1565 -> 1715 MB/s, medians of 5, docs/benchmarks.md).
enum PullSink {
    Thread {
        pieces: Option<mpsc::Sender<Chunk>>,
        worker: tokio::task::JoinHandle<std::result::Result<(), Option<String>>>,
    },
    Inline {
        target: Option<Destination>,
        attributes: Option<PulledAttributes>,
        failure: Option<std::io::Error>,
        /// `DONE` arrived: the file is complete.
        complete: bool,
        written: Arc<AtomicU64>,
    },
}

impl PullSink {
    fn new(
        target: Destination,
        compression: wire::Compression,
        attributes: Option<PulledAttributes>,
        local: &Path,
        remote: &str,
        written: Arc<AtomicU64>,
    ) -> PullSink {
        let current_thread = tokio::runtime::Handle::try_current().is_ok_and(|handle| {
            handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
        });
        if current_thread && compression == wire::Compression::None && target.is_regular_file() {
            return PullSink::Inline {
                target: Some(target),
                attributes,
                failure: None,
                complete: false,
                written,
            };
        }
        let (pieces, queue) = mpsc::channel(PULL_QUEUE_DEPTH);
        let local = local.to_path_buf();
        let remote = remote.to_string();
        let worker = tokio::task::spawn_blocking(move || {
            write_target(
                target,
                queue,
                compression,
                attributes,
                &written,
                &local,
                &remote,
            )
        });
        PullSink::Thread {
            pieces: Some(pieces),
            worker,
        }
    }

    /// Writes (or queues) one piece; after a failure the rest is dropped.
    async fn data(&mut self, piece: Bytes) {
        match self {
            PullSink::Thread { pieces, .. } => {
                if let Some(sender) = pieces {
                    if sender.send(Chunk::Data(piece)).await.is_err() {
                        // The writer failed and will say why.
                        *pieces = None;
                    }
                }
            }
            PullSink::Inline {
                target,
                failure,
                written,
                ..
            } => {
                if failure.is_some() {
                    return;
                }
                let file = target.as_ref().expect("target kept until finish").file();
                match std::io::Write::write_all(&mut &*file, &piece) {
                    Ok(()) => {
                        written.fetch_add(piece.len() as u64, Ordering::Relaxed);
                    }
                    Err(error) => *failure = Some(error),
                }
            }
        }
    }

    /// The device sent `DONE`: everything arrived.
    async fn done(&mut self) {
        match self {
            PullSink::Thread { pieces, .. } => {
                if let Some(sender) = pieces.take() {
                    let _ = sender.send(Chunk::Done { mtime: 0 }).await;
                }
            }
            PullSink::Inline { complete, .. } => *complete = true,
        }
    }

    /// Commits the file after `done`, discards it otherwise. `Err(None)`
    /// means the transfer stopped before `DONE` and the caller says why.
    async fn finish(self, local: &Path) -> std::result::Result<(), Option<String>> {
        match self {
            PullSink::Thread { pieces, worker } => {
                drop(pieces);
                worker
                    .await
                    .unwrap_or_else(|e| Err(Some(format!("writing '{}': {e}", local.display()))))
            }
            PullSink::Inline {
                target,
                attributes,
                failure,
                complete,
                ..
            } => {
                let target = target.expect("target kept until finish");
                // Dropping the destination discards its temporary file.
                if !complete && failure.is_none() {
                    drop(target);
                    return Err(None);
                }
                if let Some(error) = failure {
                    drop(target);
                    return Err(Some(format!(
                        "cannot write '{}': {}",
                        local.display(),
                        describe_io(&error)
                    )));
                }
                target.commit(commit_attributes(attributes)).map_err(|e| {
                    Some(format!(
                        "cannot create '{}': {}",
                        local.display(),
                        describe_io(&e.error)
                    ))
                })
            }
        }
    }
}

/// The pull's blocking half: writes the data, then commits or discards the
/// target. `Err(None)` means the async side stopped it and reports why.
fn write_target(
    target: Destination,
    queue: mpsc::Receiver<Chunk>,
    compression: wire::Compression,
    attributes: Option<PulledAttributes>,
    written: &AtomicU64,
    local: &Path,
    remote: &str,
) -> std::result::Result<(), Option<String>> {
    let mut input = ChunkReader::new(queue);
    match oxadb_transfer::receive(&mut input, compression, &mut target.file(), written) {
        Ok(()) => target.commit(commit_attributes(attributes)).map_err(|e| {
            Some(format!(
                "cannot create '{}': {}",
                local.display(),
                describe_io(&e.error)
            ))
        }),
        Err(failure) => {
            // Dropping the destination discards its temporary file.
            drop(target);
            Err(match failure {
                ReceiveError::Output(e) => Some(format!(
                    "cannot write '{}': {}",
                    local.display(),
                    describe_io(&e)
                )),
                ReceiveError::Decode(e) => Some(format!(
                    "failed to copy '{remote}' to '{}': decompression failed: {e}",
                    local.display()
                )),
                ReceiveError::Stopped => None,
            })
        }
    }
}
