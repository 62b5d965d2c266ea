//! [`Rules`]: the part of the fold that decides whether an append is allowed, and what
//! the engine must add to it.
//!
//! The writer keeps a `Rules` current under the append lock (from a light parse of every
//! frame: content is parsed only for decisions, actions and engine events) and asks it to
//! `Rules::check` each event before assigning a seq. Replay builds the same `Rules`
//! inside [`crate::State`] with the same [`Rules::apply`], so what was allowed at write
//! time is exactly what replay shows.
//!
//! # Rules
//! - **Permissions** (`policy` events): once a policy with permissions exists, an agent
//!   may write the entry types in its `write_types` and the channels in its
//!   `write_channels`, and is shown only the types in `read_types` and the channels in
//!   `read_channels`. An agent not listed gets the `*` entry; without a `*` entry it gets
//!   nothing. `*` in a list means all. Only an agent with `admin: true` may replace a
//!   policy (anyone may set the first one).
//! - **Board compare-and-swap**: `expect_subject_seq = N` passes only if the latest
//!   entry on the subject is seq N (0: none yet).
//! - **Contradictory actions** (seed 000: hard stop): a new `decision` or
//!   `action_taken` N on subject S *disagrees* with the standing one D (the latest
//!   decision or action on S) when all hold: D's agent is not N's agent; their contents,
//!   normalized (strings: lowercased, whitespace collapsed, trailing `.` dropped; objects:
//!   canonical JSON), differ; and N does not list D's seq in its `refs` (so N neither
//!   builds on D nor acknowledges it). N is stored (it records something that happened)
//!   and the engine appends an `escalation` in the same atomic frame. While an escalation
//!   on S is open, every further decision or action on S is refused (exit 6) until a
//!   `resolution` names it. Hypotheses and evidence on S are still accepted.
//! - **Channels**: see [`ChannelKind`] and [`ConflictPolicy`].
//! - **Pruning**: a `summary` must start right after the previous one (a CAS on the
//!   pruned prefix), so two pruners cannot summarise the same range.
//! - **Closed runs** refuse every append.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::event::{EventType, ENGINE_AGENT};

/// How a channel combines writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelKind {
    /// The value is a list; each write appends one item.
    Append,
    /// The value is the last write.
    Replace,
    /// The value is a JSON object; each write is an RFC 7396 merge patch.
    Merge,
}

/// What happens when a write was based on a stale version of the channel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConflictPolicy {
    /// The write is applied anyway; a `conflict` event records it.
    #[default]
    LastWriteWins,
    /// The write is applied as a merge patch on the current value (append channels simply
    /// append); a `conflict` event records it.
    Merge,
    /// Every write must carry the version it read (`base_version`); a missing or stale
    /// one is refused (exit 4) and a `conflict` event is recorded.
    Reject,
}

/// Content of a `channel_declare` event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelDecl {
    /// Channel name (an id).
    pub channel: String,
    /// How writes combine.
    pub kind: ChannelKind,
    /// What a stale write does.
    #[serde(default)]
    pub on_conflict: ConflictPolicy,
    /// Largest value, in KiB of JSON.
    pub max_size_kb: u64,
}

/// Content of a `channel_write` event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelWrite {
    /// Channel name.
    pub channel: String,
    /// The item (append), the new value (replace) or the patch (merge).
    pub value: Value,
    /// The channel version (seq of its last write, 0: none) the writer read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_version: Option<u64>,
}

/// Content of a `conflict` event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConflictRecord {
    /// Channel name.
    pub channel: String,
    /// The agent whose write was stale.
    pub agent: String,
    /// The agent of the write it raced with.
    pub other_agent: String,
    /// The version the writer read.
    pub base_version: Option<u64>,
    /// The channel's version at the time.
    pub version: u64,
    /// `last_write_wins`, `merge` or `reject`.
    pub resolution: ConflictPolicy,
}

/// One agent's permissions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Perms {
    /// Entry types it is shown (`*`: all).
    #[serde(default)]
    pub read_types: Vec<String>,
    /// Entry types it may write.
    #[serde(default)]
    pub write_types: Vec<String>,
    /// Channels it is shown.
    #[serde(default)]
    pub read_channels: Vec<String>,
    /// Channels it may write.
    #[serde(default)]
    pub write_channels: Vec<String>,
    /// May replace the policy.
    #[serde(default)]
    pub admin: bool,
}

