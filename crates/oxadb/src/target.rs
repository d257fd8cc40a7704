//! Which device a command talks to: `-s`/`ANDROID_SERIAL` read as a TCP
//! address or a USB serial, or with neither the one USB device present.

use crate::error::{Error, Result};
use crate::usb::UsbDeviceInfo;

/// Where a command goes when nothing names a device and no single USB
/// device is present: a local adbd (an emulator's, or oxadbd).
pub const DEFAULT_TCP: &str = "127.0.0.1:5555";

/// A device to connect to.
#[derive(Debug, Clone)]
pub enum Target {
    /// `host:port` over TCP.
    Tcp(String),
    /// `vsock:CID[:PORT]`: a virtual machine socket (AOSP's socket spec).
    Vsock(String),
    Usb(Box<UsbDeviceInfo>),
}

impl Target {
    /// How the user names it: `host:port`, or the USB serial.
    pub fn serial(&self) -> &str {
        match self {
            Target::Tcp(addr) | Target::Vsock(addr) => addr,
            Target::Usb(device) => &device.serial,
        }
    }
}

/// How a `-s` value is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spec<'a> {
    /// `host:port` (or `[v6]:port`): TCP, exactly as before USB existed.
    Tcp(&'a str),
    /// `vsock:CID[:PORT]`.
    Vsock(&'a str),
    /// `usb:BUS-PORT[.PORT...]`: the USB device plugged in there.
    UsbPath(&'a str),
    /// Has a colon but is no address (some serials do): a USB serial only.
    UsbSerial(&'a str),
    /// A bare word: the USB device with that serial, else `word:5555` over TCP.
    SerialOrHost(&'a str),
    /// `host:digits` with a number that is no TCP port (`127.0.0.1:99999`).
    BadPort(&'a str),
}

fn classify(serial: &str) -> Spec<'_> {
    if serial.starts_with("usb:") {
        return Spec::UsbPath(serial);
    }
    if serial.starts_with("vsock:") {
        return Spec::Vsock(serial);
    }
    if is_tcp_address(serial) {
        return Spec::Tcp(serial);
    }
    if bad_port(serial).is_some() {
        return Spec::BadPort(serial);
    }
    if serial.contains(':') {
        Spec::UsbSerial(serial)
    } else {
        Spec::SerialOrHost(serial)
    }
}

/// `host` or `host:port` as adb's server completes an address given to
/// `connect`/`disconnect`: port 5555 when none is given.
pub fn with_default_port(address: &str) -> String {
    if is_tcp_address(address) {
        address.to_string()
    } else {
        format!("{address}:5555")
    }
}

/// Whether `serial` is a `host:port` TCP address (a port number after the
/// last colon, and a host that is a name, an IPv4 address or a bracketed
/// IPv6 one).
pub fn is_tcp_address(serial: &str) -> bool {
    let Some((host, port)) = serial.rsplit_once(':') else {
        return false;
    };
    if host.is_empty() || !matches!(port.parse::<u16>(), Ok(1..)) {
        return false;
    }
    match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .is_some_and(|v6| v6.parse::<std::net::Ipv6Addr>().is_ok()),
        None => !host.contains(':'),
    }
}

/// The port of `host:PORT` when it is all digits but no TCP port (0, or
/// above 65535): a mistyped address, not a USB serial.
fn bad_port(serial: &str) -> Option<&str> {
    let (host, port) = serial.rsplit_once(':')?;
    let host_ok = match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .is_some_and(|v6| v6.parse::<std::net::Ipv6Addr>().is_ok()),
        None => !host.is_empty() && !host.contains(':'),
    };
    let digits = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
    (host_ok && digits && !matches!(port.parse::<u16>(), Ok(1..))).then_some(port)
}

/// Whether `serial` is a bare word (no colon): a USB serial or a host name.
pub fn is_bare_word(serial: &str) -> bool {
    matches!(classify(serial), Spec::SerialOrHost(_))
}

/// Whether choosing for `serial` needs the list of USB devices: not for a
/// `host:port`, which is TCP without looking at USB at all.
pub fn needs_usb_list(serial: Option<&str>) -> bool {
    !matches!(
        serial.map(classify),
        Some(Spec::Tcp(_) | Spec::Vsock(_) | Spec::BadPort(_))
    )
}

/// Whether a failure to list USB devices should fail the command: only when
/// `serial` can name nothing but a USB device.
pub fn requires_usb(serial: Option<&str>) -> bool {
    matches!(
        serial.map(classify),
        Some(Spec::UsbPath(_) | Spec::UsbSerial(_))
    )
}

/// The CID and port of a `vsock:CID[:PORT]` serial (port 5555 when
/// omitted, as adb's `connect` assumes), or why it is not one.
pub fn parse_vsock(serial: &str) -> std::result::Result<(u32, u32), String> {
    let rest = serial
        .strip_prefix("vsock:")
        .ok_or_else(|| format!("'{serial}' is not vsock:CID[:PORT]"))?;
    let (cid, port) = match rest.split_once(':') {
        Some((cid, port)) => (cid, Some(port)),
        None => (rest, None),
    };
    let cid = cid
        .parse::<u32>()
        .map_err(|_| format!("bad CID in '{serial}': expected vsock:CID[:PORT]"))?;
    let port = match port {
        Some(port) => port
            .parse::<u32>()
            .ok()
            .filter(|&port| port != 0)
            .ok_or_else(|| format!("bad port in '{serial}': expected vsock:CID[:PORT]"))?,
        None => 5555,
    };
    Ok((cid, port))
}

/// Picks the device for `serial` (the `-s` value or `ANDROID_SERIAL`)
/// among the USB devices present, as Google's adb does: a serial or a
/// `usb:` path names a USB device; `host:port` is TCP; with nothing given,
/// the one USB device if there is exactly one, more than one is an error,
/// and none falls back to [`DEFAULT_TCP`].
pub fn choose(serial: Option<&str>, usb: &[UsbDeviceInfo]) -> Result<Target> {
    let Some(serial) = serial else {
        return match usb {
            [] => Ok(Target::Tcp(DEFAULT_TCP.to_string())),
            [only] => Ok(Target::Usb(Box::new(only.clone()))),
            several => Err(Error::MoreThanOneDevice {
                serials: several.iter().map(|d| d.serial.clone()).collect(),
            }),
        };
    };
    let not_found = || Error::DeviceNotFound {
        serial: serial.to_string(),
    };
    let by_serial = |serial: &str| -> Result<Option<Target>> {
        let matches: Vec<&UsbDeviceInfo> = usb.iter().filter(|d| d.serial == serial).collect();
        match matches.as_slice() {
            [] => Ok(None),
            [only] => Ok(Some(Target::Usb(Box::new((*only).clone())))),
            // Cheap devices share a serial: the path tells them apart.
            several => Err(Error::MoreThanOneDevice {
                serials: several.iter().map(|d| d.path.clone()).collect(),
            }),
        }
    };
    match classify(serial) {
        Spec::Tcp(addr) => Ok(Target::Tcp(addr.to_string())),
        Spec::BadPort(serial) => Err(Error::InvalidPort {
            serial: serial.to_string(),
            port: bad_port(serial).unwrap_or_default().to_string(),
        }),
        Spec::Vsock(spec) => Ok(Target::Vsock(spec.to_string())),
        Spec::UsbPath(path) => usb
            .iter()
            .find(|d| d.path == path)
            .map(|d| Target::Usb(Box::new(d.clone())))
            .ok_or_else(not_found),
        Spec::UsbSerial(serial) => by_serial(serial)?.ok_or_else(not_found),
        Spec::SerialOrHost(word) => {
            Ok(by_serial(word)?.unwrap_or_else(|| Target::Tcp(format!("{word}:5555"))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_port_is_5555() {
        assert_eq!(with_default_port("10.0.0.2"), "10.0.0.2:5555");
        assert_eq!(with_default_port("10.0.0.2:7000"), "10.0.0.2:7000");
        assert_eq!(with_default_port("[::1]:7000"), "[::1]:7000");
    }

    fn usb(list: &[(&str, &str)]) -> Vec<UsbDeviceInfo> {
        list.iter()
            .map(|(serial, path)| UsbDeviceInfo::for_test(serial, path))
            .collect()
    }

    fn chosen(serial: Option<&str>, devices: &[UsbDeviceInfo]) -> String {
        match choose(serial, devices).unwrap() {
            Target::Tcp(addr) => format!("tcp {addr}"),
            Target::Vsock(spec) => format!("vsock {spec}"),
            Target::Usb(device) => format!("usb {} {}", device.serial, device.path),
        }
    }

    #[test]
    fn host_port_is_tcp_without_looking_at_usb() {
        let devices = usb(&[("R58M", "usb:1-1")]);
        for addr in [
            "127.0.0.1:5555",
            "localhost:5037",
            "[::1]:5555",
            "phone.lan:40000",
        ] {
            assert_eq!(chosen(Some(addr), &devices), format!("tcp {addr}"));
            assert!(!needs_usb_list(Some(addr)));
        }
        assert!(needs_usb_list(None));
        assert!(needs_usb_list(Some("R58M")));
    }

    #[test]
    fn vsock_serials_are_vsock_without_looking_at_usb() {
        let devices = usb(&[("R58M", "usb:1-1")]);
        assert_eq!(chosen(Some("vsock:1:5555"), &devices), "vsock vsock:1:5555");
        assert!(!needs_usb_list(Some("vsock:3")));
        assert_eq!(parse_vsock("vsock:1:40000"), Ok((1, 40000)));
        assert_eq!(parse_vsock("vsock:3"), Ok((3, 5555)));
        for bad in [
            "vsock:",
            "vsock:x:1",
            "vsock:1:0",
            "vsock:1:y",
            "vsock:1:2:3",
        ] {
            let error = parse_vsock(bad).unwrap_err();
            assert!(error.contains("vsock:CID[:PORT]"), "{error}");
        }
    }

    #[test]
    fn no_serial_picks_the_only_usb_device_or_the_default() {
        assert_eq!(chosen(None, &[]), "tcp 127.0.0.1:5555");
        assert_eq!(
            chosen(None, &usb(&[("R58M", "usb:1-1")])),
            "usb R58M usb:1-1"
        );
        let error = choose(None, &usb(&[("A", "usb:1-1"), ("B", "usb:1-2")])).unwrap_err();
        assert!(matches!(error, Error::MoreThanOneDevice { .. }));
        assert_eq!(
            error.to_string(),
            "more than one device (A, B): pick one with -s SERIAL or ANDROID_SERIAL"
        );
    }

    #[test]
    fn serials_and_paths_pick_usb_devices() {
        let devices = usb(&[("A", "usb:1-1"), ("B", "usb:1-2.3"), ("usb:2-4", "usb:2-4")]);
        assert_eq!(chosen(Some("B"), &devices), "usb B usb:1-2.3");
        assert_eq!(chosen(Some("usb:1-1"), &devices), "usb A usb:1-1");
        // A device without a serial is named by its path.
        assert_eq!(chosen(Some("usb:2-4"), &devices), "usb usb:2-4 usb:2-4");
        // A serial with colons that is no address.
        let devices = usb(&[("00:1a:2b", "usb:3-1")]);
        assert_eq!(chosen(Some("00:1a:2b"), &devices), "usb 00:1a:2b usb:3-1");
    }

    #[test]
    fn unknown_names_fall_back_to_tcp_or_fail() {
        let devices = usb(&[("A", "usb:1-1")]);
        // A bare word that no USB device has is a host, port 5555 (as before).
        assert_eq!(chosen(Some("10.0.0.7"), &devices), "tcp 10.0.0.7:5555");
        assert_eq!(chosen(Some("phone"), &devices), "tcp phone:5555");
        for missing in ["usb:9-9", "de:ad:be:ef"] {
            let error = choose(Some(missing), &devices).unwrap_err();
            assert_eq!(error.to_string(), format!("device '{missing}' not found"));
            assert!(requires_usb(Some(missing)));
        }
        assert!(!requires_usb(Some("phone")));
        assert!(!requires_usb(None));
    }

    #[test]
    fn an_address_with_a_bad_port_says_so_without_usb() {
        for (serial, port) in [
            ("127.0.0.1:99999", "99999"),
            ("phone.lan:0", "0"),
            ("[::1]:70000", "70000"),
        ] {
            assert!(!needs_usb_list(Some(serial)), "{serial}");
            let error = choose(Some(serial), &[]).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!("invalid port {port} in serial '{serial}' (a TCP port is 1 to 65535)")
            );
        }
        // Serials with colons that are no address stay USB serials.
        assert!(requires_usb(Some("de:ad:be:ef")));
        assert!(is_bare_word("R58M123ABC") && !is_bare_word("127.0.0.1:5555"));
    }

    #[test]
    fn duplicate_serials_need_a_path() {
        let devices = usb(&[
            ("0123456789ABCDEF", "usb:1-1"),
            ("0123456789ABCDEF", "usb:1-2"),
        ]);
        let error = choose(Some("0123456789ABCDEF"), &devices).unwrap_err();
        assert!(error.to_string().contains("usb:1-1, usb:1-2"), "{error}");
        assert_eq!(
            chosen(Some("usb:1-2"), &devices),
            "usb 0123456789ABCDEF usb:1-2"
        );
    }
}
