//! adb's host protobuf messages (AOSP `proto/adb_host.proto`, package
//! `adb.proto`), as prost structs: the device list of
//! `host:track-devices-proto-binary` / `-proto-text`, the answer to
//! `host:server-status` and `track-mdns-services`' `MdnsServices`. Field numbers and enum values are adb's, so
//! adb's clients (Android Studio's ddmlib, `adb server-status`) parse
//! them; [`devices_text`] prints the list as protobuf's text format does
//! (what `-proto-text` sends).

use std::fmt::Write as _;

/// adb.h's ConnectionState, as the proto numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ConnectionState {
    Any = 0,
    Connecting = 1,
    Authorizing = 2,
    Unauthorized = 3,
    Nopermission = 4,
    Detached = 5,
    Offline = 6,
    Bootloader = 7,
    Device = 8,
    Host = 9,
    Recovery = 10,
    Sideload = 11,
    Rescue = 12,
}

impl ConnectionState {
    /// The name the .proto gives it (text format prints enums so).
    pub fn proto_name(self) -> &'static str {
        use ConnectionState::*;
        match self {
            Any => "ANY",
            Connecting => "CONNECTING",
            Authorizing => "AUTHORIZING",
            Unauthorized => "UNAUTHORIZED",
            Nopermission => "NOPERMISSION",
            Detached => "DETACHED",
            Offline => "OFFLINE",
            Bootloader => "BOOTLOADER",
            Device => "DEVICE",
            Host => "HOST",
            Recovery => "RECOVERY",
            Sideload => "SIDELOAD",
            Rescue => "RESCUE",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ConnectionType {
    Unknown = 0,
    Usb = 1,
    Socket = 2,
}

impl ConnectionType {
    /// The name the .proto gives it.
    pub fn proto_name(self) -> &'static str {
        match self {
            ConnectionType::Unknown => "UNKNOWN",
            ConnectionType::Usb => "USB",
            ConnectionType::Socket => "SOCKET",
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Device {
    #[prost(string, tag = "1")]
    pub serial: String,
    #[prost(enumeration = "ConnectionState", tag = "2")]
    pub state: i32,
    #[prost(string, tag = "3")]
    pub bus_address: String,
    #[prost(string, tag = "4")]
    pub product: String,
    #[prost(string, tag = "5")]
    pub model: String,
    #[prost(string, tag = "6")]
    pub device: String,
    #[prost(enumeration = "ConnectionType", tag = "7")]
    pub connection_type: i32,
    #[prost(int64, tag = "8")]
    pub negotiated_speed: i64,
    #[prost(int64, tag = "9")]
    pub max_speed: i64,
    #[prost(int64, tag = "10")]
    pub transport_id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Devices {
    #[prost(message, repeated, tag = "1")]
    pub device: Vec<Device>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum UsbBackend {
    UnknownUsb = 0,
    Native = 1,
    Libusb = 2,
    UsbDisabled = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum MdnsBackend {
    UnknownMdns = 0,
    Bonjour = 1,
    Openscreen = 2,
    Libadbmdns = 3,
    MdnsDisabled = 4,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AdbServerStatus {
    #[prost(enumeration = "UsbBackend", tag = "1")]
    pub usb_backend: i32,
    #[prost(bool, tag = "2")]
    pub usb_backend_forced: bool,
    #[prost(enumeration = "MdnsBackend", tag = "3")]
    pub mdns_backend: i32,
    #[prost(bool, tag = "4")]
    pub mdns_backend_forced: bool,
    #[prost(string, tag = "5")]
    pub version: String,
    #[prost(string, tag = "6")]
    pub build: String,
    #[prost(string, tag = "7")]
    pub executable_absolute_path: String,
    #[prost(string, tag = "8")]
    pub log_absolute_path: String,
    #[prost(string, tag = "9")]
    pub os: String,
    #[prost(string, optional, tag = "10")]
    pub trace_level: Option<String>,
    #[prost(bool, optional, tag = "11")]
    pub burst_mode: Option<bool>,
    #[prost(bool, optional, tag = "12")]
    pub mdns_enabled: Option<bool>,
    #[prost(string, optional, tag = "13")]
    pub keystore_path: Option<String>,
    #[prost(string, optional, tag = "14")]
    pub known_hosts_path: Option<String>,
}

/// One mDNS service as `track-mdns-services` reports it; the strings
/// after the port are the service's TXT values (AOSP
/// `client/mdns_tracker.cpp`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct MdnsService {
    #[prost(string, tag = "1")]
    pub instance_name: String,
    #[prost(string, tag = "2")]
    pub service_name: String,
    #[prost(string, tag = "4")]
    pub ipv4: String,
    #[prost(string, repeated, tag = "5")]
    pub ipv6: Vec<String>,
    #[prost(uint32, tag = "6")]
    pub port: u32,
    #[prost(string, tag = "7")]
    pub product_model: String,
    #[prost(string, tag = "8")]
    pub build_version_sdk_full: String,
    #[prost(string, tag = "9")]
    pub given_name: String,
    #[prost(string, tag = "10")]
    pub serial: String,
    #[prost(string, tag = "11")]
    pub mdns_version: String,
    #[prost(string, tag = "12")]
    pub hostname: String,
}

/// A `_adb._tcp` service.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AdbService {
    #[prost(message, optional, tag = "1")]
    pub service: Option<MdnsService>,
}

/// A `_adb-tls-connect._tcp` service, and whether this host paired with it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AdbSecureConnectService {
    #[prost(message, optional, tag = "1")]
    pub service: Option<MdnsService>,
    #[prost(bool, tag = "2")]
    pub known_device: bool,
}

/// A `_adb-tls-pairing._tcp` service.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AdbSecurePairingService {
    #[prost(message, optional, tag = "1")]
    pub service: Option<MdnsService>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MdnsServices {
    #[prost(message, repeated, tag = "1")]
    pub services: Vec<AdbService>,
    #[prost(message, repeated, tag = "2")]
    pub tls_connect_services: Vec<AdbSecureConnectService>,
    #[prost(message, repeated, tag = "3")]
    pub pairing_services: Vec<AdbSecurePairingService>,
}

/// `devices` in protobuf's text format, as adb's server sends it for
/// `-proto-text` (C++ `TextFormat::PrintToString`): fields in number
/// order, proto3 defaults left out, enums by name, strings C-escaped, two
/// spaces of indent inside `device { ... }`.
pub fn devices_text(devices: &Devices) -> String {
    let mut out = String::new();
    for device in &devices.device {
        out.push_str("device {\n");
        let field = |out: &mut String, name: &str, value: &str| {
            let _ = writeln!(out, "  {name}: {value}");
        };
        let string = |out: &mut String, name: &str, value: &str| {
            if !value.is_empty() {
                field(out, name, &format!("\"{}\"", c_escape(value)));
            }
        };
        let number = |out: &mut String, name: &str, value: i64| {
            if value != 0 {
                field(out, name, &value.to_string());
            }
        };
        string(&mut out, "serial", &device.serial);
        if device.state != 0 {
            let name = ConnectionState::try_from(device.state)
                .map_or_else(|_| device.state.to_string(), |s| s.proto_name().into());
            field(&mut out, "state", &name);
        }
        string(&mut out, "bus_address", &device.bus_address);
        string(&mut out, "product", &device.product);
        string(&mut out, "model", &device.model);
        string(&mut out, "device", &device.device);
        if device.connection_type != 0 {
            let name = ConnectionType::try_from(device.connection_type).map_or_else(
                |_| device.connection_type.to_string(),
                |t| t.proto_name().into(),
            );
            field(&mut out, "connection_type", &name);
        }
        number(&mut out, "negotiated_speed", device.negotiated_speed);
        number(&mut out, "max_speed", device.max_speed);
        number(&mut out, "transport_id", device.transport_id);
        out.push_str("}\n");
    }
    out
}

/// Protobuf's CEscape: the usual backslash escapes, and every byte outside
/// printable ASCII (UTF-8 included) as three octal digits.
fn c_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            b'"' => out.push_str("\\\""),
            b'\'' => out.push_str("\\'"),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(byte)),
            _ => {
                let _ = write!(out, "\\{byte:03o}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn one() -> Devices {
        Devices {
            device: vec![Device {
                serial: "127.0.0.1:5555".into(),
                state: ConnectionState::Device as i32,
                product: "debian".into(),
                model: "QEMU_Virtual_Machine".into(),
                device: "builder".into(),
                connection_type: ConnectionType::Socket as i32,
                transport_id: 7,
                ..Default::default()
            }],
        }
    }

    #[test]
    fn binary_is_adbs_field_numbers() {
        let bytes = one().encode_to_vec();
        // device (1, length-delimited) holding serial (1), state (2) = 8,
        // product (4), model (5), device (6), connection_type (7) = 2,
        // transport_id (10) = 7.
        let mut inner = vec![0x0a, 14];
        inner.extend_from_slice(b"127.0.0.1:5555");
        inner.extend_from_slice(&[0x10, 8, 0x22, 6]);
        inner.extend_from_slice(b"debian");
        inner.extend_from_slice(&[0x2a, 20]);
        inner.extend_from_slice(b"QEMU_Virtual_Machine");
        inner.extend_from_slice(&[0x32, 7]);
        inner.extend_from_slice(b"builder");
        inner.extend_from_slice(&[0x38, 2, 0x50, 7]);
        let mut expected = vec![0x0a, inner.len() as u8];
        expected.extend_from_slice(&inner);
        assert_eq!(bytes, expected);
        assert_eq!(Devices::default().encode_to_vec(), b"");
    }

    #[test]
    fn text_is_protobufs_text_format() {
        assert_eq!(
            devices_text(&one()),
            "device {\n  serial: \"127.0.0.1:5555\"\n  state: DEVICE\n  product: \"debian\"\n  \
             model: \"QEMU_Virtual_Machine\"\n  device: \"builder\"\n  connection_type: SOCKET\n  \
             transport_id: 7\n}\n"
        );
        let bare = Devices {
            device: vec![Device {
                serial: "a\"b'\\\u{e9}\t".into(),
                state: ConnectionState::Any as i32,
                ..Default::default()
            }],
        };
        assert_eq!(
            devices_text(&bare),
            "device {\n  serial: \"a\\\"b\\'\\\\\\303\\251\\t\"\n}\n"
        );
        assert_eq!(devices_text(&Devices::default()), "");
    }

    #[test]
    fn server_status_keeps_explicit_optionals() {
        let status = AdbServerStatus {
            usb_backend: UsbBackend::UsbDisabled as i32,
            burst_mode: Some(false),
            trace_level: Some(String::new()),
            ..Default::default()
        };
        // usb_backend (1) = 3; trace_level (10) present though empty;
        // burst_mode (11) present though false.
        assert_eq!(status.encode_to_vec(), vec![0x08, 3, 0x52, 0, 0x58, 0]);
    }
}
