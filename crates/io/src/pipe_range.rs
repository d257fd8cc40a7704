//! Socket bytes that never enter user memory on their way to a device: a
//! relay splices what its socket received into a pipe (splice(2) hands over
//! the socket buffer's pages), queues them as a range of that pipe
//! ([`RangeSource::pipe_fd`]), and the device's [`TcpSink`](crate::TcpSink)
//! splices them from the pipe into its socket. On loopback this took the
//! server's share of a push from two copies per byte to none
//! (docs/server.md, "Performance").

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use oxadb_wire::{FileRange, RangeSource};
use rustix::pipe::{PipeFlags, SpliceFlags};

/// Capacity asked of each pipe: one splice moves up to this much, as much
/// as a WRTE of oxadbd's carries (1 MiB, `MAX_PAYLOAD`). It is also the
/// default /proc/sys/fs/pipe-max-size, so no privilege is needed; past the
/// user's pipe allowance (pipe(7), pipe-user-pages-soft) pipes stay at the
/// default 64 KiB and splices just move less.
const PIPE_CAPACITY: usize = 1024 * 1024;

/// Empty pipes kept for the next chunk; more are closed when they empty.
const IDLE_PIPES: usize = 8;

struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
        let capacity = match rustix::pipe::fcntl_setpipe_size(&write, PIPE_CAPACITY) {
            Ok(capacity) => capacity,
            Err(_) => rustix::pipe::fcntl_getpipe_size(&write)?,
        };
        Ok(Pipe {
            read,
            write,
            capacity,
        })
    }
}

/// The pipes of one relay direction.
pub struct PipePool {
    idle: Mutex<Vec<Pipe>>,
}

impl PipePool {
    pub fn new() -> Arc<PipePool> {
        Arc::new(PipePool {
            idle: Mutex::new(Vec::new()),
        })
    }

    fn take(&self) -> io::Result<Pipe> {
        match self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            Some(pipe) => Ok(pipe),
            None => Pipe::new(),
        }
    }

    fn give_back(&self, pipe: Pipe) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < IDLE_PIPES {
            idle.push(pipe);
        }
    }

    /// Moves what `socket` has received, up to a pipe's capacity, into a
    /// pipe of its own and returns it as a range: `Ok(None)` at the
    /// socket's end, `WouldBlock` when nothing has arrived (the socket is
    /// non-blocking; the pipe is empty, so it never blocks).
    pub fn splice_from(self: &Arc<Self>, socket: BorrowedFd<'_>) -> io::Result<Option<FileRange>> {
        let pipe = self.take()?;
        let flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
        match rustix::pipe::splice(socket, None, &pipe.write, None, pipe.capacity, flags) {
            Ok(0) => {
                self.give_back(pipe);
                Ok(None)
            }
            Ok(len) => Ok(Some(FileRange {
                source: Arc::new(PipeSource {
                    pipe: Some(pipe),
                    len,
                    consumed: AtomicUsize::new(0),
                    pool: Arc::downgrade(self),
                }),
                offset: 0,
                len,
            })),
            Err(error) => {
                self.give_back(pipe);
                Err(error.into())
            }
        }
    }
}

/// `len` bytes waiting in a pipe, sent once and in order.
struct PipeSource {
    /// `None` only while dropping.
    pipe: Option<Pipe>,
    len: usize,
    consumed: AtomicUsize,
    pool: Weak<PipePool>,
}

impl std::fmt::Debug for PipeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipeSource")
            .field("len", &self.len)
            .field("consumed", &self.consumed.load(Ordering::Relaxed))
            .finish()
    }
}

impl PipeSource {
    fn pipe(&self) -> &Pipe {
        self.pipe.as_ref().expect("present until dropped")
    }
}

impl RangeSource for PipeSource {
    fn sendfile_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn sendfile_refused(&self) {}

    fn sent(&self, bytes: u64) {
        self.consumed.fetch_add(bytes as usize, Ordering::Relaxed);
    }

    /// The copying path (a writer that cannot splice): the pipe's next
    /// bytes, which are the range's, since ranges are taken in order.
    fn read_exact_at(&self, mut buf: &mut [u8], _offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match rustix::io::read(&self.pipe().read, &mut *buf) {
                Ok(0) => return Err(self.shrank(self.len as u64)),
                Ok(n) => {
                    self.consumed.fetch_add(n, Ordering::Relaxed);
                    buf = &mut buf[n..];
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    fn shrank(&self, end: u64) -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "relay pipe: {} of {} bytes left before {end}",
                self.len - self.consumed.load(Ordering::Relaxed),
                self.len
            ),
        )
    }

    fn pipe_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.pipe().read.as_fd())
    }
}

impl Drop for PipeSource {
    fn drop(&mut self) {
        // A pipe still holding bytes (its connection ended first) is closed.
        if let (Some(pipe), Some(pool)) = (self.pipe.take(), self.pool.upgrade()) {
            if *self.consumed.get_mut() == self.len {
                pool.give_back(pipe);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    fn socket_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    /// Bytes spliced from one socket come out of their range, by splice into
    /// another socket and by the copying path, in order and once; an empty
    /// socket would block, and a closed one ends.
    #[test]
    fn socket_bytes_pass_through_pipes_in_order() {
        let (mut sender, receiver) = socket_pair();
        receiver.set_nonblocking(true).unwrap();
        let pool = PipePool::new();
        let error = pool.splice_from(receiver.as_fd()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);

        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        sender.write_all(&data).unwrap();
        let mut ranges = Vec::new();
        let mut got = 0;
        while got < data.len() {
            match pool.splice_from(receiver.as_fd()) {
                Ok(Some(range)) => {
                    got += range.len;
                    ranges.push(range);
                }
                Ok(None) => panic!("end before the data"),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(error) => panic!("{error}"),
            }
        }
        assert_eq!(got, data.len());

        // The first range spliced on into a socket, the rest read.
        let (out_writer, mut out_reader) = socket_pair();
        let first = &ranges[0];
        let pipe = first.source.pipe_fd().expect("a pipe range");
        let mut sent = 0;
        while sent < first.len {
            let n = rustix::pipe::splice(
                pipe,
                None,
                &out_writer,
                None,
                first.len - sent,
                SpliceFlags::empty(),
            )
            .unwrap();
            first.source.sent(n as u64);
            sent += n;
        }
        let mut received = vec![0u8; first.len];
        out_reader.read_exact(&mut received).unwrap();
        for range in &ranges[1..] {
            let mut buf = vec![0u8; range.len];
            range.source.read_exact_at(&mut buf, range.offset).unwrap();
            received.extend_from_slice(&buf);
        }
        assert!(received == data, "bytes differ after the pipes");

        // Emptied pipes go back to the pool for the next chunk.
        drop(ranges);
        assert!(!pool.idle.lock().unwrap().is_empty());
        drop(sender);
        let end = loop {
            match pool.splice_from(receiver.as_fd()) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                other => break other,
            }
        };
        assert!(matches!(end, Ok(None)), "a closed socket ends: {end:?}");
    }
}
