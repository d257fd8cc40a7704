//! [`SendFile`]: a file sent by ranges, the [`RangeSource`] behind the
//! `FileRange`s of [`Source::into_ranges`](crate::Source::into_ranges). The
//! protocol holds it as an opaque reference and a length; the connection's
//! writer (`oxadb-io`) hands its descriptor to `sendfile`, or reads it.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use oxadb_wire::{RangeCounters, RangeSource};

/// A file sent by ranges, and where to count what happened to them.
#[derive(Debug)]
pub struct SendFile {
    file: File,
    /// What error messages call the file (its local path), if known.
    name: Option<String>,
    /// `sendfile` refused this file: its other ranges are read into memory
    /// without trying again.
    unsupported: AtomicBool,
    counters: Arc<RangeCounters>,
}

impl SendFile {
    pub fn new(file: File, counters: Arc<RangeCounters>) -> Arc<SendFile> {
        SendFile::named(file, None, counters)
    }

    /// As [`SendFile::new`], for a file that errors name as `name`.
    pub fn named(file: File, name: Option<String>, counters: Arc<RangeCounters>) -> Arc<SendFile> {
        counters.files.fetch_add(1, Ordering::Relaxed);
        Arc::new(SendFile {
            file,
            name,
            unsupported: AtomicBool::new(false),
            counters,
        })
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether `sendfile` failed for this file and its ranges are copied.
    pub fn fell_back(&self) -> bool {
        self.unsupported.load(Ordering::Relaxed)
    }

    /// The file as error messages name it.
    fn describe(&self) -> String {
        match &self.name {
            Some(name) => format!("'{name}'"),
            None => "a file".to_string(),
        }
    }
}

impl RangeSource for SendFile {
    fn sendfile_fd(&self) -> Option<BorrowedFd<'_>> {
        (!self.fell_back()).then(|| self.file.as_fd())
    }

    fn sendfile_refused(&self) {
        if !self.unsupported.swap(true, Ordering::Relaxed) {
            self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn sent(&self, bytes: u64) {
        self.counters
            .by_sendfile
            .fetch_add(bytes, Ordering::Relaxed);
    }

    /// Positioned reads: the file offset is not used.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self.file.read_exact_at(buf, offset) {
            Ok(()) => {
                self.counters
                    .copied
                    .fetch_add(buf.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                Err(self.shrank(offset + buf.len() as u64))
            }
            Err(error) => Err(io::Error::new(
                error.kind(),
                format!("reading {}: {error}", self.describe()),
            )),
        }
    }

    fn shrank(&self, end: u64) -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "{} shrank while being sent: it ends before byte {end}, which was already framed",
                self.describe()
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(data: &[u8], name: Option<&str>) -> Arc<SendFile> {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(data).unwrap();
        SendFile::named(file, name.map(String::from), Arc::default())
    }

    #[test]
    fn reads_are_positioned_and_counted() {
        let file = file_with(b"0123456789", None);
        let mut buf = [0u8; 4];
        file.read_exact_at(&mut buf, 3).unwrap();
        assert_eq!(&buf, b"3456");
        file.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"0123", "the file offset is not used");
        assert_eq!(file.counters.snapshot(), (1, 0, 8, 0));
    }

    #[test]
    fn a_short_file_is_an_error_naming_it() {
        let file = file_with(b"abc", Some("/var/log/short"));
        let mut buf = [0u8; 4];
        let error = file.read_exact_at(&mut buf, 0).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        let message = error.to_string();
        assert!(
            message.contains("'/var/log/short' shrank") && message.contains("before byte 4"),
            "{message}"
        );
        assert_eq!(file.counters.snapshot(), (1, 0, 0, 0), "nothing copied");
    }

    #[test]
    fn a_refusal_of_sendfile_is_counted_once_and_stops_it() {
        let file = file_with(b"abc", None);
        assert!(file.sendfile_fd().is_some());
        file.sendfile_refused();
        file.sendfile_refused();
        assert!(file.fell_back());
        assert!(file.sendfile_fd().is_none(), "read from now on");
        file.sent(3);
        assert_eq!(file.counters.snapshot(), (1, 3, 0, 1));
    }
}
