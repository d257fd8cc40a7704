//! oxadbd's USB transport: an ADB function on Linux FunctionFS.
//!
//! [`FunctionFs::open`] writes the interface's descriptors to `ep0` (the
//! gadget can be bound from then on); [`serve`] starts an ADB connection
//! each time the host enables the function and ends it when the host
//! disables it. The bulk endpoints are driven with Linux AIO ([`aio`]),
//! several transfers in flight each way; [`bulk`] maps packets onto
//! transfers the way ADB hosts expect.
//!
//! Authentication is the engine configuration's: with `require_auth`, a USB
//! host must sign a token with a trusted key, as over TCP.

pub mod aio;
pub mod bulk;
pub mod descriptors;
pub mod endpoint;
pub mod event;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod function;
pub mod gadget;
mod session;

use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

pub use aio::AioEndpoint;
pub use bulk::{bulk_pair, BulkIn, BulkOut};
pub use endpoint::{Buffer, Completion, Endpoint};
pub use event::{Event, SetupRequest};
pub use function::{FunctionFs, DEFAULT_FFS_DIR};
pub use gadget::{bind_udc, list_udcs, UDC_CLASS_DIR};
pub use session::{serve, Gadget};

/// What can go wrong with the function itself (a connection's failures end
/// that connection only).
#[derive(Debug, Error)]
pub enum FfsError {
    #[error("{}: {action}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        source: io::Error,
    },
    /// Setting up an endpoint failed; the message names it.
    #[error("{source}")]
    Endpoint { source: io::Error },
    #[error("{}: read {len} bytes of events, not whole 12-byte events", path.display())]
    BadEvents { path: PathBuf, len: usize },
    #[error("{}: the control endpoint was closed", path.display())]
    Ep0Closed { path: PathBuf },
    #[error("{}: no UDC to bind the gadget to (is a UDC driver loaded?)", path.display())]
    NoUdc { path: PathBuf },
}

impl FfsError {
    pub(crate) fn io(path: &Path, action: &'static str, source: io::Error) -> FfsError {
        FfsError::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    }
}

#[cfg(test)]
mod tests;
