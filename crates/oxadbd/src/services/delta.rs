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
    apply_beside_op, apply_copies_in_place, apply_write, region_digest, resolve_xor, write_zeros,
    BlockDigest, BlockSize, BlockStore, CheckedReads, Composition, Op, REGION_BLOCKS,
};
use oxadb_transfer::{Attributes, Destination, Durability, Policy, Storage};

use super::delta_copy::{kernel_copy, BackgroundCopy};
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

    /// The host's next message if one has arrived.
    fn try_receive(&mut self) -> Result<Option<Message>, String> {
        match self.from_host.try_recv() {
            Ok(Message::Fail { message }) => Err(format!("the host gave up: {message}")),
            Ok(message) => Ok(Some(message)),
            Err(mpsc::error::TryRecvError::Empty) => Ok(None),
            Err(mpsc::error::TryRecvError::Disconnected) => {
                Err("the host closed the stream".into())
            }
        }
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
    let check_failed = |error: BuildError| {
        if matches!(error, BuildError::DigestMismatch) {
            if let Some(indexes) = indexes {
                indexes.remove(&path);
            }
        }
        failed("write", &error)
    };
    // The build starts before the old image is read: the host may send
    // new data while the device still reads (docs/delta.md, "Protocol").
    let destination = match &old {
        Old::BlockDevice { size, .. } => {
            if new_len > *size {
                return Err(format!(
                    "couldn't write '{}': the image is {new_len} bytes, the device {size}",
                    path.display()
                ));
            }
            None
        }
        _ => {
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
            Some(destination)
        }
    };
    let mut build = match (&old, &destination) {
        (Old::BlockDevice { device, .. }, _) => {
            Builder::in_place(device, block_size, old_len, new_len)
        }
        (Old::File { file }, Some(destination)) => {
            Builder::beside(Some(file), destination.file(), block_size, old_len, new_len)
        }
        (_, Some(destination)) => {
            Builder::beside(None, destination.file(), block_size, old_len, new_len)
        }
        (_, None) => unreachable!("a destination beside unless a block device"),
    };
    let old_file = match &old {
        Old::Absent => None,
        Old::File { file } => Some(file),
        Old::BlockDevice { device, .. } => Some(device),
    };
    let mut exchange = Exchange::default();
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
                    exchange.regions_sent =
                        send_regions(link, &digests, 0).map_err(|error| failed("send", &error))?;
                    digests
                }
                None => digest_old(link, file, block_size, old_len, &mut exchange, &mut build)
                    .map_err(|error| failed("read", &error))?,
            }
        }
    };
    let built = loop {
        match link.receive()? {
            Message::Want { runs, last } => exchange.want(link, &old_digests, runs, last)?,
            Message::Op(op) => build.apply(op, &old_digests, true).map_err(check_failed)?,
            Message::End { digest } if exchange.wants_done => {
                break build.finish(digest, &old_digests).map_err(check_failed)?
            }
            other => {
                return Err(check_failed(BuildError::Protocol(format!(
                    "the host sent {} {}",
                    other.name(),
                    if exchange.wants_done {
                        "among the operations"
                    } else {
                        "before its last WANT"
                    }
                ))))
            }
        }
    };
    match (old, destination) {
        (Old::BlockDevice { device, size }, _) => {
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
        }
        (_, Some(destination)) => {
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
        }
        (_, None) => unreachable!("a destination beside unless a block device"),
    }
    link.send(&Message::Done {
        digest: built.digest,
    });
    Ok(())
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
/// with its own while the rest is read, asks for block digests and sends
/// the new data it can already, which `build` takes between regions.
fn digest_old(
    link: &mut Link,
    file: &File,
    block_size: BlockSize,
    len: u64,
    exchange: &mut Exchange,
    build: &mut Builder,
) -> Result<Vec<BlockDigest>, String> {
    let blocks = block_size.blocks_in(len);
    let mut digests = Vec::with_capacity(blocks as usize);
    let mut failure = None;
    read_blocks(file, block_size, 0, len, |block| {
        digests.push(BlockDigest::of(block));
        if !(digests.len() as u64).is_multiple_of(REGION_BLOCKS) {
            return Ok(());
        }
        // Every 64 regions (64 MiB of 4 KiB blocks): the host sees the
        // index grow while the rest is read.
        if (digests.len() as u64).is_multiple_of(REGION_BLOCKS * 64) {
            exchange.regions_sent = send_regions(link, &digests, exchange.regions_sent)?;
        }
        if digests.len() as u64 == blocks {
            // Read to the end: the index is complete, and the host, which
            // has every region digest, may send copies and END already,
            // which only the loop after the index takes.
            return Ok(());
        }
        if let Err(error) = serve_early(link, exchange, build, &digests) {
            failure = Some(error);
            return Err(io::Error::other("the delta failed"));
        }
        Ok(())
    })
    .map_err(|error| failure.take().unwrap_or_else(|| error.to_string()))?;
    exchange.regions_sent =
        send_regions(link, &digests, exchange.regions_sent).map_err(|error| error.to_string())?;
    Ok(digests)
}

