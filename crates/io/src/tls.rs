//! TLS 1.3 on ADB's TCP connections, both roles (docs/protocol.md, "STLS").
//!
//! The STLS exchange itself is the engine's ([`oxadb_engine::Tls`]); this
//! module runs the packets before it on the bare socket ([`negotiate`]),
//! then the TLS handshake (rustls with ring), and hands the socket, TLS or
//! not, to [`Connection::start_tcp`](crate::Connection::start_tcp).
//!
//! Certificates are self-signed and carry the RSA key that identifies the
//! side (AOSP crypto/x509_generator.cpp): adbd checks the host's key against
//! its `adb_keys` (daemon/auth.cpp `adbd_tls_verify_cert`), and adb accepts
//! any device certificate, trust in the device coming from pairing.
//!
//! Without the `tls` feature only [`negotiate`] is left, for plaintext: a
//! side with no TLS never sends STLS, and a peer's STLS ends the connection.

#[cfg(feature = "tls")]
use std::fmt;
#[cfg(feature = "tls")]
use std::sync::Arc;

use oxadb_wire::{Header, HEADER_LEN};
#[cfg(feature = "tls")]
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
#[cfg(feature = "tls")]
use rustls::crypto::CryptoProvider;
#[cfg(feature = "tls")]
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
#[cfg(feature = "tls")]
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
#[cfg(feature = "tls")]
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, OtherError,
    ServerConfig, SignatureScheme,
};
use std::future::Future;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::ConnectionError;

#[cfg(feature = "tls")]
/// A certificate and its private key: one side's TLS identity.
pub struct TlsIdentity {
    pub cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
}

#[cfg(feature = "tls")]
impl Clone for TlsIdentity {
    fn clone(&self) -> TlsIdentity {
        TlsIdentity {
            cert: self.cert.clone(),
            key: self.key.clone_key(),
        }
    }
}

#[cfg(feature = "tls")]
impl fmt::Debug for TlsIdentity {
    // Never prints the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("cert_len", &self.cert.len())
            .finish()
    }
}

#[cfg(feature = "tls")]
/// Why a TLS identity or configuration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("making a self-signed certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

#[cfg(feature = "tls")]
impl TlsIdentity {
    /// A self-signed certificate for an RSA key (PKCS#8 DER), made the way
    /// AOSP crypto/x509_generator.cpp makes adb's: subject C=US, O=Android,
    /// CN=Adb, SHA-256 with RSA, a CA certificate valid for ten years.
    pub fn self_signed_rsa(pkcs8_der: Vec<u8>) -> Result<TlsIdentity, TlsError> {
        let key = PrivatePkcs8KeyDer::from(pkcs8_der);
        let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&key, &rcgen::PKCS_RSA_SHA256)?;
        let mut params = rcgen::CertificateParams::default();
        let mut name = rcgen::DistinguishedName::new();
        name.push(rcgen::DnType::CountryName, "US");
        name.push(rcgen::DnType::OrganizationName, "Android");
        name.push(rcgen::DnType::CommonName, "Adb");
        params.distinguished_name = name;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(3650);
        let cert = params.self_signed(&pair)?;
        Ok(TlsIdentity {
            cert: cert.der().clone(),
            key,
        })
    }

    /// A fresh self-signed ECDSA P-256 identity named `name`, for a
    /// connection where the certificate only has to exist (pairing: the
    /// code, not the certificate, proves the peer).
    pub fn ephemeral(name: &str) -> Result<TlsIdentity, TlsError> {
        let certified = rcgen::generate_simple_self_signed(vec![name.to_string()])?;
        Ok(TlsIdentity {
            cert: certified.cert.der().clone(),
            key: PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()),
        })
    }

    /// An identity from a certificate (DER) and its key (PKCS#8 DER) kept on disk.
    pub fn from_parts(cert_der: Vec<u8>, pkcs8_der: Vec<u8>) -> TlsIdentity {
        TlsIdentity {
            cert: CertificateDer::from(cert_der),
            key: PrivatePkcs8KeyDer::from(pkcs8_der),
        }
    }

    /// The private key, PKCS#8 DER (to keep on disk beside the certificate).
    pub fn key_der(&self) -> &[u8] {
        self.key.secret_pkcs8_der()
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key.clone_key())
    }
}

