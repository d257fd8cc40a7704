//! Which adb host server `oxadb` uses (`-P`, `-H`, `-L`, as adb's client
//! takes them; `--direct` for none), and `start-server`/`kill-server` for
//! it (AOSP `client/adb_client.cpp`, `client/main.cpp`). docs/server.md.

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use oxadb::host_client::{HostServer, Selector, DEFAULT_PORT};

/// adb's `ADB_SERVER_VERSION` (AOSP `adb.h`), which `oxadb server` answers.
const SERVER_VERSION: u32 = 41;
/// How long a started server has to answer, and a killed one to go.
const START_TIMEOUT: Duration = Duration::from_secs(10);
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Args)]
pub struct ServerFlags {
    /// Port of the adb server to use (adb's -P) [default: 5037].
    #[arg(short = 'P', value_name = "PORT", env = "ANDROID_ADB_SERVER_PORT")]
    pub port: Option<u16>,
    /// Host of the adb server to use (adb's -H) [default: 127.0.0.1].
    #[arg(short = 'H', value_name = "HOST")]
    host: Option<String>,
    /// The adb server's socket, tcp:HOST:PORT or tcp:PORT (adb's -L).
    #[arg(short = 'L', value_name = "SOCKET", conflicts_with_all = ["port", "host"])]
    socket: Option<String>,
    /// Talk to devices directly even when an adb server answers on the
    /// server port (also OXADB_DIRECT=1).
    #[arg(
        long,
        env = "OXADB_DIRECT",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub direct: bool,
    /// Use the device with this transport id (through a server only).
    #[arg(short = 't', value_name = "ID")]
    transport_id: Option<u64>,
    /// Use the USB device (through a server only).
    #[arg(short = 'd', conflicts_with = "transport_id")]
    usb: bool,
    /// Use the TCP device (through a server only).
    #[arg(short = 'e', conflicts_with_all = ["transport_id", "usb"])]
    local: bool,
}

impl ServerFlags {
    /// The server's address and how adb names it (`tcp:5037`).
    pub fn address(&self) -> anyhow::Result<(SocketAddr, String)> {
        let (host, port, spec) = match &self.socket {
            Some(spec) => {
                let rest = spec
                    .strip_prefix("tcp:")
                    .with_context(|| format!("-L {spec}: expected tcp:HOST:PORT or tcp:PORT"))?;
                let (host, port) = match rest.rsplit_once(':') {
                    Some((host, port)) => (host.trim_matches(['[', ']']).to_string(), port),
                    None => ("127.0.0.1".to_string(), rest),
                };
                let port = port
                    .parse::<u16>()
                    .with_context(|| format!("-L {spec}: bad port {port:?}"))?;
                (host, port, spec.clone())
            }
            None => {
                let port = self.port.unwrap_or(DEFAULT_PORT);
                match &self.host {
                    Some(host) => (host.clone(), port, format!("tcp:{host}:{port}")),
                    None => ("127.0.0.1".to_string(), port, format!("tcp:{port}")),
                }
            }
        };
        let addr = (host.as_str(), port)
            .to_socket_addrs()
            .with_context(|| format!("adb server address {spec}"))?
            .next()
            .with_context(|| format!("adb server address {spec}: no address"))?;
        Ok((addr, spec))
    }

    /// The server commands go through: the one that answers `host:version`
    /// on the server port, unless `--direct`.
    pub async fn running_server(&self) -> anyhow::Result<Option<HostServer>> {
        if self.direct {
            return Ok(None);
        }
        let server = HostServer::new(self.address()?.0);
        Ok(server.version().await.map(|_| server))
    }

    /// The device `-s`, `-t`, `-d`, `-e` pick, as a server is asked for it.
    pub fn selector(&self, serial: Option<&str>) -> Selector {
        if let Some(id) = self.transport_id {
            Selector::TransportId(id)
        } else if self.usb {
            Selector::Usb
        } else if self.local {
            Selector::Local
        } else if let Some(serial) = serial {
            Selector::Serial(serial.to_string())
        } else {
            Selector::Any
        }
    }

    /// Whether `-t`, `-d` or `-e` was given, which only a server serves.
    pub fn selects_through_server(&self) -> bool {
        self.transport_id.is_some() || self.usb || self.local
    }
}

/// Where a started server's output goes: adb keeps `$TMPDIR/adb.$UID.log`
/// (AOSP `adb_utils.cpp` GetLogFilePath); oxadb's is `oxadb.$UID.log` there.
pub fn log_path() -> PathBuf {
    let dir = std::env::var_os("TMPDIR")
        .filter(|dir| !dir.is_empty())
        .unwrap_or_else(|| "/tmp".into());
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(dir).join(format!("oxadb.{uid}.log"))
}

