//! `adb pull`: files and trees, several sources, `-a`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::local::{self, Landing, PulledAttributes};
use super::metadata::Describe;
use super::push::{warn_if_unsupported, Tally};
use super::session::SyncSession;
use super::{
    basename, describe_io, join_remote, show, transfer_error, Progress, PullOptions, RemoteStat,
    SyncFeatures, SyncOpener, TransferSummary,
};
use crate::error::{Error, Result};

/// Directory levels followed below a pulled directory before giving up (symlink loops).
const MAX_DEPTH: usize = 256;

/// Copies files and directories from the device, as `adb pull` does.
///
/// * If `destination` is an existing directory, each source lands in it under
///   its own name; otherwise a single source is copied to `destination`
///   itself, whose parent must exist (several sources need a directory).
/// * Directories are copied recursively; symlinks on the device are followed
///   (a link to a directory is pulled as a directory). Special files other
///   than device nodes are skipped with a warning.
/// * A regular destination file is replaced atomically (temporary file, then
///   rename); an existing non-regular destination such as `/dev/null` or a
///   FIFO is written in place and never replaced.
/// * New files get mode 0644 minus the umask, or with `options.preserve` the
///   device's mode (minus the umask) and mtime.
///
/// A source that fails does not stop the others; the error lists every
/// failure, in adb's words.
///
/// ```no_run
/// # async fn demo(device: &oxadb::Device) -> oxadb::Result<()> {
/// use std::path::Path;
/// use oxadb::sync::{pull, NoProgress, PullOptions};
///
/// let summary = pull(
///     device,
///     &["/sdcard/DCIM".to_string()],
///     Path::new("photos"),
///     &PullOptions { preserve: true, ..PullOptions::default() },
///     &mut NoProgress,
/// )
/// .await?;
/// println!("{} files, {} bytes", summary.files_transferred, summary.bytes);
/// # Ok(())
/// # }
/// ```
pub async fn pull(
    device: &dyn SyncOpener,
    sources: &[String],
    destination: &Path,
    options: &PullOptions,
    progress: &mut dyn Progress,
) -> Result<TransferSummary> {
    let started = Instant::now();
    if sources.is_empty() {
        return Err(transfer_error("pull requires an argument".to_string()));
    }
    let features = options.features.unwrap_or_else(|| device.sync_features());
    warn_if_unsupported(options.compression, &features, progress);
    let mut puller = Puller {
        device,
        features,
        session: None,
        compression: features.resolve(options.compression),
        preserve: options.preserve,
        storage: options.storage.clone(),
    };

    let dst_name = destination.display().to_string();
    let (dst_exists, dst_isdir) = match tokio::fs::metadata(destination).await {
        Ok(metadata) => (true, metadata.is_dir()),
        Err(e) if sources.len() == 1 && e.kind() == std::io::ErrorKind::NotFound => {
            // A single source may create the destination, in an existing directory.
            let parent = match destination.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent,
                _ => Path::new("."),
            };
            if let Err(e) = tokio::fs::metadata(parent).await {
                return Err(transfer_error(format!(
                    "cannot create file/directory '{dst_name}': {}",
                    describe_io(&e)
                )));
            }
            (false, false)
        }
        Err(e) => {
            return Err(transfer_error(format!(
                "failed to access '{dst_name}': {}",
                describe_io(&e)
            )))
        }
    };
    if !dst_isdir {
        if sources.len() > 1 {
            return Err(transfer_error(format!(
                "target '{dst_name}' is not a directory"
            )));
        }
        if destination.as_os_str().as_bytes().ends_with(b"/") && dst_exists {
            return Err(transfer_error(format!(
                "failed to access '{dst_name}': Not a directory"
            )));
        }
    }

    let mut tally = Tally::new();
    for source in sources {
        let remote = source.as_bytes();
        let source_started = Instant::now();
        let compression = puller.compression;
        let stat = puller
            .session()
            .await?
            .stat_for_pull(remote, compression)
            .await;
        // A RECV that went ahead of the STAT reply is wanted only for a
        // file pulled next.
        if !matches!(&stat, Ok(Ok(stat)) if !stat.is_dir() && pullable(stat)) {
            if let Some(session) = puller.session.as_mut() {
                session.drop_recv_ahead();
            }
        }
        let stat = match stat {
            Ok(Ok(stat)) => stat,
            Ok(Err(failure)) => {
                tally.fail(if failure == oxadb_transfer::StatFailure::Unknown {
                    format!("remote object '{source}' does not exist")
                } else {
                    format!(
                        "failed to stat remote object '{source}': {}",
                        failure.describe()
                    )
                });
                continue;
            }
            Err(error) => return Err(tally.abort(error)),
        };
        let result = if stat.is_dir() {
            let mut local_dir = destination.to_path_buf();
            if dst_exists {
                local_dir = destination.join(OsStr::from_bytes(basename(remote)));
            }
            puller.pull_tree(remote, &local_dir, &stat, progress).await
        } else if !pullable(&stat) {
            progress.warning(&format!(
                "skipping special file '{source}' (mode = 0o{:o})",
                stat.mode
            ));
            continue;
        } else {
            let local_path = if dst_isdir {
                destination.join(OsStr::from_bytes(basename(remote)))
            } else {
                destination.to_path_buf()
            };
            puller
                .pull_one(remote, &local_path, &stat, progress)
                .await
                .map(|bytes| TransferSummary {
                    files_transferred: 1,
                    bytes,
                    ..TransferSummary::default()
                })
        };
        tally.record(source, source_started, result, progress)?;
    }
    tally.finish(puller.session.take(), started).await
}

