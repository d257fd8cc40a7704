//! `stream-memory`: many streams pushing into consumers that do not read,
//! and what that costs the daemon in memory under each credit policy. The
//! streams share one connection, or (`--connections N`) each has its own:
//! then every connection's read buffer is held too.
//!
//! Each stream runs `sleep S; head -c N >/dev/null` on oxadbd (the shell
//! reads nothing until it wakes; `head` then drains it) while the host writes a
//! fixed amount into it as fast as credit allows. The daemon holds whatever
//! credit lets arrive: AOSP's 32 MiB per stream, or the adaptive window
//! within the process budget. Its resident set is sampled every 20 ms.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use tokio::io::AsyncWriteExt;

/// A process's resident set (`VmRSS`) in bytes.
fn resident_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS line")?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .context("bad VmRSS line")?
        .parse()?;
    Ok(kib * 1024)
}

pub struct MemoryRun {
    pub credit: String,
    /// The max payload the daemon offered in CNXN.
    pub packet: u32,
    pub baseline: u64,
    pub peak: u64,
    pub elapsed: Duration,
}

/// How the streams reach the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Every stream on one connection.
    OneConnection,
    /// One connection per stream.
    ConnectionEach,
}

/// One daemon, `streams` pushes of `per_stream` bytes each into shells that
/// sleep `stall` before reading.
pub fn one_run(
    oxadbd: &Path,
    credit: &str,
    budget: u64,
    streams: usize,
    spread: Spread,
    per_stream: u64,
    stall: Duration,
) -> Result<MemoryRun> {
    let port = crate::free_port()?;
    let serial = format!("127.0.0.1:{port}");
    let mut daemon = Command::new(oxadbd);
    daemon
        .args(["--listen", &serial, "--credit", credit])
        .arg("--memory-budget")
        .arg(budget.to_string());
    if spread == Spread::ConnectionEach && streams > 64 {
        // The default, 64, would refuse the 65th.
        daemon.arg("--max-connections").arg(streams.to_string());
    }
    let mut daemon = daemon
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", oxadbd.display()))?;
    let pid = daemon.id();
    let result = (|| {
        let runtime = tokio::runtime::Runtime::new()?;
        runtime.block_on(async {
            let options = oxadb::ConnectOptions {
                authenticate: false,
                ..Default::default()
            };
            // The daemon needs a moment to listen.
            let deadline = Instant::now() + Duration::from_secs(10);
            let first = loop {
                match oxadb::Device::connect(&serial, &options).await {
                    Ok(device) => break device,
                    Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(e) => bail!("connecting to oxadbd at {serial}: {e}"),
                }
            };
            ensure!(first.burst_mode() || credit == "classic", "no burst mode");
            let packet = first.max_payload();
            let mut devices = vec![first];
            if spread == Spread::ConnectionEach {
                for _ in 1..streams {
                    devices.push(
                        oxadb::Device::connect(&serial, &options)
                            .await
                            .with_context(|| format!("connecting to oxadbd at {serial}"))?,
                    );
                }
            }
            let baseline = resident_bytes(pid)?;
            let done = Arc::new(AtomicBool::new(false));
            let sampler = {
                let done = done.clone();
                tokio::task::spawn_blocking(move || {
                    let mut peak = 0;
                    while !done.load(Ordering::Relaxed) {
                        peak = peak.max(resident_bytes(pid).unwrap_or(0));
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    peak
                })
            };
            let started = Instant::now();
            // Raw `exec:` has no end-of-input signal short of closing the
            // stream, so the consumer reads exactly what is sent, then exits.
            let command = oxadb::DeviceService::Exec(format!(
                "sleep {}; head -c {per_stream} >/dev/null",
                stall.as_secs_f64()
            ));
            let mut tasks = Vec::new();
            for i in 0..streams {
                let mut stream = devices[i % devices.len()].open(&command).await?;
                tasks.push(tokio::spawn(async move {
                    let block = vec![0x5au8; 1 << 20];
                    let mut left = per_stream;
                    while left > 0 {
                        let n = left.min(block.len() as u64) as usize;
                        stream.write_all(&block[..n]).await?;
                        left -= n as u64;
                    }
                    stream.flush().await?;
                    // The consumer exits once it has read everything, and the
                    // daemon closes the stream.
                    while stream.read_chunk(1 << 16).await?.is_some() {}
                    anyhow::Ok(())
                }));
            }
            for task in tasks {
                task.await??;
            }
            let elapsed = started.elapsed();
            done.store(true, Ordering::Relaxed);
            let peak = sampler.await?;
            for device in &devices {
                device.close();
            }
            Ok(MemoryRun {
                credit: credit.to_string(),
                packet,
                baseline,
                peak,
                elapsed,
            })
        })
    })();
    let _ = daemon.kill();
    let _ = daemon.wait();
    result
}

pub fn stream_memory(
    oxadbd: &Path,
    credits: &[String],
    budget: u64,
    streams: usize,
    spread: Spread,
    per_stream: u64,
    stall: Duration,
) -> Result<()> {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut runs = Vec::new();
    for credit in credits {
        let run = one_run(oxadbd, credit, budget, streams, spread, per_stream, stall)?;
        eprintln!(
            "{credit}: peak RSS {:.1} MiB (baseline {:.1}) in {:.1} s",
            mib(run.peak),
            mib(run.baseline),
            run.elapsed.as_secs_f64()
        );
        runs.push(run);
    }
    // Everything a stream and its connection hold is charged to the budget,
    // and packets are sized so that what cannot be refused (floors,
    // overshoots, partly read packets, read buffers) fits it for as many
    // stalled streams as the daemon serves connections; what is left is in
    // consumers' hands (the exec service reads up to 128 KiB ahead) and the
    // allocator's: 1 MiB per stream (docs/flow-control.md, "Memory budget").
    let bound = budget + streams as u64 * (1 << 20);
    println!("Machine: {}", crate::machine_description());
    let connections = match spread {
        Spread::OneConnection => "on one connection".to_string(),
        Spread::ConnectionEach => format!("on {streams} connections"),
    };
    println!(
        "{streams} streams {connections}, each pushing {} MiB into `sleep {}; head -c N >/dev/null` on oxadbd; \
         budget {} MiB (`--memory-budget`); the daemon's VmRSS sampled every 20 ms",
        per_stream >> 20,
        stall.as_secs_f64(),
        budget >> 20
    );
    println!(
        "Bound for the adaptive policy: baseline + budget + {streams} x 1 MiB = baseline + {:.0} MiB",
        mib(bound)
    );
    println!();
    println!("| credit | packet KiB | baseline RSS MiB | peak RSS MiB | peak - baseline MiB | bound MiB | within bound | elapsed s |");
    println!("|---|---:|---:|---:|---:|---:|---|---:|");
    for run in &runs {
        let grown = run.peak.saturating_sub(run.baseline);
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {} | {:.1} |",
            run.credit,
            run.packet >> 10,
            mib(run.baseline),
            mib(run.peak),
            mib(grown),
            mib(bound),
            if grown <= bound { "yes" } else { "no" },
            run.elapsed.as_secs_f64()
        );
    }
    Ok(())
}
