//! Frames of the ADB file sync protocol (the `sync:` service).
//!
//! Every frame starts with a little-endian `u32` id made of four ASCII bytes
//! (`b"STAT"` reads as `STAT` on the wire) followed by a `u32` whose meaning
//! depends on the id: a path length for requests, a payload length for `DATA`
//! and `FAIL`, a timestamp for the `DONE` that ends a push. Replies to `STAT`,
//! `LST2`/`STA2`, `LIST` and `LIS2` are fixed-size packed structs.
//!
//! Nothing here does I/O: parsers take byte slices, encoders return bytes.

use thiserror::Error;

/// Builds a frame id from its four ASCII letters, in wire (little-endian) order.
pub const fn make_id(tag: &[u8; 4]) -> u32 {
    u32::from_le_bytes(*tag)
}

/// `lstat` with the original 16-byte reply (mode, size and mtime as `u32`).
pub const ID_LSTAT_V1: u32 = make_id(b"STAT");
/// `stat` (follows symlinks) with the 72-byte `stat_v2` reply.
pub const ID_STAT_V2: u32 = make_id(b"STA2");
/// `lstat` with the 72-byte `stat_v2` reply.
pub const ID_LSTAT_V2: u32 = make_id(b"LST2");
/// Directory listing answered with `DENT` entries.
pub const ID_LIST_V1: u32 = make_id(b"LIST");
/// Directory listing answered with `DNT2` entries.
pub const ID_LIST_V2: u32 = make_id(b"LIS2");
pub const ID_DENT_V1: u32 = make_id(b"DENT");
pub const ID_DENT_V2: u32 = make_id(b"DNT2");
/// Push; the request's path is `"<path>,<mode>"`.
pub const ID_SEND_V1: u32 = make_id(b"SEND");
/// Push; the request's path is bare and a [`SendV2Setup`] follows.
pub const ID_SEND_V2: u32 = make_id(b"SND2");
/// Pull of an uncompressed file.
pub const ID_RECV_V1: u32 = make_id(b"RECV");
/// Pull; a [`RecvV2Setup`] follows the request.
pub const ID_RECV_V2: u32 = make_id(b"RCV2");
pub const ID_DONE: u32 = make_id(b"DONE");
pub const ID_DATA: u32 = make_id(b"DATA");
pub const ID_OKAY: u32 = make_id(b"OKAY");
pub const ID_FAIL: u32 = make_id(b"FAIL");
pub const ID_QUIT: u32 = make_id(b"QUIT");

/// Largest payload of one `DATA` frame, either direction (`SYNC_DATA_MAX`).
pub const SYNC_DATA_MAX: usize = 64 * 1024;
/// Largest path a request may carry; adbd answers "path too long" beyond it.
pub const SYNC_PATH_MAX: usize = 1024;

/// Size of the `(id, len)` header that starts requests, `DATA`, `DONE`, `OKAY`, `FAIL`.
pub const HEADER_LEN: usize = 8;
/// Size of the `STAT` (v1) reply.
pub const STAT_V1_LEN: usize = 16;
/// Size of the `LST2`/`STA2` reply.
pub const STAT_V2_LEN: usize = 72;
/// Size of a `DENT` entry before its name (also the size of the `DONE` ending a `LIST`).
pub const DENT_V1_LEN: usize = 20;
/// Size of a `DNT2` entry before its name (also the size of the `DONE` ending a `LIS2`).
pub const DENT_V2_LEN: usize = 76;
/// Size of the setup frame that follows an `SND2` request.
pub const SEND_V2_SETUP_LEN: usize = 12;
/// Size of the setup frame that follows an `RCV2` request.
pub const RECV_V2_SETUP_LEN: usize = 8;

/// `SND2`/`RCV2` flag: the `DATA` payloads form one brotli stream.
pub const SYNC_FLAG_BROTLI: u32 = 1;
/// `SND2`/`RCV2` flag: the `DATA` payloads form one LZ4 *frame* (LZ4F).
pub const SYNC_FLAG_LZ4: u32 = 2;
/// `SND2`/`RCV2` flag: the `DATA` payloads form one zstd frame.
pub const SYNC_FLAG_ZSTD: u32 = 4;
/// `SND2` flag: decode and discard the data, touch nothing on the device.
pub const SYNC_FLAG_DRY_RUN: u32 = 0x8000_0000;

