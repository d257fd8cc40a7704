//! The adapter against a minimal in-process client, over a duplex pipe: the
//! service's file threads, its hand-offs and its endings. What each request
//! does is tested against the machine, synchronously, in
//! `oxadb-transfer` (`protocol/tests/`).

use super::*;
use oxadb_transfer::{stat_v2_of, Policy};
use oxadb_wire::sync::{
    self as wire, Compression, StatV1, StatV2, SyncHeader, HEADER_LEN, SYNC_DATA_MAX,
};
use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use tokio::io::AsyncReadExt;
use tokio::io::DuplexStream;
use tokio::task::JoinHandle;

const REGULAR: u32 = libc::S_IFREG;
const MTIME: u32 = 1_234_567_890;

/// A minimal sync client, framing requests the way adb's `file_sync_client.cpp` does.
struct Client {
    io: DuplexStream,
    server: JoinHandle<Result<(), SyncError>>,
}

impl Client {
    fn start() -> Self {
        let (io, daemon_side) = tokio::io::duplex(1 << 20);
        Self {
            io,
            server: tokio::spawn(serve(daemon_side, SyncSettings::default())),
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        self.io
            .write_all(bytes)
            .await
            .expect("write to the service");
    }

    async fn request(&mut self, id: u32, path: &[u8]) {
        let request = wire::SyncRequest {
            id,
            path: path.to_vec(),
        }
        .encode()
        .unwrap();
        self.write(&request).await;
    }

    async fn read_vec(&mut self, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.io
            .read_exact(&mut buf)
            .await
            .expect("read from the service");
        buf
    }

    async fn read_header(&mut self) -> SyncHeader {
        SyncHeader::parse(&self.read_vec(HEADER_LEN).await).unwrap()
    }

    /// `OKAY` → Ok, `FAIL` → Err(reason).
    async fn status(&mut self) -> Result<(), String> {
        let header = self.read_header().await;
        match header.id {
            wire::ID_OKAY => Ok(()),
            wire::ID_FAIL => {
                Err(String::from_utf8(self.read_vec(header.len as usize).await).unwrap())
            }
            other => panic!("unexpected status {}", wire::id_name(other)),
        }
    }

    async fn send_data(&mut self, payload: &[u8], chunk: usize) {
        for piece in payload.chunks(chunk) {
            self.write(&wire::encode_data(piece).unwrap()).await;
        }
    }

    /// SEND v1 with `"path,mode"` (mode in decimal, like `"%s,%d"`).
    async fn push_v1(&mut self, path: &Path, mode: u32, data: &[u8]) -> Result<(), String> {
        let spec = format!("{},{mode}", path.display());
        self.request(wire::ID_SEND_V1, spec.as_bytes()).await;
        self.send_data(data, SYNC_DATA_MAX).await;
        self.write(&wire::encode_done(MTIME)).await;
        self.status().await
    }

    /// SND2 with `payload` already compressed as the flags say, cut into `chunk`s.
    async fn push_v2(
        &mut self,
        path: &Path,
        mode: u32,
        flags: u32,
        payload: &[u8],
        chunk: usize,
    ) -> Result<(), String> {
        self.request(wire::ID_SEND_V2, path.as_os_str().as_bytes())
            .await;
        let setup = wire::SendV2Setup {
            id: wire::ID_SEND_V2,
            mode,
            flags,
        };
        self.write(&setup.encode()).await;
        self.send_data(payload, chunk).await;
        self.write(&wire::encode_done(MTIME)).await;
        self.status().await
    }

    /// RECV (flags == None) or RCV2; returns the raw concatenated DATA payloads.
    async fn pull(&mut self, path: &Path, flags: Option<u32>) -> Result<Vec<u8>, String> {
        let path = path.as_os_str().as_bytes();
        match flags {
            None => self.request(wire::ID_RECV_V1, path).await,
            Some(flags) => {
                self.request(wire::ID_RECV_V2, path).await;
                self.write(
                    &wire::RecvV2Setup {
                        id: wire::ID_RECV_V2,
                        flags,
                    }
                    .encode(),
                )
                .await;
            }
        }
        let mut data = Vec::new();
        loop {
            let header = self.read_header().await;
            match header.id {
                wire::ID_DATA => {
                    assert!(header.len as usize <= SYNC_DATA_MAX, "oversized DATA");
                    data.extend(self.read_vec(header.len as usize).await);
                }
                wire::ID_DONE => return Ok(data),
                wire::ID_FAIL => {
                    let reason = self.read_vec(header.len as usize).await;
                    return Err(String::from_utf8(reason).unwrap());
                }
                other => panic!("unexpected {}", wire::id_name(other)),
            }
        }
    }

    async fn stat_v1(&mut self, path: &Path) -> StatV1 {
        self.request(wire::ID_LSTAT_V1, path.as_os_str().as_bytes())
            .await;
        let (id, stat) = StatV1::parse(&self.read_vec(wire::STAT_V1_LEN).await).unwrap();
        assert_eq!(id, wire::ID_LSTAT_V1);
        stat
    }

    async fn stat_v2(&mut self, id: u32, path: &Path) -> StatV2 {
        self.request(id, path.as_os_str().as_bytes()).await;
        let (reply_id, stat) = StatV2::parse(&self.read_vec(wire::STAT_V2_LEN).await).unwrap();
        assert_eq!(reply_id, id);
        stat
    }

    async fn list(&mut self, path: &Path, v2: bool) -> Vec<wire::Dent> {
        let id = if v2 {
            wire::ID_LIST_V2
        } else {
            wire::ID_LIST_V1
        };
        self.request(id, path.as_os_str().as_bytes()).await;
        let fixed = if v2 {
            wire::DENT_V2_LEN
        } else {
            wire::DENT_V1_LEN
        };
        let mut dents = Vec::new();
        loop {
            let mut bytes = self.read_vec(fixed).await;
            let name_len = u32::from_le_bytes(bytes[fixed - 4..].try_into().unwrap());
            bytes.extend(self.read_vec(name_len as usize).await);
            let (dent, _) = if v2 {
                wire::parse_dent_v2(&bytes)
            } else {
                wire::parse_dent_v1(&bytes)
            }
            .unwrap();
            if dent.id == wire::ID_DONE {
                assert_eq!(bytes.len(), fixed, "DONE is a whole zeroed dent");
                assert!(bytes[4..].iter().all(|&b| b == 0));
                return dents;
            }
            assert_eq!(
                dent.id,
                if v2 {
                    wire::ID_DENT_V2
                } else {
                    wire::ID_DENT_V1
                }
            );
            dents.push(dent);
        }
    }

    async fn quit(mut self) -> Result<(), SyncError> {
        self.request(wire::ID_QUIT, b"").await;
        self.server.await.unwrap()
    }

    /// Waits for the service to end on its own (after a FAIL, or once we hang up).
    async fn finished(self) -> Result<(), SyncError> {
        let Client { io, server } = self;
        drop(io);
        server.await.unwrap()
    }
}

/// Compressible but not trivial: text runs mixed with pseudo-random bytes.
fn sample_data(len: usize) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        if state & 1 == 0 {
            out.extend_from_slice(b"the quick brown fox jumps over the lazy dog ");
        } else {
            out.extend_from_slice(&state.to_le_bytes());
        }
    }
    out.truncate(len);
    out
}