fn allows(list: &[String], item: &str) -> bool {
    list.iter().any(|x| x == "*" || x == item)
}

/// Content of a `policy` event.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Per agent (`*`: everyone not listed). Absent: everyone may do everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<BTreeMap<String, Perms>>,
    /// Pruning threshold: summarise when the working view holds more unpinned entries
    /// than this. Absent: pruning off (the default, seed 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune_max_entries: Option<u64>,
}

impl Policy {
    /// Refuses a policy that names no entry type it could mean (a typo would hide or bar
    /// a type silently) or that leaves the run with no admin (nobody could change the
    /// policy or close the run again).
    pub fn validate(&self) -> Result<()> {
        let Some(perms) = &self.permissions else {
            return Ok(());
        };
        for (agent, p) in perms {
            for t in p.read_types.iter().chain(&p.write_types) {
                if t != "*" && EventType::parse_client(t).is_err() {
                    return Err(Error::invalid(
                        "policy",
                        format!("agent {agent:?}: {t:?} is not an entry type (hypothesis, evidence, decision, action_taken, or * for all)"),
                    ));
                }
            }
        }
        if !perms.values().any(|p| p.admin) {
            return Err(Error::invalid(
                "policy",
                "no agent is an admin: nobody could change this policy or close the run again; mark one agent \"admin\": true",
            ));
        }
        Ok(())
    }

    fn perms(&self, agent: &str) -> Option<Option<&Perms>> {
        let p = self.permissions.as_ref()?;
        Some(p.get(agent).or_else(|| p.get("*")))
    }

    /// Whether `agent` is shown entries of type `kind` (by name) under this policy.
    pub fn may_read_type(&self, agent: &str, kind: &str) -> bool {
        match self.perms(agent) {
            None => true,
            Some(None) => false,
            Some(Some(p)) => allows(&p.read_types, kind),
        }
    }
}

/// Content of an `escalation` event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EscalationRecord {
    /// The blocked subject.
    pub subject: String,
    /// Why.
    pub reason: String,
    /// The two entries: the standing one and the one that contradicted it.
    pub entries: [u64; 2],
    /// Their agents.
    pub agents: [String; 2],
    /// Their normalized contents (empty when not decisions or actions).
    #[serde(default)]
    pub norms: [String; 2],
}

/// Content of a `resolution` event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolutionRecord {
    /// Seq of the escalation.
    pub escalation: u64,
    /// The entry that stands after the resolution, if any (one of the escalation's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub winner: Option<u64>,
    /// The human's note.
    pub note: String,
}

/// Content of a `summary` event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SummaryRecord {
    /// First seq covered (right after the previous summary).
    pub from_seq: u64,
    /// Last seq covered.
    pub to_seq: u64,
    /// Unpinned entries it replaces in the working view.
    pub summarized: u64,
    /// The summary text.
    pub text: String,
    /// Which summariser wrote it.
    pub summarizer: String,
}

/// The state of one channel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChannelState {
    /// Its declaration.
    pub decl: ChannelDecl,
    /// Seq of its last write (0: none).
    pub version: u64,
    /// Its current value.
    pub value: Value,
    /// Seqs of its writes.
    pub history: Vec<u64>,
    /// Seqs of its recorded conflicts.
    pub conflicts: Vec<u64>,
    /// Agent of the last write.
    pub last_agent: Option<String>,
}

/// The standing decision or action on a subject.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Standing {
    /// Its seq.
    pub seq: u64,
    /// Its agent.
    pub agent: String,
    /// Its normalized content.
    pub norm: String,
}

/// Per-subject rule state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SubjectRules {
    /// Seq of the latest entry on the subject (the board version).
    pub latest_seq: u64,
    /// The standing decision/action.
    pub standing: Option<Standing>,
    /// Open escalation blocking decisions and actions.
    pub blocked_by: Option<u64>,
}

/// An escalation and its outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EscalationState {
    /// What was escalated.
    pub record: EscalationRecord,
    /// The two standings, to restore the winner at resolution.
    pub sides: [Standing; 2],
    /// Seq of the resolution, once resolved.
    pub resolved_by: Option<u64>,
}

