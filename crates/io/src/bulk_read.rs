//! USB bulk reads handed to the driver as one byte stream, for both ends:
//! oxadbd's bulk-out reads (FunctionFS, `oxadb-ffs`) and the host's bulk IN
//! reads (nusb, `oxadb`'s `usb/read.rs`).
//!
//! Each end keeps its own reads queued on its endpoint and decides which to
//! ask for ([`BulkReads`]); the finished ones, in stream order, are copied
//! out here and their buffers go back to the end to be queued again.

use std::collections::VecDeque;
use std::io;
use std::ops::{Deref, Range};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// One end's bulk reads: what it submits, what finished, buffer reuse.
pub trait BulkReads: Unpin {
    /// A read's buffer, its received bytes at the front.
    type Buffer: Deref<Target = [u8]> + Unpin;

    /// Queues the reads that are due. Called after data was handed out too,
    /// so buffers handed back are queued again while the reader works.
    fn submit_due(&mut self) -> io::Result<()>;

    /// Waits until reads finish, then appends the ones whose turn in the
    /// stream has come to `finished` (possibly none, for example a read that
    /// finished ahead of an earlier one, or that held nothing to keep).
    fn poll_finished(
        &mut self,
        cx: &mut Context<'_>,
        finished: &mut FinishedReads<Self::Buffer>,
    ) -> Poll<io::Result<()>>;

    /// Takes back a buffer whose bytes have all been handed out.
    fn reuse(&mut self, buffer: Self::Buffer);
}

/// Finished reads whose bytes have not all been handed out, in stream order.
pub struct FinishedReads<B> {
    queue: VecDeque<(B, Range<usize>)>,
}

impl<B: Deref<Target = [u8]>> FinishedReads<B> {
    /// Appends a read whose bytes `data` (a range of `buffer`, possibly
    /// empty) come next in the stream.
    pub fn push(&mut self, buffer: B, data: Range<usize>) {
        debug_assert!(data.end <= buffer.len());
        self.queue.push_back((buffer, data));
    }
}

/// The reads of one bulk endpoint as an [`AsyncRead`] byte stream, for
/// [`crate::Connection::start`]. An empty read (a zero-length packet that
/// only ended a transfer) is no end of file: the stream ends only with an
/// error from the endpoint.
pub struct BulkReader<R: BulkReads> {
    reads: R,
    finished: FinishedReads<R::Buffer>,
}

impl<R: BulkReads> BulkReader<R> {
    pub fn new(reads: R) -> BulkReader<R> {
        BulkReader {
            reads,
            finished: FinishedReads {
                queue: VecDeque::new(),
            },
        }
    }

    pub fn get_ref(&self) -> &R {
        &self.reads
    }

    /// Copies finished bytes, in order, into `out`; emptied buffers go back
    /// to the end.
    fn hand_out(&mut self, out: &mut ReadBuf<'_>) {
        while let Some((buffer, data)) = self.finished.queue.front_mut() {
            let n = data.len().min(out.remaining());
            out.put_slice(&buffer[data.start..data.start + n]);
            data.start += n;
            if data.start < data.end {
                // `out` is full.
                return;
            }
            let (buffer, _) = self.finished.queue.pop_front().expect("just seen");
            self.reads.reuse(buffer);
        }
    }
}

