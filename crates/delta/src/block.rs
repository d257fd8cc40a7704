//! The unit both images are cut into.

/// A block size: a power of two from 512 bytes to 1 MiB. Blocks are aligned
/// to the image's start; the last one may be short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSize(u32);

impl BlockSize {
    /// 4 KiB: the page size and the block of ext4, f2fs and erofs images, so
    /// a file changed, added or moved inside a filesystem image changes or
    /// moves whole blocks of this size (docs/delta.md, "Block size").
    pub const DEFAULT: BlockSize = BlockSize(4096);

    /// `None` unless `bytes` is a power of two from 512 to 1 MiB.
    pub fn new(bytes: u32) -> Option<BlockSize> {
        (bytes.is_power_of_two() && (512..=1 << 20).contains(&bytes)).then_some(BlockSize(bytes))
    }

    pub fn bytes(self) -> u32 {
        self.0
    }

    /// Blocks that hold an image of `len` bytes, the last one maybe short.
    pub fn blocks_in(self, len: u64) -> u64 {
        len.div_ceil(u64::from(self.0))
    }

    /// Where block `index` starts.
    pub fn offset_of(self, index: u64) -> u64 {
        index * u64::from(self.0)
    }

    /// Bytes of block `index` in an image of `len` bytes (0 past its end).
    pub fn len_of(self, index: u64, len: u64) -> usize {
        let start = self.offset_of(index);
        len.saturating_sub(start).min(u64::from(self.0)) as usize
    }
}

impl Default for BlockSize {
    fn default() -> BlockSize {
        BlockSize::DEFAULT
    }
}

/// Whether every byte of `data` is zero.
pub(crate) fn is_zero(data: &[u8]) -> bool {
    // Eight bytes at a time: the compiler vectorises this, a byte loop it
    // does not always.
    let (words, rest) = data.split_at(data.len() - data.len() % 8);
    words
        .chunks_exact(8)
        .all(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")) == 0)
        && rest.iter().all(|&b| b == 0)
}
