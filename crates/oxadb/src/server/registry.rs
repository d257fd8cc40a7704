//! The transports the server knows: each device `connect:` added and each
//! USB device the watcher ([`super::usb`]) found, with the id the server
//! gave it, its serial (`host:port`, or the USB serial), its state and,
//! once connected, its [`Device`]. Every change bumps a counter that
//! `track-devices` and `wait-for-*` clients watch.
//!
//! A TCP device whose connection ends goes `offline` and is reconnected as
//! adb's server does (AOSP `transport.cpp` ReconnectHandler: an attempt
//! every 3 s, 20 attempts, then the transport is removed); `disconnect:`
//! removes it at once. A USB device whose connection ends is removed, as
//! adb's server kicks a USB transport: the watcher adds it again, under a
//! new id, if it is still plugged in.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use oxadb_wire::Banner;
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;

use crate::reverse::HostEnd;
use crate::{target, ConnectOptions, Device, Error, UsbDeviceInfo};

/// The server's number for a transport, never reused while it runs; adb's
/// `-t ID` and `host:tport:` use it.
pub type TransportId = u64;

/// Time between reconnection attempts (AOSP `transport.cpp`
/// ReconnectHandler::kDefaultTimeout).
pub const RECONNECT_INTERVAL: Duration = Duration::from_secs(3);

/// Attempts before a lost device is removed (ReconnectHandler::kMaxAttempts).
pub const RECONNECT_ATTEMPTS: u32 = 20;

/// A transport's state, with the word adb prints for it (AOSP `adb.cpp`
/// to_string(ConnectionState)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Being connected (the handshake has not finished).
    Connecting,
    Device,
    /// Lost, or not connected again yet.
    Offline,
    /// The device waits for its user to accept this host's key.
    Unauthorized,
}

impl State {
    pub fn word(self) -> &'static str {
        match self {
            State::Connecting => "connecting",
            State::Device => "device",
            State::Offline => "offline",
            State::Unauthorized => "unauthorized",
        }
    }
}

/// How a transport reaches its device: adb's `-d` picks USB ones, `-e` the
/// others (AOSP kTransportUsb and kTransportLocal, in that listing order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Usb,
    Tcp,
}

/// What requests see of a transport: a copy taken under the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportInfo {
    pub id: TransportId,
    pub kind: Kind,
    /// `host:port` for TCP; the device's serial number for USB.
    pub serial: String,
    pub state: State,
    /// `usb:BUS-PORT` for USB; empty for TCP.
    pub devpath: String,
    /// `ro.product.name`, `ro.product.model` and `ro.product.device` from
    /// the device's banner; empty until it connected.
    pub product: String,
    pub model: String,
    pub device: String,
    pub features: Vec<String>,
}

impl TransportInfo {
    /// A transport not yet numbered ([`Inner::add`] gives it its id).
    fn new(kind: Kind, serial: String, devpath: String) -> TransportInfo {
        TransportInfo {
            id: 0,
            kind,
            serial,
            state: State::Connecting,
            devpath,
            product: String::new(),
            model: String::new(),
            device: String::new(),
            features: Vec::new(),
        }
    }

    fn set_banner(&mut self, banner: &Banner) {
        let property = |key: &str| banner.property(key).unwrap_or_default().to_string();
        self.product = property("ro.product.name");
        self.model = property("ro.product.model");
        self.device = property("ro.product.device");
        self.features = banner.features.clone();
    }
}

struct Entry {
    info: TransportInfo,
    device: Option<Arc<Device>>,
    monitor: Option<AbortHandle>,
    /// Wakes its monitor for an attempt now (`host:reconnect-offline`).
    retry_now: Arc<Notify>,
}

impl Entry {
    /// Ends the device's connection and its watcher: streams relayed to it
    /// see their end.
    fn shut(&self) {
        if let Some(monitor) = &self.monitor {
            monitor.abort();
        }
        if let Some(device) = &self.device {
            device.close();
        }
    }
}

/// How a transport's device is connected (again).
enum Reach {
    /// At the address that is its serial (`host:port`, `vsock:CID:PORT`).
    Tcp(String),
    /// Found over mDNS, listed under its service name: never reconnected
    /// (removed when lost, connected again when announced again).
    Mdns(String),
    Usb(Box<UsbDeviceInfo>),
}

