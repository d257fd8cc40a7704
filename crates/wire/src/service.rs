//! Service names, typed: what an OPEN packet asks a device for
//! ([`DeviceService`]) and what a client asks an adb host server for on
//! port 5037 ([`HostService`]). Each is parsed here (`FromStr`) and written
//! here (`Display`), and nowhere else, for the host that sends them, the
//! daemon that serves them and a server that relays them. No I/O.
//!
//! The grammar is AOSP's: `docs/dev/services.md`, `daemon/services.cpp`,
//! `daemon/shell_service.cpp` (shell arguments), `adb.cpp`
//! `handle_forward_request` and `handle_host_request`, `sockets.cpp`
//! `parse_host_service` (where a `host-serial:` serial ends).
//!
//! `Display` writes the canonical form (shell arguments in the order adb's
//! client sends them, `root:` with its colon); parsing a value's text gives
//! the value back. adb has no escaping, so a value whose free text contains
//! the separator that ends it cannot come back: such limits are on each
//! field (a `TERM` without `,` or `:`, a forward spec without `;`, ...).
//! Parsing accepts what adbd accepts, so a non-canonical name (shell
//! arguments in another order, `root` without its colon) parses to the
//! value whose canonical name differs from it.

use std::fmt;
use std::num::NonZeroU16;
use std::str::FromStr;

/// A service name the text of which did not parse, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{service:?}: {problem}")]
pub struct ServiceError {
    /// The text as received.
    pub service: String,
    pub problem: ServiceProblem,
}

/// What is wrong with a service name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceProblem {
    /// No service of this name.
    #[error("unknown service")]
    Unknown,
    /// `shell` or `shell,ARGS` with no `:` before the command, or
    /// `host-transport-id:N` with none before the request.
    #[error("no ':' before the command")]
    MissingColon,
    /// `tcp:` with a port that is not 1-65535 (the text after the last `:`).
    #[error("invalid port {0:?}")]
    TcpPort(String),
    /// `tcpip:` with a port that is not 1-65535 (the text after `tcpip:`).
    #[error("invalid port {0:?}")]
    TcpipPort(String),
    /// A process id, byte count, transport id or port that is not a number
    /// of its size.
    #[error("invalid number {0:?}")]
    Number(String),
    /// A malformed forwarding request (after `reverse:`, or a host's `forward:`).
    #[error("{0}")]
    Forward(ForwardError),
    /// `host-serial:` without a serial followed by `:` and a request.
    #[error("no serial and request")]
    Serial,
    /// `pair:` without a `:` between the code and the address.
    #[error("no ':' between the pairing code and the address")]
    PairAddress,
}

impl ServiceError {
    fn new(service: &str, problem: ServiceProblem) -> ServiceError {
        ServiceError {
            service: service.to_owned(),
            problem,
        }
    }
}

/// Whether a shell service speaks shell protocol v2 or passes raw bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShellProtocol {
    /// No framing: raw bytes both ways, no exit status (`shell:`, `exec:`).
    V1,
    /// Shell protocol v2 frames (`shell,v2:`).
    V2,
}

/// How a shell's stdio is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShellMode {
    /// A pseudo-terminal; stderr shares it with stdout.
    Pty,
    /// Pipes; with v2, stderr is separate.
    Raw,
}

/// `shell[,ARG...]:COMMAND` as sent: the arguments named, not what a
/// daemon makes of their absence (`ShellRequest` in `shell.rs` does that).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellService {
    /// `v2`.
    pub protocol: ShellProtocol,
    /// `TERM=...`; `Some("")` for an empty `TERM=`. Holds no `,` or `:`.
    pub term: Option<String>,
    /// `raw` or `pty`; `None` when the name has neither.
    pub mode: Option<ShellMode>,
    /// Everything after the first `:`; empty for an interactive shell.
    pub command: String,
}

/// `reverse:` requests and a host server's forwarding requests: one grammar
/// (AOSP `adb.cpp` handle_forward_request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardRequest {
    /// `forward[:norebind]:LOCAL;REMOTE`. Neither spec is empty or holds
    /// `;`; REMOTE does not start with `*`, LOCAL not with `norebind:`.
    Forward {
        local: String,
        remote: String,
        no_rebind: bool,
    },
    /// `killforward:LOCAL` (not empty, no `;`).
    Kill(String),
    /// `killforward-all`.
    KillAll,
    /// `list-forward`.
    List,
}

/// Why a forwarding request is malformed. The texts are adbd's, which adb
/// prints after `FAIL` as `error: TEXT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    /// Not `LOCAL;REMOTE` with both present (the text after `forward:` and
    /// `norebind:`).
    #[error("bad forward: {0}")]
    BadForward(String),
    /// Not one non-empty spec (the text after `killforward:`).
    #[error("bad killforward: {0}")]
    BadKillForward(String),
    /// None of the four requests (only `reverse:` can name another).
    #[error("not a reverse forwarding command")]
    NotForwarding,
}

/// What an OPEN packet asks a device for: every service oxadbd serves and
/// the ones hosts send to Android's adbd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceService {
    /// `shell[,v2][,TERM=x][,raw|,pty]:COMMAND`.
    Shell(ShellService),
    /// `exec:COMMAND`: raw pipes, no pty, no framing.
    Exec(String),
    /// `sync:`.
    Sync,
    /// `tcp:PORT` (the device's loopback) or `tcp:HOST:PORT`; HOST may hold
    /// `:` (the port is after the last one).
    Tcp {
        host: Option<String>,
        port: NonZeroU16,
    },
    /// `localabstract:NAME`.
    LocalAbstract(String),
    /// `localreserved:NAME` (Android's reserved socket namespace).
    LocalReserved(String),
    /// `localfilesystem:PATH`.
    LocalFilesystem(String),
    /// `local:PATH` (Android: a socket in its reserved namespace's directory).
    Local(String),
    /// `dev:PATH`, or `dev-raw:PATH` with `raw` (a terminal in raw mode).
    Dev { path: String, raw: bool },
    /// `jdwp:PID`.
    Jdwp(u32),
    /// `track-jdwp`.
    TrackJdwp,
    /// `track-app`.
    TrackApp,
    /// `reverse:REQUEST`.
    Reverse(ForwardRequest),
    /// `framebuffer:` (anything after the colon is ignored, as adbd does).
    Framebuffer,
    /// `reboot:TARGET`; TARGET may be empty.
    Reboot(String),
    /// `remount:ARGS` (adbd passes ARGS to its remount).
    Remount(String),
    /// `root:` (also `root`, or with anything after the colon).
    Root,
    /// `unroot:` (likewise).
    Unroot,
    /// `enable-verity:` (likewise).
    EnableVerity,
    /// `disable-verity:` (likewise).
    DisableVerity,
    /// `usb:` (anything after the colon is ignored).
    Usb,
    /// `tcpip:PORT`.
    TcpIp(NonZeroU16),
    /// `abb:ARGS` (Android's binder shell; arguments separated by NUL).
    Abb(String),
    /// `abb_exec:ARGS`.
    AbbExec(String),
    /// `sink:BYTES` (adbd's benchmark: reads that many bytes).
    Sink(u64),
    /// `source:BYTES` (writes that many bytes).
    Source(u64),
    /// `oxadb-delta:`, oxadbd's own: an image built from block operations
    /// on the old one (docs/delta.md), for hosts that negotiated
    /// `oxadb_delta`.
    Delta,
}

