//! Linux AIO (io_setup/io_submit/io_getevents) on a FunctionFS endpoint
//! file: the crate's only unsafe code.
//!
//! Why AIO: FunctionFS serves plain read()/write() one at a time under a
//! per-endpoint mutex, so the bus idles between transfers; AIO queues
//! several requests in the controller at once. Completions signal an
//! eventfd (`IOCB_FLAG_RESFD`) that tokio watches, so no thread blocks.
//!
//! Safety rests on two rules: a buffer stays owned by [`AioEndpoint`] (in
//! `in_flight`) from submission until its completion is reaped, and
//! dropping the endpoint first destroys the AIO context, which cancels the
//! requests still queued and waits until the kernel is done with all of
//! them, before any buffer is freed.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::task::{ready, Context, Poll};

use rustix::event::{eventfd, EventfdFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::endpoint::{annotate, Buffer, Completion, Endpoint};

/// `struct iocb` of `linux/aio_abi.h`: 64 bytes on every architecture, with
/// `aio_key` and `aio_rw_flags` swapped on big-endian ones.
#[repr(C)]
#[derive(Default)]
struct Iocb {
    aio_data: u64,
    #[cfg(target_endian = "little")]
    aio_key: u32,
    aio_rw_flags: i32,
    #[cfg(target_endian = "big")]
    aio_key: u32,
    aio_lio_opcode: u16,
    aio_reqprio: i16,
    aio_fildes: u32,
    aio_buf: u64,
    aio_nbytes: u64,
    aio_offset: i64,
    aio_reserved2: u64,
    aio_flags: u32,
    aio_resfd: u32,
}

/// `struct io_event`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

const _: () = assert!(std::mem::size_of::<Iocb>() == 64);
const _: () = assert!(std::mem::size_of::<IoEvent>() == 32);

const IOCB_CMD_PREAD: u16 = 0;
const IOCB_CMD_PWRITE: u16 = 1;
/// Signal `aio_resfd` (an eventfd) when the request completes.
const IOCB_FLAG_RESFD: u32 = 1;

/// `aio_context_t`: the kernel's `unsigned long`.
type AioContext = libc::c_ulong;

/// A transfer the kernel may still be using: its control block and buffer.
struct InFlight {
    /// Boxed so its address, which the kernel reports back, stays put.
    _iocb: Box<Iocb>,
    buffer: Buffer,
}

/// The shape of an endpoint's traffic, logged when it closes: how many
/// transfers completed per wake-up and how full they were. The link
/// simulator's usb3 model batches arrivals; these are the numbers to
/// calibrate that batching from (docs/benchmarks.md, "USB transfer shapes
/// under dummy_hcd, and the usb3 model").
#[derive(Debug, Default, Clone, Copy)]
struct CompletionShape {
    /// Wake-ups that reaped at least one completion.
    batches: u64,
    completions: u64,
    bytes: u64,
    largest_batch: usize,
    /// Completions of fewer bytes than were asked for (a short packet ended them).
    short: u64,
}

/// An endpoint file with up to `depth` transfers in flight.
pub struct AioEndpoint {
    shape: CompletionShape,
    context: AioContext,
    depth: usize,
    in_flight: HashMap<u64, InFlight>,
    /// Counts completions; tokio wakes the endpoint's task when it is readable.
    eventfd: AsyncFd<OwnedFd>,
    file: OwnedFd,
    path: PathBuf,
}

impl AioEndpoint {
    /// Takes `file` (opened `O_NONBLOCK`, so that a submission to a
    /// disabled endpoint fails rather than waiting for it to be enabled)
    /// and sets up a context for `depth` transfers. Needs a tokio runtime.
    pub fn new(file: OwnedFd, path: impl Into<PathBuf>, depth: usize) -> io::Result<AioEndpoint> {
        let path = path.into();
        let eventfd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| annotate(&path, "creating an eventfd", e.into()))?;
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open, and keeps
        // the same number, until the AsyncFd is dropped.
        let eventfd = unsafe { AsyncFd::register_with_interest(eventfd, Interest::READABLE) }
            .map_err(|e| annotate(&path, "watching the eventfd", e.into()))?;
        let mut context: AioContext = 0;
        let nr_events = libc::c_long::try_from(depth).expect("small depth");
        // SAFETY: io_setup writes one aio_context_t through the pointer, which
        // points at a live local of that type.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_io_setup,
                nr_events,
                &mut context as *mut AioContext,
            )
        };
        if rc != 0 {
            return Err(annotate(
                &path,
                "setting up AIO (io_setup)",
                io::Error::last_os_error(),
            ));
        }
        Ok(AioEndpoint {
            shape: CompletionShape::default(),
            context,
            depth,
            in_flight: HashMap::with_capacity(depth),
            eventfd,
            file,
            path,
        })
    }

    /// Takes every finished request off the completion ring, without waiting.
    fn reap(&mut self, done: &mut Vec<Completion>) -> io::Result<usize> {
        let mut events = [IoEvent::default(); 32];
        let mut reaped = 0;
        loop {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            let min_nr: libc::c_long = 0;
            let max_nr: libc::c_long = events.len() as libc::c_long;
            // SAFETY: the kernel writes at most `events.len()` io_events into
            // the array; the context is ours and alive; the timespec is read only.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_io_getevents,
                    self.context,
                    min_nr,
                    max_nr,
                    events.as_mut_ptr(),
                    &zero as *const libc::timespec,
                )
            };
            if rc < 0 {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(annotate(&self.path, "collecting completions", error));
            }
            let count = rc as usize;
            for event in &events[..count] {
                let Some(transfer) = self.in_flight.remove(&event.data) else {
                    // Only ids we submitted come back; anything else is a bug
                    // here, not a reason to touch memory.
                    tracing::error!(path = %self.path.display(), id = event.data, "completion of an unknown transfer");
                    continue;
                };
                let result = if event.res < 0 {
                    Err(io::Error::from_raw_os_error(-event.res as i32))
                } else {
                    self.shape.bytes += event.res as u64;
                    if (event.res as usize) < transfer.buffer.len() {
                        self.shape.short += 1;
                    }
                    Ok(event.res as usize)
                };
                done.push(Completion {
                    id: event.data,
                    buffer: transfer.buffer,
                    result,
                });
            }
            reaped += count;
            if count < events.len() {
                if reaped > 0 {
                    self.shape.batches += 1;
                    self.shape.completions += reaped as u64;
                    self.shape.largest_batch = self.shape.largest_batch.max(reaped);
                }
                return Ok(reaped);
            }
        }
    }
}

