//! Daemon configuration: command-line flags over an optional TOML file over defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use oxadb_engine::{BudgetLimits, CreditMode};
use oxadb_engine::{Config, Role};
use oxadb_wire::{feature, Banner};
use serde::Deserialize;
use thiserror::Error;

/// Default listen address: loopback only, as adbd's TCP mode would be reachable
/// by anyone otherwise, and the daemon hands out a root shell.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:5555";
/// What `framebuffer:` reads unless configured otherwise.
pub const DEFAULT_FRAMEBUFFER: &str = "/dev/fb0";
/// Read when present and no `--config` is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/oxadbd/oxadbd.toml";
/// The state directory (the push journal, the mDNS instance name): the
/// package's systemd unit makes it (`StateDirectory=oxadbd`), a daemon that
/// may makes it itself, and one that may not uses its user's ([`StateDir`]).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/oxadbd";

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error(
        "invalid listen address {0:?}: expected ADDR:PORT (e.g. 127.0.0.1:5555) or vsock:PORT"
    )]
    BadListen(String),
    #[error("listen: {0}")]
    ListenList(String),
    #[error(
        "refusing to listen on {0} without authentication: oxadbd gives a root shell; \
         drop --no-auth (hosts then need a key trusted with `oxadbd trust-key`), \
         or give --insecure if every host that can reach {0} may have root"
    )]
    UnauthenticatedExposure(SocketAddr),
    #[error(
        "refusing to listen on vsock:{0} without authentication: other virtual machines \
         and the host reach it, and oxadbd gives a root shell; drop --no-auth (hosts then \
         need a key trusted with `oxadbd trust-key`), or give --insecure if every one of \
         them may have root"
    )]
    UnauthenticatedVsock(u32),
    #[error("config file {path}: {message}")]
    BadValue { path: PathBuf, message: String },
    #[error("{setting} cannot be used with {mode}: {why}; drop one of them")]
    Contradiction {
        setting: String,
        mode: String,
        why: &'static str,
    },
    /// A flag or key of a cargo feature this build left out: never ignored,
    /// since the daemon would then do less than its operator asked.
    #[error("{setting}: this oxadbd was built without {what} (cargo feature `{feature}`)")]
    MissingFeature {
        setting: String,
        what: &'static str,
        feature: &'static str,
    },
}

impl ConfigError {
    /// `setting` (a flag, or a key and its file) asks for what a cargo
    /// feature left out of this build brings.
    pub fn missing_feature(
        setting: impl Into<String>,
        what: &'static str,
        feature: &'static str,
    ) -> ConfigError {
        ConfigError::MissingFeature {
            setting: setting.into(),
            what,
            feature,
        }
    }
}

/// The `[daemon]`-less flat TOML file; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    /// `ADDR:PORT` and/or `vsock:PORT`, comma-separated.
    pub listen: Option<String>,
    pub shell: Option<PathBuf>,
    /// The framebuffer device `framebuffer:` reads.
    pub framebuffer: Option<PathBuf>,
    pub product_name: Option<String>,
    pub product_model: Option<String>,
    pub product_device: Option<String>,
    /// `false` is the same as `credit = "classic"`.
    pub delayed_ack: Option<bool>,
    /// `classic`, `aosp` or `adaptive`.
    pub credit: Option<String>,
    /// The receive-memory budget of all streams, e.g. `"64M"`.
    pub memory_budget: Option<String>,
    /// `false` turns off the adaptive window's headroom for clumped
    /// deliveries (for ablation runs).
    pub ack_headroom: Option<bool>,
    /// `true`: every host must authenticate, root on loopback included;
    /// `false`: none need to (refused beyond loopback unless `insecure = true`).
    pub auth: Option<bool>,
    /// Let every local user in over loopback without a key (by default only
    /// root and the daemon's own user are).
    pub trust_local_users: Option<bool>,
    /// The authorized keys file (adb's `adb_keys` format).
    pub keys: Option<PathBuf>,
    /// Trust and record any public key a host offers (trust on first use).
    pub accept_new_keys: Option<bool>,
    /// `off`, `on` or `required`: STLS on TCP (`--tls`).
    pub tls: Option<String>,
    /// The daemon's TLS key and certificate [default: beside `keys`].
    pub tls_key: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    /// Allow listening beyond loopback without authentication.
    pub insecure: Option<bool>,
    pub max_connections: Option<usize>,
    pub max_streams: Option<usize>,
    /// Seconds a new connection has to send CNXN.
    pub handshake_timeout: Option<u64>,
    /// Seconds a new connection has to authenticate.
    pub auth_timeout: Option<u64>,
    /// Seconds a stream's data may wait for the host's credit before the
    /// stream is closed (0: never).
    pub stalled_stream_timeout: Option<u64>,
    /// Seconds a TCP host may stay silent (keepalive unanswered, or data
    /// unacknowledged) before its connection is closed (0: kernel defaults).
    pub peer_timeout: Option<u64>,
    /// Serve ADB over USB (FunctionFS); TCP then only with `listen`.
    pub usb: Option<bool>,
    /// The FunctionFS mount of the ADB function.
    pub ffs_dir: Option<PathBuf>,
    /// The configfs gadget to bind to a UDC once the descriptors are written.
    pub usb_gadget: Option<PathBuf>,
    /// The UDC to bind it to (default: the first in /sys/class/udc).
    pub usb_udc: Option<String>,
    /// What `adb reboot` runs (split on blanks; the target is appended);
    /// empty turns rebooting off.
    pub reboot_command: Option<String>,
    /// Whether hosts may move the TCP listener (`adb tcpip PORT`, `adb usb`).
    pub allow_tcpip: Option<bool>,
    /// Announce the TCP listener over mDNS (`false`: as `--no-mdns`).
    pub mdns: Option<bool>,
    /// How far a pushed file is flushed before `OKAY`: `full`, `rename` or `none`.
    pub durability: Option<String>,
    /// Where the journal of directories holding temporary push files lives
    /// (default /var/lib/oxadbd, else the user's own: [`StateDir`]).
    pub state_dir: Option<PathBuf>,
    /// Seconds pushes in flight may take to finish after SIGTERM.
    pub stop_grace: Option<u64>,
    /// `[properties]`: what `getprop` answers, over the computed ones.
    /// Dotted names may be quoted or not (`ro.a = "1"` is the table
    /// `ro` in TOML; it is flattened back to `ro.a`).
    pub properties: Option<toml::Table>,
    /// Where this was read from, for error messages.
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

impl FileConfig {
    /// Whether to announce over mDNS: unless `--no-mdns` or `mdns = false`.
    /// A build without the `mdns` feature announces nothing, and refuses
    /// `mdns = true`, which asks for it.
    pub fn announces_mdns(&self, no_mdns_flag: bool) -> Result<bool, ConfigError> {
        if !cfg!(feature = "mdns") {
            if self.mdns == Some(true) {
                let path = self
                    .path
                    .as_deref()
                    .unwrap_or(Path::new(DEFAULT_CONFIG_PATH));
                return Err(ConfigError::missing_feature(
                    format!("`mdns = true` in {}", path.display()),
                    "mDNS",
                    "mdns",
                ));
            }
            return Ok(false);
        }
        Ok(!no_mdns_flag && self.mdns != Some(false))
    }

