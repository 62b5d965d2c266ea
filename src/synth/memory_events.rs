//! Memory events (seed 002's UI stream, issue 14 item 5): what the memory did, one small
//! record per action, derived from a run's events by a pure function. Nothing is stored:
//! the log is the source, so a replay, a tail or a server stream all derive the same
//! records, and every record names the run and seq of the event that caused it.
//!
//! | source event | action | category |
//! | --- | --- | --- |
//! | tracked tool call (`action_taken`, `meta.tracked`) | `tool_tracked` | `tracking` |
//! | the same call when it failed (`meta.tool_status: error`) | `stored` | `failure` |
//! | a corrected call with a lesson (`record_tool_failure_pattern`) | `pattern_learned` | `pattern` |
//! | `evidence`, or an `add_finding_to_memory` hypothesis | `stored` | `success` (`failure` for a failed tool's result) |
//! | the decision of `complete_investigation` (`meta.symptom`, `meta.root_cause`) | `pattern_learned` | `pattern` |
//!
//! | a recorded `search_memory` (`meta.memory_read`, see `src/mcp/lookup.rs`) | `searched` | `search` |
//! | a recorded strategy or advice look-up that found something | `pattern_applied` | `pattern` |
//! | the same look-up that found nothing | `searched` | `search` |
//!
//! Look-ups are reads: they appear only when the agent names the investigation they serve
//! (`record_in`), which writes them into that run. Messages of `add_session_to_memory`
//! (`meta.role`) are conversation, not findings: no record.
//!
//! **Invariant:** [`derive`] is a pure function of one event; its records carry the
//! event's run, seq and time, so they are as visible as the event (same user, same
//! policy) and never more.

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::event::{Event, EventType};

/// Longest `description` of a record, in bytes (the event holds the rest).
pub const DESCRIPTION_BYTES_MAX: usize = 280;

/// One memory event, seed 002's schema plus the seq link (`run`, `seq`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryEvent {
    /// Always `"memory"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `stored`, `searched`, `pattern_learned`, `pattern_applied` or `tool_tracked`.
    pub action: &'static str,
    /// `failure`, `success`, `pattern`, `search` or `tracking`.
    pub category: &'static str,
    /// A short title (a toast).
    pub title: String,
    /// The longer text (clipped to [`DESCRIPTION_BYTES_MAX`]).
    pub description: String,
    /// The tool involved, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// More: the agent, the subject, the tool's status and error, ...
    pub metadata: Value,
    /// The source event's time (RFC 3339, UTC).
    pub timestamp: String,
    /// The run of the source event.
    pub run: String,
    /// The seq of the source event.
    pub seq: u64,
}

