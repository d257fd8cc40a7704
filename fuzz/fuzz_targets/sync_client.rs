//! The host's side of a `sync:` stream (`oxadb_transfer::Client`) reading
//! what a device replies, which the host does not trust.
//!
//! Input: a byte of options (the `Versions` the device takes, and whether
//! the stream ends after the replies), a byte counting the requests, the
//! requests (an opcode byte each, and operands for a push's data), a byte
//! choosing the sizes of the chunks the replies arrive in, then the device's
//! reply bytes.
#![no_main]

use std::collections::VecDeque;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use oxadb_transfer::{Client, ClientError, ClientEvent, RequestError, Transmit, Versions};
use oxadb_wire::sync::{
    self as wire, Compression, SyncRequest, HEADER_LEN, SYNC_DATA_MAX, SYNC_PATH_MAX,
};

/// Longest entry name a listing may carry: what `read_list_item`
/// (crates/transfer/src/protocol/metadata.rs) enforces, PATH_MAX.
const MAX_NAME_LEN: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let (Some(options), Some(count)) = (input.byte(), input.byte()) else {
        return;
    };
    let versions = Versions {
        stat_v2: options & 1 != 0,
        ls_v2: options & 2 != 0,
        sendrecv_v2: options & 4 != 0,
        recv_ahead: options & 8 != 0,
    };
    let mut host = Host::new(versions);
    for _ in 0..count % 16 {
        let Some(op) = input.byte() else {
            return;
        };
        if host.request(op, &mut input).is_none() {
            return;
        }
    }
    let Some(sizes) = input.byte() else {
        return;
    };
    let mut chunks = Chunks {
        state: u32::from(sizes),
    };
    let mut replies = input.0;
    while !replies.is_empty() {
        let len = if sizes == 0 {
            replies.len()
        } else {
            chunks.next().min(replies.len())
        };
        let (chunk, rest) = replies.split_at(len);
        replies = rest;
        host.feed(chunk);
    }
    if options & 0x10 != 0 {
        host.eof();
    }
    host.finish();
});

/// The fuzz input, read from the front.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(taken)
    }
}

/// Chunk sizes from 1 to 64 bytes, a different one each time (an LCG
/// seeded by the input).
struct Chunks {
    state: u32,
}

impl Chunks {
    fn next(&mut self) -> usize {
        self.state = self.state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        (self.state >> 16) as usize % 64 + 1
    }
}

/// Paths, the last two at and just past the request limit (6 and 7 are 0
/// and 1 again).
fn path(pick: u8) -> Vec<u8> {
    match pick % 6 {
        0 => b"/data/local/tmp/f".to_vec(),
        1 => b"/sdcard".to_vec(),
        2 => b"/x".to_vec(),
        3 => b"".to_vec(),
        4 => vec![b'a'; SYNC_PATH_MAX],
        _ => vec![b'a'; SYNC_PATH_MAX + 1],
    }
}

fn compression(pick: u8) -> Compression {
    [
        Compression::None,
        Compression::Brotli,
        Compression::Lz4,
        Compression::Zstd,
    ][usize::from(pick & 3)]
}

/// A reply the device owes, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owed {
    Stat,
    List,
    Push,
    Pull,
}

struct Host {
    client: Client,
    versions: Versions,
    /// The replies owed, from the requests made.
    owed: VecDeque<Owed>,
    /// The path whose RECV went ahead of its STAT reply, not pulled yet.
    ahead: Option<Vec<u8>>,
    /// The session ended (a failure, an error, a pull given up).
    ended: bool,
    /// Every byte the device sent, and the DATA bytes handed out.
    fed: Vec<u8>,
    data_out: usize,
}

impl Host {
    fn new(versions: Versions) -> Host {
        Host {
            client: Client::new(versions),
            versions,
            owed: VecDeque::new(),
            ahead: None,
            ended: false,
            fed: Vec::new(),
            data_out: 0,
        }
    }

