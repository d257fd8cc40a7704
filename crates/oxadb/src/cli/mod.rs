//! The `oxadb` command line: one module per group of commands.
pub mod devices;
pub mod forward;
pub mod framebuffer;
pub mod raw;
pub mod reverse;
pub mod shell;
pub mod transfer;
