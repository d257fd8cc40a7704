//! The protocol machines driven synchronously, with files in temporary
//! directories and no async runtime: the test moves the bytes, cutting them
//! where it likes, and performs the daemon's actions with its real file work
//! (`serve.rs`) on the test's own thread.
//!
//! - `service.rs`: the daemon's machine against requests framed by hand
//!   (as adb's `file_sync_client.cpp` frames them), including malformed and
//!   truncated ones.
//! - `client.rs`: the host's machine against replies framed by hand.
//! - `pair.rs`: both machines back to back ([`Pair`]), as the engine's tests
//!   pair two connections.
//! - `random.rs`: random sessions through a [`Pair`], cut at random points.

mod client;
mod pair;
mod random;
mod service;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use bytes::Bytes;
use oxadb_wire::sync::Compression;

use oxadb_wire::sync::SYNC_DATA_MAX;

use super::{Action, Client, ClientError, ClientEvent, Failure, Service, ServiceError, Versions};
use crate::serve::{self, PushJob};
use crate::{handoff, Chunk, ChunkReader, Framing, Policy, Storage};

/// Deterministic pseudo-random numbers (xorshift64*), for data and cuts.
#[derive(Debug, Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `low..=high`.
    pub(super) fn between(&mut self, low: usize, high: usize) -> usize {
        low + (self.next() % (high - low + 1) as u64) as usize
    }

    pub(super) fn chance(&mut self, one_in: u64) -> bool {
        self.next().is_multiple_of(one_in)
    }
}

/// Where a stream's bytes are cut into the chunks the other side receives.
#[derive(Debug, Clone)]
pub(super) enum Cuts {
    /// Each write arrives as one chunk.
    Whole,
    /// At random points, from single bytes to whole writes.
    Random(Rng),
}

impl Cuts {
    pub(super) fn split(&mut self, bytes: Bytes) -> Vec<Bytes> {
        match self {
            Cuts::Whole => vec![bytes],
            Cuts::Random(rng) => {
                let mut bytes = bytes;
                let mut pieces = Vec::new();
                while !bytes.is_empty() {
                    let most = match rng.next() % 4 {
                        0 => 1,
                        1 => 16,
                        2 => 4096,
                        _ => bytes.len(),
                    };
                    let len = rng.between(1, most.clamp(1, bytes.len()));
                    pieces.push(bytes.split_to(len));
                }
                pieces
            }
        }
    }
}

/// The daemon side: the machine, and its actions performed at once with
/// `serve.rs`'s file work. A push's data is gathered and written at its
/// `DONE`, so a push refused by the file system is answered then.
pub(super) struct Daemon {
    pub(super) service: Service,
    push: Option<(PushJob, Vec<Bytes>)>,
    /// Plain pulls of regular files go as file ranges, as over TCP with
    /// `--zero-copy`.
    pub(super) zero_copy: bool,
    pub(super) cuts: Cuts,
    /// The actions taken, by name, for tests that look at their order.
    pub(super) actions: Vec<&'static str>,
}

impl Daemon {
    pub(super) fn new(cuts: Cuts) -> Daemon {
        Daemon {
            service: Service::new(),
            push: None,
            zero_copy: false,
            cuts,
            actions: Vec::new(),
        }
    }

    /// Delivers `bytes` (cut as `cuts` says), then runs the machine.
    pub(super) fn receive(&mut self, bytes: Bytes) {
        for piece in self.cuts.split(bytes) {
            self.service.handle_input(piece);
            self.run();
        }
    }

    /// The host closed the stream.
    pub(super) fn hang_up(&mut self) {
        self.service.handle_eof();
        self.run();
    }

    /// What the machine has to send, as bytes.
    pub(super) fn take_output(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(transmit) = self.service.poll_transmit() {
            out.extend_from_slice(&transmit.into_bytes());
        }
        out
    }

    /// Performs the machine's actions until it waits for input or ends.
    pub(super) fn run(&mut self) {
        while let Some(action) = self.service.poll_action() {
            self.perform(action);
        }
    }

