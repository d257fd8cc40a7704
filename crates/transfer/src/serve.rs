//! The daemon's file work for each [`Action`] of its sync machine
//! ([`crate::Service`]): stats, listings, writing a push, opening and
//! reading a pull. Everything here blocks; the adapter runs it on a blocking
//! thread and feeds the result back to the machine. The `FAIL` texts are
//! adbd's (`daemon/file_sync_service.cpp`), each naming the path and the
//! cause.
//!
//! [`Action`]: crate::Action

use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use oxadb_wire::sync::{Compression, StatV2};
use tracing::warn;

use crate::protocol::{stat_v2_of, Failure, ListEntry, PushRequest, StatKind};
use crate::{
    create_beside, set_times_at, sync_dirs, Attributes, ChunkReader, DestError, Destination,
    Framing, Policy, ReceiveError, SendError, Source, Step, Storage,
};

/// A symlink target is at most PATH_MAX (4096) bytes including the NUL the client sends.
const SYMLINK_TARGET_MAX: usize = 4096;

/// [`Action::Stat`](crate::Action::Stat): `stat` or `lstat` of `path`.
pub fn stat(kind: StatKind, path: &Path) -> io::Result<StatV2> {
    let md = if kind.follows_symlinks() {
        fs::metadata(path)?
    } else {
        fs::symlink_metadata(path)?
    };
    Ok(stat_v2_of(&md))
}

/// [`Action::List`](crate::Action::List): every `readdir` entry of `dir`
/// (`.` and `..` included) with its `lstat`, stopping quietly at the first
/// `readdir` error as adbd's loop does.
pub fn list(dir: &Path) -> io::Result<Vec<ListEntry>> {
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?;
    let mut entries = rustix::fs::Dir::new(handle)?;
    let mut names = Vec::new();
    while let Some(Ok(entry)) = entries.read() {
        names.push(entry.file_name().to_bytes().to_vec());
    }
    Ok(names
        .into_iter()
        .map(|name| {
            let stat =
                fs::symlink_metadata(dir.join(OsStr::from_bytes(&name))).map(|md| stat_v2_of(&md));
            ListEntry { name, stat }
        })
        .collect())
}

/// A push, written on a blocking thread from the payloads the machine hands
/// out ([`ChunkReader`]) under [`Policy::DAEMON`].
///
/// A regular file goes to a temporary file beside the destination, renamed
/// over it after `DONE`; a device, FIFO or kernel interface file is written
/// in place; a directory is refused; a symlink (`S_IFLNK` in the mode) is
/// made under a temporary name with its own timestamp and renamed into place.
/// A pushed file gets exactly `mode & 0o7777` (docs/protocol.md, "Pushes"),
/// stored as the daemon's `storage` says.
#[derive(Debug)]
pub struct PushJob {
    request: PushRequest,
    storage: Storage,
}

impl PushJob {
    pub fn new(request: PushRequest, storage: Storage) -> PushJob {
        PushJob { request, storage }
    }

    pub fn path(&self) -> &Path {
        &self.request.path
    }

    pub fn run(mut self, mut input: ChunkReader) -> Result<(), Failure> {
        let is_symlink = self.request.mode & libc::S_IFMT == libc::S_IFLNK;
        if is_symlink {
            // A link target always travels raw, whatever SND2's flags say: AOSP's
            // daemon reads it without decompressing, and clients (go-adb) rely on it.
            self.request.compression = Compression::None;
        }
        if self.request.dry_run {
            // SND2 dry run: decode to validate, touch nothing.
            return self.decode(&mut input, &mut io::sink(), "couldn't discard data for");
        }
        if is_symlink {
            return self.push_symlink(&mut input);
        }
        // A directory is refused; a device, FIFO or kernel interface file is written
        // in place; anything else (missing, a regular file, a symlink, which is
        // replaced by the file as adbd does) through a temporary file.
        let destination = Destination::open(&self.request.path, &Policy::DAEMON, &self.storage)
            .map_err(|e| self.dest_failure(e))?;
        self.decode(&mut input, &mut destination.file(), "couldn't write")?;
        let mtime = input.done_mtime().expect("a finished push saw DONE");
        destination
            .commit(Attributes {
                mode: Some(self.request.mode),
                mtime: Some(i64::from(mtime)),
            })
            .map_err(|e| self.dest_failure(e))
    }

    fn report(&self, what: &str, cause: impl std::fmt::Display) -> Failure {
        Failure::Report(format!("{what} '{}': {cause}", self.request.path.display()))
    }

    /// Words a destination failure as adbd's `FAIL` messages do, naming the path.
    fn dest_failure(&self, error: DestError) -> Failure {
        let what = match error.step {
            Step::Create | Step::CreateDir(_) => "couldn't create file",
            Step::OpenInPlace => "couldn't open for writing",
            Step::Write => "couldn't write",
            Step::Attributes => "couldn't set the mode or mtime of",
            Step::Replace | Step::SyncDir(_) => "couldn't replace",
            Step::SyncFile => "couldn't sync",
        };
        self.report(what, error)
    }

