//! `oxadb push --delta`: the host's side of an `oxadb-delta:` stream
//! (docs/delta.md). The host reads and digests its image once while the
//! device digests (or loads the index of) the old one and sends its region
//! digests; the host then asks for the block digests of the regions that
//! differ, decides every block from digests alone, sends the copies first
//! (a device applying them in place needs them before any write), then
//! zeros and new data, read again only where a block is new; the last
//! message carries the new image's digest, which the device must match.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use oxadb_delta::wire::{self, Decoder, Message, Target, RUNS_PER_WANT};
use oxadb_delta::{
    BlockDigest, BlockInfo, BlockSize, Decision, ImageDigest, Keep, Op, Pipeline, Plan,
    MAX_REPLACE_BYTES,
};
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
    /// The old image, if this host has it: changed blocks whose old bytes
    /// it still describes (by the device's digests) may go as XOR.
    pub base: Option<std::path::PathBuf>,
}

impl Default for DeltaOptions {
    fn default() -> DeltaOptions {
        DeltaOptions {
            block_size: BlockSize::DEFAULT,
            dry_run: false,
            progress: None,
            base: None,
        }
    }
}

/// The phases of a delta, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The host reads and digests the new image (the device digests the
    /// old one meanwhile).
    Reading,
    /// The host waits for the rest of the device's digests.
    Index,
    /// The host sends copies, zeros and new data.
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
            0 => Phase::Reading,
            1 => Phase::Index,
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
    /// Of the new-data blocks, those sent as XOR with the base.
    pub xor_blocks: u64,
    /// Zero and new-data blocks sent while the device's index still arrived.
    pub early_blocks: u64,
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

    // The new image read once, while the device reads the old one; its
    // blocks are described to the pipeline as they are hashed.
    let source_path = source.to_path_buf();
    report.start(Phase::Reading, image_len);
    let reading_report = report.clone();
    let (hashed_chunks, mut hashed) = mpsc::channel::<HashedChunk>(HASHED_QUEUE);
    let reading = tokio::task::spawn_blocking(move || {
        digest_image(
            &source_path,
            block_size,
            image_len,
            &reading_report,
            &hashed_chunks,
        )
    });
    let (target, old_len) = match from_device.next(&mut read).await? {
        Message::Index { target, old_len } => (target, old_len),
        Message::Fail { message } => return Err(remote(message)),
        other => return Err(protocol(format!("expected INDEX, got {}", other.name()))),
    };
    let mut pipeline = Pipeline::hashing(
        block_size,
        image_len,
        old_len,
        target == Target::BlockDevice,
    );

    // One thread reads, compresses and encodes whatever is to be sent, in
    // the order it is asked; one task writes it to the stream, so that the
    // device's index is read meanwhile.
    let (jobs, job_queue) = std::sync::mpsc::channel::<Job>();
    let (to_send, mut sending) = mpsc::channel::<Bytes>(4);
    let writer = {
        let source = source.to_path_buf();
        let base = options.base.clone();
        let report = report.clone();
        tokio::task::spawn_blocking(move || {
            run_writer(
                &source,
                base.as_deref(),
                block_size,
                image_len,
                old_len,
                job_queue,
                to_send,
                &report,
            )
        })
    };
    let mut forward = tokio::spawn(async move {
        let mut sent = 0u64;
        while let Some(bytes) = sending.recv().await {
            write.write_all(&bytes).await?;
            sent += bytes.len() as u64;
        }
        write.flush().await?;
        io::Result::Ok((write, sent))
    });
    let queue = |job: Job| {
        // The writer only stops early when the stream failed, which the
        // reads below report.
        let _ = jobs.send(job);
    };
    let mut last_want_sent = false;
    let mut want = |runs: &[(u64, u64)], pipeline: &Pipeline| {
        let last = pipeline.comparisons_done() && !last_want_sent;
        last_want_sent |= last;
        for (k, chunk) in runs.chunks(RUNS_PER_WANT).enumerate() {
            let final_chunk = (k + 1) * RUNS_PER_WANT >= runs.len();
            queue(Job::Bytes(encoded(&Message::Want {
                runs: chunk.to_vec(),
                last: last && final_chunk,
            })));
        }
        if runs.is_empty() && last {
            queue(Job::Bytes(encoded(&Message::Want {
                runs: Vec::new(),
                last: true,
            })));
        }
    };
    want(&[], &pipeline);
    let with_base = options.base.is_some();
    let mut early_blocks = 0u64;
    // Hashed chunks arrive in any order; the pipeline takes them in order.
    let mut out_of_order = std::collections::BTreeMap::new();
    let mut next_chunk = 0u64;
    while !(pipeline.index_complete() && pipeline.hashing_done()) {
        tokio::select! {
            chunk = hashed.recv(), if !pipeline.hashing_done() => {
                let Some(HashedChunk { chunk, blocks }) = chunk else {
                    // The reading ended early: its error says why.
                    joined(reading.await).map_err(local)?;
                    return Err(local("the image ended while being read".into()));
                };
                out_of_order.insert(chunk, blocks);
                while let Some(blocks) = out_of_order.remove(&next_chunk) {
                    next_chunk += 1;
                    let runs = pipeline.hashed(&blocks);
                    want(&runs, &pipeline);
                }
                if pipeline.hashing_done() {
                    report.start(Phase::Index, 0);
                }
            }
            message = from_device.next(&mut read), if !pipeline.index_complete() => {
                match message? {
                    Message::Regions { start, digests } => {
                        let runs = pipeline
                            .regions(start, &digests)
                            .map_err(|e| protocol(e.to_string()))?;
                        want(&runs, &pipeline);
                    }
                    Message::Digests { start, digests } => pipeline
                        .digests(start, &digests)
                        .map_err(|e| protocol(e.to_string()))?,
                    Message::Fail { message } => return Err(remote(message)),
                    other => {
                        return Err(protocol(format!(
                            "expected REGIONS or DIGESTS, got {}",
                            other.name()
                        )))
                    }
                }
            }
        }
        if options.dry_run || (pipeline.index_complete() && pipeline.hashing_done()) {
            continue;
        }
        // New data the index already allows, sent while the rest arrives.
        if let Some((first, decisions)) = pipeline.early_writes() {
            early_blocks += decisions.iter().filter(|d| **d != Decision::Same).count() as u64;
            let old = if with_base {
                (first..first + decisions.len() as u64)
                    .map(|index| pipeline.old_digest(index))
                    .collect()
            } else {
                Vec::new()
            };
            queue(Job::Writes {
                first,
                decisions,
                old,
            });
        }
    }
    joined(reading.await).map_err(local)?;
    let image_digest = ImageDigest::of_blocks(block_size, image_len, &pipeline.new_digests());
    let old_digests: Vec<Option<BlockDigest>> = if with_base {
        (0..block_size.blocks_in(old_len))
            .map(|index| pipeline.old_digest(index))
            .collect()
    } else {
        Vec::new()
    };
    let (decisions, rest) = pipeline.finish().map_err(|e| protocol(e.to_string()))?;
    let mut counts = PlanCounts::default();
    for (index, decision) in decisions.iter().enumerate() {
        counts.count(*decision, block_size.len_of(index as u64, image_len));
    }

    let mut summary = DeltaSummary {
        image_len,
        target,
        old_len,
        counts,
        xor_blocks: 0,
        early_blocks,
        bytes_sent,
        bytes_received: 0,
        elapsed: started.elapsed(),
        installed: false,
    };
    if !options.dry_run {
        // The copies, before any write that is not yet sent (a block device
        // reads their sources first), then those writes and END.
        queue(Job::Bytes(encoded_copies(block_size, &decisions)));
        queue(Job::Writes {
            first: 0,
            decisions: rest,
            old: old_digests.clone(),
        });
        queue(Job::Bytes(encoded(&Message::End {
            digest: image_digest,
        })));
        report.start(Phase::Sending, counts.replace_bytes);
    }
    drop(jobs);
    // The device may give up while data is still on its way.
    let (mut write, sent) = tokio::select! {
        forwarded = &mut forward => forwarded
            .map_err(|e| local(e.to_string()))?
            .map_err(stream_error)?,
        message = from_device.next(&mut read) => {
            forward.abort();
            let _ = writer.await;
            return Err(match message? {
                Message::Fail { message } => remote(message),
                other => protocol(format!("unexpected {} before END", other.name())),
            });
        }
    };
    summary.bytes_sent += sent;
    summary.xor_blocks = writer
        .await
        .map_err(|e| local(e.to_string()))?
        .map_err(|e| local(e.to_string()))?;
    if options.dry_run {
        // Dropping the stream ends it: the device removes what it prepared.
        let (bytes, xor_blocks) = dry_run_bytes(
            source,
            options.base.as_deref(),
            block_size,
            &decisions,
            image_len,
            old_len,
            old_digests,
        )
        .await
        .map_err(|e| local(e.to_string()))?;
        summary.bytes_sent += bytes;
        summary.xor_blocks = xor_blocks;
        summary.bytes_received = from_device.bytes;
        summary.elapsed = started.elapsed();
        return Ok(summary);
    }
    report.start(Phase::Checking, 0);
    match from_device.next(&mut read).await? {
        Message::Done { digest: built } if built == image_digest => {}
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

/// A blocking task's result, its panic or I/O error as text.
fn joined<T>(
    result: std::result::Result<io::Result<T>, tokio::task::JoinError>,
) -> std::result::Result<T, String> {
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(error.to_string()),
        Err(error) => Err(error.to_string()),
    }
}

