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
//! A new request goes here as a method that queues its bytes and an
//! [`Expect`] for its reply, and in [`Client::poll_event`] as the reading of
//! that reply.

use std::collections::VecDeque;

use bytes::Bytes;
use oxadb_wire::sync::{
    self as wire, Compression, Dent, SyncFrameError, SyncRequest, TransferFlags,
};
use oxadb_wire::Payload;

use super::metadata::{read_list_item, read_stat_reply, ListItem, StatKind, StatReply};
use super::receive::{read_pull, recv_request, PullItem};
use super::send::{push_request, read_ack, Ack};
use super::{Outbox, Transmit};
use crate::Inbox;

/// Pushes in flight before the host waits for their acknowledgements (adb's limit).
pub const MAX_UNACKED: usize = 128;

/// A reply the device owes, oldest first.
#[derive(Debug)]
enum Expect {
    Stat {
        kind: StatKind,
        path: Vec<u8>,
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
    Recv,
}

/// A reply, or a piece of one.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// The answer to [`Client::stat`] (or to the stat of
    /// [`Client::stat_with_recv_ahead`]).
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
    request: Option<Vec<u8>>,
}

impl PullTicket {
    /// Whether the `RECV` already went, ahead of the `STAT` reply.
    pub fn sent_ahead(&self) -> bool {
        self.request.is_none()
    }
}

/// The host's end of one `sync:` stream.
#[derive(Debug, Default)]
pub struct Client {
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
    pub fn new() -> Client {
        Client::default()
    }

    /// A chunk the stream delivered, kept as it is.
    pub fn handle_input(&mut self, chunk: Bytes) {
        self.inbox.push(chunk);
    }

    /// The device closed the stream.
    pub fn handle_eof(&mut self) {
        self.eof = true;
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

    /// A stat of `path`; its reply is a [`ClientEvent::Stat`].
    pub fn stat(&mut self, kind: StatKind, path: &[u8]) -> Result<(), RequestError> {
        let request = self.request(kind.id(), path)?;
        self.outbox.bytes(&request);
        self.expected.push_back(Expect::Stat {
            kind,
            path: path.to_vec(),
        });
        Ok(())
    }

    /// Stats of `paths`, pipelined (adb's `--sync` check): all requests or,
    /// if one path does not fit, none.
    pub fn stat_many(&mut self, kind: StatKind, paths: &[&[u8]]) -> Result<(), RequestError> {
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
    pub fn list(&mut self, v2: bool, path: &[u8]) -> Result<(), RequestError> {
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
    /// makes a symlink): `SND2` with `flags`, or `SEND` without. Its data
    /// follows ([`Client::push_data`], [`Client::push_batch`]), then
    /// [`Client::push_done`]; the answer is read later, as
    /// [`ClientEvent::Acked`] or [`ClientEvent::PushFailed`] with the names
    /// given here.
    pub fn push(
        &mut self,
        remote: &[u8],
        mode: u32,
        flags: Option<TransferFlags>,
        local: &str,
    ) -> Result<(), RequestError> {
        self.usable()?;
        let request = push_request(remote, mode, flags).map_err(|e| too_long(remote, e))?;
        self.outbox.bytes(&request);
        self.expected.push_back(Expect::Ack {
            local: local.to_string(),
            remote: String::from_utf8_lossy(remote).into_owned(),
        });
        Ok(())
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

    /// A `STA2` of `remote` with the `RECV` of it in the same write, for a
    /// device that refuses at once a `RECV` of anything it cannot stream
    /// (oxadbd's `oxadb_recv_ahead`): a file's data then follows the reply
    /// without another round trip. The caller pulls `remote` next
    /// ([`Client::start_pull`]) or gives it up ([`Client::drop_recv_ahead`]).
    pub fn stat_with_recv_ahead(
        &mut self,
        remote: &[u8],
        recv: Option<Compression>,
    ) -> Result<(), RequestError> {
        let mut requests = self.request(wire::ID_STAT_V2, remote)?;
        requests.extend_from_slice(&recv_request(remote, recv).map_err(|e| too_long(remote, e))?);
        self.outbox.bytes(&requests);
        self.expected.push_back(Expect::Stat {
            kind: StatKind::StatV2,
            path: remote.to_vec(),
        });
        self.expected.push_back(Expect::Recv);
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

    /// Checks that a pull of `remote` (`RCV2` with `recv`'s compression, or
    /// `RECV`) can go, and whether its request was sent ahead. The adapter
    /// prepares the destination, then [`Client::send_pull`] (or
    /// [`Client::abandon_pull`]).
    pub fn start_pull(
        &mut self,
        remote: &[u8],
        recv: Option<Compression>,
    ) -> Result<PullTicket, RequestError> {
        self.usable()?;
        let request = recv_request(remote, recv).map_err(|e| too_long(remote, e))?;
        match self.recv_ahead.take() {
            None => Ok(PullTicket {
                request: Some(request),
            }),
            Some(ahead) if ahead == remote => Ok(PullTicket { request: None }),
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
            self.expected.push_back(Expect::Recv);
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
                Expect::Recv => match read_pull(&mut self.inbox, &mut self.data_left) {
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
