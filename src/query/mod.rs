//! Reads: what a read asks for, the derived index that answers selective reads, the
//! checked event iterator, and `verify`.
//!
//! - [`options`]: `ReadOptions` and `Visibility`, shared by the reader and the planner.
//! - [`index`]: the per-segment index (format, planner, the in-process cell).
//! - `read`: `EventIter`: frames read in seq order, every one CRC- and seq-checked,
//!   filtered, through the index when it helps.
//! - [`verify`]: every frame of a run checked; damage and torn tails reported.
//!
//! Invariant: readers never take the append lock and never write the log.
//! Invariant: an index is never trusted over the log: a disagreement costs time, never an
//! event.
//! Never imports: `fold`, `commit`, `store` or anything above: permissions reach the
//! reader as a predicate from the store.

pub(crate) mod check;
pub mod index;
pub mod options;
pub(crate) mod read;
pub mod verify;
