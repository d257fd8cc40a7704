//! `pair HOST:PORT [CODE]`: wireless-debugging pairing as adb does it
//! (client/adb_wifi.cpp): prove the six-digit code the device shows, send it
//! our public key (~/.android/adbkey's), get its GUID.

use std::io::{BufRead as _, Write as _};
use std::time::Duration;

use anyhow::{bail, Context as _};
use oxadb_pairing::format::{PEER_DEVICE_GUID, PEER_RSA_PUB_KEY};
use oxadb_pairing::PeerInfo;

/// The whole exchange (connect, TLS, SPAKE2, peer infos) must end by then.
const PAIR_TIMEOUT: Duration = Duration::from_secs(30);

/// Pairs with the device at `address` and prints what adb prints.
pub async fn pair(address: &str, code: Option<&str>) -> anyhow::Result<i32> {
    let Some((host, port)) = address.rsplit_once(':') else {
        bail!("pairing with {address}: the address needs a port (HOST:PORT)");
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if port.parse::<u16>().map_or(true, |port| port == 0) {
        bail!("pairing with {address}: invalid port {port:?}");
    }
    let code = match code {
        Some(code) => code.to_string(),
        None => {
            // adb asks on the terminal when the code is not given.
            print!("Enter pairing code: ");
            std::io::stdout().flush()?;
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .context("reading the pairing code from stdin")?;
            line.trim().to_string()
        }
    };
    if code.is_empty() {
        bail!("pairing with {address}: no pairing code given");
    }
    let keys = oxadb_auth::HostKeys::load_default().context("loading ~/.android/adbkey")?;
    let mut public_key = keys.public_key_payload();
    public_key.retain(|&b| b != 0);
    let ours = PeerInfo {
        kind: PEER_RSA_PUB_KEY,
        data: public_key,
    };
    let config = oxadb_pairing::client_config(&oxadb_pairing::ephemeral_identity("oxadb")?)
        .with_context(|| format!("pairing with {address}"))?;
    let exchange = async {
        let stream = tokio::net::TcpStream::connect((host, port.parse::<u16>()?))
            .await
            .with_context(|| format!("pairing with {address}: connecting"))?;
        oxadb_pairing::pair(stream, config, host, code.as_bytes(), &ours)
            .await
            .with_context(|| format!("pairing with {address}"))
    };
    let device = tokio::time::timeout(PAIR_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "pairing with {address}: no answer within {} s",
                PAIR_TIMEOUT.as_secs()
            )
        })??;
    if device.kind != PEER_DEVICE_GUID {
        bail!(
            "pairing with {address}: paired, but the device sent peer info of type {} instead of its GUID",
            device.kind
        );
    }
    let guid = String::from_utf8_lossy(&device.data);
    println!("Successfully paired to {address} [guid={guid}]");
    Ok(0)
}