    /// One request. Bits 0-2: lstat, stat, list, push (its data follows:
    /// a length byte and the bytes), `stat_for_pull`, `start_pull` then
    /// `send_pull`, `start_pull` then `abandon_pull`, QUIT (with bit 7,
    /// `drop_recv_ahead`); bits 3-5 the path; bits 6-7 the compression (a
    /// push: bit 6 a symlink's mode, bit 7 a dry run).
    fn request(&mut self, op: u8, input: &mut Input) -> Option<()> {
        let path = path((op >> 3) & 7);
        let v2 = self.versions;
        match op & 7 {
            0 => {
                let result = self.client.lstat(&path);
                let id = if v2.stat_v2 {
                    wire::ID_LSTAT_V2
                } else {
                    wire::ID_LSTAT_V1
                };
                self.made(result, &path, &[(id, &path[..])], &[Owed::Stat]);
            }
            1 => {
                let result = self.client.stat(&path);
                let id = if v2.stat_v2 {
                    wire::ID_STAT_V2
                } else {
                    wire::ID_LSTAT_V1
                };
                self.made(result, &path, &[(id, &path[..])], &[Owed::Stat]);
            }
            2 => {
                let result = self.client.list(&path);
                let id = if v2.ls_v2 {
                    wire::ID_LIST_V2
                } else {
                    wire::ID_LIST_V1
                };
                self.made(result, &path, &[(id, &path[..])], &[Owed::List]);
            }
            3 => {
                let mode = if op & 0x40 != 0 { 0o120777 } else { 0o100644 };
                let dry_run = op & 0x80 != 0;
                let len = usize::from(input.byte()?);
                let data = input.take(len)?;
                let result = self
                    .client
                    .push(&path, mode, Compression::None, dry_run, "local");
                if dry_run && !v2.sendrecv_v2 && !self.ended {
                    assert_eq!(result, Err(RequestError::DryRunUnsupported));
                    assert!(self.transmitted().is_empty());
                    return Some(());
                }
                let (id, spec) = if v2.sendrecv_v2 {
                    (wire::ID_SEND_V2, path.clone())
                } else {
                    let mut spec = path.clone();
                    spec.extend_from_slice(format!(",{mode}").as_bytes());
                    (wire::ID_SEND_V1, spec)
                };
                let ok = result.is_ok();
                self.made(result.map(|_| ()), &spec, &[(id, &spec[..])], &[Owed::Push]);
                if ok {
                    self.client.push_data(data);
                    self.client.push_done(1_700_000_000);
                    let sent = self.transmitted();
                    let mut frames = wire::encode_data(data).unwrap();
                    frames.extend_from_slice(&wire::encode_done(1_700_000_000));
                    assert_eq!(sent, frames);
                }
            }
            4 => {
                let result = self.client.stat_for_pull(&path, compression(op >> 6));
                if v2.recv_ahead && v2.stat_v2 {
                    let recv = if v2.sendrecv_v2 {
                        wire::ID_RECV_V2
                    } else {
                        wire::ID_RECV_V1
                    };
                    let ok = result.is_ok();
                    self.made(
                        result,
                        &path,
                        &[(wire::ID_STAT_V2, &path[..]), (recv, &path[..])],
                        &[Owed::Stat, Owed::Pull],
                    );
                    if ok {
                        self.ahead = Some(path);
                    }
                } else {
                    let id = if v2.stat_v2 {
                        wire::ID_STAT_V2
                    } else {
                        wire::ID_LSTAT_V1
                    };
                    self.made(result, &path, &[(id, &path[..])], &[Owed::Stat]);
                }
            }
            5 | 6 => {
                let abandon = op & 7 == 6;
                match self.client.start_pull(&path, compression(op >> 6)) {
                    Ok(ticket) => {
                        assert!(!self.ended);
                        assert!(path.len() <= SYNC_PATH_MAX);
                        assert_eq!(ticket.sent_ahead(), self.ahead.is_some());
                        if ticket.sent_ahead() {
                            assert_eq!(self.ahead.take(), Some(path.clone()));
                        }
                        let sent_ahead = ticket.sent_ahead();
                        if abandon {
                            self.client.abandon_pull(ticket);
                            // Its data is on the way with nowhere to go.
                            if sent_ahead {
                                self.end();
                            }
                        } else {
                            self.client.send_pull(ticket);
                            if !sent_ahead {
                                self.owed.push_back(Owed::Pull);
                                let id = if v2.sendrecv_v2 {
                                    wire::ID_RECV_V2
                                } else {
                                    wire::ID_RECV_V1
                                };
                                self.check_requests(&[(id, &path[..])]);
                            }
                        }
                        assert!(self.transmitted().is_empty());
                    }
                    Err(RequestError::RecvAhead { pulled, ahead }) => {
                        assert_eq!(pulled, path);
                        assert_eq!(self.ahead.take(), Some(ahead));
                        assert!(!self.ended);
                        self.end();
                    }
                    Err(error) => self.refused(error, &path),
                }
            }
            _ => {
                if op & 0x80 != 0 {
                    self.client.drop_recv_ahead();
                    if self.ahead.take().is_some() {
                        self.end();
                    }
                } else {
                    let result = self.client.quit();
                    self.made(result, b"", &[(wire::ID_QUIT, &b""[..])], &[]);
                }
            }
        }
        assert_eq!(self.client.ended().is_some(), self.ended);
        Some(())
    }

