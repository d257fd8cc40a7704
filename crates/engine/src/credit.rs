//! Per-stream credit: how much a sender may put in flight, and when a receiver
//! returns credit.
//!
//! Two modes exist on the wire (see `docs/dev/delayed_ack.md` in AOSP):
//! - classic: one WRTE in flight per stream; an empty OKAY releases the next one.
//! - delayed ack ("burst mode"), negotiated by the `delayed_ack` feature on both
//!   sides: OPEN.arg1 and the first OKAY's i32 payload grant initial credit, every
//!   later OKAY carries the i32 number of bytes acknowledged, and the sender keeps
//!   sending while its credit is positive (overshooting by at most one packet).

use std::sync::Arc;

use crate::budget::{MemoryBudget, Pressure};

/// AOSP's `INITIAL_DELAYED_ACK_BYTES`: the fixed credit each side grants per stream.
pub const AOSP_INITIAL_CREDIT: u32 = 32 * 1024 * 1024;

/// What the sender side of a stream may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendCredit {
    /// Classic: `true` while a WRTE awaits its OKAY.
    Classic { in_flight: bool },
    /// Delayed ack: bytes we may still send; may go negative after an overshoot
    /// or a negative OKAY, which the protocol allows.
    Delayed { available: i64 },
}

impl SendCredit {
    pub fn can_send(&self) -> bool {
        match *self {
            SendCredit::Classic { in_flight } => !in_flight,
            // AOSP keeps reading its source while available > 0, so one packet may overshoot.
            SendCredit::Delayed { available } => available > 0,
        }
    }

    pub fn on_sent(&mut self, bytes: usize) {
        match self {
            SendCredit::Classic { in_flight } => *in_flight = true,
            SendCredit::Delayed { available } => *available -= bytes as i64,
        }
    }

    /// Applies an OKAY. `acked` is its payload, present only in delayed-ack mode.
    pub fn on_okay(&mut self, acked: Option<i32>) {
        match (self, acked) {
            (SendCredit::Classic { in_flight }, _) => *in_flight = false,
            (SendCredit::Delayed { available }, Some(bytes)) => *available += i64::from(bytes),
            // An empty OKAY in delayed mode grants nothing; AOSP logs and ignores it.
            (SendCredit::Delayed { .. }, None) => {}
        }
    }
}

/// How a receiver grants credit in delayed-ack mode (the wire only sees OKAY
/// amounts, so any policy works with any peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreditPolicy {
    /// AOSP burst mode: a fixed grant at open (`Config::initial_credit`),
    /// returned as soon as bytes are flushed.
    Aosp,
    /// A window that starts at two packets and grows to twice the measured
    /// consumption rate times the round trip, never above `max_window`;
    /// OKAYs are coalesced unless they unblock the sender or at least double
    /// its usable credit (`docs/flow-control.md`).
    Adaptive { max_window: u32 },
}

/// The flow control one side offers, as chosen by `--credit` and the `credit`
/// config key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CreditMode {
    /// No `delayed_ack`: one WRTE in flight per stream.
    Classic,
    /// `delayed_ack` with AOSP's fixed 32 MiB credit per stream.
    Aosp,
    /// `delayed_ack` with the adaptive window.
    #[default]
    Adaptive,
}

impl CreditMode {
    /// Whether to advertise `delayed_ack`.
    pub fn delayed_ack(self) -> bool {
        self != CreditMode::Classic
    }

    /// The receiver policy used once `delayed_ack` is negotiated.
    pub fn policy(self) -> CreditPolicy {
        match self {
            CreditMode::Aosp => CreditPolicy::Aosp,
            CreditMode::Classic | CreditMode::Adaptive => CreditPolicy::Adaptive {
                max_window: AOSP_INITIAL_CREDIT,
            },
        }
    }
}

impl std::str::FromStr for CreditMode {
    type Err = String;

    fn from_str(text: &str) -> Result<CreditMode, String> {
        match text {
            "classic" => Ok(CreditMode::Classic),
            "aosp" => Ok(CreditMode::Aosp),
            "adaptive" => Ok(CreditMode::Adaptive),
            other => Err(format!(
                "unknown credit mode '{other}' (expected classic, aosp or adaptive)"
            )),
        }
    }
}

impl std::fmt::Display for CreditMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CreditMode::Classic => "classic",
            CreditMode::Aosp => "aosp",
            CreditMode::Adaptive => "adaptive",
        })
    }
}

/// Receiver-side accounting of one stream.
#[derive(Debug)]
pub struct RecvCredit {
    mode: RecvMode,
    received: u64,
    consumed: u64,
}

#[derive(Debug)]
enum RecvMode {
    /// One OKAY per WRTE, sent once the stream's backlog fits `local_buffer`.
    Classic {
        local_buffer: usize,
        owed_okays: u32,
    },
    /// Bytes count as "flushed" once they fit in the local buffer or the
    /// consumer has taken them: AOSP acknowledges after writing to its local
    /// socket, whose kernel buffer plays that role.
    Aosp {
        local_buffer: usize,
        acked: u64,
        /// The fixed grant announced at open.
        initial: u64,
    },
    Adaptive(AdaptiveWindow),
}

