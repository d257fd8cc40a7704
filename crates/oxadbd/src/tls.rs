//! The daemon's side of STLS (docs/protocol.md, "STLS"; docs/security.md,
//! "TLS"): when a TCP host gets TLS (`--tls`), the daemon's own key and
//! certificate, and the check of a host's certificate against the keys file.
//!
//! Built without the `tls` feature, only the settings are left: every host
//! gets plaintext, and asking for TLS is a configuration error
//! ([`crate::config::ConfigError::MissingFeature`]).

#[cfg(feature = "tls")]
use std::io::Write as _;
#[cfg(feature = "tls")]
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
#[cfg(feature = "tls")]
use std::sync::{Arc, Mutex};

#[cfg(feature = "tls")]
use oxadb_auth::{AuthorizedKeys, PublicKey};
use oxadb_engine::Tls;
#[cfg(feature = "tls")]
use oxadb_io::tls::{ClientKeyCheck, TlsIdentity};

/// `--tls` / `tls = ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Never STLS.
    Off,
    /// STLS to hosts that can do TLS, plaintext to the others.
    On,
    /// Refuse hosts that cannot do TLS.
    Required,
}

impl std::fmt::Display for TlsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Required => "required",
        })
    }
}

impl std::str::FromStr for TlsMode {
    type Err = String;
    fn from_str(text: &str) -> Result<TlsMode, String> {
        match text {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "required" => Ok(TlsMode::Required),
            other => Err(format!(
                "TLS mode {other:?} is not one of off, on, required"
            )),
        }
    }
}

/// TLS settings of a daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// `None`: the default (see [`TlsSettings::for_peer`]).
    pub mode: Option<TlsMode>,
    /// The daemon's private key (PKCS#8 PEM, mode 0600) and certificate
    /// (PEM), made on first use.
    pub key: PathBuf,
    pub cert: PathBuf,
    /// The file whose presence says a host has been paired ([`has_paired_hosts`]).
    pub paired_marker: PathBuf,
}

/// File names beside the keys file (`/etc/oxadbd/` by default).
pub const KEY_FILE: &str = "tls_key.pem";
pub const CERT_FILE: &str = "tls_cert.pem";

impl TlsSettings {
    /// Settings with files beside `keys` unless given.
    pub fn resolve(
        mode: Option<TlsMode>,
        key: Option<PathBuf>,
        cert: Option<PathBuf>,
        keys: &Path,
    ) -> TlsSettings {
        let dir = keys
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        TlsSettings {
            mode,
            key: key.unwrap_or_else(|| dir.join(KEY_FILE)),
            cert: cert.unwrap_or_else(|| dir.join(CERT_FILE)),
            // `oxadbd pair` records each paired host's key there: once one
            // exists, the default beyond loopback is `required`.
            paired_marker: paired_hosts_path(keys),
        }
    }

    /// What a TCP host at a loopback (or other) address gets. The default:
    /// plaintext on loopback (those bytes never leave the machine, and who
    /// can read them can read the daemon's memory too); beyond it `on`
    /// until a host has been paired, `required` after (Android's adbd
    /// speaks only TLS on its wireless-debugging port).
    pub fn for_peer(&self, loopback: bool) -> (Tls, &'static str) {
        if !cfg!(feature = "tls") {
            // `Access::resolve` refused any mode but `off`.
            return (Tls::Off, "plaintext: oxadbd built without TLS");
        }
        match self.mode {
            Some(TlsMode::Off) => (Tls::Off, "--tls off"),
            Some(TlsMode::On) => (Tls::On, "--tls on"),
            Some(TlsMode::Required) => (Tls::Required, "--tls required"),
            None if loopback => (Tls::Off, "default: plaintext on loopback"),
            None if has_paired_hosts(self) => (
                Tls::Required,
                "default: TLS required beyond loopback once a host is paired",
            ),
            None => (
                Tls::On,
                "default: TLS offered beyond loopback (no host paired yet)",
            ),
        }
    }

    /// Whether any connection could get TLS (the identity is needed).
    pub fn may_use_tls(&self) -> bool {
        cfg!(feature = "tls") && self.mode != Some(TlsMode::Off)
    }
}

/// The file beside the keys file listing the hosts that paired, in the
/// keys file's format (seam for TLS: a key here came through pairing, not
/// through `trust-key` or USB authorization).
pub fn paired_hosts_path(keys: &Path) -> PathBuf {
    let mut name = keys
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "adb_keys".into());
    name.push(".paired");
    keys.with_file_name(name)
}

