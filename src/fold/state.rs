//! [`State`]: what a run knows, as a pure fold over its events.
//!
//! This is the one place where meaning is given to events. Replay, checkpoints, the
//! board, time travel and the demo all build a `State` by applying events in seq order,
//! so a checkpoint (a serialized `State`) plus the events after it is, by construction,
//! the same as a replay from the start. Every map is a `BTreeMap` and every list is in
//! seq order, so the same events give byte-identical serialized state.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::event::ts::Ts;
use crate::event::{Content, Event, EventRef, EventType};
use crate::fold::rules::{needs_content, RuleEvent, Rules};

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
        let parts = Parts {
            seq: e.seq,
            ts: e.ts,
            kind: e.kind,
            agent: &e.agent_id,
            user: &e.user_id,
            subject: e.subject.as_deref(),
            refs: &e.refs,
            confidence: e.confidence,
            content: Cow::Borrowed(&e.content),
        };
        self.apply_parts(&parts, Some(&Owned(e)));
    }

    /// [`State::apply`] for an event borrowed from its frame: its content is parsed only
    /// where the fold reads it (the rules' types) or keeps it (a subject's latest entry,
    /// decisions, actions, summaries), and a plain string content is copied, not parsed.
    /// The state is the one [`State::apply`] gives for the same event. Fails, changing
    /// nothing, when content or meta the fold needs does not parse (valid JSON syntax
    /// but no valid value, such as a number out of range: never written by the engine).
    pub(crate) fn apply_ref(&mut self, e: &EventRef<'_>) -> std::result::Result<(), String> {
        if e.seq <= self.head_seq {
            return Ok(());
        }
        let bad =
            |what: &str, err: serde_json::Error| format!("bad {what} of seq {}: {err}", e.seq);
        let subject = e.subject.as_deref();
        let kept = match keeps(e.kind, subject.is_some()) {
            true => Some(Borrowed {
                e,
                content: e.content().map_err(|err| bad("content", err))?,
                meta: e.meta_map().map_err(|err| bad("meta", err))?,
            }),
            false => None,
        };
        let content = match (needs_content(e.kind), &kept) {
            (false, _) => Cow::Owned(Value::Null),
            (
                true,
                Some(Borrowed {
                    content: Content::Value(v),
                    ..
                }),
            ) => Cow::Borrowed(v),
            (
                true,
                Some(Borrowed {
                    content: Content::Plain(t),
                    ..
                }),
            ) => Cow::Owned(Value::String(t.to_string())),
            (true, None) => Cow::Owned(e.content_value().map_err(|err| bad("content", err))?),
        };
        let parts = Parts {
            content,
            subject,
            refs: &e.refs,
            confidence: e.confidence,
            seq: e.seq,
            ts: e.ts,
            kind: e.kind,
            agent: &e.agent_id,
            user: &e.user_id,
        };
        self.apply_parts(&parts, kept.as_ref());
        Ok(())
    }

    /// The fold itself, for both forms of an event. `keep` builds the copies the state
    /// keeps; it is present whenever [`keeps`] says so.
    fn apply_parts(&mut self, e: &Parts<'_>, keep: Option<&impl Keep>) {
        if e.seq <= self.head_seq {
            return;
        }
        // Seqs follow on, but for the gaps `swarm repair` declared: a `log_damaged` event
        // that starts a segment, or a quarantined range (`log::quarantine`). The reader
        // checks that (`check_order`); the fold only needs them rising.
        debug_assert!(keep.is_some() || !keeps(e.kind, e.subject.is_some()));
        self.head_seq = e.seq;
        self.head_ts = Some(e.ts);
        self.rules.apply(&RuleEvent {
            seq: e.seq,
            agent: e.agent,
            kind: e.kind,
            subject: e.subject,
            refs: e.refs,
            content: &e.content,
        });
        self.counts.add(e.kind);
        match e.kind {
            EventType::Hypothesis => {
                self.hypotheses.insert(
                    e.seq,
                    HypothesisInfo {
                        agent: e.agent.to_string(),
                        subject: e.subject.map(str::to_string),
                        confidence: e.confidence.unwrap_or(0.0),
                        support: Vec::new(),
                    },
                );
            }
            EventType::Evidence => {
                for r in e.refs {
                    if let Some(h) = self.hypotheses.get_mut(r) {
                        h.support.push(e.seq);
                    }
                }
            }
            EventType::Summary => self.summaries.extend(keep.map(|k| k.event())),
            _ => {}
        }
        if !e.kind.is_client() {
            return;
        }
        with_slot(&mut self.agents, e.agent, |a: &mut AgentState| {
            if a.first_seq == 0 {
                a.first_seq = e.seq;
            }
            a.counts.add(e.kind);
            a.last_seq = e.seq;
            a.last_ts = e.ts;
        });
        with_slot(&mut self.users, e.user, |n| *n += 1);
        if let (Some(subject), Some(keep)) = (e.subject, keep) {
            match self.subjects.get_mut(subject) {
                Some(s) => {
                    s.seqs.push(e.seq);
                    keep.write_into(&mut s.latest);
                    if e.kind == EventType::Hypothesis {
                        s.hypotheses.push(e.seq);
                    }
                    with_slot(&mut s.agents, e.agent, |n| *n += 1);
                }
                None => {
                    self.subjects.insert(
                        subject.to_string(),
                        SubjectState {
                            seqs: vec![e.seq],
                            latest: keep.event(),
                            hypotheses: if e.kind == EventType::Hypothesis {
                                vec![e.seq]
                            } else {
                                Vec::new()
                            },
                            agents: BTreeMap::from([(e.agent.to_string(), 1)]),
                        },
                    );
                }
            }
        }
        match e.kind {
            EventType::Decision => self.decisions.extend(keep.map(|k| k.event())),
            EventType::ActionTaken => self.actions.extend(keep.map(|k| k.event())),
            _ => {}
        }
    }

    /// The canonical serialized form (what checkpoints store and tests compare).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain maps, vectors, strings and numbers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Whether the state keeps a copy of an event of this type (with a subject or not): a
