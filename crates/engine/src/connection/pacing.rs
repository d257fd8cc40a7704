//! Pacing a peer that keeps misbehaving without breaking the protocol:
//! OPENs refused, packets for streams it never had, a second CLSE. Each
//! costs this side an answer or a log line, and a peer can send them as fast
//! as its socket takes them; a driver that read on would give it the
//! thread (one flooding device took 0.8 to 0.99 of a good device's
//! throughput through `oxadb server`, docs/benchmarks.md, "A misbehaving
//! device beside a good one"). Past a burst, such packets are let in at a
//! fixed rate: the driver stops reading the connection until
//! [`MisbehaviourPace::paused_until`], and the peer waits on TCP's
//! back-pressure. A well-behaved peer has none of them and is never paced.
//!
//! The rate is a generic cell rate (the token bucket of ATM and of most
//! rate limiters written as one deadline): each packet pushes a
//! theoretical time one interval on, and reading waits while that time
//! runs more than the burst ahead of the clock.

use std::time::Duration;

/// Misbehaving packets a peer may send at once before it is paced: more
/// than any race of closing streams produces, and than the daemon's
/// hostile-client test sends in one burst (4 x 64 refused OPENs).
pub const MISBEHAVIOUR_BURST: u64 = 1024;

/// Misbehaving packets per second a paced peer is read at.
pub const MISBEHAVIOUR_PER_SECOND: u64 = 1024;

const INTERVAL_NS: u64 = 1_000_000_000 / MISBEHAVIOUR_PER_SECOND;

/// One connection's pace (on the engine's clock, in ns).
#[derive(Debug, Default)]
pub(super) struct MisbehaviourPace {
    /// When the packets counted so far would have arrived at the rate.
    theoretical_ns: u64,
}

impl MisbehaviourPace {
    /// One more misbehaving packet, at `now_ns`.
    pub(super) fn note(&mut self, now_ns: u64) {
        self.theoretical_ns = self.theoretical_ns.max(now_ns) + INTERVAL_NS;
    }

    /// When reading may go on, if it must wait now.
    pub(super) fn paused_until(&self, now_ns: u64) -> Option<Duration> {
        let resume = self
            .theoretical_ns
            .saturating_sub(MISBEHAVIOUR_BURST * INTERVAL_NS);
        (resume > now_ns).then(|| Duration::from_nanos(resume))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn a_burst_goes_unpaced_and_what_follows_at_the_rate() {
        let mut pace = MisbehaviourPace::default();
        let now = 5 * SECOND;
        for _ in 0..MISBEHAVIOUR_BURST {
            pace.note(now);
        }
        assert_eq!(pace.paused_until(now), None);
        // 512 more at once: read again once they are due at the rate.
        for _ in 0..MISBEHAVIOUR_PER_SECOND / 2 {
            pace.note(now);
        }
        let due = now + MISBEHAVIOUR_PER_SECOND / 2 * INTERVAL_NS;
        assert_eq!(pace.paused_until(now), Some(Duration::from_nanos(due)));
        assert!(due - now > SECOND / 2 - 1000, "half a second");
        assert_eq!(pace.paused_until(due), None);
    }

    #[test]
    fn packets_at_the_rate_are_never_paced_and_the_burst_comes_back() {
        let mut pace = MisbehaviourPace::default();
        let mut now = SECOND;
        for _ in 0..10 * MISBEHAVIOUR_PER_SECOND {
            pace.note(now);
            assert_eq!(pace.paused_until(now), None);
            now += INTERVAL_NS;
        }
        // After a quiet second a whole burst goes again.
        now += 2 * SECOND;
        for _ in 0..MISBEHAVIOUR_BURST {
            pace.note(now);
        }
        assert_eq!(pace.paused_until(now), None);
        pace.note(now);
        assert!(pace.paused_until(now).is_some());
    }
}
