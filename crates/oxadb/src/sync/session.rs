//! One `sync:` stream and the requests it carries: the session, its public
//! requests and `stat`s. The rest of [`SyncSession`] is split by job:
//! `framing.rs` (building requests, reading replies off the stream),
//! `send.rs` (pipelined pushes) and `receive.rs` (pulls).

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use oxadb_io::AdbStream;
use oxadb_transfer::Inbox;
use oxadb_wire::service::DeviceService;
use oxadb_wire::sync as wire;

use super::framing::READ_MAX;
use super::local::PulledAttributes;
use super::send::{LocalFile, SendMode, Unacked, MAX_UNACKED};
use super::{
    describe_io, show, strerror, transfer_error, Progress, PullOptions, PushOptions, RemoteEntry,
    RemoteStat, SyncFeatures, TransferSummary, ZeroCopyStats,
};
use crate::device::Device;
use crate::error::{Error, Result};

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
    pub(super) stream: AdbStream,
    pub(super) serial: String,
    /// Tells why the stream ended when the whole connection did (a device
    /// unplugged, a reset link) rather than the device closing the stream.
    pub(super) connection: oxadb_io::Connection,
    pub(super) features: SyncFeatures,
    /// Received bytes not consumed yet.
    pub(super) inbox: Inbox,
    pub(super) unacked: VecDeque<Unacked>,
    /// Why the service can't be used any more, once it can't.
    pub(super) ended: Option<String>,
    /// The remote path of a `RECV` sent ahead of the `STAT` reply it
    /// depended on: its reply comes next on the stream (`receive.rs`).
    pub(super) recv_ahead: Option<Vec<u8>>,
    /// What happened to the file ranges of this session's pushes.
    pub(super) ranges: std::sync::Arc<oxadb_wire::RangeCounters>,
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
            stream,
            serial: device.serial().to_string(),
            connection: device.connection().clone(),
            features,
            inbox: Inbox::new(),
            unacked: VecDeque::new(),
            ended: None,
            recv_ahead: None,
            ranges: Default::default(),
        })
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
            enabled: oxadb_transfer::zero_copy_enabled(),
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
        device: &Device,
        features: SyncFeatures,
    ) -> Result<&'a mut SyncSession> {
        if slot.as_ref().is_none_or(SyncSession::is_ended) {
            *slot = None;
            *slot = Some(SyncSession::open_with(device, features).await?);
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
            zero_copy: Some(self.zero_copy_stats()),
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

    pub(super) async fn read_stat_reply(&mut self, id: u32, path: &[u8]) -> Result<StatReply> {
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
}

pub(super) fn remote_error(path: &[u8], failure: StatFailure) -> Error {
    Error::Remote {
        path: show(path).into_owned(),
        message: failure.describe(),
    }
}
