//! `RECV` and `RCV2`: a file thread reads the file into ready-made `DATA`
//! frames through `oxadb-transfer` (`Framing::DAEMON`), which the stream sends
//! as they are, then `DONE` or `FAIL`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use oxadb_io::{ReadChunk, WriteChunk};
use oxadb_transfer::{handoff, send_frames, Framing, SendError, Source};
use oxadb_wire::sync::{self as wire, Compression, TransferFlags};
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::debug;

use super::{Conn, Flow, SyncError, TransferFailure};

/// Pull buffers queued between the file thread and the stream (about 4 MiB;
/// `Framing::DAEMON` sizes them).
const PULL_QUEUE_DEPTH: usize = Framing::DAEMON.queue_depth;

/// What `path` (symlinks followed) is when a `RECV` of it must fail before
/// it is opened: opening a FIFO blocks until something writes to it, and a
/// directory or socket has no bytes to stream. adb skips these after its
/// `STAT`; oxadb may ask before its `STAT` reply is back (the
/// `oxadb_recv_ahead` feature). A path that does not resolve is left to the
/// open, whose error names the cause.
async fn unstreamable(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let kind = tokio::fs::metadata(path).await.ok()?.file_type();
    if kind.is_dir() {
        Some("a directory")
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        None
    }
}

impl<S: AsyncRead + AsyncWrite + ReadChunk + WriteChunk + Unpin + Send> Conn<S> {
    // ----- RECV, RCV2 -----

    /// `RCV2`: an `(id, flags)` setup frame follows the request.
    pub(super) async fn recv_v2(&mut self, path: PathBuf) -> Result<Flow, SyncError> {
        let mut bytes = [0u8; wire::RECV_V2_SETUP_LEN];
        self.read_exact(&mut bytes, "an RCV2 setup frame").await?;
        let setup = wire::RecvV2Setup::parse(&bytes).expect("a full setup frame");
        debug!(flags = format_args!("{:#x}", setup.flags), "RCV2 setup");
        if setup.id != wire::ID_RECV_V2 {
            debug!("sync: RCV2 setup frame has id {}", wire::id_name(setup.id));
        }
        match TransferFlags::from_recv_flags(setup.flags) {
            Ok(flags) => self.recv(path, flags.compression).await,
            Err(e) => {
                self.fail(&format!("couldn't pull '{}': {e}", path.display()))
                    .await?;
                Ok(Flow::End)
            }
        }
    }

    /// Streams the file as `DATA` frames (each header and payload in one buffer), then `DONE`.
    pub(super) async fn recv(
        &mut self,
        path: PathBuf,
        compression: Compression,
    ) -> Result<Flow, SyncError> {
        if let Some(kind) = unstreamable(&path).await {
            self.refuse(&format!(
                "couldn't read '{}': not a regular file or device ({kind})",
                path.display()
            ))
            .await?;
            return Ok(Flow::End);
        }
        if compression == Compression::None
            && oxadb_transfer::zero_copy_enabled()
            && self.stream.takes_file_ranges()
        {
            let opened = {
                let path = path.clone();
                tokio::task::spawn_blocking(move || {
                    let source = Source::open(&path)?;
                    let possible = source.ranges_possible();
                    Ok::<_, io::Error>((source, possible))
                })
                .await
                .map_err(io::Error::other)
            };
            match opened {
                Ok(Ok((source, true))) => return self.recv_ranges(&path, source).await,
                Ok(Ok((_, false))) => {}
                Ok(Err(e)) | Err(e) => {
                    self.fail(&format!("couldn't open '{}': {e}", path.display()))
                        .await?;
                    return Ok(Flow::End);
                }
            }
        }
        self.recv_copying(path, compression).await
    }

    /// A plain pull of a regular file: `DATA` frames whose payloads are file
    /// ranges, sent by `sendfile` (docs/architecture.md, "Zero-copy
    /// transfers"); the WRTEs and frames are those of the copying path.
    async fn recv_ranges(&mut self, path: &Path, source: Source) -> Result<Flow, SyncError> {
        for payload in source.into_ranges(&Framing::DAEMON, self.ranges.clone()) {
            match payload {
                Ok(payload) => self.stream.write_payload(payload, false).await?,
                Err(e) => {
                    self.fail(&format!("couldn't read '{}': {e}", path.display()))
                        .await?;
                    return Ok(Flow::End);
                }
            }
        }
        self.send(&wire::encode_done(0)).await?;
        Ok(Flow::Continue)
    }

    /// Reads the file into buffers on a blocking thread (compressed pulls,
    /// USB, non-regular files, zero-copy off (the default)).
    async fn recv_copying(
        &mut self,
        path: PathBuf,
        compression: Compression,
    ) -> Result<Flow, SyncError> {
        let (frames, mut queue) = handoff::channel::<Bytes>(PULL_QUEUE_DEPTH);
        let worker_path = path.clone();
        let worker =
            tokio::task::spawn_blocking(move || send_file(&worker_path, compression, frames));

        while let Some(frame) = queue.recv().await {
            if let Err(e) = self.stream.write_chunk(frame).await {
                drop(queue);
                let _ = worker.await;
                return Err(e.into());
            }
        }
        let outcome = worker.await.unwrap_or_else(|e| {
            Err(TransferFailure::Report(format!(
                "couldn't pull '{}': {e}",
                path.display()
            )))
        });
        match outcome {
            Ok(()) => {
                self.send(&wire::encode_done(0)).await?;
                Ok(Flow::Continue)
            }
            Err(TransferFailure::Report(message)) => {
                // adbd ends the service after a failed pull; the client stops too.
                self.fail(&message).await?;
                Ok(Flow::End)
            }
            // Only happens when we stopped reading the queue, which returned above.
            Err(TransferFailure::HostGone) => Err(SyncError::Truncated("a pull")),
        }
    }
}

/// Reads the file (on a blocking thread) and queues ready-made `DATA` frames.
fn send_file(
    path: &Path,
    compression: Compression,
    mut frames: handoff::Sender<Bytes>,
) -> Result<(), TransferFailure> {
    let report = |what: &str, e: io::Error| {
        TransferFailure::Report(format!("{what} '{}': {e}", path.display()))
    };
    let source = Source::open(path).map_err(|e| report("couldn't open", e))?;
    let read = AtomicU64::new(0);
    let batches = |batch| frames.blocking_send(batch).is_ok();
    send_frames(source.file(), compression, &Framing::DAEMON, batches, &read).map_err(|e| match e {
        SendError::Read(e) => report("couldn't read", e),
        SendError::Compress(e) => report("couldn't compress", e),
        SendError::Stopped => TransferFailure::HostGone,
    })
}
