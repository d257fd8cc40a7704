//! Packets to a TCP socket, keeping its send buffer full.
//!
//! Linux reports a TCP socket writable (EPOLLOUT) only once a third of its
//! send buffer is free (`sk_stream_is_writeable`: free space at least half
//! of what is queued), yet a write succeeds as soon as anything is free
//! (`sk_stream_memory_free`). A writer woken by readiness alone therefore
//! lets the queue fall to two thirds before it refills. Where the send buffer
//! is what limits a connection (a long round trip under the kernel's default
//! `tcp_wmem` maximum of 4 MiB), bytes in flight and so throughput fall with
//! it: 1 Gbit/s at 50 ms moved 48 MB/s that way, and 60 MB/s when the writer
//! also retried every millisecond (iperf3: 54). See docs/benchmarks.md,
//! "On an emulated link".

use std::io;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::tcp::OwnedWriteHalf;

use oxadb_wire::HEADER_LEN;

use crate::sink::{batch_slices, OutgoingPacket, PacketSink};

/// First retry after a write found the buffer full: at 1 Gbit/s a
/// millisecond frees 125 KB, a few percent of a 4 MiB buffer.
const FIRST_RETRY: Duration = Duration::from_millis(1);
/// Retries back off to this while nothing at all is accepted (a peer that
/// stopped reading), so a blocked connection costs a few wake-ups a second.
const LAST_RETRY: Duration = Duration::from_millis(64);

/// A [`PacketSink`] over a TCP socket: a batch goes out in as few writev
/// calls as the socket takes, and a full socket is retried on a timer as
/// well as on readiness.
pub struct TcpSink {
    stream: OwnedWriteHalf,
}

impl TcpSink {
    pub fn new(stream: OwnedWriteHalf) -> TcpSink {
        TcpSink { stream }
    }
}

impl PacketSink for TcpSink {
    async fn write_packets(&mut self, batch: &mut Vec<OutgoingPacket>) -> io::Result<()> {
        let total: usize = batch.iter().map(|p| HEADER_LEN + p.payload.len()).sum();
        let mut done = 0usize;
        let mut retry = FIRST_RETRY;
        // Whether the next attempt bypasses tokio's readiness flag, which
        // stays clear until the kernel's one-third wake-up.
        let mut eager = false;
        while done < total {
            let slices = batch_slices(batch, done);
            let attempt = if eager {
                rustix::io::writev(self.stream.as_ref(), &slices).map_err(io::Error::from)
            } else {
                self.stream.as_ref().try_io(Interest::WRITABLE, || {
                    rustix::io::writev(self.stream.as_ref(), &slices).map_err(io::Error::from)
                })
            };
            drop(slices);
            match attempt {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(written) => {
                    done += written;
                    retry = FIRST_RETRY;
                    eager = false;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    if eager {
                        retry = (retry * 2).min(LAST_RETRY);
                    }
                    tokio::select! {
                        ready = self.stream.as_ref().writable() => {
                            ready?;
                            eager = false;
                        }
                        _ = tokio::time::sleep(retry) => eager = true,
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        batch.clear();
        Ok(())
    }

    async fn shutdown(&mut self) {
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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(64 * 1024).unwrap();
        let client = socket
            .connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let (_read_half, write_half) = client.into_split();

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
                payload: Bytes::from(payload),
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
                tokio::time::sleep(Duration::from_micros(300)).await;
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
}
