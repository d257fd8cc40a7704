//! AOSP's burst mode: a fixed grant at open, returned as bytes are flushed
//! (`docs/flow-control.md`, "Delayed ack (AOSP \"burst mode\")").

use super::{admit_within, push_okays, Counts, ReceivePolicy};

/// Bytes count as "flushed" once they fit in the local buffer or the
/// consumer has taken them: AOSP acknowledges after writing to its local
/// socket, whose kernel buffer plays that role.
#[derive(Debug)]
pub struct AospRecv {
    local_buffer: usize,
    acked: u64,
    /// The fixed grant announced at open.
    initial: u64,
}

impl AospRecv {
    pub fn new(local_buffer: usize, initial: u64) -> AospRecv {
        AospRecv {
            local_buffer,
            acked: 0,
            initial,
        }
    }
}

impl ReceivePolicy for AospRecv {
    fn admit(&self, counts: Counts, bytes: usize, max_packet: usize) -> Result<(), String> {
        admit_within(counts, bytes, self.initial + self.acked, max_packet)
    }

    fn on_received(&mut self, _bytes: usize, _backlog: u64, _counts: Counts, _now_ns: u64) {}

    fn withholding(&self, counts: Counts) -> bool {
        counts.received >= self.initial + self.acked
    }

    fn take_okays(&mut self, out: &mut Vec<Option<i32>>, counts: Counts, _now_ns: u64) {
        let buffered = counts.buffered() as usize;
        // Return what is flushed and not yet returned (AOSP returns
        // credit per flush); bytes beyond the local buffer wait for
        // the consumer.
        let overflow = buffered.saturating_sub(self.local_buffer) as u64;
        let flushed = counts.received - overflow;
        let owed = flushed.saturating_sub(self.acked);
        self.acked = self.acked.max(flushed);
        push_okays(out, owed);
    }
}

#[cfg(test)]
mod tests {
    use crate::credit::RecvCredit;

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
}
