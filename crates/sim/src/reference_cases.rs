//! The documented effects of the flow-control rules' outside sources, each
//! reproduced as two simulated runs that differ in one thing. A case is
//! named after the source it reproduces; `docs/flow-control.md`, "Reference
//! scenarios", gives each source and the figure the case answers to.

use oxadb_engine::CreditMode;

use crate::{Consumer, Link, Scenario};

const MS: u64 = 1_000_000;

/// One line per source: the effect it documents, as a ratio of two runs.
pub struct ReferenceCase {
    /// The source, as a short name (`aosp-delayed-ack`, ...).
    pub name: &'static str,
    pub what: &'static str,
    pub with: Scenario,
    pub without: Scenario,
}

/// The documented effect of each source, reproduced as a pair of runs that
/// differ in one thing.
pub fn reference_cases(size: u64) -> Vec<ReferenceCase> {
    let fast = |link: Link, policy: CreditMode| Scenario::new(link, Consumer::Fast, policy, size);
    // smoltcp's window updates and BBR's ACK aggregation hold every OKAY
    // after the accepting one for a 10 ms timer: a receiver that delays its
    // window updates (smoltcp's case), which the sender sees as
    // acknowledgements arriving in clumps (BBR's).
    let held = |mut scenario: Scenario| {
        scenario.delayed_updates = Some(10 * MS);
        scenario
    };
    let no_headroom = |mut scenario: Scenario| {
        scenario.ack_headroom = false;
        scenario
    };
    // The OKAY rule alone: no headroom, and no ramp (which grows the window
    // from what the consumer took, held updates or not).
    let rule_alone = |mut scenario: Scenario| {
        scenario.ack_headroom = false;
        scenario.slow_start = false;
        scenario
    };
    let budget = |mut scenario: Scenario, limit: u64| {
        scenario.budget_limit = Some(limit);
        scenario
    };
    vec![
        // AOSP's measurement of burst mode (adb's docs/dev/delayed_ack.md).
        ReferenceCase {
            name: "aosp-delayed-ack",
            what: "burst (adaptive) vs classic on usb3",
            with: fast(Link::usb3(), CreditMode::Adaptive),
            without: fast(Link::usb3(), CreditMode::Classic),
        },
        // smoltcp's fix for delayed window updates (smoltcp PR 935).
        ReferenceCase {
            name: "smoltcp-window-update",
            what: "updates sent at once vs held for a 10 ms timer, loopback, headroom and ramp off",
            with: rule_alone(fast(Link::loopback(), CreditMode::Adaptive)),
            without: held(rule_alone(fast(Link::loopback(), CreditMode::Adaptive))),
        },
        // Linux's receive-buffer ceilings sized from memory (tcp_mem,
        // tcp_rmem), and what halved ones cost an i.MX6 board.
        ReferenceCase {
            name: "linux-buffer-sizing",
            what: "budget 1 GiB vs 8 MiB (per-stream cap 1 MiB), wan-1g",
            with: budget(fast(Link::wan_1g(), CreditMode::Adaptive), 1 << 30),
            without: budget(fast(Link::wan_1g(), CreditMode::Adaptive), 8 << 20),
        },
        // BBR's ACK-aggregation estimate (Linux commit 78dc70ebaa38).
        ReferenceCase {
            name: "bbr-ack-aggregation",
            what: "headroom on vs off, OKAYs arriving in 10 ms clumps, loopback",
            with: held(fast(Link::loopback(), CreditMode::Adaptive)),
            without: held(no_headroom(fast(Link::loopback(), CreditMode::Adaptive))),
        },
    ]
}
