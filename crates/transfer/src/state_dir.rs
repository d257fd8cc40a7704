//! The directory a process keeps its journal in: a per-user default for
//! either role, and the checks that make it safe to act on what it holds.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Why a state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error("state directory '{}': {action}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(
        "state directory '{}': owned by uid {uid} with mode {mode:o}: it must be this \
         process's own and not writable by others (its journals say what to delete)",
        path.display()
    )]
    NotPrivate { path: PathBuf, uid: u32, mode: u32 },
}

/// `$XDG_STATE_HOME/<program>`, else `$HOME/.local/state/<program>` (the XDG
/// Base Directory Specification; a relative `XDG_STATE_HOME` is ignored, as
/// it says). `None` without either.
pub fn user_state_dir(program: &str) -> Option<PathBuf> {
    user_state_dir_from(
        std::env::var_os("XDG_STATE_HOME"),
        std::env::var_os("HOME"),
        program,
    )
}

fn user_state_dir_from(
    xdg_state_home: Option<OsString>,
    home: Option<OsString>,
    program: &str,
) -> Option<PathBuf> {
    let base = match xdg_state_home.map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        _ => PathBuf::from(home.filter(|home| !home.is_empty())?).join(".local/state"),
    };
    Some(base.join(program))
}

/// Makes `dir` (and missing parents) with mode 0700 if it is missing, and
/// checks it is this process's own and not writable by group or others:
/// its journals name directories to delete entries from.
pub fn make_state_dir(dir: &Path) -> Result<(), StateDirError> {
    let io_error = |action: &'static str| {
        move |source| StateDirError::Io {
            action,
            path: dir.to_path_buf(),
            source,
        }
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_error("creating it"))?;
    let md = fs::metadata(dir).map_err(io_error("reading it"))?;
    let euid = rustix::process::geteuid().as_raw();
    if md.uid() != euid || md.mode() & 0o022 != 0 {
        return Err(StateDirError::NotPrivate {
            path: dir.to_path_buf(),
            uid: md.uid(),
            mode: md.mode() & 0o7777,
        });
    }
    // A directory that exists but cannot take a journal (a read-only root,
    // as a board or a VM sharing the host's tree has) is as unusable as a
    // missing one: the caller falls back instead of failing at the journal.
    rustix::fs::access(
        dir,
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    )
    .map_err(|errno| io_error("checking it can be written")(io::Error::from(errno)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn xdg_state_home_then_home() {
        let dir = |xdg: Option<&str>, home: Option<&str>| {
            user_state_dir_from(xdg.map(Into::into), home.map(Into::into), "oxadbd")
        };
        assert_eq!(
            dir(Some("/x/state"), Some("/home/u")),
            Some(PathBuf::from("/x/state/oxadbd"))
        );
        let fallback = Some(PathBuf::from("/home/u/.local/state/oxadbd"));
        assert_eq!(dir(None, Some("/home/u")), fallback);
        assert_eq!(dir(Some(""), Some("/home/u")), fallback);
        assert_eq!(dir(Some("relative/state"), Some("/home/u")), fallback);
        assert_eq!(dir(None, None), None);
        assert_eq!(dir(None, Some("")), None);
    }

    #[test]
    fn made_private_and_a_shared_one_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/state");
        make_state_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
        // An existing private directory keeps its mode.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        make_state_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).unwrap();
        let error = make_state_dir(&dir).unwrap_err();
        assert!(matches!(
            error,
            StateDirError::NotPrivate { mode: 0o1777, .. }
        ));
        // A parent that is a file: the cause is named.
        let file = root.path().join("file");
        fs::write(&file, b"").unwrap();
        let error = make_state_dir(&file.join("state")).unwrap_err();
        assert!(error.to_string().contains("creating it"), "{error}");
    }
}
