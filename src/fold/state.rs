//! [`State`]: what a run knows, as a pure fold over its events.
//!
//! This is the one place where meaning is given to events. Replay, checkpoints, the
//! board, time travel and the demo all build a `State` by applying events in seq order,
//! so a checkpoint (a serialized `State`) plus the events after it is, by construction,
//! the same as a replay from the start. Every map is a `BTreeMap` and every list is in
//! seq order, so the same events give byte-identical serialized state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::ts::Ts;
use crate::event::{Event, EventType};
use crate::fold::rules::{RuleEvent, Rules};

/// Counts of entries per type.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// All entries.
    pub total: u64,
    /// Per entry type.
    pub by_type: BTreeMap<EventType, u64>,
}

impl Counts {
    fn add(&mut self, k: EventType) {
        self.total += 1;
        *self.by_type.entry(k).or_default() += 1;
    }
}

/// What one agent contributed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentState {
    /// Its entries, per type.
    pub counts: Counts,
    /// Seq of its first entry.
    pub first_seq: u64,
    /// Seq of its latest entry.
    pub last_seq: u64,
    /// Time of its latest entry.
    pub last_ts: Ts,
}

/// Everything said about one subject.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubjectState {
    /// Seqs of every entry on the subject, in order: its history.
    pub seqs: Vec<u64>,
    /// The latest entry: the authoritative one (seed 000: "the latest entry is
    /// authoritative; older entries become reasoning context").
    pub latest: Event,
    /// Seqs of the hypotheses on the subject (competing ones all stay).
    pub hypotheses: Vec<u64>,
    /// Agents that wrote about it, with their entry count.
    pub agents: BTreeMap<String, u64>,
}

/// The materialized knowledge of a run at some seq.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// The run.
    pub run_id: String,
    /// Seq of the last applied event (0: none).
    pub head_seq: u64,
    /// Time of the last applied event.
    pub head_ts: Option<Ts>,
    /// Entry counts.
    pub counts: Counts,
    /// Per agent.
    pub agents: BTreeMap<String, AgentState>,
    /// Entries per user.
    pub users: BTreeMap<String, u64>,
    /// Per subject.
    pub subjects: BTreeMap<String, SubjectState>,
    /// Every `decision`, in order (pinned: the audit trail).
    pub decisions: Vec<Event>,
    /// Every `action_taken`, in order (pinned: the audit trail).
    pub actions: Vec<Event>,
    /// Hypotheses with what the orchestrator's pick needs, by seq.
    pub hypotheses: BTreeMap<u64, HypothesisInfo>,
    /// Every summary (pruning), in order.
    pub summaries: Vec<Event>,
    /// Permissions, channels, board versions, escalations, pruning, closing.
    pub rules: Rules,
}

/// A hypothesis as the orchestrator's pick sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HypothesisInfo {
    /// Its agent.
    pub agent: String,
    /// Its subject.
    pub subject: Option<String>,
    /// Its confidence (0 when not given).
    pub confidence: f64,
    /// Seqs of `evidence` entries that ref it.
    pub support: Vec<u64>,
}

impl State {
    /// The empty state of a run.
    pub fn new(run_id: &str) -> State {
        State {
            run_id: run_id.to_string(),
            ..State::default()
        }
    }

