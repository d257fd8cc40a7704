//! `oxadbd`: the daemon binary.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use oxadbd::config::{self, FileConfig, Keyless};
use oxadbd::settings::{Environment, Settings};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// A Linux ADB daemon: Google's adb, Android Studio and other ADB clients use it
/// unchanged (`adb connect 127.0.0.1:5555`).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    flags: oxadbd::flags::Flags,
    /// More logging (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Authorize a host: append its public key (an `adbkey.pub`, e.g. the
    /// host's ~/.android/adbkey.pub) to the keys file. Takes effect at the
    /// host's next attempt (`adb reconnect`); no restart needed.
    TrustKey {
        /// The host's public key file.
        #[arg(value_name = "ADBKEY.PUB")]
        public_key: PathBuf,
        /// The keys file to add it to [default: --keys of the config file,
        /// else /etc/oxadbd/adb_keys].
        #[arg(long, value_name = "PATH")]
        keys: Option<PathBuf>,
        /// Configuration file to read `keys` from.
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Open a pairing window for `adb pair HOST:PORT CODE` (wireless
    /// debugging): prints a random six-digit code, the address and the QR
    /// text; the first host that proves the code gets its key added to the
    /// keys file. Exits 0 after one pairing, non-zero when the window closes.
    #[cfg(feature = "pairing")]
    Pair(PairArgs),
    /// Not in this build: oxadbd was built without pairing (cargo feature
    /// `pairing`).
    #[cfg(not(feature = "pairing"))]
    Pair {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<std::ffi::OsString>,
    },
}

/// What mDNS and pairing say about this device (its instance name, kept in
/// the state directory, doubles as the pairing GUID, as adbd's
/// `persist.adb.wifi.guid` does), from the config file as the daemon reads it.
#[cfg(feature = "pairing")]
fn device_info(file: &FileConfig, state_dir: Option<PathBuf>) -> oxadbd::mdns::DeviceInfo {
    let state_dir = config::StateDir::resolve(state_dir.or(file.state_dir.clone()));
    let device = config::DeviceSettings::resolve(None, false, file);
    let model = config::product_model(None, file);
    let name = config::product_name(None, file);
    let dev = config::product_device(None, file);
    let uname = rustix::system::uname();
    let machine = uname.machine().to_string_lossy();
    let props = oxadbd::services::props::Properties::new(
        &oxadbd::services::props::Identity {
            product_name: &name,
            product_model: &model,
            product_device: &dev,
            root: rustix::process::geteuid().is_root(),
            machine: &machine,
        },
        &device.properties,
    );
    oxadbd::mdns::DeviceInfo::from_properties(&props, state_dir.path())
}

#[cfg(feature = "pairing")]
#[derive(Debug, clap::Args)]
struct PairArgs {
    /// Where the pairing service listens [default: 0.0.0.0:0, every
    /// interface and a free port, as Android's].
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<std::net::SocketAddr>,
    /// Seconds the window stays open [default: 120].
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// Wrong codes after which the window closes [default: 5].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_failures: Option<u32>,
    /// Seconds the next attempt waits after a wrong code [default: 2].
    #[arg(long, value_name = "SECS")]
    failure_delay: Option<f64>,
    /// The keys file the paired host's key is added to [default: --keys of
    /// the config file, else /etc/oxadbd/adb_keys].
    #[arg(long, value_name = "PATH")]
    keys: Option<PathBuf>,
    /// Configuration file to read `keys` from.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The device GUID sent to the host [default: the daemon's mDNS
    /// instance name, adb-SERIAL-XXXXXX, kept in the state directory].
    #[arg(long)]
    guid: Option<String>,
    /// The daemon's state directory, where its instance name is kept
    /// [default: the config file's state-dir, else the daemon's: /var/lib/oxadbd,
    /// or the user's own for a user who may not make it].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Do not announce `_adb-tls-pairing._tcp` over mDNS while the window is open.
    #[arg(long)]
    no_mdns: bool,
    /// The pairing service's name in the QR text [default: the GUID].
    #[arg(long)]
    name: Option<String>,
}

#[cfg(feature = "pairing")]
fn pair(args: PairArgs) -> anyhow::Result<()> {
    let file = FileConfig::load(args.config.as_deref())?;
    let keys = config::keys_file(args.keys, &file);
    let info = device_info(&file, args.state_dir);
    let guid = args.guid.unwrap_or_else(|| info.instance.clone());
    let announce = file.announces_mdns(args.no_mdns)?.then_some(info);
    let failure_delay = args
        .failure_delay
        .map(std::time::Duration::try_from_secs_f64)
        .transpose()
        .context("--failure-delay")?
        .unwrap_or(oxadbd::pair::DEFAULT_FAILURE_DELAY);
    let options = oxadbd::pair::PairOptions {
        listen: args.listen.unwrap_or_else(|| {
            oxadbd::pair::DEFAULT_LISTEN
                .parse()
                .expect("a valid socket address")
        }),
        keys,
        timeout: args
            .timeout
            .map(std::time::Duration::from_secs)
            .unwrap_or(oxadbd::pair::DEFAULT_TIMEOUT),
        max_failures: args
            .max_failures
            .unwrap_or(oxadbd::pair::DEFAULT_MAX_FAILURES),
        failure_delay,
        name: args.name.unwrap_or_else(|| guid.clone()),
        guid,
        announce,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the pairing runtime")?;
    Ok(runtime.block_on(oxadbd::pair::run(options))?)
}

fn trust_key(
    public_key: &std::path::Path,
    keys: Option<PathBuf>,
    config: Option<PathBuf>,
) -> anyhow::Result<()> {
    let keys = config::keys_file(keys, &FileConfig::load(config.as_deref())?);
    let (key, comment) = oxadbd::auth::read_public_key(public_key)?;
    if oxadbd::auth::trust_key(&keys, &key, &comment)? {
        println!(
            "trusted {} ({comment}) in {}",
            public_key.display(),
            keys.display()
        );
    } else {
        println!(
            "{} ({comment}) was already trusted in {}",
            public_key.display(),
            keys.display()
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line, like oxadb's: a service manager's log shows the cause
            // where the operator looks.
            eprintln!(
                "oxadbd: error: {}",
                oxadb_io::error_line::one_line(error.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}

/// What is logged: RUST_LOG's `target=level` directives (e.g.
/// `debug,oxadb_io=trace`), else `default` for everything. `Targets`, not
/// `EnvFilter`: the same directives without span and field filters, and
/// without the regular-expression engine those need, a fifth of a megabyte
/// of a static board build (docs/benchmarks.md, "Static board builds: size
/// and idle memory"). A RUST_LOG that does not parse is ignored, as before.
fn log_filter(default: tracing::Level) -> tracing_subscriber::filter::Targets {
    std::env::var("RUST_LOG")
        .ok()
        .filter(|value| !value.trim().is_empty())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| tracing_subscriber::filter::Targets::new().with_default(default))
}

fn run(args: Args) -> anyhow::Result<()> {
    // Subcommands other than trust-key log like the daemon: run them after
    // the subscriber is set up.
    let subcommand = match args.command {
        Some(Command::TrustKey {
            public_key,
            keys,
            config,
        }) => return trust_key(&public_key, keys, config),
        other => other,
    };
    oxadb_io::tune_allocator();
    init_logging(args.verbose);
    #[cfg(feature = "pairing")]
    if let Some(Command::Pair(pair_args)) = subcommand {
        return pair(pair_args);
    }
    #[cfg(not(feature = "pairing"))]
    if let Some(Command::Pair { .. }) = subcommand {
        anyhow::bail!(
            "oxadbd pair: this oxadbd was built without pairing (cargo feature `pairing`)"
        );
    }
    let settings = Settings::load(&args.flags, &Environment::of_process())?;
    let state_dir = if settings.no_state_dir {
        config::StateDir::Off
    } else {
        config::StateDir::resolve(settings.state_dir.clone())
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let result = runtime.block_on(serve(settings, state_dir));
    // File threads of aborted pushes finish once their tasks are gone; do not
    // wait for anything else.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    result
}

/// Logs to stderr at `verbose`'s level (or RUST_LOG's).
fn init_logging(verbose: u8) {
    let default_level = match verbose {
        0 => tracing::Level::INFO,
        1 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    };
    // Colour only for a person at a terminal: a service manager's journal or
    // a log file gets plain text (and NO_COLOR is honoured, https://no-color.org).
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    // The formatter lets everything through (its own default stops at
    // info); the Targets layer decides.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .with_max_level(tracing::level_filters::LevelFilter::TRACE)
        .finish()
        .with(log_filter(default_level))
        .init();
}

/// Where the daemon serves, bound before anything else starts: a daemon that
/// cannot start says only why.
struct Listeners {
    tcp: Option<tokio::net::TcpListener>,
    vsock: Option<tokio_vsock::VsockListener>,
    usb: Option<oxadb_ffs::FunctionFs>,
}

impl Listeners {
    async fn bind(settings: &Settings) -> anyhow::Result<Listeners> {
        let listen = settings.daemon.listen;
        let tcp = if settings.serves_tcp {
            Some(
                tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("listening on {listen}"))?,
            )
        } else {
            None
        };
        let vsock = match settings.vsock {
            Some(port) => Some(
                tokio_vsock::VsockListener::bind(tokio_vsock::VsockAddr::new(
                    tokio_vsock::VMADDR_CID_ANY,
                    port,
                ))
                .with_context(|| {
                    format!(
                        "listening on vsock:{port} (is the vsock module loaded? \
                         vsock_loopback, or a VM's virtio/vmci transport)"
                    )
                })?,
            ),
            None => None,
        };
        let usb = match &settings.usb {
            Some(usb) => {
                let function = oxadb_ffs::FunctionFs::open(&usb.ffs_dir)?;
                if let Some(gadget) = &usb.gadget {
                    oxadb_ffs::bind_udc(
                        gadget,
                        usb.udc.as_deref(),
                        std::path::Path::new(oxadb_ffs::UDC_CLASS_DIR),
                    )?;
                }
                Some(function)
            }
            None => None,
        };
        Ok(Listeners { tcp, vsock, usb })
    }
}

/// Runs the daemon with `settings` until SIGINT or SIGTERM, then stops it.
async fn serve(settings: Settings, state_dir: config::StateDir) -> anyhow::Result<()> {
    settings.log();
    let listeners = Listeners::bind(&settings).await?;
    let local = listeners.tcp.as_ref().map(|l| l.local_addr()).transpose()?;
    // Once the listeners are bound, and before the first host is served.
    let journal = open_journal(&state_dir)?;
    announce(&settings, local);
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let Settings {
        daemon: config,
        stop_grace,
        mdns,
        ..
    } = settings;
    let daemon = oxadbd::server::Daemon::new(config, journal.clone());
    if let Some(dir) = state_dir.path() {
        daemon.keep_delta_indexes_in(dir.join("delta-index"));
    }
    // Memory freed after a transfer goes back to the system once
    // connections have been quiet for a second (a 512 MiB board cannot
    // leave ~100 MiB parked in the allocator, docs/benchmarks.md).
    tokio::spawn(
        daemon
            .activity()
            .trim_when_idle(std::time::Duration::from_secs(1)),
    );
    #[cfg(feature = "mdns")]
    if mdns {
        daemon.announce_mdns(state_dir.path());
    }
    #[cfg(not(feature = "mdns"))]
    let _ = mdns;
    // Without a listener, a USB host may still ask for one (`adb tcpip`).
    let tcp = async {
        oxadbd::server::serve_tcp_switchable(listeners.tcp, daemon.clone())
            .await
            .context("serving TCP")
    };
    let vsock = async {
        match listeners.vsock {
            Some(listener) => oxadbd::server::serve_vsock(listener, daemon.clone())
                .await
                .context("serving vsock"),
            None => std::future::pending().await,
        }
    };
    let usb = async {
        match listeners.usb {
            Some(function) => oxadbd::server::serve_usb(function, daemon.clone())
                .await
                .context("serving USB"),
            None => std::future::pending().await,
        }
    };
    let stopped_by = tokio::select! {
        result = tcp => return result,
        result = vsock => return result,
        result = usb => return result,
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    };
    // Browsers forget the device now rather than when the records expire.
    #[cfg(feature = "mdns")]
    daemon.withdraw_mdns();
    stop(stopped_by, stop_grace, journal, interrupt, terminate).await;
    Ok(())
}

/// Stops after `stopped_by`: the listeners are closed already (their futures
/// dropped), so a restarted daemon can bind at once; pushes in flight get
/// `grace` after SIGTERM (none after SIGINT, someone at a terminal, or a
/// second signal), then the rest are aborted and their temporary files
/// removed.
async fn stop(
    stopped_by: &'static str,
    grace: std::time::Duration,
    journal: Option<std::sync::Arc<oxadb_transfer::Journal>>,
    mut interrupt: tokio::signal::unix::Signal,
    mut terminate: tokio::signal::unix::Signal,
) {
    let grace = if stopped_by == "SIGTERM" {
        grace
    } else {
        std::time::Duration::ZERO
    };
    let in_flight = oxadbd::stop::begin();
    let deadline = tokio::time::Instant::now() + grace;
    let mut again = None;
    while oxadbd::stop::active_pushes() > 0 && tokio::time::Instant::now() < deadline {
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
            _ = interrupt.recv() => { again = Some("SIGINT"); break; }
            _ = terminate.recv() => { again = Some("SIGTERM"); break; }
        }
    }
    // Pushes still running never complete now: remove their temporary
    // files so nothing half-written is left beside a destination.
    let aborted = oxadbd::stop::active_pushes();
    let removed = oxadbd::services::sync::remove_unfinished_pushes();
    if let Some(journal) = journal.as_ref().filter(|_| aborted == 0) {
        journal.close();
    }
    let finished = oxadbd::stop::finished_while_stopping();
    if finished > 0 && again.is_none() {
        // The OKAYs of the last pushes are queued on their connections;
        // their tasks write them out in well under this (they end with
        // the runtime), so the hosts hear that the pushes arrived.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    tracing::info!(
        in_flight,
        finished,
        aborted,
        removed_temporary_files = removed,
        grace_s = grace.as_secs_f64(),
        "{stopped_by}{}: exiting; {finished} of {in_flight} pushes in flight finished, \
         {aborted} aborted",
        again.map(|s| format!(" then {s}")).unwrap_or_default()
    );
}

/// The one line a service manager shows (where, who needs a key, and how to
/// trust one), and a warning for every way in without a key.
fn announce(settings: &Settings, local: Option<std::net::SocketAddr>) {
    let places = [
        local.map(|local| local.to_string()),
        settings.vsock.map(|port| format!("vsock:{port}")),
        settings
            .usb
            .as_ref()
            .map(|usb| format!("USB ({})", usb.ffs_dir.display())),
    ];
    let places: Vec<String> = places.into_iter().flatten().collect();
    let access = &settings.daemon.access;
    let euid = rustix::process::geteuid().as_raw();
    let mut line = format!(
        "listening on {}; {}",
        places.join(" and "),
        access.describe(local, euid, access.keys.exists())
    );
    if let Some(command) = access.trust_command() {
        line.push_str(&format!("; to trust a host: {command}"));
    }
    tracing::info!("{line}");
    if let Some(local) = local.filter(|&local| access.is_insecure_exposure(local)) {
        tracing::warn!(
            "--insecure: listening on {local} WITHOUT authentication; anyone who \
             can reach this address gets a root shell"
        );
    } else if let Some(local) = local.filter(|_| access.keyless == Keyless::Everyone) {
        tracing::warn!(
            "--no-auth: listening on {local} WITHOUT authentication; every local user \
             gets a root shell"
        );
    }
    if let Some(port) = settings
        .vsock
        .filter(|_| access.keyless == Keyless::Everyone)
    {
        tracing::warn!(
            "--insecure: listening on vsock:{port} WITHOUT authentication; every \
             virtual machine and host that reaches it gets a root shell"
        );
    }
    if settings.usb.is_some() && access.keyless == Keyless::Everyone {
        tracing::warn!("--no-auth over USB: any host plugged into this device gets a root shell");
    }
    if access.keyless == Keyless::LocalUsers {
        tracing::warn!(
            "--trust-local-users: every local user who connects over loopback gets a \
             root shell WITHOUT a key"
        );
    }
    if access.accept_new_keys {
        tracing::warn!(
            keys = %access.keys.display(),
            "--accept-new-keys: any host that offers a key is trusted and its key recorded"
        );
    }
}

/// Sweeps the state directory for what a killed daemon left and opens this
/// daemon's journal, if it has one. A directory given explicitly must work;
/// without one, a daemon that has neither the system's nor its user's still
/// starts (saying so).
fn open_journal(
    state_dir: &config::StateDir,
) -> anyhow::Result<Option<std::sync::Arc<oxadb_transfer::Journal>>> {
    let prefix = oxadb_transfer::Policy::DAEMON.temp_prefix;
    let dir = match state_dir {
        config::StateDir::Given(dir) | config::StateDir::System(dir) => {
            tracing::debug!("state directory {}", dir.display());
            dir
        }
        config::StateDir::User {
            path,
            system_unusable,
        } => {
            tracing::info!(
                "using this user's state directory {} ({system_unusable})",
                path.display()
            );
            path
        }
        config::StateDir::Off => {
            tracing::info!(
                "no state directory (--no-state-dir): temporary files of a killed daemon \
                 will not be found at start"
            );
            return Ok(None);
        }
        config::StateDir::None {
            system_unusable,
            user_unusable,
        } => {
            tracing::warn!(
                "no state directory ({system_unusable}; {user_unusable}): temporary files \
                 of a killed daemon will not be found at start (pass --state-dir)"
            );
            return Ok(None);
        }
    };
    let (journal, sweep) = oxadb_transfer::Journal::open(dir, prefix)
        .with_context(|| format!("opening the push journal in {}", dir.display()))?;
    for problem in &sweep.problems {
        tracing::warn!("push journal: {problem}");
    }
    if !sweep.removed.is_empty() || sweep.kept > 0 {
        tracing::info!(
            state_dir = %dir.display(),
            journals = sweep.journals,
            kept_live = sweep.kept,
            "removed {} temporary files left by a stopped daemon: {}",
            sweep.removed.len(),
            sweep.removed_list(10)
        );
    }
    Ok(Some(std::sync::Arc::new(journal)))
}

#[cfg(test)]
mod tests {
    use anyhow::Context as _;
    use oxadb_io::error_line::one_line;

    #[test]
    fn errors_print_on_one_line_without_repeating_a_cause() {
        let in_use = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let error = Err::<(), _>(in_use)
            .context("listening on 127.0.0.1:5555")
            .unwrap_err();
        assert_eq!(
            one_line(error.as_ref()),
            "listening on 127.0.0.1:5555: address in use"
        );
        // A config error quotes its source already.
        let quoted = oxadbd::config::FileConfig::load(Some(std::path::Path::new(
            "/nonexistent/oxadbd.toml",
        )))
        .unwrap_err();
        let text = one_line(anyhow::Error::new(quoted).as_ref());
        assert_eq!(
            text,
            "reading config file /nonexistent/oxadbd.toml: No such file or directory (os error 2)"
        );
    }
}
