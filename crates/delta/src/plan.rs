//! The host's side of a delta: each block of the new image decided against
//! the old image's digests, and the decisions coalesced into operations.

use foldhash::{HashMap, HashMapExt};

use bytes::{Bytes, BytesMut};

use crate::block::{is_zero, BlockSize};
use crate::digest::BlockDigest;

/// What one block of the new image is, given the old image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The old image has the same bytes at the same place.
    Same,
    /// All zero (and the old block at this place is not).
    Zero,
    /// The old image has the same bytes in block `from`, elsewhere: a file
    /// moved inside a filesystem image, or a duplicated block.
    Copy { from: u64 },
    /// New bytes: they cross the link.
    Replace,
}

/// Decides blocks of a new image against the digests of the old one.
pub struct Planner {
    block_size: BlockSize,
    old_len: u64,
    old: Vec<BlockDigest>,
    /// Full-size old blocks by digest, the lowest index of each: a copy
    /// source found anywhere in the old image (as RAUC's block-hash-index
    /// does), not only near the block's own place (as rsync's window).
    anywhere: HashMap<BlockDigest, u64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the old image of {old_len} bytes has {expected} blocks of {block_size}, not {got} digests"
)]
pub struct DigestCountError {
    pub old_len: u64,
    pub block_size: u32,
    pub expected: u64,
    pub got: usize,
}

impl Planner {
    /// `old` holds one digest per block of the old image of `old_len`
    /// bytes, in order.
    pub fn new(
        block_size: BlockSize,
        old_len: u64,
        old: Vec<BlockDigest>,
    ) -> Result<Planner, DigestCountError> {
        let expected = block_size.blocks_in(old_len);
        if old.len() as u64 != expected {
            return Err(DigestCountError {
                old_len,
                block_size: block_size.bytes(),
                expected,
                got: old.len(),
            });
        }
        let mut anywhere = HashMap::with_capacity(old.len());
        for (index, digest) in old.iter().enumerate() {
            let index = index as u64;
            if block_size.len_of(index, old_len) == block_size.bytes() as usize {
                anywhere.entry(*digest).or_insert(index);
            }
        }
        Ok(Planner {
            block_size,
            old_len,
            old,
            anywhere,
        })
    }

    pub fn block_size(&self) -> BlockSize {
        self.block_size
    }

    /// Block `index` of the new image holds `block`.
    pub fn decide(&self, index: u64, block: &[u8]) -> Decision {
        self.decide_digest(index, &BlockInfo::of(block))
    }

    /// Block `index` of the new image is the one `info` describes: the
    /// host decides from the digests it took while reading its image once.
    pub fn decide_digest(&self, index: u64, info: &BlockInfo) -> Decision {
        decide(
            self.block_size,
            self.old_len,
            self.old.get(index as usize),
            &self.anywhere,
            index,
            info,
        )
    }
}

/// The rule for one block, given what is known of the old image: its
/// digest at the block's place (`None` past its end, or not yet known) and
/// its full-size blocks by digest. Shared by [`Planner`] and the host's
/// [`crate::Pipeline`], which decides while the index still arrives.
pub(crate) fn decide(
    block_size: BlockSize,
    old_len: u64,
    old_here: Option<&BlockDigest>,
    anywhere: &HashMap<BlockDigest, u64>,
    index: u64,
    info: &BlockInfo,
) -> Decision {
    let same_place =
        old_here == Some(&info.digest) && block_size.len_of(index, old_len) == info.len as usize;
    if same_place {
        return Decision::Same;
    }
    if info.zero {
        return Decision::Zero;
    }
    if info.len == block_size.bytes() {
        if let Some(&from) = anywhere.get(&info.digest) {
            return Decision::Copy { from };
        }
    }
    Decision::Replace
}

/// What deciding a block needs of it: its digest, length and whether it is
/// all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    pub digest: BlockDigest,
    pub len: u32,
    pub zero: bool,
}

impl BlockInfo {
    pub fn of(block: &[u8]) -> BlockInfo {
        BlockInfo {
            digest: BlockDigest::of(block),
            len: block.len() as u32,
            zero: is_zero(block),
        }
    }
}

/// One operation on the old image; together a plan's operations cover
/// every block of the new image once, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// New blocks `start..start + count` are old blocks `from..from +
    /// count` (`from == start`: unchanged).
    Copy { start: u64, from: u64, count: u64 },
    /// New blocks `start..start + count` are zero.
    Zero { start: u64, count: u64 },
    /// New blocks from `start` hold `data`: whole blocks, the image's last
    /// one maybe short.
    Replace { start: u64, data: Bytes },
    /// New blocks from `start` are the old blocks at the same place XOR
    /// `data` (as long as a `Replace` would be): a block that changed a
    /// little costs what its few changed bytes compress to. Only a host
    /// that has the old image (`push --delta --base`) can make one.
    Xor { start: u64, data: Bytes },
}

impl Op {
    pub fn start(&self) -> u64 {
        match self {
            Op::Copy { start, .. }
            | Op::Zero { start, .. }
            | Op::Replace { start, .. }
            | Op::Xor { start, .. } => *start,
        }
    }

