//! The adaptive window (the default policy): grown from the measured rate
//! and round trip, with headroom for clumped deliveries, drawn from the
//! process's memory budget (`docs/flow-control.md`, "Adaptive credit").

use std::sync::Arc;

use super::headroom::AckHeadroom;
use super::slow_start::SlowStart;
use super::stall::StallTracker;
use super::{admit_within, push_okays, Counts, ReceivePolicy};
use crate::budget::{MemoryBudget, Pressure};
use crate::recent_samples::RecentSamples;

/// How an adaptive window is set up (see [`RecvCredit::adaptive`]).
#[derive(Debug, Clone)]
pub struct AdaptiveParams {
    /// The first grant, before anything was measured.
    pub initial: u64,
    /// The per-stream cap.
    pub max_window: u64,
    /// What the stream may always have outstanding, whatever the budget
    /// says: one packet, classic ADB's own guarantee, so no stream can
    /// starve. It is charged to the budget all the same.
    pub floor: u64,
    /// The process-wide budget the window draws from.
    pub budget: Option<Arc<MemoryBudget>>,
    /// Add headroom for clumped deliveries (docs/flow-control.md,
    /// "Headroom for clumps").
    pub ack_headroom: bool,
    /// Ramp like TCP's slow start while the rate grows ([`SlowStart`]).
    pub slow_start: bool,
}

/// The adaptive receive window of one stream.
#[derive(Debug)]
pub struct AdaptiveWindow {
    /// Bytes the sender may have outstanding beyond what was consumed.
    window: u64,
    max_window: u64,
    floor: u64,
    budget: Option<Arc<MemoryBudget>>,
    /// Bytes of `budget` this stream holds: [`AdaptiveWindow::held`].
    reserved: u64,
    /// Bytes the consumer took of the packet it is reading: the packet's
    /// allocation holds them until it has taken the rest.
    pinned: u64,
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
    /// The ramp while the rate grows (see [`SlowStart`]).
    ramp: SlowStart,
    /// The last [`RECENT_RATE_SAMPLES`] consumption rates.
    recent_rates: RecentSamples<RECENT_RATE_SAMPLES>,
    /// The largest packet the sender has sent.
    largest_packet: u64,
    /// Whether the ramp or a consumer stall ever grew the window: the path
    /// needed more than the opening guess, so the window never settles
    /// within a packet (see [`AdaptiveWindow::settle_within_a_packet`]).
    grown_for_path: bool,
}

/// Shortest interval over which the consumption rate is measured: shorter
/// ones see single packets arrive, not a rate.
const MIN_RATE_INTERVAL_NS: u64 = 1_000_000;

/// The window over what the measured rate moves in the smallest round
/// trip. TCP under BBR keeps up to twice that in flight (its cwnd gain)
/// and must have more queued behind it, or it turns application-limited
/// and its bandwidth samples stop counting: at twice, a 256 MiB pull over a
/// 1 Gbit/s, 50 ms link of 1500-byte frames ran at 0.97 of AOSP's fixed
/// credit (medians of eight, 84 to 91 MB/s), at three times 0.99 (87 to
/// 92). Linux sizes a receive buffer at twice what is copied per smoothed
/// round trip, which a queue at the bottleneck lengthens beyond the
/// smallest one (tcp_input.c, `tcp_rcv_space_adjust`).
pub(crate) const RATE_GAIN: u128 = 3;

/// Shortest consumer stall the window is sized for (`stall.rs`). A
/// consumer held off the CPU for a few scheduler slices stalled because
/// the CPU was busy, on loopback with the sender's and the kernel's side of
/// the same transfer: a window covering that only moves the data through
/// memory instead of cache. Covered, such gaps grew loopback pulls' windows
/// to 8 to 11 MiB (docs/benchmarks.md, "Burst pulls on loopback"); a file
/// system flushing stalls for tens of milliseconds.
pub(crate) const MIN_STALL_NS: u64 = 10_000_000;

