//! Android's binary RSA public key struct and the `adbkey.pub` text form.
//!
//! The struct (libcrypto_utils' `android_pubkey` layout), every field
//! little-endian:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | modulus size in 32-bit words (64) |
//! | 4 | 4 | n0inv = -1 / n mod 2^32 (Montgomery constant) |
//! | 8 | 256 | modulus n, little-endian |
//! | 264 | 256 | rr = (2^2048)^2 mod n, little-endian |
//! | 520 | 4 | public exponent |

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use rsa::pkcs1v15::Pkcs1v15Sign;
use rsa::pkcs8::{DecodePublicKey, EncodePublicKey, LineEnding};
use rsa::traits::PublicKeyParts;
use rsa::{BigUint, RsaPublicKey};
use sha1::Sha1;

use crate::KeyError;

/// Modulus size of adb keys.
pub const MODULUS_BITS: usize = 2048;
const MODULUS_BYTES: usize = MODULUS_BITS / 8;
const MODULUS_WORDS: u32 = (MODULUS_BYTES / 4) as u32;
/// Size of the binary Android public key struct for RSA-2048.
pub const ANDROID_PUBKEY_ENCODED_SIZE: usize = 4 + 4 + MODULUS_BYTES + MODULUS_BYTES + 4;
/// Size of an AUTH token: it is signed as if it were a SHA-1 digest.
pub const TOKEN_SIZE: usize = 20;

/// Exponents the Android format supports (the struct documents 3 or 65537).
const EXPONENTS: [u32; 2] = [65537, 3];

/// Base64 as adb writes it (standard alphabet, padded); reading also accepts
/// a missing final padding.
const BASE64_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// An adb RSA-2048 public key.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PublicKey {
    key: RsaPublicKey,
}

fn format_error(origin: &str, reason: impl Into<String>) -> KeyError {
    KeyError::PublicKey {
        origin: origin.to_string(),
        reason: reason.into(),
    }
}

/// -1 / n0 mod 2^32 for odd n0, by Newton's iteration: each step doubles the
/// number of correct low bits, starting from 3 (n0 * n0 = 1 mod 8).
fn montgomery_n0inv(n0: u32) -> u32 {
    debug_assert!(n0 & 1 == 1);
    let mut inverse = n0;
    for _ in 0..4 {
        inverse = inverse.wrapping_mul(2u32.wrapping_sub(n0.wrapping_mul(inverse)));
    }
    inverse.wrapping_neg()
}

/// R^2 mod n with R = 2^2048.
fn montgomery_rr(n: &BigUint) -> BigUint {
    (BigUint::from(1u32) << (2 * MODULUS_BITS)) % n
}

/// `value` as exactly 256 little-endian bytes (value < 2^2048).
fn le_bytes_padded(value: &BigUint) -> Vec<u8> {
    let mut bytes = value.to_bytes_le();
    debug_assert!(bytes.len() <= MODULUS_BYTES);
    bytes.resize(MODULUS_BYTES, 0);
    bytes
}

fn read_u32(raw: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(raw[offset..offset + 4].try_into().expect("4 bytes"))
}

impl PublicKey {
    /// Checks that `key` can be expressed in the Android format: a 2048-bit
    /// modulus and exponent 65537 (or 3).
    pub(crate) fn from_rsa(key: RsaPublicKey, origin: &str) -> Result<PublicKey, KeyError> {
        let bits = key.n().bits();
        if bits != MODULUS_BITS {
            return Err(format_error(
                origin,
                format!("modulus is {bits} bits; adb keys are RSA-{MODULUS_BITS}"),
            ));
        }
        let exponent_ok = EXPONENTS.iter().any(|e| *key.e() == BigUint::from(*e));
        if !exponent_ok {
            return Err(format_error(
                origin,
                format!("public exponent {} is not 65537 (or 3)", key.e()),
            ));
        }
        Ok(PublicKey { key })
    }

    /// The public exponent (65537 for keys adb makes).
    pub fn exponent(&self) -> u32 {
        let mut bytes = self.key.e().to_bytes_le();
        debug_assert!(bytes.len() <= 4, "exponent checked at construction");
        bytes.resize(4, 0);
        u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"))
    }