impl DeviceService {
    /// Parses an OPEN packet's service name as the engine hands it over,
    /// its trailing NULs removed (one left would end the last field).
    pub fn parse(service: &str) -> Result<DeviceService, ServiceError> {
        parse_device(service).map_err(|problem| ServiceError::new(service, problem))
    }
}

impl FromStr for DeviceService {
    type Err = ServiceError;

    fn from_str(service: &str) -> Result<DeviceService, ServiceError> {
        DeviceService::parse(service)
    }
}

fn parse_device(service: &str) -> Result<DeviceService, ServiceProblem> {
    use DeviceService::*;
    match service {
        "sync:" => return Ok(Sync),
        "oxadb-delta:" => return Ok(Delta),
        "track-jdwp" => return Ok(TrackJdwp),
        "track-app" => return Ok(TrackApp),
        _ => {}
    }
    if let Some(rest) = service.strip_prefix("shell") {
        if rest.is_empty() || rest.starts_with([',', ':']) {
            return parse_shell(rest).map(Shell);
        }
        return Err(ServiceProblem::Unknown);
    }
    // Prefixes whose rest is free text (or ignored).
    type Make = fn(String) -> DeviceService;
    const TEXT: &[(&str, Make)] = &[
        ("exec:", Exec),
        ("localabstract:", LocalAbstract),
        ("localreserved:", LocalReserved),
        ("localfilesystem:", LocalFilesystem),
        ("local:", Local),
        ("dev:", |path| Dev { path, raw: false }),
        ("dev-raw:", |path| Dev { path, raw: true }),
        ("framebuffer:", |_| Framebuffer),
        ("reboot:", Reboot),
        ("usb:", |_| Usb),
        ("abb:", Abb),
        ("abb_exec:", AbbExec),
    ];
    for (prefix, make) in TEXT {
        if let Some(rest) = service.strip_prefix(prefix) {
            return Ok(make(rest.to_owned()));
        }
    }
    if let Some(rest) = service.strip_prefix("tcp:") {
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) => (Some(host.to_owned()), port),
            None => (None, rest),
        };
        let port = port
            .parse()
            .map_err(|_| ServiceProblem::TcpPort(port.to_owned()))?;
        return Ok(Tcp { host, port });
    }
    if let Some(port) = service.strip_prefix("tcpip:") {
        return port
            .parse()
            .map(TcpIp)
            .map_err(|_| ServiceProblem::TcpipPort(port.to_owned()));
    }
    if let Some(pid) = service.strip_prefix("jdwp:") {
        return number(pid).map(Jdwp);
    }
    if let Some(count) = service.strip_prefix("sink:") {
        return number(count).map(Sink);
    }
    if let Some(count) = service.strip_prefix("source:") {
        return number(count).map(Source);
    }
    if let Some(request) = service.strip_prefix("reverse:") {
        return ForwardRequest::parse(request)
            .map(Reverse)
            .map_err(ServiceProblem::Forward);
    }
    // adbd's restart and verity services take the name with or without a
    // colon and ignore what follows it; remount passes it on.
    let (name, args) = match service.split_once(':') {
        Some((name, args)) => (name, args),
        None => (service, ""),
    };
    match name {
        "root" => Ok(Root),
        "unroot" => Ok(Unroot),
        "enable-verity" => Ok(EnableVerity),
        "disable-verity" => Ok(DisableVerity),
        "remount" => Ok(Remount(args.to_owned())),
        _ => Err(ServiceProblem::Unknown),
    }
}

/// What follows `shell`: `[,ARG]...:COMMAND`. As adbd does, arguments may
/// come in any order, empty or unknown ones are ignored, and the last
/// `raw`/`pty` and the last `TERM=` win.
fn parse_shell(rest: &str) -> Result<ShellService, ServiceProblem> {
    let (args, command) = rest.split_once(':').ok_or(ServiceProblem::MissingColon)?;
    let mut shell = ShellService {
        protocol: ShellProtocol::V1,
        term: None,
        mode: None,
        command: command.to_owned(),
    };
    for arg in args.split(',') {
        match arg {
            "v2" => shell.protocol = ShellProtocol::V2,
            "raw" => shell.mode = Some(ShellMode::Raw),
            "pty" => shell.mode = Some(ShellMode::Pty),
            _ => {
                if let Some(term) = arg.strip_prefix("TERM=") {
                    shell.term = Some(term.to_owned());
                }
            }
        }
    }
    Ok(shell)
}

fn number<T: FromStr>(text: &str) -> Result<T, ServiceProblem> {
    text.parse()
        .map_err(|_| ServiceProblem::Number(text.to_owned()))
}

impl fmt::Display for ShellService {
    /// In the order adb's client writes them (`client/commandline.cpp`
    /// ShellServiceString): `v2`, `TERM=`, then `raw` or `pty`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("shell")?;
        if self.protocol == ShellProtocol::V2 {
            f.write_str(",v2")?;
        }
        if let Some(term) = &self.term {
            write!(f, ",TERM={term}")?;
        }
        match self.mode {
            Some(ShellMode::Raw) => f.write_str(",raw")?,
            Some(ShellMode::Pty) => f.write_str(",pty")?,
            None => {}
        }
        write!(f, ":{}", self.command)
    }
}