/// client entry on a subject is its latest; decisions, actions and summaries are kept in
/// order.
fn keeps(kind: EventType, has_subject: bool) -> bool {
    (kind.is_client() && has_subject) || kind.is_pinned() || kind == EventType::Summary
}

/// The fields of an event the fold reads, borrowed from either form.
struct Parts<'a> {
    seq: u64,
    ts: Ts,
    kind: EventType,
    agent: &'a str,
    user: &'a str,
    subject: Option<&'a str>,
    refs: &'a [u64],
    confidence: Option<f64>,
    /// The content where the rules read it ([`needs_content`]); else anything (`Null`).
    content: Cow<'a, Value>,
}

/// Builds the copies of an event the state keeps.
trait Keep {
    /// A new owned copy.
    fn event(&self) -> Event;
    /// Overwrites an older copy (a subject's previous latest entry).
    fn write_into(&self, into: &mut Event);
}

/// An owned event: copies are clones.
struct Owned<'a>(&'a Event);

impl Keep for Owned<'_> {
    fn event(&self) -> Event {
        self.0.clone()
    }
    fn write_into(&self, into: &mut Event) {
        into.clone_from(self.0);
    }
}

/// A borrowed event with its content and meta parsed (or, for a plain string, not).
struct Borrowed<'a, 'b> {
    e: &'a EventRef<'b>,
    content: Content<'b>,
    meta: Option<Map<String, Value>>,
}

impl Keep for Borrowed<'_, '_> {
    fn event(&self) -> Event {
        self.e.to_event(self.content.clone(), self.meta.clone())
    }
    fn write_into(&self, into: &mut Event) {
        self.e
            .write_into(into, self.content.clone(), self.meta.clone())
    }
}

