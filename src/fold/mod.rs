//! The pure fold.
pub mod checkpoint;
pub mod replay;
pub mod rules;
pub mod state;
pub mod summary;
