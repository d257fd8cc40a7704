//! `oxadb push --delta`: the host's side of an `oxadb-delta:` stream
//! (docs/delta.md). The device sends the old image's block digests; the
//! host reads the new image twice, once to decide every block against them
//! and once to send zeros and new data, with the copies sent in between,
//! first, as a device applying them in place needs; the last message
//! carries the new image's digest, which the device must match.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use oxadb_delta::wire::{self, Decoder, Message, Target};
use oxadb_delta::{BlockDigest, BlockSize, Decision, ImageDigest, Keep, Op, Plan, Planner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::{BoxedStream, Error, Result};

/// The service a delta opens.
pub const SERVICE: &str = "oxadb-delta:";

#[derive(Debug, Clone)]
pub struct DeltaOptions {
    pub block_size: BlockSize,
    /// Plan, print, change nothing: the stream is dropped before any
    /// operation is sent, and the device discards what it prepared.
    pub dry_run: bool,
    /// Where the phases report how far they are, for a progress bar.
    pub progress: Option<Arc<DeltaProgress>>,
}

impl Default for DeltaOptions {
    fn default() -> DeltaOptions {
        DeltaOptions {
            block_size: BlockSize::DEFAULT,
            dry_run: false,
            progress: None,
        }
    }
}

/// The phases of a delta, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The device digests its old image and sends the digests.
    Index,
    /// The host reads the new image and decides every block.
    Deciding,
    /// The host reads it again and sends zeros and new data.
    Sending,
    /// The device checks what it built against the image's digest.
    Checking,
}

/// How far a delta is: the phase, and bytes of the image done of a total.
/// Written by the delta's threads, read by whoever draws it.
#[derive(Debug, Default)]
pub struct DeltaProgress {
    phase: AtomicU8,
    done: AtomicU64,
    total: AtomicU64,
}

impl DeltaProgress {
    pub fn new() -> Arc<DeltaProgress> {
        Arc::new(DeltaProgress::default())
    }

    /// The phase, the bytes done and the bytes in all.
    pub fn get(&self) -> (Phase, u64, u64) {
        let phase = match self.phase.load(Ordering::Relaxed) {
            0 => Phase::Index,
            1 => Phase::Deciding,
            2 => Phase::Sending,
            _ => Phase::Checking,
        };
        (
            phase,
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
        )
    }