impl Reach {
    fn name(&self) -> &str {
        match self {
            Reach::Tcp(serial) | Reach::Mdns(serial) => serial,
            Reach::Usb(device) => &device.serial,
        }
    }

    /// Unattended: a device waiting for its user is `Unauthorized` at once.
    /// `None` for a device that is not connected again.
    async fn connect(&self, options: &ConnectOptions) -> Option<Result<Device, Error>> {
        Some(match self {
            Reach::Tcp(serial) => connect_device(serial, options).await,
            Reach::Mdns(_) => return None,
            Reach::Usb(device) => Device::connect_usb_unattended(device, options).await,
        })
    }
}

#[derive(Default)]
struct Inner {
    next_id: TransportId,
    entries: Vec<Entry>,
}

impl Inner {
    /// Adds `info` under the next id, which it returns.
    fn add(&mut self, mut info: TransportInfo) -> TransportId {
        info.id = self.next_id;
        self.next_id += 1;
        let id = info.id;
        self.entries.push(Entry {
            info,
            device: None,
            monitor: None,
            retry_now: Arc::new(Notify::new()),
        });
        id
    }
}

/// The server's transports.
pub struct Registry {
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
    options: ConnectOptions,
    /// Notified when a USB device's connection ended: the watcher looks
    /// at once whether it is still plugged in.
    usb_lost: Notify,
}

