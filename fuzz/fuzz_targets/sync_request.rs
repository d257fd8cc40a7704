//! The sync protocol's frames.
//!
//! The input is read twice: as the host's side of a `sync:` stream, walked the
//! way oxadbd's sync service reads it (request, SEND spec or SND2/RCV2 setup,
//! then DATA.. DONE), and as the device's replies a host parses (STAT, STA2,
//! and a listing of DENT or DNT2 entries).
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxadb_wire::sync::*;

fuzz_target!(|data: &[u8]| {
    walk_host_stream(data);
    check_replies(data);
});

fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().unwrap())
}

fn walk_host_stream(mut stream: &[u8]) {
    loop {
        let (request, used) = match SyncRequest::parse(stream) {
            Ok(parsed) => parsed,
            Err(error) => {
                check_request_error(stream, error);
                return;
            }
        };
        check_header(stream);
        assert_eq!(used, HEADER_LEN + request.path.len());
        assert_eq!(request.encode().unwrap(), &stream[..used]);
        stream = &stream[used..];

        match request.id {
            ID_SEND_V1 => {
                // oxadbd reads the spec as a C string.
                let spec = match request.path.iter().position(|&b| b == 0) {
                    Some(nul) => &request.path[..nul],
                    None => &request.path[..],
                };
                if check_send_v1_spec(spec).is_none() {
                    return;
                }
                stream = walk_push(stream);
            }
            ID_SEND_V2 => {
                let Ok(setup) = SendV2Setup::parse(stream) else {
                    assert!(stream.len() < SEND_V2_SETUP_LEN);
                    return;
                };
                assert_eq!(setup.encode(), stream[..SEND_V2_SETUP_LEN]);
                stream = &stream[SEND_V2_SETUP_LEN..];
                if check_send_flags(setup.flags).is_none() {
                    return;
                }
                stream = walk_push(stream);
            }
            ID_RECV_V2 => {
                let Ok(setup) = RecvV2Setup::parse(stream) else {
                    assert!(stream.len() < RECV_V2_SETUP_LEN);
                    return;
                };
                assert_eq!(setup.encode(), stream[..RECV_V2_SETUP_LEN]);
                stream = &stream[RECV_V2_SETUP_LEN..];
                if check_recv_flags(setup.flags).is_none() {
                    return;
                }
            }
            ID_LSTAT_V1 | ID_LSTAT_V2 | ID_STAT_V2 | ID_LIST_V1 | ID_LIST_V2 | ID_RECV_V1 => {}
            other => {
                // QUIT, or an unknown request that ends the service; its name
                // goes into a log line either way.
                let name = id_name(other);
                assert!(name.len() == 4 || name.len() == 8, "{name:?}");
                return;
            }
        }
    }
}

/// The DATA frames of a push, up to its DONE; returns what follows it.
fn walk_push(mut stream: &[u8]) -> &[u8] {
    loop {
        let Ok(header) = SyncHeader::parse(stream) else {
            return &[];
        };
        check_header(stream);
        stream = &stream[HEADER_LEN..];
        match header.id {
            ID_DATA => {
                let Ok(len) = header.data_len() else {
                    return &[];
                };
                if stream.len() < len {
                    return &[];
                }
                let frame = encode_data(&stream[..len]).unwrap();
                assert_eq!(SyncHeader::parse(&frame), Ok(header));
                stream = &stream[len..];
            }
            ID_DONE => {
                assert_eq!(encode_done(header.len), header.encode());
                return stream;
            }
            _ => return &[],
        }
    }
}

/// An `(id, len)` header at the start of `buf`, with its two length checks.
fn check_header(buf: &[u8]) {
    let header = SyncHeader::parse(buf).unwrap();
    assert_eq!(header.encode(), buf[..HEADER_LEN]);
    assert_eq!((header.id, header.len), (u32_at(buf, 0), u32_at(buf, 4)));
    let len = header.len as usize;
    match header.request_path_len() {
        Ok(n) => assert!(n == len && n <= SYNC_PATH_MAX),
        Err(e) => assert!(len > SYNC_PATH_MAX && e == SyncFrameError::PathTooLong { len }),
    }
    match header.data_len() {
        Ok(n) => assert!(n == len && n <= SYNC_DATA_MAX),
        Err(e) => assert!(len > SYNC_DATA_MAX && e == SyncFrameError::DataTooLong { len }),
    }
}

