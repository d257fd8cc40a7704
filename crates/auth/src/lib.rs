//! ADB RSA authentication keys, compatible with Google adb.
//!
//! - [`PrivateKey`]: an RSA-2048 key (e = 65537) as kept in `~/.android/adbkey`
//!   (PEM; adb writes PKCS#8, PKCS#1 is read too). It signs AUTH tokens:
//!   PKCS#1 v1.5 with the 20-byte token standing in for a SHA-1 digest.
//! - [`PublicKey`]: the Android public key struct (524 bytes for RSA-2048) and
//!   its `adbkey.pub` text form `<base64> <user>@<host>`.
//! - [`HostKeys`]: the keys a host offers a device: `adbkey` (generated when
//!   missing) then the keys named by `ADB_VENDOR_KEYS`.
//! - [`AuthorizedKeys`]: an `adb_keys` file as a daemon reads it.
//! - [`KnownHosts`]: `adb_known_hosts.pb`, the devices this host paired with.
//!
//! All RSA, padding, PEM and DER work is done by the `rsa`, `pkcs8`/`pkcs1`
//! and `sha1` crates; this crate only lays out adb's public key struct.

mod authorized;
mod error;
mod host;
mod known_hosts;
mod private_key;
mod public_key;

pub use authorized::AuthorizedKeys;
pub use error::KeyError;
pub use host::{
    android_dir_from_home, default_android_dir, default_comment, HostKeys, ADB_VENDOR_KEYS,
    ADB_VENDOR_KEY_SUFFIX, PRIVATE_KEY_FILE, PUBLIC_KEY_FILE,
};
pub use known_hosts::{KnownHosts, KNOWN_HOSTS_FILE};
pub use private_key::PrivateKey;
pub use public_key::{PublicKey, ANDROID_PUBKEY_ENCODED_SIZE, MODULUS_BITS, TOKEN_SIZE};

#[cfg(test)]
mod tests {
    #[test]
    fn types_cross_threads() {
        fn send_sync<T: Send + Sync + 'static>() {}
        send_sync::<crate::HostKeys>();
        send_sync::<crate::PrivateKey>();
        send_sync::<crate::PublicKey>();
        send_sync::<crate::AuthorizedKeys>();
        send_sync::<crate::KeyError>();
    }
}
