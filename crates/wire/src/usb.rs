//! What ADB over USB relies on beyond the packet format, shared by the
//! device's FunctionFS driver and the host's USB driver: the interface that
//! marks an ADB function, and how packets map onto bulk transfers.
//!
//! A bulk transfer ends when the receiver's buffer is full or a packet
//! shorter than `wMaxPacketSize` arrives (USB 2.0, 5.8.3). ADB's host reads
//! exactly 24 bytes for a header and then exactly the payload, so the
//! device never needs a zero-length packet; the device reads fixed-size
//! buffers, so the host must end every transfer whose length is a multiple
//! of `wMaxPacketSize` with a zero-length packet (AOSP
//! `docs/dev/zero_length_packet.md`).

use std::ops::Range;

/// Interface class of an ADB function: vendor specific.
pub const ADB_CLASS: u8 = 0xff;
/// Interface subclass of an ADB function.
pub const ADB_SUBCLASS: u8 = 0x42;
/// Interface protocol of an ADB function.
pub const ADB_PROTOCOL: u8 = 0x01;

/// Bulk `wMaxPacketSize` at full speed (the largest the spec allows).
pub const FULL_SPEED_BULK_MAX_PACKET: u16 = 64;
/// Bulk `wMaxPacketSize` at high speed (the only value the spec allows).
pub const HIGH_SPEED_BULK_MAX_PACKET: u16 = 512;
/// Bulk `wMaxPacketSize` at super speed (the only value the spec allows).
pub const SUPER_SPEED_BULK_MAX_PACKET: u16 = 1024;

/// Whether a transfer of `len` bytes towards the device needs a zero-length
/// packet after it: the device's read of a larger buffer would not end
/// otherwise, and would run on into the next packet's header.
pub fn host_needs_zlp(len: usize, max_packet: usize) -> bool {
    len > 0 && max_packet > 0 && len.is_multiple_of(max_packet)
}

/// Splits a payload of `len` bytes into transfers of at most `chunk` bytes,
/// every one but the last a multiple of `max_packet`, so that no transfer
/// but the last ends with a short packet: the host reads the payload with
/// one buffer of its exact size, and a short packet before its end would
/// end that read early. `chunk` is rounded down to a multiple of
/// `max_packet` (at least one).
pub fn payload_transfers(
    len: usize,
    chunk: usize,
    max_packet: usize,
) -> impl Iterator<Item = Range<usize>> {
    let max_packet = max_packet.max(1);
    let chunk = (chunk / max_packet).max(1) * max_packet;
    (0..len)
        .step_by(chunk)
        .map(move |start| start..(start + chunk).min(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zlp_follows_exact_multiples_only() {
        assert!(host_needs_zlp(512, 512));
        assert!(host_needs_zlp(1024 * 1024, 512));
        assert!(host_needs_zlp(4096, 1024));
        assert!(
            !host_needs_zlp(24, 512),
            "a header is always a short packet at high speed"
        );
        assert!(!host_needs_zlp(513, 512));
        assert!(!host_needs_zlp(0, 512), "nothing sent, nothing to end");
        // Full speed with 8-byte packets: even a header needs one.
        assert!(host_needs_zlp(24, 8));
    }

    #[test]
    fn payload_transfers_end_short_only_at_the_end() {
        let transfers: Vec<_> = payload_transfers(40_000, 16_384, 512).collect();
        assert_eq!(transfers, vec![0..16_384, 16_384..32_768, 32_768..40_000]);
        for range in &transfers[..transfers.len() - 1] {
            assert_eq!(range.len() % 512, 0);
        }
        // A chunk that is not a multiple of the packet size is rounded down.
        let transfers: Vec<_> = payload_transfers(3000, 1000, 512).collect();
        assert_eq!(
            transfers,
            vec![
                0..512,
                512..1024,
                1024..1536,
                1536..2048,
                2048..2560,
                2560..3000
            ]
        );
        assert_eq!(payload_transfers(0, 16_384, 512).count(), 0);
        assert_eq!(
            payload_transfers(100, 16_384, 1024).collect::<Vec<_>>(),
            vec![0..100]
        );
    }
}
