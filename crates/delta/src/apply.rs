//! Operations applied to stores of blocks: beside the old image (a new
//! file built next to it, so any order is right) or in place (a block
//! device, in [`InPlaceSchedule`]'s order). Every operation is checked
//! against both images' bounds first: the daemon applies what a host sent.

use std::io;

use crate::plan::Op;
use crate::schedule::{InPlaceSchedule, Read, Step};
use crate::BlockSize;

/// Somewhere blocks are read and written: a file, a block device, memory.
pub trait BlockStore {
    /// Fills `buf` with the bytes at `offset`.
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    fn write_all_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Copies `len` bytes at `from` in `source` to `to` in this store
    /// without passing them through memory, where both ends allow it (a
    /// kernel-side copy, a reflink): `Ok(false)` when they do not, and the
    /// caller reads and writes instead.
    fn copy_range_from(
        &mut self,
        source: &dyn BlockStore,
        from: u64,
        to: u64,
        len: u64,
    ) -> io::Result<bool> {
        let _ = (source, from, to, len);
        Ok(false)
    }

    /// The file behind the store, for [`BlockStore::copy_range_from`].
    fn as_file(&self) -> Option<&std::fs::File> {
        None
    }

    /// Makes `len` bytes at `offset` zero; a store may punch a hole instead.
    fn write_zeros_at(&mut self, offset: u64, len: u64) -> io::Result<()> {
        write_zeros(self, offset, len)
    }
}

/// [`BlockStore::write_zeros_at`] by plain writes of zeros, a megabyte at a
/// time: the default, and what a store that sometimes skips them falls back on.
pub fn write_zeros(
    store: &mut (impl BlockStore + ?Sized),
    offset: u64,
    len: u64,
) -> io::Result<()> {
    let zeros = vec![0u8; len.min(ZERO_CHUNK) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(zeros.len() as u64);
        store.write_all_at(offset + done, &zeros[..n as usize])?;
        done += n;
    }
    Ok(())
}

const ZERO_CHUNK: u64 = 1 << 20;

/// Blocks copied with one read and one write, beside the old image.
const COPY_CHUNK_BLOCKS: u64 = 256;

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{op} writes past the new image's {len} bytes")]
    PastNewEnd { op: String, len: u64 },
    #[error("{op} reads past the old image's {len} bytes, or a short block into a full one")]
    PastOldEnd { op: String, len: u64 },
    #[error("{op} carries {bytes} bytes, not whole blocks of {block_size} up to the image's end")]
    ReplaceLength {
        op: String,
        bytes: usize,
        block_size: u32,
    },
    #[error("reading {what} at byte {offset}: {source}")]
    Read {
        what: &'static str,
        offset: u64,
        source: io::Error,
    },
    #[error("writing the new image at byte {offset}: {source}")]
    Write { offset: u64, source: io::Error },
    #[error("{op} came after zeros or new data: in place, every copy comes first")]
    CopyAfterWrites { op: String },
    #[error("{op} is not a copy")]
    NotACopy { op: String },
}

/// The shape of an operation, for error messages (not its data).
fn describe(op: &Op) -> String {
    match op {
        Op::Copy { start, from, count } => {
            format!("COPY of {count} blocks from {from} to {start}")
        }
        Op::Zero { start, count } => format!("ZERO of {count} blocks at {start}"),
        Op::Replace { start, data } => {
            format!("REPLACE of {} bytes at block {start}", data.len())
        }
        Op::Xor { start, data } => format!("XOR of {} bytes at block {start}", data.len()),
    }
}