    /// The `credit` key, or `classic` for `delayed-ack = false`.
    pub fn credit_mode(&self) -> Result<Option<CreditMode>, ConfigError> {
        if let Some(text) = &self.credit {
            return oxadb_io::parse_credit_mode(text)
                .map(Some)
                .map_err(|message| ConfigError::BadValue {
                    path: self
                        .path
                        .clone()
                        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH)),
                    message,
                });
        }
        Ok((self.delayed_ack == Some(false)).then_some(CreditMode::Classic))
    }

    /// The `memory-budget` key, in bytes.
    pub fn memory_budget(&self) -> Result<Option<u64>, ConfigError> {
        self.memory_budget
            .as_deref()
            .map(|text| {
                parse_size(text).map_err(|message| ConfigError::BadValue {
                    path: self
                        .path
                        .clone()
                        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH)),
                    message: format!("memory-budget: {message}"),
                })
            })
            .transpose()
    }

    /// The `durability` key.
    pub fn durability(&self) -> Result<Option<oxadb_transfer::Durability>, ConfigError> {
        self.durability
            .as_deref()
            .map(|text| {
                text.parse().map_err(|message| ConfigError::BadValue {
                    path: self
                        .path
                        .clone()
                        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH)),
                    message: format!("durability: {message}"),
                })
            })
            .transpose()
    }

    /// Loads `path`; a missing default file is not an error, a missing named one is.
    pub fn load(path: Option<&Path>) -> Result<FileConfig, ConfigError> {
        let (path, required) = match path {
            Some(path) => (path.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if !required && error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(FileConfig::default())
            }
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        let mut config: FileConfig =
            toml::from_str(&text).map_err(|source| ConfigError::Parse {
                path: path.clone(),
                source: Box::new(source),
            })?;
        config.path = Some(path);
        Ok(config)
    }
}

/// Everything the daemon needs to run.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The TCP address (the binary serves TCP unless only USB was asked for;
    /// see [`UsbConfig`], which lives beside this struct).
    pub listen: SocketAddr,
    pub shell: PathBuf,
    /// The framebuffer device `framebuffer:` reads (`/dev/fb0`).
    pub framebuffer: PathBuf,
    pub product_name: String,
    pub product_model: String,
    pub product_device: String,
    /// Flow control offered; anything but `Classic` advertises `delayed_ack`.
    pub credit: CreditMode,
    /// The levels of the receive-memory budget shared by every stream.
    pub memory_budget: BudgetLimits,
    /// Headroom for clumped deliveries in adaptive windows (docs/flow-control.md,
    /// "Headroom for clumps").
    pub ack_headroom: bool,
    /// Host authentication and resource limits.
    pub access: Access,
    /// `getprop`, `reboot:` and `tcpip:` settings.
    pub device: DeviceSettings,
    /// How far a pushed file is flushed before its `OKAY`.
    pub durability: oxadb_transfer::Durability,
    /// Plain pulls send file data by `sendfile` (`--zero-copy`).
    pub zero_copy: bool,
}

/// How the daemon answers Android's device services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSettings {
    /// The config file's `[properties]`, over the computed ones.
    pub properties: std::collections::BTreeMap<String, String>,
    /// `reboot-command`; `None`: `systemctl reboot` under systemd, else `reboot`.
    pub reboot_command: Option<String>,
    /// Hosts may move the TCP listener to another port (never another address).
    pub allow_tcpip: bool,
}

impl Default for DeviceSettings {
    fn default() -> Self {
        DeviceSettings {
            properties: Default::default(),
            reboot_command: None,
            allow_tcpip: true,
        }
    }
}

impl DeviceSettings {
    /// `--reboot-command` and `--no-tcpip` over the file.
    pub fn resolve(reboot_command: Option<String>, no_tcpip: bool, file: &FileConfig) -> Self {
        DeviceSettings {
            properties: file
                .properties
                .as_ref()
                .map(|table| {
                    let mut flat = std::collections::BTreeMap::new();
                    flatten_properties("", table, &mut flat);
                    flat
                })
                .unwrap_or_default(),
            reboot_command: reboot_command.or_else(|| file.reboot_command.clone()),
            allow_tcpip: !no_tcpip && file.allow_tcpip != Some(false),
        }
    }
}

/// The USB transport: a FunctionFS instance, and optionally the configfs
/// gadget to bind once its descriptors are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsbConfig {
    /// Where FunctionFS is mounted (`ep0`, `ep1`, `ep2`).
    pub ffs_dir: PathBuf,
    /// `--usb-gadget`: a gadget directory under /sys/kernel/config/usb_gadget.
    pub gadget: Option<PathBuf>,
    /// `--usb-udc`: the UDC to bind it to; the first one listed otherwise.
    pub udc: Option<String>,
}

/// The FunctionFS mount adbd's init scripts use, and `scripts/usb-gadget.sh`.
pub const DEFAULT_FFS_DIR: &str = "/dev/usb-ffs/adb";

/// What the command line says about USB; `None`/`false`: not given.
#[derive(Debug, Clone, Default)]
pub struct UsbFlags {
    pub usb: bool,
    pub ffs_dir: Option<PathBuf>,
    pub gadget: Option<PathBuf>,
    pub udc: Option<String>,
}

impl UsbConfig {
    /// Flags over the file; `None` unless `--usb` or `usb = true` (giving
    /// a FunctionFS or gadget directory alone does not turn USB on).
    pub fn resolve(flags: &UsbFlags, file: &FileConfig) -> Option<UsbConfig> {
        if !flags.usb && file.usb != Some(true) {
            return None;
        }
        Some(UsbConfig {
            ffs_dir: flags
                .ffs_dir
                .clone()
                .or_else(|| file.ffs_dir.clone())
                .unwrap_or_else(|| PathBuf::from(DEFAULT_FFS_DIR)),
            gadget: flags.gadget.clone().or_else(|| file.usb_gadget.clone()),
            udc: flags.udc.clone().or_else(|| file.usb_udc.clone()),
        })
    }
}

/// Which hosts get in without a key; every other host must sign a token
/// with a key in the keys file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyless {
    /// `--auth`: nobody.
    Nobody,
    /// The default: loopback TCP peers whose socket belongs to root or to
    /// the daemon's own user, who can read the keys file or become root
    /// anyway (docs/security.md).
    LocalOwners,
    /// `--trust-local-users`: every loopback TCP peer, whoever owns it.
    LocalUsers,
    /// `--no-auth`, or `--insecure` alone beyond loopback: every host, USB
    /// ones included.
    Everyone,
}

/// Who may connect, and how much of the daemon a connection may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub keyless: Keyless,
    pub keys: PathBuf,
    pub accept_new_keys: bool,
    /// When TCP hosts get TLS, and the daemon's TLS files.
    pub tls: crate::tls::TlsSettings,
    /// Listening beyond loopback without authentication was asked for.
    pub insecure: bool,
    pub max_connections: usize,
    pub max_streams: usize,
    pub handshake_timeout: Duration,
    pub auth_timeout: Duration,
    /// `None`: stalled streams are kept.
    pub stalled_stream_timeout: Option<Duration>,
    /// Dead TCP peers (`None`: the kernel's defaults, no keepalive).
    pub peer_timeout: Option<oxadb_io::PeerTimeout>,
    /// Config-file keys a command-line flag made pointless, with why (warned
    /// at start: the flag wins, but a setting is never dropped silently).
    pub unused: Vec<String>,
}

pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_AUTH_TIMEOUT: Duration = Duration::from_secs(60);
/// Long enough for any host that is merely slow or paused in a debugger;
/// short enough that a vanished one does not pin a shell for hours.
pub const DEFAULT_STALLED_STREAM_TIMEOUT: Duration = Duration::from_secs(300);

/// What the command line says about access; `None`: not given.
#[derive(Debug, Clone, Default)]
pub struct AccessFlags {
    /// `--auth` (`Some(true)`) or `--no-auth` (`Some(false)`).
    pub auth: Option<bool>,
    pub trust_local_users: bool,
    pub keys: Option<PathBuf>,
    pub accept_new_keys: bool,
    /// `--tls`, `--tls-key`, `--tls-cert`.
    pub tls: Option<crate::tls::TlsMode>,
    pub tls_key: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub insecure: bool,
    pub max_connections: Option<usize>,
    pub max_streams: Option<usize>,
    pub handshake_timeout: Option<u64>,
    pub auth_timeout: Option<u64>,
    pub stalled_stream_timeout: Option<u64>,
    pub peer_timeout: Option<u64>,
    /// USB is served: anyone who plugs in a cable reaches the daemon.
    pub usb: bool,
    /// The vsock port served, if any: other virtual machines and the host
    /// reach it, and none of them is a loopback peer.
    pub vsock: Option<u32>,
}