/// Whether a host has been paired with this daemon (`oxadbd pair` writes
/// the marker); the seam between pairing and the TLS default.
pub fn has_paired_hosts(settings: &TlsSettings) -> bool {
    std::fs::metadata(&settings.paired_marker).is_ok_and(|m| m.len() > 0)
}

#[cfg(feature = "tls")]
/// Why the daemon's TLS identity could not be had.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{path}: {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Bad { path: PathBuf, reason: String },
    #[error("{0}")]
    Tls(#[from] oxadb_io::tls::TlsError),
}

#[cfg(feature = "tls")]
fn io_error(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> IdentityError {
    let path = path.to_path_buf();
    move |source| IdentityError::Io {
        path,
        action,
        source,
    }
}

#[cfg(feature = "tls")]
/// The PEM blocks labelled `label` in `text`, decoded.
fn pem_blocks(text: &str, label: &str, path: &Path) -> Result<Vec<u8>, IdentityError> {
    use base64::Engine as _;
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let bad = |reason: &str| IdentityError::Bad {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    let start = text
        .find(&begin)
        .ok_or_else(|| bad(&format!("no {begin} line")))?;
    let body = &text[start + begin.len()..];
    let stop = body
        .find(&end)
        .ok_or_else(|| bad(&format!("no {end} line")))?;
    let b64: String = body[..stop].split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|error| bad(&format!("bad base64: {error}")))
}

#[cfg(feature = "tls")]
fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut text = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        text.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        text.push('\n');
    }
    text.push_str(&format!("-----END {label}-----\n"));
    text
}

#[cfg(feature = "tls")]
fn write_private(path: &Path, text: &str, mode: u32) -> Result<(), IdentityError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_error(dir, "creating the directory"))?;
    }
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_error(&tmp, "creating"))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io_error(&tmp, "writing"))?;
    std::fs::rename(&tmp, path).map_err(io_error(path, "renaming into place"))
}

#[cfg(feature = "tls")]
/// The daemon's key and certificate: read from `settings`' files, or made
/// (an RSA-2048 key, as AOSP's adbd uses, and a self-signed certificate)
/// and written there on first use, the key with mode 0600.
pub fn load_or_create_identity(settings: &TlsSettings) -> Result<TlsIdentity, IdentityError> {
    match std::fs::read_to_string(&settings.key) {
        Ok(key_text) => {
            let key = pem_blocks(&key_text, "PRIVATE KEY", &settings.key)?;
            let cert_text = std::fs::read_to_string(&settings.cert)
                .map_err(io_error(&settings.cert, "reading the TLS certificate"))?;
            let cert = pem_blocks(&cert_text, "CERTIFICATE", &settings.cert)?;
            Ok(TlsIdentity::from_parts(cert, key))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let key = oxadb_auth::PrivateKey::generate().map_err(|error| IdentityError::Bad {
                path: settings.key.clone(),
                reason: format!("generating a key: {error}"),
            })?;
            let identity = TlsIdentity::self_signed_rsa(key.to_pkcs8_der())?;
            write_private(
                &settings.key,
                &pem("PRIVATE KEY", identity.key_der()),
                0o600,
            )?;
            write_private(&settings.cert, &pem("CERTIFICATE", &identity.cert), 0o644)?;
            tracing::info!(
                key = %settings.key.display(),
                cert = %settings.cert.display(),
                "made the daemon's TLS key and certificate"
            );
            Ok(identity)
        }
        Err(error) => Err(io_error(&settings.key, "reading the TLS key")(error)),
    }
}

#[cfg(feature = "tls")]
/// Lets a host's certificate in when its RSA key is in the keys file, as
/// adbd's `adbd_tls_verify_cert` (daemon/auth.cpp) does; the file is read
/// at every handshake, so removing a line revokes the host.
pub struct KeysFileCheck {
    pub keys: PathBuf,
    /// Keys and the CA hints made from them, by the file's contents.
    hints: Mutex<Option<(String, Vec<rustls::DistinguishedName>)>>,
}

#[cfg(feature = "tls")]
impl KeysFileCheck {
    pub fn new(keys: PathBuf) -> Arc<KeysFileCheck> {
        Arc::new(KeysFileCheck {
            keys,
            hints: Mutex::new(None),
        })
    }
}

#[cfg(feature = "tls")]
impl ClientKeyCheck for KeysFileCheck {
    fn check(&self, spki_der: &[u8]) -> Result<(), String> {
        let key = PublicKey::from_spki_der(spki_der)
            .map_err(|error| format!("host certificate's key: {error}"))?;
        let keys = AuthorizedKeys::load(&self.keys).map_err(|error| {
            format!(
                "no trusted keys ({error}); trust the host with `oxadbd trust-key ADBKEY.PUB --keys {}`",
                self.keys.display()
            )
        })?;
        match keys.keys().iter().find(|(known, _)| *known == key) {
            Some((_, comment)) => {
                tracing::info!(key = %comment, "host certificate's key is trusted");
                Ok(())
            }
            None => Err(format!(
                "the host certificate's RSA key is not in {}",
                self.keys.display()
            )),
        }
    }