/// How an adaptive window is set up (see [`RecvCredit::adaptive`]).
#[derive(Debug, Clone)]
pub struct AdaptiveParams {
    /// The first grant, before anything was measured.
    pub initial: u64,
    /// The per-stream cap.
    pub max_window: u64,
    /// What the stream may always have outstanding, outside any budget:
    /// one packet, classic ADB's own guarantee, so no stream can starve.
    pub floor: u64,
    /// The process-wide budget the window draws from beyond its floor.
    pub budget: Option<Arc<MemoryBudget>>,
    /// Add headroom for clumped deliveries (seed 004).
    pub ack_headroom: bool,
}

/// The adaptive receive window of one stream.
#[derive(Debug)]
pub struct AdaptiveWindow {
    /// Bytes the sender may have outstanding beyond what was consumed.
    window: u64,
    max_window: u64,
    floor: u64,
    budget: Option<Arc<MemoryBudget>>,
    /// Bytes of `budget` this stream holds: its grant beyond the floor that
    /// the consumer has not taken yet.
    reserved: u64,
    /// `None` when headroom is switched off.
    headroom: Option<AckHeadroom>,
    /// Whether the consumer's last read emptied the buffer.
    consumer_kept_up: bool,
    /// Total bytes the sender may send: the initial grant plus every OKAY.
    granted: u64,
    /// Smallest round trip seen (ns): the open handshake, then each OKAY that
    /// unblocked an exhausted sender until the WRTE it released.
    min_rtt_ns: Option<u64>,
    /// When an OKAY released an exhausted sender (ns); the next WRTE ends the probe.
    probe_started_ns: Option<u64>,
    /// Start of the current rate interval: (time ns, consumed, received).
    rate_mark: (u64, u64, u64),
    /// Last measured consumption rate, bytes per second.
    rate: u64,
    /// Consumer stalls (see [`StallTracker`]).
    stalls: StallTracker,
}

/// A consumer that stops reading for a while (a file system flushing, a
/// process descheduled) and then drains its backlog faster than the link
/// refills it leaves the link idle for whatever part of the stall the
/// window did not cover: the simulator's usb3 link with 50 ms stalls ran
/// at 64% of its rate where AOSP's fixed 32 MiB reached 97%. Linux's
/// autotuning counts the drained backlog as one round trip's consumption
/// and doubles the buffer after every stall; we size the window for the
/// stall measured instead, and only once the consumer has shown it can
/// catch up (a slow consumer never empties its buffer, and a bigger window
/// would only hold more of its backlog).
#[derive(Debug, Clone, Default)]
struct StallTracker {
    /// When the consumer last took anything or, if it had taken everything,
    /// when more arrived (ns), and how much had been received by then.
    last_read: (u64, u64),
    /// When the sender ran out of credit (ns) and how much had been received.
    blocked: Option<(u64, u64)>,
    /// The window the last stall called for, applied once the consumer
    /// catches up.
    pending: u64,
}

/// Shortest interval over which the consumption rate is measured: shorter
/// ones see single packets arrive, not a rate.
const MIN_RATE_INTERVAL_NS: u64 = 1_000_000;

/// Seed 004 (BBR's ACK-aggregation estimate): when data arrives in clumps
/// (USB completions, Wi-Fi aggregation, a peer that batches OKAYs), a window
/// of exactly rate x RTT leaves the sender idle between clumps. Track the
/// bytes delivered beyond what the rate predicts since the current burst
/// began, keep a windowed maximum, and add it to the window.
#[derive(Debug, Clone, Default)]
struct AckHeadroom {
    epoch_start_ns: u64,
    epoch_bytes: u64,
    /// Windowed maximum in two slots of `SLOT_ROUND_TRIPS` each, as BBR keeps
    /// `extra_acked[2]` over ten round trips.
    slots: [u64; 2],
    current: usize,
    slot_started_ns: u64,
}

/// Round trips per headroom slot (BBR: `bbr_extra_acked_win_rtts` = 5).
const SLOT_ROUND_TRIPS: u64 = 5;
/// The cap on headroom in time at the measured rate (BBR: 100 ms).
const MAX_HEADROOM_NS: u64 = 100_000_000;

impl AckHeadroom {
    fn on_delivered(&mut self, bytes: u64, now_ns: u64, rate: u64, rtt_ns: u64, window: u64) {
        if now_ns.saturating_sub(self.slot_started_ns)
            >= SLOT_ROUND_TRIPS * rtt_ns.max(MIN_RATE_INTERVAL_NS)
        {
            self.current ^= 1;
            self.slots[self.current] = 0;
            self.slot_started_ns = now_ns;
        }
        let elapsed = now_ns.saturating_sub(self.epoch_start_ns);
        let mut expected = (rate as u128 * elapsed as u128 / 1_000_000_000) as u64;
        if self.epoch_bytes <= expected {
            // Delivery caught up with the rate: a new burst starts here.
            self.epoch_start_ns = now_ns;
            self.epoch_bytes = 0;
            expected = 0;
        }
        self.epoch_bytes += bytes;
        let extra = (self.epoch_bytes - expected).min(window);
        let slot = &mut self.slots[self.current];
        *slot = (*slot).max(extra);
    }

    fn restart_epoch(&mut self, now_ns: u64) {
        self.epoch_start_ns = now_ns;
        self.epoch_bytes = 0;
    }

