//! The daemon's settings, resolved once: the command line ([`Flags`]), the
//! config file ([`FileConfig`]) and the environment ([`Environment`]) go
//! through [`Settings::resolve`], the one place where a flag wins over the
//! file and the file over a default, and come out as one [`Settings`] value
//! that the binary hands down (the [`DaemonConfig`] to the server and its
//! services).

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{
    self, Access, AccessFlags, ConfigError, DaemonConfig, DeviceSettings, FileConfig, UsbConfig,
    UsbFlags,
};
use crate::flags::Flags;

/// What the daemon reads from its environment, besides clap's `OXADBD_LISTEN`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Environment {
    /// `OXADB_ZERO_COPY` ([`oxadb_transfer::zero_copy_from_env`]).
    pub zero_copy: Option<bool>,
}

impl Environment {
    /// This process's environment.
    pub fn of_process() -> Environment {
        Environment {
            zero_copy: oxadb_transfer::zero_copy_from_env(),
        }
    }
}

/// Everything the daemon runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// What the server and the services use.
    pub daemon: DaemonConfig,
    /// TCP is served (on `daemon.listen`): unless only USB or only vsock
    /// was asked for.
    pub serves_tcp: bool,
    /// The vsock port served, if any.
    pub vsock: Option<u32>,
    /// The USB function served, if any.
    pub usb: Option<UsbConfig>,
    /// `--state-dir` or `state-dir`, if given; which directory is used is
    /// found at start ([`config::StateDir::resolve`], which may make it).
    pub state_dir: Option<PathBuf>,
    /// `--no-state-dir`: keep none, whatever the file says.
    pub no_state_dir: bool,
    /// How long pushes in flight may take to finish after SIGTERM.
    pub stop_grace: Duration,
    /// The TCP listener is announced over mDNS.
    pub mdns: bool,
}

impl Settings {
    /// Reads the config file `flags` name (or the default one, if present)
    /// and resolves the settings from both and `env`.
    pub fn load(flags: &Flags, env: &Environment) -> Result<Settings, ConfigError> {
        let file = FileConfig::load(flags.config.as_deref())?;
        Settings::resolve(flags, &file, env)
    }

    /// Flags over the environment over the file over defaults; a file value
    /// that does not parse is an error naming the file and the key.
    pub fn resolve(
        flags: &Flags,
        file: &FileConfig,
        env: &Environment,
    ) -> Result<Settings, ConfigError> {
        let file_credit = file.credit_mode()?;
        let file_budget = file.memory_budget()?;
        let durability = flags.durability.or(file.durability()?).unwrap_or_default();
        let stop_grace = Duration::from_secs(
            flags
                .stop_grace
                .or(file.stop_grace)
                .unwrap_or(crate::stop::DEFAULT_GRACE_SECS),
        );
        let state_dir = flags.state_dir.clone().or_else(|| file.state_dir.clone());
        let mdns = file.announces_mdns(flags.no_mdns)?;
        let usb = UsbConfig::resolve(
            &UsbFlags {
                usb: flags.usb,
                ffs_dir: flags.ffs_dir.clone(),
                gadget: flags.usb_gadget.clone(),
                udc: flags.usb_udc.clone(),
            },
            file,
        );
        // With USB, TCP is served only when an address is given; a list that
        // names only a vsock port serves no TCP either.
        let places = match flags.listen.as_deref().or(file.listen.as_deref()) {
            Some(listen) => config::parse_listen_list(listen)?,
            None if usb.is_some() => config::Listen::default(),
            None => config::parse_listen_list(config::DEFAULT_LISTEN)?,
        };
        let listen = match places.tcp {
            Some(listen) => listen,
            None => config::parse_listen(config::DEFAULT_LISTEN)?,
        };
        let access = Access::resolve(
            listen,
            &AccessFlags {
                auth: if flags.auth {
                    Some(true)
                } else if flags.no_auth {
                    Some(false)
                } else {
                    None
                },
                trust_local_users: flags.trust_local_users,
                keys: flags.keys.clone(),
                accept_new_keys: flags.accept_new_keys,
                tls: flags.tls,
                tls_key: flags.tls_key.clone(),
                tls_cert: flags.tls_cert.clone(),
                insecure: flags.insecure,
                max_connections: flags.max_connections,
                max_streams: flags.max_streams,
                handshake_timeout: flags.handshake_timeout,
                auth_timeout: flags.auth_timeout,
                stalled_stream_timeout: flags.stalled_stream_timeout,
                peer_timeout: flags.peer_timeout,
                usb: usb.is_some(),
                vsock: places.vsock,
            },
            file,
        )?;
        let device = DeviceSettings::resolve(flags.reboot_command.clone(), flags.no_tcpip, file);
        let daemon = DaemonConfig {
            listen,
            shell: flags
                .shell
                .clone()
                .or_else(|| file.shell.clone())
                .unwrap_or_else(|| PathBuf::from("/bin/sh")),
            framebuffer: flags
                .framebuffer
                .clone()
                .or_else(|| file.framebuffer.clone())
                .unwrap_or_else(|| PathBuf::from(config::DEFAULT_FRAMEBUFFER)),
            product_name: config::product_name(flags.product_name.clone(), file),
            product_model: config::product_model(flags.product_model.clone(), file),
            product_device: config::product_device(flags.product_device.clone(), file),
            credit: if flags.no_delayed_ack {
                config::CreditMode::Classic
            } else {
                flags.credit.or(file_credit).unwrap_or_default()
            },
            memory_budget: flags
                .memory_budget
                .or(file_budget)
                .map(config::BudgetLimits::from_limit)
                .unwrap_or_else(oxadb_io::default_budget_limits),
            ack_headroom: !flags.no_ack_headroom && file.ack_headroom != Some(false),
            access,
            device,
            durability,
            // The flag, else the environment: off by default.
            zero_copy: flags.zero_copy || env.zero_copy.unwrap_or(false),
        };
        Ok(Settings {
            daemon,
            serves_tcp: places.tcp.is_some(),
            vsock: places.vsock,
            usb,
            state_dir,
            no_state_dir: flags.no_state_dir,
            stop_grace,
            mdns,
        })
    }

