//! Device to host: bulk IN transfers read back as one byte stream.
//!
//! The device never sends a zero-length packet, so a transfer must not ask
//! for more than the device is known to be sending: a request that ends
//! beyond a device write whose last packet is full would wait for the next
//! write (and merge two ADB packets into one transfer, or hang if the device
//! waits for our answer first). AOSP's host therefore reads exactly 24 bytes
//! for a header and then exactly the payload (`docs/dev/zero_length_packet.md`).
//!
//! nusb accepts only IN requests that are multiples of `wMaxPacketSize`, so
//! each request here is the known length rounded up to one: the device ends
//! each header and payload it writes with a short packet unless its length
//! is a multiple of `wMaxPacketSize`, and then the rounded request is exact.
//! Either way a request never waits past the device's write. A payload is
//! split into several requests submitted at once ([`payload_transfers`]),
//! with the next header's request queued behind them, so the bus never
//! idles between transfers.
//!
//! The plan follows the bytes actually received, not the requests: a
//! transfer that ends early (a device that splits a payload oddly) or that
//! holds the start of the next packet (a device that writes header and
//! payload at once) only moves where the next request starts.

use std::collections::VecDeque;
use std::io;
use std::task::{ready, Context, Poll};

use nusb::transfer::{Buffer, Completion};
use oxadb_io::bulk_read::{BulkReader, BulkReads, FinishedReads};
use oxadb_wire::usb::payload_transfers;
use oxadb_wire::{Command, Header, HEADER_LEN, MAX_PAYLOAD};

use super::{transfer_error, BulkEndpoint};

/// Largest IN request: a 1 MiB payload is read as eight, all in flight.
pub(crate) const IN_CHUNK: usize = 128 * 1024;
/// IN requests in flight at once (AOSP's adbd keeps 8 reads queued too).
pub(crate) const IN_FLIGHT: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// Asked for the rest of a payload.
    Payload,
    /// Asked for a header (and takes whatever comes first).
    Header,
}

/// Which IN requests to make, from the ADB framing of the bytes received so
/// far. Pure logic: [`UsbReads`] submits what it asks for and feeds back
/// what arrives.
#[derive(Debug)]
pub(crate) struct ReadPlan {
    max_packet: usize,
    chunk: usize,
    max_in_flight: usize,
    /// The current packet's header bytes received so far.
    header: [u8; HEADER_LEN],
    header_have: usize,
    /// Bytes of the current packet's payload still to come (0: in a header).
    payload_left: usize,
    /// Requests submitted and not completed, oldest first.
    in_flight: VecDeque<(usize, Purpose)>,
    /// Until the first CNXN or AUTH arrives, transfers that do not start
    /// with one are dropped: what a previous host session left queued on
    /// the device (its last OKAY or CLSE, or the rest of a payload).
    synced: bool,
}

impl ReadPlan {
    pub(crate) fn new(max_packet: usize, chunk: usize, max_in_flight: usize) -> ReadPlan {
        let max_packet = max_packet.max(1);
        ReadPlan {
            max_packet,
            chunk: (chunk / max_packet).max(1) * max_packet,
            max_in_flight: max_in_flight.max(1),
            header: [0; HEADER_LEN],
            header_have: 0,
            payload_left: 0,
            in_flight: VecDeque::new(),
            synced: false,
        }
    }

    fn round_up(&self, len: usize) -> usize {
        len.div_ceil(self.max_packet).max(1) * self.max_packet
    }

    /// The next request to submit, if one is due; it counts as in flight
    /// from here on.
    pub(crate) fn next_request(&mut self) -> Option<usize> {
        if self.in_flight.len() >= self.max_in_flight {
            return None;
        }
        let request = if self.payload_left == 0 {
            // In a header: one request at a time, as nothing past it is known.
            if !self.in_flight.is_empty() {
                return None;
            }
            (
                self.round_up(HEADER_LEN - self.header_have),
                Purpose::Header,
            )
        } else {
            let covered: usize = self.in_flight.iter().map(|&(len, _)| len).sum();
            if covered < self.payload_left {
                let missing = self.payload_left - covered;
                let piece = payload_transfers(missing, self.chunk, self.max_packet)
                    .next()
                    .map_or(0, |range| range.len());
                (self.round_up(piece), Purpose::Payload)
            } else if self.in_flight.back().map(|&(_, purpose)| purpose) != Some(Purpose::Header) {
                // The payload is all asked for: queue the next header's read
                // behind it so that it is pending the moment the payload ends.
                (self.round_up(HEADER_LEN), Purpose::Header)
            } else {
                return None;
            }
        };
        self.in_flight.push_back(request);
        Some(request.0)
    }

