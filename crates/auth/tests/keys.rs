//! Keys we generate: PEM round trip, signatures, the Android public key
//! struct and its text forms. One key is generated for the whole file (RSA
//! generation is slow in debug builds).

mod common;

use std::sync::OnceLock;

use oxadb_auth::{KeyError, PrivateKey, PublicKey, ANDROID_PUBKEY_ENCODED_SIZE};

fn our_key() -> &'static PrivateKey {
    static KEY: OnceLock<PrivateKey> = OnceLock::new();
    KEY.get_or_init(|| PrivateKey::generate().expect("generate an RSA-2048 key"))
}

#[test]
fn generated_key_is_rsa_2048_with_f4() {
    let public = our_key().public_key();
    assert_eq!(public.exponent(), 65537);
    let raw = public.to_android_bytes();
    assert_eq!(raw.len(), ANDROID_PUBKEY_ENCODED_SIZE);
    assert_eq!(ANDROID_PUBKEY_ENCODED_SIZE, 524);
    assert_eq!(&raw[..4], &64u32.to_le_bytes());
    assert_eq!(&raw[520..], &65537u32.to_le_bytes());
    // The modulus's top byte is the last byte of its little-endian field.
    assert!(raw[8 + 255] & 0x80 != 0, "2048-bit modulus");
    assert!(raw[8] & 1 == 1, "odd modulus");
}

#[test]
fn pem_round_trip() {
    let key = our_key();
    let pem = key.to_pem();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{pem}");
    assert!(pem.ends_with("-----END PRIVATE KEY-----\n"), "{pem}");
    let again = PrivateKey::from_pem(&pem).unwrap();
    assert_eq!(again.public_key(), key.public_key());
    assert_eq!(again.to_pem(), pem);
    // A signature of the re-read key verifies with the original public key.
    let signature = again.sign_token(&common::TOKEN).unwrap();
    assert!(key.public_key().verify_token(&common::TOKEN, &signature));

    // Text around the PEM block and CRLF line ends are tolerated.
    let decorated = format!("comment line\r\n{}trailing\n", pem.replace('\n', "\r\n"));
    assert_eq!(
        PrivateKey::from_pem(&decorated).unwrap().public_key(),
        key.public_key()
    );
}

#[test]
fn sign_and_verify() {
    let key = our_key();
    let public = key.public_key();
    let signature = key.sign_token(&common::TOKEN).unwrap();
    assert_eq!(signature.len(), 256);
    assert!(public.verify_token(&common::TOKEN, &signature));
    // PKCS#1 v1.5 is deterministic.
    assert_eq!(key.sign_token(&common::TOKEN).unwrap(), signature);

    let mut other_token = common::TOKEN;
    other_token[19] ^= 1;
    assert!(!public.verify_token(&other_token, &signature));

    for index in [0, 100, 255] {
        let mut flipped = signature.clone();
        flipped[index] ^= 0x01;
        assert!(
            !public.verify_token(&common::TOKEN, &flipped),
            "byte {index}"
        );
    }
    assert!(!public.verify_token(&common::TOKEN, &signature[..255]));
    assert!(!public.verify_token(&common::TOKEN[..19], &signature));
}

#[test]
fn token_of_wrong_length_is_an_error() {
    for len in [0usize, 19, 21, 32] {
        let token = vec![7u8; len];
        match our_key().sign_token(&token) {
            Err(KeyError::TokenLength { len: got, .. }) => assert_eq!(got, len),
            other => panic!("{len}-byte token: {other:?}"),
        }
    }
    let message = our_key().sign_token(&[0; 19]).unwrap_err().to_string();
    assert!(message.contains("19 bytes"), "{message}");
}

#[test]
fn android_bytes_round_trip_and_validation() {
    let public = our_key().public_key();
    let raw = public.to_android_bytes();
    assert_eq!(PublicKey::from_android_bytes(&raw).unwrap(), public);

    let tamper = |offset: usize| {
        let mut bad = raw.clone();
        bad[offset] ^= 0x02;
        PublicKey::from_android_bytes(&bad).unwrap_err().to_string()
    };
    assert!(tamper(0).contains("words"), "length word");
    assert!(tamper(4).contains("n0inv"), "n0inv");
    // A changed modulus no longer matches n0inv (low word) or rr (high word).
    assert!(tamper(8).contains("n0inv"), "modulus low word");
    assert!(tamper(8 + 200).contains("rr"), "modulus high word");
    assert!(tamper(8 + 256 + 17).contains("rr"), "rr");
    assert!(tamper(520).contains("exponent"), "exponent");
    let mut even = raw.clone();
    even[8] ^= 0x01;
    let message = PublicKey::from_android_bytes(&even)
        .unwrap_err()
        .to_string();
    assert!(message.contains("even"), "{message}");
    assert!(PublicKey::from_android_bytes(&raw[..523]).is_err());
    let mut long = raw.clone();
    long.push(0);
    assert!(PublicKey::from_android_bytes(&long).is_err());
}

#[test]
fn adbkey_pub_text() {
    let public = our_key().public_key();
    let line = public.to_adbkey_pub("me@box");
    let (encoded, comment) = line.split_once(' ').unwrap();
    assert_eq!(comment, "me@box");
    assert_eq!(encoded.len(), 700, "524 bytes in padded base64");
    assert!(encoded.ends_with('='));
    assert_eq!(encoded, public.to_base64());
    assert_eq!(PublicKey::from_base64(encoded).unwrap(), public);

    for variant in [
        line.clone(),
        format!("{line}\n"),
        format!("{line}\0"),
        format!("{line}\r\n"),
        format!("  {line}  \n"),
        format!("{encoded}\tme@box"),
        format!("{}  me@box\0", encoded.trim_end_matches('=')),
    ] {
        let (key, comment) = PublicKey::parse_adbkey_pub(&variant)
            .unwrap_or_else(|error| panic!("{variant:?}: {error}"));
        assert_eq!(key, public, "{variant:?}");
        assert_eq!(comment, "me@box", "{variant:?}");
    }
    let (key, comment) = PublicKey::parse_adbkey_pub(encoded).unwrap();
    assert_eq!((key, comment.as_str()), (public.clone(), ""));

    let error = PublicKey::parse_adbkey_pub(&line[1..]).unwrap_err();
    assert!(matches!(error, KeyError::PublicKey { .. }), "{error:?}");
}

#[test]
fn private_key_debug_hides_secrets() {
    let text = format!("{:?}", our_key());
    assert!(text.contains("PrivateKey"), "{text}");
    assert!(!text.contains("primes") && !text.contains(" d:"), "{text}");
}

#[test]
fn bad_pem_is_rejected_with_reason() {
    let cases = [
        ("", "not a PEM"),
        ("hello", "not a PEM"),
        (
            "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
            "PUBLIC KEY",
        ),
        (
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
            "encrypted",
        ),
        (
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            "PKCS#8",
        ),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n",
            "PKCS#1",
        ),
        ("-----BEGIN PRIVATE KEY-----\nAAAA\n", "END"),
    ];
    for (text, expected) in cases {
        let error = PrivateKey::from_pem(text).unwrap_err();
        assert!(matches!(error, KeyError::PrivateKey { .. }), "{error:?}");
        let message = error.to_string();
        assert!(message.contains(expected), "{text:?}: {message}");
        assert!(message.starts_with("PEM text: "), "{message}");
    }
}
