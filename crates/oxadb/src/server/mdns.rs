//! mDNS discovery, as Google's adb server does it (AOSP
//! `client/transport_mdns.cpp`, `client/mdns_tracker.cpp`): the three adb
//! services are browsed for (`_adb._tcp`, `_adb-tls-connect._tcp`,
//! `_adb-tls-pairing._tcp`, names in `oxadb_wire::mdns`), what is seen is
//! kept for `mdns:services`, `track-mdns-services`, `pair:` and
//! `connect:` by service name, and a device this host paired with
//! (`~/.android/adb_known_hosts.pb`) is connected when its TLS connect
//! service appears.
//!
//! `mdns-sd`'s daemon runs in a thread of its own; one more thread per
//! service type turns its events into changes here. `ADB_MDNS=0` turns
//! discovery off and `ADB_MDNS_AUTO_CONNECT` chooses what is connected by
//! itself, as for adb (AOSP `client/mdns_utils.cpp`, `adb_mdns.cpp`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};

use mdns_sd::{ServiceDaemon, ServiceEvent};
use oxadb_auth::KnownHosts;
use oxadb_wire::mdns::{
    short_type, InstanceName, SERVICES, SERVICE_TCP, SERVICE_TLS_CONNECT, SERVICE_TLS_PAIRING,
};
use prost::Message as _;
use tokio::sync::watch;

use super::proto;
use super::registry::Registry;

/// What `mdns:check` answers with discovery off (AOSP mdns_check).
pub const DISABLED: &str = "ERROR: mdns discovery disabled";

/// One service seen, as adb keeps it (AOSP `client/discovered_services.h`
/// ServiceInfo).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// `adb-SERIAL-abc123`.
    pub instance: String,
    /// `_adb-tls-connect._tcp`, without the domain.
    pub service: String,
    pub v4: Option<Ipv4Addr>,
    pub v6: Vec<Ipv6Addr>,
    pub port: u16,
    /// `host.local.`
    pub hostname: String,
    pub txt: BTreeMap<String, String>,
}

impl Service {
    /// `INSTANCE.SERVICE`: the serial adb gives a device connected through
    /// mDNS (AOSP `socket_spec.cpp`).
    pub fn name(&self) -> String {
        format!("{}.{}", self.instance, self.service)
    }

    /// `IP:PORT` of its IPv4 address: adb connects over IPv4 only.
    pub fn v4_address(&self) -> Option<String> {
        self.v4.map(|ip| format!("{ip}:{}", self.port))
    }
}

/// Which services are connected as soon as they are seen
/// (`ADB_MDNS_AUTO_CONNECT`: unset, `adb-tls-connect`; `0` none; `all`
/// `_adb._tcp` too; else a comma-separated list of service names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoConnect {
    pub plain: bool,
    pub tls: bool,
}

impl AutoConnect {
    pub fn from_env(value: Option<&str>) -> AutoConnect {
        let default = AutoConnect {
            plain: false,
            tls: true,
        };
        match value {
            None => default,
            Some("0") => AutoConnect {
                plain: false,
                tls: false,
            },
            Some("all") => AutoConnect {
                plain: true,
                tls: true,
            },
            Some(list) => {
                let named = |name: &str| list.split(',').any(|item| item == name);
                let chosen = AutoConnect {
                    plain: named("adb"),
                    tls: named("adb-tls-connect"),
                };
                // A list naming nothing adb knows leaves the default.
                if chosen.plain || chosen.tls {
                    chosen
                } else {
                    default
                }
            }
        }
    }

    /// Whether `service` is connected when seen; the TLS one only for a
    /// device this host paired with, and never an emulator's (adb connects
    /// those through their console ports).
    pub fn wants(&self, service: &Service, known: &KnownHosts) -> bool {
        if service.instance.starts_with("adb-EMULATOR") || service.v4.is_none() {
            return false;
        }
        match service.service.as_str() {
            s if s == short_type(SERVICE_TCP) => self.plain,
            s if s == short_type(SERVICE_TLS_CONNECT) => {
                self.tls && known.is_known(&service.instance)
            }
            _ => false,
        }
    }
}