impl fmt::Display for DeviceService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use DeviceService::*;
        match self {
            Shell(shell) => shell.fmt(f),
            Exec(command) => write!(f, "exec:{command}"),
            Sync => f.write_str("sync:"),
            Tcp { host: None, port } => write!(f, "tcp:{port}"),
            Tcp {
                host: Some(host),
                port,
            } => write!(f, "tcp:{host}:{port}"),
            LocalAbstract(name) => write!(f, "localabstract:{name}"),
            LocalReserved(name) => write!(f, "localreserved:{name}"),
            LocalFilesystem(path) => write!(f, "localfilesystem:{path}"),
            Local(path) => write!(f, "local:{path}"),
            Dev { path, raw: false } => write!(f, "dev:{path}"),
            Dev { path, raw: true } => write!(f, "dev-raw:{path}"),
            Jdwp(pid) => write!(f, "jdwp:{pid}"),
            TrackJdwp => f.write_str("track-jdwp"),
            TrackApp => f.write_str("track-app"),
            Reverse(request) => write!(f, "reverse:{request}"),
            Framebuffer => f.write_str("framebuffer:"),
            Reboot(target) => write!(f, "reboot:{target}"),
            Remount(args) => write!(f, "remount:{args}"),
            Root => f.write_str("root:"),
            Unroot => f.write_str("unroot:"),
            EnableVerity => f.write_str("enable-verity:"),
            DisableVerity => f.write_str("disable-verity:"),
            Usb => f.write_str("usb:"),
            TcpIp(port) => write!(f, "tcpip:{port}"),
            Abb(args) => write!(f, "abb:{args}"),
            AbbExec(args) => write!(f, "abb_exec:{args}"),
            Sink(bytes) => write!(f, "sink:{bytes}"),
            Source(bytes) => write!(f, "source:{bytes}"),
            Delta => f.write_str("oxadb-delta:"),
        }
    }
}

impl ForwardRequest {
    /// Parses what follows `reverse:` (or `host:`), checking the specs as
    /// adbd does before it looks at them.
    pub fn parse(request: &str) -> Result<ForwardRequest, ForwardError> {
        match request {
            "list-forward" => return Ok(ForwardRequest::List),
            "killforward-all" => return Ok(ForwardRequest::KillAll),
            _ => {}
        }
        if let Some(local) = request.strip_prefix("killforward:") {
            if local.is_empty() || local.contains(';') {
                return Err(ForwardError::BadKillForward(local.to_owned()));
            }
            return Ok(ForwardRequest::Kill(local.to_owned()));
        }
        let Some(rest) = request.strip_prefix("forward:") else {
            return Err(ForwardError::NotForwarding);
        };
        let (no_rebind, pair) = match rest.strip_prefix("norebind:") {
            Some(pair) => (true, pair),
            None => (false, rest),
        };
        let mut specs = pair.split(';');
        match (specs.next(), specs.next(), specs.next()) {
            (Some(local), Some(remote), None)
                if !local.is_empty() && !remote.is_empty() && !remote.starts_with('*') =>
            {
                Ok(ForwardRequest::Forward {
                    local: local.to_owned(),
                    remote: remote.to_owned(),
                    no_rebind,
                })
            }
            _ => Err(ForwardError::BadForward(pair.to_owned())),
        }
    }
}

impl FromStr for ForwardRequest {
    type Err = ForwardError;

    fn from_str(request: &str) -> Result<ForwardRequest, ForwardError> {
        ForwardRequest::parse(request)
    }
}

impl fmt::Display for ForwardRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForwardRequest::Forward {
                local,
                remote,
                no_rebind,
            } => {
                let norebind = if *no_rebind { "norebind:" } else { "" };
                write!(f, "forward:{norebind}{local};{remote}")
            }
            ForwardRequest::Kill(local) => write!(f, "killforward:{local}"),
            ForwardRequest::KillAll => f.write_str("killforward-all"),
            ForwardRequest::List => f.write_str("list-forward"),
        }
    }
}

/// Which device a host service is about, and what `host:transport...`
/// switches to: the only one, the only USB one, the only TCP one, one by
/// serial, one by the server's transport id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelector {
    Any,
    Usb,
    Local,
    /// A serial with `:` in it survives `host-serial:` only in the shapes
    /// adb's server splits: `HOST:PORT`, `[IPv6]:PORT`, `usb:...`,
    /// `product:`/`model:`/`device:...`, `vsock:CID:PORT`, `tcp:`/`udp:`
    /// before any of these.
    Serial(String),
    TransportId(u64),
}

/// `host:tport:...`: a transport switch that answers with the transport id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TportSelector {
    Any,
    Usb,
    Local,
    Serial(String),
}

/// `host:track-devices`' formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceListFormat {
    /// `SERIAL\tSTATE` lines, as `devices`.
    Short,
    /// `-l`: as `devices-l`, with the device path, product, model, device
    /// and transport id.
    Long,
    /// `-proto-binary`.
    ProtoBinary,
    /// `-proto-text`.
    ProtoText,
}

/// `wait-for-TRANSPORT-STATE`: which transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitTransport {
    Usb,
    Local,
    Any,
}

/// `wait-for-TRANSPORT-STATE`: which state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitState {
    Device,
    Recovery,
    Rescue,
    Sideload,
    Bootloader,
    Any,
    Disconnect,
}

/// What a client asks an adb host server (after the `host...:` prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostRequest {
    Version,
    Kill,
    /// `devices`, or `devices-l` with `long`.
    Devices {
        long: bool,
    },
    /// `track-devices[-l|-proto-binary|-proto-text]`.
    TrackDevices(DeviceListFormat),
    Features,
    HostFeatures,
    /// `transport-any|usb|local`, `transport:SERIAL`, `transport-id:N`.
    Transport(DeviceSelector),
    /// `tport:any|usb|local`, `tport:serial:SERIAL`.
    Tport(TportSelector),
    GetState,
    GetSerialno,
    GetDevpath,
    /// `connect:ADDRESS`.
    Connect(String),
    /// `disconnect:ADDRESS`; empty: every TCP device.
    Disconnect(String),
    Reconnect,
    ReconnectOffline,
    /// `pair:CODE:ADDRESS`; the code holds no `:`.
    Pair {
        code: String,
        address: String,
    },
    /// `wait-for-TRANSPORT-STATE`.
    WaitFor {
        transport: WaitTransport,
        state: WaitState,
    },
    /// `forward:...`, `killforward:...`, `killforward-all`, `list-forward`.
    Forward(ForwardRequest),
    /// `mdns:check`.
    MdnsCheck,
    /// `mdns:services`.
    MdnsServices,
    TrackMdnsServices,
    Attach,
    Detach,
    ServerStatus,
    /// `emulator:PORT`: an emulator announcing its console port.
    Emulator(u16),
}