impl Registry {
    /// Every device is connected with `options` (burst mode and adaptive
    /// credit unless the command line said otherwise).
    pub fn new(options: ConnectOptions) -> Arc<Registry> {
        Arc::new(Registry {
            inner: Mutex::new(Inner {
                next_id: 1,
                entries: Vec::new(),
            }),
            changed: watch::Sender::new(0),
            options,
            usb_lost: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|generation| *generation += 1);
    }

    /// Every transport, in the order they were added.
    pub fn list(&self) -> Vec<TransportInfo> {
        self.lock().entries.iter().map(|e| e.info.clone()).collect()
    }

    /// Changes from now on: the value moves on at each one.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The connected device of transport `id`, if it is online.
    pub fn device(&self, id: TransportId) -> Option<Arc<Device>> {
        let inner = self.lock();
        let entry = inner.entries.iter().find(|e| e.info.id == id)?;
        match entry.info.state {
            State::Device => entry.device.clone(),
            _ => None,
        }
    }

    /// Whether transport `id` is still known.
    pub fn contains(&self, id: TransportId) -> bool {
        self.lock().entries.iter().any(|e| e.info.id == id)
    }

    /// `host:connect:ADDRESS`: connects (port 5555 when none is given) and
    /// answers in adb's words (AOSP `client/transport_emulator.cpp`
    /// connect_device): `connected to S`, `already connected to S`,
    /// `failed to authenticate to S` (kept, as `unauthorized`, until its
    /// user accepts), `failed to connect to 'S': CAUSE`.
    pub async fn connect(self: &Arc<Self>, address: &str) -> String {
        if address.is_empty() {
            return "empty address".to_string();
        }
        let serial = if address.starts_with("vsock:") {
            match vsock_serial(address) {
                Ok(serial) => serial,
                Err(answer) => return answer,
            }
        } else {
            target::with_default_port(address)
        };
        self.connect_at(serial.clone(), serial).await
    }

    /// Connects the device at `dial` (`host:port` or `vsock:CID:PORT`) as
    /// transport `serial`.
    /// A device found over mDNS is listed under its service name
    /// (`INSTANCE._adb-tls-connect._tcp`, AOSP `socket_spec.cpp`) and, as
    /// in adb (`client/transport_emulator.cpp` connect_device), is not
    /// reconnected when lost: it is removed, and connected again when it
    /// is announced again.
    pub async fn connect_at(self: &Arc<Self>, serial: String, dial: String) -> String {
        let id = {
            let mut inner = self.lock();
            if inner.entries.iter().any(|e| e.info.serial == serial) {
                return format!("already connected to {serial}");
            }
            inner.add(TransportInfo::new(Kind::Tcp, serial.clone(), String::new()))
        };
        self.notify();
        let (answer, device) = match connect_device(&dial, &self.options).await {
            Ok(device) => (format!("connected to {serial}"), Some(Arc::new(device))),
            Err(Error::Unauthorized { .. }) => {
                self.set_state(id, State::Unauthorized);
                (format!("failed to authenticate to {serial}"), None)
            }
            Err(error) => {
                tracing::info!(%serial, %error, "connect failed");
                self.remove(id);
                // adb's words differ by socket type (AOSP `socket_spec.cpp`
                // socket_spec_connect, `sysdeps/posix/network.cpp`); a vsock
                // socket that connected but gave no device is connect_device's.
                if dial.starts_with("vsock:") {
                    return match error {
                        Error::Connect { .. } => {
                            format!("could not connect to vsock address '{dial}'")
                        }
                        _ => format!("failed to connect to {serial}"),
                    };
                }
                return format!(
                    "failed to connect to '{serial}': {}",
                    error.cause_in_adb_words()
                );
            }
        };
        if let Some(device) = &device {
            if !self.set_online(id, device.clone()) {
                // Disconnected while the handshake ran.
                device.close();
                return format!("failed to connect to {serial}");
            }
        }
        let reach = if serial == dial {
            Reach::Tcp(serial)
        } else {
            Reach::Mdns(serial)
        };
        self.watch(id, reach, device, RECONNECT_INTERVAL);
        answer
    }

    /// Starts the monitor of transport `id`: the first attempt to connect
    /// (when `device` is `None`) comes after `first_attempt_in`.
    fn watch(
        self: &Arc<Self>,
        id: TransportId,
        reach: Reach,
        device: Option<Arc<Device>>,
        first_attempt_in: Duration,
    ) {
        let Some(retry_now) = self
            .lock()
            .entries
            .iter()
            .find(|e| e.info.id == id)
            .map(|e| e.retry_now.clone())
        else {
            return;
        };
        let monitor = tokio::spawn(monitor(
            self.clone(),
            id,
            reach,
            device,
            first_attempt_in,
            retry_now,
        ));
        match self.lock().entries.iter_mut().find(|e| e.info.id == id) {
            Some(entry) => entry.monitor = Some(monitor.abort_handle()),
            None => monitor.abort(),
        }
    }

    /// A USB device the watcher found: listed as `connecting` and connected
    /// at once; returns its id.
    pub(super) fn add_usb(self: &Arc<Self>, device: UsbDeviceInfo) -> TransportId {
        let id = self.lock().add(TransportInfo::new(
            Kind::Usb,
            device.serial.clone(),
            device.path.clone(),
        ));
        self.notify();
        self.watch(id, Reach::Usb(Box::new(device)), None, Duration::ZERO);
        id
    }

    /// A USB device that was unplugged: its transport ends.
    pub(super) fn remove_usb(&self, id: TransportId) {
        if let Some(entry) = self.take(id) {
            entry.shut();
        }
    }

    /// Waits until a USB device's connection ends.
    pub(super) async fn usb_lost(&self) {
        self.usb_lost.notified().await;
    }

    /// `host:disconnect:ADDRESS` (AOSP `adb.cpp` handle_host_request): an
    /// empty address removes every TCP device; otherwise the one whose
    /// serial is the address, or the address with port 5555. `Err` is the
    /// `FAIL` message.
    pub fn disconnect(&self, address: &str) -> Result<String, String> {
        let removed: Vec<Entry> = {
            let mut inner = self.lock();
            if address.is_empty() {
                let (tcp, rest) = std::mem::take(&mut inner.entries)
                    .into_iter()
                    .partition(|e| e.info.kind == Kind::Tcp);
                inner.entries = rest;
                tcp
            } else {
                let serial = target::with_default_port(address);
                // USB devices are not disconnected: adb reads the address
                // as host[:port] (AOSP `adb.cpp`), which no USB serial is.
                let tcp_with = |wanted: &str| {
                    inner
                        .entries
                        .iter()
                        .position(|e| e.info.kind == Kind::Tcp && e.info.serial == wanted)
                };
                let Some(at) = tcp_with(address).or_else(|| tcp_with(&serial)) else {
                    return Err(format!("no such device '{serial}'"));
                };
                vec![inner.entries.remove(at)]
            }
        };
        for entry in &removed {
            entry.shut();
        }
        self.notify();
        Ok(if address.is_empty() {
            "disconnected everything".to_string()
        } else {
            format!("disconnected {address}")
        })
    }

    /// `host:reconnect`: drops the connection of transport `id`, which is
    /// then connected again as a lost one is; the answer in adb's words.
    pub fn reconnect(&self, id: TransportId) -> String {
        let inner = self.lock();
        let Some(entry) = inner.entries.iter().find(|e| e.info.id == id) else {
            return String::new();
        };
        if let Some(device) = &entry.device {
            device.close();
        }
        format!(
            "reconnecting {} [{}]\n",
            entry.info.serial,
            entry.info.state.word()
        )
    }

    /// `host:reconnect-offline`: every transport that is not online is
    /// tried again now rather than at its next attempt; the answer is
    /// adb's, a `reconnecting SERIAL` line for each, newest first (AOSP
    /// `adb.cpp` handle_host_request; `transport.cpp` keeps its list so),
    /// without the last newline.
    pub fn reconnect_offline(&self) -> String {
        let inner = self.lock();
        let mut lines = Vec::new();
        for entry in inner.entries.iter().rev() {
            if entry.info.state != State::Device {
                entry.retry_now.notify_one();
                lines.push(format!("reconnecting {}", entry.info.serial));
            }
        }
        lines.join("\n")
    }

    fn remove(&self, id: TransportId) {
        if let Some(entry) = self.take(id) {
            // Not `shut`: the monitor removing its own entry must finish.
            if let Some(device) = &entry.device {
                device.close();
            }
        }
    }

    /// Takes transport `id` out of the list, telling the watchers.
    fn take(&self, id: TransportId) -> Option<Entry> {
        let removed = {
            let mut inner = self.lock();
            let at = inner.entries.iter().position(|e| e.info.id == id);
            at.map(|at| inner.entries.remove(at))
        };
        if removed.is_some() {
            self.notify();
        }
        removed
    }

    /// Records a change to transport `id`; false when it is gone.
    fn update(&self, id: TransportId, change: impl FnOnce(&mut Entry)) -> bool {
        let found = {
            let mut inner = self.lock();
            match inner.entries.iter_mut().find(|e| e.info.id == id) {
                Some(entry) => {
                    change(entry);
                    true
                }
                None => false,
            }
        };
        if found {
            self.notify();
        }
        found
    }

    fn set_state(&self, id: TransportId, state: State) -> bool {
        self.update(id, |entry| {
            entry.info.state = state;
            if state != State::Device {
                entry.device = None;
            }
        })
    }

    fn set_online(&self, id: TransportId, device: Arc<Device>) -> bool {
        self.update(id, |entry| {
            entry.info.set_banner(device.banner());
            entry.info.state = State::Device;
            entry.device = Some(device);
        })
    }
}

/// Watches transport `id` for as long as it is known: serves the streams
/// its device opens (`adb reverse`), and when its connection ends marks a
/// TCP device offline and connects it again, or removes a USB one.
async fn monitor(
    registry: Arc<Registry>,
    id: TransportId,
    reach: Reach,
    mut device: Option<Arc<Device>>,
    first_attempt_in: Duration,
    retry_now: Arc<Notify>,
) {
    let serial = reach.name().to_string();
    let mut attempts = 0;
    let mut delay = first_attempt_in;
    loop {
        if let Some(online) = device.take() {
            while let Some(incoming) = online.next_incoming().await {
                tokio::spawn(serve_reverse(incoming));
            }
            tracing::info!(%serial, reason = ?online.lost().map(|e| e.to_string()), "device offline");
            if let Reach::Usb(_) = reach {
                registry.remove(id);
                registry.usb_lost.notify_one();
                return;
            }
            if !registry.set_state(id, State::Offline) {
                return;
            }
            attempts = 0;
            delay = RECONNECT_INTERVAL;
        }
        if let Reach::Mdns(_) = reach {
            tracing::info!(%serial, "not reconnected (found over mDNS); removed");
            registry.remove(id);
            return;
        }
        // A USB device is retried for as long as it is plugged in: the
        // watcher removes it once it is not.
        if matches!(reach, Reach::Tcp(_)) && attempts == RECONNECT_ATTEMPTS {
            tracing::info!(%serial, attempts, "giving up reconnecting; removed");
            registry.remove(id);
            return;
        }
        attempts += 1;
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = retry_now.notified() => {}
        }
        delay = RECONNECT_INTERVAL;
        if !registry.contains(id) {
            return;
        }
        let Some(result) = reach.connect(&registry.options).await else {
            registry.remove(id);
            return;
        };
        match result {
            Ok(connected) => {
                let connected = Arc::new(connected);
                if !registry.set_online(id, connected.clone()) {
                    connected.close();
                    return;
                }
                match reach {
                    Reach::Tcp(_) | Reach::Mdns(_) => tracing::info!(%serial, "reconnected"),
                    Reach::Usb(_) => tracing::info!(%serial, "USB device connected"),
                }
                device = Some(connected);
            }
            Err(Error::Unauthorized { .. }) => {
                // Its user may accept the key any time: no attempt is lost.
                attempts = 0;
                registry.set_state(id, State::Unauthorized);
            }
            Err(error) => {
                if let Reach::Usb(_) = reach {
                    // Claimed by another process, no permission, ...: the
                    // log says which; it stays listed as adb lists it.
                    if attempts == 1 {
                        tracing::info!(%serial, %error, "USB device not connected; retrying every 3 s");
                    }
                    registry.set_state(id, State::Offline);
                }
                tracing::debug!(%serial, %error, attempts, "reconnect failed");
            }
        }
    }
}

