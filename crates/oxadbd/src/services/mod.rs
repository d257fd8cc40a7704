//! Services a host can open on the daemon (`shell:`, `exec:`, `sync:`,
//! forward targets, `dev:`/`dev-raw:` device nodes, `framebuffer:`).
pub mod forward;
pub mod framebuffer;
pub mod serial;
pub mod shell;
pub mod sync;
