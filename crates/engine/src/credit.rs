//! Per-stream credit: how much a sender may put in flight, and when a receiver
//! returns credit.
//!
//! Two modes exist on the wire (see `docs/dev/delayed_ack.md` in AOSP):
//! - classic: one WRTE in flight per stream; an empty OKAY releases the next one.
//! - delayed ack ("burst mode"), negotiated by the `delayed_ack` feature on both
//!   sides: OPEN.arg1 and the first OKAY's i32 payload grant initial credit, every
//!   later OKAY carries the i32 number of bytes acknowledged, and the sender keeps
//!   sending while its credit is positive (overshooting by at most one packet).

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

/// Receiver-side accounting of one stream. Bytes count as "flushed" once they
/// fit in the local buffer or the consumer has taken them: AOSP acknowledges
/// after writing to its local socket, whose kernel buffer plays that role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvCredit {
    delayed: bool,
    local_buffer: usize,
    received: u64,
    buffered: usize,
    acked: u64,
    /// Classic only: WRTEs whose OKAY has not been sent yet.
    owed_okays: u32,
}

impl RecvCredit {
    pub fn new(delayed: bool, local_buffer: usize) -> RecvCredit {
        RecvCredit {
            delayed,
            local_buffer,
            received: 0,
            buffered: 0,
            acked: 0,
            owed_okays: 0,
        }
    }

    pub fn buffered(&self) -> usize {
        self.buffered
    }

    pub fn on_received(&mut self, bytes: usize) {
        self.received += bytes as u64;
        self.buffered += bytes;
        if !self.delayed {
            self.owed_okays += 1;
        }
    }

    pub fn on_consumed(&mut self, bytes: usize) {
        self.buffered -= bytes;
    }

    /// The OKAYs to send now: `None` entries are classic empty OKAYs, `Some(n)`
    /// delayed-ack OKAYs carrying `n` acknowledged bytes.
    pub fn take_okays(&mut self, out: &mut Vec<Option<i32>>) {
        if self.delayed {
            // Return what is flushed and not yet returned (AOSP returns credit
            // per flush); bytes beyond the local buffer wait for the consumer.
            let overflow = self.buffered.saturating_sub(self.local_buffer) as u64;
            let flushed = self.received - overflow;
            let mut owed = flushed.saturating_sub(self.acked);
            self.acked = self.acked.max(flushed);
            while owed > 0 {
                let chunk = owed.min(i32::MAX as u64);
                out.push(Some(chunk as i32));
                owed -= chunk;
            }
        } else if self.buffered <= self.local_buffer {
            out.extend(std::iter::repeat_n(None, self.owed_okays as usize));
            self.owed_okays = 0;
        }
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

    #[test]
    fn classic_receiver_acks_each_packet_once_buffered_fits() {
        let mut credit = RecvCredit::new(false, 100);
        let mut out = Vec::new();
        credit.on_received(60);
        credit.take_okays(&mut out);
        assert_eq!(out, vec![None]);
        out.clear();
        credit.on_received(60);
        credit.take_okays(&mut out);
        assert!(
            out.is_empty(),
            "120 bytes buffered exceed the 100-byte local buffer"
        );
        credit.on_consumed(60);
        credit.take_okays(&mut out);
        assert_eq!(out, vec![None]);
    }

    #[test]
    fn delayed_receiver_returns_flushed_bytes() {
        let mut credit = RecvCredit::new(true, 100);
        let mut out = Vec::new();
        credit.on_received(80);
        credit.take_okays(&mut out);
        assert_eq!(out, vec![Some(80)]);
        out.clear();
        credit.on_received(50);
        credit.on_received(50);
        credit.take_okays(&mut out);
        assert_eq!(
            out,
            vec![Some(20)],
            "only what fits the 100-byte buffer is flushed"
        );
        out.clear();
        credit.on_consumed(100);
        credit.take_okays(&mut out);
        assert_eq!(out, vec![Some(80)]);
        out.clear();
        credit.take_okays(&mut out);
        assert!(out.is_empty(), "nothing new to return");
    }
}
