//! The memory budget shared by every stream of a process: how many received
//! bytes the adaptive receive windows may commit, in total.
//!
//! Shaped like Linux's `tcp_mem` (docs/flow-control.md, "Memory budget"): three levels derived from free
//! memory. Below `comfortable` windows grow freely; between `comfortable`
//! and `pressure` they stop growing; between `pressure` and `limit` they
//! shrink linearly towards a one-packet floor; at `limit` no stream is
//! granted anything beyond that floor.
//!
//! Everything a stream or connection holds is counted: its grant, received
//! bytes its consumer has not taken, and the part of a packet the consumer
//! took while the rest of it keeps the allocation alive; a connection's read
//! buffer too. The floor (one packet per stream, classic ADB's own
//! guarantee), a sender's overshoot (a delayed-ack sender may send a whole
//! packet on its last byte of credit) and read buffers are charged even
//! beyond the limit, so that no stream can starve: whatever else happens,
//! every stream keeps one packet moving. What they take leaves less for
//! every other window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The levels of a [`MemoryBudget`], in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLimits {
    /// Below this, windows grow as the rate and round trip ask.
    pub comfortable: u64,
    /// Above this, windows shrink.
    pub pressure: u64,
    /// Grants stop here; only what cannot be refused (floors, overshoots,
    /// read buffers) is charged beyond it.
    pub limit: u64,
    /// No single stream's window exceeds this.
    pub per_stream_cap: u64,
}

/// The largest adaptive window, for links whose bandwidth-delay product
/// AOSP's fixed credit does not cover (32 MiB is 1 Gbit/s for 268 ms):
/// three times 1 Gbit/s over 680 ms, a geostationary satellite hop, or
/// 10 Gbit/s over 70 ms. The budget caps it far lower on most hosts (a
/// stream gets an eighth of the limit, [`BudgetLimits::from_limit`]); it
/// lives here, with the other caps, so that the credit policies depend on
/// the budget and not the other way round.
pub const MAX_ADAPTIVE_WINDOW: u32 = 256 * 1024 * 1024;

/// The largest window any stream gets, however large the budget.
const MAX_PER_STREAM: u64 = MAX_ADAPTIVE_WINDOW as u64;

/// The smallest packet [`BudgetLimits::packet_size`] chooses: AOSP's
/// largest sync DATA payload (`SYNC_DATA_MAX`), so a push or pull never
/// splits a frame over more than two packets.
pub const MIN_PACKET: u32 = 64 * 1024;

impl BudgetLimits {
    /// Levels for a hard `limit`, in `tcp_mem`'s proportions (3/4 : 1 : 3/2
    /// of the pressure level, so comfortable = limit / 2, pressure =
    /// 2 x limit / 3); a stream may take an eighth of the limit, at most
    /// [`MAX_ADAPTIVE_WINDOW`](crate::MAX_ADAPTIVE_WINDOW).
    pub fn from_limit(limit: u64) -> BudgetLimits {
        BudgetLimits {
            comfortable: limit / 2,
            pressure: limit / 3 * 2,
            limit,
            per_stream_cap: (limit / 8).min(MAX_PER_STREAM),
        }
    }

    /// The largest payload for a process that may have `streams` streams
    /// (e.g. one per connection it serves) stalled at once: a quarter of each
    /// one's share of the limit, since a stalled stream may hold about four
    /// packets the budget cannot refuse (its floor, the sender's overshoot,
    /// the rest of a packet its consumer took part of, its connection's read
    /// buffer). Between [`MIN_PACKET`] and `max` (the protocol's 1 MiB), in
    /// 4 KiB steps. With 64 MiB and 64 connections, 256 KiB: before the rest
    /// of what a stream holds was charged, 64 connections into sleeping
    /// consumers grew the daemon by 271 MiB with 1 MiB packets and by 129
    /// MiB with 256 KiB ones (docs/benchmarks.md, "Daemon memory with
    /// stalled streams").
    pub fn packet_size(&self, streams: usize, max: u32) -> u32 {
        let share = self.limit / (4 * streams.max(1) as u64);
        let packet = share.min(u64::from(max)) as u32 & !4095;
        packet.max(MIN_PACKET).min(max)
    }

