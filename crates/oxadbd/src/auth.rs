//! Host authentication as adbd does it: AUTH TOKEN, a signature checked
//! against an `adb_keys` file, RSAPUBLICKEY trusted only on request.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use oxadb_auth::{AuthorizedKeys, KeyError, PublicKey, TOKEN_SIZE};
use oxadb_io::Authenticator;
use thiserror::Error;

/// Where `--keys` points by default (adbd reads `/adb_keys` and
/// `/data/misc/adb/adb_keys`; a Linux daemon keeps its state under /etc).
pub const DEFAULT_KEYS_PATH: &str = "/etc/oxadbd/adb_keys";

/// Signatures a connection may get wrong before tokens are delayed: Google
/// adb signs with every key it has (`~/.android/adbkey` and
/// `ADB_VENDOR_KEYS`) before offering its public key.
const FREE_FAILURES: u32 = 4;
/// The longest a connection waits for its next token.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(8);
/// Process-wide: refused signatures allowed in a burst, and per second after.
const FAILURE_BURST: f64 = 32.0;
const FAILURES_PER_SECOND: f64 = 8.0;

#[derive(Debug, Error)]
pub enum TrustError {
    #[error("{0}")]
    Key(#[from] KeyError),
    #[error("{path}: {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
}

/// Appends `key` to the keys file at `path` (creating it and its directory),
/// unless it is there already. Returns whether it was added.
pub fn trust_key(path: &Path, key: &PublicKey, comment: &str) -> Result<bool, TrustError> {
    let io_error = |action: &'static str| {
        let path = path.to_path_buf();
        move |source| TrustError::Io {
            path,
            action,
            source,
        }
    };
    let mut created = false;
    let existing = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            created = true;
            Vec::new()
        }
        Err(error) => return Err(io_error("reading the authorized keys")(error)),
    };
    if AuthorizedKeys::parse(&String::from_utf8_lossy(&existing)).contains(key) {
        return Ok(false);
    }
    let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty());
    // The directories whose entries change: the file's, and those made for it.
    let mut changed_dirs = Vec::new();
    if let Some(dir) = dir {
        let mut missing = Some(dir);
        while let Some(d) = missing {
            changed_dirs.push(d.to_path_buf());
            if d.exists() {
                break;
            }
            missing = d.parent().filter(|p| !p.as_os_str().is_empty());
        }
        std::fs::create_dir_all(dir).map_err(io_error("creating its directory"))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_error("opening for append"))?;
    // A file whose last line lacks its newline must not swallow the new key.
    let needs_newline = existing.last().is_some_and(|&b| b != b'\n');
    let mut line = String::new();
    if needs_newline {
        line.push('\n');
    }
    line.push_str(&key.to_adbkey_pub(comment));
    if !line.ends_with('\n') {
        line.push('\n');
    }
    file.write_all(line.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io_error("appending the key"))?;
    // A new keys file is only durable once its name is: fsync the directories
    // that got an entry (fsync(2): a file's fsync does not flush its entry).
    if created {
        oxadb_transfer::sync_dirs(&changed_dirs, oxadb_transfer::Durability::Full).map_err(
            |(dir, source)| TrustError::Io {
                path: dir,
                action: "syncing the directory of the keys file",
                source,
            },
        )?;
    }
    Ok(true)
}

/// Reads an `adbkey.pub` file (adb's public key text).
pub fn read_public_key(path: &Path) -> Result<(PublicKey, String), TrustError> {
    let text = std::fs::read_to_string(path).map_err(|source| TrustError::Io {
        path: path.to_path_buf(),
        action: "reading the public key",
        source,
    })?;
    let line = text
        .lines()
        .map(|line| line.trim_matches(|c: char| c == '\0' || c.is_whitespace()))
        .find(|line| !line.is_empty())
        .unwrap_or("");
    Ok(PublicKey::parse_adbkey_pub_at(
        line,
        &path.display().to_string(),
    )?)
}

/// A short, stable name for a key in logs: the start of its base64 form
/// and its comment.
fn describe(key: &PublicKey, comment: &str) -> String {
    let text = key.to_base64();
    format!("{}... {comment}", &text[..text.len().min(16)])
}

/// Refused signatures across all connections, as a token bucket.
struct FailureBucket {
    tokens: f64,
    updated: Instant,
}

/// Checks hosts against the keys file, re-read at every attempt so that a
/// key trusted with `oxadbd trust-key` works at the host's next attempt.
pub struct KeyAuthenticator {
    keys_path: PathBuf,
    accept_new_keys: bool,
    failures: Mutex<FailureBucket>,
}

impl KeyAuthenticator {
    pub fn new(keys_path: PathBuf, accept_new_keys: bool) -> KeyAuthenticator {
        KeyAuthenticator {
            keys_path,
            accept_new_keys,
            failures: Mutex::new(FailureBucket {
                tokens: FAILURE_BURST,
                updated: Instant::now(),
            }),
        }
    }

    fn load_keys(&self, peer: &str) -> Option<AuthorizedKeys> {
        match AuthorizedKeys::load(&self.keys_path) {
            Ok(keys) => Some(keys),
            Err(error) => {
                tracing::warn!(
                    peer,
                    %error,
                    "no trusted keys: every host is unauthorized until one is added with \
                     `oxadbd trust-key ADBKEY.PUB --keys {}`",
                    self.keys_path.display()
                );
                None
            }
        }
    }

