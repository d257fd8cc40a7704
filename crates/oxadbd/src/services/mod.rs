//! Services a host can open on the daemon (`shell:`, `exec:`, `sync:`, forward targets).
pub mod forward;
pub mod shell;
pub mod sync;
