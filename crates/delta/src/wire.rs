//! The messages of an `oxadb-delta:` stream, framed the same way in both
//! directions: a 4-byte little-endian body length, a tag byte, the body
//! (docs/delta.md, "Protocol"). The host opens the stream with `Begin`
//! and reads its image while the device answers with `Index` and the old
//! image's region digests (`Regions`); the host asks (`Want`) for the
//! block digests of the regions that differ from its own, the device sends
//! them (`Digests`), and the host sends operations; `End` carries the new
//! image's digest, and the device answers `Done` with the digest of what
//! it built, or `Fail`.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::digest::{BlockDigest, DIGEST_LEN};
use crate::plan::{Op, MAX_REPLACE_BYTES};
use crate::BlockSize;

/// Largest body a peer may send: a `Replace` of [`MAX_REPLACE_BYTES`] with
/// its fields. Anything larger is refused before it is buffered.
pub const MAX_BODY: usize = MAX_REPLACE_BYTES + 64;

/// Digests per `Digests` or `Regions` message: 64 KiB of them.
pub const DIGESTS_PER_MESSAGE: usize = 4096;

/// Runs per `Want` message: 64 KiB of them.
pub const RUNS_PER_WANT: usize = 4096;

/// What the device's destination was when the delta began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Nothing there: every block is new (a plain push would do).
    Absent,
    /// A regular file: the new one is built beside it and renamed over it.
    File,
    /// A block device: written in place.
    BlockDevice,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Host: the destination, the block size and the new image's length.
    Begin {
        block_size: BlockSize,
        new_len: u64,
        /// The new file's permission bits (a regular file's, as `SEND`'s mode).
        mode: u32,
        path: String,
    },
    /// Device: what the destination is and how long.
    Index { target: Target, old_len: u64 },
    /// Device: the digests of old regions `start..start + digests.len()`
    /// (each [`crate::REGION_BLOCKS`] blocks).
    Regions {
        start: u64,
        digests: Vec<BlockDigest>,
    },
    /// Host: send the block digests of these runs of old regions (first
    /// region, count); `last` says no more wants follow.
    Want { runs: Vec<(u64, u64)>, last: bool },
    /// Device: the digests of old blocks `start..start + digests.len()`,
    /// in the order the host wanted them.
    Digests {
        start: u64,
        digests: Vec<BlockDigest>,
    },
    /// Host: an operation; a `Replace` is sent zstd-compressed.
    Op(Op),
    /// Host: no more operations; the new image's digest.
    End { digest: [u8; 32] },
    /// Device: the image is in place, and this is its digest.
    Done { digest: [u8; 32] },
    /// Either side: the delta failed, and why.
    Fail { message: String },
}

impl Message {
    /// The message's name on the wire, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Begin { .. } => "BEGIN",
            Message::Index { .. } => "INDEX",
            Message::Regions { .. } => "REGIONS",
            Message::Want { .. } => "WANT",
            Message::Digests { .. } => "DIGESTS",
            Message::Op(Op::Copy { .. }) => "COPY",
            Message::Op(Op::Zero { .. }) => "ZERO",
            Message::Op(Op::Replace { .. }) => "REPLACE",
            Message::Op(Op::Xor { .. }) => "XOR",
            Message::End { .. } => "END",
            Message::Done { .. } => "DONE",
            Message::Fail { .. } => "FAIL",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("a delta message of {0} bytes is larger than {MAX_BODY}")]
    TooLarge(usize),
    #[error("unknown delta message tag {0:#04x}")]
    UnknownTag(u8),
    #[error("a delta {what} message is malformed: {why}")]
    Malformed { what: &'static str, why: String },
}

mod tag {
    pub const BEGIN: u8 = b'B';
    pub const INDEX: u8 = b'I';
    pub const REGIONS: u8 = b'S';
    pub const WANT: u8 = b'W';
    pub const DIGESTS: u8 = b'D';
    pub const COPY: u8 = b'C';
    pub const ZERO: u8 = b'Z';
    pub const REPLACE: u8 = b'R';
    pub const XOR: u8 = b'X';
    pub const END: u8 = b'E';
    pub const DONE: u8 = b'K';
    pub const FAIL: u8 = b'F';
}