/// Why a sync frame could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SyncFrameError {
    #[error("sync frame truncated: need {needed} bytes, got {got}")]
    Truncated { needed: usize, got: usize },
    #[error("path too long: {len} bytes (limit {SYNC_PATH_MAX})")]
    PathTooLong { len: usize },
    #[error("DATA chunk too long: {len} bytes (limit {SYNC_DATA_MAX})")]
    DataTooLong { len: usize },
    #[error("missing ',' before the mode in SEND request")]
    MissingModeSeparator,
    #[error("bad mode {0:?} in SEND request")]
    BadMode(String),
    #[error("multiple compression flags received: {0:#x}")]
    MultipleCompression(u32),
    #[error("unknown flags: {0:#x}")]
    UnknownFlags(u32),
}

/// Renders an id as its four letters when printable, else as hex (for logs and errors).
pub fn id_name(id: u32) -> String {
    let bytes = id.to_le_bytes();
    if bytes.iter().all(|b| b.is_ascii_graphic()) {
        bytes.iter().map(|&b| b as char).collect()
    } else {
        format!("{id:08x}")
    }
}

fn need(buf: &[u8], needed: usize) -> Result<(), SyncFrameError> {
    if buf.len() < needed {
        Err(SyncFrameError::Truncated {
            needed,
            got: buf.len(),
        })
    } else {
        Ok(())
    }
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

/// The 8-byte `(id, len)` header shared by requests and by `DATA`/`DONE`/`OKAY`/`FAIL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncHeader {
    pub id: u32,
    /// Path length for a request, payload length for `DATA`/`FAIL`, mtime for a push's `DONE`.
    pub len: u32,
}

impl SyncHeader {
    pub const fn new(id: u32, len: u32) -> Self {
        Self { id, len }
    }

    pub fn parse(buf: &[u8]) -> Result<Self, SyncFrameError> {
        need(buf, HEADER_LEN)?;
        Ok(Self {
            id: u32_at(buf, 0),
            len: u32_at(buf, 4),
        })
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..4].copy_from_slice(&self.id.to_le_bytes());
        out[4..].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Checks `len` as the path length of a request (at most [`SYNC_PATH_MAX`]).
    pub fn request_path_len(&self) -> Result<usize, SyncFrameError> {
        let len = self.len as usize;
        if len > SYNC_PATH_MAX {
            return Err(SyncFrameError::PathTooLong { len });
        }
        Ok(len)
    }

    /// Checks `len` as the payload length of a `DATA` frame (at most [`SYNC_DATA_MAX`]).
    pub fn data_len(&self) -> Result<usize, SyncFrameError> {
        let len = self.len as usize;
        if len > SYNC_DATA_MAX {
            return Err(SyncFrameError::DataTooLong { len });
        }
        Ok(len)
    }
}

/// A whole request: header plus path bytes (not NUL-terminated on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRequest {
    pub id: u32,
    pub path: Vec<u8>,
}

impl SyncRequest {
    /// Parses a request from the start of `buf`; returns it and the bytes consumed.
    pub fn parse(buf: &[u8]) -> Result<(Self, usize), SyncFrameError> {
        let header = SyncHeader::parse(buf)?;
        let path_len = header.request_path_len()?;
        let total = HEADER_LEN + path_len;
        need(buf, total)?;
        Ok((
            Self {
                id: header.id,
                path: buf[HEADER_LEN..total].to_vec(),
            },
            total,
        ))
    }

    /// Encodes the request; rejects paths over [`SYNC_PATH_MAX`] like the reference client.
    pub fn encode(&self) -> Result<Vec<u8>, SyncFrameError> {
        if self.path.len() > SYNC_PATH_MAX {
            return Err(SyncFrameError::PathTooLong {
                len: self.path.len(),
            });
        }
        let mut out = Vec::with_capacity(HEADER_LEN + self.path.len());
        out.extend_from_slice(&SyncHeader::new(self.id, self.path.len() as u32).encode());
        out.extend_from_slice(&self.path);
        Ok(out)
    }
}

/// Splits a `SEND` (v1) spec `"<path>,<mode>"` at its last comma.
///
/// The mode is parsed like C `strtoul(s, NULL, 0)` as adbd does: clients send
/// decimal (`"33188"` for 0100644), but a `0x` or leading-`0` prefix selects
/// hex or octal. Unlike adbd, a mode strtoul would not read whole (junk), a
/// negative one and one beyond 32 bits are rejected rather than read as 0 or
/// truncated.
pub fn parse_send_v1_spec(spec: &[u8]) -> Result<(&[u8], u32), SyncFrameError> {
    let comma = spec
        .iter()
        .rposition(|&b| b == b',')
        .ok_or(SyncFrameError::MissingModeSeparator)?;
    let mode_text = &spec[comma + 1..];
    let mode = parse_c_unsigned(mode_text)
        .ok_or_else(|| SyncFrameError::BadMode(String::from_utf8_lossy(mode_text).into_owned()))?;
    Ok((&spec[..comma], mode))
}

