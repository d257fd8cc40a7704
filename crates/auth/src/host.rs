//! The keys a host offers: `~/.android/adbkey` and `ADB_VENDOR_KEYS`.
//!
//! As Google adb (29 and later):
//! - the directory is `$HOME/.android` (home from the password database when
//!   `$HOME` is unset); no other variable moves it;
//! - `adbkey` is generated when missing (RSA-2048, PKCS#8 PEM, mode 0600),
//!   with `adbkey.pub` beside it: `<base64> <user>@<host>`, no newline;
//! - `ADB_VENDOR_KEYS` is a `:`-separated list of key files and directories;
//!   in a directory, the files whose names end in `.adb_key` are keys;
//! - the public key sent to a device (RSAPUBLICKEY) is computed from
//!   `adbkey`, not read from `adbkey.pub`, and ends with a NUL.

use std::ffi::{CStr, OsStr, OsString};
use std::fs;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use crate::{KeyError, PrivateKey};

/// The private key's file name in the android directory.
pub const PRIVATE_KEY_FILE: &str = "adbkey";
/// The public key's file name in the android directory.
pub const PUBLIC_KEY_FILE: &str = "adbkey.pub";
/// The variable listing extra private keys (files or directories).
pub const ADB_VENDOR_KEYS: &str = "ADB_VENDOR_KEYS";
/// In a directory listed in `ADB_VENDOR_KEYS`, the suffix of key files.
pub const ADB_VENDOR_KEY_SUFFIX: &str = ".adb_key";

/// The private keys a host offers a device, in the order they are tried:
/// `adbkey` first, then the vendor keys in the order `ADB_VENDOR_KEYS` lists
/// them (each directory's `*.adb_key` files by name). A key already loaded
/// from another path is not offered twice.
#[derive(Debug)]
pub struct HostKeys {
    keys: Vec<PrivateKey>,
    public_key_path: PathBuf,
    comment: String,
}

fn io_error(path: &Path, action: &'static str, source: std::io::Error) -> KeyError {
    KeyError::Io {
        path: path.to_path_buf(),
        action,
        cause: source,
    }
}

fn read_private_key(path: &Path) -> Result<PrivateKey, KeyError> {
    let bytes = fs::read(path).map_err(|error| io_error(path, "read the private key", error))?;
    let text = String::from_utf8_lossy(&bytes);
    PrivateKey::from_pem_at(&text, &path.display().to_string())
}

/// Writes `contents` to `path` with mode 0600 unless `path` exists. The key
/// appears whole or not at all: it is written to a temporary file that is
/// then hard-linked into place (which fails rather than replace a key another
/// process made meanwhile). Returns false when `path` already existed.
fn write_new_private_key(path: &Path, contents: &str) -> Result<bool, KeyError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    // The pid and a random number, so concurrent writers never share it
    // (and `create_new` would refuse a name that is taken after all).
    let mut random = [0; 8];
    getrandom::getrandom(&mut random)
        .map_err(|error| io_error(dir, "draw a temporary name", std::io::Error::other(error)))?;
    let temp = dir.join(format!(
        ".{}.tmp-{}-{:016x}",
        path.file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id(),
        u64::from_ne_bytes(random)
    ));
    let write = |target: &Path| -> std::io::Result<()> {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(target)?;
        file.write_all(contents.as_bytes())?;
        file.sync_all()
    };
    let _ = fs::remove_file(&temp);
    write(&temp).map_err(|error| io_error(&temp, "write the new private key", error))?;
    let linked = fs::hard_link(&temp, path);
    let _ = fs::remove_file(&temp);
    match linked {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        // A file system without hard links: write in place, still never
        // replacing an existing key.
        Err(_) => match write(path) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(error) => Err(io_error(path, "write the new private key", error)),
        },
    }
}

