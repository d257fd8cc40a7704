//! Host to device: each packet's header and payload as bulk OUT transfers.
//!
//! The device reads fixed-size buffers (AOSP's adbd 16 KiB) without looking
//! at the ADB framing, and a read ends only when its buffer is full or a
//! short packet arrives. So every header and every payload must end with a
//! short packet: when its length is a multiple of `wMaxPacketSize` a
//! zero-length packet follows (`docs/dev/zero_length_packet.md`), or the
//! device's read would run on into the next packet, or wait for it.

use std::future::poll_fn;
use std::io;
use std::time::Duration;

use nusb::transfer::{Buffer, Completion};
use oxadb_io::{OutgoingPacket, PacketSink, ReadRanges};
use oxadb_wire::usb::{host_needs_zlp, payload_transfers};

use super::{transfer_error, BulkEndpoint};

/// Largest OUT transfer: a 1 MiB payload goes out as sixteen.
pub(crate) const OUT_CHUNK: usize = 64 * 1024;
/// OUT transfers in flight at once, like a socket's send buffer.
pub(crate) const OUT_FLIGHT: usize = 16;
/// How long closing waits for transfers still in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The device's bulk OUT endpoint as the connection's [`PacketSink`].
pub(crate) struct UsbSink<E> {
    endpoint: E,
    chunk: usize,
    max_in_flight: usize,
    /// Buffers to reuse (zero-copy ones cost an mmap each).
    spare: Vec<Buffer>,
    /// Names the device in errors.
    label: String,
}

impl<E: BulkEndpoint> UsbSink<E> {
    pub(crate) fn new(endpoint: E, label: String) -> UsbSink<E> {
        UsbSink::with_limits(endpoint, label, OUT_CHUNK, OUT_FLIGHT)
    }

    pub(crate) fn with_limits(
        endpoint: E,
        label: String,
        chunk: usize,
        max_in_flight: usize,
    ) -> UsbSink<E> {
        UsbSink {
            endpoint,
            chunk,
            max_in_flight: max_in_flight.max(1),
            spare: Vec::new(),
            label,
        }
    }

    fn take_completion(&mut self, completion: Completion) -> io::Result<()> {
        if let Err(error) = completion.status {
            let (kind, message) = transfer_error(&self.label, "writing", error);
            return Err(io::Error::new(kind, message));
        }
        let mut buffer = completion.buffer;
        if buffer.capacity() >= self.chunk {
            buffer.clear();
            self.spare.push(buffer);
        }
        Ok(())
    }

    async fn submit(&mut self, buffer: Buffer) -> io::Result<()> {
        while self.endpoint.pending() >= self.max_in_flight {
            let completion = poll_fn(|cx| self.endpoint.poll_next_complete(cx)).await;
            self.take_completion(completion)?;
        }
        self.endpoint.submit(buffer);
        Ok(())
    }

    /// Sends one header or one payload: transfers of at most `chunk` bytes,
    /// all but the last a multiple of `wMaxPacketSize` (so the device sees
    /// one unbroken run of full packets), then a zero-length packet if the
    /// whole ends on a packet boundary.
    async fn send_part(&mut self, data: &[u8]) -> io::Result<()> {
        let max_packet = self.endpoint.max_packet_size();
        for range in payload_transfers(data.len(), self.chunk, max_packet) {
            let mut buffer = self
                .spare
                .pop()
                .unwrap_or_else(|| self.endpoint.allocate(self.chunk));
            buffer.extend_from_slice(&data[range]);
            self.submit(buffer).await?;
        }
        if host_needs_zlp(data.len(), max_packet) {
            self.submit(Buffer::new(0)).await?;
        }
        Ok(())
    }
}

impl<E: BulkEndpoint> PacketSink for UsbSink<E> {
    async fn write_packets(&mut self, batch: &mut Vec<OutgoingPacket>) -> io::Result<()> {
        for packet in batch.drain(..) {
            // File ranges are read here: usbfs transfers take memory.
            let payload = packet.payload.read_into_bytes()?;
            self.send_part(&packet.header).await?;
            if !payload.is_empty() {
                self.send_part(&payload).await?;
            }
        }
        Ok(())
    }

