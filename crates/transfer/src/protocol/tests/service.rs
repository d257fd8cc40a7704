//! The daemon's machine against a host that frames requests by hand, the
//! way adb's `file_sync_client.cpp` does: every request, the file work
//! behind it (`serve.rs`), and malformed, truncated or cut-up input.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use oxadb_wire::sync::{
    self as wire, Compression, StatV1, StatV2, SyncHeader, HEADER_LEN, SYNC_DATA_MAX,
};

use super::*;
use crate::protocol::stat_v2_of;

const REGULAR: u32 = libc::S_IFREG;
const MTIME: u32 = 1_234_567_890;

/// A host writing requests as adb does, reading what the daemon answered.
struct Host {
    daemon: Daemon,
    received: Vec<u8>,
    read: usize,
}

impl Host {
    fn new() -> Host {
        Host::with_cuts(Cuts::Whole)
    }

    fn with_cuts(cuts: Cuts) -> Host {
        Host {
            daemon: Daemon::new(cuts),
            received: Vec::new(),
            read: 0,
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        self.daemon.receive(Bytes::copy_from_slice(bytes));
        let output = self.daemon.take_output();
        self.received.extend_from_slice(&output);
    }

    fn request(&mut self, id: u32, path: &[u8]) {
        let request = wire::SyncRequest {
            id,
            path: path.to_vec(),
        }
        .encode()
        .unwrap();
        self.write(&request);
    }

    fn unread(&self) -> usize {
        self.received.len() - self.read
    }

    fn read_vec(&mut self, len: usize) -> Vec<u8> {
        assert!(
            self.unread() >= len,
            "the daemon sent {} bytes, {len} expected",
            self.unread()
        );
        let out = self.received[self.read..self.read + len].to_vec();
        self.read += len;
        out
    }

    fn read_header(&mut self) -> SyncHeader {
        SyncHeader::parse(&self.read_vec(HEADER_LEN)).unwrap()
    }

    /// `OKAY` → Ok, `FAIL` → Err(reason).
    fn status(&mut self) -> Result<(), String> {
        let header = self.read_header();
        match header.id {
            wire::ID_OKAY => Ok(()),
            wire::ID_FAIL => Err(String::from_utf8(self.read_vec(header.len as usize)).unwrap()),
            other => panic!("unexpected status {}", wire::id_name(other)),
        }
    }

    fn send_data(&mut self, payload: &[u8], chunk: usize) {
        for piece in payload.chunks(chunk) {
            self.write(&wire::encode_data(piece).unwrap());
        }
    }

    /// SEND v1 with `"path,mode"` (mode in decimal, like `"%s,%d"`).
    fn push_v1(&mut self, path: &Path, mode: u32, data: &[u8]) -> Result<(), String> {
        let spec = format!("{},{mode}", path.display());
        self.request(wire::ID_SEND_V1, spec.as_bytes());
        self.send_data(data, SYNC_DATA_MAX);
        self.write(&wire::encode_done(MTIME));
        self.status()
    }

    /// SND2 with `payload` already compressed as the flags say, cut into `chunk`s.
    fn push_v2(
        &mut self,
        path: &Path,
        mode: u32,
        flags: u32,
        payload: &[u8],
        chunk: usize,
    ) -> Result<(), String> {
        self.request(wire::ID_SEND_V2, path.as_os_str().as_bytes());
        let setup = wire::SendV2Setup {
            id: wire::ID_SEND_V2,
            mode,
            flags,
        };
        self.write(&setup.encode());
        self.send_data(payload, chunk);
        self.write(&wire::encode_done(MTIME));
        self.status()
    }

    /// RECV (flags == None) or RCV2; returns the raw concatenated DATA payloads.
    fn pull(&mut self, path: &Path, flags: Option<u32>) -> Result<Vec<u8>, String> {
        let path = path.as_os_str().as_bytes();
        match flags {
            None => self.request(wire::ID_RECV_V1, path),
            Some(flags) => {
                self.request(wire::ID_RECV_V2, path);
                self.write(
                    &wire::RecvV2Setup {
                        id: wire::ID_RECV_V2,
                        flags,
                    }
                    .encode(),
                );
            }
        }
        let mut data = Vec::new();
        loop {
            let header = self.read_header();
            match header.id {
                wire::ID_DATA => {
                    assert!(header.len as usize <= SYNC_DATA_MAX, "oversized DATA");
                    data.extend(self.read_vec(header.len as usize));
                }
                wire::ID_DONE => return Ok(data),
                wire::ID_FAIL => {
                    let reason = self.read_vec(header.len as usize);
                    return Err(String::from_utf8(reason).unwrap());
                }
                other => panic!("unexpected {}", wire::id_name(other)),
            }
        }
    }

    fn stat_v1(&mut self, path: &Path) -> StatV1 {
        self.request(wire::ID_LSTAT_V1, path.as_os_str().as_bytes());
        let (id, stat) = StatV1::parse(&self.read_vec(wire::STAT_V1_LEN)).unwrap();
        assert_eq!(id, wire::ID_LSTAT_V1);
        stat
    }

    fn stat_v2(&mut self, id: u32, path: &Path) -> StatV2 {
        self.request(id, path.as_os_str().as_bytes());
        let (reply_id, stat) = StatV2::parse(&self.read_vec(wire::STAT_V2_LEN)).unwrap();
        assert_eq!(reply_id, id);
        stat
    }

    fn list(&mut self, path: &Path, v2: bool) -> Vec<wire::Dent> {
        let id = if v2 {
            wire::ID_LIST_V2
        } else {
            wire::ID_LIST_V1
        };
        self.request(id, path.as_os_str().as_bytes());
        let fixed = if v2 {
            wire::DENT_V2_LEN
        } else {
            wire::DENT_V1_LEN
        };
        let mut dents = Vec::new();
        loop {
            let mut bytes = self.read_vec(fixed);
            let name_len = u32::from_le_bytes(bytes[fixed - 4..].try_into().unwrap());
            bytes.extend(self.read_vec(name_len as usize));
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

    fn quit(mut self) -> Result<(), ServiceError> {
        self.request(wire::ID_QUIT, b"");
        self.finished()
    }

    /// How the service ended: on its own (after a FAIL, a QUIT), or once we hang up.
    fn finished(mut self) -> Result<(), ServiceError> {
        if self.daemon.end().is_none() {
            self.daemon.hang_up();
        }
        assert_eq!(self.daemon.take_output(), b"", "nothing more after the end");
        self.daemon.end().expect("the service ended")
    }
}

/// A session of every kind of request, as one byte stream, with the byte
/// offsets where each request ends (what the daemon may see end cleanly),
/// and what the stream ending inside each part is called.
struct Script {
    bytes: Vec<u8>,
    /// (end offset of a part, what it is called when cut inside it)
    parts: Vec<(usize, &'static str)>,
}

impl Script {
    fn new() -> Script {
        Script {
            bytes: Vec::new(),
            parts: Vec::new(),
        }
    }

    fn part(&mut self, bytes: &[u8], during: &'static str) {
        self.bytes.extend_from_slice(bytes);
        self.parts.push((self.bytes.len(), during));
    }

    fn request(&mut self, id: u32, path: &[u8]) {
        let encoded = wire::SyncRequest {
            id,
            path: path.to_vec(),
        }
        .encode()
        .unwrap();
        self.part(&encoded[..HEADER_LEN], "a request header");
        self.part(&encoded[HEADER_LEN..], "a request path");
    }

    /// A push's frames (whole frames are one part: the daemon takes them whole).
    fn push_frames(&mut self, data: &[u8], chunk: usize) {
        for piece in data.chunks(chunk) {
            self.part(&wire::encode_data(piece).unwrap(), "a push");
        }
        self.part(&wire::encode_done(MTIME), "a push");
    }

    /// What the daemon says when the stream ends after `len` bytes: a clean
    /// end at a request's end (or after QUIT), else the part cut.
    fn ending_after(&self, len: usize) -> Result<(), ServiceError> {
        let mut start = 0;
        for &(end, during) in &self.parts {
            if len < end && len >= start {
                return if len == start && matches!(during, "a request header") {
                    Ok(())
                } else {
                    Err(ServiceError::Truncated(during))
                };
            }
            start = end;
        }
        Ok(())
    }
}

/// Every request once: stats, listings, pushes (v1, v2 compressed) and
/// pulls (v1, v2 compressed). Pushes go to `out/`; what is stat'ed, listed
/// and pulled is in `fixed/`, whose times are set in the past so that reading
/// it changes no atime (relatime) and every run gets the same answers.
fn full_session(dir: &Path) -> Script {
    let fixed = dir.join("fixed");
    fs::create_dir_all(fixed.join("sub")).unwrap();
    fs::create_dir_all(dir.join("out")).unwrap();
    let file = fixed.join("file");
    fs::write(&file, sample_data(20_000)).unwrap();
    let past = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    for path in [&file, &fixed.join("sub"), &fixed] {
        let handle = fs::File::open(path).unwrap();
        handle
            .set_times(fs::FileTimes::new().set_modified(past))
            .unwrap();
    }
    let mut script = Script::new();
    let path = |p: &Path| p.as_os_str().as_bytes().to_vec();
    script.request(wire::ID_LSTAT_V1, &path(&file));
    script.request(wire::ID_STAT_V2, &path(&fixed.join("missing")));
    script.request(wire::ID_LIST_V2, &path(&fixed));
    script.request(
        wire::ID_SEND_V1,
        format!("{},33188", dir.join("out/pushed-v1").display()).as_bytes(),
    );
    script.push_frames(&sample_data(70_000), SYNC_DATA_MAX);
    script.request(wire::ID_SEND_V2, &path(&dir.join("out/pushed-v2")));
    script.part(
        &wire::SendV2Setup {
            id: wire::ID_SEND_V2,
            mode: REGULAR | 0o600,
            flags: wire::SYNC_FLAG_ZSTD,
        }
        .encode(),
        "an SND2 setup frame",
    );
    script.push_frames(
        &compress_like_adb(Compression::Zstd, &sample_data(30_000)),
        5000,
    );
    script.request(wire::ID_RECV_V1, &path(&file));
    script.request(wire::ID_RECV_V2, &path(&file));
    script.part(
        &wire::RecvV2Setup {
            id: wire::ID_RECV_V2,
            flags: wire::SYNC_FLAG_LZ4,
        }
        .encode(),
        "an RCV2 setup frame",
    );
    script.request(wire::ID_LIST_V1, &path(&fixed));
    script
}

const PUSHED: [&str; 2] = ["out/pushed-v1", "out/pushed-v2"];

#[test]
fn cut_anywhere_the_answers_are_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let script = full_session(dir.path());
    let run = |cuts: Cuts| {
        let mut host = Host::with_cuts(cuts);
        host.write(&script.bytes);
        let answers = host.received.clone();
        let pushed: Vec<Vec<u8>> = PUSHED
            .iter()
            .map(|name| fs::read(dir.path().join(name)).unwrap())
            .collect();
        for name in PUSHED {
            fs::remove_file(dir.path().join(name)).unwrap();
        }
        assert_eq!(host.quit(), Ok(()));
        (answers, pushed)
    };
    let whole = run(Cuts::Whole);
    assert_eq!(whole.1[0], sample_data(70_000));
    assert_eq!(whole.1[1], sample_data(30_000));
    let seed = super::seed();
    let mut seeds = Rng::new(seed);
    for _ in 0..30 {
        let cut = run(Cuts::Random(Rng::new(seeds.next())));
        assert!(cut.0 == whole.0, "seed {seed}: other answers");
        assert_eq!(cut.1, whole.1, "seed {seed}");
    }
    assert!(temp_files_in(&dir.path().join("out")).is_empty());
}

#[test]
fn cut_short_anywhere_the_end_names_what_was_cut() {
    let dir = tempfile::tempdir().unwrap();
    let script = full_session(dir.path());
    // Around every boundary between parts, and a spread of offsets inside them.
    let mut offsets: Vec<usize> = (0..=script.bytes.len()).step_by(499).collect();
    for &(end, _) in &script.parts {
        offsets.extend(end.saturating_sub(9)..=(end + 9).min(script.bytes.len()));
    }
    offsets.sort_unstable();
    offsets.dedup();
    for len in offsets {
        let mut host = Host::new();
        host.write(&script.bytes[..len]);
        let expected = script.ending_after(len);
        assert_eq!(host.finished(), expected, "cut after {len} bytes");
        assert!(
            temp_files_in(&dir.path().join("out")).is_empty(),
            "cut after {len}"
        );
        for name in PUSHED {
            let _ = fs::remove_file(dir.path().join(name));
        }
    }
}

/// Sends `SEND` and `frames` DATA frames of `len` bytes in one chunk.
fn push_in_one_chunk(service: &mut Service, path: &str, frames: usize, len: usize) -> Bytes {
    let mut bytes = wire::SyncRequest {
        id: wire::ID_SEND_V1,
        path: format!("{path},33188").into_bytes(),
    }
    .encode()
    .unwrap();
    for _ in 0..frames {
        bytes.extend(wire::encode_data(&vec![7; len]).unwrap());
    }
    let chunk = Bytes::from(bytes);
    service.handle_input(chunk.clone());
    chunk
}

#[test]
fn payloads_leave_as_slices_sixteen_at_a_time_and_before_waiting() {
    let mut service = Service::new();
    let chunk = push_in_one_chunk(&mut service, "/x", 20, 1000);
    assert!(matches!(service.poll_action(), Some(Action::Push(_))));
    let Some(Action::PushData(first)) = service.poll_action() else {
        panic!("no data")
    };
    assert_eq!(first.len(), 16);
    // Slices of the chunk the stream delivered, not copies.
    let offset = first[0].as_ptr() as usize - chunk.as_ptr() as usize;
    assert_eq!(offset, HEADER_LEN + 8 + HEADER_LEN);
    let Some(Action::PushData(rest)) = service.poll_action() else {
        panic!("no data")
    };
    // What arrived is handed over before the machine waits for more.
    assert_eq!(rest.len(), 4);
    assert!(service.poll_action().is_none());
    assert!(service.wants_input());
    // A payload split across chunks waits until it is whole, then goes as two pieces.
    let frame = wire::encode_data(&[9; 100]).unwrap();
    service.handle_input(Bytes::copy_from_slice(&frame[..50]));
    assert!(service.poll_action().is_none());
    service.handle_input(Bytes::copy_from_slice(&frame[50..]));
    let Some(Action::PushData(split)) = service.poll_action() else {
        panic!("no data")
    };
    assert_eq!(split.iter().map(Bytes::len).collect::<Vec<_>>(), [42, 58]);
    // DONE's mtime goes with it; OKAY only once the file work says so.
    service.handle_input(Bytes::copy_from_slice(&wire::encode_done(MTIME)));
    assert!(matches!(
        service.poll_action(),
        Some(Action::PushDone { mtime: MTIME })
    ));
    assert!(service.poll_transmit().is_none());
    assert!(!service.wants_input());
    service.push_finished(Ok(()));
    let okay = service.poll_transmit().unwrap().into_bytes();
    assert_eq!(&okay[..], &wire::encode_okay());
    assert!(service.wants_input());
}

#[test]
fn a_push_that_fails_midway_is_read_to_its_done_and_ends_the_service() {
    let mut service = Service::new();
    push_in_one_chunk(&mut service, "/x", 2, 10);
    assert!(matches!(service.poll_action(), Some(Action::Push(_))));
    assert!(matches!(service.poll_action(), Some(Action::PushData(_))));
    service.push_finished(report("couldn't write '/x': No space left on device"));
    let fail = service.poll_transmit().unwrap().into_bytes();
    assert_eq!(
        &fail[..],
        &wire::encode_fail("couldn't write '/x': No space left on device")[..]
    );
    // The rest of the push is read and dropped, DONE ends the service, and
    // the request after it is never taken.
    let mut rest = wire::encode_data(&[1; 500]).unwrap();
    rest.extend(wire::encode_done(MTIME));
    rest.extend(
        wire::SyncRequest {
            id: wire::ID_LSTAT_V2,
            path: b"/".to_vec(),
        }
        .encode()
        .unwrap(),
    );
    service.handle_input(Bytes::from(rest));
    assert!(service.poll_action().is_none());
    assert_eq!(service.finished(), Some(Ok(())));
}

#[test]
fn a_push_refused_at_once_is_drained_too() {
    let mut service = Service::new();
    push_in_one_chunk(&mut service, "/x", 3, 10);
    assert!(matches!(service.poll_action(), Some(Action::Push(_))));
    // Refused before any data was handed out (a stopping daemon).
    service.push_finished(report("couldn't push '/x': oxadbd is stopping"));
    assert!(service.poll_action().is_none());
    assert!(service.wants_input());
    service.handle_input(Bytes::copy_from_slice(&wire::encode_done(MTIME)));
    assert!(service.poll_action().is_none());
    let fail = service.poll_transmit().unwrap().into_bytes();
    assert_eq!(
        &fail[..],
        &wire::encode_fail("couldn't push '/x': oxadbd is stopping")[..]
    );
    assert_eq!(service.finished(), Some(Ok(())));
}

#[test]
fn a_broken_push_is_stopped_before_its_fail_goes() {
    let mut service = Service::new();
    push_in_one_chunk(&mut service, "/x", 1, 10);
    service.handle_input(Bytes::copy_from_slice(
        &SyncHeader::new(wire::ID_OKAY, 0).encode(),
    ));
    assert!(matches!(service.poll_action(), Some(Action::Push(_))));
    // What was gathered is not handed over: the push is going nowhere.
    assert!(matches!(service.poll_action(), Some(Action::PushStop)));
    // The host hears of it only once the file work is gone.
    assert!(service.poll_transmit().is_none());
    assert_eq!(service.finished(), None);
    service.push_finished(Err(Failure::HostGone));
    let fail = service.poll_transmit().unwrap().into_bytes();
    let message = "protocol error pushing '/x': expected DATA or DONE, got OKAY";
    assert_eq!(&fail[..], &wire::encode_fail(message)[..]);
    assert_eq!(
        service.finished(),
        Some(Err(ServiceError::Protocol(message.to_string())))
    );
}

#[test]
fn setup_frames_with_bad_flags_fail_naming_the_path() {
    for (id, flags, message) in [
        (
            wire::ID_SEND_V2,
            wire::SYNC_FLAG_BROTLI | wire::SYNC_FLAG_ZSTD,
            "couldn't push '/d/x': multiple compression flags received: 0x5",
        ),
        (
            wire::ID_RECV_V2,
            wire::SYNC_FLAG_DRY_RUN,
            "couldn't pull '/d/x': unknown flags: 0x80000000",
        ),
    ] {
        let mut host = Host::new();
        host.request(id, b"/d/x");
        let mut setup = id.to_le_bytes().to_vec();
        if id == wire::ID_SEND_V2 {
            setup.extend((REGULAR | 0o644).to_le_bytes());
        }
        setup.extend(flags.to_le_bytes());
        host.write(&setup);
        assert_eq!(host.status(), Err(message.to_string()));
        // adbd closes the service here without reading the data.
        assert_eq!(host.daemon.end(), Some(Ok(())));
        assert_eq!(host.finished(), Ok(()));
    }
}

/// Never touches the file system: every path is answered as missing, every
/// push taken and dropped, every pull refused.
fn answer_blindly(service: &mut Service, action: Action) {
    match action {
        Action::Stat { .. } => service.stat_done(Err(std::io::Error::from_raw_os_error(2))),
        Action::List { .. } => service.list_done(Err(std::io::Error::from_raw_os_error(2))),
        Action::Push(_) | Action::PushData(_) => {}
        Action::PushDone { .. } => service.push_finished(Ok(())),
        Action::PushStop => service.push_finished(Err(Failure::HostGone)),
        Action::Pull { .. } => service.pull_refused("no"),
    }
}

#[test]
fn hostile_input_ends_the_service_without_a_panic() {
    let seed = super::seed();
    let mut rng = Rng::new(seed);
    let ids = [
        wire::ID_LSTAT_V1,
        wire::ID_STAT_V2,
        wire::ID_LIST_V2,
        wire::ID_SEND_V1,
        wire::ID_SEND_V2,
        wire::ID_RECV_V2,
        wire::ID_DATA,
        wire::ID_DONE,
        wire::ID_QUIT,
        0xffff_ffff,
    ];
    for round in 0..300 {
        // Plausible headers with random lengths, random bytes between them.
        let mut bytes = Vec::new();
        while bytes.len() < 2000 {
            let id = ids[rng.between(0, ids.len() - 1)];
            let len = match rng.next() % 4 {
                0 => rng.between(0, 16),
                1 => rng.between(0, 70_000),
                2 => u32::MAX as usize,
                _ => rng.between(0, 2000),
            } as u32;
            bytes.extend(SyncHeader::new(id, len).encode());
            if id == wire::ID_SEND_V1 && rng.chance(2) {
                bytes.extend(b"/x,420");
            }
            for _ in 0..rng.between(0, 40) {
                bytes.push(rng.next() as u8);
            }
        }
        let mut service = Service::new();
        let mut cuts = Cuts::Random(rng.clone());
        for piece in cuts.split(Bytes::from(bytes)) {
            service.handle_input(piece);
            while let Some(action) = service.poll_action() {
                answer_blindly(&mut service, action);
            }
            while service.poll_transmit().is_some() {}
        }
        service.handle_eof();
        while let Some(action) = service.poll_action() {
            answer_blindly(&mut service, action);
        }
        while service.poll_transmit().is_some() {}
        assert!(
            service.finished().is_some(),
            "seed {seed}, round {round}: the service did not end at the end of the stream"
        );
        rng.next();
    }
}

// ----- the file work behind each request -----

#[test]
fn push_v1_writes_file_mode_and_mtime() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("file.bin");
    let data = sample_data(200_000);
    let mut host = Host::new();
    host.push_v1(&dest, REGULAR | 0o644, &data).unwrap();
    assert_eq!(fs::read(&dest).unwrap(), data);
    assert_eq!(perm_bits(&dest), 0o644);
    assert_eq!(fs::metadata(&dest).unwrap().mtime(), i64::from(MTIME));
    assert!(temp_files_in(dir.path()).is_empty());
    host.quit().unwrap();
}

#[test]
fn push_v1_small_file_in_one_write_like_adb() {
    // adb sends SEND, DATA and DONE of a small file in a single write.
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("small");
    let mut host = Host::new();
    let mut batch = wire::SyncRequest {
        id: wire::ID_SEND_V1,
        path: format!("{},33188", dest.display()).into(),
    }
    .encode()
    .unwrap();
    batch.extend(wire::encode_data(b"hello").unwrap());
    batch.extend(wire::encode_done(MTIME));
    host.write(&batch);
    host.status().unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"hello");
    host.quit().unwrap();
}

#[test]
fn push_v1_empty_file_replaces_existing() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("empty");
    fs::write(&dest, b"old content").unwrap();
    let mut host = Host::new();
    host.push_v1(&dest, REGULAR | 0o600, b"").unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"");
    host.quit().unwrap();
}