/// Rate samples whose median decides whether a packet covers the round
/// trip: single samples over 1 ms on loopback spread from 0.9 to 6 GB/s (a
/// read that takes several packets at once), and neither a high one nor a
/// low one may decide.
const RECENT_RATE_SAMPLES: usize = 8;

/// The longest round trip over which a window settles within a packet: a
/// packet moves in under a millisecond there (loopback, vsock), where the
/// copies, not the link, set the pace. On a network path a spell of low
/// samples (TCP still starting, a loss being repaired) looks the same, and
/// a settled window there recovers only as fast as the rate rule grows it:
/// a 50 ms push fell from 0.98 to 0.92 of iperf3 without this bound.
const MAX_SETTLING_RTT_NS: u64 = 1_000_000;

/// The smallest window a stream settles at within a packet: one sync `DATA`
/// frame. The sender still sends a whole packet per grant.
pub(crate) const MIN_SETTLED_WINDOW: u64 = 64 * 1024;

/// The largest window grown to cover a consumer stall: AOSP's fixed credit,
/// which covered the simulator's 50 ms stalls on usb3 (21 MiB). The
/// link's own need (rate x round trip) may grow beyond it; a stall's may
/// not, or loopback's 50 ms stalls at 4 GB/s would pin 200 MB a stream.
const MAX_STALL_WINDOW: u64 = super::AOSP_INITIAL_CREDIT as u64;

impl AdaptiveWindow {
    /// See [`RecvCredit::adaptive`](super::RecvCredit::adaptive).
    pub(crate) fn new(params: AdaptiveParams, now_ns: u64) -> AdaptiveWindow {
        let floor = params.floor.max(1);
        let max_window = params.max_window.max(floor);
        let mut window = params.initial.clamp(floor, max_window);
        let mut reserved = 0;
        if let Some(budget) = &params.budget {
            window = budget.allowed_window(window, floor);
            budget.charge(floor);
            reserved = floor + budget.reserve(window - floor);
            window = reserved;
        }
        AdaptiveWindow {
            window,
            max_window,
            floor,
            budget: params.budget,
            reserved,
            pinned: 0,
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
            ramp: SlowStart::new(params.slow_start, now_ns),
            recent_rates: RecentSamples::default(),
            largest_packet: 0,
            grown_for_path: false,
        }
    }
}

impl ReceivePolicy for AdaptiveWindow {
    fn admit(&self, counts: Counts, bytes: usize, max_packet: usize) -> Result<(), String> {
        admit_within(counts, bytes, self.granted, max_packet)
    }

    fn on_received(&mut self, bytes: usize, backlog: u64, counts: Counts, now_ns: u64) {
        let adaptive = self;
        adaptive.largest_packet = adaptive.largest_packet.max(bytes as u64);
        adaptive.on_delivered(bytes as u64, backlog, now_ns);
        if backlog == 0 {
            // The consumer cannot read what is not there: its wait
            // for a read starts now. This packet arrived whole, so
            // the rate of what follows leaves it out.
            adaptive.stalls.last_read = (now_ns, counts.received);
        }
        if counts.received >= adaptive.granted && adaptive.stalls.blocked.is_none() {
            adaptive.stalls.blocked = Some((now_ns, counts.received));
        }
        if let Some(rtt) = adaptive.min_rtt_ns {
            adaptive.ramp.on_received(counts.received, now_ns, rtt);
        }
        // A sender's overshoot beyond its grant is held now.
        adaptive.settle(counts);
    }

