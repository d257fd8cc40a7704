//! Temporary directory entries beside a destination, made under a name that
//! says who owns them and recorded in the journal until renamed into place.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use tracing::warn;

use crate::dest_error::{DestError, Step};
use crate::durable::{parent_dir, record, Event};
use crate::journal;
use crate::{Policy, Storage};

/// A temporary directory entry that is removed unless renamed into place.
#[derive(Debug)]
pub struct TempEntry {
    path: PathBuf,
    armed: bool,
    /// The directories whose entries this entry changes once renamed: its
    /// own, and the parents of directories made for it (deepest first).
    changed_dirs: Vec<PathBuf>,
}

impl TempEntry {
    fn new(path: PathBuf, changed_dirs: Vec<PathBuf>) -> TempEntry {
        journal::register(&path);
        TempEntry {
            path,
            armed: true,
            changed_dirs,
        }
    }

    /// The directories to fsync once the entry is renamed into place, so that
    /// the new name (and any directory made for it) survives a power cut.
    pub fn changed_dirs(&self) -> &[PathBuf] {
        &self.changed_dirs
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the entry over `destination`. On failure the entry comes back
    /// (still armed, so dropping it removes it) with the error.
    pub fn rename_over(mut self, destination: &Path) -> Result<(), (TempEntry, io::Error)> {
        record(Event::Rename {
            to: destination.to_path_buf(),
        });
        match fs::rename(&self.path, destination) {
            Ok(()) => {
                self.armed = false;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }
}

impl Drop for TempEntry {
    fn drop(&mut self) {
        journal::unregister(&self.path);
        if self.armed {
            match fs::remove_file(&self.path) {
                Ok(()) => {}
                // Gone already: on SIGINT or SIGTERM the unfinished entries
                // are removed before the command is dropped
                // (`journal::remove_unfinished`).
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => warn!("sync: couldn't remove '{}': {e}", self.path.display()),
            }
        }
    }
}

/// Creates a fresh temporary entry with `create` in `destination`'s directory
/// (so the final rename is atomic), named `<prefix><pid>.<n>`, its directory
/// recorded first in `storage`'s journal. With `policy.parent_dir_mode`
/// missing parent directories are made on `ENOENT`.
pub fn create_beside<T>(
    destination: &Path,
    policy: &Policy,
    storage: &Storage,
    mut create: impl FnMut(&Path) -> io::Result<T>,
) -> Result<(TempEntry, T), DestError> {
    let dir = parent_dir(destination);
    let mut changed_dirs = vec![dir.clone()];
    let mut made_parents = false;
    // Recorded before the entry exists, so a crash right after leaves nothing unknown.
    storage.note_dir(&dir, policy.temp_prefix);
    // The pid keeps names apart between processes and a random number within
    // one; `create` refuses an existing name (a leftover, or a rare draw of
    // the same number), and another is drawn.
    for _ in 0..64 {
        let name = format!(
            "{}{}.{}",
            policy.temp_prefix,
            std::process::id(),
            random_number().map_err(|e| DestError::new(Step::Create, e))?
        );
        let candidate = dir.join(name);
        match create(&candidate) {
            Ok(made) => return Ok((TempEntry::new(candidate, changed_dirs), made)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound && !made_parents => {
                let Some(mode) = policy.parent_dir_mode else {
                    return Err(DestError::new(Step::Create, e));
                };
                // Each directory made gets an entry in its parent: up to the first that exists.
                let mut missing = dir.as_path();
                while let Some(parent) = missing.parent().filter(|p| !p.as_os_str().is_empty()) {
                    changed_dirs.push(parent.to_path_buf());
                    if parent.exists() {
                        break;
                    }
                    missing = parent;
                }
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(mode)
                    .create(&dir)
                    .map_err(|e| DestError::new(Step::CreateDir(dir.clone()), e))?;
                made_parents = true;
            }
            Err(e) => return Err(DestError::new(Step::Create, e)),
        }
    }
    Err(DestError::new(
        Step::Create,
        io::Error::from(io::ErrorKind::AlreadyExists),
    ))
}

/// A random number for a temporary name (its digits are what the sweep
/// expects after the pid).
fn random_number() -> io::Result<u32> {
    let mut bytes = [0; 4];
    getrandom::getrandom(&mut bytes).map_err(io::Error::other)?;
    Ok(u32::from_ne_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_unfinished_takes_only_its_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("d");
        // Prefixes of their own: other tests of this process have temporary files too.
        let a = Policy {
            temp_prefix: ".oxadb-test-a.",
            ..Policy::DAEMON
        };
        let b = Policy {
            temp_prefix: ".oxadb-test-b.",
            ..Policy::HOST
        };
        let (push, ()) =
            create_beside(&dest, &a, &Storage::default(), |p| fs::write(p, b"x")).unwrap();
        let (pull, ()) =
            create_beside(&dest, &b, &Storage::default(), |p| fs::write(p, b"y")).unwrap();
        assert_eq!(a.remove_unfinished(), 1);
        assert!(!push.path().exists());
        assert!(pull.path().exists());
        drop(pull);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        drop(push);
    }

    #[test]
    fn a_taken_name_is_passed_over_and_names_say_their_owner() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("d");
        let policy = Policy {
            temp_prefix: ".oxadb-test-clash.",
            ..Policy::DAEMON
        };
        let mut tries = 0;
        let (entry, ()) = create_beside(&dest, &policy, &Storage::default(), |p| {
            tries += 1;
            if tries < 3 {
                return Err(io::Error::from(io::ErrorKind::AlreadyExists));
            }
            fs::write(p, b"x")
        })
        .unwrap();
        assert_eq!(tries, 3);
        let name = entry.path().file_name().unwrap().to_str().unwrap();
        let rest = name.strip_prefix(policy.temp_prefix).unwrap();
        let (pid, number) = rest.split_once('.').unwrap();
        assert_eq!(pid, std::process::id().to_string());
        assert!(number.parse::<u32>().is_ok(), "{name}");
    }
}
