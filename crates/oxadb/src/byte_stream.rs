//! A service's stream of any kind: an [`oxadb_io::AdbStream`] on a direct
//! connection, or the socket an adb host server relays (`host_client`).
//! Shells and sync sessions run over either.

use tokio::io::{AsyncRead, AsyncWrite};

/// Bytes both ways, to and from one device service.
pub trait ByteStream: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> ByteStream for T {}

/// A [`ByteStream`] whose kind is known only at run time.
pub type BoxedStream = Box<dyn ByteStream>;