/// Checks that `op` stays inside both images: an old image of `old_len`
/// bytes and a new one of `new_len`.
pub fn check(op: &Op, block_size: BlockSize, old_len: u64, new_len: u64) -> Result<(), ApplyError> {
    let new_blocks = block_size.blocks_in(new_len);
    let count = op.count(block_size);
    let past_new = || ApplyError::PastNewEnd {
        op: describe(op),
        len: new_len,
    };
    if count == 0
        || op
            .start()
            .checked_add(count)
            .is_none_or(|end| end > new_blocks)
    {
        return Err(past_new());
    }
    match op {
        Op::Copy { start, from, count } => {
            // Only a run's last block can be short; it must be as long in both.
            let last = count - 1;
            let old_end = from.checked_add(last).ok_or_else(past_new)?;
            let old_bytes = block_size.len_of(old_end, old_len);
            if old_bytes == 0 || old_bytes != block_size.len_of(start + last, new_len) {
                return Err(ApplyError::PastOldEnd {
                    op: describe(op),
                    len: old_len,
                });
            }
        }
        Op::Zero { .. } => {}
        Op::Replace { start, data } | Op::Xor { start, data } => {
            let end = block_size.offset_of(*start) + data.len() as u64;
            let whole = data.len() % block_size.bytes() as usize == 0;
            if data.is_empty() || end > new_len || (!whole && end != new_len) {
                return Err(ApplyError::ReplaceLength {
                    op: describe(op),
                    bytes: data.len(),
                    block_size: block_size.bytes(),
                });
            }
            // An XOR reads the old blocks at the same place, as long as the new.
            let last = start + count - 1;
            if matches!(op, Op::Xor { .. })
                && block_size.len_of(last, old_len) != block_size.len_of(last, new_len)
            {
                return Err(ApplyError::PastOldEnd {
                    op: describe(op),
                    len: old_len,
                });
            }
        }
    }
    Ok(())
}

/// Builds the new image in `new` from `old` (left as it is) and `ops`.
/// `new` is expected to read as zeros where nothing was written (a fresh
/// file of the new length); Zero operations are written all the same.
pub fn apply_beside(
    old: &mut impl BlockStore,
    new: &mut impl BlockStore,
    block_size: BlockSize,
    old_len: u64,
    new_len: u64,
    ops: &[Op],
) -> Result<(), ApplyError> {
    for op in ops {
        apply_beside_op(old, new, block_size, old_len, new_len, op)?;
    }
    Ok(())
}

/// One operation of [`apply_beside`], as it arrives.
pub fn apply_beside_op(
    old: &mut dyn BlockStore,
    new: &mut (impl BlockStore + ?Sized),
    block_size: BlockSize,
    old_len: u64,
    new_len: u64,
    op: &Op,
) -> Result<(), ApplyError> {
    check(op, block_size, old_len, new_len)?;
    let bs = u64::from(block_size.bytes());
    match op {
        Op::Copy { start, from, count } => {
            let (read_at, write_at) = (from * bs, start * bs);
            let len = (count * bs).min(old_len - read_at);
            let copied = new
                .copy_range_from(old, read_at, write_at, len)
                .map_err(|source| ApplyError::Write {
                    offset: write_at,
                    source,
                })?;
            if copied {
                return Ok(());
            }
            let mut buffer = Vec::new();
            let mut done = 0;
            while done < *count {
                let blocks = (*count - done).min(COPY_CHUNK_BLOCKS);
                let read_at = (from + done) * bs;
                let bytes = (blocks * bs).min(old_len - read_at) as usize;
                buffer.resize(bytes, 0);
                read_old(old, read_at, &mut buffer)?;
                write(new, (start + done) * bs, &buffer)?;
                done += blocks;
            }
            Ok(())
        }
        Op::Xor { .. } => {
            let replace = resolve_xor(old, block_size, old_len, new_len, op)?;
            apply_write_op(new, block_size, new_len, &replace)
        }
        Op::Zero { .. } | Op::Replace { .. } => apply_write_op(new, block_size, new_len, op),
    }
}

/// The `Replace` an `Xor` amounts to: the old blocks at its place, read
/// from `old`, XOR its data. Applied in place, those blocks are still old:
/// only the XOR itself writes them, and copies that read them come first.
pub fn resolve_xor(
    old: &mut (impl BlockStore + ?Sized),
    block_size: BlockSize,
    old_len: u64,
    new_len: u64,
    op: &Op,
) -> Result<Op, ApplyError> {
    let Op::Xor { start, data } = op else {
        return Ok(op.clone());
    };
    check(op, block_size, old_len, new_len)?;
    let offset = block_size.offset_of(*start);
    let mut bytes = vec![0u8; data.len()];
    read_old(old, offset, &mut bytes)?;
    for (byte, delta) in bytes.iter_mut().zip(data.iter()) {
        *byte ^= delta;
    }
    Ok(Op::Replace {
        start: *start,
        data: bytes.into(),
    })
}

