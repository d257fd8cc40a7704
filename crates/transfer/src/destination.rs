//! Where a received file is written: atomically through a temporary file
//! renamed over the destination, or in place when the destination cannot be
//! replaced (a device node, a FIFO, a kernel interface file).

use std::fs::{self, File, FileTimes, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tracing::{debug, warn};

use crate::dest_error::{DestError, Step};
use crate::durable::{sync_dirs, sync_file, sync_in_place, Durability};
use crate::temp::{create_beside, TempEntry};
use crate::{is_special, on_kernel_interface_fs, Policy, Storage};

/// How a finished file gets its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeRule {
    /// Exactly `mode & 0o7777`, applied with `fchmod` after the data so the
    /// umask cannot change it; `mode & 0o777` when the special bits are not
    /// ours to set (EPERM). Failures are only logged: adbd ignores fchmod
    /// errors (`daemon/file_sync_service.cpp`), not every filesystem has it.
    /// Times that cannot be set are logged too.
    Exact,
    /// `mode & 0o7777` (or `default` when no mode is given) minus the process
    /// umask, as adb gives pulled files (`client/file_sync_client.cpp`).
    /// Failures are errors.
    MinusUmask { default: u32 },
}

/// The mode and time to give a finished file. Fields left `None` are left
/// alone (but a replaced file under [`ModeRule::MinusUmask`] always gets its
/// default mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attributes {
    pub mode: Option<u32>,
    /// Seconds since the epoch; atime is set to the same value (adbd and adb
    /// both set the pair).
    pub mtime: Option<i64>,
}

enum Kind {
    /// A temporary file beside the destination, renamed over it once complete.
    Replace { temp: TempEntry, file: File },
    /// An existing destination that is not a regular file (a device node, a
    /// FIFO) or a kernel interface file: written in place, never replaced,
    /// chmod'ed, retimed or removed.
    InPlace { file: File },
    /// An existing regular file in a directory we may not create files in
    /// (but the file is writable): rewritten in place from its start and cut
    /// to the new length on commit. Not atomic, but the only way
    /// ([`Policy::overwrite_if_dir_unwritable`]); [`Destination::reserve`]
    /// keeps a full disk from touching it.
    Overwrite { file: File },
}

/// A file being received. Dropping it without [`Destination::commit`]
/// discards a temporary file and leaves an existing destination untouched.
pub struct Destination {
    path: PathBuf,
    policy: Policy,
    /// How far [`Destination::commit`] flushes.
    durability: Durability,
    kind: Kind,
}

