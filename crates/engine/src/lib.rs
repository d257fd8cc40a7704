//! Sans-I/O ADB connection engine.
