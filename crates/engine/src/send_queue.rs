//! A stream's outgoing bytes: chunks handed over whole (no copy) and small
//! writes gathered into one buffer so they leave as one WRTE. Either may hold
//! file ranges ([`Payload`]) that the writer sends without reading them.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use oxadb_wire::Payload;

#[derive(Debug, Default)]
pub struct SendQueue {
    /// Whole chunks, in order, all before the tail.
    chunks: VecDeque<Payload>,
    /// Appended payloads (file ranges with their frame headers) since the
    /// last whole chunk, merged into packets like copied writes; all before
    /// `tail`.
    tail_parts: Payload,
    /// Copied writes since the last whole chunk or appended payload.
    tail: BytesMut,
    len: usize,
}

impl SendQueue {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.chunks.clear();
        self.tail_parts = Payload::default();
        self.tail.clear();
        self.len = 0;
    }

    /// Appends a copy of `data`.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        self.tail.extend_from_slice(data);
        self.len += data.len();
    }

    /// Appends `data` to the tail without copying it: packets are cut from
    /// the tail at the payload limit exactly as from copied writes, so a
    /// writer that switches between the two sends the same WRTEs.
    pub fn append_payload(&mut self, data: Payload) {
        if data.is_empty() {
            return;
        }
        self.seal_tail_bytes();
        self.len += data.len();
        self.tail_parts.append(data);
    }

    fn seal_tail_bytes(&mut self) {
        if !self.tail.is_empty() {
            let bytes = self.tail.split().freeze();
            self.tail_parts.append(Payload::from(bytes));
        }
    }

    /// Appends `data` without copying it.
    pub fn push_bytes(&mut self, data: Bytes) {
        self.push_payload(Payload::from(data));
    }

    /// Appends a whole chunk (bytes or file ranges): it is never merged with
    /// its neighbours into one packet.
    pub fn push_payload(&mut self, data: Payload) {
        if data.is_empty() {
            return;
        }
        self.seal_tail_bytes();
        if !self.tail_parts.is_empty() {
            self.chunks.push_back(std::mem::take(&mut self.tail_parts));
        }
        self.len += data.len();
        self.chunks.push_back(data);
    }

    /// Takes up to `max` bytes for one packet. A whole chunk is never merged
    /// with its neighbours (that would cost the copy it was handed over to
    /// avoid); it is split when longer than `max`.
    pub fn take(&mut self, max: usize) -> Payload {
        let taken = match self.chunks.front_mut() {
            Some(front) if front.len() > max => front.split_to(max),
            Some(_) => self.chunks.pop_front().expect("front exists"),
            None if self.tail_parts.is_empty() => {
                let n = self.tail.len().min(max);
                Payload::from(self.tail.split_to(n).freeze())
            }
            None => {
                let mut taken = self.tail_parts.split_to(max.min(self.tail_parts.len()));
                let n = self.tail.len().min(max - taken.len());
                if n > 0 {
                    taken.append(Payload::from(self.tail.split_to(n).freeze()));
                }
                taken
            }
        };
        self.len -= taken.len();
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_splits_at_max() {
        let mut queue = SendQueue::default();
        queue.extend_from_slice(b"ab");
        queue.extend_from_slice(b"cd");
        queue.push_bytes(Bytes::from_static(b"0123456789"));
        queue.extend_from_slice(b"xy");
        assert_eq!(queue.len(), 16);
        let mut take = |max| queue.take(max).in_memory().unwrap();
        assert_eq!(take(100), &b"abcd"[..]);
        assert_eq!(take(4), &b"0123"[..]);
        assert_eq!(take(100), &b"456789"[..]);
        assert_eq!(take(1), &b"x"[..]);
        assert_eq!(take(100), &b"y"[..]);
        assert_eq!(take(100), Bytes::new());
        assert!(queue.is_empty());
    }

    #[test]
    fn whole_chunks_are_not_copied() {
        let mut queue = SendQueue::default();
        let chunk = Bytes::from(vec![7u8; 1000]);
        let pointer = chunk.as_ptr();
        queue.push_bytes(chunk);
        assert_eq!(queue.take(4096).in_memory().unwrap().as_ptr(), pointer);
    }

    #[test]
    fn appended_payloads_merge_with_copied_writes() {
        let mut queue = SendQueue::default();
        queue.extend_from_slice(b"ab");
        queue.append_payload(Payload::from(Bytes::from_static(b"cdef")));
        queue.extend_from_slice(b"gh");
        queue.append_payload(Payload::from(Bytes::from_static(b"ij")));
        assert_eq!(queue.len(), 10);
        let mut take = |max| queue.take(max).in_memory().unwrap();
        assert_eq!(take(3), &b"abc"[..]);
        assert_eq!(take(6), &b"defghi"[..]);
        assert_eq!(take(6), &b"j"[..]);
        assert!(queue.is_empty());
    }
}