/// The services seen, keyed by type and instance.
type Seen = BTreeMap<(String, String), Service>;

/// The server's discovery: what is seen now, and a counter that moves at
/// every change (for `track-mdns-services`).
pub struct Discovery {
    seen: Mutex<Seen>,
    changed: watch::Sender<u64>,
    /// `None` when off (`ADB_MDNS=0`) or when the daemon did not start.
    daemon: Option<ServiceDaemon>,
}

impl Discovery {
    /// Discovery off: nothing is seen, `mdns:check` says so.
    pub fn off() -> Arc<Discovery> {
        Arc::new(Discovery {
            seen: Mutex::new(Seen::new()),
            changed: watch::Sender::new(0),
            daemon: None,
        })
    }

    /// Starts browsing, unless `ADB_MDNS=0`; devices are auto-connected
    /// into `registry`. Must run inside the server's runtime, which the
    /// connections are spawned on.
    pub fn start(registry: Arc<Registry>) -> Arc<Discovery> {
        if std::env::var("ADB_MDNS").is_ok_and(|v| v == "0") {
            tracing::info!("mDNS discovery off (ADB_MDNS=0)");
            return Discovery::off();
        }
        let auto = AutoConnect::from_env(std::env::var("ADB_MDNS_AUTO_CONNECT").ok().as_deref());
        let daemon = match ServiceDaemon::new() {
            Ok(daemon) => daemon,
            Err(error) => {
                tracing::warn!(%error, "mDNS discovery could not start");
                return Discovery::off();
            }
        };
        let mut receivers = Vec::new();
        for service in SERVICES {
            match daemon.browse(service) {
                Ok(receiver) => receivers.push(receiver),
                Err(error) => tracing::warn!(service, %error, "mDNS: cannot browse"),
            }
        }
        let discovery = Arc::new(Discovery {
            seen: Mutex::new(Seen::new()),
            changed: watch::Sender::new(0),
            daemon: Some(daemon),
        });
        let runtime = tokio::runtime::Handle::current();
        let known = KnownHosts::load_default().ok();
        for receiver in receivers {
            let discovery = Arc::downgrade(&discovery);
            let registry = Arc::downgrade(&registry);
            let runtime = runtime.clone();
            let known = known.clone();
            // Ends when the daemon shuts down (the channel closes) or
            // the server is gone.
            let spawned = std::thread::Builder::new()
                .name("mdns-browse".into())
                .spawn(move || {
                    while let Ok(event) = receiver.recv() {
                        let Some(discovery) = discovery.upgrade() else {
                            return;
                        };
                        let Some(seen) = discovery.apply(event) else {
                            continue;
                        };
                        let (Some(known), Some(registry)) = (&known, registry.upgrade()) else {
                            continue;
                        };
                        if auto.wants(&seen, known) {
                            runtime.spawn(auto_connect(registry, seen));
                        }
                    }
                });
            if let Err(error) = spawned {
                tracing::warn!(%error, "mDNS: no thread to browse with");
            }
        }
        tracing::info!("mDNS discovery started");
        discovery
    }

