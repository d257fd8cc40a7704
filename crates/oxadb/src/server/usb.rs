//! USB devices for the server: the ADB interfaces plugged in are kept in
//! the registry, each added when it appears and removed when it goes, as
//! Google's server does (AOSP `client/usb_libusb.cpp`, `client/usb_linux.cpp`:
//! an unplugged USB device leaves the list rather than going offline).
//!
//! What is plugged in is read from the OS's cache ([`crate::usb::list_devices`],
//! sysfs on Linux, no device opened). It is read again at every hotplug
//! event (nusb's watch: udev's events on Linux), whenever a USB device's
//! connection ends, and every [`RESCAN_INTERVAL`] anyway: a machine without
//! udev (a container, a minimal VM) gets no hotplug events at all.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;

use super::registry::{Registry, TransportId};
use crate::usb::{self, UsbDeviceInfo};

/// The longest a device plugged in or unplugged goes unseen without
/// hotplug events (AOSP `client/usb_linux.cpp` polls every second; this is
/// shorter so that a device shows within a second without udev too).
pub const RESCAN_INTERVAL: Duration = Duration::from_millis(500);

/// Whether the server looks for USB devices: `ADB_USB=0` keeps Google's
/// server off USB (AOSP `client/main.cpp`), so it keeps this one off too.
pub fn enabled_by_env() -> bool {
    enabled(std::env::var_os("ADB_USB").as_deref())
}

/// [`enabled_by_env`] for the value of `ADB_USB`.
fn enabled(adb_usb: Option<&std::ffi::OsStr>) -> bool {
    adb_usb.is_none_or(|value| value != "0")
}

/// One plugged-in device: its bus and its address there, which a device
/// gets anew each time it is plugged in (or its gadget is bound again).
type Plugged = (String, u8);

fn plugged(device: &UsbDeviceInfo) -> Plugged {
    (device.bus.clone(), device.address)
}

/// Keeps the registry's USB transports in step with what is plugged in,
/// for as long as the server runs. On a machine without USB it says so
/// once and returns.
pub async fn watch(registry: Arc<Registry>) {
    // The watch before the first listing, so that nothing plugged in
    // between the two is missed (nusb's `watch_devices` documentation).
    let mut hotplug = match nusb::watch_devices() {
        Ok(hotplug) => Some(hotplug),
        Err(error) => {
            tracing::info!(%error, "no USB hotplug events; looking for USB devices every {RESCAN_INTERVAL:?}");
            None
        }
    };
    let mut known: HashMap<Plugged, TransportId> = HashMap::new();
    let mut listing_failed = false;
    let mut tick = tokio::time::interval(RESCAN_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        match usb::list_devices().await {
            Ok(devices) => {
                if listing_failed {
                    tracing::info!("listing USB devices works again");
                    listing_failed = false;
                }
                reconcile(&registry, &mut known, devices);
            }
            Err(error) if usb::no_usb_here(&error) => {
                tracing::info!(%error, "no USB on this machine: serving TCP devices only");
                return;
            }
            Err(error) => {
                if !listing_failed {
                    tracing::warn!(%error, "listing USB devices failed; trying again");
                    listing_failed = true;
                }
            }
        }
        tokio::select! {
            event = next_event(&mut hotplug) => tracing::debug!(?event, "USB hotplug"),
            () = registry.usb_lost() => {}
            _ = tick.tick() => {}
        }
    }
}

/// The next hotplug event; never, without a watch.
async fn next_event(
    hotplug: &mut Option<nusb::hotplug::HotplugWatch>,
) -> nusb::hotplug::HotplugEvent {
    match hotplug {
        Some(watch) => std::future::poll_fn(|cx| Pin::new(&mut *watch).poll_next(cx))
            .await
            .expect("nusb's hotplug stream never ends"),
        None => std::future::pending().await,
    }
}

/// Adds the devices in `devices` that are not known yet and removes the
/// known ones that are no longer there (or whose transport ended).
fn reconcile(
    registry: &Arc<Registry>,
    known: &mut HashMap<Plugged, TransportId>,
    devices: Vec<UsbDeviceInfo>,
) {
    let present: Vec<Plugged> = devices.iter().map(plugged).collect();
    known.retain(|device, id| {
        let still = present.contains(device) && registry.contains(*id);
        if !still {
            tracing::info!(bus = %device.0, address = device.1, "USB device gone");
            registry.remove_usb(*id);
        }
        still
    });
    for device in devices {
        let key = plugged(&device);
        if known.contains_key(&key) {
            continue;
        }
        tracing::info!(serial = %device.serial, path = %device.path, "USB device found");
        known.insert(key, registry.add_usb(device));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::registry::{Kind, State};
    use crate::ConnectOptions;

    fn device(serial: &str, path: &str, address: u8) -> UsbDeviceInfo {
        let mut device = UsbDeviceInfo::for_test(serial, path);
        device.address = address;
        device
    }

    #[tokio::test]
    async fn devices_come_and_go_with_what_is_plugged_in() {
        let registry = Registry::new(ConnectOptions::default());
        let mut known = HashMap::new();
        reconcile(
            &registry,
            &mut known,
            vec![device("AAA", "usb:1-1", 3), device("BBB", "usb:1-2", 4)],
        );
        let listed = registry.list();
        assert_eq!(listed.len(), 2);
        assert!(listed.iter().all(|t| t.kind == Kind::Usb));
        assert_eq!(
            (listed[0].serial.as_str(), listed[0].devpath.as_str()),
            ("AAA", "usb:1-1")
        );
        let first_ids: Vec<TransportId> = listed.iter().map(|t| t.id).collect();

        // The same devices again: nothing changes.
        reconcile(
            &registry,
            &mut known,
            vec![device("AAA", "usb:1-1", 3), device("BBB", "usb:1-2", 4)],
        );
        let ids: Vec<TransportId> = registry.list().iter().map(|t| t.id).collect();
        assert_eq!(ids, first_ids);

        // BBB unplugged, AAA plugged in again (a new address): BBB leaves,
        // AAA is a new transport with a new id.
        reconcile(&registry, &mut known, vec![device("AAA", "usb:1-1", 5)]);
        let listed = registry.list();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].serial, "AAA");
        assert!(!first_ids.contains(&listed[0].id));

        reconcile(&registry, &mut known, Vec::new());
        assert!(registry.list().is_empty());
        assert!(known.is_empty());
    }

    #[tokio::test]
    async fn a_device_that_cannot_be_opened_stays_listed_offline() {
        // A test device has no nusb handle: opening it fails, as a device
        // claimed by another process or without permission does.
        let registry = Registry::new(ConnectOptions::default());
        let mut known = HashMap::new();
        reconcile(&registry, &mut known, vec![device("AAA", "usb:1-1", 3)]);
        let mut changes = registry.changes();
        let offline = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if registry.list().first().map(|t| t.state) == Some(State::Offline) {
                    return;
                }
                changes.changed().await.unwrap();
            }
        })
        .await;
        assert!(offline.is_ok(), "{:?}", registry.list());
        reconcile(&registry, &mut known, vec![device("AAA", "usb:1-1", 3)]);
        assert_eq!(registry.list().len(), 1);
    }

    #[test]
    fn adb_usb_0_turns_usb_off() {
        assert!(!enabled(Some("0".as_ref())));
        assert!(enabled(Some("1".as_ref())));
        assert!(enabled(Some("".as_ref())));
        assert!(enabled(None));
    }
}
