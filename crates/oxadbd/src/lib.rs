//! oxadbd: the daemon's services and connection handling.
pub mod services;
