//! The `sync:` service (`adb push`, `pull`, `ls`, `sync`): the adapter that
//! drives `oxadb_transfer::Service`, the protocol's daemon machine, over one
//! stream. The machine parses the requests and words the replies
//! (docs/architecture.md, "transfer"); this adapter only moves bytes between
//! it and the stream and performs its actions: `metadata.rs` stats and
//! listings, `push.rs` and `pull.rs` the transfers, each on a blocking
//! thread running `oxadb_transfer::serve`'s file work, fed by (or feeding) a
//! bounded queue, so the network and the disk work in parallel and the
//! async runtime never blocks on a file.
//!
//! # Pushes
//!
//! A pushed regular file is written to a temporary file beside the destination
//! (`.oxadb-push.<pid>.<n>`) and renamed over it only after `DONE`, so a failed or
//! abandoned push leaves an existing destination untouched and no temporary file
//! behind. An existing destination that is not a regular file or a symlink (a
//! device node, a FIFO) is opened and written in place, as adbd does, so
//! `adb push image /dev/block/...` works; its mode and times are left alone. So
//! are files on procfs/sysfs-like filesystems, where no temporary file can be
//! made. A destination that is a mount point (a bind-mounted file) cannot be
//! renamed over, so the finished temporary file is copied into it instead,
//! its space reserved first so that a full disk leaves the old content.
//! Missing parent directories are created (the `fixed_push_mkdir` feature).
//! A symlink push (`S_IFLNK` in the mode) makes the link under a temporary name,
//! sets its own timestamp and renames it into place.
//!
//! # Permissions of pushed files
//!
//! A pushed regular file gets exactly `mode & 0o7777` from the request, applied
//! with `fchmod` after its data is written, so the daemon's umask cannot change it
//! (Google's adbd copies the owner bits to group and other, turning 0751 into
//! 0777; we keep 0751). If the daemon may not set the special bits (EPERM), it
//! falls back to `mode & 0o777` and logs a warning.

mod metadata;
mod pull;
mod push;
#[cfg(test)]
mod tests;

use std::io;
use std::sync::Arc;

use oxadb_io::{ReadChunk, WriteChunk};
use oxadb_transfer::{Action, Service, ServiceError, Storage, Transmit};
use oxadb_wire::RangeCounters;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tracing::{debug, warn};

pub use push::remove_unfinished_pushes;

/// Largest chunk taken from the stream at once: a whole WRTE payload (1 MiB
/// at most), parsed in place.
const STREAM_READ_MAX: usize = 1024 * 1024;

/// Why the sync service stopped abnormally. Failures of file operations are not
/// errors here: they are reported to the host with `FAIL`.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("sync stream I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("host closed the sync stream in the middle of {0}")]
    Truncated(&'static str),
    #[error("sync protocol violation: {0}")]
    Protocol(String),
}

impl From<ServiceError> for SyncError {
    fn from(error: ServiceError) -> SyncError {
        match error {
            ServiceError::Truncated(during) => SyncError::Truncated(during),
            ServiceError::Protocol(message) => SyncError::Protocol(message),
        }
    }
}

/// What the daemon's settings say about file transfers, the same for every
/// `sync:` stream.
#[derive(Debug, Clone, Default)]
pub struct SyncSettings {
    /// How pushed files are flushed and where their directories are journalled.
    pub storage: Storage,
    /// Plain pulls send file data by `sendfile` where the stream can
    /// (`--zero-copy`; docs/architecture.md, "Zero-copy transfers").
    pub zero_copy: bool,
}

/// Serves one `sync:` stream until the host sends `QUIT` or closes it.
pub async fn serve<S>(stream: S, settings: SyncSettings) -> Result<(), SyncError>
where
    S: AsyncRead + AsyncWrite + ReadChunk + WriteChunk + Unpin + Send + 'static,
{
    let mut conn = Conn {
        stream,
        settings,
        service: Service::new(),
        push: None,
        ranges: Arc::default(),
    };
    let result = conn.run().await;
    // A push whose stream broke is discarded before the service ends.
    conn.stop_push().await;
    // A FAIL written just before stopping must reach the host before the stream closes.
    let _ = conn.stream.flush().await;
    let (files, by_sendfile, copied, fallbacks) = conn.ranges.snapshot();
    if files > 0 {
        // Counted as the writer sends; the last file's ranges may still be queued.
        debug!(
            files,
            sendfile_bytes = by_sendfile,
            copied_bytes = copied,
            sendfile_fallbacks = fallbacks,
            "sync: pulls sent as file ranges"
        );
    }
    match &result {
        Ok(()) => debug!("sync: done"),
        Err(e) => warn!("sync: stopped: {e}"),
    }
    result
}

struct Conn<S> {
    stream: S,
    settings: SyncSettings,
    service: Service,
    /// The push being written, from its `Action::Push` to its end.
    push: Option<push::Push>,
    /// What happened to the file ranges of this stream's pulls.
    ranges: Arc<RangeCounters>,
}

impl<S: AsyncRead + AsyncWrite + ReadChunk + WriteChunk + Unpin + Send> Conn<S> {
    async fn run(&mut self) -> Result<(), SyncError> {
        loop {
            while let Some(action) = self.service.poll_action() {
                self.perform(action).await?;
                self.write_transmits().await?;
            }
            self.write_transmits().await?;
            if let Some(end) = self.service.finished() {
                return end.map_err(SyncError::from);
            }
            if !self.service.wants_input() {
                // Every action's result is fed back before the next is taken.
                return Err(SyncError::Protocol(
                    "sync service waits for nothing".to_string(),
                ));
            }
            match self.stream.read_chunk(STREAM_READ_MAX).await? {
                Some(chunk) => self.service.handle_input(chunk),
                None => self.service.handle_eof(),
            }
        }
    }

    async fn perform(&mut self, action: Action) -> Result<(), SyncError> {
        match action {
            Action::Stat { kind, path } => self.stat(kind, path).await,
            Action::List { path } => self.list(path).await,
            Action::Push(request) => self.start_push(request),
            Action::PushData(pieces) => self.push_data(pieces).await,
            Action::PushDone { mtime } => self.end_push(Some(mtime)).await?,
            Action::PushStop => self.end_push(None).await?,
            Action::Pull { path, compression } => self.pull(path, compression).await?,
        }
        Ok(())
    }

    /// Writes what the machine has to send: replies and status frames as
    /// bytes, a pull's batches as they are (one WRTE each).
    async fn write_transmits(&mut self) -> io::Result<()> {
        let mut wrote = false;
        while let Some(transmit) = self.service.poll_transmit() {
            match transmit {
                Transmit::Bytes(bytes) => self.stream.write_all(&bytes).await?,
                Transmit::Batch(batch) => self.stream.write_payload(batch, false).await?,
            }
            wrote = true;
        }
        if wrote {
            self.stream.flush().await?;
        }
        Ok(())
    }
}

/// Runs `work` on a blocking thread; a panic there is an I/O error.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)))
}
