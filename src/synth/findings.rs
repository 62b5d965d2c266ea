//! What the driver does to each finding and to the facts it touches, free of the
//! driver's state: which entries are findings and their text and observation time, the
//! deduper rebuilt from the facts log, contradiction resolution, fact ids.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::Value;

use crate::embed::Embedder;
use crate::error::{Error, Result};
use crate::event::ts::Ts;
use crate::event::{Checked, Event, EventType, ENGINE_AGENT};
use crate::synth::dedup::{DedupConfig, Deduper, FactIdx};
use crate::synth::facts::{FactsFold, Record, FACT_TEXT_BYTES_MAX};
use crate::synth::search::is_bookkeeping;
use crate::synth::text::content_text;

pub(super) fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub(super) fn fact_id(i: usize) -> String {
    format!("F{}", i + 1)
}

/// Rebuilds the deduper from the fold: facts in number order, each with its wordings.
/// The lexical state does not depend on the order wordings arrived in (its postings are
/// sorted by fact); in semantic mode every kept wording gets its vector (embedded in
/// batches; a vector cache makes this free after the first time), added in the order
/// the deduper first took them (their insertion numbers in the facts log), because a
/// large scope's neighbour graph depends on that order. So this is the deduper that
/// wrote the log: a synth that crashed and was run again decides exactly as one that
/// was never interrupted. A log written before insertion numbers were recorded has
/// none: its vectors go in fact order (a different graph only for scopes past
/// `SemanticConfig::exact_max`, decided once and then kept). Facts are scoped by entry
/// type in semantic mode.
pub(super) fn restore(
    fold: &FactsFold,
    cfg: &DedupConfig,
    embedder: Option<&dyn Embedder>,
) -> Result<Deduper> {
    let mut d = match embedder {
        Some(_) => Deduper::new_semantic(cfg.clone()),
        None => Deduper::new(cfg.clone()),
    };
    // (insertion number if known, fact, wording)
    let mut kept: Vec<(Option<u64>, FactIdx, &str)> = Vec::new();
    for f in &fold.facts {
        let scope = if embedder.is_some() {
            f.kind.as_str()
        } else {
            f.scope()
        };
        let i = d.add_fact(scope, &f.text);
        // One number per wording, or none at all (a fact from before they were recorded).
        let ord = |j: usize| (f.ords.len() == 1 + f.variants.len()).then(|| f.ords[j]);
        kept.push((ord(0), i, &f.text));
        for (j, v) in f.variants.iter().enumerate() {
            if d.add_variant(i, v) {
                kept.push((ord(j + 1), i, v));
            }
        }
        if let Some(t) = f.last_observed.or(f.last_seen) {
            d.observe(i, t);
        }
    }
    if let Some(m) = embedder {
        if kept.iter().all(|k| k.0.is_some()) {
            // Stable: a fact's own wordings keep their order whatever the numbers say.
            kept.sort_by_key(|k| k.0);
        }
        for chunk in kept.chunks(EMBED_BATCH) {
            let texts: Vec<&str> = chunk.iter().map(|x| x.2).collect();
            for ((_, i, _), v) in chunk.iter().zip(m.embed(&texts)?) {
                d.add_vector(*i, &v);
            }
        }
    }
    Ok(d)
}

/// How far after its event an agent's `meta.observed_at` may lie (clock skew); later
/// ones are ignored.
pub(super) const OBSERVED_SKEW_US: u64 = 60_000_000;

/// When the finding was observed: the agent's `meta.observed_at` (RFC 3339) when it is
/// valid and not after the event (plus clock skew), else the event's time.
pub(super) fn observed(e: &Event) -> Ts {
    e.meta
        .as_ref()
        .and_then(|m| m.get("observed_at"))
        .and_then(Value::as_str)
        .and_then(Ts::parse)
        .filter(|t| t.0 <= e.ts.0.saturating_add(OBSERVED_SKEW_US))
        .unwrap_or(e.ts)
}

/// Findings embedded per model call.
pub(super) const EMBED_BATCH: usize = 256;

/// Entry types the synthesizer makes facts of.
fn synthesized(kind: EventType) -> bool {
    matches!(
        kind,
        EventType::Evidence | EventType::Hypothesis | EventType::Decision | EventType::ActionTaken
    )
}