impl<R: BulkReads> AsyncRead for BulkReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            let before = out.remaining();
            this.hand_out(out);
            this.reads.submit_due()?;
            if out.remaining() < before {
                return Poll::Ready(Ok(()));
            }
            ready!(this.reads.poll_finished(cx, &mut this.finished))?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Reads scripted as (bytes received, leading bytes to skip), finished
    /// `per_poll` at a time, up to `depth` submitted at a time; then an error.
    struct ScriptedReads {
        script: VecDeque<(Vec<u8>, usize)>,
        depth: usize,
        per_poll: usize,
        submitted: usize,
        max_submitted: usize,
        reused: usize,
        allocated: usize,
        spare: Vec<Vec<u8>>,
        error: io::ErrorKind,
    }

    impl ScriptedReads {
        fn new(script: Vec<(Vec<u8>, usize)>, depth: usize) -> ScriptedReads {
            ScriptedReads {
                script: script.into(),
                depth,
                per_poll: 1,
                submitted: 0,
                max_submitted: 0,
                reused: 0,
                allocated: 0,
                spare: Vec::new(),
                error: io::ErrorKind::ConnectionAborted,
            }
        }
    }

    impl BulkReads for ScriptedReads {
        type Buffer = Vec<u8>;

        fn submit_due(&mut self) -> io::Result<()> {
            while self.submitted < self.depth.min(self.script.len()) {
                if self.spare.pop().is_none() {
                    self.allocated += 1;
                }
                self.submitted += 1;
            }
            self.max_submitted = self.max_submitted.max(self.submitted);
            Ok(())
        }

        fn poll_finished(
            &mut self,
            _cx: &mut Context<'_>,
            finished: &mut FinishedReads<Vec<u8>>,
        ) -> Poll<io::Result<()>> {
            if self.script.is_empty() {
                return Poll::Ready(Err(self.error.into()));
            }
            for _ in 0..self.per_poll {
                let Some((bytes, skip)) = self.script.pop_front() else {
                    break;
                };
                assert!(
                    self.submitted > 0,
                    "a read finished that was never submitted"
                );
                self.submitted -= 1;
                let len = bytes.len();
                finished.push(bytes, skip..len);
            }
            Poll::Ready(Ok(()))
        }

        fn reuse(&mut self, buffer: Vec<u8>) {
            self.reused += 1;
            self.spare.push(buffer);
        }
    }

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    #[test]
    fn reads_come_out_in_order_whatever_the_callers_buffer_size() {
        let pieces: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 1 + 37 * i as usize]).collect();
        let expected = pieces.concat();
        for caller_buffer in [1, 7, 100, 4096, 1 << 20] {
            let script = pieces.iter().map(|piece| (piece.clone(), 0)).collect();
            let mut reads = ScriptedReads::new(script, 4);
            reads.per_poll = 3;
            let mut reader = BulkReader::new(reads);
            let mut got = Vec::new();
            let mut buffer = vec![0u8; caller_buffer];
            loop {
                match block_on(reader.read(&mut buffer)) {
                    Ok(n) => {
                        assert!(n > 0, "no end of file before the error");
                        got.extend_from_slice(&buffer[..n]);
                    }
                    Err(error) => {
                        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
                        break;
                    }
                }
            }
            assert!(got == expected, "caller buffer {caller_buffer}");
        }
    }

    #[test]
    fn a_read_fills_the_callers_buffer_from_several_finished_reads() {
        let script = vec![(vec![1; 10], 0), (vec![2; 10], 0), (vec![3; 10], 0)];
        let mut reads = ScriptedReads::new(script, 3);
        reads.per_poll = 3;
        let mut reader = BulkReader::new(reads);
        let mut buffer = [0u8; 25];
        assert_eq!(block_on(reader.read(&mut buffer)).unwrap(), 25);
        assert_eq!(buffer[..], [[1u8; 10], [2; 10], [3; 10]].concat()[..25]);
        assert_eq!(block_on(reader.read(&mut buffer)).unwrap(), 5);
        assert_eq!(buffer[..5], [3; 5]);
    }

    #[test]
    fn empty_reads_and_skipped_bytes_are_left_out_and_not_an_end() {
        let script = vec![
            (b"stale".to_vec(), 5),
            (Vec::new(), 0),
            (b"xxhello".to_vec(), 2),
            (Vec::new(), 0),
            (b" world".to_vec(), 0),
        ];
        let mut reader = BulkReader::new(ScriptedReads::new(script, 2));
        let mut got = [0u8; 11];
        block_on(reader.read_exact(&mut got)).unwrap();
        assert_eq!(&got, b"hello world");
        let mut more = [0u8; 1];
        assert_eq!(
            block_on(reader.read(&mut more)).unwrap_err().kind(),
            io::ErrorKind::ConnectionAborted
        );
        // Every buffer, empty or not, went back to be queued again.
        assert_eq!(reader.get_ref().reused, 5);
    }

    #[test]
    fn handed_back_buffers_are_queued_again_at_once() {
        let script = (0..12u8).map(|i| (vec![i; 100], 0)).collect();
        let mut reader = BulkReader::new(ScriptedReads::new(script, 4));
        let mut got = vec![0u8; 1200];
        block_on(reader.read_exact(&mut got)).unwrap();
        let reads = reader.get_ref();
        assert_eq!(reads.max_submitted, 4);
        assert_eq!(reads.allocated, 4, "buffers are reused, not made anew");
    }

    #[test]
    fn an_empty_callers_buffer_reads_nothing_and_waits_for_nothing() {
        let mut reader = BulkReader::new(ScriptedReads::new(Vec::new(), 1));
        assert_eq!(block_on(reader.read(&mut [])).unwrap(), 0);
    }
}