/// What `strtoul(text, &end, 0)` reads when it reads all of `text`: white space
/// (C's `isspace`), an optional `+`, then `0x` and hex, `0` and octal, or decimal.
fn parse_c_unsigned(text: &[u8]) -> Option<u32> {
    let start = text
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'))
        .unwrap_or(text.len());
    let text = &text[start..];
    let text = text.strip_prefix(b"+").unwrap_or(text);
    let (digits, radix) = match text {
        [b'0', b'x' | b'X', hex @ ..] => (hex, 16),
        [b'0', octal @ ..] if !octal.is_empty() => (octal, 8),
        _ => (text, 10),
    };
    // from_str_radix would take a sign after the prefix too ("0x+5"); strtoul does not.
    if digits.is_empty() || !digits.iter().all(|&b| char::from(b).is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(std::str::from_utf8(digits).ok()?, radix).ok()
}

/// Compression applied to the `DATA` payloads of an `SND2`/`RCV2` transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Brotli,
    /// The LZ4 frame format (LZ4F), not raw blocks.
    Lz4,
    Zstd,
}

impl Compression {
    /// The flag bit that requests this compression.
    pub fn flag(self) -> u32 {
        match self {
            Compression::None => 0,
            Compression::Brotli => SYNC_FLAG_BROTLI,
            Compression::Lz4 => SYNC_FLAG_LZ4,
            Compression::Zstd => SYNC_FLAG_ZSTD,
        }
    }
}

/// Decoded `SND2`/`RCV2` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransferFlags {
    pub compression: Compression,
    pub dry_run: bool,
}

impl TransferFlags {
    /// Decodes `SND2` flags: at most one compression bit, optional dry run, nothing else
    /// (adbd fails the push on anything else).
    pub fn from_send_flags(flags: u32) -> Result<Self, SyncFrameError> {
        let dry_run = flags & SYNC_FLAG_DRY_RUN != 0;
        let compression = decode_compression(flags, flags & !SYNC_FLAG_DRY_RUN)?;
        Ok(Self {
            compression,
            dry_run,
        })
    }

    /// Decodes `RCV2` flags: at most one compression bit; dry run means nothing for a pull.
    pub fn from_recv_flags(flags: u32) -> Result<Self, SyncFrameError> {
        let compression = decode_compression(flags, flags)?;
        Ok(Self {
            compression,
            dry_run: false,
        })
    }

    pub fn to_flags(self) -> u32 {
        self.compression.flag() | if self.dry_run { SYNC_FLAG_DRY_RUN } else { 0 }
    }
}

fn decode_compression(all_flags: u32, flags: u32) -> Result<Compression, SyncFrameError> {
    const ALL: u32 = SYNC_FLAG_BROTLI | SYNC_FLAG_LZ4 | SYNC_FLAG_ZSTD;
    let unknown = flags & !ALL;
    if unknown != 0 {
        return Err(SyncFrameError::UnknownFlags(unknown));
    }
    match flags {
        0 => Ok(Compression::None),
        SYNC_FLAG_BROTLI => Ok(Compression::Brotli),
        SYNC_FLAG_LZ4 => Ok(Compression::Lz4),
        SYNC_FLAG_ZSTD => Ok(Compression::Zstd),
        _ => Err(SyncFrameError::MultipleCompression(all_flags)),
    }
}

/// The frame after an `SND2` request: `(id, mode, flags)`; `id` repeats `SND2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendV2Setup {
    pub id: u32,
    /// Full `st_mode` of the source, file-type bits included (`S_IFLNK` asks for a symlink).
    pub mode: u32,
    pub flags: u32,
}

impl SendV2Setup {
    pub fn parse(buf: &[u8]) -> Result<Self, SyncFrameError> {
        need(buf, SEND_V2_SETUP_LEN)?;
        Ok(Self {
            id: u32_at(buf, 0),
            mode: u32_at(buf, 4),
            flags: u32_at(buf, 8),
        })
    }