    /// Takes the oldest request's result. Returns how many leading bytes of
    /// `data` to drop (stale data before the first CNXN or AUTH), or an error
    /// for a header not to be trusted.
    pub(crate) fn completed(&mut self, data: &[u8]) -> Result<usize, String> {
        let (requested, _) = self
            .in_flight
            .pop_front()
            .expect("a completion without a request");
        debug_assert!(data.len() <= requested);
        if !self.synced {
            if !self.starts_handshake(data) {
                return Ok(data.len());
            }
            self.synced = true;
        }
        let mut rest = data;
        while !rest.is_empty() {
            if self.payload_left > 0 {
                let take = self.payload_left.min(rest.len());
                self.payload_left -= take;
                rest = &rest[take..];
                continue;
            }
            let take = (HEADER_LEN - self.header_have).min(rest.len());
            self.header[self.header_have..self.header_have + take].copy_from_slice(&rest[..take]);
            self.header_have += take;
            rest = &rest[take..];
            if self.header_have == HEADER_LEN {
                // The engine checks the length against what was negotiated;
                // this only refuses to plan reads from a garbage length.
                let header =
                    Header::decode(&self.header, MAX_PAYLOAD).map_err(|e| e.to_string())?;
                self.header_have = 0;
                self.payload_left = header.data_length as usize;
            }
        }
        Ok(0)
    }

    /// Whether a transfer received before synchronisation starts with the
    /// device's first answer to our CNXN.
    fn starts_handshake(&self, data: &[u8]) -> bool {
        let Some(raw) = data.get(..HEADER_LEN) else {
            return false;
        };
        let raw: &[u8; HEADER_LEN] = raw.try_into().expect("header length");
        matches!(
            Header::decode(raw, MAX_PAYLOAD),
            Ok(Header {
                command: Command::Cnxn | Command::Auth,
                ..
            })
        )
    }

    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

/// The device's bulk IN endpoint as a byte stream for
/// [`oxadb_io::Connection::start`].
pub(crate) type UsbReader<E> = BulkReader<UsbReads<E>>;

/// The reader of the device behind `endpoint`, named `label` in errors.
pub(crate) fn usb_reader<E: BulkEndpoint>(endpoint: E, label: String) -> UsbReader<E> {
    BulkReader::new(UsbReads::new(endpoint, label))
}

/// The bulk IN requests [`ReadPlan`] asks for, on `endpoint`.
pub(crate) struct UsbReads<E> {
    endpoint: E,
    plan: ReadPlan,
    /// Buffers to reuse for requests (zero-copy ones cost an mmap each).
    spare: Vec<Buffer>,
    /// Names the device in errors.
    label: String,
    failed: Option<(io::ErrorKind, String)>,
}

impl<E: BulkEndpoint> UsbReads<E> {
    fn new(endpoint: E, label: String) -> UsbReads<E> {
        let plan = ReadPlan::new(endpoint.max_packet_size(), IN_CHUNK, IN_FLIGHT);
        UsbReads {
            endpoint,
            plan,
            spare: Vec::new(),
            label,
            failed: None,
        }
    }

    #[cfg(test)]
    pub(crate) fn endpoint(&self) -> &E {
        &self.endpoint
    }

    fn fail(&mut self, kind: io::ErrorKind, message: String) -> io::Error {
        self.failed = Some((kind, message.clone()));
        io::Error::new(kind, message)
    }

    fn take_completion(
        &mut self,
        completion: Completion,
        finished: &mut FinishedReads<Buffer>,
    ) -> io::Result<()> {
        if let Err(error) = completion.status {
            let (kind, message) = transfer_error(&self.label, "reading", error);
            return Err(self.fail(kind, message));
        }
        let buffer = completion.buffer;
        let len = buffer.len().min(completion.actual_len);
        match self.plan.completed(&buffer[..len]) {
            Ok(skip) => {
                if skip > 0 {
                    tracing::debug!(
                        device = %self.label,
                        bytes = skip,
                        "dropped data queued before our CNXN"
                    );
                }
                if skip < len {
                    finished.push(buffer, skip..len);
                } else {
                    self.spare.push(buffer);
                }
                Ok(())
            }
            Err(reason) => Err(self.fail(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: bad packet header from the device: {reason}",
                    self.label
                ),
            )),
        }
    }
}

impl<E: BulkEndpoint> BulkReads for UsbReads<E> {
    type Buffer = Buffer;

