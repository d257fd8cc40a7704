//! `oxadb forward LOCAL REMOTE`: a host-side listener relaying each
//! connection to a new stream opened on the device.
//!
//! adb's server holds its forwards; oxadb has none, so by default `forward`
//! starts a background forwarder (this program re-executed as a hidden
//! subcommand, in its own session, its output going to `forwarders.log` in
//! the state directory), records its pid in the state file and returns, as
//! `adb forward` does. `--list`, `--remove` and `--remove-all` act on those
//! records; `--foreground` serves in this process until Ctrl-C instead.

use std::io::BufRead;
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use oxadb::{Device, DeviceService};
use oxadb_wire::service::ServiceProblem;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};

use super::state::{self, Forwarder};

const AFTER_HELP: &str = "\
Through an adb server (one answering on the server port, see `oxadb
--help`), the server holds the forward, as with adb; --foreground still
serves in this process, connected to the device directly.

With no adb server, a forward is served by a background oxadb process
(`oxadb __forwarder`, in its own session) whose pid is recorded in the
state file ($XDG_STATE_HOME/oxadb/state, else ~/.local/state/oxadb/state;
$OXADB_STATE_DIR overrides) and whose messages go to forwarders.log there.
It ends when removed (--remove, --remove-all, `oxadb kill-server`), when
the device goes away, or on SIGTERM. --foreground serves in this process
instead, until Ctrl-C, and records nothing.";

#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct ForwardArgs {
    /// List the background forwards (`SERIAL LOCAL REMOTE` lines).
    #[arg(long, conflicts_with_all = ["remove", "remove_all", "no_rebind", "foreground"])]
    pub list: bool,
    /// End the background forward on LOCAL.
    #[arg(long, value_name = "LOCAL", conflicts_with_all = ["remove_all", "no_rebind", "foreground"])]
    pub remove: Option<String>,
    /// End every background forward.
    #[arg(long, conflicts_with_all = ["no_rebind", "foreground"])]
    pub remove_all: bool,
    /// Fail (`cannot rebind existing socket`) if LOCAL is already forwarded,
    /// instead of pointing it at REMOTE.
    #[arg(long)]
    pub no_rebind: bool,
    /// Serve in this process until Ctrl-C instead of in the background.
    #[arg(long)]
    pub foreground: bool,
    /// Local end: `tcp:PORT` (on 127.0.0.1; tcp:0 picks a free port, printed)
    /// or `localfilesystem:PATH` (a unix socket).
    pub local: Option<String>,
    /// Device end: `tcp:PORT`, `tcp:HOST:PORT`, `localabstract:NAME` or `localfilesystem:PATH`.
    pub remote: Option<String>,
}

/// The hidden `__forwarder LOCAL REMOTE` a background forward runs as.
#[derive(Debug, clap::Args)]
pub struct ForwarderArgs {
    local: String,
    remote: String,
}

/// `forward --list`, `--remove`, `--remove-all`: no device needed.
/// Returns `None` when the command is a new forward.
pub fn manage(args: &ForwardArgs) -> anyhow::Result<Option<i32>> {
    if args.list {
        if args.local.is_some() {
            bail!("--list doesn't take any arguments");
        }
        let mut state = state::State::load()?;
        state.prune();
        // adb prints the server's reply and a newline after it.
        let mut out = String::new();
        for f in &state.forwarders {
            out.push_str(&format!("{} {} {}\n", f.serial, f.local, f.remote));
        }
        println!("{out}");
        return Ok(Some(0));
    }
    if args.remove.is_some() || args.remove_all {
        if args.local.is_some() {
            bail!("--remove/--remove-all take no other arguments");
        }
        let mut locked = state::lock()?;
        locked.state.prune();
        let doomed: Vec<Forwarder> = match &args.remove {
            Some(local) => {
                let found: Vec<Forwarder> = locked
                    .state
                    .forwarders
                    .iter()
                    .filter(|f| &f.local == local)
                    .cloned()
                    .collect();
                if found.is_empty() {
                    eprintln!("adb: error: listener '{local}' not found");
                    return Ok(Some(1));
                }
                found
            }
            None => locked.state.forwarders.clone(),
        };
        for f in &doomed {
            state::stop_forwarder(f.pid);
        }
        locked.state.forwarders.retain(|f| !doomed.contains(f));
        locked.save()?;
        return Ok(Some(0));
    }
    if args.local.is_none() {
        bail!("forward requires an argument: LOCAL REMOTE, --list, --remove LOCAL or --remove-all");
    }
    if args.remote.is_none() {
        bail!("forward takes two arguments: LOCAL REMOTE");
    }
    Ok(None)
}

/// `oxadb forward LOCAL REMOTE` in the background: starts the forwarder,
/// waits until it listens (or fails), records it and returns.
pub fn start_background(serial: &str, args: &ForwardArgs) -> anyhow::Result<i32> {
    let (Some(local), Some(remote)) = (&args.local, &args.remote) else {
        bail!("forward takes two arguments: LOCAL REMOTE");
    };
    check_remote(remote)?;
    for (what, spec) in [
        ("local", local),
        ("remote", remote),
        ("serial", &serial.to_string()),
    ] {
        if spec.contains(char::is_whitespace) {
            bail!("forward: {what} {spec:?} contains whitespace, which oxadb's state file cannot hold");
        }
    }
    let mut locked = state::lock()?;
    locked.state.prune();
    let mut rebound = false;
    if let Some(existing) = locked
        .state
        .forwarders
        .iter()
        .find(|f| &f.local == local)
        .cloned()
    {
        if args.no_rebind {
            eprintln!("adb: error: cannot rebind existing socket");
            return Ok(1);
        }
        // adb rebinds LOCAL to the new REMOTE: the old forwarder gives way.
        state::stop_forwarder(existing.pid);
        locked.state.forwarders.retain(|f| f != &existing);
        locked.save()?;
        rebound = true;
    }
    let log_path = locked.dir().join("forwarders.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding this oxadb executable to re-run")?;
    let mut child = Command::new(&exe)
        .arg("-s")
        .arg(serial)
        .arg(state::FORWARDER_COMMAND)
        .arg(local)
        .arg(remote)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {} for forward {local}", exe.display()))?;
    // The forwarder's first stdout line: `ready PORT`, or nothing if it failed.
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped");
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .with_context(|| format!("waiting for the forwarder of {local}"))?;
    let Some(port) = line.trim_end().strip_prefix("ready ") else {
        let status = child.wait()?;
        bail!(
            "forward {local} to {remote} on {serial} failed ({status}); its messages are in {}",
            log_path.display()
        );
    };
    let pid = child.id();
    // Never waited for: it lives on in its own session; init reaps it.
    drop(child);
    // adb lists a `tcp:0` forward under the port it got, and removes it by that name.
    let local = if local == "tcp:0" {
        format!("tcp:{port}")
    } else {
        local.clone()
    };
    locked.state.forwarders.push(Forwarder {
        pid,
        serial: serial.to_string(),
        local: local.clone(),
        remote: remote.clone(),
    });
    locked.save()?;
    if local.starts_with("tcp:") && !rebound {
        // adb 29 prints the local port of a new tcp: forward (not of a
        // rebound one: its server answers a rebind without the port).
        println!("{port}");
    }
    Ok(0)
}

/// The background forwarder itself: own session, listen, report `ready
/// PORT` on stdout, then move stdout to the log and serve until SIGTERM
/// or the device goes away.
pub async fn forwarder(device: &Device, args: &ForwarderArgs) -> anyhow::Result<i32> {
    // Out of the invoking terminal's session: its hangup must not end us.
    if let Err(error) = rustix::process::setsid() {
        tracing::debug!(%error, "setsid");
    }
    let listener = Listener::bind(&args.local).await?;
    println!("ready {}", listener.port());
    // The parent stops reading after that line: later output goes to the log.
    rustix::stdio::dup2_stdout(std::io::stderr()).context("redirecting stdout to the log")?;
    eprintln!(
        "oxadb forwarder {}: {} to {} on {}",
        std::process::id(),
        args.local,
        args.remote,
        device.serial()
    );
    let result = listener.serve(device, &args.remote).await;
    eprintln!(
        "oxadb forwarder {}: {} ended: {}",
        std::process::id(),
        args.local,
        match &result {
            Ok(_) => "stopped".to_string(),
            Err(error) => format!("{error:#}"),
        }
    );
    result
}