/// The rule-relevant part of a run's state. A pure fold; see the module docs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rules {
    /// The current policy.
    pub policy: Option<Policy>,
    /// Declared channels.
    pub channels: BTreeMap<String, ChannelState>,
    /// Per subject.
    pub subjects: BTreeMap<String, SubjectRules>,
    /// Every escalation, by seq.
    pub escalations: BTreeMap<u64, EscalationState>,
    /// Seq of the `run_closed` event.
    pub closed: Option<u64>,
    /// Summaries cover seqs 1..=pruned_upto.
    pub pruned_upto: u64,
    /// Unpinned client entries ever written.
    pub unpinned_total: u64,
    /// Unpinned entries replaced by summaries.
    pub unpinned_summarized: u64,
}

/// The fields of an event the rules look at.
pub struct RuleEvent<'a> {
    /// Seq.
    pub seq: u64,
    /// Agent.
    pub agent: &'a str,
    /// Type.
    pub kind: EventType,
    /// Subject.
    pub subject: Option<&'a str>,
    /// Refs.
    pub refs: &'a [u64],
    /// Content; parsed only for decisions, actions and engine types.
    pub content: &'a Value,
}

/// Whether the rules read an event's content (others may pass `Value::Null`).
pub fn needs_content(kind: EventType) -> bool {
    !matches!(kind, EventType::Hypothesis | EventType::Evidence)
}

/// The normal form used to decide whether two decisions or actions say the same.
pub fn normalize(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let t = s
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_lowercase();
            t.trim_end_matches('.').to_string()
        }
        other => other.to_string(),
    }
}

/// What the engine must add around a checked event.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    /// Engine events to store right after it, in the same frame.
    pub after: Vec<(EventType, Value)>,
    /// The event itself is refused with this error, but `after` is still recorded (a
    /// `reject` channel's conflict).
    pub refuse: Option<Error>,
}

/// RFC 7396 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn parse<T: for<'de> Deserialize<'de>>(kind: EventType, v: &Value) -> Option<T> {
    match serde_json::from_value(v.clone()) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(kind = kind.as_str(), error = %e, "engine event with unreadable content; ignored");
            None
        }
    }
}

impl Rules {
    /// The permissions of `agent`: `None` when the run has no permission policy (all
    /// allowed), `Some(None)` when the policy grants it nothing.
    pub fn perms(&self, agent: &str) -> Option<Option<&Perms>> {
        self.policy.as_ref().and_then(|p| p.perms(agent))
    }

    /// Whether `agent` is an admin of the run: it may replace the policy and close the
    /// run. Everyone is, while the run has no permission policy.
    pub fn is_admin(&self, agent: &str) -> bool {
        match self.perms(agent) {
            None => true,
            Some(p) => p.is_some_and(|p| p.admin),
        }
    }

    /// Whether `agent` may see the stored event `e`: client types by the policy's
    /// `read_types`, channel events by the channel's readers; engine events otherwise.
    pub fn may_read_event(&self, agent: &str, e: &crate::event::Event) -> bool {
        if !self.may_read_kind(agent, e.kind) {
            return false;
        }
        match e.kind {
            EventType::ChannelDeclare | EventType::ChannelWrite | EventType::Conflict => e
                .content
                .get("channel")
                .and_then(|c| c.as_str())
                .is_some_and(|c| self.may_read_channel(agent, c)),
            _ => true,
        }
    }

    /// Whether `agent` is shown events of this type: a client type by the policy's
    /// `read_types`; an engine event that quotes entries by the types it quotes. An
    /// escalation quotes the two decisions or actions it is between (their normalized
    /// contents), or names the two hypotheses a pick could not choose between, and a
    /// resolution names the one that stands, with a human's note about them: shown to an
    /// agent shown decisions, actions and hypotheses. A summary quotes the
    /// hypotheses and evidence it replaced: shown to an agent shown both. The other
    /// engine events quote no entry (channel events go by the channel's readers, see
    /// [`Rules::may_read_event`]).
    pub fn may_read_kind(&self, agent: &str, kind: EventType) -> bool {
        match kind {
            k if k.is_client() => self.may_read_type(agent, k),
            EventType::Escalation | EventType::Resolution => {
                self.may_read_type(agent, EventType::Decision)
                    && self.may_read_type(agent, EventType::ActionTaken)
                    && self.may_read_type(agent, EventType::Hypothesis)
            }
            EventType::Summary => {
                self.may_read_type(agent, EventType::Hypothesis)
                    && self.may_read_type(agent, EventType::Evidence)
            }
            _ => true,
        }
    }

