//! Host requests: which transport a request is about and what the server
//! answers, decided from a snapshot of the transports (no I/O, so every
//! rule is tested against made-up transports). What needs I/O or time
//! (connecting, tracking, waiting, forwarding) comes back as an [`Action`]
//! for the client's task. AOSP: `adb.cpp` handle_host_request,
//! `services.cpp` host_service_to_socket and wait_service, `transport.cpp`
//! acquire_one_transport and list_transports; the texts are adb's, which
//! scripts parse.

use oxadb_wire::feature;
use oxadb_wire::service::{
    DeviceListFormat, DeviceSelector, ForwardRequest, HostRequest, HostService, ServiceError,
    ServiceProblem, TportSelector, WaitState, WaitTransport,
};
use oxadb_wire::smart_socket::{fail, okay_message, OKAY};
use prost::Message as _;

use super::proto;
use super::registry::{Kind, State, TransportId, TransportInfo};

/// What `host:version` answers (AOSP `adb.h` ADB_SERVER_VERSION): Google's
/// adb kills a server whose version differs from its own.
pub const SERVER_VERSION: u32 = 41;

/// No transport at all for a request that needs one.
pub const NO_DEVICES: &str = "no devices/emulators found";
/// None for `-e` / `host-local:`.
pub const NO_EMULATORS: &str = "no emulators found";
/// None for `-d` / `host-usb:`.
pub const NO_USB_DEVICES: &str = "no devices found";
/// Several for a request that names none.
pub const MORE_THAN_ONE_DEVICE: &str = "more than one device/emulator";
pub const MORE_THAN_ONE_EMULATOR: &str = "more than one emulator";
pub const MORE_THAN_ONE_USB_DEVICE: &str = "more than one USB device";
pub const DEVICE_OFFLINE: &str = "device offline";
pub const DEVICE_CONNECTING: &str = "device still connecting";
/// A device service before any `host:transport*`.
pub const NO_TRANSPORT: &str = "device offline (no transport)";
/// A device service on a transport that is not online.
pub const TRANSPORT_OFFLINE: &str = "device offline (transport offline)";
/// The device refused the stream (AOSP `sockets.cpp`
/// local_socket_close_notify).
pub const STREAM_CLOSED: &str = "closed";
pub const INVALID_TRANSPORT_ID: &str = "invalid transport id";
/// `host:attach` / `host:detach` on a transport that cannot be detached:
/// only libusb's USB connections can (AOSP `transport.cpp`
/// atransport::Attach and Detach; the `!` is Detach's alone).
pub const ATTACH_NOT_SUPPORTED: &str = "attach/detach not supported";
pub const DETACH_NOT_SUPPORTED: &str = "attach/detach not supported!";

pub fn device_not_found(serial: &str) -> String {
    format!("device '{serial}' not found")
}

pub fn no_transport_id(id: TransportId) -> String {
    format!("no device with transport id '{id}'")
}

pub fn more_than_one_serial(serial: &str) -> String {
    format!("more than one device with serial {serial}")
}

/// adb's words for a device that waits for its user; they name the
/// server's `$ADB_VENDOR_KEYS`, here oxadb's (the same variable).
pub fn unauthorized() -> String {
    let keys = std::env::var("ADB_VENDOR_KEYS").unwrap_or_else(|_| "not set".to_string());
    format!(
        "device unauthorized.\nThis adb server's $ADB_VENDOR_KEYS is {keys}\n\
         Try 'adb kill-server' if that seems wrong.\n\
         Otherwise check for a confirmation dialog on your device."
    )
}

/// Whether a request is for the server itself (a host prefix) rather than
/// a device service to pass on (AOSP `sockets.cpp` smart_socket_enqueue).
pub fn is_host_service(text: &str) -> bool {
    [
        "host:",
        "host-serial:",
        "host-transport-id:",
        "host-usb:",
        "host-local:",
    ]
    .iter()
    .any(|prefix| text.starts_with(prefix))
}

/// What to answer a host request that does not parse.
pub fn malformed(error: &ServiceError) -> Vec<u8> {
    match &error.problem {
        ServiceProblem::Forward(forward) => fail(&forward.to_string()),
        ServiceProblem::Number(_) if error.service.contains("transport-id:") => {
            fail(INVALID_TRANSPORT_ID)
        }
        ServiceProblem::Unknown => {
            let request = error
                .service
                .split_once(':')
                .map_or(error.service.as_str(), |(_, rest)| rest);
            fail(&format!("unknown host service '{request}'"))
        }
        problem => fail(&format!("{}: {problem}", error.service)),
    }
}

