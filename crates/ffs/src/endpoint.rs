//! The seam between the transfer logic ([`crate::bulk`]) and the kernel: an
//! endpoint with several transfers in flight, each completing on its own.
//! [`crate::aio::AioEndpoint`] is the real one; [`crate::fake`] has
//! in-memory ones for tests.

use std::io;
use std::path::Path;
use std::task::{Context, Poll};

use bytes::Bytes;

/// What a transfer moves: a buffer to fill (bulk-out) or bytes to send (bulk-in).
#[derive(Debug)]
pub enum Buffer {
    /// Filled by the transfer up to its length; the completion says how much.
    Read(Vec<u8>),
    /// Sent as one transfer.
    Write(Bytes),
}

impl Buffer {
    pub fn len(&self) -> usize {
        match self {
            Buffer::Read(buffer) => buffer.len(),
            Buffer::Write(bytes) => bytes.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A finished transfer: its id, its buffer back, and how many bytes moved.
#[derive(Debug)]
pub struct Completion {
    pub id: u64,
    pub buffer: Buffer,
    pub result: io::Result<usize>,
}

/// One bulk endpoint. Transfers complete in any order (AIO reports them as
/// they finish), but USB moves their data in the order they were submitted.
pub trait Endpoint: Send + Unpin + 'static {
    /// The endpoint's file, for error messages.
    fn path(&self) -> &Path;

    /// Queues one transfer. The endpoint keeps `buffer` until it completes.
    fn submit(&mut self, id: u64, buffer: Buffer) -> io::Result<()>;

    /// Appends finished transfers to `done`; `Pending` (with a wake-up
    /// registered) when none has finished.
    fn poll_complete(
        &mut self,
        cx: &mut Context<'_>,
        done: &mut Vec<Completion>,
    ) -> Poll<io::Result<()>>;
}

/// `error` with the endpoint's path and what was being done, keeping its
/// kind: "/dev/usb-ffs/adb/ep1: reading: Cannot send after transport
/// endpoint shutdown (os error 108)".
pub(crate) fn annotate(path: &Path, action: &str, error: io::Error) -> io::Error {
    io::Error::new(
        error.kind(),
        format!("{}: {action}: {error}", path.display()),
    )
}
