//! File data on blocking threads: reading a pushed file into ready-to-send
//! `DATA` frames (compressing on the way), and writing or decompressing the
//! `DATA` payloads of a pull into a file. The async side only moves buffers.

use std::fs::File;
use std::io::{self, BufRead, IoSlice, IoSliceMut, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use oxadb_wire::compression::{self, Encoder};
use oxadb_wire::sync::{self as wire, Compression, HEADER_LEN, SYNC_DATA_MAX};
use tokio::sync::mpsc;

/// A `DATA` frame at full size: header and payload.
const FRAME_LEN: usize = HEADER_LEN + SYNC_DATA_MAX;
/// Frames per batch handed to the async side (1 MiB of payload).
const FRAMES_PER_BATCH: usize = 16;
const BATCH_CAPACITY: usize = FRAMES_PER_BATCH * FRAME_LEN;
/// Batches read ahead of the network.
const BATCH_QUEUE_DEPTH: usize = 4;
/// Bytes read at once from a file that is being compressed.
const COMPRESS_INPUT: usize = 1024 * 1024;
/// Pulled pieces written with one `writev` at most.
const MAX_WRITE_PIECES: usize = 64;
const MAX_WRITE_BYTES: usize = 4 * 1024 * 1024;
/// Output buffer of a decompressing pull.
const DECODE_BUFFER: usize = 256 * 1024;

/// Marks the error a sink or reader returns once the other side stopped.
#[derive(Debug)]
struct Stopped;

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("transfer stopped")
    }
}

impl std::error::Error for Stopped {}

fn stopped() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, Stopped)
}

fn is_stopped(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|inner| inner.is::<Stopped>())
}

/// Why reading a pushed file stopped early.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    Read(io::Error),
    Compress(io::Error),
    /// The async side stopped taking batches; it knows why.
    Stopped,
}

/// A pushed file being read (and compressed) on a blocking thread into batches
/// of complete `DATA` frames.
pub(crate) struct FrameReader {
    batches: mpsc::Receiver<Vec<u8>>,
    recycle: std::sync::mpsc::Sender<Vec<u8>>,
    consumed: Arc<AtomicU64>,
    reported: u64,
    worker: tokio::task::JoinHandle<Result<(), ReadFailure>>,
}

impl FrameReader {
    pub(crate) fn start(file: File, compression: Compression) -> FrameReader {
        let (sender, batches) = mpsc::channel(BATCH_QUEUE_DEPTH);
        let (recycle, recycled) = std::sync::mpsc::channel();
        let consumed = Arc::new(AtomicU64::new(0));
        let counter = consumed.clone();
        let worker = tokio::task::spawn_blocking(move || {
            let batches = Batches {
                sender,
                recycled,
                stopped: false,
            };
            match compression {
                Compression::None => read_plain(file, batches, &counter),
                other => read_compressed(file, other, batches, &counter),
            }
        });
        FrameReader {
            batches,
            recycle,
            consumed,
            reported: 0,
            worker,
        }
    }

    /// The next batch of frames, or `None` at the end of the file or after a failure.
    pub(crate) async fn next(&mut self) -> Option<Vec<u8>> {
        self.batches.recv().await
    }

    /// Hands a sent batch back for reuse.
    pub(crate) fn recycle(&self, batch: Vec<u8>) {
        let _ = self.recycle.send(batch);
    }

    /// File bytes read since the last call.
    pub(crate) fn newly_read(&mut self) -> u64 {
        let now = self.consumed.load(Ordering::Relaxed);
        let delta = now - self.reported;
        self.reported = now;
        delta
    }

    /// Waits for the thread; `Ok` means the whole file was read and framed.
    pub(crate) async fn finish(self) -> Result<(), ReadFailure> {
        drop(self.batches);
        match self.worker.await {
            Ok(result) => result,
            Err(join) => Err(ReadFailure::Read(io::Error::other(join))),
        }
    }
}

/// The thread's end of the batch queue.
struct Batches {
    sender: mpsc::Sender<Vec<u8>>,
    recycled: std::sync::mpsc::Receiver<Vec<u8>>,
    stopped: bool,
}

impl Batches {
    fn empty_batch(&self) -> Vec<u8> {
        match self.recycled.try_recv() {
            Ok(mut batch) => {
                batch.clear();
                batch
            }
            Err(_) => Vec::with_capacity(BATCH_CAPACITY),
        }
    }

