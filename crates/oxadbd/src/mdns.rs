//! mDNS (DNS-SD) announcements, so that `adb mdns services`, Android Studio
//! and other browsers find the device without being told its address.
//!
//! As AOSP's `daemon/mdns.cpp` and `adb_mdns.h`: the TCP port is announced as
//! `_adb._tcp` and `_adb-tls-connect._tcp`, the pairing port (only while a
//! pairing window is open) as `_adb-tls-pairing._tcp`; every service of the
//! device has the one instance name `adb-<serial>-<6 random alphanumerics>`
//! (adbd keeps it in `persist.adb.wifi.guid`; here `<state dir>/mdns-instance`)
//! and the TXT records `v=1` (ADB_SECURE_SERVICE_VERSION), `name=` the
//! product model and `api=` the SDK level. A host that paired through mDNS
//! looks for the connect service under the pairing service's instance name
//! (`client/transport_mdns.cpp`), so both must agree, across processes too.
//!
//! Announcing is done by `mdns-sd`'s responder: one thread per process,
//! started at the first announcement, answering queries on port 5353.
//! Without the `mdns` feature only the names are left ([`DeviceInfo`], the
//! instance name that pairing sends as the device's GUID, and [`Where`]).

use std::net::IpAddr;
#[cfg(feature = "mdns")]
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
#[cfg(feature = "mdns")]
use std::sync::{Mutex, OnceLock};
#[cfg(feature = "mdns")]
use std::time::Duration;

#[cfg(feature = "mdns")]
use mdns_sd::{IfKind, IfPredicate, ServiceDaemon, ServiceInfo, UnregisterStatus};
#[cfg(feature = "mdns")]
use thiserror::Error;

use crate::services::props::Properties;

// The names hosts browse for too (the server's discovery).
pub use oxadb_wire::mdns::{
    SERVICE_TCP, SERVICE_TLS_CONNECT, SERVICE_TLS_PAIRING, SERVICE_VERSION,
};
/// Where the instance name is kept, in the state directory.
pub const INSTANCE_FILE: &str = "mdns-instance";

#[cfg(feature = "mdns")]
/// How long a withdrawal waits for the responder to send its goodbye.
const GOODBYE_WAIT: Duration = Duration::from_secs(1);

#[cfg(feature = "mdns")]
#[derive(Debug, Error)]
pub enum MdnsError {
    #[error("starting the mDNS responder: {0}")]
    Start(String),
    #[error("announcing {service} ({instance}) on port {port}: {cause}")]
    Announce {
        service: &'static str,
        instance: String,
        port: u16,
        cause: String,
    },
}

/// What the device's services are announced as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The DNS-SD instance name (`adb-<serial>-<suffix>`); a QR-code pairing
    /// announces the pairing service under the name the QR code gave instead.
    pub instance: String,
    /// `name=` in TXT: `ro.product.model`.
    pub model: String,
    /// `api=` in TXT: `ro.build.version.sdk_full` (adbd's key since Android
    /// 16), else `ro.build.version.sdk`.
    pub api: String,
}

impl DeviceInfo {
    /// From what `getprop` answers, with the instance name kept in
    /// `state_dir` (made there the first time) so that a restarted daemon,
    /// and a separate pairing process, announce the same name. Without a
    /// state directory (or when it cannot be written) the suffix is new for
    /// this process, and a warning says so.
    pub fn from_properties(props: &Properties, state_dir: Option<&Path>) -> DeviceInfo {
        let serial = props.get("ro.serialno").unwrap_or_default();
        DeviceInfo {
            instance: instance_name(serial, state_dir),
            model: props.get("ro.product.model").unwrap_or_default().into(),
            api: props
                .get("ro.build.version.sdk_full")
                .or_else(|| props.get("ro.build.version.sdk"))
                .unwrap_or_default()
                .into(),
        }
    }

    #[cfg(feature = "mdns")]
    fn txt(&self) -> Vec<(&'static str, String)> {
        // adbd leaves out a record longer than a TXT string may be (255).
        [
            ("v", SERVICE_VERSION.to_string()),
            ("name", self.model.clone()),
            ("api", self.api.clone()),
        ]
        .into_iter()
        .filter(|(key, value)| key.len() + 1 + value.len() <= 255)
        .collect()
    }
}

