//! The daemon's stop sequence: once told to stop (SIGTERM), no new stream
//! or push starts, and the pushes in flight get a grace period to finish
//! before the rest are aborted (their temporary files removed, so no
//! destination is ever half written).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// How long pushes in flight may take to finish after SIGTERM, by default:
/// long enough for a file in its last stretch (a few hundred MB at USB 3 or
/// gigabit rates), short enough that a restart by a package upgrade stays
/// quick. systemd's `TimeoutStopSec` in packaging/oxadbd.service exceeds it.
pub const DEFAULT_GRACE_SECS: u64 = 5;

static STOPPING: AtomicBool = AtomicBool::new(false);
/// Pushes started and not yet ended.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Pushes that completed (`OKAY`) after the stop began.
static FINISHED_WHILE_STOPPING: AtomicUsize = AtomicUsize::new(0);

/// Starts the stop: from now on new streams and pushes are refused. Returns
/// how many pushes are in flight.
pub fn begin() -> usize {
    STOPPING.store(true, Ordering::SeqCst);
    ACTIVE.load(Ordering::SeqCst)
}

/// Whether the daemon is stopping.
pub fn stopping() -> bool {
    STOPPING.load(Ordering::SeqCst)
}

/// Pushes in flight.
pub fn active_pushes() -> usize {
    ACTIVE.load(Ordering::SeqCst)
}

/// Pushes that completed since the stop began.
pub fn finished_while_stopping() -> usize {
    FINISHED_WHILE_STOPPING.load(Ordering::SeqCst)
}

/// A push in flight, counted until dropped.
#[derive(Debug)]
pub struct PushGuard(());

impl PushGuard {
    /// Counts a push that completed.
    pub fn finished(self) {
        if stopping() {
            FINISHED_WHILE_STOPPING.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Drop for PushGuard {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts a push about to start; `None` once the daemon is stopping.
/// Counted first and checked after, so that [`begin`] either sees the push
/// or the push sees the stop.
pub fn push_started() -> Option<PushGuard> {
    ACTIVE.fetch_add(1, Ordering::SeqCst);
    let guard = PushGuard(());
    (!stopping()).then_some(guard)
}
