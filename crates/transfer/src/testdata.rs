//! Test data for the crate's tests.

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
