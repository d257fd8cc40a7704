//! The host's machine and the daemon's back to back, with the daemon's real
//! file work in a temporary directory.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};

use oxadb_wire::sync::Compression;

use super::*;
use crate::protocol::{stat_v2_of, RequestError, StatFailure};

const FILE: u32 = libc::S_IFREG;

#[test]
fn pushed_files_pull_back_the_same_with_every_request_version() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [0, 1, 65_535, 65_536, 65_537, 300_000];
    // SEND/RECV, then SND2/RCV2 with each compression.
    let mut runs = vec![(V1, Compression::None)];
    runs.extend(ALL_COMPRESSIONS.map(|c| (V2, c)));
    for (versions, compression) in runs {
        let mut pair = Pair::new(versions);
        for size in sizes {
            let data = sample_data(size);
            let name = format!("{}-{compression:?}-{size}", versions.sendrecv_v2);
            let remote = bytes_of(&dir.path().join(&name));
            pair.push(&remote, FILE | 0o640, compression, &data)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(pair.pull(&remote, compression).unwrap(), data, "{name}");
            let md = fs::metadata(dir.path().join(&name)).unwrap();
            assert_eq!(md.mode() & 0o7777, 0o640);
            assert_eq!(md.mtime(), i64::from(PUSH_MTIME));
        }
        assert_eq!(pair.quit(), Ok(()));
    }
    assert!(temp_files_in(dir.path()).is_empty());
}