/// `adb-<serial>-<suffix>`, read from `<state_dir>/mdns-instance` when it is
/// there and still names this serial, else made and saved there.
pub fn instance_name(serial: &str, state_dir: Option<&Path>) -> String {
    // adbd uses 16 random alphanumerics when the device has no serial.
    let serial: String = serial
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    let serial = if serial.is_empty() {
        random_alphanumeric(16)
    } else {
        serial
    };
    let prefix = format!("adb-{serial}-");
    let Some(dir) = state_dir else {
        return format!("{prefix}{}", random_alphanumeric(6));
    };
    let path = dir.join(INSTANCE_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let name = text.trim();
        // A DNS label is at most 63 bytes; a name for another serial (the
        // config changed) is made anew, as adbd's GUID would be on a new device.
        if name.starts_with(&prefix) && name.len() <= 63 && name.len() == prefix.len() + 6 {
            return name.to_string();
        }
    }
    let name = format!("{prefix}{}", random_alphanumeric(6));
    if let Err(error) = save(&path, &name) {
        tracing::warn!(
            path = %path.display(),
            %error,
            "could not keep the mDNS instance name {name}: it changes at the next start"
        );
    }
    name
}

/// Written beside, then renamed over, so that a reader never sees half a name.
fn save(path: &Path, name: &str) -> std::io::Result<()> {
    let mut temp = PathBuf::from(path);
    temp.set_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&temp, format!("{name}\n"))?;
    std::fs::rename(&temp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&temp);
    })
}

fn random_alphanumeric(len: usize) -> String {
    const CHARS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut name = String::with_capacity(len);
    while name.len() < len {
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes).expect("the OS random number generator works");
        // 248 = 4 x 62: larger bytes are dropped, so every character is as likely.
        name.extend(
            bytes
                .iter()
                .filter(|&&b| b < 248)
                .map(|&b| CHARS[usize::from(b) % CHARS.len()] as char)
                .take(len - name.len()),
        );
    }
    name
}

#[cfg(feature = "mdns")]
/// The process's responder, started at the first announcement.
fn responder() -> Result<&'static ServiceDaemon, MdnsError> {
    static RESPONDER: OnceLock<Result<ServiceDaemon, String>> = OnceLock::new();
    RESPONDER
        .get_or_init(|| {
            let daemon = ServiceDaemon::new().map_err(|e| e.to_string())?;
            // Never on loopback: what it announces is for other machines, and
            // a loopback-only service is announced nowhere (see `Where`).
            daemon
                .disable_interface(vec![IfKind::LoopbackV4, IfKind::LoopbackV6])
                .map_err(|e| e.to_string())?;
            Ok(daemon)
        })
        .as_ref()
        .map_err(|cause| MdnsError::Start(cause.clone()))
}

/// Where a service listening on `local` is announced: the interface holding
/// its address, or every non-loopback interface of its family for a
/// wildcard address; nowhere for a loopback address, which no other machine
/// can reach (announcing it would only tell the network the device exists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Where {
    Nowhere,
    /// `0.0.0.0`: every IPv4 interface but loopback.
    AllV4,
    /// `::` (dual-stack on Linux unless `bindv6only`): every interface but loopback.
    All,
    /// The interface that has this address.
    Address(IpAddr),
}

impl Where {
    pub fn of(local: IpAddr) -> Where {
        let local = match local {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(local),
            v4 => v4,
        };
        if local.is_loopback() {
            Where::Nowhere
        } else if local.is_unspecified() {
            if local.is_ipv4() {
                Where::AllV4
            } else {
                Where::All
            }
        } else {
            Where::Address(local)
        }
    }
}

#[cfg(feature = "mdns")]
/// One announced service; withdrawn (a goodbye packet, TTL 0) when dropped.
pub struct Announcement {
    daemon: &'static ServiceDaemon,
    fullname: String,
}

