//! Packets to a TCP socket, keeping its send buffer as full as the path
//! needs (`refill`: retried on a timer as well as on readiness where the
//! buffer is small against the path, queued no deeper than it needs where
//! the buffer is large).

use std::io::{self, IoSlice};
use std::os::fd::BorrowedFd;

use rustix::net::{SendAncillaryBuffer, SendFlags};
use rustix::pipe::SpliceFlags;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;

use oxadb_wire::{FileRange, Part, HEADER_LEN};

use crate::refill::Refill;
use crate::sink::{OutgoingPacket, PacketSink, ReadRanges};
/// Slices per sendmsg; Linux caps iovecs at 1024 (`UIO_MAXIOV`).
const MAX_IOVECS: usize = 512;

/// A [`PacketSink`] over a TCP socket: a batch goes out in as few writev
/// calls as the socket takes, and a full socket is retried on a timer as
/// well as on readiness. File ranges in payloads go by `sendfile` (or
/// `splice` from a relay's pipe, `pipe_range`), the
/// bytes around them by `sendmsg` with `MSG_MORE` so that a header and the
/// file data after it share segments (tcp(7): with Nagle off, a send
/// without it pushes a segment at once).
pub struct TcpSink {
    stream: OwnedWriteHalf,
    refill: Refill,
    counts: FileCounts,
}

/// What happened to file ranges on this connection.
#[derive(Debug, Default)]
struct FileCounts {
    /// File bytes sent by `sendfile`.
    by_sendfile: u64,
    /// Relayed bytes spliced from pipes (`pipe_range`).
    by_splice: u64,
    /// Files whose ranges `sendfile` refused and which were read instead.
    fallbacks: u64,
}

impl TcpSink {
    pub fn new(stream: OwnedWriteHalf) -> TcpSink {
        TcpSink {
            stream,
            refill: Refill::new(),
            counts: FileCounts::default(),
        }
    }
}

/// One system call's worth of the batch after its first `done` bytes.
fn write_once(
    socket: BorrowedFd<'_>,
    batch: &mut [OutgoingPacket],
    done: usize,
    counts: &mut FileCounts,
) -> io::Result<usize> {
    loop {
        match next_run(batch, done) {
            Run::Memory { slices, more } => {
                let flags = if more {
                    SendFlags::MORE
                } else {
                    SendFlags::empty()
                };
                return rustix::net::sendmsg(
                    socket,
                    &slices,
                    &mut SendAncillaryBuffer::default(),
                    flags | SendFlags::NOSIGNAL,
                )
                .map_err(io::Error::from);
            }
            Run::File {
                packet,
                range,
                skip,
            } => {
                if let Some(pipe) = range.source.pipe_fd() {
                    // The pipe holds the range's bytes (`pipe_range`); a full
                    // socket gives EAGAIN (it is non-blocking), as sendmsg does.
                    let left = range.len - skip;
                    return match rustix::pipe::splice(
                        pipe,
                        None,
                        socket,
                        None,
                        left,
                        SpliceFlags::empty(),
                    ) {
                        Ok(0) => Err(range.source.shrank(range.offset + range.len as u64)),
                        Ok(n) => {
                            range.source.sent(n as u64);
                            counts.by_splice += n as u64;
                            Ok(n)
                        }
                        Err(error) => Err(error.into()),
                    };
                }
                let Some(file) = range.source.sendfile_fd() else {
                    // The copying path for the rest of this file.
                    batch[packet].payload.read_in()?;
                    continue;
                };
                let mut offset = range.offset + skip as u64;
                match rustix::fs::sendfile(socket, file, Some(&mut offset), range.len - skip) {
                    Ok(0) => return Err(range.source.shrank(range.offset + range.len as u64)),
                    Ok(n) => {
                        range.source.sent(n as u64);
                        counts.by_sendfile += n as u64;
                        return Ok(n);
                    }
                    // No `splice_read` for this file (sendfile(2): EINVAL,
                    // "fd is not a file that supports mmap-like operations";
                    // /proc's seq files on Linux 6.18): read it instead.
                    Err(rustix::io::Errno::INVAL)
                    | Err(rustix::io::Errno::NOSYS)
                    | Err(rustix::io::Errno::OPNOTSUPP) => {
                        tracing::debug!("sendfile refused a file; reading it instead");
                        range.source.sendfile_refused();
                        counts.fallbacks += 1;
                        batch[packet].payload.read_in()?;
                    }
                    Err(error) => return Err(error.into()),
                }
            }
        }
    }
}