/// `start-server`: nothing to do when a server answers; otherwise
/// `oxadb server` in the background, with adb's messages on stderr.
pub async fn start_server(flags: &ServerFlags) -> anyhow::Result<i32> {
    let (addr, spec) = flags.address()?;
    let server = HostServer::new(addr);
    if let Some(version) = server.version().await {
        if version != SERVER_VERSION {
            // adb kills a server of another version; another user's tools may
            // depend on that one, so it is left alone.
            eprintln!(
                "oxadb: an adb server of version {version} (not {SERVER_VERSION}) answers at {spec}; it is left running (stop it with `adb -P {} kill-server` to start oxadb's)",
                addr.port()
            );
        }
        return Ok(0);
    }
    if !addr.ip().is_loopback() {
        bail!(
            "no adb server answers at {spec}, and oxadb starts one on this machine's loopback only"
        );
    }
    eprintln!("* daemon not running; starting now at {spec}");
    let log = log_path();
    let mut child = spawn_detached(addr.port(), &log)?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if server.version().await.is_some() {
            eprintln!("* daemon started successfully");
            return Ok(0);
        }
        if let Some(status) = child.try_wait()? {
            eprintln!("* failed to start daemon");
            bail!(
                "oxadb server exited ({status}) before answering; see {}",
                log.display()
            );
        }
        if Instant::now() > deadline {
            eprintln!("* failed to start daemon");
            bail!(
                "oxadb server did not answer at {spec} within {} s; see {}",
                START_TIMEOUT.as_secs(),
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `oxadb server -P PORT` in a session of its own, stdin the null device
/// and its output appended to `log`, as adb's server runs.
fn spawn_detached(port: u16, log: &std::path::Path) -> anyhow::Result<std::process::Child> {
    let exe = std::env::current_exe().context("finding this program to start the server")?;
    let output = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log)
        .with_context(|| format!("opening the server log {}", log.display()))?;
    let mut command = Command::new(exe);
    command
        .args(["server", "-P", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(output.try_clone()?)
        .stderr(output);
    // SAFETY: setsid is async-signal-safe and touches no memory of ours.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn().context("starting oxadb server")
}

/// `kill-server`: `host:kill` to the server that answers, then waits for
/// its port to close. Returns false when no server answered.
pub async fn kill_server(flags: &ServerFlags) -> anyhow::Result<bool> {
    let (addr, spec) = flags.address()?;
    let server = HostServer::new(addr);
    if server.version().await.is_none() {
        return Ok(false);
    }
    server.kill().await?;
    let deadline = Instant::now() + KILL_TIMEOUT;
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        if Instant::now() > deadline {
            bail!(
                "the adb server at {spec} still answers {} s after host:kill",
                KILL_TIMEOUT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(port: Option<u16>, host: Option<&str>, socket: Option<&str>) -> ServerFlags {
        ServerFlags {
            port,
            host: host.map(str::to_string),
            socket: socket.map(str::to_string),
            direct: false,
            transport_id: None,
            usb: false,
            local: false,
        }
    }

    fn address(flags: &ServerFlags) -> (String, String) {
        let (addr, spec) = flags.address().unwrap();
        (addr.to_string(), spec)
    }

    #[test]
    fn the_server_address_is_taken_as_adbs_client_takes_it() {
        let default = ("127.0.0.1:5037".to_string(), "tcp:5037".to_string());
        assert_eq!(address(&flags(None, None, None)), default);
        assert_eq!(
            address(&flags(Some(5038), None, None)),
            ("127.0.0.1:5038".to_string(), "tcp:5038".to_string())
        );
        assert_eq!(
            address(&flags(Some(5039), Some("127.0.0.2"), None)),
            (
                "127.0.0.2:5039".to_string(),
                "tcp:127.0.0.2:5039".to_string()
            )
        );
        assert_eq!(
            address(&flags(None, None, Some("tcp:5040"))),
            ("127.0.0.1:5040".to_string(), "tcp:5040".to_string())
        );
        assert_eq!(
            address(&flags(None, None, Some("tcp:[::1]:5041"))),
            ("[::1]:5041".to_string(), "tcp:[::1]:5041".to_string())
        );
        for bad in ["5037", "tcp:", "tcp:host:port", "localabstract:adb"] {
            assert!(flags(None, None, Some(bad)).address().is_err(), "{bad}");
        }
    }

    #[test]
    fn selectors_follow_adbs_flags() {
        let mut f = flags(None, None, None);
        assert_eq!(f.selector(None), Selector::Any);
        assert_eq!(f.selector(Some("s1")), Selector::Serial("s1".into()));
        f.local = true;
        assert_eq!(f.selector(Some("s1")), Selector::Local);
        assert!(f.selects_through_server());
        f.transport_id = Some(4);
        assert_eq!(f.selector(None), Selector::TransportId(4));
    }
}