/// Connects the device of `serial`: `vsock:CID:PORT` over vsock, anything
/// else over TCP (adb's connect_device: `vsock:` is the one other socket
/// type a Linux server connects).
async fn connect_device(serial: &str, options: &ConnectOptions) -> Result<Device, Error> {
    if serial.starts_with("vsock:") {
        Device::connect_vsock(serial, options, false).await
    } else {
        Device::connect_unattended(serial, options).await
    }
}

/// `vsock:CID:PORT`'s serial, `vsock:CID:PORT` with both as numbers; `Err`
/// is adb's answer to a spec it cannot use (AOSP `socket_spec.cpp`
/// socket_spec_connect).
fn vsock_serial(address: &str) -> Result<String, String> {
    let fragments: Vec<&str> = address.split(':').collect();
    if !(2..=3).contains(&fragments.len()) {
        return Err(format!(
            "expected vsock:cid or vsock:cid:port in '{address}'"
        ));
    }
    let cid: u32 = fragments[1]
        .parse()
        .map_err(|_| format!("could not parse vsock cid in '{address}'"))?;
    let port: u32 = match fragments.get(2) {
        Some(port) => port
            .parse()
            .map_err(|_| format!("could not parse vsock port in '{address}'"))?,
        None => 0,
    };
    if port == 0 {
        return Err("vsock port was not provided.".to_string());
    }
    Ok(format!("vsock:{cid}:{port}"))
}

