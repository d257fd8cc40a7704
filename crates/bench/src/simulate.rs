//! `simulate`: every credit policy on every modelled link, run in the
//! deterministic link simulator (`oxadb-sim`). Virtual time, so the numbers
//! are the policies' and the links', not this machine's.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use oxadb_engine::CreditMode;
use oxadb_sim::{reference_cases, run, Consumer, Link, Outcome, Scenario};
use oxadb_wire::MAX_PAYLOAD;

const POLICIES: [CreditMode; 3] = [CreditMode::Classic, CreditMode::Aosp, CreditMode::Adaptive];
const MIB: f64 = (1 << 20) as f64;
const MS: u64 = 1_000_000;

/// A consumer, as a table heading and how it is built for a link.
struct ConsumerKind {
    title: &'static str,
    for_link: fn(&Link) -> Consumer,
    /// Runs push this many times `--size` in the one-stream tables.
    size_multiple: u64,
}

const CONSUMERS: [ConsumerKind; 3] = [
    ConsumerKind {
        title: "Fast consumer",
        for_link: |_| Consumer::Fast,
        size_multiple: 1,
    },
    ConsumerKind {
        title: "Slow consumer (a quarter of the link's payload rate)",
        for_link: |link| Consumer::quarter_of(link, MAX_PAYLOAD),
        size_multiple: 1,
    },
    ConsumerKind {
        title: "Stalling consumer (fast, but reads nothing for 50 ms of every 100 ms)",
        for_link: |_| Consumer::stalling(),
        // The adaptive window learns a stall's length from the first one:
        // four times the size shows the steady state past that lesson.
        size_multiple: 4,
    },
];