    fn lock(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one event; the service when one was added or changed.
    fn apply(&self, event: ServiceEvent) -> Option<Service> {
        match event {
            ServiceEvent::ServiceResolved(resolved) => {
                let ty = short_type(&resolved.ty_domain).to_string();
                let instance = instance_of(&resolved.fullname, &resolved.ty_domain);
                let mut v4 = None;
                let mut v6 = Vec::new();
                for address in &resolved.addresses {
                    match address.to_ip_addr() {
                        // The lowest, so that the choice is stable.
                        IpAddr::V4(ip) => v4 = Some(v4.map_or(ip, |old: Ipv4Addr| old.min(ip))),
                        IpAddr::V6(ip) => v6.push(ip),
                    }
                }
                v6.sort();
                let txt = resolved
                    .txt_properties
                    .iter()
                    .map(|p| (p.key().to_string(), p.val_str().to_string()))
                    .collect();
                let service = Service {
                    instance,
                    service: ty.clone(),
                    v4,
                    v6,
                    port: resolved.port,
                    hostname: resolved.host.clone(),
                    txt,
                };
                let key = (ty, service.instance.clone());
                let updated = {
                    let mut seen = self.lock();
                    if seen.get(&key) == Some(&service) {
                        false
                    } else {
                        seen.insert(key, service.clone());
                        true
                    }
                };
                if !updated {
                    return None;
                }
                tracing::info!(name = %service.name(), address = ?service.v4_address(), "mDNS: seen");
                self.changed.send_modify(|n| *n += 1);
                Some(service)
            }
            ServiceEvent::ServiceRemoved(ty, fullname) => {
                let key = (short_type(&ty).to_string(), instance_of(&fullname, &ty));
                if self.lock().remove(&key).is_some() {
                    tracing::info!(name = %format!("{}.{}", key.1, key.0), "mDNS: gone");
                    self.changed.send_modify(|n| *n += 1);
                }
                None
            }
            _ => None,
        }
    }

    /// Whether discovery runs.
    pub fn is_on(&self) -> bool {
        self.daemon.is_some()
    }

    /// `mdns:check` (AOSP mdns_check): adb's words, with this backend's name.
    pub fn check(&self) -> String {
        match self.daemon {
            Some(_) => "mdns daemon version [oxadb mdns-sd discovery 0.21]".to_string(),
            None => DISABLED.to_string(),
        }
    }

    /// Every service seen, by type then instance.
    pub fn services(&self) -> Vec<Service> {
        self.lock().values().cloned().collect()
    }

    /// Changes from now on.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The service `name` (`INSTANCE.SERVICE._tcp[.local.]`) names, of
    /// type `wanted` when the name gives no type (AOSP
    /// mdns_get_connect_service_info, mdns_get_pairing_service_info).
    pub fn find(&self, name: &str, wanted: Option<&str>) -> Option<Service> {
        let parsed = InstanceName::parse(name)?;
        let ty = match wanted {
            Some(ty) => short_type(ty).to_string(),
            None if parsed.service.is_empty() => return None,
            None => parsed.service_type(),
        };
        self.lock().get(&(ty, parsed.instance.to_string())).cloned()
    }

    /// The pairing service of instance `name`, for `pair:NAME`.
    pub fn pairing_service(&self, name: &str) -> Option<Service> {
        self.find(name, Some(SERVICE_TLS_PAIRING))
    }

    /// The TLS connect service of `guid`, which a new pairing connects.
    pub fn connect_service(&self, guid: &str) -> Option<Service> {
        self.find(guid, Some(SERVICE_TLS_CONNECT))
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        if let Some(daemon) = &self.daemon {
            // Closes the browse channels, which ends their threads.
            let _ = daemon.shutdown();
        }
    }
}

/// `INSTANCE` of `INSTANCE.TYPE`.
fn instance_of(fullname: &str, ty: &str) -> String {
    fullname
        .strip_suffix(ty)
        .and_then(|rest| rest.strip_suffix('.'))
        .unwrap_or(fullname)
        .to_string()
}

/// Connects a service seen over mDNS under its name (AOSP
/// RequestConnectToDevice); the registry skips one already connected.
pub async fn auto_connect(registry: Arc<Registry>, service: Service) {
    let Some(address) = service.v4_address() else {
        return;
    };
    let answer = registry.connect_at(service.name(), address).await;
    tracing::info!(name = %service.name(), %answer, "mDNS: auto-connect");
}

/// `mdns:services`' text (AOSP mdns_list_discovered_services): one line a
/// service, `INSTANCE\tSERVICE\tIP:PORT`.
pub fn services_text(services: &[Service]) -> String {
    services
        .iter()
        .map(|s| {
            let ip = s.v4.map(|ip| ip.to_string()).unwrap_or_default();
            format!("{}\t{}\t{ip}:{}\n", s.instance, s.service, s.port)
        })
        .collect()
}

/// `track-mdns-services`' message: `adb.proto.MdnsServices` (AOSP
/// `proto/adb_host.proto`, `client/mdns_tracker.cpp` list_mdns_services):
/// `_adb._tcp` services in field 1, TLS connect ones in 2 (with
/// `known_device`), pairing ones in 3, each wrapping an `MdnsService`.
/// As adb's C++ protobuf writes it: fields in number order (all `_adb._tcp`
/// services first), empty strings, zero and false left out.
pub fn services_proto(services: &[Service], known: &dyn Fn(&str) -> bool) -> Vec<u8> {
    let mut message = proto::MdnsServices::default();
    for s in services {
        let txt = |key: &str| s.txt.get(key).cloned().unwrap_or_default();
        let service = Some(proto::MdnsService {
            instance_name: s.instance.clone(),
            service_name: s.service.clone(),
            ipv4: s.v4.map(|ip| ip.to_string()).unwrap_or_default(),
            ipv6: s.v6.iter().map(ToString::to_string).collect(),
            port: u32::from(s.port),
            product_model: txt("name"),
            build_version_sdk_full: txt("api"),
            given_name: txt("given_name"),
            serial: txt("serial"),
            mdns_version: s.txt.get("v").cloned().unwrap_or_else(|| "1".into()),
            hostname: s.hostname.clone(),
        });
        match s.service.as_str() {
            t if t == short_type(SERVICE_TCP) => {
                message.services.push(proto::AdbService { service })
            }
            t if t == short_type(SERVICE_TLS_CONNECT) => {
                message
                    .tls_connect_services
                    .push(proto::AdbSecureConnectService {
                        service,
                        known_device: known(&s.instance),
                    })
            }
            t if t == short_type(SERVICE_TLS_PAIRING) => message
                .pairing_services
                .push(proto::AdbSecurePairingService { service }),
            _ => {}
        }
    }
    message.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(instance: &str, ty: &str, ip: &str, port: u16) -> Service {
        Service {
            instance: instance.to_string(),
            service: ty.to_string(),
            v4: ip.parse().ok(),
            v6: Vec::new(),
            port,
            hostname: "board.local.".to_string(),
            txt: [("v", "1"), ("name", "Board"), ("api", "31")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn services_are_adbs_lines() {
        let list = vec![
            service("adb-S-abc123", "_adb-tls-connect._tcp", "198.18.0.1", 5555),
            service("adb-S-abc123", "_adb._tcp", "198.18.0.1", 5555),
        ];
        assert_eq!(
            services_text(&list),
            "adb-S-abc123\t_adb-tls-connect._tcp\t198.18.0.1:5555\n\
             adb-S-abc123\t_adb._tcp\t198.18.0.1:5555\n"
        );
        assert_eq!(services_text(&[]), "");
        assert_eq!(list[0].name(), "adb-S-abc123._adb-tls-connect._tcp");
        assert_eq!(list[0].v4_address().unwrap(), "198.18.0.1:5555");
    }

    #[test]
    fn tracking_message_is_mdns_services() {
        let list = vec![
            service("adb-S-abc123", "_adb-tls-connect._tcp", "198.18.0.1", 5555),
            service("adb-S-abc123", "_adb-tls-pairing._tcp", "198.18.0.1", 37000),
        ];
        let bytes = services_proto(&list, &|instance| instance == "adb-S-abc123");
        // Byte for byte what adb writes (fields in number order, proto3
        // defaults left out): field 2 then field 3, each wrapping a service.
        let golden = [
            &b"\x12T\x0aP\x0a\x0cadb-S-abc123\x12\x15_adb-tls-connect._tcp\x22\x0a198.18.0.10\xb3+:\x05BoardB\x0231Z\x011b\x0cboard.local.\x10\x01"[..],
            &b"\x1aS\x0aQ\x0a\x0cadb-S-abc123\x12\x15_adb-tls-pairing._tcp\x22\x0a198.18.0.10\x88\xa1\x02:\x05BoardB\x0231Z\x011b\x0cboard.local."[..],
        ]
        .concat();
        assert_eq!(bytes, golden);
        let message = proto::MdnsServices::decode(bytes.as_slice()).unwrap();
        assert!(message.services.is_empty());
        let [tls] = message.tls_connect_services.as_slice() else {
            panic!("one TLS connect service: {message:?}");
        };
        assert!(tls.known_device);
        let inner = tls.service.as_ref().unwrap();
        assert_eq!(inner.instance_name, "adb-S-abc123");
        assert_eq!(inner.service_name, "_adb-tls-connect._tcp");
        assert_eq!(inner.ipv4, "198.18.0.1");
        assert_eq!(inner.port, 5555);
        assert_eq!(inner.product_model, "Board");
        assert_eq!(inner.build_version_sdk_full, "31");
        assert_eq!(inner.mdns_version, "1");
        assert_eq!(inner.hostname, "board.local.");
        // A pairing service has no known_device.
        let [pair] = message.pairing_services.as_slice() else {
            panic!("one pairing service: {message:?}");
        };
        assert_eq!(pair.service.as_ref().unwrap().port, 37000);
    }

    #[test]
    fn auto_connect_follows_adbs_variable_and_the_known_hosts() {
        assert_eq!(
            AutoConnect::from_env(None),
            AutoConnect {
                plain: false,
                tls: true
            }
        );
        assert_eq!(
            AutoConnect::from_env(Some("0")),
            AutoConnect {
                plain: false,
                tls: false
            }
        );
        assert_eq!(
            AutoConnect::from_env(Some("adb")),
            AutoConnect {
                plain: true,
                tls: false
            }
        );
        assert_eq!(
            AutoConnect::from_env(Some("nonsense")),
            AutoConnect::from_env(None)
        );
        let dir = tempfile::tempdir().unwrap();
        let known = KnownHosts::at(dir.path().join("known.pb"));
        known.add("adb-S-abc123").unwrap();
        let all = AutoConnect::from_env(Some("all"));
        let tls = service("adb-S-abc123", "_adb-tls-connect._tcp", "198.18.0.1", 5555);
        assert!(all.wants(&tls, &known));
        let stranger = service("adb-T-zzzzzz", "_adb-tls-connect._tcp", "198.18.0.1", 5555);
        assert!(!all.wants(&stranger, &known));
        let plain = service("adb-T-zzzzzz", "_adb._tcp", "198.18.0.1", 5555);
        assert!(all.wants(&plain, &known));
        assert!(!AutoConnect::from_env(None).wants(&plain, &known));
        let emulator = service("adb-EMULATOR1", "_adb._tcp", "198.18.0.1", 5555);
        assert!(!all.wants(&emulator, &known));
        let pairing = service("adb-S-abc123", "_adb-tls-pairing._tcp", "198.18.0.1", 1);
        assert!(!all.wants(&pairing, &known));
        let no_v4 = service("adb-S-abc123", "_adb-tls-connect._tcp", "", 5555);
        assert!(!all.wants(&no_v4, &known));
    }

    #[test]
    fn events_update_what_is_seen() {
        let discovery = Discovery::off();
        let changes = discovery.changes();
        let seen = service("adb-S-abc123", "_adb-tls-pairing._tcp", "198.18.0.1", 37000);
        discovery
            .lock()
            .insert((seen.service.clone(), seen.instance.clone()), seen.clone());
        assert_eq!(
            discovery.pairing_service("adb-S-abc123"),
            Some(seen.clone())
        );
        assert_eq!(
            discovery.find("adb-S-abc123._adb-tls-pairing._tcp.local.", None),
            Some(seen.clone())
        );
        assert_eq!(discovery.connect_service("adb-S-abc123"), None);
        assert_eq!(discovery.find("adb-S-abc123", None), None);
        discovery.apply(ServiceEvent::ServiceRemoved(
            SERVICE_TLS_PAIRING.to_string(),
            format!("adb-S-abc123.{SERVICE_TLS_PAIRING}"),
        ));
        assert!(discovery.services().is_empty());
        assert!(changes.has_changed().unwrap());
        assert_eq!(discovery.check(), DISABLED);
    }
}
