//! Pulls on a [`SyncSession`]: `RECV`/`RCV2` from the machine, the `DATA`
//! payloads it reads handed to a writer (a blocking thread, or the receiving
//! task itself) that writes them through `oxadb-transfer` under
//! `Policy::HOST`.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use oxadb_transfer::{
    handoff, Chunk, ChunkReader, ClientEvent, DestError, Destination, Policy, ReceiveError, Step,
};
use oxadb_wire::sync as wire;

use super::local::{commit_attributes, Landing, PulledAttributes};
use super::metadata::StatReply;
use super::session::SyncSession;
use super::{describe_io, show, transfer_error, Progress, PullOptions, TransferSummary};
use crate::error::{Error, Result};

/// Pulled payload pieces queued for the writing thread.
const PULL_QUEUE_DEPTH: usize = 64;

impl SyncSession {
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
            .receive(
                remote,
                local,
                size,
                compression,
                Landing {
                    attributes,
                    storage: options.storage.clone(),
                },
                progress,
            )
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

    /// Pulls `remote` into `local`; returns the file bytes written.
    pub(crate) async fn receive(
        &mut self,
        remote: &[u8],
        local: &Path,
        size: Option<u64>,
        compression: wire::Compression,
        landing: Landing,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        self.usable()?;
        self.settle().await?;
        let remote_name = show(remote).into_owned();
        progress.start(&remote_name, size);
        let result = self
            .receive_inner(remote, local, size, compression, landing, progress)
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
    /// cannot stream (`Client::stat_for_pull`): a file's data then follows
    /// the reply without another round trip. The caller pulls `remote` next
    /// with the same `compression` or calls [`SyncSession::drop_recv_ahead`].
    pub(crate) async fn stat_for_pull(
        &mut self,
        remote: &[u8],
        compression: wire::Compression,
    ) -> Result<StatReply> {
        self.settle().await?;
        self.client
            .stat_for_pull(remote, compression)
            .map_err(|e| self.request_error(e))?;
        self.flush().await?;
        self.read_stat_reply().await
    }

    /// Gives up a `RECV` sent ahead for a path that is not pulled after all
    /// (a directory, a special file, a failed `STAT`): the device ends its
    /// sync service with the `FAIL` it answers, so this session ends too
    /// and the next request opens another.
    pub(crate) fn drop_recv_ahead(&mut self) {
        self.client.drop_recv_ahead();
    }

    async fn receive_inner(
        &mut self,
        remote: &[u8],
        local: &Path,
        size: Option<u64>,
        compression: wire::Compression,
        landing: Landing,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        let Landing {
            attributes,
            storage,
        } = landing;
        let ticket = self
            .client
            .start_pull(remote, compression)
            .map_err(|e| self.transfer_request_error(e, local, remote))?;
        let compression = ticket.compression();

        let target_path = local.to_path_buf();
        let target = tokio::task::spawn_blocking(move || {
            let target = Destination::open(&target_path, &Policy::HOST, &storage)?;
            // A file overwritten in place keeps its content if the new one cannot fit.
            if let Some(size) = size {
                target.reserve(size)?;
            }
            Ok::<_, DestError>(target)
        })
        .await
        .map_err(|e| Error::io("pull", std::io::Error::other(e)))
        .and_then(|opened| {
            opened.map_err(|e| {
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
            })
        });
        let target = match target {
            Ok(target) => target,
            Err(error) => {
                self.client.abandon_pull(ticket);
                return Err(error);
            }
        };
        self.client.send_pull(ticket);
        if let Err(error) = self.write_queued().await {
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
            let event = match self.next_event().await {
                Ok(event) => event,
                Err(error) => break Err(error),
            };
            match event {
                ClientEvent::Data(piece) => {
                    // A failed write is reported after DONE: reading on
                    // keeps the session usable for the next request.
                    sink.data(piece).await;
                    let now = written.load(Ordering::Relaxed);
                    progress.advance(now - reported);
                    reported = now;
                }
                ClientEvent::Done => {
                    sink.done().await;
                    break Ok(());
                }
                ClientEvent::PullFailed(message) => {
                    break Err(transfer_error(format!(
                        "failed to copy '{}' to '{}': remote {message}",
                        show(remote),
                        local.display()
                    )));
                }
                other => break Err(self.unexpected(&other)),
            }
        };
        let written_result = sink.finish(local).await;
        let total = written.load(Ordering::Relaxed);
        progress.advance(total - reported);
        outcome?;
        // More than the stat said: a file that grew while it was read (a
        // log), or a device that misreports. Kept, as adb keeps it, but said.
        // (Fewer is the norm for sysfs files, which all claim 4096 bytes;
        // procfs files claim 0.)
        if let Some(announced) = size.filter(|&announced| announced > 0 && total > announced) {
            progress.warning(&format!(
                "'{}': the device sent {total} bytes where its stat said {announced} (the file \
                 grew while it was pulled, or the device misreports its size)",
                show(remote)
            ));
        }
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