impl Access {
    /// Flags over the file over defaults. Every host must authenticate,
    /// except loopback TCP peers owned by root or the daemon's user
    /// ([`Keyless::LocalOwners`]); `--trust-local-users` lets every loopback
    /// peer in, `--auth` nobody, `--no-auth` everybody (beyond loopback only
    /// with `insecure`, which alone also means no keys there; over USB it is
    /// the operator's call, warned at start). One setting covers every
    /// transport of the daemon. `listen` is the TCP address (USB alone: the
    /// default loopback one, which exposes nothing). A setting the others
    /// make meaningless is an error, unless a flag overrode a config-file
    /// key (then it is listed in `unused`).
    pub fn resolve(
        listen: SocketAddr,
        flags: &AccessFlags,
        file: &FileConfig,
    ) -> Result<Access, ConfigError> {
        let insecure = flags.insecure || file.insecure == Some(true);
        let loopback = crate::peer_owner::is_loopback(listen.ip());
        let trust_local_users = flags.trust_local_users || file.trust_local_users == Some(true);
        let keyless = match flags.auth.or(file.auth) {
            Some(true) => Keyless::Nobody,
            Some(false) => Keyless::Everyone,
            None if insecure && (!loopback || flags.vsock.is_some()) && !flags.usb => {
                Keyless::Everyone
            }
            None if trust_local_users => Keyless::LocalUsers,
            None => Keyless::LocalOwners,
        };
        if keyless == Keyless::Everyone && !loopback && !insecure {
            return Err(ConfigError::UnauthenticatedExposure(listen));
        }
        if let Some(port) = flags
            .vsock
            .filter(|_| keyless == Keyless::Everyone && !insecure)
        {
            return Err(ConfigError::UnauthenticatedVsock(port));
        }
        // What decided the mode, named as the operator wrote it.
        let file_path = || {
            file.path
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
                .display()
                .to_string()
        };
        let named = |from_flag: bool, flag: &str, key: &str| -> (String, bool) {
            if from_flag {
                (flag.to_string(), true)
            } else {
                (format!("`{key}` in {}", file_path()), false)
            }
        };
        let mode = match (flags.auth, file.auth) {
            (Some(true), _) => named(true, "--auth", ""),
            (Some(false), _) => named(true, "--no-auth", ""),
            (None, Some(true)) => named(false, "", "auth = true"),
            (None, Some(false)) => named(false, "", "auth = false"),
            (None, None) => named(flags.insecure, "--insecure", "insecure = true"),
        };
        let mut pointless: Vec<((String, bool), &'static str)> = Vec::new();
        if keyless == Keyless::Everyone {
            let why = "no host is asked for a key, so the keys file is never read";
            if flags.keys.is_some() || file.keys.is_some() {
                pointless.push((named(flags.keys.is_some(), "--keys", "keys"), why));
            }
            if flags.accept_new_keys || file.accept_new_keys == Some(true) {
                let setting = named(
                    flags.accept_new_keys,
                    "--accept-new-keys",
                    "accept-new-keys",
                );
                pointless.push((setting, why));
            }
        }
        if trust_local_users && matches!(keyless, Keyless::Nobody | Keyless::Everyone) {
            let setting = named(
                flags.trust_local_users,
                "--trust-local-users",
                "trust-local-users",
            );
            let why = if keyless == Keyless::Nobody {
                "it asks every host for a key, local users included"
            } else {
                "it lets every host in without a key already"
            };
            pointless.push((setting, why));
        }
        let mut unused = Vec::new();
        for ((setting, setting_from_flag), why) in pointless {
            // A flag overriding the file is the usual precedence; anything
            // else is a contradiction the operator wrote.
            if setting_from_flag || !mode.1 {
                return Err(ConfigError::Contradiction {
                    setting,
                    mode: mode.0,
                    why,
                });
            }
            unused.push(format!("{setting} is not used with {}: {why}", mode.0));
        }
        let seconds = |flag: Option<u64>, key: Option<u64>, default: Duration| {
            flag.or(key).map_or(default, Duration::from_secs)
        };
        let keys = keys_file(flags.keys.clone(), file);
        let tls_mode = match (flags.tls, &file.tls) {
            (Some(mode), _) => Some(mode),
            (None, Some(text)) => Some(text.parse().map_err(|message| ConfigError::BadValue {
                path: PathBuf::from(file_path()),
                message: format!("tls: {message}"),
            })?),
            (None, None) => None,
        };
        if !cfg!(feature = "tls") {
            // `off` is what this build does anyway; anything else asks for TLS.
            let wants = |mode: Option<crate::tls::TlsMode>| {
                mode.filter(|&mode| mode != crate::tls::TlsMode::Off)
            };
            let setting = if let Some(mode) = wants(flags.tls) {
                Some(format!("--tls {mode}"))
            } else if let Some(mode) = wants(tls_mode) {
                Some(format!("`tls = \"{mode}\"` in {}", file_path()))
            } else if flags.tls_key.is_some() {
                Some("--tls-key".to_string())
            } else if flags.tls_cert.is_some() {
                Some("--tls-cert".to_string())
            } else if file.tls_key.is_some() {
                Some(format!("`tls-key` in {}", file_path()))
            } else if file.tls_cert.is_some() {
                Some(format!("`tls-cert` in {}", file_path()))
            } else {
                None
            };
            if let Some(setting) = setting {
                return Err(ConfigError::missing_feature(setting, "TLS", "tls"));
            }
        }
        let tls = crate::tls::TlsSettings::resolve(
            tls_mode,
            flags.tls_key.clone().or_else(|| file.tls_key.clone()),
            flags.tls_cert.clone().or_else(|| file.tls_cert.clone()),
            &keys,
        );
        Ok(Access {
            keyless,
            keys,
            tls,
            accept_new_keys: flags.accept_new_keys || file.accept_new_keys == Some(true),
            insecure,
            max_connections: flags
                .max_connections
                .or(file.max_connections)
                .unwrap_or(DEFAULT_MAX_CONNECTIONS)
                .max(1),
            max_streams: flags
                .max_streams
                .or(file.max_streams)
                .unwrap_or(oxadb_engine::DEFAULT_MAX_STREAMS)
                .max(1),
            handshake_timeout: seconds(
                flags.handshake_timeout,
                file.handshake_timeout,
                DEFAULT_HANDSHAKE_TIMEOUT,
            ),
            auth_timeout: seconds(flags.auth_timeout, file.auth_timeout, DEFAULT_AUTH_TIMEOUT),
            stalled_stream_timeout: match flags
                .stalled_stream_timeout
                .or(file.stalled_stream_timeout)
            {
                Some(0) => None,
                Some(secs) => Some(Duration::from_secs(secs)),
                None => Some(DEFAULT_STALLED_STREAM_TIMEOUT),
            },
            peer_timeout: match flags.peer_timeout.or(file.peer_timeout) {
                Some(secs) => oxadb_io::PeerTimeout::from_secs(secs),
                None => Some(oxadb_io::DEFAULT_PEER_TIMEOUT),
            },
            unused,
        })
    }

    /// The defaults for `listen`, with no flags and no file.
    pub fn defaults(listen: SocketAddr) -> Result<Access, ConfigError> {
        Access::resolve(listen, &AccessFlags::default(), &FileConfig::default())
    }

    /// Exposed beyond loopback with no authentication (warned at every start).
    pub fn is_insecure_exposure(&self, listen: SocketAddr) -> bool {
        self.keyless == Keyless::Everyone && !crate::peer_owner::is_loopback(listen.ip())
    }

    /// Whether any host is asked for a key (the keys file is read).
    pub fn uses_keys(&self) -> bool {
        self.keyless != Keyless::Everyone
    }

    /// Who needs a key, in words, for the start line: the daemon listens on
    /// `tcp` (if at all) and runs as `euid`; `keys_exist`: the keys file is there.
    pub fn describe(&self, tcp: Option<SocketAddr>, euid: u32, keys_exist: bool) -> String {
        let keys = self.keys.display();
        let required = if keys_exist {
            format!("key required ({keys})")
        } else {
            format!("key required ({keys}, not created yet)")
        };
        // A peer's address is loopback only if it reached a loopback or
        // wildcard address.
        let local_peers = tcp.is_some_and(|addr| {
            crate::peer_owner::is_loopback(addr.ip()) || addr.ip().is_unspecified()
        });
        match self.keyless {
            Keyless::Everyone => "every host: no key needed".to_string(),
            Keyless::LocalOwners if local_peers => {
                let owners = if euid == 0 {
                    "root".to_string()
                } else {
                    format!("root or uid {euid}")
                };
                format!("loopback peers owned by {owners}: no key needed; others: {required}")
            }
            Keyless::LocalUsers if local_peers => {
                format!("every loopback peer (any local user): no key needed; others: {required}")
            }
            Keyless::Nobody | Keyless::LocalOwners | Keyless::LocalUsers => {
                format!("every host: {required}")
            }
        }
    }

    /// The command that trusts a host's key, when keys are used.
    pub fn trust_command(&self) -> Option<String> {
        if !self.uses_keys() {
            return None;
        }
        let mut command = "oxadbd trust-key ~/.android/adbkey.pub".to_string();
        if self.keys != Path::new(crate::auth::DEFAULT_KEYS_PATH) {
            command.push_str(&format!(" --keys {}", self.keys.display()));
        }
        Some(command)
    }
}

impl DaemonConfig {
    /// A daemon on `listen` with every setting at its default and a fixed
    /// product (`oxadbd`/`test`/`test`): for in-process daemons in tests;
    /// override fields with struct update syntax.
    pub fn with_defaults(listen: SocketAddr) -> Result<DaemonConfig, ConfigError> {
        Ok(DaemonConfig {
            listen,
            shell: "/bin/sh".into(),
            framebuffer: DEFAULT_FRAMEBUFFER.into(),
            product_name: "oxadbd".into(),
            product_model: "test".into(),
            product_device: "test".into(),
            credit: CreditMode::default(),
            memory_budget: BudgetLimits::from_limit(256 << 20),
            ack_headroom: true,
            access: Access::defaults(listen)?,
            device: DeviceSettings::default(),
            durability: oxadb_transfer::Durability::default(),
            zero_copy: false,
        })
    }

