//! `SEND` and `SND2`: the host's data is fed to a file thread that writes it
//! through `oxadb-transfer` (`Policy::DAEMON`), then `OKAY` or `FAIL`.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use oxadb_io::{ReadChunk, WriteChunk};
use oxadb_transfer::{
    create_beside, durability, handoff, set_times_at, sync_dirs, Attributes, Chunk, ChunkReader,
    DestError, Destination, Policy, ReceiveError, Step,
};
use oxadb_wire::sync::{self as wire, Compression, TransferFlags, HEADER_LEN, SYNC_DATA_MAX};
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::{debug, warn};

use super::{up_to_nul, Conn, Flow, SyncError, TransferFailure};

/// Hand-offs queued between the stream and the file thread: with at most
/// PIECES_PER_HANDOFF payloads of 64 KiB each, about 2 MiB in all.
const CHUNK_QUEUE_DEPTH: usize = 2;

/// Payloads handed to the file thread at once at most (a 1 MiB WRTE's
/// worth). Handing over each 64 KiB payload alone woke the thread for every
/// one: 11.5k context switches in oxadbd per GiB pushed into a device node,
/// 4.5k with 16 at once, and 0.30 -> 0.25 CPU s/GiB.
const PIECES_PER_HANDOFF: usize = 16;
/// A symlink target is at most PATH_MAX (4096) bytes including the NUL the client sends.
const SYMLINK_TARGET_MAX: usize = 4096;

impl<S: AsyncRead + AsyncWrite + ReadChunk + WriteChunk + Unpin + Send> Conn<S> {
    // ----- SEND, SND2 -----

    /// `SEND`: the request path is `"<path>,<mode>"`, data is never compressed.
    pub(super) async fn send_v1(&mut self, raw_spec: &[u8]) -> Result<Flow, SyncError> {
        let spec = up_to_nul(raw_spec);
        match wire::parse_send_v1_spec(spec) {
            Ok((path, mode)) => {
                let path = PathBuf::from(OsStr::from_bytes(path));
                self.push(PushJob {
                    path,
                    mode,
                    compression: Compression::None,
                    dry_run: false,
                })
                .await
            }
            Err(e) => {
                self.fail(&format!("{e}: '{}'", String::from_utf8_lossy(spec)))
                    .await?;
                self.drain_failed_push().await;
                Ok(Flow::End)
            }
        }
    }

    /// `SND2`: a `(id, mode, flags)` setup frame follows the request.
    pub(super) async fn send_v2(&mut self, path: PathBuf) -> Result<Flow, SyncError> {
        let mut bytes = [0u8; wire::SEND_V2_SETUP_LEN];
        self.read_exact(&mut bytes, "an SND2 setup frame").await?;
        let setup = wire::SendV2Setup::parse(&bytes).expect("a full setup frame");
        debug!(
            mode = format_args!("{:#o}", setup.mode),
            flags = format_args!("{:#x}", setup.flags),
            "SND2 setup"
        );
        if setup.id != wire::ID_SEND_V2 {
            // adbd ignores this id; note it in case a client is out of step.
            debug!("sync: SND2 setup frame has id {}", wire::id_name(setup.id));
        }
        match TransferFlags::from_send_flags(setup.flags) {
            Ok(flags) => {
                self.push(PushJob {
                    path,
                    mode: setup.mode,
                    compression: flags.compression,
                    dry_run: flags.dry_run,
                })
                .await
            }
            Err(e) => {
                // adbd closes the service here without reading the data.
                self.fail(&format!("couldn't push '{}': {e}", path.display()))
                    .await?;
                Ok(Flow::End)
            }
        }
    }