/// What the host has asked for of the index so far.
#[derive(Default)]
struct Exchange {
    regions_sent: u64,
    wants_done: bool,
}

impl Exchange {
    /// Answers a WANT: the block digests of the old regions it names, all
    /// already sent as regions.
    fn want(
        &mut self,
        link: &mut Link,
        old: &[BlockDigest],
        runs: Vec<(u64, u64)>,
        last: bool,
    ) -> Result<(), String> {
        if self.wants_done {
            return Err("the host sent a WANT after its last".into());
        }
        let regions = self.regions_sent;
        for (first, count) in runs {
            if count == 0 || first.checked_add(count).is_none_or(|end| end > regions) {
                return Err(format!(
                    "the host wants {count} regions from {first}; the old image has {regions} so far"
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
        self.wants_done = last;
        Ok(())
    }
}

/// Takes what the host sent while the old image is still being read:
/// WANTs of regions already sent, and zeros and new data it may write now.
fn serve_early(
    link: &mut Link,
    exchange: &mut Exchange,
    build: &mut Builder,
    digests: &[BlockDigest],
) -> Result<(), String> {
    while let Some(message) = link.try_receive()? {
        match message {
            Message::Want { runs, last } => exchange.want(link, digests, runs, last)?,
            Message::Op(op) => build
                .apply(op, digests, false)
                .map_err(|error| error.to_string())?,
            other => {
                return Err(format!(
                    "the host sent {} before the device's index was complete",
                    other.name()
                ))
            }
        }
    }
    Ok(())
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

    /// In the kernel ([`kernel_copy`]) where it can.
    fn copy_range_from(
        &mut self,
        source: &dyn BlockStore,
        from: u64,
        to: u64,
        len: u64,
    ) -> io::Result<bool> {
        match source.as_file() {
            Some(source) => kernel_copy(source, from, self.file, to, len),
            None => Ok(false),
        }
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
    #[error("{0}")]
    Copy(io::Error),
    #[error("the image built differs from the host's (its digest does not match): not installed")]
    DigestMismatch,
}

/// The new image under construction: a fresh file beside the old one, or
/// the block device itself. Operations come in the order the host sends
/// them; in place, a run of copies is applied (in [`InPlaceSchedule`]'s
/// order) when the first write after it arrives, and a copy may not read a
/// block this delta already wrote.
///
/// [`InPlaceSchedule`]: oxadb_delta::InPlaceSchedule
struct Builder<'a> {
    block_size: BlockSize,
    old_len: u64,
    new_len: u64,
    /// Beside: the old file (none if there was none). In place: none.
    old: Option<&'a File>,
    new: &'a File,
    in_place: bool,
    composition: Composition,
    written: Vec<bool>,
    copies: Vec<Op>,
    /// Beside an old file: its bytes copied into the new one meanwhile.
    background: Option<BackgroundCopy>,
}

impl<'a> Builder<'a> {
    fn beside(
        old: Option<&'a File>,
        new: &'a File,
        block_size: BlockSize,
        old_len: u64,
        new_len: u64,
    ) -> Builder<'a> {
        let mut builder = Builder::new(old, new, false, block_size, old_len, new_len);
        let clones = old.map(|old| (old.try_clone(), new.try_clone()));
        builder.background =
            match clones {
                Some((Ok(old), Ok(new))) if old_len > 0 && new_len > 0 => Some(
                    BackgroundCopy::start(old, new, block_size, old_len.min(new_len)),
                ),
                _ => None,
            };
        builder
    }

    fn in_place(
        device: &'a File,
        block_size: BlockSize,
        old_len: u64,
        new_len: u64,
    ) -> Builder<'a> {
        Builder::new(None, device, true, block_size, old_len, new_len)
    }

    fn new(
        old: Option<&'a File>,
        new: &'a File,
        in_place: bool,
        block_size: BlockSize,
        old_len: u64,
        new_len: u64,
    ) -> Builder<'a> {
        Builder {
            block_size,
            old_len,
            new_len,
            old,
            new,
            in_place,
            composition: Composition::beside(block_size, new_len),
            written: vec![false; block_size.blocks_in(new_len) as usize],
            copies: Vec::new(),
            background: None,
        }
    }

    /// Applies `op`. `old` holds the old image's digests known so far (all
    /// of them once `index_complete`); copies wait for the whole index.
    fn apply(
        &mut self,
        op: Op,
        old: &[BlockDigest],
        index_complete: bool,
    ) -> Result<(), BuildError> {
        let (block_size, old_len, new_len) = (self.block_size, self.old_len, self.new_len);
        if let Op::Copy { from, count, .. } = &op {
            if !index_complete {
                return Err(BuildError::Protocol(
                    "the host sent a COPY before the device's index was complete".into(),
                ));
            }
            if self.in_place {
                oxadb_delta::check(&op, block_size, old_len, new_len)?;
                if let Some(block) = (*from..from + count).find(|&b| self.was_written(b)) {
                    return Err(BuildError::Protocol(format!(
                        "a COPY reads block {block}, which this delta already wrote"
                    )));
                }
                self.copies.push(op);
                return Ok(());
            }
        }
        let mut new_store = FileStore {
            file: self.new,
            fresh: !self.in_place,
        };
        if self.in_place {
            self.apply_copies(old)?;
            if let Op::Xor { start, .. } = &op {
                // An XOR reads its own place, which must still be old.
                let end = start + op.count(block_size);
                if let Some(block) = (*start..end).find(|&b| self.was_written(b)) {
                    return Err(BuildError::Protocol(format!(
                        "an XOR reads block {block}, which this delta already wrote"
                    )));
                }
            }
            let mut checked = CheckedReads {
                store: &mut new_store,
                block_size,
                old_len,
                old,
            };
            let op = resolve_xor(&mut checked, block_size, old_len, new_len, &op)?;
            apply_write(&mut checked, block_size, old_len, new_len, &op)?;
            self.record(&op, old)
        } else {
            let mut old_file_store;
            let mut no_old = NoOldImage;
            let old_store: &mut dyn BlockStore = match self.old {
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
                old,
            };
            // An XOR's result is what the composition hashes.
            let op = resolve_xor(&mut checked_old, block_size, old_len, new_len, &op)?;
            let (start, count) = (op.start(), op.count(block_size));
            match (&self.background, &op) {
                (Some(background), Op::Copy { from, .. })
                    if *from == start && background.covers(start, count) =>
                {
                    oxadb_delta::check(&op, block_size, old_len, new_len)?;
                }
                (background, _) => {
                    if let Some(background) = background {
                        // Old bytes the copy put there are no zeros.
                        new_store.fresh = !background.claim(start, count);
                    }
                    apply_beside_op(
                        &mut checked_old,
                        &mut new_store,
                        block_size,
                        old_len,
                        new_len,
                        &op,
                    )?;
                }
            }
            self.record(&op, old)
        }
    }

    fn was_written(&self, block: u64) -> bool {
        self.written.get(block as usize).copied().unwrap_or(false)
    }

    /// The pending copies, applied in place in a safe order.
    fn apply_copies(&mut self, old: &[BlockDigest]) -> Result<(), BuildError> {
        if self.copies.is_empty() {
            return Ok(());
        }
        let copies = std::mem::take(&mut self.copies);
        let mut device = FileStore {
            file: self.new,
            fresh: false,
        };
        let mut checked = CheckedReads {
            store: &mut device,
            block_size: self.block_size,
            old_len: self.old_len,
            old,
        };
        apply_copies_in_place(
            &mut checked,
            self.block_size,
            self.old_len,
            self.new_len,
            &copies,
        )?;
        for copy in &copies {
            self.record(copy, old)?;
        }
        Ok(())
    }

    fn record(&mut self, op: &Op, old: &[BlockDigest]) -> Result<(), BuildError> {
        self.composition.record(op, old)?;
        let start = op.start() as usize;
        for written in &mut self.written[start..start + op.count(self.block_size) as usize] {
            *written = true;
        }
        Ok(())
    }

    /// The digest of what was built, from the digests of the blocks written
    /// and kept (docs/delta.md, "The end check"), against the host's.
    fn finish(mut self, expected: [u8; 32], old: &[BlockDigest]) -> Result<Built, BuildError> {
        if self.in_place {
            self.apply_copies(old)?;
            // What nothing wrote is the old image's.
            self.composition.keep_old(self.old_len, old);
        }
        if let Some(background) = self.background.take() {
            background.finish().map_err(BuildError::Copy)?;
        }
        let (blocks, digest) = self.composition.finish()?;
        if digest != expected {
            return Err(BuildError::DigestMismatch);
        }
        Ok(Built { digest, blocks })
    }
}

/// What a delta built: the image's digest and its blocks' (for the index).
struct Built {
    digest: [u8; 32],
    blocks: Vec<BlockDigest>,
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
