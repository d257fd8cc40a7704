//! File sync against an in-process `oxadbd`: push and pull of files and trees,
//! in burst mode and in classic flow control (daemon side and host side).
//! The daemon runs in this process as the same user, so "remote" paths are
//! paths in local temporary directories.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use oxadb::sync::{
    self, Compression, Direction, NoProgress, Progress, PullOptions, PushOptions, SyncFeatures,
    SyncSession, TransferSummary,
};
use oxadb::{ConnectOptions, CreditMode, Device, Error};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Both sides offer delayed_ack and grant adaptive credit (the default).
    Burst,
    /// Both sides offer delayed_ack and grant AOSP's fixed credit.
    BurstAosp,
    /// Burst mode against a daemon with a tiny memory budget (256 KiB: every
    /// stream lives on its one-packet floor and a few KiB) and no headroom.
    BurstTinyBudget,
    /// The daemon does not offer delayed_ack.
    ClassicDaemon,
    /// The host does not offer delayed_ack.
    ClassicHost,
}

const MODES: [Mode; 5] = [
    Mode::Burst,
    Mode::BurstAosp,
    Mode::BurstTinyBudget,
    Mode::ClassicDaemon,
    Mode::ClassicHost,
];

impl Mode {
    fn daemon_credit(self) -> CreditMode {
        match self {
            Mode::Burst | Mode::BurstTinyBudget | Mode::ClassicHost => CreditMode::Adaptive,
            Mode::BurstAosp => CreditMode::Aosp,
            Mode::ClassicDaemon => CreditMode::Classic,
        }
    }

    fn host_credit(self) -> CreditMode {
        match self {
            Mode::Burst | Mode::BurstTinyBudget | Mode::ClassicDaemon => CreditMode::Adaptive,
            Mode::BurstAosp => CreditMode::Aosp,
            Mode::ClassicHost => CreditMode::Classic,
        }
    }
}

/// A daemon on a free loopback port and a device connected to it.
struct Setup {
    device: Device,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.device.close();
        self.server.abort();
    }
}

async fn connect(mode: Mode) -> Setup {
    connect_with(mode, false).await
}

/// [`connect`], with `zero_copy` (`sendfile`) for the host's pushes and the
/// daemon's pulls.
async fn connect_with(mode: Mode, zero_copy: bool) -> Setup {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listen = listener.local_addr().unwrap();
    let config = oxadbd::config::DaemonConfig {
        credit: mode.daemon_credit(),
        memory_budget: if mode == Mode::BurstTinyBudget {
            oxadbd::config::BudgetLimits::from_limit(256 << 10)
        } else {
            oxadbd::config::BudgetLimits::from_limit(256 << 20)
        },
        ack_headroom: mode != Mode::BurstTinyBudget,
        zero_copy,
        ..oxadbd::config::DaemonConfig::with_defaults(listen).unwrap()
    };
    let server = tokio::spawn(oxadbd::server::serve(listener, config));
    let options = ConnectOptions {
        credit: mode.host_credit(),
        authenticate: false,
        timeout: Duration::from_secs(10),
        // The tiny budget applies to the host's receive windows (pulls) too.
        memory_budget: (mode == Mode::BurstTinyBudget).then(|| {
            std::sync::Arc::new(oxadb::MemoryBudget::new(
                oxadbd::config::BudgetLimits::from_limit(256 << 10),
            ))
        }),
        ack_headroom: mode != Mode::BurstTinyBudget,
        zero_copy,
        ..Default::default()
    };
    let device = Device::connect(&listen.to_string(), &options)
        .await
        .unwrap();
    assert_eq!(
        device.burst_mode(),
        matches!(mode, Mode::Burst | Mode::BurstAosp | Mode::BurstTinyBudget),
        "{mode:?}"
    );
    Setup { device, server }
}

/// A temporary directory on tmpfs when there is one, so that the disk does
/// not set the pace of timing-sensitive tests.
fn memory_tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap())
}

/// Deterministic pseudo-random bytes (xorshift).
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Half runs of one byte, half random: every algorithm compresses it.
fn compressible_bytes(len: usize) -> Vec<u8> {
    let noise = random_bytes(len, 99);
    (0..len)
        .map(|i| if i % 256 < 160 { b'x' } else { noise[i] })
        .collect()
}

fn remote(path: &Path) -> String {
    path.to_str().expect("test paths are UTF-8").to_string()
}

fn set_mtime(path: &Path, seconds: u64) {
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(seconds);
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

fn set_symlink_mtime(path: &Path, seconds: i64) {
    oxadb_transfer::set_times_at(path, seconds, false).unwrap();
}

fn umask() -> u32 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix("Umask:"))
        .unwrap();
    u32::from_str_radix(line.trim(), 8).unwrap()
}

/// Names in `dir` that look like a pull's temporary files.
fn temp_files(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".oxadb-"))
        .collect()
}

fn transfer_messages(error: Error) -> Vec<String> {
    match error {
        Error::Transfer { messages } => messages,
        other => panic!("expected a transfer error, got {other:?}"),
    }
}

/// Records everything a transfer reports.
#[derive(Default)]
struct Recorder {
    started: Vec<(String, Option<u64>)>,
    bytes: u64,
    finished: usize,
    warnings: Vec<String>,
    sources: Vec<(String, TransferSummary)>,
}

