//! `oxadb-bench forward-loopback`: one transfer of incompressible data
//! through `oxadb forward` and through `oxadb reverse` against oxadbd on
//! loopback, in both directions, runs interleaved; medians and the ratio
//! reverse / forward measured in the same run.
//!
//! Forward: an app on the host connects to oxadb's listener, the daemon
//! connects to the target. Reverse: an app on the "device" connects to the
//! daemon's listener, oxadb connects to the target on the host. Both are
//! on this machine; ADB streams carry no compression (only sync does).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use rand::{RngCore, SeedableRng};

use crate::{free_port, list_runs, machine_description, median, start_daemon};

#[derive(clap::Parser)]
pub struct ForwardLoopbackArgs {
    /// Bytes per transfer (suffixes K, M, G are powers of 1024).
    #[arg(long, default_value = "1G", value_parser = oxadb_io::parse_size)]
    size: u64,
    /// Runs of each transfer; medians are reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[arg(long, default_value = "target/release/oxadbd")]
    oxadbd: PathBuf,
    #[arg(long, default_value = "target/release/oxadb")]
    oxadb: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Forward,
    Reverse,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// From the app that connects to the listener to the target.
    ToTarget,
    /// From the target back to the app.
    FromTarget,
}

/// An `oxadb forward` or `oxadb reverse` running in the background.
struct Relay {
    child: Child,
}

impl Relay {
    fn start(oxadb: &Path, serial: &str, args: &[String], ready: &str) -> Result<Relay> {
        let mut child = Command::new(oxadb)
            .arg("-s")
            .arg(serial)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", oxadb.display()))?;
        let mut stderr = BufReader::new(child.stderr.take().expect("piped"));
        let mut line = String::new();
        loop {
            line.clear();
            ensure!(
                stderr.read_line(&mut line)? > 0,
                "oxadb {} ended before serving",
                args.join(" ")
            );
            if line.starts_with(ready) {
                break;
            }
        }
        // Keep draining its stderr so that it never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Ok(Relay { child })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One transfer of `size` bytes of `block` (repeated) between an app
/// connecting to `listen_port` and the target listening on `target`;
/// timed from the connect to the last byte received.
fn transfer(
    target: &TcpListener,
    listen_port: u16,
    size: u64,
    block: &[u8],
    direction: Direction,
) -> Result<Duration> {
    let (done_tx, done_rx) = mpsc::channel::<Result<u64>>();
    let start = Instant::now();
    std::thread::scope(|scope| -> Result<Duration> {
        scope.spawn(|| {
            let result = (|| -> Result<u64> {
                let (mut socket, _) = target.accept()?;
                socket.set_nodelay(true)?;
                match direction {
                    Direction::ToTarget => receive(&mut socket, size),
                    Direction::FromTarget => {
                        send(&mut socket, size, block)?;
                        // ADB has no half-close: hold the socket open until
                        // the app has everything.
                        let mut byte = [0u8; 1];
                        let _ = socket.read(&mut byte);
                        Ok(size)
                    }
                }
            })();
            let _ = done_tx.send(result);
        });
        let mut app = TcpStream::connect(("127.0.0.1", listen_port))?;
        app.set_nodelay(true)?;
        let elapsed = match direction {
            Direction::ToTarget => {
                send(&mut app, size, block)?;
                let received = done_rx.recv().context("target thread")??;
                ensure!(received == size, "target got {received} of {size} bytes");
                start.elapsed()
            }
            Direction::FromTarget => {
                let received = receive(&mut app, size)?;
                let elapsed = start.elapsed();
                ensure!(received == size, "app got {received} of {size} bytes");
                drop(app);
                done_rx.recv().context("target thread")??;
                elapsed
            }
        };
        Ok(elapsed)
    })
}

fn send(socket: &mut TcpStream, size: u64, block: &[u8]) -> Result<()> {
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        socket.write_all(&block[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Reads until `size` bytes came (or EOF); returns how many did.
fn receive(socket: &mut TcpStream, size: u64) -> Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    while total < size {
        let n = socket.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    Ok(total)
}

pub fn forward_loopback(args: ForwardLoopbackArgs) -> Result<()> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    let dir = std::env::temp_dir().join(format!("oxadb-bench-fwd-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let port = free_port()?;
    let mut daemon = start_daemon(&args.oxadbd, port, &[], &dir.join("oxadbd.log"))?;
    let result = run(&args, port);
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(args: &ForwardLoopbackArgs, port: u16) -> Result<()> {
    let serial = format!("127.0.0.1:{port}");
    // Incompressible: random bytes, one 8 MiB block repeated.
    let mut block = vec![0u8; 8 << 20];
    rand::rngs::StdRng::seed_from_u64(0x0a_db).fill_bytes(&mut block);
    let target = TcpListener::bind("127.0.0.1:0")?;
    let target_spec = format!("tcp:{}", target.local_addr()?.port());
    let forward_port = free_port()?;
    let _forward = Relay::start(
        &args.oxadb,
        &serial,
        &[
            "forward".into(),
            "--foreground".into(),
            format!("tcp:{forward_port}"),
            target_spec.clone(),
        ],
        "forwarding",
    )?;
    let reverse_port = free_port()?;
    let _reverse = Relay::start(
        &args.oxadb,
        &serial,
        &[
            "reverse".into(),
            format!("tcp:{reverse_port}"),
            target_spec.clone(),
        ],
        "reversing",
    )?;
    let cases = [
        (Way::Forward, Direction::ToTarget),
        (Way::Reverse, Direction::ToTarget),
        (Way::Forward, Direction::FromTarget),
        (Way::Reverse, Direction::FromTarget),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for run in 0..args.runs {
        for step in 0..cases.len() {
            // Rotate the order each run so that no case always goes first.
            let which = (run + step) % cases.len();
            let (way, direction) = cases[which];
            let listen = match way {
                Way::Forward => forward_port,
                Way::Reverse => reverse_port,
            };
            let elapsed = transfer(&target, listen, args.size, &block, direction)?;
            let rate = args.size as f64 / elapsed.as_secs_f64() / 1e6;
            eprintln!("run {} {}: {rate:.0} MB/s", run + 1, name(way, direction));
            rates[which].push(rate);
        }
    }
    println!("Machine: {}", machine_description());
    println!(
        "Transfer: {} MiB of random bytes per run, {} runs, interleaved; oxadb in burst mode (adaptive credit), no compression",
        args.size >> 20,
        args.runs
    );
    println!();
    println!("| transfer | runs (MB/s) | median MB/s | reverse / forward |");
    println!("|---|---|---|---|");
    let medians: Vec<f64> = rates.iter().map(|r| median(&mut r.clone())).collect();
    for (which, &(way, direction)) in cases.iter().enumerate() {
        let ratio = match way {
            Way::Forward => "-".to_string(),
            Way::Reverse => format!("{:.2}", medians[which] / medians[which - 1]),
        };
        println!(
            "| {} | {} | {:.0} | {ratio} |",
            name(way, direction),
            list_runs(&rates[which]),
            medians[which]
        );
    }
    Ok(())
}

fn name(way: Way, direction: Direction) -> &'static str {
    match (way, direction) {
        (Way::Forward, Direction::ToTarget) => "forward, host app to device target",
        (Way::Forward, Direction::FromTarget) => "forward, device target to host app",
        (Way::Reverse, Direction::ToTarget) => "reverse, device app to host target",
        (Way::Reverse, Direction::FromTarget) => "reverse, host target to device app",
    }
}
