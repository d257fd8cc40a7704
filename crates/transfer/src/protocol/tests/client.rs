//! The host's machine against replies framed by hand: the protocol errors
//! it names, the end of the stream, and hostile bytes.

use bytes::Bytes;
use oxadb_wire::sync::{
    self as wire, Compression, StatV1, StatV2, SyncHeader, SYNC_DATA_MAX, SYNC_PATH_MAX,
};

use super::*;
use crate::protocol::{RequestError, StatFailure};

fn fed(client: &mut Client, bytes: &[u8]) -> Result<Option<ClientEvent>, ClientError> {
    client.handle_input(Bytes::copy_from_slice(bytes));
    client.poll_event()
}

fn protocol_error(message: &str) -> Result<Option<ClientEvent>, ClientError> {
    Err(ClientError::Protocol(message.to_string()))
}

#[test]
fn replies_to_something_else_are_protocol_errors_that_end_the_session() {
    let header = |id, len| SyncHeader::new(id, len).encode();
    type Case = (Versions, fn(&mut Client), Vec<u8>, &'static str);
    let push = |c: &mut Client| {
        c.push(b"/x", 0o100644, Compression::None, false, "x")
            .unwrap();
    };
    let pull = |c: &mut Client| {
        let ticket = c.start_pull(b"/x", Compression::None).unwrap();
        c.send_pull(ticket)
    };
    let cases: Vec<Case> = vec![
        (
            V2,
            |c| c.lstat(b"/x").unwrap(),
            StatV2::default().encode(wire::ID_STAT_V2).to_vec(),
            "expected a LST2 reply for '/x', got STA2",
        ),
        (
            V1,
            |c| c.lstat(b"/x").unwrap(),
            StatV2::default().encode(wire::ID_LSTAT_V2)[..16].to_vec(),
            "expected a STAT reply for '/x', got LST2",
        ),
        (
            V1,
            push,
            header(wire::ID_OKAY, 5).to_vec(),
            "OKAY with a message length of 5",
        ),
        (
            V2,
            push,
            header(wire::ID_FAIL, SYNC_DATA_MAX as u32 + 1).to_vec(),
            "FAIL message of 65537 bytes (the limit is 65536)",
        ),
        (
            V2,
            pull,
            // What a device that then goes quiet sends: refused at its
            // header, not waited for.
            [&header(wire::ID_FAIL, u32::MAX)[..], b"short"].concat(),
            "FAIL message of 4294967295 bytes (the limit is 65536)",
        ),
        (
            V2,
            push,
            header(wire::ID_DATA, 0).to_vec(),
            "unexpected response to a push: DATA",
        ),
        (
            V1,
            pull,
            header(wire::ID_OKAY, 0).to_vec(),
            "expected DATA, DONE or FAIL, got OKAY",
        ),
        (
            V2,
            pull,
            header(wire::ID_DATA, SYNC_DATA_MAX as u32 + 1).to_vec(),
            "DATA chunk too long: 65537 bytes (limit 65536)",
        ),
        (
            V2,
            |c| c.list(b"/d").unwrap(),
            header(wire::ID_DENT_V1, 0).to_vec(),
            "listing '/d': expected DNT2 or DONE, got DENT",
        ),
        (
            V1,
            |c| c.list(b"/d").unwrap(),
            {
                let mut dent = Vec::new();
                wire::encode_dent_v1(&mut dent, 0, 0, 0, b"x");
                dent[16..20].copy_from_slice(&4097u32.to_le_bytes());
                dent
            },
            "listing '/d': entry name of 4097 bytes",
        ),
    ];
    for (versions, request, reply, message) in cases {
        let mut client = Client::new(versions);
        request(&mut client);
        assert_eq!(fed(&mut client, &reply), protocol_error(message));
        assert_eq!(client.ended(), Some("protocol error"));
        assert!(!client.awaits_reply());
        assert_eq!(
            client.stat(b"/"),
            Err(RequestError::Ended("protocol error".to_string()))
        );
    }
}

#[test]
fn a_reply_cut_short_by_the_end_of_the_stream_ends_the_session() {
    let mut client = Client::new(V2);
    client.stat(b"/x").unwrap();
    let reply = StatV2::default().encode(wire::ID_STAT_V2);
    assert_eq!(fed(&mut client, &reply[..40]), Ok(None));
    client.handle_eof();
    assert_eq!(client.poll_event(), Err(ClientError::Closed));
    assert_eq!(client.ended(), Some("the device closed the stream"));
    // Nothing owed: the end of the stream is no error.
    let mut idle = Client::new(V2);
    idle.handle_eof();
    assert_eq!(idle.poll_event(), Ok(None));
}

#[test]
fn pull_data_leaves_piece_by_piece_as_slices_of_the_chunks() {
    let mut client = Client::new(V1);
    let ticket = client.start_pull(b"/x", Compression::Zstd).unwrap();
    // RECV carries no compression.
    assert_eq!(ticket.compression(), Compression::None);
    client.send_pull(ticket);
    let mut frames = wire::encode_data(&[5; 300]).unwrap();
    frames.extend(wire::encode_data(b"").unwrap());
    frames.extend(wire::encode_done(0));
    let first = Bytes::copy_from_slice(&frames[..108]);
    client.handle_input(first.clone());
    let Ok(Some(ClientEvent::Data(piece))) = client.poll_event() else {
        panic!("no data");
    };
    // What arrived of the payload, not a copy; the rest when it comes.
    assert_eq!(piece.len(), 100);
    assert_eq!(piece.as_ptr(), first[8..].as_ptr());
    assert_eq!(client.poll_event(), Ok(None));
    client.handle_input(Bytes::copy_from_slice(&frames[108..]));
    assert_eq!(
        client.poll_event(),
        Ok(Some(ClientEvent::Data(Bytes::from(vec![5; 200]))))
    );
    // An empty DATA frame gives nothing.
    assert_eq!(client.poll_event(), Ok(Some(ClientEvent::Done)));
    assert!(!client.awaits_reply());
}

#[test]
fn a_path_too_long_is_refused_and_nothing_is_sent() {
    let mut client = Client::new(V1);
    let long = vec![b'a'; SYNC_PATH_MAX + 1];
    let error = client.lstat(&long).unwrap_err();
    assert_eq!(error.to_string(), "path too long: 1025 bytes (limit 1024)");
    // SEND's spec counts its ",mode" too.
    let almost = vec![b'a'; SYNC_PATH_MAX - 3];
    assert!(client
        .push(&almost, 0o100644, Compression::None, false, "x")
        .is_err());
    // A batch of stats goes whole or not at all.
    let paths: [&[u8]; 2] = [b"/fine", &long];
    assert!(client.lstat_many(&paths).is_err());
    assert!(client.poll_transmit().is_none());
    assert!(!client.awaits_reply());
    // The session goes on.
    assert_eq!(client.ended(), None);
    client.lstat(b"/fine").unwrap();
    assert!(client.awaits_reply());
}

#[test]
fn hostile_replies_never_panic() {
    let seed = super::seed();
    let mut rng = Rng::new(seed);
    let ids = [
        wire::ID_OKAY,
        wire::ID_FAIL,
        wire::ID_DATA,
        wire::ID_DONE,
        wire::ID_DENT_V1,
        wire::ID_DENT_V2,
        wire::ID_STAT_V2,
        wire::ID_LSTAT_V1,
        0x0102_0304,
    ];
    for round in 0..500 {
        let mut client = Client::new(if rng.chance(2) { V1 } else { V2 });
        for _ in 0..rng.between(1, 6) {
            match rng.next() % 5 {
                0 => client.lstat(b"/a").unwrap(),
                1 => client.stat(b"/a").unwrap(),
                2 => client.list(b"/d").unwrap(),
                3 => {
                    client
                        .push(b"/p", 0o100644, Compression::None, false, "p")
                        .unwrap();
                }
                _ => {
                    let ticket = client.start_pull(b"/q", Compression::None).unwrap();
                    client.send_pull(ticket);
                }
            }
        }
        let mut bytes = Vec::new();
        while bytes.len() < 3000 {
            let id = ids[rng.between(0, ids.len() - 1)];
            let len = match rng.next() % 3 {
                0 => rng.between(0, 100),
                1 => rng.between(0, 70_000),
                _ => u32::MAX as usize,
            } as u32;
            bytes.extend(SyncHeader::new(id, len).encode());
            for _ in 0..rng.between(0, 100) {
                bytes.push(rng.next() as u8);
            }
        }
        let mut cuts = Cuts::Random(rng.clone());
        let mut failed = false;
        for piece in cuts.split(Bytes::from(bytes)) {
            client.handle_input(piece);
            loop {
                match client.poll_event() {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
        }
        client.handle_eof();
        while let Ok(Some(_)) = client.poll_event() {}
        assert!(
            failed || client.ended().is_some() || !client.awaits_reply(),
            "seed {seed}, round {round}"
        );
        rng.next();
    }
}

#[test]
fn without_sta2_a_symlink_is_asked_about_again_with_a_slash() {
    let reply = |mode: u32, size: u32| {
        StatV1 {
            mode,
            size,
            mtime: 7,
        }
        .encode()
    };
    for (probe, kind) in [
        (reply(0o40755, 4096), libc::S_IFDIR),
        (StatV1::default().encode(), libc::S_IFREG),
    ] {
        let mut client = Client::new(V1);
        client.stat(b"/l").unwrap();
        let first = client.poll_transmit().unwrap().into_bytes();
        assert_eq!(&first[..], b"STAT\x02\0\0\0/l");
        assert_eq!(fed(&mut client, &reply(0o120777, 9)), Ok(None));
        // The second STAT goes on its own, for "path/".
        let second = client.poll_transmit().unwrap().into_bytes();
        assert_eq!(&second[..], b"STAT\x03\0\0\0/l/");
        let Ok(Some(ClientEvent::Stat(Ok(stat)))) = fed(&mut client, &probe) else {
            panic!("no stat");
        };
        assert_eq!((stat.mode, stat.size, stat.mtime), (kind | 0o777, 0, 7));
        assert!(!client.awaits_reply());
    }
    // A path at the request limit leaves no room for the slash.
    let mut client = Client::new(V1);
    let long = vec![b'a'; SYNC_PATH_MAX];
    client.stat(&long).unwrap();
    assert_eq!(
        fed(&mut client, &reply(0o120777, 9)),
        Ok(Some(ClientEvent::Stat(Err(StatFailure::Errno(
            libc::ENAMETOOLONG as u32
        )))))
    );
    // Not a link: the first answer is the answer.
    let mut client = Client::new(V1);
    client.stat(b"/f").unwrap();
    assert_eq!(
        fed(&mut client, &reply(0o100644, 3)),
        Ok(Some(ClientEvent::Stat(Ok(StatV2 {
            mode: 0o100644,
            size: 3,
            mtime: 7,
            ctime: 7,
            ..StatV2::default()
        }))))
    );
}
