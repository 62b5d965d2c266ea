//! The scratchpad of seed 000 over the store: typed entries on a shared board, channels,
//! the pick of an authoritative entry, escalations, pruning and bounded context.
//!
//! - [`board`]: policy, channels, the board of a subject, pick, resolve, escalations.
//! - [`prune`]: summaries of the oldest half of the working view (`Store::prune`), the
//!   command summariser, and `run_filter` (a command with a time limit).
//! - [`context`]: an agent's context within a byte budget.
//!
//! Invariant: every write is an append through the store (the rules decide under the
//! lock); every read is a view of the fold. Nothing here keeps state of its own.
//! Never imports: `tail`, `synth`.

pub mod board;
pub mod context;
pub mod prune;
