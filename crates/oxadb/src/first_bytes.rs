//! Telling a peer that is no ADB daemon (an SSH or HTTP server on the port)
//! from a slow one: the device's first packet is CNXN, AUTH or STLS
//! (AOSP `adb/protocol.txt`), so any other first four bytes end the
//! handshake at once instead of after the CNXN timeout.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// How many of the peer's first bytes are kept to show in the error.
const KEEP: usize = 32;

/// Commands a device may open a connection with.
const FIRST_COMMANDS: [&[u8; 4]; 3] = [b"CNXN", b"AUTH", b"STLS"];

/// The peer's first bytes, shared between the reader and the handshake.
pub(crate) type Seen = Arc<Mutex<Vec<u8>>>;

/// Whether `seen` can still be the start of an ADB packet from a device.
pub(crate) fn plausible(seen: &[u8]) -> bool {
    let head = &seen[..seen.len().min(4)];
    FIRST_COMMANDS
        .iter()
        .any(|command| command.starts_with(head))
}

/// What the peer sent, for the error message: `got "SSH-2.0-..."` (escaped).
pub(crate) fn describe(seen: &[u8]) -> String {
    if seen.is_empty() {
        "it closed the connection without sending anything".to_string()
    } else {
        format!("got \"{}\"", seen.escape_ascii())
    }
}

/// Reads through to `inner`, keeping the first bytes and failing the read
/// as soon as they cannot start an ADB packet.
pub(crate) struct FirstBytes<R> {
    inner: R,
    seen: Seen,
    checking: bool,
}

impl<R> FirstBytes<R> {
    pub(crate) fn new(inner: R) -> (FirstBytes<R>, Seen) {
        let seen = Seen::default();
        let reader = FirstBytes {
            inner,
            seen: seen.clone(),
            checking: true,
        };
        (reader, seen)
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for FirstBytes<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if !self.checking || !matches!(result, Poll::Ready(Ok(()))) {
            return result;
        }
        let new = &buf.filled()[before..];
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let room = KEEP.saturating_sub(seen.len());
        seen.extend_from_slice(&new[..new.len().min(room)]);
        let ok = plausible(&seen);
        let decided = seen.len() >= KEEP || new.is_empty();
        drop(seen);
        if !ok {
            self.checking = false;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer's first bytes are no ADB packet",
            )));
        }
        if decided {
            self.checking = false;
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn only_device_opening_commands_are_plausible() {
        assert!(plausible(b""));
        assert!(plausible(b"CN"));
        assert!(plausible(b"AUTH\x01\0\0\0"));
        assert!(plausible(b"STLS"));
        assert!(!plausible(b"SSH-2.0"));
        assert!(!plausible(b"HTTP/1.1 400"));
        assert!(!plausible(b"OKAY"));
        assert_eq!(describe(b"SSH\r\n"), "got \"SSH\\r\\n\"");
    }

    #[tokio::test]
    async fn garbage_fails_the_first_read_and_is_kept() {
        let (reader, seen) = FirstBytes::new(&b"SSH-2.0-OpenSSH_9.2\r\n"[..]);
        let mut reader = reader;
        let mut buf = [0u8; 64];
        let error = reader.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert_eq!(seen.lock().unwrap().as_slice(), b"SSH-2.0-OpenSSH_9.2\r\n");
    }

    #[tokio::test]
    async fn an_adb_packet_passes_through() {
        let packet = b"CNXN\0\0\0\x01\0\0\x10\0\0\0\0\0\0\0\0\0\xbc\xb1\xa7\xb1extra";
        let (mut reader, _seen) = FirstBytes::new(&packet[..]);
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, packet);
    }
}
