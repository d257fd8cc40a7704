//! A socket on this machine joined to a device stream: what one sends, the
//! other gets, until either ends (ADB has no half-close: AOSP `sockets.cpp`
//! closes both sides of a local socket when either does). One rule for the
//! adb host server's clients, its forwards, `oxadb forward` and the streams
//! a device opens for `adb reverse`.
//!
//! Each direction copies its bytes once, at the socket, where it must: what
//! the device sent is written to the socket from the chunk the engine
//! received it in, and what the socket gives is read into a chunk that
//! becomes the WRTE payload itself. A TCP socket relayed to a device on a
//! plaintext TCP connection ([`relay_tcp`]) does better towards the device:
//! its bytes are spliced through a pipe (`oxadb_io::pipe_range`) and never
//! enter this process.

use std::io;
use std::time::Duration;

use bytes::BytesMut;
use oxadb_io::pipe_range::PipePool;
use oxadb_io::{AdbStream, WriteChunk};
use oxadb_wire::{Part, Payload};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

/// Bytes taken at a time in each direction: a sync `DATA` frame (64 KiB)
/// and more, so a push or pull moves in large pieces and a WRTE payload is
/// as large as the device's maximum (1 MiB with oxadbd, 256 KiB with adbd).
const CHUNK: usize = 256 * 1024;

/// Room under which the next socket read gets a fresh [`CHUNK`].
const REFILL_BELOW: usize = 64 * 1024;

/// How long a socket whose device ended may stay silent before it is
/// dropped; while it still sends, what it sends is read and discarded.
const DRAIN_IDLE: Duration = Duration::from_secs(5);

/// Relays until either side ends, then closes both: the device stream once
/// what was written to it has been sent, the socket when dropped. A device
/// that closes its end still has everything it sent before delivered (AOSP
/// `sockets.cpp` local_socket_close waits for pending data: a shell's exit
/// status is the last packet before its close). The socket then reads its
/// end while what it still sends is discarded, as adb's server does: a
/// reset instead would fail adb's next write, and adb 29's push then exits
/// without printing its error (`file_sync_client.cpp` WriteOrDie `_exit`s
/// with the line unflushed). Returns the bytes moved by the side that ended
/// (to the socket, to the device; the other count is 0), or its error.
pub async fn relay<S>(socket: S, stream: AdbStream) -> io::Result<(u64, u64)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (read, write) = tokio::io::split(socket);
    run(Copying::new(read), write, stream).await
}

/// [`relay`] for a TCP socket: where the device's writer sends ranges
/// itself (plaintext TCP, no checksums), what the socket sends is spliced
/// to the device through pipes; otherwise it is copied as by [`relay`].
pub async fn relay_tcp(socket: &mut TcpStream, stream: AdbStream) -> io::Result<(u64, u64)> {
    if !stream.takes_file_ranges() {
        return relay(socket, stream).await;
    }
    let (read, write) = socket.split();
    let splicing = Splicing {
        read,
        pipes: PipePool::new(),
    };
    run(splicing, write, stream).await
}

/// Where the socket-to-device direction gets its payloads.
trait SocketSource: Send {
    /// What the socket sent next, as a WRTE payload; `None` at its end.
    async fn next_payload(&mut self) -> io::Result<Option<Payload>>;

    /// The socket's reading half, to drain it once the device is gone.
    fn reader(&mut self) -> &mut (dyn AsyncRead + Unpin + Send);
}

/// Reads into memory: any byte stream.
struct Copying<R> {
    read: R,
    buffer: BytesMut,
}

impl<R> Copying<R> {
    fn new(read: R) -> Copying<R> {
        Copying {
            read,
            buffer: BytesMut::new(),
        }
    }
}

impl<R: AsyncRead + Unpin + Send> SocketSource for Copying<R> {
    async fn next_payload(&mut self) -> io::Result<Option<Payload>> {
        // The engine keeps each payload until its WRTE is sent, so what was
        // handed on is never written again: the next read goes into what is
        // left of the allocation, or a fresh one once that is small (a
        // keystroke does not cost 256 KiB).
        if self.buffer.capacity() < REFILL_BELOW {
            self.buffer.reserve(CHUNK);
        }
        match self.read.read_buf(&mut self.buffer).await? {
            0 => Ok(None),
            _ => Ok(Some(Payload::from(self.buffer.split().freeze()))),
        }
    }

    fn reader(&mut self) -> &mut (dyn AsyncRead + Unpin + Send) {
        &mut self.read
    }
}

/// Splices a TCP socket's bytes into pipes, each queued as a range.
struct Splicing<'a> {
    read: tokio::net::tcp::ReadHalf<'a>,
    pipes: std::sync::Arc<PipePool>,
}

impl SocketSource for Splicing<'_> {
    async fn next_payload(&mut self) -> io::Result<Option<Payload>> {
        let socket: &TcpStream = self.read.as_ref();
        loop {
            socket.readable().await?;
            let spliced = socket.try_io(Interest::READABLE, || {
                use std::os::fd::AsFd;
                self.pipes.splice_from(socket.as_fd())
            });
            match spliced {
                Ok(range) => return Ok(range.map(|range| Payload::from(Part::File(range)))),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Err(error),
            }
        }
    }

    fn reader(&mut self) -> &mut (dyn AsyncRead + Unpin + Send) {
        &mut self.read
    }
}

/// How the socket-to-device direction ended.
enum ToDevice {
    /// The socket reached its end or failed: the relay is over.
    SocketEnded(io::Result<u64>),
    /// The device closed the stream while the socket still sent.
    DeviceClosed,
}

async fn run<R, W>(mut source: R, mut client_write: W, stream: AdbStream) -> io::Result<(u64, u64)>
where
    R: SocketSource,
    W: AsyncWrite + Unpin + Send,
{
    let device = &stream;
    let ended = {
        let to_client = async {
            let mut moved = 0u64;
            while let Some(chunk) = device.read_chunk(CHUNK).await? {
                client_write.write_all(&chunk).await?;
                moved += chunk.len() as u64;
            }
            client_write.flush().await?;
            io::Result::Ok(moved)
        };
        tokio::pin!(to_client);
        let to_device = async {
            let mut moved = 0u64;
            loop {
                let payload = match source.next_payload().await {
                    Ok(Some(payload)) => payload,
                    Ok(None) => {
                        device.close();
                        return ToDevice::SocketEnded(Ok(moved));
                    }
                    Err(error) => return ToDevice::SocketEnded(Err(error)),
                };
                moved += payload.len() as u64;
                if device.send_payload(payload).await.is_err() {
                    return ToDevice::DeviceClosed;
                }
            }
        };
        tokio::select! {
            moved = &mut to_client => moved.map(|n| (n, 0)),
            ended = to_device => match ended {
                ToDevice::SocketEnded(moved) => return moved.map(|n| (0, n)),
                // The closed stream reads to its end: what the device sent first.
                ToDevice::DeviceClosed => to_client.await.map(|n| (n, 0)),
            },
        }
    };
    // The device's side is over: its stream closes now, not after the drain.
    drop(stream);
    let _ = client_write.shutdown().await;
    discard(source.reader()).await;
    ended
}

/// Reads and drops what the socket sends until it ends, fails, or stays
/// silent for [`DRAIN_IDLE`].
async fn discard<R: AsyncRead + Unpin + ?Sized>(socket: &mut R) {
    let mut sink = vec![0u8; 64 * 1024];
    while let Ok(Ok(n)) = tokio::time::timeout(DRAIN_IDLE, socket.read(&mut sink)).await {
        if n == 0 {
            return;
        }
    }
}