    /// The CNXN banner: product properties and exactly the features implemented.
    pub fn banner(&self) -> Banner {
        let mut banner = Banner::new("device");
        for (key, value) in [
            ("ro.product.name", &self.product_name),
            ("ro.product.model", &self.product_model),
            ("ro.product.device", &self.product_device),
        ] {
            // `;` and `=` delimit banner fields; keep values parseable.
            let value: String = value
                .chars()
                .map(|c| if c == ';' || c == '=' { '_' } else { c })
                .collect();
            banner.properties.push((key.to_string(), value));
        }
        banner.features = feature::IMPLEMENTED.iter().map(|f| f.to_string()).collect();
        // services/sync/pull.rs refuses what it cannot stream before opening it.
        banner.features.push(feature::OXADB_RECV_AHEAD.to_string());
        // Named in the CNXN only to hosts that name it (engine, ONLY_IF_ASKED).
        banner.features.push(feature::OXADB_DELTA.to_string());
        banner
    }

    /// The engine configuration every connection starts from: the banner,
    /// the credit mode (which adds `delayed_ack` to the banner unless
    /// classic) and the limits. The memory budget is the caller's to share.
    pub fn engine_config(&self) -> Config {
        let mut engine = Config::new(Role::Device, self.banner());
        engine.set_credit_mode(self.credit);
        engine.ack_headroom = self.ack_headroom;
        // The transport's own rule: TCP relaxes it per connection
        // (`server::serve_tcp`), USB hosts are never loopback peers.
        engine.require_auth = self.access.uses_keys();
        engine.max_streams = self.access.max_streams;
        engine.stalled_stream_timeout = self.access.stalled_stream_timeout;
        // TCP's and vsock's deadlines; USB lifts the CNXN one (`server::serve_usb`).
        engine.handshake_timeout = Some(self.access.handshake_timeout);
        engine.auth_timeout = Some(self.access.auth_timeout);
        engine.max_payload = self.max_payload();
        // Classic streams (adb 29) buffer two packets, as with 1 MiB ones.
        engine.local_buffer = 2 * engine.max_payload as usize;
        engine
    }

    /// The largest payload offered in CNXN: 1 MiB unless the budget is
    /// small for the connections served (`BudgetLimits::packet_size`, one
    /// stalled stream per connection); hosts send no larger packets.
    pub fn max_payload(&self) -> u32 {
        self.memory_budget
            .packet_size(self.access.max_connections, oxadb_wire::MAX_PAYLOAD)
    }
}

/// `[properties]` as `name = value` pairs: nested tables (unquoted dotted
/// keys) joined with `.`, numbers and booleans written as getprop shows them.
fn flatten_properties(
    prefix: &str,
    table: &toml::Table,
    out: &mut std::collections::BTreeMap<String, String>,
) {
    for (key, value) in table {
        let name = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            toml::Value::Table(inner) => flatten_properties(&name, inner, out),
            toml::Value::String(text) => {
                out.insert(name, text.clone());
            }
            other => {
                out.insert(name, other.to_string());
            }
        }
    }
}

/// Parses a listen address (`localhost:PORT` is 127.0.0.1).
pub fn parse_listen(text: &str) -> Result<SocketAddr, ConfigError> {
    let addr = match text.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => text.to_string(),
    };
    addr.parse()
        .map_err(|_| ConfigError::BadListen(text.to_string()))
}

/// Where the daemon listens: at most one TCP address and one vsock port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Listen {
    pub tcp: Option<SocketAddr>,
    /// `vsock:PORT`: any CID may connect (`VMADDR_CID_ANY`), as adbd listens.
    pub vsock: Option<u32>,
}

/// Parses a `--listen`/`listen` value: addresses separated by commas, each
/// `ADDR:PORT` (TCP) or `vsock:PORT` (AOSP's socket spec, as adbd's
/// `service.adb.listen_addrs`).
pub fn parse_listen_list(text: &str) -> Result<Listen, ConfigError> {
    let mut listen = Listen::default();
    for item in text.split(',').map(str::trim) {
        if let Some(port) = item.strip_prefix("vsock:") {
            let port = port
                .parse::<u32>()
                .ok()
                .filter(|&port| port != u32::MAX)
                .ok_or_else(|| ConfigError::BadListen(item.to_string()))?;
            if listen.vsock.replace(port).is_some() {
                return Err(ConfigError::ListenList(format!(
                    "{text:?} names more than one vsock port; oxadbd listens on one"
                )));
            }
        } else {
            let addr = parse_listen(item)?;
            if listen.tcp.replace(addr).is_some() {
                return Err(ConfigError::ListenList(format!(
                    "{text:?} names more than one TCP address; oxadbd listens on one"
                )));
            }
        }
    }
    Ok(listen)
}

pub use oxadb_io::parse_size;

/// `ro.product.name`: the flag, else the file's `product-name`, else
/// [`default_product_name`].
pub fn product_name(flag: Option<String>, file: &FileConfig) -> String {
    flag.or_else(|| file.product_name.clone())
        .unwrap_or_else(default_product_name)
}

/// `ro.product.model`: the flag, else the file's `product-model`, else
/// [`default_product_model`].
pub fn product_model(flag: Option<String>, file: &FileConfig) -> String {
    flag.or_else(|| file.product_model.clone())
        .unwrap_or_else(default_product_model)
}

/// `ro.product.device`: the flag, else the file's `product-device`, else
/// [`default_product_device`].
pub fn product_device(flag: Option<String>, file: &FileConfig) -> String {
    flag.or_else(|| file.product_device.clone())
        .unwrap_or_else(default_product_device)
}

/// The keys file: the flag, else the file's `keys`, else
/// [`crate::auth::DEFAULT_KEYS_PATH`].
pub fn keys_file(flag: Option<PathBuf>, file: &FileConfig) -> PathBuf {
    flag.or_else(|| file.keys.clone())
        .unwrap_or_else(|| PathBuf::from(crate::auth::DEFAULT_KEYS_PATH))
}

/// `ro.product.name`: the distribution id from os-release, like "debian".
pub fn default_product_name() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                line.strip_prefix("ID=")
                    .map(|v| v.trim_matches('"').to_string())
            })
        })
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| "linux".to_string())
}

