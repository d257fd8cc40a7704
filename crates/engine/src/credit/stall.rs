//! Consumer stalls, measured for the adaptive window (`docs/flow-control.md`,
//! "Adaptive credit": windows sized for consumer stalls).

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
pub(crate) struct StallTracker {
    /// When the consumer last took anything or, if it had taken everything,
    /// when more arrived (ns), and how much had been received by then.
    pub(crate) last_read: (u64, u64),
    /// When the sender ran out of credit (ns) and how much had been received.
    pub(crate) blocked: Option<(u64, u64)>,
    /// The window the last stall called for, applied once the consumer
    /// catches up.
    pub(crate) pending: u64,
}