impl Destination {
    /// Prepares to write `path` under `policy`, stored as `storage` says. A
    /// FIFO blocks here until it has a reader, as with adbd and adb.
    pub fn open(path: &Path, policy: &Policy, storage: &Storage) -> Result<Destination, DestError> {
        let existing = if policy.follow_symlinks {
            fs::metadata(path)
        } else {
            fs::symlink_metadata(path)
        };
        let in_place = match existing {
            Ok(md) if md.is_dir() => {
                return Err(DestError::new(
                    Step::Create,
                    io::Error::from_raw_os_error(libc::EISDIR),
                ))
            }
            Ok(md) if is_special(&md) => true,
            // procfs/sysfs files can't get a sibling temp file; adbd writes them in place.
            Ok(md) => md.is_file() && policy.in_place_on_kernel_fs && on_kernel_interface_fs(path),
            Err(_) => false,
        };
        let kind = if in_place {
            let file = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOCTTY)
                .open(path)
                .map_err(|e| DestError::new(Step::OpenInPlace, e))?;
            Kind::InPlace { file }
        } else {
            Self::create_temp(path, policy, storage)?
        };
        Ok(Destination {
            path: path.to_path_buf(),
            policy: *policy,
            durability: storage.durability,
            kind,
        })
    }

    fn create_temp(path: &Path, policy: &Policy, storage: &Storage) -> Result<Kind, DestError> {
        let created = create_beside(path, policy, storage, |candidate| {
            // Readable too: a delta reads back what it built before the
            // rename (oxadbd's services/delta.rs).
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(candidate)
        });
        match created {
            Ok((temp, file)) => Ok(Kind::Replace { temp, file }),
            Err(DestError {
                step: Step::Create,
                error,
            }) if policy.overwrite_if_dir_unwritable
                && matches!(error.raw_os_error(), Some(libc::EACCES | libc::EPERM)) =>
            {
                if !fs::metadata(path).is_ok_and(|m| m.is_file()) {
                    return Err(DestError::new(Step::Create, error));
                }
                // Not truncated here: the old content stays until the data
                // overwrites it, after `reserve` made sure it fits.
                let file = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|_| DestError::new(Step::Create, error))?;
                Ok(Kind::Overwrite { file })
            }
            Err(e) => Err(e),
        }
    }

    /// The file the data goes to (the temporary file when replacing). Exposed
    /// so that a zero-copy path can `splice` into its descriptor directly.
    pub fn file(&self) -> &File {
        match &self.kind {
            Kind::Replace { file, .. } | Kind::InPlace { file } | Kind::Overwrite { file } => file,
        }
    }

    /// The destination path (not the temporary one).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the data goes into a regular file (a temporary one or, rarely,
    /// the destination itself), whose writes never wait on another process.
    pub fn is_regular_file(&self) -> bool {
        !matches!(self.kind, Kind::InPlace { .. })
    }

    /// Makes sure `len` bytes of new content fit before any of an existing
    /// destination that is overwritten in place ([`Policy::overwrite_if_dir_unwritable`])
    /// is touched, so a full disk or a quota fails the transfer with the old
    /// content intact. Nothing to do for the other kinds: a temporary file
    /// leaves the destination alone anyway, and a device has no space to take.
    pub fn reserve(&self, len: u64) -> Result<(), DestError> {
        match &self.kind {
            Kind::Overwrite { file } => {
                reserve_space(file, len).map_err(|e| DestError::new(Step::Write, e))
            }
            Kind::Replace { .. } | Kind::InPlace { .. } => Ok(()),
        }
    }

    /// Whether the destination is replaced atomically on commit.
    pub fn is_atomic(&self) -> bool {
        matches!(self.kind, Kind::Replace { .. })
    }

    /// Gives a complete file its attributes and, when replacing, renames it
    /// into place, flushed to storage as the durability it was opened with
    /// says: under [`Durability::Full`] the file is fsynced, renamed, and its
    /// directory (with any made for it) fsynced before this returns; under
    /// [`Durability::Rename`] the directory is not; under
    /// [`Durability::None`] nothing is flushed. On failure the temporary
    /// file is removed.
    pub fn commit(self, attributes: Attributes) -> Result<(), DestError> {
        let Destination {
            path,
            policy,
            durability,
            kind,
        } = self;
        let flush_failed = |e| DestError::new(Step::SyncFile, e);
        match kind {
            Kind::InPlace { file } => sync_in_place(&file, &path, durability).map_err(flush_failed),
            Kind::Overwrite { file } => {
                // Opened without truncation: cut what the old content had beyond the new.
                io::Seek::stream_position(&mut &file)
                    .and_then(|end| file.set_len(end))
                    .map_err(|e| DestError::new(Step::Write, e))?;
                apply(&file, &path, &policy, attributes, false)?;
                sync_file(&file, &path, durability).map_err(flush_failed)
            }
            Kind::Replace { temp, file } => {
                apply(&file, &path, &policy, attributes, true)?;
                // The data before the name: a rename that reaches storage first
                // would leave an empty file after a power cut.
                sync_file(&file, temp.path(), durability).map_err(flush_failed)?;
                drop(file);
                let changed_dirs = temp.changed_dirs().to_vec();
                match temp.rename_over(&path) {
                    Ok(()) => sync_dirs(&changed_dirs, durability)
                        .map_err(|(dir, e)| DestError::new(Step::SyncDir(dir), e)),
                    // A mount point (say a bind-mounted /etc/hosts) can't be renamed
                    // over; adbd would write it in place, so copy the finished file into it.
                    Err((temp, e))
                        if policy.copy_when_busy && e.raw_os_error() == Some(libc::EBUSY) =>
                    {
                        debug!("sync: '{}' is busy ({e}); copying in place", path.display());
                        let copied = copy_into_busy(temp.path(), &path)
                            .map_err(|e| DestError::new(Step::Write, e))?;
                        if let Some(mtime) = attributes.mtime {
                            if let Err(e) = set_times_at(&path, mtime, true) {
                                warn!("sync: couldn't set the mtime of '{}': {e}", path.display());
                            }
                        }
                        // Its name did not change: only the copied data needs flushing.
                        sync_in_place(&copied, &path, durability).map_err(flush_failed)
                    }
                    Err((_, e)) => Err(DestError::new(Step::Replace, e)),
                }
            }
        }
    }
}

