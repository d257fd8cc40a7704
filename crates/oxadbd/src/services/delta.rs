//! `oxadb-delta:`: an image built on the device from block operations on
//! the old one (docs/delta.md). The stream's messages are
//! `oxadb_delta::wire`'s; this file opens the destination, sends the old
//! image's block digests, applies what the host sends and checks the result
//! against the host's digest. A regular file is built beside the old one
//! and renamed over it only when the digests agree, as a push is
//! (`oxadb_transfer::Destination`); a block device is written in place,
//! every copy before anything that may overwrite its source.
//!
//! File work blocks, so it runs on a blocking thread that the stream's
//! reader and writer feed through bounded queues.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use oxadb_delta::wire::{self, Decoder, Message, Target, DIGESTS_PER_MESSAGE};
use oxadb_delta::{
    apply_beside_op, apply_copies_in_place, apply_write, region_digest, regions_in, resolve_xor,
    write_zeros, BlockDigest, BlockSize, BlockStore, CheckedReads, Composition, Op, REGION_BLOCKS,
};
use oxadb_transfer::{Attributes, Destination, Durability, Policy, Storage};

use super::delta_index::{IndexKey, IndexStore};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Bytes read at a time when hashing an image.
const READ_CHUNK: usize = 1 << 20;

/// Messages queued each way between the stream and the file thread.
const QUEUE: usize = 4;

/// Serves one `oxadb-delta:` stream to its end; `indexes` keeps the
/// digests of what it built for the next delta (none: every delta reads
/// the old image).
pub async fn serve<S>(stream: S, storage: Storage, indexes: Option<IndexStore>) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (to_worker, from_host) = mpsc::channel::<Message>(QUEUE);
    let (to_host, mut from_worker) = mpsc::channel::<Bytes>(QUEUE);
    let worker = tokio::task::spawn_blocking(move || {
        let mut link = Link { from_host, to_host };
        let outcome = run(&mut link, &storage, indexes.as_ref());
        if let Err(message) = outcome {
            tracing::warn!(%message, "delta failed");
            link.send(&Message::Fail { message });
        }
    });
    let (mut read, mut write) = tokio::io::split(stream);
    let reading = async move {
        let mut decoder = Decoder::new();
        loop {
            let Some(chunk) = read_chunk(&mut read).await? else {
                return io::Result::Ok(());
            };
            decoder.feed(&chunk);
            loop {
                match decoder.next_message() {
                    Ok(Some(message)) => {
                        if to_worker.send(message).await.is_err() {
                            return Ok(());
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        // The file thread hears it as the host's failure.
                        let _ = to_worker
                            .send(Message::Fail {
                                message: error.to_string(),
                            })
                            .await;
                        return Ok(());
                    }
                }
            }
        }
    };
    let writing = async move {
        while let Some(bytes) = from_worker.recv().await {
            write.write_all(&bytes).await?;
        }
        write.flush().await?;
        write.shutdown().await
    };
    let (read_result, write_result) = tokio::join!(reading, writing);
    worker.await.map_err(io::Error::other)?;
    read_result.and(write_result)
}

async fn read_chunk<R: AsyncRead + Unpin>(read: &mut R) -> io::Result<Option<Bytes>> {
    use tokio::io::AsyncReadExt;
    let mut buffer = BytesMut::with_capacity(256 * 1024);
    match read.read_buf(&mut buffer).await? {
        0 => Ok(None),
        _ => Ok(Some(buffer.freeze())),
    }
}

/// The file thread's ends of the two queues.
struct Link {
    from_host: mpsc::Receiver<Message>,
    to_host: mpsc::Sender<Bytes>,
}

impl Link {
    fn send(&mut self, message: &Message) -> bool {
        let mut out = BytesMut::new();
        wire::encode(message, &mut out);
        self.to_host.blocking_send(out.freeze()).is_ok()
    }

    fn receive(&mut self) -> Result<Message, String> {
        match self.from_host.blocking_recv() {
            Some(Message::Fail { message }) => Err(format!("the host gave up: {message}")),
            Some(message) => Ok(message),
            None => Err("the host closed the stream".into()),
        }
    }
}

/// What the destination is, opened.
enum Old {
    Absent,
    File { file: File },
    BlockDevice { device: File, size: u64 },
}

