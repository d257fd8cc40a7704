//! The daemon's `sync:` service as a machine: the host's requests in, the
//! replies out, and an [`Action`] for each request that needs the file
//! system, whose result the adapter feeds back.
//!
//! One stream carries a sequence of requests (`STAT`, `LST2`, `STA2`, `LIST`,
//! `LIS2`, `SEND`, `SND2`, `RECV`, `RCV2`, `QUIT`), each an 8-byte header and
//! a path of at most 1024 bytes; `SND2` and `RCV2` are followed by a setup
//! frame, a push by its `DATA` frames and `DONE`. Requests are answered one
//! at a time and in order, as adbd's `daemon/file_sync_service.cpp` does.
//! After a failed push or pull the service sends `FAIL` and ends, as adbd
//! does; for a push it first reads the remaining `DATA` up to `DONE`, so a
//! host that is still writing sees the reason instead of a broken pipe.
//!
//! A new request goes in [`Service::next_request`] (its parsing and the
//! [`Action`] it becomes), with a result method if it needs one.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use bytes::Bytes;
use oxadb_wire::sync::{self as wire, Compression, TransferFlags, HEADER_LEN};
use oxadb_wire::Payload;
use tracing::{debug, warn};

use super::metadata::{write_listing, write_stat_reply, ListEntry, StatKind};
use super::{Outbox, Transmit};
use crate::Inbox;

/// Payloads handed to the file thread at once at most (a 1 MiB WRTE's
/// worth). Handing over each 64 KiB payload alone woke the thread for every
/// one: 11.5k context switches in oxadbd per GiB pushed into a device node,
/// 4.5k with 16 at once, and 0.30 -> 0.25 CPU s/GiB.
const PIECES_PER_HANDOFF: usize = 16;

/// What the adapter is asked to do; the machine waits for the result where
/// one is named.
#[derive(Debug)]
pub enum Action {
    /// Stat `path` as `kind` says; answer with [`Service::stat_done`].
    Stat { kind: StatKind, path: PathBuf },
    /// Read the directory `path`; answer with [`Service::list_done`].
    List { path: PathBuf },
    /// A push begins: start writing it (or refuse it with
    /// [`Service::push_finished`]). Its data follows as `PushData`, then
    /// `PushDone` or `PushStop`.
    Push(PushRequest),
    /// The push's next payloads, in order, as slices of the received chunks.
    PushData(Vec<Bytes>),
    /// `DONE` arrived (with the mtime): finish the file and answer with
    /// [`Service::push_finished`].
    PushDone { mtime: u32 },
    /// The push ends without `DONE` (a protocol error, or the host went
    /// away): discard what was written, and say so with
    /// [`Service::push_finished`] (any result) once it is gone.
    PushStop,
    /// Send the file `path`: [`Service::pull_data`] for each batch of `DATA`
    /// frames, then [`Service::pull_finished`] (or [`Service::pull_refused`]
    /// before any data).
    Pull {
        path: PathBuf,
        compression: Compression,
    },
}

/// A push as the host asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushRequest {
    pub path: PathBuf,
    /// Full `st_mode` from the host; `S_IFLNK` asks for a symlink, anything
    /// else a file.
    pub mode: u32,
    pub compression: Compression,
    /// `SND2`'s dry run: decode the data, touch nothing.
    pub dry_run: bool,
}

/// How a transfer's file work ended badly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Send this message (naming the path and the cause) to the host as `FAIL`.
    Report(String),
    /// The file work stopped because the stream side stopped feeding it.
    HostGone,
}

/// Why the service stopped abnormally. Failures of file operations are not
/// errors here: they are reported to the host with `FAIL`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    #[error("host closed the sync stream in the middle of {0}")]
    Truncated(&'static str),
    #[error("sync protocol violation: {0}")]
    Protocol(String),
}

/// How a push that is ending goes on once its file work is over.
#[derive(Debug)]
enum AfterPush {
    /// `DONE` arrived: `OKAY`, or the file work's `FAIL`.
    Answer,
    /// The host broke the framing: `FAIL` with this, then stop.
    Violation(String),
    /// The stream ended in the middle of the push.
    Truncated,
}