impl Endpoint for AioEndpoint {
    fn path(&self) -> &Path {
        &self.path
    }

    fn submit(&mut self, id: u64, mut buffer: Buffer) -> io::Result<()> {
        if self.in_flight.len() >= self.depth || self.in_flight.contains_key(&id) {
            return Err(annotate(
                &self.path,
                "submitting a transfer",
                io::Error::other(format!(
                    "transfer {id} exceeds the queue of {} or reuses an id",
                    self.depth
                )),
            ));
        }
        let (opcode, address, len) = match &mut buffer {
            Buffer::Read(data) => (IOCB_CMD_PREAD, data.as_mut_ptr() as u64, data.len()),
            Buffer::Write(data) => (IOCB_CMD_PWRITE, data.as_ptr() as u64, data.len()),
        };
        let mut iocb = Box::new(Iocb {
            aio_data: id,
            aio_lio_opcode: opcode,
            aio_fildes: self.file.as_raw_fd() as u32,
            aio_buf: address,
            aio_nbytes: len as u64,
            aio_flags: IOCB_FLAG_RESFD,
            aio_resfd: self.eventfd.get_ref().as_fd().as_raw_fd() as u32,
            ..Iocb::default()
        });
        let mut list = [&mut *iocb as *mut Iocb];
        // SAFETY: the iocb and the buffer it points into are moved into
        // `in_flight` below (heap memory: moving the Box/Vec/Bytes does not
        // move it) and are only released once this request's completion is
        // reaped, or after io_destroy in Drop. A read buffer is a Vec we own
        // exclusively; a write buffer is only read by the kernel.
        let nr: libc::c_long = 1;
        let rc = unsafe { libc::syscall(libc::SYS_io_submit, self.context, nr, list.as_mut_ptr()) };
        if rc != 1 {
            let error = if rc < 0 {
                io::Error::last_os_error()
            } else {
                io::Error::other("io_submit queued nothing")
            };
            return Err(annotate(&self.path, "submitting a transfer", error));
        }
        self.in_flight.insert(
            id,
            InFlight {
                _iocb: iocb,
                buffer,
            },
        );
        Ok(())
    }

