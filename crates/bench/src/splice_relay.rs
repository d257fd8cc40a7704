//! The ceiling for any adb host server on this machine: a relay with no
//! protocol at all, which splices what one loopback connection brings into
//! another through a pipe and never touches the bytes. A push or pull that
//! goes CLI -> server -> daemon crosses loopback twice and runs three
//! processes; a raw transfer through this relay does the same with nothing
//! else, so no server can beat it (docs/server.md, "Performance").

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::thread::JoinHandle;

use anyhow::{bail, Context, Result};

/// One splice moves up to this much: as much as oxadb's server moves a time
/// (`oxadb_io::pipe_range`), and the unprivileged pipe-max-size.
const PIPE_BYTES: usize = 1 << 20;

/// Listens on a fresh loopback port; the first connection there is relayed
/// to `target` until it ends, then the relay shuts `target`'s writing side
/// and returns the bytes moved.
pub fn start(target: SocketAddr) -> Result<(SocketAddr, JoinHandle<Result<u64>>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let relay = std::thread::spawn(move || {
        let (from, _) = listener.accept()?;
        let to = TcpStream::connect(target)?;
        let moved = splice_all(&from, &to)?;
        to.shutdown(std::net::Shutdown::Write)?;
        Ok(moved)
    });
    Ok((addr, relay))
}

fn splice_all(from: &TcpStream, to: &TcpStream) -> Result<u64> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    // SAFETY: pipe2 just opened both, and nothing else owns them.
    let (pipe_read, pipe_write) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A smaller pipe only means smaller splices.
    // SAFETY: plain fcntl on a descriptor this function owns.
    unsafe {
        libc::fcntl(
            pipe_write.as_raw_fd(),
            libc::F_SETPIPE_SZ,
            PIPE_BYTES as libc::c_int,
        )
    };
    let mut moved = 0u64;
    loop {
        let n =
            splice(from.as_raw_fd(), pipe_write.as_raw_fd(), PIPE_BYTES).context("splice in")?;
        if n == 0 {
            return Ok(moved);
        }
        let mut left = n;
        while left > 0 {
            let out = splice(pipe_read.as_raw_fd(), to.as_raw_fd(), left).context("splice out")?;
            if out == 0 {
                bail!("the relay's target stopped taking bytes");
            }
            left -= out;
        }
        moved += n as u64;
    }
}

fn splice(from: i32, to: i32, len: usize) -> std::io::Result<usize> {
    // SAFETY: null offsets (both ends are a socket or a pipe); the kernel
    // moves page references between descriptors this thread holds.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}
