//! `oxadb devices [-l]`: the USB devices with an ADB interface, and the TCP
//! device a command would use, each with its state.
//!
//! There is no adb server keeping connections, so each device is connected
//! to briefly (in parallel) to tell `device` from `unauthorized`, as Google's
//! adb server does when a device appears: a device that has not accepted
//! this host's key shows its "Allow USB debugging?" prompt then.

use std::time::Duration;

use oxadb::target::{self, Target};
use oxadb::{ConnectOptions, Device, DeviceState};

#[derive(Debug, clap::Args)]
pub struct DevicesArgs {
    /// Long listing: the USB path, product, model and device names.
    #[arg(short = 'l', long = "long")]
    pub long: bool,
}

/// How long a device has to answer our CNXN before it is listed `offline`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Lists devices; `serial` (`-s`, `ANDROID_SERIAL`) adds its TCP device, and
/// without it the default `127.0.0.1:5555` is listed when it answers.
pub async fn devices(
    serial: Option<&str>,
    connected: &[String],
    options: &ConnectOptions,
    args: &DevicesArgs,
) -> anyhow::Result<i32> {
    let usb = match oxadb::usb::list_devices().await {
        Ok(usb) => usb,
        // No USB at all (a VM, a container without /sys/bus/usb) is no news.
        Err(error) if oxadb::usb::no_usb_here(&error) => {
            tracing::debug!(%error, "no USB devices");
            Vec::new()
        }
        Err(error) => {
            tracing::warn!(%error, "cannot list USB devices");
            Vec::new()
        }
    };
    // The TCP device a command would go to, if any: `-s host:port` (or a
    // bare host no USB device has as serial), or the default.
    let socket = match serial {
        // With devices `connect`ed, commands go to them, not the default.
        None if !connected.is_empty() => None,
        None => Some(Target::Tcp(target::DEFAULT_TCP.to_string())),
        Some(serial) => match target::choose(Some(serial), &usb) {
            Ok(target @ (Target::Tcp(_) | Target::Vsock(_))) => Some(target),
            _ => None,
        },
    };
    let mut targets: Vec<Target> = usb.into_iter().map(|d| Target::Usb(Box::new(d))).collect();
    // The devices `oxadb connect` added, listed even when they do not
    // answer (`offline`), as adb's server lists its TCP transports.
    let remembered = targets.len();
    for address in connected {
        targets.push(Target::Tcp(address.clone()));
    }
    let remembered = remembered..targets.len();
    if let Some(socket) = socket {
        if !connected.iter().any(|c| c == socket.serial()) {
            targets.push(socket);
        }
    }
    let mut options = options.clone();
    options.timeout = PROBE_TIMEOUT;
    let mut probes = tokio::task::JoinSet::new();
    for (index, target) in targets.iter().cloned().enumerate() {
        let options = options.clone();
        probes.spawn(async move { (index, Device::probe(&target, &options).await) });
    }
    let mut states: Vec<Option<DeviceState>> = vec![None; targets.len()];
    while let Some(joined) = probes.join_next().await {
        let (index, state) = joined?;
        states[index] = Some(state);
    }
    println!("List of devices attached");
    for (index, (target, state)) in targets.iter().zip(states).enumerate() {
        let state = state.expect("every probe ends");
        if let DeviceState::Offline(reason) = &state {
            tracing::debug!(serial = target.serial(), reason, "offline");
            // A socket address nothing listens on is no device at all,
            // unless `connect` added it.
            if matches!(target, Target::Tcp(_) | Target::Vsock(_)) && !remembered.contains(&index) {
                continue;
            }
        }
        if !args.long {
            println!("{}\t{}", target.serial(), state.word());
            continue;
        }
        let mut line = format!("{:<22} {}", target.serial(), state.word());
        if let Target::Usb(device) = target {
            line.push_str(&format!(" {}", device.path));
        }
        if let DeviceState::Device(banner) = &state {
            for (key, property) in [
                ("product", "ro.product.name"),
                ("model", "ro.product.model"),
                ("device", "ro.product.device"),
            ] {
                if let Some(value) = banner.property(property) {
                    // adb shows spaces in a model name as underscores.
                    line.push_str(&format!(" {key}:{}", value.replace(' ', "_")));
                }
            }
        }
        println!("{line}");
    }
    println!();
    Ok(0)
}
