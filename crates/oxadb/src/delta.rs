//! `oxadb push --delta`: the host's side of an `oxadb-delta:` stream
//! (docs/delta.md). The host reads and digests its image once while the
//! device digests (or loads the index of) the old one and sends its region
//! digests; the host then asks for the block digests of the regions that
//! differ, decides every block from digests alone, sends the copies first
//! (a device applying them in place needs them before any write), then
//! zeros and new data, read again only where a block is new; the last
//! message carries the new image's digest, which the device must match.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use oxadb_delta::wire::{self, Decoder, Message, Target, RUNS_PER_WANT};
use oxadb_delta::{
    region_digests, regions_in, BlockDigest, BlockInfo, BlockSize, Decision, ImageDigest, Keep, Op,
    Plan, Planner, MAX_REPLACE_BYTES, REGION_BLOCKS,
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

    // The new image read once, while the device reads the old one.
    let source_path = source.to_path_buf();
    report.start(Phase::Reading, image_len);
    let reading_report = report.clone();
    let mut reading = tokio::task::spawn_blocking(move || {
        digest_image(&source_path, block_size, image_len, &reading_report)
    });
    let ((target, old_len, old_regions), new_blocks) = {
        let index = async {
            let (target, old_len) = match from_device.next(&mut read).await? {
                Message::Index { target, old_len } => (target, old_len),
                Message::Fail { message } => return Err(remote(message)),
                other => return Err(protocol(format!("expected INDEX, got {}", other.name()))),
            };
            let regions = regions_in(block_size.blocks_in(old_len));
            let mut old_regions: Vec<BlockDigest> = Vec::with_capacity(regions as usize);
            while (old_regions.len() as u64) < regions {
                match from_device.next(&mut read).await? {
                    Message::Regions { start, digests }
                        if start == old_regions.len() as u64
                            && !digests.is_empty()
                            && start + digests.len() as u64 <= regions =>
                    {
                        old_regions.extend(digests)
                    }
                    Message::Regions { start, digests } => {
                        return Err(protocol(format!(
                            "{} region digests from {start}, expected from {} of {regions}",
                            digests.len(),
                            old_regions.len()
                        )))
                    }
                    Message::Fail { message } => return Err(remote(message)),
                    other => {
                        return Err(protocol(format!("expected REGIONS, got {}", other.name())))
                    }
                }
            }
            Ok((target, old_len, old_regions))
        };
        tokio::pin!(index);
        // The device may fail (or be slow) before this host has read its image.
        tokio::select! {
            biased;
            read_done = &mut reading => {
                let new_blocks = joined(read_done).map_err(local)?;
                report.start(Phase::Index, 0);
                ((&mut index).await?, new_blocks)
            }
            indexed = &mut index => {
                let indexed = indexed?;
                (indexed, joined(reading.await).map_err(local)?)
            }
        }
    };

    // Only the regions that differ cross: a region the same on both sides
    // has the new image's digests.
    let new_digests: Vec<BlockDigest> = new_blocks.iter().map(|b| b.digest).collect();
    let new_regions = region_digests(&new_digests);
    let wanted: Vec<u64> = (0..old_regions.len() as u64)
        .filter(|&r| new_regions.get(r as usize) != Some(&old_regions[r as usize]))
        .collect();
    let runs = runs_of(&wanted);
    for (k, chunk) in runs.chunks(RUNS_PER_WANT).enumerate() {
        let want = encoded(&Message::Want {
            runs: chunk.to_vec(),
            last: (k + 1) * RUNS_PER_WANT >= runs.len(),
        });
        bytes_sent += want.len() as u64;
        write.write_all(&want).await.map_err(stream_error)?;
    }
    if runs.is_empty() {
        let want = encoded(&Message::Want {
            runs: Vec::new(),
            last: true,
        });
        bytes_sent += want.len() as u64;
        write.write_all(&want).await.map_err(stream_error)?;
    }
    write.flush().await.map_err(stream_error)?;
    let old_blocks = block_size.blocks_in(old_len) as usize;
    let mut old_digests = vec![BlockDigest([0; 16]); old_blocks];
    let region_range = |r: u64| {
        let start = (r * REGION_BLOCKS) as usize;
        start..(start + REGION_BLOCKS as usize).min(old_blocks)
    };
    for r in 0..old_regions.len() as u64 {
        if !wanted_contains(&wanted, r) {
            let range = region_range(r);
            old_digests[range.clone()].copy_from_slice(&new_digests[range]);
        }
    }
    // The device answers each run of regions with its blocks' digests, in order.
    for &(first, count) in &runs {
        let (start, end) = (
            region_range(first).start,
            region_range(first + count - 1).end,
        );
        let mut next = start;
        while next < end {
            match from_device.next(&mut read).await? {
                Message::Digests { start, digests }
                    if start == next as u64
                        && !digests.is_empty()
                        && next + digests.len() <= end =>
                {
                    old_digests[next..next + digests.len()].copy_from_slice(&digests);
                    next += digests.len();
                }
                Message::Digests { start, digests } => {
                    return Err(protocol(format!(
                        "{} digests from block {start}, expected from {next} to {end}",
                        digests.len()
                    )))
                }
                Message::Fail { message } => return Err(remote(message)),
                other => return Err(protocol(format!("expected DIGESTS, got {}", other.name()))),
            }
        }
    }
    let base = options.base.as_ref().map(|path| Base {
        path: path.clone(),
        old_len,
        old_digests: old_digests.clone(),
    });
    let planner =
        Planner::new(block_size, old_len, old_digests).map_err(|e| protocol(e.to_string()))?;
    let mut counts = PlanCounts::default();
    let decisions: Vec<Decision> = new_blocks
        .iter()
        .enumerate()
        .map(|(index, info)| {
            let decision = planner.decide_digest(index as u64, info);
            counts.count(decision, info.len as usize);
            decision
        })
        .collect();
    let image_digest = ImageDigest::of_blocks(block_size, image_len, &new_digests);
    drop(planner);

    let mut summary = DeltaSummary {
        image_len,
        target,
        old_len,
        counts,
        xor_blocks: 0,
        bytes_sent,
        bytes_received: from_device.bytes,
        elapsed: started.elapsed(),
        installed: false,
    };
    if options.dry_run {
        // Dropping the stream ends it: the device removes what it prepared.
        let (bytes, xor_blocks) = dry_run_bytes(source, block_size, &decisions, image_len, base)
            .await
            .map_err(|e| local(e.to_string()))?;
        summary.bytes_sent += bytes;
        summary.xor_blocks = xor_blocks;
        return Ok(summary);
    }

    // The copies, all before any write (a block device reads their sources first).
    let out = encoded_copies(block_size, &decisions);
    summary.bytes_sent += out.len() as u64;
    write.write_all(&out).await.map_err(stream_error)?;

    // Zeros and new data, read and compressed on a blocking thread while
    // what it made is sent.
    let (to_send, mut sending) = mpsc::channel::<Bytes>(4);
    let source_path = source.to_path_buf();
    report.start(Phase::Sending, counts.replace_bytes);
    let sending_report = report.clone();
    let writer = tokio::task::spawn_blocking(move || {
        send_writes(
            &source_path,
            block_size,
            &decisions,
            image_len,
            base.as_ref(),
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
    summary.xor_blocks = writer
        .await
        .map_err(|e| local(e.to_string()))?
        .map_err(|e| local(e.to_string()))?;
    let end = encoded(&Message::End {
        digest: image_digest,
    });
    summary.bytes_sent += end.len() as u64;
    write.write_all(&end).await.map_err(stream_error)?;
    write.flush().await.map_err(stream_error)?;
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

/// Sorted region numbers as runs (first, count).
fn runs_of(regions: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &region in regions {
        match runs.last_mut() {
            Some((first, count)) if *first + *count == region => *count += 1,
            _ => runs.push((region, 1)),
        }
    }
    runs
}

fn wanted_contains(wanted: &[u64], region: u64) -> bool {
    wanted.binary_search(&region).is_ok()
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

/// Reads `source` once: each block's digest, length and whether it is
/// zero, which is all deciding it needs. The blocks of each 8 MiB read are
/// hashed on every core: on loopback or a fast link, hashing the new image
/// is most of a delta onto an indexed target (BLAKE3 of 4 KiB blocks ran at
/// 2.2 GB/s on one core here; docs/delta.md, "Hashes").
fn digest_image(
    source: &Path,
    block_size: BlockSize,
    len: u64,
    report: &Report,
) -> io::Result<Vec<BlockInfo>> {
    const READ: usize = 8 << 20;
    let mut file = File::open(source)?;
    let bs = block_size.bytes() as usize;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut buffer = vec![0u8; READ.max(bs)];
    let mut blocks = Vec::with_capacity(block_size.blocks_in(len) as usize);
    let mut left = len;
    while left > 0 {
        let n = left.min(buffer.len() as u64) as usize;
        file.read_exact(&mut buffer[..n]).map_err(|e| {
            io::Error::new(e.kind(), format!("reading at byte {}: {e}", len - left))
        })?;
        let per_thread = n.div_ceil(bs).div_ceil(threads) * bs;
        let parts: Vec<Vec<BlockInfo>> = std::thread::scope(|scope| {
            let handles: Vec<_> = buffer[..n]
                .chunks(per_thread)
                .map(|part| {
                    scope.spawn(move || part.chunks(bs).map(BlockInfo::of).collect::<Vec<_>>())
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().expect("hashing does not panic"))
                .collect()
        });
        blocks.extend(parts.into_iter().flatten());
        report.add(n as u64);
        left -= n as u64;
    }
    Ok(blocks)
}

/// The old image as this host has it (`--base`), with the device's
/// digests of its own, which say which of its blocks still hold.
struct Base {
    path: std::path::PathBuf,
    old_len: u64,
    old_digests: Vec<BlockDigest>,
}

/// The zeros and new data of the plan, encoded (compressed) and queued for
/// the stream; only the new blocks are read again, a run at a time. With a
/// base, each run's blocks whose old bytes the base holds go as XOR where
/// that compresses smaller; returns how many blocks did.
fn send_writes(
    source: &Path,
    block_size: BlockSize,
    decisions: &[Decision],
    len: u64,
    base: Option<&Base>,
    to_send: mpsc::Sender<Bytes>,
    report: &Report,
) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let file = File::open(source)?;
    let base_file = match base {
        Some(base) => Some(
            File::open(&base.path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", base.path.display())))?,
        ),
        None => None,
    };
    let mut writes = Plan::keeping(block_size, Keep::Writes);
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
    let mut index = 0usize;
    while index < decisions.len() {
        if decisions[index] != Decision::Replace {
            writes.push(index as u64, decisions[index], &[]);
            index += 1;
            continue;
        }
        let run = decisions[index..]
            .iter()
            .take(max_run)
            .take_while(|&&d| d == Decision::Replace)
            .count();
        let offset = block_size.offset_of(index as u64);
        let bytes = ((run * bs) as u64).min(len - offset) as usize;
        buffer.resize(bytes, 0);
        file.read_exact_at(&mut buffer, offset)
            .map_err(|e| io::Error::new(e.kind(), format!("reading at byte {offset}: {e}")))?;
        match (base, &base_file) {
            (Some(base), Some(base_file)) => {
                // Planned here, not by the plan: the plan's order stays whole.
                for k in 0..run {
                    writes.push((index + k) as u64, Decision::Same, &[]);
                }
                let (ops, xored) = xor_or_replace(base, base_file, block_size, index, &buffer)?;
                xor_blocks += xored;
                send(writes.take_closed())?;
                send(ops)?;
            }
            _ => {
                for (k, block) in buffer.chunks(bs).enumerate() {
                    writes.push((index + k) as u64, Decision::Replace, block);
                }
                send(writes.take_closed())?;
            }
        }
        report.add(bytes as u64);
        index += run;
    }
    send(writes.finish())?;
    Ok(xor_blocks)
}

/// A run of new blocks from `first` (`data`, at most 1 MiB) as operations:
/// the stretches whose old bytes the base holds (the base block's digest is
/// the device's) as one XOR each, if its compressed XOR is the smaller,
/// the rest as REPLACE. Returns them and how many blocks went as XOR.
fn xor_or_replace(
    base: &Base,
    base_file: &File,
    block_size: BlockSize,
    first: usize,
    data: &[u8],
) -> io::Result<(Vec<Op>, u64)> {
    use std::os::unix::fs::FileExt;
    let bs = block_size.bytes() as usize;
    let mut old = vec![0u8; data.len()];
    let usable: Vec<bool> = data
        .chunks(bs)
        .enumerate()
        .map(|(k, block)| {
            let index = (first + k) as u64;
            let old_block = &mut old[k * bs..k * bs + block.len()];
            block_size.len_of(index, base.old_len) == block.len()
                && base.old_digests.get(index as usize).is_some_and(|digest| {
                    base_file
                        .read_exact_at(old_block, block_size.offset_of(index))
                        .is_ok()
                        && BlockDigest::of(old_block) == *digest
                })
        })
        .collect();
    let mut ops = Vec::new();
    let mut xored = 0u64;
    let mut k = 0;
    while k < usable.len() {
        let stretch = usable[k..].iter().take_while(|&&u| u == usable[k]).count();
        let (from, to) = (k * bs, ((k + stretch) * bs).min(data.len()));
        let start = (first + k) as u64;
        let new_bytes = Bytes::copy_from_slice(&data[from..to]);
        if usable[k] {
            let delta: Vec<u8> = data[from..to]
                .iter()
                .zip(&old[from..to])
                .map(|(new, old)| new ^ old)
                .collect();
            if wire::encoded_len(&delta) < wire::encoded_len(&new_bytes) {
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
    block_size: BlockSize,
    decisions: &[Decision],
    len: u64,
    base: Option<Base>,
) -> io::Result<(u64, u64)> {
    let mut bytes = encoded_copies(block_size, decisions).len() as u64;
    let (to_send, mut sent) = mpsc::channel::<Bytes>(4);
    let source = source.to_path_buf();
    let decisions = decisions.to_vec();
    let writer = tokio::task::spawn_blocking(move || {
        send_writes(
            &source,
            block_size,
            &decisions,
            len,
            base.as_ref(),
            to_send,
            &Report(None),
        )
    });
    while let Some(chunk) = sent.recv().await {
        bytes += chunk.len() as u64;
    }
    let xor_blocks = writer.await.map_err(io::Error::other)??;
    Ok((bytes + 4 + 1 + 32, xor_blocks))
}
