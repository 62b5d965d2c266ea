//! The scratchpad as tools: typed entries with their compare-and-swaps, reads from a
//! cursor, bounded context, the board, the orchestrator's pick, channels, escalations,
//! facts and advice. Each tool calls the same [`Store`] operation as the CLI, so the
//! same permission checks apply (the run's policy, for the session's agent).

use serde_json::json;

use crate::error::{Error, Result};
use crate::event::ts::Ts;
use crate::event::{EventType, NewEvent};
use crate::log::meta::Durability;
use crate::mcp::args::{
    AdviceArgs, AppendEntryArgs, BoardArgs, ContextArgs, EntryKind, EscalationsArgs, ExplainArgs,
    FactsArgs, ListRunsArgs, PickArgs, ReadChannelArgs, ReadEntriesArgs, WriteChannelArgs,
};
use crate::mcp::lookup::{clip_read, record_read};
use crate::mcp::reply::{to_json, ToolError, ToolResult};
use crate::mcp::session::Session;
use crate::query::options::ReadOptions;
use crate::store::Store;
use crate::synth::views::FactsQuery;

/// Entries `read_entries` returns at most per call.
pub const READ_LIMIT_MAX: usize = 500;
/// Bytes of entries (as JSON) one `read_entries` answer carries at most: past it the page
/// ends early, `more: true` (one entry is at most 64 KiB of content, so one always fits).
/// 250 entries of 60 KB were a 15 MB answer: over the SDK's 1 MiB event limit on HTTP,
/// and of no use to a model.
pub const READ_BYTES_MAX: usize = 512 * 1024;
/// Default byte budget of `get_context`.
pub const CONTEXT_BUDGET_DEFAULT: usize = 8000;
/// Largest byte budget of `get_context`.
pub const CONTEXT_BUDGET_MAX: usize = 1 << 20;
/// Facts `list_facts` returns at most.
pub const FACTS_LIMIT_MAX: usize = 500;
/// Runs `list_runs` lists at most.
pub const RUNS_LISTED_MAX: usize = 200;

/// Parses an RFC 3339 time argument.
pub fn parse_time(field: &str, s: &str) -> Result<Ts> {
    Ts::parse(s).ok_or_else(|| Error::invalid(field, format!("{s:?} {}", Ts::refusal(s))))
}

/// Appends `ev` and returns the stored entry and any engine event written with it (an
/// escalation). A board CAS conflict carries the subject's current version.
pub fn append_entry(store: &Store, run: &str, ev: NewEvent, durability: Durability) -> ToolResult {
    let subject = ev.subject.clone();
    let agent = ev.agent_id.clone();
    let cas = ev.expect_subject_seq.is_some();
    let expect = ev.expect_seq;
    match store.append_batch(run, vec![ev], expect, durability) {
        Ok(stored) => {
            let mut it = stored.into_iter();
            let entry = it.next();
            let engine: Vec<_> = it.collect();
            let escalation = engine
                .iter()
                .find(|e| e.kind == EventType::Escalation)
                .map(|e| e.seq);
            let mut v = json!({"stored": entry, "engine_events": engine});
            if let Some(seq) = escalation {
                v["warning"] = json!(format!(
                    "your entry was stored, but it disagrees with the standing decision or action on its subject: escalation #{seq} blocks further decisions and actions on it until a human resolves it"
                ));
            }
            Ok(v)
        }
        Err(e @ Error::Conflict(_)) if cas => {
            let current = subject
                .as_deref()
                // As the writer reads it: a subject whose latest entry it is not shown
                // says nothing of its version.
                .and_then(|s| store.board(run, Some(&agent), Some(s)).ok())
                .and_then(|b| b.first().map(|x| x.version))
                .unwrap_or(0);
            Err(ToolError::from(e).with("current_version", current))
        }
        Err(e) => Err(e.into()),
    }
}

