//! HostKeys: generating and reusing `adbkey`, vendor keys, errors; and
//! AuthorizedKeys parsing and verification.

mod common;

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use oxadb_auth::{default_comment, AuthorizedKeys, HostKeys, KeyError, PrivateKey, PublicKey};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn vendor_list(paths: &[&Path]) -> OsString {
    std::env::join_paths(paths).unwrap()
}

#[test]
fn generates_adbkey_once_and_reuses_it() {
    let home = tempfile::tempdir().unwrap();
    let android_dir = home.path().join(".android");

    // Two loaders race on a missing key: both end up with the same one.
    let loaders: Vec<_> = (0..2)
        .map(|_| {
            let dir = android_dir.clone();
            std::thread::spawn(move || HostKeys::load(&dir, None).unwrap())
        })
        .collect();
    let loaded: Vec<HostKeys> = loaders.into_iter().map(|t| t.join().unwrap()).collect();
    let public = loaded[0].keys()[0].public_key();
    assert_eq!(loaded[1].keys()[0].public_key(), public);
    assert_eq!(loaded[0].keys().len(), 1);

    let private_path = android_dir.join("adbkey");
    let public_path = android_dir.join("adbkey.pub");
    assert_eq!(mode(&android_dir), 0o700);
    assert_eq!(mode(&private_path), 0o600);
    assert_eq!(loaded[0].public_key_path(), public_path);
    assert_eq!(
        loaded[0].keys()[0].origin(),
        private_path.display().to_string()
    );
    let leftovers: Vec<_> = std::fs::read_dir(&android_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name != "adbkey" && name != "adbkey.pub")
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    let pem = std::fs::read_to_string(&private_path).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
    assert_eq!(PrivateKey::from_pem(&pem).unwrap().public_key(), public);

    let pub_text = std::fs::read_to_string(&public_path).unwrap();
    assert_eq!(pub_text, public.to_adbkey_pub(&default_comment()));
    assert!(!pub_text.ends_with('\n'));

    let payload = loaded[0].public_key_payload();
    assert_eq!(payload, format!("{pub_text}\0").into_bytes());

    // A later load reuses the key and leaves the files alone.
    std::fs::write(&public_path, "left alone").unwrap();
    let again = HostKeys::load(&android_dir, None).unwrap();
    assert_eq!(again.keys()[0].public_key(), public);
    assert_eq!(std::fs::read_to_string(&private_path).unwrap(), pem);
    assert_eq!(std::fs::read_to_string(&public_path).unwrap(), "left alone");
    // The payload is computed from adbkey, not read from adbkey.pub.
    assert_eq!(again.public_key_payload(), payload);
}

#[test]
fn uses_an_existing_adb_key_and_appends_vendor_keys_in_order() {
    let root = tempfile::tempdir().unwrap();
    let android_dir = root.path().join(".android");
    std::fs::create_dir(&android_dir).unwrap();
    let adbkey = common::adb_keygen(&android_dir.join("adbkey")).public_key();
    let pub_before = std::fs::read_to_string(android_dir.join("adbkey.pub")).unwrap();

    let single = common::adb_keygen(&root.path().join("single.key")).public_key();
    let dir = root.path().join("vendor");
    std::fs::create_dir(&dir).unwrap();
    let b = common::adb_keygen(&dir.join("b.adb_key")).public_key();
    let a = common::adb_keygen(&dir.join("a.adb_key")).public_key();
    // Not keys for adb: wrong suffix (a valid key all the same), a directory.
    common::adb_keygen(&dir.join("ignored.pem"));
    std::fs::create_dir(dir.join("sub.adb_key")).unwrap();
    // A corrupt key and a missing path are skipped (logged), as adb does.
    std::fs::write(dir.join("corrupt.adb_key"), "garbage").unwrap();
    let missing = root.path().join("missing");

    let list = vendor_list(&[
        &dir,
        Path::new(""),
        &missing,
        &root.path().join("single.key"),
        // Already loaded through another path: not offered twice.
        &android_dir.join("adbkey"),
        &dir.join("a.adb_key"),
    ]);
    let keys = HostKeys::load(&android_dir, Some(&list)).unwrap();
    let publics: Vec<PublicKey> = keys.keys().iter().map(|k| k.public_key()).collect();
    assert_eq!(publics, vec![adbkey.clone(), a, b, single]);
    let origins: Vec<PathBuf> = keys
        .keys()
        .iter()
        .map(|k| PathBuf::from(k.origin()))
        .collect();
    assert_eq!(
        origins,
        vec![
            android_dir.join("adbkey"),
            dir.join("a.adb_key"),
            dir.join("b.adb_key"),
            root.path().join("single.key"),
        ]
    );

    // adb's adbkey.pub is untouched; the payload is adbkey's.
    assert_eq!(
        std::fs::read_to_string(android_dir.join("adbkey.pub")).unwrap(),
        pub_before
    );
    let payload = keys.public_key_payload();
    let (key, comment) =
        PublicKey::parse_adbkey_pub(std::str::from_utf8(&payload).unwrap()).unwrap();
    assert_eq!(key, adbkey);
    assert_eq!(comment, default_comment());

    // Without ADB_VENDOR_KEYS only adbkey is offered.
    assert_eq!(HostKeys::load(&android_dir, None).unwrap().keys().len(), 1);
}

