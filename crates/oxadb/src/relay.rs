//! A socket on this machine joined to a device stream: what one sends, the
//! other gets, until either ends (ADB has no half-close: AOSP `sockets.cpp`
//! closes both sides of a local socket when either does). One rule for the
//! adb host server's clients, its forwards, `oxadb forward` and the streams
//! a device opens for `adb reverse`.

use std::io;

use oxadb_io::AdbStream;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};

/// Bytes read at a time in each direction: a sync `DATA` frame (64 KiB)
/// and more, so a push or pull moves in large pieces. Each direction's
/// bytes are copied once, into this buffer, on their way through.
const BUFFER: usize = 256 * 1024;

/// Relays until either side ends, then closes both: the device stream once
/// what was written to it has been sent, the socket when dropped. Returns
/// the bytes moved by the side that ended (to the socket, to the device;
/// the other count is 0), or its error.
pub async fn relay<S>(socket: S, stream: AdbStream) -> io::Result<(u64, u64)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (device_read, mut device_write) = tokio::io::split(stream);
    let (client_read, mut client_write) = tokio::io::split(socket);
    let mut device_read = BufReader::with_capacity(BUFFER, device_read);
    let mut client_read = BufReader::with_capacity(BUFFER, client_read);
    tokio::select! {
        moved = tokio::io::copy_buf(&mut device_read, &mut client_write) => moved.map(|n| (n, 0)),
        moved = tokio::io::copy_buf(&mut client_read, &mut device_write) => moved.map(|n| (0, n)),
    }
}