    /// Blocks of the new image it writes.
    pub fn count(&self, block_size: BlockSize) -> u64 {
        match self {
            Op::Copy { count, .. } | Op::Zero { count, .. } => *count,
            Op::Replace { data, .. } | Op::Xor { data, .. } => {
                (data.len() as u64).div_ceil(u64::from(block_size.bytes()))
            }
        }
    }

    /// Whether it changes nothing when applied in place.
    pub fn is_unchanged(&self) -> bool {
        matches!(self, Op::Copy { start, from, .. } if start == from)
    }
}

/// Which operations a [`Plan`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    All,
    /// Copies only (unchanged blocks included): what goes first when a
    /// plan is applied in place; no block data is needed.
    Copies,
    /// Zeros and new data only: what follows the copies.
    Writes,
}

/// Decisions coalesced into operations, in the new image's block order.
pub struct Plan {
    block_size: BlockSize,
    keep: Keep,
    next: u64,
    /// Closed operations, then the open one (which may still grow).
    ops: Vec<Op>,
    replace: BytesMut,
    replace_start: u64,
}

/// Most bytes one `Replace` carries: a compression frame that large still
/// compresses as well as the whole image would (zstd's window at level 3 is
/// larger, but changed regions of an image are mostly smaller than this),
/// and an operation is sent while the next is planned.
pub const MAX_REPLACE_BYTES: usize = 1 << 20;

impl Plan {
    pub fn new(block_size: BlockSize) -> Plan {
        Plan::keeping(block_size, Keep::All)
    }

    /// A plan that makes only the operations `keep` names; the others'
    /// blocks are passed over (a copies-only plan needs no block data).
    pub fn keeping(block_size: BlockSize, keep: Keep) -> Plan {
        Plan::keeping_from(block_size, keep, 0)
    }

    /// A plan of the blocks from `first` on: part of an image, planned
    /// while the rest of the device's index is still on its way.
    pub fn keeping_from(block_size: BlockSize, keep: Keep, first: u64) -> Plan {
        Plan {
            block_size,
            keep,
            next: first,
            ops: Vec::new(),
            replace: BytesMut::new(),
            replace_start: 0,
        }
    }

    /// Adds the next block of the new image (`index` must follow the last
    /// one added), which holds `block` and was decided `decision`.
    pub fn push(&mut self, index: u64, decision: Decision, block: &[u8]) {
        assert_eq!(index, self.next, "blocks are planned in order");
        self.next += 1;
        if decision != Decision::Replace {
            self.close_replace();
        }
        let is_copy = matches!(decision, Decision::Same | Decision::Copy { .. });
        let kept = match self.keep {
            Keep::All => true,
            Keep::Copies => is_copy,
            Keep::Writes => !is_copy,
        };
        if !kept {
            return;
        }
        match decision {
            Decision::Same => self.extend_copy(index, index),
            Decision::Copy { from } => self.extend_copy(index, from),
            Decision::Zero => match self.ops.last_mut() {
                Some(Op::Zero { start, count }) if *start + *count == index => *count += 1,
                _ => self.ops.push(Op::Zero {
                    start: index,
                    count: 1,
                }),
            },
            Decision::Replace => {
                if self.replace.len() + block.len() > MAX_REPLACE_BYTES {
                    self.close_replace();
                }
                if self.replace.is_empty() {
                    self.replace_start = index;
                }
                self.replace.extend_from_slice(block);
            }
        }
    }

    fn extend_copy(&mut self, index: u64, from: u64) {
        match self.ops.last_mut() {
            Some(Op::Copy {
                start,
                from: run_from,
                count,
            }) if *start + *count == index && *run_from + *count == from => *count += 1,
            _ => self.ops.push(Op::Copy {
                start: index,
                from,
                count: 1,
            }),
        }
    }

    fn close_replace(&mut self) {
        if !self.replace.is_empty() {
            self.ops.push(Op::Replace {
                start: self.replace_start,
                data: self.replace.split().freeze(),
            });
        }
    }

    /// The operations that can no longer grow, to send while planning goes on.
    pub fn take_closed(&mut self) -> Vec<Op> {
        let keep = usize::from(self.replace.is_empty() && !self.ops.is_empty());
        let closed = self.ops.len() - keep;
        self.ops.drain(..closed).collect()
    }

    /// Every remaining operation: the new image has no more blocks.
    pub fn finish(mut self) -> Vec<Op> {
        self.close_replace();
        self.ops
    }

    pub fn block_size(&self) -> BlockSize {
        self.block_size
    }
}

/// The plan of a whole new image held in memory: every block decided in
/// order. The drivers read images in pieces and call the same two steps.
pub fn plan_image(planner: &Planner, new: &[u8]) -> Vec<Op> {
    let block_size = planner.block_size();
    let mut plan = Plan::new(block_size);
    for (index, block) in new.chunks(block_size.bytes() as usize).enumerate() {
        let index = index as u64;
        plan.push(index, planner.decide(index, block), block);
    }
    plan.finish()
}