    /// Charges one refused signature to the process-wide bucket; returns how
    /// long until it has a token again.
    fn charge_failure(&self) -> Duration {
        let mut bucket = self
            .failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        let refill = now.duration_since(bucket.updated).as_secs_f64() * FAILURES_PER_SECOND;
        bucket.tokens = (bucket.tokens + refill).min(FAILURE_BURST);
        bucket.updated = now;
        bucket.tokens -= 1.0;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-bucket.tokens / FAILURES_PER_SECOND)
        }
    }
}

impl Authenticator for KeyAuthenticator {
    fn token(&self) -> Bytes {
        // From the OS's CSPRNG; a token is never reused.
        let mut token = [0u8; TOKEN_SIZE];
        getrandom::getrandom(&mut token).expect("the OS random number generator works");
        Bytes::copy_from_slice(&token)
    }

    fn verify(&self, peer: &str, token: &[u8], signature: &[u8]) -> bool {
        let Some(keys) = self.load_keys(peer) else {
            return false;
        };
        match keys.verify(token, signature) {
            Some((key, comment)) => {
                tracing::info!(peer, key = %describe(key, comment), "host authenticated");
                true
            }
            None => {
                tracing::warn!(
                    peer,
                    keys = %self.keys_path.display(),
                    "AUTH signature matches no trusted key"
                );
                false
            }
        }
    }

    fn offer_key(&self, peer: &str, key: &[u8]) -> bool {
        let text = String::from_utf8_lossy(key);
        let text = text.trim_matches(|c: char| c == '\0' || c.is_whitespace());
        let (key, comment) = match PublicKey::parse_adbkey_pub(text) {
            Ok(parsed) => parsed,
            Err(error) => {
                tracing::warn!(peer, %error, "host offered a malformed public key");
                return false;
            }
        };
        let name = describe(&key, &comment);
        if !self.accept_new_keys {
            let known = self.load_keys(peer).is_some_and(|keys| keys.contains(&key));
            if known {
                // A public key is no secret: only a signature proves the host
                // holds the private half.
                tracing::warn!(
                    peer,
                    key = %name,
                    "host offered a trusted key without a valid signature; refusing"
                );
            } else {
                tracing::warn!(
                    peer,
                    key = %name,
                    "unauthorized host; to trust its key: oxadbd trust-key ADBKEY.PUB --keys {}, \
                     then reconnect",
                    self.keys_path.display()
                );
            }
            return false;
        }
        match trust_key(&self.keys_path, &key, &comment) {
            Ok(added) => {
                tracing::warn!(
                    peer,
                    key = %name,
                    added,
                    keys = %self.keys_path.display(),
                    "trusting a host's key without proof (--accept-new-keys)"
                );
                true
            }
            Err(error) => {
                tracing::error!(peer, key = %name, %error, "could not record a new key; refusing");
                false
            }
        }
    }

    fn retry_delay(&self, failures: u32) -> Duration {
        let global = self.charge_failure();
        let local = match failures.checked_sub(FREE_FAILURES) {
            None | Some(0) => Duration::ZERO,
            // 250 ms, doubling per failure, at most MAX_RETRY_DELAY.
            Some(extra) => (Duration::from_millis(250) * 2u32.saturating_pow(extra.min(6) - 1))
                .min(MAX_RETRY_DELAY),
        };
        global.max(local).min(MAX_RETRY_DELAY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxadb_auth::PrivateKey;

    #[test]
    fn trusted_keys_verify_and_others_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etc/adb_keys");
        let trusted = PrivateKey::generate().unwrap();
        let stranger = PrivateKey::generate().unwrap();
        assert!(trust_key(&path, &trusted.public_key(), "me@here").unwrap());
        assert!(
            !trust_key(&path, &trusted.public_key(), "me@here").unwrap(),
            "added once"
        );
        let auth = KeyAuthenticator::new(path.clone(), false);
        let token = auth.token();
        assert_eq!(token.len(), TOKEN_SIZE);
        assert_ne!(token, auth.token(), "fresh every time");
        let good = trusted.sign_token(&token).unwrap();
        assert!(auth.verify("test", &token, &good));
        assert!(!auth.verify("test", &auth.token(), &good), "replayed");
        let bad = stranger.sign_token(&token).unwrap();
        assert!(!auth.verify("test", &token, &bad));
        // Offered public keys: never without --accept-new-keys, even a trusted one.
        let offer = |key: &PrivateKey| format!("{}\0", key.public_key().to_adbkey_pub("x@y"));
        assert!(!auth.offer_key("test", offer(&stranger).as_bytes()));
        assert!(!auth.offer_key("test", offer(&trusted).as_bytes()));
        let tofu = KeyAuthenticator::new(path.clone(), true);
        assert!(tofu.offer_key("test", offer(&stranger).as_bytes()));
        assert!(auth.verify("test", &token, &bad), "recorded in the file");
        assert!(!tofu.offer_key("test", b"not a key\0"));
    }

    #[test]
    fn refused_signatures_slow_down_after_a_few() {
        let auth = KeyAuthenticator::new(PathBuf::from("/nonexistent/adb_keys"), false);
        let delays: Vec<Duration> = (1..=8).map(|n| auth.retry_delay(n)).collect();
        assert!(delays[..4].iter().all(Duration::is_zero), "{delays:?}");
        assert_eq!(delays[4], Duration::from_millis(250));
        assert_eq!(delays[5], Duration::from_millis(500));
        assert!(delays.windows(2).all(|w| w[0] <= w[1]), "{delays:?}");
        // Many connections failing at once drain the shared bucket.
        let mut last = Duration::ZERO;
        for _ in 0..64 {
            last = auth.retry_delay(1);
        }
        assert!(last > Duration::ZERO, "the bucket ran dry");
        assert!(last <= MAX_RETRY_DELAY);
    }
}
