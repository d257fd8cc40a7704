//! What adb's server does for its clients, without a server: `connect`,
//! `disconnect`, `reconnect`, `wait-for-*`, `get-serialno`, `get-devpath`,
//! `kill-server` and `start-server`, with adb 29's words and exit codes
//! (client/commandline.cpp, adb.cpp's host services).

use std::time::Duration;

use anyhow::bail;
use oxadb::target::{self, Target};
use oxadb::{ConnectOptions, Device, DeviceState, Error};

use super::state;

/// `connect HOST[:PORT]`: connects (the handshake included) and remembers
/// the device. adb exits 0 even when the connection fails, printing why.
pub async fn connect(address: Option<&str>, options: &ConnectOptions) -> anyhow::Result<i32> {
    let Some(address) = address else {
        eprintln!("adb: usage: adb connect HOST[:PORT]");
        return Ok(1);
    };
    let serial = target::with_default_port(address);
    if state::State::load()?.devices.contains(&serial) {
        println!("already connected to {serial}");
        return Ok(0);
    }
    let answer = match Device::connect_unattended(&serial, options).await {
        Ok(device) => {
            device.close();
            format!("connected to {serial}")
        }
        // adb 29 keeps an unauthorized device (`adb devices` lists it so,
        // until its user accepts the key) and still exits 0.
        Err(Error::Unauthorized { .. }) => format!("failed to authenticate to {serial}"),
        Err(error) => {
            println!(
                "failed to connect to '{serial}': {}",
                error.cause_in_adb_words()
            );
            return Ok(0);
        }
    };
    let mut locked = state::lock()?;
    if locked.state.devices.contains(&serial) {
        // Another oxadb connected it meanwhile.
        println!("already connected to {serial}");
        return Ok(0);
    }
    locked.state.devices.push(serial.clone());
    locked.save()?;
    println!("{answer}");
    Ok(0)
}

/// `disconnect [HOST[:PORT]]`: forgets one device, or all of them.
pub fn disconnect(address: Option<&str>) -> anyhow::Result<i32> {
    let mut locked = state::lock()?;
    let Some(address) = address else {
        locked.state.devices.clear();
        locked.save()?;
        println!("disconnected everything");
        return Ok(0);
    };
    let serial = target::with_default_port(address);
    if !locked.state.devices.contains(&serial) {
        eprintln!("error: no such device '{serial}'");
        return Ok(1);
    }
    locked.state.devices.retain(|d| d != &serial);
    locked.save()?;
    println!("disconnected {serial}");
    Ok(0)
}

/// `reconnect`: there is no kept connection to drop, so a new one is made
/// and its state reported as adb's server does (`reconnecting SERIAL [STATE]`).
pub async fn reconnect(serial: Option<&str>, options: &ConnectOptions) -> anyhow::Result<i32> {
    let target = oxadb::resolve(serial).await?;
    let state = Device::probe(&target, options).await;
    println!("reconnecting {} [{}]\n", target.serial(), state.word());
    Ok(0)
}

/// Which devices a `wait-for-TRANSPORT-STATE` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Usb,
    Local,
    Any,
}

/// `wait-for[-TRANSPORT]-STATE`, e.g. `wait-for-device`,
/// `wait-for-usb-disconnect`: `None` when `command` is not one.
pub async fn wait_for(
    command: &str,
    serial: Option<&str>,
    options: &ConnectOptions,
) -> Option<anyhow::Result<i32>> {
    let rest = command.strip_prefix("wait-for-")?;
    let (transport, state) = match rest.split_once('-') {
        Some(("usb", state)) => (Transport::Usb, state),
        Some(("local", state)) => (Transport::Local, state),
        Some(("any", state)) => (Transport::Any, state),
        _ => (Transport::Any, rest),
    };
    Some(wait(transport, state, serial, options).await)
}

async fn wait(
    transport: Transport,
    state: &str,
    serial: Option<&str>,
    options: &ConnectOptions,
) -> anyhow::Result<i32> {
    match state {
        "device" | "any" | "disconnect" => {}
        // States an oxadbd device never enters: adb would wait forever too.
        "recovery" | "rescue" | "sideload" | "bootloader" => {}
        _ => {
            eprintln!(
                "oxadb: invalid state '{state}': expected device, recovery, rescue, sideload, bootloader, any or disconnect"
            );
            return Ok(1);
        }
    }
    let mut options = options.clone();
    options.timeout = Duration::from_secs(3);
    loop {
        let present = match oxadb::resolve(serial).await {
            Ok(target) if transport_matches(transport, &target) => {
                Some(Device::probe(&target, &options).await)
            }
            _ => None,
        };
        let reached = match state {
            "disconnect" => !matches!(present, Some(DeviceState::Device(_))),
            "device" => matches!(present, Some(DeviceState::Device(_))),
            "any" => matches!(
                present,
                Some(DeviceState::Device(_) | DeviceState::Unauthorized)
            ),
            _ => false,
        };
        if reached {
            return Ok(0);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn transport_matches(transport: Transport, target: &Target) -> bool {
    match transport {
        Transport::Any => true,
        Transport::Usb => matches!(target, Target::Usb(_)),
        Transport::Local => !matches!(target, Target::Usb(_)),
    }
}

/// `kill-server`: no server to end, but its forwards and connections are
/// gone after adb's, so the background forwarders end and the connected
/// devices are forgotten.
pub fn kill_server() -> anyhow::Result<i32> {
    let mut locked = state::lock()?;
    for forwarder in &locked.state.forwarders {
        state::stop_forwarder(forwarder.pid);
    }
    locked.state = state::State::default();
    locked.save()?;
    Ok(0)
}

/// `get-serialno`, `get-devpath`: the device a command would use, which
/// must answer.
pub async fn get(what: &str, device: &Device) -> anyhow::Result<i32> {
    match what {
        "get-serialno" => println!("{}", device.serial()),
        "get-devpath" => match device.usb() {
            Some(usb) => println!("usb:{}", usb.path),
            None => println!("unknown"),
        },
        _ => bail!("unknown query {what}"),
    }
    Ok(0)
}