/// What the next system call sends.
enum Run<'a> {
    /// Bytes in memory; `more`: the batch goes on after them.
    Memory {
        slices: Vec<IoSlice<'a>>,
        more: bool,
    },
    /// A file range of packet `packet`, after its first `skip` bytes.
    File {
        packet: usize,
        range: FileRange,
        skip: usize,
    },
}

/// The run of the batch that starts after its first `skip` bytes: the bytes
/// in memory up to the next file range, or that file range.
fn next_run(batch: &[OutgoingPacket], mut skip: usize) -> Run<'_> {
    let mut slices = Vec::new();
    for (index, packet) in batch.iter().enumerate() {
        let header: &[u8] = &packet.header;
        let pieces =
            std::iter::once(Piece::Memory(header)).chain(packet.payload.parts().map(|part| {
                match part {
                    Part::Bytes(bytes) => Piece::Memory(bytes),
                    Part::File(range) => Piece::File(range),
                }
            }));
        for piece in pieces {
            let len = match piece {
                Piece::Memory(bytes) => bytes.len(),
                Piece::File(range) => range.len,
            };
            if skip >= len {
                skip -= len;
                continue;
            }
            match piece {
                Piece::Memory(bytes) => slices.push(IoSlice::new(&bytes[skip..])),
                Piece::File(range) if slices.is_empty() => {
                    return Run::File {
                        packet: index,
                        range: range.clone(),
                        skip,
                    }
                }
                Piece::File(_) => return Run::Memory { slices, more: true },
            }
            skip = 0;
            if slices.len() == MAX_IOVECS {
                return Run::Memory { slices, more: true };
            }
        }
    }
    Run::Memory {
        slices,
        more: false,
    }
}

