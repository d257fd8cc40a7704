//! Keeping a TCP socket's send buffer full, for every sink that writes one
//! (plaintext [`TcpSink`](crate::TcpSink) and TLS [`TlsSink`](crate::tls_stream::TlsSink)).
//!
//! Linux reports a TCP socket writable (EPOLLOUT) only once a third of its
//! send buffer is free (`sk_stream_is_writeable`: free space at least half
//! of what is queued), yet a write succeeds as soon as anything is free
//! (`sk_stream_memory_free`). A writer woken by readiness alone therefore
//! lets the queue fall to two thirds before it refills. Where the send buffer
//! is what limits a connection (a long round trip under the kernel's default
//! `tcp_wmem` maximum of 4 MiB), bytes in flight and so throughput fall with
//! it: 1 Gbit/s at 50 ms moved 48 MB/s that way, and 60 MB/s when the writer
//! also retried every millisecond (iperf3: 54). See docs/benchmarks.md,
//! "On an emulated link".

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::tcp::OwnedWriteHalf;

/// First retry after a write found the buffer full: at 1 Gbit/s a
/// millisecond frees 125 KB, a few percent of a 4 MiB buffer.
const FIRST_RETRY: Duration = Duration::from_millis(1);
/// Retries back off to this while nothing at all is accepted (a peer that
/// stopped reading), so a blocked connection costs a few wake-ups a second.
const LAST_RETRY: Duration = Duration::from_millis(64);

/// When a writer retries a full socket: on readiness, and on a timer that
/// starts at [`FIRST_RETRY`] and doubles while nothing is accepted.
#[derive(Debug)]
pub(crate) struct Refill {
    retry: Duration,
    /// Whether the next attempt bypasses tokio's readiness flag, which
    /// stays clear until the kernel's one-third wake-up.
    eager: bool,
}

impl Refill {
    pub(crate) fn new() -> Refill {
        Refill {
            retry: FIRST_RETRY,
            eager: false,
        }
    }

    /// Runs `attempt` (one non-blocking system call on `socket`) until it
    /// succeeds and returns what it returned; a full socket is retried.
    pub(crate) async fn write(
        &mut self,
        socket: &OwnedWriteHalf,
        mut attempt: impl FnMut(BorrowedFd<'_>) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let socket = socket.as_ref();
        loop {
            let result = if self.eager {
                attempt(socket.as_fd())
            } else {
                socket.try_io(Interest::WRITABLE, || attempt(socket.as_fd()))
            };
            match result {
                Ok(written) => {
                    self.retry = FIRST_RETRY;
                    self.eager = false;
                    return Ok(written);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    if self.eager {
                        self.retry = (self.retry * 2).min(LAST_RETRY);
                    }
                    tokio::select! {
                        ready = socket.writable() => {
                            ready?;
                            self.eager = false;
                        }
                        _ = tokio::time::sleep(self.retry) => self.eager = true,
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
    }
}
