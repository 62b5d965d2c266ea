//! The index: a derived, rebuildable lookup structure beside each run's log.
//!
//! For every segment of the log it keeps the frames (first seq, byte offset, last ts) and
//! the postings of four fields (`type`, `agent_id`, `user_id`, `subject`): for each value,
//! the sorted seqs of the events that carry it. A read with a selective filter intersects
//! the postings, maps the hits to frames and reads only those frames (seek by offset);
//! `from_seq`/`since` become a seek to the first frame that can match.
//!
//! # Who keeps it current
//! Appends never touch the index: the writer's hot path stays exactly as fast as without
//! one. Readers catch the index up instead: when a [`crate::Store`] reads a run it extends
//! its in-memory index from the position it covers to the log's visible position, reading
//! only the new frames (a fast path costs one comparison when nothing was appended). The
//! index is persisted under `<run>/index/` when a segment is sealed (complete and followed
//! by a newer one), when the active segment has [`PERSIST_EVENTS_MIN`] events more than the
//! file on disk, and on an explicit flush or rebuild, under `<run>/index/LOCK` taken with a
//! non-blocking `try_lock`: a reader that does not get it keeps its caught-up copy in
//! memory and never waits for another process.
//!
//! # Never trusted
//! A file is used only if its header and body checksums, format version, run creation time
//! and segment base match, and the log still holds at the recorded position the frame the
//! index ends with (segment long enough, same frame CRC and length there). Anything else is
//! discarded with a warning and rebuilt from the log. Reads check every frame they fetch
//! against the index (CRC, seqs, count, ts); a disagreement invalidates the index and the
//! read goes on by scanning the segment from its start, so a wrong index can cost time but
//! never an event. The byte-exact format is in `docs/index.md`.

//!
//! Invariant: appends never touch the index; only readers extend it.
//! Invariant: an index entry is never trusted over the log: every frame a read fetches is
//! checked, and a disagreement drops the index, never an event.
//! Never imports: `commit`, `fold`, `store` or anything above (it is derived from the
//! log's bytes alone).

pub(crate) mod cell;
pub(crate) mod format;
pub(crate) mod plan;

pub use cell::IndexStats;
pub(crate) use cell::{IndexCell, IndexSnapshot};
pub use format::{
    index_file_name, INDEX_DIR, INDEX_FILE_BYTES_MAX, INDEX_FORMAT_VERSION, INDEX_HEADER_LEN,
    PERSIST_EVENTS_MIN,
};
pub(crate) use plan::{useful_for, Access, Plan, ReadRun};
