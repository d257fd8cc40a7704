//! The command's settings, resolved once: the tuning flags given before the
//! command ([`Tuning`]) and the environment ([`Environment`]) go through
//! [`Settings::resolve`] into one [`Settings`] value: the options every
//! connection of the command is made with (zero copy included) and how
//! pulls store their files.

use std::sync::Arc;
use std::time::Duration;

use oxadb::{ConnectOptions, CreditMode};
use oxadb_transfer::Durability;

/// The heading of the flow-control flags: for measurements, not daily use,
/// so only the top-level help lists them and they go before the command
/// (`oxadb --no-burst push ...`).
const TUNING: &str = "Tuning (before the command)";

/// The tuning flags as given (flattened into the command line).
#[derive(Debug, Default, clap::Args)]
pub struct Tuning {
    /// Classic flow control (one packet in flight per stream) even when the
    /// device supports burst mode; for comparisons.
    #[arg(long, conflicts_with = "credit", help_heading = TUNING)]
    pub no_burst: bool,
    /// Push files with `sendfile` over TCP, the default (OXADB_ZERO_COPY=1):
    /// the file's data never passes through oxadb's memory.
    #[arg(long, conflicts_with = "no_zero_copy", help_heading = TUNING)]
    pub zero_copy: bool,
    /// Push files by reading them into buffers, as over USB and TLS (the
    /// same as OXADB_ZERO_COPY=0).
    #[arg(long, help_heading = TUNING)]
    pub no_zero_copy: bool,
    /// How far a pulled file reaches storage before pull reports it: full
    /// (fsync the file, rename it into place, fsync its directory), rename
    /// (fsync the file before the rename; the rename may be lost in a power
    /// cut) or none (no flush, as adb) [default: full].
    #[arg(long, value_name = "full|rename|none", help_heading = TUNING)]
    pub durability: Option<oxadb_transfer::Durability>,
    /// Flow control: classic (one packet in flight, like --no-burst), aosp
    /// (burst mode with AOSP's fixed 32 MiB credit per stream) or adaptive
    /// (burst mode, credit grown from the measured rate and round trip).
    #[arg(
        long,
        help_heading = TUNING,
        value_name = "classic|aosp|adaptive",
        value_parser = oxadb_io::parse_credit_mode
    )]
    pub credit: Option<CreditMode>,
    /// Receive memory this process's streams may commit together (e.g. 64M)
    /// [default: 3/32 of the available memory, as Linux sizes tcp_mem].
    #[arg(long, value_name = "SIZE", value_parser = oxadb_io::parse_size, help_heading = TUNING)]
    pub memory_budget: Option<u64>,
    /// Turn off the adaptive window's headroom for clumped deliveries (for
    /// measuring what it brings).
    #[arg(long, help_heading = TUNING)]
    pub no_ack_headroom: bool,
    /// Seconds a TCP device may stay silent (keepalive probes after half of
    /// it, data unacknowledged for all of it) before the command fails with
    /// "lost the connection"; 0 leaves the kernel's defaults [default: 30].
    #[arg(long, value_name = "SECS", env = "OXADB_PEER_TIMEOUT", help_heading = TUNING)]
    pub peer_timeout: Option<u64>,
    /// Seconds the device may take to accept or refuse a stream (a shell, a
    /// sync session, a forwarded connection) before the command fails; 0
    /// waits for ever, as adb [default: 30].
    #[arg(long, value_name = "SECS", env = "OXADB_OPEN_TIMEOUT", help_heading = TUNING)]
    pub open_timeout: Option<u64>,
    /// Seconds a push or pull waits with nothing from the device while it
    /// owes a reply (a stat, file data, the OKAY after a push's last flush),
    /// or takes none of the data sent, before it fails; 0 waits for ever,
    /// as adb [default: 300].
    #[arg(long, value_name = "SECS", env = "OXADB_REPLY_TIMEOUT", help_heading = TUNING)]
    pub reply_timeout: Option<u64>,
}

/// `SECS` of a timeout flag: 0 is no limit, none given is `default`.
fn limit(secs: Option<u64>, default: Option<Duration>) -> Option<Duration> {
    match secs {
        Some(0) => None,
        Some(secs) => Some(Duration::from_secs(secs)),
        None => default,
    }
}

/// What the command reads from its environment, besides what clap reads
/// (`ANDROID_SERIAL`, `OXADB_PEER_TIMEOUT`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Environment {
    /// `OXADB_NO_BURST` set to anything but `0`.
    pub no_burst: bool,
    /// `OXADB_ZERO_COPY` ([`oxadb_transfer::zero_copy_from_env`]).
    pub zero_copy: Option<bool>,
}

impl Environment {
    /// This process's environment.
    pub fn of_process() -> Environment {
        Environment {
            no_burst: std::env::var_os(oxadb::device::NO_BURST_ENV).is_some_and(|v| v != "0"),
            zero_copy: oxadb_transfer::zero_copy_from_env(),
        }
    }
}