#[cfg(feature = "tls")]
fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite;
    // AES-128-GCM first, as adb's BoringSSL offers it on CPUs with AES
    // instructions: ten rounds to AES-256's fourteen, for every byte a
    // transfer moves (rustls' default puts AES-256 first).
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::ring::default_provider()
    })
}

#[cfg(feature = "tls")]
/// Device role: decides whether a host's certificate is let in, from its
/// SubjectPublicKeyInfo (DER). `Err` says why not, for the daemon's log.
pub trait ClientKeyCheck: Send + Sync {
    fn check(&self, spki_der: &[u8]) -> Result<(), String>;
    /// CA names to send in the CertificateRequest (AOSP tls/adb_ca_list.cpp:
    /// one per trusted key, so adb can pick which of its keys to present).
    fn hints(&self) -> Vec<DistinguishedName> {
        Vec::new()
    }
}

#[cfg(feature = "tls")]
/// Host role: decides whether to go on with a device's certificate (DER).
/// adb accepts any (trust in the device comes from pairing); a pairing step
/// that records the device's certificate can pin it here.
pub trait DeviceCertCheck: Send + Sync {
    fn check(&self, cert_der: &[u8]) -> Result<(), String>;
}

#[cfg(feature = "tls")]
/// Accepts every device certificate, as adb does.
pub struct AnyDevice;

#[cfg(feature = "tls")]
impl DeviceCertCheck for AnyDevice {
    fn check(&self, _cert_der: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(feature = "tls")]
/// The error rustls reports for a refused certificate, with our reason.
#[derive(Debug)]
struct Refused(String);

#[cfg(feature = "tls")]
impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(feature = "tls")]
impl std::error::Error for Refused {}

#[cfg(feature = "tls")]
fn refused(reason: String) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(Refused(
        reason,
    )))))
}

#[cfg(feature = "tls")]
/// The SubjectPublicKeyInfo (DER) of a certificate (DER).
pub fn certificate_spki(cert_der: &[u8]) -> Result<Vec<u8>, String> {
    use x509_cert::der::{Decode, Encode};
    let cert = x509_cert::Certificate::from_der(cert_der)
        .map_err(|error| format!("unparsable certificate: {error}"))?;
    cert.tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|error| format!("certificate's public key: {error}"))
}

#[cfg(feature = "tls")]
/// One role's decision on the peer's certificate (DER); `Err` says why not.
trait PeerCertCheck: Send + Sync {
    fn check_cert(&self, cert_der: &[u8]) -> Result<(), String>;
}

#[cfg(feature = "tls")]
/// Device role: the host's key, taken from its certificate, against the
/// trusted keys, and the CA names sent to the host.
struct HostKeyCheck {
    /// `None`: any certificate (the host needs no key, as adbd without
    /// auth_required); the handshake still proves it holds the key.
    check: Option<Arc<dyn ClientKeyCheck>>,
    hints: Vec<DistinguishedName>,
}

#[cfg(feature = "tls")]
impl PeerCertCheck for HostKeyCheck {
    fn check_cert(&self, cert_der: &[u8]) -> Result<(), String> {
        match &self.check {
            Some(check) => check.check(&certificate_spki(cert_der)?),
            None => Ok(()),
        }
    }
}

#[cfg(feature = "tls")]
/// Host role: the device's whole certificate, as [`DeviceCertCheck`] sees it.
struct DeviceCheck(Arc<dyn DeviceCertCheck>);

#[cfg(feature = "tls")]
impl PeerCertCheck for DeviceCheck {
    fn check_cert(&self, cert_der: &[u8]) -> Result<(), String> {
        self.0.check(cert_der)
    }
}

#[cfg(feature = "tls")]
/// The peer's certificate verifier, one for both roles: the role's check
/// decides on the certificate, and the handshake signature is verified the
/// same way whichever side signed it.
struct PeerVerifier<C> {
    check: C,
    provider: Arc<CryptoProvider>,
}

#[cfg(feature = "tls")]
impl<C: PeerCertCheck> PeerVerifier<C> {
    fn verify_cert(&self, end_entity: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        self.check.check_cert(end_entity).map_err(refused)
    }

