//! Agent anti-patterns (seed 002's `detect_agent_anti_patterns`), found in the engine's
//! own record of tool calls instead of a vendor's trace store. A pure function of a run's
//! entries in seq order.
//!
//! A *tool call* is an entry with `meta.tool` (from `track_tool_call`, `add_session_to_memory`,
//! `record_tool_failure_pattern`, or a client's own meta); it failed when
//! `meta.tool_status` is `"error"` (or, without a status, when `meta.error` is set). A
//! *finding* is a client entry that is not a tracked call (`meta.tracked`).
//!
//! | kind | rule |
//! |---|---|
//! | `repeated_failing_call` | one agent made the same call (tool and arguments) that failed, and it failed again: [`REPEAT_FAILURES_MIN`] failures or more |
//! | `known_failing_parameters` | an agent called a tool with arguments that had already failed for another agent of the run |
//! | `excessive_retries` | one agent called the same tool more than [`SAME_TOOL_RUN_MAX`] times in a row |
//! | `call_loop` | one agent's calls repeat a cycle of 2 to [`LOOP_PERIOD_MAX`] tools [`LOOP_REPEATS_MIN`] times or more in a row |
//! | `long_fruitless_sequence` | one agent made [`FRUITLESS_CALLS_MIN`] or more calls in a row without writing a finding |

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::event::Event;

/// One tool call read from an entry.
#[derive(Clone, Debug)]
pub struct ToolCall {
    /// Seq of the entry.
    pub seq: u64,
    /// The calling agent.
    pub agent: String,
    /// The tool.
    pub tool: String,
    /// Its arguments, as canonical JSON (`null` when not recorded).
    pub args: String,
    /// Whether it failed.
    pub failed: bool,
    /// Its error, when failed.
    pub error: Option<String>,
}

/// One anti-pattern found.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AntiPattern {
    /// Which rule (see the module doc).
    pub kind: &'static str,
    /// The agent.
    pub agent: String,
    /// The tool, when one is concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Seqs of the entries that show it.
    pub seqs: Vec<u64>,
    /// What happened.
    pub description: String,
    /// What to do instead.
    pub suggestion: String,
}

/// The tool call an entry records, if any: a call reported as it was made, not one
/// recorded afterwards (`record_tool_failure_pattern`, which may restate calls already
/// tracked and is no call of its own).
pub fn tool_call(e: &Event) -> Option<ToolCall> {
    if crate::synth::patterns::is_retrospective(e) {
        return None;
    }
    let m = e.meta.as_ref()?;
    let tool = m.get("tool")?.as_str()?.to_string();
    let error = m.get("error").and_then(Value::as_str).map(str::to_string);
    let failed = match m.get("tool_status").and_then(Value::as_str) {
        Some("error") => true,
        Some("ok") => false,
        _ => error.is_some(),
    };
    Some(ToolCall {
        seq: e.seq,
        agent: e.agent_id.clone(),
        tool,
        args: m
            .get("args")
            .map_or_else(|| "null".into(), Value::to_string),
        failed,
        error,
    })
}

fn is_finding(e: &Event) -> bool {
    e.kind.is_client()
        && e.meta
            .as_ref()
            .and_then(|m| m.get("tracked"))
            .and_then(Value::as_bool)
            != Some(true)
}

/// Reports returned at most.
pub const REPORTS_MAX: usize = 100;

/// The anti-patterns of a run's entries (in seq order).
pub fn detect(events: &[Event]) -> Vec<AntiPattern> {
    let mut out = Vec::new();
    let calls: Vec<ToolCall> = events.iter().filter_map(tool_call).collect();
    repeated_failures(&calls, &mut out);
    let mut per_agent: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for e in events {
        per_agent.entry(e.agent_id.as_str()).or_default().push(e);
    }
    for (agent, evs) in per_agent {
        let mine: Vec<ToolCall> = evs.iter().filter_map(|e| tool_call(e)).collect();
        runs_and_loops(agent, &mine, &mut out);
        fruitless(agent, &evs, &mut out);
    }
    out.truncate(REPORTS_MAX);
    out
}

/// Failures of one identical call that make it a repeated failing call.
pub const REPEAT_FAILURES_MIN: usize = 2;

