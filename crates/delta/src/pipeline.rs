//! The host's side of a delta while the device's index is still arriving
//! and the host still hashes its own image: the old image's region
//! digests, compared as soon as the new image's region is hashed too, then
//! the block digests of the regions that differ (docs/delta.md, "Regions"),
//! and, before the last of them, the new blocks that can already be
//! decided and written.
//!
//! A block is decided once the index reaches [`LOOKAHEAD_REGIONS`] regions
//! past it: a block whose bytes lie further ahead in the old image is then
//! sent as data instead of copied, which costs bytes, never correctness.
//! Written early are only zeros and new data whose place no copy can read:
//! beside the old image any place, in place a place whose old bytes appear
//! nowhere in the new image (a copy only reads old blocks the new image
//! has). While the new image is still being hashed, "nowhere" is "nowhere
//! hashed yet", and a block hashed later that the old bytes of a place
//! written early would have given is sent as data instead of copied.
//! Everything else waits for the end: the copies, then the writes held
//! back (docs/delta.md, "Applying in place: the order").

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use crate::digest::{region_digest, regions_in, BlockDigest, REGION_BLOCKS};
use crate::plan::{decide, BlockInfo, Decision};
use crate::BlockSize;

/// How far (in regions of the old image) the index must be ahead of a
/// block before the block is decided without the rest: 64 MiB of 4 KiB
/// blocks, one batch of the device's region digests as it reads.
pub const LOOKAHEAD_REGIONS: u64 = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PipelineError {
    #[error("{count} region digests from region {start}, expected from {expected} of {regions}")]
    Regions {
        start: u64,
        count: usize,
        expected: u64,
        regions: u64,
    },
    #[error("{count} block digests from block {start}, none or others wanted")]
    Digests { start: u64, count: usize },
    #[error("the index is not complete")]
    Incomplete,
}

pub struct Pipeline {
    block_size: BlockSize,
    old_len: u64,
    /// The new image's blocks hashed so far, in order, of `new_blocks`.
    new: Vec<BlockInfo>,
    new_blocks: u64,
    /// Digests of the new image's regions whose blocks are all hashed.
    new_regions: Vec<BlockDigest>,
    /// Digests of the new image's full blocks: an old block with one of
    /// them may be a copy's source.
    new_set: HashSet<BlockDigest>,
    in_place: bool,
    old: Vec<Option<BlockDigest>>,
    old_regions: u64,
    /// The old image's region digests received so far.
    old_region_digests: Vec<BlockDigest>,
    /// Regions before this one are compared with the new image's.
    compared: u64,
    region_known: Vec<bool>,
    /// Regions before this one all have their block digests.
    known_prefix: u64,
    /// Block ranges wanted and not yet received, in the order asked.
    wanted: VecDeque<(u64, u64)>,
    anywhere: HashMap<BlockDigest, u64>,
    decisions: Vec<Decision>,
    /// Writes handed out before the index was complete.
    written_early: Vec<bool>,
}

impl Pipeline {
    /// `new` describes every block of the new image; `old_len` is the old
    /// image's length (INDEX); `in_place` whether the device writes over it.
    pub fn new(
        block_size: BlockSize,
        new: Vec<BlockInfo>,
        old_len: u64,
        in_place: bool,
    ) -> Pipeline {
        let new_len = new.iter().map(|b| u64::from(b.len)).sum();
        let mut pipeline = Pipeline::hashing(block_size, new_len, old_len, in_place);
        pipeline.hashed(&new);
        pipeline
    }

    /// A pipeline whose new image of `new_len` bytes is described block by
    /// block as it is hashed ([`Pipeline::hashed`]).
    pub fn hashing(block_size: BlockSize, new_len: u64, old_len: u64, in_place: bool) -> Pipeline {
        let new_blocks = block_size.blocks_in(new_len);
        let old_blocks = block_size.blocks_in(old_len);
        let old_regions = regions_in(old_blocks);
        Pipeline {
            block_size,
            old_len,
            new: Vec::with_capacity(new_blocks as usize),
            new_blocks,
            new_regions: Vec::with_capacity(regions_in(new_blocks) as usize),
            new_set: HashSet::with_capacity(new_blocks as usize),
            in_place,
            old: vec![None; old_blocks as usize],
            old_regions,
            old_region_digests: Vec::with_capacity(old_regions as usize),
            compared: 0,
            region_known: vec![false; old_regions as usize],
            known_prefix: 0,
            wanted: VecDeque::new(),
            anywhere: HashMap::new(),
            decisions: Vec::with_capacity(new_blocks as usize),
            written_early: vec![false; new_blocks as usize],
        }
    }

