//! Pushes on a [`SyncSession`], pipelined as adb's `file_sync_client.cpp`
//! does: the next file is sent before the device acknowledged the previous
//! one, and the `OKAY`s (or a `FAIL`) are collected on the way. The machine
//! frames the requests; the file data comes as ready-made batches of `DATA`
//! frames from a reading thread (`codec.rs`) or as file ranges.

use std::path::Path;
use std::time::Instant;

use oxadb_transfer::{Framing, SendError, Source};
use oxadb_wire::sync::{self as wire, HEADER_LEN};
use oxadb_wire::Payload;

use super::codec::FrameReader;
use super::session::SyncSession;
use super::{
    describe_io, show, transfer_error, Progress, PushOptions, TransferSummary, SYNC_DATA_MAX,
};
use crate::error::{Error, Result};

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

impl SyncSession {
    /// Pushes the regular file `local` (symlinks followed) to exactly `remote`
    /// and waits for the device to confirm it. With `options.sync` an
    /// unchanged file (same size and mtime on the device) is skipped.
    pub async fn push_file(
        &mut self,
        local: &Path,
        remote: impl AsRef<[u8]>,
        options: &PushOptions,
        progress: &mut dyn Progress,
    ) -> Result<TransferSummary> {
        let started = Instant::now();
        let remote = remote.as_ref();
        if options.dry_run && !self.features.dry_run_send {
            return Err(transfer_error(
                "dry-run not supported by the device".to_string(),
            ));
        }
        let metadata = tokio::fs::metadata(local).await.map_err(|e| {
            transfer_error(format!(
                "cannot stat '{}': {}",
                local.display(),
                describe_io(&e)
            ))
        })?;
        if !metadata.is_file() {
            return Err(transfer_error(format!(
                "cannot push '{}': not a regular file",
                local.display()
            )));
        }
        let mut summary = TransferSummary::default();
        if options.sync && self.unchanged(remote, &metadata).await? {
            summary.files_skipped = 1;
        } else {
            let mode = SendMode {
                compression: self.features.resolve(options.compression),
                dry_run: options.dry_run,
            };
            let bytes = self
                .send_regular(local, remote, LocalFile::of(&metadata), mode, progress)
                .await?;
            self.collect_acks(true).await?;
            summary.files_transferred = 1;
            summary.bytes = bytes;
        }
        summary.elapsed = started.elapsed();
        Ok(summary)
    }

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

    async fn send_inner(
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
                self.push_request(local, remote, file_mode, mode)?;
                // Request, data and DONE in one write, as adb sends them.
                self.client.push_data(&data);
                self.client.push_done(mtime);
                self.write_push().await?;
                progress.advance(data.len() as u64);
                self.collect_acks(false).await?;
                Ok(data.len() as u64)
            }
            Content::File(file) => {
                let compression = self.push_request(local, remote, file_mode, mode)?;
                self.write_push().await?;
                if compression == wire::Compression::None
                    && self.zero_copy
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
                    return self
                        .send_copying(local, file, compression, mtime, progress)
                        .await;
                }
                self.send_copying(local, file, compression, mtime, progress)
                    .await
            }
        }
    }

    /// Queues a push's request (`SND2`, or `SEND` on a device without it);
    /// returns the compression its data must have.
    fn push_request(
        &mut self,
        local: &Path,
        remote: &[u8],
        file_mode: u32,
        mode: SendMode,
    ) -> Result<wire::Compression> {
        let label = local.display().to_string();
        self.client
            .push(remote, file_mode, mode.compression, mode.dry_run, &label)
            .map_err(|e| self.transfer_request_error(e, local, remote))
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
                    self.client.end("a push was abandoned halfway");
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
            self.client.push_batch(payload);
            self.write_push().await?;
            sent += data;
            progress.advance(data);
            // A FAIL for this push (say, no space) stops it early.
            self.collect_acks(false).await?;
        }
        self.client.push_done(mtime);
        self.write_push().await?;
        self.collect_acks(false).await?;
        Ok(sent)
    }

    /// Reads the file into buffers on a blocking thread (compressed pushes,
    /// USB, TLS, non-regular files, `--no-zero-copy`).
    async fn send_copying(
        &mut self,
        local: &Path,
        file: std::fs::File,
        compression: wire::Compression,
        mtime: u32,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        let mut reader = FrameReader::start(file, compression);
        let mut sent = 0;
        while let Some(batch) = reader.next().await {
            // Appended by reference, not copied: the batch's buffer goes back
            // to the reading thread's pool once its last WRTE is sent.
            self.client.push_batch(Payload::from(batch));
            self.write_push().await?;
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
                self.client.end("a push was abandoned halfway");
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
        self.client.push_done(mtime);
        self.write_push().await?;
        self.collect_acks(false).await?;
        Ok(sent)
    }
}