/// What the writer thread is asked to send, in order.
enum Job {
    /// Bytes already encoded (WANTs, the copies, END).
    Bytes(Bytes),
    /// The zeros and new data among `decisions` (blocks from `first`; other
    /// decisions are skipped), with the old digests of those blocks when
    /// XOR against a base is possible.
    Writes {
        first: u64,
        decisions: Vec<Decision>,
        old: Vec<Option<BlockDigest>>,
    },
}

/// The writer thread: every job in order; returns how many blocks went as XOR.
#[allow(clippy::too_many_arguments)]
fn run_writer(
    source: &Path,
    base: Option<&Path>,
    block_size: BlockSize,
    len: u64,
    old_len: u64,
    jobs: std::sync::mpsc::Receiver<Job>,
    to_send: mpsc::Sender<Bytes>,
    report: &Report,
) -> io::Result<u64> {
    let file = File::open(source)?;
    let base = match base {
        Some(path) => Some(Base {
            file: File::open(path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?,
            old_len,
        }),
        None => None,
    };
    let mut xor_blocks = 0;
    for job in jobs {
        match job {
            Job::Bytes(bytes) => to_send
                .blocking_send(bytes)
                .map_err(|_| io::Error::other("the stream ended"))?,
            Job::Writes {
                first,
                decisions,
                old,
            } => {
                xor_blocks += send_writes(
                    &file,
                    block_size,
                    first,
                    &decisions,
                    len,
                    base.as_ref()
                        .filter(|_| !old.is_empty())
                        .map(|b| (b, &old[..])),
                    &to_send,
                    report,
                )?
            }
        }
    }
    Ok(xor_blocks)
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

/// The device broke the delta protocol; the caller names the device and
/// the destination ([`crate::cli`]'s context).
fn protocol(message: String) -> Error {
    Error::protocol("delta stream", "oxadb-delta", message)
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

/// Chunks of the new image hashed and not yet taken, at most.
const HASHED_QUEUE: usize = 16;

/// Bytes of the new image hashed at a time.
const HASHED_CHUNK: u64 = 4 << 20;

/// One chunk of the new image, hashed: chunk `chunk` of [`HASHED_CHUNK`]
/// bytes, its blocks in order.
struct HashedChunk {
    chunk: u64,
    blocks: Vec<BlockInfo>,
}

/// Reads `source` once: each block's digest, length and whether it is
/// zero, which is all deciding it needs, sent a chunk at a time, in the
/// order hashed. Every core takes the next chunk, reads and hashes it: on
/// loopback or a fast link, hashing the new image is most of a delta onto
/// an indexed target (BLAKE3 of 4 KiB blocks ran at 2.2 GB/s on one core
/// here; docs/delta.md, "Hashes"), and reading in the hashing threads
/// overlaps the copy out of the page cache with hashing (docs/benchmarks.md,
/// "Image updates").
fn digest_image(
    source: &Path,
    block_size: BlockSize,
    len: u64,
    report: &Report,
    hashed: &mpsc::Sender<HashedChunk>,
) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = File::open(source)?;
    let bs = u64::from(block_size.bytes());
    let chunk_len = HASHED_CHUNK.max(bs) / bs * bs;
    let chunks = len.div_ceil(chunk_len);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(chunks.max(1) as usize);
    let next_chunk = AtomicU64::new(0);
    let hash_chunks = || -> io::Result<()> {
        let mut buffer = vec![0u8; chunk_len as usize];
        loop {
            let chunk = next_chunk.fetch_add(1, Ordering::Relaxed);
            if chunk >= chunks {
                return Ok(());
            }
            let offset = chunk * chunk_len;
            let n = (len - offset).min(chunk_len) as usize;
            if let Err(e) = file.read_exact_at(&mut buffer[..n], offset) {
                // The other threads stop at their next chunk.
                next_chunk.store(chunks, Ordering::Relaxed);
                return Err(io::Error::new(
                    e.kind(),
                    format!("reading at byte {offset}: {e}"),
                ));
            }
            let blocks = buffer[..n].chunks(bs as usize).map(BlockInfo::of).collect();
            report.add(n as u64);
            if hashed.blocking_send(HashedChunk { chunk, blocks }).is_err() {
                // The delta ended.
                next_chunk.store(chunks, Ordering::Relaxed);
                return Ok(());
            }
        }
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads).map(|_| scope.spawn(hash_chunks)).collect();
        handles
            .into_iter()
            .try_for_each(|handle| handle.join().expect("hashing does not panic"))
    })
}

