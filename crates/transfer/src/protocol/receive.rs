//! The host's pulls: `RECV`/`RCV2` requests and the device's `DATA` frames,
//! `DONE` or `FAIL` that answer them (`client/file_sync_client.cpp`'s
//! `sync_recv`). Payloads leave as slices of the received chunks, each piece
//! as soon as it arrived.

use bytes::Bytes;
use oxadb_wire::sync::{self as wire, Compression, SyncFrameError, SyncRequest, HEADER_LEN};

use super::send::read_fail;
use crate::Inbox;

/// A pull's request: `RCV2` and its setup frame with `compression`
/// (`recv: Some`), else `RECV`.
pub(super) fn recv_request(
    remote: &[u8],
    recv: Option<Compression>,
) -> Result<Vec<u8>, SyncFrameError> {
    let id = if recv.is_some() {
        wire::ID_RECV_V2
    } else {
        wire::ID_RECV_V1
    };
    let mut request = SyncRequest {
        id,
        path: remote.to_vec(),
    }
    .encode()?;
    if let Some(compression) = recv {
        let setup = wire::RecvV2Setup {
            id: wire::ID_RECV_V2,
            flags: compression.flag(),
        };
        request.extend_from_slice(&setup.encode());
    }
    Ok(request)
}

/// What the host read of a pull.
pub(super) enum PullItem {
    /// A piece of a `DATA` payload.
    Data(Bytes),
    Done,
    Failed(String),
}

/// The host reading the next piece of a pull; `data_left` carries the bytes
/// of the current `DATA` payload still to come. `Ok(None)` until more
/// arrived.
pub(super) fn read_pull(
    inbox: &mut Inbox,
    data_left: &mut usize,
) -> Result<Option<PullItem>, String> {
    loop {
        if *data_left > 0 {
            if inbox.is_empty() {
                return Ok(None);
            }
            let piece = inbox.take_piece(*data_left);
            *data_left -= piece.len();
            return Ok(Some(PullItem::Data(piece)));
        }
        let Some(header) = inbox.peek_header() else {
            return Ok(None);
        };
        match header.id {
            wire::ID_DATA => {
                *data_left = header.data_len().map_err(|e| e.to_string())?;
                inbox.consume(HEADER_LEN);
            }
            wire::ID_DONE => {
                inbox.consume(HEADER_LEN);
                return Ok(Some(PullItem::Done));
            }
            wire::ID_FAIL => return Ok(read_fail(inbox, header.len)?.map(PullItem::Failed)),
            other => {
                return Err(format!(
                    "expected DATA, DONE or FAIL, got {}",
                    wire::id_name(other)
                ))
            }
        }
    }
}
