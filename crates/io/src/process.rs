//! Per-process settings (the allocator, the receive-memory budget) and the
//! values both command lines (`oxadbd`, `oxadb`) parse.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Tunes glibc's allocator for bulk transfers; call once at process start.
///
/// Packet payloads are 64 KiB to 1 MiB and come and go thousands of times a
/// second. Above glibc's mmap threshold each one is a fresh mmap, so every
/// transfer pays page faults and kernel page zeroing (about 15% of the
/// daemon's CPU in a 1 GiB push, measured with perf); served from the heap they
/// reuse warm memory. The trim threshold and top pad keep freed packets'
/// pages between transfers' bursts; an idle daemon hands them back with
/// [`Activity::trim_when_idle`].
///
/// One arena for every thread: glibc gives threads arenas of their own (up to
/// 8 per core), and a thread's arena never gives back the top of its heap
/// while the trim threshold is as large as the heap (64 MiB), not even to
/// `malloc_trim`. After eight clients had each pushed and pulled 8 MiB ten
/// times, the idle daemon kept 98 MiB with per-thread arenas (83 MiB after
/// `malloc_trim`), 41 MiB with one arena and 6 MiB with one arena after
/// `malloc_trim` (docs/benchmarks.md, "Daemon memory after load"); CPU per
/// GiB pushed and pulled did not change.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TOP_PAD, 16 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Connection activity, bumped by every read and every batch written of
/// the connections that report to it ([`Connection::report_activity_to`]),
/// and watched by [`Activity::trim_when_idle`]. Made by the binary (the
/// daemon: one for all its connections); cheap to clone.
///
/// [`Connection::report_activity_to`]: crate::Connection::report_activity_to
#[derive(Debug, Clone, Default)]
pub struct Activity(Arc<ActivityState>);

#[derive(Debug, Default)]
struct ActivityState {
    /// Reads and writes so far.
    count: AtomicU64,
    /// Set while [`Activity::trim_when_idle`] waits for the next activity,
    /// so that only the first read or write after a quiet spell pays for
    /// waking it.
    waiting: AtomicBool,
    woken: Notify,
}

impl Activity {
    /// Records that a connection moved bytes (or ended).
    pub(crate) fn note(&self) {
        let state = &*self.0;
        state.count.fetch_add(1, Ordering::SeqCst);
        if state.waiting.load(Ordering::Relaxed) && state.waiting.swap(false, Ordering::SeqCst) {
            state.woken.notify_one();
        }
    }

    /// Reads and writes noted so far.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.0.count.load(Ordering::SeqCst)
    }

    /// Returns free memory to the system once the connections have been
    /// quiet for `quiet` after moving data (see [`release_free_memory`]);
    /// runs until dropped. During transfers the allocator keeps its pages:
    /// reused warm heap is what [`tune_allocator`] is for.
    pub async fn trim_when_idle(self, quiet: std::time::Duration) {
        let state = &*self.0;
        let mut seen = state.count.load(Ordering::SeqCst);
        loop {
            // Sleep until something moves (no timer runs while the daemon idles).
            state.waiting.store(true, Ordering::SeqCst);
            if state.count.load(Ordering::SeqCst) == seen {
                state.woken.notified().await;
            }
            state.waiting.store(false, Ordering::SeqCst);
            // Then until nothing has moved for `quiet`.
            loop {
                seen = state.count.load(Ordering::SeqCst);
                tokio::time::sleep(quiet).await;
                if state.count.load(Ordering::SeqCst) == seen {
                    break;
                }
            }
            let before = resident_bytes();
            let started = std::time::Instant::now();
            if !release_free_memory() {
                return;
            }
            tracing::debug!(
                rss_before = before,
                rss_after = resident_bytes(),
                took_us = started.elapsed().as_micros() as u64,
                "idle: returned free memory to the system"
            );
        }
    }
}

/// Gives the memory the allocator holds free back to the system; returns
/// whether the allocator can be asked to (glibc's `malloc_trim`, which
/// releases the free pages inside every arena and the main heap's top: with
/// the one arena [`tune_allocator`] sets, everything free). musl maps
/// large blocks one by one and unmaps them when they are freed.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only takes the arenas' own locks.
        unsafe { libc::malloc_trim(0) };
        true
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// This process's resident set (`VmRSS`), in bytes.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The default receive-memory budget of a process: Linux's `tcp_mem`
/// proportions of the memory available at start (3/32 of it as the hard
/// limit; 48 MiB on a board with 512 MiB free). Without /proc, a small board
/// is assumed rather than a large server.
pub fn default_budget_limits() -> oxadb_engine::BudgetLimits {
    oxadb_engine::BudgetLimits::from_available_memory(available_memory().unwrap_or(256 << 20))
}

/// A credit mode as `--credit` and the `credit` config key spell it:
/// `classic`, `aosp` or `adaptive` (the names [`CreditMode`] displays).
///
/// [`CreditMode`]: oxadb_engine::CreditMode
pub fn parse_credit_mode(text: &str) -> Result<oxadb_engine::CreditMode, String> {
    use oxadb_engine::CreditMode;
    [CreditMode::Classic, CreditMode::Aosp, CreditMode::Adaptive]
        .into_iter()
        .find(|mode| mode.to_string() == text)
        .ok_or_else(|| format!("unknown credit mode '{text}' (expected classic, aosp or adaptive)"))
}

/// `bytes` for people (and logs): `64 MiB`, `1.5 GiB`, `512 B`; whole
/// numbers without a fraction, others to one decimal.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    while unit + 1 < UNITS.len() && bytes >= 1 << (10 * (unit + 1)) {
        unit += 1;
    }
    let scale = 1u64 << (10 * unit);
    if bytes.is_multiple_of(scale) {
        format!("{} {}", bytes / scale, UNITS[unit])
    } else {
        format!("{:.1} {}", bytes as f64 / scale as f64, UNITS[unit])
    }
}

/// A size such as `65536`, `64K`, `64M` or `1G` (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("bad size {text:?}: expected a number with an optional K, M or G"))?;
    let shift = match unit.trim_end_matches(['i', 'B']) {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        _ => return Err(format!("bad size unit in {text:?}: expected K, M or G")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("size {text:?} is too large"))
}
