//! The daemon's command line as given: every flag that sets up the daemon,
//! each `None` or `false` when not given. No defaults and no config file
//! here: [`crate::settings::Settings::resolve`] turns these, the config
//! file and the environment into the settings the daemon runs with.

use std::path::PathBuf;

/// The flags of `oxadbd` (without a subcommand); their help is `oxadbd --help`.
#[derive(Debug, Default, clap::Args)]
pub struct Flags {
    /// Where to listen: ADDR:PORT (TCP) and/or vsock:PORT (virtual machine
    /// sockets, any CID), comma-separated [default: 127.0.0.1:5555; with
    /// --usb, no TCP unless given]. Hosts must authenticate, except loopback
    /// TCP peers owned by root or the daemon's own user (see --auth,
    /// --trust-local-users); vsock peers always, unless --no-auth --insecure.
    #[arg(long, value_name = "ADDR:PORT|vsock:PORT", env = "OXADBD_LISTEN")]
    pub listen: Option<String>,
    /// Serve ADB over USB as a FunctionFS gadget function (see --ffs-dir).
    /// Hosts must authenticate over USB unless --no-auth is given.
    #[arg(long)]
    pub usb: bool,
    /// Where the function's FunctionFS is mounted [default: /dev/usb-ffs/adb].
    /// The gadget can be bound to a UDC once oxadbd logs "ready for UDC bind"
    /// (ep1 and ep2 then exist there).
    #[arg(long, value_name = "DIR")]
    pub ffs_dir: Option<PathBuf>,
    /// Bind this configfs gadget (e.g. /sys/kernel/config/usb_gadget/oxadbd)
    /// to a UDC once the descriptors are written; it is unbound when oxadbd
    /// exits.
    #[arg(long, value_name = "DIR")]
    pub usb_gadget: Option<PathBuf>,
    /// The UDC for --usb-gadget [default: the first in /sys/class/udc].
    #[arg(long, value_name = "NAME")]
    pub usb_udc: Option<String>,
    /// Configuration file (TOML; keys: listen, usb, ffs-dir, usb-gadget,
    /// usb-udc, shell, framebuffer, product-name, product-model, product-device, credit,
    /// delayed-ack, memory-budget, ack-headroom, auth, trust-local-users,
    /// keys, accept-new-keys, tls, tls-key, tls-cert, insecure, max-connections, max-streams,
    /// handshake-timeout, auth-timeout, stalled-stream-timeout, peer-timeout,
    /// reboot-command, allow-tcpip, mdns, durability, state-dir, stop-grace, and a
    /// [properties] table for getprop).
    #[arg(long, value_name = "PATH", default_value = None)]
    pub config: Option<PathBuf>,
    /// Login shell for `adb shell` [default: /bin/sh].
    #[arg(long, value_name = "PATH")]
    pub shell: Option<PathBuf>,
    /// The framebuffer device the `framebuffer:` service reads [default:
    /// /dev/fb0].
    #[arg(long, value_name = "PATH")]
    pub framebuffer: Option<PathBuf>,
    /// `ro.product.name` in the banner [default: the os-release ID].
    #[arg(long)]
    pub product_name: Option<String>,
    /// `ro.product.model` in the banner [default: device-tree or DMI model].
    #[arg(long)]
    pub product_model: Option<String>,
    /// `ro.product.device` in the banner [default: the host name].
    #[arg(long)]
    pub product_device: Option<String>,
    /// Send pulled files with `sendfile` instead of reading them into
    /// buffers (the same as OXADB_ZERO_COPY=1); off by default, as the
    /// receiving host then spends more than the daemon saves
    /// (docs/benchmarks.md, "Zero-copy sends").
    #[arg(long)]
    pub zero_copy: bool,
    /// How far a pushed file reaches storage before adb is told it arrived:
    /// full (fsync the file, rename it into place, fsync its directory),
    /// rename (fsync the file before the rename: after a power cut the new
    /// content or the old, but the rename may be lost) or none (no flush,
    /// as Android's adbd) [default: full].
    #[arg(long, value_name = "full|rename|none")]
    pub durability: Option<oxadb_transfer::Durability>,
    /// Where the journal of directories holding temporary push files is
    /// kept, so that a restart removes what a killed daemon left (made if
    /// missing) [default: /var/lib/oxadbd, made if missing; for a user who
    /// may not, $XDG_STATE_HOME/oxadbd or ~/.local/state/oxadbd].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Keep no state directory: no push journal (a killed daemon's temporary
    /// push files are not found at the next start) and an mDNS instance name
    /// made anew at each start. For a read-only root without one.
    #[arg(long, conflicts_with = "state_dir")]
    pub no_state_dir: bool,
    /// Seconds pushes in flight may take to finish after SIGTERM before they
    /// are aborted (a second SIGTERM or SIGINT stops at once) [default: 5].
    #[arg(long, value_name = "SECS")]
    pub stop_grace: Option<u64>,
    /// Do not offer burst mode (`delayed_ack`); the same as `--credit classic`.
    #[arg(long, conflicts_with = "credit")]
    pub no_delayed_ack: bool,
    /// Flow control: classic (no burst mode), aosp (burst mode with AOSP's
    /// fixed 32 MiB credit per stream) or adaptive (burst mode, credit grown
    /// from the measured rate and round trip) [default: adaptive].
    #[arg(long, value_name = "classic|aosp|adaptive", value_parser = oxadb_io::parse_credit_mode)]
    pub credit: Option<crate::config::CreditMode>,
    /// Receive memory all streams together may commit (e.g. 64M); windows
    /// stop growing at half of it, shrink above two thirds, and each stream
    /// gets at most an eighth [default: 3/32 of the available memory, as
    /// Linux sizes tcp_mem].
    #[arg(long, value_name = "SIZE", value_parser = crate::config::parse_size)]
    pub memory_budget: Option<u64>,
    /// Turn off the adaptive window's headroom for clumped deliveries (for
    /// measuring what it brings).
    #[arg(long)]
    pub no_ack_headroom: bool,
    /// Every host must sign a token with a key in the keys file, as adbd
    /// requires, root on loopback included [default: every host but
    /// loopback peers owned by root or the daemon's own user].
    #[arg(long, overrides_with = "no_auth")]
    pub auth: bool,
    /// Let every host in without a key, every local user included (beyond
    /// loopback only with --insecure). Warned at every start.
    #[arg(long, overrides_with = "auth")]
    pub no_auth: bool,
    /// Let every local user in over loopback without a key, not only root
    /// and the daemon's own user; other hosts still need one. Warned at
    /// every start.
    #[arg(long)]
    pub trust_local_users: bool,
    /// Authorized host keys, one `adbkey.pub` line each (adb's `adb_keys`
    /// format), for every host that must authenticate [default:
    /// /etc/oxadbd/adb_keys]. Re-read at every attempt.
    #[arg(long, value_name = "PATH")]
    pub keys: Option<PathBuf>,
    /// Trust any public key a host offers and append it to the keys file
    /// (trust on first use; every new key is logged).
    #[arg(long)]
    pub accept_new_keys: bool,
    /// TLS 1.3 on TCP connections (STLS, as adbd's wireless debugging):
    /// `off`; `on`: for hosts that can do it, plaintext for older adb;
    /// `required`: refuse hosts that cannot [default: plaintext on
    /// loopback; beyond it `on`, `required` once a host is paired].
    /// Never over USB.
    #[arg(long, value_name = "MODE")]
    pub tls: Option<crate::tls::TlsMode>,
    /// The daemon's TLS private key, made on first use (mode 0600)
    /// [default: tls_key.pem beside the keys file].
    #[arg(long, value_name = "PATH")]
    pub tls_key: Option<PathBuf>,
    /// The daemon's TLS certificate, made with the key [default:
    /// tls_cert.pem beside the keys file].
    #[arg(long, value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,
    /// Allow listening beyond loopback without authentication: anyone who
    /// can reach the address gets a root shell. Warned at every start.
    #[arg(long)]
    pub insecure: bool,
    /// Connections served at once; more are closed on accept [default: 64].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Streams a connection may have open at once; more OPENs are refused
    /// [default: 1024].
    #[arg(long, value_name = "N")]
    pub max_streams: Option<usize>,
    /// Seconds a new connection has to send CNXN [default: 10].
    #[arg(long, value_name = "SECS")]
    pub handshake_timeout: Option<u64>,
    /// Seconds a new connection has to authenticate [default: 60].
    #[arg(long, value_name = "SECS")]
    pub auth_timeout: Option<u64>,
    /// Seconds a stream's data may wait for the host's credit before the
    /// stream is closed; 0 keeps them forever [default: 300].
    #[arg(long, value_name = "SECS")]
    pub stalled_stream_timeout: Option<u64>,
    /// Seconds a TCP host may stay silent before its connection, its
    /// streams and its unfinished pushes are dropped: keepalive probes after
    /// half of it, data unacknowledged for all of it (docs/protocol.md,
    /// "Dead peers"); 0 leaves the kernel's defaults [default: 30].
    #[arg(long, value_name = "SECS")]
    pub peer_timeout: Option<u64>,
    /// What `adb reboot [TARGET]` runs once it has answered, split on
    /// blanks; a target (bootloader, recovery...) is appended as the last
    /// argument and set in OXADBD_REBOOT_TARGET. "" refuses reboots
    /// [default: `systemctl reboot` under systemd, else `reboot`].
    #[arg(long, value_name = "COMMAND")]
    pub reboot_command: Option<String>,
    /// Refuse `adb tcpip PORT` and `adb usb` (by default a host may move
    /// the TCP listener to another port on the same address).
    #[arg(long)]
    pub no_tcpip: bool,
    /// Do not announce the TCP listener over mDNS (`_adb._tcp`,
    /// `_adb-tls-connect._tcp`, as adbd does; what that reveals:
    /// docs/security.md). A loopback listener is never announced.
    #[arg(long)]
    pub no_mdns: bool,
}