fn run(link: &mut Link, storage: &Storage, indexes: Option<&IndexStore>) -> Result<(), String> {
    let Message::Begin {
        block_size,
        new_len,
        mode,
        path,
    } = link.receive()?
    else {
        return Err("the delta did not start with BEGIN".into());
    };
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err(format!("'{}' is not an absolute path", path.display()));
    }
    let Some(_in_flight) = crate::stop::push_started() else {
        return Err(format!(
            "couldn't push '{}': oxadbd is stopping",
            path.display()
        ));
    };
    let failed = |what: &str, error: &dyn std::fmt::Display| {
        format!("couldn't {what} '{}': {error}", path.display())
    };
    let old = open_old(&path).map_err(|error| failed("open", &error))?;
    let (target, old_len) = match &old {
        Old::Absent => (Target::Absent, 0),
        Old::File { file } => (
            Target::File,
            file.metadata().map_err(|e| failed("stat", &e))?.len(),
        ),
        Old::BlockDevice { size, .. } => (Target::BlockDevice, *size),
    };
    tracing::info!(path = %path.display(), ?target, old_len, new_len, "delta");
    if !link.send(&Message::Index { target, old_len }) {
        return Err("the host closed the stream".into());
    }
    let old_file = match &old {
        Old::Absent => None,
        Old::File { file } => Some(file),
        Old::BlockDevice { device, .. } => Some(device),
    };
    let old_digests = match old_file {
        None => Vec::new(),
        Some(file) => {
            if matches!(old, Old::BlockDevice { .. }) {
                // Pages another opener left dirty go out now and move the
                // device's write count, which the index key holds.
                file.sync_all().map_err(|e| failed("flush", &e))?;
            }
            let key = match indexes {
                Some(_) => {
                    IndexKey::of(file, block_size, old_len).map_err(|e| failed("stat", &e))?
                }
                None => None,
            };
            let kept = match (indexes, &key) {
                (Some(indexes), Some(key)) => indexes.load(&path, key),
                _ => None,
            };
            let kept = kept.filter(|digests| {
                let differ = sampled_blocks_differing(file, block_size, old_len, digests);
                if differ > 0 {
                    tracing::warn!(path = %path.display(), differ, "delta: the target no longer matches the index kept for it (written past its node?): reading it");
                    if let Some(indexes) = indexes {
                        indexes.remove(&path);
                    }
                }
                differ == 0
            });
            match kept {
                Some(digests) => {
                    tracing::info!(path = %path.display(), "delta: the index kept from the last delta still holds");
                    send_regions(link, &digests, 0).map_err(|error| failed("send", &error))?;
                    digests
                }
                None => digest_old(link, file, block_size, old_len)
                    .map_err(|error| failed("read", &error))?,
            }
        }
    };
    send_wanted_digests(link, &old_digests)?;
    let check_failed = |error: BuildError| {
        if matches!(error, BuildError::DigestMismatch) {
            if let Some(indexes) = indexes {
                indexes.remove(&path);
            }
        }
        failed("write", &error)
    };
    match old {
        Old::BlockDevice { device, size } => {
            if new_len > size {
                return Err(format!(
                    "couldn't write '{}': the image is {new_len} bytes, the device {size}",
                    path.display()
                ));
            }
            let built = build_in_place(link, &device, block_size, old_len, new_len, &old_digests)
                .map_err(check_failed)?;
            // A block device has no rename to wait for: flushed unless told
            // not to. Unflushed, its write count would still move as the
            // kernel writes back, and no index is kept.
            if storage.durability != Durability::None {
                device.sync_all().map_err(|e| failed("flush", &e))?;
                let whole =
                    device_digests(&device, block_size, new_len, size, &built, &old_digests);
                match whole {
                    Ok(digests) => keep_index(indexes, &path, &device, block_size, size, &digests),
                    Err(error) => {
                        tracing::debug!(%error, path = %path.display(), "no index kept")
                    }
                }
            }
            link.send(&Message::Done {
                digest: built.digest,
            });
            Ok(())
        }
        old => {
            let destination = Destination::open(&path, &Policy::DAEMON, storage)
                .map_err(|error| failed("create", &error))?;
            if !destination.is_atomic() {
                return Err(format!(
                    "couldn't build '{}' beside the old file: the directory takes no new files",
                    path.display()
                ));
            }
            destination
                .file()
                .set_len(new_len)
                .map_err(|e| failed("size", &e))?;
            let old_file = match &old {
                Old::File { file } => Some(file),
                _ => None,
            };
            let built = build_beside(
                link,
                old_file,
                destination.file(),
                block_size,
                old_len,
                new_len,
                &old_digests,
            )
            .map_err(check_failed)?;
            destination
                .commit(Attributes {
                    mode: Some(mode),
                    mtime: None,
                })
                .map_err(|error| failed("commit", &error))?;
            // The key is the installed file's, taken after the rename and the chmod.
            if let Ok(installed) = File::open(&path) {
                keep_index(
                    indexes,
                    &path,
                    &installed,
                    block_size,
                    new_len,
                    &built.blocks,
                );
            }
            link.send(&Message::Done {
                digest: built.digest,
            });
            Ok(())
        }
    }
}