    /// Whether `agent` is shown entries of this type.
    pub fn may_read_type(&self, agent: &str, kind: EventType) -> bool {
        match self.perms(agent) {
            None => true,
            Some(None) => false,
            Some(Some(p)) => allows(&p.read_types, kind.as_str()),
        }
    }

    /// Whether `agent` is shown every event: every entry type (the engine's events quote
    /// only those) and every channel. A read as such an agent needs no filter.
    pub fn sees_everything(&self, agent: &str) -> bool {
        match self.perms(agent) {
            None => true,
            Some(None) => false,
            Some(Some(p)) => {
                EventType::ALL
                    .iter()
                    .all(|k| allows(&p.read_types, k.as_str()))
                    && allows(&p.read_channels, "*")
            }
        }
    }

    /// Whether `agent` is shown this channel.
    pub fn may_read_channel(&self, agent: &str, channel: &str) -> bool {
        match self.perms(agent) {
            None => true,
            Some(None) => false,
            Some(Some(p)) => allows(&p.read_channels, channel),
        }
    }

    fn may_write_type(&self, agent: &str, kind: EventType) -> bool {
        match self.perms(agent) {
            None => true,
            Some(None) => false,
            Some(Some(p)) => allows(&p.write_types, kind.as_str()),
        }
    }

    fn may_write_channel(&self, agent: &str, channel: &str) -> bool {
        match self.perms(agent) {
            None => true,
            Some(None) => false,
            Some(Some(p)) => allows(&p.write_channels, channel),
        }
    }

    /// Unpinned entries in the working view (not yet summarised).
    pub fn working_unpinned(&self) -> u64 {
        self.unpinned_total - self.unpinned_summarized.min(self.unpinned_total)
    }

    /// Whether the policy's pruning threshold is crossed.
    pub fn wants_prune(&self) -> bool {
        let max = self.policy.as_ref().and_then(|p| p.prune_max_entries);
        max.is_some_and(|m| self.working_unpinned() > m)
    }