    /// Capped by the window itself and by rate x 100 ms (seed 004).
    fn headroom(&self, rate: u64, window: u64) -> u64 {
        let by_time = (rate as u128 * MAX_HEADROOM_NS as u128 / 1_000_000_000) as u64;
        self.slots[0].max(self.slots[1]).min(window).min(by_time)
    }
}

impl RecvCredit {
    /// Classic mode (no delayed_ack): stop-and-wait OKAYs.
    pub fn classic(local_buffer: usize) -> RecvCredit {
        RecvCredit::with_mode(RecvMode::Classic {
            local_buffer,
            owed_okays: 0,
        })
    }

    /// AOSP burst mode with the fixed grant `initial` announced at open.
    pub fn aosp(local_buffer: usize, initial: u64) -> RecvCredit {
        RecvCredit::with_mode(RecvMode::Aosp {
            local_buffer,
            acked: 0,
            initial,
        })
    }

    /// Adaptive window starting at `params.initial` (clamped to the cap and
    /// to what the budget allows), at time `now_ns`.
    pub fn adaptive(params: AdaptiveParams, now_ns: u64) -> RecvCredit {
        let floor = params.floor.max(1);
        let max_window = params.max_window.max(floor);
        let mut window = params.initial.clamp(floor, max_window);
        let mut reserved = 0;
        if let Some(budget) = &params.budget {
            window = budget.allowed_window(window, floor);
            reserved = budget.reserve(window - floor);
            window = floor + reserved;
        }
        RecvCredit::with_mode(RecvMode::Adaptive(AdaptiveWindow {
            window,
            max_window,
            floor,
            budget: params.budget,
            reserved,
            headroom: params.ack_headroom.then(AckHeadroom::default),
            consumer_kept_up: true,
            granted: window,
            min_rtt_ns: None,
            probe_started_ns: None,
            rate_mark: (now_ns, 0, 0),
            rate: 0,
            stalls: StallTracker {
                last_read: (now_ns, 0),
                ..StallTracker::default()
            },
        }))
    }

    fn with_mode(mode: RecvMode) -> RecvCredit {
        RecvCredit {
            mode,
            received: 0,
            consumed: 0,
        }
    }

    /// The grant announced at open (OPEN.arg1 or the accepting OKAY), for the
    /// adaptive window; the other modes use the configured fixed credit.
    pub fn initial_grant(&self) -> Option<u64> {
        match &self.mode {
            RecvMode::Adaptive(adaptive) => Some(adaptive.granted),
            _ => None,
        }
    }

    pub fn buffered(&self) -> usize {
        (self.received - self.consumed) as usize
    }

    /// The window grants aim for now (adaptive), for statistics.
    pub fn window(&self) -> Option<u64> {
        match &self.mode {
            RecvMode::Adaptive(adaptive) => Some(adaptive.allowed_window()),
            _ => None,
        }
    }

    /// Granted and not yet consumed (adaptive): the sender may have this much
    /// in flight, plus the one packet it may overshoot by.
    pub fn credit_outstanding(&self) -> Option<u64> {
        match &self.mode {
            RecvMode::Adaptive(adaptive) => Some(adaptive.granted.saturating_sub(self.consumed)),
            _ => None,
        }
    }

    /// Smallest round trip measured so far (adaptive), in nanoseconds.
    pub fn min_rtt_ns(&self) -> Option<u64> {
        match &self.mode {
            RecvMode::Adaptive(adaptive) => adaptive.min_rtt_ns,
            _ => None,
        }
    }

    /// Last measured consumption rate (adaptive), bytes per second.
    pub fn rate(&self) -> Option<u64> {
        match &self.mode {
            RecvMode::Adaptive(adaptive) => Some(adaptive.rate),
            _ => None,
        }
    }

    /// Starts a round-trip probe, ended by the peer's next OKAY to our OPEN
    /// or its next WRTE.
    pub fn start_rtt_probe(&mut self, now_ns: u64) {
        if let RecvMode::Adaptive(adaptive) = &mut self.mode {
            adaptive.probe_started_ns = Some(now_ns);
        }
    }

    /// Ends a round-trip probe, if one is running.
    pub fn end_rtt_probe(&mut self, now_ns: u64) {
        if let RecvMode::Adaptive(adaptive) = &mut self.mode {
            if let Some(started) = adaptive.probe_started_ns.take() {
                adaptive.rtt_sample(now_ns.saturating_sub(started));
            }
        }
    }

    /// Whether the peer may send `bytes` more now: classic peers wait for
    /// our OKAY after each WRTE; delayed-ack peers stay within what we
    /// granted, overshooting by less than one packet of `max_packet`. `Err`
    /// says by how much a WRTE broke that.
    pub fn admit(&self, bytes: usize, max_packet: usize) -> Result<(), String> {
        let after = self.received + bytes as u64;
        let granted = match &self.mode {
            RecvMode::Classic { owed_okays, .. } => {
                if *owed_okays > 0 {
                    return Err(format!(
                        "classic mode, a WRTE before our OKAY for the last one ({} bytes unread)",
                        self.buffered()
                    ));
                }
                return Ok(());
            }
            RecvMode::Aosp { acked, initial, .. } => initial + acked,
            RecvMode::Adaptive(adaptive) => adaptive.granted,
        };
        if after > granted + max_packet as u64 {
            return Err(format!(
                "{after} bytes received against {granted} granted (and one {max_packet}-byte packet)"
            ));
        }
        Ok(())
    }