/// Turns the old image in `store` into the new one: the copies first, in
/// [`InPlaceSchedule`]'s order, then zeros and new data. `store` must hold
/// at least `new_len` bytes (a block device does not grow).
pub fn apply_in_place(
    store: &mut impl BlockStore,
    block_size: BlockSize,
    old_len: u64,
    new_len: u64,
    ops: &[Op],
) -> Result<(), ApplyError> {
    let (copies, writes): (Vec<Op>, Vec<Op>) = ops
        .iter()
        .cloned()
        .partition(|op| matches!(op, Op::Copy { .. }));
    apply_copies_in_place(store, block_size, old_len, new_len, &copies)?;
    for op in &writes {
        apply_write(store, block_size, old_len, new_len, op)?;
    }
    Ok(())
}

/// Every Copy of a plan applied in place, in [`InPlaceSchedule`]'s order:
/// before any Zero or Replace, which may overwrite their sources.
pub fn apply_copies_in_place(
    store: &mut (impl BlockStore + ?Sized),
    block_size: BlockSize,
    old_len: u64,
    new_len: u64,
    copies: &[Op],
) -> Result<(), ApplyError> {
    for op in copies {
        check(op, block_size, old_len, new_len)?;
        if !matches!(op, Op::Copy { .. }) {
            return Err(ApplyError::NotACopy { op: describe(op) });
        }
    }
    let bs = u64::from(block_size.bytes());
    let schedule = InPlaceSchedule::new(copies);
    let mut slots: Vec<Vec<u8>> = Vec::with_capacity(schedule.slots);
    let mut buffer = Vec::new();
    for step in &schedule.steps {
        match *step {
            Step::Stage { block, slot } => {
                debug_assert_eq!(slot, slots.len());
                let mut staged = vec![0u8; block_size.len_of(block, old_len)];
                read_old(store, block * bs, &mut staged)?;
                slots.push(staged);
            }
            Step::Copy { block, from } => {
                let data = match from {
                    Read::Old(source) => {
                        buffer.resize(block_size.len_of(source, old_len), 0);
                        read_old(store, source * bs, &mut buffer)?;
                        &buffer
                    }
                    Read::Staged(slot) => &slots[slot],
                };
                write(store, block * bs, data)?;
            }
        }
    }
    Ok(())
}

/// A Zero or Replace, checked, written into `store`: the new image beside
/// the old one, or the device once every copy is done.
pub fn apply_write(
    store: &mut (impl BlockStore + ?Sized),
    block_size: BlockSize,
    old_len: u64,
    new_len: u64,
    op: &Op,
) -> Result<(), ApplyError> {
    check(op, block_size, old_len, new_len)?;
    let op = resolve_xor(store, block_size, old_len, new_len, op)?;
    apply_write_op(store, block_size, new_len, &op)
}

fn apply_write_op(
    store: &mut (impl BlockStore + ?Sized),
    block_size: BlockSize,
    new_len: u64,
    op: &Op,
) -> Result<(), ApplyError> {
    let bs = u64::from(block_size.bytes());
    match op {
        Op::Zero { start, count } => zero(store, block_size, *start, *count, new_len),
        Op::Replace { start, data } => write(store, start * bs, data),
        Op::Copy { .. } => Err(ApplyError::CopyAfterWrites { op: describe(op) }),
        Op::Xor { .. } => unreachable!("resolved into a Replace first"),
    }
}

fn read_old(
    store: &mut (impl BlockStore + ?Sized),
    offset: u64,
    buffer: &mut [u8],
) -> Result<(), ApplyError> {
    store
        .read_exact_at(offset, buffer)
        .map_err(|source| ApplyError::Read {
            what: "the old image",
            offset,
            source,
        })
}

fn write(
    store: &mut (impl BlockStore + ?Sized),
    offset: u64,
    data: &[u8],
) -> Result<(), ApplyError> {
    store
        .write_all_at(offset, data)
        .map_err(|source| ApplyError::Write { offset, source })
}

fn zero(
    store: &mut (impl BlockStore + ?Sized),
    block_size: BlockSize,
    start: u64,
    count: u64,
    new_len: u64,
) -> Result<(), ApplyError> {
    let offset = block_size.offset_of(start);
    let len = (count * u64::from(block_size.bytes())).min(new_len - offset);
    store
        .write_zeros_at(offset, len)
        .map_err(|source| ApplyError::Write { offset, source })
}
