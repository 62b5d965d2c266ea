//! Reads.
pub mod index;
pub mod options;
pub(crate) mod read;
pub mod verify;