/// `ro.product.model`: the board's device-tree model or the DMI product name.
pub fn default_product_model() -> String {
    [
        "/sys/firmware/devicetree/base/model",
        "/sys/class/dmi/id/product_name",
    ]
    .iter()
    .filter_map(|path| std::fs::read(path).ok())
    .map(|raw| {
        String::from_utf8_lossy(&raw)
            .trim_matches(|c: char| c == '\0' || c.is_whitespace())
            .to_string()
    })
    .find(|model| !model.is_empty())
    .unwrap_or_else(|| "Linux".to_string())
}

/// `ro.product.device`: the host name.
pub fn default_product_device() -> String {
    let uname = rustix::system::uname();
    let name = uname.nodename().to_string_lossy().into_owned();
    if name.is_empty() {
        "linux".to_string()
    } else {
        name
    }
}

/// Where the daemon keeps its state (the push journal, the mDNS instance
/// name), and why there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateDir {
    /// `--state-dir` or the config file's `state-dir`: used as given, and a
    /// daemon that cannot use it does not start.
    Given(PathBuf),
    /// [`DEFAULT_STATE_DIR`], found or made.
    System(PathBuf),
    /// The user's own (`$XDG_STATE_HOME/oxadbd`, else
    /// `~/.local/state/oxadbd`), for a daemon that may not make or use the
    /// system one (run without sudo); `system_unusable` says why.
    User {
        path: PathBuf,
        system_unusable: String,
    },
    /// `--no-state-dir`: none wanted.
    Off,
    /// Neither could be used: why not, for each.
    None {
        system_unusable: String,
        user_unusable: String,
    },
}

impl StateDir {
    /// The directory given, else the system one (made if missing, mode
    /// 0700), else the user's (the same), each used only when it is this
    /// process's own and private ([`oxadb_transfer::make_state_dir`]).
    pub fn resolve(given: Option<PathBuf>) -> StateDir {
        StateDir::resolve_from(
            given,
            Path::new(DEFAULT_STATE_DIR),
            oxadb_transfer::user_state_dir("oxadbd"),
        )
    }

    fn resolve_from(given: Option<PathBuf>, system: &Path, user: Option<PathBuf>) -> StateDir {
        if let Some(dir) = given {
            return StateDir::Given(dir);
        }
        let system_unusable = match make_system_state_dir(system) {
            Ok(()) => return StateDir::System(system.to_path_buf()),
            Err(error) => error.to_string(),
        };
        let Some(path) = user else {
            return StateDir::None {
                system_unusable,
                user_unusable: "no user state directory: neither XDG_STATE_HOME nor HOME is set"
                    .into(),
            };
        };
        match oxadb_transfer::make_state_dir(&path) {
            Ok(()) => StateDir::User {
                path,
                system_unusable,
            },
            Err(error) => StateDir::None {
                system_unusable,
                user_unusable: error.to_string(),
            },
        }
    }

    /// The directory to use, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            StateDir::Given(path) | StateDir::System(path) | StateDir::User { path, .. } => {
                Some(path)
            }
            StateDir::Off | StateDir::None { .. } => None,
        }
    }
}

