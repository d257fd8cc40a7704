//! A pushed file read (and compressed) on a blocking thread into batches of
//! ready-to-send `DATA` frames by `oxadb-transfer` (`Framing::HOST`); the
//! async side only moves the batches. Pulled data is written by
//! `oxadb_transfer::receive` (see `receive.rs`).

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use oxadb_transfer::{handoff, send_frames, Framing, SendError};
use oxadb_wire::sync::Compression;

/// A pushed file being read (and compressed) on a blocking thread into batches
/// of complete `DATA` frames. A batch's buffer is reused once it is dropped.
pub(crate) struct FrameReader {
    batches: handoff::Receiver<Bytes>,
    consumed: Arc<AtomicU64>,
    reported: u64,
    worker: tokio::task::JoinHandle<Result<(), SendError>>,
}

impl FrameReader {
    pub(crate) fn start(file: File, compression: Compression) -> FrameReader {
        let (mut sender, batches) = handoff::channel(Framing::HOST.queue_depth);
        let consumed = Arc::new(AtomicU64::new(0));
        let counter = consumed.clone();
        let worker = tokio::task::spawn_blocking(move || {
            send_frames(
                &file,
                compression,
                &Framing::HOST,
                |batch| sender.blocking_send(batch).is_ok(),
                &counter,
            )
        });
        FrameReader {
            batches,
            consumed,
            reported: 0,
            worker,
        }
    }

    /// The next batch of frames, or `None` at the end of the file or after a failure.
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        self.batches.recv().await
    }

    /// File bytes read since the last call.
    pub(crate) fn newly_read(&mut self) -> u64 {
        let now = self.consumed.load(Ordering::Relaxed);
        let delta = now - self.reported;
        self.reported = now;
        delta
    }

    /// Waits for the thread; `Ok` means the whole file was read and framed.
    pub(crate) async fn finish(self) -> Result<(), SendError> {
        drop(self.batches);
        match self.worker.await {
            Ok(result) => result,
            Err(join) => Err(SendError::Read(io::Error::other(join))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxadb_wire::sync::{self as wire, SyncHeader, HEADER_LEN, SYNC_DATA_MAX};

    #[tokio::test]
    async fn frames_and_counts_a_file() {
        let data: Vec<u8> = (0..3 * SYNC_DATA_MAX + 77)
            .map(|i| (i % 251) as u8)
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, &data).unwrap();
        let mut reader = FrameReader::start(File::open(&path).unwrap(), Compression::None);
        let mut payload = Vec::new();
        while let Some(batch) = reader.next().await {
            let mut at = 0;
            while at < batch.len() {
                let header = SyncHeader::parse(&batch[at..]).unwrap();
                assert_eq!(header.id, wire::ID_DATA);
                let len = header.data_len().unwrap();
                payload.extend_from_slice(&batch[at + HEADER_LEN..at + HEADER_LEN + len]);
                at += HEADER_LEN + len;
            }
        }
        assert_eq!(reader.newly_read(), data.len() as u64);
        reader.finish().await.unwrap();
        assert_eq!(payload, data);
    }
}
