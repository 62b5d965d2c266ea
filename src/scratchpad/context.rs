//! Bounded context (seed 000: "fail if the agent's prompt grows unbounded"): what an
//! agent should put in its prompt, never over a byte budget.
//!
//! Selection, in priority order until the budget is full: the pinned entries, decisions
//! and actions (newest first), then the summaries (newest first), then the most recent
//! unpinned entries of the working view (newest first); everything the agent may not
//! read under the run's policy is left out. Pinned entries come first because they are
//! what the swarm committed to (seed 000's audit trail) and are few, while summaries
//! grow with the run: a long run's summaries must never push its decisions out. The chosen items are printed in seq order,
//! one line each (control and invisible characters escaped, so the text is what a
//! terminal shows); the budget counts the exact bytes of the text, line ends included.

use serde::Serialize;

use crate::error::Result;
use crate::event::{Event, EventType};
use crate::query::options::ReadOptions;
use crate::store::Store;

/// Longest rendering of one item's content, in characters.
pub const ITEM_CHARS_MAX: usize = 600;
/// How many recent events are considered for the working-view part.
pub const RECENT_EVENTS_MAX: u64 = 4096;

/// One line of the context.
#[derive(Clone, Debug, Serialize)]
pub struct ContextItem {
    /// Seq of the entry.
    pub seq: u64,
    /// Why it is there: `summary`, `pinned` or `recent`.
    pub role: &'static str,
    /// The rendered line.
    pub text: String,
}

/// The context of one agent.
#[derive(Clone, Debug, Serialize)]
pub struct Context {
    /// The agent.
    pub agent: String,
    /// The budget.
    pub budget_bytes: usize,
    /// Bytes of `text`.
    pub used_bytes: usize,
    /// Head seq of the run when it was built.
    pub head_seq: u64,
    /// The items, in seq order.
    pub items: Vec<ContextItem>,
    /// Candidates left out for lack of budget, per role.
    pub omitted: std::collections::BTreeMap<&'static str, u64>,
    /// The prompt text: the items' lines, each ending in a newline (nothing when no item
    /// fits), exactly as `swarm context` prints it: `used_bytes` bytes, never over the
    /// budget.
    pub text: String,
}

fn render(e: &Event) -> String {
    let content = match (e.kind, e.content.get("text").and_then(|t| t.as_str())) {
        (crate::event::EventType::Summary, Some(t)) => t.to_string(),
        _ => e
            .content
            .as_str()
            .map_or_else(|| e.content.to_string(), str::to_string),
    };
    let mut c: String = content
        .replace('\n', " ")
        .chars()
        .take(ITEM_CHARS_MAX)
        .collect();
    if content.chars().count() > ITEM_CHARS_MAX {
        c.push('…');
    }
    let refs = if e.refs.is_empty() {
        String::new()
    } else {
        format!(
            " (builds on {})",
            e.refs
                .iter()
                .map(|r| format!("#{r}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let line = format!(
        "#{} {} {} [{}]{}: {}",
        e.seq,
        e.kind.as_str(),
        e.agent_id,
        e.subject.as_deref().unwrap_or("-"),
        refs,
        c
    );
    plain(&line)
}

/// `s` as one plain line: line breaks and tabs become spaces; the other characters a
/// terminal would interpret are escaped ([`escape_controls`]), as the CLI prints them. So
/// the context is exactly what is printed, and the budget counts the bytes printed (the
/// CLI escaped after the budget was counted: 3 bytes of U+200B printed as 8).
fn plain(s: &str) -> String {
    escape_controls(&s.replace(['\n', '\r', '\t'], " "), false)
}

/// `s` with what a terminal would interpret written as escapes: control characters
/// (`\x1b`, `\r`; line breaks and tabs kept when `keep_lines`, else `\n`, `\t`), C1
/// controls and the invisible characters that reorder or hide text (zero-width and bidi
/// marks, BOM: `\u{202e}`). Agents' text reaches terminals and prompts through it.
pub fn escape_controls(s: &str, keep_lines: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' | '\t' if keep_lines => out.push(c),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if (0x80..0xa0).contains(&(c as u32))
                || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}') =>
            {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

impl Store {
    /// Builds `agent`'s context within `budget_bytes`.
    pub fn context(&self, run: &str, agent: &str, budget_bytes: usize) -> Result<Context> {
        crate::store::engine_log_hidden(run, Some(agent))?;
        let state = self.head_state(run)?.state;
        let rules = &state.rules;
        let mut cands: Vec<(u8, &'static str, Event)> = Vec::new();
        let mut pinned: Vec<&Event> = state.decisions.iter().chain(&state.actions).collect();
        pinned.sort_by_key(|e| std::cmp::Reverse(e.seq));
        for e in pinned {
            if rules.may_read_type(agent, e.kind) {
                cands.push((0, "pinned", e.clone()));
            }
        }
        // A summary quotes the entries it replaced: only for an agent shown them. An agent
        // not shown summaries keeps the entries they replaced that it may read (they
        // left its context at a prune, with nothing in their place).
        let summaries = rules.may_read_kind(agent, EventType::Summary);
        if summaries {
            for s in state.summaries.iter().rev() {
                cands.push((1, "summary", s.clone()));
            }
        }
        let first = if summaries { rules.pruned_upto + 1 } else { 1 };
        let from = first.max(state.head_seq.saturating_sub(RECENT_EVENTS_MAX) + 1);
        let recent: Vec<Event> = self
            .read(
                run,
                ReadOptions {
                    from_seq: Some(from),
                    to_seq: Some(state.head_seq),
                    reader: Some(agent.to_string()),
                    // No item renders in under 32 bytes: more could never fit.
                    last: Some((budget_bytes / 32).clamp(16, RECENT_EVENTS_MAX as usize)),
                    ..ReadOptions::default()
                },
            )?
            .filter(|e| {
                e.as_ref()
                    .map_or(true, |e| e.kind.is_client() && !e.kind.is_pinned())
            })
            .collect::<Result<_>>()?;
        for e in recent.into_iter().rev() {
            cands.push((2, "recent", e));
        }
        let mut used = 0usize;
        let mut chosen: Vec<ContextItem> = Vec::new();
        let mut omitted = std::collections::BTreeMap::new();
        for (_, role, e) in cands {
            let text = render(&e);
            // Its line and the line's end.
            let cost = text.len() + 1;
            if used + cost <= budget_bytes {
                used += cost;
                chosen.push(ContextItem {
                    seq: e.seq,
                    role,
                    text,
                });
            } else {
                *omitted.entry(role).or_insert(0) += 1;
            }
        }
        chosen.sort_by_key(|i| i.seq);
        let mut text = String::with_capacity(used);
        for i in &chosen {
            text.push_str(&i.text);
            text.push('\n');
        }
        debug_assert!(text.len() <= budget_bytes);
        Ok(Context {
            agent: agent.to_string(),
            budget_bytes,
            used_bytes: text.len(),
            head_seq: state.head_seq,
            items: chosen,
            omitted,
            text,
        })
    }
}