/// adb pulls regular files and device nodes.
fn pullable(stat: &RemoteStat) -> bool {
    matches!(
        stat.mode & libc::S_IFMT,
        libc::S_IFREG | libc::S_IFBLK | libc::S_IFCHR
    )
}

/// What pulling a tree does, in order.
enum Step {
    MakeDir(PathBuf),
    Pull {
        remote: Vec<u8>,
        local: PathBuf,
        stat: RemoteStat,
    },
    Skip,
}

struct Puller<'a> {
    device: &'a dyn SyncOpener,
    features: SyncFeatures,
    session: Option<SyncSession>,
    compression: oxadb_wire::sync::Compression,
    preserve: bool,
    storage: oxadb_transfer::Storage,
}

impl Puller<'_> {
    async fn session(&mut self) -> Result<&mut SyncSession> {
        SyncSession::reuse_or_open(&mut self.session, self.device, self.features).await
    }

    async fn pull_one(
        &mut self,
        remote: &[u8],
        local: &Path,
        stat: &RemoteStat,
        progress: &mut dyn Progress,
    ) -> Result<u64> {
        let attributes = self.preserve.then_some(PulledAttributes {
            mode: stat.mode,
            mtime: stat.mtime,
        });
        let compression = self.compression;
        let landing = Landing {
            attributes,
            storage: self.storage.clone(),
        };
        self.session()
            .await?
            .receive(
                remote,
                local,
                Some(stat.size),
                compression,
                landing,
                progress,
            )
            .await
    }

    /// A whole directory into `local_dir`; stops at the first failure, like adb.
    async fn pull_tree(
        &mut self,
        remote_dir: &[u8],
        local_dir: &Path,
        root: &RemoteStat,
        progress: &mut dyn Progress,
    ) -> Result<TransferSummary> {
        let mut steps = Vec::new();
        let mut ancestors = vec![(root.dev, root.ino)];
        self.plan(
            remote_dir.to_vec(),
            local_dir.to_path_buf(),
            &mut ancestors,
            &mut steps,
            progress,
        )
        .await?;
        let mut summary = TransferSummary::default();
        // Parents that got a new directory entry, flushed once at the end
        // (each pulled file's own directory is flushed as it is committed).
        let mut new_entries_in = std::collections::BTreeSet::new();
        for step in steps {
            match step {
                Step::MakeDir(dir) => {
                    if tokio::fs::symlink_metadata(&dir).await.is_err() {
                        let mut made = dir.as_path();
                        while let Some(parent) = made.parent() {
                            let parent = if parent.as_os_str().is_empty() {
                                Path::new(".")
                            } else {
                                parent
                            };
                            new_entries_in.insert(parent.to_path_buf());
                            if parent.exists() {
                                break;
                            }
                            made = parent;
                        }
                    }
                    if let Err(e) = tokio::fs::create_dir_all(&dir).await {
                        return Err(transfer_error(format!(
                            "failed to create directory '{}': {}",
                            dir.display(),
                            describe_io(&e)
                        )));
                    }
                }
                Step::Pull {
                    remote,
                    local,
                    stat,
                } => {
                    summary.bytes += self.pull_one(&remote, &local, &stat, progress).await?;
                    summary.files_transferred += 1;
                }
                Step::Skip => summary.files_skipped += 1,
            }
        }
        let dirs: Vec<_> = new_entries_in.into_iter().collect();
        let durability = self.storage.durability;
        tokio::task::spawn_blocking(move || oxadb_transfer::sync_dirs(&dirs, durability))
            .await
            .map_err(|e| Error::io("pull", std::io::Error::other(e)))?
            .map_err(|(dir, e)| {
                transfer_error(format!(
                    "failed to sync directory '{}': {}",
                    dir.display(),
                    describe_io(&e)
                ))
            })?;
        Ok(summary)
    }

    /// Lists `remote_dir` recursively into steps: the directory itself, its
    /// files, then its subdirectories (symlinks to directories included).
    /// `ancestors` holds the (dev, inode) of the directories above, to stop
    /// at symlink loops.
    async fn plan(
        &mut self,
        remote_dir: Vec<u8>,
        local_dir: PathBuf,
        ancestors: &mut Vec<(u64, u64)>,
        steps: &mut Vec<Step>,
        progress: &mut dyn Progress,
    ) -> Result<()> {
        if ancestors.len() > MAX_DEPTH {
            return Err(transfer_error(format!(
                "failed to copy '{}': more than {MAX_DEPTH} directory levels (a symlink loop?)",
                show(&remote_dir)
            )));
        }
        steps.push(Step::MakeDir(local_dir.clone()));
        let session = self.session().await?;
        let entries = session.list(&remote_dir).await?;
        let mut subdirs = Vec::new();
        for entry in entries {
            if entry.name == b"." || entry.name == b".." {
                continue;
            }
            let remote = join_remote(&remote_dir, &entry.name);
            let Some(local) = local::child_path(&local_dir, &entry.name) else {
                return Err(transfer_error(format!(
                    "refusing to pull '{}': the device sent the invalid file name {:?}",
                    show(&remote_dir),
                    entry.name_lossy()
                )));
            };
            let stat = if entry.stat.is_symlink() {
                match session.stat_follow(&remote).await? {
                    Ok(target) => target,
                    Err(failure) => {
                        progress.warning(&format!(
                            "stat failed for path {}: {}",
                            show(&remote),
                            failure.describe()
                        ));
                        continue;
                    }
                }
            } else {
                entry.stat
            };
            if stat.is_dir() {
                subdirs.push((remote, local, stat));
            } else if pullable(&stat) {
                steps.push(Step::Pull {
                    remote,
                    local,
                    stat,
                });
            } else {
                progress.warning(&format!(
                    "skipping special file '{}' (mode = 0o{:o})",
                    show(&remote),
                    stat.mode
                ));
                steps.push(Step::Skip);
            }
        }
        for (remote, local, stat) in subdirs {
            // Without inode numbers (no stat_v2) only the depth limit stops loops.
            let id = (stat.dev, stat.ino);
            if stat.ino != 0 && ancestors.contains(&id) {
                progress.warning(&format!(
                    "skipping '{}': it links back to a directory above it",
                    show(&remote)
                ));
                continue;
            }
            ancestors.push(id);
            let planned = Box::pin(self.plan(remote, local, ancestors, steps, progress)).await;
            ancestors.pop();
            planned?;
        }
        Ok(())
    }
}
