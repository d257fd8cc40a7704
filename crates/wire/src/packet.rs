//! The 24-byte ADB packet header: six little-endian u32s
//! `command, arg0, arg1, data_length, data_crc32, magic`, then the payload.

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

/// Size of the fixed packet header on the wire.
pub const HEADER_LEN: usize = 24;

/// Protocol version with a checked byte-sum payload checksum.
pub const VERSION_CHECKSUMMED: u32 = 0x0100_0000;
/// Protocol version that skips the payload checksum (adb 1.0.36+ and every modern adbd).
pub const VERSION_SKIP_CHECKSUM: u32 = 0x0100_0001;

/// Payload limit of protocol v1 peers; every peer must accept this much.
pub const MAX_PAYLOAD_V1: u32 = 4 * 1024;
/// Payload limit of modern adb and adbd (AOSP `MAX_PAYLOAD`).
pub const MAX_PAYLOAD: u32 = 1024 * 1024;

/// A packet command. `SYNC` is obsolete and not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Cnxn,
    Auth,
    Open,
    Okay,
    Clse,
    Wrte,
    Stls,
}

impl Command {
    pub const fn as_u32(self) -> u32 {
        match self {
            Command::Cnxn => 0x4e58_4e43,
            Command::Auth => 0x4854_5541,
            Command::Open => 0x4e45_504f,
            Command::Okay => 0x5941_4b4f,
            Command::Clse => 0x4553_4c43,
            Command::Wrte => 0x4554_5257,
            Command::Stls => 0x534c_5453,
        }
    }

    pub const fn from_u32(raw: u32) -> Option<Command> {
        Some(match raw {
            0x4e58_4e43 => Command::Cnxn,
            0x4854_5541 => Command::Auth,
            0x4e45_504f => Command::Open,
            0x5941_4b4f => Command::Okay,
            0x4553_4c43 => Command::Clse,
            0x4554_5257 => Command::Wrte,
            0x534c_5453 => Command::Stls,
            _ => return None,
        })
    }

    pub const fn name(self) -> &'static str {
        match self {
            Command::Cnxn => "CNXN",
            Command::Auth => "AUTH",
            Command::Open => "OPEN",
            Command::Okay => "OKAY",
            Command::Clse => "CLSE",
            Command::Wrte => "WRTE",
            Command::Stls => "STLS",
        }
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a header was rejected. Any of these closes the connection (AOSP does the same).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HeaderError {
    #[error("bad magic {magic:#010x} for command {command:#010x}")]
    BadMagic { command: u32, magic: u32 },
    #[error("unknown command {0:#010x}")]
    UnknownCommand(u32),
    #[error("data_length {length} exceeds max payload {max}")]
    PayloadTooLarge { length: u32, max: u32 },
}

/// A decoded packet header (the magic is checked and dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub command: Command,
    pub arg0: u32,
    pub arg1: u32,
    pub data_length: u32,
    pub data_crc32: u32,
}

impl Header {
    /// Decodes and validates a header. `max_payload` is the largest payload the
    /// receiver currently accepts (its own limit before CNXN, the negotiated one after).
    pub fn decode(raw: &[u8; HEADER_LEN], max_payload: u32) -> Result<Header, HeaderError> {
        let word = |i: usize| u32::from_le_bytes(raw[i * 4..i * 4 + 4].try_into().unwrap());
        let (command, arg0, arg1, data_length, data_crc32, magic) =
            (word(0), word(1), word(2), word(3), word(4), word(5));
        // Magic first: a header with a wrong magic is noise, its command meaningless.
        if magic != command ^ 0xffff_ffff {
            return Err(HeaderError::BadMagic { command, magic });
        }
        let command = Command::from_u32(command).ok_or(HeaderError::UnknownCommand(command))?;
        if data_length > max_payload {
            return Err(HeaderError::PayloadTooLarge {
                length: data_length,
                max: max_payload,
            });
        }
        Ok(Header {
            command,
            arg0,
            arg1,
            data_length,
            data_crc32,
        })
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let command = self.command.as_u32();
        let mut out = [0u8; HEADER_LEN];
        for (i, word) in [
            command,
            self.arg0,
            self.arg1,
            self.data_length,
            self.data_crc32,
            command ^ 0xffff_ffff,
        ]
        .into_iter()
        .enumerate()
        {
            out[i * 4..i * 4 + 4].copy_from_slice(&word.to_le_bytes());
        }
        out
    }
}

