//! Seed 002's memory tools on the engine: search, findings, completing an investigation
//! (close, synthesize, learn), tool failure patterns, recommended strategies, tool-call
//! tracking, whole agent turns, and anti-pattern detection. Everything is stored as
//! ordinary entries of the investigation's run, with the `meta` fields the synthesizer
//! reads (`src/synth/patterns.rs`), so what an agent records here is what `swarm synth`
//! learns from.
//!
//! Tool calls (`track_tool_call`, `record_tool_failure_pattern`) are `action_taken`
//! entries with `meta.tracked: true` and no subject: they count in the learned tool
//! sequences and mistakes, never become facts (the synthesizer makes facts of hypotheses
//! and evidence only) and never take part in the board or its escalations.

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::event::{EventType, NewEvent, BATCH_EVENTS_MAX};
use crate::log::meta::Durability;
use crate::mcp::anti;
use crate::mcp::args::{
    AntiArgs, CallStatus, CompleteArgs, EntryKind, FailurePatternArgs, FindingArgs, MessageRole,
    SearchArgs, SessionArgs, StrategyArgs, TrackArgs,
};
use crate::mcp::lookup::{clip_read, record_read};
use crate::mcp::reply::{to_json, ToolResult};
use crate::mcp::scratch::{append_entry, parse_time};
use crate::mcp::session::Session;
use crate::query::options::ReadOptions;
use crate::synth::search::{self, Found, Ranker, SearchQuery};
use crate::synth::SynthOptions;

/// Longest text of one message or tool result stored by `add_session_to_memory`, in bytes.
pub const SESSION_TEXT_BYTES_MAX: usize = 16 * 1024;
/// Entries of a run `detect_agent_anti_patterns` reads at most (the latest).
pub const ANTI_EVENTS_MAX: usize = 20_000;

fn meta(v: Value) -> Option<Map<String, Value>> {
    v.as_object().cloned()
}