fn check_request_error(buf: &[u8], error: SyncFrameError) {
    if buf.len() < HEADER_LEN {
        assert_eq!(
            error,
            SyncFrameError::Truncated {
                needed: HEADER_LEN,
                got: buf.len()
            }
        );
        return;
    }
    let len = u32_at(buf, 4) as usize;
    if len > SYNC_PATH_MAX {
        assert_eq!(error, SyncFrameError::PathTooLong { len });
    } else {
        assert_eq!(
            error,
            SyncFrameError::Truncated {
                needed: HEADER_LEN + len,
                got: buf.len()
            }
        );
    }
}

/// `SEND`'s `"<path>,<mode>"`: split at the last comma, the mode read as C's
/// `strtoul(mode, &end, 0)` reads it, refusing what strtoul would not read
/// whole, negative modes and modes beyond 32 bits.
fn check_send_v1_spec(spec: &[u8]) -> Option<u32> {
    let parsed = parse_send_v1_spec(spec);
    let Some(comma) = spec.iter().rposition(|&b| b == b',') else {
        assert_eq!(parsed, Err(SyncFrameError::MissingModeSeparator));
        return None;
    };
    let mode_text = &spec[comma + 1..];
    match (strtoul(mode_text), parsed) {
        (Some(want), Ok((path, mode))) => {
            assert_eq!(mode, want, "mode {:?}", String::from_utf8_lossy(mode_text));
            assert_eq!(path, &spec[..comma]);
            // The spec a client would send for it (`"%s,%d"`) gives the same.
            let mut sent = path.to_vec();
            sent.extend_from_slice(format!(",{mode}").as_bytes());
            assert_eq!(parse_send_v1_spec(&sent), Ok((path, mode)));
            Some(mode)
        }
        (None, Err(SyncFrameError::BadMode(_))) => None,
        (want, got) => panic!(
            "mode {:?}: strtoul reads {want:?}, parse_send_v1_spec gives {got:?}",
            String::from_utf8_lossy(mode_text)
        ),
    }
}

/// C's `strtoul(text, &end, 0)` in the C locale, when it reads all of `text`
/// as a non-negative number that fits a u32.
fn strtoul(text: &[u8]) -> Option<u32> {
    let is_space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let mut rest = &text[text.iter().take_while(|b| is_space(b)).count()..];
    match rest.first() {
        Some(b'+') => rest = &rest[1..],
        Some(b'-') => return None,
        _ => {}
    }
    let radix = match rest {
        // "0x" counts as a prefix only before a hex digit; otherwise the 0 is
        // read alone and the x is left over.
        [b'0', b'x' | b'X', d, ..] if d.is_ascii_hexdigit() => {
            rest = &rest[2..];
            16
        }
        [b'0', ..] => 8,
        _ => 10,
    };
    if rest.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for &b in rest {
        let digit = (b as char).to_digit(radix)?;
        value = value * u64::from(radix) + u64::from(digit);
        if value > u64::from(u32::MAX) {
            return None;
        }
    }
    Some(value as u32)
}

const COMPRESSION_BITS: u32 = SYNC_FLAG_BROTLI | SYNC_FLAG_LZ4 | SYNC_FLAG_ZSTD;

/// The compression a flag word asks for, or the error it deserves, given the
/// bits the request allows besides the compression ones.
fn expected_compression(flags: u32, extra_allowed: u32) -> Result<Compression, SyncFrameError> {
    let unknown = flags & !(COMPRESSION_BITS | extra_allowed);
    if unknown != 0 {
        return Err(SyncFrameError::UnknownFlags(unknown));
    }
    Ok(match flags & COMPRESSION_BITS {
        0 => Compression::None,
        SYNC_FLAG_BROTLI => Compression::Brotli,
        SYNC_FLAG_LZ4 => Compression::Lz4,
        SYNC_FLAG_ZSTD => Compression::Zstd,
        _ => return Err(SyncFrameError::MultipleCompression(flags)),
    })
}

