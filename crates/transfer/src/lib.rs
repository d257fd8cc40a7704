//! The file side of adb's sync protocol, written once for both roles.
//!
//! A push on the daemon and a pull on the host do the same file work: take
//! the `DATA` payloads of the stream, decompress them if SND2/RCV2 said so,
//! and write them to a destination that is replaced atomically (a temporary
//! file beside it, renamed over it once `DONE` arrived). A pull on the daemon
//! and a push on the host do the reverse: read a file and cut it (compressed
//! or not) into `DATA` frames. The protocol framing stays in
//! [`oxadb_wire::sync`]; this crate holds what sits between those frames and
//! the file system, with the roles' differences as values ([`Policy`],
//! [`Framing`]) rather than two copies of the code (docs/architecture.md,
//! "transfer").
//!
//! Everything here blocks: callers run it on a blocking thread and talk to
//! it through bounded [`handoff`] queues ([`Chunk`] in, `Bytes` batches
//! out), which either end may wait on blocking or as a future; the crate
//! has no async runtime.
//!
//! A plain transfer from a regular file can skip the buffers: [`Source::into_ranges`]
//! frames it as file ranges that the TCP writer sends by `sendfile`
//! (docs/architecture.md, "Zero-copy transfers"). [`Destination::file`] stays
//! reachable for a receiving path (`splice`) under the same atomicity rules.

// This crate needs no unsafe code. Forbidden here, not in the workspace's
// lints, which every member shares (root Cargo.toml).
#![forbid(unsafe_code)]

mod dest_error;
mod destination;
mod durable;
pub mod handoff;
mod inbox;
mod journal;
mod protocol;
mod send_file;
pub mod serve;
mod sink;
mod source;
mod state_dir;
mod temp;
#[cfg(test)]
mod testdata;

pub use dest_error::{DestError, Step};
pub use destination::{process_umask, set_times_at, Attributes, Destination, ModeRule};
pub use durable::{sync_dir, sync_dirs, Durability};
pub use inbox::Inbox;
pub use journal::{Journal, JournalError, Sweep};
pub use protocol::{
    stat_v2_of, Action, Client, ClientError, ClientEvent, Failure, ListEntry, PullTicket,
    PushRequest, RequestError, Service, ServiceError, StatFailure, StatKind, StatReply, Transmit,
    Versions, MAX_UNACKED,
};
pub use send_file::SendFile;
pub use sink::{receive, Chunk, ChunkReader, ReceiveError};
pub use source::{
    send_frames, zero_copy_from_env, BufferPool, FrameRanges, Framing, SendError, Source,
    ZERO_COPY_ENV,
};
pub use state_dir::{make_state_dir, user_state_dir, StateDirError};
pub use temp::{create_beside, TempEntry};

use std::path::Path;
use std::sync::Arc;

/// How this process's received files reach storage: resolved once by the
/// binary (`--durability`, the journal it opened) and handed to every
/// transfer that writes one, the daemon's pushes and the host's pulls.
#[derive(Debug, Clone, Default)]
pub struct Storage {
    /// How far a committed file is flushed (docs/protocol.md, "Pushes").
    pub durability: Durability,
    /// Where the directories that get temporary entries are recorded;
    /// `None`: nowhere, so a killed process's leftovers are not found later.
    pub journal: Option<Arc<Journal>>,
}

impl Storage {
    /// Records `dir` in the journal, if any, before a temporary entry named
    /// with `prefix` is made there.
    fn note_dir(&self, dir: &Path, prefix: &str) {
        if let Some(journal) = &self.journal {
            journal.note_dir(dir, prefix, self.durability);
        }
    }
}

