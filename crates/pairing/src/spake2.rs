//! SPAKE2 over edwards25519 as BoringSSL composes it (`crypto/curve25519/
//! spake25519.c`), which adb's pairing uses (`pairing_auth/pairing_auth.cpp`):
//! wire-compatible with it, not with RFC 9382 or python-spake2 (other M and N
//! points, another transcript).
//!
//! The group arithmetic is curve25519-dalek's; only the composition is here:
//! - a private scalar `8·a` (64 random bytes reduced mod ℓ, times the cofactor),
//! - a password scalar `w = reduce(SHA-512(password)) + k·ℓ`, with `k` in 0..8
//!   making `w` a multiple of 8 (BoringSSL's "password scalar hack"; it changes
//!   the torsion part of the message only),
//! - a message `8a·B + w·M` (alice) or `8a·B + w·N` (bob),
//! - a key `SHA-512` over length-prefixed names, messages, `8a·(peer - w·N|M)`
//!   and `SHA-512(password)`, alice's items first.

use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use ring::digest::{self, SHA512};
use ring::rand::SecureRandom as _;
use thiserror::Error;

/// The size of a SPAKE2 message (an encoded point).
pub const MSG_SIZE: usize = 32;
/// The size of the derived key material.
pub const KEY_SIZE: usize = 64;

/// BoringSSL's M: the encoding found by hashing "edwards25519 point generation
/// seed (M)" with SHA-256 until it decodes (not cofactor-cleared).
const M: [u8; 32] = [
    0x5a, 0xda, 0x7e, 0x4b, 0xf6, 0xdd, 0xd9, 0xad, 0xb6, 0x62, 0x6d, 0x32, 0x13, 0x1c, 0x6b, 0x5c,
    0x51, 0xa1, 0xe3, 0x47, 0xa3, 0x47, 0x8f, 0x53, 0xcf, 0xcf, 0x44, 0x1b, 0x88, 0xee, 0xd1, 0x2e,
];
/// BoringSSL's N, from the seed "edwards25519 point generation seed (N)".
const N: [u8; 32] = [
    0x10, 0xe3, 0xdf, 0x0a, 0xe3, 0x7d, 0x8e, 0x7a, 0x99, 0xb5, 0xfe, 0x74, 0xb4, 0x46, 0x72, 0x10,
    0x3d, 0xbd, 0xdc, 0xbd, 0x06, 0xaf, 0x68, 0x0d, 0x71, 0x32, 0x9a, 0x11, 0x69, 0x3b, 0xc7, 0x78,
];
/// The low byte of ℓ, the prime subgroup's order (0x...5cf5d3ed).
const ORDER_LOW_BYTE: u8 = 0xed;

/// Which side of the exchange: adb's pairing client is alice, the device bob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Alice,
    Bob,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Spake2Error {
    #[error("SPAKE2 message is {0} bytes, not {MSG_SIZE}")]
    MessageSize(usize),
    #[error("SPAKE2 message is not a point on edwards25519")]
    NotAPoint,
    #[error("OS random number generator failed: {0}")]
    Random(String),
}

/// One side's state after it made its message.
pub struct Spake2 {
    role: Role,
    my_name: Vec<u8>,
    their_name: Vec<u8>,
    /// `a`; the private scalar proper is `8·a` (BoringSSL's left_shift_3).
    private: Scalar,
    password_hash: [u8; 64],
    password_scalar: PasswordScalar,
    my_msg: [u8; MSG_SIZE],
}

/// `w0 + k·ℓ`: kept apart because `w` may exceed ℓ and the points M and N
/// have a torsion part that `k·ℓ` does not clear.
#[derive(Clone, Copy)]
struct PasswordScalar {
    reduced: Scalar,
    order_multiple: u8,
}

impl PasswordScalar {
    fn new(password_hash: &[u8; 64]) -> PasswordScalar {
        let reduced = Scalar::from_bytes_mod_order_wide(password_hash);
        // Add ℓ, 2ℓ, 4ℓ as each low bit of the running sum is set, as
        // BoringSSL does, so the sum is a multiple of 8.
        let mut low = u16::from(reduced.as_bytes()[0]);
        let mut order_multiple = 0u8;
        for bit in [1u16, 2, 4] {
            if low & bit != 0 {
                low += bit * u16::from(ORDER_LOW_BYTE);
                order_multiple += bit as u8;
            }
        }
        debug_assert_eq!(low & 7, 0);
        PasswordScalar {
            reduced,
            order_multiple,
        }
    }