    fn hints(&self) -> Vec<rustls::DistinguishedName> {
        let text = std::fs::read_to_string(&self.keys).unwrap_or_default();
        let mut cached = self.hints.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, hints)) = cached.as_ref() {
            if *seen == text {
                return hints.clone();
            }
        }
        let hints = ca_hints(&AuthorizedKeys::parse(&text));
        *cached = Some((text, hints.clone()));
        hints
    }
}

#[cfg(feature = "tls")]
/// One CA name per trusted key (AOSP tls/adb_ca_list.cpp and daemon/auth.cpp
/// `adbd_tls_client_ca_list`): O=AdbKey-0 and CN=the upper-case hex SHA-256
/// of the key's DER SubjectPublicKeyInfo, so that adb presents the key the
/// device knows.
fn ca_hints(keys: &AuthorizedKeys) -> Vec<rustls::DistinguishedName> {
    use x509_cert::der::Encode as _;
    keys.keys()
        .iter()
        .filter_map(|(key, _)| {
            let digest = ring::digest::digest(&ring::digest::SHA256, &key.to_spki_der());
            let digest = digest.as_ref();
            let hex: String = digest.iter().map(|b| format!("{b:02X}")).collect();
            // RFC 4514 order: the last RDN is written first.
            let name: x509_cert::name::Name = format!("CN={hex},O=AdbKey-0").parse().ok()?;
            Some(rustls::DistinguishedName::from(name.to_der().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "tls")]
    fn default_is_plaintext_on_loopback_and_required_beyond_once_paired() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("adb_keys");
        let settings = TlsSettings::resolve(None, None, None, &keys);
        assert_eq!(settings.key, dir.path().join(KEY_FILE));
        assert_eq!(settings.for_peer(true).0, Tls::Off);
        assert_eq!(settings.for_peer(false).0, Tls::On);
        std::fs::write(&settings.paired_marker, "host\n").unwrap();
        assert_eq!(settings.for_peer(true).0, Tls::Off);
        assert_eq!(settings.for_peer(false).0, Tls::Required);
        let required = TlsSettings::resolve(Some(TlsMode::Required), None, None, &keys);
        assert_eq!(required.for_peer(true).0, Tls::Required);
        assert!("sometimes".parse::<TlsMode>().is_err());
    }

    #[test]
    #[cfg(not(feature = "tls"))]
    fn without_tls_every_host_gets_plaintext() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("adb_keys");
        let settings = TlsSettings::resolve(None, None, None, &keys);
        std::fs::write(&settings.paired_marker, "host\n").unwrap();
        assert_eq!(settings.for_peer(false).0, Tls::Off);
        assert!(!settings.may_use_tls());
    }

    #[test]
    fn paired_hosts_sits_beside_the_keys_file() {
        assert_eq!(
            paired_hosts_path(Path::new("/etc/oxadbd/adb_keys")),
            Path::new("/etc/oxadbd/adb_keys.paired")
        );
    }

    #[cfg(feature = "tls")]
    #[test]
    fn identity_is_made_once_with_a_private_key_file() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let settings = TlsSettings::resolve(None, None, None, &dir.path().join("adb_keys"));
        let made = load_or_create_identity(&settings).unwrap();
        let mode = std::fs::metadata(&settings.key)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = load_or_create_identity(&settings).unwrap();
        assert_eq!(made.cert, again.cert);
        assert_eq!(made.key_der(), again.key_der());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn only_keys_in_the_file_pass_and_each_gets_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("adb_keys");
        let trusted = oxadb_auth::PrivateKey::generate().unwrap().public_key();
        let stranger = oxadb_auth::PrivateKey::generate().unwrap().public_key();
        std::fs::write(&keys, trusted.to_adbkey_pub("a@b") + "\n").unwrap();
        let check = KeysFileCheck::new(keys.clone());
        assert!(check.check(&trusted.to_spki_der()).is_ok());
        let refused = check.check(&stranger.to_spki_der()).unwrap_err();
        assert!(refused.contains("not in"), "{refused}");
        assert_eq!(check.hints().len(), 1);
        std::fs::remove_file(&keys).unwrap();
        assert!(
            check.check(&trusted.to_spki_der()).is_err(),
            "revoked with the file"
        );
    }
}