/// What the client's task does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send these bytes and end the connection.
    Reply(Vec<u8>),
    /// Send these bytes and read the next request, which goes to `transport`.
    Switch {
        transport: TransportId,
        reply: Vec<u8>,
    },
    /// `OKAY`, then connect and send the answer as a message.
    Connect(String),
    /// Remove one device (or all: empty) and answer.
    Disconnect(String),
    /// Drop this transport's connection (it reconnects) and answer.
    Reconnect(TransportId),
    /// Reconnect every transport that is not online now, and answer.
    ReconnectOffline,
    /// `OKAY` and the server's `AdbServerStatus`.
    ServerStatus,
    /// `OKAY`, then the list now and at every change, until the client leaves.
    Track(DeviceListFormat),
    /// `OKAY`, then a second `OKAY` once [`wait_outcome`] says so.
    WaitFor {
        selector: DeviceSelector,
        state: WaitState,
    },
    /// A forwarding request; `transport` for `forward:` and `killforward:`.
    Forward {
        request: ForwardRequest,
        transport: Option<TransportInfo>,
    },
    /// `OKAY`, then the server stops.
    Kill,
    /// What the mDNS discovery answers (`server/mdns.rs`).
    Mdns(MdnsQuery),
    /// `OKAY`, then pairing, then adb's answer: a message on success,
    /// `FAIL` and the reason otherwise (AOSP `services.cpp` pair_service).
    Pair { code: String, address: String },
}

/// A request about what mDNS discovery sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MdnsQuery {
    /// `mdns:check`: whether discovery runs.
    Check,
    /// `mdns:services`: the services seen.
    Services,
    /// `track-mdns-services`: `OKAY`, then the services as protobuf now
    /// and at every change.
    Track,
}

/// Why no single transport was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotSelected {
    /// adb's message.
    pub message: String,
    /// Several matched (a wait gives up on that at once).
    pub ambiguous: bool,
}

/// The one transport `selector` names, as AOSP's acquire_one_transport
/// chooses it; unless `any_state`, it must be online.
pub fn select<'a>(
    transports: &'a [TransportInfo],
    selector: &DeviceSelector,
    any_state: bool,
) -> Result<&'a TransportInfo, NotSelected> {
    let none = match selector {
        DeviceSelector::TransportId(id) => no_transport_id(*id),
        DeviceSelector::Serial(serial) => device_not_found(serial),
        DeviceSelector::Local => NO_EMULATORS.to_string(),
        DeviceSelector::Any => NO_DEVICES.to_string(),
        DeviceSelector::Usb => NO_USB_DEVICES.to_string(),
    };
    let several = |message: String| NotSelected {
        message,
        ambiguous: true,
    };
    let mut found: Option<&TransportInfo> = None;
    for transport in transports {
        let matches = match selector {
            DeviceSelector::TransportId(id) => transport.id == *id,
            DeviceSelector::Serial(serial) => matches_target(transport, serial),
            DeviceSelector::Usb => transport.kind == Kind::Usb,
            DeviceSelector::Local => transport.kind == Kind::Tcp,
            DeviceSelector::Any => true,
        };
        if !matches {
            continue;
        }
        if found.is_some() {
            return Err(several(match selector {
                DeviceSelector::Serial(serial) => more_than_one_serial(serial),
                DeviceSelector::Usb => MORE_THAN_ONE_USB_DEVICE.to_string(),
                DeviceSelector::Local => MORE_THAN_ONE_EMULATOR.to_string(),
                // Ids are unique: the first match is the one.
                DeviceSelector::Any | DeviceSelector::TransportId(_) => {
                    MORE_THAN_ONE_DEVICE.to_string()
                }
            }));
        }
        found = Some(transport);
    }
    let Some(transport) = found else {
        return Err(NotSelected {
            message: none,
            ambiguous: false,
        });
    };
    if !any_state {
        let message = match transport.state {
            State::Device => None,
            State::Connecting => Some(DEVICE_CONNECTING.to_string()),
            State::Unauthorized => Some(unauthorized()),
            State::Offline => Some(DEVICE_OFFLINE.to_string()),
        };
        if let Some(message) = message {
            return Err(NotSelected {
                message,
                ambiguous: false,
            });
        }
    }
    Ok(transport)
}