fn text_of(e: &Event) -> String {
    let s = match &e.content {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    if s.len() <= DESCRIPTION_BYTES_MAX {
        return s;
    }
    let mut end = DESCRIPTION_BYTES_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn meta_str<'a>(m: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    m.get(k).and_then(Value::as_str)
}

/// The memory events of `e` (none for most events).
pub fn derive(e: &Event) -> Vec<MemoryEvent> {
    let empty = Map::new();
    let m = e.meta.as_ref().unwrap_or(&empty);
    let read = meta_str(m, "memory_read");
    let tool = meta_str(m, "tool").or(read).map(str::to_string);
    let failed = meta_str(m, "tool_status") == Some("error");
    let mut md = json!({"agent": e.agent_id, "event_type": e.kind});
    if let Some(s) = &e.subject {
        md["subject"] = json!(s);
    }
    for k in [
        "tool_status",
        "error",
        "lesson",
        "symptom",
        "root_cause",
        "resolution",
        "hits",
        "found",
        "query",
        "mode",
        "symptom",
        "for_tool",
    ] {
        if let Some(v) = m.get(k) {
            md[k] = v.clone();
        }
    }
    let rec = |action, category, title: String| MemoryEvent {
        kind: "memory",
        action,
        category,
        title,
        description: text_of(e),
        tool_name: tool.clone(),
        metadata: md.clone(),
        timestamp: e.ts.to_string(),
        run: e.run_id.clone(),
        seq: e.seq,
    };
    let name = tool.as_deref().unwrap_or("a tool");
    let mut out = Vec::new();
    if let Some(read) = read {
        let hits = m.get("hits").and_then(Value::as_u64).unwrap_or(0);
        let what = ["query", "symptom", "for_tool"]
            .iter()
            .find_map(|k| meta_str(m, k))
            .unwrap_or("?");
        out.push(match (read, hits) {
            ("search_memory", _) => rec(
                "searched",
                "search",
                format!("Memory searched: {what} ({hits} hits)"),
            ),
            ("get_recommended_investigation_strategy", 1..) => rec(
                "pattern_applied",
                "pattern",
                format!("Learned strategy applied for {what}"),
            ),
            ("get_tool_advice", 1..) => rec(
                "pattern_applied",
                "pattern",
                format!("Learned lesson applied for {what}"),
            ),
            _ => rec(
                "searched",
                "search",
                format!("Memory searched for {what}: nothing learned yet"),
            ),
        });
        return out;
    }
    let tracked = m.get("tracked").and_then(Value::as_bool) == Some(true);
    if e.kind == EventType::ActionTaken && tracked {
        out.push(rec(
            "tool_tracked",
            "tracking",
            format!("Tool call tracked: {name}"),
        ));
        if failed {
            out.push(rec(
                "stored",
                "failure",
                format!("Learning from a failure of {name}"),
            ));
        } else if m.contains_key("lesson") {
            out.push(rec(
                "pattern_learned",
                "pattern",
                format!("Self-correction learned for {name}"),
            ));
        }
        return out;
    }
    if m.contains_key("role") {
        return out;
    }
    let finding = e.kind == EventType::Evidence
        || (e.kind == EventType::Hypothesis
            && meta_str(m, "source") == Some("add_finding_to_memory"));
    if finding {
        let (category, title) = match (failed, &e.subject) {
            (true, _) => ("failure", format!("Learning from a failure of {name}")),
            (false, Some(s)) => ("success", format!("Finding stored about {s}")),
            (false, None) => ("success", "Finding stored".to_string()),
        };
        out.push(rec("stored", category, title));
    } else if e.kind == EventType::Decision
        && m.contains_key("symptom")
        && m.contains_key("root_cause")
    {
        let symptom = meta_str(m, "symptom").unwrap_or("?");
        out.push(rec(
            "pattern_learned",
            "pattern",
            format!("Investigation pattern learned for {symptom}"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ts::Ts;

    fn ev(kind: EventType, meta: Value) -> Event {
        Event {
            run_id: "inc".into(),
            seq: 7,
            ts: Ts::now(),
            id: "x".into(),
            agent_id: "sre".into(),
            user_id: "alice".into(),
            kind,
            content: json!("query_metrics failed: bad filter"),
            confidence: None,
            refs: vec![],
            subject: None,
            session_id: None,
            meta: meta.as_object().cloned(),
        }
    }

    #[test]
    fn each_source_maps_to_its_actions() {
        let actions = |e: &Event| derive(e).iter().map(|m| m.action).collect::<Vec<_>>();
        let failed = ev(
            EventType::ActionTaken,
            json!({"tracked": true, "tool": "query_metrics", "tool_status": "error"}),
        );
        assert_eq!(actions(&failed), ["tool_tracked", "stored"]);
        assert_eq!(derive(&failed)[1].category, "failure");
        assert_eq!(derive(&failed)[0].seq, 7);
        let fixed = ev(
            EventType::ActionTaken,
            json!({"tracked": true, "tool": "q", "tool_status": "ok", "lesson": "l"}),
        );
        assert_eq!(actions(&fixed), ["tool_tracked", "pattern_learned"]);
        assert_eq!(actions(&ev(EventType::Evidence, json!({}))), ["stored"]);
        assert!(actions(&ev(EventType::Evidence, json!({"role": "user"}))).is_empty());
        assert!(actions(&ev(EventType::Hypothesis, json!({}))).is_empty());
        assert!(actions(&ev(EventType::ActionTaken, json!({}))).is_empty());
        let search = ev(
            EventType::ActionTaken,
            json!({"memory_read": "search_memory", "hits": 2, "query": "pool"}),
        );
        assert_eq!(actions(&search), ["searched"]);
        assert_eq!(
            derive(&search)[0].tool_name.as_deref(),
            Some("search_memory")
        );
        let strategy = |hits: u64| {
            ev(
                EventType::ActionTaken,
                json!({"memory_read": "get_recommended_investigation_strategy", "hits": hits, "symptom": "s"}),
            )
        };
        assert_eq!(actions(&strategy(1)), ["pattern_applied"]);
        assert_eq!(actions(&strategy(0)), ["searched"]);
        let advice = ev(
            EventType::ActionTaken,
            json!({"memory_read": "get_tool_advice", "hits": 1, "for_tool": "q"}),
        );
        assert_eq!(actions(&advice), ["pattern_applied"]);
        let done = ev(
            EventType::Decision,
            json!({"symptom": "s", "root_cause": "r"}),
        );
        assert_eq!(actions(&done), ["pattern_learned"]);
    }
}
