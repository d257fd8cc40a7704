//! ADB packets over the two bulk endpoints.
//!
//! Host to device ([`BulkOut`]): the device reads fixed-size transfers, a
//! multiple of every speed's `wMaxPacketSize`; the host ends each of its
//! transfers with a short packet or a zero-length one, so the reads, taken
//! in submission order, are the host's packets back to back. They become a
//! byte stream for the engine's reader through `oxadb_io`'s
//! [`BulkReader`], the same as the host's bulk IN reads.
//!
//! Device to host ([`BulkIn`]): the host reads exactly 24 bytes for a
//! header and then exactly the payload, so each header is one transfer and
//! the payload follows in transfers that end with a short packet only at
//! its very end; no zero-length packets (AOSP `docs/dev/zero_length_packet.md`).

use std::collections::BTreeMap;
use std::future::poll_fn;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use oxadb_io::bulk_read::{BulkReader, BulkReads, FinishedReads};
use oxadb_io::{OutgoingPacket, PacketSink, ReadRanges};
use oxadb_wire::usb::{payload_transfers, SUPER_SPEED_BULK_MAX_PACKET};
use tokio::sync::Notify;

use crate::endpoint::{annotate, Buffer, Completion, Endpoint};

/// Bytes per bulk-out read: a multiple of 64, 512 and 1024, and no larger
/// than every controller handles (adbd uses the same).
pub const READ_SIZE: usize = 16 * 1024;
/// Reads kept queued, so the host never waits for the device to ask.
pub const READ_DEPTH: usize = 8;
/// Largest bulk-in transfer: the kernel allocates each one contiguously.
pub const WRITE_SIZE: usize = 16 * 1024;
/// Bulk-in transfers kept in flight.
pub const WRITE_DEPTH: usize = 8;
/// Payload transfers are cut at multiples of this: 1024 is a multiple of
/// every speed's bulk packet size, so no cut ends with a short packet.
const WRITE_CUT: usize = SUPER_SPEED_BULK_MAX_PACKET as usize;

/// Ties a connection's two directions together: once the reader is gone
/// (the connection ended), the writer stops waiting for the host.
#[derive(Default)]
struct Link {
    reader_gone: AtomicBool,
    notify: Notify,
}

/// The two directions of one ADB connection over USB, for
/// [`oxadb_io::Connection::start`].
pub fn bulk_pair<O: Endpoint, I: Endpoint>(bulk_out: O, bulk_in: I) -> (BulkOut<O>, BulkIn<I>) {
    let link = Arc::new(Link::default());
    (
        BulkReader::new(BulkOutReads::new(
            bulk_out,
            READ_SIZE,
            READ_DEPTH,
            link.clone(),
        )),
        BulkIn::new(bulk_in, WRITE_SIZE, WRITE_DEPTH, link),
    )
}

/// The host's packets as a byte stream.
pub type BulkOut<E> = BulkReader<BulkOutReads<E>>;

/// The bulk-out endpoint's reads: keeps `depth` of them queued and hands
/// them to the stream in the order they were submitted (AIO may report
/// them out of order). The stream never ends: the endpoint fails instead
/// (ESHUTDOWN once the host goes away).
pub struct BulkOutReads<E: Endpoint> {
    endpoint: E,
    /// Buffers ready to be queued again.
    free: Vec<Vec<u8>>,
    next_id: u64,
    /// The id whose data comes next in the stream.
    next_deliver: u64,
    /// Finished reads waiting for their turn: id -> (buffer, bytes in it).
    waiting: BTreeMap<u64, (Vec<u8>, usize)>,
    /// Some data has arrived on this connection.
    received: bool,
    done: Vec<Completion>,
    link: Arc<Link>,
}

impl<E: Endpoint> BulkOutReads<E> {
    fn new(endpoint: E, size: usize, depth: usize, link: Arc<Link>) -> BulkOutReads<E> {
        BulkOutReads {
            endpoint,
            free: (0..depth).map(|_| vec![0; size]).collect(),
            next_id: 0,
            next_deliver: 0,
            waiting: BTreeMap::new(),
            received: false,
            done: Vec::new(),
            link,
        }
    }

    fn take_done(&mut self) -> io::Result<()> {
        for completion in self.done.drain(..) {
            let Buffer::Read(buffer) = completion.buffer else {
                unreachable!("bulk-out submits reads only");
            };
            let len = match completion.result {
                Ok(len) => len.min(buffer.len()),
                // A host resynchronising before it sends anything clears
                // the endpoint's halt, which cancels queued reads with
                // EPIPE on newer kernels: nothing was lost, read on.
                Err(error) if !self.received && error.raw_os_error() == Some(libc::EPIPE) => {
                    tracing::debug!(path = %self.endpoint.path().display(), "read cancelled by a halt before any data; reading on");
                    0
                }
                Err(error) => return Err(annotate(self.endpoint.path(), "reading", error)),
            };
            self.received |= len > 0;
            self.waiting.insert(completion.id, (buffer, len));
        }
        Ok(())
    }
}

