//! Per-stream credit: how much a sender may put in flight, and when a receiver
//! returns credit.
//!
//! Two modes exist on the wire (see `docs/dev/delayed_ack.md` in AOSP):
//! - classic: one WRTE in flight per stream; an empty OKAY releases the next one.
//! - delayed ack ("burst mode"), negotiated by the `delayed_ack` feature on both
//!   sides: OPEN.arg1 and the first OKAY's i32 payload grant initial credit, every
//!   later OKAY carries the i32 number of bytes acknowledged, and the sender keeps
//!   sending while its credit is positive (overshooting by at most one packet).
//!
//! The sender obeys OKAYs ([`SendCredit`]); the receiver decides when to send
//! them through a [`ReceivePolicy`], one per file: [`classic`], [`aosp`] and
//! [`adaptive`] (which uses [`stall`] and [`headroom`]). [`RecvCredit`] keeps
//! the byte counts every policy shares and builds the policy for a stream.

pub mod adaptive;
pub mod aosp;
pub mod classic;
mod headroom;
mod slow_start;
mod stall;

pub use adaptive::{AdaptiveParams, AdaptiveWindow};

/// AOSP's `INITIAL_DELAYED_ACK_BYTES`: the fixed credit each side grants per stream.
pub const AOSP_INITIAL_CREDIT: u32 = 32 * 1024 * 1024;

pub use crate::budget::MAX_ADAPTIVE_WINDOW;

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
    /// A window that starts at two packets and grows to three times the
    /// measured consumption rate times the round trip, never above
    /// `max_window` (or settles below a packet where one covers the round
    /// trip); OKAYs smaller than a packet are coalesced unless they
    /// unblock the sender or at least double its usable credit
    /// (`docs/flow-control.md`).
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
                max_window: MAX_ADAPTIVE_WINDOW,
            },
        }
    }
}

impl std::fmt::Display for CreditMode {
    /// The mode's name, as `--credit` and the `credit` config key spell it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CreditMode::Classic => "classic",
            CreditMode::Aosp => "aosp",
            CreditMode::Adaptive => "adaptive",
        })
    }
}

/// Bytes received and consumed on a stream, which every policy reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub received: u64,
    pub consumed: u64,
}

impl Counts {
    /// Received and not consumed yet.
    pub fn buffered(&self) -> u64 {
        self.received - self.consumed
    }
}

/// How a receiver returns credit: the hooks [`RecvCredit`] calls as bytes
/// arrive and are consumed, and the OKAYs it asks for. `counts` are always
/// the stream's totals after the event.
pub trait ReceivePolicy: std::fmt::Debug + Send {
    /// Whether the peer may send `bytes` more now (see [`RecvCredit::admit`]).
    fn admit(&self, counts: Counts, bytes: usize, max_packet: usize) -> Result<(), String>;

    /// `bytes` arrived; `backlog` is what the consumer had not taken before.
    fn on_received(&mut self, bytes: usize, backlog: u64, counts: Counts, now_ns: u64);

    /// The consumer took bytes; `backlog` is what it had not taken before.
    fn on_consumed(&mut self, _backlog: u64, _counts: Counts, _now_ns: u64) {}

    /// Bytes the consumer took that stay allocated (the first part of a
    /// packet it reads in pieces), set before the `on_consumed` that took them.
    fn set_pinned(&mut self, _pinned: u64) {}

    /// Whether the sender has no credit left because our consumer has not
    /// taken what arrived.
    fn withholding(&self, counts: Counts) -> bool;

    /// Appends the OKAYs to send now (see [`RecvCredit::take_okays`]).
    fn take_okays(&mut self, out: &mut Vec<Option<i32>>, counts: Counts, now_ns: u64);

    /// The grant announced at open, when the policy decides it.
    fn initial_grant(&self) -> Option<u64> {
        None
    }

    /// Round-trip probes, for policies that measure it.
    fn start_rtt_probe(&mut self, _now_ns: u64) {}
    fn end_rtt_probe(&mut self, _now_ns: u64) {}

    /// Statistics (see [`RecvCredit`]'s accessors of the same names).
    fn window(&self) -> Option<u64> {
        None
    }
    fn headroom(&self) -> Option<u64> {
        None
    }
    fn credit_outstanding(&self, _counts: Counts) -> Option<u64> {
        None
    }
    fn min_rtt_ns(&self) -> Option<u64> {
        None
    }
    fn rate(&self) -> Option<u64> {
        None
    }
}

/// Receiver-side accounting of one stream: the byte counts, and the policy
/// that decides when they become OKAYs.
#[derive(Debug)]
pub struct RecvCredit {
    policy: Box<dyn ReceivePolicy>,
    counts: Counts,
}

impl RecvCredit {
    /// Classic mode (no delayed_ack): stop-and-wait OKAYs.
    pub fn classic(local_buffer: usize) -> RecvCredit {
        RecvCredit::with_policy(classic::ClassicRecv::new(local_buffer))
    }

