//! What an adb server would remember between commands, kept without a
//! server: a small per-user state file holding the devices `connect` added
//! and the background forwarders `forward` started.
//!
//! The file is `$XDG_STATE_HOME/oxadb/state` (else `~/.local/state/oxadb/state`,
//! or `$OXADB_STATE_DIR/state` when set; the directory is made with mode
//! 0700), one entry a line:
//!
//! ```text
//! device 127.0.0.1:5555
//! forward PID SERIAL LOCAL REMOTE
//! ```
//!
//! Every change happens under an exclusive `flock` of `state.lock` in the
//! same directory, and is written to a temporary file renamed over `state`,
//! so concurrent oxadb commands neither lose each other's entries nor read
//! half a file.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

/// Overrides the state directory (tests, several independent setups).
pub const STATE_DIR_ENV: &str = "OXADB_STATE_DIR";

/// The hidden subcommand a background forwarder runs as; also how a pid is
/// recognised as ours before it is signalled.
pub const FORWARDER_COMMAND: &str = "__forwarder";

/// A background forwarder: `oxadb __forwarder` serving LOCAL for SERIAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarder {
    pub pid: u32,
    pub serial: String,
    pub local: String,
    pub remote: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// `host:port` of every connected device, in `connect` order.
    pub devices: Vec<String>,
    pub forwarders: Vec<Forwarder>,
}

/// The directory holding the state file, the lock, the forwarders' log and
/// the journals of pulls in progress.
pub fn state_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os(STATE_DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    oxadb_transfer::user_state_dir("oxadb")
        .context("finding the oxadb state directory: neither XDG_STATE_HOME nor HOME is set")
}

/// This process's journal of pull temporary files, while it is open: closed
/// when dropped, and kept while a pull's temporary file is unfinished (a
/// thread may still hold it when the process ends), so the next sweep finds it.
pub struct PullJournal(Option<Arc<oxadb_transfer::Journal>>);

impl PullJournal {
    /// The journal, for the pulls' [`oxadb_transfer::Storage`].
    pub fn journal(&self) -> Option<Arc<oxadb_transfer::Journal>> {
        self.0.clone()
    }
}

impl Drop for PullJournal {
    fn drop(&mut self) {
        if let Some(journal) = &self.0 {
            journal.close();
        }
    }
}

/// Opens this process's journal of pull temporary files in the state
/// directory, first removing what killed oxadb processes left beside their
/// destinations (their journals say where): before a command's first pull,
/// and at a server's start. A pull goes on without a journal, which only
/// means a temporary file it leaves if killed is not found later.
pub fn open_pull_journal() -> PullJournal {
    let dir = match state_dir() {
        Ok(dir) => dir,
        Err(error) => {
            tracing::debug!("no pull journal: {error:#}");
            return PullJournal(None);
        }
    };
    let (journal, sweep) =
        match oxadb_transfer::Journal::open(&dir, oxadb_transfer::Policy::HOST.temp_prefix) {
            Ok(opened) => opened,
            Err(error) => {
                tracing::warn!(
                    "pull journal: {error}: a temporary file this pull leaves if killed \
                     will not be found"
                );
                return PullJournal(None);
            }
        };
    for problem in &sweep.problems {
        tracing::debug!("pull journal: {problem}");
    }
    if !sweep.removed.is_empty() || sweep.kept > 0 {
        tracing::debug!(
            state_dir = %dir.display(),
            journals = sweep.journals,
            kept_live = sweep.kept,
            "removed {} temporary files left by killed oxadb processes: {}",
            sweep.removed.len(),
            sweep.removed_list(10)
        );
    }
    PullJournal(Some(Arc::new(journal)))
}

impl State {
    fn parse(text: &str) -> State {
        let mut state = State::default();
        for line in text.lines() {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["device", serial] => state.devices.push(serial.to_string()),
                ["forward", pid, serial, local, remote] => {
                    if let Ok(pid) = pid.parse() {
                        state.forwarders.push(Forwarder {
                            pid,
                            serial: serial.to_string(),
                            local: local.to_string(),
                            remote: remote.to_string(),
                        });
                    }
                }
                // A line from a newer oxadb, or damage: skipped, not fatal.
                _ => tracing::debug!(line, "ignoring a state file line"),
            }
        }
        state
    }

    fn render(&self) -> String {
        let mut text = String::new();
        for device in &self.devices {
            text.push_str(&format!("device {device}\n"));
        }
        for f in &self.forwarders {
            text.push_str(&format!(
                "forward {} {} {} {}\n",
                f.pid, f.serial, f.local, f.remote
            ));
        }
        text
    }

    /// The state as last written (empty when there is none yet).
    pub fn load() -> anyhow::Result<State> {
        // With no place for a state file (no HOME) nothing was ever
        // connected: commands naming their device still run.
        let Ok(dir) = state_dir() else {
            return Ok(State::default());
        };
        let path = dir.join("state");
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(State::parse(&text)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(error) => Err(error).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Forgets forwarders whose process is gone (or is no longer ours).
    pub fn prune(&mut self) {
        self.forwarders.retain(|f| is_our_forwarder(f.pid));
    }
}

/// The state held under the lock; [`Locked::save`] writes it back.
pub struct Locked {
    pub state: State,
    dir: PathBuf,
    _lock: std::fs::File,
}

/// Takes the lock (waiting for other oxadb commands) and reads the state.
pub fn lock() -> anyhow::Result<Locked> {
    let dir = state_dir()?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let lock_path = dir.join("state.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .with_context(|| format!("locking {}", lock_path.display()))?;
    let state = State::load()?;
    Ok(Locked {
        state,
        dir,
        _lock: lock,
    })
}

impl Locked {
    /// Replaces the state file atomically (temporary file, fsync, rename).
    pub fn save(&self) -> anyhow::Result<()> {
        let path = self.dir.join("state");
        let temp = self.dir.join(format!("state.tmp.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&temp)?;
            file.write_all(self.state.render().as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&temp, &path)
        };
        write().with_context(|| format!("writing {}", path.display()))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Whether `pid` runs an oxadb background forwarder: its command line is
/// read from /proc before anything is signalled, so a recycled pid of
/// another program is never touched.
pub fn is_our_forwarder(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut args = cmdline.split(|&b| b == 0);
    let is_oxadb = args
        .next()
        .and_then(|argv0| std::str::from_utf8(argv0).ok())
        .is_some_and(|argv0| Path::new(argv0).file_name().is_some_and(|n| n == "oxadb"));
    is_oxadb && args.any(|arg| arg == FORWARDER_COMMAND.as_bytes())
}

/// Ends forwarder `pid` (SIGTERM) if it is still ours, and waits up to 5 s
/// for it to go so that its local socket is free again.
pub fn stop_forwarder(pid: u32) {
    if !is_our_forwarder(pid) {
        return;
    }
    let Some(process) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    if let Err(error) = rustix::process::kill_process(process, rustix::process::Signal::TERM) {
        tracing::debug!(pid, %error, "signalling a forwarder");
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        // A zombie (already exited, not yet reaped by init) counts as gone.
        let gone = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| {
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if gone {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    tracing::warn!(pid, "forwarder did not exit within 5 s of SIGTERM");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_skips_unknown_lines() {
        let state = State {
            devices: vec!["127.0.0.1:5555".into(), "[::1]:7000".into()],
            forwarders: vec![Forwarder {
                pid: 42,
                serial: "127.0.0.1:5555".into(),
                local: "tcp:8080".into(),
                remote: "tcp:80".into(),
            }],
        };
        let text = state.render() + "future thing\n";
        assert_eq!(State::parse(&text), state);
    }
}