    fn perform(&mut self, action: Action) {
        match action {
            Action::Stat { kind, path } => {
                self.actions.push("stat");
                self.service.stat_done(serve::stat(kind, &path));
            }
            Action::List { path } => {
                self.actions.push("list");
                self.service.list_done(serve::list(&path));
            }
            Action::Push(request) => {
                self.actions.push("push");
                self.push = Some((PushJob::new(request, Storage::default()), Vec::new()));
            }
            Action::PushData(pieces) => {
                self.actions.push("push data");
                let (_, gathered) = self.push.as_mut().expect("a push");
                gathered.extend(pieces);
            }
            Action::PushDone { mtime } => {
                self.actions.push("push done");
                let (job, pieces) = self.push.take().expect("a push");
                let (mut chunks, queue) = handoff::channel(2);
                chunks.blocking_send(Chunk::Pieces(pieces)).unwrap();
                chunks.blocking_send(Chunk::Done { mtime }).unwrap();
                drop(chunks);
                self.service.push_finished(job.run(ChunkReader::new(queue)));
            }
            Action::PushStop => {
                self.actions.push("push stop");
                let (job, pieces) = self.push.take().expect("a push");
                // Without DONE the job discards what it wrote.
                let (mut chunks, queue) = handoff::channel(1);
                chunks.blocking_send(Chunk::Pieces(pieces)).unwrap();
                drop(chunks);
                self.service.push_finished(job.run(ChunkReader::new(queue)));
            }
            Action::Pull { path, compression } => {
                self.actions.push("pull");
                self.pull(&path, compression);
            }
        }
    }

    fn pull(&mut self, path: &Path, compression: Compression) {
        if let Some(message) = serve::pull_refusal(path) {
            self.service.pull_refused(&message);
            return;
        }
        if self.zero_copy && compression == Compression::None {
            let source = match serve::open_pull(path) {
                Ok(source) => source,
                Err(failure) => return self.service.pull_finished(Err(failure)),
            };
            if source.ranges_possible() {
                for payload in source.into_ranges(&Framing::DAEMON, Default::default()) {
                    match payload {
                        Ok(payload) => self.service.pull_data(payload),
                        Err(e) => {
                            return self
                                .service
                                .pull_finished(Err(serve::read_failure(path, e)))
                        }
                    }
                }
                return self.service.pull_finished(Ok(()));
            }
        }
        let mut batches = Vec::new();
        let result = serve::send_file(path, compression, |batch| {
            batches.push(batch);
            true
        });
        for batch in batches {
            self.service.pull_data(batch.into());
        }
        self.service.pull_finished(result);
    }

    /// How the service ended, if it did.
    pub(super) fn end(&self) -> Option<Result<(), ServiceError>> {
        self.service.finished()
    }
}

/// A failure fed back as the file work would (for tests of the machine alone).
pub(super) fn report(message: &str) -> Result<(), Failure> {
    Err(Failure::Report(message.to_string()))
}

/// Compressible but not trivial: text runs mixed with pseudo-random bytes.
pub(super) fn sample_data(len: usize) -> Vec<u8> {
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let state = rng.next();
        if state & 1 == 0 {
            out.extend_from_slice(b"the quick brown fox jumps over the lazy dog ");
        } else {
            out.extend_from_slice(&state.to_le_bytes());
        }
    }
    out.truncate(len);
    out
}

/// Compresses as adb's client encoders do: brotli quality 1 (default window), an
/// LZ4F frame with default preferences (64 KiB linked blocks, no checksums), and a
/// streamed zstd level-1 frame without a content size.
pub(super) fn compress_like_adb(compression: Compression, data: &[u8]) -> Vec<u8> {
    match compression {
        Compression::None => data.to_vec(),
        Compression::Brotli => {
            let mut out = Vec::new();
            {
                let mut encoder = brotli::CompressorWriter::new(&mut out, 4096, 1, 22);
                encoder.write_all(data).unwrap();
            }
            out
        }
        Compression::Lz4 => {
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Linked);
            let mut encoder = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
            encoder.write_all(data).unwrap();
            encoder.finish().unwrap()
        }
        Compression::Zstd => {
            let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
            encoder.write_all(data).unwrap();
            encoder.finish().unwrap()
        }
    }
}

/// Decodes as adb's client does.
pub(super) fn decompress(compression: Compression, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match compression {
        Compression::None => out.extend_from_slice(data),
        Compression::Brotli => {
            brotli::Decompressor::new(data, 4096)
                .read_to_end(&mut out)
                .unwrap();
        }
        Compression::Lz4 => {
            lz4_flex::frame::FrameDecoder::new(data)
                .read_to_end(&mut out)
                .unwrap();
        }
        Compression::Zstd => {
            // The client's ZSTD_decompressStream loop accepts exactly one frame.
            let mut decoder = zstd::stream::read::Decoder::new(data)
                .unwrap()
                .single_frame();
            decoder.read_to_end(&mut out).unwrap();
        }
    }
    out
}

pub(super) const ALL_COMPRESSIONS: [Compression; 4] = [
    Compression::None,
    Compression::Brotli,
    Compression::Lz4,
    Compression::Zstd,
];