    /// Feeds the push's `DATA` frames to a file thread and answers `OKAY` or `FAIL`.
    async fn push(&mut self, job: PushJob) -> Result<Flow, SyncError> {
        let path = job.path.clone();
        let Some(in_flight) = crate::stop::push_started() else {
            self.fail(&format!(
                "couldn't push '{}': oxadbd is stopping",
                path.display()
            ))
            .await?;
            self.drain_failed_push().await;
            return Ok(Flow::End);
        };
        let (mut chunks, queue) = handoff::channel(CHUNK_QUEUE_DEPTH);
        let worker = tokio::task::spawn_blocking(move || job.run(ChunkReader::new(queue)));

        let mut saw_done = false;
        // Payloads gathered from what the stream already delivered, handed to
        // the file thread before waiting for more (or at PIECES_PER_HANDOFF).
        let mut gathered: Vec<Bytes> = Vec::new();
        let stream_problem = loop {
            if self.inbox.len() < HEADER_LEN && !hand_over(&mut chunks, &mut gathered).await {
                // The file thread stopped early: it failed and says why below.
                break None;
            }
            let header = match self.read_header("a push").await {
                Ok(header) => header,
                Err(e) => break Some(e),
            };
            match header.id {
                wire::ID_DATA => {
                    let len = match header.data_len() {
                        Ok(len) => len,
                        Err(e) => {
                            let message =
                                format!("protocol error pushing '{}': {e}", path.display());
                            break Some(SyncError::Protocol(message));
                        }
                    };
                    // What is gathered goes before waiting for the rest.
                    let file_thread_gone =
                        self.inbox.len() < len && !hand_over(&mut chunks, &mut gathered).await;
                    match self.fill(len).await {
                        Ok(true) => {}
                        Ok(false) => break Some(SyncError::Truncated("a push")),
                        Err(e) => break Some(e.into()),
                    }
                    if file_thread_gone {
                        // It failed and says why below; the drain goes on after this frame.
                        self.inbox.consume(len);
                        break None;
                    }
                    // As slices of the received chunks: a payload that straddles
                    // two WRTEs goes as two pieces rather than copied together.
                    let mut left = len;
                    while left > 0 {
                        let piece = self.inbox.take_piece(left);
                        left -= piece.len();
                        gathered.push(piece);
                    }
                    if gathered.len() >= PIECES_PER_HANDOFF
                        && !hand_over(&mut chunks, &mut gathered).await
                    {
                        break None;
                    }
                }
                wire::ID_DONE => {
                    saw_done = true;
                    if hand_over(&mut chunks, &mut gathered).await {
                        let _ = chunks.send(Chunk::Done { mtime: header.len }).await;
                    }
                    break None;
                }
                other => {
                    let message = format!(
                        "protocol error pushing '{}': expected DATA or DONE, got {}",
                        path.display(),
                        wire::id_name(other)
                    );
                    break Some(SyncError::Protocol(message));
                }
            }
        };
        // Without DONE in the queue the file thread discards its work; wait for that
        // so nothing is left behind when we return.
        drop(chunks);
        let outcome = worker.await.unwrap_or_else(|e| {
            Err(TransferFailure::Report(format!(
                "couldn't push '{}': {e}",
                path.display()
            )))
        });

        match (stream_problem, outcome) {
            (Some(SyncError::Protocol(message)), _) => {
                self.fail(&message).await?;
                Err(SyncError::Protocol(message))
            }
            (Some(stream_error), _) => Err(stream_error),
            (None, Ok(())) => {
                self.send(&wire::encode_okay()).await?;
                // Finished once the OKAY is queued: a stopping daemon waits for this.
                in_flight.finished();
                Ok(Flow::Continue)
            }
            (None, Err(failure)) => {
                let message = match failure {
                    TransferFailure::Report(message) => message,
                    TransferFailure::HostGone => {
                        format!("couldn't push '{}': transfer aborted", path.display())
                    }
                };
                self.fail(&message).await?;
                if !saw_done {
                    self.drain_failed_push().await;
                }
                Ok(Flow::End)
            }
        }
    }