    /// The new image's next blocks, in order; returns the runs of regions
    /// whose block digests to ask for (WANT) that this allows.
    pub fn hashed(&mut self, blocks: &[BlockInfo]) -> Vec<(u64, u64)> {
        let full = self.block_size.bytes();
        let room = (self.new_blocks - self.new.len() as u64) as usize;
        for info in &blocks[..blocks.len().min(room)] {
            self.new.push(*info);
            if info.len == full {
                self.new_set.insert(info.digest);
            }
            let hashed = self.new.len() as u64;
            if hashed.is_multiple_of(REGION_BLOCKS) || hashed == self.new_blocks {
                let first = (self.new_regions.len() as u64 * REGION_BLOCKS) as usize;
                let digests: Vec<BlockDigest> =
                    self.new[first..].iter().map(|b| b.digest).collect();
                self.new_regions.push(region_digest(&digests));
            }
        }
        self.compare()
    }

    /// Whether every block of the new image is hashed.
    pub fn hashing_done(&self) -> bool {
        self.new.len() as u64 == self.new_blocks
    }

    /// The new image's block digests (all of them once hashing is done).
    pub fn new_digests(&self) -> Vec<BlockDigest> {
        self.new.iter().map(|b| b.digest).collect()
    }

    /// Region digests of the old image from region `start` (REGIONS);
    /// returns the runs of regions whose block digests to ask for (WANT).
    pub fn regions(
        &mut self,
        start: u64,
        digests: &[BlockDigest],
    ) -> Result<Vec<(u64, u64)>, PipelineError> {
        let received = self.old_region_digests.len() as u64;
        let end = start + digests.len() as u64;
        if start != received || digests.is_empty() || end > self.old_regions {
            return Err(PipelineError::Regions {
                start,
                count: digests.len(),
                expected: received,
                regions: self.old_regions,
            });
        }
        self.old_region_digests.extend_from_slice(digests);
        Ok(self.compare())
    }

    /// Compares the regions both images' digests now allow, in order;
    /// returns the runs of those that differ, to be asked for.
    fn compare(&mut self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        while self.compared < self.old_region_digests.len() as u64 {
            let region = self.compared;
            let new_region = if region * REGION_BLOCKS >= self.new_blocks {
                None
            } else if let Some(digest) = self.new_regions.get(region as usize) {
                Some(*digest)
            } else {
                // Not hashed yet.
                break;
            };
            self.compared += 1;
            if new_region == Some(self.old_region_digests[region as usize]) {
                // The same blocks as this host's: their digests are its own.
                for block in self.region_blocks(region) {
                    self.old[block as usize] = Some(self.new[block as usize].digest);
                }
                self.region_complete(region);
            } else {
                match runs.last_mut() {
                    Some((first, count)) if *first + *count == region => *count += 1,
                    _ => runs.push((region, 1)),
                }
            }
        }
        // The device answers each run with its blocks' digests, in order.
        for &(first, count) in &runs {
            let (start, end) = (
                self.region_blocks(first).start,
                self.region_blocks(first + count - 1).end,
            );
            self.wanted.push_back((start, end));
        }
        self.advance_prefix();
        runs
    }

    /// Whether every old region is compared: the last WANT may go.
    pub fn comparisons_done(&self) -> bool {
        self.compared == self.old_regions
    }

    /// Block digests of the old image from block `start` (DIGESTS), in the
    /// order they were wanted.
    pub fn digests(&mut self, start: u64, digests: &[BlockDigest]) -> Result<(), PipelineError> {
        let refused = || PipelineError::Digests {
            start,
            count: digests.len(),
        };
        let Some(&(next, end)) = self.wanted.front() else {
            return Err(refused());
        };
        let count = digests.len() as u64;
        if start != next || count == 0 || start + count > end {
            return Err(refused());
        }
        for (k, digest) in digests.iter().enumerate() {
            self.old[start as usize + k] = Some(*digest);
        }
        // Regions whose last block is now in (their first ones came before).
        let filled = start + count;
        for region in start / REGION_BLOCKS..=(filled - 1) / REGION_BLOCKS {
            if self.region_blocks(region).end <= filled {
                self.region_complete(region);
            }
        }
        if filled == end {
            self.wanted.pop_front();
        } else {
            self.wanted[0].0 = filled;
        }
        self.advance_prefix();
        Ok(())
    }

