//! The `oxadb` command line: one module per group of commands.
pub mod connect;
pub mod delta;
pub mod device_services;
pub mod devices;
pub mod endpoint;
pub mod forward;
pub mod framebuffer;
pub mod host_server;
pub mod pair;
pub mod raw;
pub mod reverse;
pub mod server;
pub mod settings;
pub mod shell;
pub mod state;
pub mod through_server;
pub mod transfer;
