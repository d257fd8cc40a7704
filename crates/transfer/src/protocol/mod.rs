//! The sync protocol itself, as sans-I/O state machines: no stream, no file,
//! no thread, no clock (AOSP `daemon/file_sync_service.cpp` and
//! `client/file_sync_client.cpp`; frames from [`oxadb_wire::sync`]).
//!
//! Each role has one machine, fed the bytes its stream delivered and drained
//! of what to write and what to do, as `oxadb-engine` is for packets
//! (docs/architecture.md, "transfer"):
//!
//! - [`Service`] is the daemon's `sync:` service: requests in, replies out,
//!   and [`Action`]s for its adapter to perform (stat a path, list a
//!   directory, take a push's data, send a file), whose results are fed back.
//! - [`Client`] is the host's session: requests out (stats, listings,
//!   pipelined pushes, pulls), the device's replies in as [`ClientEvent`]s.
//!
//! Both take received chunks as they are (`handle_input(Bytes)`), parse them
//! in place with an [`crate::Inbox`] and hand `DATA` payloads on as slices of
//! those chunks; file data going out (batches of ready-made `DATA` frames, or
//! file ranges) passes through as it is. The machines parse only when asked
//! for their next action or event, so a result fed back in between (a push
//! refused, a pull finished) takes effect before the bytes after it are read.

mod client;
mod metadata;
mod receive;
mod send;
mod service;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use oxadb_wire::Payload;

pub use client::{
    Client, ClientError, ClientEvent, PullTicket, RequestError, Versions, MAX_UNACKED,
};
pub use metadata::{stat_v2_of, ListEntry, StatFailure, StatKind, StatReply};
pub(crate) use service::up_to_nul;
pub use service::{Action, Failure, PushRequest, Service, ServiceError};

/// Something a machine wants written to its stream, in order.
#[derive(Debug)]
pub enum Transmit {
    /// Requests, replies and status frames, adjacent ones joined into one
    /// buffer (a small push's request, data and `DONE` go in one write, as
    /// adb sends them).
    Bytes(Bytes),
    /// A batch of `DATA` frames as [`crate::send_frames`] or
    /// [`crate::Source::into_ranges`] made it (in memory or file ranges),
    /// written as it is.
    Batch(Payload),
}

#[cfg(test)]
impl Transmit {
    /// The bytes a writer sends, file ranges read.
    pub(crate) fn into_bytes(self) -> Bytes {
        match self {
            Transmit::Bytes(bytes) => bytes,
            Transmit::Batch(payload) => crate::testdata::read_ranges(payload),
        }
    }
}

/// What a machine has to send, oldest first.
#[derive(Debug, Default)]
struct Outbox {
    queue: VecDeque<Transmit>,
    /// Frames written since the last batch, not yet a [`Transmit`].
    open: BytesMut,
}

impl Outbox {
    fn bytes(&mut self, frame: &[u8]) {
        self.open.extend_from_slice(frame);
    }

    fn batch(&mut self, batch: Payload) {
        self.seal();
        if !batch.is_empty() {
            self.queue.push_back(Transmit::Batch(batch));
        }
    }

    fn seal(&mut self) {
        if !self.open.is_empty() {
            let bytes = self.open.split().freeze();
            self.queue.push_back(Transmit::Bytes(bytes));
        }
    }

    fn poll(&mut self) -> Option<Transmit> {
        if self.queue.is_empty() {
            self.seal();
        }
        self.queue.pop_front()
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.open.is_empty()
    }
}
