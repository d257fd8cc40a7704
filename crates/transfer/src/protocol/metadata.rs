//! `STAT`, `LST2`, `STA2`, `LIST` and `LIS2`: the daemon's replies, written
//! as adbd's `daemon/file_sync_service.cpp` writes them (`do_lstat_v1`,
//! `do_stat_v2`, `do_list`), and the host's reading of them
//! (`client/file_sync_client.cpp`).

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use oxadb_wire::sync::{self as wire, Dent, StatV1, StatV2};
use tracing::debug;

use super::Outbox;
use crate::Inbox;

/// Longest entry name a host accepts in a listing (PATH_MAX).
const MAX_NAME_LEN: usize = 4096;

/// Which stat a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    /// `STAT`: `lstat`, 32-bit fields, all zeroes when it fails.
    LstatV1,
    /// `LST2`: `lstat`, the errno when it fails.
    LstatV2,
    /// `STA2`: `stat` (symlinks followed), the errno when it fails.
    StatV2,
}

impl StatKind {
    pub fn of(id: u32) -> Option<StatKind> {
        match id {
            wire::ID_LSTAT_V1 => Some(StatKind::LstatV1),
            wire::ID_LSTAT_V2 => Some(StatKind::LstatV2),
            wire::ID_STAT_V2 => Some(StatKind::StatV2),
            _ => None,
        }
    }

    pub fn id(self) -> u32 {
        match self {
            StatKind::LstatV1 => wire::ID_LSTAT_V1,
            StatKind::LstatV2 => wire::ID_LSTAT_V2,
            StatKind::StatV2 => wire::ID_STAT_V2,
        }
    }

    /// Whether the path is looked at through a symlink (`stat`, not `lstat`).
    pub fn follows_symlinks(self) -> bool {
        self == StatKind::StatV2
    }
}

/// The `stat_v2` fields of `md`.
pub fn stat_v2_of(md: &Metadata) -> StatV2 {
    StatV2 {
        error: 0,
        dev: md.dev(),
        ino: md.ino(),
        mode: md.mode(),
        nlink: md.nlink() as u32,
        uid: md.uid(),
        gid: md.gid(),
        size: md.size(),
        atime: md.atime(),
        mtime: md.mtime(),
        ctime: md.ctime(),
    }
}

fn stat_v2_error(error: &io::Error) -> StatV2 {
    StatV2::error(wire::errno_to_wire(
        error.raw_os_error().unwrap_or(libc::EIO),
    ))
}

/// The daemon's reply to a stat of `path`: the fields, or what the request's
/// version says a failure looks like.
pub(super) fn write_stat_reply(
    out: &mut Outbox,
    kind: StatKind,
    path: &Path,
    result: Result<StatV2, io::Error>,
) {
    match (kind, result) {
        // v1 fields are 32-bit on the wire; adbd truncates the same way.
        (StatKind::LstatV1, Ok(stat)) => out.bytes(
            &StatV1 {
                mode: stat.mode,
                size: stat.size as u32,
                mtime: stat.mtime as u32,
            }
            .encode(),
        ),
        (StatKind::LstatV1, Err(e)) => {
            debug!("sync: lstat '{}': {e}", path.display());
            out.bytes(&StatV1::default().encode());
        }
        (kind, Ok(stat)) => out.bytes(&stat.encode(kind.id())),
        (kind, Err(e)) => {
            debug!(
                "sync: {} '{}': {e}",
                wire::id_name(kind.id()),
                path.display()
            );
            out.bytes(&stat_v2_error(&e).encode(kind.id()));
        }
    }
}

/// One entry of a directory being listed, as the daemon's adapter found it
/// (`readdir`'s name, its `lstat`).
#[derive(Debug)]
pub struct ListEntry {
    pub name: Vec<u8>,
    pub stat: Result<StatV2, io::Error>,
}

/// The daemon's whole `LIST`/`LIS2` reply. Like adbd: every entry the
/// adapter read (`.` and `..` included); v1 skips entries whose `lstat`
/// failed, v2 sends the errno; an unreadable directory is an empty listing.
pub(super) fn write_listing(
    out: &mut Outbox,
    v2: bool,
    dir: &Path,
    entries: Result<Vec<ListEntry>, io::Error>,
) {
    let mut reply = Vec::new();
    match entries {
        Ok(entries) => {
            for entry in entries {
                let stat = match entry.stat {
                    Ok(stat) => stat,
                    Err(_) if !v2 => continue,
                    Err(e) => stat_v2_error(&e),
                };
                if v2 {
                    wire::encode_dent_v2(&mut reply, &stat, &entry.name);
                } else {
                    // v1 fields are 32-bit on the wire.
                    wire::encode_dent_v1(
                        &mut reply,
                        stat.mode,
                        stat.size as u32,
                        stat.mtime as u32,
                        &entry.name,
                    );
                }
            }
        }
        Err(e) => debug!("sync: can't list '{}': {e}", dir.display()),
    }
    if v2 {
        reply.extend_from_slice(&wire::encode_dent_v2_done());
    } else {
        reply.extend_from_slice(&wire::encode_dent_v1_done());
    }
    out.bytes(&reply);
}

