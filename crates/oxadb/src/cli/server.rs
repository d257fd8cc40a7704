//! `oxadb server`: an adb host server in the foreground (adb's `server
//! nodaemon`) for Google's adb CLI and the tools that use port 5037; every
//! device it connects gets oxadb's transport. docs/server.md.

use oxadb::server::listener::{listens_everywhere, DEFAULT_PORT};
use oxadb::server::{Access, ListenSpec, Server, ServerConfig};
use oxadb::ConnectOptions;

const AFTER_HELP: &str = "\
Stop Google's server first (`adb kill-server`), then run `oxadb server &`:
adb, Android Studio and scrcpy use it unchanged. `adb kill-server` stops
it. It serves this user and root only, unless --any-user.";

#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct ServerArgs {
    /// Port to listen on (as adb's -P) [default: $ANDROID_ADB_SERVER_PORT,
    /// else 5037].
    #[arg(short = 'P', long = "port", conflicts_with = "socket")]
    port: Option<u16>,
    /// Socket to listen on, as adb's -L: tcp:PORT, tcp:localhost:PORT or
    /// tcp:[::1]:PORT [default: $ADB_SERVER_SOCKET unless -P].
    #[arg(short = 'L', value_name = "SOCKET")]
    socket: Option<String>,
    /// Listen on all network interfaces (IPv6 and IPv4), not only
    /// loopback, for tcp:PORT: whoever reaches the port controls every
    /// device.
    #[arg(short = 'a')]
    all_interfaces: bool,
    /// Serve clients of every local user, not only this user and root.
    #[arg(long)]
    any_user: bool,
}

/// Where to listen, as adb's client chooses (AOSP `client/commandline.cpp`):
/// -L, else -P, else $ADB_SERVER_SOCKET, else $ANDROID_ADB_SERVER_PORT.
fn listen_spec(args: &ServerArgs) -> anyhow::Result<ListenSpec> {
    let env = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
    if let Some(port) = args.port {
        return Ok(ListenSpec::port(port));
    }
    if let Some(spec) = args.socket.clone().or_else(|| env("ADB_SERVER_SOCKET")) {
        return ListenSpec::parse(&spec).map_err(|why| anyhow::anyhow!("-L {spec}: {why}"));
    }
    match env("ANDROID_ADB_SERVER_PORT") {
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port > 0 => Ok(ListenSpec::port(port)),
            _ => anyhow::bail!(
                "$ANDROID_ADB_SERVER_PORT must be a positive number less than 65535: got \"{port}\""
            ),
        },
        None => Ok(ListenSpec::port(DEFAULT_PORT)),
    }
}

pub async fn server(args: &ServerArgs, connect: &ConnectOptions) -> anyhow::Result<i32> {
    let spec = match listen_spec(args) {
        Ok(spec) => spec,
        Err(error) => {
            eprintln!("oxadb: error: {error}");
            return Ok(1);
        }
    };
    let config = ServerConfig {
        port: spec.port,
        host: spec.host,
        all_interfaces: args.all_interfaces,
        access: if args.any_user {
            Access::AnyUser
        } else {
            Access::OwnUser
        },
        connect: connect.clone(),
    };
    let server = match Server::bind(config).await {
        Ok(server) => server,
        Err(error) => {
            eprintln!("oxadb: error: {error}");
            return Ok(1);
        }
    };
    let address = server.local_addr()?;
    if listens_everywhere(spec.host, args.all_interfaces) {
        tracing::warn!(
            "-a: listening on every interface: anyone who can reach port {} controls every device this server holds",
            address.port()
        );
    }
    tracing::info!(
        %address,
        credit = ?connect.credit,
        "oxadb server listening"
    );
    server.run().await;
    Ok(0)
}
