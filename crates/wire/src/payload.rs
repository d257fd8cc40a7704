//! A packet payload that need not be in memory: small byte pieces (packet and
//! sync `DATA` headers) and ranges of a file, which a TCP writer can hand to
//! `sendfile` so file data never passes through user space. Writers that
//! cannot take file ranges (USB, in-memory pipes, or a peer that wants
//! payload checksums) read them with [`Payload::into_bytes`]; either way the
//! bytes on the wire are the same.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// A file sent by ranges, and where to count what happened to them.
#[derive(Debug)]
pub struct SendFile {
    file: File,
    /// What error messages call the file (its local path), if known.
    name: Option<String>,
    /// `sendfile` refused this file (EINVAL, ENOSYS, EOPNOTSUPP: no
    /// `splice_read` on its filesystem, as for /proc's seq files): its other
    /// ranges are read into memory without trying again.
    unsupported: AtomicBool,
    counters: Arc<RangeCounters>,
}

impl SendFile {
    pub fn new(file: File, counters: Arc<RangeCounters>) -> Arc<SendFile> {
        SendFile::named(file, None, counters)
    }

    /// As [`SendFile::new`], for a file that errors name as `name`.
    pub fn named(file: File, name: Option<String>, counters: Arc<RangeCounters>) -> Arc<SendFile> {
        counters.files.fetch_add(1, Ordering::Relaxed);
        Arc::new(SendFile {
            file,
            name,
            unsupported: AtomicBool::new(false),
            counters,
        })
    }

    /// The error for a file that ended before `end`, the end of a range
    /// already framed: its lengths cannot be filled, so the connection that
    /// carries it cannot go on.
    pub fn shrank(&self, end: u64) -> io::Error {
        let file = match &self.name {
            Some(name) => format!("'{name}'"),
            None => "a file".to_string(),
        };
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{file} shrank while being sent: it ends before byte {end}, which was already framed"),
        )
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether `sendfile` failed for this file and its ranges are copied.
    pub fn fell_back(&self) -> bool {
        self.unsupported.load(Ordering::Relaxed)
    }

    /// Records that `sendfile` cannot read this file (counted once).
    pub fn mark_unsupported(&self) {
        if !self.unsupported.swap(true, Ordering::Relaxed) {
            self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn note_sent(&self, bytes: u64) {
        self.counters
            .by_sendfile
            .fetch_add(bytes, Ordering::Relaxed);
    }
}

/// `len` bytes of a file from `offset`.
#[derive(Debug, Clone)]
pub struct FileRange {
    pub file: Arc<SendFile>,
    pub offset: u64,
    pub len: usize,
}

impl FileRange {
    /// Reads the range into `out` (positioned reads: the file offset is not used).
    pub fn read_into(&self, out: &mut BytesMut) -> io::Result<()> {
        let start = out.len();
        out.resize(start + self.len, 0);
        let result = self.file.file.read_exact_at(&mut out[start..], self.offset);
        if let Err(error) = result {
            out.truncate(start);
            return Err(if error.kind() == io::ErrorKind::UnexpectedEof {
                self.file.shrank(self.offset + self.len as u64)
            } else {
                error
            });
        }
        self.file
            .counters
            .copied
            .fetch_add(self.len as u64, Ordering::Relaxed);
        Ok(())
    }
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
                    file: range.file.clone(),
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

    /// The payload in memory: file ranges are read (the copying path, for
    /// writers without `sendfile` and for checksums).
    pub fn into_bytes(self) -> io::Result<Bytes> {
        match self.repr {
            Repr::One(Part::Bytes(bytes)) => Ok(bytes),
            repr => {
                let payload = Payload { repr };
                let mut out = BytesMut::with_capacity(payload.len());
                for part in payload.parts() {
                    match part {
                        Part::Bytes(bytes) => out.extend_from_slice(bytes),
                        Part::File(range) => range.read_into(&mut out)?,
                    }
                }
                Ok(out.freeze())
            }
        }
    }

    /// Reads the payload into memory in place and returns it.
    pub fn read_in(&mut self) -> io::Result<&Bytes> {
        if self.as_bytes().is_none() {
            let bytes = std::mem::take(self).into_bytes()?;
            *self = Payload::from(bytes);
        }
        Ok(self.as_bytes().expect("just read in"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(data: &[u8]) -> Arc<SendFile> {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(data).unwrap();
        SendFile::new(file, Arc::default())
    }

    #[test]
    fn splits_and_reads_across_parts() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let file = file_with(&data);
        let mut payload = Payload::default();
        payload.push(Part::Bytes(Bytes::from_static(b"head")));
        payload.push(Part::File(FileRange {
            file: file.clone(),
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

        let mut rest = payload.clone();
        let mut pieces = Vec::new();
        for at in [0, 3, 2, 300, 199, 4] {
            pieces.push(rest.split_to(at).into_bytes().unwrap());
        }
        assert!(rest.is_empty());
        assert_eq!(pieces.concat(), expected);
        assert_eq!(payload.into_bytes().unwrap(), expected);
        assert_eq!(file.counters.snapshot(), (1, 0, 1000, 0));
    }

    #[test]
    fn a_short_file_is_an_error() {
        let file = file_with(b"abc");
        let mut payload = Payload::default();
        payload.push(Part::File(FileRange {
            file,
            offset: 0,
            len: 4,
        }));
        let error = payload.into_bytes().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    }
}