/// A request to an adb host server: `host:REQUEST`, `host-usb:REQUEST`,
/// `host-local:REQUEST`, `host-serial:SERIAL:REQUEST` or
/// `host-transport-id:N:REQUEST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostService {
    pub device: DeviceSelector,
    pub request: HostRequest,
}

impl HostService {
    /// Parses a request's text (after its four hex digits of length).
    /// Anything not starting with a `host` prefix is a device service the
    /// server passes on, which this reports as [`ServiceProblem::Unknown`].
    pub fn parse(service: &str) -> Result<HostService, ServiceError> {
        parse_host(service).map_err(|problem| ServiceError::new(service, problem))
    }
}

impl FromStr for HostService {
    type Err = ServiceError;

    fn from_str(service: &str) -> Result<HostService, ServiceError> {
        HostService::parse(service)
    }
}

fn parse_host(service: &str) -> Result<HostService, ServiceProblem> {
    let (device, request) = if let Some(rest) = service.strip_prefix("host-serial:") {
        let (serial, request) = split_serial(rest).ok_or(ServiceProblem::Serial)?;
        (DeviceSelector::Serial(serial.to_owned()), request)
    } else if let Some(rest) = service.strip_prefix("host-transport-id:") {
        let (id, request) = rest.split_once(':').ok_or(ServiceProblem::MissingColon)?;
        (DeviceSelector::TransportId(number(id)?), request)
    } else if let Some(request) = service.strip_prefix("host-usb:") {
        (DeviceSelector::Usb, request)
    } else if let Some(request) = service.strip_prefix("host-local:") {
        (DeviceSelector::Local, request)
    } else if let Some(request) = service.strip_prefix("host:") {
        (DeviceSelector::Any, request)
    } else {
        return Err(ServiceProblem::Unknown);
    };
    Ok(HostService {
        device,
        request: parse_host_request(request)?,
    })
}

/// Splits `SERIAL:REQUEST` where adb's server does (AOSP `sockets.cpp`
/// parse_host_service): a serial may hold colons, so the first one does
/// not end it. After `usb:`, `product:`, `model:` or `device:` the serial
/// ends at the next colon. Otherwise a leading `tcp:`/`udp:` and a
/// `vsock:` are part of it, an `[IPv6]` address followed by `:` is taken
/// whole (else the serial runs to the next colon), and a field of digits
/// (even none) closed by another colon is its port. `None` when no request
/// follows.
fn split_serial(text: &str) -> Option<(&str, &str)> {
    // `end` is the index of the colon between serial and request.
    let finish = |end: usize| {
        let request = &text[end + 1..];
        (!request.is_empty()).then(|| (&text[..end], request))
    };
    for qualifier in ["usb:", "product:", "model:", "device:"] {
        if let Some(rest) = text.strip_prefix(qualifier) {
            return finish(qualifier.len() + rest.find(':')?);
        }
    }
    let mut at = 0;
    for protocol in ["tcp:", "udp:"] {
        if text.starts_with(protocol) {
            at = protocol.len();
            if text.len() == at {
                return None;
            }
        }
    }
    if text[at..].starts_with("vsock:") {
        at += "vsock:".len();
    }
    let mut address_taken = false;
    if text[at..].starts_with('[') {
        if let Some(close) = text[at..].find(']') {
            at += close + 1;
            if !text[at..].starts_with(':') {
                return None;
            }
            at += 1;
            address_taken = true;
        }
    }
    if !address_taken {
        at += text[at..].find(':')? + 1;
    }
    // `at` is just past a colon: a port and another colon, or the request.
    let rest = &text[at..];
    if let Some(colon) = rest.find(':') {
        if rest[..colon].bytes().all(|b| b.is_ascii_digit()) {
            at += colon + 1;
        }
    }
    finish(at - 1)
}

fn parse_host_request(request: &str) -> Result<HostRequest, ServiceProblem> {
    use HostRequest::*;
    let exact = match request {
        "version" => Some(Version),
        "kill" => Some(Kill),
        "devices" => Some(Devices { long: false }),
        "devices-l" => Some(Devices { long: true }),
        "track-devices" => Some(TrackDevices(DeviceListFormat::Short)),
        "track-devices-l" => Some(TrackDevices(DeviceListFormat::Long)),
        "track-devices-proto-binary" => Some(TrackDevices(DeviceListFormat::ProtoBinary)),
        "track-devices-proto-text" => Some(TrackDevices(DeviceListFormat::ProtoText)),
        "features" => Some(Features),
        "host-features" => Some(HostFeatures),
        "transport-any" => Some(Transport(DeviceSelector::Any)),
        "transport-usb" => Some(Transport(DeviceSelector::Usb)),
        "transport-local" => Some(Transport(DeviceSelector::Local)),
        "tport:any" => Some(Tport(TportSelector::Any)),
        "tport:usb" => Some(Tport(TportSelector::Usb)),
        "tport:local" => Some(Tport(TportSelector::Local)),
        "get-state" => Some(GetState),
        "get-serialno" => Some(GetSerialno),
        "get-devpath" => Some(GetDevpath),
        "reconnect" => Some(Reconnect),
        "reconnect-offline" => Some(ReconnectOffline),
        "mdns:check" => Some(MdnsCheck),
        "mdns:services" => Some(MdnsServices),
        "track-mdns-services" => Some(TrackMdnsServices),
        "attach" => Some(Attach),
        "detach" => Some(Detach),
        "server-status" => Some(ServerStatus),
        "killforward-all" => Some(Forward(ForwardRequest::KillAll)),
        "list-forward" => Some(Forward(ForwardRequest::List)),
        _ => None,
    };
    if let Some(request) = exact {
        return Ok(request);
    }
    if let Some(serial) = request.strip_prefix("transport:") {
        return Ok(Transport(DeviceSelector::Serial(serial.to_owned())));
    }
    if let Some(id) = request.strip_prefix("transport-id:") {
        return number(id).map(|id| Transport(DeviceSelector::TransportId(id)));
    }
    if let Some(serial) = request.strip_prefix("tport:serial:") {
        return Ok(Tport(TportSelector::Serial(serial.to_owned())));
    }
    if let Some(address) = request.strip_prefix("connect:") {
        return Ok(Connect(address.to_owned()));
    }
    if let Some(address) = request.strip_prefix("disconnect:") {
        return Ok(Disconnect(address.to_owned()));
    }
    if let Some(rest) = request.strip_prefix("pair:") {
        let (code, address) = rest.split_once(':').ok_or(ServiceProblem::PairAddress)?;
        return Ok(Pair {
            code: code.to_owned(),
            address: address.to_owned(),
        });
    }
    if let Some(port) = request.strip_prefix("emulator:") {
        return number(port).map(Emulator);
    }
    if let Some(rest) = request.strip_prefix("wait-for-") {
        return parse_wait_for(rest).ok_or(ServiceProblem::Unknown);
    }
    if request.starts_with("forward:") || request.starts_with("killforward:") {
        return ForwardRequest::parse(request)
            .map(Forward)
            .map_err(ServiceProblem::Forward);
    }
    Err(ServiceProblem::Unknown)
}