fn new_entry(s: &Session, a: AppendEntryArgs) -> Result<(String, NewEvent)> {
    let agent = s.agent(a.agent.as_deref())?;
    let mut ev = NewEvent::new(&agent, a.kind.event_type(), a.content);
    ev.subject = a.subject;
    ev.refs = a.refs;
    ev.confidence = a.confidence;
    ev.id = a.client_id;
    ev.expect_seq = a.expect_seq;
    ev.expect_subject_seq = a.expect_subject_seq;
    ev.meta = a.meta;
    ev.session_id = a.session_id;
    Ok((a.run, ev))
}

/// Entries after a cursor, as `agent` may see them.
pub fn read_entries(s: &Session, a: ReadEntriesArgs) -> ToolResult {
    let reader = s.agent(a.agent.as_deref())?;
    let limit = match a.limit {
        Some(0) => return Err(Error::invalid("limit", "must be 1 or more").into()),
        l => l.unwrap_or(50).min(READ_LIMIT_MAX),
    };
    let after = a.after_seq.unwrap_or(0);
    let Some(from) = after.checked_add(1) else {
        // Nothing comes after the largest seq (`after + 1` wrapped to the start).
        return Ok(json!({"entries": [], "next_cursor": after, "more": false}));
    };
    let opts = ReadOptions {
        from_seq: Some(from),
        kind: a.kind.map(EntryKind::event_type),
        agent: a.from_agent,
        subject: a.subject,
        limit: Some(limit + 1),
        reader: Some(reader),
        ..ReadOptions::default()
    };
    let mut events = Vec::new();
    let (mut bytes, mut more) = (0, false);
    for e in s.store.read(&a.run, opts)? {
        let e = e?;
        let size = serde_json::to_vec(&e).map_or(0, |v| v.len());
        if events.len() == limit || (!events.is_empty() && bytes + size > READ_BYTES_MAX) {
            more = true;
            break;
        }
        bytes += size;
        events.push(e);
    }
    let next = events.last().map_or(after, |e| e.seq);
    Ok(json!({"entries": events, "next_cursor": next, "more": more}))
}

/// `append_entry`.
pub fn append(s: &Session, a: AppendEntryArgs) -> ToolResult {
    let (run, ev) = new_entry(s, a)?;
    append_entry(&s.store, &run, ev, Durability::Sync)
}

/// `get_context`.
pub fn context(s: &Session, a: ContextArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    let budget = a
        .budget_bytes
        .unwrap_or(CONTEXT_BUDGET_DEFAULT)
        .min(CONTEXT_BUDGET_MAX);
    to_json(&s.store.context(&a.run, &agent, budget)?)
}

/// `get_board`.
pub fn board(s: &Session, a: BoardArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    let b = s
        .store
        .board_with(&a.run, Some(&agent), a.subject.as_deref(), a.history)?;
    Ok(json!({"subjects": b}))
}

/// `pick_hypothesis`.
pub fn pick(s: &Session, a: PickArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    to_json(&s.store.pick(&a.run, &agent, &a.subject)?)
}

/// `write_channel`: a stale base on a `reject` channel is a conflict naming the current
/// version (to an agent that may read the channel).
pub fn write_channel(s: &Session, a: WriteChannelArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    match s.store.write_channel_with_id(
        &a.run,
        &agent,
        &a.channel,
        a.value,
        a.base_version,
        a.client_id.as_deref(),
    ) {
        Ok(e) => Ok(json!({"stored": e, "version": e.seq})),
        // The current version only for an agent that may read the channel.
        Err(e @ Error::Conflict(_)) => match s.store.channel(&a.run, Some(&agent), &a.channel) {
            Ok(c) => Err(ToolError::from(e).with("current_version", c.version)),
            Err(_) => Err(e.into()),
        },
        Err(e) => Err(e.into()),
    }
}

