//! The server's socket as adb's `-L SOCKET` names it (AOSP `socket_spec.cpp`
//! parse_tcp_socket_spec and socket_spec_listen): `tcp:PORT`,
//! `tcp:localhost:PORT` or `tcp:[::1]:PORT`. adb's server listens on no
//! other host name, and neither does this one.

/// Which loopback (or, with `-a`, every) address a `tcp:` spec means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenHost {
    /// `tcp:PORT`: 127.0.0.1 (::1 where IPv4 is unavailable); with `-a`,
    /// every interface, IPv6 and IPv4.
    Unnamed,
    /// `tcp:localhost:PORT`: 127.0.0.1 as above, whatever `-a` says.
    Localhost,
    /// `tcp:[::1]:PORT` (or `tcp:::1`): ::1 alone.
    Ipv6Loopback,
}

/// A parsed `-L` spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenSpec {
    pub host: ListenHost,
    pub port: u16,
}

/// The port a `tcp:HOST` spec without one gets (AOSP
/// DEFAULT_ADB_LOCAL_TRANSPORT_PORT, which parse_tcp_socket_spec uses).
const PORT_WHEN_NONE: u16 = 5555;

impl ListenSpec {
    /// `tcp:PORT` (adb's spec when only a port is given).
    pub fn port(port: u16) -> ListenSpec {
        ListenSpec {
            host: ListenHost::Unnamed,
            port,
        }
    }

    /// Parses `spec`; `Err` is adb's reason where adb has one.
    pub fn parse(spec: &str) -> Result<ListenSpec, String> {
        let Some(after) = spec.strip_prefix("tcp:") else {
            return Err(if spec.contains(':') {
                format!("'{spec}': oxadb server listens on tcp: sockets only")
            } else {
                format!("unknown socket specification: {spec}")
            });
        };
        if after.is_empty() {
            return Err("string after tcp specification is empty".to_string());
        }
        if let Ok(port) = after.parse::<i64>() {
            return u16::try_from(port)
                .map(ListenSpec::port)
                .map_err(|_| format!("bad port number '{port}'"));
        }
        let (host, port) = split_net_address(after)?;
        let host = match host {
            "localhost" => ListenHost::Localhost,
            "::1" => ListenHost::Ipv6Loopback,
            _ => return Err("listening on specified hostname currently unsupported".to_string()),
        };
        Ok(ListenSpec { host, port })
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address (as
/// libbase's ParseNetAddress reads them); the port must be 1 to 65535.
fn split_net_address(address: &str) -> Result<(&str, u16), String> {
    let bad = || format!("bad address '{address}'");
    let (host, port) = if let Some(rest) = address.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad)?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else if address.matches(':').count() > 1 {
        (address, None)
    } else {
        match address.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (address, None),
        }
    };
    if host.is_empty() {
        return Err(format!("no host in '{address}'"));
    }
    let port = match port {
        None => PORT_WHEN_NONE,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|&port| port != 0)
            .ok_or_else(|| format!("bad port number '{port}'"))?,
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: &str) -> Result<(ListenHost, u16), String> {
        ListenSpec::parse(spec).map(|s| (s.host, s.port))
    }

    #[test]
    fn specs_adb_listens_on() {
        assert_eq!(parse("tcp:5037"), Ok((ListenHost::Unnamed, 5037)));
        assert_eq!(parse("tcp:0"), Ok((ListenHost::Unnamed, 0)));
        assert_eq!(
            parse("tcp:localhost:5038"),
            Ok((ListenHost::Localhost, 5038))
        );
        assert_eq!(parse("tcp:localhost"), Ok((ListenHost::Localhost, 5555)));
        assert_eq!(
            parse("tcp:[::1]:5039"),
            Ok((ListenHost::Ipv6Loopback, 5039))
        );
        assert_eq!(parse("tcp:[::1]"), Ok((ListenHost::Ipv6Loopback, 5555)));
        assert_eq!(parse("tcp:::1"), Ok((ListenHost::Ipv6Loopback, 5555)));
    }

    #[test]
    fn specs_adb_refuses() {
        let unsupported = Err("listening on specified hostname currently unsupported".into());
        assert_eq!(parse("tcp:127.0.0.1:5037"), unsupported);
        assert_eq!(parse("tcp:0.0.0.0:5037"), unsupported);
        assert_eq!(parse("tcp:[::]:5037"), unsupported);
        assert_eq!(parse("tcp:70000"), Err("bad port number '70000'".into()));
        assert_eq!(parse("tcp:-1"), Err("bad port number '-1'".into()));
        assert_eq!(
            parse("tcp:"),
            Err("string after tcp specification is empty".into())
        );
        assert!(parse("tcp:localhost:x").is_err());
        assert!(parse("tcp:[::1").is_err());
        assert!(parse("vsock:5037")
            .unwrap_err()
            .contains("tcp: sockets only"));
        assert_eq!(
            parse("5037"),
            Err("unknown socket specification: 5037".into())
        );
    }
}
