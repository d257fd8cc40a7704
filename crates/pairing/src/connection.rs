//! One pairing exchange over TCP, either role (AOSP
//! pairing_connection/pairing_connection.cpp): TLS 1.3 with self-signed
//! certificates that neither side checks (the code is the secret), the
//! password = code + 64 bytes exported from the TLS session (binding SPAKE2 to
//! this session), one SPAKE2 message each way, then one sealed PeerInfo each
//! way.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme,
};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::format::{
    Cipher, FormatError, Header, PeerInfo, EXPORTED_KEY_SIZE, EXPORTER_LABEL, HEADER_SIZE,
    PEER_INFO_SIZE, TYPE_PEER_INFO, TYPE_SPAKE2_MSG,
};
use crate::spake2::{Role, Spake2, Spake2Error, MSG_SIZE};

#[derive(Debug, Error)]
pub enum PairError {
    #[error("making the TLS certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("TLS setup: {0}")]
    TlsConfig(#[from] rustls::Error),
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

/// A self-signed certificate and its key for one side's TLS: pairing checks
/// neither (both verify callbacks accept any certificate), so a fresh
/// ECDSA P-256 one serves.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

impl Identity {
    pub fn ephemeral(name: &str) -> Result<Identity, PairError> {
        let certified = rcgen::generate_simple_self_signed(vec![name.to_string()])?;
        Ok(Identity {
            cert: certified.cert.der().clone(),
            key: certified.signing_key.serialize_der(),
        })
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()))
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any certificate but still checks the handshake signatures, so
/// the peer holds the key of the certificate it sent.
#[derive(Debug)]
struct AnyCertificate(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

impl ClientCertVerifier for AnyCertificate {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// The device's TLS: TLS 1.3 only, a client certificate required (as adb's
/// SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT) but not checked.
pub fn server_config(identity: &Identity) -> Result<Arc<ServerConfig>, PairError> {
    let provider = provider();
    let verifier = Arc::new(AnyCertificate(provider.signature_verification_algorithms));
    let config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![identity.cert.clone()], identity.key())?;
    Ok(Arc::new(config))
}

/// The host's TLS: TLS 1.3 only, any server certificate, ours sent.
pub fn client_config(identity: &Identity) -> Result<Arc<ClientConfig>, PairError> {
    let provider = provider();
    let verifier = Arc::new(AnyCertificate(provider.signature_verification_algorithms));
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(vec![identity.cert.clone()], identity.key())?;
    Ok(Arc::new(config))
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
    let spake = Spake2::new(
        Role::Bob,
        crate::SERVER_NAME,
        crate::CLIENT_NAME,
        &password(code, exported),
    )?;
    write_packet(
        &mut tls,
        TYPE_SPAKE2_MSG,
        spake.message(),
        "sending our SPAKE2 message",
    )
    .await?;
    let theirs = read_packet(
        &mut tls,
        TYPE_SPAKE2_MSG,
        "reading the host's SPAKE2 message",
    )
    .await?;
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
    let spake = Spake2::new(
        Role::Alice,
        crate::CLIENT_NAME,
        crate::SERVER_NAME,
        &password(code, exported),
    )?;
    write_packet(
        &mut tls,
        TYPE_SPAKE2_MSG,
        spake.message(),
        "sending our SPAKE2 message",
    )
    .await?;
    let theirs = read_packet(
        &mut tls,
        TYPE_SPAKE2_MSG,
        "reading the device's SPAKE2 message",
    )
    .await?;
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
        let server_config = server_config(&Identity::ephemeral("device").unwrap()).unwrap();
        let client_config = client_config(&Identity::ephemeral("host").unwrap()).unwrap();
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