/// The old image as this host has it (`--base`).
struct Base {
    file: File,
    old_len: u64,
}

/// The zeros and new data among `decisions` (blocks from `first`),
/// encoded (compressed) and queued for the stream; only the new blocks
/// are read again, a run at a time. With a base (and the old digests of
/// these blocks), each run's blocks whose old bytes the base holds go as
/// XOR where that compresses smaller; returns how many blocks did.
#[allow(clippy::too_many_arguments)]
fn send_writes(
    file: &File,
    block_size: BlockSize,
    first: u64,
    decisions: &[Decision],
    len: u64,
    base: Option<(&Base, &[Option<BlockDigest>])>,
    to_send: &mpsc::Sender<Bytes>,
    report: &Report,
) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut writes = Plan::keeping_from(block_size, Keep::Writes, first);
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
    let bs = block_size.bytes() as usize;
    let max_run = MAX_REPLACE_BYTES / bs;
    let mut buffer = Vec::new();
    let mut xor_blocks = 0u64;
    let mut k = 0usize;
    while k < decisions.len() {
        let index = first + k as u64;
        if decisions[k] != Decision::Replace {
            writes.push(index, decisions[k], &[]);
            k += 1;
            continue;
        }
        let run = decisions[k..]
            .iter()
            .take(max_run)
            .take_while(|&&d| d == Decision::Replace)
            .count();
        let offset = block_size.offset_of(index);
        let bytes = ((run * bs) as u64).min(len - offset) as usize;
        buffer.resize(bytes, 0);
        file.read_exact_at(&mut buffer, offset)
            .map_err(|e| io::Error::new(e.kind(), format!("reading at byte {offset}: {e}")))?;
        match base {
            Some((base, old)) => {
                // Planned here, not by the plan: the plan's order stays whole.
                for j in 0..run {
                    writes.push(index + j as u64, Decision::Same, &[]);
                }
                let (ops, xored) =
                    xor_or_replace(base, &old[k..k + run], block_size, index, &buffer)?;
                xor_blocks += xored;
                send(writes.take_closed())?;
                send(ops)?;
            }
            None => {
                for (j, block) in buffer.chunks(bs).enumerate() {
                    writes.push(index + j as u64, Decision::Replace, block);
                }
                send(writes.take_closed())?;
            }
        }
        report.add(bytes as u64);
        k += run;
    }
    send(writes.finish())?;
    Ok(xor_blocks)
}