    pub fn encode(&self) -> [u8; SEND_V2_SETUP_LEN] {
        let mut out = [0u8; SEND_V2_SETUP_LEN];
        out[0..4].copy_from_slice(&self.id.to_le_bytes());
        out[4..8].copy_from_slice(&self.mode.to_le_bytes());
        out[8..12].copy_from_slice(&self.flags.to_le_bytes());
        out
    }
}

/// The frame after an `RCV2` request: `(id, flags)`; `id` repeats `RCV2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvV2Setup {
    pub id: u32,
    pub flags: u32,
}

impl RecvV2Setup {
    pub fn parse(buf: &[u8]) -> Result<Self, SyncFrameError> {
        need(buf, RECV_V2_SETUP_LEN)?;
        Ok(Self {
            id: u32_at(buf, 0),
            flags: u32_at(buf, 4),
        })
    }

    pub fn encode(&self) -> [u8; RECV_V2_SETUP_LEN] {
        SyncHeader::new(self.id, self.flags).encode()
    }
}

/// The `STAT` (v1) reply. adbd sends all zeroes (but the id) when `lstat` fails,
/// which clients read as "does not exist".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatV1 {
    pub mode: u32,
    pub size: u32,
    pub mtime: u32,
}

impl StatV1 {
    pub fn encode(&self) -> [u8; STAT_V1_LEN] {
        let mut out = [0u8; STAT_V1_LEN];
        out[0..4].copy_from_slice(&ID_LSTAT_V1.to_le_bytes());
        out[4..8].copy_from_slice(&self.mode.to_le_bytes());
        out[8..12].copy_from_slice(&self.size.to_le_bytes());
        out[12..16].copy_from_slice(&self.mtime.to_le_bytes());
        out
    }

    /// Parses a reply (the id must be `STAT`; anything else is the caller's protocol error).
    pub fn parse(buf: &[u8]) -> Result<(u32, Self), SyncFrameError> {
        need(buf, STAT_V1_LEN)?;
        Ok((
            u32_at(buf, 0),
            Self {
                mode: u32_at(buf, 4),
                size: u32_at(buf, 8),
                mtime: u32_at(buf, 12),
            },
        ))
    }
}

/// The metadata carried by `LST2`/`STA2` replies and `DNT2` entries.
///
/// Packed layout (72 bytes): id u32, error u32, dev u64, ino u64, mode u32,
/// nlink u32, uid u32, gid u32, size u64, atime i64, mtime i64, ctime i64.
/// On failure only `error` (an errno in Linux numbering) is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatV2 {
    pub error: u32,
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
}

impl StatV2 {
    /// Only the error set, as adbd replies when `stat`/`lstat` fails.
    pub fn error(error: u32) -> Self {
        Self {
            error,
            ..Self::default()
        }
    }

    fn write_fields(&self, out: &mut [u8]) {
        out[4..8].copy_from_slice(&self.error.to_le_bytes());
        out[8..16].copy_from_slice(&self.dev.to_le_bytes());
        out[16..24].copy_from_slice(&self.ino.to_le_bytes());
        out[24..28].copy_from_slice(&self.mode.to_le_bytes());
        out[28..32].copy_from_slice(&self.nlink.to_le_bytes());
        out[32..36].copy_from_slice(&self.uid.to_le_bytes());
        out[36..40].copy_from_slice(&self.gid.to_le_bytes());
        out[40..48].copy_from_slice(&self.size.to_le_bytes());
        out[48..56].copy_from_slice(&self.atime.to_le_bytes());
        out[56..64].copy_from_slice(&self.mtime.to_le_bytes());
        out[64..72].copy_from_slice(&self.ctime.to_le_bytes());
    }

    fn read_fields(buf: &[u8]) -> Self {
        Self {
            error: u32_at(buf, 4),
            dev: u64_at(buf, 8),
            ino: u64_at(buf, 16),
            mode: u32_at(buf, 24),
            nlink: u32_at(buf, 28),
            uid: u32_at(buf, 32),
            gid: u32_at(buf, 36),
            size: u64_at(buf, 40),
            atime: u64_at(buf, 48) as i64,
            mtime: u64_at(buf, 56) as i64,
            ctime: u64_at(buf, 64) as i64,
        }
    }

    /// Encodes the reply; `id` echoes the request (`LST2` or `STA2`).
    pub fn encode(&self, id: u32) -> [u8; STAT_V2_LEN] {
        let mut out = [0u8; STAT_V2_LEN];
        out[0..4].copy_from_slice(&id.to_le_bytes());
        self.write_fields(&mut out);
        out
    }

