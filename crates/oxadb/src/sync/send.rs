//! Pushes, pipelined as adb's `file_sync_client.cpp` does: the next file is
//! sent before the device acknowledged the previous one, and the `OKAY`s (or
//! a `FAIL`) are collected on the way.

use std::path::Path;

use oxadb_wire::sync::{self as wire, HEADER_LEN};
use tokio::io::AsyncWriteExt;

use super::codec::FrameReader;
use super::session::SyncSession;
use super::{describe_io, show, transfer_error, Progress, SYNC_DATA_MAX};
use crate::error::{Error, Result};
use oxadb_io::WriteChunk;
use oxadb_transfer::{Framing, SendError, Source};
use oxadb_wire::Payload;

/// Pushes in flight before waiting for acknowledgements (adb's limit).
pub(super) const MAX_UNACKED: usize = 128;

/// How a push sends its data.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendMode {
    pub compression: wire::Compression,
    pub dry_run: bool,
}

/// What a push sends.
pub(crate) enum Content {
    /// Small files and symlink targets: sent in one write with the request.
    Bytes(Vec<u8>),
    /// Read and framed on a blocking thread.
    File(std::fs::File),
}

/// A file or symlink to push.
pub(crate) struct Upload<'a> {
    pub local: &'a Path,
    pub remote: &'a [u8],
    /// Full `st_mode`: `S_IFLNK` makes the device create a symlink.
    pub mode: u32,
    pub mtime: u32,
    /// Size for progress reports.
    pub size: u64,
    pub content: Content,
}

/// What a push needs to know about a local regular file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalFile {
    pub size: u64,
    /// Full `st_mode`.
    pub mode: u32,
    pub mtime: i64,
}

impl LocalFile {
    pub(crate) fn of(metadata: &std::fs::Metadata) -> LocalFile {
        use std::os::unix::fs::MetadataExt;
        LocalFile {
            size: metadata.size(),
            mode: metadata.mode(),
            mtime: metadata.mtime(),
        }
    }
}

/// A push sent but not yet acknowledged, named for error messages.
pub(super) struct Unacked {
    local: String,
    remote: String,
}

impl SyncSession {
    // ----- push -----

    /// Sends the regular file `local` without waiting for the acknowledgement.
    pub(crate) async fn send_regular(
        &mut self,
        local: &Path,
        remote: &[u8],
        file: LocalFile,
        mode: SendMode,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        let size = file.size;
        let content = if size < SYNC_DATA_MAX as u64 {
            let data = tokio::fs::read(local).await.map_err(|e| {
                transfer_error(format!(
                    "failed to read all of '{}': {}",
                    local.display(),
                    describe_io(&e)
                ))
            })?;
            Content::Bytes(data)
        } else {
            let file = std::fs::File::open(local).map_err(|e| {
                transfer_error(format!(
                    "opening '{}' locally failed: {}",
                    local.display(),
                    describe_io(&e)
                ))
            })?;
            Content::File(file)
        };
        let upload = Upload {
            local,
            remote,
            mode: file.mode,
            mtime: file.mtime as u32,
            size,
            content,
        };
        self.send(upload, mode, progress).await
    }

    /// Sends one push (request, data, `DONE`); the acknowledgement is
    /// collected later. Returns the file bytes sent (before compression).
    pub(crate) async fn send(
        &mut self,
        upload: Upload<'_>,
        mode: SendMode,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        self.usable()?;
        let local_name = upload.local.display().to_string();
        let remote_name = show(upload.remote).into_owned();
        progress.start(&remote_name, Some(upload.size));
        let result = self.send_inner(upload, mode, progress).await;
        progress.finish();
        result.map_err(|error| match error {
            Error::Transfer { .. } => error,
            other => transfer_error(format!(
                "failed to copy '{local_name}' to '{remote_name}': {other}"
            )),
        })
    }

