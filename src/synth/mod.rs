//! The batch synthesizer (the design card's nightly job): distils raw events into
//! deduplicated, evidence-linked facts, contradictions and their resolution, and
//! investigation patterns and tool mistakes learned from closed runs.
//!
//! # Layout
//! - [`text`]: normalization of a finding's wording and its comparison signature.
//! - [`dedup`]: [`dedup::Deduper`], the in-memory engine that decides whether a finding
//!   repeats a known fact (exactly or nearly) or contradicts one. Pure, no I/O.
//! - [`quality`]: dedup precision/recall and contradiction detection on a labelled fixture.
//! - [`sanitize`]: the redactor every record passes before it reaches the shared scope.
//! - [`patterns`]: investigation patterns and tool mistakes (seed 002), a pure fold.
//! - [`metrics`]: swarm metrics of one run (seed 004).
//! - [`memory_events`]: seed 002's memory events, derived from a run's events (pure).
//! - [`facts`]: the facts log's records (passes, commits) and their fold.
//! - `driver`: `Store::synth`: passes, watermarks, the synth lock, the writer thread.
//! - `findings`: what the driver does per finding: entry types, text, observation time,
//!   the deduper rebuilt from the facts log, contradiction resolution.
//! - [`judge`]: the optional LLM step for borderline pairs.
//! - [`share`]: the shared scope: what is copied to every user, pattern books, advice.
//! - [`views`]: facts, explain, as-of, metrics of a run, read back from the facts log.
//! - [`search`]: search of the user's facts and findings, by words and (with a model) by
//!   meaning, fused by reciprocal rank.
//! - [`snapshot`]: snapshots of the facts fold at a commit (incremental work stays small).
//!
//! Invariant: the synthesizer never writes a raw run: it reads runs and writes only the
//! user's `@facts` log and the shared `system_shared_patterns/@patterns` log.
//! Invariant: a pass takes effect only when its `synth_commit` is read: facts and
//! watermarks move together or not at all.
//! Invariant: findings never leave their user; only sanitized patterns and mistakes do.

pub mod dedup;
mod driver;
pub mod eval;
pub mod facts;
mod findings;
pub mod judge;
pub mod memory_events;
pub mod metrics;
pub mod patterns;
pub mod quality;
pub mod report;
pub mod rerank;
pub mod sanitize;
pub mod search;
pub mod settings;
pub mod share;
pub mod snapshot;
pub mod text;
pub mod views;

pub use crate::event::SHARED_USER;
pub use driver::{SynthOptions, LEARNED_SUBJECT, PASS_EVENTS_MAX_DEFAULT, SHARED_RUN};
pub use facts::FACTS_RUN;
pub use judge::LlmOptions;
pub use report::{RunSynth, SynthProgress, SynthReport};
pub use settings::{SharePatterns, UserSettings};
pub use share::Scoped;
pub use views::{Explanation, FactGate, FactView, FactsAnswer, FactsQuery};
