//! The local file system side: walking a tree to push, and the files a pull
//! writes. Everything here blocks; callers run it on a blocking thread.

use std::ffi::OsStr;
use std::fs::{self, File, FileTimes, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use super::{describe_io, join_remote};

/// Prefix of the temporary files a pull writes before renaming them into place.
pub(crate) const PULL_TEMP_PREFIX: &str = ".oxadb-pull.";
/// Mode of files adb pulls without `-a` (before the umask).
const PULLED_FILE_MODE: u32 = 0o644;

/// What a pushed tree entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    File,
    Symlink,
    /// Neither a regular file, a directory nor a symlink: skipped, as adb does.
    Special,
}

/// A file (or symlink) of a local tree to push.
#[derive(Debug, Clone)]
pub(crate) struct LocalEntry {
    pub local: PathBuf,
    pub remote: Vec<u8>,
    /// Full `st_mode` from `lstat`.
    pub mode: u32,
    pub mtime: i64,
    pub size: u64,
    pub kind: EntryKind,
}

/// Lists the files under `local_dir` (depth first: a directory's files before
/// its subdirectories', names sorted), each with its remote path under
/// `remote_dir`. An unreadable root is an error; an unreadable subdirectory or
/// entry is reported in `warnings` and left out, as adb does.
pub(crate) fn build_push_list(
    local_dir: &Path,
    remote_dir: &[u8],
    warnings: &mut Vec<String>,
) -> Result<Vec<LocalEntry>, String> {
    let mut entries = Vec::new();
    list_dir(local_dir, remote_dir, &mut entries, warnings)
        .map_err(|e| format!("cannot open '{}': {}", local_dir.display(), describe_io(&e)))?;
    Ok(entries)
}

fn list_dir(
    local_dir: &Path,
    remote_dir: &[u8],
    entries: &mut Vec<LocalEntry>,
    warnings: &mut Vec<String>,
) -> io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(local_dir)?
        .filter_map(|entry| match entry {
            Ok(entry) => Some(entry.file_name()),
            Err(e) => {
                warnings.push(format!(
                    "cannot read '{}': {}",
                    local_dir.display(),
                    describe_io(&e)
                ));
                None
            }
        })
        .collect();
    names.sort();
    let mut subdirs = Vec::new();
    for name in names {
        let local = local_dir.join(&name);
        let remote = join_remote(remote_dir, name.as_bytes());
        let metadata = match fs::symlink_metadata(&local) {
            Ok(metadata) => metadata,
            Err(e) => {
                warnings.push(format!(
                    "cannot lstat '{}': {}",
                    local.display(),
                    describe_io(&e)
                ));
                continue;
            }
        };
        let file_type = metadata.file_type();
        if file_type.is_dir() {
            subdirs.push((local, remote));
            continue;
        }
        let kind = if file_type.is_file() {
            EntryKind::File
        } else if file_type.is_symlink() {
            EntryKind::Symlink
        } else {
            EntryKind::Special
        };
        entries.push(LocalEntry {
            local,
            remote,
            mode: metadata.mode(),
            mtime: metadata.mtime(),
            size: metadata.size(),
            kind,
        });
    }
    for (local, remote) in subdirs {
        if let Err(e) = list_dir(&local, &remote, entries, warnings) {
            warnings.push(format!(
                "cannot open '{}': {}",
                local.display(),
                describe_io(&e)
            ));
        }
    }
    Ok(())
}

/// The link target followed by the NUL adb sends with it.
pub(crate) fn symlink_payload(path: &Path) -> io::Result<Vec<u8>> {
    let mut target = fs::read_link(path)?.into_os_string().into_vec();
    target.push(0);
    Ok(target)
}

use std::os::unix::ffi::OsStringExt;

/// Mode and time to give a pulled file (`pull -a`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PulledAttributes {
    pub mode: u32,
    pub mtime: i64,
}

