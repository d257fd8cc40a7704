//! `oxadbd`: the daemon binary.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use oxadbd::config::{
    self, Access, AccessFlags, DaemonConfig, FileConfig, Keyless, UsbConfig, UsbFlags,
};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// A Linux ADB daemon: Google's adb, Android Studio and other ADB clients use it
/// unchanged (`adb connect 127.0.0.1:5555`).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Where to listen: ADDR:PORT (TCP) and/or vsock:PORT (virtual machine
    /// sockets, any CID), comma-separated [default: 127.0.0.1:5555; with
    /// --usb, no TCP unless given]. Hosts must authenticate, except loopback
    /// TCP peers owned by root or the daemon's own user (see --auth,
    /// --trust-local-users); vsock peers always, unless --no-auth --insecure.
    #[arg(long, value_name = "ADDR:PORT|vsock:PORT", env = "OXADBD_LISTEN")]
    listen: Option<String>,
    /// Serve ADB over USB as a FunctionFS gadget function (see --ffs-dir).
    /// Hosts must authenticate over USB unless --no-auth is given.
    #[arg(long)]
    usb: bool,
    /// Where the function's FunctionFS is mounted [default: /dev/usb-ffs/adb].
    /// The gadget can be bound to a UDC once oxadbd logs "ready for UDC bind"
    /// (ep1 and ep2 then exist there).
    #[arg(long, value_name = "DIR")]
    ffs_dir: Option<PathBuf>,
    /// Bind this configfs gadget (e.g. /sys/kernel/config/usb_gadget/oxadbd)
    /// to a UDC once the descriptors are written; it is unbound when oxadbd
    /// exits.
    #[arg(long, value_name = "DIR")]
    usb_gadget: Option<PathBuf>,
    /// The UDC for --usb-gadget [default: the first in /sys/class/udc].
    #[arg(long, value_name = "NAME")]
    usb_udc: Option<String>,
    /// Configuration file (TOML; keys: listen, usb, ffs-dir, usb-gadget,
    /// usb-udc, shell, framebuffer, product-name, product-model, product-device, credit,
    /// delayed-ack, memory-budget, ack-headroom, auth, trust-local-users,
    /// keys, accept-new-keys, tls, tls-key, tls-cert, insecure, max-connections, max-streams,
    /// handshake-timeout, auth-timeout, stalled-stream-timeout, peer-timeout,
    /// reboot-command, allow-tcpip, mdns, durability, state-dir, stop-grace, and a
    /// [properties] table for getprop).
    #[arg(long, value_name = "PATH", default_value = None)]
    config: Option<PathBuf>,
    /// Login shell for `adb shell` [default: /bin/sh].
    #[arg(long, value_name = "PATH")]
    shell: Option<PathBuf>,
    /// The framebuffer device the `framebuffer:` service reads [default:
    /// /dev/fb0].
    #[arg(long, value_name = "PATH")]
    framebuffer: Option<PathBuf>,
    /// `ro.product.name` in the banner [default: the os-release ID].
    #[arg(long)]
    product_name: Option<String>,
    /// `ro.product.model` in the banner [default: device-tree or DMI model].
    #[arg(long)]
    product_model: Option<String>,
    /// `ro.product.device` in the banner [default: the host name].
    #[arg(long)]
    product_device: Option<String>,
    /// Send pulled files with `sendfile` instead of reading them into
    /// buffers (the same as OXADB_ZERO_COPY=1); off by default, as the
    /// receiving host then spends more than the daemon saves
    /// (docs/benchmarks.md, "Zero-copy sends").
    #[arg(long)]
    zero_copy: bool,
    /// How far a pushed file reaches storage before adb is told it arrived:
    /// full (fsync the file, rename it into place, fsync its directory),
    /// rename (fsync the file before the rename: after a power cut the new
    /// content or the old, but the rename may be lost) or none (no flush,
    /// as Android's adbd) [default: full].
    #[arg(long, value_name = "full|rename|none")]
    durability: Option<oxadb_transfer::Durability>,
    /// Where the journal of directories holding temporary push files is
    /// kept, so that a restart removes what a killed daemon left (made if
    /// missing) [default: /var/lib/oxadbd, made if missing; for a user who
    /// may not, $XDG_STATE_HOME/oxadbd or ~/.local/state/oxadbd].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Seconds pushes in flight may take to finish after SIGTERM before they
    /// are aborted (a second SIGTERM or SIGINT stops at once) [default: 5].
    #[arg(long, value_name = "SECS")]
    stop_grace: Option<u64>,
    /// Do not offer burst mode (`delayed_ack`); the same as `--credit classic`.
    #[arg(long, conflicts_with = "credit")]
    no_delayed_ack: bool,
    /// Flow control: classic (no burst mode), aosp (burst mode with AOSP's
    /// fixed 32 MiB credit per stream) or adaptive (burst mode, credit grown
    /// from the measured rate and round trip) [default: adaptive].
    #[arg(long, value_name = "classic|aosp|adaptive", value_parser = oxadb_io::parse_credit_mode)]
    credit: Option<oxadbd::config::CreditMode>,
    /// Receive memory all streams together may commit (e.g. 64M); windows
    /// stop growing at half of it, shrink above two thirds, and each stream
    /// gets at most an eighth [default: 3/32 of the available memory, as
    /// Linux sizes tcp_mem].
    #[arg(long, value_name = "SIZE", value_parser = config::parse_size)]
    memory_budget: Option<u64>,
    /// Turn off the adaptive window's headroom for clumped deliveries (for
    /// measuring what it brings).
    #[arg(long)]
    no_ack_headroom: bool,
    /// Every host must sign a token with a key in the keys file, as adbd
    /// requires, root on loopback included [default: every host but
    /// loopback peers owned by root or the daemon's own user].
    #[arg(long, overrides_with = "no_auth")]
    auth: bool,
    /// Let every host in without a key, every local user included (beyond
    /// loopback only with --insecure). Warned at every start.
    #[arg(long, overrides_with = "auth")]
    no_auth: bool,
    /// Let every local user in over loopback without a key, not only root
    /// and the daemon's own user; other hosts still need one. Warned at
    /// every start.
    #[arg(long)]
    trust_local_users: bool,
    /// Authorized host keys, one `adbkey.pub` line each (adb's `adb_keys`
    /// format), for every host that must authenticate [default:
    /// /etc/oxadbd/adb_keys]. Re-read at every attempt.
    #[arg(long, value_name = "PATH")]
    keys: Option<PathBuf>,
    /// Trust any public key a host offers and append it to the keys file
    /// (trust on first use; every new key is logged).
    #[arg(long)]
    accept_new_keys: bool,
    /// TLS 1.3 on TCP connections (STLS, as adbd's wireless debugging):
    /// `off`; `on`: for hosts that can do it, plaintext for older adb;
    /// `required`: refuse hosts that cannot [default: plaintext on
    /// loopback; beyond it `on`, `required` once a host is paired].
    /// Never over USB.
    #[arg(long, value_name = "MODE")]
    tls: Option<oxadbd::tls::TlsMode>,
    /// The daemon's TLS private key, made on first use (mode 0600)
    /// [default: tls_key.pem beside the keys file].
    #[arg(long, value_name = "PATH")]
    tls_key: Option<PathBuf>,
    /// The daemon's TLS certificate, made with the key [default:
    /// tls_cert.pem beside the keys file].
    #[arg(long, value_name = "PATH")]
    tls_cert: Option<PathBuf>,
    /// Allow listening beyond loopback without authentication: anyone who
    /// can reach the address gets a root shell. Warned at every start.
    #[arg(long)]
    insecure: bool,
    /// Connections served at once; more are closed on accept [default: 64].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Streams a connection may have open at once; more OPENs are refused
    /// [default: 1024].
    #[arg(long, value_name = "N")]
    max_streams: Option<usize>,
    /// Seconds a new connection has to send CNXN [default: 10].
    #[arg(long, value_name = "SECS")]
    handshake_timeout: Option<u64>,
    /// Seconds a new connection has to authenticate [default: 60].
    #[arg(long, value_name = "SECS")]
    auth_timeout: Option<u64>,
    /// Seconds a stream's data may wait for the host's credit before the
    /// stream is closed; 0 keeps them forever [default: 300].
    #[arg(long, value_name = "SECS")]
    stalled_stream_timeout: Option<u64>,
    /// Seconds a TCP host may stay silent before its connection, its
    /// streams and its unfinished pushes are dropped: keepalive probes after
    /// half of it, data unacknowledged for all of it (docs/protocol.md,
    /// "Dead peers"); 0 leaves the kernel's defaults [default: 30].
    #[arg(long, value_name = "SECS")]
    peer_timeout: Option<u64>,
    /// What `adb reboot [TARGET]` runs once it has answered, split on
    /// blanks; a target (bootloader, recovery...) is appended as the last
    /// argument and set in OXADBD_REBOOT_TARGET. "" refuses reboots
    /// [default: `systemctl reboot` under systemd, else `reboot`].
    #[arg(long, value_name = "COMMAND")]
    reboot_command: Option<String>,
    /// Refuse `adb tcpip PORT` and `adb usb` (by default a host may move
    /// the TCP listener to another port on the same address).
    #[arg(long)]
    no_tcpip: bool,
    /// Do not announce the TCP listener over mDNS (`_adb._tcp`,
    /// `_adb-tls-connect._tcp`, as adbd does; what that reveals:
    /// docs/security.md). A loopback listener is never announced.
    #[arg(long)]
    no_mdns: bool,
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
    let model = file
        .product_model
        .clone()
        .unwrap_or_else(config::default_product_model);
    let name = file
        .product_name
        .clone()
        .unwrap_or_else(config::default_product_name);
    let dev = file
        .product_device
        .clone()
        .unwrap_or_else(config::default_product_device);
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
    let keys = args
        .keys
        .or(file.keys.clone())
        .unwrap_or_else(|| PathBuf::from(oxadbd::auth::DEFAULT_KEYS_PATH));
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
    let file = FileConfig::load(config.as_deref())?;
    let keys = keys
        .or(file.keys)
        .unwrap_or_else(|| PathBuf::from(oxadbd::auth::DEFAULT_KEYS_PATH));
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
    let default_level = match args.verbose {
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

    let file = FileConfig::load(args.config.as_deref())?;
    let file_credit = file.credit_mode()?;
    let file_budget = file.memory_budget()?;
    let durability = args.durability.or(file.durability()?).unwrap_or_default();
    let stop_grace = std::time::Duration::from_secs(
        args.stop_grace
            .or(file.stop_grace)
            .unwrap_or(oxadbd::stop::DEFAULT_GRACE_SECS),
    );
    let state_dir = config::StateDir::resolve(args.state_dir.or(file.state_dir.clone()));
    let mdns = file.announces_mdns(args.no_mdns)?;
    let usb = UsbConfig::resolve(
        &UsbFlags {
            usb: args.usb,
            ffs_dir: args.ffs_dir,
            gadget: args.usb_gadget,
            udc: args.usb_udc,
        },
        &file,
    );
    // With USB, TCP is served only when an address is given; a list that
    // names only a vsock port serves no TCP either.
    let places = match args.listen.or(file.listen.clone()) {
        Some(listen) => config::parse_listen_list(&listen)?,
        None if usb.is_some() => config::Listen::default(),
        None => config::parse_listen_list(config::DEFAULT_LISTEN)?,
    };
    let tcp = places.tcp.is_some();
    let vsock = places.vsock;
    let listen = match places.tcp {
        Some(listen) => listen,
        None => config::parse_listen(config::DEFAULT_LISTEN)?,
    };
    let access = Access::resolve(
        listen,
        &AccessFlags {
            auth: if args.auth {
                Some(true)
            } else if args.no_auth {
                Some(false)
            } else {
                None
            },
            trust_local_users: args.trust_local_users,
            keys: args.keys,
            accept_new_keys: args.accept_new_keys,
            tls: args.tls,
            tls_key: args.tls_key,
            tls_cert: args.tls_cert,
            insecure: args.insecure,
            max_connections: args.max_connections,
            max_streams: args.max_streams,
            handshake_timeout: args.handshake_timeout,
            auth_timeout: args.auth_timeout,
            stalled_stream_timeout: args.stalled_stream_timeout,
            peer_timeout: args.peer_timeout,
            usb: usb.is_some(),
            vsock,
        },
        &file,
    )?;
    let device = config::DeviceSettings::resolve(args.reboot_command, args.no_tcpip, &file);
    let config = DaemonConfig {
        listen,
        shell: args
            .shell
            .or(file.shell)
            .unwrap_or_else(|| PathBuf::from("/bin/sh")),
        framebuffer: args
            .framebuffer
            .or(file.framebuffer)
            .unwrap_or_else(|| PathBuf::from(config::DEFAULT_FRAMEBUFFER)),
        product_name: args
            .product_name
            .or(file.product_name)
            .unwrap_or_else(config::default_product_name),
        product_model: args
            .product_model
            .or(file.product_model)
            .unwrap_or_else(config::default_product_model),
        product_device: args
            .product_device
            .or(file.product_device)
            .unwrap_or_else(config::default_product_device),
        credit: if args.no_delayed_ack {
            config::CreditMode::Classic
        } else {
            args.credit.or(file_credit).unwrap_or_default()
        },
        memory_budget: args
            .memory_budget
            .or(file_budget)
            .map(config::BudgetLimits::from_limit)
            .unwrap_or_else(oxadb_io::default_budget_limits),
        ack_headroom: !args.no_ack_headroom && file.ack_headroom != Some(false),
        access,
        device,
        durability,
        // The flag, else the environment: off by default.
        zero_copy: args.zero_copy || oxadb_transfer::zero_copy_from_env().unwrap_or(false),
    };

    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let result = runtime.block_on(async {
        tracing::debug!(
            shell = %config.shell.display(),
            credit = %config.credit,
            durability = %durability,
            memory_budget = %oxadb_io::format_size(config.memory_budget.limit),
            per_stream_cap = %oxadb_io::format_size(config.memory_budget.per_stream_cap),
            max_payload = %oxadb_io::format_size(config.max_payload() as u64),
            ack_headroom = config.ack_headroom,
            keys = %config.access.keys.display(),
            max_connections = config.access.max_connections,
            max_streams = config.access.max_streams,
            peer_timeout = ?config.access.peer_timeout.map(|t| t.timeout()),
            "settings"
        );
        for unused in &config.access.unused {
            tracing::warn!("{unused}");
        }
        let listener = match tcp.then_some(config.listen) {
            Some(listen) => Some(
                tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("listening on {listen}"))?,
            ),
            None => None,
        };
        let local = listener.as_ref().map(|l| l.local_addr()).transpose()?;
        let vsock_listener = match vsock {
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
        let function = match &usb {
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
        // Once the listeners are bound (a daemon that cannot start says only
        // why), and before the first host is served.
        let journal = open_journal(&state_dir)?;
        // The one line a service manager shows: where, who needs a key, and
        // how to trust one.
        let places = [
            local.map(|local| local.to_string()),
            vsock.map(|port| format!("vsock:{port}")),
            usb.as_ref()
                .map(|usb| format!("USB ({})", usb.ffs_dir.display())),
        ];
        let places: Vec<String> = places.into_iter().flatten().collect();
        let access = &config.access;
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
        if let Some(port) = vsock.filter(|_| access.keyless == Keyless::Everyone) {
            tracing::warn!(
                "--insecure: listening on vsock:{port} WITHOUT authentication; every \
                 virtual machine and host that reaches it gets a root shell"
            );
        }
        if usb.is_some() && access.keyless == Keyless::Everyone {
            tracing::warn!(
                "--no-auth over USB: any host plugged into this device gets a root shell"
            );
        }
        if access.keyless == Keyless::LocalUsers {
            tracing::warn!(
                "--trust-local-users: every local user who connects over loopback gets a \
                 root shell WITHOUT a key"
            );
        }
        if config.access.accept_new_keys {
            tracing::warn!(
                keys = %config.access.keys.display(),
                "--accept-new-keys: any host that offers a key is trusted and its key recorded"
            );
        }
        use tokio::signal::unix::{signal, SignalKind};
        let mut interrupt =
            signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
        let mut terminate =
            signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
        let daemon = oxadbd::server::Daemon::new(config, journal.clone());
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
            oxadbd::server::serve_tcp_switchable(listener, daemon.clone())
                .await
                .context("serving TCP")
        };
        let vsock = async {
            match vsock_listener {
                Some(listener) => oxadbd::server::serve_vsock(listener, daemon.clone())
                    .await
                    .context("serving vsock"),
                None => std::future::pending().await,
            }
        };
        let usb = async {
            match function {
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
        // The listeners are closed (their futures dropped above): a restarted
        // daemon can bind at once. SIGINT is someone at a terminal: no grace.
        let grace = if stopped_by == "SIGTERM" {
            stop_grace
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
        Ok(())
    });
    // File threads of aborted pushes finish once their tasks are gone; do not
    // wait for anything else.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    result
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