fn check_send_flags(flags: u32) -> Option<TransferFlags> {
    let got = TransferFlags::from_send_flags(flags);
    let want = expected_compression(flags, SYNC_FLAG_DRY_RUN).map(|compression| TransferFlags {
        compression,
        dry_run: flags & SYNC_FLAG_DRY_RUN != 0,
    });
    assert_eq!(got, want, "SND2 flags {flags:#x}");
    // The recv rules are the send rules without dry run.
    check_recv_flags(flags);
    let decoded = got.ok()?;
    assert_eq!(decoded.to_flags(), flags);
    Some(decoded)
}

fn check_recv_flags(flags: u32) -> Option<TransferFlags> {
    let got = TransferFlags::from_recv_flags(flags);
    let want = expected_compression(flags, 0).map(|compression| TransferFlags {
        compression,
        dry_run: false,
    });
    assert_eq!(got, want, "RCV2 flags {flags:#x}");
    let decoded = got.ok()?;
    assert_eq!(decoded.to_flags(), flags);
    Some(decoded)
}

/// The device's replies as a host reads them.
fn check_replies(data: &[u8]) {
    match StatV1::parse(data) {
        Ok((id, stat)) => {
            let encoded = stat.encode();
            assert_eq!(encoded[4..], data[4..STAT_V1_LEN]);
            assert!(id != ID_LSTAT_V1 || encoded == data[..STAT_V1_LEN]);
        }
        Err(e) => assert!(
            data.len() < STAT_V1_LEN
                && e == SyncFrameError::Truncated {
                    needed: STAT_V1_LEN,
                    got: data.len()
                }
        ),
    }
    match StatV2::parse(data) {
        Ok((id, stat)) => assert_eq!(stat.encode(id), data[..STAT_V2_LEN]),
        Err(_) => assert!(data.len() < STAT_V2_LEN),
    }
    if data.len() >= 4 {
        // A few bytes of garbage in front of a listing must not upset the
        // parser either; start at every offset of the first word.
        for skip in 0..4 {
            walk_listing(&data[skip..], false);
            walk_listing(&data[skip..], true);
        }
    }
}

/// A `LIST` (`DENT`..`DONE`) or `LIS2` (`DNT2`..`DONE`) reply.
fn walk_listing(mut buf: &[u8], v2: bool) {
    let fixed = if v2 { DENT_V2_LEN } else { DENT_V1_LEN };
    loop {
        let parsed = if v2 {
            parse_dent_v2(buf)
        } else {
            parse_dent_v1(buf)
        };
        let (dent, used) = match parsed {
            Ok(parsed) => parsed,
            Err(SyncFrameError::Truncated { needed, got }) => {
                assert!(got == buf.len() && needed > got);
                return;
            }
            Err(e) => panic!("a listing can only be short, got {e}"),
        };
        assert_eq!(used, fixed + dent.name.len());
        assert_eq!(u32_at(buf, fixed - 4) as usize, dent.name.len());
        let mut encoded = Vec::new();
        if v2 {
            encode_dent_v2(&mut encoded, &dent.stat, &dent.name);
        } else {
            // v1 has only mode, size and mtime, all 32-bit.
            let StatV2 {
                mode, size, mtime, ..
            } = dent.stat;
            assert_eq!(
                dent.stat,
                StatV2 {
                    mode,
                    size,
                    mtime,
                    ..StatV2::default()
                }
            );
            encode_dent_v1(&mut encoded, mode, size as u32, mtime as u32, &dent.name);
        }
        assert_eq!(encoded[4..], buf[4..used]);
        buf = &buf[used..];
        if dent.id == ID_DONE {
            return;
        }
    }
}