#[test]
fn push_v2_each_compression() {
    let dir = tempfile::tempdir().unwrap();
    let data = sample_data(300_000);
    let mut host = Host::new();
    for compression in ALL_COMPRESSIONS {
        let compressed = compress_like_adb(compression, &data);
        // Odd chunk sizes check that the decoders resume across DATA boundaries.
        for chunk in [SYNC_DATA_MAX, 1000] {
            let dest = dir.path().join(format!("{compression:?}-{chunk}"));
            host.push_v2(
                &dest,
                REGULAR | 0o640,
                compression.flag(),
                &compressed,
                chunk,
            )
            .unwrap_or_else(|e| panic!("{compression:?}: {e}"));
            assert_eq!(fs::read(&dest).unwrap(), data, "{compression:?}");
            assert_eq!(perm_bits(&dest), 0o640);
            assert_eq!(fs::metadata(&dest).unwrap().mtime(), i64::from(MTIME));
        }
    }
    assert!(temp_files_in(dir.path()).is_empty());
    host.quit().unwrap();
}

#[test]
fn push_v2_compressed_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = Host::new();
    for compression in [Compression::Brotli, Compression::Lz4, Compression::Zstd] {
        let dest = dir.path().join(format!("{compression:?}"));
        let payload = compress_like_adb(compression, b"");
        host.push_v2(&dest, REGULAR | 0o644, compression.flag(), &payload, 7)
            .unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"", "{compression:?}");
    }
    host.quit().unwrap();
}

