//! Async drivers for the engine.