    /// After a failed push adbd keeps reading `DATA` until `DONE`, so a client that is
    /// still writing is not cut off before it reads the `FAIL` (adb 29 polls for it
    /// between chunks, stops, and sends `DONE`).
    async fn drain_failed_push(&mut self) {
        let mut scratch = vec![0u8; SYNC_DATA_MAX];
        loop {
            let Ok(header) = self.read_header("a failed push").await else {
                return;
            };
            // DONE ends the push; anything else means the host has given up on it.
            if header.id != wire::ID_DATA {
                return;
            }
            let Ok(len) = header.data_len() else {
                return;
            };
            if self
                .read_exact(&mut scratch[..len], "a failed push")
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

/// A push, run on a blocking thread.
struct PushJob {
    path: PathBuf,
    /// Full `st_mode` from the host; `S_IFLNK` asks for a symlink, anything else a file.
    mode: u32,
    compression: Compression,
    dry_run: bool,
}

impl PushJob {
    fn run(mut self, mut input: ChunkReader) -> Result<(), TransferFailure> {
        if self.mode & libc::S_IFMT == libc::S_IFLNK {
            // A link target always travels raw, whatever SND2's flags say: AOSP's
            // daemon reads it without decompressing, and clients (go-adb) rely on it.
            self.compression = Compression::None;
        }
        if self.dry_run {
            // SND2 dry run: decode to validate, touch nothing.
            return self.decode(&mut input, &mut io::sink(), "couldn't discard data for");
        }
        if self.mode & libc::S_IFMT == libc::S_IFLNK {
            return self.push_symlink(&mut input);
        }
        // A directory is refused; a device, FIFO or kernel interface file is written
        // in place; anything else (missing, a regular file, a symlink, which is
        // replaced by the file as adbd does) through a temporary file.
        let destination =
            Destination::open(&self.path, &Policy::DAEMON).map_err(|e| self.dest_failure(e))?;
        self.decode(&mut input, &mut destination.file(), "couldn't write")?;
        let mtime = input.done_mtime().expect("a finished push saw DONE");
        destination
            .commit(Attributes {
                mode: Some(self.mode),
                mtime: Some(i64::from(mtime)),
            })
            .map_err(|e| self.dest_failure(e))
    }

    fn report(&self, what: &str, cause: impl std::fmt::Display) -> TransferFailure {
        TransferFailure::Report(format!("{what} '{}': {cause}", self.path.display()))
    }

    /// Words a destination failure as adbd's `FAIL` messages do, naming the path.
    fn dest_failure(&self, error: DestError) -> TransferFailure {
        let what = match error.step {
            Step::Create | Step::CreateDir(_) => "couldn't create file",
            Step::OpenInPlace => "couldn't open for writing",
            Step::Write => "couldn't write",
            Step::Attributes => "couldn't set the mode or mtime of",
            Step::Replace | Step::SyncDir(_) => "couldn't replace",
            Step::SyncFile => "couldn't sync",
        };
        self.report(what, error)
    }

    fn decode(
        &self,
        input: &mut ChunkReader,
        output: &mut impl Write,
        output_context: &str,
    ) -> Result<(), TransferFailure> {
        let written = AtomicU64::new(0);
        match oxadb_transfer::receive(input, self.compression, output, &written) {
            Ok(()) => Ok(()),
            Err(ReceiveError::Stopped) => Err(TransferFailure::HostGone),
            Err(ReceiveError::Decode(e)) => Err(self.report("couldn't decompress data for", e)),
            Err(ReceiveError::Output(e)) => Err(self.report(output_context, e)),
        }
    }

    /// The data is the link target followed by a NUL (the client sends `readlink()` + NUL).
    fn push_symlink(&self, input: &mut ChunkReader) -> Result<(), TransferFailure> {
        let mut target = Vec::new();
        self.decode(
            input,
            &mut LimitedBuffer::new(&mut target),
            "couldn't create symlink",
        )?;
        let target = up_to_nul(&target);
        if target.is_empty() {
            return Err(self.report("couldn't create symlink", "empty link target"));
        }
        let mtime = input.done_mtime().expect("a finished push saw DONE");
        match fs::symlink_metadata(&self.path) {
            Ok(md) if md.is_dir() => {
                return Err(self.report(
                    "couldn't create symlink",
                    io::Error::from_raw_os_error(libc::EISDIR),
                ))
            }
            Ok(md) if oxadb_transfer::is_special(&md) => {
                return Err(self.report(
                    "couldn't create symlink",
                    "refusing to replace a device or FIFO",
                ))
            }
            _ => {}
        }
        let (temp, ()) = create_beside(&self.path, &Policy::DAEMON, |candidate| {
            std::os::unix::fs::symlink(OsStr::from_bytes(target), candidate)
        })
        .map_err(|e| self.report("couldn't create symlink", e))?;
        // Set on the link itself (AT_SYMLINK_NOFOLLOW): fixed_push_symlink_timestamp.
        if let Err(e) = set_times_at(temp.path(), i64::from(mtime), false) {
            warn!(
                "sync: couldn't set the mtime of symlink '{}': {e}",
                self.path.display()
            );
        }
        let changed_dirs = temp.changed_dirs().to_vec();
        temp.rename_over(&self.path)
            .map_err(|(_, e)| self.report("couldn't replace", e))?;
        // A link has no data of its own: its directory entry is all there is to flush.
        sync_dirs(&changed_dirs, durability()).map_err(|(dir, e)| {
            self.report(
                "couldn't replace",
                format!("couldn't sync directory '{}': {e}", dir.display()),
            )
        })
    }
}

/// Collects a symlink target, refusing more than PATH_MAX bytes.
struct LimitedBuffer<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> LimitedBuffer<'a> {
    fn new(buf: &'a mut Vec<u8>) -> Self {
        Self { buf }
    }
}

impl Write for LimitedBuffer<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > SYMLINK_TARGET_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("link target longer than {SYMLINK_TARGET_MAX} bytes"),
            ));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Removes the temporary files of every push still in progress; for a daemon
/// that is shutting down. Returns how many were removed.
pub fn remove_unfinished_pushes() -> usize {
    Policy::DAEMON.remove_unfinished()
}

/// Queues the payloads `gathered` so far for the file thread (nothing when
/// there are none); false once the file thread stopped taking them.
async fn hand_over(chunks: &mut handoff::Sender<Chunk>, gathered: &mut Vec<Bytes>) -> bool {
    if gathered.is_empty() {
        return true;
    }
    chunks
        .send(Chunk::Pieces(std::mem::take(gathered)))
        .await
        .is_ok()
}
