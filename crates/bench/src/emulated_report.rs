//! The tables `oxadb-bench emulated` prints: one per link kind and round
//! trip, every row beside iperf3 in the same direction with the same
//! buffers.

use std::path::Path;

use crate::emulated::{
    packet_payload, stop_and_wait_mb_s, EmulatedArgs, Link, LinkRun, Row, RttResult, Target,
    DAEMON_PORT, MSS, SEGMENT_WIRE,
};

/// Round trips a transfer needs before its data flows, as oxadb's printed
/// time counts them: a push's clock starts with its first data (the
/// destination's `STA2` came before), and its last bytes wait a round trip
/// for the `OKAY` after `DONE`; a pull's clock starts before `STA2`
/// (whether the source is a directory decides what to ask for), then
/// `RCV2` takes another before the first byte.
fn protocol_round_trips(push: bool) -> f64 {
    if push {
        1.0
    } else {
        2.0
    }
}

pub(crate) fn print(args: &EmulatedArgs, oxadb: &Path, oxadbd: &Path, runs: &[LinkRun]) {
    let rate = args.rate_mbit * 1e6 / 8.0;
    println!("Machine: {}", crate::machine_description());
    let texts = &runs[0].texts;
    let mut tools = Vec::new();
    // One `adb version` text per Google adb used (29, 34).
    for line in texts
        .adb_version
        .lines()
        .filter(|l| l.trim().starts_with("Version "))
    {
        tools.push(format!(
            "Google adb {}",
            line.trim().trim_start_matches("Version ")
        ));
    }
    if let Some(line) = texts.iperf3_version.lines().next() {
        tools.push(line.trim().to_string());
    }
    tools.push(format!("{} and {}", oxadb.display(), oxadbd.display()));
    println!("Tools: {}", tools.join("; "));
    let rtts: Vec<String> = args.rtts.iter().map(|r| format!("{r}")).collect();
    println!(
        "Link: {} Mbit/s each way ({:.1} MB/s of TCP payload in 1500-byte frames), round trips {} ms, tail-drop queue {}",
        args.rate_mbit,
        rate * MSS / SEGMENT_WIRE / 1e6,
        rtts.join(", "),
        args.queue_limit
            .map_or("2 x BDP + 256 KiB".to_string(), |q| format!("{q} bytes")),
    );
    println!(
        "Transfer: {} MiB of random data per run, {} run(s), interleaved (order rotated per run); compression off (-z none); pushes into a private character device node (1, 3); oxadb's pulls {}; Google adb's pulls into tmpfs, compared with the source byte for byte",
        args.size >> 20,
        args.runs,
        if args.pull_into == Target::File {
            "into tmpfs, compared with the source byte for byte"
        } else {
            "into the same device node (--pull-into tmpfs for files)"
        }
    );
    println!(
        "MB/s are 10^6 bytes/s, as the tool reports them: iperf3's receiver, adb's and oxadb's `(N bytes in T s)`; wall MB/s is the size over the client process's whole life (start, connect, transfer). \"vs iperf3 + RTTs\" is the transfer's time over the time the same bytes take at iperf3's rate (same direction and buffers) plus the round trips before data flows (one for a push, two for a pull). Classic flow control's ceiling is one packet per round trip plus its serialization ({:.0} bytes per push packet, {:.0} per pull packet).",
        packet_payload(true),
        packet_payload(false)
    );
    for run in runs {
        print_link(args, run);
    }
    println!();
    println!("## oxadb --stats (the sync stream, as the client saw it)");
    for run in runs {
        for result in &run.results {
            for row in result.rows.iter().filter(|r| r.label.starts_with("oxadb")) {
                for (index, stats) in row.stats.iter().enumerate() {
                    println!();
                    println!(
                        "{}{}, {:?} link, round trip {} ms, run {}:",
                        row.label,
                        if row.small { ", default buffers" } else { "" },
                        run.link,
                        result.rtt.as_secs_f64() * 1e3,
                        index + 1
                    );
                    println!("```");
                    for line in stats {
                        println!("{line}");
                    }
                    println!("```");
                }
            }
        }
    }
}

