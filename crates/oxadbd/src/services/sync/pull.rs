//! `RECV` and `RCV2`: the file read into ready-made `DATA` frames on a file
//! thread (`oxadb_transfer::serve::send_file`, `Framing::DAEMON`), or framed
//! as file ranges for `sendfile`; the machine passes them through and ends
//! the pull with `DONE` or `FAIL`.

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use oxadb_io::{ReadChunk, WriteChunk};
use oxadb_transfer::{handoff, serve, Failure, Framing, Source};
use oxadb_wire::sync::Compression;
use oxadb_wire::Payload;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{Conn, SyncError};

/// Pull buffers queued between the file thread and the stream (about 4 MiB;
/// `Framing::DAEMON` sizes them).
const PULL_QUEUE_DEPTH: usize = Framing::DAEMON.queue_depth;

impl<S: AsyncRead + AsyncWrite + ReadChunk + WriteChunk + Unpin + Send> Conn<S> {
    /// `Action::Pull`.
    pub(super) async fn pull(
        &mut self,
        path: PathBuf,
        compression: Compression,
    ) -> Result<(), SyncError> {
        let refusal = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || serve::pull_refusal(&path))
                .await
                .unwrap_or(None)
        };
        if let Some(message) = refusal {
            self.service.pull_refused(&message);
            return Ok(());
        }
        if compression == Compression::None
            && self.settings.zero_copy
            && self.stream.takes_file_ranges()
        {
            let opened = {
                let worker_path = path.clone();
                tokio::task::spawn_blocking(move || {
                    let source = serve::open_pull(&worker_path)?;
                    let possible = source.ranges_possible();
                    Ok::<_, Failure>((source, possible))
                })
                .await
                .unwrap_or_else(|e| {
                    Err(Failure::Report(format!(
                        "couldn't open '{}': {}",
                        path.display(),
                        io::Error::other(e)
                    )))
                })
            };
            match opened {
                Ok((source, true)) => return self.pull_ranges(&path, source).await,
                Ok((_, false)) => {}
                Err(failure) => {
                    self.service.pull_finished(Err(failure));
                    return Ok(());
                }
            }
        }
        self.pull_copying(path, compression).await
    }

    /// A plain pull of a regular file: `DATA` frames whose payloads are file
    /// ranges, sent by `sendfile` (docs/architecture.md, "Zero-copy
    /// transfers"); the WRTEs and frames are those of the copying path.
    async fn pull_ranges(&mut self, path: &Path, source: Source) -> Result<(), SyncError> {
        for payload in source.into_ranges(&Framing::DAEMON, self.ranges.clone()) {
            match payload {
                Ok(payload) => {
                    self.service.pull_data(payload);
                    self.write_transmits().await?;
                }
                Err(e) => {
                    self.service
                        .pull_finished(Err(serve::read_failure(path, e)));
                    return Ok(());
                }
            }
        }
        self.service.pull_finished(Ok(()));
        Ok(())
    }

    /// Reads the file into buffers on a blocking thread (compressed pulls,
    /// USB, non-regular files, zero-copy off (the default)).
    async fn pull_copying(
        &mut self,
        path: PathBuf,
        compression: Compression,
    ) -> Result<(), SyncError> {
        let (mut frames, mut queue) = handoff::channel::<Bytes>(PULL_QUEUE_DEPTH);
        let worker_path = path.clone();
        let worker = tokio::task::spawn_blocking(move || {
            serve::send_file(&worker_path, compression, |batch| {
                frames.blocking_send(batch).is_ok()
            })
        });
        while let Some(batch) = queue.recv().await {
            self.service.pull_data(Payload::from(batch));
            if let Err(e) = self.write_transmits().await {
                drop(queue);
                let _ = worker.await;
                return Err(e.into());
            }
        }
        let outcome = worker.await.unwrap_or_else(|e| {
            Err(Failure::Report(format!(
                "couldn't pull '{}': {e}",
                path.display()
            )))
        });
        self.service.pull_finished(outcome);
        Ok(())
    }
}