    fn on_consumed(&mut self, backlog: u64, counts: Counts, now_ns: u64) {
        let adaptive = self;
        adaptive.measure_rate(counts.consumed, counts.received, now_ns);
        adaptive.consumer_kept_up = counts.consumed == counts.received;
        let caught_up = adaptive.consumer_kept_up;
        // More than a packet waiting for over a round trip: the consumer,
        // not the window, sets the pace from here (slow_start.rs).
        if let Some(rtt) = adaptive.min_rtt_ns {
            let floor = adaptive.floor;
            let left = counts.received - counts.consumed > floor;
            let waited = now_ns.saturating_sub(adaptive.stalls.last_read.0);
            adaptive
                .ramp
                .on_backlog(backlog > floor, left, waited, now_ns, rtt);
        }
        if let Some(target) = adaptive.ramp.on_consumed(caught_up) {
            adaptive.grow_for_path(target);
        }
        adaptive.size_for_stalls(backlog, caught_up, counts.received, now_ns);
        adaptive.settle(counts);
    }

    fn set_pinned(&mut self, pinned: u64) {
        self.pinned = pinned;
    }

    fn withholding(&self, counts: Counts) -> bool {
        counts.received >= self.granted
    }

    fn take_okays(&mut self, out: &mut Vec<Option<i32>>, counts: Counts, now_ns: u64) {
        let adaptive = self;
        let desired = counts.consumed + adaptive.allowed_window();
        if desired <= adaptive.granted {
            return;
        }
        let mut increase = desired - adaptive.granted;
        // What the sender can still send; negative after its one
        // allowed overshoot.
        let usable = adaptive.granted as i64 - counts.received as i64;
        // docs/flow-control.md, "When to send an OKAY" (smoltcp): coalesce
        // updates smaller than a packet, except one that unblocks the sender
        // or at least doubles its usable credit. Usable credit as seen here
        // counts what is still on the way, a round trip's worth on a long
        // link: held to half a 32 MiB window, a pull at 100 ms ran dry for a
        // round trip (75.9 MB/s against AOSP's 78.2, per-packet OKAYs).
        // While ramping, every update carries growth the sender needs within
        // the round trip (holding one back stretched a doubling over two
        // round trips), so none waits.
        if usable > 0
            && (increase as i64) < usable
            && increase < adaptive.floor
            && !adaptive.ramp.active()
        {
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
        increase = adaptive.reserve_for_grant(increase, counts);
        if increase == 0 {
            return;
        }
        if usable <= 0 && adaptive.probe_started_ns.is_none() {
            // The sender is waiting for exactly this OKAY: its next
            // WRTE times one round trip.
            adaptive.probe_started_ns = Some(now_ns);
        }
        adaptive.granted += increase;
        tracing::trace!(
            now_ns,
            increase,
            granted = adaptive.granted,
            received = counts.received,
            consumed = counts.consumed,
            window = adaptive.window,
            headroom = adaptive.headroom(),
            ramping = adaptive.ramp.active(),
            rate = adaptive.rate,
            min_rtt_ns = adaptive.min_rtt_ns,
            "credit granted"
        );
        if counts.received < adaptive.granted {
            adaptive.stalls.blocked = None;
        }
        push_okays(out, increase);
    }

    fn initial_grant(&self) -> Option<u64> {
        Some(self.granted)
    }

    fn start_rtt_probe(&mut self, now_ns: u64) {
        self.probe_started_ns = Some(now_ns);
    }

    fn end_rtt_probe(&mut self, now_ns: u64) {
        if let Some(started) = self.probe_started_ns.take() {
            self.rtt_sample(now_ns.saturating_sub(started));
        }
    }

    fn window(&self) -> Option<u64> {
        Some(self.allowed_window())
    }

    fn headroom(&self) -> Option<u64> {
        Some(AdaptiveWindow::headroom(self))
    }

    fn credit_outstanding(&self, counts: Counts) -> Option<u64> {
        Some(self.granted.saturating_sub(counts.consumed))
    }

    fn min_rtt_ns(&self) -> Option<u64> {
        self.min_rtt_ns
    }

    fn rate(&self) -> Option<u64> {
        Some(self.rate)
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
            // The floor is what the budget cannot take away, not a minimum
            // the window must ask for (a settled window may be smaller).
            Some(budget) => budget.allowed_window(wish, self.floor).min(wish),
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
            let rate_interval = rtt.max(MIN_RATE_INTERVAL_NS);
            headroom.on_delivered(bytes, now_ns, self.rate, rate_interval, self.window);
        }
    }