#[test]
fn push_v2_corrupt_or_trailing_data_fails_and_keeps_destination() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("victim");
    let data = sample_data(100_000);
    let cases = [
        (Compression::Zstd, b"definitely not zstd".to_vec()),
        (Compression::Lz4, {
            let mut frame = compress_like_adb(Compression::Lz4, &data);
            frame.truncate(frame.len() / 2);
            frame
        }),
        (Compression::Brotli, {
            let mut stream = compress_like_adb(Compression::Brotli, &data);
            stream.truncate(stream.len() - 10);
            stream
        }),
        (Compression::Zstd, {
            let mut frame = compress_like_adb(Compression::Zstd, &data);
            frame.extend_from_slice(b"trailing junk");
            frame
        }),
        (Compression::Zstd, Vec::new()),
    ];
    for (compression, payload) in cases {
        fs::write(&dest, b"keep me").unwrap();
        let mut host = Host::new();
        let err = host
            .push_v2(&dest, REGULAR | 0o644, compression.flag(), &payload, 4096)
            .unwrap_err();
        assert!(err.contains("couldn't decompress data for"), "{err}");
        assert!(err.contains(&dest.display().to_string()), "{err}");
        // Like adbd, the service ends after a failed transfer.
        host.finished().unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"keep me", "{compression:?}");
        assert!(temp_files_in(dir.path()).is_empty());
    }
}