    fn decode(
        &self,
        input: &mut ChunkReader,
        output: &mut impl Write,
        output_context: &str,
    ) -> Result<(), Failure> {
        let written = AtomicU64::new(0);
        match crate::receive(input, self.request.compression, output, &written) {
            Ok(()) => Ok(()),
            Err(ReceiveError::Stopped) => Err(Failure::HostGone),
            Err(ReceiveError::Decode(e)) => Err(self.report("couldn't decompress data for", e)),
            Err(ReceiveError::Output(e)) => Err(self.report(output_context, e)),
        }
    }

    /// The data is the link target followed by a NUL (the client sends `readlink()` + NUL).
    fn push_symlink(&self, input: &mut ChunkReader) -> Result<(), Failure> {
        let path = &self.request.path;
        let mut target = Vec::new();
        self.decode(
            input,
            &mut LimitedBuffer::new(&mut target),
            "couldn't create symlink",
        )?;
        let target = crate::protocol::up_to_nul(&target);
        if target.is_empty() {
            return Err(self.report("couldn't create symlink", "empty link target"));
        }
        let mtime = input.done_mtime().expect("a finished push saw DONE");
        match fs::symlink_metadata(path) {
            Ok(md) if md.is_dir() => {
                return Err(self.report(
                    "couldn't create symlink",
                    io::Error::from_raw_os_error(libc::EISDIR),
                ))
            }
            Ok(md) if crate::is_special(&md) => {
                return Err(self.report(
                    "couldn't create symlink",
                    "refusing to replace a device or FIFO",
                ))
            }
            _ => {}
        }
        let (temp, ()) = create_beside(path, &Policy::DAEMON, &self.storage, |candidate| {
            std::os::unix::fs::symlink(OsStr::from_bytes(target), candidate)
        })
        .map_err(|e| self.report("couldn't create symlink", e))?;
        // Set on the link itself (AT_SYMLINK_NOFOLLOW): fixed_push_symlink_timestamp.
        if let Err(e) = set_times_at(temp.path(), i64::from(mtime), false) {
            warn!(
                "sync: couldn't set the mtime of symlink '{}': {e}",
                path.display()
            );
        }
        let changed_dirs = temp.changed_dirs().to_vec();
        temp.rename_over(path)
            .map_err(|(_, e)| self.report("couldn't replace", e))?;
        // A link has no data of its own: its directory entry is all there is to flush.
        sync_dirs(&changed_dirs, self.storage.durability).map_err(|(dir, e)| {
            self.report(
                "couldn't replace",
                format!("couldn't sync directory '{}': {e}", dir.display()),
            )
        })
    }
}

/// Collects a symlink target, refusing more than PATH_MAX bytes.
struct LimitedBuffer<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> LimitedBuffer<'a> {
    fn new(buf: &'a mut Vec<u8>) -> Self {
        Self { buf }
    }
}

impl Write for LimitedBuffer<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > SYMLINK_TARGET_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("link target longer than {SYMLINK_TARGET_MAX} bytes"),
            ));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Why a pull of `path` (symlinks followed) is refused before it is opened,
/// if it is: opening a FIFO blocks until something writes to it, and a
/// directory or socket has no bytes to stream. adb skips these after its
/// `STAT`; oxadb may ask before its `STAT` reply is back (the
/// `oxadb_recv_ahead` feature). A path that does not resolve is left to the
/// open, whose error names the cause.
pub fn pull_refusal(path: &Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    let kind = fs::metadata(path).ok()?.file_type();
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else {
        return None;
    };
    Some(format!(
        "couldn't read '{}': not a regular file or device ({what})",
        path.display()
    ))
}

/// Opens the file a pull sends.
pub fn open_pull(path: &Path) -> Result<Source, Failure> {
    Source::open(path)
        .map_err(|e| Failure::Report(format!("couldn't open '{}': {e}", path.display())))
}

/// A pulled file that could not be read.
pub fn read_failure(path: &Path, error: io::Error) -> Failure {
    Failure::Report(format!("couldn't read '{}': {error}", path.display()))
}

/// Reads the pulled file `path` into batches of ready-made `DATA` frames
/// ([`Framing::DAEMON`]), each given to `batches` (false: stop).
pub fn send_file(
    path: &Path,
    compression: Compression,
    batches: impl FnMut(Bytes) -> bool,
) -> Result<(), Failure> {
    let source = open_pull(path)?;
    let read = AtomicU64::new(0);
    crate::send_frames(source.file(), compression, &Framing::DAEMON, batches, &read).map_err(|e| {
        match e {
            SendError::Read(e) => read_failure(path, e),
            SendError::Compress(e) => {
                Failure::Report(format!("couldn't compress '{}': {e}", path.display()))
            }
            SendError::Stopped => Failure::HostGone,
        }
    })
}
