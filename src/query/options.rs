//! What a read asks for: filters, bounds and visibility. Shared by the reader and the
//! index's planner, so neither imports the other for it.

use crate::event::ts::Ts;
use crate::event::EventType;

/// Which records a reader may see.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Visibility {
    /// Records before the visibility watermark: in `sync` mode, only durable ones.
    #[default]
    Visible,
    /// Every whole record in the files, durable or not (for `verify` and recovery).
    Written,
}

/// What to read.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// First seq to return.
    pub from_seq: Option<u64>,
    /// Last seq to return.
    pub to_seq: Option<u64>,
    /// Only this agent's events.
    pub agent: Option<String>,
    /// Only events of this type.
    pub kind: Option<EventType>,
    /// Only events about this subject.
    pub subject: Option<String>,
    /// Only events of this user.
    pub user: Option<String>,
    /// Only events at or after this time.
    pub since: Option<Ts>,
    /// Only events at or before this time.
    pub until: Option<Ts>,
    /// At most this many events (applied after `last`).
    pub limit: Option<usize>,
    /// Only the last this many matching events (still returned in seq order).
    pub last: Option<usize>,
    /// Never use the index: scan every frame (for comparisons and benchmarks).
    pub full_scan: bool,
    /// Skip corrupt records (each skip is recorded) instead of stopping with an error.
    pub skip_corrupt: bool,
    /// Durable-only (default) or everything written.
    pub visibility: Visibility,
    /// Read as this agent: only what the run's policy lets it see is returned.
    pub reader: Option<String>,
}