/// Where a pull writes.
pub(crate) enum PullTarget {
    /// A temporary file beside `dest`, renamed over it once complete.
    Replace {
        temp: PathBuf,
        dest: PathBuf,
        file: File,
    },
    /// An existing destination that is not a regular file (a device node, a
    /// FIFO): written in place, never replaced, chmod'ed or removed.
    InPlace { file: File },
    /// An existing regular file in a directory we may not create files in
    /// (but the file is writable): truncated and rewritten in place, as adb
    /// always does. Not atomic, but the only way.
    Overwrite { file: File },
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Temporary pull files not yet renamed into place or removed, so that an
/// interrupted process (Ctrl-C, SIGTERM) can remove them before it exits.
static UNFINISHED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

fn unfinished() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    UNFINISHED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn forget_unfinished(temp: &Path) {
    unfinished().retain(|p| p != temp);
}

/// Removes every temporary pull file still in progress; for signal handlers
/// that end the process. Returns how many were removed.
pub fn remove_unfinished_pulls() -> usize {
    let mut files = unfinished();
    let count = files.iter().filter(|p| fs::remove_file(p).is_ok()).count();
    files.clear();
    count
}

impl PullTarget {
    /// Prepares to write `dest`. A FIFO blocks here until it has a reader.
    pub(crate) fn open(dest: &Path) -> io::Result<PullTarget> {
        match fs::metadata(dest) {
            Ok(metadata) if metadata.is_dir() => {
                return Err(io::Error::from_raw_os_error(libc::EISDIR))
            }
            Ok(metadata) if !metadata.is_file() => {
                let file = OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NOCTTY)
                    .open(dest)?;
                return Ok(PullTarget::InPlace { file });
            }
            _ => {}
        }
        let dir = match dest.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        let pid = std::process::id();
        loop {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let temp = dir.join(format!("{PULL_TEMP_PREFIX}{pid}.{n}"));
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&temp)
            {
                Ok(file) => {
                    unfinished().push(temp.clone());
                    return Ok(PullTarget::Replace {
                        temp,
                        dest: dest.to_path_buf(),
                        file,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
                    let writable = fs::metadata(dest).is_ok_and(|m| m.is_file());
                    if !writable {
                        return Err(e);
                    }
                    let file = OpenOptions::new()
                        .write(true)
                        .truncate(true)
                        .custom_flags(libc::O_CLOEXEC)
                        .open(dest)
                        .map_err(|_| e)?;
                    return Ok(PullTarget::Overwrite { file });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether the data goes into a regular file (a temporary one or, rarely,
    /// the destination itself), whose writes never wait on another process.
    pub(crate) fn is_regular_file(&self) -> bool {
        !matches!(self, PullTarget::InPlace { .. })
    }

    pub(crate) fn file(&self) -> &File {
        match self {
            PullTarget::Replace { file, .. }
            | PullTarget::InPlace { file }
            | PullTarget::Overwrite { file } => file,
        }
    }

    /// Gives a complete temporary file its mode (and with `-a` its mtime) and
    /// renames it into place. Removes it if that fails.
    pub(crate) fn commit(self, attributes: Option<PulledAttributes>) -> io::Result<()> {
        match self {
            PullTarget::InPlace { .. } => Ok(()),
            PullTarget::Overwrite { file } => match attributes {
                Some(attributes) => apply_attributes(&file, Some(attributes)),
                None => Ok(()),
            },
            PullTarget::Replace { temp, dest, file } => {
                let result = apply_attributes(&file, attributes).and_then(|()| {
                    drop(file);
                    fs::rename(&temp, &dest)
                });
                if result.is_err() {
                    let _ = fs::remove_file(&temp);
                }
                forget_unfinished(&temp);
                result
            }
        }
    }

    /// Discards a temporary file; leaves an in-place destination alone.
    pub(crate) fn abort(self) {
        if let PullTarget::Replace { temp, file, .. } = self {
            drop(file);
            let _ = fs::remove_file(&temp);
            forget_unfinished(&temp);
        }
    }
}

/// The mode adb gives a pulled file (0644, or with `-a` the device's), minus
/// the umask, and with `-a` the device's mtime.
fn apply_attributes(file: &File, attributes: Option<PulledAttributes>) -> io::Result<()> {
    let umask = process_umask();
    let mode = match attributes {
        Some(attributes) => attributes.mode & 0o7777 & !umask,
        None => PULLED_FILE_MODE & !umask,
    };
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    if let Some(attributes) = attributes {
        let when = unix_time(attributes.mtime);
        file.set_times(FileTimes::new().set_accessed(when).set_modified(when))?;
    }
    Ok(())
}

fn unix_time(seconds: i64) -> SystemTime {
    if seconds >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds as u64)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs())
    }
}

/// This process's umask (read once).
pub(crate) fn process_umask() -> u32 {
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
    // SAFETY: umask has no memory-safety preconditions; the previous mask is restored.
    unsafe {
        let mask = libc::umask(0o022);
        libc::umask(mask);
        mask as u32
    }
}

/// The local path for a name received from the device, refusing names that
/// could escape the directory (`/` inside, `.`, `..`, empty).
pub(crate) fn child_path(dir: &Path, name: &[u8]) -> Option<PathBuf> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return None;
    }
    Some(dir.join(OsStr::from_bytes(name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn push_list_orders_files_before_subdirectories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("b/c")).unwrap();
        fs::write(root.join("z"), b"z").unwrap();
        fs::write(root.join("b/x"), b"xx").unwrap();
        fs::write(root.join("b/c/y"), b"y").unwrap();
        symlink("z", root.join("a-link")).unwrap();
        let mut warnings = Vec::new();
        let list = build_push_list(root, b"/r", &mut warnings).unwrap();
        let remotes: Vec<_> = list
            .iter()
            .map(|e| String::from_utf8(e.remote.clone()).unwrap())
            .collect();
        assert_eq!(remotes, ["/r/a-link", "/r/z", "/r/b/x", "/r/b/c/y"]);
        assert_eq!(list[0].kind, EntryKind::Symlink);
        assert_eq!(list[2].size, 2);
        assert!(warnings.is_empty());
        assert_eq!(symlink_payload(&root.join("a-link")).unwrap(), b"z\0");
        let err = build_push_list(&root.join("missing"), b"/r", &mut warnings).unwrap_err();
        assert!(
            err.contains("missing") && err.contains("No such file"),
            "{err}"
        );
    }

    #[test]
    fn child_paths_stay_inside() {
        let dir = Path::new("/tmp/x");
        assert_eq!(child_path(dir, b"a b"), Some(dir.join("a b")));
        assert_eq!(child_path(dir, b".."), None);
        assert_eq!(child_path(dir, b"a/../../b"), None);
        assert_eq!(child_path(dir, b""), None);
    }

    #[test]
    fn umask_is_read() {
        let mask = process_umask();
        assert_eq!(mask & !0o777, 0);
    }
}
