//! TLS records over a TCP socket once STLS's handshake is done: [`TlsReader`]
//! reads ciphertext from the socket in large chunks and decrypts records from
//! memory; [`TlsSink`] encrypts a whole batch of packets at once and writes
//! its records with the same full-socket refill as plaintext (`refill`). The
//! two halves share the rustls connection under a mutex held only for rustls
//! calls and non-blocking socket writes, never across an await.
//!
//! Why not tokio-rustls's stream after the handshake (as before): its reads
//! take one record per `recvfrom` (at most 16,406 bytes: 26,042 `recvfrom`s
//! and 13,790 `epoll_wait`s in the daemon for a 256 MiB push), and its writes
//! wait for EPOLLOUT, which lets the send buffer drain to two thirds before
//! it refills. On a 50 ms, 1 Gbit/s link with the kernel's default buffers
//! that held pushes and pulls to 0.83 of iperf3 (docs/benchmarks.md, "Long
//! links with 1500-byte frames").

use std::io::{self, BufRead, IoSlice, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use rustix::net::{SendAncillaryBuffer, SendFlags};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use oxadb_wire::HEADER_LEN;

use crate::refill::Refill;
use crate::sink::{batch_slices, OutgoingPacket, PacketSink, ReadRanges};

/// Ciphertext read from the socket per system call at most: four full
/// records. The plaintext path reads up to a packet at a time; this buffer
/// is kept for the connection's life, so it stays the size of the
/// plaintext path's idle read buffer (`driver::READ_CHUNK`).
const CIPHERTEXT_READ: usize = 64 * 1024;

/// The rustls connection both halves use. Only the sink writes to the
/// socket: what the reader's records make rustls answer (a key update,
/// RFC 8446 4.6.3) rustls sends ahead of our next record, and a fatal
/// alert goes out with the sink's shutdown.
struct TlsSession {
    connection: Mutex<rustls::Connection>,
}

impl TlsSession {
    fn lock(&self) -> MutexGuard<'_, rustls::Connection> {
        self.connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Splits a socket whose TLS handshake `connection` completed into the
/// reader and the sink of a [`Connection`](crate::Connection). Whatever
/// rustls already holds (records that came with the handshake's last
/// flight) is read first.
pub(crate) fn split(socket: TcpStream, mut connection: rustls::Connection) -> (TlsReader, TlsSink) {
    // A batch is encrypted whole (its plaintext is in memory already), so
    // rustls' 64 KiB cap on queued records would only split the write.
    connection.set_buffer_limit(None);
    let session = Arc::new(TlsSession {
        connection: Mutex::new(connection),
    });
    let (read, write) = socket.into_split();
    (
        TlsReader {
            socket: read,
            session: session.clone(),
            ciphertext: BytesMut::with_capacity(CIPHERTEXT_READ),
            socket_ended: false,
            eof_given: false,
        },
        TlsSink {
            socket: write,
            session,
            refill: Refill::new(),
        },
    )
}

/// The read half: plaintext as an [`AsyncRead`]. A peer that closes TCP
/// without TLS's close_notify (adb does) ends the stream like one that sends
/// it: the driver tells a clean end from a truncated packet by itself.
pub(crate) struct TlsReader {
    socket: OwnedReadHalf,
    session: Arc<TlsSession>,
    /// Read from the socket, not yet given to rustls.
    ciphertext: BytesMut,
    /// The socket reached its end of file.
    socket_ended: bool,
    /// rustls was told of that end.
    eof_given: bool,
}

/// What [`TlsReader::take_plaintext`] found.
enum Taken {
    /// Plaintext was copied out, or the stream ended.
    Ready,
    /// Nothing to give until more ciphertext arrives.
    NeedCiphertext,
}

impl TlsReader {
    /// Decrypts the ciphertext held and copies plaintext into `out`.
    fn take_plaintext(&mut self, out: &mut ReadBuf<'_>) -> io::Result<Taken> {
        let mut connection = self.session.lock();
        let start = out.filled().len();
        loop {
            let mut reader = connection.reader();
            loop {
                match reader.fill_buf() {
                    // The peer sent close_notify.
                    Ok([]) => return Ok(Taken::Ready),
                    Ok(chunk) => {
                        let n = chunk.len().min(out.remaining());
                        out.put_slice(&chunk[..n]);
                        reader.consume(n);
                        if out.remaining() == 0 {
                            return Ok(Taken::Ready);
                        }
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                    // TCP ended without close_notify.
                    Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                        return Ok(Taken::Ready)
                    }
                    Err(error) => return Err(error),
                }
            }
            if self.ciphertext.is_empty() {
                if self.socket_ended && !self.eof_given {
                    // rustls records the end; its reader reports it above.
                    self.eof_given = true;
                    connection.read_tls(&mut io::empty())?;
                    continue;
                }
                return Ok(if out.filled().len() > start || self.eof_given {
                    Taken::Ready
                } else {
                    Taken::NeedCiphertext
                });
            }
            // At most one record's worth per call, into rustls' own buffer.
            let fed = connection.read_tls(&mut &self.ciphertext[..])?;
            self.ciphertext.advance(fed);
            connection.process_new_packets().map_err(tls_error)?;
        }
    }

    /// Reads more ciphertext from the socket (or notes its end).
    fn poll_ciphertext(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.ciphertext.capacity() - self.ciphertext.len() < CIPHERTEXT_READ {
            // Reclaims the emptied buffer in place: nothing else holds it.
            self.ciphertext.reserve(CIPHERTEXT_READ);
        }
        loop {
            std::task::ready!(self.socket.as_ref().poll_read_ready(cx))?;
            match self.socket.try_read_buf(&mut self.ciphertext) {
                Ok(0) => {
                    self.socket_ended = true;
                    return Poll::Ready(Ok(()));
                }
                Ok(_) => return Poll::Ready(Ok(())),
                // Readiness was stale; try_read_buf cleared it.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

impl AsyncRead for TlsReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let Taken::Ready = this.take_plaintext(out)? {
                return Poll::Ready(Ok(()));
            }
            std::task::ready!(this.poll_ciphertext(cx))?;
        }
    }
}

/// A rustls error as an I/O error; an alert from the peer in words.
fn tls_error(error: rustls::Error) -> io::Error {
    match error {
        rustls::Error::AlertReceived(alert) => {
            io::Error::new(io::ErrorKind::InvalidData, crate::tls::alert_text(alert))
        }
        other => io::Error::new(io::ErrorKind::InvalidData, other),
    }
}

/// The write half: packets encrypted into records and written to a socket
/// kept full.
pub(crate) struct TlsSink {
    socket: OwnedWriteHalf,
    session: Arc<TlsSession>,
    refill: Refill,
}

impl TlsSink {
    /// Writes every record rustls holds.
    async fn flush(&mut self) -> io::Result<()> {
        let TlsSink {
            socket,
            session,
            refill,
        } = self;
        while session.lock().wants_write() {
            refill
                .write(socket, |fd| session.lock().write_tls(&mut SocketWriter(fd)))
                .await?;
        }
        Ok(())
    }
}

impl PacketSink for TlsSink {
    async fn write_packets(&mut self, batch: &mut Vec<OutgoingPacket>) -> io::Result<()> {
        for packet in batch.iter_mut() {
            packet.payload.read_in()?;
        }
        {
            let mut connection = self.session.lock();
            let total: usize = batch.iter().map(|p| HEADER_LEN + p.payload.len()).sum();
            let mut done = 0;
            // Slices from many packets fill records up to 16 KiB across
            // packet edges, so an OKAY does not cost a record of its own.
            while done < total {
                let written = connection
                    .writer()
                    .write_vectored(&batch_slices(batch, done))?;
                if written == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                done += written;
            }
        }
        batch.clear();
        self.flush().await
    }

    async fn shutdown(&mut self) {
        {
            let mut connection = self.session.lock();
            connection.send_close_notify();
            // One attempt (with any alert a failed read queued before it):
            // a peer that stopped reading must not hold the close.
            let _ = connection.write_tls(&mut SocketWriter(self.socket.as_ref().as_fd()));
        }
        let _ = self.socket.shutdown().await;
    }
}

/// Non-blocking writes to a TCP socket for rustls' `write_tls` (SIGPIPE
/// off: a closed peer is an error, not a signal).
struct SocketWriter<'a>(BorrowedFd<'a>);

impl Write for SocketWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(rustix::net::send(self.0, buf, SendFlags::NOSIGNAL)?)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Ok(rustix::net::sendmsg(
            self.0,
            bufs,
            &mut SendAncillaryBuffer::default(),
            SendFlags::NOSIGNAL,
        )?)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{client_config, server_config, AnyDevice, TlsIdentity};
    use bytes::Bytes;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpSocket};

    /// Both ends of a loopback TCP connection after a real TLS 1.3
    /// handshake: (device reader, device sink), (host reader, host sink).
    /// The host's send buffer is small, so its writes stop part way.
    async fn tls_pair() -> ((TlsReader, TlsSink), (TlsReader, TlsSink)) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let device_config =
            server_config(&TlsIdentity::ephemeral("device").unwrap(), None).unwrap();
        let device = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let (socket, session) = tokio_rustls::TlsAcceptor::from(device_config)
                .accept(socket)
                .await
                .unwrap()
                .into_inner();
            split(socket, rustls::Connection::Server(session))
        });
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(64 * 1024).unwrap();
        let socket = socket.connect(addr).await.unwrap();
        let host_config = client_config(
            &TlsIdentity::ephemeral("host").unwrap(),
            Arc::new(AnyDevice),
        )
        .unwrap();
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let (socket, session) = tokio_rustls::TlsConnector::from(host_config)
            .connect(name, socket)
            .await
            .unwrap()
            .into_inner();
        // Ours prefer AES-128-GCM (tls.rs, `provider`).
        assert_eq!(
            session.negotiated_cipher_suite().map(|s| s.suite()),
            Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
        );
        let host = split(socket, rustls::Connection::Client(session));
        (device.await.unwrap(), host)
    }

    /// Batch `index` of a test stream, and the bytes it stands for: packets
    /// from empty (an OKAY) to a full 1 MiB payload.
    fn batch(index: usize) -> (Vec<OutgoingPacket>, Vec<u8>) {
        let mut packets = Vec::new();
        let mut bytes = Vec::new();
        for i in 0..(index % 5 + 1) {
            let len = [0, 1, 24, 16_384, 16_385, 65_536, 1 << 20][(index + i) % 7];
            let payload: Vec<u8> = (0..len).map(|j| (j * 7 + index * 13 + i) as u8).collect();
            let header = [(index + i) as u8; HEADER_LEN];
            bytes.extend_from_slice(&header);
            bytes.extend_from_slice(&payload);
            packets.push(OutgoingPacket {
                header,
                payload: Bytes::from(payload).into(),
            });
        }
        (packets, bytes)
    }

    /// Writes `count` batches into `sink`, a key update after half of them,
    /// then closes; returns the bytes sent.
    async fn send_batches(mut sink: TlsSink, count: usize) -> Vec<u8> {
        let mut sent = Vec::new();
        for index in 0..count {
            if index == count / 2 {
                sink.session.lock().refresh_traffic_keys().unwrap();
            }
            let (mut packets, bytes) = batch(index);
            sink.write_packets(&mut packets).await.unwrap();
            assert!(packets.is_empty(), "a written batch is emptied");
            sent.extend_from_slice(&bytes);
        }
        sink.shutdown().await;
        sent
    }

    /// Both directions at once, each through a key update: every byte
    /// arrives once and in order, and both streams end cleanly.
    #[tokio::test]
    async fn batches_cross_both_ways_whole_through_a_key_update() {
        let ((mut device_reader, device_sink), (mut host_reader, host_sink)) = tls_pair().await;
        let host_sends = tokio::spawn(send_batches(host_sink, 40));
        let device_sends = tokio::spawn(send_batches(device_sink, 25));
        let mut at_device = Vec::new();
        let mut at_host = Vec::new();
        let (read_device, read_host) = tokio::join!(
            device_reader.read_to_end(&mut at_device),
            host_reader.read_to_end(&mut at_host)
        );
        read_device.unwrap();
        read_host.unwrap();
        let (from_host, from_device) = (host_sends.await.unwrap(), device_sends.await.unwrap());
        assert!(from_host.len() > 10 << 20);
        assert_eq!(at_device.len(), from_host.len());
        assert!(
            at_device == from_host,
            "the device read other bytes than the host sent"
        );
        assert_eq!(at_host.len(), from_device.len());
        assert!(
            at_host == from_device,
            "the host read other bytes than the device sent"
        );
    }

    /// adb closes its socket without TLS's close_notify: the reader gives
    /// everything sent, then a plain end of file.
    #[tokio::test]
    async fn a_close_without_close_notify_is_a_plain_end() {
        let ((mut device_reader, _device_sink), (_host_reader, mut host_sink)) = tls_pair().await;
        let (mut packets, bytes) = batch(6);
        // More than both socket buffers hold: written while the device reads.
        let writing = tokio::spawn(async move {
            host_sink.write_packets(&mut packets).await.unwrap();
            drop(host_sink);
        });
        let mut received = Vec::new();
        device_reader.read_to_end(&mut received).await.unwrap();
        writing.await.unwrap();
        assert!(bytes.len() > 1 << 20);
        assert!(received == bytes);
    }

    /// A record that does not decrypt is a read error, in rustls' words.
    #[tokio::test]
    async fn a_forged_record_is_an_error() {
        let ((mut device_reader, _device_sink), (_host_reader, host_sink)) = tls_pair().await;
        // An application-data record of 100 bytes that no key made.
        let mut forged = vec![0x17, 0x03, 0x03, 0x00, 100];
        forged.extend((0..100u8).map(|i| i.wrapping_mul(37)));
        let fd = host_sink.socket.as_ref().as_fd();
        assert_eq!(
            rustix::net::send(fd, &forged, SendFlags::empty()).unwrap(),
            forged.len()
        );
        let mut buf = [0u8; 64];
        let error = device_reader.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("decrypt"), "{error}");
    }
}
