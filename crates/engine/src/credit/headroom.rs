//! Headroom for data and acknowledgements that arrive in clumps, added to
//! the adaptive window (`docs/flow-control.md`, "Adaptive credit").

/// BBR's ACK-aggregation estimate (docs/flow-control.md, "Headroom for clumps"): when data arrives in clumps
/// (USB completions, Wi-Fi aggregation, a peer that batches OKAYs), a window
/// of exactly rate x RTT leaves the sender idle between clumps. Track the
/// bytes delivered beyond what the rate predicts since the current burst
/// began, keep a windowed maximum, and add it to the window.
#[derive(Debug, Clone, Default)]
pub(crate) struct AckHeadroom {
    epoch_start_ns: u64,
    epoch_bytes: u64,
    /// Windowed maximum in two slots of `SLOT_ROUND_TRIPS` each, as BBR keeps
    /// `extra_acked[2]` over ten round trips.
    slots: [u64; 2],
    current: usize,
    slot_started_ns: u64,
    /// When the last bytes arrived (ns).
    last_delivery_ns: u64,
    /// Whether the current burst began after a silence of MIN_SILENCE_NS.
    epoch_after_silence: bool,
}

/// Round trips per headroom slot (BBR: `bbr_extra_acked_win_rtts` = 5).
const SLOT_ROUND_TRIPS: u64 = 5;
/// The shortest silence before a burst that makes it a clump. On loopback
/// 1 MiB packets reach the engine 0.1 to 0.6 ms apart, bunched by the
/// reader's scheduling and measured against a rate that 1 ms intervals of
/// whole packets quantise: every transfer earned a window of headroom,
/// which held 4 MiB in flight where 2 carry the link and cost pulls a
/// fifth (docs/benchmarks.md, "Burst pulls on loopback"). Held OKAYs
/// (10 ms), a repaired loss (a round trip) and Wi-Fi bursts seen as
/// whole packets are longer.
const MIN_SILENCE_NS: u64 = 2_000_000;

/// The cap on headroom in time at the measured rate (BBR: 100 ms).
const MAX_HEADROOM_NS: u64 = 100_000_000;

impl AckHeadroom {
    /// `rate` was measured over `rate_interval_ns`: the round trip, or the
    /// rate's shortest measuring interval when the round trip is shorter.
    pub(crate) fn on_delivered(
        &mut self,
        bytes: u64,
        now_ns: u64,
        rate: u64,
        rate_interval_ns: u64,
        window: u64,
    ) {
        if now_ns.saturating_sub(self.slot_started_ns) >= SLOT_ROUND_TRIPS * rate_interval_ns {
            self.current ^= 1;
            self.slots[self.current] = 0;
            self.slot_started_ns = now_ns;
        }
        let elapsed = now_ns.saturating_sub(self.epoch_start_ns);
        let mut expected = (rate as u128 * elapsed as u128 / 1_000_000_000) as u64;
        if self.epoch_bytes <= expected {
            // Delivery caught up with the rate: a new burst starts here. It
            // is a clump only after a silence: deliveries less than
            // MIN_SILENCE_NS apart were spread by packet size and our own
            // reader's scheduling, not by the link.
            self.epoch_start_ns = now_ns;
            self.epoch_bytes = 0;
            self.epoch_after_silence =
                now_ns.saturating_sub(self.last_delivery_ns) >= MIN_SILENCE_NS;
            expected = 0;
        }
        self.last_delivery_ns = now_ns;
        self.epoch_bytes += bytes;
        if !self.epoch_after_silence {
            return;
        }
        let extra = (self.epoch_bytes - expected).min(window);
        let slot = &mut self.slots[self.current];
        *slot = (*slot).max(extra);
    }

    pub(crate) fn restart_epoch(&mut self, now_ns: u64) {
        self.epoch_start_ns = now_ns;
        self.epoch_bytes = 0;
        self.epoch_after_silence = false;
        self.last_delivery_ns = now_ns;
    }

    /// Capped by the window itself and by rate x 100 ms (BBR caps it at 100 ms of the rate).
    pub(crate) fn headroom(&self, rate: u64, window: u64) -> u64 {
        let by_time = (rate as u128 * MAX_HEADROOM_NS as u128 / 1_000_000_000) as u64;
        self.slots[0].max(self.slots[1]).min(window).min(by_time)
    }
}