    fn verify_tls12(&self) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Only TLS 1.3 is configured (AOSP tls_connection.cpp sets 1.3 as
        // both minimum and maximum).
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(feature = "tls")]
impl fmt::Debug for PeerVerifier<HostKeyCheck> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientVerifier")
            .field("checks_keys", &self.check.check.is_some())
            .finish()
    }
}

#[cfg(feature = "tls")]
impl fmt::Debug for PeerVerifier<DeviceCheck> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServerVerifier")
    }
}

#[cfg(feature = "tls")]
impl ClientCertVerifier for PeerVerifier<HostKeyCheck> {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.check.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.verify_cert(end_entity)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_tls12()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
}

#[cfg(feature = "tls")]
impl ServerCertVerifier for PeerVerifier<DeviceCheck> {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verify_cert(end_entity)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_tls12()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
}

#[cfg(feature = "tls")]
/// Device role: a TLS 1.3 server configuration presenting `identity` and
/// asking every host for its certificate, checked by `check` (`None`: any).
pub fn server_config(
    identity: &TlsIdentity,
    check: Option<Arc<dyn ClientKeyCheck>>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let hints = check.as_ref().map(|c| c.hints()).unwrap_or_default();
    let verifier = Arc::new(PeerVerifier {
        check: HostKeyCheck { check, hints },
        provider: provider.clone(),
    });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![identity.cert.clone()], identity.key())?;
    // adb never resumes a session, and speaks first after the handshake is
    // the device's CNXN (AOSP transport.cpp DoTlsHandshake): no tickets.
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

#[cfg(feature = "tls")]
/// Host role: a TLS 1.3 client configuration presenting `identity` (made
/// from the adb key the device trusts) and checking the device's
/// certificate with `device`.
pub fn client_config(
    identity: &TlsIdentity,
    device: Arc<dyn DeviceCertCheck>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider();
    let verifier = Arc::new(PeerVerifier {
        check: DeviceCheck(device),
        provider: provider.clone(),
    });
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(vec![identity.cert.clone()], identity.key())?;
    Ok(Arc::new(config))
}

/// The first byte of a TLS handshake record (RFC 8446, 5.1); no ADB
/// command starts with it.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Which TLS side a TCP connection plays if the engine moves to TLS.
#[cfg(feature = "tls")]
#[derive(Clone)]
pub enum TlsSide {
    /// Device role: the server configuration for this host.
    Device(Arc<ServerConfig>),
    /// Host role: the client configuration; the device's address names it.
    Host(Arc<ClientConfig>),
}

/// Without TLS there is no side to play: [`negotiate`] takes `None`.
#[cfg(not(feature = "tls"))]
#[derive(Clone)]
pub enum TlsSide {}

/// A TCP socket after [`negotiate`]: plaintext, or TLS from here on (the
/// socket and the rustls connection whose handshake completed on it).
pub enum TcpTransport {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls {
        socket: TcpStream,
        session: Box<rustls::Connection>,
    },
}

impl TcpTransport {
    pub fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return matches!(self, TcpTransport::Tls { .. });
        #[cfg(not(feature = "tls"))]
        false
    }
}