pub fn simulate(size: u64, series_dir: Option<&Path>) -> Result<()> {
    let wall = Instant::now();
    if let Some(dir) = series_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    println!(
        "Push of {} MiB host to device, 1 MiB packets, virtual time. Links:\n",
        size >> 20
    );
    for link in Link::all() {
        println!(
            "- {}: {:.1} MB/s raw ({:.1} MB/s of payload), {} us round trip, {} us per packet, arrivals batched every {} us",
            link.name,
            link.rate as f64 / 1e6,
            link.payload_rate(MAX_PAYLOAD as usize) / 1e6,
            link.round_trip_ns() / 1000,
            link.per_transfer_overhead_ns / 1000,
            link.batch_interval_ns / 1000,
        );
    }
    println!(
        "\nMB/s and % of link count payload bytes consumed from the first stream's \
         opening to the last byte consumed; peak in flight is the most payload the \
         host had sent and the device's consumer had not taken (in the sender's \
         queue, on the link or unread: what the grants let exist); peak unread is \
         the most the device held unread; OKAYs sent include the one accepting \
         each stream."
    );
    for kind in &CONSUMERS {
        let bytes = size * kind.size_multiple;
        println!("\n### {}, one stream, {} MiB\n", kind.title, bytes >> 20);
        println!("| link | policy | MB/s | % of link | peak in flight MiB | peak unread MiB | OKAYs sent | done |");
        println!("|---|---|---:|---:|---:|---:|---:|---|");
        for link in Link::all() {
            for policy in POLICIES {
                let scenario = Scenario::new(link, (kind.for_link)(&link), policy, bytes);
                let outcome = run(&scenario);
                println!("| {} | {} | {}", link.name, policy, measurements(&outcome));
                if let Some(dir) = series_dir {
                    write_series(dir, &scenario, &outcome)?;
                }
            }
        }
    }
    shared_link(size);
    ablations(size);
    reference_scenarios(size);
    rtt_sweep(size, series_dir)?;
    println!(
        "\nSimulation wall-clock time: {:.2} s",
        wall.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Three streams, each with its own consumer, behind a sender that queues
/// at most one packet on the link (as a socket buffer would), so that the
/// engine's round robin decides who sends.
fn shared_link(size: u64) {
    println!("\n### Three streams sharing the link, sender queue 1 MiB\n");
    println!("Consumers read per stream; the spread is how much earlier the first stream finished than the last.\n");
    println!("| link | consumer | policy | MB/s | % of link | peak in flight MiB | peak unread MiB | OKAYs sent | done | finish spread |");
    println!("|---|---|---|---:|---:|---:|---:|---:|---|---:|");
    for link in Link::all() {
        for kind in &CONSUMERS[..2] {
            for policy in POLICIES {
                let mut scenario = Scenario::new(link, (kind.for_link)(&link), policy, size);
                scenario.streams = 3;
                scenario.sender_queue_limit = Some(u64::from(MAX_PAYLOAD));
                let outcome = run(&scenario);
                let finished: Vec<u64> = outcome
                    .streams
                    .iter()
                    .filter_map(|s| s.finished_ns)
                    .collect();
                let spread = match (finished.iter().min(), finished.iter().max()) {
                    (Some(first), Some(last)) if *last > outcome.started_ns => {
                        let span = (last - outcome.started_ns) as f64;
                        format!("{:.0}%", (last - first) as f64 * 100.0 / span)
                    }
                    _ => "-".into(),
                };
                println!(
                    "| {} | {} | {} | {} {spread} |",
                    link.name,
                    scenario.consumer.name(),
                    policy,
                    measurements(&outcome)
                );
            }
        }
    }
}

/// The receiver delaying its window updates (the smoltcp bug behind docs/flow-control.md, "When to send an OKAY") and,
/// for the adaptive policy, running without ack headroom.
fn ablations(size: u64) {
    println!("\n### Ablations, fast consumer, one stream\n");
    println!(
        "| link | policy | variant | MB/s | % of link | peak in flight MiB | peak unread MiB | OKAYs sent | done |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---|");
    for link in Link::all() {
        for policy in POLICIES {
            let base = Scenario::new(link, Consumer::Fast, policy, size);
            let mut variants = vec![(
                "window updates every 10 ms",
                Scenario {
                    delayed_updates: Some(10 * MS),
                    ..base.clone()
                },
            )];
            if policy == CreditMode::Adaptive {
                variants.push((
                    "no ack headroom",
                    Scenario {
                        ack_headroom: false,
                        ..base.clone()
                    },
                ));
            }
            for (variant, scenario) in variants {
                println!(
                    "| {} | {} | {variant} | {}",
                    link.name,
                    policy,
                    measurements(&run(&scenario))
                );
            }
        }
    }
}

/// The columns every table shares, from MB/s to done.
fn measurements(outcome: &Outcome) -> String {
    format!(
        "{:.1} | {:.1}% | {:.1} | {:.1} | {} | {} |",
        outcome.throughput / 1e6,
        outcome.link_utilisation * 100.0,
        outcome.peak_in_flight as f64 / MIB,
        outcome.peak_buffered as f64 / MIB,
        outcome.okays_sent,
        if outcome.completed { "yes" } else { "NO" },
    )
}

/// One CSV per run: the most bytes buffered in each millisecond.
fn write_series(dir: &Path, scenario: &Scenario, outcome: &Outcome) -> Result<()> {
    let path = dir.join(format!(
        "{}-{}-{}.csv",
        scenario.link.name,
        scenario.policy,
        scenario.consumer.name()
    ));
    let mut text = String::from("time_ns,buffered_bytes\n");
    for (time, buffered) in &outcome.series {
        writeln!(text, "{time},{buffered}")?;
    }
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

fn reference_scenarios(size: u64) {
    println!("\n### Reference scenarios\n");
    println!(
        "Each row is two runs that differ in one thing; the ratio is the documented effect \
         (each source and its figure: docs/flow-control.md, \"Reference scenarios\").\n"
    );
    println!("| scenario | comparison | with MB/s | without MB/s | ratio | peak in flight MiB with / without |");
    println!("|---|---|---:|---:|---:|---|");
    for case in reference_cases(size) {
        let with = run(&case.with);
        let without = run(&case.without);
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.2}x | {:.1} / {:.1} |",
            case.name,
            case.what,
            with.throughput / 1e6,
            without.throughput / 1e6,
            with.throughput / without.throughput,
            with.peak_in_flight as f64 / MIB,
            without.peak_in_flight as f64 / MIB,
        );
    }
}

/// Throughput against round trip on a 1 Gbit/s link, every policy, fast
/// consumer (the shape of the emulated end-to-end runs, on virtual time).
fn rtt_sweep(size: u64, series_dir: Option<&Path>) -> Result<()> {
    const RTTS_MS: [u64; 7] = [1, 2, 5, 10, 20, 50, 100];
    println!("\n### Throughput against round trip, 1 Gbit/s, fast consumer\n");
    println!("| RTT ms | classic MB/s | aosp MB/s | adaptive MB/s |");
    println!("|---:|---:|---:|---:|");
    let mut csv = String::from("rtt_ms,policy,mb_per_s\n");
    for rtt in RTTS_MS {
        let link = Link {
            name: "1gbit",
            one_way_delay_ns: rtt * MS / 2,
            ..Link::wan_1g()
        };
        let mut cells = Vec::new();
        for policy in POLICIES {
            let outcome = run(&Scenario::new(link, Consumer::Fast, policy, size));
            let rate = outcome.throughput / 1e6;
            cells.push(format!("{rate:.1}"));
            writeln!(csv, "{rtt},{policy},{rate:.3}").expect("writing to a String");
        }
        println!("| {rtt} | {} |", cells.join(" | "));
    }
    if let Some(dir) = series_dir {
        let path = dir.join("rtt-sweep.csv");
        std::fs::write(&path, csv).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
