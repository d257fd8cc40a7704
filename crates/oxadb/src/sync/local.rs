//! The local file system side: walking a tree to push, and what a pulled file
//! is given (the files themselves are written by `oxadb-transfer`, under
//! `Policy::HOST`). Everything here blocks; callers run it on a blocking thread.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use oxadb_transfer::{Attributes, Policy};

use super::{describe_io, join_remote};

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

/// Mode and time to give a pulled file (`pull -a`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PulledAttributes {
    pub mode: u32,
    pub mtime: i64,
}

/// What a pulled file becomes locally besides its data.
pub(crate) struct Landing {
    /// The device's mode and mtime (`-a`), else `Policy::HOST`'s defaults.
    pub attributes: Option<PulledAttributes>,
    /// How it is flushed and where its directory is journalled.
    pub storage: oxadb_transfer::Storage,
}

/// What a pulled file's destination gets on commit: with `-a` the device's
/// mode and mtime, else `Policy::HOST`'s default mode (adb's 0644 minus the umask).
pub(crate) fn commit_attributes(attributes: Option<PulledAttributes>) -> Attributes {
    match attributes {
        Some(attributes) => Attributes {
            mode: Some(attributes.mode),
            mtime: Some(attributes.mtime),
        },
        None => Attributes::default(),
    }
}

/// Removes every temporary pull file still in progress; for signal handlers
/// that end the process (the journal that would have found them can then be
/// closed). Returns how many were removed.
pub fn remove_unfinished_pulls() -> usize {
    Policy::HOST.remove_unfinished()
}

/// The local path for a name received from the device, refusing names that
/// could escape the directory (`/` inside, `.`, `..`, empty) and names no
/// file here can have (a NUL inside: the path would end there).
pub(crate) fn child_path(dir: &Path, name: &[u8]) -> Option<PathBuf> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
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
        assert_eq!(child_path(dir, b"a\0b"), None);
    }
}