    pub(super) async fn send_inner(
        &mut self,
        upload: Upload<'_>,
        mode: SendMode,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        let Upload {
            local,
            remote,
            mode: file_mode,
            mtime,
            content,
            ..
        } = upload;
        match content {
            Content::Bytes(data) => {
                // Small data is never worth compressing (nor does adb).
                let mode = SendMode {
                    compression: wire::Compression::None,
                    ..mode
                };
                let mut message = self.send_request(local, remote, file_mode, mode)?;
                message.reserve(2 * HEADER_LEN + data.len());
                message.extend_from_slice(&wire::encode_data_header(data.len()));
                message.extend_from_slice(&data);
                message.extend_from_slice(&wire::encode_done(mtime));
                self.expect_ack(local, remote);
                self.write_push(&message).await?;
                progress.advance(data.len() as u64);
                self.collect_acks(false).await?;
                Ok(data.len() as u64)
            }
            Content::File(file) => {
                let request = self.send_request(local, remote, file_mode, mode)?;
                self.expect_ack(local, remote);
                self.write_push(&request).await?;
                if mode.compression == wire::Compression::None
                    && oxadb_transfer::zero_copy_enabled()
                    && self.stream.takes_file_ranges()
                {
                    let source = Source::new(file)
                        .map_err(|e| {
                            transfer_error(format!(
                                "reading '{}' locally failed: {}",
                                local.display(),
                                describe_io(&e)
                            ))
                        })?
                        .named(local);
                    if source.ranges_possible() {
                        return self.send_ranges(local, source, mtime, progress).await;
                    }
                    let file = source.into_file();
                    return self.send_copying(local, file, mode, mtime, progress).await;
                }
                self.send_copying(local, file, mode, mtime, progress).await
            }
        }
    }

    /// A plain push of a regular file: `DATA` frames whose payloads are file
    /// ranges, appended to the stream like the copying path's writes so that
    /// the WRTEs are the same; the writer sends them by `sendfile`
    /// (docs/architecture.md, "Zero-copy transfers").
    async fn send_ranges(
        &mut self,
        local: &Path,
        source: Source,
        mtime: u32,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        let mut sent = 0;
        for payload in source.into_ranges(&Framing::HOST, self.ranges.clone()) {
            let payload = match payload {
                Ok(payload) => payload,
                Err(e) => {
                    self.end("a push was abandoned halfway");
                    return Err(transfer_error(format!(
                        "reading '{}' locally failed: {}",
                        local.display(),
                        describe_io(&e)
                    )));
                }
            };
            // Frame headers are 8 of every 65544 bytes; the rest is file data.
            let frames = payload.len().div_ceil(HEADER_LEN + SYNC_DATA_MAX);
            let data = (payload.len() - frames * HEADER_LEN) as u64;
            if let Err(error) = self.stream.write_payload(payload, true).await {
                self.collect_acks(true).await?;
                return Err(self.stream_error(&error));
            }
            sent += data;
            progress.advance(data);
            // A FAIL for this push (say, no space) stops it early.
            self.collect_acks(false).await?;
        }
        self.write_push(&wire::encode_done(mtime)).await?;
        self.collect_acks(false).await?;
        Ok(sent)
    }

