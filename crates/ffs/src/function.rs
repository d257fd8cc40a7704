//! The ADB function on a mounted FunctionFS: `ep0` (descriptors, strings,
//! lifecycle events) and the two bulk endpoint files.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use tokio::sync::mpsc;

use crate::aio::AioEndpoint;
use crate::bulk::{READ_DEPTH, WRITE_DEPTH};
use crate::descriptors::{descriptors, strings, BULK_IN_FILE, BULK_OUT_FILE, INTERFACE_NAME};
use crate::event::{Event, SetupRequest, EVENT_LEN, MAX_EVENTS};
use crate::{FfsError, Gadget};

/// Where adbd's FunctionFS instance is usually mounted.
pub const DEFAULT_FFS_DIR: &str = "/dev/usb-ffs/adb";

/// An ADB function whose descriptors are written: the gadget can be bound
/// to a UDC from now on, and [`crate::serve`] runs connections on it.
///
/// `ep0` must stay open for as long as the function is wanted: FunctionFS
/// unbinds the gadget when it is closed. A thread (`oxadbd-ep0`) blocks
/// reading its events for the life of the process; blocking reads are the
/// simplest correct way to take them (non-blocking ones can fail with
/// EAGAIN while epoll holds ep0's lock, and the event would be missed).
pub struct FunctionFs {
    dir: PathBuf,
    events: mpsc::Receiver<Result<Event, FfsError>>,
}

impl FunctionFs {
    /// Opens `dir/ep0` and writes the descriptors and strings; logs "ready
    /// for UDC bind" at INFO once the gadget can be bound.
    pub fn open(dir: impl Into<PathBuf>) -> Result<FunctionFs, FfsError> {
        let dir = dir.into();
        let path = dir.join("ep0");
        let ep0 = rustix::fs::open(&path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| FfsError::io(&path, "opening", e.into()))?;
        write_blob(&ep0, &path, "writing descriptors", &descriptors())?;
        write_blob(&ep0, &path, "writing strings", &strings(INTERFACE_NAME))?;
        tracing::info!(
            ffs_dir = %dir.display(),
            "USB descriptors written; ready for UDC bind"
        );
        let (sender, events) = mpsc::channel(16);
        let thread_path = path.clone();
        std::thread::Builder::new()
            .name("oxadbd-ep0".into())
            .spawn(move || read_events(ep0, thread_path, sender))
            .map_err(|e| FfsError::io(&path, "starting its event thread", e))?;
        Ok(FunctionFs { dir, events })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Gadget for FunctionFs {
    type Endpoint = AioEndpoint;

    async fn next_event(&mut self) -> Result<Event, FfsError> {
        match self.events.recv().await {
            Some(event) => event,
            None => Err(FfsError::Ep0Closed {
                path: self.dir.join("ep0"),
            }),
        }
    }

    fn open_endpoints(&self) -> Result<(AioEndpoint, AioEndpoint), FfsError> {
        // O_NONBLOCK: a transfer queued on an endpoint that was disabled
        // meanwhile fails (EAGAIN) instead of waiting in io_submit for the
        // next ENABLE.
        let open = |name: &str, access: OFlags, depth: usize| {
            let path = self.dir.join(name);
            let file: OwnedFd = rustix::fs::open(
                &path,
                access | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| FfsError::io(&path, "opening", e.into()))?;
            AioEndpoint::new(file, &path, depth).map_err(|source| FfsError::Endpoint { source })
        };
        let bulk_out = open(BULK_OUT_FILE, OFlags::RDONLY, READ_DEPTH)?;
        let bulk_in = open(BULK_IN_FILE, OFlags::WRONLY, WRITE_DEPTH)?;
        Ok((bulk_out, bulk_in))
    }
}

/// FunctionFS takes each blob in a single write().
fn write_blob(
    ep0: &OwnedFd,
    path: &Path,
    action: &'static str,
    blob: &[u8],
) -> Result<(), FfsError> {
    match rustix::io::write(ep0, blob) {
        Ok(n) if n == blob.len() => Ok(()),
        Ok(n) => Err(FfsError::io(
            path,
            action,
            io::Error::other(format!("wrote {n} of {} bytes", blob.len())),
        )),
        Err(e) => Err(FfsError::io(path, action, e.into())),
    }
}

/// The event thread: reads ep0 until it fails or nobody listens.
fn read_events(ep0: OwnedFd, path: PathBuf, events: mpsc::Sender<Result<Event, FfsError>>) {
    let mut raw = [0u8; EVENT_LEN * MAX_EVENTS];
    loop {
        let n = match rustix::io::read(&ep0, &mut raw) {
            Ok(0) => {
                let _ = events.blocking_send(Err(FfsError::Ep0Closed { path }));
                return;
            }
            Ok(n) => n,
            // EIDRM: the host cancelled a SETUP before we stalled it.
            Err(Errno::INTR) | Err(Errno::IDRM) => continue,
            Err(e) => {
                let _ = events.blocking_send(Err(FfsError::io(&path, "reading events", e.into())));
                return;
            }
        };
        let Some(parsed) = Event::parse_all(&raw[..n]) else {
            let _ = events.blocking_send(Err(FfsError::BadEvents { path, len: n }));
            return;
        };
        for event in parsed {
            if let Event::Setup(setup) = event {
                stall(&ep0, &path, &setup);
            }
            if events.blocking_send(Ok(event)).is_err() {
                return;
            }
        }
    }
}

/// Refuses a control request: the ADB interface defines none. FunctionFS
/// stalls a pending request when ep0 is used against its direction
/// (read for device-to-host, write for host-to-device); the call then
/// fails with EL2HLT.
fn stall(ep0: &OwnedFd, path: &Path, setup: &SetupRequest) {
    let mut byte = [0u8; 1];
    let result = if setup.is_in() {
        rustix::io::read(ep0, &mut byte)
    } else {
        rustix::io::write(ep0, &byte)
    };
    match result {
        Err(Errno::L2HLT) => tracing::debug!(?setup, "stalled a control request"),
        other => {
            tracing::debug!(path = %path.display(), ?setup, ?other, "stalling a control request")
        }
    }
}