/// REMOTE goes to the device as typed, as adb's server sends it (a
/// malformed `tcp:` port is the device's to refuse); only the services a
/// forward can reach are let through.
fn check_remote(remote: &str) -> anyhow::Result<()> {
    use DeviceService::*;
    let reachable = match DeviceService::parse(remote) {
        Ok(Tcp { .. } | LocalAbstract(_) | LocalFilesystem(_) | LocalReserved(_)) => true,
        Ok(Dev { raw, .. }) => !raw,
        Ok(_) => false,
        Err(error) => matches!(error.problem, ServiceProblem::TcpPort(_)),
    };
    if !reachable {
        bail!("unsupported remote forward target {remote:?}: expected tcp:PORT, localabstract:NAME or localfilesystem:PATH");
    }
    Ok(())
}

enum Listener {
    Tcp(TcpListener, String),
    Unix(UnixListener, SocketFile),
}

/// A unix socket path this process bound: removed when dropped, also when
/// a signal ends the command.
struct SocketFile(String);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Listener {
    async fn bind(local: &str) -> anyhow::Result<Listener> {
        if let Some(port) = local.strip_prefix("tcp:") {
            let port: u16 = port
                .parse()
                .with_context(|| format!("invalid local port in {local:?}"))?;
            let listener = TcpListener::bind(("127.0.0.1", port))
                .await
                .with_context(|| format!("cannot listen on {local}"))?;
            Ok(Listener::Tcp(listener, local.to_string()))
        } else if let Some(path) = local.strip_prefix("localfilesystem:") {
            let listener =
                UnixListener::bind(path).with_context(|| format!("cannot listen on {path}"))?;
            Ok(Listener::Unix(listener, SocketFile(path.to_string())))
        } else {
            bail!("unsupported local forward end {local:?}: expected tcp:PORT or localfilesystem:PATH")
        }
    }