/// A run of new blocks from `first` (`data`, at most 1 MiB) as operations:
/// the stretches whose old bytes the base holds (the base block's digest is
/// the device's, `old`) as one XOR each, if its compressed XOR is the
/// smaller, the rest as REPLACE. Returns them and how many blocks went as XOR.
fn xor_or_replace(
    base: &Base,
    old_digests: &[Option<BlockDigest>],
    block_size: BlockSize,
    first: u64,
    data: &[u8],
) -> io::Result<(Vec<Op>, u64)> {
    use std::os::unix::fs::FileExt;
    let bs = block_size.bytes() as usize;
    let mut old = vec![0u8; data.len()];
    let usable: Vec<bool> = data
        .chunks(bs)
        .enumerate()
        .map(|(k, block)| {
            let index = first + k as u64;
            let old_block = &mut old[k * bs..k * bs + block.len()];
            block_size.len_of(index, base.old_len) == block.len()
                && old_digests.get(k).copied().flatten().is_some_and(|digest| {
                    base.file
                        .read_exact_at(old_block, block_size.offset_of(index))
                        .is_ok()
                        && BlockDigest::of(old_block) == digest
                })
        })
        .collect();
    let mut ops = Vec::new();
    let mut xored = 0u64;
    let mut k = 0;
    while k < usable.len() {
        let stretch = usable[k..].iter().take_while(|&&u| u == usable[k]).count();
        let (from, to) = (k * bs, ((k + stretch) * bs).min(data.len()));
        let start = first + k as u64;
        let new_bytes = Bytes::copy_from_slice(&data[from..to]);
        let delta: Vec<u8> = if usable[k] {
            data[from..to]
                .iter()
                .zip(&old[from..to])
                .map(|(new, old)| new ^ old)
                .collect()
        } else {
            Vec::new()
        };
        // Unchanged bytes XOR to zero: with fewer than one in eight, the
        // XOR cannot compress better than the data (random data XORed).
        let worth_trying = delta.iter().filter(|&&b| b == 0).count() * 8 >= delta.len();
        if usable[k] && worth_trying && wire::encoded_len(&delta) < wire::encoded_len(&new_bytes) {
            ops.push(Op::Xor {
                start,
                data: delta.into(),
            });
            xored += stretch as u64;
        } else {
            ops.push(Op::Replace {
                start,
                data: new_bytes,
            });
        }
        k += stretch;
    }
    Ok((ops, xored))
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

/// What a dry run would have sent (the copies, the encoded writes, END),
/// counted, not sent, and how many blocks went as XOR.
async fn dry_run_bytes(
    source: &Path,
    base: Option<&Path>,
    block_size: BlockSize,
    decisions: &[Decision],
    len: u64,
    old_len: u64,
    old: Vec<Option<BlockDigest>>,
) -> io::Result<(u64, u64)> {
    let (jobs, job_queue) = std::sync::mpsc::channel::<Job>();
    let (to_send, mut sent) = mpsc::channel::<Bytes>(4);
    let _ = jobs.send(Job::Bytes(encoded_copies(block_size, decisions)));
    let _ = jobs.send(Job::Writes {
        first: 0,
        decisions: decisions.to_vec(),
        old,
    });
    drop(jobs);
    let source = source.to_path_buf();
    let base = base.map(Path::to_path_buf);
    let writer = tokio::task::spawn_blocking(move || {
        run_writer(
            &source,
            base.as_deref(),
            block_size,
            len,
            old_len,
            job_queue,
            to_send,
            &Report(None),
        )
    });
    let mut bytes = 0u64;
    while let Some(chunk) = sent.recv().await {
        bytes += chunk.len() as u64;
    }
    let xor_blocks = writer.await.map_err(io::Error::other)??;
    // END, which a dry run does not send.
    Ok((bytes + 4 + 1 + 32, xor_blocks))
}