    /// AOSP burst mode with the fixed grant `initial` announced at open.
    pub fn aosp(local_buffer: usize, initial: u64) -> RecvCredit {
        RecvCredit::with_policy(aosp::AospRecv::new(local_buffer, initial))
    }

    /// Adaptive window starting at `params.initial` (clamped to the cap and
    /// to what the budget allows), at time `now_ns`.
    pub fn adaptive(params: AdaptiveParams, now_ns: u64) -> RecvCredit {
        RecvCredit::with_policy(AdaptiveWindow::new(params, now_ns))
    }

    fn with_policy(policy: impl ReceivePolicy + 'static) -> RecvCredit {
        RecvCredit {
            policy: Box::new(policy),
            counts: Counts::default(),
        }
    }

    /// The grant announced at open (OPEN.arg1 or the accepting OKAY), for the
    /// adaptive window; the other modes use the configured fixed credit.
    pub fn initial_grant(&self) -> Option<u64> {
        self.policy.initial_grant()
    }

    pub fn buffered(&self) -> usize {
        self.counts.buffered() as usize
    }

    /// The window grants aim for now (adaptive), for statistics.
    pub fn window(&self) -> Option<u64> {
        self.policy.window()
    }

    /// Granted and not yet consumed (adaptive): the sender may have this much
    /// in flight, plus the one packet it may overshoot by.
    pub fn credit_outstanding(&self) -> Option<u64> {
        self.policy.credit_outstanding(self.counts)
    }

    /// Smallest round trip measured so far (adaptive), in nanoseconds.
    pub fn min_rtt_ns(&self) -> Option<u64> {
        self.policy.min_rtt_ns()
    }

    /// Last measured consumption rate (adaptive), bytes per second.
    pub fn rate(&self) -> Option<u64> {
        self.policy.rate()
    }

    /// Starts a round-trip probe, ended by the peer's next OKAY to our OPEN
    /// or its next WRTE.
    pub fn start_rtt_probe(&mut self, now_ns: u64) {
        self.policy.start_rtt_probe(now_ns);
    }

    /// Ends a round-trip probe, if one is running.
    pub fn end_rtt_probe(&mut self, now_ns: u64) {
        self.policy.end_rtt_probe(now_ns);
    }

    /// Whether the peer may send `bytes` more now: classic peers wait for
    /// our OKAY after each WRTE; delayed-ack peers stay within what we
    /// granted, overshooting by less than one packet of `max_packet`. `Err`
    /// says by how much a WRTE broke that.
    pub fn admit(&self, bytes: usize, max_packet: usize) -> Result<(), String> {
        self.policy.admit(self.counts, bytes, max_packet)
    }

    pub fn on_received(&mut self, bytes: usize, now_ns: u64) {
        let backlog = self.counts.buffered();
        self.counts.received += bytes as u64;
        self.policy.on_received(bytes, backlog, self.counts, now_ns);
        self.end_rtt_probe(now_ns);
    }

    pub fn on_consumed(&mut self, bytes: usize, now_ns: u64) {
        self.on_read(bytes, 0, now_ns);
    }

    /// The consumer took `bytes`, after which the first `pinned` bytes of
    /// the packet it is reading (those it took) stay allocated with the rest.
    pub fn on_read(&mut self, bytes: usize, pinned: u64, now_ns: u64) {
        self.policy.set_pinned(pinned);
        let backlog = self.counts.buffered();
        self.counts.consumed += bytes as u64;
        self.policy.on_consumed(backlog, self.counts, now_ns);
    }

    /// Whether the sender has no credit left because our consumer has not
    /// taken what arrived (the stream waits on the consumer).
    pub fn withholding(&self) -> bool {
        self.policy.withholding(self.counts)
    }

    /// Headroom currently added to the adaptive window (statistics).
    pub fn headroom(&self) -> Option<u64> {
        self.policy.headroom()
    }

    /// The OKAYs to send now: `None` entries are classic empty OKAYs, `Some(n)`
    /// delayed-ack OKAYs carrying `n` acknowledged bytes.
    pub fn take_okays(&mut self, out: &mut Vec<Option<i32>>, now_ns: u64) {
        self.policy.take_okays(out, self.counts, now_ns);
    }
}

/// A delayed-ack peer stays within `granted`, overshooting by less than one
/// packet of `max_packet`.
fn admit_within(
    counts: Counts,
    bytes: usize,
    granted: u64,
    max_packet: usize,
) -> Result<(), String> {
    let after = counts.received + bytes as u64;
    if after > granted + max_packet as u64 {
        return Err(format!(
            "{after} bytes received against {granted} granted (and one {max_packet}-byte packet)"
        ));
    }
    Ok(())
}

/// OKAY amounts are i32 on the wire.
pub(crate) fn push_okays(out: &mut Vec<Option<i32>>, mut owed: u64) {
    while owed > 0 {
        let chunk = owed.min(i32::MAX as u64);
        out.push(Some(chunk as i32));
        owed -= chunk;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
