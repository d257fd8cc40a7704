//! `oxadbd pair`: a pairing window as Android's "Pair device with pairing
//! code" dialog opens (AOSP pairing_connection/pairing_server.cpp): a random
//! six-digit code, a TCP port, and the first host that proves the code gets
//! its public key added to the keys file.
//!
//! Unlike Android (20 tries, no delay), wrong codes are few and slow: each
//! failure delays the next attempt and the window closes after a handful,
//! so the 10^6 codes cannot be walked through.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use oxadb_auth::PublicKey;
use oxadb_pairing::format::{PEER_DEVICE_GUID, PEER_RSA_PUB_KEY};
use oxadb_pairing::{PairError, PeerInfo};
use thiserror::Error;
use tokio::net::TcpListener;

/// Where the pairing service listens by default: every interface, a port
/// the kernel picks, as Android's pairing server (`socket_inaddr_any_server`
/// with port 0): pairing is meant for hosts on the network.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:0";
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
pub const DEFAULT_MAX_FAILURES: u32 = 5;
pub const DEFAULT_FAILURE_DELAY: Duration = Duration::from_secs(2);
/// How long one host may take over its exchange (it holds the window: one
/// pairing at a time keeps the failure count and delay exact).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug)]
pub struct PairOptions {
    pub listen: SocketAddr,
    pub keys: PathBuf,
    pub timeout: Duration,
    pub max_failures: u32,
    pub failure_delay: Duration,
    /// The device's GUID, sent to the host (adb prints it and remembers it
    /// as the name of the device's `_adb-tls-connect` service).
    pub guid: String,
    /// The pairing service's instance name (the QR code's `S:`).
    pub name: String,
    /// Announced as `_adb-tls-pairing._tcp` while the window is open; `None`
    /// with `--no-mdns` (and always without the `mdns` feature).
    pub announce: Option<crate::mdns::DeviceInfo>,
}

