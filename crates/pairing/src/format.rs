//! The pairing connection's messages (AOSP pairing_connection.cpp and
//! pairing_auth/aes_128_gcm.cpp): a 6-byte header, SPAKE2 messages, and an
//! 8192-byte PeerInfo sealed with AES-128-GCM.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};
use ring::hkdf::{Salt, HKDF_SHA256};
use thiserror::Error;

/// The only header version adb knows (kCurrentKeyHeaderVersion).
pub const HEADER_VERSION: u8 = 1;
pub const HEADER_SIZE: usize = 6;
/// PairingPacket.Type in proto/pairing.proto.
pub const TYPE_SPAKE2_MSG: u8 = 0;
pub const TYPE_PEER_INFO: u8 = 1;
/// sizeof(PeerInfo): a type byte and 8191 bytes of NUL-terminated data.
pub const PEER_INFO_SIZE: usize = 8192;
/// kMaxPayloadSize: adb refuses larger payloads before reading them.
pub const MAX_PAYLOAD: u32 = 2 * PEER_INFO_SIZE as u32;
/// PeerInfo types (PeerInfoType in pairing_connection.h).
pub const PEER_RSA_PUB_KEY: u8 = 0;
pub const PEER_DEVICE_GUID: u8 = 1;
/// The TLS exporter label: `sizeof("adb-label")`, its NUL included
/// (tls/tls_connection.cpp), no context.
pub const EXPORTER_LABEL: &[u8] = b"adb-label\0";
/// Exported keying material appended to the code to make the password.
pub const EXPORTED_KEY_SIZE: usize = 64;
/// HKDF-SHA256 info for the AES-128-GCM key (no salt, no NUL).
const HKDF_INFO: &[u8] = b"adb pairing_auth aes-128-gcm key";
const TAG_SIZE: usize = 16;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("pairing header version {0}, only 1 is known")]
    Version(u8),
    #[error("pairing packet type {0} is unknown")]
    UnknownType(u8),
    #[error("pairing packet of type {got} where {want} was expected")]
    UnexpectedType { got: u8, want: u8 },
    #[error("pairing payload of {0} bytes (1 to {MAX_PAYLOAD} allowed)")]
    PayloadSize(u32),
    #[error("peer info data of {0} bytes does not fit in {max} bytes", max = PEER_INFO_SIZE - 2)]
    PeerInfoTooLong(usize),
    #[error("peer info of {0} bytes, not {PEER_INFO_SIZE}")]
    PeerInfoSize(usize),
    #[error("peer info does not decrypt: the codes differ (or the data was altered)")]
    Decrypt,
}

/// A packet header: version, type, big-endian payload size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    pub payload: u32,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[0] = HEADER_VERSION;
        out[1] = self.kind;
        out[2..].copy_from_slice(&self.payload.to_be_bytes());
        out
    }

    /// Checks a header as adb's ReadHeader does, and its type.
    pub fn decode(bytes: &[u8; HEADER_SIZE], want: u8) -> Result<Header, FormatError> {
        if bytes[0] != HEADER_VERSION {
            return Err(FormatError::Version(bytes[0]));
        }
        let kind = bytes[1];
        if kind != TYPE_SPAKE2_MSG && kind != TYPE_PEER_INFO {
            return Err(FormatError::UnknownType(kind));
        }
        let payload = u32::from_be_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
        if payload == 0 || payload > MAX_PAYLOAD {
            return Err(FormatError::PayloadSize(payload));
        }
        if kind != want {
            return Err(FormatError::UnexpectedType { got: kind, want });
        }
        Ok(Header { kind, payload })
    }
}

/// What a side tells the other once the code is proven: the host its public
/// key (adb_keys line), the device its GUID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub kind: u8,
    pub data: Vec<u8>,
}

impl PeerInfo {
    /// The fixed-size struct, data NUL-terminated and zero-padded.
    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        // One byte for the type, one for the terminating NUL adb's readers
        // rely on (client/adb_wifi.cpp reads the GUID as a C string).
        if self.data.len() > PEER_INFO_SIZE - 2 {
            return Err(FormatError::PeerInfoTooLong(self.data.len()));
        }
        let mut out = vec![0u8; PEER_INFO_SIZE];
        out[0] = self.kind;
        out[1..1 + self.data.len()].copy_from_slice(&self.data);
        Ok(out)
    }

    /// The type and the data up to the first NUL.
    pub fn decode(bytes: &[u8]) -> Result<PeerInfo, FormatError> {
        if bytes.len() != PEER_INFO_SIZE {
            return Err(FormatError::PeerInfoSize(bytes.len()));
        }
        let data = &bytes[1..];
        let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
        Ok(PeerInfo {
            kind: bytes[0],
            data: data[..end].to_vec(),
        })
    }
}

/// AES-128-GCM keyed from the SPAKE2 key material; nonces are a 64-bit
/// little-endian counter per direction, zero-padded to 12 bytes.
///
/// ring's AES-GCM and HKDF: TLS links them anyway (docs/benchmarks.md,
/// "Static board builds: size and idle memory").
pub struct Cipher {
    aead: LessSafeKey,
    sent: u64,
    received: u64,
}

