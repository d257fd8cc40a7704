//! What a run simulates and what it measured.

use oxadb_engine::{CreditMode, StreamStats};
use oxadb_wire::MAX_PAYLOAD;

use crate::link::Link;

const MS: u64 = 1_000_000;
const NS_PER_SEC: u64 = 1_000_000_000;

/// How the receiving application (the device, in a push) reads its streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumer {
    /// Reads everything as soon as it arrives.
    Fast,
    /// Reads at most `bytes_per_sec` per stream, in slices of one
    /// [`SLOW_TICK_NS`] tick; time spent idle is not made up later (a disk
    /// that only writes so fast).
    Slow { bytes_per_sec: u64 },
    /// Fast, except that the last `stall_ns` of every `period_ns` (counted
    /// from virtual time zero) it reads nothing (a file system flushing, a
    /// process descheduled).
    Stalling { period_ns: u64, stall_ns: u64 },
}

/// The slow consumer's tick: short enough that the adaptive policy (which
/// measures rates over at least 1 ms) sees a steady rate.
pub const SLOW_TICK_NS: u64 = MS;

impl Consumer {
    /// A consumer reading at a quarter of what `link` carries: the link is
    /// never the bottleneck, the consumer always is.
    pub fn quarter_of(link: &Link, max_payload: u32) -> Consumer {
        Consumer::Slow {
            bytes_per_sec: (link.payload_rate(max_payload as usize) / 4.0) as u64,
        }
    }

    /// Reads for 50 ms, then stalls for 50 ms, over and over: a stall is
    /// at least a round trip on every link we model, so the sender fills
    /// whatever credit it has, and even a 256 MiB push over loopback (67 ms)
    /// meets one.
    pub fn stalling() -> Consumer {
        Consumer::Stalling {
            period_ns: 100 * MS,
            stall_ns: 50 * MS,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Consumer::Fast => "fast",
            Consumer::Slow { .. } => "slow",
            Consumer::Stalling { .. } => "stalling",
        }
    }
}

/// One simulated push: the host writes `bytes` over `streams` streams, the
/// device consumes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    pub link: Link,
    pub consumer: Consumer,
    /// Classic: neither side offers `delayed_ack`. Aosp and Adaptive: both
    /// offer it and use that receive policy.
    pub policy: CreditMode,
    /// Total bytes pushed, split evenly over the streams.
    pub bytes: u64,
    /// Streams sharing the link (each has its own consumer).
    pub streams: u32,
    /// A [`oxadb_engine::MemoryBudget`] limit for each side (`None`: no budget).
    pub budget_limit: Option<u64>,
    /// [`oxadb_engine::Config::ack_headroom`] on both sides.
    pub ack_headroom: bool,
    /// [`oxadb_engine::Config::slow_start`] on both sides.
    pub slow_start: bool,
    /// Hold the device's window updates (every OKAY after the one accepting a
    /// stream) until the next tick of a delayed-ack timer of this period.
    pub delayed_updates: Option<u64>,
    pub max_payload: u32,
    /// Bytes a sender's driver lets wait on its side of the link (a socket
    /// send buffer) before it stops taking packets from its engine. `None`:
    /// it takes every packet the engine offers at once, which is the same
    /// for one stream (credit bounds it) but serves several streams in the
    /// order they filled the queue instead of the engine's round robin.
    pub sender_queue_limit: Option<u64>,
    /// The run stops here, incomplete, if the transfer has not finished.
    pub time_limit_ns: u64,
    /// The buffered-bytes time series keeps the maximum of each interval.
    pub series_interval_ns: u64,
}

impl Scenario {
    /// One stream, no budget, immediate window updates, 1 MiB packets, no
    /// limit on the senders' queues.
    pub fn new(link: Link, consumer: Consumer, policy: CreditMode, bytes: u64) -> Scenario {
        Scenario {
            link,
            consumer,
            policy,
            bytes,
            streams: 1,
            budget_limit: None,
            ack_headroom: true,
            slow_start: true,
            delayed_updates: None,
            max_payload: MAX_PAYLOAD,
            sender_queue_limit: None,
            time_limit_ns: 600 * NS_PER_SEC,
            series_interval_ns: MS,
        }
    }
}

/// What one receiving stream did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOutcome {
    pub bytes_consumed: u64,
    /// When the consumer read the stream's end of file, ns.
    pub finished_ns: Option<u64>,
    pub peak_buffered: u64,
    /// The largest adaptive window seen (`None` for the other policies).
    pub peak_window: Option<u64>,
    /// The most the stream ever held beyond its grant: the fixed credit plus
    /// the local buffer (aosp), the local buffer (classic), the largest
    /// window so far (adaptive). The protocol allows up to one packet.
    pub peak_over_grant: i64,
    /// The device's engine counters, taken when the stream ended (or when
    /// the run did).
    pub engine_stats: Option<StreamStats>,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Every byte was consumed and every stream closed before the time limit.
    pub completed: bool,
    /// When the first stream opened (the host starts writing), ns.
    pub started_ns: u64,
    /// From `started_ns` to the last byte consumed, and processed for a slow
    /// consumer (to the time limit, or to the last event, for an incomplete run).
    pub elapsed_ns: u64,
    pub bytes_delivered: u64,
    /// Bytes consumed per second over `elapsed_ns`.
    pub throughput: f64,
    /// `throughput` over the payload rate the link carries with max-size packets.
    pub link_utilisation: f64,
    /// The most the device ever held unread, over all streams (sampled after
    /// arrivals, before the consumer reads).
    pub peak_buffered: u64,
    /// The most payload ever sent by the host and not yet consumed by the
    /// device, over all streams: what the grants let exist between the two
    /// applications (the sender's queue, the link, the device's buffer).
    /// Sampled with `peak_buffered`.
    pub peak_in_flight: u64,
    /// OKAY packets the device put on the link, including each stream's accept.
    pub okays_sent: u64,
    /// WRTE packets the host put on the link.
    pub wrtes_sent: u64,
    /// The device budget's peak commitment, when a budget was set.
    pub budget_peak: Option<u64>,
    pub streams: Vec<StreamOutcome>,
    /// (start of interval ns, most bytes buffered in it), one point per
    /// `series_interval_ns` in which anything happened.
    pub series: Vec<(u64, u64)>,
}