/// Compresses as adb's client encoders do: brotli quality 1 (default window), an
/// LZ4F frame with default preferences (64 KiB linked blocks, no checksums), and a
/// streamed zstd level-1 frame without a content size.
fn compress_like_adb(compression: Compression, data: &[u8]) -> Vec<u8> {
    match compression {
        Compression::None => data.to_vec(),
        Compression::Brotli => {
            let mut out = Vec::new();
            {
                let mut encoder = brotli::CompressorWriter::new(&mut out, 4096, 1, 22);
                encoder.write_all(data).unwrap();
            }
            out
        }
        Compression::Lz4 => {
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Linked);
            let mut encoder = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
            encoder.write_all(data).unwrap();
            encoder.finish().unwrap()
        }
        Compression::Zstd => {
            let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
            encoder.write_all(data).unwrap();
            encoder.finish().unwrap()
        }
    }
}

fn decompress(compression: Compression, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match compression {
        Compression::None => out.extend_from_slice(data),
        Compression::Brotli => {
            brotli::Decompressor::new(data, 4096)
                .read_to_end(&mut out)
                .unwrap();
        }
        Compression::Lz4 => {
            lz4_flex::frame::FrameDecoder::new(data)
                .read_to_end(&mut out)
                .unwrap();
        }
        Compression::Zstd => {
            // The client's ZSTD_decompressStream loop accepts exactly one frame.
            let mut decoder = zstd::stream::read::Decoder::new(data)
                .unwrap()
                .single_frame();
            decoder.read_to_end(&mut out).unwrap();
        }
    }
    out
}