fn open_old(path: &Path) -> io::Result<Old> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Old::Absent),
        Err(error) => return Err(error),
    };
    let kind = metadata.file_type();
    if kind.is_symlink() {
        // Replaced by the new file, as a push replaces it.
        return Ok(Old::Absent);
    }
    if kind.is_file() {
        return Ok(Old::File {
            file: File::open(path)?,
        });
    }
    if kind.is_block_device() {
        let mut device = OpenOptions::new().read(true).write(true).open(path)?;
        let size = device.seek(SeekFrom::End(0))?;
        return Ok(Old::BlockDevice { device, size });
    }
    Err(io::Error::other(
        "not a regular file or a block device: a delta needs one",
    ))
}

/// Reads and digests the old image, a megabyte at a time, sending each
/// region's digest as soon as its blocks are read: the host compares them
/// with its own while the rest is read.
fn digest_old(
    link: &mut Link,
    file: &File,
    block_size: BlockSize,
    len: u64,
) -> io::Result<Vec<BlockDigest>> {
    let mut digests = Vec::with_capacity(block_size.blocks_in(len) as usize);
    let mut regions_sent = 0u64;
    read_blocks(file, block_size, 0, len, |block| {
        digests.push(BlockDigest::of(block));
        // Every 64 regions (64 MiB of 4 KiB blocks): the host sees the
        // index grow while the rest is read.
        if (digests.len() as u64).is_multiple_of(REGION_BLOCKS * 64) {
            regions_sent = send_regions(link, &digests, regions_sent)?;
        }
        Ok(())
    })?;
    send_regions(link, &digests, regions_sent)?;
    Ok(digests)
}

/// Blocks read to confirm a kept index: spread over the whole target from
/// a phase that changes every time. A target rewritten behind its node
/// (the whole disk written over a partition, a loop device's backing file)
/// differs in most blocks and cannot pass; unchanged, it costs a few
/// milliseconds of reads.
const INDEX_SAMPLES: u64 = 256;

/// How many of [`INDEX_SAMPLES`] blocks of `file` no longer have the
/// digest `index` gives them (a read error counts as one).
fn sampled_blocks_differing(
    file: &File,
    block_size: BlockSize,
    len: u64,
    index: &[BlockDigest],
) -> usize {
    let blocks = index.len() as u64;
    if blocks == 0 {
        return 0;
    }
    let step = blocks.div_ceil(INDEX_SAMPLES);
    let phase = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| u64::from(t.subsec_nanos()))
        % step;
    let mut buffer = vec![0u8; block_size.bytes() as usize];
    (phase..blocks)
        .step_by(step as usize)
        .filter(|&block| {
            let bytes = &mut buffer[..block_size.len_of(block, len)];
            file.read_exact_at(bytes, block_size.offset_of(block))
                .is_err()
                || BlockDigest::of(bytes) != index[block as usize]
        })
        .count()
}

/// REGIONS messages for the regions from `first` that `digests` covers
/// (a last partial region only once every block is in); returns how many
/// regions have been sent.
fn send_regions(link: &mut Link, digests: &[BlockDigest], first: u64) -> io::Result<u64> {
    let regions: Vec<BlockDigest> = digests
        .chunks(REGION_BLOCKS as usize)
        .skip(first as usize)
        .map(region_digest)
        .collect();
    let mut sent = first;
    for batch in regions.chunks(DIGESTS_PER_MESSAGE) {
        if !link.send(&Message::Regions {
            start: sent,
            digests: batch.to_vec(),
        }) {
            return Err(io::Error::other("the host closed the stream"));
        }
        sent += batch.len() as u64;
    }
    Ok(sent)
}

/// Answers the host's WANTs: the block digests of the old regions it
/// asked for, in its order, until its last WANT.
fn send_wanted_digests(link: &mut Link, old: &[BlockDigest]) -> Result<(), String> {
    let regions = regions_in(old.len() as u64);
    loop {
        let Message::Want { runs, last } = link.receive()? else {
            return Err("the host sent something else than WANT after the regions".into());
        };
        for (first, count) in runs {
            if count == 0 || first.checked_add(count).is_none_or(|end| end > regions) {
                return Err(format!(
                    "the host wants {count} regions from {first}; the old image has {regions}"
                ));
            }
            let start = (first * REGION_BLOCKS) as usize;
            let end = ((first + count) * REGION_BLOCKS).min(old.len() as u64) as usize;
            for (k, batch) in old[start..end].chunks(DIGESTS_PER_MESSAGE).enumerate() {
                if !link.send(&Message::Digests {
                    start: (start + k * DIGESTS_PER_MESSAGE) as u64,
                    digests: batch.to_vec(),
                }) {
                    return Err("the host closed the stream".into());
                }
            }
        }
        if last {
            return Ok(());
        }
    }
}

