//! `oxadb reverse REMOTE LOCAL`: the device listens on REMOTE and every
//! connection it accepts comes back over this connection to LOCAL on this
//! machine. With no adb server to hold the connection, the command stays
//! in the foreground serving them until Ctrl-C, and the device drops the
//! listener when the connection ends.

use anyhow::{bail, Context};
use oxadb::{Device, HostEnd};

const AFTER_HELP: &str = "\
Through an adb server (one answering on the server port, see `oxadb
--help`), the server's connection holds the reverse forward, as with adb,
and `oxadb reverse` returns at once. Without one, read on.

A reverse forward belongs to the connection that made it: the device drops
it when that connection ends. Without a server every oxadb command is a
connection of its own: `oxadb reverse REMOTE LOCAL`
serves until Ctrl-C and its listener goes away when it exits. On oxadbd,
`--list`, `--remove` and `--remove-all` act on their own connection's
reverses only, so run from another oxadb they list nothing and remove
nothing (`--remove` fails with `listener '...' not found`); stop a running
reverse with Ctrl-C. Android's adbd keeps one list for all connections:
there they see and remove every connection's reverses.";

#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct ReverseArgs {
    /// List this connection's reverse forwards (see below).
    #[arg(long, conflicts_with_all = ["remove", "remove_all", "no_rebind", "remote"])]
    pub list: bool,
    /// Remove this connection's reverse forward on REMOTE (see below).
    #[arg(long, value_name = "REMOTE", conflicts_with_all = ["remove_all", "no_rebind", "remote"])]
    pub remove: Option<String>,
    /// Remove all of this connection's reverse forwards (see below).
    #[arg(long, conflicts_with_all = ["no_rebind", "remote"])]
    pub remove_all: bool,
    /// Fail (`cannot rebind existing socket`) if REMOTE is already
    /// reversed, instead of pointing it at LOCAL.
    #[arg(long)]
    pub no_rebind: bool,
    /// Device end, where the device listens: tcp:PORT (its 127.0.0.1; tcp:0
    /// picks a free port, printed on stdout), localabstract:NAME or
    /// localfilesystem:PATH.
    #[arg(required_unless_present_any = ["list", "remove", "remove_all"], requires = "local")]
    pub remote: Option<String>,
    /// Host end, where each connection goes on this machine: tcp:PORT (on
    /// 127.0.0.1), localabstract:NAME or localfilesystem:PATH.
    pub local: Option<String>,
}

pub async fn reverse(device: &Device, args: &ReverseArgs) -> anyhow::Result<i32> {
    if args.list {
        for entry in device.reverse_list().await? {
            // adb's format, `(reverse)` in place of a device serial.
            println!("(reverse) {} {}", entry.device, entry.host);
        }
        // adb prints the device's reply and a newline after it.
        println!();
        return Ok(0);
    }
    if let Some(spec) = &args.remove {
        device.reverse_remove(spec).await?;
        return Ok(0);
    }
    if args.remove_all {
        device.reverse_remove_all().await?;
        return Ok(0);
    }
    let (Some(remote), Some(local)) = (&args.remote, &args.local) else {
        bail!("reverse takes REMOTE and LOCAL (or --list, --remove, --remove-all)");
    };
    let host_end = HostEnd::parse(local).map_err(anyhow::Error::msg)?;
    let port = device
        .reverse_forward(remote, local, args.no_rebind)
        .await
        .with_context(|| format!("reversing {remote} on {} to {local}", device.serial()))?;
    let listening = match port {
        Some(port) => {
            // adb prints the port the device picked for tcp:0.
            println!("{port}");
            format!("tcp:{port}")
        }
        None => remote.clone(),
    };
    eprintln!(
        "reversing {listening} on {} to {local}; Ctrl-C to stop",
        device.serial()
    );
    loop {
        let Some(incoming) = device.next_incoming().await else {
            bail!(
                "{}: connection ended; the device dropped its listener on {listening}",
                device.serial()
            );
        };
        // Only LOCAL comes here: the connection refuses, at once, any other
        // stream the device opens (no reverse of it names that service;
        // oxadb-engine `reverse_forwards.rs`).
        let service = incoming.service().to_string();
        let host_end = host_end.clone();
        tokio::spawn(async move {
            // Connect first: a refused OPEN closes the device-side connection.
            let socket = match host_end.connect().await {
                Ok(socket) => socket,
                Err(error) => {
                    eprintln!("oxadb: reverse: cannot connect to {service}: {error}; closing the device's connection");
                    incoming.refuse();
                    return;
                }
            };
            if let Err(error) = oxadb::relay::relay(socket, incoming.accept()).await {
                tracing::debug!(%service, %error, "reverse connection ended with an error");
            }
        });
    }
}