    fn send(&mut self, batch: Vec<u8>) -> io::Result<()> {
        if self.sender.blocking_send(batch).is_err() {
            self.stopped = true;
            return Err(stopped());
        }
        Ok(())
    }
}

/// Uncompressed: each `readv` fills the payload slots of up to 16 frames in
/// place, so the data is copied once from the page cache and never again here.
fn read_plain(
    mut file: File,
    mut batches: Batches,
    consumed: &AtomicU64,
) -> Result<(), ReadFailure> {
    loop {
        let mut batch = batches.empty_batch();
        batch.resize(BATCH_CAPACITY, 0);
        let read = read_into_frames(&mut file, &mut batch).map_err(ReadFailure::Read)?;
        if read == 0 {
            return Ok(());
        }
        consumed.fetch_add(read as u64, Ordering::Relaxed);
        if batches.send(batch).is_err() {
            return Err(ReadFailure::Stopped);
        }
    }
}

/// Reads into the payload slots of `batch` (which is `BATCH_CAPACITY` long),
/// writes the headers of the frames it filled and truncates `batch` after the
/// last one. Returns the payload bytes read; 0 at end of file.
fn read_into_frames(file: &mut File, batch: &mut Vec<u8>) -> io::Result<usize> {
    let read = loop {
        let mut slots: Vec<IoSliceMut<'_>> = Vec::with_capacity(FRAMES_PER_BATCH);
        let mut rest = &mut batch[..];
        while rest.len() >= FRAME_LEN {
            let (frame, tail) = rest.split_at_mut(FRAME_LEN);
            slots.push(IoSliceMut::new(&mut frame[HEADER_LEN..]));
            rest = tail;
        }
        match file.read_vectored(&mut slots) {
            Ok(read) => break read,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    let mut end = 0;
    let mut left = read;
    let mut at = 0;
    while left > 0 {
        let len = left.min(SYNC_DATA_MAX);
        batch[at..at + HEADER_LEN].copy_from_slice(&wire::encode_data_header(len));
        end = at + HEADER_LEN + len;
        left -= len;
        at += FRAME_LEN;
    }
    batch.truncate(end);
    Ok(read)
}

/// Compressed: the encoder's output is cut into full-size frames by [`FrameSink`].
fn read_compressed(
    mut file: File,
    compression: Compression,
    batches: Batches,
    consumed: &AtomicU64,
) -> Result<(), ReadFailure> {
    let sink = FrameSink::new(batches);
    let mut encoder = Encoder::new(compression, sink).map_err(ReadFailure::Compress)?;
    let mut input = vec![0u8; COMPRESS_INPUT];
    let classify = |error: io::Error| {
        if is_stopped(&error) {
            ReadFailure::Stopped
        } else {
            ReadFailure::Compress(error)
        }
    };
    loop {
        let read = match file.read(&mut input) {
            Ok(0) => break,
            Ok(read) => read,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadFailure::Read(e)),
        };
        consumed.fetch_add(read as u64, Ordering::Relaxed);
        encoder.write_all(&input[..read]).map_err(classify)?;
    }
    let sink = encoder.finish().map_err(classify)?;
    // Brotli's finish cannot report that the sink stopped; the sink knows.
    if sink.batches.stopped {
        return Err(ReadFailure::Stopped);
    }
    sink.finish().map_err(classify)
}

/// Cuts a byte stream into full-size `DATA` frames, sent in batches.
struct FrameSink {
    batches: Batches,
    batch: Vec<u8>,
    /// Offset of the header of the frame being filled.
    open_frame: Option<usize>,
}

impl FrameSink {
    fn new(batches: Batches) -> FrameSink {
        let batch = batches.empty_batch();
        FrameSink {
            batches,
            batch,
            open_frame: None,
        }
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
        let next = self.batches.empty_batch();
        let full = std::mem::replace(&mut self.batch, next);
        self.batches.send(full)
    }

    fn finish(mut self) -> io::Result<()> {
        self.send_batch()
    }
}

impl Write for FrameSink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.batches.stopped {
            return Err(stopped());
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
                if self.batch.len() + FRAME_LEN > BATCH_CAPACITY {
                    self.send_batch()?;
                }
            }
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the async side of a pull hands the writing thread.
pub(crate) enum PullInput {
    Data(Bytes),
    /// The device sent `DONE`: everything arrived.
    Done,
}

/// Why writing a pulled file failed.
#[derive(Debug)]
pub(crate) enum WriteFailure {
    Output(io::Error),
    Decode(io::Error),
    /// The async side stopped before `DONE`; it knows why.
    Aborted,
}

/// Writes (decompressing if asked) the pulled data to `out` until `Done`.
/// `written` counts the file bytes written so far.
pub(crate) fn write_pulled(
    input: mpsc::Receiver<PullInput>,
    compression: Compression,
    out: &File,
    written: &AtomicU64,
) -> Result<(), WriteFailure> {
    match compression {
        Compression::None => write_plain(input, out, written),
        other => write_decoded(input, other, out, written),
    }
}

fn write_plain(
    mut input: mpsc::Receiver<PullInput>,
    mut out: &File,
    written: &AtomicU64,
) -> Result<(), WriteFailure> {
    let mut pieces: Vec<Bytes> = Vec::with_capacity(MAX_WRITE_PIECES);
    loop {
        let mut done = false;
        match input.blocking_recv() {
            Some(PullInput::Data(piece)) => pieces.push(piece),
            Some(PullInput::Done) => done = true,
            None => return Err(WriteFailure::Aborted),
        }
        let mut total: usize = pieces.iter().map(Bytes::len).sum();
        while !done && pieces.len() < MAX_WRITE_PIECES && total < MAX_WRITE_BYTES {
            match input.try_recv() {
                Ok(PullInput::Data(piece)) => {
                    total += piece.len();
                    pieces.push(piece);
                }
                Ok(PullInput::Done) => done = true,
                Err(_) => break,
            }
        }
        write_all_pieces(&mut out, &pieces).map_err(WriteFailure::Output)?;
        written.fetch_add(total as u64, Ordering::Relaxed);
        pieces.clear();
        if done {
            return Ok(());
        }
    }
}

fn write_all_pieces(out: &mut &File, pieces: &[Bytes]) -> io::Result<()> {
    let mut index = 0;
    let mut offset = 0;
    while index < pieces.len() {
        if pieces[index].len() == offset {
            index += 1;
            offset = 0;
            continue;
        }
        let slices: Vec<IoSlice<'_>> = std::iter::once(IoSlice::new(&pieces[index][offset..]))
            .chain(pieces[index + 1..].iter().map(|p| IoSlice::new(p)))
            .collect();
        let mut n = match out.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while n > 0 {
            let left = pieces[index].len() - offset;
            if n >= left {
                n -= left;
                index += 1;
                offset = 0;
            } else {
                offset += n;
                n = 0;
            }
        }
    }
    Ok(())
}

fn write_decoded(
    input: mpsc::Receiver<PullInput>,
    compression: Compression,
    mut out: &File,
    written: &AtomicU64,
) -> Result<(), WriteFailure> {
    let mut reader = PieceReader {
        input,
        piece: Bytes::new(),
        done: false,
        aborted: false,
        received: 0,
    };
    let result = {
        let decoder =
            compression::decoder(compression, &mut reader).map_err(WriteFailure::Decode)?;
        copy_decoded(decoder, &mut out, written)
    };
    match result {
        Ok(()) => {}
        Err(_) if reader.aborted => return Err(WriteFailure::Aborted),
        Err(failure) => return Err(failure),
    }
    if reader.received == 0 {
        return Err(WriteFailure::Decode(io::Error::new(
            io::ErrorKind::InvalidData,
            "empty compressed stream",
        )));
    }
    // The stream must end exactly at DONE.
    match reader.fill_buf() {
        Ok([]) => Ok(()),
        Ok(_) => Err(WriteFailure::Decode(io::Error::new(
            io::ErrorKind::InvalidData,
            "data after the end of the compressed stream",
        ))),
        Err(_) => Err(WriteFailure::Aborted),
    }
}

fn copy_decoded(
    mut decoder: Box<dyn Read + '_>,
    out: &mut &File,
    written: &AtomicU64,
) -> Result<(), WriteFailure> {
    let mut buf = vec![0u8; DECODE_BUFFER];
    loop {
        let n = match decoder.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(WriteFailure::Decode(e)),
        };
        out.write_all(&buf[..n]).map_err(WriteFailure::Output)?;
        written.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The pulled payloads as one byte stream that ends at `DONE`.
struct PieceReader {
    input: mpsc::Receiver<PullInput>,
    piece: Bytes,
    done: bool,
    aborted: bool,
    received: u64,
}

impl BufRead for PieceReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.piece.is_empty() && !self.done {
            match self.input.blocking_recv() {
                Some(PullInput::Data(piece)) => {
                    self.received += piece.len() as u64;
                    self.piece = piece;
                }
                Some(PullInput::Done) => self.done = true,
                None => {
                    self.aborted = true;
                    return Err(stopped());
                }
            }
        }
        Ok(&self.piece)
    }

    fn consume(&mut self, amount: usize) {
        let _ = self.piece.split_to(amount.min(self.piece.len()));
    }
}

