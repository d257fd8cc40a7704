//! The new image's block digests as the device builds it, without reading
//! it back: a block written from data takes the digest of that data, a
//! zeroed block the digest of zeros, a copied or untouched block the digest
//! its source had in the old image. The image digest made from them is
//! the device's half of the end check (docs/delta.md, "The end check").

use crate::digest::{BlockDigest, ImageDigest};
use crate::plan::Op;
use crate::BlockSize;

/// Digests of the new image's blocks, filled in as operations are applied.
pub struct Composition {
    block_size: BlockSize,
    new_len: u64,
    blocks: Vec<Option<BlockDigest>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompositionError {
    #[error("block {0} of the new image was never written")]
    Unwritten(u64),
    #[error("{op} copies old block {block}, which the old image does not have")]
    NoOldBlock { op: String, block: u64 },
    #[error("an XOR at block {0} was recorded before it was resolved into its data")]
    UnresolvedXor(u64),
}

impl Composition {
    /// For an image built beside the old one: every block must be written.
    pub fn beside(block_size: BlockSize, new_len: u64) -> Composition {
        Composition {
            block_size,
            new_len,
            blocks: vec![None; block_size.blocks_in(new_len) as usize],
        }
    }

    /// For an image built over the old one (`old` has the old image's
    /// digests): a block nothing writes keeps the old block's bytes, which
    /// are the new block's if both have the same length there.
    pub fn in_place(
        block_size: BlockSize,
        new_len: u64,
        old_len: u64,
        old: &[BlockDigest],
    ) -> Composition {
        let mut composition = Composition::beside(block_size, new_len);
        composition.keep_old(old_len, old);
        composition
    }

    /// Blocks nothing wrote, in place, keep the old block's bytes, which
    /// are the new block's if both have the same length there.
    pub fn keep_old(&mut self, old_len: u64, old: &[BlockDigest]) {
        let (block_size, new_len) = (self.block_size, self.new_len);
        for (index, slot) in self.blocks.iter_mut().enumerate() {
            let index = index as u64;
            if slot.is_none()
                && block_size.len_of(index, new_len) == block_size.len_of(index, old_len)
            {
                *slot = old.get(index as usize).copied();
            }
        }
    }

    /// Records what `op` wrote. `old` holds the old image's digests; a
    /// `Replace` is hashed from its data, which is what was written.
    pub fn record(&mut self, op: &Op, old: &[BlockDigest]) -> Result<(), CompositionError> {
        let block_size = self.block_size;
        match op {
            Op::Copy { start, from, count } => {
                for k in 0..*count {
                    let digest = old.get((from + k) as usize).copied().ok_or_else(|| {
                        CompositionError::NoOldBlock {
                            op: format!("{op:?}"),
                            block: from + k,
                        }
                    })?;
                    self.set(start + k, digest);
                }
            }
            Op::Zero { start, count } => {
                for index in *start..start + count {
                    let digest = BlockDigest::of_zeros(block_size.len_of(index, self.new_len));
                    self.set(index, digest);
                }
            }
            Op::Replace { start, data } => {
                for (k, block) in data.chunks(block_size.bytes() as usize).enumerate() {
                    self.set(start + k as u64, BlockDigest::of(block));
                }
            }
            // Its digests are its result's ([`crate::resolve_xor`]).
            Op::Xor { start, .. } => return Err(CompositionError::UnresolvedXor(*start)),
        }
        Ok(())
    }

    fn set(&mut self, index: u64, digest: BlockDigest) {
        // Operations were checked against the image's bounds before they
        // were applied ([`crate::check`]); one past them is a bug here.
        self.blocks[index as usize] = Some(digest);
    }

    /// Every block's digest, once each has one, and the image digest they
    /// make (see [`ImageDigest`]).
    pub fn finish(self) -> Result<(Vec<BlockDigest>, [u8; 32]), CompositionError> {
        let blocks = self
            .blocks
            .into_iter()
            .enumerate()
            .map(|(index, digest)| digest.ok_or(CompositionError::Unwritten(index as u64)))
            .collect::<Result<Vec<_>, _>>()?;
        let digest = ImageDigest::of_blocks(self.block_size, self.new_len, &blocks);
        Ok((blocks, digest))
    }
}

/// An old image read through a check: every whole block read from it must
/// have the digest the delta was planned against. A copy that goes
/// through memory thus confirms its source, and an index that no longer
/// describes the device fails the delta instead of building a wrong image.
pub struct CheckedReads<'a, S: ?Sized> {
    pub store: &'a mut S,
    pub block_size: BlockSize,
    pub old_len: u64,
    pub old: &'a [BlockDigest],
}

impl<S: crate::BlockStore + ?Sized> CheckedReads<'_, S> {
    fn check(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let bs = u64::from(self.block_size.bytes());
        if !offset.is_multiple_of(bs) {
            return Ok(());
        }
        let first = offset / bs;
        for (k, block) in buf.chunks(bs as usize).enumerate() {
            let index = first + k as u64;
            if block.len() != self.block_size.len_of(index, self.old_len) {
                continue;
            }
            if self.old.get(index as usize) != Some(&BlockDigest::of(block)) {
                return Err(std::io::Error::other(format!(
                    "old block {index} no longer has the digest the delta was planned against \
                     (the target changed since its digests were taken)"
                )));
            }
        }
        Ok(())
    }
}

impl<S: crate::BlockStore + ?Sized> crate::BlockStore for CheckedReads<'_, S> {
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.store.read_exact_at(offset, buf)?;
        self.check(offset, buf)
    }

    fn write_all_at(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.store.write_all_at(offset, data)
    }

    fn copy_range_from(
        &mut self,
        source: &dyn crate::BlockStore,
        from: u64,
        to: u64,
        len: u64,
    ) -> std::io::Result<bool> {
        self.store.copy_range_from(source, from, to, len)
    }

    fn as_file(&self) -> Option<&std::fs::File> {
        self.store.as_file()
    }

    fn write_zeros_at(&mut self, offset: u64, len: u64) -> std::io::Result<()> {
        self.store.write_zeros_at(offset, len)
    }
}
