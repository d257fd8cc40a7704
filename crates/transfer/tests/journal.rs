//! The journal of one process from opening to closing, as a daemon or an
//! oxadb command uses it: the sweep of a dead process's leftovers, the
//! directory recorded before a temporary file is made there, and the journal
//! kept while that file is unfinished. One test: a process has one journal.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

use std::sync::Arc;

use oxadb_transfer::{Attributes, Destination, Journal, JournalError, Policy, Storage};

/// Above the kernel's largest pid_max: never a running process.
const DEAD: u32 = 4_194_305;

#[test]
fn leftovers_of_dead_processes_go_and_live_ones_stay() {
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let dest = root.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let prefix = Policy::HOST.temp_prefix;

    // A killed process's journal names `dest`, where it left a temporary file.
    fs::create_dir(&state).unwrap();
    let mut line = dest.as_os_str().as_bytes().to_vec();
    line.push(0);
    fs::write(state.join(format!("pending-dirs.{DEAD}")), &line).unwrap();
    let dead_entry = dest.join(format!("{prefix}{DEAD}.0"));
    fs::write(&dead_entry, b"half a file").unwrap();
    // One of another dead process (its journal elsewhere), and the live
    // entry of a running process of another program.
    let other_dead = dest.join(format!("{prefix}{}.3", DEAD + 1));
    fs::write(&other_dead, b"x").unwrap();
    let mut live = Command::new("sleep").arg("30").spawn().unwrap();
    let live_entry = dest.join(format!("{prefix}{}.0", live.id()));
    fs::write(&live_entry, b"in progress").unwrap();
    // Neither another role's entry nor an ordinary file is touched.
    let push_entry = dest.join(format!(".oxadb-push.{DEAD}.1"));
    fs::write(&push_entry, b"y").unwrap();
    fs::write(dest.join("f"), b"old").unwrap();

    let (journal, sweep) = Journal::open(&state, prefix).unwrap();
    let mut removed = sweep.removed.clone();
    removed.sort();
    assert_eq!(removed, [dead_entry.clone(), other_dead.clone()]);
    assert_eq!((sweep.kept, sweep.journals), (1, 1), "{sweep:?}");
    assert!(sweep.problems.is_empty(), "{sweep:?}");
    assert!(live_entry.exists() && push_entry.exists());
    let mut journals: Vec<_> = fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    journals.sort();
    let own = state.join(format!("pending-dirs.{}", std::process::id()));
    assert_eq!(journals, [own.file_name().unwrap()]);
    assert_eq!(fs::metadata(&own).unwrap().mode() & 0o777, 0o600);
    assert_eq!(fs::read(&own).unwrap(), b"");

    // While it is open, this process cannot open another (it would sweep
    // this one's live entries as a dead namesake's).
    assert!(matches!(
        Journal::open(&state, prefix),
        Err(JournalError::AlreadyOpen(path)) if path == own
    ));

    // The directory is recorded before the temporary file is made, once.
    let storage = Storage {
        journal: Some(Arc::new(journal)),
        ..Storage::default()
    };
    let journal = storage.journal.clone().unwrap();
    let target = Destination::open(&dest.join("f"), &Policy::HOST, &storage).unwrap();
    let second = Destination::open(&dest.join("g"), &Policy::HOST, &storage).unwrap();
    assert_eq!(fs::read(&own).unwrap(), line);
    // Kept while a temporary file is unfinished, removed once none is.
    assert!(!journal.close());
    assert!(own.exists());
    drop(second);
    target.commit(Attributes::default()).unwrap();
    assert!(journal.close());
    assert!(!own.exists());
    assert_eq!(fs::read(dest.join("f")).unwrap(), b"");

    live.kill().unwrap();
    live.wait().unwrap();
}