/// The daemon's temporary files left in `dir`.
pub(super) fn temp_files_in(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| Policy::DAEMON.is_temp_name(name))
        .collect()
}

pub(super) fn perm_bits(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o7777
}

pub(super) fn make_fifo(path: &Path, mode: u32) {
    rustix::fs::mkfifoat(rustix::fs::CWD, path, rustix::fs::Mode::from_raw_mode(mode)).unwrap();
}

/// The seed of a randomised test: `OXADB_SYNC_SEED`, else the clock.
/// Printed, so a failing run can be repeated.
pub(super) fn seed() -> u64 {
    let seed = std::env::var("OXADB_SYNC_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |since| since.as_nanos() as u64)
        });
    eprintln!("seed {seed} (OXADB_SYNC_SEED={seed} repeats the run)");
    seed
}

/// The host's machine and the daemon's, back to back: the test makes the
/// requests, [`Pair::drive`] moves the bytes (cut as the `Cuts` say) and
/// runs the daemon, and the host's events come out of [`Pair::event`].
pub(super) struct Pair {
    pub(super) client: Client,
    pub(super) daemon: Daemon,
    to_host: Cuts,
    /// Everything the daemon sent, for tests that look at its frames.
    pub(super) sent_to_host: Vec<u8>,
    /// The daemon's end was passed on as the end of the host's stream.
    hung_up: bool,
    /// Local files the host pushes from.
    scratch: tempfile::TempDir,
}

/// The mtime the host's pushes carry.
pub(super) const PUSH_MTIME: u32 = 1_600_000_000;

/// Every request's second version (`STA2`/`LST2`, `LIS2`, `SND2`/`RCV2`).
pub(super) const V2: Versions = Versions {
    stat_v2: true,
    ls_v2: true,
    sendrecv_v2: true,
    recv_ahead: false,
};

/// Only the original requests (`STAT`, `LIST`, `SEND`, `RECV`), as adb 29's
/// devices take.
pub(super) const V1: Versions = Versions {
    stat_v2: false,
    ls_v2: false,
    sendrecv_v2: false,
    recv_ahead: false,
};

impl Pair {
    pub(super) fn new(versions: Versions) -> Pair {
        Pair::with_cuts(versions, Cuts::Whole, Cuts::Whole)
    }

    pub(super) fn with_cuts(versions: Versions, to_daemon: Cuts, to_host: Cuts) -> Pair {
        Pair {
            client: Client::new(versions),
            daemon: Daemon::new(to_daemon),
            to_host,
            sent_to_host: Vec::new(),
            hung_up: false,
            scratch: tempfile::tempdir().unwrap(),
        }
    }

    /// Moves bytes both ways until neither side has anything to say; the
    /// daemon's end closes the host's stream, as adbd closes it. Whether
    /// anything moved.
    pub(super) fn drive(&mut self) -> bool {
        let mut any = false;
        loop {
            let mut moved = false;
            while let Some(transmit) = self.client.poll_transmit() {
                self.daemon.receive(transmit.into_bytes());
                moved = true;
            }
            let output = self.daemon.take_output();
            if !output.is_empty() {
                self.sent_to_host.extend_from_slice(&output);
                for piece in self.to_host.split(Bytes::from(output)) {
                    self.client.handle_input(piece);
                }
                moved = true;
            }
            if !self.hung_up && self.daemon.end().is_some() {
                self.client.handle_eof();
                self.hung_up = true;
                moved = true;
            }
            if !moved {
                return any;
            }
            any = true;
        }
    }

    /// The host hangs up.
    pub(super) fn hang_up(&mut self) {
        self.daemon.hang_up();
        self.drive();
    }

    /// The host's next event; `None` when nothing more comes. Reading a
    /// reply may queue another request (adb's stat fallback), which goes
    /// before the host waits again.
    pub(super) fn event(&mut self) -> Option<Result<ClientEvent, ClientError>> {
        loop {
            if let Some(event) = self.client.poll_event().transpose() {
                return Some(event);
            }
            if !self.drive() {
                return None;
            }
        }
    }

