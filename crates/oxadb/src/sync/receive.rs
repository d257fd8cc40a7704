//! Pulls: `RECV`/`RCV2`, the `DATA` payloads handed to a writer (a blocking
//! thread, or the receiving task itself) that writes them through
//! `oxadb-transfer` under `Policy::HOST`.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use oxadb_wire::sync as wire;
use tokio::io::AsyncWriteExt;

use super::local::{commit_attributes, PulledAttributes};
use super::session::{StatReply, SyncSession};
use super::{describe_io, show, transfer_error, Progress, SYNC_DATA_MAX};
use crate::error::{Error, Result};
use oxadb_transfer::{
    handoff, Chunk, ChunkReader, DestError, Destination, Policy, ReceiveError, Step,
};

/// Pulled payload pieces queued for the writing thread.
const PULL_QUEUE_DEPTH: usize = 64;

impl SyncSession {
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
            .receive_inner(remote, local, size, compression, attributes, progress)
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

    /// `remote`'s metadata, symlinks followed, with the `RECV` of it in the
    /// same write when the device refuses at once a `RECV` of anything it
    /// cannot stream (oxadbd's `oxadb_recv_ahead`): a file's data then
    /// follows the reply without another round trip (docs/protocol.md,
    /// "Pulls in two round trips"). The caller pulls `remote` next with
    /// the same `compression` or calls [`SyncSession::drop_recv_ahead`].
    pub(crate) async fn stat_with_recv_ahead(
        &mut self,
        remote: &[u8],
        compression: wire::Compression,
    ) -> Result<StatReply> {
        if !(self.features.recv_ahead && self.features.stat_v2) {
            return self.stat_follow(remote).await;
        }
        self.settle().await?;
        let mut requests = self.request(wire::ID_STAT_V2, remote)?;
        let (recv, _) = self.recv_request(|id| self.request(id, remote), compression)?;
        requests.extend_from_slice(&recv);
        self.write(&requests).await?;
        self.recv_ahead = Some(remote.to_vec());
        self.read_stat_reply(wire::ID_STAT_V2, remote).await
    }

    /// Gives up a `RECV` sent ahead for a path that is not pulled after all
    /// (a directory, a special file, a failed `STAT`): the device ends its
    /// sync service with the `FAIL` it answers, so this session ends too
    /// and the next request opens another.
    pub(crate) fn drop_recv_ahead(&mut self) {
        if self.recv_ahead.take().is_some() {
            self.end("a RECV sent ahead of its STAT reply was not needed");
        }
    }

    /// `RCV2` and its setup frame when the device has it, else `RECV`, with
    /// the compression that then applies; `path_request` frames the path.
    fn recv_request(
        &self,
        path_request: impl FnOnce(u32) -> Result<Vec<u8>>,
        compression: wire::Compression,
    ) -> Result<(Vec<u8>, wire::Compression)> {
        if !self.features.sendrecv_v2 {
            return Ok((path_request(wire::ID_RECV_V1)?, wire::Compression::None));
        }
        let mut request = path_request(wire::ID_RECV_V2)?;
        let setup = wire::RecvV2Setup {
            id: wire::ID_RECV_V2,
            flags: compression.flag(),
        };
        request.extend_from_slice(&setup.encode());
        Ok((request, compression))
    }

    pub(super) async fn receive_inner(
        &mut self,
        remote: &[u8],
        local: &Path,
        size: Option<u64>,
        compression: wire::Compression,
        attributes: Option<PulledAttributes>,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        let (request, compression) = self.recv_request(
            |id| self.path_request(id, remote, local, remote),
            compression,
        )?;
        let sent_ahead = match self.recv_ahead.take() {
            None => false,
            Some(ahead) if ahead == remote => true,
            Some(ahead) => {
                // Its reply would be read as this pull's.
                self.end("a RECV sent ahead was followed by another pull");
                return Err(Error::Protocol(format!(
                    "{}: pulling '{}' while the RECV of '{}' was on its way",
                    self.serial,
                    show(remote),
                    show(&ahead)
                )));
            }
        };

        let target_path = local.to_path_buf();
        let target = tokio::task::spawn_blocking(move || {
            let target = Destination::open(&target_path, &Policy::HOST)?;
            // A file overwritten in place keeps its content if the new one cannot fit.
            if let Some(size) = size {
                target.reserve(size)?;
            }
            Ok::<_, DestError>(target)
        })
        .await
        .map_err(|e| Error::io("pull", std::io::Error::other(e)))?
        .map_err(|e| {
            let what = if e.step == Step::Write {
                "cannot write"
            } else {
                "cannot create"
            };
            transfer_error(format!(
                "{what} '{}': {}",
                local.display(),
                describe_io(&e.error)
            ))
        });
        let target = match target {
            Ok(target) => target,
            Err(error) => {
                if sent_ahead {
                    // The file's data is on its way with nowhere to go.
                    self.end("a pull's destination failed while its data was on the way");
                }
                return Err(error);
            }
        };
        if !sent_ahead {
            if let Err(error) = self.stream.write_all(&request).await {
                // Dropping the destination discards its temporary file.
                drop(target);
                return Err(self.stream_error(&error));
            }
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
                        if self.inbox.is_empty() {
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
        pieces: Option<handoff::Sender<Chunk>>,
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
        let (pieces, queue) = handoff::channel(PULL_QUEUE_DEPTH);
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
                if let Some(mut sender) = pieces.take() {
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
                target
                    .commit(commit_attributes(attributes))
                    .map_err(|e| Some(commit_failure(local, &e)))
            }
        }
    }
}

/// Words a failed commit, naming the file (and the directory when flushing it failed).
fn commit_failure(local: &Path, error: &DestError) -> String {
    let cause = describe_io(&error.error);
    match &error.step {
        Step::SyncFile => format!("cannot sync '{}' to storage: {cause}", local.display()),
        Step::SyncDir(dir) => format!(
            "cannot sync directory '{}' after renaming '{}' into it: {cause}",
            dir.display(),
            local.display()
        ),
        _ => format!("cannot create '{}': {cause}", local.display()),
    }
}

/// The pull's blocking half: writes the data, then commits or discards the
/// target. `Err(None)` means the async side stopped it and reports why.
fn write_target(
    target: Destination,
    queue: handoff::Receiver<Chunk>,
    compression: wire::Compression,
    attributes: Option<PulledAttributes>,
    written: &AtomicU64,
    local: &Path,
    remote: &str,
) -> std::result::Result<(), Option<String>> {
    let mut input = ChunkReader::new(queue);
    match oxadb_transfer::receive(&mut input, compression, &mut target.file(), written) {
        Ok(()) => target
            .commit(commit_attributes(attributes))
            .map_err(|e| Some(commit_failure(local, &e))),
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