    /// The 524-byte Android public key struct.
    pub fn to_android_bytes(&self) -> Vec<u8> {
        let n = self.key.n();
        let modulus = le_bytes_padded(n);
        let n0 = u32::from_le_bytes(modulus[..4].try_into().expect("4 bytes"));
        let mut out = Vec::with_capacity(ANDROID_PUBKEY_ENCODED_SIZE);
        out.extend_from_slice(&MODULUS_WORDS.to_le_bytes());
        out.extend_from_slice(&montgomery_n0inv(n0).to_le_bytes());
        out.extend_from_slice(&modulus);
        out.extend_from_slice(&le_bytes_padded(&montgomery_rr(n)));
        out.extend_from_slice(&self.exponent().to_le_bytes());
        debug_assert_eq!(out.len(), ANDROID_PUBKEY_ENCODED_SIZE);
        out
    }

    /// Parses the 524-byte Android public key struct, checking the modulus
    /// size word, the exponent, and that n0inv and rr agree with the modulus.
    pub fn from_android_bytes(raw: &[u8]) -> Result<PublicKey, KeyError> {
        Self::from_android_bytes_at(raw, "Android public key")
    }

    fn from_android_bytes_at(raw: &[u8], origin: &str) -> Result<PublicKey, KeyError> {
        if raw.len() != ANDROID_PUBKEY_ENCODED_SIZE {
            return Err(format_error(
                origin,
                format!(
                    "{} bytes; an RSA-{MODULUS_BITS} key struct is {ANDROID_PUBKEY_ENCODED_SIZE}",
                    raw.len()
                ),
            ));
        }
        let words = read_u32(raw, 0);
        if words != MODULUS_WORDS {
            return Err(format_error(
                origin,
                format!("modulus size is {words} words; adb keys have {MODULUS_WORDS}"),
            ));
        }
        let n0inv = read_u32(raw, 4);
        let modulus = &raw[8..8 + MODULUS_BYTES];
        let rr = &raw[8 + MODULUS_BYTES..8 + 2 * MODULUS_BYTES];
        let exponent = read_u32(raw, 8 + 2 * MODULUS_BYTES);

        if !EXPONENTS.contains(&exponent) {
            return Err(format_error(
                origin,
                format!("public exponent {exponent} is not 65537 (or 3)"),
            ));
        }
        let n = BigUint::from_bytes_le(modulus);
        if n.bits() != MODULUS_BITS {
            return Err(format_error(
                origin,
                format!("modulus is {} bits, not {MODULUS_BITS}", n.bits()),
            ));
        }
        let n0 = read_u32(modulus, 0);
        if n0 & 1 == 0 {
            return Err(format_error(origin, "modulus is even"));
        }
        let expected_n0inv = montgomery_n0inv(n0);
        if n0inv != expected_n0inv {
            return Err(format_error(
                origin,
                format!("n0inv is {n0inv:#010x}, the modulus gives {expected_n0inv:#010x}"),
            ));
        }
        if rr != le_bytes_padded(&montgomery_rr(&n)).as_slice() {
            return Err(format_error(origin, "rr is not (2^2048)^2 mod the modulus"));
        }
        let key = RsaPublicKey::new(n, BigUint::from(exponent))
            .map_err(|error| format_error(origin, error.to_string()))?;
        Self::from_rsa(key, origin)
    }