    async fn shutdown(&mut self) {
        // Let what is in flight reach the device (a CLSE, the last WRTE), so
        // the next session does not find half a packet in adbd's buffer.
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while self.endpoint.pending() > 0 {
                let completion = poll_fn(|cx| self.endpoint.poll_next_complete(cx)).await;
                if completion.status.is_err() {
                    break;
                }
            }
        })
        .await;
        if drained.is_err() || self.endpoint.pending() > 0 {
            self.endpoint.cancel_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usb::tests::{block_on_ready, FakeOut};
    use bytes::Bytes;
    use nusb::transfer::TransferError;
    use oxadb_wire::{Command, Header, HEADER_LEN};

    fn outgoing(payload_len: usize) -> OutgoingPacket {
        let header = Header {
            command: Command::Wrte,
            arg0: 1,
            arg1: 2,
            data_length: payload_len as u32,
            data_crc32: 0,
        };
        OutgoingPacket {
            header: header.encode(),
            payload: Bytes::from((0..payload_len).map(|i| i as u8).collect::<Vec<_>>()).into(),
        }
    }

    /// Sends packets with these payload sizes; returns the transfer lengths.
    fn transfers(max_packet: usize, chunk: usize, payloads: &[usize]) -> (Vec<usize>, FakeOut) {
        let mut sink = UsbSink::with_limits(FakeOut::new(max_packet), "test".into(), chunk, 4);
        let mut batch: Vec<_> = payloads.iter().map(|&len| outgoing(len)).collect();
        let expected: Vec<u8> = batch
            .iter()
            .flat_map(|p| {
                p.header
                    .iter()
                    .chain(p.payload.as_bytes().unwrap().iter())
                    .copied()
            })
            .collect::<Vec<u8>>();
        block_on_ready(sink.write_packets(&mut batch)).unwrap();
        assert!(batch.is_empty(), "the batch is emptied");
        let fake = sink.endpoint;
        assert_eq!(fake.bytes(), expected, "bytes in order");
        (fake.transfer_lengths(), fake)
    }

    #[test]
    fn zero_length_packets_end_exact_multiples_only() {
        // High speed: a header is a short packet; a 512-byte payload needs a
        // ZLP, 513 and 100 do not; an empty payload sends nothing.
        let (lengths, _) = transfers(512, 64 * 1024, &[0, 100, 512, 513, 1024]);
        assert_eq!(
            lengths,
            vec![
                HEADER_LEN, HEADER_LEN, 100, HEADER_LEN, 512, 0, HEADER_LEN, 513, HEADER_LEN, 1024,
                0
            ]
        );
        // Full speed with 8-byte packets: the 24-byte header itself ends on a
        // packet boundary and needs one.
        let (lengths, _) = transfers(8, 64 * 1024, &[0, 7]);
        assert_eq!(lengths, vec![HEADER_LEN, 0, HEADER_LEN, 0, 7]);
    }

    #[test]
    fn large_payloads_split_without_zlps_inside() {
        // 200 KiB in 64 KiB transfers: full packets throughout, so no ZLP
        // between them (one read may span them), one after the last as the
        // total is a multiple of 512.
        let (lengths, fake) = transfers(512, 64 * 1024, &[200 * 1024]);
        assert_eq!(lengths, vec![HEADER_LEN, 65536, 65536, 65536, 8192, 0]);
        assert!(fake.max_pending() > 1, "transfers are pipelined");
        assert!(fake.max_pending() <= 4, "but capped");
        // 100000 bytes at super speed: the last piece is short, no ZLP.
        let (lengths, _) = transfers(1024, 64 * 1024, &[100_000]);
        assert_eq!(lengths, vec![HEADER_LEN, 65536, 34464]);
    }

    /// What a device that reads fixed 16 KiB buffers (AOSP's adbd) gets
    /// from these transfers: a read ends when full or at a short packet
    /// (a zero-length one included). `None` if the last read never ends.
    fn device_reads(transfers: &[Vec<u8>], max_packet: usize) -> Option<Vec<Vec<u8>>> {
        const READ: usize = 16384;
        let mut reads = Vec::new();
        let mut current = Vec::new();
        for transfer in transfers {
            let mut packets: Vec<&[u8]> = transfer.chunks(max_packet).collect();
            if transfer.is_empty() {
                packets.push(&[]);
            }
            for packet in packets {
                current.extend_from_slice(packet);
                if packet.len() < max_packet || current.len() == READ {
                    reads.push(std::mem::take(&mut current));
                }
            }
        }
        current.is_empty().then_some(reads)
    }

    #[test]
    fn device_reads_end_with_each_header_and_payload() {
        for max_packet in [8, 64, 512, 1024] {
            let sizes = [
                0,
                1,
                max_packet - 1,
                max_packet,
                max_packet + 1,
                16384,
                16384 + max_packet,
                65536,
                200 * 1024,
                1024 * 1024,
            ];
            let mut sink =
                UsbSink::with_limits(FakeOut::new(max_packet), "test".into(), OUT_CHUNK, 4);
            let mut batch: Vec<_> = sizes.iter().map(|&len| outgoing(len)).collect();
            let mut parts: Vec<Vec<u8>> = Vec::new();
            for packet in &batch {
                parts.push(packet.header.to_vec());
                if !packet.payload.is_empty() {
                    parts.push(packet.payload.as_bytes().unwrap().to_vec());
                }
            }
            block_on_ready(sink.write_packets(&mut batch)).unwrap();
            let reads = device_reads(&sink.endpoint.transfers, max_packet)
                .unwrap_or_else(|| panic!("mps {max_packet}: the device's last read never ends"));
            // Every read lies within one header or one payload, and each
            // part's last read ends exactly where the part does.
            let mut reads = reads.into_iter().filter(|r| !r.is_empty());
            for part in &parts {
                let mut got = 0;
                while got < part.len() {
                    let read = reads.next().expect("a read for every part");
                    assert!(
                        part[got..].starts_with(&read),
                        "mps {max_packet}: a read of {} bytes runs past a part of {} at {got}",
                        read.len(),
                        part.len()
                    );
                    got += read.len();
                }
            }
            assert!(reads.next().is_none());
        }
    }

    #[test]
    fn a_failed_transfer_fails_the_write_naming_the_device() {
        let mut fake = FakeOut::new(512);
        fake.fail_with(TransferError::Disconnected);
        let mut sink =
            UsbSink::with_limits(fake, "USB device R58M (bus 1, address 3)".into(), 4096, 2);
        let mut batch = vec![outgoing(100_000)];
        let error = block_on_ready(sink.write_packets(&mut batch)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
        let text = error.to_string();
        assert!(
            text.contains("R58M (bus 1, address 3)") && text.contains("disconnected"),
            "{text}"
        );
    }
}
