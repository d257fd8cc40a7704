//! The link model: one FIFO per direction with a rate, a delay, a fixed cost
//! per packet and optional batching of arrivals.

use std::collections::VecDeque;

use oxadb_wire::HEADER_LEN;

const NS_PER_SEC: u64 = 1_000_000_000;
const US: u64 = 1_000;
const MS: u64 = 1_000_000;

/// The parameters of one direction of a link (a scenario uses the same ones
/// both ways).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub name: &'static str,
    /// Bytes per second on the wire, counting the 24-byte header and the payload.
    pub rate: u64,
    pub one_way_delay_ns: u64,
    /// Fixed wire time per packet (USB transfer setup, a syscall and a wakeup).
    pub per_transfer_overhead_ns: u64,
    /// 0: none. Otherwise arrivals are held and released together at the next
    /// multiple of this interval (USB completion batching, Wi-Fi aggregation).
    pub batch_interval_ns: u64,
}

impl Link {
    /// Loopback TCP between two processes: raw TCP loopback measures 3-4 GB/s
    /// on this machine; a write, a wakeup and a read cost about a microsecond
    /// per packet and the socket round trip is tens of microseconds.
    pub fn loopback() -> Link {
        Link {
            name: "loopback",
            rate: 4_000_000_000,
            one_way_delay_ns: 25 * US,
            per_transfer_overhead_ns: US,
            batch_interval_ns: 0,
        }
    }

    /// USB 3 SuperSpeed as ADB sees it, calibrated on the phone AOSP measured
    /// burst mode on (push: 202 MB/s classic, 340 MB/s burst):
    /// 5 Gbit/s signalling carries about 350 MB/s of ADB payload after
    /// 8b/10b coding, bulk-protocol and gadget overheads (burst push reached
    /// 340 MB/s there); each bulk transfer costs tens of microseconds; the
    /// gadget takes completions in batches; and a packet's acknowledgement
    /// takes about 2 ms to come back through both USB stacks and both ADB
    /// processes (classic push managed 202 MB/s: 5.2 ms per 1 MiB packet, 3 ms
    /// of it on the wire). The batch is what oxadbd's FunctionFS endpoints
    /// showed under dummy_hcd (tests/usb/transfer-shapes.sh): 16 KiB
    /// transfers, reaped 3.4 to 5.1 at a time (at most the 8 queued), about
    /// 72 KiB per wake-up, which at this rate is 200 us (first guess: one
    /// 125 us microframe).
    pub fn usb3() -> Link {
        Link {
            name: "usb3",
            rate: 350_000_000,
            one_way_delay_ns: MS,
            per_transfer_overhead_ns: 30 * US,
            batch_interval_ns: 200 * US,
        }
    }

    /// Good 802.11ac Wi-Fi: 400 Mbit/s of goodput, 4 ms round trip, frames
    /// aggregated into bursts every 2 ms (which clumps acknowledgements too);
    /// per-frame costs are already in the rate, the per-packet cost is the
    /// sender's write and wakeup.
    pub fn wifi() -> Link {
        Link {
            name: "wifi",
            rate: 50_000_000,
            one_way_delay_ns: 2 * MS,
            per_transfer_overhead_ns: 10 * US,
            batch_interval_ns: 2 * MS,
        }
    }

    /// A wide-area path (adb over a VPN or a remote device farm): 100 Mbit/s,
    /// 50 ms round trip, no batching.
    pub fn wan() -> Link {
        Link {
            name: "wan",
            rate: 12_500_000,
            one_way_delay_ns: 25 * MS,
            per_transfer_overhead_ns: US,
            batch_interval_ns: 0,
        }
    }

    /// A long fat pipe: 1 Gbit/s over a 50 ms round trip (the emulated
    /// end-to-end runs use the same), a bandwidth-delay product of 6.25 MB:
    /// three times the adaptive window's two-packet start, so the window
    /// must grow, and a small budget caps it (docs/flow-control.md, "Memory budget").
    pub fn wan_1g() -> Link {
        Link {
            name: "wan-1g",
            rate: 125_000_000,
            one_way_delay_ns: 25 * MS,
            per_transfer_overhead_ns: US,
            batch_interval_ns: 0,
        }
    }

    /// Every named link, fastest first.
    pub fn all() -> [Link; 4] {
        [Link::loopback(), Link::usb3(), Link::wifi(), Link::wan()]
    }

