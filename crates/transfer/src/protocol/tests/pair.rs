//! The host's machine and the daemon's back to back, with the daemon's real
//! file work in a temporary directory.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};

use oxadb_wire::sync::{Compression, TransferFlags};

use super::*;
use crate::protocol::{stat_v2_of, RequestError, StatFailure, StatKind};

const FILE: u32 = libc::S_IFREG;

fn v2(compression: Compression) -> Option<TransferFlags> {
    Some(TransferFlags {
        compression,
        dry_run: false,
    })
}

#[test]
fn pushed_files_pull_back_the_same_with_every_request_version() {
    let dir = tempfile::tempdir().unwrap();
    let mut pair = Pair::new();
    let sizes = [0, 1, 65_535, 65_536, 65_537, 300_000];
    // SEND/RECV, then SND2/RCV2 with each compression.
    let mut versions = vec![(None, None)];
    versions.extend(ALL_COMPRESSIONS.map(|c| (v2(c), Some(c))));
    for (flags, recv) in versions {
        for size in sizes {
            let data = sample_data(size);
            let remote = bytes_of(&dir.path().join(format!("{flags:?}-{size}")));
            pair.push(&remote, FILE | 0o640, flags, &data)
                .unwrap_or_else(|e| panic!("{flags:?} {size}: {e}"));
            assert_eq!(pair.pull(&remote, recv).unwrap(), data, "{flags:?} {size}");
            let md = fs::metadata(std::str::from_utf8(&remote).unwrap()).unwrap();
            assert_eq!(md.mode() & 0o7777, 0o640);
            assert_eq!(md.mtime(), i64::from(PUSH_MTIME));
        }
    }
    assert!(temp_files_in(dir.path()).is_empty());
    assert_eq!(pair.quit(), Ok(()));
}

#[test]
fn stats_and_listings_in_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    fs::write(&file, b"12345").unwrap();
    symlink("file", dir.path().join("link")).unwrap();
    symlink("nowhere", dir.path().join("dangling")).unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    let mut pair = Pair::new();
    let path = |name: &str| bytes_of(&dir.path().join(name));

    let v1 = pair.stat(StatKind::LstatV1, &path("file")).unwrap();
    let md = fs::metadata(&file).unwrap();
    assert_eq!((v1.mode, v1.size, v1.mtime), (md.mode(), 5, md.mtime()));
    // adb reads a STAT reply's mtime as its ctime too.
    assert_eq!(v1.ctime, md.mtime());
    assert_eq!(v1.ino, 0, "v1 has no inode");
    let link = pair.stat(StatKind::LstatV1, &path("link")).unwrap();
    assert_eq!(link.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        pair.stat(StatKind::LstatV1, &path("missing")),
        Err(StatFailure::Unknown)
    );

    assert_eq!(
        pair.stat(StatKind::StatV2, &path("link")),
        Ok(stat_v2_of(&md))
    );
    let lst2 = pair.stat(StatKind::LstatV2, &path("link")).unwrap();
    assert_eq!(lst2.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        pair.stat(StatKind::StatV2, &path("dangling")),
        Err(StatFailure::Errno(libc::ENOENT as u32))
    );
    assert_eq!(
        pair.stat(StatKind::StatV2, &path("file/x")),
        Err(StatFailure::Errno(libc::ENOTDIR as u32))
    );
    assert!(StatFailure::Unknown.is_not_found() && StatFailure::Errno(2).is_not_found());
    assert!(!StatFailure::Errno(20).is_not_found());

    for v2 in [false, true] {
        let mut names: Vec<String> = pair
            .list(v2, &bytes_of(dir.path()))
            .into_iter()
            .map(|dent| String::from_utf8(dent.name).unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [".", "..", "dangling", "file", "link", "sub"],
            "v2={v2}"
        );
        // An unreadable directory is an empty listing.
        assert!(pair.list(v2, &path("missing")).is_empty());
        assert!(pair.list(v2, &path("file")).is_empty());
    }
    let dnt2 = pair.list(true, &bytes_of(dir.path()));
    let entry = dnt2.iter().find(|d| d.name == b"file").unwrap();
    assert_eq!(
        entry.stat,
        stat_v2_of(&fs::symlink_metadata(&file).unwrap())
    );
    assert_eq!(pair.quit(), Ok(()));
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut pair = Pair::new();
    // adb sends a batch of LST2 before reading any reply, and pushes before
    // their OKAYs: all of them go before the first answer is read.
    let paths: Vec<Vec<u8>> = (0..200)
        .map(|i| bytes_of(&dir.path().join(format!("f{i}"))))
        .collect();
    for (i, path) in paths.iter().enumerate() {
        pair.push_unacked(path, FILE | 0o600, None, format!("{i}").as_bytes());
    }
    assert_eq!(pair.client.pending_acks(), 200);
    assert_eq!(
        pair.client.oldest_push(),
        Some(("local", &*String::from_utf8_lossy(&paths[0])))
    );
    let refs: Vec<&[u8]> = paths.iter().map(Vec::as_slice).collect();
    pair.client.stat_many(StatKind::LstatV2, &refs).unwrap();
    for _ in &paths {
        assert_eq!(pair.expect_event(), ClientEvent::Acked);
    }
    for (i, _) in paths.iter().enumerate() {
        match pair.expect_event() {
            ClientEvent::Stat(Ok(stat)) => assert_eq!(stat.size, format!("{i}").len() as u64),
            other => panic!("{other:?}"),
        }
    }
    assert!(!pair.client.awaits_reply());
    assert_eq!(pair.quit(), Ok(()));
}