/// The legacy "crc32" field: a plain byte sum, only checked for protocol version
/// `VERSION_CHECKSUMMED` peers.
pub fn payload_checksum(payload: &[u8]) -> u32 {
    payload
        .iter()
        .fold(0u32, |sum, &b| sum.wrapping_add(u32::from(b)))
}

/// A whole packet. The payload is reference-counted so that it moves from the
/// socket to a stream's consumer without being copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub command: Command,
    pub arg0: u32,
    pub arg1: u32,
    pub payload: Bytes,
}

impl Packet {
    pub fn new(command: Command, arg0: u32, arg1: u32, payload: impl Into<Bytes>) -> Packet {
        Packet {
            command,
            arg0,
            arg1,
            payload: payload.into(),
        }
    }

    /// The header for this packet; `with_checksum` fills the byte sum for old peers.
    pub fn header(&self, with_checksum: bool) -> Header {
        Header {
            command: self.command,
            arg0: self.arg0,
            arg1: self.arg1,
            data_length: self.payload.len() as u32,
            data_crc32: if with_checksum {
                payload_checksum(&self.payload)
            } else {
                0
            },
        }
    }

    /// Encodes header and payload into one buffer (tests and small packets; the
    /// drivers write header and payload with vectored I/O instead).
    pub fn to_bytes(&self, with_checksum: bool) -> Bytes {
        let mut out = BytesMut::with_capacity(HEADER_LEN + self.payload.len());
        out.put_slice(&self.header(with_checksum).encode());
        out.put_slice(&self.payload);
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        for command in [
            Command::Cnxn,
            Command::Auth,
            Command::Open,
            Command::Okay,
            Command::Clse,
            Command::Wrte,
            Command::Stls,
        ] {
            let header = Header {
                command,
                arg0: 7,
                arg1: 0xdead_beef,
                data_length: 4096,
                data_crc32: 12,
            };
            assert_eq!(Header::decode(&header.encode(), MAX_PAYLOAD), Ok(header));
        }
    }

    #[test]
    fn known_encoding_of_cnxn() {
        let header = Packet::new(
            Command::Cnxn,
            VERSION_SKIP_CHECKSUM,
            MAX_PAYLOAD,
            &b"host::\0"[..],
        )
        .header(false);
        let raw = header.encode();
        assert_eq!(&raw[0..4], b"CNXN");
        assert_eq!(&raw[4..8], &[1, 0, 0, 1]);
        assert_eq!(u32::from_le_bytes(raw[12..16].try_into().unwrap()), 7);
        assert_eq!(
            u32::from_le_bytes(raw[20..24].try_into().unwrap()),
            !0x4e58_4e43
        );
    }

    #[test]
    fn rejects_bad_magic() {
        let mut raw = Packet::new(Command::Okay, 1, 2, Bytes::new())
            .header(false)
            .encode();
        raw[20] ^= 1;
        assert!(matches!(
            Header::decode(&raw, MAX_PAYLOAD),
            Err(HeaderError::BadMagic { .. })
        ));
    }

    #[test]
    fn rejects_unknown_command() {
        let command = u32::from_le_bytes(*b"SYNC");
        let mut raw = [0u8; HEADER_LEN];
        raw[0..4].copy_from_slice(&command.to_le_bytes());
        raw[20..24].copy_from_slice(&(command ^ 0xffff_ffff).to_le_bytes());
        assert_eq!(
            Header::decode(&raw, MAX_PAYLOAD),
            Err(HeaderError::UnknownCommand(command))
        );
    }

    #[test]
    fn rejects_oversized_payload() {
        let mut header = Packet::new(Command::Wrte, 1, 2, Bytes::new()).header(false);
        header.data_length = MAX_PAYLOAD_V1 + 1;
        assert_eq!(
            Header::decode(&header.encode(), MAX_PAYLOAD_V1),
            Err(HeaderError::PayloadTooLarge {
                length: MAX_PAYLOAD_V1 + 1,
                max: MAX_PAYLOAD_V1
            })
        );
        header.data_length = MAX_PAYLOAD_V1;
        assert!(Header::decode(&header.encode(), MAX_PAYLOAD_V1).is_ok());
    }

    #[test]
    fn checksum_is_byte_sum() {
        assert_eq!(payload_checksum(b""), 0);
        assert_eq!(payload_checksum(&[0xff, 0xff, 2]), 0x200);
        let packet = Packet::new(Command::Wrte, 1, 2, vec![1u8, 2, 3]);
        assert_eq!(packet.header(true).data_crc32, 6);
        assert_eq!(packet.header(false).data_crc32, 0);
        assert_eq!(packet.to_bytes(true).len(), HEADER_LEN + 3);
    }
}
