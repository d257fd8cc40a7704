//! ADB packet headers as the connection reader meets them.
//!
//! Input: a little-endian u32 max payload (the receiver's current limit), then
//! the byte stream from the peer. Like `read_loop` in crates/io, each header is
//! decoded, its payload taken once it is all there, and the first rejected
//! header ends the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxadb_wire::packet::{payload_checksum, Command, Header, HeaderError, Packet, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let Some((limit, mut stream)) = data.split_first_chunk::<4>() else {
        return;
    };
    let max_payload = u32::from_le_bytes(*limit);
    while let Some((raw, rest)) = stream.split_first_chunk::<HEADER_LEN>() {
        let header = match Header::decode(raw, max_payload) {
            Ok(header) => header,
            Err(error) => {
                assert_eq!(error, expected_rejection(raw, max_payload), "{raw:02x?}");
                return;
            }
        };
        check_accepted(raw, max_payload, &header);
        let len = header.data_length as usize;
        if rest.len() < len {
            // The reader would wait for the rest of the payload.
            return;
        }
        let (payload, rest) = rest.split_at(len);
        check_payload(raw, &header, payload);
        stream = rest;
    }
});

fn word(raw: &[u8; HEADER_LEN], i: usize) -> u32 {
    u32::from_le_bytes(raw[i * 4..i * 4 + 4].try_into().unwrap())
}

/// The rejection the format calls for, checked in the documented order:
/// magic, then command, then length.
fn expected_rejection(raw: &[u8; HEADER_LEN], max_payload: u32) -> HeaderError {
    let (command, length, magic) = (word(raw, 0), word(raw, 3), word(raw, 5));
    if magic != !command {
        return HeaderError::BadMagic { command, magic };
    }
    if Command::from_u32(command).is_none() {
        return HeaderError::UnknownCommand(command);
    }
    assert!(
        length > max_payload,
        "a valid header was rejected: {raw:02x?}"
    );
    HeaderError::PayloadTooLarge {
        length,
        max: max_payload,
    }
}

fn check_accepted(raw: &[u8; HEADER_LEN], max_payload: u32, header: &Header) {
    assert!(header.data_length <= max_payload);
    // Every field is kept and the magic is implied, so encoding restores the bytes.
    assert_eq!(&header.encode(), raw);
    assert_eq!(Header::decode(&header.encode(), max_payload), Ok(*header));
    // A header within one limit is within any larger one (a limit only grows
    // from the CNXN minimum to the negotiated one).
    assert_eq!(Header::decode(raw, u32::MAX), Ok(*header));
    // The command's wire bytes spell its name, and it survives u32 and back.
    assert_eq!(&raw[..4], header.command.name().as_bytes());
    assert_eq!(
        Command::from_u32(header.command.as_u32()),
        Some(header.command)
    );
}

fn check_payload(raw: &[u8; HEADER_LEN], header: &Header, payload: &[u8]) {
    // The legacy checksum is the byte sum modulo 2^32.
    let sum = payload.iter().map(|&b| u64::from(b)).sum::<u64>() as u32;
    assert_eq!(payload_checksum(payload), sum);

    let packet = Packet::new(header.command, header.arg0, header.arg1, payload.to_vec());
    let checked = packet.to_bytes(true);
    assert_eq!(checked.len(), HEADER_LEN + payload.len());
    assert_eq!(&checked[HEADER_LEN..], payload);
    let unchecked = Header::decode(&packet.header(false).encode(), u32::MAX).unwrap();
    assert_eq!(unchecked.data_crc32, 0);
    assert_eq!(unchecked.data_length, header.data_length);
    if header.data_crc32 == sum {
        // A checksummed peer's packet re-encodes byte for byte.
        assert_eq!(&checked[..HEADER_LEN], raw);
    }
}