/// Reads `file` from block `first` to byte `len`, a megabyte at a time,
/// handing each block (the last maybe short) to `each`.
fn read_blocks(
    file: &File,
    block_size: BlockSize,
    first: u64,
    len: u64,
    mut each: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let bs = block_size.bytes() as usize;
    let mut buffer = vec![0u8; READ_CHUNK.max(bs)];
    let mut offset = block_size.offset_of(first);
    while offset < len {
        let n = (len - offset).min(buffer.len() as u64) as usize;
        file.read_exact_at(&mut buffer[..n], offset)?;
        for block in buffer[..n].chunks(bs) {
            each(block)?;
        }
        offset += n as u64;
    }
    Ok(())
}

/// A file as a store of blocks.
struct FileStore<'a> {
    file: &'a File,
    /// A fresh file reads as zeros already: Zero operations leave holes.
    fresh: bool,
}

impl BlockStore for FileStore<'_> {
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_all_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    fn as_file(&self) -> Option<&File> {
        Some(self.file)
    }

    /// `copy_file_range`: the kernel copies (or, on btrfs and xfs, shares
    /// the blocks), and the bytes never enter this process.
    fn copy_range_from(
        &mut self,
        source: &dyn BlockStore,
        from: u64,
        to: u64,
        len: u64,
    ) -> io::Result<bool> {
        let Some(source) = source.as_file() else {
            return Ok(false);
        };
        let (mut from, mut to, mut left) = (from, to, len);
        while left > 0 {
            let chunk = left.min(1 << 30) as usize;
            match rustix::fs::copy_file_range(
                source,
                Some(&mut from),
                self.file,
                Some(&mut to),
                chunk,
            ) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                Ok(n) => left -= n as u64,
                // Not between these two: the caller copies through memory.
                Err(error)
                    if left == len
                        && matches!(
                            error,
                            rustix::io::Errno::XDEV
                                | rustix::io::Errno::INVAL
                                | rustix::io::Errno::NOSYS
                                | rustix::io::Errno::OPNOTSUPP
                        ) =>
                {
                    return Ok(false)
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(true)
    }

    fn write_zeros_at(&mut self, offset: u64, len: u64) -> io::Result<()> {
        if self.fresh {
            return Ok(());
        }
        write_zeros(self, offset, len)
    }
}

/// An old image that is not there: nothing to read.
struct NoOldImage;

impl BlockStore for NoOldImage {
    fn read_exact_at(&mut self, _offset: u64, _buf: &mut [u8]) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::UnexpectedEof))
    }

    fn write_all_at(&mut self, _offset: u64, _data: &[u8]) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::PermissionDenied))
    }
}