/// Runs `engine`'s handshake on the bare socket until it either moves to
/// TLS (STLS exchanged: the TLS handshake runs here, then
/// [`tls_established`](oxadb_engine::Connection::tls_established)) or goes
/// on in plaintext (a device answered CNXN with AUTH or CNXN, or a host got
/// one of those). Packets are read exactly, header then payload, so no byte
/// meant for TLS is consumed here. Any events the engine queued are left for
/// the driver.
///
/// `started` is when the connection was accepted or made: time zero of the
/// engine's clock, which [`Connection::start_tcp`](crate::Connection::start_tcp)
/// goes on from. Every wait here lasts at most until the engine's deadline
/// ([`Config::handshake_timeout`](oxadb_engine::Config)); when it passes
/// first the timeout is logged and the result is [`ConnectionError::Closed`].
pub async fn negotiate(
    mut stream: TcpStream,
    engine: &mut oxadb_engine::Connection,
    tls: Option<&TlsSide>,
    started: Instant,
) -> Result<TcpTransport, ConnectionError> {
    if engine.role() == oxadb_engine::Role::Host {
        return negotiate_host(stream, engine, tls, started).await;
    }
    loop {
        send_pending(&mut stream, engine, started).await?;
        if engine.starting_tls() {
            break;
        }
        if engine.is_online() || engine.awaiting_auth() {
            return Ok(TcpTransport::Plain(stream));
        }
        if engine.tls_pending() && engine.role() == oxadb_engine::Role::Device {
            // A TLS record (a handshake: content type 22) instead of the
            // host's STLS: adb's STLS lost a race and follows the handshake.
            let mut first = [0u8; 1];
            let peeked = before_deadline(engine, started, stream.peek(&mut first)).await?;
            if peeked? == 1 && first[0] == TLS_HANDSHAKE_RECORD {
                tracing::debug!(
                    "TLS handshake before the host's STLS; its STLS will follow in TLS"
                );
                engine.tls_began_early();
                break;
            }
        }
        let max_payload = engine.max_incoming_payload();
        let (header, payload) = before_deadline(engine, started, async {
            let mut raw = [0u8; HEADER_LEN];
            read_exact(&mut stream, &mut raw, |got| {
                if got == 0 {
                    ConnectionError::PeerClosed
                } else {
                    ConnectionError::TruncatedHeader(got)
                }
            })
            .await?;
            let header = Header::decode(&raw, max_payload)?;
            let mut payload = vec![0u8; header.data_length as usize];
            read_exact(&mut stream, &mut payload, |got| {
                ConnectionError::TruncatedPayload {
                    command: header.command,
                    got,
                    expected: header.data_length as usize,
                }
            })
            .await?;
            Ok::<_, ConnectionError>((header, payload))
        })
        .await??;
        engine.set_time(started.elapsed());
        engine.handle_packet(&header, payload.into())?;
    }
    start_tls(stream, engine, tls, started).await
}

