//! `stream-loopback`: the transport alone. One ADB stream between a host
//! engine and a device engine over loopback TCP, no services and no files,
//! beside raw TCP in the same run. It shows the ceiling the engine and the
//! driver put on every transfer.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use oxadb_engine::{Config, CreditMode, Role};
use oxadb_io::{Auth, Connection};
use oxadb_wire::Banner;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

fn config(role: Role, burst: bool) -> Config {
    let banner = Banner::new(if role == Role::Host { "host" } else { "device" });
    let mut config = Config::new(role, banner);
    config.set_credit_mode(if burst {
        CreditMode::Adaptive
    } else {
        CreditMode::Classic
    });
    if let Some(credit) = std::env::var("OXADB_BENCH_CREDIT")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        // A fixed grant: the AOSP policy with this credit instead of 32 MiB.
        config.credit_policy = oxadb_engine::CreditPolicy::Aosp;
        config.initial_credit = credit;
    }
    config
}

/// Sends `size` bytes host to device on one stream; returns the elapsed time.
pub async fn one_stream(size: u64, burst: bool) -> Result<Duration> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    // The device gets its own runtime, as it would in its own process.
    let device_runtime = tokio::runtime::Runtime::new()?;
    let device = device_runtime.spawn(async move {
        let listener = TcpListener::from_std(listener)?;
        let (socket, _) = listener.accept().await?;
        let (reader, sink, label) = oxadb_io::tcp_halves(socket)?;
        let (connection, run) =
            Connection::start(reader, sink, config(Role::Device, burst), label, Auth::None);
        tokio::spawn(run);
        let incoming = connection.next_incoming().await.expect("an OPEN");
        let stream = incoming.accept();
        let mut total = 0u64;
        while let Some(chunk) = stream.read_chunk(usize::MAX).await? {
            total += chunk.len() as u64;
        }
        anyhow::Ok(total)
    });
    let socket = TcpStream::connect(addr).await?;
    let (reader, sink, label) = oxadb_io::tcp_halves(socket)?;
    let (connection, run) =
        Connection::start(reader, sink, config(Role::Host, burst), label, Auth::None);
    tokio::spawn(run);
    connection.connected().await?;
    let mut stream = connection.open("sink:").await?;
    let block = vec![0x5au8; 1 << 20];
    let start = Instant::now();
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        stream.write_all(&block[..n]).await?;
        left -= n as u64;
    }
    stream.shutdown().await?;
    let received = device.await??;
    let elapsed = start.elapsed();
    device_runtime.shutdown_background();
    ensure!(received == size, "moved {received} of {size} bytes");
    Ok(elapsed)
}