    pub fn on_received(&mut self, bytes: usize, now_ns: u64) {
        let backlog = self.buffered() as u64;
        self.received += bytes as u64;
        match &mut self.mode {
            RecvMode::Classic { owed_okays, .. } => *owed_okays += 1,
            RecvMode::Adaptive(adaptive) => {
                adaptive.on_delivered(bytes as u64, backlog, now_ns);
                if backlog == 0 {
                    // The consumer cannot read what is not there: its wait
                    // for a read starts now. This packet arrived whole, so
                    // the rate of what follows leaves it out.
                    adaptive.stalls.last_read = (now_ns, self.received);
                }
                if self.received >= adaptive.granted && adaptive.stalls.blocked.is_none() {
                    adaptive.stalls.blocked = Some((now_ns, self.received));
                }
            }
            RecvMode::Aosp { .. } => {}
        }
        self.end_rtt_probe(now_ns);
    }

    pub fn on_consumed(&mut self, bytes: usize, now_ns: u64) {
        let backlog = self.buffered() as u64;
        self.consumed += bytes as u64;
        if let RecvMode::Adaptive(adaptive) = &mut self.mode {
            adaptive.measure_rate(self.consumed, self.received, now_ns);
            adaptive.consumer_kept_up = self.consumed == self.received;
            let caught_up = adaptive.consumer_kept_up;
            adaptive.size_for_stalls(backlog, caught_up, self.received, now_ns);
            adaptive.release_consumed(self.consumed);
        }
    }

    /// Whether the sender has no credit left because our consumer has not
    /// taken what arrived (the stream waits on the consumer).
    pub fn withholding(&self) -> bool {
        match &self.mode {
            RecvMode::Classic { owed_okays, .. } => *owed_okays > 0,
            RecvMode::Aosp { acked, initial, .. } => self.received >= initial + acked,
            RecvMode::Adaptive(adaptive) => self.received >= adaptive.granted,
        }
    }

    /// Headroom currently added to the adaptive window (statistics).
    pub fn headroom(&self) -> Option<u64> {
        match &self.mode {
            RecvMode::Adaptive(adaptive) => Some(adaptive.headroom()),
            _ => None,
        }
    }

    /// The OKAYs to send now: `None` entries are classic empty OKAYs, `Some(n)`
    /// delayed-ack OKAYs carrying `n` acknowledged bytes.
    pub fn take_okays(&mut self, out: &mut Vec<Option<i32>>, now_ns: u64) {
        let buffered = self.buffered();
        match &mut self.mode {
            RecvMode::Classic {
                local_buffer,
                owed_okays,
            } => {
                if buffered <= *local_buffer {
                    out.extend(std::iter::repeat_n(None, *owed_okays as usize));
                    *owed_okays = 0;
                }
            }
            RecvMode::Aosp {
                local_buffer,
                acked,
                ..
            } => {
                // Return what is flushed and not yet returned (AOSP returns
                // credit per flush); bytes beyond the local buffer wait for
                // the consumer.
                let overflow = buffered.saturating_sub(*local_buffer) as u64;
                let flushed = self.received - overflow;
                let owed = flushed.saturating_sub(*acked);
                *acked = (*acked).max(flushed);
                push_okays(out, owed);
            }
            RecvMode::Adaptive(adaptive) => {
                let desired = self.consumed + adaptive.allowed_window();
                if desired <= adaptive.granted {
                    return;
                }
                let mut increase = desired - adaptive.granted;
                // What the sender can still send; negative after its one
                // allowed overshoot.
                let usable = adaptive.granted as i64 - self.received as i64;
                // Seed 002 (smoltcp): coalesce, except an update that
                // unblocks the sender or at least doubles its usable credit.
                if usable > 0 && (increase as i64) < usable {
                    return;
                }
                // An update that leaves the sender still blocked (after its
                // one-packet overshoot, a slow consumer frees a few KiB at a
                // time) only costs a packet: wait until it unblocks. Without
                // this a 256 MiB push over a 50 ms WAN into a slow consumer
                // sent 53,466 OKAYs (classic: 256).
                if usable + (increase as i64) <= 0 {
                    return;
                }
                // The budget has the last word: beyond the floor, a grant is
                // only as large as what is left of it.
                increase = adaptive.reserve_for_grant(increase, self.consumed);
                if increase == 0 {
                    return;
                }
                if usable <= 0 && adaptive.probe_started_ns.is_none() {
                    // The sender is waiting for exactly this OKAY: its next
                    // WRTE times one round trip.
                    adaptive.probe_started_ns = Some(now_ns);
                }
                adaptive.granted += increase;
                if self.received < adaptive.granted {
                    adaptive.stalls.blocked = None;
                }
                push_okays(out, increase);
            }
        }
    }
}

/// OKAY amounts are i32 on the wire.
fn push_okays(out: &mut Vec<Option<i32>>, mut owed: u64) {
    while owed > 0 {
        let chunk = owed.min(i32::MAX as u64);
        out.push(Some(chunk as i32));
        owed -= chunk;
    }
}

