//! `oxadb forward LOCAL REMOTE`: a host-side listener, kept in the foreground
//! (there is no adb server to hold it), relaying each connection to a new
//! stream opened on the device.

use anyhow::{bail, Context};
use oxadb::Device;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};

#[derive(Debug, clap::Args)]
pub struct ForwardArgs {
    /// Local end: `tcp:PORT` (on 127.0.0.1) or `localfilesystem:PATH` (a unix socket).
    local: String,
    /// Device end: `tcp:PORT`, `tcp:HOST:PORT`, `localabstract:NAME` or `localfilesystem:PATH`.
    remote: String,
}

/// Serves the forward until interrupted (Ctrl-C) or the device goes away.
pub async fn forward(device: &Device, args: &ForwardArgs) -> anyhow::Result<i32> {
    let remote = args.remote.as_str();
    if ![
        "tcp:",
        "localabstract:",
        "localfilesystem:",
        "localreserved:",
        "dev:",
    ]
    .iter()
    .any(|p| remote.starts_with(p))
    {
        bail!("unsupported remote forward target {remote:?}: expected tcp:PORT, localabstract:NAME or localfilesystem:PATH");
    }
    if let Some(port) = args.local.strip_prefix("tcp:") {
        let port: u16 = port
            .parse()
            .with_context(|| format!("invalid local port in {:?}", args.local))?;
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .with_context(|| format!("cannot listen on {}", args.local))?;
        eprintln!(
            "forwarding 127.0.0.1:{} to {} on {}",
            listener.local_addr()?.port(),
            remote,
            device.serial()
        );
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (socket, _) = accepted.with_context(|| format!("accepting on {}", args.local))?;
                    socket.set_nodelay(true)?;
                    spawn_relay(device, remote, socket).await;
                }
                _ = tokio::signal::ctrl_c() => return Ok(0),
            }
        }
    } else if let Some(path) = args.local.strip_prefix("localfilesystem:") {
        let listener =
            UnixListener::bind(path).with_context(|| format!("cannot listen on {path}"))?;
        eprintln!("forwarding {path} to {} on {}", remote, device.serial());
        let result = loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((socket, _)) => spawn_relay(device, remote, socket).await,
                    Err(error) => break Err(error).with_context(|| format!("accepting on {path}")),
                },
                _ = tokio::signal::ctrl_c() => break Ok(0),
            }
        };
        let _ = std::fs::remove_file(path);
        result
    } else {
        bail!(
            "unsupported local forward end {:?}: expected tcp:PORT or localfilesystem:PATH",
            args.local
        )
    }
}

async fn spawn_relay<S>(device: &Device, remote: &str, socket: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match device.open(remote).await {
        Ok(stream) => {
            tokio::spawn(async move {
                let (mut adb_read, mut adb_write) = tokio::io::split(stream);
                let (mut socket_read, mut socket_write) = tokio::io::split(socket);
                // No half-close in ADB: the first side to end ends both.
                tokio::select! {
                    _ = tokio::io::copy(&mut adb_read, &mut socket_write) => {}
                    _ = tokio::io::copy(&mut socket_read, &mut adb_write) => {}
                }
            });
        }
        Err(error) => eprintln!("oxadb: forward to {remote} failed: {error}"),
    }
}
