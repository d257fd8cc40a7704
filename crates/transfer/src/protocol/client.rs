//! The host's side of one `sync:` stream as a machine: requests are queued
//! as bytes to write, and the device's replies, which come strictly in the
//! order of the requests, are read as [`ClientEvent`]s against the queue of
//! replies expected (`client/file_sync_client.cpp`).
//!
//! Stats and listings (`metadata.rs`) are answered one by one; pushes
//! (`send.rs`) are pipelined: their `OKAY`s are read whenever the adapter
//! looks; a pull (`receive.rs`) may have its `RECV` sent ahead of the `STAT`
//! reply it depends on (docs/protocol.md, "Pulls in two round trips").
//! After a failed transfer the device ends its service, and this machine
//! ends too: further requests are refused with the reason.
//!
//! Which version of each request goes (`STAT` or `LST2`/`STA2`, `LIST` or
//! `LIS2`, `SEND`/`RECV` or `SND2`/`RCV2`) is the machine's choice, from the
//! [`Versions`] the device takes. A new request goes here as a method that
//! queues its bytes and an [`Expect`] for its reply, and in
//! [`Client::poll_event`] as the reading of that reply.

use std::collections::VecDeque;

use bytes::Bytes;
use oxadb_wire::sync::{
    self as wire, Compression, Dent, StatV2, SyncFrameError, SyncRequest, TransferFlags,
};
use oxadb_wire::Payload;

use super::metadata::{
    read_list_item, read_stat_reply, ListItem, StatFailure, StatKind, StatReply,
};
use super::receive::{read_pull, recv_request, PullItem};
use super::send::{push_request, read_ack, Ack};
use super::{Outbox, Transmit};
use crate::Inbox;

/// Pushes in flight before the host waits for their acknowledgements (adb's limit).
pub const MAX_UNACKED: usize = 128;

/// The request versions the device takes (its banner's features).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Versions {
    /// `STA2`/`LST2` with 64-bit sizes and the errno on failure (`stat_v2`),
    /// else `STAT`.
    pub stat_v2: bool,
    /// `LIS2` (`ls_v2`), else `LIST`.
    pub ls_v2: bool,
    /// `SND2`/`RCV2` (`sendrecv_v2`), else `SEND`/`RECV`.
    pub sendrecv_v2: bool,
    /// A `RECV` may go before the `STAT` reply it depends on: the device
    /// refuses at once one it cannot stream (oxadbd's `oxadb_recv_ahead`).
    pub recv_ahead: bool,
}

/// A reply the device owes, oldest first.
#[derive(Debug)]
enum Expect {
    Stat {
        kind: StatKind,
        path: Vec<u8>,
    },
    /// A stat that follows symlinks on a device without `STA2`, as adb's
    /// fallback does it: a `STAT`, and for a symlink a `STAT` of `path/`,
    /// which resolves only if the link points at a directory (`link` holds
    /// the first reply once that one went).
    StatFollow {
        path: Vec<u8>,
        link: Option<StatV2>,
    },
    List {
        v2: bool,
        path: Vec<u8>,
    },
    /// A push's `OKAY` or `FAIL`; the names are the caller's, for its messages.
    Ack {
        local: String,
        remote: String,
    },
    /// A pull's `DATA` frames and `DONE`, or its `FAIL`.
    Recv {
        path: Vec<u8>,
    },
}

impl Expect {
    /// The reply, in words for a message about waiting for it.
    fn describe(&self) -> String {
        let show = |path: &[u8]| String::from_utf8_lossy(path).into_owned();
        match self {
            Expect::Stat { kind, path } => {
                format!("to the {} of '{}'", wire::id_name(kind.id()), show(path))
            }
            Expect::StatFollow { path, .. } => format!("to the STAT of '{}'", show(path)),
            Expect::List { path, .. } => format!("to the listing of '{}'", show(path)),
            Expect::Ack { local, remote } => {
                format!("to the push of '{local}' to '{remote}' (OKAY or FAIL)")
            }
            Expect::Recv { path } => {
                format!("to the pull of '{}' (DATA, DONE or FAIL)", show(path))
            }
        }
    }
}

/// A reply, or a piece of one.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// The answer to [`Client::lstat`], [`Client::stat`] (or the stat of
    /// [`Client::stat_for_pull`]), or one of [`Client::lstat_many`]'s.
    Stat(StatReply),
    /// An entry of the listing asked for with [`Client::list`] (entries the
    /// device could not `lstat` are left out).
    Entry(Dent),
    /// The listing is complete.
    ListDone,
    /// The oldest push was written.
    Acked,
    /// The oldest push failed with `message`; the session has ended.
    PushFailed {
        local: String,
        remote: String,
        message: String,
    },
    /// A piece of the pulled file, a slice of a received chunk.
    Data(Bytes),
    /// The pulled file is complete.
    Done,
    /// The pull failed with `message`; the session has ended.
    PullFailed(String),
}