#[test]
fn a_device_without_v2_gets_only_the_original_requests() {
    let dir = tempfile::tempdir().unwrap();
    let mut pair = Pair::new(V1);
    let remote = bytes_of(&dir.path().join("f"));
    pair.push(
        &remote,
        FILE | 0o600,
        Compression::Zstd,
        &sample_data(100_000),
    )
    .unwrap();
    assert_eq!(
        pair.pull(&remote, Compression::Lz4).unwrap(),
        sample_data(100_000)
    );
    pair.lstat(&remote).unwrap();
    pair.list(&bytes_of(dir.path()));
    assert_eq!(
        pair.daemon.actions,
        ["push", "push data", "push done", "pull", "stat", "list"]
    );
    // Compression asked of SEND/RECV goes nowhere: the data went plain.
    let sent = &pair.sent_to_host;
    assert!(sent.windows(4).any(|w| w == b"DATA") && sent.windows(4).any(|w| w == b"STAT"));
    assert!(!sent.windows(4).any(|w| w == b"LST2" || w == b"DNT2"));
    // SEND has no dry run.
    assert_eq!(
        pair.client
            .push(&remote, FILE, Compression::None, true, "local"),
        Err(RequestError::DryRunUnsupported)
    );
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
    symlink("sub", dir.path().join("dirlink")).unwrap();
    let path = |name: &str| bytes_of(&dir.path().join(name));
    let md = fs::metadata(&file).unwrap();

    // STAT: lstat, 32-bit fields, zeroes for a failure.
    let mut v1 = Pair::new(V1);
    let stat = v1.lstat(&path("file")).unwrap();
    assert_eq!(
        (stat.mode, stat.size, stat.mtime),
        (md.mode(), 5, md.mtime())
    );
    // adb reads a STAT reply's mtime as its ctime too.
    assert_eq!(stat.ctime, md.mtime());
    assert_eq!(stat.ino, 0, "v1 has no inode");
    let link = v1.lstat(&path("link")).unwrap();
    assert_eq!(link.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(v1.lstat(&path("missing")), Err(StatFailure::Unknown));
    // Following symlinks without STA2 is adb's fallback: a second STAT of
    // "path/" tells a link to a directory from the rest, size 0.
    let followed = v1.stat(&path("link")).unwrap();
    assert_eq!(
        (followed.mode & libc::S_IFMT, followed.size),
        (libc::S_IFREG, 0)
    );
    assert_eq!(followed.mode & 0o7777, link.mode & 0o7777);
    let followed = v1.stat(&path("dirlink")).unwrap();
    assert_eq!(followed.mode & libc::S_IFMT, libc::S_IFDIR);
    let followed = v1.stat(&path("dangling")).unwrap();
    assert_eq!(followed.mode & libc::S_IFMT, libc::S_IFREG);
    assert_eq!(v1.stat(&path("file")).unwrap().size, 5);
    assert_eq!(v1.stat(&path("missing")), Err(StatFailure::Unknown));
    let stats = v1.daemon.actions.iter().filter(|&&a| a == "stat").count();
    assert_eq!(stats, 3 + 3 * 2 + 2, "a second STAT for each link");

    // STA2 and LST2: the errno for a failure.
    let mut v2 = Pair::new(V2);
    assert_eq!(v2.stat(&path("link")), Ok(stat_v2_of(&md)));
    let lst2 = v2.lstat(&path("link")).unwrap();
    assert_eq!(lst2.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        v2.stat(&path("dangling")),
        Err(StatFailure::Errno(libc::ENOENT as u32))
    );
    assert_eq!(
        v2.stat(&path("file/x")),
        Err(StatFailure::Errno(libc::ENOTDIR as u32))
    );
    assert!(StatFailure::Unknown.is_not_found() && StatFailure::Errno(2).is_not_found());
    assert!(!StatFailure::Errno(20).is_not_found());

    for pair in [&mut v1, &mut v2] {
        let mut names: Vec<String> = pair
            .list(&bytes_of(dir.path()))
            .into_iter()
            .map(|dent| String::from_utf8(dent.name).unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [".", "..", "dangling", "dirlink", "file", "link", "sub"]
        );
        // An unreadable directory is an empty listing.
        assert!(pair.list(&path("missing")).is_empty());
        assert!(pair.list(&path("file")).is_empty());
    }
    let dnt2 = v2.list(&bytes_of(dir.path()));
    let entry = dnt2.iter().find(|d| d.name == b"file").unwrap();
    assert_eq!(
        entry.stat,
        stat_v2_of(&fs::symlink_metadata(&file).unwrap())
    );
    assert_eq!(v1.quit(), Ok(()));
    assert_eq!(v2.quit(), Ok(()));
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut pair = Pair::new(V2);
    // adb sends a batch of LST2 before reading any reply, and pushes before
    // their OKAYs: all of them go before the first answer is read.
    let paths: Vec<Vec<u8>> = (0..200)
        .map(|i| bytes_of(&dir.path().join(format!("f{i}"))))
        .collect();
    for (i, path) in paths.iter().enumerate() {
        let data = format!("{i}");
        pair.push_unacked(
            path,
            FILE | 0o600,
            Compression::None,
            false,
            data.as_bytes(),
        )
        .unwrap();
    }
    assert_eq!(pair.client.pending_acks(), 200);
    let first = String::from_utf8_lossy(&paths[0]).into_owned();
    assert_eq!(pair.client.oldest_push(), Some(("local", first.as_str())));
    let refs: Vec<&[u8]> = paths.iter().map(Vec::as_slice).collect();
    pair.client.lstat_many(&refs).unwrap();
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
    let mut pair = Pair::new(V2);
    pair.push_unacked(
        &remote,
        FILE | 0o644,
        Compression::None,
        false,
        &sample_data(200_000),
    )
    .unwrap();
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
        pair.client.lstat(b"/"),
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
    let mut pair = Pair::new(V1);
    assert_eq!(
        pair.pull(&bytes_of(&missing), Compression::None),
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

    let mut pair = Pair::new(V2);
    assert_eq!(
        pair.pull(&bytes_of(dir.path()), Compression::Zstd),
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
    let ahead = Versions {
        recv_ahead: true,
        ..V2
    };
    let mut pair = Pair::new(ahead);
    pair.client
        .stat_for_pull(&bytes_of(&file), Compression::Lz4)
        .unwrap();
    // Both requests in one write, before any reply.
    let requests = pair.client.poll_transmit().unwrap().into_bytes();
    assert!(pair.client.poll_transmit().is_none());
    assert!(requests.windows(4).any(|w| w == b"RCV2"));
    pair.daemon.receive(requests);
    let md = fs::metadata(&file).unwrap();
    assert_eq!(pair.stat_reply(), Ok(stat_v2_of(&md)));
    let ticket = pair
        .client
        .start_pull(&bytes_of(&file), Compression::Lz4)
        .unwrap();
    assert!(ticket.sent_ahead());
    assert_eq!(ticket.compression(), Compression::Lz4);
    pair.client.send_pull(ticket);
    assert!(
        pair.client.poll_transmit().is_none(),
        "nothing more to send"
    );
    assert_eq!(pair.pulled(Compression::Lz4).unwrap(), data);
    assert_eq!(pair.quit(), Ok(()));

    // Not pulled after all (a directory): the device refuses the RECV and
    // ends its service; so does the host.
    let mut pair = Pair::new(ahead);
    pair.client
        .stat_for_pull(&bytes_of(dir.path()), Compression::None)
        .unwrap();
    let stat = pair.stat_reply().unwrap();
    assert_eq!(stat.mode & libc::S_IFMT, libc::S_IFDIR);
    pair.client.drop_recv_ahead();
    assert_eq!(
        pair.client.ended(),
        Some("a RECV sent ahead of its STAT reply was not needed")
    );
    pair.drive();
    assert_eq!(pair.daemon.end(), Some(Ok(())));

    // Another path pulled than the one sent ahead: its reply would be read
    // as this pull's.
    let mut pair = Pair::new(ahead);
    pair.client
        .stat_for_pull(&bytes_of(&file), Compression::None)
        .unwrap();
    let error = pair
        .client
        .start_pull(b"/other", Compression::None)
        .unwrap_err();
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

    // A device that does not take it gets the STAT alone.
    let mut pair = Pair::new(V2);
    pair.client
        .stat_for_pull(&bytes_of(&file), Compression::None)
        .unwrap();
    let requests = pair.client.poll_transmit().unwrap().into_bytes();
    assert_eq!(requests.len(), 8 + file.as_os_str().len());
    pair.daemon.receive(requests);
    assert!(pair.stat_reply().is_ok());
    let ticket = pair
        .client
        .start_pull(&bytes_of(&file), Compression::None)
        .unwrap();
    assert!(!ticket.sent_ahead());
}

#[test]
fn zero_copy_pulls_send_the_bytes_of_the_copying_path() {
    let dir = tempfile::tempdir().unwrap();
    for size in [1, SYNC_DATA_MAX, 15 * SYNC_DATA_MAX, 3 * 1024 * 1024 + 5] {
        let file = dir.path().join(format!("f{size}"));
        fs::write(&file, sample_data(size)).unwrap();
        let mut sent = Vec::new();
        for zero_copy in [false, true] {
            let mut pair = Pair::new(V1);
            pair.daemon.zero_copy = zero_copy;
            assert_eq!(
                pair.pull(&bytes_of(&file), Compression::None).unwrap(),
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
    let mut pair = Pair::new(V2);
    let target = bytes_of(&dir.path().join("missing-dir/file"));
    pair.push_unacked(
        &target,
        FILE | 0o644,
        Compression::Zstd,
        true,
        &sample_data(100_000),
    )
    .unwrap();
    assert_eq!(pair.ack(), Ok(()));
    assert!(!dir.path().join("missing-dir").exists());
    // A link target travels as one frame, with its NUL.
    let link = bytes_of(&dir.path().join("link"));
    pair.push(
        &link,
        libc::S_IFLNK | 0o777,
        Compression::Brotli,
        b"target\0",
    )
    .unwrap();
    assert_eq!(
        fs::read_link(dir.path().join("link")).unwrap(),
        Path::new("target")
    );
    assert_eq!(pair.quit(), Ok(()));
}