    /// What the stream holds with a grant of `granted`: the grant, or what
    /// arrived beyond it (a sender's one-packet overshoot), less what the
    /// consumer took, plus the taken part of the packet it is reading.
    fn held(&self, granted: u64, counts: Counts) -> u64 {
        granted.max(counts.received) - counts.consumed + self.pinned
    }

    /// Reserves budget for a grant of `increase` bytes; returns the grant the
    /// budget allows (all of it without a budget). Up to the floor the grant
    /// is charged whatever the limit says.
    fn reserve_for_grant(&mut self, increase: u64, counts: Counts) -> u64 {
        let Some(budget) = &self.budget else {
            return increase;
        };
        let need = self
            .held(self.granted + increase, counts)
            .saturating_sub(self.reserved);
        let forced = need.min(self.floor.saturating_sub(self.reserved));
        budget.charge(forced);
        let got = forced + budget.reserve(need - forced);
        self.reserved += got;
        increase - (need - got)
    }

    /// Charges or releases what changed in [`AdaptiveWindow::held`] after
    /// bytes arrived or were consumed: arrivals are already in memory, so
    /// they are charged beyond the limit if need be.
    fn settle(&mut self, counts: Counts) {
        let Some(budget) = &self.budget else {
            return;
        };
        let held = self.held(self.granted, counts);
        if held > self.reserved {
            budget.charge(held - self.reserved);
        } else {
            budget.release(self.reserved - held);
        }
        self.reserved = held;
    }

    fn rtt_sample(&mut self, rtt_ns: u64) {
        let rtt_ns = rtt_ns.max(1);
        self.min_rtt_ns = Some(self.min_rtt_ns.map_or(rtt_ns, |min| min.min(rtt_ns)));
    }