/// Appends `message`, framed, to `out`.
pub fn encode(message: &Message, out: &mut BytesMut) {
    let frame_start = out.len();
    out.put_u32_le(0);
    match message {
        Message::Begin {
            block_size,
            new_len,
            mode,
            path,
        } => {
            out.put_u8(tag::BEGIN);
            out.put_u32_le(block_size.bytes());
            out.put_u64_le(*new_len);
            out.put_u32_le(*mode);
            out.put_slice(path.as_bytes());
        }
        Message::Index { target, old_len } => {
            out.put_u8(tag::INDEX);
            out.put_u8(match target {
                Target::Absent => 0,
                Target::File => 1,
                Target::BlockDevice => 2,
            });
            out.put_u64_le(*old_len);
        }
        Message::Regions { start, digests } => {
            out.put_u8(tag::REGIONS);
            out.put_u64_le(*start);
            for digest in digests {
                out.put_slice(&digest.0);
            }
        }
        Message::Want { runs, last } => {
            out.put_u8(tag::WANT);
            out.put_u8(u8::from(*last));
            for (first, count) in runs {
                out.put_u64_le(*first);
                out.put_u64_le(*count);
            }
        }
        Message::Digests { start, digests } => {
            out.put_u8(tag::DIGESTS);
            out.put_u64_le(*start);
            for digest in digests {
                out.put_slice(&digest.0);
            }
        }
        Message::Op(Op::Copy { start, from, count }) => {
            out.put_u8(tag::COPY);
            out.put_u64_le(*start);
            out.put_u64_le(*from);
            out.put_u64_le(*count);
        }
        Message::Op(Op::Zero { start, count }) => {
            out.put_u8(tag::ZERO);
            out.put_u64_le(*start);
            out.put_u64_le(*count);
        }
        Message::Op(Op::Replace { start, data }) | Message::Op(Op::Xor { start, data }) => {
            out.put_u8(if matches!(message, Message::Op(Op::Xor { .. })) {
                tag::XOR
            } else {
                tag::REPLACE
            });
            out.put_u64_le(*start);
            out.put_u32_le(data.len() as u32);
            // Data that does not compress (already compressed files in the
            // image) goes as it is, so a body never outgrows MAX_BODY.
            let compressed = compress(data);
            if compressed.len() < data.len() {
                out.put_u8(1);
                out.put_slice(&compressed);
            } else {
                out.put_u8(0);
                out.put_slice(data);
            }
        }
        Message::End { digest } => {
            out.put_u8(tag::END);
            out.put_slice(digest);
        }
        Message::Done { digest } => {
            out.put_u8(tag::DONE);
            out.put_slice(digest);
        }
        Message::Fail { message } => {
            out.put_u8(tag::FAIL);
            out.put_slice(message.as_bytes());
        }
    }
    let body = (out.len() - frame_start - 4) as u32;
    out[frame_start..frame_start + 4].copy_from_slice(&body.to_le_bytes());
}

/// zstd level 3, zstd's default: a changed region of an image compresses
/// about as well as at higher levels, at a speed that keeps up with a
/// gigabit link on one core (docs/delta.md, "Compression").
const ZSTD_LEVEL: i32 = 3;

/// Bytes the data of a REPLACE or XOR takes on the wire (compressed, or
/// raw if that is smaller), without its framing: how a host chooses
/// between the two.
pub fn encoded_len(data: &[u8]) -> usize {
    compress(data).len().min(data.len())
}

fn compress(data: &[u8]) -> Vec<u8> {
    zstd::bulk::compress(data, ZSTD_LEVEL).expect("compressing into memory does not fail")
}

/// Reassembles messages from a byte stream fed in pieces of any size.
#[derive(Default)]
pub struct Decoder {
    buffer: BytesMut,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Bytes fed and not yet decoded: at the stream's end, anything here is
    /// a message cut short.
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }

    /// The next whole message, `None` until one has arrived. An error
    /// leaves the stream unusable: the peer is not speaking this protocol.
    pub fn next_message(&mut self) -> Result<Option<Message>, WireError> {
        if self.buffer.len() < 4 {
            return Ok(None);
        }
        let body = u32::from_le_bytes(self.buffer[..4].try_into().expect("4 bytes")) as usize;
        if body > MAX_BODY {
            return Err(WireError::TooLarge(body));
        }
        if self.buffer.len() < 4 + body {
            self.buffer.reserve(4 + body - self.buffer.len());
            return Ok(None);
        }
        self.buffer.advance(4);
        let frame = self.buffer.split_to(body).freeze();
        decode(frame).map(Some)
    }
}