#[cfg(feature = "mdns")]
impl Announcement {
    /// `INSTANCE._service._tcp.local.`
    pub fn fullname(&self) -> &str {
        &self.fullname
    }
}

#[cfg(feature = "mdns")]
impl Drop for Announcement {
    fn drop(&mut self) {
        match self.daemon.unregister(&self.fullname) {
            // The responder answers once the goodbye went out; waiting for it
            // lets a process that exits next still withdraw the service.
            Ok(status) => match status.recv_timeout(GOODBYE_WAIT) {
                Ok(UnregisterStatus::OK) => {
                    tracing::info!(service = %self.fullname, "mDNS: withdrawn")
                }
                other => tracing::warn!(
                    service = %self.fullname,
                    "mDNS: withdrawing: no goodbye sent ({other:?})"
                ),
            },
            Err(error) => {
                tracing::warn!(service = %self.fullname, %error, "mDNS: withdrawing failed")
            }
        }
    }
}

#[cfg(feature = "mdns")]
/// Announces `service` for `device` on `port` at `place`; `None` for
/// [`Where::Nowhere`].
pub fn announce(
    service: &'static str,
    device: &DeviceInfo,
    port: u16,
    place: &Where,
) -> Result<Option<Announcement>, MdnsError> {
    let error = |cause: String| MdnsError::Announce {
        service,
        instance: device.instance.clone(),
        port,
        cause,
    };
    let (addresses, interfaces): (Vec<IpAddr>, Vec<IfKind>) = match place {
        Where::Nowhere => return Ok(None),
        Where::Address(ip) => (vec![*ip], vec![IfKind::Addr(*ip)]),
        Where::AllV4 => (
            Vec::new(),
            vec![IfKind::Predicate(IfPredicate::new(|i| {
                i.ip().is_ipv4() && !i.is_loopback()
            }))],
        ),
        Where::All => (
            Vec::new(),
            vec![IfKind::Predicate(IfPredicate::new(|i| !i.is_loopback()))],
        ),
    };
    let daemon = responder()?;
    let mut info = ServiceInfo::new(
        service,
        &device.instance,
        &host_name(),
        addresses.as_slice(),
        port,
        device.txt().as_slice(),
    )
    .map_err(|e| error(e.to_string()))?;
    if matches!(place, Where::AllV4 | Where::All) {
        info = info.enable_addr_auto();
    }
    info.set_interfaces(interfaces);
    let fullname = info.get_fullname().to_string();
    daemon.register(info).map_err(|e| error(e.to_string()))?;
    tracing::info!(service = %fullname, port, at = ?place, "mDNS: announced");
    Ok(Some(Announcement { daemon, fullname }))
}

#[cfg(feature = "mdns")]
/// The seam for pairing: announces `_adb-tls-pairing._tcp` for `port` (the
/// pairing server's, on `place`) while the guard lives, i.e. while the
/// pairing window is open, and withdraws it when the guard is dropped.
/// Works in any process (a separate `oxadbd pair` starts its own responder);
/// `device` from [`DeviceInfo::from_properties`] with the daemon's state
/// directory gives the daemon's instance name, which hosts expect.
pub fn announce_pairing(
    port: u16,
    place: &Where,
    device: &DeviceInfo,
) -> Result<Option<Announcement>, MdnsError> {
    announce(SERVICE_TLS_PAIRING, device, port, place)
}

#[cfg(feature = "mdns")]
/// The daemon's TCP listener announced (`_adb._tcp` and
/// `_adb-tls-connect._tcp`, as adbd with wireless debugging on), following
/// it when a host moves it (`tcpip:PORT`) or closes it (`usb:`).
pub struct ConnectAnnouncer {
    device: DeviceInfo,
    /// `_adb-tls-connect._tcp` promises TLS: not announced with `--tls off`.
    tls_offered: bool,
    current: Mutex<Vec<Announcement>>,
}

#[cfg(feature = "mdns")]
impl ConnectAnnouncer {
    pub fn new(device: DeviceInfo, tls_offered: bool) -> ConnectAnnouncer {
        ConnectAnnouncer {
            device,
            tls_offered,
            current: Mutex::new(Vec::new()),
        }
    }

