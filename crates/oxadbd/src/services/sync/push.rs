//! `SEND` and `SND2`: the machine's `PushData` handed to a file thread that
//! writes them (`oxadb_transfer::serve::PushJob`, `Policy::DAEMON`), whose
//! result the machine turns into `OKAY` or `FAIL`.

use std::path::PathBuf;

use bytes::Bytes;
use oxadb_io::{ReadChunk, WriteChunk};
use oxadb_transfer::serve::PushJob;
use oxadb_transfer::{handoff, Chunk, ChunkReader, Failure, Policy, PushRequest};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;

use super::{Conn, SyncError};
use crate::stop::PushGuard;

/// Hand-offs queued between the stream and the file thread: with at most
/// 16 payloads of 64 KiB each per hand-off (the machine's), about 2 MiB in all.
const CHUNK_QUEUE_DEPTH: usize = 2;

/// A push being written.
pub(super) struct Push {
    /// `None` once the file thread stopped taking data.
    chunks: Option<handoff::Sender<Chunk>>,
    worker: JoinHandle<Result<(), Failure>>,
    /// Counted from before its temporary file exists to its `OKAY` or `FAIL`.
    in_flight: PushGuard,
    path: PathBuf,
}

impl<S: AsyncRead + AsyncWrite + ReadChunk + WriteChunk + Unpin + Send> Conn<S> {
    /// `Action::Push`: a file thread starts on it, unless the daemon is stopping.
    pub(super) fn start_push(&mut self, request: PushRequest) {
        let Some(in_flight) = crate::stop::push_started() else {
            self.service.push_finished(Err(Failure::Report(format!(
                "couldn't push '{}': oxadbd is stopping",
                request.path.display()
            ))));
            return;
        };
        let path = request.path.clone();
        let (chunks, queue) = handoff::channel(CHUNK_QUEUE_DEPTH);
        let job = PushJob::new(request, self.settings.storage.clone());
        let worker = tokio::task::spawn_blocking(move || job.run(ChunkReader::new(queue)));
        self.push = Some(Push {
            chunks: Some(chunks),
            worker,
            in_flight,
            path,
        });
    }

    /// `Action::PushData`: queued for the file thread. If it stopped taking
    /// them, it failed, and its reason goes to the machine.
    pub(super) async fn push_data(&mut self, pieces: Vec<Bytes>) {
        let Some(push) = self.push.as_mut() else {
            return;
        };
        let Some(chunks) = push.chunks.as_mut() else {
            return;
        };
        if chunks.send(Chunk::Pieces(pieces)).await.is_err() {
            let push = self.push.take().expect("a push");
            let outcome = finish(push, None).await.0;
            self.service.push_finished(outcome);
        }
    }

    /// `Action::PushDone` (with `DONE`'s mtime) or `Action::PushStop`
    /// (without): the file thread finishes, or discards its work without
    /// `DONE`, and the machine hears how it ended.
    pub(super) async fn end_push(&mut self, done: Option<u32>) -> Result<(), SyncError> {
        let Some(push) = self.push.take() else {
            // Refused or failed already: the machine knows.
            self.service.push_finished(Err(Failure::HostGone));
            return Ok(());
        };
        let (outcome, in_flight) = finish(push, done).await;
        let written = outcome.is_ok() && done.is_some();
        self.service.push_finished(outcome);
        if written {
            self.write_transmits().await?;
            // Finished once the OKAY is queued: a stopping daemon waits for this.
            in_flight.finished();
        }
        Ok(())
    }

    /// The push's file thread, stopped and waited for when the stream broke,
    /// so that its temporary file is gone when the service ends.
    pub(super) async fn stop_push(&mut self) {
        if let Some(push) = self.push.take() {
            let _ = finish(push, None).await;
        }
    }
}

/// Hands `DONE` to the file thread (when given), closes its queue and waits
/// for its result. Without `DONE` in the queue it discards its work.
async fn finish(push: Push, done: Option<u32>) -> (Result<(), Failure>, PushGuard) {
    let Push {
        chunks,
        worker,
        in_flight,
        path,
    } = push;
    if let (Some(mut chunks), Some(mtime)) = (chunks, done) {
        let _ = chunks.send(Chunk::Done { mtime }).await;
    }
    let outcome = worker.await.unwrap_or_else(|e| {
        Err(Failure::Report(format!(
            "couldn't push '{}': {e}",
            path.display()
        )))
    });
    (outcome, in_flight)
}

/// Removes the temporary files of every push still in progress; for a daemon
/// that is shutting down. Returns how many were removed.
pub fn remove_unfinished_pushes() -> usize {
    Policy::DAEMON.remove_unfinished()
}