fn print_link(args: &EmulatedArgs, run: &LinkRun) {
    let texts = &run.texts;
    println!();
    println!("## Link: {}", run.link.describe(args));
    println!();
    println!(
        "Namespaces: {} (198.18.0.1/24, every client) and {} (198.18.0.2/24: oxadbd on 198.18.0.2:{DAEMON_PORT}, the iperf3 server)",
        run.names[0], run.names[1]
    );
    println!(
        "TCP congestion control: {}{}",
        texts.congestion,
        if args.congestion_control.is_some() {
            " (--congestion-control)"
        } else {
            " (what a new namespace inherits from the host)"
        }
    );
    println!("TCP buffers: {}", texts.buffers);
    println!(
        "Default-buffer rows (the kernel's defaults for a new namespace unless --small-rmem/--small-wmem): {}",
        texts.small_buffers
    );
    let (connections, tls) = texts.tls;
    println!(
        "oxadb to oxadbd: {connections} connections, {tls} of them over TLS 1.3 (daemon --tls {})",
        args.daemon_tls
            .as_deref()
            .unwrap_or("default: offered beyond loopback")
    );
    for result in &run.results {
        print_round_trip(run.link, result, args.size);
    }
}

fn print_round_trip(link: Link, result: &RttResult, size: u64) {
    let ms = result.rtt.as_secs_f64() * 1e3;
    let rate = result.params.rate;
    println!();
    println!("### {link:?} link, round trip {ms} ms");
    println!();
    if link == Link::External {
        println!("Ping {}: {}", result.ping, result.ping_verdict);
    } else {
        println!(
            "Ping {}: {}; queue limit {} bytes; link over these transfers: {} frames ({} of 1500 bytes), {} of 1500 bytes dropped, released {:.0} us late on average, {:.0} us at most, longest queue {} bytes",
            result.ping,
            result.ping_verdict,
            result.params.queue_limit,
            result.frames,
            result.segments,
            result.drops,
            if result.frames == 0 { 0.0 } else { result.late_sum_ns as f64 / result.frames as f64 / 1e3 },
            result.late_max_ns as f64 / 1e3,
            result.peak_backlog
        );
    }
    println!(
        "Classic flow control's ceiling at this round trip: {:.1} MB/s push, {:.1} MB/s pull.",
        stop_and_wait_mb_s(true, result.rtt, rate),
        stop_and_wait_mb_s(false, result.rtt, rate)
    );
    println!();
    println!("| transfer | runs (MB/s) | median MB/s | wall MB/s | vs iperf3 | median s | vs iperf3 + RTTs | client CPU s/GiB | device CPU s/GiB | frames dropped |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    // Each row against iperf3 in the same direction with the same buffers.
    let iperf3 = |push: bool, small: bool| {
        result
            .rows
            .iter()
            .find(|r| r.small == small && is_iperf3(r) && r.push == push)
            .map(|r| crate::median(&mut r.rates.clone()))
    };
    for row in &result.rows {
        let median = crate::median(&mut row.rates.clone());
        let seconds = size as f64 / median / 1e6;
        let wall = crate::median(&mut row.walls.clone());
        let (versus, versus_time) = match iperf3(row.push, row.small) {
            Some(reference) if !is_iperf3(row) => {
                let allowed = size as f64 / reference / 1e6
                    + protocol_round_trips(row.push) * result.rtt.as_secs_f64();
                (
                    format!("{:.2}", median / reference),
                    format!("{:.3}", seconds / allowed),
                )
            }
            Some(_) => ("1.00".to_string(), "-".to_string()),
            None => ("-".to_string(), "-".to_string()),
        };
        let client_cpu = crate::median(&mut row.client_cpu.clone());
        let device_cpu = crate::median(&mut row.device_cpu.clone());
        let drops = if link == Link::External {
            "-".to_string()
        } else {
            let drops: Vec<String> = row.drops.iter().map(|d| d.to_string()).collect();
            drops.join(", ")
        };
        println!(
            "| {}{} | {} | {median:.1} | {wall:.1} | {versus} | {seconds:.2} | {versus_time} | {client_cpu:.2} | {device_cpu:.2} | {drops} |",
            row.label,
            if row.small { ", default buffers" } else { "" },
            row.rates
                .iter()
                .map(|r| format!("{r:.1}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
}

fn is_iperf3(row: &Row) -> bool {
    row.label.starts_with("iperf3")
}
