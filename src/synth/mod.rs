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

pub mod dedup;
pub mod metrics;
pub mod patterns;
pub mod quality;
pub mod sanitize;
pub mod text;