/// Why the device's replies cannot be read any more; the session has ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// A reply that is not what the request asked for.
    #[error("{0}")]
    Protocol(String),
    /// The stream ended before the reply.
    #[error("the device closed the sync stream")]
    Closed,
}

/// Why a request could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The session ended earlier, for this reason.
    #[error("this sync session can't be used any more: {0}")]
    Ended(String),
    /// A dry run asked of a device without `SND2`.
    #[error("dry-run not supported by the device")]
    DryRunUnsupported,
    /// `path` does not fit in a request.
    #[error("{error}")]
    Path {
        path: Vec<u8>,
        error: SyncFrameError,
    },
    /// A `RECV` of another path was sent ahead, and its reply would be read
    /// as this pull's; the session has ended.
    #[error("pulling '{}' while the RECV of '{}' was on its way", String::from_utf8_lossy(.pulled), String::from_utf8_lossy(.ahead))]
    RecvAhead { pulled: Vec<u8>, ahead: Vec<u8> },
}

fn too_long(path: &[u8], error: SyncFrameError) -> RequestError {
    RequestError::Path {
        path: path.to_vec(),
        error,
    }
}

/// A pull that may go: its request, unless it was sent ahead
/// ([`Client::start_pull`]).
#[derive(Debug)]
pub struct PullTicket {
    path: Vec<u8>,
    request: Option<Vec<u8>>,
    compression: Compression,
}

impl PullTicket {
    /// Whether the `RECV` already went, ahead of the `STAT` reply.
    pub fn sent_ahead(&self) -> bool {
        self.request.is_none()
    }

    /// How the data comes compressed (never over `RECV`).
    pub fn compression(&self) -> Compression {
        self.compression
    }
}

/// The host's end of one `sync:` stream.
#[derive(Debug, Default)]
pub struct Client {
    versions: Versions,
    inbox: Inbox,
    outbox: Outbox,
    expected: VecDeque<Expect>,
    /// Why the session can't be used any more, once it can't.
    ended: Option<String>,
    eof: bool,
    /// The remote path of a `RECV` sent ahead of the `STAT` reply it
    /// depended on: its reply follows that one.
    recv_ahead: Option<Vec<u8>>,
    /// Bytes of the current pull's `DATA` payload still to come.
    data_left: usize,
}

impl Client {
    pub fn new(versions: Versions) -> Client {
        Client {
            versions,
            ..Client::default()
        }
    }

    /// The request versions this session uses.
    pub fn versions(&self) -> Versions {
        self.versions
    }

    /// A chunk the stream delivered, kept as it is.
    pub fn handle_input(&mut self, chunk: Bytes) {
        self.inbox.push(chunk);
    }

    /// The device closed the stream.
    pub fn handle_eof(&mut self) {
        self.eof = true;
    }

    /// Bytes received and not read yet. Once [`Client::poll_event`] returns
    /// `Ok(None)` while a reply is owed, they are less than one reply frame
    /// (the longest: a `FAIL` with a message of `SYNC_DATA_MAX` bytes); a
    /// `DATA` payload is handed on as it arrives, never held whole.
    pub fn buffered(&self) -> usize {
        self.inbox.len()
    }

