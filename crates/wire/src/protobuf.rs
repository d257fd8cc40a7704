//! The few protobuf wire-format pieces adb's small host messages need
//! (`adb_known_hosts.pb`, `track-mdns-services`' `MdnsServices`): varints,
//! length-delimited fields, and reading a message's fields back. Field
//! numbers and types are the callers'; AOSP's `.proto` files name them.

/// Wire type 0: a varint.
const VARINT: u64 = 0;
/// Wire type 1: eight bytes.
const FIXED64: u64 = 1;
/// Wire type 2: a length, then that many bytes.
const LEN: u64 = 2;
/// Wire type 5: four bytes.
const FIXED32: u64 = 5;

pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A string, bytes or embedded message field.
pub fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_varint(out, (u64::from(field) << 3) | LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// An integer or bool field.
pub fn put_uint(out: &mut Vec<u8>, field: u32, value: u64) {
    put_varint(out, (u64::from(field) << 3) | VARINT);
    put_varint(out, value);
}

/// One field of a message as read: its number, and the bytes of a
/// length-delimited one (`None` for the other wire types).
pub type Field<'a> = (u64, Option<&'a [u8]>);

/// A message's fields in order; unknown ones are the caller's to skip.
pub fn fields(mut bytes: &[u8]) -> Result<Vec<Field<'_>>, String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = take_varint(&mut bytes)?;
        let field = key >> 3;
        let skip = match key & 7 {
            VARINT => {
                take_varint(&mut bytes)?;
                out.push((field, None));
                continue;
            }
            FIXED64 => 8,
            FIXED32 => 4,
            LEN => {
                let len = usize::try_from(take_varint(&mut bytes)?)
                    .map_err(|_| "field length too large")?;
                if bytes.len() < len {
                    return Err("truncated field".into());
                }
                out.push((field, Some(&bytes[..len])));
                bytes = &bytes[len..];
                continue;
            }
            other => return Err(format!("unsupported wire type {other}")),
        };
        if bytes.len() < skip {
            return Err("truncated fixed-width field".into());
        }
        bytes = &bytes[skip..];
        out.push((field, None));
    }
    Ok(out)
}

fn take_varint(bytes: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first().ok_or("truncated varint")?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint longer than 10 bytes".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_as_protoc_encodes_them() {
        let mut out = Vec::new();
        put_bytes(&mut out, 1, b"abc");
        put_uint(&mut out, 6, 37000);
        put_uint(&mut out, 2, 1);
        // protoc: 0a 03 'abc', 30 88 a1 02, 10 01.
        assert_eq!(out, b"\x0a\x03abc\x30\x88\xa1\x02\x10\x01".to_vec());
        assert_eq!(
            fields(&out).unwrap(),
            vec![(1, Some(&b"abc"[..])), (6, None), (2, None)]
        );
        // Fixed-width fields are skipped whole; truncations are errors.
        let mut fixed = vec![0x09];
        fixed.extend_from_slice(&[0; 8]);
        fixed.extend_from_slice(&[0x15, 1, 2, 3, 4]);
        assert_eq!(fields(&fixed).unwrap(), vec![(1, None), (2, None)]);
        assert!(fields(b"\x0a\x05ab").is_err());
        assert!(fields(b"\x30\x88").is_err());
        assert!(fields(b"\x0b").is_err());
    }
}