#[derive(Debug, Error)]
pub enum PairCommandError {
    #[error("pairing: listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("pairing: {0}")]
    Setup(#[from] PairError),
    #[error("pairing: OS random number generator: {0}")]
    Random(String),
    #[error("pairing window closed after {0} s without a pairing")]
    Expired(u64),
    #[error("pairing window closed after {0} wrong codes")]
    TooManyFailures(u32),
    #[error("pairing: adding the key of {peer} to {keys}: {source}")]
    Trust {
        peer: SocketAddr,
        keys: PathBuf,
        source: crate::auth::TrustError,
    },
}

/// Announces `_adb-tls-pairing._tcp` for the open window (unless `device`
/// is `None`: `--no-mdns`); the announcement ends when the guard is dropped.
/// A failure is logged, not fatal: a host can still pair by address.
#[cfg(feature = "mdns")]
fn announce_window(
    device: Option<&crate::mdns::DeviceInfo>,
    bound: SocketAddr,
) -> Option<crate::mdns::Announcement> {
    let device = device?;
    let place = crate::mdns::Where::of(bound.ip());
    match crate::mdns::announce_pairing(bound.port(), &place, device) {
        Ok(announcement) => announcement,
        Err(error) => {
            tracing::warn!(%error, "pairing window not announced over mDNS");
            None
        }
    }
}

/// Six digits from the OS RNG, leading zeroes kept.
pub fn new_code() -> Result<String, PairCommandError> {
    // 4294 whole runs of 10^6 fit in a u32: a draw above them is redrawn,
    // so every code is as likely.
    const LIMIT: u32 = 4294 * 1_000_000;
    loop {
        let mut bytes = [0u8; 4];
        getrandom::getrandom(&mut bytes)
            .map_err(|error| PairCommandError::Random(error.to_string()))?;
        let draw = u32::from_le_bytes(bytes);
        if draw < LIMIT {
            return Ok(format!("{:06}", draw % 1_000_000));
        }
    }
}

/// The address a host should dial: the listening one, or for a wildcard
/// the address of the interface with the default route (a UDP connect
/// sends nothing; it only picks the source address).
fn shown_address(bound: SocketAddr) -> SocketAddr {
    if !bound.ip().is_unspecified() {
        return bound;
    }
    let local = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|socket| {
            socket.connect((Ipv4Addr::new(192, 0, 2, 1), 9))?;
            socket.local_addr()
        })
        .map(|addr| addr.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    SocketAddr::new(local, bound.port())
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Opens the window and serves until one host pairs (Ok), the failure
/// limit is reached or the window times out.
pub async fn run(options: PairOptions) -> Result<(), PairCommandError> {
    let listener =
        TcpListener::bind(options.listen)
            .await
            .map_err(|source| PairCommandError::Listen {
                addr: options.listen,
                source,
            })?;
    let bound = listener
        .local_addr()
        .map_err(|source| PairCommandError::Listen {
            addr: options.listen,
            source,
        })?;
    let code = new_code()?;
    let config = oxadb_pairing::server_config(&oxadb_pairing::ephemeral_identity(&options.guid)?)?;
    let device = PeerInfo {
        kind: PEER_DEVICE_GUID,
        data: options.guid.clone().into_bytes(),
    };
    #[cfg(feature = "mdns")]
    let _announcement = announce_window(options.announce.as_ref(), bound);
    say(&format!("pairing code: {code}"));
    say(&format!("pairing address: {}", shown_address(bound)));
    say(&format!("WIFI:T:ADB;S:{};P:{code};;", options.name));
    tracing::info!(address = %bound, timeout_s = options.timeout.as_secs(), "pairing window open");

    let deadline = tokio::time::Instant::now() + options.timeout;
    let mut failures = 0u32;
    loop {
        let accepted = tokio::time::timeout_at(deadline, listener.accept()).await;
        let Ok(accepted) = accepted else {
            return Err(PairCommandError::Expired(options.timeout.as_secs()));
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "pairing: accept failed");
                continue;
            }
        };
        let limit = ATTEMPT_TIMEOUT.min(deadline - tokio::time::Instant::now());
        let outcome = tokio::time::timeout(
            limit,
            oxadb_pairing::serve(stream, config.clone(), code.as_bytes(), &device),
        )
        .await;
        let error = match outcome {
            Ok(Ok(host)) => match parse_host_key(peer, &host) {
                Ok((key, comment)) => return record_host(&options, peer, &key, &comment),
                Err(error) => {
                    // The code was right but the key unusable: still a
                    // spent attempt.
                    tracing::warn!(%peer, %error, "pairing: host proved the code");
                    failures += 1;
                    error.to_string()
                }
            },
            Ok(Err(error)) => {
                if error.used_a_guess() {
                    failures += 1;
                }
                tracing::warn!(%peer, %error, failures, "pairing attempt failed");
                error.to_string()
            }
            Err(_) => {
                tracing::warn!(%peer, "pairing attempt timed out after {} s", limit.as_secs());
                continue;
            }
        };
        if failures >= options.max_failures {
            say(&format!(
                "pairing closed: {failures} wrong codes (last from {peer}: {error})"
            ));
            return Err(PairCommandError::TooManyFailures(failures));
        }
        if error.contains("wrong pairing code") {
            say(&format!("wrong pairing code from {peer}"));
        }
        // Each failure costs the next host this long before its handshake.
        tokio::time::sleep(options.failure_delay).await;
    }
}

#[derive(Debug, Error)]
enum HostInfoError {
    #[error("host sent peer info of type {0}, not its public key")]
    Kind(u8),
    #[error("host's public key: {0}")]
    Key(#[from] oxadb_auth::KeyError),
}

fn record_host(
    options: &PairOptions,
    peer: SocketAddr,
    key: &PublicKey,
    comment: &str,
) -> Result<(), PairCommandError> {
    let trust = |path: &Path| {
        crate::auth::trust_key(path, key, comment).map_err(|source| PairCommandError::Trust {
            peer,
            keys: path.to_path_buf(),
            source,
        })
    };
    trust(&options.keys)?;
    trust(&crate::tls::paired_hosts_path(&options.keys))?;
    tracing::info!(%peer, comment, keys = %options.keys.display(), "host paired");
    say(&format!(
        "paired with {comment} ({peer}): key added to {}",
        options.keys.display()
    ));
    Ok(())
}

fn parse_host_key(peer: SocketAddr, host: &PeerInfo) -> Result<(PublicKey, String), HostInfoError> {
    if host.kind != PEER_RSA_PUB_KEY {
        return Err(HostInfoError::Kind(host.kind));
    }
    let text = String::from_utf8_lossy(&host.data);
    let line = text.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    Ok(PublicKey::parse_adbkey_pub_at(
        line,
        &format!("pairing peer info from {peer}"),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_six_digits() {
        for _ in 0..100 {
            let code = new_code().unwrap();
            assert_eq!(code.len(), 6);
            assert!(code.bytes().all(|b| b.is_ascii_digit()), "{code}");
        }
    }
}