    fn port(&self) -> u16 {
        match self {
            Listener::Tcp(listener, _) => listener.local_addr().map(|a| a.port()).unwrap_or(0),
            Listener::Unix(..) => 0,
        }
    }

    /// Serves until Ctrl-C/SIGTERM (`Ok(0)`) or the device goes away.
    async fn serve(self, device: &Device, remote: &str) -> anyhow::Result<i32> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut health = tokio::time::interval(std::time::Duration::from_secs(2));
        let result = loop {
            tokio::select! {
                accepted = self.accept() => match accepted {
                    Ok(Accepted::Tcp(socket)) => spawn_relay(device, remote, socket).await,
                    Ok(Accepted::Unix(socket)) => spawn_relay(device, remote, socket).await,
                    Err(error) => break Err(error),
                },
                _ = terminate.recv() => break Ok(0),
                _ = interrupt.recv() => break Ok(0),
                _ = health.tick() => {
                    if device.connection_closed() {
                        break Err(anyhow::anyhow!("{}: the device connection ended", device.serial()));
                    }
                }
            }
        };
        result
    }

    async fn accept(&self) -> anyhow::Result<Accepted> {
        match self {
            Listener::Tcp(listener, local) => {
                let (socket, _) = listener
                    .accept()
                    .await
                    .with_context(|| format!("accepting on {local}"))?;
                socket.set_nodelay(true)?;
                Ok(Accepted::Tcp(socket))
            }
            Listener::Unix(listener, path) => {
                let (socket, _) = listener
                    .accept()
                    .await
                    .with_context(|| format!("accepting on {}", path.0))?;
                Ok(Accepted::Unix(socket))
            }
        }
    }
}

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// `--foreground`: serves the forward in this process until interrupted
/// (Ctrl-C) or the device goes away.
pub async fn forward(device: &Device, args: &ForwardArgs) -> anyhow::Result<i32> {
    let (Some(local), Some(remote)) = (&args.local, &args.remote) else {
        bail!("forward takes two arguments: LOCAL REMOTE");
    };
    check_remote(remote)?;
    let listener = Listener::bind(local).await?;
    match &listener {
        Listener::Tcp(..) => eprintln!(
            "forwarding 127.0.0.1:{} to {} on {}",
            listener.port(),
            remote,
            device.serial()
        ),
        Listener::Unix(_, path) => {
            eprintln!("forwarding {} to {} on {}", path.0, remote, device.serial())
        }
    }
    listener.serve(device, remote).await
}

async fn spawn_relay<S>(device: &Device, remote: &str, socket: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match device.open_text(remote).await {
        Ok(stream) => {
            tokio::spawn(async move {
                let _ = oxadb::relay::relay(socket, stream).await;
            });
        }
        Err(error) => eprintln!("oxadb: forward to {remote} failed: {error}"),
    }
}
