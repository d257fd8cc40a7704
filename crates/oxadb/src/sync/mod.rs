//! The host side of adb's file sync protocol (the `sync:` service): `stat`,
//! directory listings, `push` and `pull`.
//!
//! [`SyncSession`] wraps one `sync:` stream and offers the protocol's requests
//! one by one. [`push`] and [`pull`] are what `adb push` and `adb pull` do on
//! top of it: several sources, whole directory trees, "is the destination a
//! directory?" logic, `--sync`, compression, dry runs and `pull -a`.
//!
//! ```no_run
//! # async fn demo() -> oxadb::Result<()> {
//! use std::path::{Path, PathBuf};
//! use oxadb::sync::{self, NoProgress, PullOptions, PushOptions};
//! use oxadb::{ConnectOptions, Device};
//!
//! let device = Device::connect("127.0.0.1:5555", &ConnectOptions::default()).await?;
//! let pushed = sync::push(
//!     &device,
//!     &[PathBuf::from("build/app")],
//!     "/data/local/tmp/",
//!     &PushOptions::default(),
//!     &mut NoProgress,
//! )
//! .await?;
//! println!("{}", pushed.report("build/app", sync::Direction::Push));
//! sync::pull(
//!     &device,
//!     &["/data/local/tmp/app/log.txt".to_string()],
//!     Path::new("."),
//!     &PullOptions { preserve: true, ..PullOptions::default() },
//!     &mut NoProgress,
//! )
//! .await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Behaviour worth knowing
//!
//! * Pushes are pipelined like adb's: the next file is sent before the device
//!   acknowledged the previous one; acknowledgements are collected on the way.
//! * A pulled regular file is written to a temporary file beside the
//!   destination and renamed over it only once the device sent all of it, so a
//!   failed pull leaves an existing file untouched and no temporary file behind.
//!   An existing destination that is not a regular file (a character device
//!   such as `/dev/null`, a FIFO, a terminal) is opened and written in place and
//!   never replaced or removed; Google's adb would replace it with a file.
//! * After a failed transfer the device ends the sync service (adbd does); the
//!   high-level functions then open a new `sync:` stream for the remaining
//!   sources.

mod codec;
mod local;
mod metadata;
mod pull;
mod push;
mod receive;
mod send;
mod session;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use oxadb_wire::feature;
use oxadb_wire::service::DeviceService;
use oxadb_wire::sync as wire;

use crate::device::Device;

pub use local::remove_unfinished_pulls;
pub use pull::pull;
pub use push::push;
pub use session::SyncSession;
pub use wire::SYNC_DATA_MAX;

/// Compression of file data requested for a transfer.
///
/// It is used only when the device advertises `sendrecv_v2` and the
/// algorithm's own feature (`sendrecv_v2_brotli`, `sendrecv_v2_lz4`,
/// `sendrecv_v2_zstd`); otherwise the data goes uncompressed. Pushed files
/// smaller than [`SYNC_DATA_MAX`] are never compressed (as with adb).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Compression {
    /// No compression (adb 29's only mode, and adb's `-Z`).
    #[default]
    None,
    /// The best algorithm the device supports, in adb's order: zstd, lz4, brotli.
    Any,
    Brotli,
    Lz4,
    Zstd,
}