/// Whether `target` (a `-s` serial) names `transport` (AOSP `transport.cpp`
/// atransport::MatchesTarget): its serial; for TCP, the same host and port
/// after an optional `tcp:`/`udp:`, the port defaulting to its own; its
/// device path; or `product:`, `model:`, `device:` and the value.
pub fn matches_target(transport: &TransportInfo, target: &str) -> bool {
    if target == transport.serial {
        return true;
    }
    if transport.kind == Kind::Tcp {
        let bare = target
            .strip_prefix("tcp:")
            .or_else(|| target.strip_prefix("udp:"))
            .unwrap_or(target);
        if let Some((host, port)) = split_host_port(&transport.serial) {
            let same = match split_host_port(bare) {
                Some((target_host, target_port)) => target_host == host && target_port == port,
                None => bare == host,
            };
            if same {
                return true;
            }
        }
    }
    let qualified = |prefix: &str, value: &str, alphanumeric: bool| {
        target
            .strip_prefix(prefix)
            .is_some_and(|wanted| !value.is_empty() && wanted == sanitize(value, alphanumeric))
    };
    (!transport.devpath.is_empty() && target == transport.devpath)
        || qualified("product:", &transport.product, false)
        || qualified("model:", &transport.model, true)
        || qualified("device:", &transport.device, false)
}

/// `host:port` or `[v6]:port` split at the port's colon.
fn split_host_port(address: &str) -> Option<(&str, &str)> {
    let (host, port) = address.rsplit_once(':')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return None;
    }
    Some((host, port))
}