/// Why a stat failed on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatFailure {
    /// `stat_v2` reports the errno (Linux numbering).
    Errno(u32),
    /// A `STAT` (v1) reply of zeroes: the path does not exist or can't be read.
    Unknown,
}

impl StatFailure {
    pub fn is_not_found(self) -> bool {
        matches!(
            self,
            StatFailure::Unknown | StatFailure::Errno(2 /* ENOENT */)
        )
    }
}

/// A stat's answer: the metadata (a `STAT` reply's three fields in a
/// `StatV2`, its `ctime` the `mtime` as adb fills it), or why not.
pub type StatReply = Result<StatV2, StatFailure>;

/// The host reading a stat reply of `kind` for `path`; `Ok(None)` until all
/// of it arrived, `Err` (a protocol error) for a reply to something else.
pub(super) fn read_stat_reply(
    inbox: &mut Inbox,
    kind: StatKind,
    path: &[u8],
) -> Result<Option<StatReply>, String> {
    let len = if kind == StatKind::LstatV1 {
        wire::STAT_V1_LEN
    } else {
        wire::STAT_V2_LEN
    };
    if inbox.len() < len {
        return Ok(None);
    }
    let bytes = inbox.take_vec(len);
    if kind == StatKind::LstatV1 {
        let (reply_id, stat) = StatV1::parse(&bytes).expect("a whole reply");
        if reply_id != kind.id() {
            return Err(unexpected_reply(kind, reply_id, path));
        }
        if stat == StatV1::default() {
            return Ok(Some(Err(StatFailure::Unknown)));
        }
        return Ok(Some(Ok(StatV2 {
            mode: stat.mode,
            size: u64::from(stat.size),
            mtime: i64::from(stat.mtime),
            ctime: i64::from(stat.mtime),
            ..StatV2::default()
        })));
    }
    let (reply_id, stat) = StatV2::parse(&bytes).expect("a whole reply");
    if reply_id != kind.id() {
        return Err(unexpected_reply(kind, reply_id, path));
    }
    if stat.error != 0 {
        return Ok(Some(Err(StatFailure::Errno(stat.error))));
    }
    Ok(Some(Ok(stat)))
}

fn unexpected_reply(kind: StatKind, got: u32, path: &[u8]) -> String {
    format!(
        "expected a {} reply for '{}', got {}",
        wire::id_name(kind.id()),
        String::from_utf8_lossy(path),
        wire::id_name(got)
    )
}

/// What the host read of a listing.
pub(super) enum ListItem {
    Entry(Dent),
    /// An entry the device could not `lstat` (`LIS2` says why); left out.
    Skipped,
    Done,
}

/// The host reading the next entry of a listing of `path`; `Ok(None)` until
/// all of it arrived.
pub(super) fn read_list_item(
    inbox: &mut Inbox,
    v2: bool,
    path: &[u8],
) -> Result<Option<ListItem>, String> {
    let (fixed, expected, name_at) = if v2 {
        (wire::DENT_V2_LEN, wire::ID_DENT_V2, 72)
    } else {
        (wire::DENT_V1_LEN, wire::ID_DENT_V1, 16)
    };
    let Some(header) = inbox.peek_header() else {
        return Ok(None);
    };
    let show = || String::from_utf8_lossy(path);
    if header.id == wire::ID_DONE {
        // A whole zeroed entry with the id DONE.
        if inbox.len() < fixed {
            return Ok(None);
        }
        inbox.consume(fixed);
        return Ok(Some(ListItem::Done));
    }
    if header.id != expected {
        return Err(format!(
            "listing '{}': expected {} or DONE, got {}",
            show(),
            wire::id_name(expected),
            wire::id_name(header.id)
        ));
    }
    if inbox.len() < fixed {
        return Ok(None);
    }
    let head = inbox.peek(fixed);
    let name_len = u32::from_le_bytes(head[name_at..name_at + 4].try_into().expect("4")) as usize;
    if name_len > MAX_NAME_LEN {
        return Err(format!(
            "listing '{}': entry name of {name_len} bytes",
            show()
        ));
    }
    if inbox.len() < fixed + name_len {
        return Ok(None);
    }
    let whole = inbox.take_vec(fixed + name_len);
    let parsed = if v2 {
        wire::parse_dent_v2(&whole)
    } else {
        wire::parse_dent_v1(&whole)
    };
    let (dent, _) = parsed.map_err(|e| e.to_string())?;
    if dent.stat.error != 0 {
        debug!(
            "sync: listing '{}': entry {:?}: {}",
            show(),
            String::from_utf8_lossy(&dent.name),
            io::Error::from_raw_os_error(dent.stat.error as i32)
        );
        return Ok(Some(ListItem::Skipped));
    }
    Ok(Some(ListItem::Entry(dent)))
}