    /// Parses a reply, returning its id alongside.
    pub fn parse(buf: &[u8]) -> Result<(u32, Self), SyncFrameError> {
        need(buf, STAT_V2_LEN)?;
        Ok((u32_at(buf, 0), Self::read_fields(buf)))
    }
}

/// Appends a `DENT` entry (mode, size, mtime as `u32`, then the name) to `out`.
pub fn encode_dent_v1(out: &mut Vec<u8>, mode: u32, size: u32, mtime: u32, name: &[u8]) {
    out.extend_from_slice(&ID_DENT_V1.to_le_bytes());
    out.extend_from_slice(&mode.to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&mtime.to_le_bytes());
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(name);
}

/// Appends a `DNT2` entry (the `stat_v2` fields, `namelen`, then the name) to `out`.
pub fn encode_dent_v2(out: &mut Vec<u8>, stat: &StatV2, name: &[u8]) {
    let mut fixed = [0u8; DENT_V2_LEN];
    fixed[0..4].copy_from_slice(&ID_DENT_V2.to_le_bytes());
    stat.write_fields(&mut fixed[..STAT_V2_LEN]);
    fixed[72..76].copy_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(&fixed);
    out.extend_from_slice(name);
}

/// The `DONE` that ends a `LIST`: a whole zeroed `DENT` struct with the id `DONE`.
pub fn encode_dent_v1_done() -> [u8; DENT_V1_LEN] {
    let mut out = [0u8; DENT_V1_LEN];
    out[0..4].copy_from_slice(&ID_DONE.to_le_bytes());
    out
}

/// The `DONE` that ends a `LIS2`: a whole zeroed `DNT2` struct with the id `DONE`.
pub fn encode_dent_v2_done() -> [u8; DENT_V2_LEN] {
    let mut out = [0u8; DENT_V2_LEN];
    out[0..4].copy_from_slice(&ID_DONE.to_le_bytes());
    out
}

/// One parsed `DENT`/`DNT2` entry (or the `DONE` terminator, with `id == ID_DONE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dent {
    pub id: u32,
    pub stat: StatV2,
    pub name: Vec<u8>,
}

/// Parses a `DENT` (v1) entry or its `DONE`; returns it and the bytes consumed.
/// Only mode, size and mtime are meaningful in `stat`.
pub fn parse_dent_v1(buf: &[u8]) -> Result<(Dent, usize), SyncFrameError> {
    need(buf, DENT_V1_LEN)?;
    let name_len = u32_at(buf, 16) as usize;
    let total = DENT_V1_LEN + name_len;
    need(buf, total)?;
    let stat = StatV2 {
        mode: u32_at(buf, 4),
        size: u32_at(buf, 8) as u64,
        mtime: u32_at(buf, 12) as i64,
        ..StatV2::default()
    };
    Ok((
        Dent {
            id: u32_at(buf, 0),
            stat,
            name: buf[DENT_V1_LEN..total].to_vec(),
        },
        total,
    ))
}

/// Parses a `DNT2` entry or its `DONE`; returns it and the bytes consumed.
pub fn parse_dent_v2(buf: &[u8]) -> Result<(Dent, usize), SyncFrameError> {
    need(buf, DENT_V2_LEN)?;
    let name_len = u32_at(buf, 72) as usize;
    let total = DENT_V2_LEN + name_len;
    need(buf, total)?;
    Ok((
        Dent {
            id: u32_at(buf, 0),
            stat: StatV2::read_fields(buf),
            name: buf[DENT_V2_LEN..total].to_vec(),
        },
        total,
    ))
}

/// A `DATA` header for a payload of `len` bytes (the caller appends the payload).
pub fn encode_data_header(len: usize) -> [u8; HEADER_LEN] {
    debug_assert!(len <= SYNC_DATA_MAX);
    SyncHeader::new(ID_DATA, len as u32).encode()
}

/// A whole `DATA` frame: header and payload in one buffer.
pub fn encode_data(payload: &[u8]) -> Result<Vec<u8>, SyncFrameError> {
    if payload.len() > SYNC_DATA_MAX {
        return Err(SyncFrameError::DataTooLong { len: payload.len() });
    }
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&encode_data_header(payload.len()));
    out.extend_from_slice(payload);
    Ok(out)
}

/// `DONE` carrying `value`: the mtime when a push ends, 0 when a pull ends.
pub fn encode_done(value: u32) -> [u8; HEADER_LEN] {
    SyncHeader::new(ID_DONE, value).encode()
}