const ALL_COMPRESSIONS: [Compression; 4] = [
    Compression::None,
    Compression::Brotli,
    Compression::Lz4,
    Compression::Zstd,
];

fn temp_files_in(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| Policy::DAEMON.is_temp_name(name))
        .collect()
}

fn perm_bits(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o7777
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

#[tokio::test]
async fn push_v1_writes_file_mode_and_mtime() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("file.bin");
    let data = sample_data(200_000);
    let mut client = Client::start();
    client.push_v1(&dest, REGULAR | 0o644, &data).await.unwrap();
    assert_eq!(fs::read(&dest).unwrap(), data);
    assert_eq!(perm_bits(&dest), 0o644);
    assert_eq!(fs::metadata(&dest).unwrap().mtime(), i64::from(MTIME));
    assert!(temp_files_in(dir.path()).is_empty());
    client.quit().await.unwrap();
}

#[tokio::test]
async fn push_v1_small_file_in_one_write_like_adb() {
    // adb sends SEND, DATA and DONE of a small file in a single write.
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("small");
    let mut client = Client::start();
    let mut batch = wire::SyncRequest {
        id: wire::ID_SEND_V1,
        path: format!("{},33188", dest.display()).into(),
    }
    .encode()
    .unwrap();
    batch.extend(wire::encode_data(b"hello").unwrap());
    batch.extend(wire::encode_done(MTIME));
    client.write(&batch).await;
    client.status().await.unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"hello");
    client.quit().await.unwrap();
}

#[tokio::test]
async fn push_v2_each_compression() {
    let dir = tempfile::tempdir().unwrap();
    let data = sample_data(300_000);
    let mut client = Client::start();
    for compression in ALL_COMPRESSIONS {
        let compressed = compress_like_adb(compression, &data);
        // Odd chunk sizes check that the decoders resume across DATA boundaries.
        for chunk in [SYNC_DATA_MAX, 1000] {
            let dest = dir.path().join(format!("{compression:?}-{chunk}"));
            client
                .push_v2(
                    &dest,
                    REGULAR | 0o640,
                    compression.flag(),
                    &compressed,
                    chunk,
                )
                .await
                .unwrap_or_else(|e| panic!("{compression:?}: {e}"));
            assert_eq!(fs::read(&dest).unwrap(), data, "{compression:?}");
            assert_eq!(perm_bits(&dest), 0o640);
            assert_eq!(fs::metadata(&dest).unwrap().mtime(), i64::from(MTIME));
        }
    }
    assert!(temp_files_in(dir.path()).is_empty());
    client.quit().await.unwrap();
}

#[tokio::test]
async fn push_interrupted_leaves_old_content_and_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("precious");
    fs::write(&dest, b"old content").unwrap();
    let mut client = Client::start();
    client
        .request(
            wire::ID_SEND_V1,
            format!("{},33188", dest.display()).as_bytes(),
        )
        .await;
    client.send_data(&sample_data(300_000), SYNC_DATA_MAX).await;
    // The host vanishes before DONE.
    let result = client.finished().await;
    assert!(matches!(result, Err(SyncError::Truncated(_))), "{result:?}");
    assert_eq!(fs::read(&dest).unwrap(), b"old content");
    assert!(temp_files_in(dir.path()).is_empty());
}

