//! What this process has unfinished: its temporary entries not yet renamed
//! into place, in memory (so that a process told to stop removes them while
//! the threads writing them may still hold them), and the journal of the
//! directories that may hold them, on disk (so that a restarted process finds
//! what a killed one, SIGKILL or a power cut, left beside its destinations,
//! and removes it at start).
//!
//! Cheap by design: what is recorded is the *directory*, once per process, not
//! each temporary entry. A transfer into a directory already recorded costs
//! nothing more; a new directory costs one append (and one `fdatasync` unless
//! durability is `none`, since a power cut may keep the temporary entry and
//! lose an unsynced journal line). The entry's name says who owns it
//! (`<prefix><pid>.<n>`), so the sweep at start removes only entries whose
//! owner is no longer running.
//!
//! Each process appends to a file of its own, `pending-dirs.<pid>`, in the
//! state directory: several daemons, or the oxadb commands of one user
//! pulling at once, share one state directory without locking, and a sweep
//! never rewrites a live process's journal. A journal is removed once swept,
//! or when its process stops with nothing left unfinished.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rustix::fs::FlockOperation;
use tracing::{debug, warn};

use crate::durable::sync_dir;
use crate::state_dir::{make_state_dir, StateDirError};
use crate::Durability;

/// Journal file names: this prefix and the owning process's id.
const JOURNAL_PREFIX: &str = "pending-dirs.";

/// Temporary entries in progress, of every role this process plays. A static,
/// unlike everything else here, because the path that runs on SIGINT/SIGTERM
/// removes them, and a signal's handler cannot be handed a value.
static UNFINISHED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn unfinished() -> MutexGuard<'static, Vec<PathBuf>> {
    UNFINISHED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn has_prefix(path: &Path, prefix: &str) -> bool {
    path.file_name()
        .is_some_and(|name| name.as_encoded_bytes().starts_with(prefix.as_bytes()))
}

/// Notes a temporary entry just made; it stays unfinished until [`unregister`].
pub(crate) fn register(path: &Path) {
    unfinished().push(path.to_path_buf());
}

/// A temporary entry renamed into place or removed.
pub(crate) fn unregister(path: &Path) {
    unfinished().retain(|p| p != path);
}

/// Removes the unfinished entries whose names start with `prefix`.
pub(crate) fn remove_unfinished(prefix: &str) -> usize {
    let mut entries = unfinished();
    let mut removed = 0;
    entries.retain(|path| {
        if !has_prefix(path, prefix) {
            return true;
        }
        if fs::remove_file(path).is_ok() {
            removed += 1;
        }
        false
    });
    removed
}

/// Why the journal could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error(transparent)]
    StateDir(#[from] StateDirError),
    #[error("state directory '{}': {action}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("a journal is already open in this process ('{}')", .0.display())]
    AlreadyOpen(PathBuf),
}

/// What the sweep at start found.
#[derive(Debug, Default)]
pub struct Sweep {
    /// Leftover temporary entries removed (files, links or whole directories).
    pub removed: Vec<PathBuf>,
    /// Temporary entries kept because their owner still runs.
    pub kept: usize,
    /// Journals of dead processes read (and removed).
    pub journals: usize,
    /// Problems that did not stop the sweep (a directory that cannot be read):
    /// each names the path and the cause.
    pub problems: Vec<String>,
}

impl Sweep {
    /// The first `shown` removed paths, then how many more: a tree of
    /// leftovers would flood a log line.
    pub fn removed_list(&self, shown: usize) -> String {
        let mut names: Vec<String> = self
            .removed
            .iter()
            .take(shown)
            .map(|p| p.display().to_string())
            .collect();
        if self.removed.len() > names.len() {
            names.push(format!("and {} more", self.removed.len() - names.len()));
        }
        names.join(", ")
    }
}

/// This process's journal, owned by whoever opened it (the daemon at start,
/// an `oxadb pull`) and handed to what makes temporary entries through
/// [`Storage`](crate::Storage).
#[derive(Debug)]
pub struct Journal {
    /// This process's journal file, under an exclusive `flock` while open.
    path: PathBuf,
    prefix: &'static str,
    file: Mutex<File>,
    /// Directories already recorded by this process.
    recorded: Mutex<HashSet<PathBuf>>,
}