#[derive(Debug)]
enum State {
    /// Between requests.
    Header,
    /// A request's path.
    Path {
        id: u32,
        len: usize,
    },
    /// The setup frame after an `SND2` or `RCV2` request.
    Setup {
        id: u32,
        path: PathBuf,
    },
    /// A stat or listing was handed out.
    Stat {
        kind: StatKind,
        path: PathBuf,
    },
    List {
        v2: bool,
        path: PathBuf,
    },
    /// A pull was handed out; its frames go through [`Service::pull_data`].
    Pull,
    /// A push's `DATA` frames, gathered into `PushData`.
    Push {
        path: PathBuf,
        gathered: Vec<Bytes>,
    },
    /// The push's file work is finishing.
    PushEnding {
        path: PathBuf,
        after: AfterPush,
    },
    /// After a failed push: `DATA` read and dropped up to `DONE`.
    Drain,
    Ended,
}

/// One `sync:` stream on the daemon, from the first request to `QUIT`, the
/// end of the stream, or a failed transfer.
#[derive(Debug)]
pub struct Service {
    inbox: Inbox,
    outbox: Outbox,
    state: State,
    /// The host closed the stream: what is buffered is all there is.
    eof: bool,
    end: Option<Result<(), ServiceError>>,
}

impl Default for Service {
    fn default() -> Self {
        Service::new()
    }
}

impl Service {
    pub fn new() -> Service {
        Service {
            inbox: Inbox::new(),
            outbox: Outbox::default(),
            state: State::Header,
            eof: false,
            end: None,
        }
    }

    /// A chunk the stream delivered, kept as it is.
    pub fn handle_input(&mut self, chunk: Bytes) {
        self.inbox.push(chunk);
    }

    /// The host closed the stream.
    pub fn handle_eof(&mut self) {
        self.eof = true;
    }

    /// Whether the machine waits for more of the stream (and not for the
    /// result of an action): only then does the adapter read.
    pub fn wants_input(&self) -> bool {
        !self.eof
            && matches!(
                self.state,
                State::Header
                    | State::Path { .. }
                    | State::Setup { .. }
                    | State::Push { .. }
                    | State::Drain
            )
    }

    /// How the service ended, once it did (and everything it had to send
    /// was taken with [`Service::poll_transmit`]).
    pub fn finished(&self) -> Option<Result<(), ServiceError>> {
        if self.outbox.is_empty() {
            self.end.clone()
        } else {
            None
        }
    }