    fn poll_complete(
        &mut self,
        cx: &mut Context<'_>,
        done: &mut Vec<Completion>,
    ) -> Poll<io::Result<()>> {
        loop {
            // Reap after draining the eventfd: a completion that lands in
            // between is reaped now and only costs a spurious wake-up later.
            if self.reap(done)? > 0 {
                return Poll::Ready(Ok(()));
            }
            let mut guard = ready!(self.eventfd.poll_read_ready(cx))?;
            let mut counter = [0u8; 8];
            match guard
                .try_io(|fd| rustix::io::read(fd.get_ref(), &mut counter).map_err(io::Error::from))
            {
                Ok(Ok(_)) | Err(_) => continue, // drained, or readiness cleared
                Ok(Err(error)) => {
                    return Poll::Ready(Err(annotate(&self.path, "reading the eventfd", error)))
                }
            }
        }
    }
}

impl Drop for AioEndpoint {
    fn drop(&mut self) {
        let shape = self.shape;
        if shape.completions > 0 {
            tracing::debug!(
                path = %self.path.display(),
                completions = shape.completions,
                batches = shape.batches,
                mean_batch = format_args!("{:.2}", shape.completions as f64 / shape.batches as f64),
                largest_batch = shape.largest_batch,
                mean_transfer_bytes = shape.bytes / shape.completions,
                short = shape.short,
                "endpoint closed: completions per wake-up"
            );
        }
        // SAFETY: the context is ours. io_destroy cancels queued requests and
        // returns once the kernel has finished with every one of them.
        let rc = unsafe { libc::syscall(libc::SYS_io_destroy, self.context) };
        if rc != 0 {
            let error = io::Error::last_os_error();
            tracing::error!(path = %self.path.display(), %error, "io_destroy failed; leaking the in-flight buffers");
            // The kernel may still write into them: never free them.
            std::mem::forget(std::mem::take(&mut self.in_flight));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::future::poll_fn;

    async fn wait(endpoint: &mut AioEndpoint, count: usize) -> Vec<Completion> {
        let mut done = Vec::new();
        while done.len() < count {
            poll_fn(|cx| endpoint.poll_complete(cx, &mut done))
                .await
                .unwrap();
        }
        done
    }

    // Regular files complete AIO inside io_submit, which is enough to check
    // the ABI, the eventfd wake-up and buffer hand-back on any Linux.
    #[tokio::test]
    async fn aio_round_trip_on_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("endpoint");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path)
            .unwrap();
        let mut endpoint = AioEndpoint::new(OwnedFd::from(file), &path, 4).unwrap();
        endpoint
            .submit(7, Buffer::Write(Bytes::from_static(b"hello, ")))
            .unwrap();
        endpoint
            .submit(8, Buffer::Write(Bytes::from_static(b"usb")))
            .unwrap();
        let mut done = wait(&mut endpoint, 2).await;
        done.sort_by_key(|c| c.id);
        assert_eq!(done[0].id, 7);
        assert_eq!(*done[0].result.as_ref().unwrap(), 7);
        assert_eq!(*done[1].result.as_ref().unwrap(), 3);
        assert_eq!(std::fs::read(&path).unwrap(), b"hello, usb");

        endpoint.submit(9, Buffer::Read(vec![0; 64])).unwrap();
        let done = wait(&mut endpoint, 1).await;
        let Completion {
            id,
            buffer: Buffer::Read(data),
            result,
        } = &done[0]
        else {
            panic!("a read comes back as a read");
        };
        assert_eq!(*id, 9);
        let n = *result.as_ref().unwrap();
        assert_eq!(&data[..n], b"hello, usb");
    }

    #[tokio::test]
    async fn errors_name_the_file_and_the_queue_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("read-only");
        std::fs::write(&path, b"x").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let mut endpoint = AioEndpoint::new(OwnedFd::from(file), &path, 1).unwrap();
        // Writing a read-only file fails at submission (EBADF).
        let error = endpoint
            .submit(1, Buffer::Write(Bytes::from_static(b"no")))
            .unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with(&format!("{}: submitting a transfer: ", path.display())),
            "{text}"
        );
        // A completed read frees its slot; a second one in flight would not fit.
        endpoint.submit(2, Buffer::Read(vec![0; 8])).unwrap();
        assert!(endpoint.submit(3, Buffer::Read(vec![0; 8])).is_err());
        assert_eq!(wait(&mut endpoint, 1).await.len(), 1);
        endpoint.submit(3, Buffer::Read(vec![0; 8])).unwrap();
    }
}
