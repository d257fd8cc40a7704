//! A packet payload that need not be in memory: small byte pieces (packet and
//! sync `DATA` headers) and ranges of a file, which a TCP writer can hand to
//! `sendfile` so file data never passes through user space. Writers that
//! cannot take file ranges (USB, in-memory pipes, or a peer that wants
//! payload checksums) read them into memory (`oxadb_io::ReadRanges`); either
//! way the bytes on the wire are the same. Nothing here reads a file: a
//! range is an opaque [`RangeSource`] and a length. A range may also be
//! bytes waiting in a pipe, which a TCP writer splices out.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

/// What happened to the file ranges of some transfers (a sync stream's, a
/// connection's): counted as the writer sends them.
#[derive(Debug, Default)]
pub struct RangeCounters {
    /// Files sent as ranges.
    pub files: AtomicU64,
    /// File bytes sent by `sendfile`.
    pub by_sendfile: AtomicU64,
    /// File bytes read into memory to be sent (a writer without `sendfile`,
    /// a checksumming peer, or a fallback).
    pub copied: AtomicU64,
    /// Files that `sendfile` refused, sent by reading them instead.
    pub fallbacks: AtomicU64,
}

impl RangeCounters {
    /// `(files, by_sendfile, copied, fallbacks)` so far.
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.files.load(Ordering::Relaxed),
            self.by_sendfile.load(Ordering::Relaxed),
            self.copied.load(Ordering::Relaxed),
            self.fallbacks.load(Ordering::Relaxed),
        )
    }
}

/// Where the bytes of a [`FileRange`] are: a file the sender opened
/// (`oxadb_transfer::SendFile`). Opaque to the protocol, which only counts
/// its lengths (this crate and the engine never read it); the connection's
/// writer in `oxadb-io` hands it to `sendfile` or, on the copying path,
/// reads it through these methods.
pub trait RangeSource: fmt::Debug + Send + Sync {
    /// The descriptor `sendfile` reads from; `None` once `sendfile` was
    /// refused for this source ([`RangeSource::sendfile_refused`]), whose
    /// ranges are read from then on.
    fn sendfile_fd(&self) -> Option<BorrowedFd<'_>>;

    /// `sendfile` cannot read this source (EINVAL, ENOSYS, EOPNOTSUPP: no
    /// `splice_read` on its filesystem, as for /proc's seq files).
    fn sendfile_refused(&self);

    /// `bytes` of it went out by `sendfile`.
    fn sent(&self, bytes: u64);

    /// Fills `buf` from `offset` (the copying path). A source that ends
    /// first fails with [`RangeSource::shrank`]'s error; every error names
    /// the source.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// The error for a source that ends before `end`, the end of a range
    /// already framed: its lengths cannot be filled, so the connection that
    /// carries it cannot go on.
    fn shrank(&self, end: u64) -> io::Error;