/// Everything the tuning flags and the environment decide.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How every connection of the command is made.
    pub connect: ConnectOptions,
    /// How far a pulled file is flushed.
    pub durability: Durability,
}

impl Settings {
    /// Flags over the environment over defaults.
    pub fn resolve(tuning: &Tuning, env: &Environment) -> Settings {
        let credit = match tuning.credit {
            Some(credit) => credit,
            None if tuning.no_burst || env.no_burst => CreditMode::Classic,
            None => CreditMode::Adaptive,
        };
        // One budget for every connection this command makes (the limit is
        // per process, docs/flow-control.md, "Memory budget").
        let budget = tuning
            .memory_budget
            .map(oxadb::BudgetLimits::from_limit)
            .unwrap_or_else(oxadb_io::default_budget_limits);
        let connect = ConnectOptions {
            credit,
            memory_budget: Some(Arc::new(oxadb::MemoryBudget::new(budget))),
            ack_headroom: !tuning.no_ack_headroom,
            peer_timeout: match tuning.peer_timeout {
                Some(secs) => oxadb_io::PeerTimeout::from_secs(secs),
                None => Some(oxadb_io::DEFAULT_PEER_TIMEOUT),
            },
            // Pushes by sendfile unless told otherwise: 1.2 times the
            // copying push on loopback, less CPU on any link
            // (docs/benchmarks.md, "Zero-copy sends").
            zero_copy: !tuning.no_zero_copy && (tuning.zero_copy || env.zero_copy.unwrap_or(true)),
            open_timeout: limit(
                tuning.open_timeout,
                Some(oxadb::device::DEFAULT_OPEN_TIMEOUT),
            ),
            reply_timeout: limit(
                tuning.reply_timeout,
                Some(oxadb::device::DEFAULT_REPLY_TIMEOUT),
            ),
            ..ConnectOptions::default()
        };
        Settings {
            connect,
            durability: tuning.durability.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(tuning: Tuning, env: Environment) -> Settings {
        Settings::resolve(&tuning, &env)
    }

    #[test]
    fn zero_copy_is_on_unless_a_flag_or_the_environment_says_otherwise() {
        let zero_copy = |zero_copy: bool, no_zero_copy: bool, env: Option<bool>| {
            let tuning = Tuning {
                zero_copy,
                no_zero_copy,
                ..Tuning::default()
            };
            let env = Environment {
                zero_copy: env,
                ..Environment::default()
            };
            resolve(tuning, env).connect.zero_copy
        };
        assert!(zero_copy(false, false, None));
        assert!(!zero_copy(false, false, Some(false)));
        assert!(
            zero_copy(true, false, Some(false)),
            "the flag beats the environment"
        );
        assert!(
            !zero_copy(false, true, Some(true)),
            "the flag beats the environment"
        );
    }

    #[test]
    fn the_credit_mode_is_the_flag_else_the_environment_else_adaptive() {
        let credit = |tuning: Tuning, no_burst: bool| {
            let env = Environment {
                no_burst,
                ..Environment::default()
            };
            resolve(tuning, env).connect.credit
        };
        assert_eq!(credit(Tuning::default(), false), CreditMode::Adaptive);
        assert_eq!(credit(Tuning::default(), true), CreditMode::Classic);
        let no_burst = Tuning {
            no_burst: true,
            ..Tuning::default()
        };
        assert_eq!(credit(no_burst, false), CreditMode::Classic);
        let aosp = Tuning {
            credit: Some(CreditMode::Aosp),
            ..Tuning::default()
        };
        assert_eq!(credit(aosp, true), CreditMode::Aosp);
    }

    #[test]
    fn durability_timeouts_and_the_budget_come_from_the_flags_or_their_defaults() {
        let defaults = resolve(Tuning::default(), Environment::default());
        assert_eq!(defaults.durability, Durability::Full);
        assert_eq!(
            defaults.connect.peer_timeout.map(|t| t.timeout()),
            Some(oxadb_io::DEFAULT_PEER_TIMEOUT.timeout())
        );
        assert!(defaults.connect.ack_headroom);
        assert_eq!(defaults.connect.open_timeout, Some(Duration::from_secs(30)));
        assert_eq!(
            defaults.connect.reply_timeout,
            Some(Duration::from_secs(300))
        );
        let tuned = resolve(
            Tuning {
                durability: Some(Durability::None),
                peer_timeout: Some(0),
                open_timeout: Some(0),
                reply_timeout: Some(7),
                memory_budget: Some(64 << 20),
                no_ack_headroom: true,
                ..Tuning::default()
            },
            Environment::default(),
        );
        assert_eq!(tuned.durability, Durability::None);
        assert!(tuned.connect.peer_timeout.is_none());
        assert_eq!(tuned.connect.open_timeout, None);
        assert_eq!(tuned.connect.reply_timeout, Some(Duration::from_secs(7)));
        assert!(!tuned.connect.ack_headroom);
        let budget = tuned.connect.memory_budget.expect("one budget");
        assert_eq!(budget.limits().limit, 64 << 20);
    }
}
