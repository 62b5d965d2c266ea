//! The scratchpad.
pub mod board;
pub mod context;
pub mod prune;