    /// Levels for a machine with `available` bytes of free memory, the way
    /// Linux sizes `tcp_mem` from free pages (`tcp_init_mem`: pressure at a
    /// sixteenth, the hard limit at 3/32).
    pub fn from_available_memory(available: u64) -> BudgetLimits {
        BudgetLimits::from_limit(available / 32 * 3)
    }
}

/// Memory pressure as the budget sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pressure {
    /// Windows may grow.
    Comfortable,
    /// Windows keep their size.
    Moderate,
    /// Windows shrink towards the floor.
    High,
    /// Nothing beyond the floor.
    Exhausted,
}

/// The process-wide budget; share it with `Arc` between connections.
#[derive(Debug)]
pub struct MemoryBudget {
    limits: BudgetLimits,
    committed: AtomicU64,
    peak: AtomicU64,
}

impl MemoryBudget {
    pub fn new(limits: BudgetLimits) -> MemoryBudget {
        MemoryBudget {
            limits,
            committed: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> BudgetLimits {
        self.limits
    }

    /// Bytes committed now: granted to senders and not yet consumed,
    /// received and held, and read buffers.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
    }

    /// The most ever committed at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    pub fn pressure(&self) -> Pressure {
        let committed = self.committed();
        let limits = &self.limits;
        if committed >= limits.limit {
            Pressure::Exhausted
        } else if committed >= limits.pressure {
            Pressure::High
        } else if committed >= limits.comfortable {
            Pressure::Moderate
        } else {
            Pressure::Comfortable
        }
    }

    /// The window a stream may use when it wishes for `wish` bytes: capped
    /// per stream, shrunk linearly from `pressure` to `limit`, never below
    /// `floor`.
    pub fn allowed_window(&self, wish: u64, floor: u64) -> u64 {
        let limits = &self.limits;
        let wish = wish.min(limits.per_stream_cap).max(floor);
        let committed = self.committed();
        if committed < limits.pressure {
            return wish;
        }
        if committed >= limits.limit {
            return floor;
        }
        let left = (limits.limit - committed) as u128;
        let span = (limits.limit - limits.pressure).max(1) as u128;
        let shrunk = (wish as u128 * left / span) as u64;
        shrunk.max(floor)
    }

    /// Reserves up to `want` bytes; returns how many were reserved (less when
    /// the limit is near, zero at the limit).
    pub fn reserve(&self, want: u64) -> u64 {
        let mut committed = self.committed.load(Ordering::Relaxed);
        loop {
            let got = want.min(self.limits.limit.saturating_sub(committed));
            if got == 0 {
                return 0;
            }
            match self.committed.compare_exchange_weak(
                committed,
                committed + got,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(committed + got, Ordering::Relaxed);
                    return got;
                }
                Err(now) => committed = now,
            }
        }
    }

    /// Charges `bytes` that are held whatever the limit says (a floor, an
    /// overshoot that arrived, a read buffer): they count towards pressure,
    /// so every other window shrinks to make room.
    pub fn charge(&self, bytes: u64) {
        if bytes > 0 {
            let before = self.committed.fetch_add(bytes, Ordering::Relaxed);
            self.peak.fetch_max(before + bytes, Ordering::Relaxed);
        }
    }

    /// Returns `bytes` reserved or charged earlier.
    pub fn release(&self, bytes: u64) {
        if bytes > 0 {
            let before = self.committed.fetch_sub(bytes, Ordering::Relaxed);
            debug_assert!(before >= bytes, "released more than was reserved");
        }
    }
}

/// Bytes something holds, charged to a budget (or to none) as they change
/// and released on drop: a connection's read buffer.
#[derive(Debug, Default)]
pub struct Holding {
    budget: Option<Arc<MemoryBudget>>,
    bytes: u64,
}