#[test]
fn push_v2_dry_run_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = sample_data(100_000);
    let mut host = Host::new();
    for compression in ALL_COMPRESSIONS {
        let dest = dir
            .path()
            .join("missing-dir")
            .join(format!("{compression:?}"));
        let payload = compress_like_adb(compression, &data);
        let flags = compression.flag() | wire::SYNC_FLAG_DRY_RUN;
        host.push_v2(&dest, REGULAR | 0o644, flags, &payload, 5000)
            .unwrap();
        assert!(!dir.path().join("missing-dir").exists());
    }
    let existing = dir.path().join("existing");
    fs::write(&existing, b"unchanged").unwrap();
    let symlink_mode = libc::S_IFLNK | 0o777;
    host.push_v2(
        &existing,
        symlink_mode,
        wire::SYNC_FLAG_DRY_RUN,
        b"target\0",
        100,
    )
    .unwrap();
    host.push_v2(
        &existing,
        REGULAR | 0o600,
        wire::SYNC_FLAG_DRY_RUN,
        b"new",
        100,
    )
    .unwrap();
    assert_eq!(fs::read(&existing).unwrap(), b"unchanged");
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    host.quit().unwrap();
}

#[test]
fn push_v2_bad_flags_fail() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("x");
    let mut host = Host::new();
    host.request(wire::ID_SEND_V2, dest.as_os_str().as_bytes());
    let flags = wire::SYNC_FLAG_BROTLI | wire::SYNC_FLAG_ZSTD;
    host.write(
        &wire::SendV2Setup {
            id: wire::ID_SEND_V2,
            mode: REGULAR | 0o644,
            flags,
        }
        .encode(),
    );
    let err = host.status().unwrap_err();
    assert!(err.contains("multiple compression flags"), "{err}");
    host.finished().unwrap();
    assert!(!dest.exists());
}

