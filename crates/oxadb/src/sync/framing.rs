//! Request framing and reading replies: how a [`SyncSession`] builds its
//! requests (`file_sync_client.cpp`'s `SendRequest`, `SendSend2`) and takes
//! sync frames off its stream without copying payloads.

use std::future::Future;
use std::path::Path;
use std::task::Poll;

use bytes::Bytes;
use oxadb_wire::sync::{self as wire, SyncHeader, SyncRequest, TransferFlags, HEADER_LEN};
use tokio::io::AsyncWriteExt;

use super::send::SendMode;
use super::session::SyncSession;
use super::{show, transfer_error};
use crate::error::{Error, Result};

/// Largest chunk taken from the stream at once.
pub(super) const READ_MAX: usize = 1024 * 1024;

impl SyncSession {
    // ----- requests -----

    /// A push's request: `SND2` and its setup frame when the device has
    /// `sendrecv_v2`, else `SEND` with `"<path>,<mode>"` (adb 29's only form).
    pub(super) fn send_request(
        &mut self,
        local: &Path,
        remote: &[u8],
        file_mode: u32,
        mode: SendMode,
    ) -> Result<Vec<u8>> {
        if self.features.sendrecv_v2 {
            let mut message = self.path_request(wire::ID_SEND_V2, remote, local, remote)?;
            let setup = wire::SendV2Setup {
                id: wire::ID_SEND_V2,
                mode: file_mode,
                flags: TransferFlags {
                    compression: mode.compression,
                    dry_run: mode.dry_run,
                }
                .to_flags(),
            };
            message.extend_from_slice(&setup.encode());
            Ok(message)
        } else {
            if mode.dry_run {
                return Err(transfer_error(
                    "dry-run not supported by the device".to_string(),
                ));
            }
            let mut spec = remote.to_vec();
            spec.extend_from_slice(format!(",{file_mode}").as_bytes());
            self.path_request(wire::ID_SEND_V1, &spec, local, remote)
        }
    }

    /// A request whose path is checked against the protocol's limit.
    pub(super) fn path_request(
        &self,
        id: u32,
        path: &[u8],
        local: &Path,
        remote: &[u8],
    ) -> Result<Vec<u8>> {
        SyncRequest {
            id,
            path: path.to_vec(),
        }
        .encode()
        .map_err(|e| {
            transfer_error(format!(
                "failed to copy '{}' to '{}': {e}",
                local.display(),
                show(remote)
            ))
        })
    }

    // ----- reading the stream -----

    /// Before a request with a reply: the answers to earlier pushes come first.
    pub(super) async fn settle(&mut self) -> Result<()> {
        if self.unacked.is_empty() {
            Ok(())
        } else {
            self.collect_acks(true).await
        }
    }

    pub(super) fn usable(&self) -> Result<()> {
        match &self.ended {
            None => Ok(()),
            Some(reason) => Err(Error::Protocol(format!(
                "{}: this sync session can't be used any more: {reason}",
                self.serial
            ))),
        }
    }

    pub(super) fn end(&mut self, reason: &str) {
        if self.ended.is_none() {
            self.ended = Some(reason.to_string());
        }
    }

    pub(super) fn request(&self, id: u32, path: &[u8]) -> Result<Vec<u8>> {
        self.usable()?;
        SyncRequest {
            id,
            path: path.to_vec(),
        }
        .encode()
        .map_err(|e| Error::Remote {
            path: show(path).into_owned(),
            message: e.to_string(),
        })
    }

    pub(super) async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        if let Err(error) = self.stream.write_all(bytes).await {
            return Err(self.stream_error(&error));
        }
        Ok(())
    }

    pub(super) fn stream_error(&mut self, error: &std::io::Error) -> Error {
        self.end("the stream broke");
        Error::ConnectionLost {
            addr: self.serial.clone(),
            reason: format!("sync stream: {error}"),
        }
    }

    pub(super) fn protocol_error(&mut self, message: String) -> Error {
        self.end("protocol error");
        Error::Protocol(format!("{}: {message}", self.serial))
    }

    pub(super) fn unexpected_reply(&mut self, expected: &str, got: u32, path: &[u8]) -> Error {
        self.protocol_error(format!(
            "expected a {expected} reply for '{}', got {}",
            show(path),
            wire::id_name(got)
        ))
    }

    pub(super) fn push_chunk(&mut self, chunk: Bytes) {
        self.inbox.push(chunk);
    }

    /// The error for a stream that ended under us: the connection's end if
    /// that is what ended it.
    pub(super) fn stream_ended(&self) -> Error {
        Error::ConnectionLost {
            addr: self.serial.clone(),
            reason: match self.connection.closed() {
                Some(error) if !error.is_clean() => error.to_string(),
                _ => "the device closed the sync stream".to_string(),
            },
        }
    }

    /// Waits for more data; the end of the stream is an error here.
    pub(super) async fn fill(&mut self) -> Result<()> {
        match self.stream.read_chunk(READ_MAX).await {
            Ok(Some(chunk)) => {
                self.push_chunk(chunk);
                Ok(())
            }
            Ok(None) => {
                self.end("the device closed the stream");
                Err(self.stream_ended())
            }
            Err(error) => Err(self.stream_error(&error)),
        }
    }

    /// Takes data that already arrived, without waiting; false if none had.
    pub(super) async fn poll_fill(&mut self) -> Result<bool> {
        let stream = &mut self.stream;
        let polled = std::future::poll_fn(|cx| {
            let read = stream.read_chunk(READ_MAX);
            let mut read = std::pin::pin!(read);
            Poll::Ready(match read.as_mut().poll(cx) {
                Poll::Ready(result) => Some(result),
                Poll::Pending => None,
            })
        })
        .await;
        match polled {
            None => Ok(false),
            Some(Ok(Some(chunk))) => {
                self.push_chunk(chunk);
                Ok(true)
            }
            Some(Ok(None)) => {
                self.end("the device closed the stream");
                Err(self.stream_ended())
            }
            Some(Err(error)) => Err(self.stream_error(&error)),
        }
    }

    pub(super) fn peek_header(&self) -> Option<SyncHeader> {
        self.inbox.peek_header()
    }

    pub(super) fn consume(&mut self, amount: usize) {
        self.inbox.consume(amount)
    }

    /// Copies out `len` buffered bytes (which must be there).
    pub(super) fn take_vec(&mut self, len: usize) -> Vec<u8> {
        self.inbox.take_vec(len)
    }

    /// Up to `max` buffered bytes (at least one must be there), without copying.
    pub(super) fn take_piece(&mut self, max: usize) -> Bytes {
        self.inbox.take_piece(max)
    }

    pub(super) async fn read_vec(&mut self, len: usize) -> Result<Vec<u8>> {
        while self.inbox.len() < len {
            self.fill().await?;
        }
        Ok(self.take_vec(len))
    }

    pub(super) async fn read_header(&mut self) -> Result<SyncHeader> {
        let bytes = self.read_vec(HEADER_LEN).await?;
        Ok(SyncHeader::parse(&bytes).expect("a full header"))
    }
}