    /// The next event, which must come and be no error.
    pub(super) fn expect_event(&mut self) -> ClientEvent {
        match self.event() {
            Some(Ok(event)) => event,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    /// Pushes `data` to `remote` as oxadb does: a small file in one `DATA`
    /// frame with its request, never compressed; a larger one read from a
    /// local file into batches of frames (compressed as the request allows).
    /// The answer: `Ok` for `OKAY`, else the `FAIL` text.
    pub(super) fn push(
        &mut self,
        remote: &[u8],
        mode: u32,
        compression: Compression,
        data: &[u8],
    ) -> Result<(), String> {
        self.push_unacked(remote, mode, compression, false, data)
            .unwrap();
        self.ack()
    }

    /// [`Pair::push`] without waiting for the answer, dry run or not.
    pub(super) fn push_unacked(
        &mut self,
        remote: &[u8],
        mode: u32,
        compression: Compression,
        dry_run: bool,
        data: &[u8],
    ) -> Result<(), super::RequestError> {
        if data.len() < SYNC_DATA_MAX {
            self.client
                .push(remote, mode, Compression::None, dry_run, "local")?;
            self.client.push_data(data);
        } else {
            let compression = self
                .client
                .push(remote, mode, compression, dry_run, "local")?;
            let local = self.scratch.path().join("local");
            fs::write(&local, data).unwrap();
            let file = fs::File::open(&local).unwrap();
            let mut batches = Vec::new();
            crate::send_frames(
                &file,
                compression,
                &Framing::HOST,
                |batch| {
                    batches.push(batch);
                    true
                },
                &Default::default(),
            )
            .unwrap();
            for batch in batches {
                self.client.push_batch(batch.into());
            }
        }
        self.client.push_done(PUSH_MTIME);
        Ok(())
    }

    /// The answer to the oldest push.
    pub(super) fn ack(&mut self) -> Result<(), String> {
        match self.expect_event() {
            ClientEvent::Acked => Ok(()),
            ClientEvent::PushFailed { message, .. } => Err(message),
            other => panic!("expected a push's answer, got {other:?}"),
        }
    }

    /// Pulls `remote` (`RCV2` with `compression`, or `RECV`) and decodes it
    /// as the host does; the `FAIL` text if it failed.
    pub(super) fn pull(
        &mut self,
        remote: &[u8],
        compression: Compression,
    ) -> Result<Vec<u8>, String> {
        let ticket = self.client.start_pull(remote, compression).unwrap();
        let compression = ticket.compression();
        self.client.send_pull(ticket);
        self.pulled(compression)
    }

    /// The data of a pull whose request went, decoded.
    pub(super) fn pulled(&mut self, compression: Compression) -> Result<Vec<u8>, String> {
        let mut pieces = Vec::new();
        loop {
            match self.expect_event() {
                ClientEvent::Data(piece) => pieces.push(piece),
                ClientEvent::Done => break,
                ClientEvent::PullFailed(message) => return Err(message),
                other => panic!("expected a pull's data, got {other:?}"),
            }
        }
        let (mut chunks, queue) = handoff::channel(2);
        chunks.blocking_send(Chunk::Pieces(pieces)).unwrap();
        chunks.blocking_send(Chunk::Done { mtime: 0 }).unwrap();
        drop(chunks);
        let mut out = Vec::new();
        crate::receive(
            &mut ChunkReader::new(queue),
            compression,
            &mut out,
            &Default::default(),
        )
        .map_err(|e| format!("decoding the pull: {e:?}"))?;
        Ok(out)
    }

    /// The answer to [`Client::lstat`].
    pub(super) fn lstat(&mut self, path: &[u8]) -> super::StatReply {
        self.client.lstat(path).unwrap();
        self.stat_reply()
    }

    /// The answer to [`Client::stat`].
    pub(super) fn stat(&mut self, path: &[u8]) -> super::StatReply {
        self.client.stat(path).unwrap();
        self.stat_reply()
    }

    pub(super) fn stat_reply(&mut self) -> super::StatReply {
        match self.expect_event() {
            ClientEvent::Stat(reply) => reply,
            other => panic!("expected a stat reply, got {other:?}"),
        }
    }

    /// A listing's entries.
    pub(super) fn list(&mut self, path: &[u8]) -> Vec<oxadb_wire::sync::Dent> {
        self.client.list(path).unwrap();
        let mut entries = Vec::new();
        loop {
            match self.expect_event() {
                ClientEvent::Entry(dent) => entries.push(dent),
                ClientEvent::ListDone => return entries,
                other => panic!("expected a listing, got {other:?}"),
            }
        }
    }

    /// `QUIT`, and how the daemon ended.
    pub(super) fn quit(&mut self) -> Result<(), ServiceError> {
        self.client.quit().unwrap();
        self.drive();
        self.daemon.end().expect("the service ended")
    }
}

/// A path as request bytes.
pub(super) fn bytes_of(path: &Path) -> Vec<u8> {
    path.as_os_str().as_bytes().to_vec()
}