    /// `w·P` for a point with a possible torsion part.
    fn mul(&self, point: &EdwardsPoint) -> EdwardsPoint {
        // ℓ·P = (ℓ-1)·P + P: the torsion part of P alone.
        let torsion = point * (-Scalar::ONE) + point;
        point * self.reduced + torsion * Scalar::from(self.order_multiple)
    }
}

fn point(bytes: &[u8; 32]) -> EdwardsPoint {
    CompressedEdwardsY(*bytes)
        .decompress()
        .expect("BoringSSL's SPAKE2 constants are points")
}

/// SHA-512 with ring, which TLS links anyway.
fn sha512(data: &[u8]) -> [u8; 64] {
    digest::digest(&SHA512, data)
        .as_ref()
        .try_into()
        .expect("SHA-512 is 64 bytes")
}

fn update_with_length_prefix(hash: &mut digest::Context, data: &[u8]) {
    hash.update(&(data.len() as u64).to_le_bytes());
    hash.update(data);
}

impl Spake2 {
    /// Starts an exchange with a private scalar from the OS RNG.
    pub fn new(
        role: Role,
        my_name: &[u8],
        their_name: &[u8],
        password: &[u8],
    ) -> Result<Spake2, Spake2Error> {
        let mut random = [0u8; 64];
        ring::rand::SystemRandom::new()
            .fill(&mut random)
            .map_err(|_| Spake2Error::Random("getrandom failed".into()))?;
        Ok(Spake2::with_random(
            role, my_name, their_name, password, &random,
        ))
    }

    /// Starts an exchange with the 64 random bytes BoringSSL would draw
    /// (for test vectors).
    pub fn with_random(
        role: Role,
        my_name: &[u8],
        their_name: &[u8],
        password: &[u8],
        random: &[u8; 64],
    ) -> Spake2 {
        let private = Scalar::from_bytes_mod_order_wide(random);
        // Without dalek's precomputed tables (30 KiB of a static daemon):
        // one multiplication per pairing.
        let public = EdwardsPoint::mul_base(&(private * Scalar::from(8u8)));
        let password_hash = sha512(password);
        let password_scalar = PasswordScalar::new(&password_hash);
        let mask = password_scalar.mul(&point(match role {
            Role::Alice => &M,
            Role::Bob => &N,
        }));
        let my_msg = (public + mask).compress().to_bytes();
        Spake2 {
            role,
            my_name: my_name.to_vec(),
            their_name: their_name.to_vec(),
            private,
            password_hash,
            password_scalar,
            my_msg,
        }
    }

    /// The message to send to the peer.
    pub fn message(&self) -> &[u8; MSG_SIZE] {
        &self.my_msg
    }

    /// The shared key material from the peer's message; both sides get the
    /// same bytes only if they used the same password.
    pub fn finish(self, their_msg: &[u8]) -> Result<[u8; KEY_SIZE], Spake2Error> {
        let their_bytes: [u8; MSG_SIZE] = their_msg
            .try_into()
            .map_err(|_| Spake2Error::MessageSize(their_msg.len()))?;
        let their_point = CompressedEdwardsY(their_bytes)
            .decompress()
            .ok_or(Spake2Error::NotAPoint)?;
        let their_mask = self.password_scalar.mul(&point(match self.role {
            Role::Alice => &N,
            Role::Bob => &M,
        }));
        // 8a·Q = a·(8Q): the cofactor in the private scalar clears any
        // torsion the peer's point carries.
        let shared = ((their_point - their_mask).mul_by_cofactor() * self.private)
            .compress()
            .to_bytes();
        let mut hash = digest::Context::new(&SHA512);
        let (alice_name, bob_name, alice_msg, bob_msg) = match self.role {
            Role::Alice => (&self.my_name, &self.their_name, &self.my_msg, &their_bytes),
            Role::Bob => (&self.their_name, &self.my_name, &their_bytes, &self.my_msg),
        };
        update_with_length_prefix(&mut hash, alice_name);
        update_with_length_prefix(&mut hash, bob_name);
        update_with_length_prefix(&mut hash, alice_msg);
        update_with_length_prefix(&mut hash, bob_msg);
        update_with_length_prefix(&mut hash, &shared);
        update_with_length_prefix(&mut hash, &self.password_hash);
        Ok(hash
            .finish()
            .as_ref()
            .try_into()
            .expect("SHA-512 is 64 bytes"))
    }
}

#[cfg(test)]
mod tests;
