//! swarm-memory: an event-sourced shared memory engine for swarms of concurrent agents.
//!
//! One durable, append-only, CRC-framed JSONL log per run, which many OS processes append
//! to under a file lock; everything else is derived from it.
//!
//! # Layout
//! Folders are layers; imports run one way, from the top of this list to the bottom
//! (checked in CI by `.ci/layout.py`).
//! - `serve` (feature `server`): `swarm serve`, the HTTP API, the SSE tail and bearer
//!   tokens; a front door above every other layer.
//! - `mcp` (feature `mcp`): the MCP server: memory tools, scratchpad tools, run resources.
//! - [`synth`]: the batch synthesizer: facts, contradictions, patterns, the shared scope;
//!   search of a user's facts and findings (words and meaning, `synth::search`).
//! - [`tail`]: the live tail: catch up from the log, then follow it (iterator, `Stream`).
//! - [`scratchpad`]: board, pick, channels, policy, escalations, pruning, context.
//! - [`store`]: [`Store`], the public handle over a data directory; archives, time travel.
//! - [`commit`]: the multi-process writer: the append path, group commit (where an
//!   append is made durable: `commit/group.rs`), recovery and torn-tail repair
//!   (`commit/recovery.rs`).
//! - [`fold`]: the pure fold (rules, state), checkpoints, replay, summaries.
//! - [`query`]: read options, the derived index and its planner, checked reads, verify.
//! - [`log`]: bytes on disk: the storage seam, frames, segments, the `SYNCED` marks,
//!   `run.json`.
//! - [`embed`]: sentence embeddings: the [`embed::Embedder`] seam, the local model
//!   (feature `semantic`), the vector cache.
//! - [`event`]: the data model (events, types, limits, timestamps); [`error`]: the error
//!   type every layer returns.
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
pub mod embed;
pub mod error;
pub mod event;
pub mod fold;
pub mod log;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod query;
pub mod scratchpad;
#[cfg(feature = "server")]
pub mod serve;
pub mod store;
pub mod synth;
pub mod tail;

pub use commit::SyncCounters;
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
pub use scratchpad::board::{BoardEntry, EscalationView, PickOutcome, BOARD_HISTORY};
pub use store::{HandoffCounters, RunInfo, Store};
pub use tail::{Cursor, Tail, TailOptions, TailPosition, TailStream};
