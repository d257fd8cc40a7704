//! How far a received file is flushed to storage before the peer is told it
//! arrived: the one implementation of "file fsync, rename, directory fsync"
//! that the daemon's pushes and the host's pulls share.
//!
//! Why all three steps: a rename is a metadata operation that journaling
//! filesystems may commit before the data blocks of the renamed file are
//! allocated (delayed allocation). After a power cut the destination can then
//! be empty or truncated on xfs, f2fs, ubifs and ext4 mounted with
//! `noauto_da_alloc` (ext4's default `auto_da_alloc` flushes on
//! rename-over-existing only, and not for a new name). Fsyncing the file
//! before the rename closes that gap; fsyncing the directory afterwards makes
//! the rename itself (the new directory entry) persistent, as fsync(2) says a
//! file's fsync does not.

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tracing::debug;

/// How much of a finished file reaches storage before it is reported done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// fsync the file, rename it into place, fsync its directory, then report:
    /// after a power cut the destination has the new content.
    #[default]
    Full,
    /// fsync the file before the rename, no directory fsync: after a power
    /// cut the destination has the new content or the old, never an empty or
    /// partial file, but the rename itself may be lost.
    Rename,
    /// No flush (what Android's adbd and adb do): the kernel writes back when
    /// it likes, and a power cut soon after may leave an empty destination.
    None,
}

impl Durability {
    /// The name `--durability` and the `durability` key take.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Full => "full",
            Durability::Rename => "rename",
            Durability::None => "none",
        }
    }

    fn syncs_file(self) -> bool {
        self != Durability::None
    }

    fn syncs_dir(self) -> bool {
        self == Durability::Full
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "full" => Ok(Durability::Full),
            "rename" => Ok(Durability::Rename),
            "none" => Ok(Durability::None),
            other => Err(format!(
                "unknown durability '{other}' (expected full, rename or none)"
            )),
        }
    }
}

/// Flushes a finished file's data (and mode, times) before it is renamed into
/// place or reported, when `durability` asks for it.
pub(crate) fn sync_file(file: &File, path: &Path, durability: Durability) -> io::Result<()> {
    if !durability.syncs_file() {
        return Ok(());
    }
    debug!(path = %path.display(), "sync: fsync file");
    record(Event::SyncFile(path.to_path_buf()));
    file.sync_all()
}

/// Like [`sync_file`] for a destination written in place (a device node, a
/// FIFO, a kernel interface file): one that cannot be flushed (`EINVAL`, as a
/// FIFO or a character device answers) has nothing to lose.
pub(crate) fn sync_in_place(file: &File, path: &Path, durability: Durability) -> io::Result<()> {
    match sync_file(file, path, durability) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EROFS)) => {
            debug!(path = %path.display(), "sync: no fsync for this file: {e}");
            Ok(())
        }
        other => other,
    }
}

/// Makes the entries of `dirs` (each directory whose entries changed: the
/// destination's, and the parents of directories made for it) persistent.
/// On failure, the directory that failed and why.
pub fn sync_dirs(dirs: &[PathBuf], durability: Durability) -> Result<(), (PathBuf, io::Error)> {
    if !durability.syncs_dir() {
        return Ok(());
    }
    for dir in dirs {
        sync_dir(dir).map_err(|e| (dir.clone(), e))?;
    }
    Ok(())
}

/// fsync of a directory: its new or renamed entries reach storage.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    debug!(path = %dir.display(), "sync: fsync directory");
    record(Event::SyncDir(dir.to_path_buf()));
    let handle = File::open(dir)?;
    match handle.sync_all() {
        // Some filesystems (old FUSE ones, vboxsf) cannot fsync a directory;
        // their entries are then as durable as they get.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            debug!(path = %dir.display(), "sync: directory fsync unsupported: {e}");
            Ok(())
        }
        other => other,
    }
}

/// The directory holding `path`'s entry.
pub(crate) fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A storage step, recorded in tests so they can check the order.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    SyncFile(PathBuf),
    Rename { to: PathBuf },
    SyncDir(PathBuf),
}

#[cfg(test)]
thread_local! {
    static EVENTS: std::cell::RefCell<Vec<Event>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
pub(crate) fn record(event: Event) {
    EVENTS.with(|events| events.borrow_mut().push(event));
}

#[cfg(not(test))]
#[inline]
pub(crate) fn record(_event: Event) {}

/// The steps this thread recorded since the last call.
#[cfg(test)]
pub(crate) fn take_events() -> Vec<Event> {
    EVENTS.with(|events| std::mem::take(&mut *events.borrow_mut()))
}