#[tokio::test]
async fn push_interrupted_mid_frame_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("new");
    let mut client = Client::start();
    client
        .request(
            wire::ID_SEND_V1,
            format!("{},33188", dest.display()).as_bytes(),
        )
        .await;
    let frame = wire::encode_data(&sample_data(SYNC_DATA_MAX)).unwrap();
    client.write(&frame[..1000]).await;
    assert!(client.finished().await.is_err());
    assert!(!dest.exists());
    assert!(temp_files_in(dir.path()).is_empty());
}

#[tokio::test]
async fn push_onto_fifo_writes_through() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    assert_eq!(unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o644) }, 0);
    let reader_path = fifo.clone();
    let reader = std::thread::spawn(move || fs::read(reader_path).unwrap());
    let data = sample_data(150_000);
    let mut client = Client::start();
    client.push_v1(&fifo, REGULAR | 0o600, &data).await.unwrap();
    assert_eq!(reader.join().unwrap(), data);
    let md = fs::symlink_metadata(&fifo).unwrap();
    assert!(md.file_type().is_fifo());
    assert_eq!(md.mode() & 0o777, 0o644, "a FIFO's mode is left alone");
    client.quit().await.unwrap();
}

#[tokio::test]
async fn push_into_path_under_a_file_names_path_and_cause() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("plainfile");
    fs::write(&blocker, b"x").unwrap();
    let dest = blocker.join("child");
    let mut client = Client::start();
    // The data keeps coming after the FAIL; the service drains it up to DONE.
    let err = client
        .push_v1(&dest, REGULAR | 0o644, &sample_data(500_000))
        .await
        .unwrap_err();
    assert!(
        err.starts_with(&format!("couldn't create file '{}': ", dest.display())),
        "{err}"
    );
    assert!(err.contains("Not a directory"), "{err}");
    client.finished().await.unwrap();
}

#[tokio::test]
async fn push_oversized_data_chunk_is_a_protocol_error() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("x");
    fs::write(&dest, b"old").unwrap();
    let mut client = Client::start();
    client
        .request(
            wire::ID_SEND_V1,
            format!("{},33188", dest.display()).as_bytes(),
        )
        .await;
    client
        .write(&SyncHeader::new(wire::ID_DATA, SYNC_DATA_MAX as u32 + 1).encode())
        .await;
    let err = client.status().await.unwrap_err();
    assert!(err.contains("DATA chunk too long"), "{err}");
    assert!(err.contains(&dest.display().to_string()), "{err}");
    assert!(matches!(
        client.finished().await,
        Err(SyncError::Protocol(_))
    ));
    assert_eq!(fs::read(&dest).unwrap(), b"old");
    assert!(temp_files_in(dir.path()).is_empty());
}