impl Cipher {
    pub fn new(key_material: &[u8]) -> Cipher {
        // No salt: HKDF's default of HashLen zeros, which HMAC pads the
        // empty key to.
        let mut key = [0u8; 16];
        Salt::new(HKDF_SHA256, &[])
            .extract(key_material)
            .expand(&[HKDF_INFO], &AES_128_GCM)
            .and_then(|okm| okm.fill(&mut key))
            .expect("16 bytes is a valid HKDF-SHA256 length");
        Cipher {
            aead: LessSafeKey::new(
                UnboundKey::new(&AES_128_GCM, &key).expect("an AES-128 key is 16 bytes"),
            ),
            sent: 0,
            received: 0,
        }
    }

    fn nonce(counter: u64) -> Nonce {
        let mut nonce = [0u8; 12];
        nonce[..8].copy_from_slice(&counter.to_le_bytes());
        Nonce::assume_unique_for_key(nonce)
    }

    pub fn seal(&mut self, plain: &[u8]) -> Vec<u8> {
        let mut sealed = plain.to_vec();
        self.aead
            .seal_in_place_append_tag(Self::nonce(self.sent), Aad::empty(), &mut sealed)
            .expect("AES-GCM seals any message this small");
        self.sent += 1;
        sealed
    }

    pub fn open(&mut self, sealed: &[u8]) -> Result<Vec<u8>, FormatError> {
        if sealed.len() < TAG_SIZE {
            return Err(FormatError::Decrypt);
        }
        let mut plain = sealed.to_vec();
        let len = self
            .aead
            .open_in_place(Self::nonce(self.received), Aad::empty(), &mut plain)
            .map_err(|_| FormatError::Decrypt)?
            .len();
        plain.truncate(len);
        self.received += 1;
        Ok(plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_checks() {
        let h = Header {
            kind: TYPE_PEER_INFO,
            payload: 8208,
        };
        let bytes = h.encode();
        assert_eq!(bytes, [1, 1, 0, 0, 0x20, 0x10]);
        assert_eq!(Header::decode(&bytes, TYPE_PEER_INFO), Ok(h));
        assert_eq!(
            Header::decode(&bytes, TYPE_SPAKE2_MSG),
            Err(FormatError::UnexpectedType { got: 1, want: 0 })
        );
        assert_eq!(
            Header::decode(&[2, 0, 0, 0, 0, 32], TYPE_SPAKE2_MSG),
            Err(FormatError::Version(2))
        );
        assert_eq!(
            Header::decode(&[1, 7, 0, 0, 0, 32], TYPE_SPAKE2_MSG),
            Err(FormatError::UnknownType(7))
        );
        assert_eq!(
            Header::decode(&[1, 0, 0, 0, 0, 0], TYPE_SPAKE2_MSG),
            Err(FormatError::PayloadSize(0))
        );
        assert_eq!(
            Header::decode(&[1, 0, 0, 0, 0x40, 1], TYPE_SPAKE2_MSG),
            Err(FormatError::PayloadSize(16385))
        );
    }

    #[test]
    fn peer_info_layout() {
        let info = PeerInfo {
            kind: PEER_DEVICE_GUID,
            data: b"adb-host-abc123".to_vec(),
        };
        let bytes = info.encode().unwrap();
        assert_eq!(bytes.len(), 8192);
        assert_eq!(bytes[0], 1);
        assert_eq!(&bytes[1..16], b"adb-host-abc123");
        assert!(bytes[16..].iter().all(|&b| b == 0));
        assert_eq!(PeerInfo::decode(&bytes).unwrap(), info);
        let long = PeerInfo {
            kind: 0,
            data: vec![b'a'; 8191],
        };
        assert_eq!(long.encode(), Err(FormatError::PeerInfoTooLong(8191)));
        assert_eq!(
            PeerInfo::decode(&bytes[..100]),
            Err(FormatError::PeerInfoSize(100))
        );
    }

    /// The first nonce is all zeroes and the key is HKDF's: checked against
    /// RustCrypto-independent values computed with Python's `cryptography`
    /// (HKDF(SHA256, 16, salt=None, info) then AESGCM.encrypt(zero nonce)).
    #[test]
    fn cipher_matches_reference() {
        let mut c = Cipher::new(&[7u8; 64]);
        let sealed = c.seal(b"peer");
        assert_eq!(hex::encode(&sealed), CIPHER_REFERENCE);
        let mut d = Cipher::new(&[7u8; 64]);
        assert_eq!(d.open(&sealed).unwrap(), b"peer");
        // The second message uses nonce 1: replaying the first fails.
        assert_eq!(d.open(&sealed), Err(FormatError::Decrypt));
        let mut wrong = Cipher::new(&[8u8; 64]);
        assert_eq!(wrong.open(&sealed), Err(FormatError::Decrypt));
    }

    const CIPHER_REFERENCE: &str = "b1303f03e6af19cc21ff9138ff3ada6eca008c47";
}