    /// A request made: sent as `requests` and owing `owed`, or refused.
    fn made(
        &mut self,
        result: Result<(), RequestError>,
        path: &[u8],
        requests: &[(u32, &[u8])],
        owed: &[Owed],
    ) {
        match result {
            Ok(()) => {
                assert!(!self.ended, "a request after the end");
                self.owed.extend(owed);
                self.check_requests(requests);
            }
            Err(error) => self.refused(error, path),
        }
    }

    /// A refused request sends nothing and changes nothing: the session
    /// ended, or its path does not fit.
    fn refused(&mut self, error: RequestError, path: &[u8]) {
        match error {
            RequestError::Ended(_) => assert!(self.ended),
            RequestError::Path { .. } => {
                assert!(!self.ended && path.len() > SYNC_PATH_MAX);
            }
            other => panic!("{other:?}"),
        }
        assert!(self.transmitted().is_empty());
    }

    /// What the client wrote is these requests, in order.
    fn check_requests(&mut self, requests: &[(u32, &[u8])]) {
        let sent = self.transmitted();
        let mut rest = &sent[..];
        for &(id, path) in requests {
            let (request, used) = SyncRequest::parse(rest).expect("a request");
            assert_eq!((request.id, &request.path[..]), (id, path));
            rest = &rest[used..];
            // RCV2 and SND2 have their setup frame.
            match id {
                wire::ID_RECV_V2 => rest = &rest[wire::RECV_V2_SETUP_LEN..],
                wire::ID_SEND_V2 => rest = &rest[wire::SEND_V2_SETUP_LEN..],
                _ => {}
            }
        }
        assert!(rest.is_empty(), "more than the requests was sent");
    }

    fn transmitted(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(transmit) = self.client.poll_transmit() {
            match transmit {
                Transmit::Bytes(bytes) => out.extend_from_slice(&bytes),
                Transmit::Batch(_) => panic!("no batch was queued"),
            }
        }
        out
    }

    fn end(&mut self) {
        self.ended = true;
        self.owed.clear();
        self.ahead = None;
    }

    /// A chunk of the device's replies, then every event it completes.
    fn feed(&mut self, chunk: &[u8]) {
        self.fed.extend_from_slice(chunk);
        self.client.handle_input(Bytes::copy_from_slice(chunk));
        self.poll();
    }

    fn eof(&mut self) {
        self.client.handle_eof();
        let owed = !self.owed.is_empty();
        let failed = self.poll();
        // The end of the stream with a reply owed is an error, never a wait.
        if owed && !failed {
            assert!(self.owed.is_empty(), "waiting after the end of the stream");
        }
    }

    /// Takes events until the client needs more; true if it failed.
    fn poll(&mut self) -> bool {
        loop {
            match self.client.poll_event() {
                Ok(Some(event)) => self.event(event),
                Ok(None) => {
                    self.waiting();
                    return false;
                }
                Err(error) => {
                    assert!(!self.ended, "{error:?} after the end");
                    if error == ClientError::Closed {
                        assert!(!self.owed.is_empty());
                    }
                    // A symlink's second STAT may have gone before the error.
                    self.check_restat();
                    self.end();
                    // The error ended the session: nothing is read any more.
                    assert_eq!(self.client.poll_event(), Ok(None));
                    assert!(!self.client.awaits_reply());
                    return true;
                }
            }
            assert_eq!(self.client.ended().is_some(), self.ended);
        }
    }

    /// An event: the reply (or part of one) owed first.
    fn event(&mut self, event: ClientEvent) {
        let front = self.owed.front().copied();
        let expected = match &event {
            ClientEvent::Stat(_) => Owed::Stat,
            ClientEvent::Entry(dent) => {
                let id = if self.versions.ls_v2 {
                    wire::ID_DENT_V2
                } else {
                    wire::ID_DENT_V1
                };
                assert_eq!(dent.id, id);
                // The name is no longer than the client allows; entries the
                // device could not stat are left out. Other names (empty,
                // `.`, `..`, with `/` or NUL) reach the caller as sent, as
                // adb lists them: oxadb's `child_path` refuses them for a
                // local path.
                assert!(dent.name.len() <= MAX_NAME_LEN);
                assert_eq!(dent.stat.error, 0);
                Owed::List
            }
            ClientEvent::ListDone => Owed::List,
            ClientEvent::Acked | ClientEvent::PushFailed { .. } => Owed::Push,
            ClientEvent::Data(piece) => {
                // The next bytes of a DATA payload, as they arrived.
                assert!(!piece.is_empty());
                let read = self.fed.len() - self.client.buffered();
                assert_eq!(piece[..], self.fed[read - piece.len()..read]);
                self.data_out += piece.len();
                assert!(self.data_out <= self.fed.len());
                Owed::Pull
            }
            ClientEvent::Done | ClientEvent::PullFailed(_) => Owed::Pull,
        };
        assert_eq!(
            front,
            Some(expected),
            "{event:?} when {:?} is owed",
            self.owed
        );
        match event {
            ClientEvent::Stat(_)
            | ClientEvent::ListDone
            | ClientEvent::Acked
            | ClientEvent::Done => {
                self.owed.pop_front();
            }
            ClientEvent::PushFailed { .. } | ClientEvent::PullFailed(_) => self.end(),
            ClientEvent::Entry(_) | ClientEvent::Data(_) => {}
        }
        self.check_restat();
    }