    /// The next bytes to write.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.poll()
    }

    /// Why the session ended, once it did.
    pub fn ended(&self) -> Option<&str> {
        self.ended.as_deref()
    }

    /// Ends the session (the first reason is kept): the device ended its
    /// service, or the stream can't go on.
    pub fn end(&mut self, reason: &str) {
        if self.ended.is_none() {
            self.ended = Some(reason.to_string());
        }
        self.expected.clear();
        self.recv_ahead = None;
    }

    /// Pushes sent and not acknowledged yet.
    pub fn pending_acks(&self) -> usize {
        self.expected
            .iter()
            .filter(|expect| matches!(expect, Expect::Ack { .. }))
            .count()
    }

    /// The names of the oldest push not acknowledged yet.
    pub fn oldest_push(&self) -> Option<(&str, &str)> {
        self.expected.iter().find_map(|expect| match expect {
            Expect::Ack { local, remote } => Some((local.as_str(), remote.as_str())),
            _ => None,
        })
    }

    /// Whether a reply is still owed.
    pub fn awaits_reply(&self) -> bool {
        !self.expected.is_empty()
    }

    /// The oldest reply owed, in words (`to the RECV of '/x'`), for an
    /// adapter that gave up waiting for it.
    pub fn awaited(&self) -> Option<String> {
        self.expected.front().map(Expect::describe)
    }

    fn usable(&self) -> Result<(), RequestError> {
        match &self.ended {
            None => Ok(()),
            Some(reason) => Err(RequestError::Ended(reason.clone())),
        }
    }

    fn request(&self, id: u32, path: &[u8]) -> Result<Vec<u8>, RequestError> {
        self.usable()?;
        SyncRequest {
            id,
            path: path.to_vec(),
        }
        .encode()
        .map_err(|error| too_long(path, error))
    }

    // ----- requests -----

    fn lstat_kind(&self) -> StatKind {
        if self.versions.stat_v2 {
            StatKind::LstatV2
        } else {
            StatKind::LstatV1
        }
    }

    fn queue_stat(&mut self, kind: StatKind, path: &[u8]) -> Result<(), RequestError> {
        let request = self.request(kind.id(), path)?;
        self.outbox.bytes(&request);
        self.expected.push_back(Expect::Stat {
            kind,
            path: path.to_vec(),
        });
        Ok(())
    }

    /// Metadata of `path` itself (`LST2`, or `STAT`): a [`ClientEvent::Stat`].
    pub fn lstat(&mut self, path: &[u8]) -> Result<(), RequestError> {
        self.queue_stat(self.lstat_kind(), path)
    }

    /// Metadata of `path`, symlinks followed: `STA2`, or without it adb's
    /// fallback (a symlink is reported as a directory or a file of size 0,
    /// after a second `STAT`). A [`ClientEvent::Stat`].
    pub fn stat(&mut self, path: &[u8]) -> Result<(), RequestError> {
        if self.versions.stat_v2 {
            return self.queue_stat(StatKind::StatV2, path);
        }
        let request = self.request(wire::ID_LSTAT_V1, path)?;
        self.outbox.bytes(&request);
        self.expected.push_back(Expect::StatFollow {
            path: path.to_vec(),
            link: None,
        });
        Ok(())
    }

    /// `lstat`s of `paths`, pipelined (adb's `--sync` check): all requests
    /// or, if one path does not fit, none. A [`ClientEvent::Stat`] each.
    pub fn lstat_many(&mut self, paths: &[&[u8]]) -> Result<(), RequestError> {
        let kind = self.lstat_kind();
        let mut requests = Vec::new();
        for path in paths {
            requests.extend_from_slice(&self.request(kind.id(), path)?);
        }
        self.outbox.bytes(&requests);
        self.expected.extend(paths.iter().map(|path| Expect::Stat {
            kind,
            path: path.to_vec(),
        }));
        Ok(())
    }

    /// A listing of `path` (`LIS2` or `LIST`): [`ClientEvent::Entry`]s,
    /// then [`ClientEvent::ListDone`]. The device answers an unreadable or
    /// missing directory with an empty listing.
    pub fn list(&mut self, path: &[u8]) -> Result<(), RequestError> {
        let v2 = self.versions.ls_v2;
        let id = if v2 {
            wire::ID_LIST_V2
        } else {
            wire::ID_LIST_V1
        };
        let request = self.request(id, path)?;
        self.outbox.bytes(&request);
        self.expected.push_back(Expect::List {
            v2,
            path: path.to_vec(),
        });
        Ok(())
    }

    /// Starts a push of `remote` with the full `st_mode` `mode` (`S_IFLNK`
    /// makes a symlink): `SND2` with `compression` and `dry_run`, or `SEND`
    /// (uncompressed, and no dry run). Returns the compression the data must
    /// have. Its data follows ([`Client::push_data`], [`Client::push_batch`]),
    /// then [`Client::push_done`]; the answer is read later, as
    /// [`ClientEvent::Acked`] or [`ClientEvent::PushFailed`] with the names
    /// given here.
    pub fn push(
        &mut self,
        remote: &[u8],
        mode: u32,
        compression: Compression,
        dry_run: bool,
        local: &str,
    ) -> Result<Compression, RequestError> {
        self.usable()?;
        let flags = if self.versions.sendrecv_v2 {
            Some(TransferFlags {
                compression,
                dry_run,
            })
        } else if dry_run {
            return Err(RequestError::DryRunUnsupported);
        } else {
            None
        };
        let request = push_request(remote, mode, flags).map_err(|e| too_long(remote, e))?;
        self.outbox.bytes(&request);
        self.expected.push_back(Expect::Ack {
            local: local.to_string(),
            remote: String::from_utf8_lossy(remote).into_owned(),
        });
        Ok(flags.map_or(Compression::None, |flags| flags.compression))
    }

    /// A push's data in one `DATA` frame (at most `SYNC_DATA_MAX` bytes),
    /// joined to the request before it: small files and link targets.
    pub fn push_data(&mut self, data: &[u8]) {
        self.outbox.bytes(&wire::encode_data_header(data.len()));
        self.outbox.bytes(data);
    }

    /// A batch of ready-made `DATA` frames ([`crate::send_frames`],
    /// [`crate::Source::into_ranges`]), sent as it is.
    pub fn push_batch(&mut self, batch: Payload) {
        self.outbox.batch(batch);
    }

    /// The push's `DONE`, with the file's mtime.
    pub fn push_done(&mut self, mtime: u32) {
        self.outbox.bytes(&wire::encode_done(mtime));
    }

    /// The compression of a pull's data: `RCV2` carries it, `RECV` none.
    fn recv_compression(&self, compression: Compression) -> Option<Compression> {
        self.versions.sendrecv_v2.then_some(compression)
    }

    /// The stat a pull of `remote` starts with ([`Client::stat`]), and, when
    /// the device takes it ([`Versions::recv_ahead`] with `STA2`), the `RECV`
    /// of `remote` in the same write: a file's data then follows the reply
    /// without another round trip (docs/protocol.md, "Pulls in two round
    /// trips"). The caller pulls `remote` next ([`Client::start_pull`], with
    /// the same `compression`) or gives it up ([`Client::drop_recv_ahead`]).
    pub fn stat_for_pull(
        &mut self,
        remote: &[u8],
        compression: Compression,
    ) -> Result<(), RequestError> {
        if !(self.versions.recv_ahead && self.versions.stat_v2) {
            return self.stat(remote);
        }
        let recv = self.recv_compression(compression);
        let mut requests = self.request(wire::ID_STAT_V2, remote)?;
        requests.extend_from_slice(&recv_request(remote, recv).map_err(|e| too_long(remote, e))?);
        self.outbox.bytes(&requests);
        self.expected.push_back(Expect::Stat {
            kind: StatKind::StatV2,
            path: remote.to_vec(),
        });
        self.expected.push_back(Expect::Recv {
            path: remote.to_vec(),
        });
        self.recv_ahead = Some(remote.to_vec());
        Ok(())
    }

    /// Gives up a `RECV` sent ahead for a path that is not pulled after all:
    /// the device ends its service with the `FAIL` it answers, so this
    /// session ends too.
    pub fn drop_recv_ahead(&mut self) {
        if self.recv_ahead.is_some() {
            self.end("a RECV sent ahead of its STAT reply was not needed");
        }
    }

    /// Checks that a pull of `remote` (`RCV2` with `compression`, or `RECV`)
    /// can go, and whether its request was sent ahead. The adapter prepares
    /// the destination, then [`Client::send_pull`] (or
    /// [`Client::abandon_pull`]).
    pub fn start_pull(
        &mut self,
        remote: &[u8],
        compression: Compression,
    ) -> Result<PullTicket, RequestError> {
        self.usable()?;
        let recv = self.recv_compression(compression);
        let request = recv_request(remote, recv).map_err(|e| too_long(remote, e))?;
        let compression = recv.unwrap_or(Compression::None);
        match self.recv_ahead.take() {
            None => Ok(PullTicket {
                path: remote.to_vec(),
                request: Some(request),
                compression,
            }),
            Some(ahead) if ahead == remote => Ok(PullTicket {
                path: ahead,
                request: None,
                compression,
            }),
            Some(ahead) => {
                // Its reply would be read as this pull's.
                self.end("a RECV sent ahead was followed by another pull");
                Err(RequestError::RecvAhead {
                    pulled: remote.to_vec(),
                    ahead,
                })
            }
        }
    }

    /// Sends the pull's request (unless it went ahead): its reply is
    /// [`ClientEvent::Data`] pieces, then [`ClientEvent::Done`] or
    /// [`ClientEvent::PullFailed`].
    pub fn send_pull(&mut self, ticket: PullTicket) {
        if let Some(request) = ticket.request {
            self.outbox.bytes(&request);
            self.expected.push_back(Expect::Recv { path: ticket.path });
        }
    }

    /// The pull will not happen after all (its destination failed); a
    /// request sent ahead has its data on the way with nowhere to go.
    pub fn abandon_pull(&mut self, ticket: PullTicket) {
        if ticket.sent_ahead() {
            self.end("a pull's destination failed while its data was on the way");
        }
    }

    /// `QUIT`: the device ends its service and closes the stream.
    pub fn quit(&mut self) -> Result<(), RequestError> {
        let request = self.request(wire::ID_QUIT, b"")?;
        self.outbox.bytes(&request);
        Ok(())
    }

    // ----- replies -----

    /// The next reply (or piece of one) that arrived whole; `Ok(None)` when
    /// none is owed or more input is needed.
    pub fn poll_event(&mut self) -> Result<Option<ClientEvent>, ClientError> {
        loop {
            let Some(expect) = self.expected.front() else {
                return Ok(None);
            };
            let read = match expect {
                Expect::Stat { kind, path } => {
                    read_stat_reply(&mut self.inbox, *kind, path).map(|reply| {
                        reply.map(|reply| {
                            self.expected.pop_front();
                            ClientEvent::Stat(reply)
                        })
                    })
                }
                Expect::StatFollow { path, link: None } => {
                    match read_stat_reply(&mut self.inbox, StatKind::LstatV1, path) {
                        Ok(Some(Ok(stat))) if stat.mode & libc::S_IFMT == libc::S_IFLNK => {
                            let mut as_dir = path.clone();
                            as_dir.push(b'/');
                            match self.request(wire::ID_LSTAT_V1, &as_dir) {
                                Ok(request) => {
                                    self.outbox.bytes(&request);
                                    self.expected[0] = Expect::StatFollow {
                                        path: as_dir,
                                        link: Some(stat),
                                    };
                                    continue;
                                }
                                // "path/" is past the request limit: the stat
                                // fails, as asking for it would have.
                                Err(_) => {
                                    Ok(Some(Err(StatFailure::Errno(libc::ENAMETOOLONG as u32))))
                                }
                            }
                        }
                        other => other,
                    }
                    .map(|reply| {
                        reply.map(|reply| {
                            self.expected.pop_front();
                            ClientEvent::Stat(reply)
                        })
                    })
                }
                Expect::StatFollow {
                    path,
                    link: Some(link),
                } => {
                    let link = *link;
                    read_stat_reply(&mut self.inbox, StatKind::LstatV1, path).map(|reply| {
                        reply.map(|probe| {
                            let kind = if probe.is_ok() {
                                libc::S_IFDIR
                            } else {
                                libc::S_IFREG
                            };
                            let stat = StatV2 {
                                mode: (link.mode & !libc::S_IFMT) | kind,
                                size: 0,
                                ..link
                            };
                            self.expected.pop_front();
                            ClientEvent::Stat(Ok(stat))
                        })
                    })
                }
                Expect::List { v2, path } => match read_list_item(&mut self.inbox, *v2, path) {
                    Ok(Some(ListItem::Skipped)) => continue,
                    Ok(Some(ListItem::Entry(dent))) => Ok(Some(ClientEvent::Entry(dent))),
                    Ok(Some(ListItem::Done)) => {
                        self.expected.pop_front();
                        Ok(Some(ClientEvent::ListDone))
                    }
                    Ok(None) => Ok(None),
                    Err(e) => Err(e),
                },
                Expect::Ack { .. } => match read_ack(&mut self.inbox) {
                    Ok(Some(Ack::Okay)) => {
                        self.expected.pop_front();
                        Ok(Some(ClientEvent::Acked))
                    }
                    Ok(Some(Ack::Failed(message))) => {
                        let Some(Expect::Ack { local, remote }) = self.expected.pop_front() else {
                            unreachable!("the front expectation is an Ack");
                        };
                        self.end("the device reported a failed push");
                        Ok(Some(ClientEvent::PushFailed {
                            local,
                            remote,
                            message,
                        }))
                    }
                    Ok(None) => Ok(None),
                    Err(e) => Err(e),
                },
                Expect::Recv { .. } => match read_pull(&mut self.inbox, &mut self.data_left) {
                    Ok(Some(PullItem::Data(piece))) => Ok(Some(ClientEvent::Data(piece))),
                    Ok(Some(PullItem::Done)) => {
                        self.expected.pop_front();
                        Ok(Some(ClientEvent::Done))
                    }
                    Ok(Some(PullItem::Failed(message))) => {
                        self.end("the device reported a failed pull");
                        Ok(Some(ClientEvent::PullFailed(message)))
                    }
                    Ok(None) => Ok(None),
                    Err(e) => Err(e),
                },
            };
            return match read {
                Ok(Some(event)) => Ok(Some(event)),
                Ok(None) if self.eof => {
                    self.end("the device closed the stream");
                    Err(ClientError::Closed)
                }
                Ok(None) => Ok(None),
                Err(message) => {
                    self.end("protocol error");
                    Err(ClientError::Protocol(message))
                }
            };
        }
    }
}
