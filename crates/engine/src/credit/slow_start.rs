//! The adaptive window's ramp: TCP's slow start applied to credit.
//!
//! Measuring the rate once per round trip and granting twice what it
//! moved lags the sender by that round trip while the rate grows: a trace
//! of a 1 Gbit/s, 50 ms push showed windows of 2, 2, 4, 6, 8, 12, 20 and
//! 27 MiB, one round trip apart, and a 256 MiB push lost 5% at 50 ms and 15%
//! at 100 ms to it. TCP's slow start (RFC 5681, 3.1) instead grows the
//! window with every acknowledgement, doubling it each round trip with no
//! measurement in between. Here, at every read while ramping and keeping
//! up, the window becomes at least [`RAMP_GAIN`] times what arrived in the
//! last round trip (a sliding round trip, not a finished interval): a
//! sender limited by credit delivers its whole window in one round trip, so
//! the window grows as that delivery lands, and the OKAYs that follow carry
//! it at once. Arrivals, not reads, are counted (one read can take what
//! arrived over several round trips), and never faster than they came: the
//! gain times the rate seen after the round trip's first arrival times the
//! round trip caps the growth, since the first packet was mostly on its way
//! before the round trip began (on the simulator's loopback two 1 MiB
//! packets land within one 0.3 ms round trip: grown whole, 6 MiB where 2
//! carry it). Like BBR's startup (which ends once three rounds fail to
//! raise the bandwidth estimate by a quarter), the ramp ends when the
//! measured rate stops growing, or when data has waited for the consumer
//! for longer than a round trip: from then on the rate rule alone sizes the
//! window. A burst that the consumer clears within the round trip is no
//! sign of a slow consumer: TCP delivers one after every loss it repairs
//! (a round trip's data held behind the hole), which ended the ramp while
//! TCP was still raising its rate. On a link whose rate is reached at once
//! (loopback, where a round trip brings far less than the first two
//! packets) it never raises the window.

use std::collections::VecDeque;

/// What the ramp grants over the last round trip's arrivals. The window
/// granted now carries the sender through the next round trip, whose rate
/// TCP raises by up to 2/ln 2 = 2.89 while it ramps (BBR's startup gain;
/// slow start doubles), so twice the arrivals held BBR's startup back.
/// With both this and the exit rule below, a 256 MiB pull over a 1 Gbit/s,
/// 50 ms link of 1500-byte frames went from 0.96 to 0.99 of AOSP's fixed
/// 32 MiB (medians of five, docs/benchmarks.md).
pub(super) const RAMP_GAIN: u128 = 3;

/// Rate intervals without a quarter's growth that end the ramp (BBR's
/// `full_bw_cnt` threshold).
const FLAT_INTERVALS_TO_EXIT: u32 = 3;
/// Samples kept of the last round trip's reads; beyond it the oldest go,
/// which only underestimates what the round trip moved.
const MAX_SAMPLES: usize = 4096;

#[derive(Debug, Clone)]
pub(super) struct SlowStart {
    /// Still ramping.
    active: bool,
    /// Highest rate seen at a quarter's growth over the one before.
    full_rate: u64,
    /// Rate intervals since `full_rate` last grew by a quarter.
    flat_intervals: u32,
    /// (time ns, bytes received by then) of the arrivals in the last round
    /// trip, oldest first, the first one at or before its start when there
    /// is one.
    arrivals: VecDeque<(u64, u64)>,
    /// What the ramp asks for after the last arrival.
    wanted: u64,
    /// Since when (ns) more than a packet has waited for the consumer.
    behind_since: Option<u64>,
}

impl SlowStart {
    /// A ramp that starts active at `now_ns`, or none at all (`enabled` false).
    pub(super) fn new(enabled: bool, now_ns: u64) -> SlowStart {
        SlowStart {
            active: enabled,
            full_rate: 0,
            flat_intervals: 0,
            arrivals: VecDeque::from([(now_ns, 0)]),
            wanted: 0,
            behind_since: None,
        }
    }

    pub(super) fn active(&self) -> bool {
        self.active
    }

    /// `received` bytes in all have arrived by `now_ns`.
    pub(super) fn on_received(&mut self, received: u64, now_ns: u64, rtt_ns: u64) {
        if !self.active {
            return;
        }
        self.arrivals.push_back((now_ns, received));
        let start = now_ns.saturating_sub(rtt_ns);
        while self.arrivals.len() > MAX_SAMPLES
            || self.arrivals.get(1).is_some_and(|a| a.0 <= start)
        {
            self.arrivals.pop_front();
        }
        // The newest arrival at or before the start is in front when there is
        // one; `first` is the first arrival inside the round trip.
        let (before, first) = match self.arrivals.front() {
            Some(&(at, bytes)) if at <= start => (Some(bytes), self.arrivals.get(1).copied()),
            front => (None, front.copied()),
        };
        self.wanted = match first {
            Some((at, bytes)) if now_ns > at => {
                let grown = RAMP_GAIN * (received - before.unwrap_or(bytes)) as u128;
                let at_rate =
                    RAMP_GAIN * (received - bytes) as u128 * rtt_ns as u128 / (now_ns - at) as u128;
                grown.min(at_rate).min(u64::MAX as u128) as u64
            }
            _ => 0,
        };
    }

