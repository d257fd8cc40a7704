//! `adb push`: files and trees, several sources, `--sync`, dry runs.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::local::{self, EntryKind, LocalEntry};
use super::metadata::Describe;
use super::send::{Content, LocalFile, SendMode, Upload};
use super::session::SyncSession;
use super::{
    basename, join_remote, transfer_error, Compression, Progress, PushOptions, SyncFeatures,
    SyncOpener, TransferSummary,
};
use crate::error::{Error, Result};

/// Copies local files and directories to the device, as `adb push` does.
///
/// * If `destination` is an existing directory on the device, each source is
///   copied into it under its own name; otherwise a single source is copied
///   to `destination` itself (several sources need a directory).
/// * Directories are copied recursively. Symlinks inside them are recreated
///   as symlinks with their own mtime; a symlink given as a source is
///   followed. Other special files are skipped with a warning. Empty
///   directories are not created (the protocol only creates the parents of
///   pushed files).
/// * Files keep their mode and mtime.
///
/// A source that fails (a missing local file, a device error) does not stop
/// the others; the error lists every failure, in adb's words. `progress`
/// hears about each file, warnings and each finished source.
///
/// ```no_run
/// # async fn demo(device: &oxadb::Device) -> oxadb::Result<()> {
/// use std::path::PathBuf;
/// use oxadb::sync::{push, Compression, NoProgress, PushOptions};
///
/// let options = PushOptions {
///     sync: true,
///     compression: Compression::Any,
///     ..PushOptions::default()
/// };
/// let summary = push(
///     device,
///     &[PathBuf::from("out/lib"), PathBuf::from("out/bin")],
///     "/data/local/tmp/",
///     &options,
///     &mut NoProgress,
/// )
/// .await?;
/// println!("{} pushed, {} unchanged", summary.files_transferred, summary.files_skipped);
/// # Ok(())
/// # }
/// ```
pub async fn push(
    device: &dyn SyncOpener,
    sources: &[PathBuf],
    destination: &str,
    options: &PushOptions,
    progress: &mut dyn Progress,
) -> Result<TransferSummary> {
    let started = Instant::now();
    if sources.is_empty() || destination.is_empty() {
        return Err(transfer_error(
            "push requires <source> and <destination> arguments".to_string(),
        ));
    }
    let features = options.features.unwrap_or_else(|| device.sync_features());
    if options.dry_run && !features.dry_run_send {
        return Err(transfer_error(
            "dry-run not supported by the device".to_string(),
        ));
    }
    warn_if_unsupported(options.compression, &features, progress);
    let mut pusher = Pusher {
        device,
        features,
        session: None,
        mode: SendMode {
            compression: features.resolve(options.compression),
            dry_run: options.dry_run,
        },
        sync: options.sync,
    };

    let dst = destination.as_bytes();
    let (dst_exists, dst_isdir) = match pusher.session().await?.stat_follow(dst).await? {
        Ok(stat) => (true, stat.is_dir()),
        Err(failure) if failure.is_not_found() => (false, false),
        Err(failure) => {
            return Err(transfer_error(format!(
                "stat failed when trying to push to {destination}: {}",
                failure.describe()
            )))
        }
    };
    if !dst_isdir {
        if sources.len() > 1 {
            return Err(transfer_error(format!(
                "target '{destination}' is not a directory"
            )));
        }
        if dst.ends_with(b"/") && dst_exists {
            return Err(transfer_error(format!(
                "failed to access '{destination}': Not a directory"
            )));
        }
    }

    let mut tally = Tally::new();
    for source in sources {
        let name = source.display().to_string();
        let metadata = match tokio::fs::metadata(source).await {
            Ok(metadata) => metadata,
            Err(e) => {
                tally.fail(format!("cannot stat '{name}': {}", super::describe_io(&e)));
                continue;
            }
        };
        let source_started = Instant::now();
        let result = if metadata.is_dir() {
            let mut remote_dir = dst.to_vec();
            if dst_exists {
                // The directory goes inside the existing one.
                remote_dir = join_remote(dst, basename(source.as_os_str().as_bytes()));
            }
            pusher.push_tree(source, &remote_dir, progress).await
        } else if !metadata.is_file() {
            progress.warning(&format!(
                "skipping special file '{name}' (mode = 0o{:o})",
                metadata.mode()
            ));
            continue;
        } else {
            let remote = if dst_isdir {
                join_remote(dst, basename(source.as_os_str().as_bytes()))
            } else {
                dst.to_vec()
            };
            pusher.push_one(source, &remote, &metadata, progress).await
        };
        tally.record(&name, source_started, result, progress)?;
    }
    tally.finish(pusher.session.take(), started).await
}
/// The outcome of a push or pull of several sources: the totals, and every
/// failed source in adb's wording (one failed source does not stop the others,
/// as in adb; a lost connection stops them all).
pub(crate) struct Tally {
    total: TransferSummary,
    errors: Vec<String>,
}

impl Tally {
    pub(crate) fn new() -> Tally {
        Tally {
            total: TransferSummary::default(),
            errors: Vec::new(),
        }
    }

    /// A source that failed before its transfer started.
    pub(crate) fn fail(&mut self, message: String) {
        self.errors.push(message);
    }

    /// Ends the whole transfer with `error` after what failed so far.
    pub(crate) fn abort(mut self, error: Error) -> Error {
        self.errors.push(error.to_string());
        Error::Transfer {
            messages: self.errors,
        }
    }