const WAIT_TRANSPORTS: [(&str, WaitTransport); 3] = [
    ("usb", WaitTransport::Usb),
    ("local", WaitTransport::Local),
    ("any", WaitTransport::Any),
];

const WAIT_STATES: [(&str, WaitState); 7] = [
    ("device", WaitState::Device),
    ("recovery", WaitState::Recovery),
    ("rescue", WaitState::Rescue),
    ("sideload", WaitState::Sideload),
    ("bootloader", WaitState::Bootloader),
    ("any", WaitState::Any),
    ("disconnect", WaitState::Disconnect),
];

fn parse_wait_for(rest: &str) -> Option<HostRequest> {
    let (transport, state) = rest.split_once('-')?;
    let transport = WAIT_TRANSPORTS
        .iter()
        .find(|(name, _)| *name == transport)?
        .1;
    let state = WAIT_STATES.iter().find(|(name, _)| *name == state)?.1;
    Some(HostRequest::WaitFor { transport, state })
}

fn name_of<T: PartialEq + Copy>(table: &[(&'static str, T)], value: T) -> &'static str {
    table
        .iter()
        .find(|(_, v)| *v == value)
        .map(|(name, _)| *name)
        .expect("every value is in its table")
}

impl fmt::Display for HostRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use HostRequest::*;
        match self {
            Version => f.write_str("version"),
            Kill => f.write_str("kill"),
            Devices { long: false } => f.write_str("devices"),
            Devices { long: true } => f.write_str("devices-l"),
            TrackDevices(format) => f.write_str(match format {
                DeviceListFormat::Short => "track-devices",
                DeviceListFormat::Long => "track-devices-l",
                DeviceListFormat::ProtoBinary => "track-devices-proto-binary",
                DeviceListFormat::ProtoText => "track-devices-proto-text",
            }),
            Features => f.write_str("features"),
            HostFeatures => f.write_str("host-features"),
            Transport(DeviceSelector::Any) => f.write_str("transport-any"),
            Transport(DeviceSelector::Usb) => f.write_str("transport-usb"),
            Transport(DeviceSelector::Local) => f.write_str("transport-local"),
            Transport(DeviceSelector::Serial(serial)) => write!(f, "transport:{serial}"),
            Transport(DeviceSelector::TransportId(id)) => write!(f, "transport-id:{id}"),
            Tport(TportSelector::Any) => f.write_str("tport:any"),
            Tport(TportSelector::Usb) => f.write_str("tport:usb"),
            Tport(TportSelector::Local) => f.write_str("tport:local"),
            Tport(TportSelector::Serial(serial)) => write!(f, "tport:serial:{serial}"),
            GetState => f.write_str("get-state"),
            GetSerialno => f.write_str("get-serialno"),
            GetDevpath => f.write_str("get-devpath"),
            Connect(address) => write!(f, "connect:{address}"),
            Disconnect(address) => write!(f, "disconnect:{address}"),
            Reconnect => f.write_str("reconnect"),
            ReconnectOffline => f.write_str("reconnect-offline"),
            Pair { code, address } => write!(f, "pair:{code}:{address}"),
            WaitFor { transport, state } => write!(
                f,
                "wait-for-{}-{}",
                name_of(&WAIT_TRANSPORTS, *transport),
                name_of(&WAIT_STATES, *state)
            ),
            Forward(request) => request.fmt(f),
            MdnsCheck => f.write_str("mdns:check"),
            MdnsServices => f.write_str("mdns:services"),
            TrackMdnsServices => f.write_str("track-mdns-services"),
            Attach => f.write_str("attach"),
            Detach => f.write_str("detach"),
            ServerStatus => f.write_str("server-status"),
            Emulator(port) => write!(f, "emulator:{port}"),
        }
    }
}

impl fmt::Display for HostService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.device {
            DeviceSelector::Any => f.write_str("host:")?,
            DeviceSelector::Usb => f.write_str("host-usb:")?,
            DeviceSelector::Local => f.write_str("host-local:")?,
            DeviceSelector::Serial(serial) => write!(f, "host-serial:{serial}:")?,
            DeviceSelector::TransportId(id) => write!(f, "host-transport-id:{id}:")?,
        }
        self.request.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str) -> DeviceService {
        name.parse()
            .unwrap_or_else(|error| panic!("{name:?}: {error}"))
    }

    fn device_problem(name: &str) -> ServiceProblem {
        match DeviceService::parse(name) {
            Ok(service) => panic!("{name:?} parsed as {service:?}"),
            Err(error) => {
                assert_eq!(error.service, name);
                error.problem
            }
        }
    }

    fn host(name: &str) -> HostService {
        name.parse()
            .unwrap_or_else(|error| panic!("{name:?}: {error}"))
    }

    fn port(port: u16) -> NonZeroU16 {
        NonZeroU16::new(port).unwrap()
    }

    fn shell(
        protocol: ShellProtocol,
        term: Option<&str>,
        mode: Option<ShellMode>,
        command: &str,
    ) -> DeviceService {
        DeviceService::Shell(ShellService {
            protocol,
            term: term.map(str::to_owned),
            mode,
            command: command.to_owned(),
        })
    }

    /// Names as hosts send them: each parses to a value that writes it back.
    const CANONICAL_DEVICE: &[&str] = &[
        "shell:",
        "shell:ls -l",
        "shell,v2,raw:id",
        "shell,v2,TERM=xterm-256color,pty:",
        "shell,v2,TERM=dumb:export ANDROID_LOG_TAGS=\"''\"; exec logcat",
        "shell,TERM=:x",
        "shell,raw:",
        "exec:",
        "exec:cat > /tmp/f",
        "sync:",
        "tcp:8080",
        "tcp:localhost:22",
        "tcp:::1:22",
        "tcp:[::1]:22",
        "localabstract:chrome_devtools_remote",
        "localreserved:x",
        "localfilesystem:/run/x.sock",
        "local:/dev/socket/x",
        "dev:/dev/ttyS0",
        "dev-raw:/dev/ttyUSB0",
        "dev:",
        "jdwp:1234",
        "track-jdwp",
        "track-app",
        "reverse:forward:tcp:8080;tcp:9090",
        "reverse:forward:norebind:localabstract:a;localfilesystem:/b",
        "reverse:killforward:tcp:8080",
        "reverse:killforward-all",
        "reverse:list-forward",
        "framebuffer:",
        "reboot:",
        "reboot:bootloader",
        "remount:",
        "remount:-R",
        "root:",
        "unroot:",
        "enable-verity:",
        "disable-verity:",
        "usb:",
        "tcpip:5555",
        "abb:package\0list\0packages",
        "abb_exec:package\0install-write",
        "sink:1048576",
        "source:0",
    ];

    #[test]
    fn canonical_device_names_come_back() {
        for name in CANONICAL_DEVICE {
            assert_eq!(device(name).to_string(), *name);
        }
    }

    #[test]
    fn shell_arguments_in_any_order() {
        use ShellMode::*;
        use ShellProtocol::*;
        let want = shell(V2, Some("xterm"), Some(Raw), "ls");
        for name in [
            "shell,v2,TERM=xterm,raw:ls",
            "shell,raw,v2,TERM=xterm:ls",
            "shell,TERM=xterm,raw,v2:ls",
            "shell,,v2,,TERM=xterm,raw,:ls",
            "shell,future=1,v2,TERM=xterm,raw:ls",
            "shell,pty,TERM=dumb,v2,raw,TERM=xterm:ls",
        ] {
            assert_eq!(device(name), want, "{name}");
        }
        assert_eq!(device("shell,pty,raw:x"), shell(V1, None, Some(Raw), "x"));
        assert_eq!(device("shell,raw,pty:x"), shell(V1, None, Some(Pty), "x"));
        assert_eq!(device("shell,v2:"), shell(V2, None, None, ""));
        // Only the first colon ends the arguments.
        assert_eq!(
            device("shell,v2:echo a:b,c"),
            shell(V2, None, None, "echo a:b,c")
        );
        assert_eq!(device("shell,TERM=a=b:"), shell(V1, Some("a=b"), None, ""));
        assert_eq!(device("exec:a,b:c"), DeviceService::Exec("a,b:c".into()));
    }

    #[test]
    fn shell_without_a_colon_is_malformed() {
        assert_eq!(device_problem("shell"), ServiceProblem::MissingColon);
        assert_eq!(device_problem("shell,v2"), ServiceProblem::MissingColon);
        assert_eq!(device_problem("shell,v2,raw"), ServiceProblem::MissingColon);
        for name in [
            "shellx:ls",
            "Shell:ls",
            "exec",
            "",
            "sync",
            "sync:x",
            "shel:",
        ] {
            assert_eq!(device_problem(name), ServiceProblem::Unknown, "{name:?}");
        }
    }

    #[test]
    fn tcp_ports_follow_the_last_colon() {
        assert_eq!(
            device("tcp:8080"),
            DeviceService::Tcp {
                host: None,
                port: port(8080)
            }
        );
        assert_eq!(
            device("tcp:fe80::1:22"),
            DeviceService::Tcp {
                host: Some("fe80::1".into()),
                port: port(22)
            }
        );
        assert_eq!(
            device("tcp::22"),
            DeviceService::Tcp {
                host: Some(String::new()),
                port: port(22)
            }
        );
        assert_eq!(device("tcp:+22").to_string(), "tcp:22");
        for (name, text) in [
            ("tcp:0", "0"),
            ("tcp:x", "x"),
            ("tcp:", ""),
            ("tcp:65536", "65536"),
            ("tcp:22:localhost", "localhost"),
        ] {
            assert_eq!(device_problem(name), ServiceProblem::TcpPort(text.into()));
        }
    }

    #[test]
    fn tcpip_keeps_the_text_of_a_bad_port() {
        assert_eq!(device("tcpip:5555"), DeviceService::TcpIp(port(5555)));
        for text in ["0", "x", "", "70000", "-1"] {
            assert_eq!(
                device_problem(&format!("tcpip:{text}")),
                ServiceProblem::TcpipPort(text.into())
            );
        }
    }

    #[test]
    fn names_with_or_without_a_colon() {
        use DeviceService::*;
        for (name, want) in [
            ("root", Root),
            ("root:", Root),
            ("root:now", Root),
            ("unroot", Unroot),
            ("enable-verity", EnableVerity),
            ("disable-verity:", DisableVerity),
            ("remount", Remount(String::new())),
            ("remount:-R", Remount("-R".into())),
            ("framebuffer:whatever", Framebuffer),
            ("usb:x", Usb),
        ] {
            assert_eq!(device(name), want, "{name}");
        }
        for name in [
            "framebuffer",
            "usb",
            "reboot",
            "rooted:",
            "track-app:",
            "sink:",
            "jdwp:x",
        ] {
            assert!(DeviceService::parse(name).is_err(), "{name}");
        }
        assert_eq!(
            device_problem("jdwp:-1"),
            ServiceProblem::Number("-1".into())
        );
    }

    #[test]
    fn forwarding_requests_fail_in_adbds_words() {
        let failure = |name: &str| match device_problem(name) {
            ServiceProblem::Forward(error) => error.to_string(),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(failure("reverse:forward:tcp:1"), "bad forward: tcp:1");
        assert_eq!(
            failure("reverse:forward:norebind:tcp:1;*smartsocket*"),
            "bad forward: tcp:1;*smartsocket*"
        );
        assert_eq!(failure("reverse:forward:;tcp:1"), "bad forward: ;tcp:1");
        assert_eq!(failure("reverse:forward:a;b;c"), "bad forward: a;b;c");
        assert_eq!(failure("reverse:killforward:"), "bad killforward: ");
        assert_eq!(failure("reverse:killforward:a;b"), "bad killforward: a;b");
        assert_eq!(
            failure("reverse:frobnicate"),
            "not a reverse forwarding command"
        );
        assert_eq!(failure("reverse:"), "not a reverse forwarding command");
        assert_eq!(
            device("reverse:forward:norebind:tcp:1;tcp:2"),
            DeviceService::Reverse(ForwardRequest::Forward {
                local: "tcp:1".into(),
                remote: "tcp:2".into(),
                no_rebind: true
            })
        );
    }

    #[test]
    fn errors_name_the_service() {
        let error = DeviceService::parse("tcp:http").unwrap_err();
        assert_eq!(error.to_string(), r#""tcp:http": invalid port "http""#);
        let error = HostService::parse("frobnicate").unwrap_err();
        assert_eq!(error.to_string(), r#""frobnicate": unknown service"#);
    }

    const CANONICAL_HOST: &[&str] = &[
        "host:version",
        "host:kill",
        "host:devices",
        "host:devices-l",
        "host:track-devices",
        "host:track-devices-l",
        "host:track-devices-proto-binary",
        "host:track-devices-proto-text",
        "host:features",
        "host:host-features",
        "host:transport:emulator-5554",
        "host:transport:127.0.0.1:5555",
        "host:transport-id:7",
        "host:transport-any",
        "host:transport-usb",
        "host:transport-local",
        "host:tport:serial:127.0.0.1:5555",
        "host:tport:any",
        "host:tport:usb",
        "host:tport:local",
        "host-serial:emulator-5554:get-state",
        "host-serial:127.0.0.1:5555:get-serialno",
        "host-transport-id:3:get-devpath",
        "host-usb:get-state",
        "host-local:get-state",
        "host:connect:192.168.1.2:5555",
        "host:disconnect:",
        "host:disconnect:192.168.1.2:5555",
        "host:reconnect",
        "host-serial:usb:1-2:reconnect",
        "host:reconnect-offline",
        "host:pair:123456:192.168.1.2:37000",
        "host-serial:abc:wait-for-any-device",
        "host:wait-for-usb-disconnect",
        "host-local:wait-for-local-bootloader",
        "host-serial:abc:forward:tcp:8080;tcp:9090",
        "host-serial:abc:forward:norebind:tcp:0;localabstract:x",
        "host:killforward:tcp:8080",
        "host:killforward-all",
        "host:list-forward",
        "host:mdns:check",
        "host:mdns:services",
        "host:track-mdns-services",
        "host-serial:abc:attach",
        "host-serial:abc:detach",
        "host:server-status",
        "host:emulator:5554",
    ];

    #[test]
    fn canonical_host_names_come_back() {
        for name in CANONICAL_HOST {
            assert_eq!(host(name).to_string(), *name);
        }
    }

    #[test]
    fn serials_split_where_adbs_server_splits_them() {
        for (name, serial, request) in [
            (
                "host-serial:emulator-5554:get-state",
                "emulator-5554",
                "get-state",
            ),
            (
                "host-serial:127.0.0.1:5555:get-state",
                "127.0.0.1:5555",
                "get-state",
            ),
            (
                "host-serial:[::1]:5555:get-state",
                "[::1]:5555",
                "get-state",
            ),
            (
                "host-serial:[fe80::1%eth0]:get-state",
                "[fe80::1%eth0]",
                "get-state",
            ),
            (
                "host-serial:tcp:10.0.0.1:5555:get-state",
                "tcp:10.0.0.1:5555",
                "get-state",
            ),
            ("host-serial:udp:host:get-state", "udp:host", "get-state"),
            (
                "host-serial:vsock:3:5555:get-state",
                "vsock:3:5555",
                "get-state",
            ),
            ("host-serial:usb:1-2.3:get-state", "usb:1-2.3", "get-state"),
            (
                "host-serial:product:sdk_x86:get-state",
                "product:sdk_x86",
                "get-state",
            ),
            (
                "host-serial:model:Pixel_7:get-state",
                "model:Pixel_7",
                "get-state",
            ),
            (
                "host-serial:device:generic:get-state",
                "device:generic",
                "get-state",
            ),
            // A non-numeric field after the first colon is the request.
            (
                "host-serial:abc:forward:tcp:1;tcp:2",
                "abc",
                "forward:tcp:1;tcp:2",
            ),
            // An empty port field is a port, as in adb.
            ("host-serial:abc::get-state", "abc:", "get-state"),
            ("host-serial::get-state", "", "get-state"),
        ] {
            let service = host(name);
            assert_eq!(
                service.device,
                DeviceSelector::Serial(serial.into()),
                "{name}"
            );
            assert_eq!(service.request.to_string(), request, "{name}");
            assert_eq!(service.to_string(), name);
        }
        for name in [
            "host-serial:",
            "host-serial:abc",
            "host-serial:abc:",
            "host-serial:127.0.0.1:5555:",
            "host-serial:tcp:",
            "host-serial:usb:1-2",
            "host-serial:[::1]x:get-state",
            "host-serial:[::1]",
        ] {
            assert_eq!(
                HostService::parse(name).unwrap_err().problem,
                ServiceProblem::Serial,
                "{name}"
            );
        }
        // A serial that is not one of adb's shapes is misread, as adb misreads it.
        assert_eq!(
            HostService::parse("host-serial:a:b:get-state")
                .unwrap_err()
                .problem,
            ServiceProblem::Unknown
        );
    }

    #[test]
    fn malformed_host_requests() {
        for (name, problem) in [
            ("host:", ServiceProblem::Unknown),
            ("host:frobnicate", ServiceProblem::Unknown),
            ("shell:ls", ServiceProblem::Unknown),
            ("hosts:version", ServiceProblem::Unknown),
            ("host:wait-for-usb", ServiceProblem::Unknown),
            ("host:wait-for-bluetooth-device", ServiceProblem::Unknown),
            ("host:pair:123456", ServiceProblem::PairAddress),
            ("host:transport-id:x", ServiceProblem::Number("x".into())),
            (
                "host-transport-id:x:version",
                ServiceProblem::Number("x".into()),
            ),
            ("host-transport-id:7", ServiceProblem::MissingColon),
            (
                "host:emulator:70000",
                ServiceProblem::Number("70000".into()),
            ),
            (
                "host:forward:tcp:1",
                ServiceProblem::Forward(ForwardError::BadForward("tcp:1".into())),
            ),
        ] {
            assert_eq!(
                HostService::parse(name).unwrap_err().problem,
                problem,
                "{name}"
            );
        }
    }

    /// A small deterministic generator (xorshift64*), so the round trip
    /// covers many values in every run with no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn coin(&mut self) -> bool {
            self.next() & 1 == 1
        }

        /// Up to 8 characters, separators and digits well represented.
        fn text(&mut self, forbidden: &[char]) -> String {
            const ALPHABET: &[char] = &[
                'a', 'z', 'Q', '0', '5', '9', ':', ',', ';', '=', '-', '[', ']', '*', '/', ' ',
                '\'', '"', '\0', 'é', '😀',
            ];
            let len = self.below(9);
            (0..len)
                .map(|_| ALPHABET[self.below(ALPHABET.len())])
                .filter(|c| !forbidden.contains(c))
                .collect()
        }

        fn port(&mut self) -> NonZeroU16 {
            NonZeroU16::new(self.next() as u16).unwrap_or(NonZeroU16::MIN)
        }

        /// A spec for a forwarding request: not empty, no `;`.
        fn spec(&mut self) -> String {
            let spec = self.text(&[';']);
            if spec.is_empty() {
                "tcp:1".into()
            } else {
                spec
            }
        }

        fn forward(&mut self) -> ForwardRequest {
            match self.below(4) {
                0 => {
                    let mut local = self.spec();
                    if local.starts_with("norebind:") {
                        local.insert(0, 'x');
                    }
                    let mut remote = self.spec();
                    if remote.starts_with('*') {
                        remote.insert(0, 'x');
                    }
                    ForwardRequest::Forward {
                        local,
                        remote,
                        no_rebind: self.coin(),
                    }
                }
                1 => ForwardRequest::Kill(self.spec()),
                2 => ForwardRequest::KillAll,
                _ => ForwardRequest::List,
            }
        }

        fn device(&mut self) -> DeviceService {
            use DeviceService::*;
            match self.below(29) {
                28 => Delta,
                0 => Shell(ShellService {
                    protocol: if self.coin() {
                        ShellProtocol::V2
                    } else {
                        ShellProtocol::V1
                    },
                    term: self.coin().then(|| self.text(&[',', ':'])),
                    mode: [None, Some(ShellMode::Raw), Some(ShellMode::Pty)][self.below(3)],
                    command: self.text(&[]),
                }),
                1 => Exec(self.text(&[])),
                2 => Sync,
                3 => Tcp {
                    host: self.coin().then(|| self.text(&[])),
                    port: self.port(),
                },
                4 => LocalAbstract(self.text(&[])),
                5 => LocalReserved(self.text(&[])),
                6 => LocalFilesystem(self.text(&[])),
                7 => Local(self.text(&[])),
                8 => Dev {
                    path: self.text(&[]),
                    raw: self.coin(),
                },
                9 => Jdwp(self.next() as u32),
                10 => TrackJdwp,
                11 => TrackApp,
                12 => Reverse(self.forward()),
                13 => Framebuffer,
                14 => Reboot(self.text(&[])),
                15 => Remount(self.text(&[])),
                16 => Root,
                17 => Unroot,
                18 => EnableVerity,
                19 => DisableVerity,
                20 => Usb,
                21 => TcpIp(self.port()),
                22 => Abb(self.text(&[])),
                23 => AbbExec(self.text(&[])),
                24 => Sink(self.next()),
                25 => Source(self.next()),
                26 => Shell(ShellService {
                    protocol: ShellProtocol::V2,
                    term: None,
                    mode: None,
                    command: String::new(),
                }),
                _ => Exec(String::new()),
            }
        }

        /// A serial in one of the shapes adb's server splits back.
        fn serial(&mut self) -> String {
            let word = |rng: &mut Rng| {
                let word = rng.text(&[':', '[', ']']);
                // A leading protocol or qualifier would change the shape.
                format!("s{word}")
            };
            match self.below(7) {
                0 => word(self),
                1 => format!("{}:{}", word(self), self.next() as u16),
                2 => format!("[{}]:{}", self.text(&[']']), self.next() as u16),
                3 => format!("usb:{}", self.text(&[':'])),
                4 => format!("vsock:{}:{}", self.next() as u32, self.next() as u16),
                5 => format!("tcp:{}:{}", word(self), self.next() as u16),
                _ => format!("model:{}", self.text(&[':'])),
            }
        }

        fn selector(&mut self) -> DeviceSelector {
            match self.below(5) {
                0 => DeviceSelector::Any,
                1 => DeviceSelector::Usb,
                2 => DeviceSelector::Local,
                3 => DeviceSelector::Serial(self.serial()),
                _ => DeviceSelector::TransportId(self.next()),
            }
        }

        fn host(&mut self) -> HostService {
            use HostRequest::*;
            let formats = [
                DeviceListFormat::Short,
                DeviceListFormat::Long,
                DeviceListFormat::ProtoBinary,
                DeviceListFormat::ProtoText,
            ];
            let request = match self.below(26) {
                0 => Version,
                1 => Kill,
                2 => Devices { long: self.coin() },
                3 => TrackDevices(formats[self.below(4)]),
                4 => Features,
                5 => HostFeatures,
                6 => Transport(match self.selector() {
                    // Any serial: `transport:` runs to the end.
                    DeviceSelector::Serial(_) => DeviceSelector::Serial(self.text(&[])),
                    other => other,
                }),
                7 => Tport(match self.below(4) {
                    0 => TportSelector::Any,
                    1 => TportSelector::Usb,
                    2 => TportSelector::Local,
                    _ => TportSelector::Serial(self.text(&[])),
                }),
                8 => GetState,
                9 => GetSerialno,
                10 => GetDevpath,
                11 => Connect(self.text(&[])),
                12 => Disconnect(self.text(&[])),
                13 => Reconnect,
                14 => ReconnectOffline,
                15 => Pair {
                    code: self.text(&[':']),
                    address: self.text(&[]),
                },
                16 => WaitFor {
                    transport: WAIT_TRANSPORTS[self.below(3)].1,
                    state: WAIT_STATES[self.below(7)].1,
                },
                17 => Forward(self.forward()),
                18 => MdnsCheck,
                19 => MdnsServices,
                20 => TrackMdnsServices,
                21 => Attach,
                22 => Detach,
                23 => ServerStatus,
                24 => Emulator(self.next() as u16),
                _ => Reconnect,
            };
            HostService {
                device: self.selector(),
                request,
            }
        }
    }

    #[test]
    fn random_values_come_back_from_their_names() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let service = rng.device();
            let name = service.to_string();
            assert_eq!(DeviceService::parse(&name), Ok(service), "{name:?}");
            let service = rng.host();
            let name = service.to_string();
            assert_eq!(HostService::parse(&name), Ok(service), "{name:?}");
        }
    }
}