    /// The next bytes to write.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.poll()
    }

    /// Parses what arrived up to the next action; `None` when the machine
    /// waits for input, for a result, or has ended.
    pub fn poll_action(&mut self) -> Option<Action> {
        loop {
            let state = std::mem::replace(&mut self.state, State::Ended);
            match self.step(state) {
                Step::Action(action) => return Some(action),
                Step::Continue => {}
                Step::Wait => return None,
            }
        }
    }

    fn step(&mut self, state: State) -> Step {
        match state {
            State::Header => self.next_header(),
            State::Path { id, len } => self.next_request(id, len),
            State::Setup { id, path } => self.setup(id, path),
            State::Push { path, gathered } => self.push_frames(path, gathered),
            State::Drain => self.drain(),
            waiting => {
                self.state = waiting;
                Step::Wait
            }
        }
    }

    /// Parks in `state` until more input comes, or ends as the end of the
    /// stream there says.
    fn wait_for_input(&mut self, state: State, at_eof: Result<(), ServiceError>) -> Step {
        if self.eof {
            self.finish(at_eof)
        } else {
            self.state = state;
            Step::Wait
        }
    }

    fn next_header(&mut self) -> Step {
        if self.inbox.is_empty() {
            // Closing the stream between requests is a clean end.
            return self.wait_for_input(State::Header, Ok(()));
        }
        let Some(header) = self.inbox.take_header() else {
            return self.wait_for_input(
                State::Header,
                Err(ServiceError::Truncated("a request header")),
            );
        };
        match header.request_path_len() {
            Ok(len) => {
                self.state = State::Path { id: header.id, len };
                Step::Continue
            }
            Err(e) => self.violation(e.to_string()),
        }
    }

    /// A request whose path is buffered: what it asks for.
    fn next_request(&mut self, id: u32, len: usize) -> Step {
        if self.inbox.len() < len {
            return self.wait_for_input(
                State::Path { id, len },
                Err(ServiceError::Truncated("a request path")),
            );
        }
        let raw = self.inbox.take_vec(len);
        let path = path_from_request(&raw);
        debug!(request = %wire::id_name(id), path = %path.display(), "sync request");
        if let Some(kind) = StatKind::of(id) {
            self.state = State::Stat {
                kind,
                path: path.clone(),
            };
            return Step::Action(Action::Stat { kind, path });
        }
        match id {
            wire::ID_LIST_V1 | wire::ID_LIST_V2 => {
                let v2 = id == wire::ID_LIST_V2;
                self.state = State::List {
                    v2,
                    path: path.clone(),
                };
                Step::Action(Action::List { path })
            }
            wire::ID_SEND_V1 => {
                // The request path is "<path>,<mode>"; its data is never compressed.
                let spec = up_to_nul(&raw);
                match wire::parse_send_v1_spec(spec) {
                    Ok((path, mode)) => self.start_push(PushRequest {
                        path: PathBuf::from(OsStr::from_bytes(path)),
                        mode,
                        compression: Compression::None,
                        dry_run: false,
                    }),
                    Err(e) => {
                        self.fail(&format!("{e}: '{}'", String::from_utf8_lossy(spec)));
                        self.state = State::Drain;
                        Step::Continue
                    }
                }
            }
            wire::ID_SEND_V2 | wire::ID_RECV_V2 => {
                self.state = State::Setup { id, path };
                Step::Continue
            }
            wire::ID_RECV_V1 => self.start_pull(path, Compression::None),
            wire::ID_QUIT => self.finish(Ok(())),
            other => self.violation(format!(
                "unknown command {other:08x} ({})",
                wire::id_name(other)
            )),
        }
    }

    /// The `(id, mode, flags)` frame after `SND2`, the `(id, flags)` frame
    /// after `RCV2`.
    fn setup(&mut self, id: u32, path: PathBuf) -> Step {
        let (len, during) = if id == wire::ID_SEND_V2 {
            (wire::SEND_V2_SETUP_LEN, "an SND2 setup frame")
        } else {
            (wire::RECV_V2_SETUP_LEN, "an RCV2 setup frame")
        };
        if self.inbox.len() < len {
            return self.wait_for_input(
                State::Setup { id, path },
                Err(ServiceError::Truncated(during)),
            );
        }
        let bytes = self.inbox.take_vec(len);
        if id == wire::ID_SEND_V2 {
            let setup = wire::SendV2Setup::parse(&bytes).expect("a whole setup frame");
            debug!(
                mode = format_args!("{:#o}", setup.mode),
                flags = format_args!("{:#x}", setup.flags),
                "SND2 setup"
            );
            if setup.id != wire::ID_SEND_V2 {
                // adbd ignores this id; note it in case a client is out of step.
                debug!("sync: SND2 setup frame has id {}", wire::id_name(setup.id));
            }
            match TransferFlags::from_send_flags(setup.flags) {
                Ok(flags) => self.start_push(PushRequest {
                    path,
                    mode: setup.mode,
                    compression: flags.compression,
                    dry_run: flags.dry_run,
                }),
                Err(e) => {
                    // adbd closes the service here without reading the data.
                    self.fail(&format!("couldn't push '{}': {e}", path.display()));
                    self.finish(Ok(()))
                }
            }
        } else {
            let setup = wire::RecvV2Setup::parse(&bytes).expect("a whole setup frame");
            debug!(flags = format_args!("{:#x}", setup.flags), "RCV2 setup");
            if setup.id != wire::ID_RECV_V2 {
                debug!("sync: RCV2 setup frame has id {}", wire::id_name(setup.id));
            }
            match TransferFlags::from_recv_flags(setup.flags) {
                Ok(flags) => self.start_pull(path, flags.compression),
                Err(e) => {
                    self.fail(&format!("couldn't pull '{}': {e}", path.display()));
                    self.finish(Ok(()))
                }
            }
        }
    }

    fn start_push(&mut self, request: PushRequest) -> Step {
        self.state = State::Push {
            path: request.path.clone(),
            gathered: Vec::new(),
        };
        Step::Action(Action::Push(request))
    }

    fn start_pull(&mut self, path: PathBuf, compression: Compression) -> Step {
        self.state = State::Pull;
        Step::Action(Action::Pull { path, compression })
    }

    /// A push's `DATA` frames up to `DONE`. Whole frames only: a payload
    /// leaves as slices of the chunks it came in (one that straddles two
    /// WRTEs as two pieces rather than copied together), handed over
    /// PIECES_PER_HANDOFF at a time or before waiting for more.
    fn push_frames(&mut self, path: PathBuf, mut gathered: Vec<Bytes>) -> Step {
        loop {
            let frame = self.inbox.peek_header();
            let complete = match frame {
                Some(header) if header.id == wire::ID_DATA => match header.data_len() {
                    Ok(len) => self.inbox.len() >= HEADER_LEN + len,
                    Err(e) => {
                        let message = format!("protocol error pushing '{}': {e}", path.display());
                        return self.stop_push(path, AfterPush::Violation(message));
                    }
                },
                Some(_) => true,
                None => false,
            };
            if !complete {
                if !gathered.is_empty() {
                    self.state = State::Push {
                        path,
                        gathered: Vec::new(),
                    };
                    return Step::Action(Action::PushData(gathered));
                }
                if self.eof {
                    return self.stop_push(path, AfterPush::Truncated);
                }
                self.state = State::Push { path, gathered };
                return Step::Wait;
            }
            let header = frame.expect("a complete frame has a header");
            match header.id {
                wire::ID_DATA => {
                    self.inbox.consume(HEADER_LEN);
                    let mut left = header.len as usize;
                    while left > 0 {
                        let piece = self.inbox.take_piece(left);
                        left -= piece.len();
                        gathered.push(piece);
                    }
                    if gathered.len() >= PIECES_PER_HANDOFF {
                        self.state = State::Push {
                            path,
                            gathered: Vec::new(),
                        };
                        return Step::Action(Action::PushData(gathered));
                    }
                }
                wire::ID_DONE if !gathered.is_empty() => {
                    // What came before DONE goes first.
                    self.state = State::Push {
                        path,
                        gathered: Vec::new(),
                    };
                    return Step::Action(Action::PushData(gathered));
                }
                wire::ID_DONE => {
                    self.inbox.consume(HEADER_LEN);
                    self.state = State::PushEnding {
                        path,
                        after: AfterPush::Answer,
                    };
                    return Step::Action(Action::PushDone { mtime: header.len });
                }
                other => {
                    let message = format!(
                        "protocol error pushing '{}': expected DATA or DONE, got {}",
                        path.display(),
                        wire::id_name(other)
                    );
                    return self.stop_push(path, AfterPush::Violation(message));
                }
            }
        }
    }

    /// The push ends without `DONE`: its file work is stopped first, so
    /// nothing is left behind by the time the host hears of it.
    fn stop_push(&mut self, path: PathBuf, after: AfterPush) -> Step {
        self.state = State::PushEnding { path, after };
        Step::Action(Action::PushStop)
    }

    /// After a failed push adbd keeps reading `DATA` until `DONE`, so a
    /// client that is still writing is not cut off before it reads the
    /// `FAIL` (adb 29 polls for it between chunks, stops, and sends `DONE`).
    /// Anything else, or the end of the stream, ends the service.
    fn drain(&mut self) -> Step {
        loop {
            let Some(header) = self.inbox.peek_header() else {
                return self.wait_for_input(State::Drain, Ok(()));
            };
            let len = match header.data_len() {
                Ok(len) if header.id == wire::ID_DATA => len,
                _ => return self.finish(Ok(())),
            };
            if self.inbox.len() < HEADER_LEN + len {
                return self.wait_for_input(State::Drain, Ok(()));
            }
            self.inbox.consume(HEADER_LEN + len);
        }
    }

    // ----- results -----

    /// The result of [`Action::Stat`].
    pub fn stat_done(&mut self, result: Result<wire::StatV2, io::Error>) {
        match std::mem::replace(&mut self.state, State::Header) {
            State::Stat { kind, path } => write_stat_reply(&mut self.outbox, kind, &path, result),
            other => self.misuse("stat_done", other),
        }
    }

    /// The result of [`Action::List`]: the entries read, or why the
    /// directory could not be read (an empty listing).
    pub fn list_done(&mut self, entries: Result<Vec<ListEntry>, io::Error>) {
        match std::mem::replace(&mut self.state, State::Header) {
            State::List { v2, path } => write_listing(&mut self.outbox, v2, &path, entries),
            other => self.misuse("list_done", other),
        }
    }

    /// How a push's file work ended: after [`Action::PushDone`] `OKAY` or
    /// `FAIL`; before it (refused, or failed while the data was coming) a
    /// `FAIL` and the rest of the data read up to `DONE`; after
    /// [`Action::PushStop`] the reason it stopped.
    pub fn push_finished(&mut self, result: Result<(), Failure>) {
        match std::mem::replace(&mut self.state, State::Ended) {
            State::Push { path, .. } => {
                // The file work cannot succeed without DONE.
                let failure = result.err().unwrap_or(Failure::HostGone);
                self.fail(&push_failure_message(&path, failure));
                self.state = State::Drain;
            }
            State::PushEnding { path, after } => match (after, result) {
                (AfterPush::Answer, Ok(())) => {
                    self.outbox.bytes(&wire::encode_okay());
                    self.state = State::Header;
                }
                (AfterPush::Answer, Err(failure)) => {
                    self.fail(&push_failure_message(&path, failure));
                    self.finish(Ok(()));
                }
                (AfterPush::Violation(message), _) => {
                    self.violation(message);
                }
                (AfterPush::Truncated, _) => {
                    self.finish(Err(ServiceError::Truncated("a push")));
                }
            },
            other => self.misuse("push_finished", other),
        }
    }

    /// Refuses an [`Action::Pull`] a host may expect to be refused (a
    /// `RECV` sent ahead of its `STAT` reply, for a directory): `FAIL`,
    /// logged at debug, and the service ends.
    pub fn pull_refused(&mut self, message: &str) {
        match std::mem::replace(&mut self.state, State::Ended) {
            State::Pull => {
                debug!("sync: FAIL (expected): {message}");
                self.outbox.bytes(&wire::encode_fail(message));
                self.finish(Ok(()));
            }
            other => self.misuse("pull_refused", other),
        }
    }

    /// A batch of the pull's `DATA` frames, sent as it is.
    pub fn pull_data(&mut self, batch: Payload) {
        match &self.state {
            State::Pull => self.outbox.batch(batch),
            _ => {
                let state = std::mem::replace(&mut self.state, State::Ended);
                self.misuse("pull_data", state);
            }
        }
    }

    /// How the pull ended: `DONE`, or `FAIL` and the end of the service
    /// (adbd ends it after a failed pull; the client stops too).
    pub fn pull_finished(&mut self, result: Result<(), Failure>) {
        match std::mem::replace(&mut self.state, State::Ended) {
            State::Pull => match result {
                Ok(()) => {
                    self.outbox.bytes(&wire::encode_done(0));
                    self.state = State::Header;
                }
                Err(Failure::Report(message)) => {
                    self.fail(&message);
                    self.finish(Ok(()));
                }
                // Only when the stream side stopped taking the frames.
                Err(Failure::HostGone) => {
                    self.finish(Err(ServiceError::Truncated("a pull")));
                }
            },
            other => self.misuse("pull_finished", other),
        }
    }

    // ----- endings -----

    /// Sends `FAIL` with `message` (which names the path and the cause).
    fn fail(&mut self, message: &str) {
        warn!("sync: FAIL: {message}");
        self.outbox.bytes(&wire::encode_fail(message));
    }

    /// A host protocol error: reported with `FAIL`, then the service ends,
    /// since the framing can no longer be trusted.
    fn violation(&mut self, message: String) -> Step {
        self.fail(&message);
        self.finish(Err(ServiceError::Protocol(message)))
    }

    fn finish(&mut self, result: Result<(), ServiceError>) -> Step {
        self.state = State::Ended;
        if self.end.is_none() {
            self.end = Some(result);
        }
        Step::Wait
    }

    /// A result fed in a state that asked for none: the adapter's bug.
    fn misuse(&mut self, call: &str, state: State) {
        debug_assert!(false, "sync service: {call} in state {state:?}");
        let message = format!("sync service: {call} out of turn");
        self.finish(Err(ServiceError::Protocol(message)));
    }
}

enum Step {
    Action(Action),
    Continue,
    Wait,
}

fn push_failure_message(path: &std::path::Path, failure: Failure) -> String {
    match failure {
        Failure::Report(message) => message,
        Failure::HostGone => format!("couldn't push '{}': transfer aborted", path.display()),
    }
}

/// The request path as the C string adbd would see: cut at the first NUL.
fn path_from_request(raw: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(up_to_nul(raw)))
}

/// `bytes` up to its first NUL, as C reads it.
pub(crate) fn up_to_nul(bytes: &[u8]) -> &[u8] {
    match bytes.iter().position(|&b| b == 0) {
        Some(nul) => &bytes[..nul],
        None => bytes,
    }
}
