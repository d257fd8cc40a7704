//! The documented effects of the flow-control rules' outside sources, each
//! reproduced as two simulated runs that differ in one thing. A case is
//! labelled by its source's number in the design notes: 000 AOSP's delayed
//! ACK (`docs/dev/delayed_ack.md`), 002 smoltcp's window-update fix (PR 935),
//! 003 TCP buffer sizing on an i.MX6 board (buffer ceilings from free memory,
//! Linux's `tcp_mem`), 004 BBR's ACK-aggregation estimate. The rules are in
//! `docs/flow-control.md`.

use oxadb_engine::CreditMode;

use crate::{Consumer, Link, Scenario};

const MS: u64 = 1_000_000;

/// One line per source: the effect it documents, as a ratio of two runs.
pub struct SeedCase {
    pub seed: &'static str,
    pub what: &'static str,
    pub with: Scenario,
    pub without: Scenario,
}

/// The documented effect of each source (listed in the module's note),
/// reproduced as a pair of runs that differ in one thing.
pub fn seed_cases(size: u64) -> Vec<SeedCase> {
    let fast = |link: Link, policy: CreditMode| Scenario::new(link, Consumer::Fast, policy, size);
    // 002 (smoltcp) and 004 (BBR) hold every OKAY after the accepting one for
    // a 10 ms timer: a receiver that delays its window updates (smoltcp's
    // case), which the sender sees as acknowledgements arriving in clumps
    // (BBR's).
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
        SeedCase {
            seed: "000",
            what: "burst (adaptive) vs classic on usb3",
            with: fast(Link::usb3(), CreditMode::Adaptive),
            without: fast(Link::usb3(), CreditMode::Classic),
        },
        SeedCase {
            seed: "002",
            what: "updates sent at once vs held for a 10 ms timer, loopback, headroom and ramp off",
            with: rule_alone(fast(Link::loopback(), CreditMode::Adaptive)),
            without: held(rule_alone(fast(Link::loopback(), CreditMode::Adaptive))),
        },
        SeedCase {
            seed: "003",
            what: "budget 1 GiB vs 8 MiB (per-stream cap 1 MiB), wan-1g",
            with: budget(fast(Link::wan_1g(), CreditMode::Adaptive), 1 << 30),
            without: budget(fast(Link::wan_1g(), CreditMode::Adaptive), 8 << 20),
        },
        SeedCase {
            seed: "004",
            what: "headroom on vs off, OKAYs arriving in 10 ms clumps, loopback",
            with: held(fast(Link::loopback(), CreditMode::Adaptive)),
            without: held(no_headroom(fast(Link::loopback(), CreditMode::Adaptive))),
        },
    ]
}