    /// Logs what the daemon runs with (debug), under the binary's target as
    /// it always was.
    pub fn log(&self) {
        let config = &self.daemon;
        tracing::debug!(
            target: "oxadbd",
            shell = %config.shell.display(),
            credit = %config.credit,
            durability = %config.durability,
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
            tracing::warn!(target: "oxadbd", "{unused}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxadb_transfer::Durability;

    fn file(text: &str) -> FileConfig {
        let mut file: FileConfig = toml::from_str(text).unwrap();
        file.path = Some(PathBuf::from("/etc/test/oxadbd.toml"));
        file
    }

    fn resolve(flags: &Flags, text: &str, env: Environment) -> Settings {
        Settings::resolve(flags, &file(text), &env).unwrap()
    }

    #[test]
    fn a_flag_beats_the_file_which_beats_the_default() {
        let none = Flags::default();
        let env = Environment::default();
        let flagged = Flags {
            durability: Some(Durability::None),
            handshake_timeout: Some(3),
            stop_grace: Some(1),
            shell: Some("/bin/flag-sh".into()),
            ..Flags::default()
        };
        let text = "durability = \"rename\"\nhandshake-timeout = 7\nstop-grace = 9\n\
                    shell = \"/bin/file-sh\"\n";

        let defaults = resolve(&none, "", env);
        assert_eq!(defaults.daemon.durability, Durability::Full);
        assert_eq!(
            defaults.daemon.access.handshake_timeout,
            config::DEFAULT_HANDSHAKE_TIMEOUT
        );
        assert_eq!(
            defaults.stop_grace,
            Duration::from_secs(crate::stop::DEFAULT_GRACE_SECS)
        );
        assert_eq!(defaults.daemon.shell, PathBuf::from("/bin/sh"));

        let from_file = resolve(&none, text, env);
        assert_eq!(from_file.daemon.durability, Durability::Rename);
        assert_eq!(
            from_file.daemon.access.handshake_timeout,
            Duration::from_secs(7)
        );
        assert_eq!(from_file.stop_grace, Duration::from_secs(9));
        assert_eq!(from_file.daemon.shell, PathBuf::from("/bin/file-sh"));

        let from_flags = resolve(&flagged, text, env);
        assert_eq!(from_flags.daemon.durability, Durability::None);
        assert_eq!(
            from_flags.daemon.access.handshake_timeout,
            Duration::from_secs(3)
        );
        assert_eq!(from_flags.stop_grace, Duration::from_secs(1));
        assert_eq!(from_flags.daemon.shell, PathBuf::from("/bin/flag-sh"));
    }

    #[test]
    fn zero_copy_is_the_flag_else_the_environment_else_off() {
        let zero_copy = |flag: bool, env: Option<bool>| {
            let flags = Flags {
                zero_copy: flag,
                ..Flags::default()
            };
            resolve(&flags, "", Environment { zero_copy: env })
                .daemon
                .zero_copy
        };
        assert!(!zero_copy(false, None));
        assert!(zero_copy(false, Some(true)));
        assert!(!zero_copy(false, Some(false)));
        assert!(zero_copy(true, None));
        // The flag only turns it on; OXADB_ZERO_COPY=0 does not undo it.
        assert!(zero_copy(true, Some(false)));
    }

    #[test]
    fn where_the_daemon_listens() {
        let env = Environment::default();
        let tcp = resolve(&Flags::default(), "", env);
        assert!(tcp.serves_tcp && tcp.vsock.is_none() && tcp.usb.is_none());
        assert_eq!(tcp.daemon.listen, "127.0.0.1:5555".parse().unwrap());
        // USB alone serves no TCP; a vsock port alone neither.
        let usb = Flags {
            usb: true,
            ..Flags::default()
        };
        let usb = resolve(&usb, "", env);
        assert!(!usb.serves_tcp && usb.usb.is_some());
        let vsock = resolve(&Flags::default(), "listen = \"vsock:5\"\n", env);
        assert!(!vsock.serves_tcp);
        assert_eq!(vsock.vsock, Some(5));
        // The flag's list replaces the file's.
        let flags = Flags {
            listen: Some("127.0.0.1:7".into()),
            ..Flags::default()
        };
        let both = resolve(&flags, "listen = \"vsock:5\"\n", env);
        assert!(both.serves_tcp && both.vsock.is_none());
        assert_eq!(both.daemon.listen, "127.0.0.1:7".parse().unwrap());
    }

    #[test]
    fn a_bad_file_value_names_the_file_and_the_key() {
        let error = |text: &str| {
            Settings::resolve(&Flags::default(), &file(text), &Environment::default())
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            error("durability = \"often\"\n"),
            "config file /etc/test/oxadbd.toml: durability: unknown durability 'often' \
             (expected full, rename or none)"
        );
        assert_eq!(
            error("memory-budget = \"lots\"\n"),
            "config file /etc/test/oxadbd.toml: memory-budget: bad size \"lots\": \
             expected a number with an optional K, M or G"
        );
        // A good flag does not hide a bad file value: the file is wrong.
        let flags = Flags {
            durability: Some(Durability::Full),
            ..Flags::default()
        };
        let result = Settings::resolve(
            &flags,
            &file("durability = \"often\"\n"),
            &Environment::default(),
        );
        assert!(result.is_err());
    }
}