/// Makes the system state directory if it is missing, but not its parent
/// (`/var/lib` is not the daemon's to make, and would get mode 0700), then
/// checks it as any state directory.
fn make_system_state_dir(dir: &Path) -> Result<(), oxadb_transfer::StateDirError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(oxadb_transfer::StateDirError::Io {
                action: "creating it",
                path: dir.to_path_buf(),
                source,
            })
        }
    }
    oxadb_transfer::make_state_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse() {
        assert_eq!(
            parse_listen("127.0.0.1:5555").unwrap(),
            "127.0.0.1:5555".parse().unwrap()
        );
        assert!(parse_listen("[::1]:1").is_ok());
        assert_eq!(
            parse_listen("localhost:7").unwrap(),
            "127.0.0.1:7".parse().unwrap()
        );
        assert!(parse_listen("198.18.0.1:5555").is_ok());
        assert!(matches!(
            parse_listen("nonsense"),
            Err(ConfigError::BadListen(_))
        ));
    }

    #[test]
    fn the_peer_timeout_is_the_flag_over_the_file_over_30_s() {
        let listen = parse_listen("127.0.0.1:5555").unwrap();
        let timeout = |flag: Option<u64>, file: &str| {
            let file: FileConfig = toml::from_str(file).unwrap();
            let flags = AccessFlags {
                peer_timeout: flag,
                ..AccessFlags::default()
            };
            Access::resolve(listen, &flags, &file)
                .unwrap()
                .peer_timeout
                .map(|t| t.timeout().as_secs())
        };
        assert_eq!(timeout(None, ""), Some(30));
        assert_eq!(timeout(None, "peer-timeout = 12\n"), Some(12));
        assert_eq!(timeout(Some(5), "peer-timeout = 12\n"), Some(5));
        assert_eq!(timeout(Some(0), ""), None);
        assert_eq!(timeout(None, "peer-timeout = 0\n"), None);
    }

    #[test]
    fn keys_are_needed_by_everyone_but_local_owners_by_default() {
        let file = FileConfig::default();
        let resolve = |listen: &str, flags: AccessFlags| {
            Access::resolve(parse_listen(listen).unwrap(), &flags, &file)
        };
        let loopback = resolve("127.0.0.1:5555", AccessFlags::default()).unwrap();
        assert_eq!(loopback.keyless, Keyless::LocalOwners);
        assert!(loopback.uses_keys());
        assert_eq!(loopback.keys, Path::new(crate::auth::DEFAULT_KEYS_PATH));
        assert_eq!(loopback.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(
            loopback.stalled_stream_timeout,
            Some(DEFAULT_STALLED_STREAM_TIMEOUT)
        );
        assert!(loopback.unused.is_empty());
        let never = AccessFlags {
            stalled_stream_timeout: Some(0),
            ..AccessFlags::default()
        };
        assert_eq!(
            resolve("127.0.0.1:1", never)
                .unwrap()
                .stalled_stream_timeout,
            None
        );
        // Wider listeners: the same rule (only loopback peers can be owners).
        for wide in ["0.0.0.0:5555", "[::]:5555", "[::1]:5555"] {
            assert_eq!(
                resolve(wide, AccessFlags::default()).unwrap().keyless,
                Keyless::LocalOwners,
                "{wide}"
            );
        }
        let local_users = AccessFlags {
            trust_local_users: true,
            keys: Some("/k".into()),
            ..AccessFlags::default()
        };
        let trusting = resolve("127.0.0.1:5555", local_users).unwrap();
        assert_eq!(trusting.keyless, Keyless::LocalUsers);
        assert_eq!(
            trusting.keys,
            Path::new("/k"),
            "keys still serve remote hosts"
        );
        let forced = resolve(
            "[::1]:5555",
            AccessFlags {
                auth: Some(true),
                keys: Some("/k".into()),
                max_streams: Some(8),
                auth_timeout: Some(5),
                ..AccessFlags::default()
            },
        )
        .unwrap();
        assert_eq!(forced.keyless, Keyless::Nobody);
        assert_eq!(forced.keys, Path::new("/k"));
        assert_eq!(forced.max_streams, 8);
        assert_eq!(forced.auth_timeout, Duration::from_secs(5));
        let file: FileConfig =
            toml::from_str("auth = true\nkeys = \"/k\"\nmax-connections = 2\n").unwrap();
        let from_file = Access::resolve(
            parse_listen("127.0.0.1:1").unwrap(),
            &AccessFlags::default(),
            &file,
        )
        .unwrap();
        assert_eq!(from_file.keyless, Keyless::Nobody);
        assert_eq!(from_file.keys, Path::new("/k"));
        assert_eq!(from_file.max_connections, 2);
        let file: FileConfig = toml::from_str("trust-local-users = true\n").unwrap();
        let from_file = Access::resolve(
            parse_listen("127.0.0.1:1").unwrap(),
            &AccessFlags::default(),
            &file,
        )
        .unwrap();
        assert_eq!(from_file.keyless, Keyless::LocalUsers);
    }

    #[test]
    fn no_keys_beyond_loopback_only_with_insecure() {
        let file = FileConfig::default();
        let resolve = |listen: &str, flags: AccessFlags| {
            Access::resolve(parse_listen(listen).unwrap(), &flags, &file)
        };
        let no_auth = AccessFlags {
            auth: Some(false),
            ..AccessFlags::default()
        };
        let open = resolve("127.0.0.1:5555", no_auth.clone()).unwrap();
        assert_eq!(open.keyless, Keyless::Everyone);
        assert!(!open.uses_keys());
        assert!(!open.is_insecure_exposure("127.0.0.1:5555".parse().unwrap()));
        let error = resolve("198.18.0.1:5555", no_auth.clone()).unwrap_err();
        assert!(matches!(error, ConfigError::UnauthenticatedExposure(_)));
        assert!(error.to_string().contains("--insecure"), "{error}");
        let insecure = resolve(
            "198.18.0.1:5555",
            AccessFlags {
                insecure: true,
                ..no_auth
            },
        )
        .unwrap();
        assert_eq!(insecure.keyless, Keyless::Everyone);
        assert!(insecure.is_insecure_exposure("198.18.0.1:5555".parse().unwrap()));
        let insecure_alone = AccessFlags {
            insecure: true,
            ..AccessFlags::default()
        };
        assert_eq!(
            resolve("0.0.0.0:5555", insecure_alone.clone())
                .unwrap()
                .keyless,
            Keyless::Everyone
        );
        // On loopback --insecure changes nothing.
        assert_eq!(
            resolve("127.0.0.1:5555", insecure_alone).unwrap().keyless,
            Keyless::LocalOwners
        );
    }

    #[test]
    fn listen_lists_name_one_tcp_address_and_one_vsock_port() {
        assert_eq!(
            parse_listen_list("127.0.0.1:5555").unwrap(),
            Listen {
                tcp: Some("127.0.0.1:5555".parse().unwrap()),
                vsock: None
            }
        );
        assert_eq!(
            parse_listen_list("vsock:5555, 127.0.0.1:7").unwrap(),
            Listen {
                tcp: Some("127.0.0.1:7".parse().unwrap()),
                vsock: Some(5555)
            }
        );
        assert_eq!(
            parse_listen_list("vsock:40000").unwrap(),
            Listen {
                tcp: None,
                vsock: Some(40000)
            }
        );
        for bad in ["vsock:", "vsock:x", "vsock:-1", "vsock:4294967295"] {
            let error = parse_listen_list(bad).unwrap_err().to_string();
            assert!(error.contains("vsock:PORT"), "{error}");
        }
        let error = parse_listen_list("vsock:1,vsock:2")
            .unwrap_err()
            .to_string();
        assert!(error.contains("more than one vsock port"), "{error}");
        let error = parse_listen_list("127.0.0.1:1,127.0.0.1:2")
            .unwrap_err()
            .to_string();
        assert!(error.contains("more than one TCP address"), "{error}");
    }

    #[test]
    fn vsock_peers_need_a_key_unless_insecure() {
        let loopback = parse_listen(DEFAULT_LISTEN).unwrap();
        let file = FileConfig::default();
        let vsock = AccessFlags {
            vsock: Some(5555),
            ..AccessFlags::default()
        };
        let access = Access::resolve(loopback, &vsock, &file).unwrap();
        assert_eq!(access.keyless, Keyless::LocalOwners);
        assert!(access.uses_keys());
        let no_auth = AccessFlags {
            auth: Some(false),
            ..vsock.clone()
        };
        let error = Access::resolve(loopback, &no_auth, &file).unwrap_err();
        assert!(matches!(error, ConfigError::UnauthenticatedVsock(5555)));
        assert!(error.to_string().contains("--insecure"), "{error}");
        let insecure = AccessFlags {
            insecure: true,
            ..no_auth
        };
        let access = Access::resolve(loopback, &insecure, &file).unwrap();
        assert_eq!(access.keyless, Keyless::Everyone);
        // --insecure alone means no keys for what is beyond loopback.
        let insecure_alone = AccessFlags {
            insecure: true,
            ..vsock
        };
        let access = Access::resolve(loopback, &insecure_alone, &file).unwrap();
        assert_eq!(access.keyless, Keyless::Everyone);
    }

    #[test]
    fn settings_that_cannot_apply_are_refused_naming_both() {
        let listen = parse_listen("127.0.0.1:5555").unwrap();
        let no_file = FileConfig::default();
        let refused = |flags: AccessFlags, file: &FileConfig| {
            Access::resolve(listen, &flags, file)
                .unwrap_err()
                .to_string()
        };
        let error = refused(
            AccessFlags {
                auth: Some(false),
                keys: Some("/k".into()),
                ..AccessFlags::default()
            },
            &no_file,
        );
        assert_eq!(
            error,
            "--keys cannot be used with --no-auth: no host is asked for a key, so the keys \
             file is never read; drop one of them"
        );
        assert!(!error.contains('\n'));
        let error = refused(
            AccessFlags {
                auth: Some(false),
                accept_new_keys: true,
                ..AccessFlags::default()
            },
            &no_file,
        );
        assert!(
            error.starts_with("--accept-new-keys cannot be used with --no-auth"),
            "{error}"
        );
        let error = refused(
            AccessFlags {
                auth: Some(true),
                trust_local_users: true,
                ..AccessFlags::default()
            },
            &no_file,
        );
        assert!(
            error.starts_with("--trust-local-users cannot be used with --auth"),
            "{error}"
        );
        let error = refused(
            AccessFlags {
                auth: Some(false),
                trust_local_users: true,
                ..AccessFlags::default()
            },
            &no_file,
        );
        assert!(
            error.starts_with("--trust-local-users cannot be used with --no-auth"),
            "{error}"
        );
        let error = Access::resolve(
            parse_listen("198.18.0.1:5555").unwrap(),
            &AccessFlags {
                insecure: true,
                keys: Some("/k".into()),
                ..AccessFlags::default()
            },
            &no_file,
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.starts_with("--keys cannot be used with --insecure"),
            "{error}"
        );
        // A file that contradicts itself is named key by key.
        let mut file: FileConfig = toml::from_str("auth = false\nkeys = \"/k\"\n").unwrap();
        file.path = Some("/etc/x.toml".into());
        let error = refused(AccessFlags::default(), &file);
        assert!(
            error.starts_with(
                "`keys` in /etc/x.toml cannot be used with `auth = false` in /etc/x.toml"
            ),
            "{error}"
        );
        // A flag over the file wins; the file's pointless key is reported.
        let mut file: FileConfig = toml::from_str("keys = \"/k\"\n").unwrap();
        file.path = Some("/etc/x.toml".into());
        let open = Access::resolve(
            listen,
            &AccessFlags {
                auth: Some(false),
                ..AccessFlags::default()
            },
            &file,
        )
        .unwrap();
        assert_eq!(open.keyless, Keyless::Everyone);
        assert_eq!(
            open.unused,
            [
                "`keys` in /etc/x.toml is not used with --no-auth: no host is asked for a key, \
              so the keys file is never read"
            ]
        );
        // But a flag is never dropped for a file's sake.
        let mut file: FileConfig = toml::from_str("auth = false\n").unwrap();
        file.path = Some("/etc/x.toml".into());
        let error = refused(
            AccessFlags {
                keys: Some("/k".into()),
                ..AccessFlags::default()
            },
            &file,
        );
        assert!(
            error.starts_with("--keys cannot be used with `auth = false` in /etc/x.toml"),
            "{error}"
        );
    }

    #[test]
    fn the_start_line_says_who_needs_a_key() {
        let listen = parse_listen("127.0.0.1:5555").unwrap();
        let with =
            |flags: AccessFlags| Access::resolve(listen, &flags, &FileConfig::default()).unwrap();
        let default = with(AccessFlags::default());
        assert_eq!(
            default.describe(Some(listen), 0, true),
            "loopback peers owned by root: no key needed; others: key required \
             (/etc/oxadbd/adb_keys)"
        );
        assert_eq!(
            default.describe(Some(listen), 1000, false),
            "loopback peers owned by root or uid 1000: no key needed; others: key required \
             (/etc/oxadbd/adb_keys, not created yet)"
        );
        assert_eq!(
            default.trust_command().as_deref(),
            Some("oxadbd trust-key ~/.android/adbkey.pub")
        );
        // Only USB, or an address loopback peers cannot reach: no exception.
        assert_eq!(
            default.describe(None, 0, true),
            "every host: key required (/etc/oxadbd/adb_keys)"
        );
        let remote = parse_listen("198.18.0.1:5555").unwrap();
        assert!(default
            .describe(Some(remote), 0, true)
            .starts_with("every host: key required"));
        let wildcard = parse_listen("[::]:5555").unwrap();
        assert!(default
            .describe(Some(wildcard), 0, true)
            .starts_with("loopback peers owned by root:"));
        let trusting = with(AccessFlags {
            trust_local_users: true,
            keys: Some("/tmp/k".into()),
            ..AccessFlags::default()
        });
        assert_eq!(
            trusting.describe(Some(listen), 0, true),
            "every loopback peer (any local user): no key needed; others: key required (/tmp/k)"
        );
        assert_eq!(
            trusting.trust_command().as_deref(),
            Some("oxadbd trust-key ~/.android/adbkey.pub --keys /tmp/k")
        );
        let strict = with(AccessFlags {
            auth: Some(true),
            ..AccessFlags::default()
        });
        assert!(strict
            .describe(Some(listen), 0, true)
            .starts_with("every host: key required"));
        let open = with(AccessFlags {
            auth: Some(false),
            ..AccessFlags::default()
        });
        assert_eq!(
            open.describe(Some(listen), 0, true),
            "every host: no key needed"
        );
        assert_eq!(open.trust_command(), None);
    }

    #[test]
    fn banner_lists_implemented_features() {
        let mut config = DaemonConfig {
            listen: parse_listen(DEFAULT_LISTEN).unwrap(),
            shell: "/bin/sh".into(),
            framebuffer: DEFAULT_FRAMEBUFFER.into(),
            product_name: "debian".into(),
            product_model: "Board; rev=2".into(),
            product_device: "kiosk".into(),
            credit: CreditMode::Adaptive,
            memory_budget: BudgetLimits::from_limit(64 << 20),
            ack_headroom: true,
            access: Access::resolve(
                parse_listen(DEFAULT_LISTEN).unwrap(),
                &AccessFlags::default(),
                &FileConfig::default(),
            )
            .unwrap(),
            device: DeviceSettings::default(),
            ..DaemonConfig::with_defaults(parse_listen(DEFAULT_LISTEN).unwrap()).unwrap()
        };
        let banner = Banner::parse(config.engine_config().banner.encode().as_bytes()).unwrap();
        assert_eq!(banner.property("ro.product.model"), Some("Board_ rev_2"));
        assert!(banner.has_feature("shell_v2"));
        assert!(banner.has_feature("delayed_ack"));
        config.credit = CreditMode::Aosp;
        assert!(config.engine_config().banner.has_feature("delayed_ack"));
        config.credit = CreditMode::Classic;
        assert!(!config.engine_config().banner.has_feature("delayed_ack"));
    }

    #[test]
    fn usb_needs_auth_by_default_and_reads_its_keys() {
        let loopback = parse_listen(DEFAULT_LISTEN).unwrap();
        let usb = AccessFlags {
            usb: true,
            ..AccessFlags::default()
        };
        let file = FileConfig::default();
        let access = Access::resolve(loopback, &usb, &file).unwrap();
        assert!(access.uses_keys());
        assert!(
            DaemonConfig {
                listen: loopback,
                shell: "/bin/sh".into(),
                framebuffer: DEFAULT_FRAMEBUFFER.into(),
                product_name: String::new(),
                product_model: String::new(),
                product_device: String::new(),
                credit: CreditMode::Adaptive,
                memory_budget: BudgetLimits::from_limit(64 << 20),
                ack_headroom: true,
                access,
                device: DeviceSettings::default(),
                ..DaemonConfig::with_defaults(loopback).unwrap()
            }
            .engine_config()
            .require_auth
        );
        // --no-auth is the operator's call over USB (no --insecure needed).
        let open = Access::resolve(
            loopback,
            &AccessFlags {
                auth: Some(false),
                ..usb.clone()
            },
            &file,
        )
        .unwrap();
        assert_eq!(open.keyless, Keyless::Everyone);
        // Not asked for: no USB, whatever else is given.
        let flags = UsbFlags {
            ffs_dir: Some("/ffs".into()),
            ..UsbFlags::default()
        };
        assert_eq!(UsbConfig::resolve(&flags, &file), None);
        let flags = UsbFlags {
            usb: true,
            ..UsbFlags::default()
        };
        assert_eq!(
            UsbConfig::resolve(&flags, &file),
            Some(UsbConfig {
                ffs_dir: DEFAULT_FFS_DIR.into(),
                gadget: None,
                udc: None,
            })
        );
        let file: FileConfig = toml::from_str(
            "usb = true\nffs-dir = \"/dev/ffs\"\nusb-gadget = \"/g\"\nusb-udc = \"dummy_udc.0\"\n",
        )
        .unwrap();
        let from_file = UsbConfig::resolve(&UsbFlags::default(), &file).unwrap();
        assert_eq!(from_file.ffs_dir, Path::new("/dev/ffs"));
        assert_eq!(from_file.gadget.as_deref(), Some(Path::new("/g")));
        assert_eq!(from_file.udc.as_deref(), Some("dummy_udc.0"));
        // Flags win over the file.
        let flags = UsbFlags {
            ffs_dir: Some("/other".into()),
            ..UsbFlags::default()
        };
        assert_eq!(
            UsbConfig::resolve(&flags, &file).unwrap().ffs_dir,
            Path::new("/other")
        );
    }

    #[test]
    fn config_file_keys() {
        let config: FileConfig = toml::from_str(
            "listen = \"127.0.0.1:1\"\nshell = \"/bin/bash\"\ndelayed-ack = false\n",
        )
        .unwrap();
        assert_eq!(config.shell.as_deref(), Some(Path::new("/bin/bash")));
        assert_eq!(config.delayed_ack, Some(false));
        assert_eq!(config.credit_mode().unwrap(), Some(CreditMode::Classic));
        let config: FileConfig = toml::from_str("credit = \"aosp\"\n").unwrap();
        assert_eq!(config.credit_mode().unwrap(), Some(CreditMode::Aosp));
        let config: FileConfig = toml::from_str("credit = \"fast\"\n").unwrap();
        let error = config.credit_mode().unwrap_err().to_string();
        assert!(error.contains("unknown credit mode 'fast'"), "{error}");
        assert!(toml::from_str::<FileConfig>("bogus = 1").is_err());
        let config: FileConfig = toml::from_str("memory-budget = \"64M\"\n").unwrap();
        assert_eq!(config.memory_budget().unwrap(), Some(64 << 20));
        let config: FileConfig = toml::from_str("memory-budget = \"lots\"\n").unwrap();
        let error = config.memory_budget().unwrap_err().to_string();
        assert!(
            error.contains("memory-budget: bad size \"lots\""),
            "{error}"
        );
        let config: FileConfig = toml::from_str("durability = \"rename\"\n").unwrap();
        assert_eq!(
            config.durability().unwrap(),
            Some(oxadb_transfer::Durability::Rename)
        );
        assert_eq!(FileConfig::default().durability().unwrap(), None);
        let config: FileConfig = toml::from_str("durability = \"maybe\"\n").unwrap();
        let error = config.durability().unwrap_err().to_string();
        assert!(
            error
                .contains("durability: unknown durability 'maybe' (expected full, rename or none)"),
            "{error}"
        );
        let config: FileConfig =
            toml::from_str("state-dir = \"/srv/oxadbd\"\nstop-grace = 12\n").unwrap();
        assert_eq!(config.state_dir.as_deref(), Some(Path::new("/srv/oxadbd")));
        assert_eq!(config.stop_grace, Some(12));
        assert!(toml::from_str::<FileConfig>("stop-grace = \"soon\"\n").is_err());
        let file: FileConfig = toml::from_str(
            "reboot-command = \"/bin/true x\"\nallow-tcpip = false\n\
             [properties]\n\"ro.build.version.sdk\" = \"33\"\nvendor.site = \"lab\"\n\
             vendor.count = 2\n",
        )
        .unwrap();
        let device = DeviceSettings::resolve(None, false, &file);
        assert!(!device.allow_tcpip);
        assert_eq!(device.reboot_command.as_deref(), Some("/bin/true x"));
        assert_eq!(device.properties["ro.build.version.sdk"], "33");
        // A dotted bare key is a nested table in TOML: flattened back.
        assert_eq!(device.properties["vendor.site"], "lab");
        assert_eq!(device.properties["vendor.count"], "2");
        let flags = DeviceSettings::resolve(Some("/sbin/reboot".into()), true, &file);
        assert_eq!(flags.reboot_command.as_deref(), Some("/sbin/reboot"));
        assert!(DeviceSettings::resolve(None, false, &FileConfig::default()).allow_tcpip);
    }
}

