//! What identifies a block, and a whole image.
//!
//! One strong hash does both jobs a delta needs, finding a block anywhere in
//! the old image and confirming it is the same: BLAKE3, which hashed 4 KiB
//! blocks at 2.2 GB/s on one core of this project's VM, against 1.3 GB/s for
//! SHA-256 (docs/delta.md, "Hashes"). A fast non-cryptographic hash for
//! finding (xxh3, 6.3 GB/s) would still need the strong one for every match,
//! and in an image that changed a few percent nearly every block matches.

use crate::BlockSize;

/// Bytes of a block digest: BLAKE3 cut to 128 bits. Two different blocks
/// share one with probability 2^-128 per pair; nobody can choose the old
/// image's blocks but the device's owner, and the whole-image digest checks
/// the result anyway.
pub const DIGEST_LEN: usize = 16;

/// The digest of one block's bytes (a short last block is hashed as it is).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockDigest(pub [u8; DIGEST_LEN]);

impl BlockDigest {
    pub fn of(block: &[u8]) -> BlockDigest {
        let hash = blake3::hash(block);
        let mut digest = [0u8; DIGEST_LEN];
        digest.copy_from_slice(&hash.as_bytes()[..DIGEST_LEN]);
        BlockDigest(digest)
    }

    /// The digest of `len` zero bytes.
    pub fn of_zeros(len: usize) -> BlockDigest {
        // Fed a page at a time: BLAKE3 of bytes fed in pieces is the same
        // as of them whole, and a static block of zeros would sit in the
        // binary (1 MiB of read-only data in the board daemon).
        const PAGE: [u8; 4096] = [0; 4096];
        let mut hasher = blake3::Hasher::new();
        let mut left = len;
        while left > 0 {
            let n = left.min(PAGE.len());
            hasher.update(&PAGE[..n]);
            left -= n;
        }
        let mut digest = [0u8; DIGEST_LEN];
        digest.copy_from_slice(&hasher.finalize().as_bytes()[..DIGEST_LEN]);
        BlockDigest(digest)
    }
}

impl std::fmt::Debug for BlockDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for byte in &self.0[..6] {
            write!(f, "{byte:02x}")?;
        }
        f.write_str("…")
    }
}

/// The digest of a whole image: BLAKE3-256 over its length, its block size
/// and its blocks' digests in order, the root of a two-level tree whose
/// leaves are [`BlockDigest`]s. Both ends can make it without reading the
/// image again: the host from the digests it took while reading, the
/// device from the digests of what it wrote and of the old blocks it kept
/// (docs/delta.md, "The end check").
#[derive(Clone)]
pub struct ImageDigest(blake3::Hasher);

impl ImageDigest {
    pub fn new(block_size: BlockSize, len: u64) -> ImageDigest {
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"oxadb-delta image");
        hasher.update(&len.to_le_bytes());
        hasher.update(&block_size.bytes().to_le_bytes());
        ImageDigest(hasher)
    }

    /// Adds the image's next block.
    pub fn push(&mut self, block: &BlockDigest) {
        self.0.update(&block.0);
    }

    pub fn finish(&self) -> [u8; 32] {
        *self.0.finalize().as_bytes()
    }

    /// The digest of an image whose blocks have `blocks` for digests.
    pub fn of_blocks(block_size: BlockSize, len: u64, blocks: &[BlockDigest]) -> [u8; 32] {
        let mut digest = ImageDigest::new(block_size, len);
        for block in blocks {
            digest.push(block);
        }
        digest.finish()
    }
}

/// Blocks under one region digest. 256 blocks of 4 KiB make 1 MiB regions:
/// a GiB's region digests are 16 KiB against 4 MiB of block digests, and
/// an image whose changes cluster (a rewritten file, a grown directory)
/// sends block digests for few regions (docs/delta.md, "Regions").
pub const REGION_BLOCKS: u64 = 256;

/// The digest of a region: BLAKE3 of its blocks' digests, cut to 128 bits.
/// Two regions with the same digest hold the same blocks, a short last
/// block included (its digest covers its length).
pub fn region_digest(blocks: &[BlockDigest]) -> BlockDigest {
    let mut hasher = blake3::Hasher::new();
    for block in blocks {
        hasher.update(&block.0);
    }
    let mut digest = [0u8; DIGEST_LEN];
    digest.copy_from_slice(&hasher.finalize().as_bytes()[..DIGEST_LEN]);
    BlockDigest(digest)
}

/// The region digests of an image whose blocks have `blocks` for digests.
pub fn region_digests(blocks: &[BlockDigest]) -> Vec<BlockDigest> {
    blocks
        .chunks(REGION_BLOCKS as usize)
        .map(region_digest)
        .collect()
}

/// Regions that hold an image of `blocks` blocks, the last one maybe short.
pub fn regions_in(blocks: u64) -> u64 {
    blocks.div_ceil(REGION_BLOCKS)
}
