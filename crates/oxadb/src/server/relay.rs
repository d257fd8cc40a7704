//! A client's socket joined to a device stream: what one sends, the other
//! gets, until either ends (ADB has no half-close: AOSP `sockets.cpp`
//! closes both sides of a local socket when either does).

use oxadb_io::AdbStream;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};

/// Bytes read at a time in each direction: a sync `DATA` frame (64 KiB)
/// and more, so a push or pull moves in large pieces. Each direction's
/// bytes are copied once, into this buffer, on their way through.
const BUFFER: usize = 256 * 1024;

/// Relays until either side ends, then closes both: the device stream once
/// what was written to it has been sent, the socket when dropped.
pub async fn relay<S>(socket: S, stream: AdbStream)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (device_read, mut device_write) = tokio::io::split(stream);
    let (client_read, mut client_write) = tokio::io::split(socket);
    let mut device_read = BufReader::with_capacity(BUFFER, device_read);
    let mut client_read = BufReader::with_capacity(BUFFER, client_read);
    let ended = tokio::select! {
        result = tokio::io::copy_buf(&mut device_read, &mut client_write) => ("device", result),
        result = tokio::io::copy_buf(&mut client_read, &mut device_write) => ("client", result),
    };
    tracing::debug!(side = ended.0, bytes = ?ended.1.as_ref().ok(), error = ?ended.1.as_ref().err(), "relay ended");
}
