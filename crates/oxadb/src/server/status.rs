//! `host:server-status`: what the server says of itself in adb's
//! `AdbServerStatus` (AOSP `adb.cpp` handle_host_request), with what is
//! true of this one: USB through usbfs (nusb, adb's "native" backend)
//! unless `ADB_USB=0`, mDNS by mdns-sd unless `ADB_MDNS=0`
//! (docs/server.md), oxadb's version, this executable, where its log goes,
//! the keys it offers and the devices it paired with.

use std::path::PathBuf;

use super::proto::{AdbServerStatus, MdnsBackend, UsbBackend};
use crate::ConnectOptions;

/// The status of a server that connects devices with `connect`, whose USB
/// watcher and mDNS discovery run or not.
pub fn server_status(connect: &ConnectOptions, usb_on: bool, mdns_on: bool) -> AdbServerStatus {
    let version = env!("CARGO_PKG_VERSION");
    AdbServerStatus {
        usb_backend: if usb_on {
            UsbBackend::Native
        } else {
            UsbBackend::UsbDisabled
        } as i32,
        usb_backend_forced: false,
        // mdns-sd is none of the backends adb names.
        mdns_backend: if mdns_on {
            MdnsBackend::UnknownMdns
        } else {
            MdnsBackend::MdnsDisabled
        } as i32,
        mdns_backend_forced: false,
        version: version.to_string(),
        build: format!("oxadb-{version}"),
        executable_absolute_path: std::env::current_exe()
            .map(|path| path.display().to_string())
            .unwrap_or_default(),
        log_absolute_path: log_file()
            .map(|path| path.display().to_string())
            .unwrap_or_default(),
        os: os_version(),
        // adb's ADB_TRACE tags mean nothing here (oxadb logs by -v).
        trace_level: None,
        burst_mode: Some(connect.credit.delayed_ack()),
        mdns_enabled: Some(mdns_on),
        keystore_path: oxadb_auth::default_android_dir()
            .ok()
            .map(|dir| dir.join("adbkey").display().to_string()),
        known_hosts_path: oxadb_auth::KnownHosts::load_default()
            .ok()
            .map(|known| known.path().display().to_string()),
    }
}

/// The file the log (stderr) goes to, if it is one.
fn log_file() -> Option<PathBuf> {
    let path = std::fs::read_link("/proc/self/fd/2").ok()?;
    let is_file = std::fs::metadata(&path).ok()?.is_file();
    (path.is_absolute() && is_file).then_some(path)
}

/// As adb words it (AOSP `sysdeps_unix.cpp` GetOSVersion):
/// `Linux 6.1.0-13-amd64 (x86_64)`.
fn os_version() -> String {
    let name = rustix::system::uname();
    format!(
        "{} {} ({})",
        name.sysname().to_string_lossy(),
        name.release().to_string_lossy(),
        name.machine().to_string_lossy()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_says_what_this_server_is() {
        let status = server_status(&ConnectOptions::default(), false, false);
        assert_eq!(status.usb_backend, UsbBackend::UsbDisabled as i32);
        assert_eq!(status.mdns_backend, MdnsBackend::MdnsDisabled as i32);
        assert_eq!(status.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(status.burst_mode, Some(true));
        assert_eq!(status.mdns_enabled, Some(false));
        assert!(
            status.os.starts_with("Linux ") && status.os.ends_with(')'),
            "{}",
            status.os
        );
        assert!(status.executable_absolute_path.starts_with('/'));
        let classic = ConnectOptions {
            credit: crate::CreditMode::Classic,
            ..ConnectOptions::default()
        };
        assert_eq!(
            server_status(&classic, false, false).burst_mode,
            Some(false)
        );
        let browsing = server_status(&ConnectOptions::default(), true, true);
        assert_eq!(browsing.usb_backend, UsbBackend::Native as i32);
        assert_eq!(browsing.mdns_backend, MdnsBackend::UnknownMdns as i32);
        assert_eq!(browsing.mdns_enabled, Some(true));
    }
}
