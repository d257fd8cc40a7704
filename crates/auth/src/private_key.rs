//! The host's RSA private key (`adbkey`).

use std::fmt;

use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs1v15::Pkcs1v15Sign;
use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey, LineEnding};
use rsa::rand_core::OsRng;
use rsa::RsaPrivateKey;
use sha1::Sha1;

use crate::public_key::{MODULUS_BITS, TOKEN_SIZE};
use crate::{KeyError, PublicKey};

/// An adb RSA-2048 private key.
#[derive(Clone)]
pub struct PrivateKey {
    key: RsaPrivateKey,
    public: PublicKey,
    /// Where the key came from, for error messages.
    origin: String,
}

impl fmt::Debug for PrivateKey {
    // Never prints the private parts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateKey")
            .field("origin", &self.origin)
            .field("public", &self.public.to_base64())
            .finish()
    }
}

fn pem_error(origin: &str, reason: impl Into<String>) -> KeyError {
    KeyError::PrivateKey {
        origin: origin.to_string(),
        reason: reason.into(),
    }
}

/// The first PEM block of `text` (from its BEGIN line through its END line)
/// and its label. Like OpenSSL's reader, text around the block is ignored.
fn pem_block<'t>(text: &'t str, origin: &str) -> Result<(&'t str, &'t str), KeyError> {
    const BEGIN: &str = "-----BEGIN ";
    let start = text
        .find(BEGIN)
        .ok_or_else(|| pem_error(origin, "no \"-----BEGIN\" line: not a PEM file"))?;
    let rest = &text[start + BEGIN.len()..];
    let label_end = rest
        .find("-----")
        .ok_or_else(|| pem_error(origin, "unterminated PEM BEGIN line"))?;
    let label = &rest[..label_end];
    let end_line = format!("-----END {label}-----");
    let end = text[start..]
        .find(&end_line)
        .ok_or_else(|| pem_error(origin, format!("no \"{end_line}\" line")))?;
    let block = &text[start..start + end + end_line.len()];
    Ok((block, label))
}

impl PrivateKey {
    fn from_rsa(key: RsaPrivateKey, origin: &str) -> Result<PrivateKey, KeyError> {
        key.validate()
            .map_err(|error| pem_error(origin, format!("inconsistent RSA key: {error}")))?;
        let public =
            PublicKey::from_rsa(key.to_public_key(), origin).map_err(|error| match error {
                KeyError::PublicKey { origin, reason } => KeyError::PrivateKey { origin, reason },
                other => other,
            })?;
        Ok(PrivateKey {
            key,
            public,
            origin: origin.to_string(),
        })
    }

    /// A new RSA-2048 key with exponent 65537, from the OS's random source.
    pub fn generate() -> Result<PrivateKey, KeyError> {
        let origin = "new key";
        let key =
            RsaPrivateKey::new(&mut OsRng, MODULUS_BITS).map_err(|error| KeyError::Generate {
                origin: origin.to_string(),
                reason: error.to_string(),
            })?;
        Self::from_rsa(key, origin)
    }

    /// Parses a PEM private key: PKCS#8 (`BEGIN PRIVATE KEY`, what adb
    /// writes) or PKCS#1 (`BEGIN RSA PRIVATE KEY`). Must be unencrypted
    /// RSA-2048 with exponent 65537 (or 3).
    pub fn from_pem(text: &str) -> Result<PrivateKey, KeyError> {
        Self::from_pem_at(text, "PEM text")
    }

    /// [`PrivateKey::from_pem`], naming `origin` (e.g. the file's path) in
    /// errors and in later signing errors.
    pub fn from_pem_at(text: &str, origin: &str) -> Result<PrivateKey, KeyError> {
        let (block, label) = pem_block(text, origin)?;
        let key = match label {
            "PRIVATE KEY" => RsaPrivateKey::from_pkcs8_pem(block)
                .map_err(|error| pem_error(origin, format!("PKCS#8: {error}")))?,
            "RSA PRIVATE KEY" => RsaPrivateKey::from_pkcs1_pem(block)
                .map_err(|error| pem_error(origin, format!("PKCS#1: {error}")))?,
            "ENCRYPTED PRIVATE KEY" => {
                return Err(pem_error(
                    origin,
                    "the key is encrypted; adb keys have no passphrase",
                ))
            }
            other => {
                return Err(pem_error(
                    origin,
                    format!("PEM block is \"{other}\", not \"PRIVATE KEY\" or \"RSA PRIVATE KEY\""),
                ))
            }
        };
        Self::from_rsa(key, origin)
    }

    /// The key as PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`, LF line ends),
    /// the form adb writes to `adbkey`.
    pub fn to_pem(&self) -> String {
        self.key
            .to_pkcs8_pem(LineEnding::LF)
            .expect("PKCS#8 encoding of a valid RSA key")
            .to_string()
    }

    /// Signs an AUTH token as adb does: PKCS#1 v1.5 with the SHA-1
    /// DigestInfo, the 20-byte token standing in for the digest.
    pub fn sign_token(&self, token: &[u8]) -> Result<Vec<u8>, KeyError> {
        if token.len() != TOKEN_SIZE {
            return Err(KeyError::TokenLength {
                origin: self.origin.clone(),
                len: token.len(),
            });
        }
        // With an RNG the private-key operation is blinded; the signature is
        // the same (PKCS#1 v1.5 is deterministic).
        self.key
            .sign_with_rng(&mut OsRng, Pkcs1v15Sign::new::<Sha1>(), token)
            .map_err(|error| KeyError::Sign {
                origin: self.origin.clone(),
                reason: error.to_string(),
            })
    }

    /// The key as PKCS#8 DER, for TLS: adb's client certificate carries
    /// this key (AOSP crypto/x509_generator.cpp).
    pub fn to_pkcs8_der(&self) -> Vec<u8> {
        self.key
            .to_pkcs8_der()
            .expect("DER encoding of an RSA private key")
            .as_bytes()
            .to_vec()
    }

    /// The matching public key.
    pub fn public_key(&self) -> PublicKey {
        self.public.clone()
    }

    /// Where the key came from: its file's path, "PEM text" or "new key".
    pub fn origin(&self) -> &str {
        &self.origin
    }

    pub(crate) fn set_origin(&mut self, origin: String) {
        self.origin = origin;
    }
}