fn repeated_failures(calls: &[ToolCall], out: &mut Vec<AntiPattern>) {
    // (agent, tool, args) -> failing seqs; (tool, args) -> first failure (agent, seq).
    let mut fails: BTreeMap<(&str, &str, &str), Vec<u64>> = BTreeMap::new();
    let mut first_fail: BTreeMap<(&str, &str), (&str, u64)> = BTreeMap::new();
    let mut reported_known: BTreeMap<(&str, &str, &str), ()> = BTreeMap::new();
    for c in calls {
        let key = (c.tool.as_str(), c.args.as_str());
        if let Some(&(who, at)) = first_fail.get(&key) {
            if who != c.agent
                && c.args != "null"
                && reported_known
                    .insert((c.agent.as_str(), key.0, key.1), ())
                    .is_none()
            {
                out.push(AntiPattern {
                    kind: "known_failing_parameters",
                    agent: c.agent.clone(),
                    tool: Some(c.tool.clone()),
                    seqs: vec![at, c.seq],
                    description: format!(
                        "{} called {} at #{} with arguments that had already failed for {who} at #{at}",
                        c.agent, c.tool, c.seq
                    ),
                    suggestion: format!(
                        "read the run (or get_tool_advice for {}) before calling a tool; change the arguments that failed",
                        c.tool
                    ),
                });
            }
        }
        if c.failed {
            fails
                .entry((c.agent.as_str(), key.0, key.1))
                .or_default()
                .push(c.seq);
            first_fail.entry(key).or_insert((c.agent.as_str(), c.seq));
        }
    }
    for ((agent, tool, _), seqs) in fails {
        if seqs.len() >= REPEAT_FAILURES_MIN {
            out.push(AntiPattern {
                kind: "repeated_failing_call",
                agent: agent.to_string(),
                tool: Some(tool.to_string()),
                description: format!(
                    "{agent} made the same failing call of {tool} {} times (#{})",
                    seqs.len(),
                    seqs.iter().map(u64::to_string).collect::<Vec<_>>().join(", #")
                ),
                seqs,
                suggestion: format!(
                    "after a failure, change the arguments (get_tool_advice for {tool}) instead of repeating the call"
                ),
            });
        }
    }
}

/// Consecutive calls of one tool allowed before `excessive_retries`.
pub const SAME_TOOL_RUN_MAX: usize = 3;
/// Longest cycle looked for.
pub const LOOP_PERIOD_MAX: usize = 4;
/// Repeats of a cycle that make a loop.
pub const LOOP_REPEATS_MIN: usize = 3;

fn runs_and_loops(agent: &str, calls: &[ToolCall], out: &mut Vec<AntiPattern>) {
    let mut i = 0;
    while i < calls.len() {
        let mut j = i + 1;
        while j < calls.len() && calls[j].tool == calls[i].tool {
            j += 1;
        }
        if j - i > SAME_TOOL_RUN_MAX {
            out.push(AntiPattern {
                kind: "excessive_retries",
                agent: agent.to_string(),
                tool: Some(calls[i].tool.clone()),
                seqs: calls[i..j].iter().map(|c| c.seq).collect(),
                description: format!("{agent} called {} {} times in a row", calls[i].tool, j - i),
                suggestion:
                    "stop after three tries: record what failed and try another tool or ask a peer"
                        .into(),
            });
        }
        i = j;
    }
    let names: Vec<&str> = calls.iter().map(|c| c.tool.as_str()).collect();
    let mut i = 0;
    while i < names.len() {
        let mut found = None;
        for p in 2..=LOOP_PERIOD_MAX {
            if i + p * LOOP_REPEATS_MIN > names.len() {
                break;
            }
            let cycle = &names[i..i + p];
            if cycle.iter().all(|t| *t == cycle[0]) {
                continue; // a single tool: excessive_retries covers it
            }
            let mut reps = 1;
            while i + p * (reps + 1) <= names.len()
                && names[i + p * reps..i + p * (reps + 1)] == *cycle
            {
                reps += 1;
            }
            if reps >= LOOP_REPEATS_MIN {
                found = Some((p, reps));
                break;
            }
        }
        match found {
            Some((p, reps)) => {
                let end = i + p * reps;
                out.push(AntiPattern {
                    kind: "call_loop",
                    agent: agent.to_string(),
                    tool: None,
                    seqs: calls[i..end].iter().map(|c| c.seq).collect(),
                    description: format!(
                        "{agent} repeated the cycle {} {reps} times",
                        names[i..i + p].join(" > ")
                    ),
                    suggestion: "the loop is not converging: write down what each pass showed and change approach".into(),
                });
                i = end;
            }
            None => i += 1,
        }
    }
}