/// Loads the vendor keys of one `ADB_VENDOR_KEYS` entry. Like adb, a path
/// that cannot be read or a key that cannot be parsed is logged and skipped.
fn load_vendor_path(path: &Path, out: &mut Vec<PrivateKey>) {
    let metadata = match fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "ADB_VENDOR_KEYS: cannot stat; skipped");
            return;
        }
    };
    if metadata.is_file() {
        load_vendor_file(path, out);
    } else if metadata.is_dir() {
        let entries = match fs::read_dir(path) {
            Ok(entries) => entries,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "ADB_VENDOR_KEYS: cannot list directory; skipped");
                return;
            }
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok())
            .filter(|entry| {
                entry
                    .file_name()
                    .as_bytes()
                    .ends_with(ADB_VENDOR_KEY_SUFFIX.as_bytes())
            })
            .map(|entry| entry.path())
            .collect();
        files.sort();
        for file in files {
            // adb does not recurse: only files count.
            if fs::metadata(&file).map(|m| m.is_file()).unwrap_or(false) {
                load_vendor_file(&file, out);
            } else {
                tracing::warn!(path = %file.display(), "ADB_VENDOR_KEYS: not a regular file; skipped");
            }
        }
    } else {
        tracing::warn!(path = %path.display(), "ADB_VENDOR_KEYS: neither a file nor a directory; skipped");
    }
}

fn load_vendor_file(path: &Path, out: &mut Vec<PrivateKey>) {
    match read_private_key(path) {
        Ok(key) => {
            let public = key.public_key();
            if out.iter().any(|known| known.public_key() == public) {
                tracing::debug!(path = %path.display(), "vendor key already loaded; skipped");
            } else {
                tracing::debug!(path = %path.display(), "loaded vendor key");
                out.push(key);
            }
        }
        Err(error) => tracing::warn!(%error, "ADB_VENDOR_KEYS: key skipped"),
    }
}

impl HostKeys {
    /// Loads `android_dir/adbkey`, generating it (and `adbkey.pub`) when it
    /// is missing, then the keys named by `vendor_keys` (the value of
    /// `ADB_VENDOR_KEYS`). `android_dir` is created (mode 0700) if needed.
    /// An unreadable or corrupt `adbkey` is an error naming its path; vendor
    /// keys that cannot be loaded are logged and skipped, as adb does.
    pub fn load(android_dir: &Path, vendor_keys: Option<&OsStr>) -> Result<HostKeys, KeyError> {
        let private_path = android_dir.join(PRIVATE_KEY_FILE);
        let public_key_path = android_dir.join(PUBLIC_KEY_FILE);
        let comment = default_comment();

        let exists = match fs::symlink_metadata(&private_path) {
            Ok(_) => true,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => false,
            Err(error) => return Err(io_error(&private_path, "stat the private key", error)),
        };
        let adbkey = if exists {
            read_private_key(&private_path)?
        } else {
            if !android_dir.is_dir() {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(android_dir)
                    .map_err(|error| io_error(android_dir, "create the directory", error))?;
            }
            let mut key = PrivateKey::generate()?;
            if write_new_private_key(&private_path, &key.to_pem())? {
                key.set_origin(private_path.display().to_string());
                fs::write(&public_key_path, key.public_key().to_adbkey_pub(&comment))
                    .map_err(|error| io_error(&public_key_path, "write the public key", error))?;
                tracing::info!(
                    path = %private_path.display(),
                    public = %public_key_path.display(),
                    "generated a new adb key"
                );
                key
            } else {
                // Another process created it meanwhile: use theirs.
                read_private_key(&private_path)?
            }
        };

        let mut keys = vec![adbkey];
        if let Some(list) = vendor_keys {
            for path in std::env::split_paths(list) {
                if path.as_os_str().is_empty() {
                    continue;
                }
                load_vendor_path(&path, &mut keys);
            }
        }
        Ok(HostKeys {
            keys,
            public_key_path,
            comment,
        })
    }

    /// [`HostKeys::load`] from the environment as adb does: `$HOME/.android`
    /// and `$ADB_VENDOR_KEYS`.
    pub fn load_default() -> Result<HostKeys, KeyError> {
        let android_dir = default_android_dir()?;
        let vendor = std::env::var_os(ADB_VENDOR_KEYS);
        Self::load(&android_dir, vendor.as_deref())
    }

    /// The keys in the order they are tried: `adbkey` first.
    pub fn keys(&self) -> &[PrivateKey] {
        &self.keys
    }

    /// The `adbkey.pub` path (the public key a user may install by hand).
    pub fn public_key_path(&self) -> &Path {
        &self.public_key_path
    }