/// What differs between the roles when they write a received file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Prefix of temporary names: `.oxadb-push.` (daemon) or `.oxadb-pull.` (host).
    /// Each is followed by the process id and a counter.
    pub temp_prefix: &'static str,
    /// How the mode is given to a finished file.
    pub mode: ModeRule,
    /// Whether an existing destination is looked at through a symlink (the
    /// host's `stat`, so a link to `/dev/null` is written in place) or not
    /// (adbd's `lstat` in `daemon/file_sync_service.cpp`: a link is replaced).
    pub follow_symlinks: bool,
    /// Mode for missing parent directories, created on `ENOENT`
    /// (the daemon's `fixed_push_mkdir` feature); `None`: fail instead.
    pub parent_dir_mode: Option<u32>,
    /// Write regular files on procfs/sysfs-like filesystems in place: no
    /// temporary file can be made there (the daemon, as adbd writes them).
    pub in_place_on_kernel_fs: bool,
    /// When no temporary file may be created in the directory (`EACCES`,
    /// `EPERM`) but the destination is a writable regular file, rewrite it in
    /// place, as adb's `file_sync_client.cpp` always does (the host); unlike
    /// adb, not truncated before the data is known to fit.
    pub overwrite_if_dir_unwritable: bool,
    /// When the rename says `EBUSY` (a bind-mounted file), copy the finished
    /// file into the destination instead (the daemon).
    pub copy_when_busy: bool,
}

impl Policy {
    /// The daemon writing a pushed file (`daemon/file_sync_service.cpp`).
    pub const DAEMON: Policy = Policy {
        temp_prefix: ".oxadb-push.",
        mode: ModeRule::Exact,
        follow_symlinks: false,
        // adbd's `secure_mkdirs` uses 0775 (subject to the umask).
        parent_dir_mode: Some(0o775),
        in_place_on_kernel_fs: true,
        overwrite_if_dir_unwritable: false,
        copy_when_busy: true,
    };

    /// The host writing a pulled file (`client/file_sync_client.cpp`).
    pub const HOST: Policy = Policy {
        temp_prefix: ".oxadb-pull.",
        // adb's `sync_recv` creates pulled files 0644 before the umask.
        mode: ModeRule::MinusUmask { default: 0o644 },
        follow_symlinks: true,
        parent_dir_mode: None,
        in_place_on_kernel_fs: false,
        overwrite_if_dir_unwritable: true,
        copy_when_busy: false,
    };

    /// Removes the temporary files of this policy's transfers still in
    /// progress, for a process that is shutting down (a signal handler).
    /// Returns how many were removed.
    pub fn remove_unfinished(&self) -> usize {
        journal::remove_unfinished(self.temp_prefix)
    }

    /// Whether `name` (a file name) is one of this policy's temporary files.
    pub fn is_temp_name(&self, name: &str) -> bool {
        name.starts_with(self.temp_prefix)
    }
}

/// Whether `path` is on a kernel pseudo filesystem (magic numbers from
/// linux/magic.h): proc, sysfs, configfs, debugfs, tracefs, cgroup, cgroup2,
/// securityfs, selinuxfs.
pub fn on_kernel_interface_fs(path: &Path) -> bool {
    match rustix::fs::statfs(path) {
        Ok(fs) => is_kernel_fs_magic(fs.f_type as u64 as u32),
        Err(_) => false,
    }
}

/// [`on_kernel_interface_fs`] for an open file.
pub fn fd_on_kernel_interface_fs(file: &std::fs::File) -> bool {
    match rustix::fs::fstatfs(file) {
        Ok(fs) => is_kernel_fs_magic(fs.f_type as u64 as u32),
        Err(_) => false,
    }
}

fn is_kernel_fs_magic(magic: u32) -> bool {
    const KERNEL_FS_MAGICS: [u32; 9] = [
        0x0000_9fa0,
        0x6265_6572,
        0x6265_6570,
        0x6462_6720,
        0x7472_6163,
        0x0027_e0eb,
        0x6367_7270,
        0x7363_6673,
        0xf97c_ff8c,
    ];
    // f_type's integer type varies by architecture; the magic is its low 32 bits.
    KERNEL_FS_MAGICS.contains(&magic)
}

/// A file type that is neither regular, a directory nor a symlink.
pub fn is_special(md: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let kind = md.file_type();
    kind.is_char_device() || kind.is_block_device() || kind.is_fifo() || kind.is_socket()
}