    /// Base64 (standard alphabet, padded) of the Android struct: the first
    /// field of an `adbkey.pub` line.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.to_android_bytes())
    }

    /// Parses the base64 field of an `adbkey.pub` line.
    pub fn from_base64(text: &str) -> Result<PublicKey, KeyError> {
        Self::from_base64_at(text, "Android public key (base64)")
    }

    fn from_base64_at(text: &str, origin: &str) -> Result<PublicKey, KeyError> {
        let raw = BASE64_LENIENT
            .decode(text.trim())
            .map_err(|error| format_error(origin, format!("bad base64: {error}")))?;
        Self::from_android_bytes_at(&raw, origin)
    }

    /// The `adbkey.pub` text: `<base64> <comment>`, with no line end (adb
    /// writes the file without a trailing newline).
    pub fn to_adbkey_pub(&self, comment: &str) -> String {
        format!("{} {comment}", self.to_base64())
    }

    /// Parses an `adbkey.pub` line (or an RSAPUBLICKEY payload, or an
    /// `adb_keys` line): `<base64>` then optionally a space or tab and a
    /// comment. Surrounding whitespace and trailing NULs are ignored. Returns
    /// the key and the comment (empty when there is none).
    pub fn parse_adbkey_pub(line: &str) -> Result<(PublicKey, String), KeyError> {
        Self::parse_adbkey_pub_at(line, "adbkey.pub line")
    }

    /// Like [`PublicKey::parse_adbkey_pub`], naming `origin` (a file, say)
    /// in errors.
    pub fn parse_adbkey_pub_at(line: &str, origin: &str) -> Result<(PublicKey, String), KeyError> {
        let line = line.trim_matches(|c: char| c == '\0' || c.is_whitespace());
        if line.is_empty() {
            return Err(format_error(origin, "empty line"));
        }
        let (encoded, comment) = match line.find([' ', '\t']) {
            Some(at) => (&line[..at], line[at + 1..].trim()),
            None => (line, ""),
        };
        let key = Self::from_base64_at(encoded, origin)?;
        Ok((key, comment.to_string()))
    }

    /// Whether `signature` is this key's PKCS#1 v1.5 signature of the 20-byte
    /// `token` taken as a SHA-1 digest (what adbd checks).
    pub fn verify_token(&self, token: &[u8], signature: &[u8]) -> bool {
        token.len() == TOKEN_SIZE
            && self
                .key
                .verify(Pkcs1v15Sign::new::<Sha1>(), token, signature)
                .is_ok()
    }

    /// The key as a DER SubjectPublicKeyInfo (what adb's TLS CA hints hash).
    pub fn to_spki_der(&self) -> Vec<u8> {
        self.key
            .to_public_key_der()
            .expect("DER encoding of an RSA public key")
            .into_vec()
    }

    /// A key from a DER SubjectPublicKeyInfo (a TLS certificate's key).
    pub fn from_spki_der(der: &[u8]) -> Result<PublicKey, KeyError> {
        let origin = "certificate";
        let key = RsaPublicKey::from_public_key_der(der)
            .map_err(|error| format_error(origin, format!("not an RSA public key: {error}")))?;
        PublicKey::from_rsa(key, origin)
    }

    /// The key as a PEM SubjectPublicKeyInfo (`-----BEGIN PUBLIC KEY-----`),
    /// for other tools such as `openssl`.
    pub fn to_spki_pem(&self) -> String {
        self.key
            .to_public_key_pem(LineEnding::LF)
            .expect("DER encoding of an RSA public key")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n0inv_is_minus_inverse() {
        for n0 in [1u32, 3, 0xffff_ffff, 0x1234_5677, 0x8000_0001, 65537] {
            let inv = montgomery_n0inv(n0);
            assert_eq!(n0.wrapping_mul(inv), u32::MAX, "n0 = {n0:#x}");
        }
    }

    #[test]
    fn rejects_wrong_sizes() {
        let error = PublicKey::from_android_bytes(&[0u8; 523]).unwrap_err();
        assert!(error.to_string().contains("523 bytes"), "{error}");
        let mut raw = vec![0u8; ANDROID_PUBKEY_ENCODED_SIZE];
        raw[0] = 32;
        let error = PublicKey::from_android_bytes(&raw).unwrap_err();
        assert!(error.to_string().contains("32 words"), "{error}");
    }

    #[test]
    fn parse_rejects_garbage() {
        assert!(PublicKey::parse_adbkey_pub("").is_err());
        assert!(PublicKey::parse_adbkey_pub("not-base64!! user@host").is_err());
        assert!(PublicKey::parse_adbkey_pub("QUFBQQ== user@host").is_err());
    }
}