    /// Decides whether `e` may be appended now (with `expect_subject_seq`), and what the
    /// engine must append with it. Does not change the rules.
    pub(crate) fn check(
        &self,
        e: &RuleEvent<'_>,
        expect_subject_seq: Option<u64>,
    ) -> Result<Effects> {
        if let Some(c) = self.closed {
            return Err(Error::Forbidden(format!(
                "the run was closed at seq {c}; it refuses appends"
            )));
        }
        let mut fx = Effects::default();
        // One open escalation per subject: a second (two picks of one tie at once) would
        // stay open, and block the subject, after the first was resolved.
        if e.kind == EventType::Escalation {
            if let Some(rec) = parse::<EscalationRecord>(e.kind, e.content) {
                if let Some(esc) = self.subjects.get(&rec.subject).and_then(|r| r.blocked_by) {
                    let shown = self.may_read_kind(e.agent, EventType::Escalation);
                    return Err(Error::Escalated {
                        subject: rec.subject,
                        escalation: if shown || e.agent == ENGINE_AGENT {
                            esc
                        } else {
                            0
                        },
                    });
                }
            }
        }
        // The engine's own events (escalations, conflicts) need no permission; a summary
        // it writes still goes through the pruning CAS below.
        if e.agent == ENGINE_AGENT && e.kind != EventType::Summary {
            return Ok(fx);
        }
        // Engine events an agent writes itself act on what others wrote: a summary (a
        // prune) quotes the hypotheses and evidence it replaces, and its writer is
        // answered with it; an escalation (a pick) and a resolution name decisions,
        // actions and hypotheses; closing freezes the run for everyone. Only an agent
        // shown all they quote may write the first three, only an admin may close.
        match e.kind {
            EventType::Summary | EventType::Escalation | EventType::Resolution
                if e.agent != ENGINE_AGENT && !self.may_read_kind(e.agent, e.kind) =>
            {
                return Err(Error::Forbidden(format!(
                    "agent {:?} may not write a {} (run policy: it is not shown every entry type one quotes)",
                    e.agent,
                    e.kind.as_str()
                )));
            }
            EventType::RunClosed if !self.is_admin(e.agent) => {
                return Err(Error::Forbidden(format!(
                    "agent {:?} may not close the run (needs admin)",
                    e.agent
                )));
            }
            _ => {}
        }
        if let (Some(s), Some(want)) = (e.subject, expect_subject_seq) {
            let have = self.subjects.get(s).map_or(0, |r| r.latest_seq);
            if have != want {
                // The seq names an entry: only for an agent shown every entry type.
                let shown = EventType::ALL
                    .iter()
                    .all(|k| self.may_read_type(e.agent, *k));
                return Err(Error::Conflict(if shown {
                    format!("subject {s:?} is at seq {have}, expected {want}: another entry landed since you read it")
                } else {
                    format!("subject {s:?} is not at seq {want}: another entry landed since you read it (its board entry, as you may read it, has the version)")
                }));
            }
        }
        match e.kind {
            k if k.is_client() => {
                if !self.may_write_type(e.agent, k) {
                    return Err(Error::Forbidden(format!(
                        "agent {:?} may not write {} entries (run policy)",
                        e.agent,
                        k.as_str()
                    )));
                }
                if k.is_pinned() {
                    if let Some(s) = e.subject {
                        self.check_action(e, s, &mut fx)?;
                    }
                }
            }
            EventType::Policy => {
                if !self.is_admin(e.agent) {
                    return Err(Error::Forbidden(format!(
                        "agent {:?} may not replace the run's policy (needs admin)",
                        e.agent
                    )));
                }
                serde_json::from_value::<Policy>(e.content.clone())
                    .map_err(|err| Error::invalid("policy", err.to_string()))?
                    .validate()?;
            }
            EventType::ChannelDeclare => {
                let d: ChannelDecl = serde_json::from_value(e.content.clone())
                    .map_err(|err| Error::invalid("channel", err.to_string()))?;
                crate::event::check_id("channel", &d.channel)?;
                if !self.may_write_channel(e.agent, &d.channel) {
                    return Err(Error::Forbidden(format!(
                        "agent {:?} may not write channel {:?}",
                        e.agent, d.channel
                    )));
                }
                if self.channels.contains_key(&d.channel) {
                    return Err(Error::invalid(
                        "channel",
                        format!("{:?} is already declared", d.channel),
                    ));
                }
                if d.max_size_kb == 0 || d.max_size_kb > 1024 {
                    return Err(Error::invalid("max_size_kb", "must be 1..=1024"));
                }
            }
            EventType::ChannelWrite => self.check_channel_write(e, &mut fx)?,
            EventType::Resolution => {
                let r: ResolutionRecord = serde_json::from_value(e.content.clone())
                    .map_err(|err| Error::invalid("resolution", err.to_string()))?;
                let esc = self.escalations.get(&r.escalation).ok_or_else(|| {
                    Error::invalid(
                        "escalation",
                        format!("#{} is not an escalation of this run", r.escalation),
                    )
                })?;
                if let Some(by) = esc.resolved_by {
                    return Err(Error::Conflict(format!(
                        "escalation #{} was already resolved by #{by}",
                        r.escalation
                    )));
                }
                if let Some(w) = r.winner {
                    if !esc.record.entries.contains(&w) {
                        return Err(Error::invalid(
                            "winner",
                            format!(
                                "#{w} is not one of the escalated entries {:?}",
                                esc.record.entries
                            ),
                        ));
                    }
                }
            }
            EventType::Summary => {
                let s: SummaryRecord = serde_json::from_value(e.content.clone())
                    .map_err(|err| Error::invalid("summary", err.to_string()))?;
                if s.from_seq != self.pruned_upto + 1 || s.to_seq < s.from_seq || s.to_seq >= e.seq
                {
                    return Err(Error::Conflict(format!(
                        "summary must cover {}..N below its own seq; another pruner ran first",
                        self.pruned_upto + 1
                    )));
                }
            }
            EventType::RunClosed | EventType::Conflict | EventType::Escalation => {}
            _ => {}
        }
        Ok(fx)
    }

    fn check_action(&self, e: &RuleEvent<'_>, subject: &str, fx: &mut Effects) -> Result<()> {
        let Some(r) = self.subjects.get(subject) else {
            return Ok(());
        };
        if let Some(esc) = r.blocked_by {
            // Its seq only to an agent shown escalations (they quote the entries they
            // are between); 0 to the others.
            let shown = self.may_read_kind(e.agent, EventType::Escalation);
            return Err(Error::Escalated {
                subject: subject.to_string(),
                escalation: if shown { esc } else { 0 },
            });
        }
        if let Some(d) = &r.standing {
            let norm = normalize(e.content);
            if d.agent != e.agent && d.norm != norm && !e.refs.contains(&d.seq) {
                let rec = EscalationRecord {
                    subject: subject.to_string(),
                    reason: format!(
                        "{} #{} by {} contradicts the standing entry #{} by {} and does not build on it",
                        e.kind.as_str(),
                        e.seq,
                        e.agent,
                        d.seq,
                        d.agent
                    ),
                    entries: [d.seq, e.seq],
                    agents: [d.agent.clone(), e.agent.to_string()],
                    norms: [d.norm.clone(), norm],
                };
                fx.after.push((
                    EventType::Escalation,
                    serde_json::to_value(rec).unwrap_or(Value::Null),
                ));
            }
        }
        Ok(())
    }