#[derive(Debug, thiserror::Error)]
enum BuildError {
    #[error("{0}")]
    Apply(#[from] oxadb_delta::ApplyError),
    #[error("{0}")]
    Composition(#[from] oxadb_delta::CompositionError),
    #[error("{0}")]
    Protocol(String),
    #[error("the image built differs from the host's (its digest does not match): not installed")]
    DigestMismatch,
}

/// Applies operations as they come into `new`, a fresh file of the new
/// length, reading copies from `old`; returns what was built once its
/// digest matches the host's.
fn build_beside(
    link: &mut Link,
    old: Option<&File>,
    new: &File,
    block_size: BlockSize,
    old_len: u64,
    new_len: u64,
    old_digests: &[BlockDigest],
) -> Result<Built, BuildError> {
    let mut new_store = FileStore {
        file: new,
        fresh: true,
    };
    let mut old_file_store;
    let mut no_old = NoOldImage;
    let old_store: &mut dyn BlockStore = match old {
        Some(file) => {
            old_file_store = FileStore { file, fresh: false };
            &mut old_file_store
        }
        None => &mut no_old,
    };
    let mut checked_old = CheckedReads {
        store: old_store,
        block_size,
        old_len,
        old: old_digests,
    };
    let mut built = Composition::beside(block_size, new_len);
    loop {
        match link.receive().map_err(BuildError::Protocol)? {
            Message::Op(op) => {
                // An XOR's result is what the composition hashes.
                let op = resolve_xor(&mut checked_old, block_size, old_len, new_len, &op)?;
                apply_beside_op(
                    &mut checked_old,
                    &mut new_store,
                    block_size,
                    old_len,
                    new_len,
                    &op,
                )?;
                built.record(&op, old_digests)?;
            }
            Message::End { digest } => return finish(built, digest),
            other => return Err(unexpected(&other)),
        }
    }
}

/// Applies operations in place on a block device: copies are gathered until
/// the first zero or new data, applied in a safe order, then the rest as
/// it comes.
fn build_in_place(
    link: &mut Link,
    device: &File,
    block_size: BlockSize,
    old_len: u64,
    new_len: u64,
    old_digests: &[BlockDigest],
) -> Result<Built, BuildError> {
    let mut device_store = FileStore {
        file: device,
        fresh: false,
    };
    let mut store = CheckedReads {
        store: &mut device_store,
        block_size,
        old_len,
        old: old_digests,
    };
    let mut built = Composition::in_place(block_size, new_len, old_len, old_digests);
    let mut copies: Option<Vec<Op>> = Some(Vec::new());
    loop {
        let (op, end) = match link.receive().map_err(BuildError::Protocol)? {
            Message::Op(op) => (Some(op), None),
            Message::End { digest } => (None, Some(digest)),
            other => return Err(unexpected(&other)),
        };
        let is_copy = matches!(op, Some(Op::Copy { .. }));
        if let (Some(pending), false) = (&copies, is_copy) {
            apply_copies_in_place(&mut store, block_size, old_len, new_len, pending)?;
            for copy in pending {
                built.record(copy, old_digests)?;
            }
            copies = None;
        }
        match (op, &mut copies, end) {
            (Some(op @ Op::Copy { .. }), Some(pending), _) => pending.push(op),
            (Some(op), _, _) => {
                let op = resolve_xor(&mut store, block_size, old_len, new_len, &op)?;
                apply_write(&mut store, block_size, old_len, new_len, &op)?;
                built.record(&op, old_digests)?;
            }
            (None, _, Some(digest)) => return finish(built, digest),
            (None, _, None) => unreachable!("an operation or END"),
        }
    }
}

fn unexpected(message: &Message) -> BuildError {
    BuildError::Protocol(format!(
        "the host sent {} among the operations",
        message.name()
    ))
}

/// What a delta built: the image's digest and its blocks' (for the index).
struct Built {
    digest: [u8; 32],
    blocks: Vec<BlockDigest>,
}

/// The digest of what was built, from the digests of the blocks written
/// and kept (docs/delta.md, "The end check"), against the host's.
fn finish(built: Composition, expected: [u8; 32]) -> Result<Built, BuildError> {
    let (blocks, digest) = built.finish()?;
    if digest != expected {
        return Err(BuildError::DigestMismatch);
    }
    Ok(Built { digest, blocks })
}

/// The digests of a whole block device after an image of `new_len` bytes
/// was written over its start: the image's blocks, the old digests of the
/// blocks past it, and, when the image ends inside a block, that block
/// read again (it holds the image's end and the old bytes after it).
fn device_digests(
    device: &File,
    block_size: BlockSize,
    new_len: u64,
    size: u64,
    built: &Built,
    old: &[BlockDigest],
) -> io::Result<Vec<BlockDigest>> {
    let mut digests = built.blocks.clone();
    if !new_len.is_multiple_of(u64::from(block_size.bytes())) {
        let last = digests.len() as u64 - 1;
        let mut block = vec![0u8; block_size.len_of(last, size)];
        device.read_exact_at(&mut block, block_size.offset_of(last))?;
        digests[last as usize] = BlockDigest::of(&block);
    }
    let device_blocks = block_size.blocks_in(size) as usize;
    digests.extend_from_slice(&old[digests.len().min(old.len())..device_blocks.min(old.len())]);
    if digests.len() != device_blocks {
        return Err(io::Error::other("the old digests do not cover the device"));
    }
    Ok(digests)
}

/// Keeps `digests`, the blocks of what `file` now holds, for the next delta.
fn keep_index(
    indexes: Option<&IndexStore>,
    path: &Path,
    file: &File,
    block_size: BlockSize,
    size: u64,
    digests: &[BlockDigest],
) {
    let Some(indexes) = indexes else { return };
    let saved = IndexKey::of(file, block_size, size).and_then(|key| match key {
        Some(key) => indexes.save(path, &key, digests),
        None => Ok(()),
    });
    if let Err(error) = saved {
        tracing::warn!(%error, path = %path.display(), "could not keep the delta index");
    }
}