impl AdaptiveWindow {
    fn headroom(&self) -> u64 {
        self.headroom
            .as_ref()
            .map_or(0, |h| h.headroom(self.rate, self.window))
    }

    /// The window grants aim for: the measured window plus headroom, capped
    /// per stream and shrunk by budget pressure.
    fn allowed_window(&self) -> u64 {
        let wish = (self.window + self.headroom()).min(self.max_window);
        match &self.budget {
            Some(budget) => budget.allowed_window(wish, self.floor),
            None => wish,
        }
    }

    /// `backlog`: what the consumer had not taken when these bytes arrived.
    fn on_delivered(&mut self, bytes: u64, backlog: u64, now_ns: u64) {
        let (Some(headroom), Some(rtt)) = (self.headroom.as_mut(), self.min_rtt_ns) else {
            return;
        };
        if backlog > self.floor || !self.consumer_kept_up {
            // The consumer, not the link, is the bottleneck: data bunching up
            // behind it is no sign of clumped delivery, and headroom would
            // only hold more of it (the simulator's slow consumer buffered
            // 5 MiB instead of 3 until this check).
            headroom.restart_epoch(now_ns);
            return;
        }
        if self.rate > 0 {
            headroom.on_delivered(bytes, now_ns, self.rate, rtt, self.window);
        }
    }

    /// Grant beyond the floor what the consumer has not taken: that is what
    /// this stream holds of the budget.
    fn beyond_floor(&self, granted: u64, consumed: u64) -> u64 {
        granted.saturating_sub(consumed).saturating_sub(self.floor)
    }

    /// Reserves budget for a grant of `increase` bytes; returns the grant the
    /// budget allows (all of it without a budget).
    fn reserve_for_grant(&mut self, increase: u64, consumed: u64) -> u64 {
        let Some(budget) = &self.budget else {
            return increase;
        };
        let target = self.beyond_floor(self.granted + increase, consumed);
        let need = target.saturating_sub(self.reserved);
        let got = budget.reserve(need);
        self.reserved += got;
        increase - (need - got)
    }

    fn release_consumed(&mut self, consumed: u64) {
        let Some(budget) = &self.budget else {
            return;
        };
        let target = self.beyond_floor(self.granted, consumed);
        if target < self.reserved {
            budget.release(self.reserved - target);
            self.reserved = target;
        }
    }

    fn rtt_sample(&mut self, rtt_ns: u64) {
        let rtt_ns = rtt_ns.max(1);
        self.min_rtt_ns = Some(self.min_rtt_ns.map_or(rtt_ns, |min| min.min(rtt_ns)));
    }

    /// Linux-style receive-buffer autotuning: once per interval of at least a
    /// round trip, the window grows to twice the bytes consumed per round
    /// trip (rate x RTT is what must be in flight; twice leaves room for the
    /// rate to double before the next measurement). It never shrinks here.
    fn measure_rate(&mut self, consumed: u64, received: u64, now_ns: u64) {
        let Some(rtt) = self.min_rtt_ns else {
            return;
        };
        let (mark_ns, mark_consumed, mark_received) = self.rate_mark;
        let elapsed = now_ns.saturating_sub(mark_ns);
        if elapsed < rtt.max(MIN_RATE_INTERVAL_NS) {
            return;
        }
        // What both the link delivered and the consumer took: a consumer
        // draining a backlog after a stall reads faster than anything can
        // arrive, and counting that ratcheted the window up to its cap (the
        // simulator's stalling consumer on usb3: 1.57 GB/s "measured" on a
        // 614 MB/s link, window doubled after every stall).
        let moved = (consumed - mark_consumed).min(received - mark_received);
        self.rate = (moved as u128 * 1_000_000_000 / elapsed as u128) as u64;
        self.rate_mark = (now_ns, consumed, received);
        let target = 2 * self.rate as u128 * rtt as u128 / 1_000_000_000;
        self.grow_to(target.min(u64::MAX as u128) as u64);
    }

    /// Raises the window towards `target`, never above the cap; seed 003:
    /// above the comfortable level of the budget, windows stop growing.
    fn grow_to(&mut self, target: u64) {
        if self
            .budget
            .as_ref()
            .is_some_and(|b| b.pressure() > Pressure::Comfortable)
        {
            return;
        }
        self.window = self.window.max(target.min(self.max_window));
    }

    /// Called for every read: `backlog` is what the consumer had not taken
    /// before it, `caught_up` whether it emptied the buffer, `received` the
    /// bytes received so far.
    fn size_for_stalls(&mut self, backlog: u64, caught_up: bool, received: u64, now_ns: u64) {
        let (last_read_ns, received_then) =
            std::mem::replace(&mut self.stalls.last_read, (now_ns, received));
        let Some(rtt) = self.min_rtt_ns else {
            return;
        };
        let gap = now_ns.saturating_sub(last_read_ns);
        // A gap with data waiting, during which the sender ran out of
        // credit, is a stall the window did not cover. The rate at which the
        // window filled is the link's (the sender had credit and the
        // consumer had kept up), measured over at least a round trip so
        // that a packet arriving whole does not inflate it.
        if let Some((blocked_ns, received_by_then)) = self.stalls.blocked {
            if backlog > 0 && gap > rtt.max(MIN_RATE_INTERVAL_NS) && blocked_ns >= last_read_ns {
                let filled = received_by_then.saturating_sub(received_then) as u128;
                let fill_ns = (blocked_ns - last_read_ns).max(rtt) as u128;
                let covers = filled * (gap + rtt) as u128 / fill_ns;
                self.stalls.pending = self.stalls.pending.max(covers.min(u64::MAX as u128) as u64);
            }
        }
        if caught_up && self.stalls.pending > 0 {
            let target = std::mem::take(&mut self.stalls.pending);
            // A stall the cap cannot cover would hold a cap's worth of memory
            // for a fraction of the gain (loopback: 50 ms at 4 GB/s is 200 MB).
            if target <= self.max_window {
                self.grow_to(target);
            }
        }
    }
}

