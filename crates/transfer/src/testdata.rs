//! Test data for the crate's tests.

use bytes::Bytes;
use oxadb_wire::Payload;

/// Compressible but not trivial: runs of one byte mixed with pseudo-random bytes.
pub(crate) fn sample(len: usize) -> Vec<u8> {
    let mut state = 0x1234_5678u32;
    (0..len)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            // Partly compressible.
            if i % 64 < 32 {
                b'a'
            } else {
                state as u8
            }
        })
        .collect()
}

/// The bytes a writer sends for `payload`, its file ranges read (what
/// `oxadb_io::ReadRanges` does for the copying path).
pub(crate) fn read_ranges(payload: Payload) -> Bytes {
    payload
        .gather_with(|range, buf| range.source.read_exact_at(buf, range.offset))
        .unwrap()
}
