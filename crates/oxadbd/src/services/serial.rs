//! `dev:PATH` and `dev-raw:PATH`: a device node (a board's UART, a USB
//! serial adapter) relayed over the stream both ways. As in AOSP's
//! `daemon/services.cpp`, the node is opened read-write before the stream
//! is accepted, and `dev-raw:` first gives a terminal `cfmakeraw`'s
//! settings (no line editing, signals, echo or newline translation), so
//! every byte passes unchanged. A node that cannot be opened, or a
//! `dev-raw:` node that is not a terminal, refuses the stream.

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use oxadb_wire::service::DeviceService;
use rustix::fs::{Mode, OFlags};
use rustix::termios::OptionalActions;
use thiserror::Error;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::forward::Socket;

/// A parsed `dev:` or `dev-raw:` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub path: PathBuf,
    /// `dev-raw:`: put the terminal into raw mode first.
    pub raw: bool,
}

impl Request {
    /// A `dev:`/`dev-raw:` request for `path`; an empty path names no node.
    pub fn new(path: &str, raw: bool) -> Result<Request, String> {
        if path.is_empty() {
            let service = DeviceService::Dev {
                path: String::new(),
                raw,
            };
            return Err(format!("{:?} names no device path", service.to_string()));
        }
        Ok(Request {
            path: PathBuf::from(path),
            raw,
        })
    }

    fn service(&self) -> &'static str {
        if self.raw {
            "dev-raw"
        } else {
            "dev"
        }
    }
}

#[derive(Debug, Error)]
pub enum SerialError {
    #[error("{service}: cannot open {path}: {source}")]
    Open {
        service: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{service}: cannot put {path} into raw mode: {source}")]
    Raw {
        service: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// Opens the node for `request` (raw mode set for `dev-raw:`), ready to relay.
pub fn open(request: &Request) -> Result<Box<dyn Socket>, SerialError> {
    let service = request.service();
    let open_error = |source| SerialError::Open {
        service,
        path: request.path.clone(),
        source,
    };
    // O_NONBLOCK: a UART without CLOCAL would block open until carrier
    // detect; NOCTTY: the daemon must never acquire a controlling terminal.
    let fd = rustix::fs::open(
        &request.path,
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|errno| open_error(errno.into()))?;
    if request.raw {
        let raw_error = |errno: rustix::io::Errno| SerialError::Raw {
            service,
            path: request.path.clone(),
            source: errno.into(),
        };
        let mut termios = rustix::termios::tcgetattr(&fd).map_err(raw_error)?;
        termios.make_raw();
        // TCSADRAIN, as adbd: output already queued goes out with the old settings.
        rustix::termios::tcsetattr(&fd, OptionalActions::Drain, &termios).map_err(raw_error)?;
    }
    // SAFETY: an OwnedFd stays open and keeps its number until the AsyncFd
    // that owns it is dropped.
    match unsafe { AsyncFd::register(fd) } {
        Ok(fd) => Ok(Box::new(Node(fd))),
        Err(refused) => {
            let (fd, error) = refused.into_parts();
            // A node without poll support (epoll_ctl's EPERM: a regular
            // file, /dev/zero) is read and written by tokio's blocking
            // threads, where blocking is harmless for such files.
            if error.raw_os_error() != Some(libc::EPERM) {
                return Err(open_error(error));
            }
            let flags = rustix::fs::fcntl_getfl(&fd).map_err(|errno| open_error(errno.into()))?;
            rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK)
                .map_err(|errno| open_error(errno.into()))?;
            Ok(Box::new(tokio::fs::File::from_std(std::fs::File::from(fd))))
        }
    }
}

/// A pollable device node (terminals, ptys, most character devices).
struct Node(AsyncFd<OwnedFd>);

impl AsyncRead for Node {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| rustix::io::read(fd, &mut *unfilled).map_err(io::Error::from)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // A terminal whose other side is gone (a pty's master
                // closed, a USB adapter unplugged) reads EIO: that is EOF.
                Ok(Err(error)) if error.raw_os_error() == Some(libc::EIO) => {
                    return Poll::Ready(Ok(()))
                }
                Ok(Err(error)) => return Poll::Ready(Err(error)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Node {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|fd| rustix::io::write(fd, data).map_err(io::Error::from)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn requests_need_a_path() {
        assert_eq!(
            Request::new("/dev/ttyUSB0", true),
            Ok(Request {
                path: "/dev/ttyUSB0".into(),
                raw: true
            })
        );
        assert_eq!(
            Request::new("", false),
            Err("\"dev:\" names no device path".into())
        );
        assert_eq!(
            Request::new("", true),
            Err("\"dev-raw:\" names no device path".into())
        );
    }

    #[test]
    fn errors_name_the_service_path_and_cause() {
        let error = open(&Request {
            path: "/nonexistent/tty".into(),
            raw: false,
        })
        .err()
        .unwrap();
        assert_eq!(
            error.to_string(),
            "dev: cannot open /nonexistent/tty: No such file or directory (os error 2)"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        let error = open(&Request {
            path: file.clone(),
            raw: true,
        })
        .err()
        .unwrap();
        assert_eq!(
            error.to_string(),
            format!(
                "dev-raw: cannot put {} into raw mode: Inappropriate ioctl for device (os error 25)",
                file.display()
            )
        );
    }

    #[tokio::test]
    async fn raw_mode_passes_every_byte_of_a_pty() {
        let (master, slave) = pty_pair();
        let slave_path = rustix::pty::ptsname(&master, Vec::new()).unwrap();
        let path = PathBuf::from(slave_path.to_str().unwrap());
        let mut node = open(&Request {
            path: path.clone(),
            raw: true,
        })
        .unwrap();
        let termios = rustix::termios::tcgetattr(&slave).unwrap();
        assert!(!termios
            .local_modes
            .contains(rustix::termios::LocalModes::ICANON));
        let mut master = tokio::fs::File::from_std(std::fs::File::from(master));
        let all: Vec<u8> = (0..=255u8).collect();
        master.write_all(&all).await.unwrap();
        let mut got = vec![0; all.len()];
        node.read_exact(&mut got).await.unwrap();
        assert_eq!(got, all);
        node.write_all(b"a\nb\r\x03").await.unwrap();
        let mut got = [0; 5];
        master.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"a\nb\r\x03");
    }

    fn pty_pair() -> (OwnedFd, OwnedFd) {
        use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
        grantpt(&master).unwrap();
        unlockpt(&master).unwrap();
        let name = ptsname(&master, Vec::new()).unwrap();
        let slave = rustix::fs::open(
            name.as_c_str(),
            OFlags::RDWR | OFlags::NOCTTY,
            Mode::empty(),
        )
        .unwrap();
        (master, slave)
    }
}
