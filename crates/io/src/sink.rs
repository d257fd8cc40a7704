//! Where the writer task puts packets: [`PacketSink`], and [`StreamSink`]
//! for byte streams, which writes a batch with as few writev calls as it can;
//! and [`ReadRanges`], the copying path for payloads with file ranges.

use std::io::{self, IoSlice};

use bytes::Bytes;
use oxadb_wire::{Payload, HEADER_LEN};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// One packet ready for the wire: its encoded header and its payload, which
/// holds file ranges only for sinks that [take them](PacketSink::takes_file_ranges).
pub struct OutgoingPacket {
    pub header: [u8; HEADER_LEN],
    pub payload: Payload,
}

/// Where the writer task puts packets. A byte stream takes a whole batch in
/// one writev ([`StreamSink`]); USB keeps each header and each payload a
/// transfer of its own, because the host reads exactly 24 bytes for a header
/// and then exactly the payload (AOSP `docs/dev/zero_length_packet.md`).
pub trait PacketSink: Send + 'static {
    /// Writes every packet of `batch`, in order, and empties it.
    fn write_packets<'a>(
        &'a mut self,
        batch: &'a mut Vec<OutgoingPacket>,
    ) -> impl std::future::Future<Output = io::Result<()>> + Send + 'a;

    /// Whether payloads may hold file ranges for this sink to send itself
    /// (`sendfile`); for other sinks the writer reads them into memory first.
    fn takes_file_ranges(&self) -> bool {
        false
    }

    /// The connection ended: flush and close what can be.
    fn shutdown(&mut self) -> impl std::future::Future<Output = ()> + Send + '_;
}

/// A [`PacketSink`] over any byte stream (TCP, a pipe): packets are bytes in a row.
pub struct StreamSink<W>(pub W);

impl<W: AsyncWrite + Unpin + Send + 'static> PacketSink for StreamSink<W> {
    async fn write_packets(&mut self, batch: &mut Vec<OutgoingPacket>) -> io::Result<()> {
        write_all_vectored(&mut self.0, batch).await
    }

    async fn shutdown(&mut self) {
        let _ = self.0.shutdown().await;
    }
}

/// Writes `batch` with as few writev calls as the writer allows.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    writer: &mut W,
    batch: &mut Vec<OutgoingPacket>,
) -> io::Result<()> {
    // Each packet is up to two slices: its header, then its payload; `done`
    // counts bytes of the batch already written.
    for packet in batch.iter_mut() {
        packet.payload.read_in()?;
    }
    let mut done = 0usize;
    let total: usize = batch.iter().map(|p| HEADER_LEN + p.payload.len()).sum();
    while done < total {
        let slices = batch_slices(batch, done);
        let written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        done += written;
    }
    batch.clear();
    Ok(())
}

/// Slices of `packets` after the first `skip` bytes: each packet's header,
/// then its payload, which must be in memory ([`ReadRanges::read_in`]).
pub(crate) fn batch_slices(packets: &[OutgoingPacket], mut skip: usize) -> Vec<IoSlice<'_>> {
    let mut slices = Vec::with_capacity(2 * packets.len());
    for packet in packets {
        let payload = packet.payload.as_bytes().expect("payload read in");
        for part in [&packet.header[..], &payload[..]] {
            if part.is_empty() {
                continue;
            }
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            slices.push(IoSlice::new(&part[skip..]));
            skip = 0;
        }
    }
    slices
}

/// The copying path: a payload's file ranges read into memory, for sinks
/// that cannot send them (USB, TLS, byte streams), for a peer that checks
/// payload sums, and where `sendfile` refused a file. The protocol crates
/// below never read a file; this is where ranges are read.
pub trait ReadRanges {
    /// Reads the payload into one buffer in place and returns it. A read
    /// that fails is an error naming the file (one that shrank under its
    /// ranges: [`RangeSource::shrank`](oxadb_wire::RangeSource::shrank)),
    /// which ends the connection.
    fn read_in(&mut self) -> io::Result<&Bytes>;

    /// The payload in one buffer, its file ranges read.
    fn read_into_bytes(self) -> io::Result<Bytes>;
}

impl ReadRanges for Payload {
    fn read_in(&mut self) -> io::Result<&Bytes> {
        if self.as_bytes().is_none() {
            let bytes = std::mem::take(self).read_into_bytes()?;
            *self = Payload::from(bytes);
        }
        Ok(self.as_bytes().expect("just read in"))
    }

    fn read_into_bytes(self) -> io::Result<Bytes> {
        self.gather_with(|range, buf| range.source.read_exact_at(buf, range.offset))
    }
}