/// A stream the device opened for a reverse forward asked for on this
/// transport (`adb reverse`; the connection refuses every other at once,
/// oxadb-engine `reverse_forwards.rs`): connected to the host end it names
/// on this machine, as adb's server does, or refused.
async fn serve_reverse(incoming: oxadb_io::Incoming) {
    let end = match HostEnd::parse(incoming.service()) {
        Ok(end) => end,
        Err(error) => {
            tracing::debug!(%error, "refusing a stream the device opened");
            incoming.refuse();
            return;
        }
    };
    match end.connect().await {
        Ok(socket) => super::relay(socket, incoming.accept()).await,
        Err(error) => {
            tracing::debug!(service = incoming.service(), %error, "reverse connection refused here");
            incoming.refuse();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vsock_specs_as_adb_reads_them() {
        assert_eq!(vsock_serial("vsock:3:5555"), Ok("vsock:3:5555".into()));
        assert_eq!(vsock_serial("vsock:03:05555"), Ok("vsock:3:5555".into()));
        assert_eq!(
            vsock_serial("vsock:3"),
            Err("vsock port was not provided.".into())
        );
        assert_eq!(
            vsock_serial("vsock:x:1"),
            Err("could not parse vsock cid in 'vsock:x:1'".into())
        );
        assert_eq!(
            vsock_serial("vsock:1:y"),
            Err("could not parse vsock port in 'vsock:1:y'".into())
        );
        assert_eq!(
            vsock_serial("vsock:1:2:3"),
            Err("expected vsock:cid or vsock:cid:port in 'vsock:1:2:3'".into())
        );
    }
}