    /// Linux-style receive-buffer autotuning: once per interval of at least a
    /// round trip, the window grows to [`RATE_GAIN`] times the bytes consumed
    /// per round trip (rate x RTT is what must be in flight; the rest is
    /// TCP's own cwnd gain and its queue). It never shrinks here.
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
        self.ramp.on_rate(self.rate);
        self.recent_rates.push(self.rate);
        if self.settle_within_a_packet(rtt) {
            return;
        }
        let target = RATE_GAIN * self.rate as u128 * rtt as u128 / 1_000_000_000;
        self.grow_to(target.min(u64::MAX as u128) as u64);
    }

    /// Where one packet moves in less than the round trip at the recent
    /// rate, the sender is not what waits: the consumer or the CPU sets the
    /// pace (loopback: 4 to 6 GB/s over 80 to 190 us, 0.5 to 0.9 of the
    /// daemon's 983,160-byte pull payloads). A delayed-ack sender sends a
    /// whole packet whenever it has credit, so a window of one round trip's
    /// bytes keeps a packet coming while the last is consumed; more only
    /// queues packets in the socket, out of cache. Loopback pulls into a
    /// device node ran at 0.90 of classic ones with the two-packet window
    /// and at 0.99 settled, medians of 20 paired runs (docs/benchmarks.md,
    /// "Burst pulls on loopback"). Not while ramping, nor behind a
    /// consumer, nor once the path needed more (a link's window, grown by
    /// the ramp, is never taken back for a spell of low samples), nor over
    /// a round trip of [`MAX_SETTLING_RTT_NS`] or more.
    fn settle_within_a_packet(&mut self, rtt_ns: u64) -> bool {
        if self.ramp.active()
            || !self.consumer_kept_up
            || self.grown_for_path
            || rtt_ns >= MAX_SETTLING_RTT_NS
        {
            return false;
        }
        let typical_rate = self.recent_rates.median().unwrap_or(0);
        let covers = (typical_rate as u128 * rtt_ns as u128 / 1_000_000_000) as u64;
        if covers >= self.largest_packet {
            return false;
        }
        self.window = covers.max(MIN_SETTLED_WINDOW).min(self.max_window);
        true
    }

    /// [`AdaptiveWindow::grow_to`] for the ramp or a stall: what the path
    /// itself needed, which the window keeps.
    fn grow_for_path(&mut self, target: u64) {
        let before = self.window;
        self.grow_to(target);
        self.grown_for_path |= self.window > before;
    }

    /// Raises the window towards `target`, never above the cap; above the
    /// comfortable level of the budget, windows stop growing
    /// (docs/flow-control.md, "Memory budget").
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
            if backlog > 0
                && gap > rtt.max(MIN_RATE_INTERVAL_NS).max(MIN_STALL_NS)
                && blocked_ns >= last_read_ns
            {
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
            if target <= self.max_window.min(MAX_STALL_WINDOW) {
                self.grow_for_path(target);
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
    use std::sync::Arc;

    use super::AdaptiveParams;
    use crate::budget::MemoryBudget;
    use crate::credit::RecvCredit;

    /// An adaptive window with no budget, no headroom and no ramp: the rules alone.
    fn adaptive(initial: u64, max_window: u64) -> RecvCredit {
        adaptive_with_packet(initial, max_window, 1)
    }

    /// As [`adaptive`], with packets of `packet` bytes (the floor).
    fn adaptive_with_packet(initial: u64, max_window: u64, packet: u64) -> RecvCredit {
        RecvCredit::adaptive(
            AdaptiveParams {
                initial,
                max_window,
                floor: packet,
                budget: None,
                ack_headroom: false,
                slow_start: false,
            },
            0,
        )
    }

    const MS: u64 = 1_000_000;

    /// `bytes` arriving at `now_ns` in packets of at most 1 MiB, as a
    /// sender's WRTEs bring them.
    fn receive_in_packets(credit: &mut RecvCredit, bytes: u64, now_ns: u64) {
        let mut left = bytes;
        while left > 0 {
            let packet = left.min(1 << 20);
            credit.on_received(packet as usize, now_ns);
            left -= packet;
        }
    }

    #[test]
    fn adaptive_coalesces_less_than_a_packet_until_it_doubles_usable_credit() {
        let mut credit = adaptive_with_packet(1000, 1 << 20, 800);
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
    fn a_packet_of_credit_goes_out_at_once_in_a_large_window() {
        // Ten packets of window: most of the usable credit seen here may be
        // on the way on a long link, so a packet's worth is not held back.
        let mut credit = adaptive_with_packet(1000, 1 << 20, 100);
        let mut out = Vec::new();
        credit.on_received(60, 0);
        credit.on_consumed(60, 0);
        credit.take_okays(&mut out, 0);
        assert!(out.is_empty(), "less than a packet waits");
        credit.on_received(40, 0);
        credit.on_consumed(40, 0);
        credit.take_okays(&mut out, 0);
        assert_eq!(
            out,
            vec![Some(100)],
            "a packet goes although 900 are usable"
        );
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
    fn adaptive_window_grows_to_three_times_rate_times_rtt_and_stops_at_the_cap() {
        let mut credit = adaptive(1 << 20, 64 << 20);
        let mut out = Vec::new();
        // Open handshake: 10 ms round trip.
        credit.start_rtt_probe(0);
        credit.end_rtt_probe(10 * MS);
        assert_eq!(credit.min_rtt_ns(), Some(10 * MS));
        // 6 MB consumed over 30 ms: 3 x 200 MB/s x 10 ms = 6 MB.
        receive_in_packets(&mut credit, 6_000_000, 20 * MS);
        credit.on_consumed(6_000_000, 30 * MS);
        credit.take_okays(&mut out, 30 * MS);
        assert_eq!(credit.rate(), Some(200_000_000));
        let window = credit.window().unwrap();
        assert!(
            (5_950_000..6_050_000).contains(&window),
            "3 x 200 MB/s x 10 ms, got {window}"
        );
        // A much faster consumer later: capped at max_window.
        receive_in_packets(&mut credit, 1 << 30, 40 * MS);
        credit.on_consumed(1 << 30, 50 * MS);
        assert_eq!(credit.window(), Some(64 << 20));
    }

    #[test]
    fn a_link_needing_more_than_aosps_credit_gets_it() {
        // 1 Gbit/s over 300 ms: 3 x 125 MB/s x 300 ms = 112.5 MB, beyond
        // AOSP's fixed 32 MiB (which would cap the link at 112 MB/s minus
        // what sits in the sockets' buffers).
        let mut credit = adaptive(1 << 20, crate::MAX_ADAPTIVE_WINDOW.into());
        credit.start_rtt_probe(0);
        credit.end_rtt_probe(300 * MS);
        receive_in_packets(&mut credit, 125_000_000, 1000 * MS);
        credit.on_consumed(125_000_000, 1000 * MS);
        let window = credit.window().unwrap();
        assert!(
            (112_000_000..113_000_000).contains(&window),
            "3 x 125 MB/s x 300 ms, got {window}"
        );
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
                        slow_start: false,
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
            assert_eq!(
                budget.committed(),
                committed,
                "round {round}: the budget counts what every stream holds"
            );
        }
        // Only the floors are charged beyond the limit.
        assert!(budget.peak() <= limit + 20 * floor);
        drop(streams);
        assert_eq!(budget.committed(), 0, "every stream returned its share");
    }

    /// The budget is charged what the stream may hold: its grant, what a
    /// sender's overshoot brought beyond it, and the part of a packet its
    /// consumer took while the rest keeps the allocation alive.
    #[test]
    fn the_budget_is_charged_overshoots_and_partly_read_packets() {
        let budget = Arc::new(MemoryBudget::new(crate::BudgetLimits::from_limit(1 << 20)));
        let mut credit = RecvCredit::adaptive(
            AdaptiveParams {
                initial: 2000,
                max_window: 1 << 20,
                floor: 1000,
                budget: Some(budget.clone()),
                ack_headroom: false,
                slow_start: false,
            },
            0,
        );
        assert_eq!(budget.committed(), 2000, "the opening grant");
        credit.on_received(1000, 0);
        credit.on_read(300, 300, 0);
        assert_eq!(budget.committed(), 2000, "300 bytes read, still allocated");
        credit.on_read(700, 0, 0);
        assert_eq!(budget.committed(), 1000, "the packet is gone");
        // The sender had 1000 bytes of credit left and sent a 1500-byte packet.
        credit.on_received(1500, 0);
        assert_eq!(budget.committed(), 1500, "the overshoot is charged");
        credit.on_consumed(1500, 0);
        assert_eq!(budget.committed(), 0);
        drop(credit);
        assert_eq!(budget.committed(), 0);
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
                    slow_start: false,
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
                // Clumps of eight 100 kB packets every 8 ms, 10 us apart.
                let (packets, bytes) = if !clumped {
                    (1, 10_000)
                } else if tick % 80 == 0 {
                    (8, 100_000)
                } else {
                    (0, 0)
                };
                for i in 0..packets {
                    let at = now + i * 10_000;
                    credit.on_received(bytes, at);
                    credit.on_consumed(bytes, at);
                }
                credit.take_okays(&mut okays, now);
            }
            credit.headroom().unwrap()
        };
        let (steady, clumped) = (run(false), run(true));
        // The measured window is 3 x 100 MB/s x 1 ms = 300 kB, which also
        // caps the headroom (docs/flow-control.md, "Headroom for clumps": never more than the window).
        assert!(steady <= 20_000, "steady arrivals earned {steady}");
        assert_eq!(clumped, 300_000, "clumps of 800 kB earned {clumped}");
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
    /// that refills whatever it frees, does not; nor does a stall beyond
    /// AOSP's 32 MiB, however large the cap.
    #[test]
    fn a_stall_the_consumer_catches_up_from_sizes_the_window() {
        let run = |read_per_ms: usize, stall_ms: u64| {
            let mut credit = adaptive(1 << 20, 256 << 20);
            let mut okays = Vec::new();
            credit.start_rtt_probe(0);
            credit.end_rtt_probe(MS);
            // 1 MiB arrives over 4 ms (262 kB/ms) and sits unread: the
            // sender is out of credit at 4 ms, the consumer stalls to 50 ms.
            for t in 1..=4 {
                credit.on_received(1 << 18, t * MS);
            }
            let mut sender_credit = 0;
            for t in stall_ms..stall_ms + 50 {
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
        let fast = run(usize::MAX, 50);
        assert!(
            (13_000_000..13_300_000).contains(&fast),
            "the stall called for 13.1 MB, got {fast}"
        );
        let slow = run(1 << 14, 50);
        assert!(slow <= 1 << 20, "a slow drain is no stall: window {slow}");
        // 262 kB/ms x 150 ms = 39 MB: more than a stall may pin.
        let long = run(usize::MAX, 150);
        assert!(long <= 1 << 20, "a 150 ms stall grew the window to {long}");
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

    /// Property (docs/flow-control.md, "When to send an OKAY"): after `take_okays`, no update that would unblock
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
                    slow_start: false,
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

    /// A sender limited by credit on a long link: each round trip it sends
    /// all it was granted, the consumer takes it at once, and what that frees
    /// reaches the sender for the next round. The ramp multiplies what moves
    /// per round trip by its gain (three, ahead of TCP's own ramp) up to the
    /// cap; the rate rule alone, measuring once per round trip, lags behind it.
    #[test]
    fn the_ramp_triples_what_moves_each_round_trip_while_credit_limits() {
        let packet: u64 = 1 << 20;
        let moved_per_round = |slow_start: bool| -> Vec<u64> {
            let mut credit = RecvCredit::adaptive(
                AdaptiveParams {
                    initial: 2 * packet,
                    max_window: 64 * packet,
                    floor: packet,
                    budget: None,
                    ack_headroom: false,
                    slow_start,
                },
                0,
            );
            // The open handshake measures the round trip: 50 ms.
            credit.start_rtt_probe(0);
            credit.end_rtt_probe(50 * MS);
            let mut usable = credit.initial_grant().unwrap();
            let mut moved = Vec::new();
            for round in 0..6u64 {
                // The round's packets arrive over 10 ms, 60 ms apart.
                let start = 100 * MS + round * 60 * MS;
                let packets = usable / packet;
                let mut granted_next = 0;
                for i in 0..packets {
                    let now = start + i * 10 * MS / packets.max(1);
                    credit.on_received(packet as usize, now);
                    credit.on_consumed(packet as usize, now);
                    let mut out = Vec::new();
                    credit.take_okays(&mut out, now);
                    granted_next += out.iter().map(|o| o.unwrap() as u64).sum::<u64>();
                }
                moved.push(packets * packet);
                usable = usable - packets * packet + granted_next;
            }
            moved
        };
        let ramp = moved_per_round(true);
        let rule_alone = moved_per_round(false);
        let gain = crate::credit::slow_start::RAMP_GAIN as u64;
        for pair in ramp.windows(2).take(4) {
            assert!(
                pair[1] >= (gain * pair[0] - packet).min(64 * packet),
                "the ramp grows {gain}-fold each round up to the cap: {ramp:?}"
            );
        }
        assert!(
            ramp.iter().sum::<u64>() > 2 * rule_alone.iter().sum::<u64>(),
            "ramp {ramp:?} against the rate rule alone {rule_alone:?}"
        );
    }

    /// `packets` of the daemon's 983,160-byte pull payloads arriving at
    /// `rate` bytes a second after `from_ns`, each consumed as it lands.
    fn packets_at_rate(credit: &mut RecvCredit, from_ns: u64, packets: u64, rate: u64) {
        let packet = 983_160u64;
        let mut now = from_ns;
        for _ in 0..packets {
            now += packet * 1_000_000_000 / rate;
            credit.on_received(packet as usize, now);
            credit.on_consumed(packet as usize, now);
            let mut out = Vec::new();
            credit.take_okays(&mut out, now);
        }
    }

    #[test]
    fn a_window_settles_within_a_packet_where_one_covers_the_round_trip() {
        let mut credit = adaptive_with_packet(2 << 20, 64 << 20, 1 << 20);
        credit.start_rtt_probe(0);
        credit.end_rtt_probe(150_000);
        // Loopback's numbers: a 150 us round trip, 4 GB/s.
        packets_at_rate(&mut credit, 150_000, 200, 4_000_000_000);
        let window = credit.window().unwrap();
        // 4 GB/s x 150 us = 600 KB, under one packet: not the two it opened with.
        assert!(
            (550_000..650_000).contains(&window),
            "rate x round trip, got {window}"
        );
    }

    #[test]
    fn a_window_over_a_network_round_trip_does_not_settle() {
        // 10 ms and no ramp: 50 MB/s x 10 ms = 500 KB, under a packet, but
        // on a network path a low rate is TCP's, not the copies'.
        let mut credit = adaptive_with_packet(2 << 20, 64 << 20, 1 << 20);
        credit.start_rtt_probe(0);
        credit.end_rtt_probe(10 * MS);
        packets_at_rate(&mut credit, 10 * MS, 100, 50_000_000);
        assert_eq!(credit.rate(), Some(50_000_000));
        assert_eq!(credit.window(), Some(2 << 20), "the opening window stays");
    }

    #[test]
    fn a_window_behind_a_slow_consumer_does_not_settle() {
        let mut credit = adaptive_with_packet(2 << 20, 64 << 20, 1 << 20);
        credit.start_rtt_probe(0);
        credit.end_rtt_probe(150_000);
        let packet = 983_160u64;
        let (mut granted, mut received, mut consumed) = (2u64 << 20, 0u64, 0u64);
        let mut now = 150_000;
        for _ in 0..2000 {
            now += 250_000;
            // The sender sends a packet whenever it has credit; the
            // consumer takes 400 KB per 250 us (1.6 GB/s), less than arrives.
            if granted > received {
                credit.on_received(packet as usize, now);
                received += packet;
            }
            let take = (received - consumed).min(400_000);
            credit.on_consumed(take as usize, now);
            consumed += take;
            let mut out = Vec::new();
            credit.take_okays(&mut out, now);
            granted += out.iter().map(|o| o.unwrap() as u64).sum::<u64>();
        }
        assert!(
            credit.window().unwrap() >= 2 << 20,
            "a consumer that sets the pace keeps the window, got {:?}",
            credit.window()
        );
    }

    #[test]
    fn a_window_the_ramp_grew_never_settles_within_a_packet() {
        let packet: u64 = 1 << 20;
        let mut credit = RecvCredit::adaptive(
            AdaptiveParams {
                initial: 2 * packet,
                max_window: 64 * packet,
                floor: packet,
                budget: None,
                ack_headroom: false,
                slow_start: true,
            },
            0,
        );
        // A 0.5 ms path: two packets land within the round trip and the
        // ramp triples what moved.
        credit.start_rtt_probe(0);
        credit.end_rtt_probe(MS / 2);
        for i in 0..2 {
            let now = MS + i * MS / 10;
            credit.on_received(packet as usize, now);
            credit.on_consumed(packet as usize, now);
        }
        let grown = credit.window().unwrap();
        assert!(grown > 2 * packet, "the ramp grew the window: {grown}");
        // Then a long spell far below that (a loss being repaired):
        // 20 MB/s x 0.5 ms = 10 KB, under a packet.
        let mut now = 2 * MS;
        for _ in 0..40 {
            now += 50 * MS;
            credit.on_received(packet as usize, now);
            credit.on_consumed(packet as usize, now);
        }
        assert!(
            credit.window().unwrap() >= grown,
            "the link's window stays: {:?} after {grown}",
            credit.window()
        );
    }
}
