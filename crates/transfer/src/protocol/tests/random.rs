//! Random sessions through both machines: random requests (pushes and pulls
//! of every version and compression, stats, listings, pipelined pushes,
//! pulls of missing files), with both streams cut at random points, checked
//! against a model of the directory. The seed is printed; `OXADB_SYNC_SEED`
//! repeats a run.

use std::collections::BTreeMap;
use std::fs;

use oxadb_wire::sync::Compression;

use super::*;
use crate::protocol::StatFailure;

/// A size worth trying: empty, small, around a frame, a few frames.
fn random_size(rng: &mut Rng) -> usize {
    match rng.next() % 5 {
        0 => 0,
        1 => rng.between(1, 200),
        2 => rng.between(SYNC_DATA_MAX - 2, SYNC_DATA_MAX + 2),
        3 => rng.between(1000, 30_000),
        _ => rng.between(70_000, 200_000),
    }
}

/// A compression to ask for (which `SEND`/`RECV` do without).
fn random_compression(rng: &mut Rng) -> Compression {
    ALL_COMPRESSIONS[rng.between(0, ALL_COMPRESSIONS.len() - 1)]
}

/// The request versions of a device: each on or off.
fn random_versions(rng: &mut Rng) -> Versions {
    Versions {
        stat_v2: rng.chance(2),
        ls_v2: rng.chance(2),
        sendrecv_v2: rng.chance(2),
        recv_ahead: false,
    }
}

fn random_data(rng: &mut Rng, len: usize) -> Vec<u8> {
    // Compressible runs and noise, different every time.
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let word = rng.next();
        if word.is_multiple_of(3) {
            out.extend_from_slice(&[word as u8; 64]);
        } else {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
    out.truncate(len);
    out
}

#[test]
fn random_sessions_cut_at_random_points() {
    let seed = super::seed();
    let mut rng = Rng::new(seed);
    for session in 0..30 {
        let dir = tempfile::tempdir().unwrap();
        let name_of = |i: usize| format!("f{i}");
        let remote = |name: &str| bytes_of(&dir.path().join(name));
        let versions = random_versions(&mut rng);
        let mut pair = Pair::with_cuts(
            versions,
            Cuts::Random(Rng::new(rng.next())),
            Cuts::Random(Rng::new(rng.next())),
        );
        let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut ended = false;
        for step in 0..rng.between(1, 20) {
            let context = format!("seed {seed}, session {session}, step {step}");
            match rng.next() % 7 {
                0 | 1 => {
                    let name = name_of(rng.between(0, 4));
                    let size = random_size(&mut rng);
                    let data = random_data(&mut rng, size);
                    let compression = random_compression(&mut rng);
                    pair.push(&remote(&name), libc::S_IFREG | 0o644, compression, &data)
                        .unwrap_or_else(|e| panic!("{context}: {e}"));
                    model.insert(name, data);
                }
                2 => {
                    // Several pushes before any answer is read.
                    let count = rng.between(2, 6);
                    for _ in 0..count {
                        let name = name_of(rng.between(0, 4));
                        let size = random_size(&mut rng);
                        let data = random_data(&mut rng, size);
                        let compression = random_compression(&mut rng);
                        pair.push_unacked(
                            &remote(&name),
                            libc::S_IFREG | 0o600,
                            compression,
                            false,
                            &data,
                        )
                        .unwrap();
                        model.insert(name, data);
                    }
                    for _ in 0..count {
                        pair.ack().unwrap_or_else(|e| panic!("{context}: {e}"));
                    }
                }
                3 => {
                    let name = name_of(rng.between(0, 6));
                    let compression = random_compression(&mut rng);
                    let pulled = pair.pull(&remote(&name), compression);
                    match model.get(&name) {
                        Some(data) => assert!(
                            pulled.as_ref() == Ok(data),
                            "{context}: pulled {name} differs"
                        ),
                        None => {
                            assert_eq!(
                                pulled,
                                Err(format!(
                                    "couldn't open '{}': No such file or directory (os error 2)",
                                    dir.path().join(&name).display()
                                )),
                                "{context}"
                            );
                            // A failed pull ends the service.
                            ended = true;
                            break;
                        }
                    }
                }
                4 => {
                    let name = name_of(rng.between(0, 6));
                    let reply = if rng.chance(2) {
                        pair.lstat(&remote(&name))
                    } else {
                        pair.stat(&remote(&name))
                    };
                    match model.get(&name) {
                        Some(data) => {
                            let stat = reply.unwrap_or_else(|e| panic!("{context}: {e:?}"));
                            assert_eq!(stat.size, data.len() as u64, "{context}");
                            assert_eq!(stat.mtime, i64::from(PUSH_MTIME), "{context}");
                        }
                        None if !versions.stat_v2 => {
                            assert_eq!(reply, Err(StatFailure::Unknown), "{context}")
                        }
                        None => assert_eq!(
                            reply,
                            Err(StatFailure::Errno(libc::ENOENT as u32)),
                            "{context}"
                        ),
                    }
                }
                _ => {
                    let mut names: Vec<String> = pair
                        .list(&bytes_of(dir.path()))
                        .into_iter()
                        .map(|dent| String::from_utf8(dent.name).unwrap())
                        .filter(|name| name != "." && name != "..")
                        .collect();
                    names.sort();
                    let expected: Vec<&String> = model.keys().collect();
                    assert_eq!(names.iter().collect::<Vec<_>>(), expected, "{context}");
                }
            }
        }
        let context = format!("seed {seed}, session {session}");
        if ended {
            pair.drive();
            assert_eq!(pair.daemon.end(), Some(Ok(())), "{context}");
        } else if rng.chance(2) {
            assert_eq!(pair.quit(), Ok(()), "{context}");
        } else {
            pair.hang_up();
            assert_eq!(pair.daemon.end(), Some(Ok(())), "{context}");
        }
        for (name, data) in &model {
            let on_disk = fs::read(dir.path().join(name)).unwrap();
            assert!(&on_disk == data, "{context}: {name} on disk differs");
        }
        assert!(temp_files_in(dir.path()).is_empty(), "{context}");
    }
}