/// `OKAY` acknowledging a finished push.
pub fn encode_okay() -> [u8; HEADER_LEN] {
    SyncHeader::new(ID_OKAY, 0).encode()
}

/// `FAIL` with a human-readable reason; clients print it after "remote ".
pub fn encode_fail(message: &str) -> Vec<u8> {
    // Clients refuse reasons longer than SYNC_DATA_MAX; cut on a char boundary.
    let mut end = message.len().min(SYNC_DATA_MAX);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let reason = &message.as_bytes()[..end];
    let mut out = Vec::with_capacity(HEADER_LEN + reason.len());
    out.extend_from_slice(&SyncHeader::new(ID_FAIL, reason.len() as u32).encode());
    out.extend_from_slice(reason);
    out
}

/// Errno values the protocol defines (Linux numbering); adbd maps any other to EIO.
const WIRE_ERRNOS: [u32; 20] = [
    1,  // EPERM
    2,  // ENOENT
    4,  // EINTR
    5,  // EIO
    12, // ENOMEM
    13, // EACCES
    14, // EFAULT
    17, // EEXIST
    20, // ENOTDIR
    21, // EISDIR
    22, // EINVAL
    23, // ENFILE
    24, // EMFILE
    26, // ETXTBSY
    27, // EFBIG
    28, // ENOSPC
    30, // EROFS
    36, // ENAMETOOLONG
    40, // ELOOP
    75, // EOVERFLOW
];
const WIRE_EIO: u32 = 5;

