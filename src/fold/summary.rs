//! Summaries for pruning (seed 000): the [`Summarizer`] trait the store's background
//! pruner and `swarm prune` call, and the built-in extractive summariser. Pure: no I/O
//! (a summariser that runs a command lives with the prune job, in
//! `scratchpad::prune`).

use serde_json::Value;

use crate::error::{Error, Result};
use crate::event::Event;

/// Largest summary text accepted, in bytes.
pub const SUMMARY_BYTES_MAX: usize = 16 * 1024;

/// Who writes a summary of a range of the working view.
pub trait Summarizer: Send + Sync {
    /// The name stored in the summary event (never a secret: not a command line).
    fn name(&self) -> String;
    /// The summary text of `events` (seq order), before the checks of [`summarize`].
    fn write(&self, events: &[Event]) -> Result<String>;
}

/// Runs `s` on `events` and checks what it wrote: trimmed, not empty, at most
/// [`SUMMARY_BYTES_MAX`] bytes. A failure leaves the run unchanged.
pub fn summarize(s: &dyn Summarizer, events: &[Event]) -> Result<String> {
    let text = s.write(events)?.trim().to_string();
    if text.is_empty() {
        return Err(Error::External(format!(
            "summarizer {} produced an empty summary; the run is unchanged",
            s.name()
        )));
    }
    if text.len() > SUMMARY_BYTES_MAX {
        return Err(Error::External(format!(
            "summarizer {} produced {} bytes, limit {SUMMARY_BYTES_MAX}; the run is unchanged",
            s.name(),
            text.len()
        )));
    }
    Ok(text)
}

/// Built in, deterministic, extractive: per subject, the highest-confidence and the
/// latest entries, first sentence of each.
#[derive(Clone, Copy, Debug, Default)]
pub struct Builtin;

impl Summarizer for Builtin {
    fn name(&self) -> String {
        "builtin-extractive".into()
    }

    fn write(&self, events: &[Event]) -> Result<String> {
        Ok(builtin(events))
    }
}

fn first_sentence(v: &Value) -> String {
    let s = v.as_str().map_or_else(|| v.to_string(), str::to_string);
    let end = s.find(". ").map_or(s.len(), |i| i + 1);
    let t: String = s[..end].chars().take(160).collect();
    t.replace('\n', " ")
}

fn builtin(events: &[Event]) -> String {
    use std::collections::BTreeMap;
    let mut by_subject: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for e in events {
        by_subject
            .entry(e.subject.as_deref().unwrap_or("(no subject)"))
            .or_default()
            .push(e);
    }
    let mut agents: Vec<&str> = events.iter().map(|e| e.agent_id.as_str()).collect();
    agents.sort_unstable();
    agents.dedup();
    let (first, last) = (
        events.first().map_or(0, |e| e.seq),
        events.last().map_or(0, |e| e.seq),
    );
    let mut out = format!(
        "Summary of {} entries, seqs {first}..{last}, by {}.\n",
        events.len(),
        agents.join(", ")
    );
    for (subject, evs) in by_subject {
        let mut best: Vec<&&Event> = evs.iter().collect();
        best.sort_by(|a, b| {
            b.confidence
                .unwrap_or(0.0)
                .total_cmp(&a.confidence.unwrap_or(0.0))
                .then(b.seq.cmp(&a.seq))
        });
        let mut picked: Vec<&Event> = best.into_iter().take(2).copied().collect();
        if let Some(latest) = evs.last() {
            if !picked.iter().any(|p| p.seq == latest.seq) {
                picked.push(latest);
            }
        }
        picked.sort_by_key(|e| e.seq);
        out.push_str(&format!("- {subject} ({} entries):", evs.len()));
        for e in picked {
            out.push_str(&format!(
                " [#{} {} {}] {}",
                e.seq,
                e.agent_id,
                e.kind.as_str(),
                first_sentence(&e.content)
            ));
        }
        out.push('\n');
        if out.len() > SUMMARY_BYTES_MAX - 512 {
            out.push_str("- (more subjects omitted)\n");
            break;
        }
    }
    out
}
