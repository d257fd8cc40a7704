//! The order that applies a plan in place, on a block device: an image must
//! never be built from its own half-overwritten blocks.
//!
//! Only copies read the old image, so the rule is: a copy reads its source
//! block before anything writes that block. Zero and Replace blocks are
//! written after every copy, which settles them. Among copies, the copy
//! that writes block B waits for every copy that reads B; copies that wait
//! on each other in a cycle (two files that swapped places) get their
//! source read into a staging slot first, as Android's snapshot merge
//! stages the COW copies it would otherwise overwrite. Each block is
//! written by one operation only, so the waits form chains and cycles,
//! and the staged blocks are one per cycle.

use std::collections::{HashMap, VecDeque};

use crate::plan::Op;

/// Where a copy reads its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// The old image's block, not yet overwritten.
    Old(u64),
    /// A staging slot, filled by an earlier [`Step::Stage`].
    Staged(usize),
}

/// One step of the copies, in the order they must run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Read old block `block` into staging slot `slot`.
    Stage { block: u64, slot: usize },
    /// Write block `block` with what `from` holds.
    Copy { block: u64, from: Read },
}

/// The copy steps of a plan applied in place. The plan's Zero and Replace
/// operations follow them, in any order; unchanged blocks need no step.
#[derive(Debug, Default)]
pub struct InPlaceSchedule {
    pub steps: Vec<Step>,
    /// Staging slots used (blocks held at once).
    pub slots: usize,
}

impl InPlaceSchedule {
    pub fn new(ops: &[Op]) -> InPlaceSchedule {
        // One entry per block that moves: (destination, source).
        let moves: Vec<(u64, u64)> = ops
            .iter()
            .filter(|op| !op.is_unchanged())
            .filter_map(|op| match *op {
                Op::Copy { start, from, count } => {
                    Some((0..count).map(move |k| (start + k, from + k)))
                }
                _ => None,
            })
            .flatten()
            .collect();
        let writer_of: HashMap<u64, usize> = moves
            .iter()
            .enumerate()
            .map(|(index, &(block, _))| (block, index))
            .collect();
        let mut readers_of: HashMap<u64, Vec<usize>> = HashMap::new();
        for (index, &(_, source)) in moves.iter().enumerate() {
            readers_of.entry(source).or_default().push(index);
        }
        // Copies still to read the block each one writes.
        let mut waiting_for: Vec<usize> = moves
            .iter()
            .map(|(block, _)| readers_of.get(block).map_or(0, Vec::len))
            .collect();
        let mut ready: VecDeque<usize> =
            (0..moves.len()).filter(|&i| waiting_for[i] == 0).collect();
        let mut done = vec![false; moves.len()];
        let mut staged: HashMap<u64, usize> = HashMap::new();
        let mut schedule = InPlaceSchedule::default();
        let mut next_unfinished = 0;
        let mut finished = 0;
        while finished < moves.len() {
            let Some(index) = ready.pop_front() else {
                // Only cycles are left: the lowest unfinished copy's block is
                // staged, so those that read it no longer hold it back.
                while done[next_unfinished] {
                    next_unfinished += 1;
                }
                let (block, _) = moves[next_unfinished];
                let slot = schedule.slots;
                schedule.slots += 1;
                schedule.steps.push(Step::Stage { block, slot });
                staged.insert(block, slot);
                waiting_for[next_unfinished] = 0;
                ready.push_back(next_unfinished);
                continue;
            };
            if done[index] {
                continue;
            }
            done[index] = true;
            finished += 1;
            let (block, source) = moves[index];
            let from = match staged.get(&source) {
                Some(&slot) => Read::Staged(slot),
                None => Read::Old(source),
            };
            schedule.steps.push(Step::Copy { block, from });
            // The copy that overwrites this one's source waits for one fewer.
            if let Some(&writer) = writer_of.get(&source) {
                if !done[writer] && waiting_for[writer] > 0 {
                    waiting_for[writer] -= 1;
                    if waiting_for[writer] == 0 {
                        ready.push_back(writer);
                    }
                }
            }
        }
        schedule
    }
}
