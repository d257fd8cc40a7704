//! A stream's outgoing bytes: chunks handed over whole (no copy) and small
//! writes gathered into one buffer so they leave as one WRTE.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

#[derive(Debug, Default)]
pub struct SendQueue {
    /// Whole chunks, in order, all before `tail`.
    chunks: VecDeque<Bytes>,
    /// Copied writes since the last whole chunk.
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
        self.tail.clear();
        self.len = 0;
    }

    /// Appends a copy of `data`.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        self.tail.extend_from_slice(data);
        self.len += data.len();
    }

    /// Appends `data` without copying it.
    pub fn push_bytes(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        if !self.tail.is_empty() {
            self.chunks.push_back(self.tail.split().freeze());
        }
        self.len += data.len();
        self.chunks.push_back(data);
    }

    /// Takes up to `max` bytes for one packet. A whole chunk is never merged
    /// with its neighbours (that would cost the copy it was handed over to
    /// avoid); it is split when longer than `max`.
    pub fn take(&mut self, max: usize) -> Bytes {
        let taken = match self.chunks.front_mut() {
            Some(front) if front.len() > max => front.split_to(max),
            Some(_) => self.chunks.pop_front().expect("front exists"),
            None => {
                let n = self.tail.len().min(max);
                self.tail.split_to(n).freeze()
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
        assert_eq!(queue.take(100), &b"abcd"[..]);
        assert_eq!(queue.take(4), &b"0123"[..]);
        assert_eq!(queue.take(100), &b"456789"[..]);
        assert_eq!(queue.take(1), &b"x"[..]);
        assert_eq!(queue.take(100), &b"y"[..]);
        assert!(queue.is_empty());
        assert_eq!(queue.take(100), Bytes::new());
    }

    #[test]
    fn whole_chunks_are_not_copied() {
        let mut queue = SendQueue::default();
        let chunk = Bytes::from(vec![7u8; 1000]);
        let pointer = chunk.as_ptr();
        queue.push_bytes(chunk);
        assert_eq!(queue.take(4096).as_ptr(), pointer);
    }
}