impl Journal {
    /// Sweeps `state_dir` (made if missing, mode 0700, and refused unless
    /// private: [`make_state_dir`]) for the journals of processes no longer
    /// running, removes the temporary entries named `<prefix><pid>.<n>` they
    /// point at whose owner is gone, and opens this process's journal. Must
    /// run before this process makes any temporary entry (a leftover carrying
    /// this process's id is taken for a dead namesake's), and only once per
    /// process: the journal's file is named by the process id.
    pub fn open(state_dir: &Path, prefix: &'static str) -> Result<(Journal, Sweep), JournalError> {
        let io_error = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| JournalError::Io {
                action,
                path,
                source,
            }
        };
        make_state_dir(state_dir)?;
        let me = std::process::id();
        let path = state_dir.join(format!("{JOURNAL_PREFIX}{me}"));
        // A second journal of this process would sweep the first's live
        // entries as a dead namesake's: the open one holds its file locked.
        if locked_by_open_journal(&path) {
            return Err(JournalError::AlreadyOpen(path));
        }
        let mut sweep = Sweep::default();
        let entries = fs::read_dir(state_dir).map_err(io_error("listing it", state_dir))?;
        for entry in entries {
            let entry = entry.map_err(io_error("listing it", state_dir))?;
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|name| name.strip_prefix(JOURNAL_PREFIX))
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            let path = entry.path();
            let Ok(md) = fs::symlink_metadata(&path) else {
                continue;
            };
            if pid != me && owner_runs(pid, &md) {
                continue;
            }
            sweep.journals += 1;
            if sweep_journal(&path, prefix, &mut sweep) {
                if let Err(e) = fs::remove_file(&path) {
                    sweep
                        .problems
                        .push(format!("couldn't remove journal '{}': {e}", path.display()));
                }
            }
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io_error("creating its journal", &path))?;
        // Held while the file is open: a lock belongs to the open file, so
        // even this process's own second `open` sees it, and a dead
        // namesake's died with it.
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Err(JournalError::AlreadyOpen(path)),
            Err(e) => return Err(io_error("locking its journal", &path)(e.into())),
        }
        // A namesake's journal swept above was removed; this one starts empty.
        file.set_len(0)
            .map_err(io_error("emptying its journal", &path))?;
        sync_dir(state_dir).map_err(io_error("syncing it", state_dir))?;
        let journal = Journal {
            path,
            prefix,
            file: Mutex::new(file),
            recorded: Mutex::new(HashSet::new()),
        };
        Ok((journal, sweep))
    }

    /// Removes this process's journal, for a process that stops: it would
    /// only cost the next start a sweep. Kept (false) while an entry of its
    /// prefix is unfinished: a thread may still hold it when the process
    /// ends, and only the journal says where it is.
    pub fn close(&self) -> bool {
        if unfinished()
            .iter()
            .any(|path| has_prefix(path, self.prefix))
        {
            return false;
        }
        match fs::remove_file(&self.path) {
            Ok(()) => true,
            Err(e) => {
                warn!("couldn't remove journal '{}': {e}", self.path.display());
                false
            }
        }
    }

    /// Records `dir` before a temporary entry named with `prefix` is made
    /// there, flushed unless `durability` is `none`. For another prefix
    /// nothing happens; a failure is logged and the transfer goes on.
    pub(crate) fn note_dir(&self, dir: &Path, prefix: &str, durability: Durability) {
        if self.prefix != prefix {
            return;
        }
        let dir = match std::path::absolute(dir) {
            Ok(dir) => dir,
            Err(e) => {
                warn!(
                    "journal: couldn't make '{}' absolute: {e}; a leftover there would not be found",
                    dir.display()
                );
                return;
            }
        };
        if self.recorded().contains(&dir) {
            return;
        }
        // One line per directory, NUL-terminated (a path may hold a newline);
        // the sweep ignores a torn last line.
        let mut line = dir.as_os_str().as_bytes().to_vec();
        line.push(0);
        let result = {
            let mut file = self
                .file
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            file.write_all(&line).and_then(|()| {
                if durability == Durability::None {
                    Ok(())
                } else {
                    file.sync_data()
                }
            })
        };
        match result {
            Ok(()) => {
                debug!(dir = %dir.display(), "journal: recorded");
                self.recorded().insert(dir);
            }
            Err(e) => warn!(
                "journal '{}': couldn't record '{}': {e}; a leftover there would not be found",
                self.path.display(),
                dir.display()
            ),
        }
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, HashSet<PathBuf>> {
        self.recorded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Whether an open [`Journal`] of this process holds `path` locked (a shared
/// lock cannot be had then). A file that cannot be opened is no open journal.
fn locked_by_open_journal(path: &Path) -> bool {
    let Ok(file) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    rustix::fs::flock(&file, FlockOperation::NonBlockingLockShared)
        == Err(rustix::io::Errno::WOULDBLOCK)
}

/// Sweeps the directories one dead process's journal names. False when a
/// directory could not be read (the journal is kept for a later start).
fn sweep_journal(journal: &Path, prefix: &str, sweep: &mut Sweep) -> bool {
    let bytes = match fs::read(journal) {
        Ok(bytes) => bytes,
        Err(e) => {
            sweep.problems.push(format!(
                "couldn't read journal '{}': {e}",
                journal.display()
            ));
            return false;
        }
    };
    let mut complete = true;
    let mut seen = HashSet::new();
    // The part after the last NUL is a line torn by a crash: its directory
    // never got a temporary entry (the line is written first).
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == 0).collect();
    lines.pop();
    for line in lines.into_iter().filter(|line| !line.is_empty()) {
        let dir = PathBuf::from(std::ffi::OsStr::from_bytes(line));
        if seen.insert(dir.clone()) {
            complete &= sweep_dir(&dir, prefix, sweep);
        }
    }
    complete
}

/// Removes the entries of `dir` named `<prefix><pid>.<n>` whose owner is gone.
fn sweep_dir(dir: &Path, prefix: &str, sweep: &mut Sweep) -> bool {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        // Removed since (or a made parent that never came to be): nothing to do.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
        Err(e) => {
            sweep
                .problems
                .push(format!("couldn't list '{}': {e}", dir.display()));
            return false;
        }
    };
    let me = std::process::id();
    let mut complete = true;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = temp_owner(name.as_bytes(), prefix) else {
            continue;
        };
        let path = entry.path();
        let Ok(md) = fs::symlink_metadata(&path) else {
            continue;
        };
        if pid != me && owner_runs(pid, &md) {
            sweep.kept += 1;
            continue;
        }
        // Not followed: a temporary link is removed itself, a temporary
        // directory (an atomic directory push) with all it holds.
        let removed = if md.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match removed {
            Ok(()) => sweep.removed.push(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                complete = false;
                sweep
                    .problems
                    .push(format!("couldn't remove '{}': {e}", path.display()));
            }
        }
    }
    complete
}

