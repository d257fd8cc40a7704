//! `host:pair:CODE:ADDRESS`: pairing through the server ([`crate::pair`]),
//! with adb's answers (AOSP `client/adb_wifi.cpp` adb_wifi_pair_device).
//! The address may be a pairing service's mDNS instance name; once paired,
//! the device's TLS connect service, if seen, is connected at once.

use std::sync::Arc;

use crate::pair::{split_address, PairError};

use super::mdns::{auto_connect, Discovery};
use super::registry::Registry;

/// `Ok`: the message after `OKAY`; `Err`: the `FAIL` text.
pub async fn pair(
    discovery: &Discovery,
    registry: &Arc<Registry>,
    code: &str,
    address: &str,
) -> Result<String, String> {
    let (host, port) = match discovery.pairing_service(address) {
        Some(service) => match service.v4 {
            Some(ip) => (ip.to_string(), service.port),
            None => return Err(failed(&PairError::NoPort)),
        },
        None => match split_address(address) {
            Ok((host, port)) => (host.to_string(), port),
            Err(PairError::NoPort) => {
                return Err(format!(
                    "Failed to parse address for pairing: no port in '{address}'"
                ))
            }
            Err(_) => return Err(format!("Invalid port while parsing address [{address}]")),
        },
    };
    let guid = crate::pair::pair(&host, port, code)
        .await
        .map_err(|error| failed(&error))?;
    if let Some(service) = discovery.connect_service(&guid) {
        tokio::spawn(auto_connect(registry.clone(), service));
    }
    Ok(format!("Successfully paired to {address} [guid={guid}]"))
}

/// adb's `Failed: ...` texts; a wrong code and a dropped connection are
/// one case for adb, the others say what failed.
fn failed(error: &PairError) -> String {
    tracing::info!(%error, "pairing failed");
    match error {
        PairError::Exchange(_) | PairError::Connect(_) | PairError::Timeout => {
            "Failed: Wrong password or connection was dropped.".to_string()
        }
        PairError::NotAGuid(kind) => {
            format!("Failed: Successfully paired but server returned unknown response={kind}")
        }
        other => format!("Failed: {other}"),
    }
}