enum Piece<'a> {
    Memory(&'a [u8]),
    File(&'a FileRange),
}

impl PacketSink for TcpSink {
    fn takes_file_ranges(&self) -> bool {
        true
    }

    async fn write_packets(&mut self, batch: &mut Vec<OutgoingPacket>) -> io::Result<()> {
        let total: usize = batch.iter().map(|p| HEADER_LEN + p.payload.len()).sum();
        let mut done = 0usize;
        while done < total {
            let TcpSink {
                stream,
                refill,
                counts,
            } = &mut *self;
            let written = refill
                .write(stream, |socket| write_once(socket, batch, done, counts))
                .await?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            done += written;
        }
        batch.clear();
        Ok(())
    }

    async fn shutdown(&mut self) {
        tracing::debug!(
            sendfile_bytes = self.counts.by_sendfile,
            spliced_bytes = self.counts.by_splice,
            sendfile_fallbacks = self.counts.fallbacks,
            "tcp connection's file data"
        );
        let _ = self.stream.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tokio::io::AsyncReadExt;

    /// A batch larger than a small send buffer, into a reader that drains it
    /// slowly: the sink meets a full socket many times, refills it on the
    /// timer and on readiness, and every byte arrives once, in order.
    #[tokio::test]
    async fn a_full_socket_is_refilled_and_nothing_is_lost_or_repeated() {
        let (write_half, mut server) = pair().await;

        let mut batch = Vec::new();
        let mut expected = Vec::new();
        for i in 0..48u32 {
            let payload: Vec<u8> = (0..(i as usize * 7919 % 70_000))
                .map(|j| (j as u32 ^ i) as u8)
                .collect();
            let header = [i as u8; HEADER_LEN];
            expected.extend_from_slice(&header);
            expected.extend_from_slice(&payload);
            batch.push(OutgoingPacket {
                header,
                payload: Bytes::from(payload).into(),
            });
        }
        let reader = tokio::spawn(async move {
            let mut received = Vec::new();
            let mut chunk = vec![0u8; 16 * 1024];
            loop {
                let n = server.read(&mut chunk).await.unwrap();
                if n == 0 {
                    return received;
                }
                received.extend_from_slice(&chunk[..n]);
                tokio::time::sleep(std::time::Duration::from_micros(300)).await;
            }
        });
        let mut sink = TcpSink::new(write_half);
        sink.write_packets(&mut batch).await.unwrap();
        assert!(batch.is_empty(), "a written batch is emptied");
        sink.shutdown().await;
        let received = reader.await.unwrap();
        assert_eq!(received.len(), expected.len());
        assert!(received == expected, "bytes differ from what was sent");
    }

    use crate::sink::StreamSink;
    use oxadb_transfer::SendFile;
    use oxadb_wire::{Payload, RangeCounters};
    use std::sync::Arc;

    /// A connected loopback pair: the writer's half (with a small send
    /// buffer, so writes stop part way) and the reader.
    async fn pair() -> (OwnedWriteHalf, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(64 * 1024).unwrap();
        let client = socket
            .connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        client.set_nodelay(true).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client.into_split().1, server)
    }

    async fn read_all(mut reader: tokio::net::TcpStream) -> Vec<u8> {
        let mut received = Vec::new();
        reader.read_to_end(&mut received).await.unwrap();
        received
    }

    /// Sends `batch` through `sink` and returns what the other end read.
    async fn through<S: PacketSink>(
        sink: impl FnOnce(OwnedWriteHalf) -> S,
        mut batch: Vec<OutgoingPacket>,
    ) -> Vec<u8> {
        let (writer, reader) = pair().await;
        let reading = tokio::spawn(read_all(reader));
        let mut sink = sink(writer);
        sink.write_packets(&mut batch).await.unwrap();
        assert!(batch.is_empty());
        sink.shutdown().await;
        reading.await.unwrap()
    }

    /// A file of `len` patterned bytes, already unlinked.
    fn scratch_file(len: usize) -> std::fs::File {
        use std::io::Write;
        let mut file = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 131 + i / 4099) as u8).collect();
        file.write_all(&data).unwrap();
        file
    }

    /// Packets of sync `DATA` headers around file ranges, at offsets and
    /// sizes on packet and frame edges, with an in-memory packet between.
    fn ranged_batch(file: &Arc<SendFile>) -> Vec<OutgoingPacket> {
        const K64: usize = 64 * 1024;
        let mut batch = Vec::new();
        let cases = [
            (0, 0),
            (0, 1),
            (1, K64),
            (4095, K64 + 1),
            (K64 + 7, 1024 * 1024 + 1),
            (3, 1),
        ];
        for (i, (offset, len)) in cases.into_iter().enumerate() {
            let mut payload = Payload::default();
            // Built by hand: ranges beyond a DATA frame's 64 KiB limit are
            // the point here (sendfile of long ranges), and the encoder refuses them.
            let mut header = b"DATA".to_vec();
            header.extend_from_slice(&(len as u32).to_le_bytes());
            payload.push(Part::Bytes(bytes::Bytes::from(header)));
            payload.push(Part::File(FileRange {
                source: file.clone(),
                offset: offset as u64,
                len,
            }));
            if i % 2 == 1 {
                // Two frames in one packet, as a pull's WRTE holds 15.
                payload.push(Part::Bytes(bytes::Bytes::from_static(b"DATA\x02\0\0\0")));
                payload.push(Part::File(FileRange {
                    source: file.clone(),
                    offset: (offset + len) as u64,
                    len: 2,
                }));
            }
            let header = [i as u8 + 1; HEADER_LEN];
            batch.push(OutgoingPacket { header, payload });
            batch.push(OutgoingPacket {
                header: [0xee; HEADER_LEN],
                payload: bytes::Bytes::from_static(b"between").into(),
            });
        }
        batch
    }

    #[tokio::test]
    async fn file_ranges_go_out_byte_for_byte_as_the_copying_path() {
        let file = scratch_file(2 * 1024 * 1024);
        let counters = Arc::new(RangeCounters::default());
        let shared = SendFile::new(file.try_clone().unwrap(), counters.clone());
        let by_sendfile = through(TcpSink::new, ranged_batch(&shared)).await;
        let copied = through(StreamSink, ranged_batch(&shared)).await;
        assert_eq!(by_sendfile.len(), copied.len());
        assert!(by_sendfile == copied, "the two paths sent different bytes");
        let (files, sent, read, fallbacks) = counters.snapshot();
        assert_eq!((files, fallbacks), (1, 0));
        assert_eq!(sent, read, "each range once by sendfile, once read");
        assert!(sent > 1024 * 1024);
    }

    /// /proc's seq files refuse `sendfile` (EINVAL): the sink reads them
    /// instead, sends the same bytes and counts the fallback once.
    #[tokio::test]
    async fn a_file_sendfile_refuses_is_read_and_counted() {
        let expected = std::fs::read("/proc/self/environ").unwrap();
        assert!(!expected.is_empty());
        let file = std::fs::File::open("/proc/self/environ").unwrap();
        let counters = Arc::new(RangeCounters::default());
        let shared = SendFile::new(file, counters.clone());
        let mut batch = Vec::new();
        for (offset, len) in [
            (0, expected.len() / 2),
            (expected.len() / 2, expected.len() - expected.len() / 2),
        ] {
            batch.push(OutgoingPacket {
                header: [7; HEADER_LEN],
                payload: Part::File(FileRange {
                    source: shared.clone(),
                    offset: offset as u64,
                    len,
                })
                .into(),
            });
        }
        let received = through(TcpSink::new, batch).await;
        let mut wanted = vec![7u8; HEADER_LEN];
        wanted.extend_from_slice(&expected[..expected.len() / 2]);
        wanted.extend_from_slice(&[7u8; HEADER_LEN]);
        wanted.extend_from_slice(&expected[expected.len() / 2..]);
        assert_eq!(received, wanted);
        assert!(shared.fell_back());
        assert_eq!(
            counters.snapshot(),
            (1, 0, expected.len() as u64, 1),
            "(files, by sendfile, read, fallbacks)"
        );
    }
    /// A file that ends before a range already framed cannot fill the
    /// packet's length: both writers fail, and the error names the file and
    /// the byte the range needed.
    #[tokio::test]
    async fn a_file_that_shrank_under_its_ranges_fails_naming_it() {
        let file = scratch_file(64 * 1024);
        file.set_len(1000).unwrap();
        let range = |shared: &Arc<SendFile>| {
            vec![OutgoingPacket {
                header: [3; HEADER_LEN],
                payload: Part::File(FileRange {
                    source: shared.clone(),
                    offset: 0,
                    len: 64 * 1024,
                })
                .into(),
            }]
        };
        let name = Some("/data/rotated.log".to_string());
        let shared = SendFile::named(file, name, Arc::default());
        for by_sendfile in [true, false] {
            let (writer, _reader) = pair().await;
            let mut batch = range(&shared);
            let error = if by_sendfile {
                TcpSink::new(writer).write_packets(&mut batch).await
            } else {
                StreamSink(writer).write_packets(&mut batch).await
            }
            .expect_err("a range past the end of the file was sent");
            let message = error.to_string();
            assert!(
                message.contains("'/data/rotated.log' shrank while being sent")
                    && message.contains("before byte 65536"),
                "by sendfile {by_sendfile}: {message}"
            );
        }
    }

    /// Socket bytes spliced into pipes (`pipe_range`) go out by splice from
    /// the pipes: split across packets, between in-memory packets, through a
    /// small send buffer that stops part way; what arrives is the headers
    /// and the socket's bytes in order, each once.
    #[tokio::test]
    async fn pipe_ranges_are_spliced_in_order() {
        use std::io::Write;
        let data: Vec<u8> = (0..700_000u32).map(|i| (i * 13 + i / 977) as u8).collect();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut source = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (relayed, _) = listener.accept().unwrap();
        relayed.set_nonblocking(true).unwrap();
        source.write_all(&data).unwrap();
        drop(source);

        let pool = crate::pipe_range::PipePool::new();
        let mut ranges = Payload::default();
        loop {
            match pool.splice_from(std::os::fd::AsFd::as_fd(&relayed)) {
                Ok(Some(range)) => ranges.push(Part::File(range)),
                Ok(None) => break,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await
                }
                Err(error) => panic!("{error}"),
            }
        }
        assert_eq!(ranges.len(), data.len());

        let mut batch = Vec::new();
        let mut expected = Vec::new();
        for (i, size) in [1usize, 65_536, 300_000, 1, 334_462]
            .into_iter()
            .enumerate()
        {
            let header = [i as u8; HEADER_LEN];
            expected.extend_from_slice(&header);
            let part = ranges.split_to(size);
            let start = data.len() - ranges.len() - size;
            expected.extend_from_slice(&data[start..start + size]);
            batch.push(OutgoingPacket {
                header,
                payload: part,
            });
            let header = [0xee; HEADER_LEN];
            expected.extend_from_slice(&header);
            expected.extend_from_slice(b"between");
            batch.push(OutgoingPacket {
                header,
                payload: Bytes::from_static(b"between").into(),
            });
        }
        assert!(ranges.is_empty());
        let received = through(TcpSink::new, batch).await;
        assert_eq!(received.len(), expected.len());
        assert!(received == expected, "bytes differ from what was spliced");
    }
}
