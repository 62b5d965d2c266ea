//! The pure fold: what the events of a run mean, and its snapshots.
//!
//! - [`rules`]: the part of the fold appends are checked against under the lock (CAS,
//!   channels, conflicts, escalations, policy, pruning marks).
//! - [`state`]: `State`, the whole fold (subjects, agents, decisions, actions, ...).
//! - [`checkpoint`]: the checkpoint container (zstd body, checksummed header, atomic
//!   write) and checkpoints of `State` at frame boundaries.
//! - [`binary`]: the compact binary form of `State` that checkpoints hold.
//! - [`replay`]: the state at a seq or a time, from the newest usable checkpoint plus the
//!   log.
//! - [`summary`]: the `Summarizer` trait and the built-in extractive summary (pruning).
//!
//! Invariant: the fold is a pure function of the events in seq order: the same events
//! give byte-identical serialized state, so a checkpoint plus the later events equals a
//! replay from the start.
//! Invariant: a checkpoint is only taken at a frame boundary, and only used if the log
//! still holds that frame.
//! Never imports: `commit`, `store`, `scratchpad`, `tail`, `synth` (the fold sits below
//! the writer, which checks every append against [`rules`]).

pub(crate) mod binary;
pub mod checkpoint;
pub mod replay;
pub mod rules;
pub mod state;
pub mod summary;