/// `read_channel`.
pub fn read_channel(s: &Session, a: ReadChannelArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    let mut c = s.store.channel(&a.run, Some(&agent), &a.channel)?;
    let (writes, conflicts) = (c.history.len(), c.conflicts.len());
    if !a.history {
        c.history.clear();
        c.conflicts.clear();
    }
    let mut v = to_json(&c)?;
    v["writes"] = json!(writes);
    v["conflicts_total"] = json!(conflicts);
    Ok(v)
}

/// `list_escalations`.
pub fn escalations(s: &Session, a: EscalationsArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    let e = s
        .store
        .escalations_as(&a.run, a.include_resolved, Some(&agent))?;
    Ok(json!({"escalations": to_json(&e)?}))
}

/// `list_facts`: the most confident first, at most `limit`.
pub fn facts(s: &Session, a: FactsArgs) -> ToolResult {
    let q = FactsQuery {
        subject: a.subject,
        as_of: a
            .as_of
            .as_deref()
            .map(|t| parse_time("as_of", t))
            .transpose()?,
        include_superseded: a.include_superseded,
        // Facts are drawn from every run, past each run's policy: the agent gets those
        // whose every source it may read.
        reader: Some(s.agent(a.agent.as_deref())?),
    };
    let mut ans = match s.store.facts(&q) {
        Ok(a) => a,
        Err(Error::RunNotFound(_)) => {
            return Ok(json!({"facts": [], "contradictions": [], "facts_total": 0,
                "note": "no synthesis has run for this user yet"}))
        }
        Err(e) => return Err(e.into()),
    };
    ans.facts
        .sort_by(|x, y| y.confidence.total_cmp(&x.confidence));
    let total = ans.facts.len();
    ans.facts
        .truncate(a.limit.unwrap_or(50).clamp(1, FACTS_LIMIT_MAX));
    // The contradictions of the facts returned, not of those cut.
    let kept: std::collections::BTreeSet<&str> = ans.facts.iter().map(|f| f.id.as_str()).collect();
    ans.contradictions
        .retain(|c| kept.contains(c.a.as_str()) || kept.contains(c.b.as_str()));
    let mut v = to_json(&ans)?;
    v["facts_total"] = json!(total);
    Ok(v)
}

/// `explain_fact`.
pub fn explain(s: &Session, a: ExplainArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    to_json(
        &s.store
            .explain_fact_as(&a.fact, a.limit.unwrap_or(10).clamp(1, 100), Some(&agent))?,
    )
}

/// `get_tool_advice`.
pub fn advice(s: &Session, a: AdviceArgs) -> ToolResult {
    let agent = s.agent(a.agent.as_deref())?;
    if a.tool.trim().is_empty() {
        return Err(Error::invalid("tool", "must not be empty").into());
    }
    let advice = s.store.advise_as(&a.tool, Some(&agent))?;
    let mut out = json!({"advice": to_json(&advice)?});
    if let Some(run) = &a.record_in {
        let found: Vec<String> = advice
            .iter()
            .map(|x| format!("{}:{}", x.scope, x.item.fingerprint))
            .collect();
        let tool = clip_read(&a.tool);
        let text = match advice.first() {
            Some(m) => format!(
                "applied a learned lesson for {tool}: {}",
                m.item.correction.as_deref().unwrap_or(&m.item.error)
            ),
            None => format!("no learned lesson yet for {tool}"),
        };
        let mut m = serde_json::Map::new();
        m.insert("for_tool".into(), json!(tool));
        out["recorded"] = record_read(s, run, &agent, "get_tool_advice", text, found, m);
    }
    Ok(out)
}

/// `list_runs`: at most [`RUNS_LISTED_MAX`].
pub fn runs(s: &Session, _: ListRunsArgs) -> ToolResult {
    let mut runs = Vec::new();
    for r in s
        .store
        .run_ids()?
        .into_iter()
        .filter(|r| !r.starts_with('@'))
    {
        if runs.len() == RUNS_LISTED_MAX {
            break;
        }
        runs.push(to_json(&s.store.run_info(&r)?)?);
    }
    Ok(json!({"runs": runs}))
}