    fn start(&self, phase: Phase, total: u64) {
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    fn add(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Reports to a [`DeltaProgress`], if there is one.
#[derive(Clone)]
struct Report(Option<Arc<DeltaProgress>>);

impl Report {
    fn start(&self, phase: Phase, total: u64) {
        if let Some(progress) = &self.0 {
            progress.start(phase, total);
        }
    }

    fn add(&self, bytes: u64) {
        if let Some(progress) = &self.0 {
            progress.add(bytes);
        }
    }
}

/// Blocks and bytes per kind of operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanCounts {
    pub same_blocks: u64,
    pub copy_blocks: u64,
    pub zero_blocks: u64,
    pub replace_blocks: u64,
    /// Bytes of the new image sent as new data, before compression.
    pub replace_bytes: u64,
}

impl PlanCounts {
    fn count(&mut self, decision: Decision, len: usize) {
        match decision {
            Decision::Same => self.same_blocks += 1,
            Decision::Copy { .. } => self.copy_blocks += 1,
            Decision::Zero => self.zero_blocks += 1,
            Decision::Replace => {
                self.replace_blocks += 1;
                self.replace_bytes += len as u64;
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct DeltaSummary {
    pub image_len: u64,
    pub target: Target,
    pub old_len: u64,
    pub counts: PlanCounts,
    /// Bytes this host sent on the stream (framing included).
    pub bytes_sent: u64,
    /// Bytes the device sent (its digests, mostly).
    pub bytes_received: u64,
    pub elapsed: Duration,
    /// Whether the image was installed (not for a dry run).
    pub installed: bool,
}

/// Pushes `source` (a file or block device) to `destination` on the device
/// over `stream`, an open `oxadb-delta:` stream.
pub async fn push_delta(
    stream: BoxedStream,
    source: &Path,
    destination: &str,
    options: &DeltaOptions,
) -> Result<DeltaSummary> {
    let started = Instant::now();
    let local = |message: String| Error::Local {
        path: source.to_path_buf(),
        message,
    };
    let remote = |message: String| Error::Remote {
        path: destination.to_string(),
        message,
    };
    let (image_len, mode) = image_size_and_mode(source).map_err(|e| local(e.to_string()))?;
    let block_size = options.block_size;
    let report = Report(options.progress.clone());
    let (mut read, mut write) = tokio::io::split(stream);
    let mut from_device = Received::default();
    let mut bytes_sent = 0u64;

    let begin = encoded(&Message::Begin {
        block_size,
        new_len: image_len,
        mode,
        path: destination.to_string(),
    });
    bytes_sent += begin.len() as u64;
    write.write_all(&begin).await.map_err(stream_error)?;

    // The old image's digests, while nothing else can be decided.
    let (target, old_len) = match from_device.next(&mut read).await? {
        Message::Index { target, old_len } => (target, old_len),
        Message::Fail { message } => return Err(remote(message)),
        other => return Err(protocol(format!("expected INDEX, got {}", other.name()))),
    };
    let old_blocks = block_size.blocks_in(old_len);
    report.start(Phase::Index, old_len);
    let mut digests: Vec<BlockDigest> = Vec::with_capacity(old_blocks as usize);
    while (digests.len() as u64) < old_blocks {
        match from_device.next(&mut read).await? {
            Message::Digests {
                start,
                digests: batch,
            } if start == digests.len() as u64 => {
                report.add(batch.len() as u64 * u64::from(block_size.bytes()));
                digests.extend(batch)
            }
            Message::Digests { start, .. } => {
                return Err(protocol(format!(
                    "digests from block {start}, expected from {}",
                    digests.len()
                )))
            }
            Message::Fail { message } => return Err(remote(message)),
            other => return Err(protocol(format!("expected DIGESTS, got {}", other.name()))),
        }
    }
    if digests.len() as u64 != old_blocks {
        return Err(protocol(format!(
            "{} digests for {old_blocks} blocks",
            digests.len()
        )));
    }
    let planner =
        Planner::new(block_size, old_len, digests).map_err(|e| protocol(e.to_string()))?;

    // First pass: every block decided.
    let source_path = source.to_path_buf();
    report.start(Phase::Deciding, image_len);
    let deciding = report.clone();
    let (planner, decisions, counts) = tokio::task::spawn_blocking(move || {
        decide_all(&source_path, planner, image_len, &deciding)
    })
    .await
    .map_err(|e| local(e.to_string()))?
    .map_err(|e| local(e.to_string()))?;

    let mut summary = DeltaSummary {
        image_len,
        target,
        old_len,
        counts,
        bytes_sent,
        bytes_received: from_device.bytes,
        elapsed: started.elapsed(),
        installed: false,
    };
    if options.dry_run {
        // Dropping the stream ends it: the device removes what it prepared.
        summary.bytes_sent += dry_run_bytes(source, &planner, &decisions, image_len)
            .await
            .map_err(|e| local(e.to_string()))?;
        return Ok(summary);
    }

    // The copies, all before any write (a block device reads their sources first).
    let out = encoded_copies(block_size, &decisions);
    summary.bytes_sent += out.len() as u64;
    write.write_all(&out).await.map_err(stream_error)?;

    // Second pass: zeros and new data, compressed on a blocking thread
    // while what it made is sent.
    let (to_send, mut sending) = mpsc::channel::<Bytes>(4);
    let source_path = source.to_path_buf();
    report.start(Phase::Sending, image_len);
    let sending_report = report.clone();
    let writer = tokio::task::spawn_blocking(move || {
        send_writes(
            &source_path,
            block_size,
            &decisions,
            image_len,
            to_send,
            &sending_report,
        )
    });
    loop {
        tokio::select! {
            bytes = sending.recv() => {
                let Some(bytes) = bytes else { break };
                summary.bytes_sent += bytes.len() as u64;
                write.write_all(&bytes).await.map_err(stream_error)?;
            }
            // The device may give up while data is still on its way.
            message = from_device.next(&mut read) => {
                drop(sending);
                let _ = writer.await;
                return Err(match message? {
                    Message::Fail { message } => remote(message),
                    other => protocol(format!("unexpected {} before END", other.name())),
                });
            }
        }
    }
    let digest = writer
        .await
        .map_err(|e| local(e.to_string()))?
        .map_err(|e| local(e.to_string()))?;
    write.flush().await.map_err(stream_error)?;
    report.start(Phase::Checking, 0);
    match from_device.next(&mut read).await? {
        Message::Done { digest: built } if built == digest => {}
        Message::Done { .. } => {
            return Err(remote(
                "the device reports an image whose digest differs from this one's".into(),
            ))
        }
        Message::Fail { message } => return Err(remote(message)),
        other => return Err(protocol(format!("expected DONE, got {}", other.name()))),
    }
    let _ = write.shutdown().await;
    summary.bytes_received = from_device.bytes;
    summary.elapsed = started.elapsed();
    summary.installed = true;
    Ok(summary)
}

/// What the device sent, decoded as it arrives.
struct Received {
    decoder: Decoder,
    buffer: Vec<u8>,
    bytes: u64,
}

impl Default for Received {
    fn default() -> Received {
        Received {
            decoder: Decoder::new(),
            buffer: vec![0u8; 256 * 1024],
            bytes: 0,
        }
    }
}

impl Received {
    async fn next(&mut self, read: &mut (impl tokio::io::AsyncRead + Unpin)) -> Result<Message> {
        loop {
            if let Some(message) = self
                .decoder
                .next_message()
                .map_err(|e| protocol(e.to_string()))?
            {
                return Ok(message);
            }
            // Cancel-safe (a `select!` branch): bytes read are fed at once.
            let n = read.read(&mut self.buffer).await.map_err(stream_error)?;
            if n == 0 {
                return Err(protocol("the device closed the stream".into()));
            }
            self.bytes += n as u64;
            self.decoder.feed(&self.buffer[..n]);
        }
    }
}

fn encoded(message: &Message) -> Bytes {
    let mut out = BytesMut::new();
    wire::encode(message, &mut out);
    out.freeze()
}

fn protocol(message: String) -> Error {
    Error::Protocol(format!("oxadb-delta: {message}"))
}

fn stream_error(cause: io::Error) -> Error {
    Error::Io {
        context: "oxadb-delta stream".into(),
        cause,
    }
}

/// The image's length (a block device's size) and the mode a new file gets.
fn image_size_and_mode(source: &Path) -> io::Result<(u64, u32)> {
    let mut file = File::open(source)?;
    let metadata = file.metadata()?;
    let len = if metadata.is_file() {
        metadata.len()
    } else {
        file.seek(SeekFrom::End(0))?
    };
    Ok((len, metadata.permissions().mode() & 0o7777))
}

/// Reads `source` block by block, calling `each` with the block's index
/// and bytes (the last block maybe short).
fn each_block(
    source: &Path,
    block_size: BlockSize,
    len: u64,
    mut each: impl FnMut(u64, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut file = File::open(source)?;
    let bs = block_size.bytes() as usize;
    let mut buffer = vec![0u8; (1 << 20).max(bs)];
    let mut index = 0u64;
    let mut left = len;
    while left > 0 {
        let n = left.min(buffer.len() as u64) as usize;
        file.read_exact(&mut buffer[..n]).map_err(|e| {
            io::Error::new(e.kind(), format!("reading at byte {}: {e}", len - left))
        })?;
        for block in buffer[..n].chunks(bs) {
            each(index, block)?;
            index += 1;
        }
        left -= n as u64;
    }
    Ok(())
}

fn decide_all(
    source: &Path,
    planner: Planner,
    len: u64,
    report: &Report,
) -> io::Result<(Planner, Vec<Decision>, PlanCounts)> {
    let block_size = planner.block_size();
    let mut decisions = Vec::with_capacity(block_size.blocks_in(len) as usize);
    let mut counts = PlanCounts::default();
    each_block(source, block_size, len, |index, block| {
        let decision = planner.decide(index, block);
        counts.count(decision, block.len());
        report.add(block.len() as u64);
        decisions.push(decision);
        Ok(())
    })?;
    Ok((planner, decisions, counts))
}

/// The zeros and new data of the plan, encoded (compressed) and queued for
/// the stream, then END; returns the image's digest.
fn send_writes(
    source: &Path,
    block_size: BlockSize,
    decisions: &[Decision],
    len: u64,
    to_send: mpsc::Sender<Bytes>,
    report: &Report,
) -> io::Result<[u8; 32]> {
    let mut writes = Plan::keeping(block_size, Keep::Writes);
    let mut digest = ImageDigest::new();
    let send = |ops: Vec<Op>| -> io::Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut out = BytesMut::new();
        for op in ops {
            wire::encode(&Message::Op(op), &mut out);
        }
        to_send
            .blocking_send(out.freeze())
            .map_err(|_| io::Error::other("the stream ended"))
    };
    each_block(source, block_size, len, |index, block| {
        digest.update(block);
        report.add(block.len() as u64);
        writes.push(index, decisions[index as usize], block);
        send(writes.take_closed())
    })?;
    send(writes.finish())?;
    let digest = digest.finish();
    to_send
        .blocking_send(encoded(&Message::End { digest }))
        .map_err(|_| io::Error::other("the stream ended"))?;
    Ok(digest)
}

/// The plan's copies (unchanged blocks included), coalesced and encoded:
/// they need no block data, only the decisions.
fn encoded_copies(block_size: BlockSize, decisions: &[Decision]) -> Bytes {
    let mut copies = Plan::keeping(block_size, Keep::Copies);
    for (index, decision) in decisions.iter().enumerate() {
        copies.push(index as u64, *decision, &[]);
    }
    let mut out = BytesMut::new();
    for op in copies.finish() {
        wire::encode(&Message::Op(op), &mut out);
    }
    out.freeze()
}

/// What a dry run would have sent: the copies and the encoded writes,
/// counted, not sent.
async fn dry_run_bytes(
    source: &Path,
    planner: &Planner,
    decisions: &[Decision],
    len: u64,
) -> io::Result<u64> {
    let block_size = planner.block_size();
    let mut bytes = encoded_copies(block_size, decisions).len() as u64;
    let (to_send, mut sent) = mpsc::channel::<Bytes>(4);
    let source = source.to_path_buf();
    let decisions = decisions.to_vec();
    let writer = tokio::task::spawn_blocking(move || {
        send_writes(&source, block_size, &decisions, len, to_send, &Report(None))
    });
    while let Some(chunk) = sent.recv().await {
        bytes += chunk.len() as u64;
    }
    writer.await.map_err(io::Error::other)??;
    Ok(bytes)
}
