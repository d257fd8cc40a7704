//! Received sync bytes as the stream delivered them: a queue of chunks that
//! both roles' machines (`protocol/`) parse in place, so `DATA` payloads
//! leave as slices of the chunks (no copy) and only headers, request paths
//! and replies are copied out. It is the one reading helper of the sync
//! protocol: a machine asks it whether a whole frame is there and takes it,
//! or waits for the next chunk.

use std::collections::VecDeque;

use bytes::{Buf, Bytes};
use oxadb_wire::sync::{SyncHeader, HEADER_LEN};

/// Chunks received and not yet parsed, oldest first.
#[derive(Debug, Default)]
pub struct Inbox {
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl Inbox {
    pub fn new() -> Inbox {
        Inbox::default()
    }

    /// Bytes buffered.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a received chunk (kept as it is, not copied).
    pub fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.len += chunk.len();
            self.chunks.push_back(chunk);
        }
    }

    /// The next sync header without consuming it; `None` until 8 bytes are
    /// buffered.
    pub fn peek_header(&self) -> Option<SyncHeader> {
        if self.len < HEADER_LEN {
            return None;
        }
        let mut bytes = [0u8; HEADER_LEN];
        self.copy_prefix(&mut bytes);
        SyncHeader::parse(&bytes).ok()
    }

    /// A copy of the first `len` buffered bytes (which must be there),
    /// without consuming them.
    pub fn peek(&self, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.copy_prefix(&mut out);
        out
    }

    /// The next sync header, consumed; `None` (and nothing consumed) until 8
    /// bytes are buffered.
    pub fn take_header(&mut self) -> Option<SyncHeader> {
        let header = self.peek_header()?;
        self.consume(HEADER_LEN);
        Some(header)
    }

    /// Fills `out` from the front of the buffered bytes (there must be enough).
    fn copy_prefix(&self, out: &mut [u8]) {
        assert!(out.len() <= self.len, "enough buffered data");
        let mut filled = 0;
        for chunk in &self.chunks {
            if filled == out.len() {
                break;
            }
            let take = (out.len() - filled).min(chunk.len());
            out[filled..filled + take].copy_from_slice(&chunk[..take]);
            filled += take;
        }
    }

    /// Drops `amount` buffered bytes (which must be there).
    pub fn consume(&mut self, mut amount: usize) {
        while amount > 0 {
            let front = self.chunks.front_mut().expect("enough buffered data");
            let take = amount.min(front.len());
            front.advance(take);
            if front.is_empty() {
                self.chunks.pop_front();
            }
            self.len -= take;
            amount -= take;
        }
    }

    /// Copies out `len` buffered bytes (which must be there).
    pub fn take_vec(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let piece = self.take_piece(len - out.len());
            out.extend_from_slice(&piece);
        }
        out
    }

    /// Up to `max` buffered bytes (at least one must be there), without
    /// copying: what is left of the front chunk, or its first `max` bytes.
    pub fn take_piece(&mut self, max: usize) -> Bytes {
        let front = self.chunks.front_mut().expect("buffered data");
        let piece = if front.len() <= max {
            self.chunks.pop_front().expect("a front chunk")
        } else {
            front.split_to(max)
        };
        self.len -= piece.len();
        piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxadb_wire::sync::{self as wire};

    fn inbox_of(chunks: &[&[u8]]) -> Inbox {
        let mut inbox = Inbox::new();
        for chunk in chunks {
            inbox.push(Bytes::copy_from_slice(chunk));
        }
        inbox
    }

    #[test]
    fn a_header_split_across_chunks_is_peeked_whole() {
        let header = wire::encode_data_header(300);
        let mut inbox = inbox_of(&[&header[..3], &header[3..], b"xyz"]);
        assert_eq!(inbox.len(), 11);
        let peeked = inbox.peek_header().expect("a header");
        assert_eq!(peeked.id, wire::ID_DATA);
        assert_eq!(peeked.len, 300);
        inbox.consume(HEADER_LEN);
        assert_eq!(inbox.len(), 3);
        assert_eq!(inbox.take_vec(3), b"xyz");
        assert!(inbox.is_empty());
        assert!(inbox.peek_header().is_none());
    }

    #[test]
    fn pieces_are_slices_of_the_chunks_and_peeks_copy_across_them() {
        let first = Bytes::from_static(b"abcdef");
        let mut inbox = Inbox::new();
        inbox.push(first.clone());
        inbox.push(Bytes::new());
        inbox.push(Bytes::from_static(b"ghij"));
        assert_eq!(inbox.peek(8), b"abcdefgh");
        assert_eq!(inbox.len(), 10);
        let head = inbox.take_piece(4);
        assert_eq!(&head[..], b"abcd");
        // Within the front chunk: the same memory, not a copy.
        assert_eq!(head.as_ptr(), first.as_ptr());
        // A piece never spans two chunks.
        assert_eq!(inbox.take_piece(4), Bytes::from_static(b"ef"));
        assert_eq!(inbox.take_piece(100), Bytes::from_static(b"ghij"));
        assert_eq!(inbox.len(), 0);
        assert!(inbox.take_header().is_none());
    }
}