impl Compression {
    /// All choices, in the spelling of adb's `-z` option.
    pub const NAMES: [&'static str; 5] = ["any", "none", "brotli", "lz4", "zstd"];

    /// The name used by adb's `-z` option.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Any => "any",
            Compression::Brotli => "brotli",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A compression name that is not one of [`Compression::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected compression type {0} (expected any, none, brotli, lz4 or zstd)")]
pub struct UnknownCompression(pub String);

impl FromStr for Compression {
    type Err = UnknownCompression;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "any" => Ok(Compression::Any),
            "none" => Ok(Compression::None),
            "brotli" => Ok(Compression::Brotli),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            other => Err(UnknownCompression(other.to_string())),
        }
    }
}

/// The sync protocol extensions a session may use.
///
/// [`SyncFeatures::of`] reads them from the device's banner; a caller may pass
/// fewer (say [`SyncFeatures::legacy`]) to force the original requests, for
/// example to debug an old device's behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncFeatures {
    /// `STA2`/`LST2` with 64-bit sizes and errno on failure (else `STAT`).
    pub stat_v2: bool,
    /// `LIS2` (else `LIST`).
    pub ls_v2: bool,
    /// `SND2`/`RCV2` (else `SEND`/`RECV`).
    pub sendrecv_v2: bool,
    pub brotli: bool,
    pub lz4: bool,
    pub zstd: bool,
    /// `SND2` accepts the dry-run flag.
    pub dry_run_send: bool,
    /// A `RECV` may go before the `STAT` reply (oxadbd's `oxadb_recv_ahead`):
    /// pulls then wait one round trip less.
    pub recv_ahead: bool,
}

/// Where `sync:` sessions come from: a device connected directly, or one
/// an adb host server holds (`host_client::ServerDevice`), whose sessions
/// run over the socket the server relays.
pub trait SyncOpener: Sync {
    /// The device's name in messages.
    fn serial(&self) -> &str;
    /// The sync extensions the device advertises.
    fn sync_features(&self) -> SyncFeatures;
    /// How long a session waits for a reply with nothing arriving.
    fn reply_timeout(&self) -> Option<std::time::Duration>;
    /// Opens `sync:` on the device, using only `features`.
    fn open_sync(
        &self,
        features: SyncFeatures,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = crate::Result<SyncSession>> + Send + '_>>;
}

impl SyncOpener for Device {
    fn serial(&self) -> &str {
        Device::serial(self)
    }

    fn sync_features(&self) -> SyncFeatures {
        SyncFeatures::of(self)
    }

    fn reply_timeout(&self) -> Option<std::time::Duration> {
        Device::reply_timeout(self)
    }

    fn open_sync(
        &self,
        features: SyncFeatures,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = crate::Result<SyncSession>> + Send + '_>>
    {
        Box::pin(SyncSession::open_with(self, features))
    }
}

impl SyncOpener for crate::host_client::ServerDevice {
    fn serial(&self) -> &str {
        crate::host_client::ServerDevice::serial(self)
    }

    fn sync_features(&self) -> SyncFeatures {
        SyncFeatures::from_names(self.features())
    }

    fn reply_timeout(&self) -> Option<std::time::Duration> {
        crate::host_client::ServerDevice::reply_timeout(self)
    }

    fn open_sync(
        &self,
        features: SyncFeatures,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = crate::Result<SyncSession>> + Send + '_>>
    {
        Box::pin(async move {
            let stream = self.open(&DeviceService::Sync).await?;
            Ok(
                SyncSession::over_stream(Box::new(stream), self.serial(), features)
                    .with_reply_timeout(SyncOpener::reply_timeout(self)),
            )
        })
    }
}

impl SyncFeatures {
    /// What `device` advertises.
    pub fn of(device: &Device) -> SyncFeatures {
        SyncFeatures::from_names(device.features())
    }

    /// The extensions in a device's feature list (its banner's `features=`).
    pub fn from_names(features: &[String]) -> SyncFeatures {
        let has = |name: &str| features.iter().any(|f| f == name);
        SyncFeatures {
            stat_v2: has(feature::STAT_V2),
            ls_v2: has(feature::LS_V2),
            sendrecv_v2: has(feature::SENDRECV_V2),
            brotli: has(feature::SENDRECV_V2_BROTLI),
            lz4: has(feature::SENDRECV_V2_LZ4),
            zstd: has(feature::SENDRECV_V2_ZSTD),
            dry_run_send: has(feature::SENDRECV_V2_DRY_RUN_SEND),
            recv_ahead: has(feature::OXADB_RECV_AHEAD),
        }
    }

    /// Only the original protocol: `STAT`, `LIST`, `SEND`, `RECV`.
    pub fn legacy() -> SyncFeatures {
        SyncFeatures::default()
    }

    /// The request versions these features allow, for the protocol machine.
    pub(crate) fn versions(&self) -> oxadb_transfer::Versions {
        oxadb_transfer::Versions {
            stat_v2: self.stat_v2,
            ls_v2: self.ls_v2,
            sendrecv_v2: self.sendrecv_v2,
            recv_ahead: self.recv_ahead,
        }
    }

    /// Whether `compression` (a specific algorithm) can be used with these features.
    pub fn supports(&self, compression: Compression) -> bool {
        self.sendrecv_v2
            && match compression {
                Compression::None | Compression::Any => true,
                Compression::Brotli => self.brotli,
                Compression::Lz4 => self.lz4,
                Compression::Zstd => self.zstd,
            }
    }

    /// The algorithm actually used for `requested`: `Any` becomes the best one
    /// available (zstd, then lz4, then brotli), an unsupported one becomes none.
    pub fn resolve(&self, requested: Compression) -> wire::Compression {
        let choice = match requested {
            Compression::Any if self.sendrecv_v2 && self.zstd => Compression::Zstd,
            Compression::Any if self.sendrecv_v2 && self.lz4 => Compression::Lz4,
            Compression::Any if self.sendrecv_v2 && self.brotli => Compression::Brotli,
            Compression::Any => Compression::None,
            other if self.supports(other) => other,
            _ => Compression::None,
        };
        match choice {
            Compression::Brotli => wire::Compression::Brotli,
            Compression::Lz4 => wire::Compression::Lz4,
            Compression::Zstd => wire::Compression::Zstd,
            Compression::None | Compression::Any => wire::Compression::None,
        }
    }
}

/// How to push (adb's `push` flags).
#[derive(Debug, Clone, Default)]
pub struct PushOptions {
    /// `--sync`: skip files whose size and mtime on the device match the local
    /// file's (a symlink in a tree is compared with the link itself).
    pub sync: bool,
    /// `-z`/`-Z`: compression of the file data.
    pub compression: Compression,
    /// `-n`: send everything with the dry-run flag; the device decodes and
    /// discards the data and changes nothing. Needs `sendrecv_v2_dry_run_send`.
    pub dry_run: bool,
    /// Protocol features to use instead of what the device advertises.
    pub features: Option<SyncFeatures>,
}

/// How to pull (adb's `pull` flags).
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// `-a`: give pulled regular files the device's mtime and mode (the mode
    /// minus this process's umask, as adb does).
    pub preserve: bool,
    /// `-z`/`-Z`: compression of the file data.
    pub compression: Compression,
    /// Protocol features to use instead of what the device advertises.
    pub features: Option<SyncFeatures>,
    /// How pulled files are flushed (`--durability`; fully by default) and
    /// the journal recording where their temporary files are made (none by
    /// default).
    pub storage: oxadb_transfer::Storage,
}

/// Which way files went, for [`TransferSummary::report`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Push,
    Pull,
}

/// What a transfer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransferSummary {
    /// Files (and symlinks) sent or received.
    pub files_transferred: u64,
    /// Files left alone: unchanged ones with `--sync`, special files.
    pub files_skipped: u64,
    /// File content bytes moved (uncompressed size).
    pub bytes: u64,
    pub elapsed: Duration,
    /// Flow-control statistics of the sync stream that carried the transfer
    /// (the last one, if a failure made it reopen), when it is known: in the
    /// total of a [`push`] or [`pull`], not in each source's summary.
    pub stream: Option<crate::StreamStats>,
    /// How the file data of plain pushes left (known where `stream` is).
    pub zero_copy: Option<ZeroCopyStats>,
}

/// How a session's plain pushes sent file data: as file ranges by
/// `sendfile`, or read into memory (docs/architecture.md, "Zero-copy transfers").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ZeroCopyStats {
    /// Whether the zero-copy path was allowed (`--no-zero-copy` and `OXADB_ZERO_COPY=0` turn it off).
    pub enabled: bool,
    /// Files sent as ranges.
    pub files: u64,
    /// File bytes sent by `sendfile`.
    pub sendfile_bytes: u64,
    /// File bytes of ranges read into memory (USB, fallbacks).
    pub copied_bytes: u64,
    /// Files `sendfile` refused, read instead.
    pub fallbacks: u64,
}

impl TransferSummary {
    /// adb's summary line, e.g.
    /// `dir/: 3 files pushed, 1 skipped. 512.3 MB/s (12345678 bytes in 0.023s)`.
    /// An empty `name` leaves out the `name: ` prefix (adb's line for the total).
    pub fn report(&self, name: &str, direction: Direction) -> String {
        let verb = match direction {
            Direction::Push => "pushed",
            Direction::Pull => "pulled",
        };
        let mut line = String::new();
        if !name.is_empty() {
            line.push_str(name);
            line.push_str(": ");
        }
        let plural = if self.files_transferred == 1 { "" } else { "s" };
        line.push_str(&format!(
            "{} file{plural} {verb}, {} skipped.",
            self.files_transferred, self.files_skipped
        ));
        let seconds = self.elapsed.as_secs_f64();
        if self.bytes > 0 && seconds > 0.0 {
            let rate = self.bytes as f64 / seconds / (1024.0 * 1024.0);
            line.push_str(&format!(
                " {rate:.1} MB/s ({} bytes in {seconds:.3}s)",
                self.bytes
            ));
        }
        line
    }

    /// Whether the counters (not the time) are equal: adb prints the total line
    /// only when it differs from the last source's line in this sense.
    /// The stream statistics as lines for `--stats`: bytes and packets each
    /// way, time blocked on credit and on the consumer, and (adaptive credit)
    /// window, headroom, round trip and consumption rate.
    pub fn stats_report(&self) -> Vec<String> {
        let Some(stats) = &self.stream else {
            return vec!["stream stats: not available (no sync stream was used)".to_string()];
        };
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut lines = vec![
            format!(
                "stream stats: flow control {}",
                if stats.delayed_ack {
                    "delayed_ack (burst mode)"
                } else {
                    "classic (one packet in flight)"
                }
            ),
            format!(
                "  sent {} bytes in {} packets, received {} bytes in {} packets; OKAYs sent {}, received {}",
                stats.bytes_sent,
                stats.packets_sent,
                stats.bytes_received,
                stats.packets_received,
                stats.okays_sent,
                stats.okays_received
            ),
            format!(
                "  blocked on credit {:.1} ms, on the consumer {:.1} ms (of {:.1} ms)",
                ms(stats.credit_blocked_ns),
                ms(stats.consumer_blocked_ns),
                self.elapsed.as_secs_f64() * 1e3
            ),
        ];
        if let Some(zc) = self.zero_copy.filter(|zc| zc.files > 0 || !zc.enabled) {
            lines.push(if zc.enabled {
                format!(
                    "  zero-copy: {} files sent as file ranges, {} bytes by sendfile, {} read into memory, {} sendfile fallbacks",
                    zc.files, zc.sendfile_bytes, zc.copied_bytes, zc.fallbacks
                )
            } else {
                "  zero-copy: off (--no-zero-copy or OXADB_ZERO_COPY=0)".to_string()
            });
        }
        if let Some(window) = stats.window {
            lines.push(format!(
                "  our receive window {} bytes (headroom {}), min RTT {}, our consumption rate {}",
                window,
                stats.headroom.unwrap_or(0),
                stats
                    .min_rtt_ns
                    .map_or("not measured".to_string(), |ns| format!(
                        "{:.0} us",
                        ns as f64 / 1e3
                    )),
                stats
                    .consume_rate
                    .map_or("not measured".to_string(), |rate| format!(
                        "{:.1} MB/s",
                        rate as f64 / 1e6
                    ))
            ));
        }
        lines
    }

    pub fn same_counts(&self, other: &TransferSummary) -> bool {
        self.files_transferred == other.files_transferred
            && self.files_skipped == other.files_skipped
            && self.bytes == other.bytes
    }
}

/// Receives progress reports during a transfer. Every method but the first
/// three has a default that ignores the report.
pub trait Progress: Send {
    /// A file transfer begins: `name` is the remote path, `total` its size if known.
    fn start(&mut self, name: &str, total: Option<u64>);
    /// `bytes` more bytes of the current file were sent or received.
    fn advance(&mut self, bytes: u64);
    /// The current file is done (or failed).
    fn finish(&mut self);
    /// Something was left out without failing the transfer, such as a special
    /// file in a tree (`skipping special file ...`).
    fn warning(&mut self, message: &str) {
        let _ = message;
    }
    /// One of the sources given to [`push`] or [`pull`] is done; `source` is as given.
    fn source_finished(&mut self, source: &str, summary: &TransferSummary) {
        let _ = (source, summary);
    }
}

/// A [`Progress`] that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _name: &str, _total: Option<u64>) {}
    fn advance(&mut self, _bytes: u64) {}
    fn finish(&mut self) {}
}

/// File metadata on the device.
///
/// With the original `STAT` request (devices without `stat_v2`) only `mode`,
/// `size` (32 bits) and `mtime` are known; the rest is zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteStat {
    pub dev: u64,
    pub ino: u64,
    /// Full `st_mode`: file type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
}

impl RemoteStat {
    fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }

    pub fn is_file(&self) -> bool {
        self.file_type() == libc::S_IFREG
    }

    pub fn is_symlink(&self) -> bool {
        self.file_type() == libc::S_IFLNK
    }

    /// Permission bits, setuid/setgid/sticky included.
    pub fn permissions(&self) -> u32 {
        self.mode & 0o7777
    }

    pub(crate) fn from_v2(stat: &wire::StatV2) -> RemoteStat {
        RemoteStat {
            dev: stat.dev,
            ino: stat.ino,
            mode: stat.mode,
            nlink: stat.nlink,
            uid: stat.uid,
            gid: stat.gid,
            size: stat.size,
            atime: stat.atime,
            mtime: stat.mtime,
            ctime: stat.ctime,
        }
    }
}

/// One directory entry on the device (`.` and `..` included, as the device sends them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteEntry {
    /// The name as bytes: device file names need not be UTF-8.
    pub name: Vec<u8>,
    /// The entry's own metadata (`lstat`: a symlink is reported as a symlink).
    pub stat: RemoteStat,
}

impl RemoteEntry {
    /// The name, with invalid UTF-8 replaced.
    pub fn name_lossy(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.name)
    }
}

/// `strerror` text for an errno, without Rust's ` (os error N)` suffix.
pub(crate) fn strerror(errno: i32) -> String {
    describe_io(&std::io::Error::from_raw_os_error(errno))
}

/// An I/O error as adb prints it: the `strerror` text for OS errors.
pub(crate) fn describe_io(error: &std::io::Error) -> String {
    let text = error.to_string();
    match error.raw_os_error() {
        Some(code) => text
            .strip_suffix(&format!(" (os error {code})"))
            .map(str::to_string)
            .unwrap_or(text),
        None => text,
    }
}

/// A remote path for messages.
pub(crate) fn show(path: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(path)
}

/// adb's (and POSIX `basename`'s) last path component: trailing slashes are
/// ignored, and a path of only slashes is `/`.
pub(crate) fn basename(path: &[u8]) -> &[u8] {
    let trimmed = match path.iter().rposition(|&b| b != b'/') {
        Some(last) => &path[..=last],
        None if path.is_empty() => return b".",
        None => return b"/",
    };
    match trimmed.iter().rposition(|&b| b == b'/') {
        Some(slash) => &trimmed[slash + 1..],
        None => trimmed,
    }
}

/// `dir` + `/` + `name`, without doubling a slash `dir` already ends with.
pub(crate) fn join_remote(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    path.extend_from_slice(dir);
    if !path.ends_with(b"/") {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// The failure for a transfer, in adb's words.
pub(crate) fn transfer_error(message: String) -> crate::Error {
    crate::Error::Transfer {
        messages: vec![message],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basename_like_adb() {
        assert_eq!(basename(b"/sdcard/dir/"), b"dir");
        assert_eq!(basename(b"file"), b"file");
        assert_eq!(basename(b"a/b//"), b"b");
        assert_eq!(basename(b"///"), b"/");
        assert_eq!(basename(b""), b".");
        assert_eq!(basename(b"."), b".");
    }

    #[test]
    fn join_remote_adds_one_slash() {
        assert_eq!(join_remote(b"/data", b"x"), b"/data/x");
        assert_eq!(join_remote(b"/data/", b"x"), b"/data/x");
        assert_eq!(join_remote(b"/", b"x"), b"/x");
    }

    #[test]
    fn compression_resolution_follows_adb_order() {
        let all = SyncFeatures {
            stat_v2: true,
            ls_v2: true,
            sendrecv_v2: true,
            brotli: true,
            lz4: true,
            zstd: true,
            dry_run_send: true,
            recv_ahead: true,
        };
        assert_eq!(all.resolve(Compression::Any), wire::Compression::Zstd);
        let no_zstd = SyncFeatures { zstd: false, ..all };
        assert_eq!(no_zstd.resolve(Compression::Any), wire::Compression::Lz4);
        assert_eq!(no_zstd.resolve(Compression::Zstd), wire::Compression::None);
        let only_brotli = SyncFeatures {
            lz4: false,
            zstd: false,
            ..all
        };
        assert_eq!(
            only_brotli.resolve(Compression::Any),
            wire::Compression::Brotli
        );
        let no_v2 = SyncFeatures {
            sendrecv_v2: false,
            ..all
        };
        assert_eq!(no_v2.resolve(Compression::Brotli), wire::Compression::None);
        assert_eq!(no_v2.resolve(Compression::Any), wire::Compression::None);
        assert_eq!(
            SyncFeatures::legacy().resolve(Compression::Lz4),
            wire::Compression::None
        );
    }

    #[test]
    fn compression_names_round_trip() {
        for name in Compression::NAMES {
            assert_eq!(name.parse::<Compression>().unwrap().name(), name);
        }
        assert!("gzip".parse::<Compression>().is_err());
    }

    #[test]
    fn summary_line_matches_adb() {
        let summary = TransferSummary {
            files_transferred: 1,
            files_skipped: 0,
            bytes: 1024 * 1024,
            elapsed: Duration::from_millis(500),
            stream: None,
            zero_copy: None,
        };
        assert_eq!(
            summary.report("a.txt", Direction::Push),
            "a.txt: 1 file pushed, 0 skipped. 2.0 MB/s (1048576 bytes in 0.500s)"
        );
        let empty = TransferSummary {
            files_transferred: 0,
            files_skipped: 2,
            ..TransferSummary::default()
        };
        assert_eq!(
            empty.report("", Direction::Pull),
            "0 files pulled, 2 skipped."
        );
    }

    #[test]
    fn io_errors_read_like_strerror() {
        assert_eq!(strerror(libc::ENOENT), "No such file or directory");
        let custom = std::io::Error::other("boom");
        assert_eq!(describe_io(&custom), "boom");
    }
}
