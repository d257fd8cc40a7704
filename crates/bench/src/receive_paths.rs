//! `receive-paths`: how fast can any receiver write a TCP stream into a tmpfs
//! file on this machine? A pull can be no faster than its bare file copy, so
//! this measures the copy's floor with the receive paths Linux offers:
//! `read` + `write` (two copies), `splice` socket -> pipe -> file (the socket
//! pages move into the pipe; one copy into the file) and `read` straight into
//! a shared `mmap` of the destination (one copy, a page fault per 4 KiB).
//! The sender is the same in every case: `read` the source, `write` the socket.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

const CHUNK: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceivePath {
    ReadWrite,
    Splice,
    Mmap,
}

impl ReceivePath {
    pub const ALL: [ReceivePath; 3] = [
        ReceivePath::ReadWrite,
        ReceivePath::Splice,
        ReceivePath::Mmap,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReceivePath::ReadWrite => "read + write",
            ReceivePath::Splice => "splice via pipe",
            ReceivePath::Mmap => "read into mmap",
        }
    }
}

/// CPU seconds the calling thread has used so far.
fn thread_cpu_seconds() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage for the call to fill.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Copies `source` into `dest` over one loopback TCP connection, receiving with
/// `path`. Returns the elapsed time and the receiving thread's CPU seconds.
pub fn copy_once(source: &Path, dest: &Path, path: ReceivePath) -> Result<(Duration, f64)> {
    let size = std::fs::metadata(source)?.len();
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let dest_path = dest.to_path_buf();
    let start = Instant::now();
    let receiver = std::thread::spawn(move || -> Result<(u64, f64)> {
        let (socket, _) = listener.accept()?;
        let cpu_before = thread_cpu_seconds();
        let out = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&dest_path)
            .with_context(|| format!("creating {}", dest_path.display()))?;
        let received = match path {
            ReceivePath::ReadWrite => receive_read_write(socket, out)?,
            ReceivePath::Splice => receive_splice(&socket, &out)?,
            ReceivePath::Mmap => receive_mmap(socket, &out, size)?,
        };
        Ok((received, thread_cpu_seconds() - cpu_before))
    });
    crate::send_file(source, addr)?;
    let (received, receiver_cpu) = receiver.join().expect("receiver thread")?;
    let elapsed = start.elapsed();
    ensure!(
        received == size,
        "{}: moved {received} of {size} bytes",
        path.name()
    );
    Ok((elapsed, receiver_cpu))
}

fn receive_read_write(mut socket: TcpStream, mut out: File) -> Result<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0;
    loop {
        let n = socket.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        out.write_all(&buf[..n])?;
        total += n as u64;
    }
}

fn receive_splice(socket: &TcpStream, out: &File) -> Result<u64> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 returns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe2: {}", std::io::Error::last_os_error());
    }
    let (pipe_read, pipe_write) = (fds[0], fds[1]);
    // A pipe as large as one socket read, so one splice in drains one out.
    unsafe { libc::fcntl(pipe_write, libc::F_SETPIPE_SZ, CHUNK as libc::c_int) };
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_MORE;
    let result = (|| {
        let mut total = 0u64;
        loop {
            // SAFETY: plain descriptors, null offsets (both ends are streams or
            // use the file position).
            let n = unsafe {
                libc::splice(
                    socket.as_raw_fd(),
                    std::ptr::null_mut(),
                    pipe_write,
                    std::ptr::null_mut(),
                    CHUNK,
                    flags,
                )
            };
            if n < 0 {
                bail!("splice socket -> pipe: {}", std::io::Error::last_os_error());
            }
            if n == 0 {
                return Ok(total);
            }
            let mut left = n as usize;
            while left > 0 {
                let m = unsafe {
                    libc::splice(
                        pipe_read,
                        std::ptr::null_mut(),
                        out.as_raw_fd(),
                        std::ptr::null_mut(),
                        left,
                        flags,
                    )
                };
                if m <= 0 {
                    bail!("splice pipe -> file: {}", std::io::Error::last_os_error());
                }
                left -= m as usize;
            }
            total += n as u64;
        }
    })();
    unsafe {
        libc::close(pipe_read);
        libc::close(pipe_write);
    }
    result
}

