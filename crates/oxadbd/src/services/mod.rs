//! Services a host can open on the daemon (`shell:`, `exec:`, `sync:`,
//! forward targets, `reverse:`, `dev:`/`dev-raw:` device nodes,
//! `framebuffer:`, Android's device services), and the Android commands the
//! shell service answers itself: `command` routes a line, `logcat` and
//! `props` serve it, both on `invocation`'s words (dependencies go that one
//! way).
pub mod command;
pub mod delta;
mod delta_copy;
pub mod delta_index;
pub mod device;
pub mod forward;
pub mod framebuffer;
pub mod invocation;
pub mod logcat;
pub mod props;
pub mod reverse;
pub mod serial;
pub mod shell;
pub mod sync;
pub mod tcpip;
