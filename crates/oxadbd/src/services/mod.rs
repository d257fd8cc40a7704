//! Services a host can open on the daemon (`shell:`, `exec:`, `sync:`, forward targets, `reverse:`).
pub mod forward;
pub mod reverse;
pub mod shell;
pub mod sync;
