//! `STAT`, `LST2`, `STA2`, `LIST` and `LIS2`: the daemon's replies, written
//! as adbd's `daemon/file_sync_service.cpp` writes them (`do_lstat_v1`,
//! `do_stat_v2`, `do_list`).

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use oxadb_wire::sync::{self as wire, StatV1, StatV2};
use tracing::debug;

use super::Outbox;

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