fn decode(mut frame: Bytes) -> Result<Message, WireError> {
    if frame.is_empty() {
        return Err(malformed("empty", "no tag"));
    }
    let tag = frame.get_u8();
    let need = |frame: &Bytes, what: &'static str, len: usize| {
        if frame.len() < len {
            Err(malformed(
                what,
                format!("{} bytes, at least {len} expected", frame.len()),
            ))
        } else {
            Ok(())
        }
    };
    let exact = |frame: &Bytes, what: &'static str, len: usize| {
        if frame.len() != len {
            Err(malformed(
                what,
                format!("{} bytes, {len} expected", frame.len()),
            ))
        } else {
            Ok(())
        }
    };
    Ok(match tag {
        tag::BEGIN => {
            need(&frame, "BEGIN", 16)?;
            let bytes = frame.get_u32_le();
            let block_size = BlockSize::new(bytes)
                .ok_or_else(|| malformed("BEGIN", format!("block size {bytes}")))?;
            let new_len = frame.get_u64_le();
            let mode = frame.get_u32_le();
            let path = String::from_utf8(frame.to_vec())
                .map_err(|_| malformed("BEGIN", "the path is not UTF-8"))?;
            Message::Begin {
                block_size,
                new_len,
                mode,
                path,
            }
        }
        tag::INDEX => {
            exact(&frame, "INDEX", 9)?;
            let target = match frame.get_u8() {
                0 => Target::Absent,
                1 => Target::File,
                2 => Target::BlockDevice,
                other => return Err(malformed("INDEX", format!("target {other}"))),
            };
            Message::Index {
                target,
                old_len: frame.get_u64_le(),
            }
        }
        tag::REGIONS | tag::DIGESTS => {
            let what = if tag == tag::REGIONS {
                "REGIONS"
            } else {
                "DIGESTS"
            };
            need(&frame, what, 8)?;
            let start = frame.get_u64_le();
            if !frame.len().is_multiple_of(DIGEST_LEN) {
                return Err(malformed(what, "not whole digests"));
            }
            let digests = frame
                .chunks_exact(DIGEST_LEN)
                .map(|d| BlockDigest(d.try_into().expect("DIGEST_LEN bytes")))
                .collect();
            if tag == tag::REGIONS {
                Message::Regions { start, digests }
            } else {
                Message::Digests { start, digests }
            }
        }
        tag::WANT => {
            need(&frame, "WANT", 1)?;
            let last = match frame.get_u8() {
                0 => false,
                1 => true,
                other => return Err(malformed("WANT", format!("last flag {other}"))),
            };
            if !frame.len().is_multiple_of(16) {
                return Err(malformed("WANT", "not whole runs"));
            }
            let runs = frame
                .chunks_exact(16)
                .map(|run| {
                    let first = u64::from_le_bytes(run[..8].try_into().expect("8 bytes"));
                    let count = u64::from_le_bytes(run[8..].try_into().expect("8 bytes"));
                    (first, count)
                })
                .collect();
            Message::Want { runs, last }
        }
        tag::COPY => {
            exact(&frame, "COPY", 24)?;
            Message::Op(Op::Copy {
                start: frame.get_u64_le(),
                from: frame.get_u64_le(),
                count: frame.get_u64_le(),
            })
        }
        tag::ZERO => {
            exact(&frame, "ZERO", 16)?;
            Message::Op(Op::Zero {
                start: frame.get_u64_le(),
                count: frame.get_u64_le(),
            })
        }
        tag::REPLACE | tag::XOR => {
            let what = if tag == tag::XOR { "XOR" } else { "REPLACE" };
            need(&frame, what, 13)?;
            let start = frame.get_u64_le();
            let raw_len = frame.get_u32_le() as usize;
            if raw_len == 0 || raw_len > MAX_REPLACE_BYTES {
                return Err(malformed(what, format!("{raw_len} bytes of data")));
            }
            let data = match frame.get_u8() {
                0 => frame.to_vec(),
                // Decompressed into at most the announced size: a bomb fails here.
                1 => zstd::bulk::decompress(&frame, raw_len)
                    .map_err(|error| malformed(what, format!("zstd: {error}")))?,
                other => return Err(malformed(what, format!("encoding {other}"))),
            };
            if data.len() != raw_len {
                return Err(malformed(
                    "REPLACE",
                    format!("{} bytes of data, {raw_len} announced", data.len()),
                ));
            }
            let data = Bytes::from(data);
            Message::Op(if tag == tag::XOR {
                Op::Xor { start, data }
            } else {
                Op::Replace { start, data }
            })
        }
        tag::END | tag::DONE => {
            let what = if tag == tag::END { "END" } else { "DONE" };
            exact(&frame, what, 32)?;
            let digest: [u8; 32] = frame[..].try_into().expect("32 bytes");
            if tag == tag::END {
                Message::End { digest }
            } else {
                Message::Done { digest }
            }
        }
        tag::FAIL => Message::Fail {
            message: String::from_utf8_lossy(&frame).into_owned(),
        },
        other => return Err(WireError::UnknownTag(other)),
    })
}

fn malformed(what: &'static str, why: impl Into<String>) -> WireError {
    WireError::Malformed {
        what,
        why: why.into(),
    }
}