impl Holding {
    pub fn new(budget: Option<Arc<MemoryBudget>>) -> Holding {
        Holding { budget, bytes: 0 }
    }

    /// Now `bytes` are held.
    pub fn set(&mut self, bytes: u64) {
        if let Some(budget) = &self.budget {
            if bytes > self.bytes {
                budget.charge(bytes - self.bytes);
            } else {
                budget.release(self.bytes - bytes);
            }
        }
        self.bytes = bytes;
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_tcp_mem_proportions() {
        let limits = BudgetLimits::from_available_memory(512 << 20);
        assert_eq!(limits.limit, 48 << 20);
        assert_eq!(limits.pressure, 32 << 20);
        assert_eq!(limits.comfortable, 24 << 20);
        assert_eq!(limits.per_stream_cap, 6 << 20);
        assert_eq!(
            BudgetLimits::from_limit(1 << 40).per_stream_cap,
            256 << 20,
            "never above the largest adaptive window"
        );
    }

    #[test]
    fn reservations_stop_at_the_limit_and_come_back() {
        let budget = MemoryBudget::new(BudgetLimits::from_limit(1000));
        assert_eq!(budget.reserve(600), 600);
        assert_eq!(budget.reserve(600), 400, "clipped at the limit");
        assert_eq!(budget.reserve(1), 0);
        assert_eq!(budget.pressure(), Pressure::Exhausted);
        budget.release(700);
        assert_eq!(budget.committed(), 300);
        assert_eq!(budget.peak(), 1000);
        assert_eq!(budget.pressure(), Pressure::Comfortable);
    }

    #[test]
    fn charges_go_beyond_the_limit_and_press_on_reservations() {
        let budget = Arc::new(MemoryBudget::new(BudgetLimits::from_limit(1000)));
        budget.charge(900);
        assert_eq!(budget.reserve(300), 100, "a charge leaves less to reserve");
        budget.charge(500);
        assert_eq!(budget.committed(), 1500);
        assert_eq!(budget.peak(), 1500, "charges are not clipped");
        assert_eq!(budget.reserve(1), 0);
        let mut held = Holding::new(Some(budget.clone()));
        held.set(200);
        held.set(50);
        assert_eq!(budget.committed(), 1550);
        drop(held);
        budget.release(1500);
        assert_eq!(budget.committed(), 0);
    }

    #[test]
    fn packets_are_a_quarter_of_a_stalled_streams_share() {
        let max = 1 << 20;
        let limits = BudgetLimits::from_limit(64 << 20);
        assert_eq!(limits.packet_size(64, max), 256 << 10);
        assert_eq!(
            limits.packet_size(1, max),
            max,
            "never above the protocol's"
        );
        assert_eq!(limits.packet_size(65, max), 252 << 10, "in 4 KiB steps");
        assert_eq!(
            BudgetLimits::from_limit(1 << 20).packet_size(64, max),
            MIN_PACKET
        );
        assert_eq!(
            BudgetLimits::from_limit(1 << 20).packet_size(64, 4096),
            4096,
            "never above the given maximum"
        );
        assert_eq!(
            BudgetLimits::from_available_memory(512 << 20).packet_size(64, max),
            192 << 10,
            "a 512 MiB board's 48 MiB budget"
        );
    }

    #[test]
    fn windows_shrink_between_pressure_and_limit() {
        let budget = MemoryBudget::new(BudgetLimits::from_limit(3000));
        // pressure = 2000, limit = 3000, per-stream cap = 375.
        assert_eq!(budget.allowed_window(300, 10), 300);
        assert_eq!(budget.allowed_window(10_000, 10), 375, "per-stream cap");
        budget.reserve(2500);
        assert_eq!(budget.allowed_window(300, 10), 150, "halfway to the limit");
        budget.reserve(500);
        assert_eq!(budget.allowed_window(300, 10), 10, "the floor at the limit");
    }
}
