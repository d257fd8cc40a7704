//! `stat`s and listings on a [`SyncSession`]: `STA2`/`LST2` (or `STAT`,
//! following symlinks the way adb's fallback does), `LIS2` (or `LIST`),
//! and the pipelined `lstat`s of `push --sync`.

use oxadb_transfer::{ClientEvent, StatFailure};

use super::session::SyncSession;
use super::{show, strerror, RemoteEntry, RemoteStat};
use crate::error::{Error, Result};
use oxadb_transfer::MAX_UNACKED;

pub(crate) type StatReply = std::result::Result<RemoteStat, StatFailure>;

/// How a failed stat reads in messages.
pub(crate) trait Describe {
    fn describe(self) -> String;
}

impl Describe for StatFailure {
    fn describe(self) -> String {
        match self {
            StatFailure::Errno(errno) => strerror(errno as i32),
            StatFailure::Unknown => "does not exist".to_string(),
        }
    }
}

impl SyncSession {
    /// Metadata of `path`, following symlinks (`STA2`; with only `STAT`, a
    /// symlink is reported as a directory or a file of size 0, as adb does).
    pub async fn stat(&mut self, path: impl AsRef<[u8]>) -> Result<RemoteStat> {
        let path = path.as_ref();
        let reply = self.stat_follow(path).await?;
        reply.map_err(|failure| remote_error(path, failure))
    }

    /// Metadata of `path` itself (`LST2`, or `STAT` without `stat_v2`).
    pub async fn lstat(&mut self, path: impl AsRef<[u8]>) -> Result<RemoteStat> {
        let path = path.as_ref();
        let reply = self.lstat_raw(path).await?;
        reply.map_err(|failure| remote_error(path, failure))
    }

    /// The entries of directory `path` (`LIS2`, or `LIST` without `ls_v2`),
    /// `.` and `..` included. The device answers an unreadable or missing
    /// directory with an empty listing.
    pub async fn list(&mut self, path: impl AsRef<[u8]>) -> Result<Vec<RemoteEntry>> {
        let path = path.as_ref();
        self.settle().await?;
        self.client.list(path).map_err(|e| self.request_error(e))?;
        self.flush().await?;
        let mut entries = Vec::new();
        loop {
            match self.next_event().await? {
                ClientEvent::Entry(dent) => entries.push(RemoteEntry {
                    name: dent.name,
                    stat: RemoteStat::from_v2(&dent.stat),
                }),
                ClientEvent::ListDone => return Ok(entries),
                other => return Err(self.unexpected(&other)),
            }
        }
    }

    pub(crate) async fn lstat_raw(&mut self, path: &[u8]) -> Result<StatReply> {
        self.settle().await?;
        self.client.lstat(path).map_err(|e| self.request_error(e))?;
        self.flush().await?;
        self.read_stat_reply().await
    }

    /// `stat` following symlinks (`STA2`, or adb's fallback with `STAT`).
    pub(crate) async fn stat_follow(&mut self, path: &[u8]) -> Result<StatReply> {
        self.settle().await?;
        self.client.stat(path).map_err(|e| self.request_error(e))?;
        self.flush().await?;
        self.read_stat_reply().await
    }

    /// `lstat`s of many paths, pipelined in batches like adb's `--sync` check.
    pub(crate) async fn lstat_many(&mut self, paths: &[&[u8]]) -> Result<Vec<StatReply>> {
        self.settle().await?;
        let mut replies = Vec::with_capacity(paths.len());
        for batch in paths.chunks(MAX_UNACKED) {
            self.client
                .lstat_many(batch)
                .map_err(|e| self.request_error(e))?;
            self.flush().await?;
            for _ in batch {
                replies.push(self.read_stat_reply().await?);
            }
        }
        Ok(replies)
    }

    pub(super) async fn read_stat_reply(&mut self) -> Result<StatReply> {
        match self.next_event().await? {
            ClientEvent::Stat(reply) => Ok(reply.map(|stat| RemoteStat::from_v2(&stat))),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Whether `remote` has the size and mtime of the local file (`--sync`).
    pub(crate) async fn unchanged(
        &mut self,
        remote: &[u8],
        metadata: &std::fs::Metadata,
    ) -> Result<bool> {
        use std::os::unix::fs::MetadataExt;
        Ok(match self.lstat_raw(remote).await? {
            Ok(stat) => stat.size == metadata.size() && stat.mtime == metadata.mtime(),
            Err(_) => false,
        })
    }
}

fn remote_error(path: &[u8], failure: StatFailure) -> Error {
    Error::Remote {
        path: show(path).into_owned(),
        message: failure.describe(),
    }
}