#[cfg(test)]
mod state_dir_tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_given_directory_wins_untouched() {
        let root = tempfile::tempdir().unwrap();
        let system = root.path().join("oxadbd");
        let given = root.path().join("given");
        let chosen = StateDir::resolve_from(Some(given.clone()), &system, None);
        assert_eq!(chosen, StateDir::Given(given.clone()));
        assert_eq!(chosen.path(), Some(given.as_path()));
        // Made (and checked) by the journal when it opens, not here.
        assert!(!given.exists() && !system.exists());
    }

    #[test]
    fn the_system_directory_is_made_when_it_may_be() {
        let root = tempfile::tempdir().unwrap();
        let system = root.path().join("oxadbd");
        let user = root.path().join("home/.local/state/oxadbd");
        let chosen = StateDir::resolve_from(None, &system, Some(user.clone()));
        assert_eq!(chosen, StateDir::System(system.clone()));
        assert_eq!(mode(&system), 0o700);
        assert!(!user.exists());
        // Its parent is not made: that is the system's.
        let deeper = root.path().join("var/lib/oxadbd");
        let chosen = StateDir::resolve_from(None, &deeper, Some(user.clone()));
        assert!(matches!(chosen, StateDir::User { .. }), "{chosen:?}");
        assert!(!root.path().join("var").exists());
    }

    #[test]
    fn a_daemon_that_may_not_use_the_system_directory_uses_its_users() {
        let root = tempfile::tempdir().unwrap();
        // Not makeable, whoever runs the test: its parent is a file.
        let file = root.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let system = file.join("oxadbd");
        let user = root.path().join("home/.local/state/oxadbd");
        let chosen = StateDir::resolve_from(None, &system, Some(user.clone()));
        let StateDir::User {
            path,
            system_unusable,
        } = &chosen
        else {
            panic!("{chosen:?}");
        };
        assert_eq!(path, &user);
        assert!(
            system_unusable.contains(&format!("'{}'", system.display())),
            "{system_unusable}"
        );
        assert_eq!(mode(&user), 0o700);
        assert_eq!(chosen.path(), Some(user.as_path()));
        // One that exists but is not private (another user's, or shared)
        // is passed over too.
        let shared = root.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let chosen = StateDir::resolve_from(None, &shared, Some(user.clone()));
        assert!(matches!(chosen, StateDir::User { .. }), "{chosen:?}");
    }

    #[test]
    fn without_either_the_reasons_for_both_are_kept() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let chosen = StateDir::resolve_from(None, &file.join("system"), None);
        let StateDir::None {
            system_unusable,
            user_unusable,
        } = &chosen
        else {
            panic!("{chosen:?}");
        };
        assert!(system_unusable.contains("creating it"), "{system_unusable}");
        assert!(user_unusable.contains("HOME"), "{user_unusable}");
        assert_eq!(chosen.path(), None);
        let chosen =
            StateDir::resolve_from(None, &file.join("system"), Some(file.join("user/oxadbd")));
        let StateDir::None { user_unusable, .. } = &chosen else {
            panic!("{chosen:?}");
        };
        assert!(user_unusable.contains("user/oxadbd"), "{user_unusable}");
    }
}

