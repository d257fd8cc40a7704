//! The receiving half: `DATA` payloads handed over by the async side, read
//! as one byte stream that ends at `DONE`, decompressed if asked, and written
//! to a file (or any writer).

use std::collections::VecDeque;
use std::io::{self, BufRead, IoSlice, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use oxadb_wire::compression;
use oxadb_wire::sync::Compression;

use crate::handoff::{self, TryRecvError};

/// Pieces written with one `writev` at most.
const MAX_WRITE_PIECES: usize = 64;
const MAX_WRITE_BYTES: usize = 4 * 1024 * 1024;
/// Output buffer of a decompressing transfer.
const DECODE_BUFFER: usize = 256 * 1024;

/// What the stream side hands the file thread.
#[derive(Debug)]
pub enum Chunk {
    /// A `DATA` payload (or a piece of one).
    Data(Bytes),
    /// Several payloads (or pieces) in order, handed over at once: one wakeup
    /// of the file thread for all that one read of the stream brought.
    Pieces(Vec<Bytes>),
    /// `DONE`: everything arrived. A push's `DONE` carries the mtime; a pull's is 0.
    Done { mtime: u32 },
}

/// The received payloads as a blocking reader that ends at `DONE`. A queue
/// closed before `DONE` means the other side stopped the transfer: reads
/// fail with `ConnectionAborted` and [`ChunkReader::stopped`] says so.
pub struct ChunkReader {
    queue: handoff::Receiver<Chunk>,
    /// Received and not yet read, oldest first; never holds an empty piece.
    pieces: VecDeque<Bytes>,
    done_mtime: Option<u32>,
    stopped: bool,
    received: u64,
}

impl ChunkReader {
    pub fn new(queue: handoff::Receiver<Chunk>) -> ChunkReader {
        ChunkReader {
            queue,
            pieces: VecDeque::new(),
            done_mtime: None,
            stopped: false,
            received: 0,
        }
    }

    /// The `DONE` timestamp, once `DONE` was read.
    pub fn done_mtime(&self) -> Option<u32> {
        self.done_mtime
    }

    /// Whether the queue closed before `DONE`.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Payload bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    fn take(&mut self, chunk: Chunk) {
        match chunk {
            Chunk::Data(data) => self.queue_piece(data),
            Chunk::Pieces(pieces) => pieces.into_iter().for_each(|piece| self.queue_piece(piece)),
            Chunk::Done { mtime } => self.done_mtime = Some(mtime),
        }
    }

    fn queue_piece(&mut self, piece: Bytes) {
        if !piece.is_empty() {
            self.received += piece.len() as u64;
            self.pieces.push_back(piece);
        }
    }

    fn aborted(&mut self) -> io::Error {
        self.stopped = true;
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the transfer stopped before DONE",
        )
    }

    /// The rest of the current chunk, or the next one if it is already
    /// queued (`block: false`) or once it arrives. `None` at `DONE` (or,
    /// without `block`, when nothing is queued).
    fn next_piece(&mut self, block: bool) -> io::Result<Option<Bytes>> {
        while self.pieces.is_empty() {
            if self.done_mtime.is_some() {
                return Ok(None);
            }
            let next = if block {
                self.queue.blocking_recv()
            } else {
                match self.queue.try_recv() {
                    Ok(chunk) => Some(chunk),
                    Err(TryRecvError::Empty) => return Ok(None),
                    Err(TryRecvError::Disconnected) => None,
                }
            };
            match next {
                Some(chunk) => self.take(chunk),
                None => return Err(self.aborted()),
            }
        }
        Ok(self.pieces.pop_front())
    }
}

