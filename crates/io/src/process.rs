//! Per-process settings (the allocator, the receive-memory budget) and the
//! values both command lines (`oxadbd`, `oxadb`) parse.

use std::sync::Arc;

/// Tunes glibc's allocator for bulk transfers; call once at process start.
///
/// Packet payloads are 64 KiB to 1 MiB and come and go thousands of times a
/// second. Above glibc's mmap threshold each one is a fresh mmap, so every
/// transfer pays page faults and kernel page zeroing (about 15% of the
/// daemon's CPU in a 1 GiB push, measured with perf); served from the heap they
/// reuse warm memory. The trim threshold bounds what an idle process keeps.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TOP_PAD, 16 << 20);
    }
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

/// The budget every connection of this process shares unless told otherwise.
pub fn process_budget() -> Arc<oxadb_engine::MemoryBudget> {
    static BUDGET: std::sync::OnceLock<Arc<oxadb_engine::MemoryBudget>> =
        std::sync::OnceLock::new();
    BUDGET
        .get_or_init(|| Arc::new(oxadb_engine::MemoryBudget::new(default_budget_limits())))
        .clone()
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