    /// The AUTH RSAPUBLICKEY payload, as adb sends it: the `adbkey.pub` text
    /// of `adbkey` (computed from the private key, with this host's
    /// `user@host`) followed by a NUL byte.
    pub fn public_key_payload(&self) -> Vec<u8> {
        let mut payload = self.keys[0]
            .public_key()
            .to_adbkey_pub(&self.comment)
            .into_bytes();
        payload.push(0);
        payload
    }
}

fn env_nonempty(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|value| !value.is_empty())
}

/// The current user's password entry: (login name, home directory).
fn passwd_entry() -> Option<(OsString, PathBuf)> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let mut buffer = vec![0u8; 4096];
    loop {
        // SAFETY: a zeroed passwd is a valid out-parameter (integers and
        // null pointers); getpwuid_r fills it with pointers into `buffer`,
        // which outlives every use below.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = unsafe {
            libc::getpwuid_r(
                uid,
                &mut entry,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buffer.len() < 1 << 20 {
            buffer.resize(buffer.len() * 2, 0);
            continue;
        }
        if rc != 0 || result.is_null() || entry.pw_name.is_null() || entry.pw_dir.is_null() {
            return None;
        }
        // SAFETY: non-null NUL-terminated strings inside `buffer`.
        let name = unsafe { CStr::from_ptr(entry.pw_name) };
        let dir = unsafe { CStr::from_ptr(entry.pw_dir) };
        return Some((
            OsStr::from_bytes(name.to_bytes()).to_os_string(),
            PathBuf::from(OsStr::from_bytes(dir.to_bytes())),
        ));
    }
}

fn host_name() -> Option<String> {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname writes a
    // NUL-terminated name (we also keep the last byte 0 in case of truncation).
    let rc = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len() - 1) };
    if rc != 0 {
        return None;
    }
    let name = CStr::from_bytes_until_nul(&buffer).ok()?;
    let name = name.to_string_lossy().into_owned();
    (!name.is_empty()).then_some(name)
}

/// `user@host` for `adbkey.pub` and the RSAPUBLICKEY payload. The user is
/// `$LOGNAME`, else `$USER`, else the password entry's name; the host is
/// `$HOSTNAME`, else gethostname(); either falls back to "unknown".
pub fn default_comment() -> String {
    let user = env_nonempty("LOGNAME")
        .or_else(|| env_nonempty("USER"))
        .or_else(|| passwd_entry().map(|(name, _)| name))
        .map(|name| name.to_string_lossy().into_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    let host = env_nonempty("HOSTNAME")
        .map(|name| name.to_string_lossy().into_owned())
        .or_else(host_name)
        .unwrap_or_else(|| "unknown".to_string());
    format!("{user}@{host}")
}

/// adb's android directory for a given `$HOME` value: `<home>/.android`.
pub fn android_dir_from_home(home: &Path) -> PathBuf {
    home.join(".android")
}

/// adb's android directory: `$HOME/.android`, with the password database's
/// home directory when `$HOME` is unset or empty.
pub fn default_android_dir() -> Result<PathBuf, KeyError> {
    if let Some(home) = env_nonempty("HOME") {
        return Ok(android_dir_from_home(Path::new(&home)));
    }
    match passwd_entry() {
        Some((_, home)) => Ok(android_dir_from_home(&home)),
        // SAFETY: getuid cannot fail.
        None => Err(KeyError::NoHomeDir {
            uid: unsafe { libc::getuid() },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comment_has_user_and_host() {
        let comment = default_comment();
        let (user, host) = comment.split_once('@').expect("user@host");
        assert!(!user.is_empty() && !host.is_empty(), "{comment}");
    }

    #[test]
    fn passwd_entry_exists() {
        let (name, dir) = passwd_entry().expect("this user has a password entry");
        assert!(!name.is_empty());
        assert!(dir.is_absolute(), "{}", dir.display());
    }

    #[test]
    fn android_dir_is_under_home() {
        assert_eq!(
            android_dir_from_home(Path::new("/home/u")),
            PathBuf::from("/home/u/.android")
        );
        let dir = default_android_dir().unwrap();
        assert!(dir.ends_with(".android"), "{}", dir.display());
    }
}