    /// The read end of a pipe that holds this source's bytes in order (a
    /// relay's socket data, `oxadb_io::pipe_range`): a TCP writer splices its
    /// ranges out instead of calling `sendfile`, and every range of it is
    /// sent (or read) once, in order, so offsets only count.
    fn pipe_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

/// `len` bytes of a [`RangeSource`] from `offset`.
#[derive(Debug, Clone)]
pub struct FileRange {
    pub source: Arc<dyn RangeSource>,
    pub offset: u64,
    pub len: usize,
}

/// One piece of a payload.
#[derive(Debug, Clone)]
pub enum Part {
    Bytes(Bytes),
    File(FileRange),
}

impl Part {
    pub fn len(&self) -> usize {
        match self {
            Part::Bytes(bytes) => bytes.len(),
            Part::File(range) => range.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Splits off the first `at` bytes (`at` < len).
    fn split_to(&mut self, at: usize) -> Part {
        match self {
            Part::Bytes(bytes) => Part::Bytes(bytes.split_to(at)),
            Part::File(range) => {
                let front = FileRange {
                    source: range.source.clone(),
                    offset: range.offset,
                    len: at,
                };
                range.offset += at as u64;
                range.len -= at;
                Part::File(front)
            }
        }
    }
}

/// A payload: one buffer (every packet but file data), or pieces in order.
#[derive(Debug, Clone)]
pub struct Payload {
    repr: Repr,
}

#[derive(Debug, Clone)]
enum Repr {
    /// One piece, without the deque (most payloads).
    One(Part),
    Parts {
        parts: VecDeque<Part>,
        len: usize,
    },
}

impl Default for Payload {
    fn default() -> Payload {
        Payload::from(Bytes::new())
    }
}

impl From<Bytes> for Payload {
    fn from(bytes: Bytes) -> Payload {
        Payload {
            repr: Repr::One(Part::Bytes(bytes)),
        }
    }
}

impl From<Part> for Payload {
    fn from(part: Part) -> Payload {
        Payload {
            repr: Repr::One(part),
        }
    }
}

impl Payload {
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::One(part) => part.len(),
            Repr::Parts { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether some of the payload is file ranges (not in memory).
    pub fn has_file_ranges(&self) -> bool {
        self.parts().any(|p| matches!(p, Part::File(_)))
    }

    /// The pieces in order.
    pub fn parts(&self) -> impl Iterator<Item = &Part> + '_ {
        let (one, many) = match &self.repr {
            Repr::One(part) => (Some(part), None),
            Repr::Parts { parts, .. } => (None, Some(parts.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    /// The payload when it is one buffer in memory.
    pub fn as_bytes(&self) -> Option<&Bytes> {
        match &self.repr {
            Repr::One(Part::Bytes(bytes)) => Some(bytes),
            _ => None,
        }
    }

    /// Appends `part` (nothing for an empty one).
    pub fn push(&mut self, part: Part) {
        if part.is_empty() {
            return;
        }
        if self.is_empty() {
            self.repr = Repr::One(part);
            return;
        }
        self.make_parts();
        if let Repr::Parts { parts, len } = &mut self.repr {
            *len += part.len();
            parts.push_back(part);
        }
    }

    /// Appends all of `other`.
    pub fn append(&mut self, other: Payload) {
        match other.repr {
            Repr::One(part) => self.push(part),
            Repr::Parts { parts, .. } => parts.into_iter().for_each(|p| self.push(p)),
        }
    }

    fn make_parts(&mut self) {
        if let Repr::One(part) = &mut self.repr {
            let part = std::mem::replace(part, Part::Bytes(Bytes::new()));
            let len = part.len();
            let parts = if part.is_empty() {
                VecDeque::new()
            } else {
                VecDeque::from([part])
            };
            self.repr = Repr::Parts { parts, len };
        }
    }

    /// Splits off the first `at` bytes (at most the length).
    pub fn split_to(&mut self, at: usize) -> Payload {
        assert!(at <= self.len(), "split_to past the end");
        match &mut self.repr {
            Repr::One(part) if at == part.len() => {
                Payload::from(std::mem::replace(part, Part::Bytes(Bytes::new())))
            }
            Repr::One(part) => Payload::from(part.split_to(at)),
            Repr::Parts { parts, len } => {
                let mut front = Payload::default();
                let mut left = at;
                while left > 0 {
                    let part = parts.front_mut().expect("length covers the parts");
                    if part.len() <= left {
                        left -= part.len();
                        front.push(parts.pop_front().expect("front exists"));
                    } else {
                        front.push(part.split_to(left));
                        left = 0;
                    }
                }
                *len -= at;
                front
            }
        }
    }

    /// The payload as one buffer, each file range filled by `read` (given
    /// the range and its place in the buffer): the layout is this crate's,
    /// the reading the caller's (`oxadb_io::ReadRanges` on the copying path).
    pub fn gather_with(
        &self,
        mut read: impl FnMut(&FileRange, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<Bytes> {
        if let Some(bytes) = self.as_bytes() {
            return Ok(bytes.clone());
        }
        let mut out = BytesMut::with_capacity(self.len());
        for part in self.parts() {
            match part {
                Part::Bytes(bytes) => out.extend_from_slice(bytes),
                Part::File(range) => {
                    let start = out.len();
                    out.resize(start + range.len, 0);
                    read(range, &mut out[start..])?;
                }
            }
        }
        Ok(out.freeze())
    }

    /// The payload as one buffer, when none of it is a file range (those
    /// are read by the connection's writer, `oxadb_io::ReadRanges`).
    pub fn in_memory(self) -> Option<Bytes> {
        match self.repr {
            Repr::One(Part::Bytes(bytes)) => Some(bytes),
            Repr::One(Part::File(_)) => None,
            Repr::Parts { parts, len } => {
                let mut out = BytesMut::with_capacity(len);
                for part in parts {
                    match part {
                        Part::Bytes(bytes) => out.extend_from_slice(&bytes),
                        Part::File(_) => return None,
                    }
                }
                Some(out.freeze())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source in memory, to follow the ranges a payload splits into.
    #[derive(Debug)]
    struct Memory(Vec<u8>);

    impl RangeSource for Memory {
        fn sendfile_fd(&self) -> Option<BorrowedFd<'_>> {
            None
        }
        fn sendfile_refused(&self) {}
        fn sent(&self, _: u64) {}
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            let start = offset as usize;
            let bytes = self.0.get(start..start + buf.len());
            buf.copy_from_slice(bytes.ok_or_else(|| self.shrank(offset + buf.len() as u64))?);
            Ok(())
        }
        fn shrank(&self, end: u64) -> io::Error {
            io::Error::new(io::ErrorKind::UnexpectedEof, format!("ends before {end}"))
        }
    }

    /// The payload's bytes, its ranges read from their sources.
    fn contents(payload: &Payload) -> Vec<u8> {
        payload
            .gather_with(|range, buf| range.source.read_exact_at(buf, range.offset))
            .unwrap()
            .to_vec()
    }

    #[test]
    fn splits_across_parts_at_any_byte() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let source: Arc<dyn RangeSource> = Arc::new(Memory(data.clone()));
        let mut payload = Payload::default();
        payload.push(Part::Bytes(Bytes::from_static(b"head")));
        payload.push(Part::File(FileRange {
            source,
            offset: 10,
            len: 500,
        }));
        payload.push(Part::Bytes(Bytes::from_static(b"")));
        payload.push(Part::Bytes(Bytes::from_static(b"tail")));
        assert_eq!(payload.len(), 508);
        assert!(payload.has_file_ranges());
        let mut expected = b"head".to_vec();
        expected.extend_from_slice(&data[10..510]);
        expected.extend_from_slice(b"tail");
        assert_eq!(contents(&payload), expected);

        let mut rest = payload.clone();
        let mut pieces = Vec::new();
        for at in [0, 3, 2, 300, 199, 4] {
            let piece = rest.split_to(at);
            assert_eq!(piece.len(), at);
            pieces.push(contents(&piece));
        }
        assert!(rest.is_empty());
        assert_eq!(pieces.concat(), expected);
        assert_eq!(payload.in_memory(), None, "ranges are not in memory");
    }

    #[test]
    fn pieces_in_memory_join_into_one_buffer() {
        let mut payload = Payload::from(Bytes::from_static(b"one "));
        payload.push(Part::Bytes(Bytes::from_static(b"two")));
        payload.append(Payload::from(Bytes::from_static(b" three")));
        assert!(!payload.has_file_ranges());
        assert_eq!(payload.as_bytes(), None, "several pieces");
        assert_eq!(payload.in_memory().unwrap(), &b"one two three"[..]);
        let single = Bytes::from_static(b"whole");
        let pointer = single.as_ptr();
        let joined = Payload::from(single).in_memory().unwrap();
        assert_eq!(
            joined.as_ptr(),
            pointer,
            "one buffer is handed back as it is"
        );
    }
}