#[tokio::test]
async fn stat_variants_on_file_symlink_and_missing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    fs::write(&file, b"12345").unwrap();
    let link = dir.path().join("link");
    symlink("file", &link).unwrap();
    let missing = dir.path().join("missing");
    let file_md = fs::metadata(&file).unwrap();
    let mut client = Client::start();

    let v1 = client.stat_v1(&file).await;
    assert_eq!(
        v1,
        StatV1 {
            mode: file_md.mode(),
            size: 5,
            mtime: file_md.mtime() as u32
        }
    );
    let v1 = client.stat_v1(&link).await;
    assert_eq!(v1.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(v1.size, 4);
    assert_eq!(client.stat_v1(&missing).await, StatV1::default());

    let lst2 = client.stat_v2(wire::ID_LSTAT_V2, &link).await;
    assert_eq!(lst2.error, 0);
    assert_eq!(lst2.mode & libc::S_IFMT, libc::S_IFLNK);
    let sta2 = client.stat_v2(wire::ID_STAT_V2, &link).await;
    assert_eq!(sta2, stat_v2_of(&file_md));
    assert_eq!(sta2.size, 5);
    assert_eq!(sta2.nlink, 1);

    let gone = client.stat_v2(wire::ID_LSTAT_V2, &missing).await;
    assert_eq!(gone, StatV2::error(libc::ENOENT as u32));
    let dangling = dir.path().join("dangling");
    symlink("nowhere", &dangling).unwrap();
    assert_eq!(
        client.stat_v2(wire::ID_STAT_V2, &dangling).await.error,
        libc::ENOENT as u32
    );
    assert_eq!(client.stat_v2(wire::ID_LSTAT_V2, &dangling).await.error, 0);
    let under_file = file.join("x");
    assert_eq!(
        client.stat_v2(wire::ID_STAT_V2, &under_file).await.error,
        libc::ENOTDIR as u32
    );
    client.quit().await.unwrap();
}

#[tokio::test]
async fn list_v1_and_v2() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.txt"), b"abc").unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    symlink("a.txt", dir.path().join("ln")).unwrap();
    let mut client = Client::start();

    for v2 in [false, true] {
        let dents = client.list(dir.path(), v2).await;
        let mut names: Vec<_> = dents.iter().map(|d| d.name.clone()).collect();
        names.sort();
        let expected: Vec<Vec<u8>> = [".", "..", "a.txt", "ln", "sub"]
            .iter()
            .map(|n| n.as_bytes().to_vec())
            .collect();
        assert_eq!(names, expected, "v2={v2}");
        let find = |name: &str| dents.iter().find(|d| d.name == name.as_bytes()).unwrap();
        assert_eq!(find("a.txt").stat.mode & libc::S_IFMT, libc::S_IFREG);
        assert_eq!(find("a.txt").stat.size, 3);
        assert_eq!(
            find("ln").stat.mode & libc::S_IFMT,
            libc::S_IFLNK,
            "lstat semantics"
        );
        assert_eq!(find("sub").stat.mode & libc::S_IFMT, libc::S_IFDIR);
        if v2 {
            let md = fs::symlink_metadata(dir.path().join("a.txt")).unwrap();
            assert_eq!(find("a.txt").stat, stat_v2_of(&md));
        }
    }
    // Unlistable paths give an empty listing, as with adbd.
    assert!(client
        .list(&dir.path().join("missing"), true)
        .await
        .is_empty());
    assert!(client
        .list(&dir.path().join("a.txt"), false)
        .await
        .is_empty());
    client.quit().await.unwrap();
}

#[tokio::test]
async fn recv_and_rcv2_each_compression() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("source");
    let data = sample_data(333_333);
    fs::write(&file, &data).unwrap();
    let empty = dir.path().join("empty");
    fs::write(&empty, b"").unwrap();
    let mut client = Client::start();

    assert_eq!(client.pull(&file, None).await.unwrap(), data);
    assert_eq!(client.pull(&empty, None).await.unwrap(), b"");
    for compression in ALL_COMPRESSIONS {
        let raw = client.pull(&file, Some(compression.flag())).await.unwrap();
        assert_eq!(decompress(compression, &raw), data, "{compression:?}");
        let raw = client.pull(&empty, Some(compression.flag())).await.unwrap();
        assert_eq!(decompress(compression, &raw), b"", "{compression:?}");
    }
    // Pulling through a symlink reads its target, as open() does.
    let link = dir.path().join("link");
    symlink("source", &link).unwrap();
    assert_eq!(client.pull(&link, None).await.unwrap(), data);
    client.quit().await.unwrap();
}

#[tokio::test]
async fn recv_missing_file_fails_naming_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let mut client = Client::start();
    let err = client.pull(&missing, None).await.unwrap_err();
    assert_eq!(
        err,
        format!(
            "couldn't open '{}': No such file or directory (os error 2)",
            missing.display()
        )
    );
    client.finished().await.unwrap();

    let mut client = Client::start();
    let err = client
        .pull(dir.path(), Some(wire::SYNC_FLAG_ZSTD))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        format!(
            "couldn't read '{}': not a regular file or device (a directory)",
            dir.path().display()
        )
    );
    client.finished().await.unwrap();
}

