//! The `oxadb` command line: one module per group of commands.
pub mod connect;
pub mod device_services;
pub mod devices;
pub mod forward;
pub mod framebuffer;
pub mod pair;
pub mod raw;
pub mod reverse;
pub mod server;
pub mod settings;
pub mod shell;
pub mod state;
pub mod transfer;
