//! Recorded look-ups: `search_memory`, `get_recommended_investigation_strategy` and
//! `get_tool_advice` with `record_in` write what was looked up, and what was found, into
//! the investigation's run, so seed 002's memory-event stream can show `searched` and
//! `pattern_applied` (derived from the log like every other memory event:
//! `synth::memory_events`), and a replay shows what an agent knew when it acted.

use serde_json::{json, Map, Value};

use crate::event::{EventType, NewEvent};
use crate::log::meta::Durability;
use crate::mcp::session::Session;

/// Longest query or symptom text kept in a recorded look-up, in bytes.
pub const READ_TEXT_BYTES_MAX: usize = 500;
/// Ids of hits kept in a recorded look-up.
pub const READ_IDS_MAX: usize = 10;

/// Records a look-up of the memory (`search_memory`, a strategy, advice) in the
/// investigation's run `run`, as the session's `agent`: an `action_taken` entry with
/// `meta.memory_read` (the tool), `meta.hits` and `meta.found` (the ids), and no
/// `meta.tool`, so it is never a tracked call, a finding, a fact or a search hit (see
/// `synth::search::is_bookkeeping`). Never fails the look-up: its answer gets
/// `recorded: {seq}` or `recorded: {error}`.
///
/// `batch` durability, like `track_tool_call`: a look-up must not wait for an fsync,
/// and a lost record costs a line of the memory-event stream, not a finding.
pub fn record_read(
    s: &Session,
    run: &str,
    agent: &str,
    tool: &str,
    text: String,
    found: Vec<String>,
    mut extra: Map<String, Value>,
) -> Value {
    let hits = found.len();
    extra.insert("memory_read".into(), json!(tool));
    extra.insert("hits".into(), json!(hits));
    extra.insert(
        "found".into(),
        json!(found.into_iter().take(READ_IDS_MAX).collect::<Vec<_>>()),
    );
    let mut ev = NewEvent::new(agent, EventType::ActionTaken, text);
    ev.meta = Some(extra);
    match s.store.append(run, ev, Durability::Batch) {
        Ok(e) => json!({"run": run, "seq": e.seq}),
        Err(e) => json!({"run": run, "error": e.to_string()}),
    }
}

/// `s` clipped to [`READ_TEXT_BYTES_MAX`] on a char boundary.
pub fn clip_read(s: &str) -> String {
    let mut end = s.len().min(READ_TEXT_BYTES_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}