    /// Applies the next event. Events must come in seq order; an event at or below the
    /// head is ignored (so re-applying an overlap is harmless).
    pub fn apply(&mut self, e: &Event) {
        if e.seq <= self.head_seq {
            return;
        }
        // Seqs follow on, but for the gap a `log_damaged` event declares (`swarm repair`).
        debug_assert!(
            e.seq == self.head_seq + 1
                || crate::event::LogDamaged::declared(e.kind, &e.content)
                    == Some((self.head_seq + 1, e.seq - 1)),
            "events applied out of order: {} after {}",
            e.seq,
            self.head_seq
        );
        self.head_seq = e.seq;
        self.head_ts = Some(e.ts);
        self.rules.apply(&RuleEvent {
            seq: e.seq,
            agent: &e.agent_id,
            kind: e.kind,
            subject: e.subject.as_deref(),
            refs: &e.refs,
            content: &e.content,
        });
        self.counts.add(e.kind);
        match e.kind {
            EventType::Hypothesis => {
                self.hypotheses.insert(
                    e.seq,
                    HypothesisInfo {
                        agent: e.agent_id.clone(),
                        subject: e.subject.clone(),
                        confidence: e.confidence.unwrap_or(0.0),
                        support: Vec::new(),
                    },
                );
            }
            EventType::Evidence => {
                for r in &e.refs {
                    if let Some(h) = self.hypotheses.get_mut(r) {
                        h.support.push(e.seq);
                    }
                }
            }
            EventType::Summary => self.summaries.push(e.clone()),
            _ => {}
        }
        if !e.kind.is_client() {
            return;
        }
        let a = self.agents.entry(e.agent_id.clone()).or_default();
        if a.first_seq == 0 {
            a.first_seq = e.seq;
        }
        a.counts.add(e.kind);
        a.last_seq = e.seq;
        a.last_ts = e.ts;
        *self.users.entry(e.user_id.clone()).or_default() += 1;
        if let Some(subject) = &e.subject {
            match self.subjects.get_mut(subject) {
                Some(s) => {
                    s.seqs.push(e.seq);
                    s.latest = e.clone();
                    if e.kind == EventType::Hypothesis {
                        s.hypotheses.push(e.seq);
                    }
                    *s.agents.entry(e.agent_id.clone()).or_default() += 1;
                }
                None => {
                    self.subjects.insert(
                        subject.clone(),
                        SubjectState {
                            seqs: vec![e.seq],
                            latest: e.clone(),
                            hypotheses: if e.kind == EventType::Hypothesis {
                                vec![e.seq]
                            } else {
                                Vec::new()
                            },
                            agents: BTreeMap::from([(e.agent_id.clone(), 1)]),
                        },
                    );
                }
            }
        }
        match e.kind {
            EventType::Decision => self.decisions.push(e.clone()),
            EventType::ActionTaken => self.actions.push(e.clone()),
            _ => {}
        }
    }

    /// The canonical serialized form (what checkpoints store and tests compare).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain maps, vectors, strings and numbers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(seq: u64, agent: &str, kind: EventType, subject: Option<&str>) -> Event {
        Event {
            run_id: "r".into(),
            seq,
            ts: Ts(seq * 10),
            id: format!("e{seq}"),
            agent_id: agent.into(),
            user_id: "u".into(),
            kind,
            content: json!(format!("c{seq}")),
            confidence: None,
            refs: vec![],
            subject: subject.map(str::to_string),
            session_id: None,
            meta: None,
        }
    }

    #[test]
    fn folds_and_is_deterministic() {
        let evs = [
            ev(1, "a", EventType::Hypothesis, Some("db")),
            ev(2, "b", EventType::Evidence, Some("db")),
            ev(3, "a", EventType::Decision, None),
            ev(4, "c", EventType::ActionTaken, Some("db")),
        ];
        let mut s = State::new("r");
        for e in &evs {
            s.apply(e);
        }
        s.apply(&evs[1]); // ignored: already applied
        assert_eq!(s.head_seq, 4);
        assert_eq!(s.counts.total, 4);
        assert_eq!(s.subjects["db"].seqs, vec![1, 2, 4]);
        assert_eq!(s.subjects["db"].latest.seq, 4);
        assert_eq!(s.subjects["db"].hypotheses, vec![1]);
        assert_eq!(s.decisions.len(), 1);
        assert_eq!(s.actions.len(), 1);
        assert_eq!(s.agents["a"].counts.total, 2);
        let mut t = State::new("r");
        for e in &evs {
            t.apply(e);
        }
        assert_eq!(s.to_bytes(), t.to_bytes());
        let back: State = serde_json::from_slice(&s.to_bytes()).unwrap();
        assert_eq!(back, s);
    }
}