#[test]
fn corrupt_adbkey_is_an_error_naming_its_path() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("adbkey");
    for contents in [
        "not a key",
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    ] {
        std::fs::write(&path, contents).unwrap();
        let error = HostKeys::load(root.path(), None).expect_err("an error");
        assert!(matches!(error, KeyError::PrivateKey { .. }), "{error:?}");
        let message = error.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        // The corrupt key is not replaced.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), contents);
    }

    // Unreadable: adbkey is a directory.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let error = HostKeys::load(root.path(), None).expect_err("an error");
    assert!(matches!(error, KeyError::Io { .. }), "{error:?}");
    assert!(
        error.to_string().contains(&path.display().to_string()),
        "{error}"
    );
}

#[test]
fn unwritable_android_dir_is_an_error_naming_it() {
    let root = tempfile::tempdir().unwrap();
    // A file where the directory should be.
    let android_dir = root.path().join("file");
    std::fs::write(&android_dir, "").unwrap();
    let error = HostKeys::load(&android_dir.join(".android"), None).expect_err("an error");
    assert!(matches!(error, KeyError::Io { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains(&android_dir.display().to_string()),
        "{error}"
    );
}

#[test]
fn authorized_keys_parse_and_verify() {
    let root = tempfile::tempdir().unwrap();
    let first = common::adb_keygen(&root.path().join("first"));
    let second = common::adb_keygen(&root.path().join("second"));
    let stranger = common::adb_keygen(&root.path().join("stranger"));
    let line = |key: &PrivateKey, comment: &str| key.public_key().to_adbkey_pub(comment);

    let text = format!(
        "# adb_keys\n\
         \n\
         {}\n\
         this is not a key\n\
         {}\r\n\
         \t  \n\
         {}\0\n\
         {}\n\
         {}",
        line(&first, "alice@one"),
        &line(&stranger, "broken@line")[10..],
        line(&second, "bob@two"),
        first.public_key().to_base64(),
        std::fs::read_to_string(root.path().join("second.pub")).unwrap(),
    );
    let authorized = AuthorizedKeys::parse(&text);
    let entries: Vec<(PublicKey, &str)> = authorized
        .keys()
        .iter()
        .map(|(k, c)| (k.clone(), c.as_str()))
        .collect();
    assert_eq!(
        entries,
        vec![
            (first.public_key(), "alice@one"),
            (second.public_key(), "bob@two"),
            (first.public_key(), ""),
            (second.public_key(), "tester@testhost"),
        ]
    );
    assert!(authorized.contains(&first.public_key()));
    assert!(authorized.contains(&second.public_key()));
    assert!(!authorized.contains(&stranger.public_key()));

    let signature = second.sign_token(&common::TOKEN).unwrap();
    let (key, comment) = authorized.verify(&common::TOKEN, &signature).unwrap();
    assert_eq!(key, &second.public_key());
    assert_eq!(comment, "bob@two");
    let signature = first.sign_token(&common::TOKEN).unwrap();
    assert_eq!(
        authorized.verify(&common::TOKEN, &signature).unwrap().1,
        "alice@one"
    );

    let unknown = stranger.sign_token(&common::TOKEN).unwrap();
    assert!(authorized.verify(&common::TOKEN, &unknown).is_none());
    let mut other = common::TOKEN;
    other[5] ^= 1;
    assert!(authorized.verify(&other, &signature).is_none());

    // From a file; a missing file is an error naming it.
    let file = root.path().join("adb_keys");
    std::fs::write(&file, &text).unwrap();
    assert_eq!(AuthorizedKeys::load(&file).unwrap().keys().len(), 4);
    let missing = root.path().join("nope");
    let error = AuthorizedKeys::load(&missing).unwrap_err();
    assert!(
        error.to_string().contains(&missing.display().to_string()),
        "{error}"
    );

    assert!(AuthorizedKeys::parse("").keys().is_empty());
}