fn receive_mmap(mut socket: TcpStream, out: &File, size: u64) -> Result<u64> {
    out.set_len(size)?;
    if size == 0 {
        return Ok(0);
    }
    // SAFETY: a fresh shared mapping of a file we just sized and own.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            out.as_raw_fd(),
            0,
        )
    };
    if map == libc::MAP_FAILED {
        bail!("mmap: {}", std::io::Error::last_os_error());
    }
    // SAFETY: the mapping is `size` bytes, writable, and unmapped below.
    let bytes = unsafe { std::slice::from_raw_parts_mut(map as *mut u8, size as usize) };
    let mut total = 0usize;
    let result = loop {
        if total == bytes.len() {
            break Ok(total as u64);
        }
        let end = (total + CHUNK).min(bytes.len());
        match socket.read(&mut bytes[total..end]) {
            Ok(0) => break Ok(total as u64),
            Ok(n) => total += n,
            Err(e) => break Err(e.into()),
        }
    };
    unsafe { libc::munmap(map, size as usize) };
    result
}

/// The `receive-paths` benchmark: raw TCP and every receive path, interleaved.
pub fn receive_paths(size: u64, runs: usize, workdir: &Path) -> Result<()> {
    let source = workdir.join(format!("oxadb-bench-floor-src-{}", std::process::id()));
    let dest = workdir.join(format!("oxadb-bench-floor-dst-{}", std::process::id()));
    let result = (|| -> Result<()> {
        crate::write_random_file(&source, size)?;
        let mut raw = Vec::new();
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); ReceivePath::ALL.len()];
        let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); ReceivePath::ALL.len()];
        // Both ends are threads of this process: its CPU is theirs together.
        let mut both_ends: Vec<Vec<f64>> = vec![Vec::new(); ReceivePath::ALL.len() + 1];
        let process_cpu = || crate::cpu_seconds(std::process::id());
        let gib = size as f64 / (1u64 << 30) as f64;
        for run in 0..runs {
            let before = process_cpu()?;
            let rate = size as f64 / crate::raw_tcp(size)?.as_secs_f64() / 1e6;
            both_ends[0].push((process_cpu()? - before) / gib);
            eprintln!("run {} raw TCP: {rate:.0} MB/s", run + 1);
            raw.push(rate);
            for step in 0..ReceivePath::ALL.len() {
                let which = (run + step) % ReceivePath::ALL.len();
                let path = ReceivePath::ALL[which];
                let before = process_cpu()?;
                let (elapsed, receiver_cpu) = copy_once(&source, &dest, path)?;
                both_ends[which + 1].push((process_cpu()? - before) / gib);
                ensure!(
                    crate::same_contents(&source, &dest)?,
                    "{}: the copy differs from the source",
                    path.name()
                );
                std::fs::remove_file(&dest)?;
                let rate = size as f64 / elapsed.as_secs_f64() / 1e6;
                eprintln!("run {} {}: {rate:.0} MB/s", run + 1, path.name());
                rates[which].push(rate);
                cpu[which].push(receiver_cpu / gib);
            }
        }
        println!("Machine: {}", crate::machine_description());
        println!(
            "Transfer: {} MiB of random data per run into a tmpfs file, {runs} runs, interleaved",
            size >> 20
        );
        println!();
        println!("| receive path | runs (MB/s) | median MB/s | vs raw TCP | receiver CPU s/GiB | both ends CPU s/GiB |");
        println!("|---|---|---|---|---|---|");
        let raw_median = crate::median(&mut raw.clone());
        println!(
            "| raw TCP (no file) | {} | {raw_median:.0} | 1.00 | | {:.2} |",
            crate::list_runs(&raw),
            crate::median(&mut both_ends[0])
        );
        for (which, path) in ReceivePath::ALL.iter().enumerate() {
            let list = crate::list_runs(&rates[which]);
            let med = crate::median(&mut rates[which]);
            println!(
                "| {} | {list} | {med:.0} | {:.2} | {:.2} | {:.2} |",
                path.name(),
                med / raw_median,
                crate::median(&mut cpu[which]),
                crate::median(&mut both_ends[which + 1])
            );
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&source);
    let _ = std::fs::remove_file(&dest);
    result
}
