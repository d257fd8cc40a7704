//! The host's pushes: `SEND`/`SND2` requests and their `DATA`/`DONE`
//! (`client/file_sync_client.cpp`'s `SendRequest`, `SendSend2`), and the
//! device's `OKAY` or `FAIL` that answers each. adb pipelines them: the next
//! file goes before the last one was acknowledged.

use oxadb_wire::sync::{
    self as wire, SyncFrameError, SyncRequest, TransferFlags, HEADER_LEN, SYNC_DATA_MAX,
};

use crate::Inbox;

/// A push's request: `SND2` and its setup frame (`flags: Some`), else `SEND`
/// with `"<path>,<mode>"` (adb 29's only form).
pub(super) fn push_request(
    remote: &[u8],
    mode: u32,
    flags: Option<TransferFlags>,
) -> Result<Vec<u8>, SyncFrameError> {
    match flags {
        Some(flags) => {
            let mut message = SyncRequest {
                id: wire::ID_SEND_V2,
                path: remote.to_vec(),
            }
            .encode()?;
            let setup = wire::SendV2Setup {
                id: wire::ID_SEND_V2,
                mode,
                flags: flags.to_flags(),
            };
            message.extend_from_slice(&setup.encode());
            Ok(message)
        }
        None => {
            let mut spec = remote.to_vec();
            spec.extend_from_slice(format!(",{mode}").as_bytes());
            SyncRequest {
                id: wire::ID_SEND_V1,
                path: spec,
            }
            .encode()
        }
    }
}

/// The reason of a `FAIL` whose header was peeked, once all of it arrived;
/// a length over a `DATA` payload's is an error at once, never waited for
/// (adb's `file_sync_client.cpp` refuses it on pushes; a device that
/// announces 4 GiB and goes quiet must not hang a pull either).
pub(super) fn read_fail(inbox: &mut Inbox, announced: u32) -> Result<Option<String>, String> {
    let len = announced as usize;
    if len > SYNC_DATA_MAX {
        return Err(format!(
            "FAIL message of {len} bytes (the limit is {SYNC_DATA_MAX})"
        ));
    }
    if inbox.len() < HEADER_LEN + len {
        return Ok(None);
    }
    inbox.consume(HEADER_LEN);
    let message = inbox.take_vec(len);
    Ok(Some(String::from_utf8_lossy(&message).into_owned()))
}

/// The device's answer to a finished push.
pub(super) enum Ack {
    Okay,
    Failed(String),
}

/// The host reading the answer to the oldest push; `Ok(None)` until all of
/// it arrived, `Err` (a protocol error) for anything but `OKAY` or `FAIL`.
pub(super) fn read_ack(inbox: &mut Inbox) -> Result<Option<Ack>, String> {
    let Some(header) = inbox.peek_header() else {
        return Ok(None);
    };
    match header.id {
        wire::ID_OKAY => {
            inbox.consume(HEADER_LEN);
            if header.len != 0 {
                return Err(format!("OKAY with a message length of {}", header.len));
            }
            Ok(Some(Ack::Okay))
        }
        wire::ID_FAIL => Ok(read_fail(inbox, header.len)?.map(Ack::Failed)),
        other => Err(format!(
            "unexpected response to a push: {}",
            wire::id_name(other)
        )),
    }
}
