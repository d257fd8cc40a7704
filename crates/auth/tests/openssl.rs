//! Our signatures and key files checked by an independent implementation:
//! the `openssl` command (required; the test fails without it).

mod common;

use std::path::Path;
use std::process::Command;

use oxadb_auth::PrivateKey;

/// DER DigestInfo prefix for SHA-1 (RFC 8017 section 9.2, note 1).
const SHA1_DIGEST_INFO: [u8; 15] = [
    0x30, 0x21, 0x30, 0x09, 0x06, 0x05, 0x2b, 0x0e, 0x03, 0x02, 0x1a, 0x05, 0x00, 0x04, 0x14,
];

fn openssl(dir: &Path, args: &[&str]) -> std::process::Output {
    common::run(Command::new(common::openssl()).current_dir(dir).args(args))
}

#[test]
fn openssl_agrees_with_our_signatures_by_a_key_we_generated() {
    let dir = tempfile::tempdir().unwrap();
    let key = PrivateKey::generate().unwrap();
    std::fs::write(dir.path().join("adbkey"), key.to_pem()).unwrap();
    check_signatures_with_openssl(dir.path(), &key);
}

#[test]
fn openssl_agrees_with_our_signatures_by_adbs_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = common::adb_keygen(&dir.path().join("adbkey"));
    check_signatures_with_openssl(dir.path(), &key);
}

/// `d/adbkey` holds `key`.
fn check_signatures_with_openssl(d: &Path, key: &PrivateKey) {
    std::fs::write(d.join("pub.pem"), key.public_key().to_spki_pem()).unwrap();
    std::fs::write(d.join("token"), common::TOKEN).unwrap();
    let mut wrong = common::TOKEN;
    wrong[0] ^= 0x80;
    std::fs::write(d.join("wrong"), wrong).unwrap();

    let ours = key.sign_token(&common::TOKEN).unwrap();
    std::fs::write(d.join("ours.sig"), &ours).unwrap();

    // openssl verifies our signature of the token as a SHA-1 digest...
    let verify = |input: &str| {
        Command::new(common::openssl())
            .current_dir(d)
            .args(["pkeyutl", "-verify", "-pubin", "-inkey", "pub.pem"])
            .args([
                "-pkeyopt",
                "digest:sha1",
                "-sigfile",
                "ours.sig",
                "-in",
                input,
            ])
            .output()
            .unwrap()
    };
    let good = verify("token");
    assert!(
        good.status.success(),
        "openssl rejects our signature: {}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(
        !verify("wrong").status.success(),
        "openssl accepts a wrong token"
    );

    // ...the signed block is exactly SHA-1's DigestInfo with the token...
    let recovered = openssl(
        d,
        &[
            "pkeyutl",
            "-verifyrecover",
            "-pubin",
            "-inkey",
            "pub.pem",
            "-in",
            "ours.sig",
        ],
    )
    .stdout;
    let mut expected = SHA1_DIGEST_INFO.to_vec();
    expected.extend_from_slice(&common::TOKEN);
    assert_eq!(recovered, expected);

    // ...and openssl's own signature is the same bytes, which we verify.
    let theirs = openssl(
        d,
        &[
            "pkeyutl",
            "-sign",
            "-inkey",
            "adbkey",
            "-pkeyopt",
            "digest:sha1",
            "-in",
            "token",
        ],
    )
    .stdout;
    assert_eq!(theirs, ours);
    assert!(key.public_key().verify_token(&common::TOKEN, &theirs));
    assert!(!key.public_key().verify_token(&wrong, &theirs));
}

#[test]
fn openssl_reads_our_pem_and_we_read_pkcs1() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = common::adb_keygen(&d.join("adbkey"));

    // Our PKCS#8 output is a valid RSA key for openssl.
    std::fs::write(d.join("ours.pem"), key.to_pem()).unwrap();
    let check = openssl(d, &["rsa", "-in", "ours.pem", "-check", "-noout"]);
    assert!(String::from_utf8_lossy(&check.stdout).contains("RSA key ok"));

    // The traditional PKCS#1 form (BEGIN RSA PRIVATE KEY) of the same key.
    openssl(
        d,
        &["rsa", "-in", "adbkey", "-traditional", "-out", "pkcs1.pem"],
    );
    let pkcs1 = std::fs::read_to_string(d.join("pkcs1.pem")).unwrap();
    assert!(
        pkcs1.starts_with("-----BEGIN RSA PRIVATE KEY-----"),
        "{pkcs1}"
    );
    let from_pkcs1 = PrivateKey::from_pem(&pkcs1).unwrap();
    assert_eq!(from_pkcs1.public_key(), key.public_key());
    // Written back as PKCS#8, as adb would.
    assert_eq!(from_pkcs1.to_pem(), key.to_pem());
    let signature = from_pkcs1.sign_token(&common::TOKEN).unwrap();
    assert!(key.public_key().verify_token(&common::TOKEN, &signature));
}

#[test]
fn other_key_sizes_and_exponents_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, args) in [
        ("rsa1024", &["-pkeyopt", "rsa_keygen_bits:1024"][..]),
        (
            "rsa2048e3",
            &[
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-pkeyopt",
                "rsa_keygen_pubexp:17",
            ][..],
        ),
    ] {
        let mut full = vec!["genpkey", "-algorithm", "RSA", "-out", name];
        full.extend_from_slice(args);
        openssl(d, &full);
        let pem = std::fs::read_to_string(d.join(name)).unwrap();
        let message = PrivateKey::from_pem(&pem).unwrap_err().to_string();
        let expected = if name == "rsa1024" {
            "1024 bits"
        } else {
            "exponent 17"
        };
        assert!(message.contains(expected), "{name}: {message}");
    }
}