#[test]
fn push_creates_missing_parent_directories() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("a/b/c/file.txt");
    let mut host = Host::new();
    host.push_v1(&dest, REGULAR | 0o644, b"nested").unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"nested");
    assert!(fs::metadata(dir.path().join("a/b")).unwrap().is_dir());
    host.quit().unwrap();
}

#[test]
fn push_keeps_exact_mode_despite_umask() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = Host::new();
    // adbd would turn 0751 into 0777; the umask would turn 0777 into 0755.
    for mode in [0o751, 0o777, 0o600, 0o400, 0o4755, 0o2750, 0o1777] {
        let dest = dir.path().join(format!("mode-{mode:o}"));
        host.push_v1(&dest, REGULAR | mode, b"x").unwrap();
        let got = perm_bits(&dest);
        if mode & 0o7000 != 0 && got != mode {
            // Not root: special bits may be refused, the rest must hold.
            assert_eq!(got, mode & 0o777, "mode {mode:o}");
        } else {
            assert_eq!(got, mode, "mode {mode:o}");
        }
    }
    host.quit().unwrap();
}

#[test]
fn push_interrupted_leaves_old_content_and_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("precious");
    fs::write(&dest, b"old content").unwrap();
    let mut host = Host::new();
    host.request(
        wire::ID_SEND_V1,
        format!("{},33188", dest.display()).as_bytes(),
    );
    host.send_data(&sample_data(300_000), SYNC_DATA_MAX);
    // The host vanishes before DONE.
    let result = host.finished();
    assert!(
        matches!(result, Err(ServiceError::Truncated(_))),
        "{result:?}"
    );
    assert_eq!(fs::read(&dest).unwrap(), b"old content");
    assert!(temp_files_in(dir.path()).is_empty());
}