/// The process id in a temporary entry's name `<prefix><pid>.<n>`.
fn temp_owner(name: &[u8], prefix: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix.as_bytes())?;
    let dot = rest.iter().position(|&b| b == b'.')?;
    let (pid, n) = (&rest[..dot], &rest[dot + 1..]);
    if n.is_empty() || !n.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(pid).ok()?.parse().ok()
}

/// Whether process `pid` may own the entry `md` describes: it runs (not a
/// zombie) and started no later than the entry last changed (a pid reused
/// since started afterwards). Its program is not compared: the prefixes are
/// this library's, and tests and other programs use it under their own
/// names. In doubt it does: a live transfer must never lose its file.
fn owner_runs(pid: u32, md: &fs::Metadata) -> bool {
    match process_state(pid) {
        Ok(Some(ProcessState { dead: true, .. })) => false,
        // A second of slack for the clock tick rounding of the start time.
        Ok(Some(ProcessState {
            started: Some(started),
            ..
        })) => started <= md.ctime() + 1,
        Ok(Some(ProcessState { started: None, .. })) => true,
        Ok(None) => false,
        Err(_) => true,
    }
}

/// What `/proc/PID/stat` says of a process.
struct ProcessState {
    /// A zombie (killed, not yet reaped) or dead: it makes no more changes.
    dead: bool,
    /// When it started, in seconds since the epoch, when that can be told.
    started: Option<i64>,
}

/// `Ok(None)` when no process `pid` exists; an error when its entry cannot
/// be read (whether it runs is then unknown).
fn process_state(pid: u32) -> io::Result<Option<ProcessState>> {
    if pid == 0 {
        return Ok(None);
    }
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // Fields after the command name, which may itself hold blanks and ')'.
    let after = stat
        .rfind(')')
        .map(|at| &stat[at + 1..])
        .unwrap_or_default();
    let mut fields = after.split_whitespace();
    // proc(5): field 3 is the state, Z a zombie and X (or x) dead.
    let dead = matches!(fields.next(), Some("Z" | "X" | "x"));
    // `starttime` is field 22: 18 fields after the state.
    let started = fields
        .nth(18)
        .and_then(|ticks| ticks.parse().ok())
        .and_then(start_secs);
    Ok(Some(ProcessState { dead, started }))
}

