//! A socket on this machine joined to a device stream: what one sends, the
//! other gets, until either ends (ADB has no half-close: AOSP `sockets.cpp`
//! closes both sides of a local socket when either does). One rule for the
//! adb host server's clients, its forwards, `oxadb forward` and the streams
//! a device opens for `adb reverse`.

use std::io;
use std::time::Duration;

use oxadb_io::AdbStream;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// Bytes read at a time in each direction: a sync `DATA` frame (64 KiB)
/// and more, so a push or pull moves in large pieces. Each direction's
/// bytes are copied once, into this buffer, on their way through.
const BUFFER: usize = 256 * 1024;

/// How long a socket whose device ended may stay silent before it is
/// dropped; while it still sends, what it sends is read and discarded.
const DRAIN_IDLE: Duration = Duration::from_secs(5);

/// How the socket-to-device direction ended.
enum ToDevice {
    /// The socket reached its end or failed: the relay is over.
    SocketEnded(io::Result<u64>),
    /// The device closed the stream while the socket still sent.
    DeviceClosed,
}

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
    let (device_read, mut device_write) = tokio::io::split(stream);
    let (client_read, mut client_write) = tokio::io::split(socket);
    let mut device_read = BufReader::with_capacity(BUFFER, device_read);
    let mut client_read = BufReader::with_capacity(BUFFER, client_read);
    let ended = {
        let to_client = tokio::io::copy_buf(&mut device_read, &mut client_write);
        tokio::pin!(to_client);
        tokio::select! {
            moved = &mut to_client => moved.map(|n| (n, 0)),
            ended = to_device(&mut client_read, &mut device_write) => match ended {
                ToDevice::SocketEnded(moved) => return moved.map(|n| (0, n)),
                // The closed stream reads to its end: what the device sent first.
                ToDevice::DeviceClosed => to_client.await.map(|n| (n, 0)),
            },
        }
    };
    let _ = client_write.shutdown().await;
    discard(&mut client_read).await;
    ended
}

/// Reads and drops what the socket sends until it ends, fails, or stays
/// silent for [`DRAIN_IDLE`].
async fn discard<R: AsyncBufRead + Unpin>(socket: &mut R) {
    while let Ok(Ok(chunk)) = tokio::time::timeout(DRAIN_IDLE, socket.fill_buf()).await {
        if chunk.is_empty() {
            return;
        }
        let length = chunk.len();
        socket.consume(length);
    }
}

/// Copies the socket's bytes to the device, telling a failed write (the
/// device closed) from the socket's own end.
async fn to_device<R, W>(socket: &mut R, device: &mut W) -> ToDevice
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut moved = 0u64;
    loop {
        let chunk = match socket.fill_buf().await {
            Ok(chunk) => chunk,
            Err(error) => return ToDevice::SocketEnded(Err(error)),
        };
        if chunk.is_empty() {
            return ToDevice::SocketEnded(device.flush().await.map(|()| moved));
        }
        let length = chunk.len();
        if device.write_all(chunk).await.is_err() {
            return ToDevice::DeviceClosed;
        }
        socket.consume(length);
        moved += length as u64;
    }
}