    fn check_channel_write(&self, e: &RuleEvent<'_>, fx: &mut Effects) -> Result<()> {
        let w: ChannelWrite = serde_json::from_value(e.content.clone())
            .map_err(|err| Error::invalid("channel write", err.to_string()))?;
        // The permission first: it depends on the name alone, so the answer says nothing
        // of whether a channel the agent may not use is declared (it was 403 for a
        // declared one, 400 for another).
        if !self.may_write_channel(e.agent, &w.channel) {
            return Err(Error::Forbidden(format!(
                "agent {:?} may not write channel {:?}",
                e.agent, w.channel
            )));
        }
        let ch = self.channels.get(&w.channel).ok_or_else(|| {
            Error::invalid(
                "channel",
                format!("{:?} is not declared in this run", w.channel),
            )
        })?;
        if ch.decl.kind == ChannelKind::Merge && !w.value.is_object() {
            return Err(Error::invalid(
                "value",
                "a merge channel takes a JSON object (a merge patch)",
            ));
        }
        let stale = match (ch.decl.on_conflict, w.base_version) {
            (ConflictPolicy::Reject, None) => true,
            (_, Some(b)) => b != ch.version,
            (_, None) => false,
        };
        let mut next = ch.value.clone();
        apply_channel(
            ch.decl.kind,
            ch.decl.on_conflict,
            stale,
            &mut next,
            &w.value,
        );
        // The channel's version and size are its state: only for a writer that may read it.
        let reads = self.may_read_channel(e.agent, &w.channel);
        let size = serde_json::to_vec(&next).map_or(usize::MAX, |b| b.len()) as u64;
        if size > ch.decl.max_size_kb * 1024 {
            return Err(Error::invalid(
                "value",
                match reads {
                    true => format!(
                        "channel {:?} would hold {size} bytes, limit {} KiB",
                        w.channel, ch.decl.max_size_kb
                    ),
                    false => format!("channel {:?} would exceed its size limit", w.channel),
                },
            ));
        }
        if stale {
            let rec = ConflictRecord {
                channel: w.channel.clone(),
                agent: e.agent.to_string(),
                other_agent: ch.last_agent.clone().unwrap_or_default(),
                base_version: w.base_version,
                version: ch.version,
                resolution: ch.decl.on_conflict,
            };
            let v = serde_json::to_value(&rec).unwrap_or(Value::Null);
            if ch.decl.on_conflict == ConflictPolicy::Reject {
                fx.refuse = Some(Error::Conflict(match reads {
                    true => format!(
                        "channel {:?} is at version {}, the write was based on {} (policy reject); \
                         recorded as a conflict event",
                        w.channel,
                        ch.version,
                        w.base_version
                            .map_or("nothing".to_string(), |b| b.to_string()),
                    ),
                    false => format!(
                        "channel {:?} is not at the version the write was based on (policy \
                         reject); recorded as a conflict event",
                        w.channel
                    ),
                }));
            }
            fx.after.push((EventType::Conflict, v));
        }
        Ok(())
    }

