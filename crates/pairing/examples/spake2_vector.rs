//! One side of a SPAKE2 exchange with chosen randomness, for
//! scripts/spake2-vectors.py (which runs BoringSSL as the other side):
//! `spake2_vector alice|bob PASSWORD_HEX RANDOM_HEX PEER_MSG_HEX` prints
//! `msg HEX` and `key HEX`. Names are adb's (pairing_auth/pairing_auth.cpp).

use oxadb_pairing::spake2::{Role, Spake2};
use oxadb_pairing::{CLIENT_NAME, SERVER_NAME};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [role, password, random, peer] = &args[..] else {
        eprintln!("usage: spake2_vector alice|bob PASSWORD_HEX RANDOM_HEX PEER_MSG_HEX");
        std::process::exit(2);
    };
    let (role, me, them) = match role.as_str() {
        "alice" => (Role::Alice, CLIENT_NAME, SERVER_NAME),
        _ => (Role::Bob, SERVER_NAME, CLIENT_NAME),
    };
    let random: [u8; 64] = hex::decode(random).unwrap().try_into().unwrap();
    let spake = Spake2::with_random(role, me, them, &hex::decode(password).unwrap(), &random);
    println!("msg {}", hex::encode(spake.message()));
    let key = spake.finish(&hex::decode(peer).unwrap()).unwrap();
    println!("key {}", hex::encode(key));
}
