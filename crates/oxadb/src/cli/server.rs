//! `oxadb server`: an adb host server in the foreground (adb's `server
//! nodaemon`) for Google's adb CLI and the tools that use port 5037; every
//! device it connects gets oxadb's transport. docs/server.md.

use oxadb::server::{Access, Server, ServerConfig};
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
    /// [default: 5037].
    #[arg(short = 'P', long = "port", env = "ANDROID_ADB_SERVER_PORT")]
    port: Option<u16>,
    /// Listen on all network interfaces, not only 127.0.0.1: whoever
    /// reaches the port controls every device.
    #[arg(short = 'a')]
    all_interfaces: bool,
    /// Serve clients of every local user, not only this user and root.
    #[arg(long)]
    any_user: bool,
}

/// `port`: the port given before the command (`oxadb -P PORT server`),
/// used unless the command has its own.
pub async fn server(
    args: &ServerArgs,
    port: Option<u16>,
    connect: &ConnectOptions,
) -> anyhow::Result<i32> {
    let port = args
        .port
        .or(port)
        .unwrap_or(oxadb::server::listener::DEFAULT_PORT);
    let config = ServerConfig {
        port,
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
    if args.all_interfaces {
        tracing::warn!(
            "-a: listening on every interface: anyone who can reach port {} controls every device this server holds",
            port
        );
    }
    tracing::info!(
        address = %server.local_addr()?,
        credit = ?connect.credit,
        "oxadb server listening"
    );
    server.run().await;
    Ok(0)
}