    fn submit_due(&mut self) -> io::Result<()> {
        // After a failure nothing more is asked of the device; the error
        // comes from `poll_finished`, once the data before it is read.
        if self.failed.is_some() {
            return Ok(());
        }
        while let Some(len) = self.plan.next_request() {
            let mut buffer = match self.spare.iter().position(|b| b.capacity() >= len) {
                Some(index) => self.spare.swap_remove(index),
                None => self.endpoint.allocate(len.max(IN_CHUNK)),
            };
            buffer.clear();
            buffer.set_requested_len(len);
            self.endpoint.submit(buffer);
        }
        Ok(())
    }

    fn poll_finished(
        &mut self,
        cx: &mut Context<'_>,
        finished: &mut FinishedReads<Buffer>,
    ) -> Poll<io::Result<()>> {
        if let Some((kind, message)) = &self.failed {
            return Poll::Ready(Err(io::Error::new(*kind, message.clone())));
        }
        let completion = ready!(self.endpoint.poll_next_complete(cx));
        Poll::Ready(self.take_completion(completion, finished))
    }

    fn reuse(&mut self, buffer: Buffer) {
        self.spare.push(buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usb::tests::{block_on_ready, FakeIn};
    use nusb::transfer::TransferError;
    use tokio::io::AsyncReadExt;

    fn packet(command: Command, payload: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let header = Header {
            command,
            arg0: 1,
            arg1: 2,
            data_length: payload.len() as u32,
            data_crc32: 0,
        };
        (header.encode().to_vec(), payload.to_vec())
    }

    fn cnxn() -> (Vec<u8>, Vec<u8>) {
        packet(
            Command::Cnxn,
            b"device::ro.product.name=x;features=shell_v2",
        )
    }

    /// Reads until `expected` bytes arrived; panics if a request stalls
    /// (waits for data the device never sends).
    fn read_all(reader: &mut UsbReader<FakeIn>, expected: usize) -> Vec<u8> {
        let mut out = vec![0; expected];
        block_on_ready(reader.read_exact(&mut out)).expect("read");
        out
    }

    /// The device writes each header and each payload separately, as AOSP's
    /// adbd does, the payload in 16 KiB pieces: every packet comes through
    /// whole, in order, whatever its size relative to wMaxPacketSize.
    #[test]
    fn header_then_payload_sizes_never_stall() {
        for max_packet in [64, 512, 1024] {
            let mut writes = Vec::new();
            let mut expected = Vec::new();
            let (h, p) = cnxn();
            for payload_len in [
                0,
                1,
                max_packet - 1,
                max_packet,
                max_packet + 1,
                16384,
                40_000,
                IN_CHUNK,
                1024 * 1024,
                3 * max_packet,
            ] {
                let payload: Vec<u8> = (0..payload_len).map(|i| (i * 7 % 251) as u8).collect();
                let (header, payload) = packet(Command::Wrte, &payload);
                expected.extend_from_slice(&header);
                expected.extend_from_slice(&payload);
                writes.push(header);
                for piece in payload.chunks(16384) {
                    writes.push(piece.to_vec());
                }
            }
            let mut all = h.clone();
            all.extend_from_slice(&p);
            all.extend_from_slice(&expected);
            let mut script = vec![h, p];
            script.extend(writes);
            let fake = FakeIn::new(max_packet, script);
            let mut reader = usb_reader(fake, "test".into());
            assert_eq!(read_all(&mut reader, all.len()), all, "mps {max_packet}");
            let stats = reader.get_ref().endpoint().stats();
            assert!(
                stats.max_pending > 2,
                "payload reads are pipelined: {stats:?}"
            );
            assert_eq!(stats.overflows, 0);
        }
    }

    /// Devices that write a header and its payload at once, or a payload in
    /// pieces that are not multiples of wMaxPacketSize, or at full speed with
    /// packets smaller than a header: the stream stays intact.
    #[test]
    fn odd_splits_and_merges_come_through_intact() {
        for max_packet in [8, 16, 64, 512] {
            let (h, p) = cnxn();
            let (h2, p2) = packet(Command::Wrte, &vec![0xab; 1000]);
            let (h3, p3) = packet(Command::Okay, &[]);
            let (h4, p4) = packet(Command::Wrte, &vec![0xcd; 4 * 512]);
            let mut all = Vec::new();
            for part in [&h, &p, &h2, &p2, &h3, &p3, &h4, &p4] {
                all.extend_from_slice(part);
            }
            let script = vec![
                // CNXN header and payload in one write.
                [h.clone(), p.clone()].concat(),
                // A header, then its payload in odd pieces.
                h2.clone(),
                p2[..100].to_vec(),
                p2[100..613].to_vec(),
                p2[613..].to_vec(),
                // An OKAY glued to the next header.
                [h3.clone(), h4.clone()].concat(),
                p4[..512].to_vec(),
                p4[512..].to_vec(),
            ];
            let mut reader = usb_reader(FakeIn::new(max_packet, script), "test".into());
            assert_eq!(read_all(&mut reader, all.len()), all, "mps {max_packet}");
            assert_eq!(reader.get_ref().endpoint().stats().overflows, 0);
        }
    }

    #[test]
    fn plan_asks_for_header_then_payload_pieces_then_next_header() {
        let mut plan = ReadPlan::new(512, 16 * 1024, 8);
        assert_eq!(plan.next_request(), Some(512), "header, rounded up");
        assert_eq!(plan.next_request(), None, "nothing past a header is known");
        let (header, _) = packet(Command::Cnxn, &[0; 40_000]);
        assert_eq!(plan.completed(&header), Ok(0));
        let mut requests = Vec::new();
        while let Some(len) = plan.next_request() {
            requests.push(len);
        }
        // 40000 = 2 * 16384 + 7232; the last rounded up to 7680; then the
        // next header's read.
        assert_eq!(requests, vec![16384, 16384, 7680, 512]);
        assert_eq!(plan.in_flight(), 4);
        assert_eq!(plan.completed(&[0; 16384]), Ok(0));
        assert_eq!(plan.next_request(), None, "all of it is asked for");
        // The second piece ends early (the device split its write) and the
        // third takes 7232: 15384 bytes are left, the first 512 of them in
        // the header read's reach. The other 14872 are asked for (rounded up
        // to 15360), and a new header read goes last.
        assert_eq!(plan.completed(&[0; 1000]), Ok(0));
        assert_eq!(plan.completed(&[0; 7232]), Ok(0));
        assert_eq!(plan.next_request(), Some(15_360));
        assert_eq!(plan.next_request(), Some(512));
        assert_eq!(plan.next_request(), None);
    }

    #[test]
    fn in_flight_is_capped() {
        let mut plan = ReadPlan::new(512, 1024, 3);
        plan.next_request();
        let (header, _) = packet(Command::Cnxn, &[0; 10_000]);
        plan.completed(&header).unwrap();
        assert_eq!(plan.next_request(), Some(1024));
        assert_eq!(plan.next_request(), Some(1024));
        assert_eq!(plan.next_request(), Some(1024));
        assert_eq!(plan.next_request(), None);
    }

    #[test]
    fn stale_data_before_the_handshake_is_dropped() {
        let (okay, _) = packet(Command::Okay, &[]);
        let (h, p) = cnxn();
        let mut all = h.clone();
        all.extend_from_slice(&p);
        // A previous session's OKAY and the tail of a payload it never read.
        let script = vec![okay, vec![0x55; 1500], h, p];
        let mut reader = usb_reader(FakeIn::new(512, script), "test".into());
        assert_eq!(read_all(&mut reader, all.len()), all);
    }

    #[test]
    fn garbage_headers_are_refused_naming_the_device() {
        let (h, p) = cnxn();
        let mut bad_magic = packet(Command::Okay, &[]).0;
        bad_magic[20] ^= 1;
        let mut huge = packet(Command::Wrte, &[]).0;
        huge[12..16].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        for (garbage, what) in [(bad_magic, "bad magic"), (huge, "exceeds max payload")] {
            let script = vec![h.clone(), p.clone(), garbage];
            let mut reader = usb_reader(
                FakeIn::new(512, script),
                "USB device R58M (bus 1, address 3)".into(),
            );
            let mut sink = Vec::new();
            let error = block_on_ready(reader.read_to_end(&mut sink)).unwrap_err();
            let text = error.to_string();
            assert!(
                text.contains("USB device R58M (bus 1, address 3)"),
                "{text}"
            );
            assert!(text.contains(what), "{text}");
        }
    }

    #[test]
    fn disconnect_ends_the_stream_with_an_error() {
        let (h, p) = cnxn();
        let mut fake = FakeIn::new(512, vec![h.clone(), p.clone()]);
        fake.then_fail(TransferError::Disconnected);
        let mut reader = usb_reader(fake, "USB device R58M (bus 1, address 3)".into());
        let mut sink = Vec::new();
        let error = block_on_ready(reader.read_to_end(&mut sink)).unwrap_err();
        assert_eq!(sink.len(), h.len() + p.len());
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
        assert!(
            error.to_string().contains("R58M (bus 1, address 3)")
                && error.to_string().contains("disconnected"),
            "{error}"
        );
        // Later reads fail the same way rather than waiting.
        let mut byte = [0u8; 1];
        assert!(block_on_ready(reader.read(&mut byte)).is_err());
    }
}