#[test]
fn a_failed_push_ends_both_sides_with_the_daemons_words() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("plainfile");
    fs::write(&blocker, b"x").unwrap();
    let remote = bytes_of(&blocker.join("child"));
    let mut pair = Pair::new();
    pair.push_unacked(
        &remote,
        FILE | 0o644,
        v2(Compression::None),
        &sample_data(200_000),
    );
    match pair.expect_event() {
        ClientEvent::PushFailed {
            local,
            remote: named,
            message,
        } => {
            assert_eq!(local, "local");
            assert_eq!(named.as_bytes(), &remote[..]);
            assert_eq!(
                message,
                format!(
                    "couldn't create file '{}': Not a directory (os error 20)",
                    blocker.join("child").display()
                )
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        pair.client.ended(),
        Some("the device reported a failed push")
    );
    assert_eq!(
        pair.client.stat(StatKind::LstatV2, b"/"),
        Err(RequestError::Ended(
            "the device reported a failed push".to_string()
        ))
    );
    assert_eq!(pair.daemon.end(), Some(Ok(())));
}

#[test]
fn a_failed_pull_ends_both_sides_with_the_daemons_words() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let mut pair = Pair::new();
    assert_eq!(
        pair.pull(&bytes_of(&missing), None),
        Err(format!(
            "couldn't open '{}': No such file or directory (os error 2)",
            missing.display()
        ))
    );
    assert_eq!(
        pair.client.ended(),
        Some("the device reported a failed pull")
    );
    assert_eq!(pair.daemon.end(), Some(Ok(())));

    let mut pair = Pair::new();
    assert_eq!(
        pair.pull(&bytes_of(dir.path()), Some(Compression::Zstd)),
        Err(format!(
            "couldn't read '{}': not a regular file or device (a directory)",
            dir.path().display()
        ))
    );
    assert_eq!(pair.daemon.end(), Some(Ok(())));
}

#[test]
fn a_recv_sent_ahead_brings_the_data_after_the_stat() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    let data = sample_data(100_000);
    fs::write(&file, &data).unwrap();
    let mut pair = Pair::new();
    pair.client
        .stat_with_recv_ahead(&bytes_of(&file), Some(Compression::Lz4))
        .unwrap();
    // Both requests in one write, before any reply.
    let requests = pair.client.poll_transmit().unwrap().into_bytes();
    assert!(pair.client.poll_transmit().is_none());
    pair.daemon.receive(requests);
    let md = fs::metadata(&file).unwrap();
    assert_eq!(pair.expect_event(), ClientEvent::Stat(Ok(stat_v2_of(&md))));
    let ticket = pair
        .client
        .start_pull(&bytes_of(&file), Some(Compression::Lz4))
        .unwrap();
    assert!(ticket.sent_ahead());
    pair.client.send_pull(ticket);
    assert!(
        pair.client.poll_transmit().is_none(),
        "nothing more to send"
    );
    assert_eq!(pair.pulled(Compression::Lz4).unwrap(), data);
    assert_eq!(pair.quit(), Ok(()));

    // Not pulled after all (a directory): the device refuses the RECV and
    // ends its service; so does the host.
    let mut pair = Pair::new();
    pair.client
        .stat_with_recv_ahead(&bytes_of(dir.path()), None)
        .unwrap();
    match pair.expect_event() {
        ClientEvent::Stat(Ok(stat)) => assert_eq!(stat.mode & libc::S_IFMT, libc::S_IFDIR),
        other => panic!("{other:?}"),
    }
    pair.client.drop_recv_ahead();
    assert_eq!(
        pair.client.ended(),
        Some("a RECV sent ahead of its STAT reply was not needed")
    );
    pair.drive();
    assert_eq!(pair.daemon.end(), Some(Ok(())));

    // Another path pulled than the one sent ahead: its reply would be read
    // as this pull's.
    let mut pair = Pair::new();
    pair.client
        .stat_with_recv_ahead(&bytes_of(&file), None)
        .unwrap();
    let error = pair.client.start_pull(b"/other", None).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "pulling '/other' while the RECV of '{}' was on its way",
            file.display()
        )
    );
    assert_eq!(
        pair.client.ended(),
        Some("a RECV sent ahead was followed by another pull")
    );
}

#[test]
fn zero_copy_pulls_send_the_bytes_of_the_copying_path() {
    let dir = tempfile::tempdir().unwrap();
    for size in [1, SYNC_DATA_MAX, 15 * SYNC_DATA_MAX, 3 * 1024 * 1024 + 5] {
        let file = dir.path().join(format!("f{size}"));
        fs::write(&file, sample_data(size)).unwrap();
        let mut sent = Vec::new();
        for zero_copy in [false, true] {
            let mut pair = Pair::new();
            pair.daemon.zero_copy = zero_copy;
            assert_eq!(
                pair.pull(&bytes_of(&file), None).unwrap(),
                sample_data(size)
            );
            sent.push(std::mem::take(&mut pair.sent_to_host));
        }
        assert!(sent[0] == sent[1], "size {size}");
    }
}

#[test]
fn dry_runs_and_links_through_both_machines() {
    let dir = tempfile::tempdir().unwrap();
    let mut pair = Pair::new();
    let target = bytes_of(&dir.path().join("missing-dir/file"));
    let dry = Some(TransferFlags {
        compression: Compression::Zstd,
        dry_run: true,
    });
    pair.push(&target, FILE | 0o644, dry, &sample_data(100_000))
        .unwrap();
    assert!(!dir.path().join("missing-dir").exists());
    // A link target travels as one frame, with its NUL.
    let link = bytes_of(&dir.path().join("link"));
    pair.push(
        &link,
        libc::S_IFLNK | 0o777,
        v2(Compression::Brotli),
        b"target\0",
    )
    .unwrap();
    assert_eq!(
        fs::read_link(dir.path().join("link")).unwrap(),
        Path::new("target")
    );
    assert_eq!(pair.quit(), Ok(()));
}
