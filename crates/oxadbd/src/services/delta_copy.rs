//! The old file's bytes copied into the new one beside it while the delta
//! runs, from its first message on (docs/delta.md, "Building beside").
//!
//! Most of a file rebuilt beside the old one is unchanged blocks, which
//! the host sends as copies only once the index is complete; copied then,
//! a GiB inside tmpfs (0.4 to 3 GB/s on this project's VM) held up the
//! stream behind it. Copied from the start on a thread of its own, it
//! overlaps the old image's read, the host's hashing and the link. The
//! operations the host sends claim their blocks first: the copy skips a
//! claimed block, and a claimed block it already copied is simply written
//! over, as a block is claimed and the copy done under one lock.
//!
//! The copy runs at a lower priority (nice 10) until the delta waits for
//! it: it has the whole delta to finish, and on a small board the stream
//! (TLS, decompression, writes) must not wait behind it for a core.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use oxadb_delta::{BlockSize, REGION_BLOCKS};

/// What the copy thread and the operations share.
struct State {
    /// Blocks an operation writes: the copy leaves them alone.
    claimed: Vec<bool>,
    /// Regions before this one are copied.
    copied_regions: u64,
}

pub struct BackgroundCopy {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    /// Set when the delta waits for the copy: it takes its priority back.
    waited_for: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<()>>>,
    /// Blocks the copy covers: those of the first `len` bytes.
    blocks: u64,
}

impl BackgroundCopy {
    /// Starts copying the first `len` bytes of `old` into `new` at the same
    /// offsets, a region at a time.
    pub fn start(old: File, new: File, block_size: BlockSize, len: u64) -> BackgroundCopy {
        let blocks = block_size.blocks_in(len);
        let state = Arc::new(Mutex::new(State {
            claimed: vec![false; blocks as usize],
            copied_regions: 0,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let waited_for = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop, waited_for) = (state.clone(), stop.clone(), waited_for.clone());
            std::thread::Builder::new()
                .name("delta-copy".into())
                .spawn(move || {
                    let copy = CopyJob {
                        old: &old,
                        new: &new,
                        block_size,
                        len,
                    };
                    copy.run(&state, &stop, &waited_for)
                })
        };
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(error) => {
                tracing::warn!(%error, "delta: no thread for the background copy");
                None
            }
        };
        BackgroundCopy {
            state,
            stop,
            waited_for,
            thread,
            blocks,
        }
    }

    /// Whether it runs: without a thread, every copy is the host's to send
    /// and the builder applies it.
    pub fn running(&self) -> bool {
        self.thread.is_some()
    }

    /// Whether blocks `start..start + count` are all the old file's at the
    /// same place once the copy is done: the copy covers them and nothing
    /// claimed them.
    pub fn covers(&self, start: u64, count: u64) -> bool {
        if !self.running() || start + count > self.blocks {
            return false;
        }
        let state = self.state.lock().expect("the copy thread does not panic");
        !state.claimed[start as usize..(start + count) as usize]
            .iter()
            .any(|&claimed| claimed)
    }

    /// Claims blocks `start..start + count` for an operation that writes
    /// them; returns whether the copy may already have put old bytes there
    /// (a zero must then be written, not left as a hole).
    pub fn claim(&self, start: u64, count: u64) -> bool {
        if start >= self.blocks {
            return false;
        }
        let end = (start + count).min(self.blocks);
        let mut state = self.state.lock().expect("the copy thread does not panic");
        for claimed in &mut state.claimed[start as usize..end as usize] {
            *claimed = true;
        }
        start / REGION_BLOCKS < state.copied_regions
    }

