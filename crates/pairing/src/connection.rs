//! One pairing exchange over TCP, either role (AOSP
//! pairing_connection/pairing_connection.cpp): TLS 1.3 with self-signed
//! certificates that neither side checks (the code is the secret), the
//! password = code + 64 bytes exported from the TLS session (binding SPAKE2 to
//! this session), one SPAKE2 message each way, then one sealed PeerInfo each
//! way.

use std::sync::Arc;

use oxadb_io::tls::{AnyDevice, TlsError, TlsIdentity};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::format::{
    Cipher, FormatError, Header, PeerInfo, EXPORTED_KEY_SIZE, EXPORTER_LABEL, HEADER_SIZE,
    PEER_INFO_SIZE, TYPE_PEER_INFO, TYPE_SPAKE2_MSG,
};
use crate::spake2::{Role, Spake2, Spake2Error, MSG_SIZE};

#[derive(Debug, Error)]
pub enum PairError {
    #[error("TLS setup: {0}")]
    TlsConfig(#[from] TlsError),
    #[error("exporting the TLS session's keying material: {0}")]
    Exporter(#[from] rustls::Error),
    #[error("TLS handshake: {0}")]
    Handshake(std::io::Error),
    #[error("{stage}: {source}")]
    Io {
        stage: &'static str,
        source: std::io::Error,
    },
    #[error("{0}")]
    Format(#[from] FormatError),
    #[error("{0}")]
    Spake2(#[from] Spake2Error),
    /// The peer's PeerInfo did not decrypt: its code differs from ours.
    #[error("wrong pairing code")]
    WrongCode,
    /// The device closed the connection instead of sending its PeerInfo,
    /// which it does when the code is wrong (adb says "Wrong password or
    /// connection was dropped").
    #[error("wrong pairing code, or the device dropped the connection")]
    Refused,
    /// The peer failed after it had sent its SPAKE2 message: it had a guess.
    #[error("{0}")]
    AfterGuess(Box<PairError>),
}

impl PairError {
    /// Whether the peer could have tried a code in this exchange.
    pub fn used_a_guess(&self) -> bool {
        matches!(self, PairError::WrongCode | PairError::AfterGuess(_))
    }
}

/// A fresh self-signed identity for one side of a pairing connection:
/// neither side checks the other's certificate (the code is the secret).
pub fn ephemeral_identity(name: &str) -> Result<TlsIdentity, PairError> {
    Ok(TlsIdentity::ephemeral(name)?)
}

/// The device's TLS: ADB's own TLS 1.3 server configuration (crates/io),
/// a client certificate required (as adb's SSL_VERIFY_PEER |
/// SSL_VERIFY_FAIL_IF_NO_PEER_CERT) but any accepted.
pub fn server_config(identity: &TlsIdentity) -> Result<Arc<ServerConfig>, PairError> {
    Ok(oxadb_io::tls::server_config(identity, None)?)
}

/// The host's TLS: ADB's own TLS 1.3 client configuration, any device
/// certificate, ours sent.
pub fn client_config(identity: &TlsIdentity) -> Result<Arc<ClientConfig>, PairError> {
    Ok(oxadb_io::tls::client_config(identity, Arc::new(AnyDevice))?)
}

async fn write_packet<S: AsyncWrite + Unpin>(
    stream: &mut S,
    kind: u8,
    payload: &[u8],
    stage: &'static str,
) -> Result<(), PairError> {
    let header = Header {
        kind,
        payload: payload.len() as u32,
    };
    let io = |source| PairError::Io { stage, source };
    stream.write_all(&header.encode()).await.map_err(io)?;
    stream.write_all(payload).await.map_err(io)?;
    stream.flush().await.map_err(io)
}

async fn read_packet<S: AsyncRead + Unpin>(
    stream: &mut S,
    kind: u8,
    stage: &'static str,
) -> Result<Vec<u8>, PairError> {
    let io = |source| PairError::Io { stage, source };
    let mut header = [0u8; HEADER_SIZE];
    stream.read_exact(&mut header).await.map_err(io)?;
    let header = Header::decode(&header, kind)?;
    let mut payload = vec![0u8; header.payload as usize];
    stream.read_exact(&mut payload).await.map_err(io)?;
    Ok(payload)
}

fn password(code: &[u8], exported: [u8; EXPORTED_KEY_SIZE]) -> Vec<u8> {
    let mut password = code.to_vec();
    password.extend_from_slice(&exported);
    password
}

/// The SPAKE2 step of either role (pairing_auth.cpp): the password is the
/// code bound to this TLS session by its exported keying material; our
/// message goes out, the peer's comes back.
async fn swap_spake2_messages<S: AsyncRead + AsyncWrite + Unpin>(
    tls: &mut S,
    role: Role,
    code: &[u8],
    exported: [u8; EXPORTED_KEY_SIZE],
) -> Result<(Spake2, Vec<u8>), PairError> {
    let (ours, peers, reading) = match role {
        Role::Alice => (
            crate::CLIENT_NAME,
            crate::SERVER_NAME,
            "reading the device's SPAKE2 message",
        ),
        Role::Bob => (
            crate::SERVER_NAME,
            crate::CLIENT_NAME,
            "reading the host's SPAKE2 message",
        ),
    };
    let spake = Spake2::new(role, ours, peers, &password(code, exported))?;
    write_packet(
        tls,
        TYPE_SPAKE2_MSG,
        spake.message(),
        "sending our SPAKE2 message",
    )
    .await?;
    let theirs = read_packet(tls, TYPE_SPAKE2_MSG, reading).await?;
    Ok((spake, theirs))
}

/// Serves one pairing as the device: returns the host's PeerInfo once the
/// host proved the code. Our PeerInfo is sent only after the host's
/// decrypted, so a wrong guess gets nothing sealed under our key.
pub async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    config: Arc<ServerConfig>,
    code: &[u8],
    device: &PeerInfo,
) -> Result<PeerInfo, PairError> {
    let device = device.encode()?;
    let mut tls = tokio_rustls::TlsAcceptor::from(config)
        .accept(stream)
        .await
        .map_err(PairError::Handshake)?;
    let exported =
        tls.get_ref()
            .1
            .export_keying_material([0u8; EXPORTED_KEY_SIZE], EXPORTER_LABEL, None)?;
    let (spake, theirs) = swap_spake2_messages(&mut tls, Role::Bob, code, exported).await?;
    let after = |error: PairError| match error {
        PairError::WrongCode => error,
        other => PairError::AfterGuess(Box::new(other)),
    };
    if theirs.len() != MSG_SIZE {
        return Err(after(Spake2Error::MessageSize(theirs.len()).into()));
    }
    let mut cipher = Cipher::new(&spake.finish(&theirs).map_err(|e| after(e.into()))?);
    let sealed = read_packet(&mut tls, TYPE_PEER_INFO, "reading the host's peer info")
        .await
        .map_err(after)?;
    let host = cipher.open(&sealed).map_err(|_| PairError::WrongCode)?;
    let host = PeerInfo::decode(&host).map_err(|e| after(e.into()))?;
    write_packet(
        &mut tls,
        TYPE_PEER_INFO,
        &cipher.seal(&device),
        "sending our peer info",
    )
    .await
    .map_err(after)?;
    // close_notify, so the host reads our PeerInfo to its end.
    let _ = tls.shutdown().await;
    Ok(host)
}

/// Pairs as the host with a device at the other end of `stream`: returns
/// the device's PeerInfo (its GUID).
pub async fn pair<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    config: Arc<ClientConfig>,
    server_name: &str,
    code: &[u8],
    host: &PeerInfo,
) -> Result<PeerInfo, PairError> {
    let host = host.encode()?;
    let name = ServerName::try_from(server_name.to_string())
        .unwrap_or_else(|_| ServerName::try_from("device.invalid").expect("a valid DNS name"));
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await
        .map_err(PairError::Handshake)?;
    let exported =
        tls.get_ref()
            .1
            .export_keying_material([0u8; EXPORTED_KEY_SIZE], EXPORTER_LABEL, None)?;
    let (spake, theirs) = swap_spake2_messages(&mut tls, Role::Alice, code, exported).await?;
    let mut cipher = Cipher::new(&spake.finish(&theirs)?);
    write_packet(
        &mut tls,
        TYPE_PEER_INFO,
        &cipher.seal(&host),
        "sending our peer info",
    )
    .await?;
    let sealed = match read_packet(&mut tls, TYPE_PEER_INFO, "reading the device's peer info").await
    {
        Ok(sealed) => sealed,
        Err(PairError::Io { source, .. })
            if matches!(
                source.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            return Err(PairError::Refused)
        }
        Err(other) => return Err(other),
    };
    if sealed.len() != PEER_INFO_SIZE + 16 {
        return Err(FormatError::PeerInfoSize(sealed.len().saturating_sub(16)).into());
    }
    let device = cipher.open(&sealed).map_err(|_| PairError::WrongCode)?;
    Ok(PeerInfo::decode(&device)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{PEER_DEVICE_GUID, PEER_RSA_PUB_KEY};

    async fn run(
        server_code: &[u8],
        client_code: &[u8],
    ) -> (Result<PeerInfo, PairError>, Result<PeerInfo, PairError>) {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let server_config = server_config(&ephemeral_identity("device").unwrap()).unwrap();
        let client_config = client_config(&ephemeral_identity("host").unwrap()).unwrap();
        let device = PeerInfo {
            kind: PEER_DEVICE_GUID,
            data: b"adb-test-guid".to_vec(),
        };
        let host = PeerInfo {
            kind: PEER_RSA_PUB_KEY,
            data: b"QAAAAKEY user@host".to_vec(),
        };
        let server = async { serve(a, server_config, server_code, &device).await };
        let client = async { pair(b, client_config, "127.0.0.1", client_code, &host).await };
        tokio::join!(server, client)
    }

    #[tokio::test]
    async fn same_code_exchanges_peer_infos() {
        let (server, client) = run(b"123456", b"123456").await;
        assert_eq!(server.unwrap().data, b"QAAAAKEY user@host");
        assert_eq!(client.unwrap().data, b"adb-test-guid");
    }

    #[tokio::test]
    async fn wrong_code_is_refused_on_both_sides() {
        let (server, client) = run(b"123456", b"654321").await;
        let server = server.unwrap_err();
        assert!(matches!(server, PairError::WrongCode), "{server}");
        assert!(server.used_a_guess());
        let client = client.unwrap_err();
        assert!(matches!(client, PairError::Refused), "{client}");
    }
}