/// Maps a Linux errno to the `stat_v2.error` wire value: the protocol's errno set uses
/// Linux numbers, and anything outside it becomes EIO, as adbd's `errno_to_wire` does.
pub fn errno_to_wire(linux_errno: i32) -> u32 {
    match u32::try_from(linux_errno) {
        Ok(e) if WIRE_ERRNOS.contains(&e) => e,
        _ => WIRE_EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_ascii_little_endian() {
        assert_eq!(ID_LSTAT_V1.to_le_bytes(), *b"STAT");
        assert_eq!(ID_SEND_V2, 0x3244_4e53);
        assert_eq!(id_name(ID_RECV_V2), "RCV2");
        assert_eq!(id_name(0x0000_0001), "00000001");
    }

    #[test]
    fn header_round_trip_and_short_input() {
        let header = SyncHeader::new(ID_DATA, 1234);
        assert_eq!(SyncHeader::parse(&header.encode()), Ok(header));
        assert_eq!(
            SyncHeader::parse(&[1, 2, 3]),
            Err(SyncFrameError::Truncated { needed: 8, got: 3 })
        );
    }

    #[test]
    fn request_round_trip() {
        let request = SyncRequest {
            id: ID_LSTAT_V2,
            path: b"/data/local/tmp".to_vec(),
        };
        let mut bytes = request.encode().unwrap();
        bytes.extend_from_slice(b"trailing");
        let (parsed, used) = SyncRequest::parse(&bytes).unwrap();
        assert_eq!(parsed, request);
        assert_eq!(used, 8 + 15);
    }

    #[test]
    fn request_rejects_long_path_and_short_input() {
        let long = SyncRequest {
            id: ID_LIST_V1,
            path: vec![b'a'; SYNC_PATH_MAX + 1],
        };
        assert_eq!(
            long.encode(),
            Err(SyncFrameError::PathTooLong { len: 1025 })
        );
        let max = SyncRequest {
            id: ID_LIST_V1,
            path: vec![b'a'; SYNC_PATH_MAX],
        };
        assert!(max.encode().is_ok());

        let header = SyncHeader::new(ID_LIST_V1, 1025).encode();
        assert_eq!(
            SyncRequest::parse(&header),
            Err(SyncFrameError::PathTooLong { len: 1025 })
        );

        let mut short = SyncHeader::new(ID_LIST_V1, 10).encode().to_vec();
        short.extend_from_slice(b"/abc");
        assert_eq!(
            SyncRequest::parse(&short),
            Err(SyncFrameError::Truncated {
                needed: 18,
                got: 12
            })
        );
    }

    #[test]
    fn data_length_limit() {
        assert_eq!(SyncHeader::new(ID_DATA, 65536).data_len(), Ok(65536));
        assert_eq!(
            SyncHeader::new(ID_DATA, 65537).data_len(),
            Err(SyncFrameError::DataTooLong { len: 65537 })
        );
        assert!(encode_data(&vec![0; SYNC_DATA_MAX + 1]).is_err());
        let frame = encode_data(b"abc").unwrap();
        assert_eq!(SyncHeader::parse(&frame), Ok(SyncHeader::new(ID_DATA, 3)));
        assert_eq!(&frame[8..], b"abc");
    }

    #[test]
    fn send_v1_spec() {
        // Clients format "%s,%d" with the full st_mode: 0100644 == 33188.
        assert_eq!(
            parse_send_v1_spec(b"/sdcard/a,b,33188"),
            Ok((&b"/sdcard/a,b"[..], 0o100644))
        );
        assert_eq!(parse_send_v1_spec(b"/x,0755"), Ok((&b"/x"[..], 0o755)));
        assert_eq!(parse_send_v1_spec(b"/x,0x1ed"), Ok((&b"/x"[..], 0o755)));
        assert_eq!(parse_send_v1_spec(b"/x,0"), Ok((&b"/x"[..], 0)));
        assert_eq!(
            parse_send_v1_spec(b"/x"),
            Err(SyncFrameError::MissingModeSeparator)
        );
        assert_eq!(
            parse_send_v1_spec(b"/x,rw"),
            Err(SyncFrameError::BadMode("rw".into()))
        );
        assert_eq!(
            parse_send_v1_spec(b"/x,"),
            Err(SyncFrameError::BadMode(String::new()))
        );
    }

    #[test]
    fn send_v1_mode_reads_as_strtoul_does() {
        // Found by fuzz/fuzz_targets/sync_request.rs: a sign after the prefix
        // was taken ("0+55" read as octal 55), where strtoul stops at the '+'.
        for junk in [
            &b"/x,0+55"[..],
            b"/x,0x+5",
            b"/x,0x",
            b"/x,08",
            b"/x,-1",
            b"/x,++5",
            b"/x,4294967296",
            "/x,\u{a0}5".as_bytes(),
        ] {
            assert!(
                matches!(parse_send_v1_spec(junk), Err(SyncFrameError::BadMode(_))),
                "{:?}",
                String::from_utf8_lossy(junk)
            );
        }
        assert_eq!(parse_send_v1_spec(b"/x,+0x1ed"), Ok((&b"/x"[..], 0o755)));
        assert_eq!(parse_send_v1_spec(b"/x,+0755"), Ok((&b"/x"[..], 0o755)));
        assert_eq!(
            parse_send_v1_spec(b"/x,\x0b\t 33188"),
            Ok((&b"/x"[..], 0o100644))
        );
        assert_eq!(
            parse_send_v1_spec(b"/x,4294967295"),
            Ok((&b"/x"[..], u32::MAX))
        );
    }

    #[test]
    fn transfer_flags() {
        assert_eq!(
            TransferFlags::from_send_flags(SYNC_FLAG_LZ4 | SYNC_FLAG_DRY_RUN),
            Ok(TransferFlags {
                compression: Compression::Lz4,
                dry_run: true
            })
        );
        assert_eq!(
            TransferFlags::from_send_flags(SYNC_FLAG_BROTLI | SYNC_FLAG_ZSTD),
            Err(SyncFrameError::MultipleCompression(5))
        );
        assert_eq!(
            TransferFlags::from_send_flags(0x10),
            Err(SyncFrameError::UnknownFlags(0x10))
        );
        assert_eq!(
            TransferFlags::from_recv_flags(SYNC_FLAG_DRY_RUN),
            Err(SyncFrameError::UnknownFlags(SYNC_FLAG_DRY_RUN))
        );
        let flags = TransferFlags {
            compression: Compression::Zstd,
            dry_run: true,
        };
        assert_eq!(TransferFlags::from_send_flags(flags.to_flags()), Ok(flags));
    }

    #[test]
    fn setup_frames_round_trip() {
        let send = SendV2Setup {
            id: ID_SEND_V2,
            mode: 0o100751,
            flags: SYNC_FLAG_BROTLI,
        };
        assert_eq!(SendV2Setup::parse(&send.encode()), Ok(send));
        assert!(SendV2Setup::parse(&send.encode()[..11]).is_err());
        let recv = RecvV2Setup {
            id: ID_RECV_V2,
            flags: SYNC_FLAG_ZSTD,
        };
        assert_eq!(RecvV2Setup::parse(&recv.encode()), Ok(recv));
        assert!(RecvV2Setup::parse(&recv.encode()[..7]).is_err());
    }

    #[test]
    fn stat_v1_layout() {
        let stat = StatV1 {
            mode: 0o100644,
            size: 5,
            mtime: 1_600_000_000,
        };
        let bytes = stat.encode();
        assert_eq!(&bytes[..4], b"STAT");
        assert_eq!(StatV1::parse(&bytes), Ok((ID_LSTAT_V1, stat)));
        assert!(StatV1::parse(&bytes[..15]).is_err());
    }

    #[test]
    fn stat_v2_layout() {
        let stat = StatV2 {
            error: 0,
            dev: 0x0102_0304_0506_0708,
            ino: 42,
            mode: 0o120777,
            nlink: 1,
            uid: 1000,
            gid: 2000,
            size: 1 << 40,
            atime: -1,
            mtime: 1_700_000_000,
            ctime: 1_700_000_001,
        };
        let bytes = stat.encode(ID_LSTAT_V2);
        assert_eq!(bytes.len(), 72);
        assert_eq!(&bytes[0..4], b"LST2");
        // Spot-check offsets of the packed struct.
        assert_eq!(&bytes[8..16], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&bytes[24..28], &0o120777u32.to_le_bytes());
        assert_eq!(&bytes[40..48], &(1u64 << 40).to_le_bytes());
        assert_eq!(&bytes[64..72], &1_700_000_001i64.to_le_bytes());
        assert_eq!(StatV2::parse(&bytes), Ok((ID_LSTAT_V2, stat)));
        assert!(StatV2::parse(&bytes[..71]).is_err());

        let missing = StatV2::error(2).encode(ID_STAT_V2);
        assert_eq!(&missing[0..8], b"STA2\x02\0\0\0");
        assert!(missing[8..].iter().all(|&b| b == 0));
    }

    #[test]
    fn dents_round_trip_and_done_sizes() {
        let mut out = Vec::new();
        encode_dent_v1(&mut out, 0o40755, 4096, 7, b"dir");
        let (dent, used) = parse_dent_v1(&out).unwrap();
        assert_eq!(used, 23);
        assert_eq!(dent.id, ID_DENT_V1);
        assert_eq!(
            (dent.stat.mode, dent.stat.size, dent.stat.mtime),
            (0o40755, 4096, 7)
        );
        assert_eq!(dent.name, b"dir");
        assert!(parse_dent_v1(&out[..22]).is_err());

        let stat = StatV2 {
            ino: 9,
            mode: 0o100600,
            size: 3,
            nlink: 1,
            ..StatV2::default()
        };
        let mut out = Vec::new();
        encode_dent_v2(&mut out, &stat, b"file");
        assert_eq!(out.len(), 80);
        let (dent, used) = parse_dent_v2(&out).unwrap();
        assert_eq!(used, 80);
        assert_eq!(
            dent,
            Dent {
                id: ID_DENT_V2,
                stat,
                name: b"file".to_vec()
            }
        );
        assert!(parse_dent_v2(&out[..79]).is_err());

        let done1 = encode_dent_v1_done();
        assert_eq!(done1.len(), 20);
        assert_eq!(parse_dent_v1(&done1).unwrap().0.id, ID_DONE);
        let done2 = encode_dent_v2_done();
        assert_eq!(done2.len(), 76);
        assert!(done2[4..].iter().all(|&b| b == 0));
        assert_eq!(parse_dent_v2(&done2).unwrap().0.id, ID_DONE);
    }

    #[test]
    fn status_frames() {
        assert_eq!(&encode_okay(), b"OKAY\0\0\0\0");
        assert_eq!(
            SyncHeader::parse(&encode_done(77)),
            Ok(SyncHeader::new(ID_DONE, 77))
        );
        let fail = encode_fail("couldn't create file '/x': Read-only file system (os error 30)");
        let header = SyncHeader::parse(&fail).unwrap();
        assert_eq!(header.id, ID_FAIL);
        assert_eq!(header.len as usize, fail.len() - 8);
        let huge = "é".repeat(SYNC_DATA_MAX);
        let fail = encode_fail(&huge);
        assert!(fail.len() - 8 <= SYNC_DATA_MAX);
        assert!(std::str::from_utf8(&fail[8..]).is_ok());
    }

    #[test]
    fn errno_mapping() {
        assert_eq!(errno_to_wire(2), 2);
        assert_eq!(errno_to_wire(30), 30);
        assert_eq!(errno_to_wire(95), 5); // EOPNOTSUPP is not on the wire list.
        assert_eq!(errno_to_wire(-1), 5);
    }
}