impl BufRead for ChunkReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.pieces.is_empty() && self.done_mtime.is_none() {
            match self.queue.blocking_recv() {
                Some(chunk) => self.take(chunk),
                None => return Err(self.aborted()),
            }
        }
        Ok(self.pieces.front().map_or(&[], |piece| &piece[..]))
    }

    fn consume(&mut self, amount: usize) {
        if let Some(front) = self.pieces.front_mut() {
            let _ = front.split_to(amount.min(front.len()));
            if front.is_empty() {
                self.pieces.pop_front();
            }
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

/// Why receiving into a file failed.
#[derive(Debug)]
pub enum ReceiveError {
    /// The data could not be decompressed (or a compressed stream was
    /// empty, or followed by more data).
    Decode(io::Error),
    /// The output could not be written.
    Output(io::Error),
    /// The queue closed before `DONE`: the async side knows why.
    Stopped,
}

/// Writes the received stream up to `DONE` into `out`, decompressing it as
/// `compression` says; `written` counts the bytes written. The compressed
/// formats are the ones adb and adbd use (`oxadb_wire::compression`): one
/// brotli stream, one LZ4 frame, one zstd frame, and nothing may follow the
/// stream before `DONE` (`daemon/file_sync_service.cpp` and
/// `client/file_sync_client.cpp` both decode until the stream ends).
pub fn receive(
    input: &mut ChunkReader,
    compression: Compression,
    out: &mut impl Write,
    written: &AtomicU64,
) -> Result<(), ReceiveError> {
    let result = if compression == Compression::None {
        write_plain(input, out, written)
    } else {
        write_decoded(input, compression, out, written)
    };
    match result {
        Err(_) if input.stopped => Err(ReceiveError::Stopped),
        other => other,
    }
}

/// Plain data: every piece already queued goes out with one `writev`.
fn write_plain(
    input: &mut ChunkReader,
    out: &mut impl Write,
    written: &AtomicU64,
) -> Result<(), ReceiveError> {
    let mut pieces: Vec<Bytes> = Vec::with_capacity(MAX_WRITE_PIECES);
    loop {
        match input.next_piece(true).map_err(ReceiveError::Decode)? {
            Some(piece) => pieces.push(piece),
            None => return Ok(()),
        }
        let mut total = pieces[0].len();
        while pieces.len() < MAX_WRITE_PIECES && total < MAX_WRITE_BYTES {
            match input.next_piece(false).map_err(ReceiveError::Decode)? {
                Some(piece) => {
                    total += piece.len();
                    pieces.push(piece);
                }
                None => break,
            }
        }
        write_all_pieces(out, &pieces).map_err(ReceiveError::Output)?;
        written.fetch_add(total as u64, Ordering::Relaxed);
        pieces.clear();
    }
}

fn write_all_pieces(out: &mut impl Write, pieces: &[Bytes]) -> io::Result<()> {
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
    input: &mut ChunkReader,
    compression: Compression,
    out: &mut impl Write,
    written: &AtomicU64,
) -> Result<(), ReceiveError> {
    {
        let mut decoder =
            compression::decoder(compression, &mut *input).map_err(ReceiveError::Decode)?;
        let mut buf = vec![0u8; DECODE_BUFFER];
        loop {
            let n = match decoder.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ReceiveError::Decode(e)),
            };
            out.write_all(&buf[..n]).map_err(ReceiveError::Output)?;
            written.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
    if input.received == 0 {
        return Err(ReceiveError::Decode(io::Error::new(
            io::ErrorKind::InvalidData,
            "empty compressed stream",
        )));
    }
    // Reaching DONE here proves the decoder consumed everything that was sent.
    if !input.fill_buf().map_err(ReceiveError::Decode)?.is_empty() {
        return Err(ReceiveError::Decode(io::Error::new(
            io::ErrorKind::InvalidData,
            "data after the end of the compressed stream",
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::sample;

    /// Feeds `stream` in `piece`-sized chunks, then `DONE` unless `done` is false.
    fn feed(stream: Vec<u8>, piece: usize, done: bool) -> ChunkReader {
        let (mut chunks, queue) = handoff::channel(4);
        std::thread::spawn(move || {
            for piece in stream.chunks(piece) {
                chunks
                    .blocking_send(Chunk::Data(Bytes::copy_from_slice(piece)))
                    .unwrap();
            }
            if done {
                chunks.blocking_send(Chunk::Done { mtime: 7 }).unwrap();
            }
        });
        ChunkReader::new(queue)
    }

    #[test]
    fn lz4_independent_blocks_and_checksums_decode_too() {
        // LZ4F producers may pick other frame options; the decoder must take them all.
        let data = sample(150_000);
        let info = lz4_flex::frame::FrameInfo::new()
            .block_size(lz4_flex::frame::BlockSize::Max256KB)
            .block_checksums(true)
            .content_checksum(true)
            .content_size(Some(data.len() as u64));
        let mut encoder = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
        encoder.write_all(&data).unwrap();
        let frame = encoder.finish().unwrap();

        let mut reader = feed(frame, 999, true);
        let mut out = Vec::new();
        let counter = AtomicU64::new(0);
        assert!(receive(&mut reader, Compression::Lz4, &mut out, &counter).is_ok());
        assert_eq!(out, data);
        assert_eq!(reader.done_mtime(), Some(7));
        assert_eq!(counter.load(Ordering::Relaxed), data.len() as u64);
    }

    #[test]
    fn plain_pieces_arrive_whole_and_in_order() {
        let data = sample(1_000_003);
        let mut reader = feed(data.clone(), 4093, true);
        let mut out = Vec::new();
        let counter = AtomicU64::new(0);
        receive(&mut reader, Compression::None, &mut out, &counter).unwrap();
        assert_eq!(out, data);
        assert_eq!(counter.load(Ordering::Relaxed), data.len() as u64);
    }

    #[test]
    fn handed_over_pieces_read_as_one_stream_with_single_chunks() {
        let data = sample(300_007);
        let (mut chunks, queue) = handoff::channel(2);
        let sent = data.clone();
        std::thread::spawn(move || {
            let (batched, single) = sent.split_at(200_000);
            let pieces = batched
                .chunks(65_536)
                .map(Bytes::copy_from_slice)
                .chain([Bytes::new()])
                .collect();
            chunks.blocking_send(Chunk::Pieces(pieces)).unwrap();
            chunks
                .blocking_send(Chunk::Data(Bytes::copy_from_slice(single)))
                .unwrap();
            chunks.blocking_send(Chunk::Pieces(Vec::new())).unwrap();
            chunks.blocking_send(Chunk::Done { mtime: 3 }).unwrap();
        });
        let mut reader = ChunkReader::new(queue);
        let mut out = Vec::new();
        let written = AtomicU64::new(0);
        receive(&mut reader, Compression::None, &mut out, &written).unwrap();
        assert_eq!(out, data);
        assert_eq!(reader.received(), data.len() as u64);
        assert_eq!(reader.done_mtime(), Some(3));
    }

    #[test]
    fn plain_writer_aborts_without_done() {
        let mut reader = feed(b"abc".to_vec(), 3, false);
        let result = receive(
            &mut reader,
            Compression::None,
            &mut io::sink(),
            &AtomicU64::new(0),
        );
        assert!(matches!(result, Err(ReceiveError::Stopped)));
        assert!(reader.stopped());
    }

    #[test]
    fn empty_or_trailing_compressed_streams_fail() {
        for compression in [Compression::Brotli, Compression::Lz4, Compression::Zstd] {
            let mut reader = feed(Vec::new(), 1, true);
            let result = receive(
                &mut reader,
                compression,
                &mut io::sink(),
                &AtomicU64::new(0),
            );
            assert!(
                matches!(result, Err(ReceiveError::Decode(_))),
                "{compression:?}"
            );
        }
        let mut encoder =
            oxadb_wire::compression::Encoder::new(Compression::Zstd, Vec::new()).unwrap();
        encoder.write_all(b"hello").unwrap();
        let mut stream = encoder.finish().unwrap();
        stream.extend_from_slice(b"junk");
        let mut reader = feed(stream, 3, true);
        let result = receive(
            &mut reader,
            Compression::Zstd,
            &mut io::sink(),
            &AtomicU64::new(0),
        );
        assert!(matches!(result, Err(ReceiveError::Decode(_))), "{result:?}");
    }
}
