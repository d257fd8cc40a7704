//! ADB wire formats. No I/O: everything here turns bytes into values and back.
pub mod shell;
pub mod sync;