/// adb keeps newlines out of its lists; a model is letters and digits only
/// (AOSP `transport.cpp` sanitize).
fn sanitize(value: &str, alphanumeric: bool) -> String {
    value
        .chars()
        .map(|c| {
            let keep = if alphanumeric {
                c.is_ascii_alphanumeric()
            } else {
                c != '\n'
            };
            if keep {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The transports in the order adb lists them (AOSP `transport.cpp`
/// list_transports): USB before TCP, then by serial.
fn listing_order(transports: &[TransportInfo]) -> Vec<&TransportInfo> {
    let mut sorted: Vec<&TransportInfo> = transports.iter().collect();
    sorted.sort_by(|a, b| (a.kind, &a.serial).cmp(&(b.kind, &b.serial)));
    sorted
}

/// `host:devices` / `devices-l` and `track-devices[-l]`'s text: one
/// line each, `SERIAL\tSTATE`, or with `long` the serial padded to 22
/// columns, the state, the device path, `product:`, `model:`, `device:`
/// where known, and `transport_id:` last.
pub fn device_list(transports: &[TransportInfo], long: bool) -> String {
    let mut out = String::new();
    for t in listing_order(transports) {
        let serial = if t.serial.is_empty() {
            "(no serial number)"
        } else {
            &t.serial
        };
        if !long {
            out.push_str(&format!("{serial}\t{}\n", t.state.word()));
            continue;
        }
        out.push_str(&format!("{serial:<22} {}", t.state.word()));
        for (key, value, alphanumeric) in [
            ("", &t.devpath, false),
            ("product:", &t.product, false),
            ("model:", &t.model, true),
            ("device:", &t.device, false),
        ] {
            if !value.is_empty() {
                out.push_str(&format!(" {key}{}", sanitize(value, alphanumeric)));
            }
        }
        out.push_str(&format!(" transport_id:{}\n", t.id));
    }
    out
}

/// The list as `adb.proto.Devices` (AOSP `transport.cpp`
/// transportListToProto): the same order and sanitizing as the text; a
/// socket transport has no bus address and no speeds.
pub fn devices_proto(transports: &[TransportInfo]) -> proto::Devices {
    let device = listing_order(transports)
        .into_iter()
        .map(|t| proto::Device {
            serial: t.serial.clone(),
            state: match t.state {
                State::Connecting => proto::ConnectionState::Connecting,
                State::Device => proto::ConnectionState::Device,
                State::Offline => proto::ConnectionState::Offline,
                State::Unauthorized => proto::ConnectionState::Unauthorized,
            } as i32,
            bus_address: sanitize(&t.devpath, false),
            product: sanitize(&t.product, false),
            model: sanitize(&t.model, true),
            device: sanitize(&t.device, false),
            connection_type: match t.kind {
                Kind::Usb => proto::ConnectionType::Usb,
                Kind::Tcp => proto::ConnectionType::Socket,
            } as i32,
            negotiated_speed: 0,
            max_speed: 0,
            transport_id: t.id as i64,
        })
        .collect();
    proto::Devices { device }
}

/// What a device tracker sends (in a length-prefixed message) for
/// `format`: the text list, or the proto serialized or in text format.
pub fn tracked_list(transports: &[TransportInfo], format: DeviceListFormat) -> Vec<u8> {
    match format {
        DeviceListFormat::Short => device_list(transports, false).into_bytes(),
        DeviceListFormat::Long => device_list(transports, true).into_bytes(),
        DeviceListFormat::ProtoBinary => devices_proto(transports).encode_to_vec(),
        DeviceListFormat::ProtoText => proto::devices_text(&devices_proto(transports)).into_bytes(),
    }
}

/// Which transport a request that names one is about: a serial or id in
/// the request itself, else the prefix's, else the request's kind (AOSP
/// `adb.cpp`: `transport:` and `transport-id:` override `host-serial:`,
/// whose serial overrides `transport-usb`/`-local`/`-any`).
fn combine(prefix: &DeviceSelector, request: DeviceSelector) -> DeviceSelector {
    match (&request, prefix) {
        (DeviceSelector::Serial(_) | DeviceSelector::TransportId(_), _) => request,
        (_, DeviceSelector::Serial(_) | DeviceSelector::TransportId(_)) => prefix.clone(),
        _ => request,
    }
}

/// Decides what to do with `service`. `bound` is the transport an earlier
/// `host:transport*` on this connection chose: requests about a device
/// then use it, whatever their prefix says (AOSP: `s->transport`).
pub fn dispatch(
    service: &HostService,
    bound: Option<TransportId>,
    transports: &[TransportInfo],
) -> Action {
    use HostRequest::*;
    // The transport a request about one device uses.
    let about = |any_state: bool| -> Result<&TransportInfo, String> {
        match bound {
            Some(id) => transports
                .iter()
                .find(|t| t.id == id)
                .ok_or_else(|| no_transport_id(id)),
            None => select(transports, &service.device, any_state).map_err(|e| e.message),
        }
    };
    let answer = |result: Result<String, String>| {
        Action::Reply(match result {
            Ok(text) => okay_message(&text),
            Err(message) => fail(&message),
        })
    };
    match &service.request {
        Version => Action::Reply(okay_message(&format!("{SERVER_VERSION:04x}"))),
        Kill => Action::Kill,
        Devices { long } => Action::Reply(okay_message(&device_list(transports, *long))),
        TrackDevices(format) => Action::Track(*format),
        ServerStatus => Action::ServerStatus,
        HostFeatures => Action::Reply(okay_message(&feature::IMPLEMENTED.join(","))),
        Features => answer(about(false).map(|t| t.features.join(","))),
        GetSerialno => answer(about(false).map(|t| t.serial.clone())),
        GetDevpath => answer(about(false).map(|t| {
            if t.devpath.is_empty() {
                "unknown".to_string()
            } else {
                t.devpath.clone()
            }
        })),
        GetState => answer(about(false).map(|t| t.state.word().to_string())),
        Transport(selector) => switch(
            transports,
            &combine(&service.device, selector.clone()),
            false,
        ),
        Tport(selector) => {
            let selector = match selector {
                TportSelector::Any => DeviceSelector::Any,
                TportSelector::Usb => DeviceSelector::Usb,
                TportSelector::Local => DeviceSelector::Local,
                TportSelector::Serial(serial) => DeviceSelector::Serial(serial.clone()),
            };
            switch(transports, &combine(&service.device, selector), true)
        }
        Connect(address) => Action::Connect(address.clone()),
        Disconnect(address) => Action::Disconnect(address.clone()),
        // adb answers OKAY with the error as the message.
        Reconnect => match about(true) {
            Ok(t) => Action::Reconnect(t.id),
            Err(message) => Action::Reply(okay_message(&message)),
        },
        ReconnectOffline => Action::ReconnectOffline,
        // Only libusb's USB connections detach; every transport here is a
        // socket (AOSP `adb.cpp` handle_host_request, any state accepted).
        Attach => {
            answer(about(true).and_then(|_| Err::<String, _>(ATTACH_NOT_SUPPORTED.to_string())))
        }
        Detach => {
            answer(about(true).and_then(|_| Err::<String, _>(DETACH_NOT_SUPPORTED.to_string())))
        }
        WaitFor { transport, state } => {
            let kind = match transport {
                WaitTransport::Usb => DeviceSelector::Usb,
                WaitTransport::Local => DeviceSelector::Local,
                WaitTransport::Any => DeviceSelector::Any,
            };
            let selector = match bound {
                Some(id) => DeviceSelector::TransportId(id),
                None => combine(&service.device, kind),
            };
            Action::WaitFor {
                selector,
                state: *state,
            }
        }
        Forward(request @ (ForwardRequest::List | ForwardRequest::KillAll)) => Action::Forward {
            request: request.clone(),
            transport: None,
        },
        Forward(request) => match about(false) {
            Ok(t) => Action::Forward {
                request: request.clone(),
                transport: Some(t.clone()),
            },
            Err(message) => Action::Reply(fail(&message)),
        },
        // A new emulator announcing itself gets no answer.
        Emulator(_) => Action::Reply(Vec::new()),
        MdnsCheck => Action::Mdns(MdnsQuery::Check),
        MdnsServices => Action::Mdns(MdnsQuery::Services),
        TrackMdnsServices => Action::Mdns(MdnsQuery::Track),
        Pair { code, address } => Action::Pair {
            code: code.clone(),
            address: address.clone(),
        },
    }
}

/// `host:transport*` (`OKAY`) and `host:tport:*` (`OKAY` and the id as
/// eight little-endian bytes).
fn switch(transports: &[TransportInfo], selector: &DeviceSelector, with_id: bool) -> Action {
    match select(transports, selector, false) {
        Ok(t) => {
            let mut reply = OKAY.to_vec();
            if with_id {
                reply.extend_from_slice(&t.id.to_le_bytes());
            }
            Action::Switch {
                transport: t.id,
                reply,
            }
        }
        Err(error) => Action::Reply(fail(&error.message)),
    }
}

/// Where a `wait-for-*` stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Reached: the second `OKAY`.
    Done,
    /// Cannot be decided (several devices match): `FAIL` with this.
    Fail(String),
    Wait,
}

/// Whether `state` is reached (AOSP `services.cpp` wait_service):
/// `disconnect` once no transport matches; `any` once one does, in any
/// state; a named state once the one transport is in it (an oxadbd device
/// is never in recovery, rescue, sideload or bootloader).
pub fn wait_outcome(
    transports: &[TransportInfo],
    selector: &DeviceSelector,
    state: WaitState,
) -> WaitOutcome {
    let found = match select(transports, selector, true) {
        Ok(t) => Some(t),
        Err(error) if error.ambiguous => return WaitOutcome::Fail(error.message),
        Err(_) => None,
    };
    let reached = match (state, found) {
        (WaitState::Disconnect, found) => found.is_none(),
        (WaitState::Any, found) => found.is_some(),
        (WaitState::Device, Some(t)) => t.state == State::Device,
        _ => false,
    };
    if reached {
        WaitOutcome::Done
    } else {
        WaitOutcome::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transport(id: TransportId, serial: &str, state: State) -> TransportInfo {
        TransportInfo {
            id,
            kind: Kind::Tcp,
            serial: serial.to_string(),
            state,
            devpath: String::new(),
            product: "debian".to_string(),
            model: "QEMU Virtual Machine".to_string(),
            device: "builder".to_string(),
            features: vec!["shell_v2".to_string(), "delayed_ack".to_string()],
        }
    }

    fn two() -> Vec<TransportInfo> {
        vec![
            transport(7, "127.0.0.1:5555", State::Device),
            transport(3, "10.0.0.2:5555", State::Offline),
        ]
    }

    fn run(text: &str, bound: Option<TransportId>, transports: &[TransportInfo]) -> Action {
        let service = HostService::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        dispatch(&service, bound, transports)
    }

    fn reply(text: &str, bound: Option<TransportId>, transports: &[TransportInfo]) -> String {
        match run(text, bound, transports) {
            Action::Reply(bytes) => String::from_utf8(bytes).unwrap(),
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn version_is_adbs_server_version_in_hex() {
        assert_eq!(reply("host:version", None, &[]), "OKAY00040029");
    }

    #[test]
    fn requests_about_a_device_need_exactly_one() {
        assert_eq!(
            reply("host:get-state", None, &[]),
            "FAIL001ano devices/emulators found"
        );
        assert_eq!(
            reply("host:get-serialno", None, &two()),
            "FAIL001dmore than one device/emulator"
        );
        assert_eq!(
            reply("host-local:get-serialno", None, &two()),
            "FAIL0016more than one emulator"
        );
        assert_eq!(
            reply("host-usb:get-state", None, &two()),
            "FAIL0010no devices found"
        );
        assert_eq!(
            reply("host-serial:1.2.3.4:5555:get-state", None, &two()),
            "FAIL001fdevice '1.2.3.4:5555' not found"
        );
        assert_eq!(
            reply("host-transport-id:9:get-state", None, &two()),
            "FAIL001fno device with transport id '9'"
        );
    }

    #[test]
    fn host_serial_routes_to_its_device() {
        let list = two();
        assert_eq!(
            reply("host-serial:127.0.0.1:5555:get-serialno", None, &list),
            "OKAY000e127.0.0.1:5555"
        );
        assert_eq!(
            reply("host-serial:127.0.0.1:5555:get-state", None, &list),
            "OKAY0006device"
        );
        assert_eq!(
            reply("host-transport-id:7:get-devpath", None, &list),
            "OKAY0007unknown"
        );
        // The other one is offline: adb's text, not its state.
        assert_eq!(
            reply("host-serial:10.0.0.2:5555:get-state", None, &list),
            "FAIL000edevice offline"
        );
        // A port left out is the device's own; tcp: is ignored.
        assert_eq!(
            reply("host-serial:tcp:127.0.0.1:get-serialno", None, &list),
            "OKAY000e127.0.0.1:5555"
        );
        assert_eq!(
            reply("host:features", Some(7), &list),
            "OKAY0014shell_v2,delayed_ack"
        );
    }

    #[test]
    fn a_bound_transport_answers_for_every_prefix() {
        let list = two();
        assert_eq!(
            reply("host:get-serialno", Some(7), &list),
            "OKAY000e127.0.0.1:5555"
        );
        assert_eq!(
            reply("host-serial:10.0.0.2:5555:get-serialno", Some(7), &list),
            "OKAY000e127.0.0.1:5555"
        );
    }

    #[test]
    fn tport_answers_the_id_in_eight_little_endian_bytes() {
        let list = vec![transport(0x0102, "127.0.0.1:5555", State::Device)];
        let Action::Switch {
            transport: id,
            reply: bytes,
        } = run("host:tport:any", None, &list)
        else {
            panic!("no switch");
        };
        assert_eq!(id, 0x0102);
        assert_eq!(bytes, b"OKAY\x02\x01\0\0\0\0\0\0");
        let Action::Switch { reply: bytes, .. } = run("host:transport:127.0.0.1:5555", None, &list)
        else {
            panic!("no switch");
        };
        assert_eq!(bytes, b"OKAY");
        assert_eq!(
            run("host:tport:serial:127.0.0.1:5555", None, &list),
            Action::Switch {
                transport: 0x0102,
                reply: b"OKAY\x02\x01\0\0\0\0\0\0".to_vec()
            }
        );
        assert_eq!(
            reply("host:transport-usb", None, &list),
            "FAIL0010no devices found"
        );
        assert_eq!(
            reply("host:tport:serial:x:1", None, &list),
            "FAIL0016device 'x:1' not found"
        );
        // A switch needs an online device.
        let offline = vec![transport(1, "a:1", State::Offline)];
        assert_eq!(
            reply("host:transport-any", None, &offline),
            "FAIL000edevice offline"
        );
        // host-serial's serial applies to transport-any.
        assert_eq!(
            run("host-serial:127.0.0.1:5555:transport-any", None, &two()),
            Action::Switch {
                transport: 7,
                reply: b"OKAY".to_vec()
            }
        );
    }

    #[test]
    fn unauthorized_devices_say_so_in_adbs_words() {
        let list = vec![transport(1, "a:1", State::Unauthorized)];
        let text = reply("host:get-state", None, &list);
        assert!(text.starts_with("FAIL"), "{text}");
        assert!(text.contains("device unauthorized.\nThis adb server's $ADB_VENDOR_KEYS is "));
    }

    #[test]
    fn device_lists_are_adbs_lines() {
        let mut list = two();
        list.push(transport(9, "127.0.0.1:40000", State::Unauthorized));
        assert_eq!(
            device_list(&list, false),
            "10.0.0.2:5555\toffline\n127.0.0.1:40000\tunauthorized\n127.0.0.1:5555\tdevice\n"
        );
        assert_eq!(
            device_list(&list[..1], true),
            "127.0.0.1:5555         device product:debian model:QEMU_Virtual_Machine device:builder transport_id:7\n"
        );
        // Nothing known yet: the id alone.
        let mut bare = transport(2, "a-very-long-serial-number:5555", State::Connecting);
        bare.product.clear();
        bare.model.clear();
        bare.device.clear();
        assert_eq!(
            device_list(&[bare], true),
            "a-very-long-serial-number:5555 connecting transport_id:2\n"
        );
        assert_eq!(reply("host:devices", None, &[]), "OKAY0000");
        assert_eq!(
            reply("host:devices", None, &list[..1]),
            "OKAY0016127.0.0.1:5555\tdevice\n"
        );
    }

    #[test]
    fn qualified_serials_match_the_banner() {
        let t = transport(1, "127.0.0.1:5555", State::Device);
        assert!(matches_target(&t, "model:QEMU_Virtual_Machine"));
        assert!(matches_target(&t, "product:debian"));
        assert!(matches_target(&t, "device:builder"));
        assert!(matches_target(&t, "127.0.0.1"));
        assert!(matches_target(&t, "udp:127.0.0.1:5555"));
        assert!(!matches_target(&t, "127.0.0.1:5556"));
        assert!(!matches_target(&t, "model:QEMU"));
        assert!(!matches_target(&t, "127.0.0"));
    }

    #[test]
    fn forwards_need_a_device_but_lists_do_not() {
        assert_eq!(
            reply("host:forward:tcp:1;tcp:2", None, &[]),
            "FAIL001ano devices/emulators found"
        );
        assert_eq!(
            run("host:list-forward", None, &[]),
            Action::Forward {
                request: ForwardRequest::List,
                transport: None
            }
        );
        let list = two();
        assert_eq!(
            run("host-serial:127.0.0.1:5555:killforward:tcp:1", None, &list),
            Action::Forward {
                request: ForwardRequest::Kill("tcp:1".into()),
                transport: Some(list[0].clone())
            }
        );
        let error = HostService::parse("host:forward:tcp:1").unwrap_err();
        assert_eq!(malformed(&error), fail("bad forward: tcp:1"));
        let error = HostService::parse("host:transport-id:x").unwrap_err();
        assert_eq!(malformed(&error), fail("invalid transport id"));
        let error = HostService::parse("host:frobnicate").unwrap_err();
        assert_eq!(malformed(&error), fail("unknown host service 'frobnicate'"));
    }

    #[test]
    fn pairing_mdns_and_emulator_requests_go_to_their_services() {
        assert_eq!(
            run("host:pair:123456:a:1", None, &[]),
            Action::Pair {
                code: "123456".into(),
                address: "a:1".into()
            }
        );
        assert_eq!(
            run("host:mdns:services", None, &[]),
            Action::Mdns(MdnsQuery::Services)
        );
        assert_eq!(
            run("host:track-mdns-services", None, &[]),
            Action::Mdns(MdnsQuery::Track)
        );
        assert_eq!(reply("host:emulator:5554", None, &[]), "");
    }

    #[test]
    fn proto_lists_are_adbs_devices_message() {
        let mut list = two();
        list[1].model = "QEMU Virtual\nMachine".to_string();
        let devices = devices_proto(&list);
        // Sorted by serial, as the text list.
        let serials: Vec<&str> = devices.device.iter().map(|d| d.serial.as_str()).collect();
        assert_eq!(serials, ["10.0.0.2:5555", "127.0.0.1:5555"]);
        let offline = &devices.device[0];
        assert_eq!(offline.state, proto::ConnectionState::Offline as i32);
        assert_eq!(
            offline.connection_type,
            proto::ConnectionType::Socket as i32
        );
        assert_eq!(offline.model, "QEMU_Virtual_Machine");
        assert_eq!(offline.transport_id, 3);
        assert_eq!(
            tracked_list(&list, DeviceListFormat::ProtoBinary),
            devices.encode_to_vec()
        );
        let text =
            String::from_utf8(tracked_list(&list[..1], DeviceListFormat::ProtoText)).unwrap();
        assert_eq!(
            text,
            "device {\n  serial: \"127.0.0.1:5555\"\n  state: DEVICE\n  product: \"debian\"\n  \
             model: \"QEMU_Virtual_Machine\"\n  device: \"builder\"\n  connection_type: SOCKET\n  \
             transport_id: 7\n}\n"
        );
        assert_eq!(
            tracked_list(&list, DeviceListFormat::Short),
            device_list(&list, false).into_bytes()
        );
        for (request, format) in [
            (
                "host:track-devices-proto-binary",
                DeviceListFormat::ProtoBinary,
            ),
            ("host:track-devices-proto-text", DeviceListFormat::ProtoText),
            ("host:track-devices-l", DeviceListFormat::Long),
        ] {
            assert_eq!(run(request, None, &[]), Action::Track(format));
        }
    }

    #[test]
    fn attach_and_detach_are_for_usb_only_as_adbs() {
        let list = two();
        assert_eq!(
            reply("host:attach", None, &[]),
            "FAIL001ano devices/emulators found"
        );
        assert_eq!(
            reply("host:detach", None, &list),
            "FAIL001dmore than one device/emulator"
        );
        // Any state will do to be found.
        assert_eq!(
            reply("host-serial:10.0.0.2:5555:attach", None, &list),
            "FAIL001battach/detach not supported"
        );
        assert_eq!(
            reply("host-serial:10.0.0.2:5555:detach", None, &list),
            "FAIL001cattach/detach not supported!"
        );
        assert_eq!(
            reply("host:detach", Some(7), &list),
            "FAIL001cattach/detach not supported!"
        );
    }

    #[test]
    fn server_status_and_reconnect_offline_are_the_servers() {
        assert_eq!(run("host:server-status", None, &[]), Action::ServerStatus);
        assert_eq!(
            run("host:reconnect-offline", None, &two()),
            Action::ReconnectOffline
        );
    }

    #[test]
    fn host_prefixes_are_told_from_device_services() {
        assert!(is_host_service("host:version"));
        assert!(is_host_service("host-serial:a:1:get-state"));
        assert!(!is_host_service("shell,v2,raw:echo"));
        assert!(!is_host_service("hostname"));
    }

    #[test]
    fn waits_end_as_adbs() {
        let list = two();
        let any = DeviceSelector::Any;
        let serial = |s: &str| DeviceSelector::Serial(s.to_string());
        assert_eq!(
            wait_outcome(&list, &any, WaitState::Device),
            WaitOutcome::Fail(MORE_THAN_ONE_DEVICE.to_string())
        );
        assert_eq!(
            wait_outcome(&list, &serial("127.0.0.1:5555"), WaitState::Device),
            WaitOutcome::Done
        );
        assert_eq!(
            wait_outcome(&list, &serial("10.0.0.2:5555"), WaitState::Device),
            WaitOutcome::Wait
        );
        assert_eq!(
            wait_outcome(&list, &serial("10.0.0.2:5555"), WaitState::Any),
            WaitOutcome::Done
        );
        assert_eq!(
            wait_outcome(&list, &serial("10.0.0.2:5555"), WaitState::Disconnect),
            WaitOutcome::Wait
        );
        assert_eq!(
            wait_outcome(&[], &any, WaitState::Disconnect),
            WaitOutcome::Done
        );
        assert_eq!(
            wait_outcome(&list, &serial("127.0.0.1:5555"), WaitState::Recovery),
            WaitOutcome::Wait
        );
        // The id a transport switch chose.
        let Action::WaitFor { selector, state } =
            run("host:wait-for-any-disconnect", Some(3), &list)
        else {
            panic!("no wait");
        };
        assert_eq!(selector, DeviceSelector::TransportId(3));
        assert_eq!(state, WaitState::Disconnect);
        let Action::WaitFor { selector, .. } = run(
            "host-serial:10.0.0.2:5555:wait-for-local-device",
            None,
            &list,
        ) else {
            panic!("no wait");
        };
        assert_eq!(selector, serial("10.0.0.2:5555"));
    }
}