    /// Without STA2 a symlink is stat'ed again as "path/": nothing else is
    /// ever sent while reading.
    fn check_restat(&mut self) {
        let sent = self.transmitted();
        if !sent.is_empty() {
            let (request, used) = SyncRequest::parse(&sent).expect("a request");
            assert_eq!(request.id, wire::ID_LSTAT_V1);
            assert_eq!(request.path.last(), Some(&b'/'));
            assert_eq!(used, sent.len());
        }
    }

    /// `Ok(None)` with a reply owed: the client waits for the rest of one
    /// frame, never sits on a whole one, and an announced length it refuses
    /// (a FAIL over `SYNC_DATA_MAX`, a name over `MAX_NAME_LEN`) was an
    /// error at its header.
    fn waiting(&mut self) {
        let held = self.client.buffered();
        let Some(&front) = self.owed.front() else {
            // Nothing owed: whatever came waits, unread.
            assert!(!self.client.awaits_reply());
            return;
        };
        assert!(self.client.awaits_reply());
        assert!(held < HEADER_LEN + SYNC_DATA_MAX, "{held} bytes held");
        self.check_restat();
        let unread = &self.fed[self.fed.len() - held..];
        let u32_at = |at: usize| u32::from_le_bytes(unread[at..at + 4].try_into().unwrap());
        let whole = match front {
            Owed::Stat if self.versions.stat_v2 => wire::STAT_V2_LEN,
            Owed::Stat => wire::STAT_V1_LEN,
            _ if unread.len() < HEADER_LEN => HEADER_LEN,
            Owed::List => {
                let (fixed, dent, name_at) = if self.versions.ls_v2 {
                    (wire::DENT_V2_LEN, wire::ID_DENT_V2, 72)
                } else {
                    (wire::DENT_V1_LEN, wire::ID_DENT_V1, 16)
                };
                let id = u32_at(0);
                assert!(id == wire::ID_DONE || id == dent, "waiting on {id:#x}");
                if id == wire::ID_DONE || unread.len() < fixed {
                    fixed
                } else {
                    let name_len = u32_at(name_at) as usize;
                    assert!(
                        name_len <= MAX_NAME_LEN,
                        "waiting on a {name_len}-byte name"
                    );
                    fixed + name_len
                }
            }
            // OKAY, DATA and DONE are taken at their header: only a FAIL's
            // message is waited for, and only one that fits a DATA payload
            // (client/file_sync_client.cpp refuses longer ones).
            Owed::Push | Owed::Pull => {
                assert_eq!(u32_at(0), wire::ID_FAIL, "waiting on a header");
                let len = u32_at(4) as usize;
                assert!(len <= SYNC_DATA_MAX, "waiting on a FAIL of {len} bytes");
                HEADER_LEN + len
            }
        };
        assert!(unread.len() < whole, "a whole reply waits ({front:?})");
    }

    /// After the end of the session, every request is refused with its reason.
    fn finish(&mut self) {
        assert_eq!(self.client.ended().is_some(), self.ended);
        if !self.ended {
            return;
        }
        let path: &[u8] = b"/x";
        let ended = |result: Result<(), RequestError>| {
            assert!(matches!(result, Err(RequestError::Ended(_))), "{result:?}");
        };
        ended(self.client.lstat(path));
        ended(self.client.stat(path));
        ended(self.client.list(path));
        ended(self.client.lstat_many(&[path]));
        ended(
            self.client
                .push(path, 0o100644, Compression::None, false, "x")
                .map(|_| ()),
        );
        ended(self.client.stat_for_pull(path, Compression::None));
        ended(self.client.start_pull(path, Compression::None).map(|_| ()));
        ended(self.client.quit());
        assert!(self.transmitted().is_empty());
        assert!(!self.client.awaits_reply());
    }
}