#[cfg(test)]
mod tls_tests {
    use super::*;
    use crate::tls::TlsMode;

    #[test]
    #[cfg(feature = "tls")]
    fn tls_comes_from_the_flag_or_the_file_and_files_sit_beside_the_keys() {
        let listen = parse_listen("127.0.0.1:1").unwrap();
        let file: FileConfig =
            toml::from_str("keys = \"/k/adb_keys\"\ntls = \"required\"\n").unwrap();
        let access = Access::resolve(listen, &AccessFlags::default(), &file).unwrap();
        assert_eq!(access.tls.mode, Some(TlsMode::Required));
        assert_eq!(access.tls.key, Path::new("/k/tls_key.pem"));
        assert_eq!(access.tls.cert, Path::new("/k/tls_cert.pem"));
        let flags = AccessFlags {
            tls: Some(TlsMode::Off),
            tls_key: Some("/x.pem".into()),
            ..AccessFlags::default()
        };
        let access = Access::resolve(listen, &flags, &file).unwrap();
        assert_eq!(access.tls.mode, Some(TlsMode::Off));
        assert_eq!(access.tls.key, Path::new("/x.pem"));
        let bad: FileConfig = toml::from_str("tls = \"maybe\"\n").unwrap();
        let error = Access::resolve(listen, &AccessFlags::default(), &bad).unwrap_err();
        assert!(error.to_string().contains("tls"), "{error}");
        let none = Access::resolve(listen, &AccessFlags::default(), &FileConfig::default());
        assert_eq!(none.unwrap().tls.mode, None);
    }

    #[test]
    #[cfg(not(feature = "tls"))]
    fn without_tls_asking_for_it_names_the_feature() {
        let listen = parse_listen("127.0.0.1:1").unwrap();
        let refused = |flags: &AccessFlags, file: &FileConfig| {
            Access::resolve(listen, flags, file)
                .unwrap_err()
                .to_string()
        };
        let on = AccessFlags {
            tls: Some(TlsMode::On),
            ..AccessFlags::default()
        };
        assert_eq!(
            refused(&on, &FileConfig::default()),
            "--tls on: this oxadbd was built without TLS (cargo feature `tls`)"
        );
        let mut file: FileConfig = toml::from_str("tls = \"required\"\n").unwrap();
        file.path = Some("/etc/o.toml".into());
        assert_eq!(
            refused(&AccessFlags::default(), &file),
            "`tls = \"required\"` in /etc/o.toml: this oxadbd was built without TLS \
             (cargo feature `tls`)"
        );
        let key = AccessFlags {
            tls_key: Some("/k.pem".into()),
            ..AccessFlags::default()
        };
        assert!(refused(&key, &FileConfig::default()).starts_with("--tls-key: "));
        let cert: FileConfig = toml::from_str("tls-cert = \"/c.pem\"\n").unwrap();
        assert!(refused(&AccessFlags::default(), &cert).contains("`tls-cert` in"));
        // What asks for no TLS stays valid, and every host gets plaintext.
        let off = AccessFlags {
            tls: Some(TlsMode::Off),
            ..AccessFlags::default()
        };
        assert!(Access::resolve(listen, &off, &FileConfig::default()).is_ok());
        let access = Access::resolve(listen, &AccessFlags::default(), &FileConfig::default());
        assert_eq!(
            access.unwrap().tls.for_peer(false).0,
            oxadb_engine::Tls::Off
        );
    }

    #[test]
    #[cfg(not(feature = "mdns"))]
    fn without_mdns_asking_for_it_names_the_feature() {
        let on: FileConfig = toml::from_str("mdns = true\n").unwrap();
        let error = on.announces_mdns(false).unwrap_err().to_string();
        assert!(
            error.ends_with("this oxadbd was built without mDNS (cargo feature `mdns`)"),
            "{error}"
        );
        let off: FileConfig = toml::from_str("mdns = false\n").unwrap();
        assert!(!off.announces_mdns(true).unwrap());
        assert!(!FileConfig::default().announces_mdns(false).unwrap());
    }
}