/// Calls without a finding that make a fruitless sequence.
pub const FRUITLESS_CALLS_MIN: usize = 8;

fn fruitless(agent: &str, evs: &[&Event], out: &mut Vec<AntiPattern>) {
    let mut streak: Vec<u64> = Vec::new();
    let flush = |streak: &mut Vec<u64>, out: &mut Vec<AntiPattern>| {
        if streak.len() >= FRUITLESS_CALLS_MIN {
            out.push(AntiPattern {
                kind: "long_fruitless_sequence",
                agent: agent.to_string(),
                tool: None,
                seqs: streak.clone(),
                description: format!(
                    "{agent} made {} tool calls in a row without recording a finding",
                    streak.len()
                ),
                suggestion: "record what the calls showed (add_finding_to_memory), or check get_recommended_investigation_strategy for a proven sequence".into(),
            });
        }
        streak.clear();
    };
    for e in evs {
        let call = tool_call(e).is_some();
        if call && !is_finding(e) {
            streak.push(e.seq);
        } else if is_finding(e) {
            flush(&mut streak, out);
        }
    }
    flush(&mut streak, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ts::Ts;
    use crate::event::EventType;
    use serde_json::json;

    fn call(seq: u64, agent: &str, tool: &str, args: Value, ok: bool) -> Event {
        let mut meta = json!({"tool": tool, "tool_status": if ok {"ok"} else {"error"}, "args": args, "tracked": true});
        if !ok {
            meta["error"] = json!("invalid filter");
        }
        Event {
            run_id: "r".into(),
            seq,
            ts: Ts::now(),
            id: format!("e{seq}"),
            agent_id: agent.into(),
            user_id: "u".into(),
            kind: EventType::ActionTaken,
            content: json!(format!("called {tool}")),
            confidence: None,
            refs: vec![],
            subject: None,
            session_id: None,
            meta: meta.as_object().cloned(),
        }
    }

    fn finding(seq: u64, agent: &str) -> Event {
        let mut e = call(seq, agent, "x", json!(null), true);
        e.kind = EventType::Evidence;
        e.meta = None;
        e
    }

    fn kinds(v: &[AntiPattern]) -> Vec<&'static str> {
        v.iter().map(|a| a.kind).collect()
    }

    #[test]
    fn a_repeated_failing_call_and_known_failing_arguments() {
        let evs = vec![
            call(1, "a", "q", json!({"f": 1}), false),
            call(2, "a", "q", json!({"f": 1}), false),
            call(3, "b", "q", json!({"f": 1}), true),
            call(4, "a", "q", json!({"f": 2}), true),
        ];
        let r = detect(&evs);
        assert_eq!(
            kinds(&r),
            vec!["known_failing_parameters", "repeated_failing_call"]
        );
        assert_eq!(r[0].seqs, vec![1, 3]);
        assert_eq!(r[1].seqs, vec![1, 2]);
    }

    #[test]
    fn loops_retries_and_fruitless_sequences() {
        let mut evs = Vec::new();
        let mut seq = 0;
        for _ in 0..3 {
            for t in ["logs", "metrics"] {
                seq += 1;
                evs.push(call(seq, "a", t, json!({"s": seq}), true));
            }
        }
        for _ in 0..4 {
            seq += 1;
            evs.push(call(seq, "a", "traces", json!({"s": seq}), true));
        }
        seq += 1;
        evs.push(finding(seq, "a"));
        let r = detect(&evs);
        assert_eq!(
            kinds(&r),
            vec!["excessive_retries", "call_loop", "long_fruitless_sequence"]
        );
        assert_eq!(r[1].seqs, (1..=6).collect::<Vec<_>>());
        assert_eq!(r[2].seqs.len(), 10);
    }

    #[test]
    fn a_short_healthy_run_has_none() {
        let evs = vec![
            call(1, "a", "q", json!({"f": 1}), false),
            call(2, "a", "q", json!({"f": 2}), true),
            finding(3, "a"),
        ];
        assert!(detect(&evs).is_empty());
    }
}