impl Read for PieceReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxadb_wire::sync::SyncHeader;

    fn sample(len: usize) -> Vec<u8> {
        let mut state = 0x1234_5678u32;
        (0..len)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                // Partly compressible.
                if i % 64 < 32 {
                    b'a'
                } else {
                    state as u8
                }
            })
            .collect()
    }

    /// Splits batches into frames and returns the payloads.
    fn payloads(batches: &[Vec<u8>]) -> Vec<Vec<u8>> {
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

    async fn read_all(data: &[u8], compression: Compression) -> Vec<Vec<u8>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, data).unwrap();
        let mut reader = FrameReader::start(File::open(&path).unwrap(), compression);
        let mut batches = Vec::new();
        while let Some(batch) = reader.next().await {
            batches.push(batch.clone());
            reader.recycle(batch);
        }
        assert_eq!(reader.newly_read(), data.len() as u64);
        reader.finish().await.unwrap();
        payloads(&batches)
    }

    #[tokio::test]
    async fn plain_frames_are_full_size() {
        let data = sample(3 * SYNC_DATA_MAX * FRAMES_PER_BATCH / 2 + 77);
        let frames = read_all(&data, Compression::None).await;
        assert!(frames[..frames.len() - 1]
            .iter()
            .all(|f| f.len() == SYNC_DATA_MAX));
        assert_eq!(frames.concat(), data);
        assert!(read_all(b"", Compression::None).await.is_empty());
    }

    #[tokio::test]
    async fn compressed_frames_decode_back() {
        let data = sample(5 * SYNC_DATA_MAX + 3);
        for compression in [Compression::Brotli, Compression::Lz4, Compression::Zstd] {
            let frames = read_all(&data, compression).await;
            assert!(frames
                .iter()
                .all(|f| !f.is_empty() && f.len() <= SYNC_DATA_MAX));
            let stream = frames.concat();
            assert!(stream.len() < data.len(), "{compression:?} compresses");

            // Decode through the pull writer, a few bytes at a time.
            let dir = tempfile::tempdir().unwrap();
            let out = File::create(dir.path().join("out")).unwrap();
            let (sender, receiver) = mpsc::channel(4);
            let writer_out = out.try_clone().unwrap();
            let counter = Arc::new(AtomicU64::new(0));
            let worker_counter = counter.clone();
            let worker = tokio::task::spawn_blocking(move || {
                write_pulled(receiver, compression, &writer_out, &worker_counter)
            });
            for piece in stream.chunks(1000) {
                sender
                    .send(PullInput::Data(Bytes::copy_from_slice(piece)))
                    .await
                    .unwrap();
            }
            sender.send(PullInput::Done).await.unwrap();
            worker.await.unwrap().unwrap();
            assert_eq!(std::fs::read(dir.path().join("out")).unwrap(), data);
            assert_eq!(counter.load(Ordering::Relaxed), data.len() as u64);

            // Empty files still make a (short) compressed stream.
            let empty = read_all(b"", compression).await;
            assert!(!empty.concat().is_empty());
        }
    }

    #[tokio::test]
    async fn plain_writer_aborts_without_done() {
        let dir = tempfile::tempdir().unwrap();
        let out = File::create(dir.path().join("out")).unwrap();
        let (sender, receiver) = mpsc::channel(4);
        let worker = tokio::task::spawn_blocking(move || {
            write_pulled(receiver, Compression::None, &out, &AtomicU64::new(0))
        });
        sender
            .send(PullInput::Data(Bytes::from_static(b"abc")))
            .await
            .unwrap();
        drop(sender);
        assert!(matches!(worker.await.unwrap(), Err(WriteFailure::Aborted)));
    }
}
