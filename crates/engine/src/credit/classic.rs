//! Classic flow control (no `delayed_ack`): one WRTE in flight per stream,
//! released by an empty OKAY (`docs/flow-control.md`, "Classic").

use super::{Counts, ReceivePolicy};

/// One OKAY per WRTE, sent once the stream's backlog fits `local_buffer`.
#[derive(Debug)]
pub struct ClassicRecv {
    local_buffer: usize,
    owed_okays: u32,
}

impl ClassicRecv {
    pub fn new(local_buffer: usize) -> ClassicRecv {
        ClassicRecv {
            local_buffer,
            owed_okays: 0,
        }
    }
}

impl ReceivePolicy for ClassicRecv {
    fn admit(&self, counts: Counts, _bytes: usize, _max_packet: usize) -> Result<(), String> {
        if self.owed_okays > 0 {
            return Err(format!(
                "classic mode, a WRTE before our OKAY for the last one ({} bytes unread)",
                counts.buffered() as usize
            ));
        }
        Ok(())
    }

    fn on_received(&mut self, _bytes: usize, _backlog: u64, _counts: Counts, _now_ns: u64) {
        self.owed_okays += 1;
    }

    fn withholding(&self, _counts: Counts) -> bool {
        self.owed_okays > 0
    }

    fn take_okays(&mut self, out: &mut Vec<Option<i32>>, counts: Counts, _now_ns: u64) {
        if counts.buffered() as usize <= self.local_buffer {
            out.extend(std::iter::repeat_n(None, self.owed_okays as usize));
            self.owed_okays = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::credit::RecvCredit;

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
}