/// Copies the finished file `from` into the busy destination `to` (a mount
/// point) without truncating it first: the space for the new content is
/// reserved (`fallocate`, `FALLOC_FL_KEEP_SIZE`) before a byte is
/// overwritten, so a full disk or a quota (ENOSPC, EDQUOT) fails the push
/// with the old content intact. Returns the destination, open for flushing.
fn copy_into_busy(from: &Path, to: &Path) -> io::Result<File> {
    let mut source = File::open(from)?;
    let len = source.metadata()?.len();
    let destination = OpenOptions::new().write(true).open(to)?;
    reserve_space(&destination, len)?;
    io::copy(&mut source, &mut &destination)?;
    destination.set_len(len)?;
    Ok(destination)
}

/// Allocates `len` bytes from the start of `file` without changing its size
/// or content (`fallocate`, `FALLOC_FL_KEEP_SIZE`), so that overwriting it
/// with that much cannot fail for want of space.
fn reserve_space(file: &File, len: u64) -> io::Result<()> {
    use rustix::fs::{fallocate, FallocateFlags};
    use rustix::io::Errno;
    if len == 0 {
        return Ok(());
    }
    let old_len = file.metadata()?.len();
    match fallocate(file, FallocateFlags::KEEP_SIZE, 0, len) {
        Ok(()) => Ok(()),
        // Filesystems without fallocate are written without the guarantee.
        Err(Errno::OPNOTSUPP | Errno::NOSYS) => Ok(()),
        Err(e) => {
            // Give back what a partial reservation took past the end.
            let _ = file.set_len(old_len);
            Err(e.into())
        }
    }
}

/// Applies `attributes` under the policy's [`ModeRule`]; `replaced` says the
/// file is new, so a default mode applies.
fn apply(
    file: &File,
    path: &Path,
    policy: &Policy,
    attributes: Attributes,
    replaced: bool,
) -> Result<(), DestError> {
    match policy.mode {
        ModeRule::Exact => {
            if let Some(mode) = attributes.mode {
                apply_exact_mode(file, mode, path);
            }
            if let Some(mtime) = attributes.mtime {
                if let Err(e) = file.set_times(times(mtime)) {
                    warn!("sync: couldn't set the mtime of '{}': {e}", path.display());
                }
            }
            Ok(())
        }
        ModeRule::MinusUmask { default } => {
            let mode = match attributes.mode {
                Some(mode) => Some(mode & 0o7777),
                None if replaced => Some(default),
                None => None,
            };
            if let Some(mode) = mode {
                file.set_permissions(fs::Permissions::from_mode(mode & !process_umask()))
                    .map_err(|e| DestError::new(Step::Attributes, e))?;
            }
            if let Some(mtime) = attributes.mtime {
                file.set_times(times(mtime))
                    .map_err(|e| DestError::new(Step::Attributes, e))?;
            }
            Ok(())
        }
    }
}

/// [`ModeRule::Exact`]: exactly `mode & 0o7777`, or `mode & 0o777` when the
/// special bits are not ours to set. (Google's adbd copies the owner bits to
/// group and other, turning 0751 into 0777; we keep 0751.)
fn apply_exact_mode(file: &File, mode: u32, path: &Path) {
    let wanted = mode & 0o7777;
    match file.set_permissions(fs::Permissions::from_mode(wanted)) {
        Ok(()) => {
            // Linux may silently drop setgid instead of failing; say so.
            if let Ok(md) = file.metadata() {
                if md.mode() & 0o7777 != wanted {
                    warn!(
                        "sync: '{}' got mode {:o} instead of {wanted:o}",
                        path.display(),
                        md.mode() & 0o7777
                    );
                }
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && wanted & 0o7000 != 0 => {
            let fallback = wanted & 0o777;
            warn!(
                "sync: may not set mode {wanted:o} on '{}' ({e}); using {fallback:o}",
                path.display()
            );
            if let Err(e) = file.set_permissions(fs::Permissions::from_mode(fallback)) {
                warn!("sync: couldn't chmod '{}': {e}", path.display());
            }
        }
        Err(e) => warn!(
            "sync: couldn't chmod '{}' to {wanted:o}: {e}",
            path.display()
        ),
    }
}

/// This process's umask (read once). A cache of the kernel's own
/// per-process value, not a setting of ours: it saves a /proc read per file,
/// and nothing in the workspace changes the umask after start.
pub fn process_umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(read_umask)
}

/// The umask, read without changing it (`/proc/self/status`), else by the
/// set-and-restore dance.
fn read_umask() -> u32 {
    if let Ok(status) = fs::read_to_string("/proc/self/status") {
        for line in status.lines() {
            if let Some(value) = line.strip_prefix("Umask:") {
                if let Ok(mask) = u32::from_str_radix(value.trim(), 8) {
                    return mask;
                }
            }
        }
    }
    let mask = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    rustix::process::umask(mask);
    mask.as_raw_mode()
}

fn unix_time(seconds: i64) -> SystemTime {
    if seconds >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds as u64)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs())
    }
}