/// Host role: sends CNXN and looks at the device's first packet without
/// taking it unless it is STLS, so that the driver reads any other answer
/// (and its own checks see every byte the device sent).
async fn negotiate_host(
    mut stream: TcpStream,
    engine: &mut oxadb_engine::Connection,
    tls: Option<&TlsSide>,
    started: Instant,
) -> Result<TcpTransport, ConnectionError> {
    // A peer that is no ADB daemon may hang up before our CNXN is out
    // (EPIPE or a reset): what it sent, if anything, is still to be read,
    // and the driver's first-bytes check names it.
    if let Err(error) = send_pending(&mut stream, engine, started).await {
        return match error {
            ConnectionError::Io(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                Ok(TcpTransport::Plain(stream))
            }
            error => Err(error),
        };
    }
    let stls = oxadb_wire::Command::Stls.as_u32().to_le_bytes();
    let mut head = [0u8; HEADER_LEN];
    let seen_stls = before_deadline(engine, started, async {
        loop {
            // A failed peek (a peer that reset the connection on our CNXN) is
            // the driver's to report, where the first-bytes check names it.
            let Ok(seen) = stream.peek(&mut head).await else {
                return false;
            };
            let prefix = seen.min(stls.len());
            if seen == 0 || head[..prefix] != stls[..prefix] {
                return false;
            }
            if seen == HEADER_LEN {
                return true;
            }
            // Part of a header: peek returns at once while any byte waits.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await?;
    if !seen_stls {
        return Ok(TcpTransport::Plain(stream));
    }
    let header = Header::decode(&head, engine.max_incoming_payload())?;
    let payload = before_deadline(engine, started, async {
        stream.read_exact(&mut head).await?;
        let mut payload = vec![0u8; header.data_length as usize];
        stream.read_exact(&mut payload).await?;
        Ok::<_, std::io::Error>(payload)
    })
    .await??;
    engine.set_time(started.elapsed());
    engine.handle_packet(&header, payload.into())?;
    send_pending(&mut stream, engine, started).await?;
    start_tls(stream, engine, tls, started).await
}

/// Runs `step`, socket I/O that leaves the engine alone, until it completes
/// or the engine's next deadline passes. A deadline that passes hands the
/// engine the time; when that gave the connection up (a handshake deadline:
/// before CNXN is answered no other timer runs), the step is dropped, the
/// timeout is logged and the result is [`ConnectionError::Closed`];
/// otherwise the step goes on.
async fn before_deadline<T>(
    engine: &mut oxadb_engine::Connection,
    started: Instant,
    step: impl Future<Output = T>,
) -> Result<T, ConnectionError> {
    tokio::pin!(step);
    loop {
        let Some(deadline) = engine.poll_timeout() else {
            return Ok(step.await);
        };
        tokio::select! {
            outcome = &mut step => return Ok(outcome),
            () = tokio::time::sleep_until((started + deadline).into()) => {
                engine.handle_timeout(started.elapsed());
                if engine.handshake_timed_out() {
                    // The connection is given up: of its events only the
                    // timeout matters, for the log.
                    while let Some(event) = engine.poll_event() {
                        if let oxadb_engine::Event::HandshakeTimedOut { stage, limit } = event {
                            crate::driver::log_handshake_timeout(stage, limit);
                        }
                    }
                    return Err(ConnectionError::Closed);
                }
            }
        }
    }
}

/// Writes every packet the engine has queued, during the handshake (before
/// any driver owns the socket), within the engine's deadline.
async fn send_pending(
    stream: &mut TcpStream,
    engine: &mut oxadb_engine::Connection,
    started: Instant,
) -> Result<(), ConnectionError> {
    let mut packets = Vec::new();
    while let Some(packet) = engine.poll_transmit() {
        packets.push((engine.header_for(&packet).encode(), packet.payload));
    }
    if packets.is_empty() {
        return Ok(());
    }
    before_deadline(engine, started, async {
        for (header, payload) in &packets {
            stream.write_all(header).await?;
            stream.write_all(payload).await?;
        }
        Ok::<_, std::io::Error>(())
    })
    .await??;
    Ok(())
}

/// Runs the TLS handshake once STLS was exchanged, within the engine's
/// deadline.
#[cfg(feature = "tls")]
async fn start_tls(
    stream: TcpStream,
    engine: &mut oxadb_engine::Connection,
    tls: Option<&TlsSide>,
    started: Instant,
) -> Result<TcpTransport, ConnectionError> {
    // tokio-rustls runs the handshake only; the records after it go through
    // `tls_stream`, which reads and writes the socket itself.
    let handshake = async {
        Ok(match tls {
            Some(TlsSide::Device(config)) => {
                let (socket, session) = tokio_rustls::TlsAcceptor::from(config.clone())
                    .accept(stream)
                    .await
                    .map_err(|error| ConnectionError::Tls(describe(&error)))?
                    .into_inner();
                (socket, rustls::Connection::Server(session))
            }
            Some(TlsSide::Host(config)) => {
                let name = ServerName::IpAddress(stream.peer_addr()?.ip().into());
                let (socket, session) = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, stream)
                    .await
                    .map_err(|error| ConnectionError::Tls(describe(&error)))?
                    .into_inner();
                (socket, rustls::Connection::Client(session))
            }
            None => {
                return Err(ConnectionError::Tls(
                    "STLS exchanged but this side has no TLS configuration".into(),
                ))
            }
        })
    };
    let (socket, session) = before_deadline(engine, started, handshake).await??;
    engine.set_time(started.elapsed());
    engine.tls_established();
    Ok(TcpTransport::Tls {
        socket,
        session: Box::new(session),
    })
}

/// Without TLS a side never sends STLS ([`TlsSide`] has no value), so a
/// peer's STLS is a protocol error.
#[cfg(not(feature = "tls"))]
async fn start_tls(
    _stream: TcpStream,
    _engine: &mut oxadb_engine::Connection,
    tls: Option<&TlsSide>,
    _started: Instant,
) -> Result<TcpTransport, ConnectionError> {
    match tls {
        Some(side) => match *side {},
        None => Err(ConnectionError::Tls(
            "STLS exchanged but this side has no TLS configuration".into(),
        )),
    }
}

async fn read_exact(
    stream: &mut TcpStream,
    buf: &mut [u8],
    short: impl Fn(usize) -> ConnectionError,
) -> Result<(), ConnectionError> {
    let mut got = 0;
    while got < buf.len() {
        let n = stream.read(&mut buf[got..]).await?;
        if n == 0 {
            return Err(short(got));
        }
        got += n;
    }
    Ok(())
}

#[cfg(feature = "tls")]
/// A TLS error in words: our own reason for refusing a certificate as it
/// was given, rustls' text otherwise.
fn describe(error: &std::io::Error) -> String {
    match error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(other)))) => {
            format!("certificate refused: {other}")
        }
        Some(rustls::Error::AlertReceived(alert)) => alert_text(*alert),
        _ => error.to_string(),
    }
}