impl Progress for Recorder {
    fn start(&mut self, name: &str, total: Option<u64>) {
        self.started.push((name.to_string(), total));
    }
    fn advance(&mut self, bytes: u64) {
        self.bytes += bytes;
    }
    fn finish(&mut self) {
        self.finished += 1;
    }
    fn warning(&mut self, message: &str) {
        self.warnings.push(message.to_string());
    }
    fn source_finished(&mut self, source: &str, summary: &TransferSummary) {
        self.sources.push((source.to_string(), *summary));
    }
}

async fn push_paths(
    device: &Device,
    sources: &[&Path],
    destination: &str,
    options: &PushOptions,
) -> oxadb::Result<TransferSummary> {
    let sources: Vec<PathBuf> = sources.iter().map(|p| p.to_path_buf()).collect();
    sync::push(device, &sources, destination, options, &mut NoProgress).await
}

async fn pull_paths(
    device: &Device,
    sources: &[&Path],
    destination: &Path,
    options: &PullOptions,
) -> oxadb::Result<TransferSummary> {
    let sources: Vec<String> = sources.iter().map(|p| remote(p)).collect();
    sync::pull(device, &sources, destination, options, &mut NoProgress).await
}

/// Asserts two trees hold the same regular files (and, with `links`, symlinks).
fn assert_same_tree(expected: &Path, actual: &Path) {
    for entry in fs::read_dir(expected).unwrap() {
        let entry = entry.unwrap();
        let other = actual.join(entry.file_name());
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            assert_same_tree(&entry.path(), &other);
        } else if kind.is_symlink() {
            assert_eq!(
                fs::read_link(&other).unwrap(),
                fs::read_link(entry.path()).unwrap(),
                "{}",
                other.display()
            );
        } else {
            assert_eq!(
                fs::read(&other).unwrap(),
                fs::read(entry.path()).unwrap(),
                "{}",
                other.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_and_pull_8_mib_random_file() {
    let data = random_bytes(8 * 1024 * 1024 + 12345, 1);
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("big.bin");
        fs::write(&local, &data).unwrap();
        let remote_dir = dir.path().join("device");
        fs::create_dir(&remote_dir).unwrap();

        let mut progress = Recorder::default();
        let summary = sync::push(
            &setup.device,
            std::slice::from_ref(&local),
            &remote(&remote_dir),
            &PushOptions::default(),
            &mut progress,
        )
        .await
        .unwrap();
        let pushed = remote_dir.join("big.bin");
        assert!(fs::read(&pushed).unwrap() == data, "{mode:?}: pushed bytes");
        assert_eq!(summary.files_transferred, 1);
        assert_eq!(summary.bytes, data.len() as u64);
        assert_eq!(progress.bytes, data.len() as u64);
        assert_eq!(
            progress.started,
            [(remote(&pushed), Some(data.len() as u64))]
        );
        assert_eq!(progress.finished, 1);
        assert_eq!(progress.sources.len(), 1);
        assert_eq!(progress.sources[0].0, local.display().to_string());

        let back = dir.path().join("back.bin");
        let mut progress = Recorder::default();
        let summary = sync::pull(
            &setup.device,
            &[remote(&pushed)],
            &back,
            &PullOptions::default(),
            &mut progress,
        )
        .await
        .unwrap();
        assert!(fs::read(&back).unwrap() == data, "{mode:?}: pulled bytes");
        assert_eq!(summary.files_transferred, 1);
        assert_eq!(summary.bytes, data.len() as u64);
        assert_eq!(progress.bytes, data.len() as u64);
        assert!(temp_files(dir.path()).is_empty());
    }
}

/// With zero-copy on (`--zero-copy`), plain pushes and pulls of regular
/// files go as file ranges (sendfile) on both ends over TCP; sizes on frame
/// and packet edges arrive intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_copy_round_trips_at_frame_and_packet_edges() {
    const K64: usize = 64 * 1024;
    let sizes = [
        1,
        K64,
        K64 + 1,
        15 * K64,
        1024 * 1024 + 1,
        3 * 1024 * 1024 + 7,
    ];
    for mode in [Mode::Burst, Mode::BurstTinyBudget, Mode::ClassicHost] {
        let setup = connect_with(mode, true).await;
        let dir = tempfile::tempdir().unwrap();
        let remote_dir = dir.path().join("device");
        fs::create_dir(&remote_dir).unwrap();
        for (i, &size) in sizes.iter().enumerate() {
            let data = random_bytes(size, i as u64 + 7);
            let local = dir.path().join(format!("f{i}"));
            fs::write(&local, &data).unwrap();
            let summary = push_paths(
                &setup.device,
                &[&local],
                &remote(&remote_dir),
                &PushOptions::default(),
            )
            .await
            .unwrap();
            let pushed = remote_dir.join(format!("f{i}"));
            assert!(
                fs::read(&pushed).unwrap() == data,
                "{mode:?} {size}: pushed"
            );
            let zc = summary.zero_copy.expect("zero-copy counters");
            if size >= K64 {
                // Smaller files go with their request, in one write.
                assert_eq!(zc.files, 1, "{mode:?} {size}");
                assert_eq!(zc.sendfile_bytes, size as u64, "{mode:?} {size}");
                assert_eq!((zc.copied_bytes, zc.fallbacks), (0, 0));
            }
            let back = dir.path().join(format!("back{i}"));
            pull_paths(&setup.device, &[&pushed], &back, &PullOptions::default())
                .await
                .unwrap();
            assert!(fs::read(&back).unwrap() == data, "{mode:?} {size}: pulled");
        }
        assert!(temp_files(dir.path()).is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_file_round_trip() {
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("empty");
        fs::write(&local, b"").unwrap();
        let pushed = dir.path().join("pushed-empty");
        let summary = push_paths(
            &setup.device,
            &[&local],
            &remote(&pushed),
            &PushOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!((summary.files_transferred, summary.bytes), (1, 0));
        assert_eq!(fs::read(&pushed).unwrap(), b"");
        let back = dir.path().join("back");
        fs::write(&back, b"old content").unwrap();
        pull_paths(&setup.device, &[&pushed], &back, &PullOptions::default())
            .await
            .unwrap();
        assert_eq!(fs::read(&back).unwrap(), b"", "{mode:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_and_mtime_are_kept() {
    const MTIME: u64 = 1_500_000_000;
    let mask = umask();
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();
        for (name, size) in [("small", 100), ("large", 300_000)] {
            let local = dir.path().join(name);
            fs::write(&local, random_bytes(size, 2)).unwrap();
            fs::set_permissions(&local, fs::Permissions::from_mode(0o751)).unwrap();
            set_mtime(&local, MTIME);
            let pushed = dir.path().join(format!("{name}-pushed"));
            push_paths(
                &setup.device,
                &[&local],
                &remote(&pushed),
                &PushOptions::default(),
            )
            .await
            .unwrap();
            let metadata = fs::metadata(&pushed).unwrap();
            assert_eq!(metadata.mode() & 0o7777, 0o751, "{mode:?} {name}");
            assert_eq!(metadata.mtime(), MTIME as i64, "{mode:?} {name}");

            // Without -a: a fresh file, 0644 minus the umask, pulled now.
            let plain = dir.path().join(format!("{name}-plain"));
            pull_paths(&setup.device, &[&pushed], &plain, &PullOptions::default())
                .await
                .unwrap();
            let metadata = fs::metadata(&plain).unwrap();
            assert_eq!(metadata.mode() & 0o7777, 0o644 & !mask);
            assert_ne!(metadata.mtime(), MTIME as i64);

            // -a: the device's mode (minus the umask) and mtime.
            let kept = dir.path().join(format!("{name}-kept"));
            let options = PullOptions {
                preserve: true,
                ..PullOptions::default()
            };
            pull_paths(&setup.device, &[&pushed], &kept, &options)
                .await
                .unwrap();
            let metadata = fs::metadata(&kept).unwrap();
            assert_eq!(metadata.mode() & 0o7777, 0o751 & !mask, "{mode:?} {name}");
            assert_eq!(metadata.mtime(), MTIME as i64, "{mode:?} {name}");
        }
    }
}

/// A tree with nested directories, symlinks, spaces and non-ASCII names.
fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("ünïcödé dir/日本")).unwrap();
    fs::write(root.join("top.bin"), random_bytes(200_000, 3)).unwrap();
    fs::write(root.join("with space.txt"), b"spaces").unwrap();
    fs::write(root.join("a/b/c/deep.txt"), b"deep").unwrap();
    fs::write(root.join("a/empty"), b"").unwrap();
    fs::write(
        root.join("ünïcödé dir/日本/名前.txt"),
        "こんにちは".as_bytes(),
    )
    .unwrap();
    fs::write(root.join("ünïcödé dir/100k"), random_bytes(100_000, 4)).unwrap();
    symlink("top.bin", root.join("link-to-top")).unwrap();
    symlink("../a", root.join("ünïcödé dir/link-to-dir")).unwrap();
    symlink("nowhere/at all", root.join("dangling")).unwrap();
    set_symlink_mtime(&root.join("link-to-top"), 1_400_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tree_with_nested_dirs_symlinks_and_odd_names() {
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        make_tree(&tree);

        // To a new path: the tree's contents become that directory.
        let copy = dir.path().join("device/copy");
        let mut progress = Recorder::default();
        let summary = sync::push(
            &setup.device,
            std::slice::from_ref(&tree),
            &remote(&copy),
            &PushOptions::default(),
            &mut progress,
        )
        .await
        .unwrap();
        assert_eq!(summary.files_transferred, 9, "{mode:?}");
        assert_eq!(summary.files_skipped, 0);
        assert!(progress.warnings.is_empty(), "{:?}", progress.warnings);
        assert_same_tree(&tree, &copy);
        let link = fs::symlink_metadata(copy.join("link-to-top")).unwrap();
        assert!(link.file_type().is_symlink());
        assert_eq!(link.mtime(), 1_400_000_000, "the link's own mtime");
        assert!(fs::symlink_metadata(copy.join("dangling"))
            .unwrap()
            .file_type()
            .is_symlink());

        // To an existing directory: the tree goes inside under its name.
        let device_dir = dir.path().join("device");
        push_paths(
            &setup.device,
            &[&tree],
            &remote(&device_dir),
            &PushOptions::default(),
        )
        .await
        .unwrap();
        assert_same_tree(&tree, &device_dir.join("tree"));

        // Pull it back: symlinks are followed, the dangling one is skipped.
        let back = dir.path().join("back");
        let mut progress = Recorder::default();
        let summary = sync::pull(
            &setup.device,
            &[remote(&copy)],
            &back,
            &PullOptions::default(),
            &mut progress,
        )
        .await
        .unwrap();
        assert_eq!(
            fs::read(back.join("link-to-top")).unwrap(),
            fs::read(tree.join("top.bin")).unwrap()
        );
        assert!(fs::symlink_metadata(back.join("link-to-top"))
            .unwrap()
            .is_file());
        assert_eq!(
            fs::read(back.join("ünïcödé dir/link-to-dir/b/c/deep.txt")).unwrap(),
            b"deep"
        );
        assert!(!back.join("dangling").exists());
        assert!(
            progress
                .warnings
                .iter()
                .any(|w| w.contains("dangling") && w.contains("No such file")),
            "{:?}",
            progress.warnings
        );
        for path in [
            "top.bin",
            "with space.txt",
            "a/b/c/deep.txt",
            "a/empty",
            "ünïcödé dir/日本/名前.txt",
            "ünïcödé dir/100k",
        ] {
            assert_eq!(
                fs::read(back.join(path)).unwrap(),
                fs::read(tree.join(path)).unwrap(),
                "{mode:?} {path}"
            );
        }
        // 6 regular files, link-to-top, and deep.txt + empty through link-to-dir.
        assert_eq!(summary.files_transferred, 9, "{mode:?}");

        // Into an existing directory: under the source's name.
        let into = dir.path().join("into");
        fs::create_dir(&into).unwrap();
        pull_paths(&setup.device, &[&copy], &into, &PullOptions::default())
            .await
            .unwrap();
        assert_eq!(fs::read(into.join("copy/a/b/c/deep.txt")).unwrap(), b"deep");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_sources_into_a_directory() {
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();
        let one = dir.path().join("one.txt");
        let two = dir.path().join("two.bin");
        let tree = dir.path().join("tree");
        fs::write(&one, b"one").unwrap();
        fs::write(&two, random_bytes(150_000, 5)).unwrap();
        fs::create_dir(&tree).unwrap();
        fs::write(tree.join("inner"), b"inner").unwrap();
        let device_dir = dir.path().join("device");
        fs::create_dir(&device_dir).unwrap();

        let mut progress = Recorder::default();
        let total = sync::push(
            &setup.device,
            &[one.clone(), two.clone(), tree.clone()],
            &format!("{}/", remote(&device_dir)),
            &PushOptions::default(),
            &mut progress,
        )
        .await
        .unwrap();
        assert_eq!(total.files_transferred, 3);
        assert_eq!(total.bytes, 3 + 150_000 + 5);
        assert_eq!(progress.sources.len(), 3);
        assert_eq!(fs::read(device_dir.join("one.txt")).unwrap(), b"one");
        assert_eq!(
            fs::read(device_dir.join("two.bin")).unwrap(),
            fs::read(&two).unwrap()
        );
        assert_eq!(fs::read(device_dir.join("tree/inner")).unwrap(), b"inner");

        // Several sources need a directory.
        let not_dir = device_dir.join("one.txt");
        let error = push_paths(
            &setup.device,
            &[&one, &two],
            &remote(&not_dir),
            &PushOptions::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            transfer_messages(error),
            [format!("target '{}' is not a directory", remote(&not_dir))]
        );

        // Pull several back into a local directory.
        let back = dir.path().join("back");
        fs::create_dir(&back).unwrap();
        let total = pull_paths(
            &setup.device,
            &[
                &device_dir.join("one.txt"),
                &device_dir.join("two.bin"),
                &device_dir.join("tree"),
            ],
            &back,
            &PullOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(total.files_transferred, 3, "{mode:?}");
        assert_eq!(fs::read(back.join("one.txt")).unwrap(), b"one");
        assert_eq!(fs::read(back.join("tree/inner")).unwrap(), b"inner");

        // A missing source fails alone; the others are still copied.
        let missing = dir.path().join("missing");
        let again = dir.path().join("again");
        fs::create_dir(&again).unwrap();
        let error = push_paths(
            &setup.device,
            &[&missing, &one],
            &remote(&again),
            &PushOptions::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            transfer_messages(error),
            [format!(
                "cannot stat '{}': No such file or directory",
                missing.display()
            )]
        );
        assert_eq!(fs::read(again.join("one.txt")).unwrap(), b"one");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_skips_unchanged_files() {
    let sync_options = PushOptions {
        sync: true,
        ..PushOptions::default()
    };
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        make_tree(&tree);
        // Into an existing directory each time (a missing destination would
        // become the tree the first time and hold it the second, as with adb).
        let device_dir = dir.path().join("device");
        fs::create_dir(&device_dir).unwrap();
        let copy = device_dir.join("tree");
        let first = push_paths(&setup.device, &[&tree], &remote(&device_dir), &sync_options)
            .await
            .unwrap();
        assert_eq!((first.files_transferred, first.files_skipped), (9, 0));

        let again = push_paths(&setup.device, &[&tree], &remote(&device_dir), &sync_options)
            .await
            .unwrap();
        assert_eq!(
            (again.files_transferred, again.files_skipped),
            (0, 9),
            "{mode:?}"
        );

        // A changed file (new size and mtime) goes again; the rest is skipped.
        fs::write(tree.join("a/b/c/deep.txt"), b"deeper").unwrap();
        set_mtime(&tree.join("a/b/c/deep.txt"), 1_600_000_000);
        let changed = push_paths(&setup.device, &[&tree], &remote(&device_dir), &sync_options)
            .await
            .unwrap();
        assert_eq!((changed.files_transferred, changed.files_skipped), (1, 8));
        assert_eq!(fs::read(copy.join("a/b/c/deep.txt")).unwrap(), b"deeper");

        // Same for a single file, and through the session API.
        let file = tree.join("top.bin");
        let target = dir.path().join("single");
        let once = push_paths(&setup.device, &[&file], &remote(&target), &sync_options)
            .await
            .unwrap();
        assert_eq!(once.files_transferred, 1);
        let twice = push_paths(&setup.device, &[&file], &remote(&target), &sync_options)
            .await
            .unwrap();
        assert_eq!((twice.files_transferred, twice.files_skipped), (0, 1));
        let mut session = SyncSession::open(&setup.device).await.unwrap();
        let summary = session
            .push_file(&file, remote(&target), &sync_options, &mut NoProgress)
            .await
            .unwrap();
        assert_eq!(summary.files_skipped, 1);
        session.quit().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_compression_push_and_pull() {
    let compressible = compressible_bytes(3 * 1024 * 1024 + 7);
    let random = random_bytes(1024 * 1024 + 3, 6);
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();
        let sources = [
            (dir.path().join("compressible"), &compressible),
            (dir.path().join("random"), &random),
        ];
        for (path, data) in &sources {
            fs::write(path, data).unwrap();
        }
        for compression in [
            Compression::Brotli,
            Compression::Lz4,
            Compression::Zstd,
            Compression::Any,
        ] {
            let device_dir = dir.path().join(format!("device-{compression}"));
            fs::create_dir(&device_dir).unwrap();
            let options = PushOptions {
                compression,
                ..PushOptions::default()
            };
            let mut progress = Recorder::default();
            let summary = sync::push(
                &setup.device,
                &[sources[0].0.clone(), sources[1].0.clone()],
                &remote(&device_dir),
                &options,
                &mut progress,
            )
            .await
            .unwrap();
            assert!(progress.warnings.is_empty(), "{:?}", progress.warnings);
            assert_eq!(summary.bytes, (compressible.len() + random.len()) as u64);
            assert_eq!(progress.bytes, summary.bytes);
            for (path, data) in &sources {
                let pushed = device_dir.join(path.file_name().unwrap());
                assert!(
                    fs::read(&pushed).unwrap() == **data,
                    "{mode:?} {compression} push"
                );
                let back = dir.path().join(format!("back-{compression}"));
                let options = PullOptions {
                    compression,
                    ..PullOptions::default()
                };
                let mut progress = Recorder::default();
                let summary = sync::pull(
                    &setup.device,
                    &[remote(&pushed)],
                    &back,
                    &options,
                    &mut progress,
                )
                .await
                .unwrap();
                assert!(
                    fs::read(&back).unwrap() == **data,
                    "{mode:?} {compression} pull"
                );
                assert_eq!(summary.bytes, data.len() as u64);
                assert_eq!(progress.bytes, data.len() as u64);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_falls_back_when_unsupported() {
    let setup = connect(Mode::Burst).await;
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("data");
    let data = compressible_bytes(500_000);
    fs::write(&local, &data).unwrap();
    let features = SyncFeatures {
        zstd: false,
        ..SyncFeatures::of(&setup.device)
    };
    let options = PushOptions {
        compression: Compression::Zstd,
        features: Some(features),
        ..PushOptions::default()
    };
    let mut progress = Recorder::default();
    let target = dir.path().join("pushed");
    sync::push(
        &setup.device,
        std::slice::from_ref(&local),
        &remote(&target),
        &options,
        &mut progress,
    )
    .await
    .unwrap();
    assert_eq!(fs::read(&target).unwrap(), data);
    assert_eq!(
        progress.warnings,
        ["the device does not support zstd compression; transferring uncompressed"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_protocol_round_trip() {
    // STAT/LIST/SEND/RECV only, as with a device without stat_v2, ls_v2, sendrecv_v2.
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        make_tree(&tree);
        let push_options = PushOptions {
            features: Some(SyncFeatures::legacy()),
            sync: true,
            compression: Compression::Any,
            ..PushOptions::default()
        };
        let device_dir = dir.path().join("device");
        fs::create_dir(&device_dir).unwrap();
        let copy = device_dir.join("tree");
        let summary = push_paths(&setup.device, &[&tree], &remote(&device_dir), &push_options)
            .await
            .unwrap();
        assert_eq!(summary.files_transferred, 9);
        assert_same_tree(&tree, &copy);
        let again = push_paths(&setup.device, &[&tree], &remote(&device_dir), &push_options)
            .await
            .unwrap();
        assert_eq!(again.files_skipped, 9, "{mode:?}");

        let pull_options = PullOptions {
            features: Some(SyncFeatures::legacy()),
            preserve: true,
            compression: Compression::Any,
            ..PullOptions::default()
        };
        // Without stat_v2 a dangling link looks like a file that can't be
        // opened (adb fails the same way); leave it out.
        fs::remove_file(copy.join("dangling")).unwrap();
        let back = dir.path().join("back");
        pull_paths(&setup.device, &[&copy], &back, &pull_options)
            .await
            .unwrap();
        assert_eq!(
            fs::read(back.join("ünïcödé dir/100k")).unwrap(),
            fs::read(tree.join("ünïcödé dir/100k")).unwrap()
        );
        assert_eq!(
            fs::read(back.join("ünïcödé dir/link-to-dir/b/c/deep.txt")).unwrap(),
            b"deep"
        );
        let error = pull_paths(
            &setup.device,
            &[&dir.path().join("missing")],
            &back,
            &pull_options,
        )
        .await
        .unwrap_err();
        assert_eq!(
            transfer_messages(error),
            [format!(
                "remote object '{}' does not exist",
                dir.path().join("missing").display()
            )]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_stat_lstat_and_list() {
    let setup = connect(Mode::Burst).await;
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("file"), b"12345").unwrap();
    symlink("file", dir.path().join("link")).unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    for features in [SyncFeatures::of(&setup.device), SyncFeatures::legacy()] {
        let mut session = SyncSession::open_with(&setup.device, features)
            .await
            .unwrap();
        let stat = session
            .stat(remote(&dir.path().join("link")))
            .await
            .unwrap();
        assert!(stat.is_file());
        let lstat = session
            .lstat(remote(&dir.path().join("link")))
            .await
            .unwrap();
        assert!(lstat.is_symlink());
        let file = session
            .stat(remote(&dir.path().join("file")))
            .await
            .unwrap();
        assert_eq!(file.size, 5);
        let missing = dir.path().join("missing");
        let error = session.stat(remote(&missing)).await.unwrap_err();
        assert!(error.to_string().contains(&remote(&missing)), "{error}");
        let mut names: Vec<String> = session
            .list(remote(dir.path()))
            .await
            .unwrap()
            .iter()
            .map(|entry| entry.name_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [".", "..", "file", "link", "sub"]);
        session.quit().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_leaves_nothing() {
    let options = PushOptions {
        dry_run: true,
        compression: Compression::Lz4,
        ..PushOptions::default()
    };
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        make_tree(&tree);
        let target = dir.path().join("device/tree");
        let summary = push_paths(&setup.device, &[&tree], &remote(&target), &options)
            .await
            .unwrap();
        assert_eq!(summary.files_transferred, 9, "{mode:?}");
        assert!(!dir.path().join("device").exists());

        // An existing file is not touched either.
        let existing = dir.path().join("existing");
        fs::write(&existing, b"keep").unwrap();
        push_paths(
            &setup.device,
            &[&tree.join("top.bin")],
            &remote(&existing),
            &options,
        )
        .await
        .unwrap();
        assert_eq!(fs::read(&existing).unwrap(), b"keep");

        // A device without the feature gets a clear error.
        let without = PushOptions {
            features: Some(SyncFeatures {
                dry_run_send: false,
                ..SyncFeatures::of(&setup.device)
            }),
            ..options.clone()
        };
        let error = push_paths(&setup.device, &[&tree], &remote(&target), &without)
            .await
            .unwrap_err();
        assert_eq!(
            transfer_messages(error),
            ["dry-run not supported by the device"]
        );
    }
}

/// A private `/dev/null` look-alike (never the real one); returns its mode.
fn make_null_node(path: &Path) -> u32 {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mknod has no other preconditions.
    let rc = unsafe { libc::mknod(c_path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
    fs::symlink_metadata(path).unwrap().mode()
}

fn assert_null_node(path: &Path, mode: u32) {
    let metadata = fs::symlink_metadata(path).unwrap();
    assert!(
        metadata.file_type().is_char_device(),
        "{} is no longer a character device",
        path.display()
    );
    assert_eq!(metadata.rdev(), libc::makedev(1, 3));
    assert_eq!(metadata.mode(), mode, "mode unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_into_a_char_device_keeps_it() {
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("source");
        fs::write(&source, random_bytes(300_000, 7)).unwrap();
        fs::set_permissions(&source, fs::Permissions::from_mode(0o600)).unwrap();
        let null = dir.path().join("null");
        let null_mode = make_null_node(&null);

        for preserve in [false, true] {
            for compression in [Compression::None, Compression::Zstd] {
                let options = PullOptions {
                    preserve,
                    compression,
                    ..PullOptions::default()
                };
                let summary = pull_paths(&setup.device, &[&source], &null, &options)
                    .await
                    .unwrap();
                assert_eq!(summary.bytes, 300_000);
                assert_null_node(&null, null_mode);
            }
        }
        // A failed pull leaves it alone too.
        let error = pull_paths(
            &setup.device,
            &[&dir.path().join("missing")],
            &null,
            &PullOptions::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(transfer_messages(error).len(), 1);
        let mut session = SyncSession::open(&setup.device).await.unwrap();
        session
            .pull_file(
                remote(&dir.path().join("missing")),
                &null,
                &PullOptions::default(),
                &mut NoProgress,
            )
            .await
            .unwrap_err();
        assert_null_node(&null, null_mode);
        assert!(temp_files(dir.path()).is_empty(), "{mode:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_pull_keeps_the_existing_file() {
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("precious");
        fs::write(&local, b"old content").unwrap();
        let missing = dir.path().join("missing");

        // The high-level pull stats first.
        let error = pull_paths(&setup.device, &[&missing], &local, &PullOptions::default())
            .await
            .unwrap_err();
        assert_eq!(
            transfer_messages(error),
            [format!(
                "failed to stat remote object '{}': No such file or directory",
                remote(&missing)
            )]
        );

        // The session's pull_file asks directly: the device's FAIL arrives
        // after the temporary file was created, which must go away again.
        let mut session = SyncSession::open(&setup.device).await.unwrap();
        let error = session
            .pull_file(
                remote(&missing),
                &local,
                &PullOptions::default(),
                &mut NoProgress,
            )
            .await
            .unwrap_err();
        let message = transfer_messages(error).join("\n");
        assert!(
            message.starts_with(&format!(
                "failed to copy '{}' to '{}': remote ",
                remote(&missing),
                local.display()
            )),
            "{message}"
        );
        assert!(message.contains("No such file or directory"), "{message}");
        assert!(session.is_ended());
        drop(session);

        // A directory is refused before it is opened, with or without
        // compression.
        for compression in [Compression::None, Compression::Brotli] {
            let mut session = SyncSession::open(&setup.device).await.unwrap();
            let options = PullOptions {
                compression,
                ..PullOptions::default()
            };
            let error = session
                .pull_file(remote(dir.path()), &local, &options, &mut NoProgress)
                .await
                .unwrap_err();
            let message = transfer_messages(error).join("\n");
            assert!(
                message.contains("not a regular file or device (a directory)"),
                "{message}"
            );
        }
        assert_eq!(fs::read(&local).unwrap(), b"old content", "{mode:?}");
        assert!(
            temp_files(dir.path()).is_empty(),
            "{:?}",
            temp_files(dir.path())
        );

        // A successful pull replaces it.
        let source = dir.path().join("source");
        fs::write(&source, b"new content").unwrap();
        pull_paths(&setup.device, &[&source], &local, &PullOptions::default())
            .await
            .unwrap();
        assert_eq!(fs::read(&local).unwrap(), b"new content");
        assert!(temp_files(dir.path()).is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_path_and_the_cause() {
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = tempfile::tempdir().unwrap();

        // Missing local file.
        let missing = dir.path().join("no such file");
        let error = push_paths(
            &setup.device,
            &[&missing],
            &remote(dir.path()),
            &PushOptions::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            transfer_messages(error),
            [format!(
                "cannot stat '{}': No such file or directory",
                missing.display()
            )]
        );

        // Missing remote file.
        let error = pull_paths(
            &setup.device,
            &[&missing],
            dir.path(),
            &PullOptions::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            transfer_messages(error),
            [format!(
                "failed to stat remote object '{}': No such file or directory",
                missing.display()
            )]
        );

        // Local destination whose parent is missing.
        let nowhere = dir.path().join("nowhere/file");
        fs::write(dir.path().join("source"), b"x").unwrap();
        let error = pull_paths(
            &setup.device,
            &[&dir.path().join("source")],
            &nowhere,
            &PullOptions::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            transfer_messages(error),
            [format!(
                "cannot create file/directory '{}': No such file or directory",
                nowhere.display()
            )]
        );
        let _ = mode;
    }
}

/// `chattr +i` on a directory for the test (no new entries, files inside
/// stay writable), undone when dropped.
struct Immutable {
    path: PathBuf,
}

impl Immutable {
    fn new(path: &Path) -> Option<Immutable> {
        let status = std::process::Command::new("chattr")
            .arg("+i")
            .arg(path)
            .status()
            .ok()?;
        status.success().then(|| Immutable {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.path)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_over_a_file_in_an_unwritable_directory() {
    let setup = connect(Mode::Burst).await;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    fs::write(&source, random_bytes(100_000, 11)).unwrap();
    fs::set_permissions(&source, fs::Permissions::from_mode(0o640)).unwrap();
    set_mtime(&source, 1_300_000_000);
    let locked = dir.path().join("locked");
    fs::create_dir(&locked).unwrap();
    let target = locked.join("file");
    fs::write(&target, b"old").unwrap();
    let Some(_immutable) = Immutable::new(&locked) else {
        eprintln!("skipped: chattr +i is not available here");
        return;
    };
    // No temporary file can be made beside it: rewritten in place, as adb does.
    let options = PullOptions {
        preserve: true,
        ..PullOptions::default()
    };
    pull_paths(&setup.device, &[&source], &target, &options)
        .await
        .unwrap();
    assert_eq!(fs::read(&target).unwrap(), fs::read(&source).unwrap());
    let metadata = fs::metadata(&target).unwrap();
    assert_eq!(metadata.mode() & 0o7777, 0o640 & !umask());
    assert_eq!(metadata.mtime(), 1_300_000_000);
    // A new file there is still an error naming the path and the cause.
    let new = locked.join("new");
    let error = pull_paths(&setup.device, &[&source], &new, &PullOptions::default())
        .await
        .unwrap_err();
    assert_eq!(
        transfer_messages(error),
        [format!(
            "cannot create '{}': Operation not permitted",
            new.display()
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_files_are_pipelined() {
    for mode in MODES {
        let setup = connect(mode).await;
        let dir = memory_tempdir();
        let tree = dir.path().join("many");
        for group in 0..20 {
            let sub = tree.join(format!("group {group}"));
            fs::create_dir_all(&sub).unwrap();
            for n in 0..100 {
                fs::write(sub.join(format!("f{n}")), format!("{group}/{n}")).unwrap();
            }
        }
        let device_dir = dir.path().join("device");
        fs::create_dir(&device_dir).unwrap();
        let started = std::time::Instant::now();
        let summary = push_paths(
            &setup.device,
            &[&tree],
            &remote(&device_dir),
            &PushOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(summary.files_transferred, 2000, "{mode:?}");
        let pushed_in = started.elapsed();
        assert_same_tree(&tree, &device_dir.join("many"));
        let started = std::time::Instant::now();
        let back = dir.path().join("back");
        let summary = pull_paths(
            &setup.device,
            &[&device_dir.join("many")],
            &back,
            &PullOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(summary.files_transferred, 2000);
        assert_same_tree(&tree, &back);
        eprintln!(
            "{mode:?}: 2000 files pushed in {pushed_in:?}, pulled in {:?}",
            started.elapsed()
        );
    }
}

/// A read-only tmpfs mounted for the test, unmounted when dropped.
struct ReadOnlyMount {
    path: PathBuf,
}

impl ReadOnlyMount {
    fn new(path: PathBuf) -> ReadOnlyMount {
        fs::create_dir_all(&path).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
            .arg(&path)
            .status()
            .expect("running mount");
        assert!(status.success(), "mount -t tmpfs -o ro failed (need root)");
        ReadOnlyMount { path }
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.path)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_destinations_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let mount = ReadOnlyMount::new(dir.path().join("ro"));
    let small = dir.path().join("small");
    let large = dir.path().join("large");
    fs::write(&small, b"small").unwrap();
    fs::write(&large, random_bytes(2 * 1024 * 1024, 8)).unwrap();
    for mode in MODES {
        let setup = connect(mode).await;
        for local in [&small, &large] {
            let target = mount.path.join("file");
            let error = push_paths(
                &setup.device,
                &[local],
                &remote(&target),
                &PushOptions::default(),
            )
            .await
            .unwrap_err();
            let messages = transfer_messages(error);
            assert_eq!(messages.len(), 1);
            let prefix = format!(
                "failed to copy '{}' to '{}': remote ",
                local.display(),
                remote(&target)
            );
            assert!(messages[0].starts_with(&prefix), "{}", messages[0]);
            assert!(
                messages[0].contains("Read-only file system"),
                "{}",
                messages[0]
            );
        }
        // The session is reopened after the device ended it: a later push works.
        let ok_target = dir.path().join("ok");
        let error = push_paths(
            &setup.device,
            &[&large, &small],
            &remote(&mount.path),
            &PushOptions::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(transfer_messages(error).len(), 2, "{mode:?}");
        push_paths(
            &setup.device,
            &[&small],
            &remote(&ok_target),
            &PushOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(fs::read(&ok_target).unwrap(), b"small");

        // Pulling into it fails locally.
        let error = pull_paths(
            &setup.device,
            &[&small],
            &mount.path,
            &PullOptions::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            transfer_messages(error),
            [format!(
                "cannot create '{}': Read-only file system",
                mount.path.join("small").display()
            )]
        );
    }
    drop(mount);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summary_lines_match_adb() {
    let setup = connect(Mode::Burst).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    fs::write(&file, random_bytes(100_000, 9)).unwrap();
    let summary = push_paths(
        &setup.device,
        &[&file],
        &remote(&dir.path().join("g")),
        &PushOptions::default(),
    )
    .await
    .unwrap();
    let line = summary.report("f", Direction::Push);
    assert!(
        line.starts_with("f: 1 file pushed, 0 skipped. ") && line.contains("(100000 bytes in "),
        "{line}"
    );
}

/// `cargo test --release -p oxadb --test sync -- --ignored --nocapture throughput`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark"]
async fn throughput() {
    let size = 512 * 1024 * 1024;
    let dir = memory_tempdir();
    let local = dir.path().join("big");
    fs::write(&local, random_bytes(size, 10)).unwrap();
    for mode in [
        Mode::Burst,
        Mode::ClassicDaemon,
        Mode::Burst,
        Mode::ClassicDaemon,
    ] {
        let setup = connect(mode).await;
        let target = dir.path().join("pushed");
        let push = push_paths(
            &setup.device,
            &[&local],
            &remote(&target),
            &PushOptions::default(),
        )
        .await
        .unwrap();
        let back = dir.path().join("back");
        let pull = pull_paths(&setup.device, &[&target], &back, &PullOptions::default())
            .await
            .unwrap();
        println!(
            "{mode:?}: {}; {}",
            push.report("push", Direction::Push),
            pull.report("pull", Direction::Pull)
        );
        fs::remove_file(&target).unwrap();
        fs::remove_file(&back).unwrap();
    }
}
