//! `oxadb raw SERVICE`: any service as a byte stream, as adb 34's `adb raw`
//! (e.g. `dev-raw:/dev/ttyS0` for a board's serial console, `framebuffer:`).

use super::endpoint::Endpoint;
use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, clap::Args)]
pub struct RawArgs {
    /// The service to open, e.g. `dev-raw:/dev/ttyS0` or `framebuffer:`.
    #[arg(value_name = "SERVICE")]
    service: String,
}

/// Copies stdin to the stream and the stream to stdout until the device
/// closes the stream. ADB streams have no half-close, so the end of stdin
/// does not end the stream: what the device still sends is still printed.
pub async fn raw(device: &Endpoint, args: &RawArgs) -> anyhow::Result<i32> {
    let stream = device.open_text(&args.service).await?;
    let (mut from_device, mut to_device) = tokio::io::split(stream);
    let what = || format!("{}: {}", device.serial(), args.service);
    let input = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_device.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        // Keep the write half (and so the stream) open until the output ends.
        std::future::pending::<()>().await;
    });
    let mut stdout = tokio::io::stdout();
    let copied = tokio::io::copy(&mut from_device, &mut stdout).await;
    input.abort();
    copied.with_context(what)?;
    stdout.flush().await.with_context(what)?;
    Ok(0)
}