    /// The consumer read, and emptied its buffer or not (`caught_up`): the
    /// window the ramp asks for, when ramping and the consumer kept up (else
    /// the consumer, not the window, is what limits).
    pub(super) fn on_consumed(&self, caught_up: bool) -> Option<u64> {
        (self.active && caught_up).then_some(self.wanted)
    }

    /// The consumer read at `now_ns`: more than a packet was waiting
    /// (`waiting`) for `waited_ns` since its previous read (or since data
    /// came to an empty buffer), and more than a packet is left (`left`) or
    /// not. Data that waited longer than a round trip (`rtt_ns`), in one
    /// stall or over several reads that never caught up, ends the ramp.
    pub(super) fn on_backlog(
        &mut self,
        waiting: bool,
        left: bool,
        waited_ns: u64,
        now_ns: u64,
        rtt_ns: u64,
    ) {
        if waiting && waited_ns > rtt_ns {
            self.end();
            return;
        }
        if !left {
            self.behind_since = None;
            return;
        }
        let since = *self.behind_since.get_or_insert(now_ns);
        if now_ns.saturating_sub(since) > rtt_ns {
            self.end();
        }
    }

    /// The ramp is over for good.
    pub(super) fn end(&mut self) {
        self.active = false;
        self.arrivals = VecDeque::new();
    }

    /// A rate interval ended with `rate` bytes per second.
    pub(super) fn on_rate(&mut self, rate: u64) {
        if !self.active {
            return;
        }
        if rate as u128 * 4 >= self.full_rate as u128 * 5 {
            self.full_rate = rate;
            self.flat_intervals = 0;
        } else {
            self.flat_intervals += 1;
            if self.flat_intervals >= FLAT_INTERVALS_TO_EXIT {
                self.end();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_for_three_times_what_arrived_in_the_last_round_trip_at_most_at_its_rate() {
        let mut ramp = SlowStart::new(true, 0);
        ramp.on_received(100, 10, 100);
        assert_eq!(ramp.on_consumed(true), Some(0), "one arrival is no rate");
        // 200 bytes in 80 ns after the first arrival, over a round trip of
        // 100: 250, three times 750 (under three times the 300 that arrived).
        ramp.on_received(300, 90, 100);
        assert_eq!(ramp.on_consumed(true), Some(750));
        // At 150 the round trip began at 50: the arrival at 90 is its first,
        // 100 bytes in 60 ns after it, three times 100 / 60 x 100.
        ramp.on_received(400, 150, 100);
        assert_eq!(ramp.on_consumed(true), Some(500));
        // A consumer behind its backlog limits the stream, not the window.
        assert_eq!(ramp.on_consumed(false), None);
    }

    #[test]
    fn three_intervals_without_a_quarters_growth_end_the_ramp() {
        let mut ramp = SlowStart::new(true, 0);
        for rate in [10, 20, 40, 80] {
            ramp.on_rate(rate);
            assert!(ramp.active());
        }
        ramp.on_rate(90);
        ramp.on_rate(95);
        assert!(ramp.active(), "two flat intervals do not end it");
        ramp.on_rate(99);
        assert!(!ramp.active());
        ramp.on_received(5000, 1, 100);
        assert_eq!(ramp.on_consumed(true), None, "ended for good");
    }

    #[test]
    fn a_backlog_ends_the_ramp_only_once_it_outlasts_a_round_trip() {
        let mut ramp = SlowStart::new(true, 0);
        // A burst (a loss repaired) that the consumer clears in time.
        ramp.on_backlog(true, true, 5, 1000, 100);
        ramp.on_backlog(true, true, 5, 1090, 100);
        ramp.on_backlog(true, false, 5, 1095, 100);
        ramp.on_backlog(true, true, 5, 1200, 100);
        assert!(ramp.active());
        // A consumer still behind more than a round trip later.
        ramp.on_backlog(true, true, 5, 1301, 100);
        assert!(!ramp.active());
        // A consumer back from a stall longer than a round trip, even one
        // that takes everything at once.
        let mut ramp = SlowStart::new(true, 0);
        ramp.on_backlog(true, false, 150, 1000, 100);
        assert!(!ramp.active());
    }

    #[test]
    fn a_disabled_ramp_asks_for_nothing() {
        let mut ramp = SlowStart::new(false, 0);
        ramp.on_received(5000, 1, 100);
        assert_eq!(ramp.on_consumed(true), None);
    }
}