    /// Whether every old block's digest is known.
    pub fn index_complete(&self) -> bool {
        self.comparisons_done() && self.wanted.is_empty()
    }

    /// Decides the blocks the index now allows, and returns the writes
    /// among them that may go before the copies: the first block and one
    /// decision per block from it, `Same` for those not written now.
    pub fn early_writes(&mut self) -> Option<(u64, Vec<Decision>)> {
        let first = self.decisions.len() as u64;
        let complete = self.index_complete();
        // Only blocks hashed can be decided.
        while self.decisions.len() < self.new.len() {
            let index = self.decisions.len() as u64;
            let region = index / REGION_BLOCKS;
            if !complete && self.known_prefix < region + LOOKAHEAD_REGIONS + 1 {
                break;
            }
            let decision = self.decide(index);
            self.decisions.push(decision);
        }
        let mut any = false;
        let writes: Vec<Decision> = (first..self.decisions.len() as u64)
            .map(|index| {
                let decision = self.decisions[index as usize];
                let write = matches!(decision, Decision::Zero | Decision::Replace);
                if write && self.may_write_early(index) {
                    self.written_early[index as usize] = true;
                    any = true;
                    decision
                } else {
                    Decision::Same
                }
            })
            .collect();
        any.then_some((first, writes))
    }

    /// The old image's digest of block `index`, if known yet.
    pub fn old_digest(&self, index: u64) -> Option<BlockDigest> {
        self.old.get(index as usize).copied().flatten()
    }

    /// Every block decided: the decisions, and the writes still to send
    /// (`Same` where a block was written early or is no write).
    pub fn finish(mut self) -> Result<(Vec<Decision>, Vec<Decision>), PipelineError> {
        if !self.index_complete() || !self.hashing_done() {
            return Err(PipelineError::Incomplete);
        }
        while self.decisions.len() < self.new.len() {
            let decision = self.decide(self.decisions.len() as u64);
            self.decisions.push(decision);
        }
        let rest = self
            .decisions
            .iter()
            .zip(&self.written_early)
            .map(|(&decision, &early)| if early { Decision::Same } else { decision })
            .collect();
        Ok((self.decisions, rest))
    }

    fn decide(&self, index: u64) -> Decision {
        let old_here = self.old.get(index as usize).and_then(Option::as_ref);
        let decision = decide(
            self.block_size,
            self.old_len,
            old_here,
            &self.anywhere,
            index,
            &self.new[index as usize],
        );
        match decision {
            // In place, a place written early holds old bytes no more.
            Decision::Copy { from }
                if self.in_place && self.written_early.get(from as usize) == Some(&true) =>
            {
                Decision::Replace
            }
            decision => decision,
        }
    }

    /// Whether no copy can read the old bytes at `index`.
    fn may_write_early(&self, index: u64) -> bool {
        if !self.in_place {
            return true;
        }
        if self.block_size.len_of(index, self.old_len) != self.block_size.bytes() as usize {
            // Past the old image, or its short last block: never a copy's source.
            return true;
        }
        // Blocks hashed later that hold these bytes are sent as data
        // ([`Pipeline::decide`]); a block hashed already is in the set.
        match self.old.get(index as usize).and_then(Option::as_ref) {
            Some(old) => !self.new_set.contains(old),
            None => false,
        }
    }

    fn region_blocks(&self, region: u64) -> std::ops::Range<u64> {
        let old_blocks = self.old.len() as u64;
        region * REGION_BLOCKS..((region + 1) * REGION_BLOCKS).min(old_blocks)
    }

    fn region_complete(&mut self, region: u64) {
        self.region_known[region as usize] = true;
        for index in self.region_blocks(region) {
            if self.block_size.len_of(index, self.old_len) == self.block_size.bytes() as usize {
                if let Some(digest) = self.old[index as usize] {
                    self.anywhere.entry(digest).or_insert(index);
                }
            }
        }
    }

    fn advance_prefix(&mut self) {
        while (self.known_prefix as usize) < self.region_known.len()
            && self.region_known[self.known_prefix as usize]
        {
            self.known_prefix += 1;
        }
    }
}