/// Runs `f` on the value of `key`, inserted as the default first if absent: one lookup,
/// and the key is copied only when it is new.
fn with_slot<V: Default>(map: &mut BTreeMap<String, V>, key: &str, f: impl FnOnce(&mut V)) {
    match map.get_mut(key) {
        Some(v) => f(v),
        None => {
            let mut v = V::default();
            f(&mut v);
            map.insert(key.to_string(), v);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A plain event of a test run `r`.
    pub(crate) fn ev(seq: u64, agent: &str, kind: EventType, subject: Option<&str>) -> Event {
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

    /// The fold of borrowed events (replay) and of owned events give the same state, on
    /// every type, plain, escaped and object contents, meta, refs and odd subjects.
    #[test]
    fn borrowed_and_owned_events_fold_alike() {
        let kinds: Vec<EventType> = EventType::ALL
            .into_iter()
            .chain(EventType::ENGINE)
            .filter(|k| *k != EventType::LogDamaged)
            .collect();
        let contents = [
            json!("plain text"),
            json!("quoted \"x\" back\\slash\nnewline é ☃"),
            json!({"channel": "notes", "value": {"k": 1}, "base_version": null}),
            json!({"permissions": {"*": {"read_types": ["*"], "write_types": ["*"]}}}),
            json!({"from_seq": 1, "to_seq": 2, "summarized": 2, "text": "t", "summarizer": "s"}),
            json!(""),
            json!({"nested": [1, 2.5, -3e300, null, true, {"k": "v"}]}),
        ];
        // 7 contents and 15 types: every pair occurs (the moduli are coprime).
        let mut owned = State::new("r");
        let mut borrowed = State::new("r");
        let mut frame = Vec::new();
        for seq in 1..=400u64 {
            let mut e = ev(
                seq,
                ["a", "b", "c"][(seq % 3) as usize],
                kinds[(seq * 7 % kinds.len() as u64) as usize],
                [None, Some("db"), Some("s \"q\" ü"), Some("cache")][(seq % 4) as usize],
            );
            e.content = contents[(seq % contents.len() as u64) as usize].clone();
            e.confidence = (seq % 3 == 0).then_some(0.5);
            if seq % 5 == 0 {
                e.refs = vec![seq - 1, seq - 3];
            }
            e.meta = (seq % 6 == 0).then(|| {
                let mut m = Map::new();
                m.insert("tool".into(), json!("q"));
                m
            });
            e.session_id = (seq % 2 == 0).then(|| "sess".into());
            frame.push(e);
            if seq % 9 == 0 || seq == 400 {
                let bytes = serde_json::to_vec(&frame).unwrap();
                let refs: Vec<EventRef<'_>> = serde_json::from_slice(&bytes).unwrap();
                for (e, r) in frame.iter().zip(&refs) {
                    owned.apply(e);
                    borrowed.apply_ref(r).unwrap();
                }
                frame.clear();
                assert_eq!(borrowed, owned, "after seq {seq}");
            }
        }
        assert!(owned.decisions.len() > 10 && owned.summaries.len() > 1);
        assert!(owned.rules.policy.is_some());
        assert_eq!(borrowed.to_bytes(), owned.to_bytes());
    }

    #[test]
    fn content_that_does_not_parse_changes_nothing() {
        let mut s = State::new("r");
        let good = serde_json::to_vec(&ev(1, "a", EventType::Decision, Some("db"))).unwrap();
        s.apply_ref(&serde_json::from_slice(&good).unwrap())
            .unwrap();
        let before = s.clone();
        // Valid JSON syntax, but no value: a number out of range.
        let bad = String::from_utf8(
            serde_json::to_vec(&ev(2, "a", EventType::Decision, Some("db"))).unwrap(),
        )
        .unwrap()
        .replace(r#""content":"c2""#, r#""content":1e999"#);
        let r: EventRef<'_> = serde_json::from_str(&bad).unwrap();
        assert!(s.apply_ref(&r).is_err());
        assert_eq!(s, before);
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