/// Whether the synthesizer makes a fact of `e`: an entry of a [`synthesized`] type that
/// is not the memory's bookkeeping (a tracked tool call such as "called query_metrics:
/// ok", or a recorded memory look-up).
pub(super) fn is_finding(e: &Event) -> bool {
    synthesized(e.kind) && !is_bookkeeping(e)
}

/// The text a finding is compared by, as [`Pass::feed`] takes it (`None`: not a
/// finding, or empty).
pub(super) fn finding_text(e: &Event) -> Option<String> {
    if !is_finding(e) {
        return None;
    }
    let t = content_text(&e.content);
    let t = clip(t.trim(), FACT_TEXT_BYTES_MAX);
    (!t.is_empty()).then(|| t.to_string())
}

/// Decides every contradiction touched by `touched` facts again: evidence weight first,
/// then recency (the newer last evidence), then the newer fact. Returns the resolutions
/// whose decision changed (winner, reason, weights or time), applied to `fold`, and how
/// many of them changed the winner. A decision that kept its winner is recorded too: its
/// reason and weights were left as first decided, so the same events split into other
/// passes reported other reasons and weights.
pub(super) fn resolve(fold: &mut FactsFold, touched: &BTreeSet<usize>) -> (Vec<Record>, u64) {
    let mut todo: BTreeSet<usize> = BTreeSet::new();
    for &f in touched {
        if let Some(fact) = fold.facts.get(f) {
            todo.extend(fact.contradictions.iter().copied());
        }
    }
    let mut out = Vec::new();
    let mut new_winners = 0;
    for n in todo {
        let Some(Some(c)) = fold.contradictions.get(n) else {
            continue;
        };
        let (fa, fb) = (&fold.facts[c.a], &fold.facts[c.b]);
        let (wa, wb) = (fa.weight(), fb.weight());
        let (winner, reason) = if (wa - wb).abs() > 1e-9 {
            (if wa > wb { c.a } else { c.b }, "evidence_weight")
        } else if fa.last_seen != fb.last_seen {
            (
                if fa.last_seen > fb.last_seen {
                    c.a
                } else {
                    c.b
                },
                "recency",
            )
        } else {
            (c.a.max(c.b), "recency")
        };
        let loser = if winner == c.a { c.b } else { c.a };
        let at = fa.last_seen.max(fb.last_seen).unwrap_or(c.at);
        let (ww, wl) = if winner == c.a { (wa, wb) } else { (wb, wa) };
        let same = |(x, y): (f64, f64)| (x - ww).abs() < 1e-9 && (y - wl).abs() < 1e-9;
        if c.winner == Some(winner)
            && c.reason.as_deref() == Some(reason)
            && c.weights.is_some_and(same)
            && c.resolved_at == Some(at)
        {
            continue;
        }
        if c.winner != Some(winner) {
            new_winners += 1;
        }
        let r = Record::Resolution {
            contradiction: c.id.clone(),
            winner: fact_id(winner),
            loser: fact_id(loser),
            reason: reason.to_string(),
            weights: (ww, wl),
            at,
        };
        fold.apply_record(&r);
        out.push(r);
    }
    (out, new_winners)
}

/// An engine event of the synthesizer's (facts log, shared scope).
pub(crate) fn engine_event(
    user: &str,
    kind: EventType,
    subject: Option<String>,
    content: Value,
) -> Checked {
    Checked::engine(ENGINE_AGENT, user, kind, content, subject, Vec::new())
}

/// Bytes a JSON value takes, roughly (strings and numbers counted, structure estimated),
/// without serializing it: only frames are sized with it.
pub(super) fn approx_json_len(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len() + 2,
        Value::Array(a) => 2 + a.iter().map(|x| approx_json_len(x) + 1).sum::<usize>(),
        Value::Object(o) => {
            2 + o
                .iter()
                .map(|(k, x)| k.len() + 4 + approx_json_len(x))
                .sum::<usize>()
        }
        _ => 24,
    }
}

/// A record as JSON content.
pub(crate) fn to_value(v: &impl Serialize) -> Result<Value> {
    serde_json::to_value(v).map_err(|e| Error::invalid("synth record", e.to_string()))
}