#[test]
fn push_interrupted_mid_frame_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("new");
    let mut host = Host::new();
    host.request(
        wire::ID_SEND_V1,
        format!("{},33188", dest.display()).as_bytes(),
    );
    let frame = wire::encode_data(&sample_data(SYNC_DATA_MAX)).unwrap();
    host.write(&frame[..1000]);
    assert!(host.finished().is_err());
    assert!(!dest.exists());
    assert!(temp_files_in(dir.path()).is_empty());
}

#[test]
fn push_onto_fifo_writes_through() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    make_fifo(&fifo, 0o644);
    let reader_path = fifo.clone();
    let reader = std::thread::spawn(move || fs::read(reader_path).unwrap());
    let data = sample_data(150_000);
    let mut host = Host::new();
    host.push_v1(&fifo, REGULAR | 0o600, &data).unwrap();
    assert_eq!(reader.join().unwrap(), data);
    let md = fs::symlink_metadata(&fifo).unwrap();
    assert!(md.file_type().is_fifo());
    assert_eq!(md.mode() & 0o777, 0o644, "a FIFO's mode is left alone");
    host.quit().unwrap();
}

#[test]
fn push_onto_private_char_device_writes_through() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("null");
    let dev = rustix::fs::makedev(1, 3);
    // A private /dev/null twin; never the real one.
    let made = rustix::fs::mknodat(
        rustix::fs::CWD,
        &node,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        dev,
    );
    if let Err(e) = made {
        eprintln!("skipping: mknod needs root: {e}");
        return;
    }
    let mut host = Host::new();
    host.push_v1(&node, REGULAR | 0o600, &sample_data(200_000))
        .unwrap();
    let md = fs::symlink_metadata(&node).unwrap();
    assert!(md.file_type().is_char_device());
    assert_eq!(md.rdev(), dev);
    // A symlink push must not replace it either.
    let err = host
        .push_v1(&node, libc::S_IFLNK | 0o777, b"elsewhere\0")
        .unwrap_err();
    assert!(err.contains("refusing to replace"), "{err}");
    host.finished().unwrap();
    assert!(fs::symlink_metadata(&node)
        .unwrap()
        .file_type()
        .is_char_device());
}

#[test]
fn push_onto_kernel_interface_file_writes_in_place() {
    // No temp file can be made in /proc; the push must write the file itself.
    let comm = Path::new("/proc/thread-self/comm");
    // On a thread of its own, whose name the write changes.
    std::thread::spawn(move || {
        let mut host = Host::new();
        host.push_v1(comm, REGULAR | 0o644, b"oxadb-sync\n")
            .unwrap();
        host.quit().unwrap();
    })
    .join()
    .unwrap();
}

#[test]
fn push_onto_mount_point_copies_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    fs::write(&source, b"mounted").unwrap();
    let dest = dir.path().join("dest");
    fs::write(&dest, b"original").unwrap();
    let mounted = std::process::Command::new("mount")
        .arg("--bind")
        .args([&source, &dest])
        .status();
    if !mounted.as_ref().is_ok_and(|status| status.success()) {
        eprintln!("skipping: bind mount unavailable: {mounted:?}");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _mounted = Unmount(dest.clone());
    let mut host = Host::new();
    host.push_v1(&dest, REGULAR | 0o640, b"pushed").unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"pushed");
    assert_eq!(
        fs::read(&source).unwrap(),
        b"pushed",
        "written through the mount"
    );
    assert_eq!(fs::metadata(&dest).unwrap().mtime(), i64::from(MTIME));
    assert!(temp_files_in(dir.path()).is_empty());
    host.quit().unwrap();
}

#[test]
fn push_onto_directory_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("subdir");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("inside"), b"x").unwrap();
    let mut host = Host::new();
    let err = host
        .push_v1(&target, REGULAR | 0o644, &sample_data(200_000))
        .unwrap_err();
    assert_eq!(
        err,
        format!(
            "couldn't create file '{}': Is a directory (os error 21)",
            target.display()
        )
    );
    host.finished().unwrap();
    assert!(target.join("inside").exists());
    assert!(temp_files_in(dir.path()).is_empty());
}

