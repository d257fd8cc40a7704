//! Errors of the host library. Each names the device address, stream or path
//! involved and the cause.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("{addr}: device unauthorized: accept this host's key on the device (its public key is {key_path})")]
    Unauthorized { addr: String, key_path: String },
    #[error("{addr}: no CNXN from the device within {seconds} s")]
    HandshakeTimeout { addr: String, seconds: u64 },
    #[error("{addr}: connection ended: {reason}")]
    ConnectionLost { addr: String, reason: String },
    #[error("{addr}: device refused service {service:?}")]
    ServiceRefused { addr: String, service: String },
    /// The device answered a `reverse:` request with FAIL: its message (adb's words).
    #[error("{request}: {message}")]
    Reverse { request: String, message: String },
    #[error("host keys: {0}")]
    Keys(#[from] oxadb_auth::KeyError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Local { path: PathBuf, message: String },
    #[error("remote {path:?}: {message}")]
    Remote { path: String, message: String },
    #[error("sync protocol: {0}")]
    Protocol(String),
    #[error("listing USB devices: {0}")]
    UsbList(nusb::Error),
    #[error("{device}: {message}")]
    Usb { device: String, message: String },
    #[error("{device}: its ADB interface is claimed by another program (a running adb server? try `adb kill-server`)")]
    UsbClaimed { device: String },
    #[error("{device}: no permission to open it (missing udev rule? e.g. SUBSYSTEM==\"usb\", ATTR{{idVendor}}==\"{vendor_id:04x}\", MODE=\"0660\", GROUP=\"plugdev\")")]
    UsbPermission { device: String, vendor_id: u16 },
    #[error("device '{serial}' not found")]
    DeviceNotFound { serial: String },
    #[error("more than one device ({}): pick one with -s SERIAL or ANDROID_SERIAL", .serials.join(", "))]
    MoreThanOneDevice { serials: Vec<String> },
    /// A push or pull failed: one message per failed source, each naming the
    /// local and remote paths and the cause in adb's words.
    #[error("{}", .messages.join("\n"))]
    Transfer { messages: Vec<String> },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
