//! Errors of the host library. Each names the device address, stream or path
//! involved and the cause. A cause shown in the message is not also returned
//! by `source()`: printers that walk the chain (anyhow's `{:#}`) would repeat it.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("cannot connect to {addr}: {cause}{}", connect_hint(cause))]
    Connect { addr: String, cause: std::io::Error },
    /// The device waits for its user (or its keys file) to accept our key.
    #[error("{addr}: device unauthorized: this host's key is {key_path}; on an oxadbd device trust it with `oxadbd trust-key {key_path}` (as root, the file copied there), on an Android device accept the prompt on its screen")]
    Unauthorized { addr: String, key_path: String },
    /// The device asked for a key and this host has none to give.
    #[error("{addr}: device unauthorized and this host has no key to offer ({why}); oxadb keeps its key in $HOME/.android/adbkey: set HOME to a writable directory")]
    NoKey { addr: String, why: String },
    #[error("{addr}: no answer to CNXN within {seconds} s (is it an ADB daemon?)")]
    HandshakeTimeout { addr: String, seconds: u64 },
    /// The peer's first bytes are no ADB packet, or it hung up at once.
    #[error("{addr} does not speak ADB ({got})")]
    NotAdb { addr: String, got: String },
    #[error("lost the connection to {addr}: {reason}")]
    ConnectionLost { addr: String, reason: String },
    #[error("{addr}: device refused service {service:?}")]
    ServiceRefused { addr: String, service: String },
    /// The device neither accepted nor refused an OPEN in time
    /// ([`crate::ConnectOptions::open_timeout`]).
    #[error("{addr}: no answer to the OPEN of service {service:?} within {seconds} s")]
    OpenTimeout {
        addr: String,
        service: String,
        seconds: f64,
    },
    /// A sync session waited for a reply the device owed with nothing
    /// arriving ([`crate::ConnectOptions::reply_timeout`]).
    #[error(
        "{addr}: no reply {waiting_for} within {seconds} s (the device's sync service stalled)"
    )]
    ReplyTimeout {
        addr: String,
        /// What was owed, e.g. `to the RECV of '/var/log/x'`.
        waiting_for: String,
        seconds: f64,
    },
    /// The device answered a `reverse:` request with FAIL: its message (adb's words).
    #[error("{request}: {message}")]
    Reverse { request: String, message: String },
    /// An adb host server answered `FAIL`: its message, in adb's words
    /// (`device 'X' not found`), which adb prints as `error: MESSAGE`.
    #[error("{0}")]
    ServerFail(String),
    /// An adb host server broke the protocol or the connection.
    #[error("adb server at {addr}: {message}")]
    Server { addr: String, message: String },
    #[error("host keys: {0}")]
    Keys(oxadb_auth::KeyError),
    #[error("{context}: {cause}")]
    Io {
        context: String,
        cause: std::io::Error,
    },
    #[error("{path}: {message}")]
    Local { path: PathBuf, message: String },
    #[error("remote {path:?}: {message}")]
    Remote { path: String, message: String },
    /// The device broke one of adb's protocols (`protocol`: sync, shell,
    /// reverse, oxadb-delta) on the stream `context` names (the device, and
    /// the path where there is one): that stream can't be read on.
    #[error("{context}: {protocol} protocol: {message}")]
    Protocol {
        context: String,
        protocol: &'static str,
        message: String,
    },
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
    /// A bare word (`-s WORD`) that is neither a USB serial nor a host name.
    #[error("no device with serial {serial} (no USB device has it, and it is not a host name: {cause}); `oxadb devices` lists the devices present")]
    NoSuchSerial { serial: String, cause: String },
    #[error("invalid port {port} in serial '{serial}' (a TCP port is 1 to 65535)")]
    InvalidPort { serial: String, port: String },
    #[error("more than one device ({}): pick one with -s SERIAL or ANDROID_SERIAL", .serials.join(", "))]
    MoreThanOneDevice { serials: Vec<String> },
    /// A push or pull failed: one message per failed source, each naming the
    /// local and remote paths and the cause in adb's words.
    #[error("{}", .messages.join("\n"))]
    Transfer { messages: Vec<String> },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The cause in adb's (strerror) words, without Rust's "(os error N)":
    /// what follows `failed to connect to 'ADDR': ` in `connect`'s answer.
    pub fn cause_in_adb_words(&self) -> String {
        let text = match self {
            Error::Connect { cause, .. } => cause.to_string(),
            other => other.to_string(),
        };
        match text.find(" (os error") {
            Some(at) => text[..at].to_string(),
            None => text,
        }
    }

    /// The device broke `protocol` on the stream `context` names, as
    /// `message` says.
    pub(crate) fn protocol(
        context: impl Into<String>,
        protocol: &'static str,
        message: impl Into<String>,
    ) -> Error {
        Error::Protocol {
            context: context.into(),
            protocol,
            message: message.into(),
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            cause: source,
        }
    }
}

impl From<oxadb_auth::KeyError> for Error {
    fn from(error: oxadb_auth::KeyError) -> Error {
        Error::Keys(error)
    }
}

/// The next step after a failed connect, where the cause points to one.
fn connect_hint(cause: &std::io::Error) -> &'static str {
    match cause.kind() {
        std::io::ErrorKind::ConnectionRefused => {
            "; nothing listens there: is the daemon running (`oxadbd --listen ADDR:PORT` on the device)?"
        }
        _ => "",
    }
}
