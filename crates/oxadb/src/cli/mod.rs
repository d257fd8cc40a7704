//! The `oxadb` command line: one module per group of commands.
pub mod devices;
pub mod forward;
pub mod reverse;
pub mod shell;
pub mod transfer;
