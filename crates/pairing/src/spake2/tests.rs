//! Vectors made by scripts/spake2-vectors.py: BoringSSL (Debian's
//! android-libboringssl, the libcrypto adb links to) ran the other side and
//! derived `key` from our `msg`; see the script for how.

use super::*;

struct Vector {
    ours: Role,
    password: &'static str,
    random: &'static str,
    peer_msg: &'static str,
    msg: &'static str,
    key: &'static str,
}

const VECTORS: &[Vector] = &[
Vector { ours: Role::Bob, password: "3132333435365d4402a56c4566e04f8336c97a43306c38b7a7996c38e3196fe1253ffe5c591b98844c522e3d1fd42e9eaec51d4d372c1eb7c2fbead4c7812d04169ea29f62f4",
    random: "3ff4deeda73fc9b812198b6a13895be0c0316cd82361c1ec80738094fbf6fc0f4ccc0960b11f37344e35e403abd359e1e9cff5403f8ef90d2863881b0087b956",
    peer_msg: "15a3b4e5efb0476d9c624cf052256331160aa77ee51b1d3e2005b18956695f46",
    msg: "d36eb0360415191ddc29ffdfd296482631356ecd7332b2179e8e9cdecffd1ed5",
    key: "335b1c1a816f9d292521bbc43f2467d25b9032ea3d19e5297e5d99d9cefcf0c75922ed248a360cc27efac724af330f6253b85f66f75b4f539fc3fb9de484ceaf" },
Vector { ours: Role::Alice, password: "303030303030502a878411c8384054dedc5fe9e30bd9f567529a8072fbf16078b47a41d60907f97355aee57832a4e99f740f5b6d287e6f6a4a1328084668f6afc45536718cc9",
    random: "ea4f1cad151402b023df9f98e1cfcf81896bd81f880e01c002209085a66de86c88ce5b0b74ccd302d4548331aab2f7ca52cc3df988a0677d8b8d226ed0f106bd",
    peer_msg: "f92d9e780a5cdb7130757c9a0b72c41ede22793a58f7cf4bc68912aa706816ae",
    msg: "d94f122c64bde5f4bc40e8fc164f6ad9af904318bc5005dbd5005b08df8084b7",
    key: "2cb181fa51e8f1499f2e061940ee6a8bc638475bde983d19b3342ca915c3cc1109fb7cb92713552038c5a5a85c62f588e580c053a79cd1e3f4350d6cd8835bad" },
Vector { ours: Role::Bob, password: "393837363534776234c7fd32c645d0a3495e0890e1e2a0c12f6afd6d72574aa9af5b12eb5dd57f6211fe43089ff36ebe2efaf98d6b0ed71d00699491143a3712f9905088cec0",
    random: "f2d34146e05dde6d3410b09bee6e4f61c5872cdfcb60a78bd0b47dae7aaae3f5e94a65e6e0c6d78b4eea62ce4736b4244101a517469b90fa39a9f6302fa85380",
    peer_msg: "fbf0ee6a1bd9407c33b08827f266abbc22b002922d2b26413c1f5cf8b8f7fecd",
    msg: "ba9f837e85a301d3be5ce71436eb03c5aea87093a5a837c9bb3a7dded2b9b22a",
    key: "d899b1291910c81e965d1279c806ad316d9d6e1d3fe2984cb9970d6436b69d151c675d6dad7dc60d0036bd0d8dff4a1f27ab401c10da8f17147a4b0ad1b24648" },
Vector { ours: Role::Alice, password: "3331343135398b444023615ca3e86cde467815fcef856953c7ee8e3973ec31b2cd4636e0b3787c56f91fc6bc6f882d90e04248844d7f7ac86b4883bf9bdc215c3f3c4b18bfa6",
    random: "0f1ff060cf9a0a349b436d3ba033431d1cc00a30dd92048c4daed3962e121b5c4070f21a6094375aa6fa5581e1e76829fd850a13e3a089eb7edd0c50f25c66f5",
    peer_msg: "4fb26f656f827bf1b6c0cfb99c6cafeb3286024922a869ac7d9d36930406d506",
    msg: "abb3daf06d1e45ef04682d0b406b62f9476779a9a6c66f88ab0ca5c505a13e43",
    key: "117a29669b57f5c76fd2a7b0904cb8b85e99897aeb73b38eff7ae9e500d3863b633ea45e5c87ee039aa6904460302cf4e6d2a6a05dac072bbc8cd06caa84ecae" },
];

fn names(role: Role) -> (&'static [u8], &'static [u8]) {
    match role {
        Role::Alice => (crate::CLIENT_NAME, crate::SERVER_NAME),
        Role::Bob => (crate::SERVER_NAME, crate::CLIENT_NAME),
    }
}

#[test]
fn matches_boringssl_vectors() {
    for (i, v) in VECTORS.iter().enumerate() {
        let (me, them) = names(v.ours);
        let random: [u8; 64] = hex::decode(v.random).unwrap().try_into().unwrap();
        let password = hex::decode(v.password).unwrap();
        let spake = Spake2::with_random(v.ours, me, them, &password, &random);
        assert_eq!(hex::encode(spake.message()), v.msg, "vector {i}: message");
        let key = spake.finish(&hex::decode(v.peer_msg).unwrap()).unwrap();
        assert_eq!(hex::encode(key), v.key, "vector {i}: key");
    }
}

#[test]
fn both_roles_agree_only_on_the_same_password() {
    let pair = |alice_pw: &[u8], bob_pw: &[u8]| {
        let alice = Spake2::new(
            Role::Alice,
            crate::CLIENT_NAME,
            crate::SERVER_NAME,
            alice_pw,
        )
        .unwrap();
        let bob = Spake2::new(Role::Bob, crate::SERVER_NAME, crate::CLIENT_NAME, bob_pw).unwrap();
        let (a_msg, b_msg) = (*alice.message(), *bob.message());
        (alice.finish(&b_msg).unwrap(), bob.finish(&a_msg).unwrap())
    };
    let (a, b) = pair(b"123456", b"123456");
    assert_eq!(a, b);
    let (a, b) = pair(b"123456", b"123457");
    assert_ne!(a, b);
}

#[test]
fn refuses_bad_messages() {
    let alice = || Spake2::new(Role::Alice, b"a", b"b", b"pw").unwrap();
    assert_eq!(
        alice().finish(&[0; 31]).unwrap_err(),
        Spake2Error::MessageSize(31)
    );
    // y = 2 is not the y of any edwards25519 point.
    let mut off_curve = [0u8; 32];
    off_curve[0] = 2;
    assert_eq!(
        alice().finish(&off_curve).unwrap_err(),
        Spake2Error::NotAPoint
    );
}

#[test]
fn password_scalar_is_a_multiple_of_eight() {
    // The sum w0 + k·ℓ computed in full, for many password hashes.
    let order: [u8; 32] = (-Scalar::ONE).to_bytes();
    for i in 0u8..64 {
        let hash = sha512(&[i]);
        let w = PasswordScalar::new(&hash);
        let low = u32::from(w.reduced.as_bytes()[0])
            + u32::from(w.order_multiple) * (u32::from(order[0]) + 1);
        assert_eq!(low % 8, 0, "hash {i}");
    }
}
