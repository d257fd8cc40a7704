//! adb's one-shot device services: `reboot`, `root`, `unroot`, `remount`,
//! `tcpip`, `usb` (the service's answer copied to stdout, as adb's
//! `adb_connect_command` does), plus `sync` and the Android package
//! commands, which a Linux device cannot serve.

use std::num::NonZeroU16;

use anyhow::Context;
use oxadb::DeviceService;

use super::endpoint::Endpoint;
use tokio::io::AsyncWriteExt;

/// Opens `service` and copies what the device answers to stdout.
pub async fn one_shot(device: &Endpoint, service: &DeviceService) -> anyhow::Result<i32> {
    let mut stream = device.open(service).await?;
    let mut stdout = tokio::io::stdout();
    tokio::io::copy(&mut stream, &mut stdout)
        .await
        .with_context(|| format!("{}: {service}", device.serial()))?;
    stdout.flush().await?;
    Ok(0)
}

/// `reboot [TARGET]`: `reboot:TARGET` (bootloader, recovery, sideload...).
pub async fn reboot(device: &Endpoint, target: Option<&str>) -> anyhow::Result<i32> {
    let target = target.unwrap_or("").to_string();
    one_shot(device, &DeviceService::Reboot(target)).await
}

/// `tcpip PORT`, with adb's check of the port.
pub fn tcpip_service(port: Option<&str>) -> Result<DeviceService, String> {
    let port = port.ok_or("adb: tcpip requires an argument")?;
    match port.parse::<NonZeroU16>() {
        Ok(number) => Ok(DeviceService::TcpIp(number)),
        Err(_) => Err(format!("adb: tcpip: invalid port: {port}")),
    }
}

/// adb 29's `sync [all|data|odm|oem|product|system|vendor]` pushes the
/// build in $ANDROID_PRODUCT_OUT; refused as adb refuses it when unset.
pub fn sync() -> i32 {
    match std::env::var_os("ANDROID_PRODUCT_OUT").filter(|d| !d.is_empty()) {
        None => eprintln!("adb: product directory not specified; set $ANDROID_PRODUCT_OUT"),
        Some(dir) => eprintln!(
            "oxadb: sync: cannot sync {}: an Android build's partitions (system, vendor...) have no place on a Linux device; use `oxadb push`",
            std::path::Path::new(&dir).display()
        ),
    }
    1
}

/// The Android package and recovery commands: no package manager or
/// recovery on a Linux device. `None` if `command` is not one of them.
pub fn refuse_android_only(command: &str) -> Option<i32> {
    const ANDROID_ONLY: &[&str] = &[
        "install",
        "install-multiple",
        "install-multi-package",
        "uninstall",
        "sideload",
        "backup",
        "restore",
        "bugreport",
        "jdwp",
    ];
    if !ANDROID_ONLY.contains(&command) {
        return None;
    }
    let why = match command {
        "sideload" => "it needs Android's recovery",
        "backup" | "restore" => "it needs Android's backup manager",
        "bugreport" => "it needs Android's bugreportz",
        "jdwp" => "there are no Java processes to debug",
        _ => "there is no Android package manager on a Linux device (copy files with `oxadb push`)",
    };
    eprintln!("oxadb: {command} is not supported: {why}");
    Some(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcpip_checks_the_port_as_adb() {
        assert_eq!(
            tcpip_service(Some("5555")).unwrap().to_string(),
            "tcpip:5555"
        );
        assert_eq!(
            tcpip_service(None).unwrap_err(),
            "adb: tcpip requires an argument"
        );
        assert_eq!(
            tcpip_service(Some("abc")).unwrap_err(),
            "adb: tcpip: invalid port: abc"
        );
        assert!(tcpip_service(Some("0")).is_err());
        assert!(tcpip_service(Some("65536")).is_err());
    }
}
