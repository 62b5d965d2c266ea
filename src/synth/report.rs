//! What a synth reports: per run, as a whole, and as it goes (a progress bar).

use serde::Serialize;

/// What one run contributed to a synth.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunSynth {
    /// The run.
    pub run: String,
    /// First seq read (watermark + 1).
    pub from_seq: u64,
    /// Watermark reached.
    pub to_seq: u64,
    /// Events read.
    pub events: u64,
    /// Findings (evidence, hypotheses) among them.
    pub findings: u64,
    /// Damaged records skipped (where, which seq, why): the run's intact records are
    /// synthesized, these are not (`swarm verify --run R` and `swarm repair` tell the
    /// rest). Absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub damaged: Vec<String>,
}

/// The report of [`Store::synth`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct SynthReport {
    /// The user.
    pub user: String,
    /// Per run read.
    pub runs: Vec<RunSynth>,
    /// Passes committed.
    pub passes: u64,
    /// Source events read.
    pub events: u64,
    /// Findings classified.
    pub findings: u64,
    /// New facts.
    pub facts_new: u64,
    /// Findings that repeated a known fact exactly.
    pub matched_exact: u64,
    /// Findings that were near-duplicates of a known fact.
    pub matched_near: u64,
    /// Borderline findings the LLM step called duplicates.
    pub matched_judged: u64,
    /// New contradictions.
    pub contradictions_new: u64,
    /// Changes over time recorded (a later observation of a quantity replaced an
    /// earlier fact; semantic mode).
    pub changes_new: u64,
    /// `on: <model id>` or `off: <why>` (lexical matching within subjects).
    pub semantic: String,
    /// Facts found by two or more agents (after this synth): seed 004's cross-agent
    /// insights.
    pub facts_multi_agent: u64,
    /// Contradictions whose winner is new or changed (a decision that only changed its
    /// reason, weights or time is recorded too, not counted here).
    pub resolutions: u64,
    /// Closed runs learned from.
    pub learned_runs: Vec<String>,
    /// Sanitized copies this synth sent to the shared scope, the last pass's re-sent ones
    /// included (a copy already shared in another form is not sent again).
    pub shared_copies: u64,
    /// LLM calls made.
    pub llm_calls: u64,
    /// LLM calls that failed or timed out (the deterministic answer stood).
    pub llm_fallbacks: u64,
    /// Facts in the log after the synth.
    pub facts_total: u64,
    /// Events written to the facts log.
    pub records_written: u64,
    /// Wall time.
    pub elapsed_ms: u64,
    /// Source events per second.
    pub events_per_s: f64,
    /// Nothing new since the last synth: nothing was written.
    pub nothing_new: bool,
}

/// Progress of a long synth, for a progress bar.
#[derive(Clone, Debug, Default)]
pub struct SynthProgress {
    /// The run being read.
    pub run: String,
    /// Events read so far (all runs).
    pub events: u64,
    /// Passes committed so far.
    pub passes: u64,
}