impl<E: Endpoint> BulkReads for BulkOutReads<E> {
    type Buffer = Vec<u8>;

    /// Queues every free buffer.
    fn submit_due(&mut self) -> io::Result<()> {
        while let Some(buffer) = self.free.pop() {
            self.endpoint.submit(self.next_id, Buffer::Read(buffer))?;
            self.next_id += 1;
        }
        Ok(())
    }

    fn poll_finished(
        &mut self,
        cx: &mut Context<'_>,
        finished: &mut FinishedReads<Vec<u8>>,
    ) -> Poll<io::Result<()>> {
        ready!(self.endpoint.poll_complete(cx, &mut self.done))?;
        self.take_done()?;
        // A zero-length read is the host's ZLP: it only ended a transfer.
        while let Some((buffer, len)) = self.waiting.remove(&self.next_deliver) {
            self.next_deliver += 1;
            finished.push(buffer, 0..len);
        }
        Poll::Ready(Ok(()))
    }

    fn reuse(&mut self, buffer: Vec<u8>) {
        self.free.push(buffer);
    }
}

impl<E: Endpoint> Drop for BulkOutReads<E> {
    fn drop(&mut self) {
        self.link.reader_gone.store(true, Ordering::Release);
        self.link.notify.notify_waiters();
    }
}

/// Sends packets to the host: each header a 24-byte transfer, each payload
/// in transfers of at most `size` bytes, with at most `depth` in flight.
/// Returns once a batch is queued; a failed transfer fails a later call.
pub struct BulkIn<E: Endpoint> {
    endpoint: E,
    size: usize,
    depth: usize,
    in_flight: usize,
    next_id: u64,
    done: Vec<Completion>,
    link: Arc<Link>,
}

impl<E: Endpoint> BulkIn<E> {
    fn new(endpoint: E, size: usize, depth: usize, link: Arc<Link>) -> BulkIn<E> {
        BulkIn {
            endpoint,
            size,
            depth,
            in_flight: 0,
            next_id: 0,
            done: Vec::new(),
            link,
        }
    }

    fn gone(&self) -> io::Error {
        annotate(
            self.endpoint.path(),
            "writing",
            io::Error::new(io::ErrorKind::ConnectionAborted, "the connection ended"),
        )
    }

    /// Checks finished transfers: each must have moved all its bytes.
    fn take_done(&mut self) -> io::Result<()> {
        self.in_flight -= self.done.len();
        for completion in self.done.drain(..) {
            let expected = completion.buffer.len();
            match completion.result {
                Ok(sent) if sent == expected => {}
                Ok(sent) => {
                    return Err(annotate(
                        self.endpoint.path(),
                        "writing",
                        io::Error::new(
                            io::ErrorKind::WriteZero,
                            format!("sent {sent} of {expected} bytes"),
                        ),
                    ))
                }
                Err(error) => return Err(annotate(self.endpoint.path(), "writing", error)),
            }
        }
        Ok(())
    }

    /// Collects what has finished without waiting (registering a wake-up
    /// that may come spuriously later, which is harmless).
    async fn collect(&mut self) -> io::Result<()> {
        poll_fn(|cx| {
            Poll::Ready(match self.endpoint.poll_complete(cx, &mut self.done) {
                Poll::Ready(result) => result,
                Poll::Pending => Ok(()),
            })
        })
        .await?;
        self.take_done()
    }

    /// Waits for at least one transfer to finish, or for the reader to go.
    async fn wait_one(&mut self) -> io::Result<()> {
        let link = self.link.clone();
        let gone = link.notify.notified();
        tokio::pin!(gone);
        gone.as_mut().enable();
        if link.reader_gone.load(Ordering::Acquire) {
            return Err(self.gone());
        }
        tokio::select! {
            result = poll_fn(|cx| self.endpoint.poll_complete(cx, &mut self.done)) => result?,
            _ = gone => return Err(self.gone()),
        }
        self.take_done()
    }

    async fn send(&mut self, data: Bytes) -> io::Result<()> {
        while self.in_flight >= self.depth {
            self.wait_one().await?;
        }
        self.endpoint.submit(self.next_id, Buffer::Write(data))?;
        self.next_id += 1;
        self.in_flight += 1;
        Ok(())
    }
}

impl<E: Endpoint> PacketSink for BulkIn<E> {
    async fn write_packets(&mut self, batch: &mut Vec<OutgoingPacket>) -> io::Result<()> {
        self.collect().await?;
        for packet in batch.drain(..) {
            // File ranges are read here: AIO transfers take memory.
            let payload = packet.payload.read_into_bytes()?;
            self.send(Bytes::copy_from_slice(&packet.header)).await?;
            for range in payload_transfers(payload.len(), self.size, WRITE_CUT) {
                self.send(payload.slice(range)).await?;
            }
        }
        Ok(())
    }

    async fn shutdown(&mut self) {
        // Nothing to flush: what is in flight is cancelled when the endpoint
        // is dropped (the connection is over; the host reads no more of it).
    }
}
