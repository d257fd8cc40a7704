//! The sending half: a file read (and compressed if asked) into batches of
//! complete `DATA` frames, each batch one buffer that the async side writes
//! as it is.

use std::fs::File;
use std::io::{self, IoSliceMut, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use oxadb_wire::compression::Encoder;
use oxadb_wire::sync::{self as wire, Compression, HEADER_LEN, SYNC_DATA_MAX};
use oxadb_wire::{FileRange, Part, Payload, RangeCounters};

use crate::send_file::SendFile;

/// A `DATA` frame at full size: header and payload.
const FRAME_LEN: usize = HEADER_LEN + SYNC_DATA_MAX;

/// A file to send, with its length: read into frames ([`send_frames`]) or
/// framed as file ranges for `sendfile` ([`Source::into_ranges`]).
#[derive(Debug)]
pub struct Source {
    file: File,
    len: u64,
    /// The local path, for errors about the file (see [`Source::named`]).
    name: Option<String>,
}

impl Source {
    pub fn open(path: &Path) -> io::Result<Source> {
        Ok(Source::new(File::open(path)?)?.named(path))
    }

    pub fn new(file: File) -> io::Result<Source> {
        let len = file.metadata()?.len();
        Ok(Source {
            file,
            len,
            name: None,
        })
    }

    /// Names the source as `path` in errors raised while it is sent (a file
    /// that shrinks under its ranges).
    pub fn named(mut self, path: &Path) -> Source {
        self.name = Some(path.display().to_string());
        self
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// The length when opened (a file that grows or shrinks meanwhile is sent
    /// as read: `DATA` frames until end of file, as adb and adbd do).
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn into_file(self) -> File {
        self.file
    }

    /// Whether this source can go as file ranges ([`Source::into_ranges`]):
    /// a regular file with a length, not on procfs/sysfs-like filesystems,
    /// whose sizes are not what a read returns (0 for /proc, 4096 for sysfs).
    pub fn ranges_possible(&self) -> bool {
        let Ok(md) = self.file.metadata() else {
            return false;
        };
        md.file_type().is_file() && self.len > 0 && !crate::fd_on_kernel_interface_fs(&self.file)
    }

    /// The file as payloads of uncompressed `DATA` frames,
    /// `framing.frames_per_batch` frames each.
    /// What happens to the ranges is counted in `counters`.
    pub fn into_ranges(self, framing: &Framing, counters: Arc<RangeCounters>) -> FrameRanges {
        FrameRanges {
            file: SendFile::named(self.file, self.name, counters),
            offset: 0,
            end: self.len,
            frames_per_batch: framing.frames_per_batch,
        }
    }
}

/// What `OXADB_ZERO_COPY` asks for: `Some(false)` for `0`, `Some(true)` for
/// any other value, `None` when unset or empty. Each binary reads it once,
/// while resolving its settings, under its own flags and over its own
/// default (the host's pushes: on; the daemon's pulls: off). A push by
/// `sendfile` skips the sender's copy (1.2 times the copying push on
/// loopback); a pull by `sendfile` costs the host's receiving end more than
/// it saves the daemon (docs/benchmarks.md, "Zero-copy sends").
pub fn zero_copy_from_env() -> Option<bool> {
    zero_copy_asked(std::env::var_os(ZERO_COPY_ENV).as_deref())
}

/// [`zero_copy_from_env`] for the variable's value.
fn zero_copy_asked(value: Option<&std::ffi::OsStr>) -> Option<bool> {
    value.filter(|v| !v.is_empty()).map(|v| v != "0")
}

/// The environment variable that turns the zero-copy path on (any value but
/// `0`) or off (`0`).
pub const ZERO_COPY_ENV: &str = "OXADB_ZERO_COPY";

/// Cuts a file into the same full-size `DATA` frames as [`send_frames`]
/// sends uncompressed, as payloads of frame headers in memory and file ranges
/// that the connection's writer hands to `sendfile`: `frames_per_batch`
/// frames per payload. Like the reading path it goes on while the file grows
/// (checked with `fstat` when the length known so far is reached).
#[derive(Debug)]
pub struct FrameRanges {
    file: Arc<SendFile>,
    offset: u64,
    end: u64,
    frames_per_batch: usize,
}

impl FrameRanges {
    pub fn file(&self) -> &Arc<SendFile> {
        &self.file
    }
}

impl Iterator for FrameRanges {
    type Item = io::Result<Payload>;

    fn next(&mut self) -> Option<io::Result<Payload>> {
        if self.offset >= self.end {
            match self.file.file().metadata() {
                Ok(md) if md.len() > self.end => self.end = md.len(),
                Ok(_) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
        let left = self.end - self.offset;
        let frames = left
            .div_ceil(SYNC_DATA_MAX as u64)
            .min(self.frames_per_batch as u64) as usize;
        let mut headers = BytesMut::with_capacity(frames * HEADER_LEN);
        let mut lens = Vec::with_capacity(frames);
        let mut rest = left;
        for _ in 0..frames {
            let len = rest.min(SYNC_DATA_MAX as u64) as usize;
            headers.extend_from_slice(&wire::encode_data_header(len));
            lens.push(len);
            rest -= len as u64;
        }
        let mut headers = headers.freeze();
        let mut payload = Payload::default();
        for len in lens {
            payload.push(Part::Bytes(headers.split_to(HEADER_LEN)));
            payload.push(Part::File(FileRange {
                source: self.file.clone(),
                offset: self.offset,
                len,
            }));
            self.offset += len as u64;
        }
        Some(Ok(payload))
    }
}

/// How a role batches its frames; only the sizes of the writes differ, never
/// the frames (full-size `DATA` frames, the last one short).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// Full frames per batch of plain data.
    pub frames_per_batch: usize,
    /// Full frames per batch of compressed data.
    pub compressed_frames_per_batch: usize,
    /// File bytes read at once when compressing.
    pub compress_input: usize,
    /// Batches queued ahead of the stream (and so the buffers worth keeping).
    pub queue_depth: usize,
}

impl Framing {
    /// The daemon's pulls: 15 frames of 64 KiB + 8 fit in one 1 MiB WRTE
    /// payload (`MAX_PAYLOAD`), so a plain batch is exactly one packet; a
    /// compressed frame goes out as soon as it is full.
    pub const DAEMON: Framing = Framing {
        frames_per_batch: 15,
        compressed_frames_per_batch: 1,
        compress_input: 256 * 1024,
        queue_depth: 4,
    };

    /// The host's pushes: 1 MiB of payload per batch either way.
    pub const HOST: Framing = Framing {
        frames_per_batch: 16,
        compressed_frames_per_batch: 16,
        compress_input: 1024 * 1024,
        queue_depth: 4,
    };
}

/// Why sending a file stopped early.
#[derive(Debug)]
pub enum SendError {
    Read(io::Error),
    Compress(io::Error),
    /// The async side stopped taking batches; it knows why.
    Stopped,
}

/// Batch buffers reused once the async side has written them (the clone kept
/// here is then the only reference): the file is read into memory that is
/// neither freshly mapped nor zeroed again, one pass over memory less per byte.
#[derive(Debug)]
pub struct BufferPool {
    sent: Vec<Bytes>,
    keep: usize,
}

impl BufferPool {
    /// Keeps up to `keep` buffers: the queue, the stream's send buffer and a few in flight.
    pub fn new(keep: usize) -> BufferPool {
        BufferPool {
            sent: Vec::new(),
            keep,
        }
    }

    /// A buffer of `len` bytes (contents unspecified).
    pub fn take(&mut self, len: usize) -> BytesMut {
        while let Some(i) = self.sent.iter().position(Bytes::is_unique) {
            if let Ok(mut buffer) = self.sent.swap_remove(i).try_into_mut() {
                buffer.resize(len, 0);
                return buffer;
            }
        }
        BytesMut::zeroed(len)
    }

    /// Remembers a buffer handed out, to take it back once it is unique.
    pub fn keep(&mut self, sent: &Bytes) {
        if self.sent.len() < self.keep {
            self.sent.push(sent.clone());
        }
    }
}

/// The file thread's end of the batch queue.
struct Batches<F> {
    sink: F,
    pool: BufferPool,
    stopped: bool,
}

impl<F: FnMut(Bytes) -> bool> Batches<F> {
    fn send(&mut self, batch: BytesMut) -> io::Result<()> {
        let batch = batch.freeze();
        self.pool.keep(&batch);
        if !(self.sink)(batch) {
            self.stopped = true;
            return Err(io::Error::from(io::ErrorKind::BrokenPipe));
        }
        Ok(())
    }
}

/// Reads `file` to its end and hands ready-made `DATA` frames (compressed as
/// `compression` says) to `batches`, a batch at a time, until it returns
/// false (the stream side stopped taking them); `read` counts the file bytes
/// read. Runs on a blocking thread; `Err(Stopped)` when the sink stopped.
pub fn send_frames(
    file: &File,
    compression: Compression,
    framing: &Framing,
    batches: impl FnMut(Bytes) -> bool,
    read: &AtomicU64,
) -> Result<(), SendError> {
    let batches = Batches {
        sink: batches,
        pool: BufferPool::new(framing.queue_depth + 4),
        stopped: false,
    };
    if compression == Compression::None {
        send_plain(file, framing, batches, read)
    } else {
        send_compressed(file, compression, framing, batches, read)
    }
}

/// Uncompressed: each `readv` fills the payload slots of a batch's frames in
/// place, so the data is copied once from the page cache and never again.
fn send_plain<F: FnMut(Bytes) -> bool>(
    mut file: &File,
    framing: &Framing,
    mut batches: Batches<F>,
    read: &AtomicU64,
) -> Result<(), SendError> {
    loop {
        let mut batch = batches.pool.take(framing.frames_per_batch * FRAME_LEN);
        let (filled, at_end) = read_into_frames(&mut file, &mut batch).map_err(SendError::Read)?;
        read.fetch_add(filled as u64, Ordering::Relaxed);
        if !batch.is_empty() && batches.send(batch).is_err() {
            return Err(SendError::Stopped);
        }
        if at_end {
            return Ok(());
        }
    }
}

/// Fills the payload slots of `batch` (whole frames) until it is full or the
/// file ends, so every frame but the file's last is full-size; writes the
/// headers of the frames it filled and truncates `batch` after the last one.
/// Returns the payload bytes read and whether the file ended.
fn read_into_frames(file: &mut &File, batch: &mut BytesMut) -> io::Result<(usize, bool)> {
    let capacity = batch.len() / FRAME_LEN * SYNC_DATA_MAX;
    let mut filled = 0;
    let mut at_end = false;
    while filled < capacity {
        let (first, offset) = (filled / SYNC_DATA_MAX, filled % SYNC_DATA_MAX);
        let mut slots: Vec<IoSliceMut<'_>> = batch
            .chunks_mut(FRAME_LEN)
            .skip(first)
            .enumerate()
            .map(|(i, frame)| {
                let start = HEADER_LEN + if i == 0 { offset } else { 0 };
                IoSliceMut::new(&mut frame[start..])
            })
            .collect();
        match file.read_vectored(&mut slots) {
            Ok(0) => {
                at_end = true;
                break;
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    let mut end = 0;
    let mut left = filled;
    let mut at = 0;
    while left > 0 {
        let len = left.min(SYNC_DATA_MAX);
        batch[at..at + HEADER_LEN].copy_from_slice(&wire::encode_data_header(len));
        end = at + HEADER_LEN + len;
        left -= len;
        at += FRAME_LEN;
    }
    batch.truncate(end);
    Ok((filled, at_end))
}

/// Compressed: the encoder's output is cut into full-size frames by [`FrameSink`].
fn send_compressed<F: FnMut(Bytes) -> bool>(
    mut file: &File,
    compression: Compression,
    framing: &Framing,
    batches: Batches<F>,
    read: &AtomicU64,
) -> Result<(), SendError> {
    let sink = FrameSink::new(batches, framing.compressed_frames_per_batch);
    // The encoders are adb's and adbd's (see `oxadb_wire::compression`).
    let mut encoder = Encoder::new(compression, sink).map_err(SendError::Compress)?;
    let mut input = vec![0u8; framing.compress_input];
    let classify = |error: io::Error, sink: &FrameSink<F>| {
        if sink.batches.stopped {
            SendError::Stopped
        } else {
            SendError::Compress(error)
        }
    };
    loop {
        let n = match file.read(&mut input) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(SendError::Read(e)),
        };
        read.fetch_add(n as u64, Ordering::Relaxed);
        if let Err(e) = encoder.write_all(&input[..n]) {
            return Err(classify(e, encoder.get_ref()));
        }
    }
    let sink = encoder.finish().map_err(SendError::Compress)?;
    // Brotli's finish cannot report that the sink stopped; the sink knows.
    if sink.batches.stopped {
        return Err(SendError::Stopped);
    }
    sink.finish().map_err(|_| SendError::Stopped)
}

/// Cuts a byte stream into full-size `DATA` frames, sent in batches.
struct FrameSink<F> {
    batches: Batches<F>,
    capacity: usize,
    batch: BytesMut,
    /// Offset of the header of the frame being filled.
    open_frame: Option<usize>,
}

impl<F: FnMut(Bytes) -> bool> FrameSink<F> {
    fn new(mut batches: Batches<F>, frames_per_batch: usize) -> FrameSink<F> {
        let capacity = frames_per_batch * FRAME_LEN;
        let batch = Self::empty_batch(&mut batches, capacity);
        FrameSink {
            batches,
            capacity,
            batch,
            open_frame: None,
        }
    }

    fn empty_batch(batches: &mut Batches<F>, capacity: usize) -> BytesMut {
        let mut batch = batches.pool.take(capacity);
        batch.clear();
        batch
    }

    fn close_frame(&mut self) {
        if let Some(start) = self.open_frame.take() {
            let len = self.batch.len() - start - HEADER_LEN;
            self.batch[start..start + HEADER_LEN].copy_from_slice(&wire::encode_data_header(len));
        }
    }

    fn send_batch(&mut self) -> io::Result<()> {
        self.close_frame();
        if self.batch.is_empty() {
            return Ok(());
        }
        let next = Self::empty_batch(&mut self.batches, self.capacity);
        let full = std::mem::replace(&mut self.batch, next);
        self.batches.send(full)
    }

    fn finish(mut self) -> io::Result<()> {
        self.send_batch()
    }
}

impl<F: FnMut(Bytes) -> bool> Write for FrameSink<F> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.batches.stopped {
            return Err(io::Error::from(io::ErrorKind::BrokenPipe));
        }
        let mut rest = data;
        while !rest.is_empty() {
            let start = match self.open_frame {
                Some(start) => start,
                None => {
                    let start = self.batch.len();
                    self.batch.extend_from_slice(&[0u8; HEADER_LEN]);
                    self.open_frame = Some(start);
                    start
                }
            };
            let used = self.batch.len() - start - HEADER_LEN;
            let take = (SYNC_DATA_MAX - used).min(rest.len());
            self.batch.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if used + take == SYNC_DATA_MAX {
                self.close_frame();
                if self.batch.len() + FRAME_LEN > self.capacity {
                    self.send_batch()?;
                }
            }
        }
        Ok(data.len())
    }

    /// Frames go out when full or at the end; an encoder's flush need not cut one short.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff;
    use crate::sink::{receive, Chunk, ChunkReader};
    use crate::testdata::{read_ranges, sample};
    use oxadb_wire::sync::SyncHeader;

    /// Splits batches into frames and returns the payloads.
    fn payloads(batches: &[Bytes]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for batch in batches {
            let mut at = 0;
            while at < batch.len() {
                let header = SyncHeader::parse(&batch[at..]).unwrap();
                assert_eq!(header.id, wire::ID_DATA);
                let len = header.data_len().unwrap();
                out.push(batch[at + HEADER_LEN..at + HEADER_LEN + len].to_vec());
                at += HEADER_LEN + len;
            }
            assert_eq!(at, batch.len());
        }
        out
    }

    /// Sends `data` through `send_frames`; returns the batches.
    fn send_all(data: &[u8], compression: Compression, framing: Framing) -> Vec<Bytes> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, data).unwrap();
        let source = Source::open(&path).unwrap();
        assert_eq!(source.len(), data.len() as u64);
        let mut batches = Vec::new();
        let read = AtomicU64::new(0);
        send_frames(
            source.file(),
            compression,
            &framing,
            |batch| {
                batches.push(batch);
                true
            },
            &read,
        )
        .unwrap();
        assert_eq!(read.load(Ordering::Relaxed), data.len() as u64);
        batches
    }

    #[test]
    fn plain_frames_are_full_size() {
        for framing in [Framing::DAEMON, Framing::HOST] {
            let data = sample(3 * SYNC_DATA_MAX * framing.frames_per_batch / 2 + 77);
            let batches = send_all(&data, Compression::None, framing);
            assert!(batches
                .iter()
                .all(|b| b.len() <= framing.frames_per_batch * FRAME_LEN));
            let frames = payloads(&batches);
            assert!(frames[..frames.len() - 1]
                .iter()
                .all(|f| f.len() == SYNC_DATA_MAX));
            assert_eq!(frames.concat(), data);
            assert!(send_all(b"", Compression::None, framing).is_empty());
            // A file of whole frames ends without an empty frame.
            let whole = sample(2 * SYNC_DATA_MAX);
            let frames = payloads(&send_all(&whole, Compression::None, framing));
            assert_eq!(frames.len(), 2);
        }
    }

    #[test]
    fn daemon_plain_batch_is_one_packet() {
        // 15 frames fit in one 1 MiB WRTE payload; 16 would not.
        const { assert!(Framing::DAEMON.frames_per_batch * FRAME_LEN <= 1024 * 1024) };
        const { assert!((Framing::DAEMON.frames_per_batch + 1) * FRAME_LEN > 1024 * 1024) };
    }

    #[test]
    fn compressed_frames_decode_back() {
        let data = sample(5 * SYNC_DATA_MAX + 3);
        for framing in [Framing::DAEMON, Framing::HOST] {
            for compression in [Compression::Brotli, Compression::Lz4, Compression::Zstd] {
                let batches = send_all(&data, compression, framing);
                let frames = payloads(&batches);
                assert!(frames
                    .iter()
                    .all(|f| !f.is_empty() && f.len() <= SYNC_DATA_MAX));
                assert!(frames[..frames.len() - 1]
                    .iter()
                    .all(|f| f.len() == SYNC_DATA_MAX));
                let stream = frames.concat();
                assert!(stream.len() < data.len(), "{compression:?} compresses");

                // Decode through the receiving half, a few bytes at a time.
                let (mut sender, queue) = handoff::channel(4);
                let feeder = std::thread::spawn(move || {
                    for piece in stream.chunks(1000) {
                        sender
                            .blocking_send(Chunk::Data(Bytes::copy_from_slice(piece)))
                            .unwrap();
                    }
                    sender.blocking_send(Chunk::Done { mtime: 0 }).unwrap();
                });
                let mut out = Vec::new();
                let written = AtomicU64::new(0);
                receive(
                    &mut ChunkReader::new(queue),
                    compression,
                    &mut out,
                    &written,
                )
                .unwrap();
                feeder.join().unwrap();
                assert_eq!(out, data);
                assert_eq!(written.load(Ordering::Relaxed), data.len() as u64);

                // Empty files still make a (short) compressed stream.
                let empty = send_all(b"", compression, framing);
                assert!(!payloads(&empty).concat().is_empty());
            }
        }
    }

    #[test]
    fn a_stopped_receiver_stops_the_sender() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, sample(40 * SYNC_DATA_MAX)).unwrap();
        for compression in [Compression::None, Compression::Zstd] {
            let file = File::open(&path).unwrap();
            // The stream side takes nothing.
            let result = send_frames(
                &file,
                compression,
                &Framing::HOST,
                |_| false,
                &AtomicU64::new(0),
            );
            assert!(matches!(result, Err(SendError::Stopped)), "{result:?}");
        }
    }

    /// Edge sizes for the zero-copy path: nothing, a byte, a frame, a frame
    /// and a byte, a WRTE's worth and a byte.
    const EDGE_SIZES: [usize; 7] = [
        0,
        1,
        SYNC_DATA_MAX,
        SYNC_DATA_MAX + 1,
        15 * SYNC_DATA_MAX,
        1024 * 1024 + 1,
        3 * 1024 * 1024 + 5,
    ];

    #[test]
    fn file_ranges_frame_exactly_as_the_reading_path() {
        for framing in [Framing::DAEMON, Framing::HOST] {
            for size in EDGE_SIZES {
                let data = sample(size);
                let batches = send_all(&data, Compression::None, framing);
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("f");
                std::fs::write(&path, &data).unwrap();
                let source = Source::open(&path).unwrap();
                assert_eq!(source.ranges_possible(), size > 0);
                let counters = Arc::new(RangeCounters::default());
                let payloads: Vec<Bytes> = source
                    .into_ranges(&framing, counters.clone())
                    .map(|p| read_ranges(p.unwrap()))
                    .collect();
                // The same batches (so the same WRTEs), byte for byte.
                assert_eq!(payloads, batches, "{framing:?} size {size}");
                assert_eq!(counters.snapshot(), (1, 0, size as u64, 0));
            }
        }
    }

    #[test]
    fn file_ranges_follow_a_growing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, sample(100)).unwrap();
        let mut ranges = Source::open(&path)
            .unwrap()
            .into_ranges(&Framing::HOST, Arc::default());
        let first = ranges.next().unwrap().unwrap();
        assert_eq!(first.len(), HEADER_LEN + 100);
        let mut more = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        more.write_all(&sample(50)).unwrap();
        let second = read_ranges(ranges.next().unwrap().unwrap());
        assert_eq!(&second[HEADER_LEN..], &sample(50)[..]);
        assert!(ranges.next().is_none());
    }

    #[test]
    fn only_plain_regular_files_go_as_ranges() {
        // procfs sizes are not what a read returns (0 here).
        let proc_file = Source::open(Path::new("/proc/self/status")).unwrap();
        assert!(!proc_file.ranges_possible());
        let (reader, _writer) = rustix::pipe::pipe().unwrap();
        let pipe = Source::new(File::from(reader)).unwrap();
        assert!(!pipe.ranges_possible());
    }

    #[test]
    fn the_environment_turns_zero_copy_off_with_0_and_on_with_anything_else() {
        use std::ffi::OsStr;
        assert_eq!(zero_copy_asked(None), None);
        assert_eq!(zero_copy_asked(Some(OsStr::new(""))), None);
        assert_eq!(zero_copy_asked(Some(OsStr::new("0"))), Some(false));
        assert_eq!(zero_copy_asked(Some(OsStr::new("1"))), Some(true));
        assert_eq!(zero_copy_asked(Some(OsStr::new("yes"))), Some(true));
    }
}
