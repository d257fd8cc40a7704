//! Daemon configuration: command-line flags over an optional TOML file over defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use oxadb_engine::{BudgetLimits, CreditMode};
use oxadb_wire::{feature, Banner};
use serde::Deserialize;
use thiserror::Error;

/// Default listen address: loopback only, as adbd's TCP mode would be reachable
/// by anyone otherwise, and the daemon hands out a root shell.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:5555";
/// Read when present and no `--config` is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/oxadbd/oxadbd.toml";

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
    #[error("invalid listen address {0:?}: expected ADDR:PORT, e.g. 127.0.0.1:5555")]
    BadListen(String),
    #[error(
        "refusing to listen on {0}: oxadbd has no authentication yet and gives a root shell, \
         so it only listens on loopback (e.g. 127.0.0.1:5555 or [::1]:5555); \
         reach it remotely through an SSH tunnel"
    )]
    NotLoopback(SocketAddr),
    #[error("config file {path}: {message}")]
    BadValue { path: PathBuf, message: String },
}

/// The `[daemon]`-less flat TOML file; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub listen: Option<String>,
    pub shell: Option<PathBuf>,
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
    /// Where this was read from, for error messages.
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

impl FileConfig {
    /// The `credit` key, or `classic` for `delayed-ack = false`.
    pub fn credit_mode(&self) -> Result<Option<CreditMode>, ConfigError> {
        if let Some(text) = &self.credit {
            return text
                .parse()
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
    pub listen: SocketAddr,
    pub shell: PathBuf,
    pub product_name: String,
    pub product_model: String,
    pub product_device: String,
    /// Flow control offered; anything but `Classic` advertises `delayed_ack`.
    pub credit: CreditMode,
    /// The levels of the receive-memory budget shared by every stream.
    pub memory_budget: BudgetLimits,
    /// Headroom for clumped deliveries in adaptive windows (seed 004).
    pub ack_headroom: bool,
}

impl DaemonConfig {
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
        let mut features = feature::IMPLEMENTED.to_vec();
        if self.credit.delayed_ack() {
            features.push(feature::DELAYED_ACK);
        }
        banner.features = features.into_iter().map(str::to_string).collect();
        banner
    }
}

/// Parses a listen address and enforces loopback-only (no auth yet).
pub fn parse_listen(text: &str) -> Result<SocketAddr, ConfigError> {
    let addr = match text.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => text.to_string(),
    };
    let addr: SocketAddr = addr
        .parse()
        .map_err(|_| ConfigError::BadListen(text.to_string()))?;
    if !addr.ip().is_loopback() {
        return Err(ConfigError::NotLoopback(addr));
    }
    Ok(addr)
}

pub use oxadb_io::parse_size;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_is_loopback_only() {
        assert_eq!(
            parse_listen("127.0.0.1:5555").unwrap(),
            "127.0.0.1:5555".parse().unwrap()
        );
        assert!(parse_listen("[::1]:1").is_ok());
        assert!(parse_listen("localhost:7").is_ok());
        assert!(matches!(
            parse_listen("0.0.0.0:5555"),
            Err(ConfigError::NotLoopback(_))
        ));
        assert!(matches!(
            parse_listen("198.18.0.1:5555"),
            Err(ConfigError::NotLoopback(_))
        ));
        assert!(matches!(
            parse_listen("nonsense"),
            Err(ConfigError::BadListen(_))
        ));
    }

    #[test]
    fn banner_lists_implemented_features() {
        let mut config = DaemonConfig {
            listen: parse_listen(DEFAULT_LISTEN).unwrap(),
            shell: "/bin/sh".into(),
            product_name: "debian".into(),
            product_model: "Board; rev=2".into(),
            product_device: "kiosk".into(),
            credit: CreditMode::Adaptive,
            memory_budget: BudgetLimits::from_limit(64 << 20),
            ack_headroom: true,
        };
        let banner = Banner::parse(config.banner().encode().as_bytes()).unwrap();
        assert_eq!(banner.property("ro.product.model"), Some("Board_ rev_2"));
        assert!(banner.has_feature("shell_v2"));
        assert!(banner.has_feature("delayed_ack"));
        config.credit = CreditMode::Aosp;
        assert!(config.banner().has_feature("delayed_ack"));
        config.credit = CreditMode::Classic;
        assert!(!config.banner().has_feature("delayed_ack"));
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
    }
}
