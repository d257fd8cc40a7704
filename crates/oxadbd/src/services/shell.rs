//! The `shell:` (v1 and shell protocol v2) and `exec:` services.
//!
//! One child process per ADB stream: `login_shell -c CMD`, or an interactive
//! login shell when the command is empty. Its stdio is a pty or pipes
//! (see [`ShellMode`]). Without the shell protocol the stream carries raw
//! bytes and stderr joins stdout; with v2 the stream carries frames
//! (stdout 1, stderr 2, exit 3 out; stdin 0, close-stdin 4, window size 5 in).

use std::ffi::{CStr, OsString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use oxadb_wire::shell::{
    encode_header, exit_frame, Frame, FrameDecoder, FrameId, ShellMode, ShellProtocol,
    ShellRequest, ShellWireError, WindowSize, HEADER_LEN,
};
use rustix::process::{Pid, Signal};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tracing::{debug, warn};

/// Read size for the child's output and the host's input.
const CHUNK: usize = 64 * 1024;
/// How much host input we read ahead while the child's stdin is full: enough
/// to notice the host closing the stream, bounded so a slow child throttles
/// the host instead of growing our buffers. Input read is no longer the
/// stream's, so the memory budget does not count it: with 256 KiB, 64 exec
/// streams into sleeping children held 22 MiB here.
const READ_AHEAD: usize = CHUNK;
/// `exec:` has no close-stdin, so a host that is done sending just closes the
/// stream (`adb exec-in`). We hand the child what already arrived plus EOF
/// and wait this long before hanging up.
const HANGUP_GRACE: Duration = Duration::from_millis(500);
/// How long a process group may ignore the hang-up (SIGHUP) that ends a
/// stream the host closed before it gets SIGKILL.
const KILL_AFTER_HANGUP: Duration = Duration::from_secs(3);
/// adbd's exit status when the service cannot start (its `ReportError`).
const START_FAILED_STATUS: u8 = 126;
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Daemon-wide settings for the shell service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellConfig {
    /// Shell run as `-c CMD`, or as an interactive login shell.
    pub login_shell: PathBuf,
}

impl Default for ShellConfig {
    fn default() -> Self {
        ShellConfig {
            login_shell: PathBuf::from("/bin/sh"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    /// The shell could not be executed (already reported to the host).
    #[error("exec '{}' failed: {}", .shell.display(), os_cause(.source))]
    Spawn { shell: PathBuf, source: io::Error },
    /// Creating the pty/pipes failed (already reported to the host).
    #[error("{what}: {}", os_cause(.source))]
    Setup {
        what: &'static str,
        source: io::Error,
    },
    /// The host sent an undecodable shell-protocol stream; the child was hung up.
    #[error("bad shell protocol data from host: {0}")]
    Protocol(#[from] ShellWireError),
}

/// Runs one `shell`/`exec` request over `stream` until the child is done (its
/// output drained, and for v2 its exit status sent) or the host closes the
/// stream (the child's process group then gets SIGHUP). Returns `Ok` in both
/// cases; errors have already been reported to the host where possible.
pub async fn serve<S>(
    stream: S,
    request: ShellRequest,
    config: &ShellConfig,
) -> Result<(), ShellError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let protocol = request.protocol;

    // getpwuid_r may consult NSS (files, LDAP...), so keep it off the reactor.
    let env = {
        let term = request.term.clone();
        let login_shell = config.login_shell.clone();
        tokio::task::spawn_blocking(move || child_env(term, &login_shell))
            .await
            .unwrap_or_default()
    };

    let Spawned {
        mut process,
        pid,
        stdin,
        stdout,
        stderr,
        pty,
    } = match spawn_child(&request, config, &env) {
        Ok(s) => s,
        Err(err) => {
            warn!(error = %err, command = %request.command, "shell: cannot start");
            report_start_error(&mut wr, protocol, &err).await;
            return Err(err);
        }
    };
    debug!(pid = pid.as_raw_nonzero().get(), ?request, "shell: started");

    let mut input = Input::new(protocol, request.mode, stdin, pty);
    let mut protocol_error = None;
    let ended = {
        let input_fut = input.run(&mut rd);
        let output_fut = pump_output(&mut wr, protocol, &stdout, stderr.as_deref());
        tokio::pin!(input_fut, output_fut);
        let drained = tokio::select! {
            r = &mut input_fut => {
                protocol_error = r.err();
                false
            }
            r = &mut output_fut => match r {
                Ok(()) => true,
                Err(e) => {
                    debug!(error = %e, "shell: writing to host failed");
                    false
                }
            },
        };
        if !drained {
            Ended::HostGone
        } else if protocol == ShellProtocol::V1 {
            // No exit status to send: the stream ends with the output, as adbd
            // closes its socket when the pty/pipe reports EOF.
            Ended::Drained(None)
        } else {
            // Keep feeding stdin (and watching for the host leaving) until exit.
            tokio::select! {
                r = &mut input_fut => {
                    protocol_error = r.err();
                    Ended::HostGone
                }
                status = process.wait() => Ended::Drained(Some(status)),
            }
        }
    };

    match ended {
        Ended::Drained(status) => {
            if let Some(status) = status {
                let code = match status {
                    Ok(s) => exit_status_byte(s),
                    Err(e) => {
                        warn!(error = %e, "shell: waiting for child failed");
                        1
                    }
                };
                debug!(pid = pid.as_raw_nonzero().get(), code, "shell: exited");
                if let Err(e) = write_flush(&mut wr, &exit_frame(code)).await {
                    debug!(error = %e, "shell: could not send exit status");
                }
            }
            let _ = wr.shutdown().await;
            drop((input, stdout, stderr));
            reap_in_background(process, pid);
        }
        Ended::HostGone => {
            debug!(
                pid = pid.as_raw_nonzero().get(),
                "shell: host closed the stream"
            );
            if request.close_ends_input {
                let finish = async {
                    input.finish_stdin().await;
                    process.wait().await
                };
                tokio::select! {
                    r = tokio::time::timeout(HANGUP_GRACE, finish) => {
                        debug!(exited_in_grace = r.is_ok(), "shell: v1 stdin finished");
                    }
                    () = discard_output(&stdout) => {}
                };
            }
            // adbd's answer to the host going away. The whole group, so that
            // `cmd &` and pipelines stop too, even if the shell itself is gone
            // (as a pty hangup would reach them).
            if let Err(e) = rustix::process::kill_process_group(pid, Signal::HUP) {
                debug!(error = %e, "shell: SIGHUP to process group failed");
            }
            // Close our ends so a child ignoring SIGHUP sees EOF/EPIPE rather
            // than blocking on a full pipe forever.
            drop((input, stdout, stderr));
            let _ = wr.shutdown().await;
            kill_after_hangup_grace(process, pid);
        }
    }
    match protocol_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

enum Ended {
    /// The child's output hit EOF; v2 also carries the wait result.
    Drained(Option<io::Result<ExitStatus>>),
    /// The host closed the stream (or broke the protocol) first.
    HostGone,
}

/// Exit status byte as adbd reports it: the code, or 128 + signal.
fn exit_status_byte(s: ExitStatus) -> u8 {
    match (s.code(), s.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        _ => 1,
    }
}

/// Awaits the child in a task so it never lingers as a zombie.
/// After the hang-up, what is still in the process group ignored it: it gets
/// SIGKILL once `KILL_AFTER_HANGUP` has passed, so nothing a host started
/// outlives its stream unless it left the group (`setsid`, as `nohup` users
/// do). The group's id cannot be taken by an unrelated process meanwhile:
/// Linux keeps a process group's id allocated while any member lives.
fn kill_after_hangup_grace(mut process: tokio::process::Child, pid: Pid) {
    tokio::spawn(async move {
        let hung_up = tokio::time::Instant::now();
        let exited = tokio::time::timeout(KILL_AFTER_HANGUP, process.wait()).await;
        // The whole grace period, even when the shell itself went at once:
        // what it started may still be finishing up after the SIGHUP.
        tokio::time::sleep_until(hung_up + KILL_AFTER_HANGUP).await;
        if rustix::process::test_kill_process_group(pid).is_ok() {
            debug!(
                pid = pid.as_raw_nonzero().get(),
                "shell: process group ignored the hang-up; SIGKILL"
            );
            if let Err(e) = rustix::process::kill_process_group(pid, Signal::KILL) {
                debug!(error = %e, "shell: SIGKILL to process group failed");
            }
        }
        let status = match exited {
            Ok(status) => status,
            Err(_) => process.wait().await,
        };
        match status {
            Ok(s) => debug!(pid = pid.as_raw_nonzero().get(), status = %s, "shell: reaped"),
            Err(e) => warn!(pid = pid.as_raw_nonzero().get(), error = %e, "shell: wait failed"),
        }
    });
}

fn reap_in_background(mut process: tokio::process::Child, pid: Pid) {
    tokio::spawn(async move {
        match process.wait().await {
            Ok(s) => debug!(pid = pid.as_raw_nonzero().get(), status = %s, "shell: reaped"),
            Err(e) => warn!(pid = pid.as_raw_nonzero().get(), error = %e, "shell: wait failed"),
        }
    });
}

/// Replies to a `shell`/`exec` request without a child: `stdout`, `stderr`
/// and the exit status, framed as the request's protocol wants (v1: one byte
/// stream, no status), newlines as a pty would have written them. Used for
/// commands oxadbd answers itself (`services::command`).
pub async fn answer<S>(stream: S, request: &ShellRequest, stdout: &str, stderr: &str, status: u8)
where
    S: AsyncWrite + Unpin,
{
    let mut wr = stream;
    let crlf = |text: &str| match request.mode {
        ShellMode::Pty => text.replace('\n', "\r\n"),
        ShellMode::Raw => text.to_string(),
    };
    let (stdout, stderr) = (crlf(stdout), crlf(stderr));
    let mut buf = Vec::with_capacity(stdout.len() + stderr.len() + 3 * HEADER_LEN + 1);
    for (id, text) in [(FrameId::Stdout, &stdout), (FrameId::Stderr, &stderr)] {
        if text.is_empty() {
            continue;
        }
        if request.protocol == ShellProtocol::V2 {
            if let Ok(header) = encode_header(id, text.len()) {
                buf.extend_from_slice(&header);
            }
        }
        buf.extend_from_slice(text.as_bytes());
    }
    if request.protocol == ShellProtocol::V2 {
        buf.extend_from_slice(&exit_frame(status));
    }
    if let Err(e) = write_flush(&mut wr, &buf).await {
        debug!(error = %e, "shell: could not send the answer");
    }
    let _ = wr.shutdown().await;
}

/// Like adbd's `ReportError`: "error: ...\n" as raw bytes (v1), or as a stderr
/// frame followed by exit status 126 (v2); then the stream is closed.
async fn report_start_error<W: AsyncWrite + Unpin>(
    wr: &mut W,
    protocol: ShellProtocol,
    err: &ShellError,
) {
    let msg = format!("error: {err}\n");
    let mut buf = Vec::with_capacity(msg.len() + 2 * HEADER_LEN + 1);
    if protocol == ShellProtocol::V2 {
        if let Ok(h) = encode_header(FrameId::Stderr, msg.len()) {
            buf.extend_from_slice(&h);
        }
    }
    buf.extend_from_slice(msg.as_bytes());
    if protocol == ShellProtocol::V2 {
        buf.extend_from_slice(&exit_frame(START_FAILED_STATUS));
    }
    let _ = write_flush(wr, &buf).await;
    let _ = wr.shutdown().await;
}

async fn write_flush<W: AsyncWrite + Unpin>(wr: &mut W, data: &[u8]) -> io::Result<()> {
    wr.write_all(data).await?;
    wr.flush().await
}

/// `strerror`-style text of an OS error, without std's "(os error N)" suffix.
fn os_cause(e: &io::Error) -> String {
    let s = e.to_string();
    match e.raw_os_error() {
        Some(code) => s
            .strip_suffix(&format!(" (os error {code})"))
            .map(str::to_owned)
            .unwrap_or(s),
        None => s,
    }
}

// ---------------------------------------------------------------------------
// Child output -> host.

type Fd = Arc<AsyncFd<OwnedFd>>;

/// Copies the child's output to the host until every output fd is at EOF.
/// Each chunk is read straight behind a reserved header so a v2 frame goes
/// out as one write; we only read again once the host took the last chunk,
/// so a slow host stalls the child instead of growing a buffer.
/// An error means writing to the host failed.
async fn pump_output<W: AsyncWrite + Unpin>(
    wr: &mut W,
    protocol: ShellProtocol,
    stdout: &AsyncFd<OwnedFd>,
    stderr: Option<&AsyncFd<OwnedFd>>,
) -> io::Result<()> {
    let mut out_buf = vec![0u8; HEADER_LEN + CHUNK];
    let mut err_buf = vec![0u8; HEADER_LEN + if stderr.is_some() { CHUNK } else { 0 }];
    let mut out_open = true;
    let mut err_open = stderr.is_some();
    while out_open || err_open {
        let (id, n) = tokio::select! {
            r = read_fd(stdout, &mut out_buf[HEADER_LEN..]), if out_open => {
                (FrameId::Stdout, eof_on_error(r, "stdout"))
            }
            r = read_fd_opt(stderr, &mut err_buf[HEADER_LEN..]), if err_open => {
                (FrameId::Stderr, eof_on_error(r, "stderr"))
            }
        };
        let (buf, open) = if id == FrameId::Stdout {
            (&mut out_buf, &mut out_open)
        } else {
            (&mut err_buf, &mut err_open)
        };
        if n == 0 {
            *open = false;
            continue;
        }
        match protocol {
            ShellProtocol::V1 => write_flush(wr, &buf[HEADER_LEN..HEADER_LEN + n]).await?,
            ShellProtocol::V2 => {
                let header = encode_header(id, n).map_err(io::Error::other)?;
                buf[..HEADER_LEN].copy_from_slice(&header);
                write_flush(wr, &buf[..HEADER_LEN + n]).await?;
            }
        }
    }
    Ok(())
}

/// Reads and drops the child's output until EOF, then never completes.
async fn discard_output(fd: &AsyncFd<OwnedFd>) {
    let mut buf = vec![0u8; CHUNK];
    while let Ok(n) = read_fd(fd, &mut buf).await {
        if n == 0 {
            break;
        }
    }
    std::future::pending::<()>().await
}

fn eof_on_error(r: io::Result<usize>, what: &str) -> usize {
    r.unwrap_or_else(|e| {
        warn!(error = %e, "shell: reading child {what} failed");
        0
    })
}

async fn read_fd(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    match fd
        .async_io(Interest::READABLE, |f| {
            rustix::io::read(f, &mut *buf).map_err(io::Error::from)
        })
        .await
    {
        // A pty master reads EIO once every slave fd is closed: that is EOF.
        Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(0),
        r => r,
    }
}

async fn read_fd_opt(fd: Option<&AsyncFd<OwnedFd>>, buf: &mut [u8]) -> io::Result<usize> {
    match fd {
        Some(fd) => read_fd(fd, buf).await,
        None => std::future::pending().await,
    }
}

async fn write_fd_opt(fd: Option<&AsyncFd<OwnedFd>>, data: &[u8]) -> io::Result<usize> {
    match fd {
        Some(fd) => {
            fd.async_io(Interest::WRITABLE, |f| {
                rustix::io::write(f, data).map_err(io::Error::from)
            })
            .await
        }
        None => std::future::pending().await,
    }
}

// ---------------------------------------------------------------------------
// Host -> child input.

struct Input {
    protocol: ShellProtocol,
    mode: ShellMode,
    /// Where stdin bytes go (pipe or pty master); `None` once closed.
    stdin: Option<Fd>,
    /// The pty master, for window-size changes.
    pty: Option<Fd>,
    /// v1: bytes read from the host, not yet handed on.
    raw: BytesMut,
    /// v2: frames read from the host, not yet decoded.
    decoder: FrameDecoder,
    /// Bytes for the child's stdin that are not written yet.
    pending: Bytes,
}

impl Input {
    fn new(protocol: ShellProtocol, mode: ShellMode, stdin: Option<Fd>, pty: Option<Fd>) -> Self {
        Input {
            protocol,
            mode,
            stdin,
            pty,
            raw: BytesMut::new(),
            decoder: FrameDecoder::new(),
            pending: Bytes::new(),
        }
    }

    /// Feeds the child from the host until the host closes the stream (`Ok`),
    /// or sends something undecodable (`Err`). Reading the host and writing
    /// the child's stdin run concurrently, so a child whose stdin is full does
    /// not stop us from noticing the host leaving; read-ahead is bounded.
    async fn run<R: AsyncRead + Unpin>(&mut self, rd: &mut R) -> Result<(), ShellError> {
        loop {
            self.refill_pending()?;
            let (inbuf, buffered) = match self.protocol {
                ShellProtocol::V1 => {
                    let n = self.raw.len();
                    (&mut self.raw, n)
                }
                ShellProtocol::V2 => {
                    let n = self.decoder.buffered();
                    (self.decoder.buffer_mut(), n)
                }
            };
            let want_read = self.pending.is_empty() || buffered < READ_AHEAD;
            let most = if self.pending.is_empty() {
                CHUNK
            } else {
                READ_AHEAD.saturating_sub(buffered)
            };
            tokio::select! {
                r = read_some(rd, inbuf, most), if want_read => match r {
                    Ok(0) => return Ok(()),
                    Ok(_) => {}
                    Err(e) => {
                        debug!(error = %e, "shell: reading from host failed");
                        return Ok(());
                    }
                },
                r = write_fd_opt(self.stdin.as_deref(), &self.pending), if !self.pending.is_empty() => {
                    self.wrote(r);
                }
            }
        }
    }

    /// Moves received input into `pending`, acting on control frames in order.
    fn refill_pending(&mut self) -> Result<(), ShellError> {
        while self.pending.is_empty() {
            match self.protocol {
                ShellProtocol::V1 => {
                    if self.raw.is_empty() {
                        break;
                    }
                    let data = self.raw.split().freeze();
                    if self.stdin.is_some() {
                        self.pending = data;
                    }
                }
                ShellProtocol::V2 => match self.decoder.next_frame()? {
                    Some(frame) => self.handle_frame(frame),
                    None => break,
                },
            }
        }
        Ok(())
    }

    fn handle_frame(&mut self, frame: Frame) {
        match frame.id {
            FrameId::Stdin => {
                if self.stdin.is_some() {
                    self.pending = frame.payload;
                }
            }
            FrameId::CloseStdin => match self.mode {
                ShellMode::Raw => {
                    debug!("shell: host closed stdin");
                    self.stdin = None;
                }
                // As adbd: a pty cannot close just its input direction, and
                // closing the master would lose the remaining output.
                ShellMode::Pty => debug!("shell: close-stdin ignored for a pty"),
            },
            FrameId::WindowSizeChange => {
                let Some(pty) = &self.pty else { return };
                match WindowSize::parse(&frame.payload) {
                    Ok(ws) => {
                        let winsize = rustix::termios::Winsize {
                            ws_row: ws.rows,
                            ws_col: ws.cols,
                            ws_xpixel: ws.x_pixels,
                            ws_ypixel: ws.y_pixels,
                        };
                        if let Err(e) = rustix::termios::tcsetwinsize(pty.get_ref(), winsize) {
                            debug!(error = %e, "shell: TIOCSWINSZ failed");
                        }
                    }
                    Err(e) => debug!(error = %e, "shell: ignoring window size"),
                }
            }
            other => debug!(id = other.as_u8(), "shell: ignoring frame"),
        }
    }

    fn wrote(&mut self, r: io::Result<usize>) {
        match r {
            Ok(n) => self.pending.advance(n),
            Err(e) => {
                // EPIPE (pipe) or EIO (pty): the child stopped reading for good;
                // keep consuming host input so we still see the stream close.
                debug!(error = %e, "shell: child stdin closed");
                self.stdin = None;
                self.pending.clear();
            }
        }
    }

    /// After the host left (v1 raw): write what was already received, then
    /// close stdin so the child sees EOF.
    async fn finish_stdin(&mut self) {
        loop {
            if self.refill_pending().is_err() || self.pending.is_empty() {
                break;
            }
            let r = write_fd_opt(self.stdin.as_deref(), &self.pending).await;
            self.wrote(r);
        }
        self.stdin = None;
    }
}

/// Reads at most `most` bytes into `buf`.
async fn read_some<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    most: usize,
) -> io::Result<usize> {
    buf.reserve(most);
    rd.read_buf(&mut bytes::BufMut::limit(buf, most)).await
}

// ---------------------------------------------------------------------------
// Starting the child.

struct Spawned {
    process: tokio::process::Child,
    pid: Pid,
    stdin: Option<Fd>,
    stdout: Fd,
    stderr: Option<Fd>,
    pty: Option<Fd>,
}

fn spawn_child(
    request: &ShellRequest,
    config: &ShellConfig,
    env: &ChildEnv,
) -> Result<Spawned, ShellError> {
    let shell = config.login_shell.as_path();
    let mut cmd = tokio::process::Command::new(shell);
    if request.command.is_empty() {
        // A leading '-' in argv[0] is what makes sh, dash and bash a login shell.
        cmd.arg0(login_arg0(shell));
    } else {
        cmd.arg("-c").arg(&request.command);
    }
    for (k, v) in &env.vars {
        cmd.env(k, v);
    }
    if let Some(home) = env.home.as_deref().filter(|h| h.is_dir()) {
        cmd.current_dir(home);
    }

    let setup = |what| move |source| ShellError::Setup { what, source };
    // The child's ends go into `cmd`; the parent keeps only its own ends, all
    // O_CLOEXEC so no other child inherits them.
    let (stdin, stdout, stderr, pty) = match request.mode {
        ShellMode::Pty => {
            let (master, slave) = open_pty().map_err(setup("failed to create pty"))?;
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(setup("failed to dup pty"));
            cmd.stdin(Stdio::from(dup(&slave)?));
            cmd.stdout(Stdio::from(dup(&slave)?));
            cmd.stderr(Stdio::from(slave));
            // SAFETY: the hook only makes async-signal-safe syscalls.
            unsafe { cmd.pre_exec(|| child_setup(true)) };
            let master = async_fd(master).map_err(setup("failed to register pty"))?;
            (Some(master.clone()), master.clone(), None, Some(master))
        }
        ShellMode::Raw => {
            let (in_r, in_w) = pipe().map_err(setup("failed to create stdin pipe"))?;
            let (out_r, out_w) = pipe().map_err(setup("failed to create stdout pipe"))?;
            let err_r = if request.protocol == ShellProtocol::V2 {
                let (err_r, err_w) = pipe().map_err(setup("failed to create stderr pipe"))?;
                cmd.stderr(Stdio::from(err_w));
                Some(err_r)
            } else {
                // Without the shell protocol there is one byte stream: stderr
                // joins stdout, as in adbd.
                let dup = out_w
                    .try_clone()
                    .map_err(setup("failed to dup stdout pipe"))?;
                cmd.stderr(Stdio::from(dup));
                None
            };
            cmd.stdin(Stdio::from(in_r));
            cmd.stdout(Stdio::from(out_w));
            // SAFETY: the hook only makes async-signal-safe syscalls.
            unsafe { cmd.pre_exec(|| child_setup(false)) };
            let reg = setup("failed to register pipe");
            let stdin = async_fd(in_w).map_err(reg)?;
            let stdout = async_fd(out_r).map_err(reg)?;
            let stderr = err_r.map(async_fd).transpose().map_err(reg)?;
            (Some(stdin), stdout, stderr, None)
        }
    };

    let process = cmd.spawn().map_err(|source| ShellError::Spawn {
        shell: shell.to_owned(),
        source,
    })?;
    // Dropping the command closes our copies of the child's ends, so EOF on
    // the output means the child side (and anything it forked) closed it.
    drop(cmd);
    let pid = process
        .id()
        .and_then(|id| Pid::from_raw(id as i32))
        .ok_or_else(|| ShellError::Spawn {
            shell: shell.to_owned(),
            source: io::Error::other("child has no pid"),
        })?;
    Ok(Spawned {
        process,
        pid,
        stdin,
        stdout,
        stderr,
        pty,
    })
}

/// Runs in the forked child before exec: only async-signal-safe calls.
fn child_setup(controlling_tty: bool) -> io::Result<()> {
    // Own session and process group, so SIGHUP can reach everything it starts.
    rustix::process::setsid()?;
    if controlling_tty {
        // stdin is the pty slave by now; make it the session's terminal.
        rustix::process::ioctl_tiocsctty(rustix::stdio::stdin())?;
    }
    // Our own fds are all O_CLOEXEC; this also covers any the daemon itself
    // inherited without it. Best effort: needs Linux 5.11.
    // SAFETY: marks fds close-on-exec, closes nothing now.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    // Ignored dispositions survive exec; the daemon may ignore SIGPIPE or
    // SIGHUP, the child must not.
    for sig in [
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGPIPE,
        libc::SIGTERM,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGCHLD,
    ] {
        // SAFETY: signal(2) is async-signal-safe; SIG_DFL installs no handler.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    Ok(())
}

fn login_arg0(shell: &Path) -> OsString {
    let mut arg0 = OsString::from("-");
    arg0.push(shell.file_name().unwrap_or("sh".as_ref()));
    arg0
}

fn open_pty() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::fs::{Mode, OFlags};
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    // NOCTTY here: the child takes it as controlling tty itself (TIOCSCTTY).
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok((master, slave))
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two new descriptors on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Makes our end non-blocking (never the child's) and registers it with tokio.
fn async_fd(fd: OwnedFd) -> io::Result<Fd> {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    fcntl_setfl(&fd, fcntl_getfl(&fd)? | OFlags::NONBLOCK)?;
    // SAFETY: an OwnedFd stays open and keeps returning the same fd until the
    // AsyncFd that owns it is dropped.
    let fd = unsafe { AsyncFd::register(fd) }?;
    Ok(Arc::new(fd))
}

// ---------------------------------------------------------------------------
// Environment.

#[derive(Debug, Default)]
struct ChildEnv {
    /// Overrides on top of the daemon's environment.
    vars: Vec<(OsString, OsString)>,
    home: Option<PathBuf>,
}

/// HOME/USER/LOGNAME/SHELL from the passwd entry and TERM from the request
/// (as adbd does), plus a PATH if the daemon has none.
fn child_env(term: Option<String>, login_shell: &Path) -> ChildEnv {
    let mut env = ChildEnv::default();
    let uid = rustix::process::getuid().as_raw();
    match passwd_entry(uid) {
        Some(pw) => {
            let shell = if pw.shell.is_empty() {
                login_shell.as_os_str().to_owned()
            } else {
                pw.shell
            };
            env.home = Some(PathBuf::from(&pw.dir));
            env.vars.push(("HOME".into(), pw.dir));
            env.vars.push(("USER".into(), pw.name.clone()));
            env.vars.push(("LOGNAME".into(), pw.name));
            env.vars.push(("SHELL".into(), shell));
        }
        None => {
            warn!(
                uid,
                "shell: no passwd entry; HOME/USER/SHELL left as inherited"
            );
            env.home = std::env::var_os("HOME").map(PathBuf::from);
        }
    }
    if std::env::var_os("PATH").is_none() {
        env.vars.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    if let Some(term) = term {
        env.vars.push(("TERM".into(), term.into()));
    }
    env
}

struct PasswdEntry {
    name: OsString,
    dir: OsString,
    shell: OsString,
}

fn passwd_entry(uid: libc::uid_t) -> Option<PasswdEntry> {
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: all-zero is a valid `passwd` (null pointers, zero ids).
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; strings land in `buf`.
        let rc = unsafe {
            libc::getpwuid_r(
                uid,
                &mut pwd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < (1 << 20) {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || result.is_null() {
            return None;
        }
        let field = |p: *const libc::c_char| {
            if p.is_null() {
                OsString::new()
            } else {
                // SAFETY: non-null fields point at NUL-terminated strings in `buf`.
                std::ffi::OsStr::from_bytes(unsafe { CStr::from_ptr(p) }.to_bytes()).to_owned()
            }
        };
        return Some(PasswdEntry {
            name: field(pwd.pw_name),
            dir: field(pwd.pw_dir),
            shell: field(pwd.pw_shell),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use oxadb_wire::shell::encode_frame;
    use tokio::io::DuplexStream;
    use tokio::task::JoinHandle;

    const T: Duration = Duration::from_secs(60);

    fn start_with(
        service: &str,
        config: ShellConfig,
    ) -> (DuplexStream, JoinHandle<Result<(), ShellError>>) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let req = ShellRequest::from_service(service.parse().unwrap()).unwrap();
        let h = tokio::spawn(async move { serve(server, req, &config).await });
        (client, h)
    }

    fn start(service: &str) -> (DuplexStream, JoinHandle<Result<(), ShellError>>) {
        start_with(service, ShellConfig::default())
    }

    #[derive(Debug, Default)]
    struct V2Output {
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        exit: Option<u8>,
    }

    /// Reads v2 frames until the stream closes; the exit frame must be last.
    async fn collect_v2<R: AsyncRead + Unpin>(rd: &mut R) -> V2Output {
        collect_v2_from(rd, FrameDecoder::new()).await
    }

    /// As `collect_v2`, continuing with bytes already in `dec`.
    async fn collect_v2_from<R: AsyncRead + Unpin>(rd: &mut R, mut dec: FrameDecoder) -> V2Output {
        let mut out = V2Output::default();
        loop {
            let n = tokio::time::timeout(T, rd.read_buf(dec.buffer_mut()))
                .await
                .unwrap()
                .unwrap();
            while let Some(f) = dec.next_frame().unwrap() {
                assert!(out.exit.is_none(), "frame after exit: {f:?}");
                match f.id {
                    FrameId::Stdout => out.stdout.extend_from_slice(&f.payload),
                    FrameId::Stderr => out.stderr.extend_from_slice(&f.payload),
                    FrameId::Exit => {
                        assert_eq!(f.payload.len(), 1);
                        out.exit = Some(f.payload[0]);
                    }
                    other => panic!("unexpected frame id {other:?}"),
                }
            }
            if n == 0 {
                assert_eq!(dec.buffered(), 0, "truncated frame");
                return out;
            }
        }
    }

    async fn read_to_end<R: AsyncRead + Unpin>(rd: &mut R) -> Vec<u8> {
        let mut v = Vec::new();
        tokio::time::timeout(T, rd.read_to_end(&mut v))
            .await
            .unwrap()
            .unwrap();
        v
    }

    fn frame(id: FrameId, payload: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        encode_frame(id, payload, &mut b).unwrap();
        b.to_vec()
    }

    async fn run_v2(service: &str) -> V2Output {
        let (mut c, h) = start(service);
        let out = collect_v2(&mut c).await;
        h.await.unwrap().unwrap();
        out
    }

    fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            v.extend_from_slice(&seed.to_le_bytes());
        }
        v.truncate(len);
        v
    }

    /// Dead = gone or a zombie (its parent, maybe not us, has not reaped it).
    fn process_dead(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z')),
        }
    }

    async fn wait_dead(pid: i32) {
        for _ in 0..200 {
            if process_dead(pid) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("process {pid} still alive");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn v2_raw_separates_stdout_stderr_and_exit_status() {
        let out = run_v2("shell,v2,raw:echo out; echo err >&2; exit 42").await;
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.exit, Some(42));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn v2_exit_codes() {
        assert_eq!(run_v2("shell,v2,raw:true").await.exit, Some(0));
        assert_eq!(run_v2("shell,v2,raw:false").await.exit, Some(1));
        // Killed by a signal: 128 + signo, as adbd.
        assert_eq!(run_v2("shell,v2,raw:kill -9 $$").await.exit, Some(128 + 9));
        // Default for a non-empty command is raw, so this works without ",raw".
        assert_eq!(run_v2("shell,v2:exit 7").await.exit, Some(7));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn v2_stdin_to_cat_with_close_stdin() {
        let (mut c, h) = start("shell,v2,raw:cat");
        let mut msg = frame(FrameId::Stdin, b"hello ");
        msg.extend(frame(FrameId::Stdin, b"world\n"));
        msg.extend(frame(FrameId::CloseStdin, b""));
        // Split mid-header to exercise the incremental decoder.
        for piece in msg.chunks(3) {
            c.write_all(piece).await.unwrap();
        }
        let out = collect_v2(&mut c).await;
        assert_eq!(out.stdout, b"hello world\n");
        assert_eq!(out.exit, Some(0));
        h.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn v2_large_stdin_through_cat() {
        let data = random_bytes(16 << 20, 0x9e37_79b9_7f4a_7c15);
        let (c, h) = start("shell,v2,raw:cat");
        let (mut rd, mut wr) = tokio::io::split(c);
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            // adb's client sends stdin in frames of up to ~1 MiB.
            for chunk in sent.chunks((1 << 20) - 5) {
                wr.write_all(&frame(FrameId::Stdin, chunk)).await.unwrap();
            }
            wr.write_all(&frame(FrameId::CloseStdin, b""))
                .await
                .unwrap();
            wr
        });
        let out = collect_v2(&mut rd).await;
        let _wr = writer.await.unwrap();
        assert_eq!(out.stdout.len(), data.len());
        assert!(out.stdout == data, "data corrupted");
        assert_eq!(out.exit, Some(0));
        h.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn exec_cat_is_binary_safe_16mib() {
        let data = random_bytes(16 << 20, 42);
        let (c, h) = start("exec:cat");
        let (mut rd, mut wr) = tokio::io::split(c);
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            wr.write_all(&sent).await.unwrap();
            wr
        });
        let mut got = vec![0u8; data.len()];
        tokio::time::timeout(T, rd.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert!(got == data, "data corrupted");
        // v1 has no close-stdin: the host closes the stream, cat gets EOF.
        let wr = writer.await.unwrap();
        drop(rd.unsplit(wr));
        h.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn v1_shell_joins_stderr_and_closes_at_exit() {
        let (mut c, h) = start("shell:echo a; echo b >&2; exit 3");
        assert_eq!(read_to_end(&mut c).await, b"a\nb\n");
        h.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn v2_pty_tty_is_pts() {
        let out = run_v2("shell,v2,pty:tty").await;
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(s.starts_with("/dev/pts/"), "{s:?}");
        // The pty's output processing turns \n into \r\n.
        assert!(s.ends_with("\r\n"), "{s:?}");
        assert!(out.stderr.is_empty());
        assert_eq!(out.exit, Some(0));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn v2_pty_window_size_change() {
        let (mut c, h) = start("shell,v2,pty:read x; stty size");
        // As adb's client sends it: ASCII with a trailing NUL. Frames are
        // handled in order, so the size is set before the shell reads "go".
        let mut msg = frame(FrameId::WindowSizeChange, b"40x120,0x0\0");
        msg.extend(frame(FrameId::Stdin, b"go\n"));
        c.write_all(&msg).await.unwrap();
        let out = collect_v2(&mut c).await;
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(s.contains("40 120\r\n"), "{s:?}");
        assert_eq!(out.exit, Some(0));
        h.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn v2_pty_output_is_complete_at_exit() {
        // Output still queued in the pty when the child exits must not be lost
        // to the master's EIO.
        let out = run_v2("shell,v2,pty:seq 1 200000").await;
        let s = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = s.split("\r\n").collect();
        assert_eq!(lines.len(), 200001, "{}", &s[s.len().saturating_sub(100)..]);
        assert_eq!(lines[199999], "200000");
        assert_eq!(out.exit, Some(0));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn v2_pty_stderr_goes_to_the_pty() {
        let out = run_v2("shell,v2,pty:echo err >&2").await;
        assert_eq!(out.stdout, b"err\r\n");
        assert!(out.stderr.is_empty());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn v2_pty_interactive_login_shell() {
        for shell in ["/bin/sh", "/bin/dash", "/bin/bash"] {
            if !Path::new(shell).exists() {
                continue;
            }
            let config = ShellConfig {
                login_shell: shell.into(),
            };
            let (mut c, h) = start_with("shell,v2,TERM=xterm,pty:", config);
            // Type only once the shell has printed its prompt, as a person
            // would: a shell setting up its terminal may flush input typed
            // before (seen under load: the commands echoed, never run).
            let mut dec = FrameDecoder::new();
            let mut prompt = Vec::new();
            while prompt.is_empty() {
                let n = tokio::time::timeout(T, c.read_buf(dec.buffer_mut()))
                    .await
                    .unwrap()
                    .unwrap();
                assert!(n > 0, "{shell}: EOF before a prompt");
                while let Some(f) = dec.next_frame().unwrap() {
                    assert_eq!(f.id, FrameId::Stdout, "{shell}: {f:?} before a prompt");
                    prompt.extend_from_slice(&f.payload);
                }
            }
            c.write_all(&frame(FrameId::Stdin, b"echo hi-$((6*7)) $0\nexit 3\n"))
                .await
                .unwrap();
            let out = collect_v2_from(&mut c, dec).await;
            let s = String::from_utf8_lossy(&out.stdout);
            // $0 is "-NAME": run as a login shell.
            let name = Path::new(shell).file_name().unwrap().to_str().unwrap();
            assert!(s.contains(&format!("hi-42 -{name}")), "{shell}: {s:?}");
            assert_eq!(out.exit, Some(3), "{shell}");
            h.await.unwrap().unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn term_from_request_else_dumb() {
        let out = run_v2("shell,v2,TERM=xterm-256color,raw:echo $TERM").await;
        assert_eq!(out.stdout, b"xterm-256color\n");
        let out = run_v2("shell,v2,raw:echo $TERM").await;
        assert_eq!(out.stdout, b"dumb\n");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn environment_and_session() {
        let pw = passwd_entry(rustix::process::getuid().as_raw()).expect("test user in passwd");
        let out = run_v2(
            r#"shell,v2,raw:echo "$HOME|$USER|$LOGNAME"; [ -n "$PATH" ] && echo path; ps -o sid= -p $$; echo $$"#,
        )
        .await;
        let s = String::from_utf8(out.stdout).unwrap();
        let mut lines = s.lines();
        let name = pw.name.to_str().unwrap();
        assert_eq!(
            lines.next().unwrap(),
            format!("{}|{name}|{name}", pw.dir.to_str().unwrap())
        );
        assert_eq!(lines.next(), Some("path"));
        // setsid: the shell leads its own session (skip if ps is missing).
        if let (Some(sid), Some(pid)) = (lines.next(), lines.next()) {
            assert_eq!(sid.trim(), pid.trim());
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn no_leaked_fds() {
        // ls opens the directory itself as fd 3; anything else leaked to it.
        for service in [
            "shell,v2,raw:exec ls /proc/self/fd",
            "shell,v2,pty:exec ls /proc/self/fd",
        ] {
            let out = run_v2(service).await;
            let s = String::from_utf8(out.stdout).unwrap();
            let fds: Vec<&str> = s.split_whitespace().collect();
            assert_eq!(fds, ["0", "1", "2", "3"], "{service}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn closing_stream_early_kills_the_process_group() {
        for service in [
            "shell,v2,raw:echo $$; exec sleep 100",
            // A background job: same process group, not the shell itself.
            "shell,v2,raw:sleep 100 & echo $!; wait",
            "shell,v2,pty:echo $$; exec sleep 100",
            // v1: SIGHUP at once; exec: EOF first, then SIGHUP after the grace period.
            "shell:echo $$; exec sleep 100",
            "exec:sleep 100 & echo $!; wait",
            // The shell is gone, its background job still holds the output.
            "exec:sleep 100 & echo $!",
            "shell,v2,raw:sleep 100 & echo $!",
        ] {
            let (mut c, h) = start(service);
            let mut got = Vec::new();
            let pid = loop {
                let mut buf = [0u8; 256];
                let n = tokio::time::timeout(T, c.read(&mut buf))
                    .await
                    .unwrap()
                    .unwrap();
                assert_ne!(n, 0, "{service}: closed early");
                got.extend_from_slice(&buf[..n]);
                // v2 frames have a 5-byte header; take the digits after it.
                let text: String = got
                    .iter()
                    .skip(if service.contains("v2") {
                        HEADER_LEN
                    } else {
                        0
                    })
                    .map(|&b| b as char)
                    .collect();
                if let Some(line) = text
                    .split(['\n', '\r'])
                    .next()
                    .filter(|_| text.contains('\n'))
                {
                    break line.trim().parse::<i32>().unwrap();
                }
            };
            assert!(!process_dead(pid));
            drop(c);
            tokio::time::timeout(T, h).await.unwrap().unwrap().unwrap();
            wait_dead(pid).await;
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn v1_shell_hang_up_reaches_a_shell_waiting_on_stdin() {
        // adb's v1 client never closes the stream to end stdin, so a close is
        // a hang-up: the trap must run while `read` still waits.
        let dir = tempfile::tempdir().unwrap();
        let hup = dir.path().join("hup");
        let (mut c, h) = start(&format!(
            "shell:trap 'echo HUP > {}' HUP; echo ready; read x",
            hup.display()
        ));
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(T, c.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"ready\n");
        drop(c);
        tokio::time::timeout(T, h).await.unwrap().unwrap().unwrap();
        for _ in 0..100 {
            if std::fs::read_to_string(&hup).is_ok_and(|s| s == "HUP\n") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the v1 shell's HUP trap did not run");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn exec_in_delivers_data_then_eof() {
        // `adb exec-in CMD < file` writes everything and then closes the stream.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let data = random_bytes(1 << 20, 7);
        let (mut c, h) = start(&format!("exec:cat > '{}'", path.display()));
        c.write_all(&data).await.unwrap();
        drop(c);
        h.await.unwrap().unwrap();
        for _ in 0..100 {
            if std::fs::read(&path).map(|d| d == data).unwrap_or(false) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("exec-in data not delivered");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn slow_host_throttles_child_output() {
        let (mut c, h) = start("shell,v2,raw:echo $$ >&2; exec head -c 67108864 /dev/zero");
        // Learn the pid, then stop reading for a while.
        let mut dec = FrameDecoder::new();
        let mut stdout_len = 0usize;
        let mut pid = None;
        while pid.is_none() {
            c.read_buf(dec.buffer_mut()).await.unwrap();
            while let Some(f) = dec.next_frame().unwrap() {
                match f.id {
                    FrameId::Stdout => stdout_len += f.payload.len(),
                    FrameId::Stderr => {
                        let text = std::str::from_utf8(&f.payload).unwrap();
                        pid = Some(text.trim().parse::<i32>().unwrap());
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        let pid = pid.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(io) = std::fs::read_to_string(format!("/proc/{pid}/io")) {
            let wchar: u64 = io
                .lines()
                .find_map(|l| l.strip_prefix("wchar: "))
                .unwrap()
                .parse()
                .unwrap();
            // duplex (64 KiB) + our chunk + pipe buffer + decoder: well under 1 MiB.
            assert!(
                wchar < 1 << 20,
                "child wrote {wchar} bytes to a stalled host"
            );
        }
        let rest = collect_v2_from(&mut c, dec).await;
        assert_eq!(stdout_len + rest.stdout.len(), 64 << 20);
        assert!(rest.stdout.iter().all(|&b| b == 0));
        assert_eq!(rest.exit, Some(0));
        h.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn start_failure_is_reported() {
        let config = ShellConfig {
            login_shell: PathBuf::from("/nonexistent/sh"),
        };
        let (mut c, h) = start_with("shell,v2,raw:true", config.clone());
        let out = collect_v2(&mut c).await;
        let s = String::from_utf8(out.stderr).unwrap();
        assert_eq!(
            s,
            "error: exec '/nonexistent/sh' failed: No such file or directory\n"
        );
        assert_eq!(out.exit, Some(START_FAILED_STATUS));
        assert!(matches!(h.await.unwrap(), Err(ShellError::Spawn { .. })));

        let (mut c, h) = start_with("exec:true", config);
        let s = String::from_utf8(read_to_end(&mut c).await).unwrap();
        assert!(
            s.starts_with("error: exec '/nonexistent/sh' failed: "),
            "{s:?}"
        );
        assert!(h.await.unwrap().is_err());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn absurd_frame_length_hangs_up() {
        let (mut c, h) = start("shell,v2,raw:echo $$; exec sleep 100");
        let mut dec = FrameDecoder::new();
        let pid = loop {
            c.read_buf(dec.buffer_mut()).await.unwrap();
            if let Some(f) = dec.next_frame().unwrap() {
                break std::str::from_utf8(&f.payload)
                    .unwrap()
                    .trim()
                    .parse::<i32>()
                    .unwrap();
            }
        };
        c.write_all(&[0, 0xff, 0xff, 0xff, 0x7f]).await.unwrap();
        let r = tokio::time::timeout(T, h).await.unwrap().unwrap();
        assert!(matches!(r, Err(ShellError::Protocol(_))), "{r:?}");
        wait_dead(pid).await;
    }
}