#[cfg(feature = "tls")]
pub(crate) fn alert_text(alert: rustls::AlertDescription) -> String {
    format!(
        "the peer ended TLS with alert {alert:?} (a device does when our certificate's \
         key is not among its trusted keys: `oxadbd trust-key ~/.android/adbkey.pub` there)"
    )
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A device's key check that records what it was shown and answers `verdict`.
    struct RecordingKeyCheck {
        seen: Mutex<Vec<Vec<u8>>>,
        verdict: Result<(), String>,
    }

    impl ClientKeyCheck for RecordingKeyCheck {
        fn check(&self, spki_der: &[u8]) -> Result<(), String> {
            self.seen.lock().unwrap().push(spki_der.to_vec());
            self.verdict.clone()
        }
    }

    /// A host's device check that records what it was shown and answers `verdict`.
    struct RecordingDeviceCheck {
        seen: Mutex<Vec<Vec<u8>>>,
        verdict: Result<(), String>,
    }

    impl DeviceCertCheck for RecordingDeviceCheck {
        fn check(&self, cert_der: &[u8]) -> Result<(), String> {
            self.seen.lock().unwrap().push(cert_der.to_vec());
            self.verdict.clone()
        }
    }

    /// Runs a TLS handshake between the two configurations over an
    /// in-memory pipe: (device's outcome, host's outcome), errors in words.
    async fn handshake(
        device: Arc<ServerConfig>,
        host: Arc<ClientConfig>,
    ) -> (Result<(), String>, Result<(), String>) {
        let (device_end, host_end) = tokio::io::duplex(64 * 1024);
        let accept = tokio::spawn(async move {
            let mut stream = tokio_rustls::TlsAcceptor::from(device)
                .accept(device_end)
                .await
                .map_err(|error| describe(&error))?;
            // The host's certificate is checked on its Finished: read
            // until the host's first byte (or its end) to see the verdict.
            let mut byte = [0u8; 1];
            stream
                .read(&mut byte)
                .await
                .map(drop)
                .map_err(|error| describe(&error))
        });
        let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let host_outcome = match tokio_rustls::TlsConnector::from(host)
            .connect(name, host_end)
            .await
        {
            Ok(mut stream) => {
                // Closing makes the device's read end once the handshake is done.
                stream.shutdown().await.map_err(|error| describe(&error))
            }
            Err(error) => Err(describe(&error)),
        };
        (accept.await.unwrap(), host_outcome)
    }

    #[tokio::test]
    async fn the_device_checks_the_hosts_key_and_says_why_it_refuses() {
        let host_identity = TlsIdentity::ephemeral("host").unwrap();
        let device_identity = TlsIdentity::ephemeral("device").unwrap();
        let host = client_config(&host_identity, Arc::new(AnyDevice)).unwrap();

        let trusting = Arc::new(RecordingKeyCheck {
            seen: Mutex::new(Vec::new()),
            verdict: Ok(()),
        });
        let device = server_config(&device_identity, Some(trusting.clone())).unwrap();
        let (device_outcome, host_outcome) = handshake(device, host.clone()).await;
        assert_eq!(device_outcome, Ok(()));
        assert_eq!(host_outcome, Ok(()));
        let host_spki = certificate_spki(&host_identity.cert).unwrap();
        assert_eq!(*trusting.seen.lock().unwrap(), vec![host_spki]);

        let refusing = Arc::new(RecordingKeyCheck {
            seen: Mutex::new(Vec::new()),
            verdict: Err("key not in adb_keys".into()),
        });
        let device = server_config(&device_identity, Some(refusing)).unwrap();
        let (device_outcome, _) = handshake(device, host).await;
        assert_eq!(
            device_outcome,
            Err("certificate refused: key not in adb_keys".into())
        );
    }

    #[tokio::test]
    async fn a_device_without_a_key_check_lets_any_host_in() {
        let host = client_config(
            &TlsIdentity::ephemeral("host").unwrap(),
            Arc::new(AnyDevice),
        )
        .unwrap();
        let device = server_config(&TlsIdentity::ephemeral("device").unwrap(), None).unwrap();
        assert_eq!(handshake(device, host).await, (Ok(()), Ok(())));
    }

    #[tokio::test]
    async fn the_host_checks_the_devices_certificate_and_says_why_it_refuses() {
        let device_identity = TlsIdentity::ephemeral("device").unwrap();
        let device = server_config(&device_identity, None).unwrap();
        let refusing = Arc::new(RecordingDeviceCheck {
            seen: Mutex::new(Vec::new()),
            verdict: Err("not the paired device".into()),
        });
        let host =
            client_config(&TlsIdentity::ephemeral("host").unwrap(), refusing.clone()).unwrap();
        let (device_outcome, host_outcome) = handshake(device, host).await;
        assert_eq!(
            host_outcome,
            Err("certificate refused: not the paired device".into())
        );
        assert!(device_outcome.is_err());
        assert_eq!(
            *refusing.seen.lock().unwrap(),
            vec![device_identity.cert.to_vec()]
        );
    }

    /// A device engine bounded by `handshake_timeout`, with TLS required.
    fn bounded_device(handshake_timeout: std::time::Duration) -> oxadb_engine::Connection {
        let mut config = oxadb_engine::Config::new(
            oxadb_engine::Role::Device,
            oxadb_wire::Banner::new("device"),
        );
        config.tls = oxadb_engine::Tls::Required;
        config.handshake_timeout = Some(handshake_timeout);
        oxadb_engine::Connection::new(config)
    }

    /// Runs `negotiate` for a device over loopback against `host`, which
    /// plays the host's side on the other socket and hands it back to be
    /// kept open; returns the outcome, how long it took and the engine.
    async fn negotiate_against<F, Fut>(
        host: F,
    ) -> (
        Result<TcpTransport, ConnectionError>,
        std::time::Duration,
        oxadb_engine::Connection,
    )
    where
        F: FnOnce(TcpStream) -> Fut,
        Fut: std::future::Future<Output = TcpStream> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let host_socket = TcpStream::connect(address).await.unwrap();
        let (socket, _) = listener.accept().await.unwrap();
        let host_task = tokio::spawn(host(host_socket));
        let side = TlsSide::Device(
            server_config(&TlsIdentity::ephemeral("device").unwrap(), None).unwrap(),
        );
        let mut engine = bounded_device(std::time::Duration::from_millis(300));
        let started = Instant::now();
        let outcome = negotiate(socket, &mut engine, Some(&side), started).await;
        let took = started.elapsed();
        // Its checks passed, and its socket stayed open until now.
        drop(host_task.await.unwrap());
        (outcome, took, engine)
    }

    /// Closed by the engine's 300 ms deadline: not before it, and not at
    /// some later limit (the bound allows a loaded runner seconds of delay).
    fn assert_gave_up_at_the_deadline(
        outcome: &Result<TcpTransport, ConnectionError>,
        took: std::time::Duration,
        engine: &oxadb_engine::Connection,
    ) {
        assert!(matches!(outcome, Err(ConnectionError::Closed)));
        assert!(engine.handshake_timed_out());
        assert!(
            took >= std::time::Duration::from_millis(300)
                && took < std::time::Duration::from_secs(10),
            "{took:?}"
        );
    }

    #[tokio::test]
    async fn negotiate_gives_up_at_the_engines_handshake_deadline() {
        // No CNXN at all.
        let (outcome, took, engine) = negotiate_against(|socket| async move { socket }).await;
        assert_gave_up_at_the_deadline(&outcome, took, &engine);

        // CNXN at once, STLS back, then neither STLS nor a TLS handshake:
        // still the deadline counted from the start.
        let (outcome, took, engine) = negotiate_against(|mut socket| async move {
            let cnxn = oxadb_wire::Packet::new(
                oxadb_wire::Command::Cnxn,
                oxadb_wire::packet::VERSION_SKIP_CHECKSUM,
                oxadb_wire::MAX_PAYLOAD,
                b"host::features=sendrecv_v2\0".to_vec(),
            );
            socket.write_all(&cnxn.header(true).encode()).await.unwrap();
            socket.write_all(&cnxn.payload).await.unwrap();
            let mut stls = [0u8; HEADER_LEN];
            socket.read_exact(&mut stls).await.unwrap();
            assert_eq!(stls[..4], oxadb_wire::Command::Stls.as_u32().to_le_bytes());
            socket
        })
        .await;
        assert_gave_up_at_the_deadline(&outcome, took, &engine);
    }
}
