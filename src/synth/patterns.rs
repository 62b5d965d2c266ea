//! Investigation patterns and tool mistakes (seed 002), learned from closed runs.
//!
//! CONTRACT (the driver relies on it):
//! - [`learn_from_run`] is a pure function of one closed run's events, in seq order.
//! - [`PatternBook`] is a pure fold of [`RunLearnings`] (`merge_run`), so the driver can
//!   store each run's learnings as one event and rebuild the book by replaying them.
//! - Fields read from events are documented in DESIGN.md ("Patterns and mistakes").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::Event;

/// A crystallized investigation (seed 002's `InvestigationPattern`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InvestigationPattern {
    /// Stable key: hash of symptom, root cause and tool sequence.
    pub fingerprint: String,
    /// The observed issue (`high_latency_checkout`).
    pub symptom_type: String,
    /// The confirmed category of the failure.
    pub root_cause_category: String,
    /// Ordered tools that led to the solution.
    pub tool_sequence: Vec<String>,
    /// Brief description of the resolution.
    pub resolution_summary: String,
    /// Times observed.
    pub occurrence_count: u64,
    /// Reinforcement score in 0..=1.
    pub confidence: f64,
}

/// A fingerprinted tool mistake, with its self-correction when one was seen.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolMistake {
    /// Stable key: hash of tool and normalized error.
    pub fingerprint: String,
    /// The tool.
    pub tool: String,
    /// Category (syntax, invalid_argument, ...).
    pub category: String,
    /// The error message, normalized.
    pub error: String,
    /// Times seen.
    pub occurrence_count: u64,
    /// What changed when a later call of the same tool succeeded.
    pub correction: Option<String>,
}

/// What one closed run teaches.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunLearnings {
    /// The run's investigation pattern, when it has one (occurrence 1).
    pub pattern: Option<InvestigationPattern>,
    /// Its tool mistakes (occurrences within the run).
    pub mistakes: Vec<ToolMistake>,
}

/// Learns from one closed run's events.
pub fn learn_from_run<'a>(_events: impl IntoIterator<Item = &'a Event>) -> RunLearnings {
    RunLearnings::default()
}

/// All patterns and mistakes learned so far: a fold of [`RunLearnings`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PatternBook {
    /// Patterns by fingerprint.
    pub patterns: BTreeMap<String, InvestigationPattern>,
    /// Mistakes by fingerprint.
    pub mistakes: BTreeMap<String, ToolMistake>,
}

impl PatternBook {
    /// Folds in one run's learnings.
    pub fn merge_run(&mut self, _l: &RunLearnings) {}

    /// Patterns for a symptom, best first.
    pub fn recommend(&self, _symptom: &str) -> Vec<&InvestigationPattern> {
        Vec::new()
    }

    /// Known mistakes of a tool, most frequent first.
    pub fn advise(&self, _tool: &str) -> Vec<&ToolMistake> {
        Vec::new()
    }
}