impl Drop for AdaptiveWindow {
    fn drop(&mut self) {
        // A closed stream's grant is no longer anyone's memory.
        if let Some(budget) = &self.budget {
            budget.release(self.reserved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An adaptive window with no budget and no headroom: the rules alone.
    fn adaptive(initial: u64, max_window: u64) -> RecvCredit {
        RecvCredit::adaptive(
            AdaptiveParams {
                initial,
                max_window,
                floor: 1,
                budget: None,
                ack_headroom: false,
            },
            0,
        )
    }

    #[test]
    fn classic_sender_is_stop_and_wait() {
        let mut credit = SendCredit::Classic { in_flight: false };
        assert!(credit.can_send());
        credit.on_sent(100);
        assert!(!credit.can_send());
        credit.on_okay(None);
        assert!(credit.can_send());
    }

    #[test]
    fn delayed_sender_overshoots_by_one_packet_then_stops() {
        let mut credit = SendCredit::Delayed { available: 1000 };
        credit.on_sent(600);
        assert!(credit.can_send());
        credit.on_sent(600);
        assert_eq!(credit, SendCredit::Delayed { available: -200 });
        assert!(!credit.can_send());
        credit.on_okay(Some(100));
        assert!(!credit.can_send());
        credit.on_okay(Some(101));
        assert!(credit.can_send());
        credit.on_okay(Some(-500));
        assert!(!credit.can_send());
        credit.on_okay(None);
        assert_eq!(credit, SendCredit::Delayed { available: -499 });
    }

    #[test]
    fn classic_receiver_acks_each_packet_once_buffered_fits() {
        let mut credit = RecvCredit::classic(100);
        let mut out = Vec::new();
        credit.on_received(60, 0);
        credit.take_okays(&mut out, 0);
        assert_eq!(out, vec![None]);
        out.clear();
        credit.on_received(60, 0);
        credit.take_okays(&mut out, 0);
        assert!(
            out.is_empty(),
            "120 bytes buffered exceed the 100-byte local buffer"
        );
        credit.on_consumed(60, 0);
        credit.take_okays(&mut out, 0);
        assert_eq!(out, vec![None]);
    }

    #[test]
    fn delayed_receiver_returns_flushed_bytes() {
        let mut credit = RecvCredit::aosp(100, 1 << 20);
        let mut out = Vec::new();
        credit.on_received(80, 0);
        credit.take_okays(&mut out, 0);
        assert_eq!(out, vec![Some(80)]);
        out.clear();
        credit.on_received(50, 0);
        credit.on_received(50, 0);
        credit.take_okays(&mut out, 0);
        assert_eq!(
            out,
            vec![Some(20)],
            "only what fits the 100-byte buffer is flushed"
        );
        out.clear();
        credit.on_consumed(100, 0);
        credit.take_okays(&mut out, 0);
        assert_eq!(out, vec![Some(80)]);
        out.clear();
        credit.take_okays(&mut out, 0);
        assert!(out.is_empty(), "nothing new to return");
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn adaptive_coalesces_until_the_update_doubles_usable_credit() {
        let mut credit = adaptive(1000, 1 << 20);
        assert_eq!(credit.initial_grant(), Some(1000));
        let mut out = Vec::new();
        credit.on_received(300, 0);
        credit.on_consumed(300, 0);
        credit.take_okays(&mut out, 0);
        assert!(out.is_empty(), "300 more would not double 700 usable");
        credit.on_received(300, 0);
        credit.on_consumed(300, 0);
        credit.take_okays(&mut out, 0);
        assert_eq!(out, vec![Some(600)], "600 more doubles the 400 usable");
    }

    #[test]
    fn adaptive_unblocks_an_exhausted_sender_at_once() {
        let mut credit = adaptive(1000, 1 << 20);
        let mut out = Vec::new();
        // The sender used its whole grant (and overshot by one packet).
        credit.on_received(1100, 0);
        credit.take_okays(&mut out, 0);
        assert!(out.is_empty(), "nothing consumed: nothing to grant");
        credit.on_consumed(150, 0);
        credit.take_okays(&mut out, 0);
        assert_eq!(out, vec![Some(150)], "any credit unblocks the sender");
    }

    #[test]
    fn adaptive_stalled_consumer_bounds_what_arrives() {
        let mut credit = adaptive(1000, 1 << 20);
        let mut out = Vec::new();
        credit.on_received(1000, 0);
        for t in 1..100 {
            credit.take_okays(&mut out, t * MS);
        }
        assert!(out.is_empty(), "no credit while nothing is consumed");
        assert_eq!(credit.buffered(), 1000);
    }

    #[test]
    fn adaptive_window_grows_to_twice_rate_times_rtt_and_stops_at_the_cap() {
        let mut credit = adaptive(1 << 20, 64 << 20);
        let mut out = Vec::new();
        // Open handshake: 10 ms round trip.
        credit.start_rtt_probe(0);
        credit.end_rtt_probe(10 * MS);
        assert_eq!(credit.min_rtt_ns(), Some(10 * MS));
        // 100 MB/s consumed over 20 ms: 2 x 100 MB/s x 10 ms = 2 MB.
        credit.on_received(2_000_000, 20 * MS);
        credit.on_consumed(2_000_000, 30 * MS);
        credit.take_okays(&mut out, 30 * MS);
        assert_eq!(credit.rate(), Some(2_000_000 * 1000 / 30));
        let window = credit.window().unwrap();
        assert!(
            (1_300_000..1_400_000).contains(&window),
            "2 x 66.7 MB/s x 10 ms, got {window}"
        );
        // A much faster consumer later: capped at max_window.
        credit.on_received(1 << 30, 40 * MS);
        credit.on_consumed(1 << 30, 50 * MS);
        assert_eq!(credit.window(), Some(64 << 20));
    }

    #[test]
    fn adaptive_rtt_probe_times_the_okay_that_unblocked_the_sender() {
        let mut credit = adaptive(1000, 1 << 20);
        let mut out = Vec::new();
        credit.on_received(1000, MS);
        credit.on_consumed(1000, 2 * MS);
        credit.take_okays(&mut out, 2 * MS);
        assert_eq!(out, vec![Some(1000)]);
        credit.on_received(500, 7 * MS);
        assert_eq!(credit.min_rtt_ns(), Some(5 * MS));
    }

    #[test]
    fn windows_sharing_a_budget_never_commit_more_than_it() {
        let limit = 1 << 20;
        let floor = 4096;
        let budget = Arc::new(MemoryBudget::new(crate::BudgetLimits::from_limit(limit)));
        let mut streams: Vec<RecvCredit> = (0..20)
            .map(|_| {
                RecvCredit::adaptive(
                    AdaptiveParams {
                        initial: 256 * 1024,
                        max_window: 32 << 20,
                        floor,
                        budget: Some(budget.clone()),
                        ack_headroom: true,
                    },
                    0,
                )
            })
            .collect();
        let mut okays = Vec::new();
        for round in 0..200u64 {
            let now = round * 1_000_000;
            for (i, credit) in streams.iter_mut().enumerate() {
                // Every sender uses all its credit; consumers take a share
                // that differs by stream, some nothing at all.
                let outstanding = credit.credit_outstanding().unwrap();
                let unreceived = outstanding - credit.buffered() as u64;
                credit.on_received(unreceived as usize, now);
                let take = credit.buffered() * (i % 4) / 4;
                credit.on_consumed(take, now);
                okays.clear();
                credit.take_okays(&mut okays, now);
            }
            let committed: u64 = streams
                .iter()
                .map(|c| c.credit_outstanding().unwrap())
                .sum();
            assert!(
                committed <= limit + 20 * floor,
                "round {round}: {committed} granted and unconsumed over a budget of {limit}"
            );
        }
        assert!(budget.peak() <= limit);
        drop(streams);
        assert_eq!(budget.committed(), 0, "every stream returned its share");
    }

    /// Data that arrives in clumps (8 ms of it at once, every 8 ms, over a
    /// 1 ms round trip) earns headroom up to the window; steady arrivals at
    /// the same rate earn none.
    #[test]
    fn clumped_arrivals_earn_headroom_and_steady_ones_do_not() {
        let run = |clumped: bool| {
            let mut credit = RecvCredit::adaptive(
                AdaptiveParams {
                    initial: 64 * 1024,
                    max_window: 32 << 20,
                    floor: 16 * 1024,
                    budget: None,
                    ack_headroom: true,
                },
                0,
            );
            credit.start_rtt_probe(0);
            credit.end_rtt_probe(1_000_000);
            // 100 MB/s: 100 bytes per microsecond.
            let mut okays = Vec::new();
            for tick in 1..4000u64 {
                // Ticks of 100 us.
                let now = tick * 100_000;
                let bytes = if !clumped {
                    10_000
                } else if tick % 80 == 0 {
                    800_000
                } else {
                    0
                };
                if bytes > 0 {
                    credit.on_received(bytes, now);
                    credit.on_consumed(bytes, now);
                }
                credit.take_okays(&mut okays, now);
            }
            credit.headroom().unwrap()
        };
        let (steady, clumped) = (run(false), run(true));
        // The measured window is 2 x 100 MB/s x 1 ms = 200 kB, which also
        // caps the headroom (seed 004: never more than the window itself).
        assert!(steady <= 20_000, "steady arrivals earned {steady}");
        assert_eq!(clumped, 200_000, "clumps of 800 kB earned {clumped}");
    }

    /// After the sender's one-packet overshoot, a consumer that frees a
    /// little at a time gets no OKAY until the sender can send again.
    #[test]
    fn adaptive_sends_no_update_that_leaves_the_sender_blocked() {
        let mut credit = adaptive(1000, 1 << 20);
        let mut okays = Vec::new();
        credit.on_received(1500, 0);
        credit.on_consumed(100, 0);
        credit.take_okays(&mut okays, 0);
        assert!(okays.is_empty(), "still 400 bytes short: {okays:?}");
        credit.on_consumed(1400, 0);
        credit.take_okays(&mut okays, 0);
        assert_eq!(okays, vec![Some(1500)], "unblocked with the whole window");
    }

    /// A consumer that reads nothing for 50 ms and then drains its backlog
    /// at once gets a window that covers the stall at the rate the window
    /// filled; one that then reads slowly, never catching up with a sender
    /// that refills whatever it frees, does not.
    #[test]
    fn a_stall_the_consumer_catches_up_from_sizes_the_window() {
        let run = |read_per_ms: usize| {
            let mut credit = adaptive(1 << 20, 64 << 20);
            let mut okays = Vec::new();
            credit.start_rtt_probe(0);
            credit.end_rtt_probe(MS);
            // 1 MiB arrives over 4 ms (262 kB/ms) and sits unread: the
            // sender is out of credit at 4 ms, the consumer stalls to 50 ms.
            for t in 1..=4 {
                credit.on_received(1 << 18, t * MS);
            }
            let mut sender_credit = 0;
            for t in 50..100 {
                let take = credit.buffered().min(read_per_ms);
                credit.on_consumed(take, t * MS);
                okays.clear();
                credit.take_okays(&mut okays, t * MS);
                // The sender spends its grants at the link's 262 kB/ms.
                sender_credit += okays.iter().map(|o| o.unwrap() as usize).sum::<usize>();
                let sent = sender_credit.min(1 << 18);
                if sent > 0 {
                    sender_credit -= sent;
                    credit.on_received(sent, (t + 1) * MS);
                }
            }
            credit.window().unwrap()
        };
        // 262 kB/ms x (49 ms waited + 1 ms round trip) = 13.1 MB.
        let fast = run(usize::MAX);
        assert!(
            (13_000_000..13_300_000).contains(&fast),
            "the stall called for 13.1 MB, got {fast}"
        );
        let slow = run(1 << 14);
        assert!(slow <= 1 << 20, "a slow drain is no stall: window {slow}");
    }

    /// A backlog read at once after a stall is not a rate the link delivered.
    #[test]
    fn adaptive_rate_counts_what_arrived_not_a_drained_backlog() {
        let mut credit = adaptive(1 << 20, 64 << 20);
        credit.start_rtt_probe(0);
        credit.end_rtt_probe(1_000_000);
        // 1 MiB arrives within the first millisecond and sits unread...
        credit.on_received(1 << 20, 1_000_000);
        credit.on_consumed(1, 1_000_000);
        // ...then, 1 ms later with nothing more arriving, all of it is read
        // in one go: 1 GB/s of reading, nothing delivered.
        credit.on_consumed((1 << 20) - 1, 2_000_000);
        let rate = credit.rate().unwrap();
        assert!(
            rate < 1_000_000,
            "nothing arrived in that millisecond, measured {rate} B/s"
        );
    }

    /// Property (seed 002): after `take_okays`, no update that would unblock
    /// the sender or at least double its usable credit is left pending,
    /// whatever the order of arrivals, reads and clock, with or without
    /// headroom. 2000 seeded runs of 300 random steps.
    #[test]
    fn a_significant_window_update_is_never_held_back() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            seed.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        };
        for run in 0..2000 {
            let packet = 1 + next(64 * 1024);
            let mut credit = RecvCredit::adaptive(
                AdaptiveParams {
                    initial: 2 * packet,
                    max_window: 2 * packet + next(8 << 20),
                    floor: packet,
                    budget: None,
                    ack_headroom: next(2) == 0,
                },
                0,
            );
            let (mut now, mut received, mut consumed) = (0u64, 0u64, 0u64);
            let mut granted = credit.credit_outstanding().unwrap();
            let mut okays = Vec::new();
            credit.start_rtt_probe(0);
            for _ in 0..300 {
                now += next(2_000_000);
                if next(2) == 0 {
                    // The sender sends while it has credit, a packet at most.
                    if granted > received {
                        let bytes = (1 + next(packet)).min(packet);
                        credit.on_received(bytes as usize, now);
                        received += bytes;
                    }
                } else if received > consumed {
                    let bytes = 1 + next(received - consumed);
                    credit.on_consumed(bytes as usize, now);
                    consumed += bytes;
                }
                okays.clear();
                credit.take_okays(&mut okays, now);
                granted += okays.iter().map(|o| o.unwrap() as u64).sum::<u64>();
                assert_eq!(credit.credit_outstanding(), Some(granted - consumed));
                let usable = granted as i64 - received as i64;
                let desired = consumed + credit.window().unwrap();
                let increase = desired.saturating_sub(granted) as i64;
                assert!(
                    !(usable <= 0 && usable + increase > 0),
                    "run {run}: an unblocking update of {increase} is pending (usable {usable})"
                );
                assert!(
                    !(usable > 0 && increase >= usable),
                    "run {run}: an update of {increase} doubling usable {usable} is pending"
                );
            }
        }
    }
}