    /// The listener is now at `local` (`None`: closed). Failures are logged:
    /// a daemon without mDNS still serves.
    pub fn listening(&self, local: Option<SocketAddr>) {
        let Ok(mut current) = self.current.lock() else {
            return;
        };
        // Goodbyes for the old port first, so no browser keeps both.
        current.clear();
        let Some(local) = local else { return };
        let place = Where::of(local.ip());
        if place == Where::Nowhere {
            tracing::info!(
                %local,
                "mDNS: nothing announced: the listener is on loopback, which no other \
                 machine reaches"
            );
            return;
        }
        let services: &[&str] = if self.tls_offered {
            &[SERVICE_TCP, SERVICE_TLS_CONNECT]
        } else {
            &[SERVICE_TCP]
        };
        for &service in services {
            match announce(service, &self.device, local.port(), &place) {
                Ok(Some(announcement)) => current.push(announcement),
                Ok(None) => {}
                Err(error) => tracing::warn!("mDNS: {error}; the daemon serves unannounced"),
            }
        }
    }
}

#[cfg(feature = "mdns")]
/// `<host name>.local.`, as mdnsd names the device's address records.
fn host_name() -> String {
    let uname = rustix::system::uname();
    let node = uname.nodename().to_string_lossy();
    let label: String = node
        .split('.')
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(63)
        .collect();
    let label = if label.is_empty() {
        "oxadbd".to_string()
    } else {
        label
    };
    format!("{label}.local.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn where_follows_the_listen_address() {
        assert_eq!(Where::of("127.0.0.1".parse().unwrap()), Where::Nowhere);
        assert_eq!(Where::of("::1".parse().unwrap()), Where::Nowhere);
        assert_eq!(
            Where::of("::ffff:127.0.0.1".parse().unwrap()),
            Where::Nowhere
        );
        assert_eq!(Where::of("0.0.0.0".parse().unwrap()), Where::AllV4);
        assert_eq!(Where::of("::".parse().unwrap()), Where::All);
        assert_eq!(
            Where::of("198.18.0.1".parse().unwrap()),
            Where::Address("198.18.0.1".parse().unwrap())
        );
        assert_eq!(
            Where::of("::ffff:198.18.0.1".parse().unwrap()),
            Where::Address("198.18.0.1".parse().unwrap())
        );
    }

    #[test]
    fn instance_name_is_kept_in_the_state_dir() {
        let dir = tempfile::tempdir().unwrap();
        let first = instance_name("0123abcd", Some(dir.path()));
        assert!(first.starts_with("adb-0123abcd-"), "{first}");
        assert_eq!(first.len(), "adb-0123abcd-".len() + 6);
        assert!(first[13..].chars().all(|c| c.is_ascii_alphanumeric()));
        // Another process (a restart, `oxadbd pair`) reads the same name.
        assert_eq!(instance_name("0123abcd", Some(dir.path())), first);
        // A new serial makes a new name.
        let other = instance_name("ffff", Some(dir.path()));
        assert!(other.starts_with("adb-ffff-"), "{other}");
        assert_eq!(instance_name("ffff", Some(dir.path())), other);
        // Without a state dir: new each time; no serial: 16 random characters.
        let bare = instance_name("", None);
        assert_eq!(bare.len(), 4 + 16 + 1 + 6, "{bare}");
    }

    #[cfg(feature = "mdns")]
    #[test]
    fn txt_records_are_adbds() {
        let mut props = Properties::default();
        props.0.insert("ro.serialno".into(), "SER1".into());
        props.0.insert("ro.product.model".into(), "Board X".into());
        props.0.insert("ro.build.version.sdk".into(), "31".into());
        let device = DeviceInfo::from_properties(&props, None);
        assert!(device.instance.starts_with("adb-SER1-"));
        assert_eq!(
            device.txt(),
            vec![
                ("v", "1".to_string()),
                ("name", "Board X".to_string()),
                ("api", "31".to_string())
            ]
        );
        props
            .0
            .insert("ro.build.version.sdk_full".into(), "36.1".into());
        assert_eq!(DeviceInfo::from_properties(&props, None).api, "36.1");
    }
}