fn clip(s: &str) -> String {
    if s.len() <= SESSION_TEXT_BYTES_MAX {
        return s.to_string();
    }
    let mut end = SESSION_TEXT_BYTES_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A tracked tool call as an entry.
fn call_entry(
    agent: &str,
    tool: &str,
    args: Option<Map<String, Value>>,
    status: CallStatus,
    error: Option<&str>,
    text: String,
) -> NewEvent {
    let mut m = json!({"tool": tool, "tool_status": status.as_str(), "tracked": true});
    if let Some(a) = args {
        m["args"] = Value::Object(a);
    }
    if let Some(e) = error {
        m["error"] = json!(e);
    }
    let mut ev = NewEvent::new(agent, EventType::ActionTaken, text);
    ev.meta = meta(m);
    ev
}

/// `complete_investigation`: closes the run and, with `learn`, synthesizes it; returns
/// what was closed and learned.
pub fn complete(s: &Session, a: CompleteArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    for (field, v) in [
        ("symptom", &a.symptom),
        ("root_cause", &a.root_cause),
        ("resolution", &a.resolution),
    ] {
        if v.trim().is_empty() {
            return Err(Error::invalid(field, "must not be empty").into());
        }
    }
    let text = format!(
        "investigation complete: root cause {}; resolution: {}",
        a.root_cause, a.resolution
    );
    // Only an admin of the run closes it: asked first, so that a refused close leaves
    // no closing decision behind.
    match s.store.head_state(&a.run) {
        Ok(h) if !h.state.rules.is_admin(&agent) => {
            return Err(Error::Forbidden(format!(
                "agent {agent:?} may not close the run (needs admin)"
            ))
            .into())
        }
        Ok(_) => {}
        // A typo must not create, close and archive a run nobody wrote to.
        Err(e) => return Err(e.into()),
    }
    let mut ev = NewEvent::new(&agent, EventType::Decision, text);
    ev.subject = a.subject;
    ev.meta = meta(json!({
        "symptom": a.symptom, "root_cause": a.root_cause, "resolution": a.resolution,
    }));
    let decision = s.store.append(&a.run, ev, Durability::Sync)?;
    let archive = s.store.close_run(&a.run, &agent)?;
    let mut out = json!({
        "decision": decision,
        "closed": {"head_seq": archive.head_seq, "records": archive.records},
    });
    if a.defer_learning {
        out["learning"] = json!("deferred: the next `swarm synth` learns from this run");
        return Ok(out);
    }
    let opts = SynthOptions {
        runs: Some(vec![a.run.clone()]),
        ..SynthOptions::default()
    };
    match s.store.synth(&opts, |_| {}) {
        Ok(r) => {
            let pattern = s
                .store
                .patterns_as(&a.symptom, Some(&agent))?
                .into_iter()
                // This symptom's own pattern, not the first that shares a word with it.
                .find(|p| {
                    p.scope == "private"
                        && p.item.symptom_type == crate::synth::patterns::slugify(&a.symptom)
                });
            out["learning"] = json!({"facts_new": r.facts_new, "pattern": pattern});
            // Figures over all the user's runs (facts in the log, copies re-sent for
            // earlier runs) would tell an agent of runs it may not read: an admin's only.
            if s.admin {
                out["learning"]["facts_total"] = json!(r.facts_total);
                out["learning"]["shared_copies"] = json!(r.shared_copies);
            }
            if pattern_missing(&out) {
                out["learning"]["note"] = json!("no pattern: a pattern needs a symptom, a root cause and at least one successful tool call in the run (track_tool_call)");
            }
        }
        // Another synth of this user holds the lock: it (or the next) learns the run.
        Err(Error::Conflict(e)) => {
            out["learning"] = json!(format!("deferred: {e}; the next synth learns this run"))
        }
        Err(e) => return Err(e.into()),
    }
    Ok(out)
}

fn pattern_missing(out: &Value) -> bool {
    out["learning"]["pattern"].is_null()
}

fn session_batch(s: &Session, a: &SessionArgs) -> Result<Vec<NewEvent>> {
    let agent = s.agent(a.agent.as_deref())?;
    let mut batch = Vec::new();
    for (i, m) in a.messages.iter().enumerate() {
        let kind = match m.role {
            MessageRole::User => EventType::Evidence,
            MessageRole::Assistant => EventType::Hypothesis,
            MessageRole::System => continue,
        };
        if m.content.trim().is_empty() {
            continue;
        }
        let mut ev = NewEvent::new(&agent, kind, clip(&m.content));
        let role = if m.role == MessageRole::User {
            "user"
        } else {
            "assistant"
        };
        ev.meta = meta(json!({"role": role, "turn_message": i}));
        batch.push(ev);
    }
    for (i, t) in a.tool_results.iter().enumerate() {
        let ev = match t.result.as_deref().filter(|r| !r.trim().is_empty()) {
            Some(r) => {
                let mut ev = NewEvent::new(&agent, EventType::Evidence, clip(r));
                let mut m = json!({"tool": t.tool, "tool_status": t.status.as_str(), "turn_tool_result": i});
                if let Some(args) = &t.args {
                    m["args"] = Value::Object(args.clone());
                }
                if let Some(e) = &t.error {
                    m["error"] = json!(e);
                }
                ev.meta = meta(m);
                ev
            }
            None => {
                let text = match &t.error {
                    Some(e) => format!("{} failed: {e}", t.tool),
                    None => format!("called {}: {}", t.tool, t.status.as_str()),
                };
                call_entry(
                    &agent,
                    &t.tool,
                    t.args.clone(),
                    t.status,
                    t.error.as_deref(),
                    text,
                )
            }
        };
        batch.push(ev);
    }
    if batch.is_empty() {
        return Err(Error::invalid(
            "messages",
            "nothing to store: give user or assistant messages or tool results",
        ));
    }
    if batch.len() > BATCH_EVENTS_MAX {
        return Err(Error::invalid(
            "messages",
            format!(
                "{} entries, at most {BATCH_EVENTS_MAX} per turn",
                batch.len()
            ),
        ));
    }
    for (i, ev) in batch.iter_mut().enumerate() {
        ev.session_id = a.session_id.clone();
        ev.id = a.turn_id.as_ref().map(|t| format!("{t}.{i}"));
    }
    Ok(batch)
}

/// `search_memory`: the library's search as the session's agent.
pub fn search_memory(s: &Session, a: SearchArgs) -> ToolResult {
    let filters = ReadOptions {
        agent: a.from_agent,
        kind: a.kind.map(EntryKind::event_type),
        subject: a.subject,
        since: a
            .since
            .as_deref()
            .map(|t| parse_time("since", t))
            .transpose()?,
        until: a
            .until
            .as_deref()
            .map(|t| parse_time("until", t))
            .transpose()?,
        reader: Some(s.agent(a.agent.as_deref())?),
        ..ReadOptions::default()
    };
    let agent = filters.reader.clone().unwrap_or_default();
    let q = SearchQuery {
        text: &a.query,
        run: a.run.as_deref(),
        filters,
        limit: a.limit.unwrap_or(10),
        facts: true,
    };
    let answer = search::search(
        &s.store,
        &q,
        Ranker::new(s.embedder.as_deref(), &s.no_model_reason),
    )?;
    let mut out = to_json(&answer)?;
    if let Some(run) = &a.record_in {
        let found = answer
            .hits
            .iter()
            .map(|h| match &h.found {
                Found::Fact { fact } => fact.id.clone(),
                Found::Finding { entry } => format!("{}:{}", entry.run_id, entry.seq),
            })
            .collect();
        let query = clip_read(&a.query);
        let mut m = Map::new();
        m.insert("query".into(), json!(query));
        m.insert("mode".into(), json!(answer.mode));
        let text = format!(
            "searched the memory for \"{query}\": {} hits",
            answer.hits.len()
        );
        out["recorded"] = record_read(s, run, &agent, "search_memory", text, found, m);
    }
    Ok(out)
}

/// `add_finding_to_memory`: an evidence (or, inferred, a hypothesis) entry.
pub fn add_finding(s: &Session, a: FindingArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    let kind = match a.inferred {
        true => EventType::Hypothesis,
        false => EventType::Evidence,
    };
    let mut ev = NewEvent::new(&agent, kind, a.finding);
    ev.subject = a.subject;
    ev.confidence = a.confidence;
    ev.id = a.client_id;
    let mut m = json!({"source": "add_finding_to_memory"});
    if let Some(t) = a.tool {
        m["tool"] = json!(t);
        m["tool_status"] = json!("ok");
    }
    ev.meta = meta(m);
    append_entry(&s.store, &a.run, ev, Durability::Sync)
}

/// `record_tool_failure_pattern`: the failing call and, when given, the corrected one, as
/// one batch of tracked calls.
pub fn record_failure(s: &Session, a: FailurePatternArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    let failed = format!("{} failed: {}", a.tool, a.error);
    let mut batch = vec![call_entry(
        &agent,
        &a.tool,
        a.failed_args,
        CallStatus::Error,
        Some(&a.error),
        failed,
    )];
    if let Some(c) = a.corrected_args {
        let text = match &a.lesson {
            Some(l) => format!("{} succeeded after a correction: {l}", a.tool),
            None => format!("{} succeeded after a correction", a.tool),
        };
        let mut ok = call_entry(&agent, &a.tool, Some(c), CallStatus::Ok, None, text);
        if let (Some(l), Some(m)) = (&a.lesson, ok.meta.as_mut()) {
            m.insert("lesson".into(), json!(l));
        }
        batch.push(ok);
    }
    // Recorded after the fact: the synthesizer does not count a failure the run already
    // tracked twice, and the anti-pattern detector does not take these for calls.
    for e in &mut batch {
        if let Some(m) = e.meta.as_mut() {
            m.insert("retrospective".into(), json!(true));
        }
    }
    let stored = s
        .store
        .append_batch(&a.run, batch, None, Durability::Sync)?;
    Ok(json!({
        "stored": stored,
        "learned_when": "complete_investigation (or the next swarm synth after the run is closed)",
    }))
}

/// `get_recommended_investigation_strategy`.
pub fn strategy(s: &Session, a: StrategyArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    let mut p = s.store.patterns_as(&a.symptom, Some(&agent))?;
    p.retain(|x| !a.own_only || x.scope == "private");
    p.truncate(a.limit.unwrap_or(5).clamp(1, 50));
    let mut out = json!({"symptom": a.symptom, "strategies": to_json(&p)?});
    if let Some(run) = &a.record_in {
        let found: Vec<String> = p
            .iter()
            .map(|x| format!("{}:{}", x.scope, x.item.fingerprint))
            .collect();
        let symptom = clip_read(&a.symptom);
        let text = match p.first() {
            Some(best) => format!(
                "applied a learned strategy for {symptom}: {} ({})",
                best.item.tool_sequence.join(" -> "),
                best.item.root_cause_category
            ),
            None => format!("no learned strategy yet for {symptom}"),
        };
        let mut m = Map::new();
        m.insert("symptom".into(), json!(symptom));
        out["recorded"] = record_read(
            s,
            run,
            &agent,
            "get_recommended_investigation_strategy",
            text,
            found,
            m,
        );
    }
    Ok(out)
}

/// `track_tool_call`: never an error (a call that cannot be recorded says so in its answer).
pub fn track(s: &Session, a: TrackArgs) -> ToolResult {
    Ok(try_track(s, a).unwrap_or_else(|e| json!({"recorded": false, "reason": e.to_string()})))
}

fn try_track(s: &Session, a: TrackArgs) -> Result<Value> {
    let agent = s.agent(a.agent.as_deref())?;
    let text = match (&a.error, a.status) {
        (Some(e), CallStatus::Error) => format!("{} failed: {e}", a.tool),
        _ => format!("called {}: {}", a.tool, a.status.as_str()),
    };
    let mut ev = call_entry(&agent, &a.tool, a.args, a.status, a.error.as_deref(), text);
    ev.id = a.call_id;
    // `batch`: acknowledged after the write, fsynced within 10 ms: tracking must not
    // slow the agent down, and a lost tracking record costs a learning, not a finding.
    let e = s.store.append(&a.run, ev, Durability::Batch)?;
    let mut out = json!({"recorded": true, "seq": e.seq});
    if a.status == CallStatus::Error {
        if let Ok(advice) = s.store.advise_as(&a.tool, Some(&agent)) {
            if !advice.is_empty() {
                out["advice"] = serde_json::to_value(advice).unwrap_or(Value::Null);
            }
        }
    }
    Ok(out)
}

/// `add_session_to_memory`.
pub fn add_session(s: &Session, a: SessionArgs) -> ToolResult {
    let batch = session_batch(s, &a)?;
    let stored = s
        .store
        .append_batch(&a.run, batch, None, Durability::Sync)?;
    let seqs: Vec<u64> = stored.iter().map(|e| e.seq).collect();
    Ok(json!({"stored": seqs.len(), "seqs": seqs}))
}

/// `detect_agent_anti_patterns`.
pub fn anti_patterns(s: &Session, a: AntiArgs) -> ToolResult {
    let reader = s.agent(a.agent.as_deref())?;
    let opts = ReadOptions {
        last: Some(ANTI_EVENTS_MAX),
        reader: Some(reader),
        ..ReadOptions::default()
    };
    let events: Vec<_> = s.store.read(&a.run, opts)?.collect::<Result<_>>()?;
    let calls = events
        .iter()
        .filter(|e| anti::tool_call(e).is_some())
        .count();
    let found: Vec<_> = anti::detect(&events)
        .into_iter()
        .filter(|p| a.of_agent.as_ref().is_none_or(|x| *x == p.agent))
        .collect();
    Ok(json!({"run": a.run, "tool_calls": calls, "anti_patterns": found}))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::Store;

    /// `complete_investigation` answered an agent `facts_total`, the facts of all the
    /// user's runs, runs the agent may not read included; an admin session keeps it.
    #[test]
    fn complete_tells_an_agent_no_totals_over_other_runs() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("data"))
            .unwrap()
            .with_user("alice", false)
            .unwrap();
        let store = Arc::new(store);
        let finding = |run: &str, text: &str| {
            let mut e = NewEvent::new("lead", EventType::Evidence, text.to_string());
            e.subject = Some(format!("{run}-db"));
            store.append(run, e, Durability::Sync).unwrap();
        };
        for (i, text) in ["disk full on ingest", "cert expired on edge", "dns flap"]
            .iter()
            .enumerate()
        {
            finding(&format!("other{i}"), text);
        }
        store.synth(&SynthOptions::default(), |_| {}).unwrap();
        let complete_as = |admin: bool, run: &str| {
            finding(run, "pool exhausted at 40");
            let s = Session::new(store.clone(), vec!["lead".into()])
                .unwrap()
                .with_admin(admin);
            let a: CompleteArgs = serde_json::from_value(json!({
                "run": run, "symptom": "slow_checkout", "root_cause": "pool",
                "resolution": "raised the pool",
            }))
            .unwrap();
            complete(&s, a).unwrap()["learning"].clone()
        };
        let agent = complete_as(false, "r");
        assert!(agent["facts_new"].as_u64().is_some(), "{agent}");
        assert!(agent.get("facts_total").is_none(), "{agent}");
        assert!(agent.get("shared_copies").is_none(), "{agent}");
        let admin = complete_as(true, "r2");
        assert!(admin["facts_total"].as_u64().unwrap() > 3, "{admin}");
    }
}
