//! swarm-memory: an event-sourced shared memory engine for swarms of concurrent agents.
//!
//! One durable, append-only, CRC-framed JSONL log per run, which many OS processes append
//! to under a file lock; everything else is derived from it.
//!
//! # Layout
//! - [`event`]: the entry schema and its limits.
//! - [`frame`]: the byte-exact line format (length + CRC-32 per atomic commit).
//! - [`segment`]: segment files and the streaming frame reader.
//! - `log`: the writer: multi-process appends, group commit, torn-tail repair.
//! - [`watermark`]: the durable and visible positions shared by all processes.
//! - [`index`]: the derived per-run index (frames, postings, time), caught up by readers.
//! - `read`: ordered, checked, filtered reads and `verify`.
//! - [`state`]: the pure fold that gives events their meaning.
//! - [`checkpoint`]: zstd snapshots of the state at frame boundaries.
//! - [`replay`]: the state at any seq or time, from a checkpoint plus the log.
//! - [`store`]: the public handle over a data directory.
//! - [`tail`]: the live tail: catch up from the log, then follow it (iterator and `Stream`).
//! - [`storage`]: the I/O trait every file access goes through (real and fault-injecting).
//! - [`synth`]: the batch synthesizer: deduplicated, evidence-linked facts, contradictions,
//!   patterns and mistakes, the sanitizer, swarm metrics.
//!
//! # Example
//! ```
//! use swarm_memory::{Store, NewEvent, EventType, Durability, ReadOptions};
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path()).unwrap();
//! let ev = store
//!     .append("incident-1", NewEvent::new("db-agent", EventType::Evidence, "disk full on db-1"), Durability::Sync)
//!     .unwrap();
//! assert_eq!(ev.seq, 1);
//! let all: Vec<_> = store.read("incident-1", ReadOptions::default()).unwrap().collect::<Result<_, _>>().unwrap();
//! assert_eq!(all[0].content, "disk full on db-1");
//! ```

#![warn(missing_docs)]

pub mod commit;
pub mod error;
pub mod event;
pub mod fold;
pub mod log;
pub mod query;
pub mod scratchpad;
pub mod store;
pub mod synth;
pub mod tail;

pub use error::{Error, Result};
pub use event::ts::Ts;
pub use event::{Event, EventType, NewEvent};
pub use fold::replay::{ReplayStats, Replayed, Target};
pub use fold::state::State;
pub use log::meta::{Durability, LogOptions, RunMeta, SEGMENT_BYTES_DEFAULT};
pub use log::storage::{FsStorage, MemStorage, Storage};
pub use query::index::IndexStats;
pub use query::options::{ReadOptions, Visibility};
pub use query::read::{EventIter, Skipped, TornTail};
pub use query::verify::{RepairedTail, VerifyReport};
pub use scratchpad::board::{BoardEntry, EscalationView, PickOutcome};
pub use store::{RunInfo, Store};
pub use tail::{Cursor, Tail, TailOptions, TailPosition, TailStream};
