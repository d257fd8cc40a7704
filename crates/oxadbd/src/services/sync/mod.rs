//! The `sync:` service: adb's file sync protocol (`adb push`, `pull`, `ls`, `sync`).
//!
//! One stream carries a sequence of requests (`STAT`, `LST2`, `STA2`, `LIST`,
//! `LIS2`, `SEND`, `SND2`, `RECV`, `RCV2`, `QUIT`), each an 8-byte header and a
//! path of at most 1024 bytes. Frame layouts live in [`oxadb_wire::sync`]; this
//! module answers the requests (`mod.rs`), `metadata.rs` the stats and listings,
//! `push.rs` and `pull.rs` the transfers, whose file side (atomic destinations,
//! `DATA` framing, (de)compression) is `oxadb-transfer`'s, shared with the host.
//! File I/O and (de)compression run on a
//! blocking thread fed by a bounded channel of 64 KiB chunks, so the network and
//! the disk work in parallel and the async runtime never blocks on a file.
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
//! After a failed push or pull the service sends `FAIL` and ends, as adbd does;
//! for a push it first reads the remaining `DATA` up to `DONE` so the client sees
//! the reason instead of a broken pipe.
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

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use oxadb_io::{ReadChunk, WriteChunk};
use oxadb_transfer::Inbox;
use oxadb_wire::sync::{self as wire, Compression, SyncHeader, HEADER_LEN};
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

/// Serves one `sync:` stream until the host sends `QUIT` or closes it.
pub async fn serve<S>(stream: S) -> Result<(), SyncError>
where
    S: AsyncRead + AsyncWrite + ReadChunk + WriteChunk + Unpin + Send + 'static,
{
    let mut conn = Conn {
        stream,
        inbox: Inbox::new(),
        ranges: Arc::default(),
    };
    let result = conn.serve_requests().await;
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    /// A transfer failed and was reported; adbd closes the service then, and so do we.
    End,
}

struct Conn<S> {
    stream: S,
    /// Received and not yet parsed: the stream's chunks as they came, so
    /// `DATA` payloads go to the file thread as slices of them, not copies.
    inbox: Inbox,
    /// What happened to the file ranges of this stream's pulls.
    ranges: Arc<RangeCounters>,
}

impl<S: AsyncRead + AsyncWrite + ReadChunk + WriteChunk + Unpin + Send> Conn<S> {
    async fn serve_requests(&mut self) -> Result<(), SyncError> {
        loop {
            let Some(header) = self.next_request_header().await? else {
                return Ok(());
            };
            let path_len = match header.request_path_len() {
                Ok(len) => len,
                Err(e) => return Err(self.protocol_violation(e.to_string()).await),
            };
            let raw_path = self.read_vec(path_len, "a request path").await?;
            let path = path_from_request(&raw_path);
            debug!(request = %wire::id_name(header.id), path = %path.display(), "sync request");

            let flow = match header.id {
                wire::ID_LSTAT_V1 => self.lstat_v1(&path).await?,
                wire::ID_LSTAT_V2 | wire::ID_STAT_V2 => self.stat_v2(header.id, &path).await?,
                wire::ID_LIST_V1 => self.list(path, false).await?,
                wire::ID_LIST_V2 => self.list(path, true).await?,
                wire::ID_SEND_V1 => self.send_v1(&raw_path).await?,
                wire::ID_SEND_V2 => self.send_v2(path).await?,
                wire::ID_RECV_V1 => self.recv(path, Compression::None).await?,
                wire::ID_RECV_V2 => self.recv_v2(path).await?,
                wire::ID_QUIT => return Ok(()),
                other => {
                    let message = format!("unknown command {other:08x} ({})", wire::id_name(other));
                    return Err(self.protocol_violation(message).await);
                }
            };
            self.stream.flush().await?;
            if flow == Flow::End {
                return Ok(());
            }
        }
    }

    // ----- stream helpers -----

    /// Reads until `len` bytes are buffered; `false` if the stream ended first.
    async fn fill(&mut self, len: usize) -> io::Result<bool> {
        while self.inbox.len() < len {
            match self.stream.read_chunk(STREAM_READ_MAX).await? {
                Some(chunk) => self.inbox.push(chunk),
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Reads the next request header, or `None` if the host closed the stream cleanly.
    async fn next_request_header(&mut self) -> Result<Option<SyncHeader>, SyncError> {
        if !self.fill(1).await? {
            return Ok(None);
        }
        self.read_header("a request header").await.map(Some)
    }

    async fn read_header(&mut self, during: &'static str) -> Result<SyncHeader, SyncError> {
        let mut bytes = [0u8; HEADER_LEN];
        self.read_exact(&mut bytes, during).await?;
        Ok(SyncHeader::parse(&bytes).expect("a full header"))
    }

    async fn read_exact(&mut self, buf: &mut [u8], during: &'static str) -> Result<(), SyncError> {
        let bytes = self.read_bytes(buf.len(), during).await?;
        buf.copy_from_slice(&bytes);
        Ok(())
    }

    async fn read_bytes(&mut self, len: usize, during: &'static str) -> Result<Bytes, SyncError> {
        if !self.fill(len).await? {
            return Err(SyncError::Truncated(during));
        }
        Ok(self.inbox.take_bytes(len))
    }

    async fn read_vec(&mut self, len: usize, during: &'static str) -> Result<Vec<u8>, SyncError> {
        Ok(self.read_bytes(len, during).await?.to_vec())
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), SyncError> {
        self.stream.write_all(bytes).await?;
        Ok(())
    }

    /// Sends `FAIL` with `message` (which names the path and the cause) and flushes it.
    async fn fail(&mut self, message: &str) -> Result<(), SyncError> {
        warn!("sync: FAIL: {message}");
        self.send_fail(message).await
    }

    /// As [`Conn::fail`] for a refusal a host may expect (a RECV sent ahead
    /// of its STAT reply, for a directory: `pull.rs`), logged at debug.
    async fn refuse(&mut self, message: &str) -> Result<(), SyncError> {
        debug!("sync: FAIL (expected): {message}");
        self.send_fail(message).await
    }

    async fn send_fail(&mut self, message: &str) -> Result<(), SyncError> {
        self.send(&wire::encode_fail(message)).await?;
        self.stream.flush().await?;
        Ok(())
    }

    /// Reports a host protocol error with `FAIL`; the caller ends the service with the result,
    /// since the framing can no longer be trusted.
    async fn protocol_violation(&mut self, message: String) -> SyncError {
        if let Err(e) = self.fail(&message).await {
            return e;
        }
        SyncError::Protocol(message)
    }
}

/// The request path as the C string adbd would see: cut at the first NUL.
fn path_from_request(raw: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(up_to_nul(raw)))
}

fn up_to_nul(bytes: &[u8]) -> &[u8] {
    match bytes.iter().position(|&b| b == 0) {
        Some(nul) => &bytes[..nul],
        None => bytes,
    }
}

/// How a transfer on the file thread ended badly.
#[derive(Debug)]
enum TransferFailure {
    /// Send this message (naming the path and the cause) to the host as `FAIL`.
    Report(String),
    /// The host went away (or the async side stopped); there is nobody to tell.
    HostGone,
}
