//! `oxadb`: an ADB host command line that talks to any adbd directly over TCP
//! or USB, with burst mode (`delayed_ack`) whenever the device supports it.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use oxadb::{Device, DeviceService};

/// Android Debug Bridge host tool. Commands, flags and exit codes follow
/// Google's adb. When an adb server (`oxadb server`, or Google's) answers on
/// the server port, commands go through it as adb's do; otherwise (or with
/// --direct) each command connects to the device itself.
#[derive(Debug, Parser)]
#[command(
    version,
    about,
    after_help = "Also: wait-for[-usb|-local|-any]-STATE (STATE: device, any, disconnect; recovery, rescue, sideload and bootloader, which an oxadbd device never reaches) waits for the device. install, install-multiple, uninstall, sideload, backup, restore, bugreport and jdwp are refused: a Linux device has no Android package manager or recovery.\n\nAdb server: when one answers `host:version` on 127.0.0.1:5037 (or -P PORT, ANDROID_ADB_SERVER_PORT, -H HOST, -L tcp:HOST:PORT), every device command goes through it as Google's adb sends it: the server holds the connections (`connect`), forwards and reverse forwards, and -s, -t, -d, -e pick among its devices. `oxadb start-server` starts `oxadb server` in the background (its output appended to $TMPDIR/oxadb.$UID.log) unless a server answers; `oxadb kill-server` stops the one that answers. --direct (or OXADB_DIRECT=1) ignores any server.\n\nWithout a server, commands without -s or ANDROID_SERIAL use the only device `oxadb connect` added, else the only USB device, else 127.0.0.1:5555.\n\nState without a server: the devices `connect` added and the background forwarders `forward` started are kept in $XDG_STATE_HOME/oxadb/state (else ~/.local/state/oxadb/state), changed under an flock of state.lock and replaced atomically; `kill-server` with no server answering ends the forwarders and forgets the devices.\n\nEnvironment:\n  ANDROID_SERIAL   device to use when -s is not given (as -s)\n  ANDROID_ADB_SERVER_PORT  port of the adb server (as -P)\n  OXADB_DIRECT     set to 1 to talk to devices directly (like --direct)\n  OXADB_STATE_DIR  directory of the state file (instead of the above)\n  OXADB_NO_BURST   set to 1 to force classic flow control (like --no-burst)\n  OXADB_ZERO_COPY  set to 0 to push files by reading them (like --no-zero-copy); sendfile is the default over TCP\n  OXADB_PEER_TIMEOUT  seconds a silent TCP device is given (like --peer-timeout)\n  ADB_VENDOR_KEYS  extra private keys for authentication (colon-separated files or directories)"
)]
struct Args {
    /// Device to talk to: a USB device's serial or its usb:BUS-PORT path (as
    /// `oxadb devices` lists them), HOST:PORT over TCP (port 5555 if
    /// omitted and no USB device has that serial), or vsock:CID[:PORT]
    /// [default: the only USB device present, else 127.0.0.1:5555].
    #[arg(short = 's', long = "serial", env = "ANDROID_SERIAL", global = true)]
    serial: Option<String>,
    #[command(flatten)]
    server: cli::host_server::ServerFlags,
    #[command(flatten)]
    tuning: cli::settings::Tuning,
    /// Log protocol details to stderr (-v debug, -vv trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the devices: the adb server's, when one answers; else the USB
    /// devices with an ADB interface and the TCP devices `connect` added (or
    /// -s names), with their state (device, unauthorized, offline, busy, no
    /// permissions).
    Devices(cli::devices::DevicesArgs),
    /// Run a command on the device (an interactive shell when none is given).
    /// Exits with the remote command's status.
    Shell(cli::shell::ShellArgs),
    /// Run a command with `exec:` and copy its raw output to stdout (binary-safe).
    ExecOut(cli::shell::ExecOutArgs),
    /// Copy local files or directories to the device.
    Push(cli::transfer::PushArgs),
    /// Copy files or directories from the device.
    Pull(cli::transfer::PullArgs),
    /// Forward a local socket to a socket on the device, served by the adb
    /// server when one answers, else by a background oxadb (--list, --remove,
    /// --remove-all; --foreground to serve until Ctrl-C instead).
    Forward(cli::forward::ForwardArgs),
    /// Make the device listen on REMOTE and relay its connections to LOCAL
    /// here: kept by the adb server when one answers, else served until
    /// Ctrl-C (see `oxadb reverse --help`).
    Reverse(cli::reverse::ReverseArgs),
    /// Open any service (e.g. `dev-raw:/dev/ttyS0`, `framebuffer:`) and copy
    /// stdin to it and its output to stdout, until the device closes it.
    Raw(cli::raw::RawArgs),
    /// Save the device's screen (`framebuffer:`) as a PPM image.
    Framebuffer(cli::framebuffer::FramebufferArgs),
    /// Connect to HOST[:PORT] (port 5555 if omitted): the adb server does
    /// when one answers; else oxadb remembers it, and later commands without
    /// -s use it when it is the only one.
    Connect {
        #[arg(value_name = "HOST[:PORT]")]
        address: Option<String>,
    },
    /// Pair with a device for wireless debugging, using the six-digit code
    /// it shows (asked for when not given); its public key is
    /// ~/.android/adbkey's.
    Pair {
        #[arg(value_name = "HOST:PORT")]
        address: String,
        #[arg(value_name = "CODE")]
        code: Option<String>,
    },
    /// Forget a connected device, or all of them.
    Disconnect {
        #[arg(value_name = "HOST[:PORT]")]
        address: Option<String>,
    },
    /// Connect to the device anew and report its state.
    Reconnect,
    /// Print the serial of the device a command would use.
    GetSerialno,
    /// Print the device path (`usb:BUS-PORT` for USB, `unknown` over TCP).
    GetDevpath,
    /// Reboot the device, optionally into TARGET (bootloader, recovery...).
    Reboot {
        #[arg(value_name = "TARGET")]
        target: Option<String>,
    },
    /// Print the device's system log (`logcat` on the device; oxadbd serves
    /// it from journald, syslog or the kernel log).
    Logcat {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Ask adbd to run as root (oxadbd answers whether it does).
    Root,
    /// Ask adbd to run as non-root.
    Unroot,
    /// Remount partitions read-write (oxadbd answers that it is not needed).
    Remount,
    /// Turn Android's dm-verity off (answered by the device).
    DisableVerity,
    /// Turn Android's dm-verity on (answered by the device).
    EnableVerity,
    /// Make the device listen for TCP connections on PORT.
    Tcpip {
        #[arg(value_name = "PORT")]
        port: Option<String>,
    },
    /// Make the device serve over USB again.
    Usb,
    /// adb's `sync` of $ANDROID_PRODUCT_OUT: refused (no Android partitions).
    Sync {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Stop the adb server that answers on the server port; with none, end
    /// the background forwarders and forget connected devices.
    KillServer,
    /// Start `oxadb server` in the background unless an adb server answers
    /// on the server port.
    StartServer,
    /// Run an adb host server in the foreground (port 5037, or -P), for
    /// Google's adb CLI and other tools that use one.
    Server(cli::server::ServerArgs),
    /// A background forward (started by `oxadb forward`).
    #[command(name = "__forwarder", hide = true)]
    Forwarder(cli::forward::ForwarderArgs),
    /// `wait-for[-usb|-local|-any]-STATE`, and anything else adb knows.
    #[command(external_subcommand)]
    External(Vec<String>),
    /// List the features the device advertises, and whether burst mode is in use.
    Features,
    /// Print the device state (`device`), or fail if it cannot be reached.
    GetState,
    /// Print the version of oxadb.
    Version,
    /// Generate an adb key pair: FILE (private, mode 0600) and FILE.pub (the
    /// line a device's keys file takes: `oxadbd trust-key FILE.pub`).
    Keygen {
        #[arg(value_name = "FILE")]
        file: std::path::PathBuf,
    },
}

/// `oxadb keygen FILE`, as `adb keygen`, except that an existing key is
/// never overwritten.
fn keygen(file: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let key = oxadb_auth::PrivateKey::generate()?;
    let public_path = {
        let mut name = file.as_os_str().to_owned();
        name.push(".pub");
        std::path::PathBuf::from(name)
    };
    let mut private = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .with_context(|| {
            format!(
                "creating {} (an existing key is never overwritten)",
                file.display()
            )
        })?;
    private
        .write_all(key.to_pem().as_bytes())
        .and_then(|()| private.sync_all())
        .with_context(|| format!("writing {}", file.display()))?;
    std::fs::write(
        &public_path,
        key.public_key()
            .to_adbkey_pub(&oxadb_auth::default_comment()),
    )
    .with_context(|| format!("writing {}", public_path.display()))?;
    println!("wrote {} and {}", file.display(), public_path.display());
    Ok(())
}

/// Splits off the words after `logcat`, which are logcat's own options
/// (`-s TAG`, `-v long`), not oxadb's global ones.
fn split_logcat(argv: Vec<std::ffi::OsString>) -> (Vec<std::ffi::OsString>, Vec<String>) {
    let mut index = 1;
    while index < argv.len() {
        let word = argv[index].to_string_lossy();
        if !word.starts_with('-') {
            if word == "logcat" {
                let rest = argv[index + 1..]
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect();
                return (argv[..=index].to_vec(), rest);
            }
            break;
        }
        // Global options that take a value as the next word.
        if [
            "-s",
            "--serial",
            "--credit",
            "--memory-budget",
            "-P",
            "-H",
            "-L",
            "-t",
        ]
        .contains(&word.as_ref())
        {
            index += 1;
        }
        index += 1;
    }
    (argv, Vec::new())
}

fn main() -> ExitCode {
    let (argv, logcat_args) = split_logcat(std::env::args_os().collect());
    let mut args = match Args::try_parse_from(argv) {
        Ok(args) => args,
        Err(error) => {
            let _ = error.print();
            // adb exits 1 on a usage error; --help and --version are no error.
            return match error.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::FAILURE,
            };
        }
    };
    if let Command::Logcat { args: words } = &mut args.command {
        words.extend(logcat_args);
    }
    oxadb_io::tune_allocator();
    // nusb reports through `log` what oxadb already turns into errors (a
    // busy interface, a vanished device): only -v shows it.
    let level = match args.verbose {
        // A server says what it does (clients, devices coming and going).
        0 if matches!(args.command, Command::Server(_)) => "info,nusb=off",
        0 => "warn,nusb=off",
        1 => "debug,nusb=warn",
        _ => "trace",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .init();
    // One async thread: a command drives one connection and file I/O runs on
    // blocking threads, so more workers only add hand-offs between threads
    // (docs/benchmarks.md has the measurements). So does the server, as
    // adb's does: a second worker added 0.35 ms to every `adb shell true`
    // (hand-offs again) and nothing measurable to sixteen pushes at once,
    // whose bytes it splices without touching (docs/server.md).
    let workers = match args.command {
        Command::Server(_) => server_threads(),
        _ => 1,
    };
    let mut builder = if workers > 1 {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(workers);
        builder
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("oxadb: error: starting the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return run(args).await;
        };
        // On Ctrl-C or SIGTERM half-written pull files are removed, then the
        // command is dropped (restoring the terminal, and closing the pull
        // journal, which no longer has anything to find): nothing partial is left.
        let mut command = Box::pin(run(args));
        let signal_number = tokio::select! {
            result = &mut command => return result,
            _ = interrupt.recv() => libc::SIGINT,
            _ = terminate.recv() => libc::SIGTERM,
        };
        oxadb::sync::remove_unfinished_pulls();
        drop(command);
        Ok(128 + signal_number)
    });
    // A blocking read of stdin may still be pending; do not wait for it.
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(error) => {
            eprintln!(
                "oxadb: error: {}",
                oxadb_io::error_line::one_line(error.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<i32> {
    if let Command::Version = args.command {
        println!("oxadb version {}", env!("CARGO_PKG_VERSION"));
        if let Ok(path) = std::env::current_exe() {
            println!("Installed as {}", path.display());
        }
        return Ok(0);
    }
    if let Command::Keygen { file } = &args.command {
        keygen(file)?;
        return Ok(0);
    }
    let settings =
        cli::settings::Settings::resolve(&args.tuning, &cli::settings::Environment::of_process());
    let options = &settings.connect;
    // The server's own commands, and those no server serves.
    match &args.command {
        Command::Server(server) => {
            return cli::server::server(server, args.server.port, options).await
        }
        Command::StartServer if args.server.direct => return Ok(0),
        Command::StartServer => return cli::host_server::start_server(&args.server).await,
        Command::KillServer => {
            if !args.server.direct && cli::host_server::kill_server(&args.server).await? {
                return Ok(0);
            }
            return cli::connect::kill_server();
        }
        Command::Pair { address, code } => return cli::pair::pair(address, code.as_deref()).await,
        Command::External(words) => {
            let name = words.first().map(String::as_str).unwrap_or("");
            if let Some(code) = cli::device_services::refuse_android_only(name) {
                return Ok(code);
            }
            if !name.starts_with("wait-for-") {
                eprintln!("oxadb: unknown command {name} (see `oxadb --help`)");
                return Ok(1);
            }
        }
        Command::Sync { .. } => return Ok(cli::device_services::sync()),
        Command::Tcpip { port } => {
            if let Err(message) = cli::device_services::tcpip_service(port.as_deref()) {
                eprintln!("{message}");
                return Ok(1);
            }
        }
        _ => {}
    }
    // A forward served by this process, or a background forwarder, talks to
    // the device itself.
    let direct_only = matches!(
        &args.command,
        Command::Forwarder(_)
            | Command::Forward(cli::forward::ForwardArgs {
                foreground: true,
                ..
            })
    );
    if !direct_only {
        if let Some(server) = args.server.running_server().await? {
            return through_server(&args, &server, &settings).await;
        }
    }
    if args.server.selects_through_server() {
        if args.server.direct {
            anyhow::bail!("-t, -d and -e pick among an adb server's devices, and --direct (or OXADB_DIRECT) uses none");
        }
        let (_, spec) = args.server.address()?;
        anyhow::bail!(
            "-t, -d and -e pick among an adb server's devices, and no adb server answers at {spec} (`oxadb start-server` starts one)"
        );
    }
    direct(args, settings).await
}

/// A command through the adb server that answers on the server port.
async fn through_server(
    args: &Args,
    server: &oxadb::host_client::HostServer,
    settings: &cli::settings::Settings,
) -> anyhow::Result<i32> {
    use cli::through_server as via;
    let selector = args.server.selector(args.serial.as_deref());
    let prefix = selector.host_prefix();
    match &args.command {
        Command::Devices(devices) => return via::devices(server, devices.long).await,
        Command::Connect { address } => return via::connect(server, address.as_deref()).await,
        Command::Disconnect { address } => {
            return via::disconnect(server, address.as_deref()).await
        }
        Command::GetState => return via::print_query(server, &format!("{prefix}:get-state")).await,
        Command::GetSerialno => {
            return via::print_query(server, &format!("{prefix}:get-serialno")).await
        }
        Command::GetDevpath => {
            return via::print_query(server, &format!("{prefix}:get-devpath")).await
        }
        Command::Reconnect => {
            return via::print_query(server, &format!("{prefix}:reconnect")).await
        }
        Command::External(words) => {
            let name = words.first().map(String::as_str).unwrap_or("");
            return via::wait_for(server, &selector, name).await;
        }
        Command::Forward(forward) => return via::forward(server, &selector, forward).await,
        _ => {}
    }
    let device = oxadb::host_client::ServerDevice::select(*server, selector)
        .await?
        .with_reply_timeout(settings.connect.reply_timeout);
    if let Command::Reverse(reverse) = &args.command {
        return via::reverse(&device, reverse).await;
    }
    let endpoint = cli::endpoint::Endpoint::Server(device);
    match on_device(&endpoint, &args.command, settings.durability).await? {
        Some(code) => Ok(code),
        None => unreachable!("every other command is answered above"),
    }
}

/// A command connecting to the device itself (no server, or --direct).
async fn direct(mut args: Args, settings: cli::settings::Settings) -> anyhow::Result<i32> {
    let options = &settings.connect;
    // Commands that need no device, or pick it themselves.
    match &args.command {
        Command::Connect { address } => {
            return cli::connect::connect(address.as_deref(), options).await
        }
        Command::Disconnect { address } => return cli::connect::disconnect(address.as_deref()),
        Command::Devices(devices) => {
            let connected = cli::state::State::load()?.devices;
            return cli::devices::devices(args.serial.as_deref(), &connected, options, devices)
                .await;
        }
        Command::Forward(forward) => {
            if let Some(code) = cli::forward::manage(forward)? {
                return Ok(code);
            }
        }
        _ => {}
    }
    let serial = match args.serial.clone() {
        Some(serial) => Some(serial),
        // As adb's server: the only connected device when none is named.
        None => {
            let devices = cli::state::State::load()?.devices;
            match devices.as_slice() {
                [] => None,
                [only] => Some(only.clone()),
                _ => anyhow::bail!(
                    "more than one device/emulator ({}): pick one with -s SERIAL",
                    devices.join(", ")
                ),
            }
        }
    };
    let serial = serial.as_deref();
    match &args.command {
        Command::Reconnect => return cli::connect::reconnect(serial, options).await,
        Command::External(words) => {
            let name = words.first().map(String::as_str).unwrap_or("");
            if let Some(result) = cli::connect::wait_for(name, serial, options).await {
                return result;
            }
            unreachable!("only wait-for-* gets here")
        }
        _ => {}
    }
    if matches!(&args.command, Command::Forward(forward) if !forward.foreground) {
        let target = oxadb::resolve(serial).await?;
        let serial = target.serial().to_string();
        let Command::Forward(forward) = std::mem::replace(&mut args.command, Command::StartServer)
        else {
            unreachable!("matched above")
        };
        // Blocking: it waits on the lock and for the forwarder to listen.
        return tokio::task::spawn_blocking(move || {
            cli::forward::start_background(&serial, &forward)
        })
        .await?;
    }
    let device = Device::connect_serial(serial, options).await?;
    let code = match &args.command {
        Command::Forward(forward) => cli::forward::forward(&device, forward).await?,
        Command::Forwarder(forwarder) => cli::forward::forwarder(&device, forwarder).await?,
        Command::Reverse(reverse) => cli::reverse::reverse(&device, reverse).await?,
        Command::GetState => {
            println!("device");
            0
        }
        Command::GetSerialno => cli::connect::get("get-serialno", &device).await?,
        Command::GetDevpath => cli::connect::get("get-devpath", &device).await?,
        _ => {
            let endpoint = cli::endpoint::Endpoint::Direct(Box::new(device));
            let code = on_device(&endpoint, &args.command, settings.durability).await?;
            endpoint.close();
            return Ok(code.unwrap_or_else(|| unreachable!("handled above")));
        }
    };
    device.close();
    Ok(code)
}

/// The commands that only open services on the device, the same directly
/// and through a server; `None` for any other command.
async fn on_device(
    device: &cli::endpoint::Endpoint,
    command: &Command,
    durability: oxadb_transfer::Durability,
) -> anyhow::Result<Option<i32>> {
    let code = match command {
        Command::Shell(shell) => cli::shell::shell(device, shell).await?,
        Command::ExecOut(exec) => cli::shell::exec_out(device, exec).await?,
        Command::Push(push) => {
            cli::transfer::push(device, push).await?;
            0
        }
        Command::Pull(pull) => {
            cli::transfer::pull(device, pull, durability).await?;
            0
        }
        Command::Raw(raw) => cli::raw::raw(device, raw).await?,
        Command::Framebuffer(framebuffer) => {
            cli::framebuffer::framebuffer(device, framebuffer).await?
        }
        Command::Features => {
            for feature in device.features() {
                println!("{feature}");
            }
            match device.burst_mode() {
                Some(on) => {
                    eprintln!(
                        "burst mode (delayed_ack): {}",
                        if on { "on" } else { "off" }
                    )
                }
                None => eprintln!("burst mode (delayed_ack): the adb server's choice"),
            }
            0
        }
        Command::Reboot { target } => {
            cli::device_services::reboot(device, target.as_deref()).await?
        }
        Command::Logcat { args } => cli::shell::logcat(device, args).await?,
        Command::Root => cli::device_services::one_shot(device, &DeviceService::Root).await?,
        Command::Unroot => cli::device_services::one_shot(device, &DeviceService::Unroot).await?,
        Command::Remount => {
            let remount = DeviceService::Remount(String::new());
            cli::device_services::one_shot(device, &remount).await?
        }
        Command::DisableVerity => {
            cli::device_services::one_shot(device, &DeviceService::DisableVerity).await?
        }
        Command::EnableVerity => {
            cli::device_services::one_shot(device, &DeviceService::EnableVerity).await?
        }
        Command::Tcpip { port } => {
            let service =
                cli::device_services::tcpip_service(port.as_deref()).map_err(anyhow::Error::msg)?;
            cli::device_services::one_shot(device, &service).await?
        }
        Command::Usb => cli::device_services::one_shot(device, &DeviceService::Usb).await?,
        _ => return Ok(None),
    };
    Ok(Some(code))
}

/// `OXADB_SERVER_THREADS`, else one worker.
fn server_threads() -> usize {
    std::env::var("OXADB_SERVER_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}