/// A RECV of a FIFO fails at once instead of waiting for a writer (a host
/// may send it before its STAT reply: the `oxadb_recv_ahead` feature).
#[tokio::test]
async fn recv_of_a_fifo_fails_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c_path = CString::new(fifo.as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let mut client = Client::start();
    let err = tokio::time::timeout(std::time::Duration::from_secs(10), client.pull(&fifo, None))
        .await
        .expect("RECV of a FIFO blocked")
        .unwrap_err();
    assert_eq!(
        err,
        format!(
            "couldn't read '{}': not a regular file or device (a FIFO)",
            fifo.display()
        )
    );
    client.finished().await.unwrap();
}

#[tokio::test]
async fn unknown_request_fails_and_ends() {
    let mut client = Client::start();
    client.request(wire::make_id(b"WHAT"), b"/").await;
    let err = client.status().await.unwrap_err();
    assert!(
        err.contains("unknown command") && err.contains("WHAT"),
        "{err}"
    );
    assert!(matches!(
        client.server.await.unwrap(),
        Err(SyncError::Protocol(_))
    ));
}

#[tokio::test]
async fn host_closing_between_requests_is_a_clean_end() {
    let client = Client::start();
    client.finished().await.unwrap();
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    // `adb sync` sends a batch of LST2 requests before reading any reply.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    fs::write(&file, b"x").unwrap();
    let mut client = Client::start();
    let mut batch = Vec::new();
    for path in [&file, &dir.path().join("missing"), &file] {
        let request = wire::SyncRequest {
            id: wire::ID_LSTAT_V2,
            path: path.as_os_str().as_bytes().to_vec(),
        };
        batch.extend(request.encode().unwrap());
    }
    client.write(&batch).await;
    let mut errors = Vec::new();
    for _ in 0..3 {
        let (_, stat) = StatV2::parse(&client.read_vec(wire::STAT_V2_LEN).await).unwrap();
        errors.push(stat.error);
    }
    assert_eq!(errors, [0, libc::ENOENT as u32, 0]);
    client.quit().await.unwrap();
}

/// `cargo test --release -p oxadbd -- --ignored --nocapture throughput`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark"]
async fn throughput_push_and_pull() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("big");
    let size = 512 * 1024 * 1024;
    let chunk = sample_data(SYNC_DATA_MAX);
    let mut client = Client::start();
    let started = std::time::Instant::now();
    client
        .request(
            wire::ID_SEND_V1,
            format!("{},33188", dest.display()).as_bytes(),
        )
        .await;
    let frame = wire::encode_data(&chunk).unwrap();
    for _ in 0..size / SYNC_DATA_MAX {
        client.write(&frame).await;
    }
    client.write(&wire::encode_done(MTIME)).await;
    client.status().await.unwrap();
    let push = started.elapsed();
    assert_eq!(fs::metadata(&dest).unwrap().len(), size as u64);

    let started = std::time::Instant::now();
    client
        .request(wire::ID_RECV_V1, dest.as_os_str().as_bytes())
        .await;
    let mut total = 0;
    let mut buf = vec![0u8; SYNC_DATA_MAX];
    loop {
        let header = client.read_header().await;
        if header.id == wire::ID_DONE {
            break;
        }
        client
            .io
            .read_exact(&mut buf[..header.len as usize])
            .await
            .unwrap();
        total += header.len as usize;
    }
    let pull = started.elapsed();
    assert_eq!(total, size);
    let mib = (size >> 20) as f64;
    println!(
        "push {:.0} MiB/s, pull {:.0} MiB/s",
        mib / push.as_secs_f64(),
        mib / pull.as_secs_f64()
    );
    client.quit().await.unwrap();
}