    /// Records one source's transfer; `Err` when the connection is gone.
    pub(crate) fn record(
        &mut self,
        source: &str,
        started: Instant,
        result: Result<TransferSummary>,
        progress: &mut dyn Progress,
    ) -> Result<(), Error> {
        match result {
            Ok(mut summary) => {
                summary.elapsed = started.elapsed();
                self.total.files_transferred += summary.files_transferred;
                self.total.files_skipped += summary.files_skipped;
                self.total.bytes += summary.bytes;
                progress.source_finished(source, &summary);
                Ok(())
            }
            Err(Error::Transfer { messages }) => {
                self.errors.extend(messages);
                Ok(())
            }
            Err(other) => Err(std::mem::replace(self, Tally::new()).abort(other)),
        }
    }

    /// Ends the sync session, if one is open, and gives the result.
    pub(crate) async fn finish(
        mut self,
        session: Option<SyncSession>,
        started: Instant,
    ) -> Result<TransferSummary> {
        if let Some(session) = session {
            self.total.stream = session.stream_stats();
            self.total.zero_copy = Some(session.zero_copy_stats());
            if !session.is_ended() {
                if let Err(error) = session.quit().await {
                    self.errors.push(error.to_string());
                }
            }
        }
        self.total.elapsed = started.elapsed();
        if self.errors.is_empty() {
            Ok(self.total)
        } else {
            Err(Error::Transfer {
                messages: self.errors,
            })
        }
    }
}

/// Tells the user when the requested algorithm can't be used with this device.
pub(crate) fn warn_if_unsupported(
    compression: Compression,
    features: &SyncFeatures,
    progress: &mut dyn Progress,
) {
    if !matches!(compression, Compression::None | Compression::Any)
        && !features.supports(compression)
    {
        progress.warning(&format!(
            "the device does not support {compression} compression; transferring uncompressed"
        ));
    }
}

struct Pusher<'a> {
    device: &'a dyn SyncOpener,
    features: SyncFeatures,
    session: Option<SyncSession>,
    mode: SendMode,
    sync: bool,
}

impl Pusher<'_> {
    /// The current session, or a new one if the device ended the last.
    async fn session(&mut self) -> Result<&mut SyncSession> {
        SyncSession::reuse_or_open(&mut self.session, self.device, self.features).await
    }

    /// One regular file to exactly `remote`, acknowledged before returning.
    async fn push_one(
        &mut self,
        local: &Path,
        remote: &[u8],
        metadata: &std::fs::Metadata,
        progress: &mut dyn Progress,
    ) -> Result<TransferSummary> {
        let mode = self.mode;
        let sync = self.sync;
        let session = self.session().await?;
        let mut summary = TransferSummary::default();
        if sync && session.unchanged(remote, metadata).await? {
            summary.files_skipped = 1;
            return Ok(summary);
        }
        summary.bytes = session
            .send_regular(local, remote, LocalFile::of(metadata), mode, progress)
            .await?;
        session.collect_acks(true).await?;
        summary.files_transferred = 1;
        Ok(summary)
    }

    /// A whole directory to `remote_dir`; stops at the first failure, like adb.
    async fn push_tree(
        &mut self,
        local_dir: &Path,
        remote_dir: &[u8],
        progress: &mut dyn Progress,
    ) -> Result<TransferSummary> {
        let (list, warnings) = {
            let local_dir = local_dir.to_path_buf();
            let remote_dir = remote_dir.to_vec();
            tokio::task::spawn_blocking(move || {
                let mut warnings = Vec::new();
                let list = local::build_push_list(&local_dir, &remote_dir, &mut warnings);
                (list, warnings)
            })
            .await
            .map_err(|e| Error::io("listing local files", std::io::Error::other(e)))?
        };
        for warning in &warnings {
            progress.warning(warning);
        }
        let list = list.map_err(transfer_error)?;
        let mut summary = TransferSummary::default();
        let mut todo: Vec<&LocalEntry> = Vec::with_capacity(list.len());
        for entry in &list {
            if entry.kind == EntryKind::Special {
                progress.warning(&format!(
                    "skipping special file '{}' (mode = 0o{:o})",
                    entry.local.display(),
                    entry.mode
                ));
                summary.files_skipped += 1;
            } else {
                todo.push(entry);
            }
        }

        let mode = self.mode;
        let sync = self.sync;
        let session = self.session().await?;
        if sync {
            let paths: Vec<&[u8]> = todo.iter().map(|e| e.remote.as_slice()).collect();
            let stats = session.lstat_many(&paths).await?;
            let before = todo.len();
            let mut stats = stats.into_iter();
            todo.retain(|entry| {
                !matches!(stats.next(), Some(Ok(stat))
                    if stat.size == entry.size && stat.mtime == entry.mtime)
            });
            summary.files_skipped += (before - todo.len()) as u64;
        }

        for entry in todo {
            let bytes = match entry.kind {
                EntryKind::Symlink => {
                    let target = match local::symlink_payload(&entry.local) {
                        Ok(target) => target,
                        Err(e) => {
                            return Err(transfer_error(format!(
                                "readlink '{}' failed: {}",
                                entry.local.display(),
                                super::describe_io(&e)
                            )))
                        }
                    };
                    let upload = Upload {
                        local: &entry.local,
                        remote: &entry.remote,
                        mode: entry.mode,
                        mtime: entry.mtime as u32,
                        size: target.len() as u64,
                        content: Content::Bytes(target),
                    };
                    session.send(upload, mode, progress).await?
                }
                _ => {
                    let file = LocalFile {
                        size: entry.size,
                        mode: entry.mode,
                        mtime: entry.mtime,
                    };
                    session
                        .send_regular(&entry.local, &entry.remote, file, mode, progress)
                        .await?
                }
            };
            summary.files_transferred += 1;
            summary.bytes += bytes;
        }
        session.collect_acks(true).await?;
        Ok(summary)
    }
}
