//! adb's mDNS (DNS-SD) names, shared by the daemon that announces them and
//! the host server that browses for them (AOSP `adb_mdns.h`,
//! `client/mdns_utils.cpp`).

/// The plain TCP service (AOSP `ADB_SERVICE_TCP`), fully qualified.
pub const SERVICE_TCP: &str = "_adb._tcp.local.";
/// The TLS connect service (`ADB_SERVICE_TLS`).
pub const SERVICE_TLS_CONNECT: &str = "_adb-tls-connect._tcp.local.";
/// The pairing service (`ADB_SERVICE_PAIR`).
pub const SERVICE_TLS_PAIRING: &str = "_adb-tls-pairing._tcp.local.";
/// Every service adb knows, in adb's index order (`kADBDNSServices`).
pub const SERVICES: [&str; 3] = [SERVICE_TCP, SERVICE_TLS_PAIRING, SERVICE_TLS_CONNECT];
/// The `v` TXT record: `ADB_SECURE_SERVICE_VERSION`.
pub const SERVICE_VERSION: &str = "1";
/// The domain every service is in.
pub const DOMAIN: &str = "local";

/// A fully qualified service type without its domain, as adb prints and
/// matches it: `_adb-tls-connect._tcp.local.` is `_adb-tls-connect._tcp`.
pub fn short_type(service: &str) -> &str {
    let service = service.strip_suffix('.').unwrap_or(service);
    service.strip_suffix(".local").unwrap_or(service)
}

/// An mDNS name split as adb splits it (`mdns_parse_instance_name`):
/// `<instance>.<service>.<transport>[.local[.]]`, e.g.
/// `adb-SER-abc123._adb-tls-connect._tcp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceName<'a> {
    pub instance: &'a str,
    /// `_adb-tls-connect`; empty for a bare name.
    pub service: &'a str,
    /// `_tcp` or `_udp`; empty for a bare name.
    pub transport: &'a str,
}

impl<'a> InstanceName<'a> {
    /// `None` for a name that ends like a service name but has nothing
    /// before it; a name without `._tcp`/`._udp` (nor `.local`) is a bare
    /// instance name.
    pub fn parse(name: &'a str) -> Option<InstanceName<'a>> {
        if name.is_empty() {
            return None;
        }
        let mut rest = name;
        let mut has_local = false;
        let local = if rest.ends_with('.') {
            ".local."
        } else {
            ".local"
        };
        if let Some(stripped) = rest.strip_suffix(local) {
            if stripped.is_empty() {
                return None;
            }
            rest = stripped;
            has_local = true;
        }
        let dot = if !has_local && rest.ends_with('.') {
            "."
        } else {
            ""
        };
        let mut transport = "";
        for candidate in ["_tcp", "_udp"] {
            if let Some(stripped) = rest.strip_suffix(&format!(".{candidate}{dot}")) {
                if stripped.is_empty() {
                    return None;
                }
                rest = stripped;
                transport = candidate;
                break;
            }
        }
        if transport.is_empty() {
            if has_local {
                return None;
            }
            return Some(InstanceName {
                instance: rest,
                service: "",
                transport: "",
            });
        }
        let at = rest.rfind('.')?;
        if at == 0 || at == rest.len() - 1 {
            return None;
        }
        Some(InstanceName {
            instance: &rest[..at],
            service: &rest[at + 1..],
            transport,
        })
    }

    /// `<service>.<transport>`, as [`short_type`] gives it; empty for a
    /// bare name.
    pub fn service_type(&self) -> String {
        if self.service.is_empty() {
            String::new()
        } else {
            format!("{}.{}", self.service, self.transport)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_types_are_adbs() {
        assert_eq!(short_type(SERVICE_TLS_CONNECT), "_adb-tls-connect._tcp");
        assert_eq!(short_type("_adb._tcp.local"), "_adb._tcp");
        assert_eq!(short_type("_adb._tcp"), "_adb._tcp");
    }

    #[test]
    fn names_split_as_adbs() {
        let parsed = InstanceName::parse("adb-SER-abc123._adb-tls-connect._tcp").unwrap();
        assert_eq!(parsed.instance, "adb-SER-abc123");
        assert_eq!(parsed.service, "_adb-tls-connect");
        assert_eq!(parsed.transport, "_tcp");
        assert_eq!(parsed.service_type(), "_adb-tls-connect._tcp");
        for name in [
            "adb-SER-abc123._adb-tls-connect._tcp.local.",
            "adb-SER-abc123._adb-tls-connect._tcp.local",
            "adb-SER-abc123._adb-tls-connect._tcp.",
        ] {
            assert_eq!(InstanceName::parse(name), Some(parsed.clone()), "{name}");
        }
        // Dots in the instance stay in it.
        let dotted = InstanceName::parse("my.device._adb._tcp").unwrap();
        assert_eq!(dotted.instance, "my.device");
        assert_eq!(dotted.service, "_adb");
        // A bare name is an instance name.
        let bare = InstanceName::parse("adb-SER-abc123").unwrap();
        assert_eq!(bare.instance, "adb-SER-abc123");
        assert_eq!(bare.service_type(), "");
        // An address is a bare name too (callers try addresses first).
        assert_eq!(
            InstanceName::parse("10.0.0.1:5555").unwrap().instance,
            "10.0.0.1:5555"
        );
        for bad in [
            "",
            ".local",
            "._tcp",
            "x.local",
            "._adb._tcp",
            "adb._tcp",
            "x._tcp.local",
        ] {
            assert_eq!(InstanceName::parse(bad), None, "{bad}");
        }
    }
}