    pub fn round_trip_ns(&self) -> u64 {
        2 * self.one_way_delay_ns
    }

    /// How long a packet with `payload` bytes occupies the link.
    pub fn wire_time_ns(&self, payload: usize) -> u64 {
        let bytes = (HEADER_LEN + payload) as u128;
        let transfer = (bytes * NS_PER_SEC as u128).div_ceil(self.rate as u128) as u64;
        self.per_transfer_overhead_ns + transfer
    }

    /// Payload bytes per second the link carries with packets of `max_payload`.
    pub fn payload_rate(&self, max_payload: usize) -> f64 {
        max_payload as f64 * NS_PER_SEC as f64 / self.wire_time_ns(max_payload) as f64
    }
}

/// One direction of a link in use.
#[derive(Debug, Clone)]
pub(crate) struct Wire {
    link: Link,
    /// When the packet last put on the link has left the sender.
    busy_until: u64,
    /// Packets not yet fully sent: (when they will have left, wire bytes).
    departing: VecDeque<(u64, u64)>,
    departing_bytes: u64,
}

impl Wire {
    pub fn new(link: Link) -> Wire {
        Wire {
            link,
            busy_until: 0,
            departing: VecDeque::new(),
            departing_bytes: 0,
        }
    }

    /// Bytes (headers included) waiting or in transmission at `now`: what a
    /// socket send buffer would hold.
    pub fn queued_bytes(&mut self, now: u64) -> u64 {
        while let Some(&(leaves_at, bytes)) = self.departing.front() {
            if leaves_at > now {
                break;
            }
            self.departing.pop_front();
            self.departing_bytes -= bytes;
        }
        self.departing_bytes
    }

    /// When the oldest queued packet will have left, if any is queued.
    pub fn next_departure(&self) -> Option<u64> {
        self.departing.front().map(|&(leaves_at, _)| leaves_at)
    }

    /// Puts a packet with `payload` bytes on the link at `now`; returns when
    /// it arrives. Packets leave in the order they were sent, and rounding up
    /// to a batch boundary keeps that order.
    pub fn send(&mut self, now: u64, payload: usize) -> u64 {
        let start = now.max(self.busy_until);
        self.busy_until = start + self.link.wire_time_ns(payload);
        let bytes = (HEADER_LEN + payload) as u64;
        self.departing.push_back((self.busy_until, bytes));
        self.departing_bytes += bytes;
        let arrival = self.busy_until + self.link.one_way_delay_ns;
        match self.link.batch_interval_ns {
            0 => arrival,
            interval => arrival.div_ceil(interval) * interval,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_queue_behind_each_other_and_arrive_after_the_delay() {
        let link = Link {
            name: "test",
            rate: 1_000_000,
            one_way_delay_ns: 5 * MS,
            per_transfer_overhead_ns: 1_000,
            batch_interval_ns: 0,
        };
        let mut wire = Wire::new(link);
        // 24 + 976 bytes at 1 MB/s: 1 ms, plus 1 us of overhead.
        assert_eq!(wire.send(0, 976), 1_001_000 + 5 * MS);
        assert_eq!(wire.send(0, 976), 2_002_000 + 5 * MS, "waits for the first");
        assert_eq!(wire.queued_bytes(0), 2000);
        assert_eq!(wire.next_departure(), Some(1_001_000));
        assert_eq!(wire.queued_bytes(1_001_000), 1000, "the first has left");
        assert_eq!(wire.send(10 * MS, 0), 10 * MS + 1_000 + 24_000 + 5 * MS);
    }

    #[test]
    fn batching_releases_arrivals_at_the_next_boundary() {
        let link = Link {
            batch_interval_ns: MS,
            ..Link::wan()
        };
        let mut wire = Wire::new(link);
        let first = wire.send(0, 0);
        let second = wire.send(0, 0);
        assert_eq!(first, 26 * MS);
        assert_eq!(first, second, "both in one batch");
    }

    #[test]
    fn payload_rate_counts_headers_and_overhead() {
        let link = Link::usb3();
        let rate = link.payload_rate(1 << 20);
        // 1 MiB in 30 us plus (1 MiB + 24) at 350 MB/s.
        assert!(rate < 350e6 && rate > 345e6, "{rate}");
    }
}