/// Seconds since the epoch of a start `ticks` clock ticks after boot
/// (proc(5): `starttime` counts ticks since boot, `btime` in `/proc/stat` is
/// the boot time).
fn start_secs(ticks: i64) -> Option<i64> {
    let boot: i64 = fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let hz = i64::try_from(rustix::param::clock_ticks_per_second()).ok()?;
    (hz > 0).then(|| boot + ticks / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_state_dir_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        fs::create_dir(&state).unwrap();
        fs::set_permissions(&state, fs::Permissions::from_mode(0o1777)).unwrap();
        let error = Journal::open(&state, ".oxadb-sharedtest.").unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(
                error,
                JournalError::StateDir(StateDirError::NotPrivate { .. })
            ),
            "{text}"
        );
        assert!(text.contains(&format!("'{}'", state.display())), "{text}");
        assert!(text.contains("mode 1777"), "{text}");
    }

    #[test]
    fn temp_names_give_their_owner() {
        assert_eq!(temp_owner(b".oxadb-push.123.4", ".oxadb-push."), Some(123));
        assert_eq!(temp_owner(b".oxadb-push.123.", ".oxadb-push."), None);
        assert_eq!(temp_owner(b".oxadb-push.x.4", ".oxadb-push."), None);
        assert_eq!(temp_owner(b".oxadb-pull.1.4", ".oxadb-push."), None);
        assert_eq!(temp_owner(b"file", ".oxadb-push."), None);
    }

    #[test]
    fn this_process_runs_and_pid_zero_never_does() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        let md = fs::metadata(&file).unwrap();
        // This process started before the file was made.
        assert!(owner_runs(std::process::id(), &md));
        let me = process_state(std::process::id()).unwrap().unwrap();
        assert!(!me.dead);
        assert!(me.started.unwrap() <= md.ctime() + 1);
        // pid 0 is never a process with a /proc entry.
        assert!(!owner_runs(0, &md));
    }

    #[test]
    fn another_program_owns_newer_entries_only_while_it_runs() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        let new = fs::metadata(&file).unwrap();
        // Started before the entry changed: it may own it, whatever its program.
        assert!(owner_runs(pid, &new));
        // A file installed long before the child started is no entry of its:
        // its pid would have been reused.
        let old = fs::metadata("/bin/sh").unwrap();
        assert!(!owner_runs(pid, &old));
        // Killed but not yet reaped (a zombie): gone.
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !process_state(pid).unwrap().unwrap().dead {
            assert!(std::time::Instant::now() < deadline, "no zombie");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!owner_runs(pid, &new));
        child.wait().unwrap();
        assert!(process_state(pid).unwrap().is_none());
        assert!(!owner_runs(pid, &new));
    }

    #[test]
    fn sweep_removes_dead_owners_entries_and_keeps_live_ones() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = ".oxadb-sweeptest.";
        // A pid that cannot run now: above the kernel's pid_max limit.
        let dead = 4_194_305;
        let me = std::process::id();
        let dead_file = dir.path().join(format!("{prefix}{dead}.0"));
        let dead_dir = dir.path().join(format!("{prefix}{dead}.1"));
        let namesake = dir.path().join(format!("{prefix}{me}.2"));
        let other = dir.path().join("keep-me");
        fs::write(&dead_file, b"x").unwrap();
        fs::create_dir(&dead_dir).unwrap();
        fs::write(dead_dir.join("inner"), b"y").unwrap();
        fs::write(&namesake, b"z").unwrap();
        fs::write(&other, b"w").unwrap();
        let journal = dir.path().join("j");
        let mut text = dir.path().as_os_str().as_bytes().to_vec();
        text.extend_from_slice(b"\0/nonexistent/dir\0/torn");
        fs::write(&journal, text).unwrap();
        let mut sweep = Sweep::default();
        assert!(sweep_journal(&journal, prefix, &mut sweep));
        let mut removed = sweep.removed.clone();
        removed.sort();
        // An entry carrying this process's own id is a dead namesake's (the
        // sweep runs before this process makes any).
        let mut want = vec![dead_file.clone(), dead_dir.clone(), namesake.clone()];
        want.sort();
        assert_eq!(removed, want);
        assert!(!dead_file.exists() && !dead_dir.exists() && !namesake.exists());
        assert!(other.exists());
        assert_eq!(sweep.kept, 0);
    }
}
