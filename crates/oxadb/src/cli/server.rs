//! `oxadb server`: an adb host server in the foreground (adb's `server
//! nodaemon`) for Google's adb CLI and the tools that use port 5037; every
//! device it connects gets oxadb's transport. docs/server.md.

use oxadb::server::listener::{listens_everywhere, DEFAULT_PORT};
use oxadb::server::{Access, ListenSpec, Server, ServerConfig};
use oxadb::ConnectOptions;

const AFTER_HELP: &str = "\
Stop Google's server first (`adb kill-server`), then run `oxadb server &`:
adb, Android Studio and scrcpy use it unchanged. `adb kill-server` stops
it. It serves this user and root only, unless --any-user. It finds USB
devices as they are plugged in, unless ADB_USB=0 (as Google's server).";

#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct ServerArgs {
    /// Port to listen on (as adb's -P; also given before the command)
    /// [default: $ANDROID_ADB_SERVER_PORT, else 5037].
    #[arg(short = 'P', long = "port", conflicts_with = "socket")]
    port: Option<u16>,
    /// Socket to listen on, as adb's -L: tcp:PORT, tcp:localhost:PORT or
    /// tcp:[::1]:PORT [default: $ADB_SERVER_SOCKET unless a port is given].
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

/// Where to listen, much as adb's client chooses (AOSP
/// `client/commandline.cpp`): the command's -P or -L, else `port` (the -P
/// given before the command, or $ANDROID_ADB_SERVER_PORT), else
/// $ADB_SERVER_SOCKET, else 5037.
fn listen_spec(args: &ServerArgs, port: Option<u16>) -> anyhow::Result<ListenSpec> {
    if let Some(port) = args.port {
        return Ok(ListenSpec::port(port));
    }
    if let Some(spec) = &args.socket {
        return ListenSpec::parse(spec).map_err(|why| anyhow::anyhow!("-L {spec}: {why}"));
    }
    if let Some(port) = port {
        return Ok(ListenSpec::port(port));
    }
    match std::env::var("ADB_SERVER_SOCKET") {
        Ok(spec) if !spec.is_empty() => ListenSpec::parse(&spec)
            .map_err(|why| anyhow::anyhow!("$ADB_SERVER_SOCKET {spec}: {why}")),
        _ => Ok(ListenSpec::port(DEFAULT_PORT)),
    }
}

/// `port`: the port given before the command (`oxadb -P PORT server`),
/// used unless the command has its own.
pub async fn server(
    args: &ServerArgs,
    port: Option<u16>,
    connect: &ConnectOptions,
) -> anyhow::Result<i32> {
    let spec = match listen_spec(args, port) {
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
        usb: oxadb::server::usb::enabled_by_env(),
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