#[test]
fn push_into_path_under_a_file_names_path_and_cause() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("plainfile");
    fs::write(&blocker, b"x").unwrap();
    let dest = blocker.join("child");
    let mut host = Host::new();
    // The data keeps coming after the FAIL; the service drains it up to DONE.
    let err = host
        .push_v1(&dest, REGULAR | 0o644, &sample_data(500_000))
        .unwrap_err();
    assert!(
        err.starts_with(&format!("couldn't create file '{}': ", dest.display())),
        "{err}"
    );
    assert!(err.contains("Not a directory"), "{err}");
    host.finished().unwrap();
}

#[test]
fn push_symlink_creates_link_with_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("deep/link");
    let mut host = Host::new();
    // adb sends readlink() output plus a NUL.
    host.push_v1(&link, libc::S_IFLNK | 0o777, b"../some/target\0")
        .unwrap();
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("../some/target"));
    assert_eq!(
        fs::symlink_metadata(&link).unwrap().mtime(),
        i64::from(MTIME)
    );

    // Replacing a regular file and an existing link, atomically.
    let file = dir.path().join("was-a-file");
    fs::write(&file, b"x").unwrap();
    host.push_v1(&file, libc::S_IFLNK | 0o777, b"new-target\0")
        .unwrap();
    assert_eq!(fs::read_link(&file).unwrap(), Path::new("new-target"));
    host.push_v1(&link, libc::S_IFLNK | 0o777, b"other\0")
        .unwrap();
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("other"));
    assert!(temp_files_in(dir.path()).is_empty());
    host.quit().unwrap();
}

#[test]
fn push_v2_symlink_target_is_never_compressed() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = Host::new();
    for (name, flags) in [
        ("brotli", wire::SYNC_FLAG_BROTLI),
        ("lz4", wire::SYNC_FLAG_LZ4),
        ("zstd", wire::SYNC_FLAG_ZSTD),
    ] {
        let link = dir.path().join(format!("link-{name}"));
        // The target goes raw even though the flags name a compression.
        host.push_v2(
            &link,
            libc::S_IFLNK | 0o777,
            flags,
            b"target-file",
            64 * 1024,
        )
        .unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("target-file"));
        let dry = dir.path().join(format!("dry-{name}"));
        host.push_v2(
            &dry,
            libc::S_IFLNK | 0o777,
            flags | wire::SYNC_FLAG_DRY_RUN,
            b"t",
            64 * 1024,
        )
        .unwrap();
        assert!(
            fs::symlink_metadata(&dry).is_err(),
            "dry run created {dry:?}"
        );
    }
    host.quit().unwrap();
}

#[test]
fn push_regular_file_replaces_symlink_not_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fs::write(&target, b"target content").unwrap();
    let link = dir.path().join("link");
    symlink(&target, &link).unwrap();
    let mut host = Host::new();
    host.push_v1(&link, REGULAR | 0o644, b"pushed").unwrap();
    assert!(fs::symlink_metadata(&link).unwrap().is_file());
    assert_eq!(fs::read(&link).unwrap(), b"pushed");
    assert_eq!(fs::read(&target).unwrap(), b"target content");
    host.quit().unwrap();
}

#[test]
fn push_oversized_data_chunk_is_a_protocol_error() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("x");
    fs::write(&dest, b"old").unwrap();
    let mut host = Host::new();
    host.request(
        wire::ID_SEND_V1,
        format!("{},33188", dest.display()).as_bytes(),
    );
    host.write(&SyncHeader::new(wire::ID_DATA, SYNC_DATA_MAX as u32 + 1).encode());
    let err = host.status().unwrap_err();
    assert!(err.contains("DATA chunk too long"), "{err}");
    assert!(err.contains(&dest.display().to_string()), "{err}");
    assert!(matches!(host.finished(), Err(ServiceError::Protocol(_))));
    assert_eq!(fs::read(&dest).unwrap(), b"old");
    assert!(temp_files_in(dir.path()).is_empty());
}

#[test]
fn bad_send_v1_spec_fails() {
    let mut host = Host::new();
    host.request(wire::ID_SEND_V1, b"/tmp/no-mode-here");
    host.write(&wire::encode_done(0));
    let err = host.status().unwrap_err();
    assert!(
        err.contains("missing ','") && err.contains("/tmp/no-mode-here"),
        "{err}"
    );
    host.finished().unwrap();
}

#[test]
fn stat_variants_on_file_symlink_and_missing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    fs::write(&file, b"12345").unwrap();
    let link = dir.path().join("link");
    symlink("file", &link).unwrap();
    let missing = dir.path().join("missing");
    let file_md = fs::metadata(&file).unwrap();
    let mut host = Host::new();

    let v1 = host.stat_v1(&file);
    assert_eq!(
        v1,
        StatV1 {
            mode: file_md.mode(),
            size: 5,
            mtime: file_md.mtime() as u32
        }
    );
    let v1 = host.stat_v1(&link);
    assert_eq!(v1.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(v1.size, 4);
    assert_eq!(host.stat_v1(&missing), StatV1::default());

    let lst2 = host.stat_v2(wire::ID_LSTAT_V2, &link);
    assert_eq!(lst2.error, 0);
    assert_eq!(lst2.mode & libc::S_IFMT, libc::S_IFLNK);
    let sta2 = host.stat_v2(wire::ID_STAT_V2, &link);
    assert_eq!(sta2, stat_v2_of(&file_md));
    assert_eq!(sta2.size, 5);
    assert_eq!(sta2.nlink, 1);

    let gone = host.stat_v2(wire::ID_LSTAT_V2, &missing);
    assert_eq!(gone, StatV2::error(libc::ENOENT as u32));
    let dangling = dir.path().join("dangling");
    symlink("nowhere", &dangling).unwrap();
    assert_eq!(
        host.stat_v2(wire::ID_STAT_V2, &dangling).error,
        libc::ENOENT as u32
    );
    assert_eq!(host.stat_v2(wire::ID_LSTAT_V2, &dangling).error, 0);
    let under_file = file.join("x");
    assert_eq!(
        host.stat_v2(wire::ID_STAT_V2, &under_file).error,
        libc::ENOTDIR as u32
    );
    host.quit().unwrap();
}

