//! `STAT`, `LST2`, `STA2`, `LIST` and `LIS2`: answered as adbd's
//! `daemon/file_sync_service.cpp` does (`do_lstat_v1`, `do_stat_v2`, `do_list`).

use std::ffi::OsStr;
use std::fs::{self, Metadata, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use oxadb_io::{ReadChunk, WriteChunk};
use oxadb_wire::sync::{self as wire, StatV1, StatV2};
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::debug;

use super::{Conn, Flow, SyncError};

impl<S: AsyncRead + AsyncWrite + ReadChunk + WriteChunk + Unpin + Send> Conn<S> {
    // ----- STAT, LST2, STA2 -----

    /// `STAT`: adbd answers with `lstat` and all-zero fields when it fails.
    pub(super) async fn lstat_v1(&mut self, path: &Path) -> Result<Flow, SyncError> {
        let stat = match tokio::fs::symlink_metadata(path).await {
            // v1 fields are 32-bit on the wire; adbd truncates the same way.
            Ok(md) => StatV1 {
                mode: md.mode(),
                size: md.size() as u32,
                mtime: md.mtime() as u32,
            },
            Err(e) => {
                debug!("sync: lstat '{}': {e}", path.display());
                StatV1::default()
            }
        };
        self.send(&stat.encode()).await?;
        Ok(Flow::Continue)
    }

    /// `STA2` follows symlinks, `LST2` does not; failures carry the errno.
    pub(super) async fn stat_v2(&mut self, id: u32, path: &Path) -> Result<Flow, SyncError> {
        let result = if id == wire::ID_STAT_V2 {
            tokio::fs::metadata(path).await
        } else {
            tokio::fs::symlink_metadata(path).await
        };
        let stat = match result {
            Ok(md) => stat_v2_of(&md),
            Err(e) => {
                debug!("sync: {} '{}': {e}", wire::id_name(id), path.display());
                stat_v2_error(&e)
            }
        };
        self.send(&stat.encode(id)).await?;
        Ok(Flow::Continue)
    }

    // ----- LIST, LIS2 -----

    pub(super) async fn list(&mut self, dir: PathBuf, v2: bool) -> Result<Flow, SyncError> {
        let reply = tokio::task::spawn_blocking(move || list_reply(&dir, v2))
            .await
            .map_err(|e| SyncError::Io(io::Error::other(e)))?;
        self.send(&reply).await?;
        Ok(Flow::Continue)
    }
}

pub(super) fn stat_v2_of(md: &Metadata) -> StatV2 {
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

/// Builds the whole `LIST`/`LIS2` reply. Like adbd: every `readdir` entry including
/// `.` and `..`, each `lstat`ed; v1 skips entries whose `lstat` fails, v2 reports the
/// errno; an unreadable directory is just an empty listing.
fn list_reply(dir: &Path, v2: bool) -> Vec<u8> {
    let mut out = Vec::new();
    match directory_entry_names(dir) {
        Ok(names) => {
            for name in names {
                let entry_path = dir.join(OsStr::from_bytes(&name));
                let stat = match fs::symlink_metadata(&entry_path) {
                    Ok(md) => stat_v2_of(&md),
                    Err(_) if !v2 => continue,
                    Err(e) => stat_v2_error(&e),
                };
                if v2 {
                    wire::encode_dent_v2(&mut out, &stat, &name);
                } else {
                    // v1 fields are 32-bit on the wire.
                    wire::encode_dent_v1(
                        &mut out,
                        stat.mode,
                        stat.size as u32,
                        stat.mtime as u32,
                        &name,
                    );
                }
            }
        }
        Err(e) => debug!("sync: can't list '{}': {e}", dir.display()),
    }
    if v2 {
        out.extend_from_slice(&wire::encode_dent_v2_done());
    } else {
        out.extend_from_slice(&wire::encode_dent_v1_done());
    }
    out
}

/// Names from `readdir`, stopping quietly at the first error as adbd's loop does.
fn directory_entry_names(dir: &Path) -> io::Result<Vec<Vec<u8>>> {
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?;
    let mut entries = rustix::fs::Dir::new(handle)?;
    let mut names = Vec::new();
    while let Some(Ok(entry)) = entries.read() {
        names.push(entry.file_name().to_bytes().to_vec());
    }
    Ok(names)
}