fn times(mtime: i64) -> FileTimes {
    let when = unix_time(mtime);
    FileTimes::new().set_accessed(when).set_modified(when)
}

/// Sets atime and mtime of `path` to `mtime`; `follow: false` retimes a
/// symlink itself (`AT_SYMLINK_NOFOLLOW`, the `fixed_push_symlink_timestamp`
/// feature of `daemon/file_sync_service.cpp`).
pub fn set_times_at(path: &Path, mtime: i64, follow: bool) -> io::Result<()> {
    let when = rustix::fs::Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    let times = rustix::fs::Timestamps {
        last_access: when,
        last_modification: when,
    };
    let flags = if follow {
        rustix::fs::AtFlags::empty()
    } else {
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW
    };
    rustix::fs::utimensat(rustix::fs::CWD, path, &times, flags)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn umask_is_read() {
        let mask = process_umask();
        assert_eq!(mask & !0o777, 0);
    }

    #[test]
    fn copy_into_busy_replaces_longer_and_shorter_content_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        for (old, new) in [
            (&b"a much longer old content"[..], &b"short"[..]),
            (b"x", b"longer"),
        ] {
            fs::write(&to, old).unwrap();
            fs::write(&from, new).unwrap();
            copy_into_busy(&from, &to).unwrap();
            assert_eq!(fs::read(&to).unwrap(), new);
        }
        fs::write(&from, b"").unwrap();
        copy_into_busy(&from, &to).unwrap();
        assert_eq!(fs::read(&to).unwrap(), b"");
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replace_is_atomic_and_dropping_discards() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        fs::write(&dest, b"old").unwrap();
        for policy in [Policy::DAEMON, Policy::HOST] {
            let target = Destination::open(&dest, &policy, &Storage::default()).unwrap();
            assert!(target.is_atomic() && target.is_regular_file());
            target.file().write_all(b"new").unwrap();
            assert_eq!(fs::read(&dest).unwrap(), b"old");
            drop(target);
            assert_eq!(entries(dir.path()), ["f"]);
        }
        let target = Destination::open(&dest, &Policy::DAEMON, &Storage::default()).unwrap();
        target.file().write_all(b"new").unwrap();
        target
            .commit(Attributes {
                mode: Some(0o640),
                mtime: Some(1_234_567_890),
            })
            .unwrap();
        let md = fs::metadata(&dest).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"new");
        assert_eq!((md.mode() & 0o7777, md.mtime()), (0o640, 1_234_567_890));
        assert_eq!(entries(dir.path()), ["f"]);
    }

    #[test]
    fn host_pull_gets_default_mode_minus_umask() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("pulled");
        Destination::open(&dest, &Policy::HOST, &Storage::default())
            .unwrap()
            .commit(Attributes::default())
            .unwrap();
        let mode = fs::metadata(&dest).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o644 & !process_umask());
    }

    #[test]
    fn directories_and_special_files() {
        let dir = tempfile::tempdir().unwrap();
        for policy in [Policy::DAEMON, Policy::HOST] {
            let err = Destination::open(dir.path(), &policy, &Storage::default())
                .err()
                .unwrap();
            assert_eq!(err.step, Step::Create);
            assert_eq!(err.error.raw_os_error(), Some(libc::EISDIR));
        }
        // A character device is written in place (/dev/zero discards writes).
        let target =
            Destination::open(Path::new("/dev/zero"), &Policy::HOST, &Storage::default()).unwrap();
        assert!(!target.is_regular_file() && !target.is_atomic());
        drop(target);
        assert!(fs::metadata("/dev/zero")
            .unwrap()
            .file_type()
            .is_char_device());
    }

    #[test]
    fn missing_parents_only_where_the_policy_says() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("a/b/f");
        let err = Destination::open(&dest, &Policy::HOST, &Storage::default())
            .err()
            .unwrap();
        assert_eq!(err.error.kind(), io::ErrorKind::NotFound);
        Destination::open(&dest, &Policy::DAEMON, &Storage::default())
            .unwrap()
            .commit(Attributes::default())
            .unwrap();
        assert!(dest.is_file());
    }

    use crate::durable::{take_events, Event};

    /// The steps of committing `dest` (which gets "new") under `durability`.
    fn commit_steps(dest: &Path, durability: Durability) -> Vec<Event> {
        let storage = Storage {
            durability,
            journal: None,
        };
        let target = Destination::open(dest, &Policy::DAEMON, &storage).unwrap();
        target.file().write_all(b"new").unwrap();
        take_events();
        target.commit(Attributes::default()).unwrap();
        assert_eq!(fs::read(dest).unwrap(), b"new");
        take_events()
    }

    #[test]
    fn full_syncs_the_file_then_renames_then_syncs_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        fs::write(&dest, b"old").unwrap();
        let steps = commit_steps(&dest, Durability::Full);
        let [Event::SyncFile(temp), Event::Rename { to }, Event::SyncDir(synced)] = &steps[..]
        else {
            panic!("expected fsync(file), rename, fsync(dir); got {steps:?}");
        };
        assert!(temp
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(".oxadb-push."));
        assert_eq!((to, synced), (&dest, &dir.path().to_path_buf()));
    }

    #[test]
    fn rename_level_syncs_only_the_file_and_none_syncs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        let steps = commit_steps(&dest, Durability::Rename);
        assert!(
            matches!(&steps[..], [Event::SyncFile(_), Event::Rename { .. }]),
            "{steps:?}"
        );
        let steps = commit_steps(&dest, Durability::None);
        assert!(matches!(&steps[..], [Event::Rename { .. }]), "{steps:?}");
    }

    #[test]
    fn directories_made_for_a_file_are_synced_into_their_parents_once() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("a/b/f");
        let steps = commit_steps(&dest, Durability::Full);
        let synced: Vec<_> = steps
            .iter()
            .filter_map(|e| match e {
                Event::SyncDir(d) => Some(d.clone()),
                _ => None,
            })
            .collect();
        let root = dir.path();
        assert_eq!(
            synced,
            [root.join("a/b"), root.join("a"), root.to_path_buf()]
        );
        assert!(
            matches!(steps[..2], [Event::SyncFile(_), Event::Rename { .. }]),
            "{steps:?}"
        );
    }

    #[test]
    fn in_place_destinations_are_synced_without_a_rename() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        fs::write(&dest, b"old").unwrap();
        // The host's overwrite of a file in a directory it may not add to.
        let file = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&dest)
            .unwrap();
        let target = Destination {
            path: dest.clone(),
            policy: Policy::HOST,
            durability: Durability::Full,
            kind: Kind::Overwrite { file },
        };
        take_events();
        target.commit(Attributes::default()).unwrap();
        assert_eq!(take_events(), [Event::SyncFile(dest)]);
        // A character device can't be flushed (EINVAL): that is no failure.
        let full = Storage {
            durability: Durability::Full,
            journal: None,
        };
        let target = Destination::open(Path::new("/dev/zero"), &Policy::HOST, &full).unwrap();
        target.commit(Attributes::default()).unwrap();
        assert_eq!(take_events(), [Event::SyncFile("/dev/zero".into())]);
    }

    #[test]
    fn an_overwrite_keeps_the_old_content_until_written_and_is_cut_on_commit() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        fs::write(&dest, b"a longer old content").unwrap();
        let file = OpenOptions::new().write(true).open(&dest).unwrap();
        let target = Destination {
            path: dest.clone(),
            policy: Policy::HOST,
            durability: Durability::None,
            kind: Kind::Overwrite { file },
        };
        target.reserve(4).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"a longer old content");
        target.file().write_all(b"new!").unwrap();
        target.commit(Attributes::default()).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"new!");
    }

    use std::os::unix::fs::FileTypeExt;
}
