//! Wireless-debugging pairing as adb's host does it (AOSP
//! `client/adb_wifi.cpp` adb_wifi_pair_device): prove the six-digit code
//! the device shows, send it our public key (`~/.android/adbkey`'s), get
//! its GUID, and record that GUID in `~/.android/adb_known_hosts.pb` so
//! that a host server connects the device when it sees it over mDNS.
//! `oxadb pair` and the server's `host:pair:` both come here.

use std::time::Duration;

use oxadb_auth::{KeyError, KnownHosts};
use oxadb_pairing::format::{PEER_DEVICE_GUID, PEER_RSA_PUB_KEY};
use oxadb_pairing::PeerInfo;
use thiserror::Error;

/// The whole exchange (connect, TLS, SPAKE2, peer infos) must end by then.
pub const PAIR_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Error)]
pub enum PairError {
    #[error("the address needs a port (HOST:PORT)")]
    NoPort,
    #[error("invalid port {0:?}")]
    BadPort(String),
    #[error("no pairing code given")]
    NoCode,
    #[error("loading ~/.android/adbkey: {0}")]
    Keys(KeyError),
    #[error("connecting: {0}")]
    Connect(std::io::Error),
    #[error("{0}")]
    Exchange(#[from] oxadb_pairing::PairError),
    #[error("no answer within {} s", PAIR_TIMEOUT.as_secs())]
    Timeout,
    #[error("paired, but the device sent peer info of type {0} instead of its GUID")]
    NotAGuid(u8),
}

/// `HOST:PORT` (or `[V6]:PORT`) split; the port must be 1 to 65535.
pub fn split_address(address: &str) -> Result<(&str, u16), PairError> {
    let (host, port) = address.rsplit_once(':').ok_or(PairError::NoPort)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match port.parse::<u16>() {
        Ok(port) if port != 0 => Ok((host, port)),
        _ => Err(PairError::BadPort(port.to_string())),
    }
}

/// Pairs with the device listening at `host`:`port` and returns its GUID,
/// recorded in the known hosts (a failure to record is logged: the
/// pairing itself holds).
pub async fn pair(host: &str, port: u16, code: &str) -> Result<String, PairError> {
    if code.is_empty() {
        return Err(PairError::NoCode);
    }
    let keys = oxadb_auth::HostKeys::load_default().map_err(PairError::Keys)?;
    let mut public_key = keys.public_key_payload();
    public_key.retain(|&b| b != 0);
    let ours = PeerInfo {
        kind: PEER_RSA_PUB_KEY,
        data: public_key,
    };
    let config = oxadb_pairing::client_config(&oxadb_pairing::ephemeral_identity("oxadb")?)?;
    let exchange = async {
        let stream = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(PairError::Connect)?;
        Ok::<_, PairError>(oxadb_pairing::pair(stream, config, host, code.as_bytes(), &ours).await?)
    };
    let device = tokio::time::timeout(PAIR_TIMEOUT, exchange)
        .await
        .map_err(|_| PairError::Timeout)??;
    if device.kind != PEER_DEVICE_GUID {
        return Err(PairError::NotAGuid(device.kind));
    }
    let guid = String::from_utf8_lossy(&device.data).into_owned();
    match KnownHosts::load_default().and_then(|hosts| hosts.add(&guid)) {
        Ok(()) => tracing::info!(%guid, "paired; recorded in the known hosts"),
        Err(error) => tracing::warn!(%guid, %error, "paired, but not recorded"),
    }
    Ok(guid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_need_a_port() {
        assert_eq!(
            split_address("10.0.0.1:37000").unwrap(),
            ("10.0.0.1", 37000)
        );
        assert_eq!(split_address("[::1]:37000").unwrap(), ("::1", 37000));
        assert!(matches!(split_address("10.0.0.1"), Err(PairError::NoPort)));
        assert!(matches!(split_address("h:0"), Err(PairError::BadPort(_))));
        assert!(matches!(split_address("h:x"), Err(PairError::BadPort(_))));
    }
}