    /// Applies the next event (in seq order).
    pub fn apply(&mut self, e: &RuleEvent<'_>) {
        match e.kind {
            k if k.is_client() => {
                if !k.is_pinned() {
                    self.unpinned_total += 1;
                }
                if let Some(s) = e.subject {
                    let update = |r: &mut SubjectRules| {
                        r.latest_seq = e.seq;
                        if k.is_pinned() {
                            r.standing = Some(Standing {
                                seq: e.seq,
                                agent: e.agent.to_string(),
                                norm: normalize(e.content),
                            });
                        }
                    };
                    // One lookup, and no copy of the name, for a subject seen before.
                    match self.subjects.get_mut(s) {
                        Some(r) => update(r),
                        None => update(self.subjects.entry(s.to_string()).or_default()),
                    }
                }
            }
            EventType::Policy => {
                if let Some(p) = parse::<Policy>(e.kind, e.content) {
                    self.policy = Some(p);
                }
            }
            EventType::ChannelDeclare => {
                if let Some(d) = parse::<ChannelDecl>(e.kind, e.content) {
                    let value = match d.kind {
                        ChannelKind::Append => Value::Array(Vec::new()),
                        ChannelKind::Replace => Value::Null,
                        ChannelKind::Merge => Value::Object(Map::new()),
                    };
                    self.channels
                        .entry(d.channel.clone())
                        .or_insert(ChannelState {
                            decl: d,
                            version: 0,
                            value,
                            history: Vec::new(),
                            conflicts: Vec::new(),
                            last_agent: None,
                        });
                }
            }
            EventType::ChannelWrite => {
                if let Some(w) = parse::<ChannelWrite>(e.kind, e.content) {
                    if let Some(ch) = self.channels.get_mut(&w.channel) {
                        let stale = match (ch.decl.on_conflict, w.base_version) {
                            (ConflictPolicy::Reject, None) => true,
                            (_, Some(b)) => b != ch.version,
                            (_, None) => false,
                        };
                        apply_channel(
                            ch.decl.kind,
                            ch.decl.on_conflict,
                            stale,
                            &mut ch.value,
                            &w.value,
                        );
                        ch.version = e.seq;
                        ch.history.push(e.seq);
                        ch.last_agent = Some(e.agent.to_string());
                    }
                }
            }
            EventType::Conflict => {
                if let Some(c) = parse::<ConflictRecord>(e.kind, e.content) {
                    if let Some(ch) = self.channels.get_mut(&c.channel) {
                        ch.conflicts.push(e.seq);
                    }
                }
            }
            EventType::Escalation => {
                if let Some(rec) = parse::<EscalationRecord>(e.kind, e.content) {
                    let r = self.subjects.entry(rec.subject.clone()).or_default();
                    r.blocked_by = Some(e.seq);
                    let side = |i: usize| Standing {
                        seq: rec.entries[i],
                        agent: rec.agents[i].clone(),
                        norm: rec.norms[i].clone(),
                    };
                    let sides = [side(0), side(1)];
                    self.escalations.insert(
                        e.seq,
                        EscalationState {
                            record: rec,
                            sides,
                            resolved_by: None,
                        },
                    );
                }
            }
            EventType::Resolution => {
                if let Some(res) = parse::<ResolutionRecord>(e.kind, e.content) {
                    if let Some(esc) = self.escalations.get_mut(&res.escalation) {
                        esc.resolved_by = Some(e.seq);
                        let winner = res
                            .winner
                            .and_then(|w| esc.sides.iter().find(|s| s.seq == w).cloned());
                        if let Some(r) = self.subjects.get_mut(&esc.record.subject) {
                            if r.blocked_by == Some(res.escalation) {
                                r.blocked_by = None;
                            }
                            r.standing = winner;
                        }
                    }
                }
            }
            EventType::Summary => {
                if let Some(s) = parse::<SummaryRecord>(e.kind, e.content) {
                    self.pruned_upto = self.pruned_upto.max(s.to_seq);
                    self.unpinned_summarized += s.summarized;
                }
            }
            EventType::RunClosed => self.closed = Some(e.seq),
            _ => {}
        }
    }
}

fn apply_channel(
    kind: ChannelKind,
    policy: ConflictPolicy,
    stale: bool,
    value: &mut Value,
    w: &Value,
) {
    match kind {
        ChannelKind::Append => {
            if let Value::Array(a) = value {
                a.push(w.clone());
            } else {
                *value = Value::Array(vec![w.clone()]);
            }
        }
        ChannelKind::Replace if stale && policy == ConflictPolicy::Merge => merge_patch(value, w),
        ChannelKind::Replace => *value = w.clone(),
        ChannelKind::Merge => merge_patch(value, w),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7396_examples() {
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (mut t, p, want) in cases {
            merge_patch(&mut t, &p);
            assert_eq!(t, want, "patch {p}");
        }
    }

    #[test]
    fn normalization_ignores_case_space_and_final_dot() {
        assert_eq!(
            normalize(&json!("Roll back  orders-svc.")),
            normalize(&json!("roll back orders-svc"))
        );
        assert_ne!(
            normalize(&json!("roll back")),
            normalize(&json!("scale up"))
        );
    }
}