    /// Waits for the copy to end.
    pub fn finish(mut self) -> io::Result<()> {
        self.waited_for.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| io::Error::other("the copy thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for BackgroundCopy {
    /// A delta that failed stops the copy before its new file goes.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the copy thread copies: the first `len` bytes of `old` into `new`.
struct CopyJob<'a> {
    old: &'a File,
    new: &'a File,
    block_size: BlockSize,
    len: u64,
}

/// The copy thread's nice value while the delta does not wait for it.
const BACKGROUND_NICE: i32 = 10;

impl CopyJob<'_> {
    fn run(
        &self,
        state: &Mutex<State>,
        stop: &AtomicBool,
        waited_for: &AtomicBool,
    ) -> io::Result<()> {
        let this_thread = Some(rustix::thread::gettid());
        // Best effort: a priority it cannot change costs time, not bytes.
        let _ = rustix::process::setpriority_process(this_thread, BACKGROUND_NICE);
        let mut lowered = true;
        let bs = u64::from(self.block_size.bytes());
        let blocks = self.block_size.blocks_in(self.len);
        let mut buffer = Vec::new();
        for region in 0..blocks.div_ceil(REGION_BLOCKS) {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            if lowered && waited_for.load(Ordering::Relaxed) {
                // Back up needs CAP_SYS_NICE; without it, the copy stays low.
                let _ = rustix::process::setpriority_process(this_thread, 0);
                lowered = false;
            }
            let first = region * REGION_BLOCKS;
            let end = (first + REGION_BLOCKS).min(blocks);
            // Held while the region is copied, so that a block claimed
            // meanwhile is written after its old bytes, never under them.
            let mut state = state
                .lock()
                .expect("the operations do not panic holding it");
            let mut block = first;
            while block < end {
                if state.claimed[block as usize] {
                    block += 1;
                    continue;
                }
                let run_start = block;
                while block < end && !state.claimed[block as usize] {
                    block += 1;
                }
                let offset = run_start * bs;
                let bytes = (block * bs).min(self.len) - offset;
                copy_range(self.old, self.new, offset, bytes, &mut buffer).map_err(|error| {
                    io::Error::new(
                        error.kind(),
                        format!("copying the old file's bytes at {offset}: {error}"),
                    )
                })?;
            }
            state.copied_regions = region + 1;
        }
        Ok(())
    }
}

/// Copies `len` bytes at `offset` of `old` to the same place in `new`:
/// in the kernel where it can, through `buffer` where it cannot.
fn copy_range(
    old: &File,
    new: &File,
    offset: u64,
    len: u64,
    buffer: &mut Vec<u8>,
) -> io::Result<()> {
    if kernel_copy(old, offset, new, offset, len)? {
        return Ok(());
    }
    buffer.resize(len as usize, 0);
    old.read_exact_at(buffer, offset)?;
    new.write_all_at(buffer, offset)
}

/// `copy_file_range`: the kernel copies (or, on btrfs and xfs, shares the
/// blocks), and the bytes never enter this process. `Ok(false)`: not
/// between these two files, nothing copied; the caller copies through
/// memory.
pub(super) fn kernel_copy(
    source: &File,
    from: u64,
    destination: &File,
    to: u64,
    len: u64,
) -> io::Result<bool> {
    let (mut from, mut to, mut left) = (from, to, len);
    while left > 0 {
        let chunk = left.min(1 << 30) as usize;
        match rustix::fs::copy_file_range(
            source,
            Some(&mut from),
            destination,
            Some(&mut to),
            chunk,
        ) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Ok(n) => left -= n as u64,
            Err(
                rustix::io::Errno::XDEV
                | rustix::io::Errno::INVAL
                | rustix::io::Errno::NOSYS
                | rustix::io::Errno::OPNOTSUPP,
            ) if left == len => return Ok(false),
            Err(error) => return Err(error.into()),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: usize = 4096;

    /// Whatever the interleaving, a block an operation claimed holds what
    /// the operation wrote, every other block the old file's, and a claim
    /// says when the copy may already have been there.
    #[test]
    fn claimed_blocks_keep_what_was_written_over_them() {
        let dir = tempfile::tempdir().unwrap();
        let blocks = 3 * REGION_BLOCKS as usize + 7;
        let old: Vec<u8> = (0..blocks * BLOCK)
            .map(|i| (i / BLOCK) as u8 ^ 0x5a)
            .collect();
        let len = old.len() as u64 - 100;
        std::fs::write(dir.path().join("old"), &old[..len as usize]).unwrap();
        for trial in 0..20u64 {
            let new_path = dir.path().join(format!("new{trial}"));
            let new = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&new_path)
                .unwrap();
            new.set_len(len).unwrap();
            let copy = BackgroundCopy::start(
                File::open(dir.path().join("old")).unwrap(),
                new.try_clone().unwrap(),
                BlockSize::DEFAULT,
                len,
            );
            assert!(copy.running());
            let mut expected = old[..len as usize].to_vec();
            // Spread over the regions, some before the copy reaches them
            // and some after, depending on the trial's pace.
            for (k, block) in (0..blocks as u64).step_by(97).enumerate() {
                let zeros = k % 2 == 0;
                let may_hold_old = copy.claim(block, 1);
                let at = block as usize * BLOCK;
                let end = (at + BLOCK).min(len as usize);
                let data = if zeros {
                    vec![0u8; end - at]
                } else {
                    vec![0xee; end - at]
                };
                if !zeros || may_hold_old {
                    new.write_all_at(&data, at as u64).unwrap();
                }
                expected[at..end].copy_from_slice(&data);
                assert!(!copy.covers(block, 1));
                if trial % 3 == 0 {
                    std::thread::yield_now();
                }
            }
            copy.finish().unwrap();
            assert!(
                std::fs::read(&new_path).unwrap() == expected,
                "trial {trial}"
            );
        }
    }
}