    /// Reads the file into buffers on a blocking thread (compressed pushes,
    /// USB, TLS, non-regular files, `--no-zero-copy`).
    async fn send_copying(
        &mut self,
        local: &Path,
        file: std::fs::File,
        mode: SendMode,
        mtime: u32,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        let mut reader = FrameReader::start(file, mode.compression);
        let mut sent = 0;
        while let Some(batch) = reader.next().await {
            // Appended by reference, not copied: the batch's buffer goes back
            // to the reading thread's pool once its last WRTE is sent.
            if let Err(error) = self.stream.write_payload(Payload::from(batch), true).await {
                self.collect_acks(true).await?;
                return Err(self.stream_error(&error));
            }
            let read = reader.newly_read();
            sent += read;
            progress.advance(read);
            // A FAIL for this push (say, no space) stops it early.
            self.collect_acks(false).await?;
        }
        let read = reader.newly_read();
        sent += read;
        progress.advance(read);
        match reader.finish().await {
            Ok(()) => {}
            Err(failure) => {
                // Without DONE the device discards what it got; this
                // stream can't continue, so end it.
                self.end("a push was abandoned halfway");
                let message = match failure {
                    SendError::Read(e) => format!(
                        "reading '{}' locally failed: {}",
                        local.display(),
                        describe_io(&e)
                    ),
                    SendError::Compress(e) => format!(
                        "compressing '{}' locally failed: {}",
                        local.display(),
                        describe_io(&e)
                    ),
                    SendError::Stopped => {
                        format!("reading '{}' locally stopped", local.display())
                    }
                };
                return Err(transfer_error(message));
            }
        }
        self.write_push(&wire::encode_done(mtime)).await?;
        self.collect_acks(false).await?;
        Ok(sent)
    }

    pub(super) fn expect_ack(&mut self, local: &Path, remote: &[u8]) {
        self.unacked.push_back(Unacked {
            local: local.display().to_string(),
            remote: show(remote).into_owned(),
        });
    }

    /// Writes push data; when the device closed the stream, its `FAIL` says why.
    pub(super) async fn write_push(&mut self, bytes: &[u8]) -> Result<()> {
        if let Err(error) = self.stream.write_all(bytes).await {
            self.collect_acks(true).await?;
            return Err(self.stream_error(&error));
        }
        Ok(())
    }

    /// Reads the device's answers to finished pushes: all of them when
    /// `block`, else only what already arrived (unless too many are pending).
    pub(crate) async fn collect_acks(&mut self, block: bool) -> Result<()> {
        while let Some(front) = self.unacked.front() {
            let context = (front.local.clone(), front.remote.clone());
            let wait = block || self.unacked.len() > MAX_UNACKED;
            match self.next_ack(wait).await {
                Ok(true) => {
                    self.unacked.pop_front();
                }
                Ok(false) => return Ok(()),
                Err(error) => {
                    self.unacked.clear();
                    return Err(match error {
                        Error::Transfer { .. } => error,
                        other => transfer_error(format!(
                            "failed to copy '{}' to '{}': {other}",
                            context.0, context.1
                        )),
                    });
                }
            }
        }
        Ok(())
    }

    /// Consumes one `OKAY` (true), or finds not enough data without `wait`
    /// (false); a `FAIL` becomes adb's "failed to copy" error.
    pub(super) async fn next_ack(&mut self, wait: bool) -> Result<bool> {
        loop {
            if let Some(header) = self.peek_header() {
                match header.id {
                    wire::ID_OKAY => {
                        self.consume(HEADER_LEN);
                        if header.len != 0 {
                            return Err(self.protocol_error(format!(
                                "OKAY with a message length of {}",
                                header.len
                            )));
                        }
                        return Ok(true);
                    }
                    wire::ID_FAIL => {
                        let len = header.len as usize;
                        if len > SYNC_DATA_MAX {
                            return Err(self.protocol_error(format!("FAIL message of {len} bytes")));
                        }
                        if self.inbox.len() >= HEADER_LEN + len {
                            self.consume(HEADER_LEN);
                            let message = self.take_vec(len);
                            let failed = self.unacked.pop_front().expect("a pending push");
                            self.end("the device reported a failed push");
                            return Err(transfer_error(format!(
                                "failed to copy '{}' to '{}': remote {}",
                                failed.local,
                                failed.remote,
                                String::from_utf8_lossy(&message)
                            )));
                        }
                    }
                    other => {
                        return Err(self.protocol_error(format!(
                            "unexpected response to a push: {}",
                            wire::id_name(other)
                        )))
                    }
                }
            }
            if wait {
                self.fill().await?;
            } else if !self.poll_fill().await? {
                return Ok(false);
            }
        }
    }
}