#[test]
fn list_v1_and_v2() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.txt"), b"abc").unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    symlink("a.txt", dir.path().join("ln")).unwrap();
    let mut host = Host::new();

    for v2 in [false, true] {
        let dents = host.list(dir.path(), v2);
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
    assert!(host.list(&dir.path().join("missing"), true).is_empty());
    assert!(host.list(&dir.path().join("a.txt"), false).is_empty());
    host.quit().unwrap();
}

#[test]
fn recv_and_rcv2_each_compression() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("source");
    let data = sample_data(333_333);
    fs::write(&file, &data).unwrap();
    let empty = dir.path().join("empty");
    fs::write(&empty, b"").unwrap();
    let mut host = Host::new();

    assert_eq!(host.pull(&file, None).unwrap(), data);
    assert_eq!(host.pull(&empty, None).unwrap(), b"");
    for compression in ALL_COMPRESSIONS {
        let raw = host.pull(&file, Some(compression.flag())).unwrap();
        assert_eq!(decompress(compression, &raw), data, "{compression:?}");
        let raw = host.pull(&empty, Some(compression.flag())).unwrap();
        assert_eq!(decompress(compression, &raw), b"", "{compression:?}");
    }
    // Pulling through a symlink reads its target, as open() does.
    let link = dir.path().join("link");
    symlink("source", &link).unwrap();
    assert_eq!(host.pull(&link, None).unwrap(), data);
    host.quit().unwrap();
}

#[test]
fn recv_uses_full_size_frames() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("source");
    fs::write(&file, sample_data(3 * SYNC_DATA_MAX + 10)).unwrap();
    let mut host = Host::new();
    host.request(wire::ID_RECV_V1, file.as_os_str().as_bytes());
    let mut sizes = Vec::new();
    loop {
        let header = host.read_header();
        if header.id == wire::ID_DONE {
            assert_eq!(header.len, 0);
            break;
        }
        sizes.push(header.len as usize);
        host.read_vec(header.len as usize);
    }
    assert_eq!(sizes, [SYNC_DATA_MAX, SYNC_DATA_MAX, SYNC_DATA_MAX, 10]);
    host.quit().unwrap();
}

#[test]
fn recv_missing_file_fails_naming_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let mut host = Host::new();
    let err = host.pull(&missing, None).unwrap_err();
    assert_eq!(
        err,
        format!(
            "couldn't open '{}': No such file or directory (os error 2)",
            missing.display()
        )
    );
    host.finished().unwrap();

    let mut host = Host::new();
    let err = host
        .pull(dir.path(), Some(wire::SYNC_FLAG_ZSTD))
        .unwrap_err();
    assert_eq!(
        err,
        format!(
            "couldn't read '{}': not a regular file or device (a directory)",
            dir.path().display()
        )
    );
    host.finished().unwrap();
}

/// A RECV of a FIFO fails at once instead of waiting for a writer (a host
/// may send it before its STAT reply: the `oxadb_recv_ahead` feature).
#[test]
fn recv_of_a_fifo_fails_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    make_fifo(&fifo, 0o600);
    let mut host = Host::new();
    let (done, outcome) = mpsc::channel();
    let asked = fifo.clone();
    std::thread::spawn(move || {
        let err = host.pull(&asked, None).unwrap_err();
        done.send((err, host)).unwrap();
    });
    let (err, host) = outcome
        .recv_timeout(Duration::from_secs(10))
        .expect("RECV of a FIFO blocked");
    assert_eq!(
        err,
        format!(
            "couldn't read '{}': not a regular file or device (a FIFO)",
            fifo.display()
        )
    );
    host.finished().unwrap();
}

#[test]
fn unknown_request_fails_and_ends() {
    let mut host = Host::new();
    host.request(wire::make_id(b"WHAT"), b"/");
    let err = host.status().unwrap_err();
    assert!(
        err.contains("unknown command") && err.contains("WHAT"),
        "{err}"
    );
    assert!(matches!(host.finished(), Err(ServiceError::Protocol(_))));
}

#[test]
fn overlong_path_fails_and_ends() {
    let mut host = Host::new();
    host.write(&SyncHeader::new(wire::ID_LSTAT_V2, 1025).encode());
    let err = host.status().unwrap_err();
    assert!(err.contains("path too long"), "{err}");
    assert!(matches!(host.finished(), Err(ServiceError::Protocol(_))));
}

#[test]
fn host_closing_between_requests_is_a_clean_end() {
    let host = Host::new();
    host.finished().unwrap();
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    // `adb sync` sends a batch of LST2 requests before reading any reply.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    fs::write(&file, b"x").unwrap();
    let mut host = Host::new();
    let mut batch = Vec::new();
    for path in [&file, &dir.path().join("missing"), &file] {
        let request = wire::SyncRequest {
            id: wire::ID_LSTAT_V2,
            path: path.as_os_str().as_bytes().to_vec(),
        };
        batch.extend(request.encode().unwrap());
    }
    host.write(&batch);
    let mut errors = Vec::new();
    for _ in 0..3 {
        let (_, stat) = StatV2::parse(&host.read_vec(wire::STAT_V2_LEN)).unwrap();
        errors.push(stat.error);
    }
    assert_eq!(errors, [0, libc::ENOENT as u32, 0]);
    host.quit().unwrap();
}
