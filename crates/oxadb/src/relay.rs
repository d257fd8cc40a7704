//! A socket on this machine joined to a device stream: what one sends, the
//! other gets, until either ends (ADB has no half-close: AOSP `sockets.cpp`
//! closes both sides of a local socket when either does). One rule for the
//! adb host server's clients, its forwards, `oxadb forward` and the streams
//! a device opens for `adb reverse`.
//!
//! Each direction copies its bytes once, at the socket (the kernel copies
//! into or out of user memory; nothing can avoid that for a TCP or Unix
//! socket): what the device sent is written to the socket from the chunk the
//! engine received it in, and what the socket gives is read into a chunk
//! that becomes the WRTE payload itself.

use std::io;
use std::time::Duration;

use bytes::BytesMut;
use oxadb_io::AdbStream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes taken at a time in each direction: a sync `DATA` frame (64 KiB)
/// and more, so a push or pull moves in large pieces and a WRTE payload is
/// as large as the device's maximum (1 MiB with oxadbd, 256 KiB with adbd).
const CHUNK: usize = 256 * 1024;

/// Room under which the next socket read gets a fresh [`CHUNK`].
const REFILL_BELOW: usize = 64 * 1024;

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
    let device = &stream;
    let (mut client_read, mut client_write) = tokio::io::split(socket);
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
            let mut buffer = BytesMut::new();
            loop {
                // The engine keeps each payload until its WRTE is sent, so
                // what was handed on is never written again: the next read
                // goes into what is left of the allocation, or a fresh one
                // once that is small (a keystroke does not cost 256 KiB).
                if buffer.capacity() < REFILL_BELOW {
                    buffer.reserve(CHUNK);
                }
                match client_read.read_buf(&mut buffer).await {
                    Ok(0) => {
                        device.close();
                        return ToDevice::SocketEnded(Ok(moved));
                    }
                    Ok(n) => moved += n as u64,
                    Err(error) => return ToDevice::SocketEnded(Err(error)),
                }
                if device.send(buffer.split().freeze()).await.is_err() {
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
    discard(&mut client_read).await;
    ended
}

/// Reads and drops what the socket sends until it ends, fails, or stays
/// silent for [`DRAIN_IDLE`].
async fn discard<R: AsyncRead + Unpin>(socket: &mut R) {
    let mut sink = vec![0u8; 64 * 1024];
    while let Ok(Ok(n)) = tokio::time::timeout(DRAIN_IDLE, socket.read(&mut sink)).await {
        if n == 0 {
            return;
        }
    }
}
