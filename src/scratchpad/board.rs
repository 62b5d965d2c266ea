//! The scratchpad operations over a run: policy, channels, the board, the orchestrator's
//! pick, escalations and their resolution. Each write is an event checked by the
//! [`crate::fold::rules`] under the append lock; each read is a view of the fold.

use serde::Serialize;
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::event::{Checked, Event, EventType, ENGINE_AGENT};
use crate::fold::rules::{
    ChannelDecl, ChannelState, ChannelWrite, EscalationRecord, EscalationState, Policy,
    ResolutionRecord,
};
use crate::fold::state::State;
use crate::log::meta::Durability;
use crate::query::options::ReadOptions;
use crate::store::{engine_log_hidden, Store};

/// How many of a subject's seqs a board entry lists by default (`writes` counts them
/// all): the board stays small and current, as seed 004 wants it, however long the run
/// (a full history of every subject was a megabyte at 100,000 events); the whole
/// history is one flag away (`Store::board_with`, `swarm board --history`,
/// `GET .../board?history=true`).
pub const BOARD_HISTORY: usize = 16;

/// One subject on the board: its authoritative value and how it got there.
#[derive(Clone, Debug, Serialize)]
pub struct BoardEntry {
    /// The subject.
    pub subject: String,
    /// Its version: the seq of its latest entry (use it as `expect_subject_seq`).
    pub version: u64,
    /// The latest entry: the authoritative value.
    pub value: Event,
    /// Evidence links of the value.
    pub refs: Vec<u64>,
    /// How many entries the subject has: all of them, however many `history` lists.
    pub writes: usize,
    /// Seqs of the subject's most recent entries, oldest first: the last
    /// [`BOARD_HISTORY`] by default, every one with [`Store::board_with`]`(.., true)`.
    pub history: Vec<u64>,
    /// Hypotheses on the subject.
    pub hypotheses: Vec<u64>,
    /// Open escalation blocking decisions and actions, if any.
    pub blocked_by: Option<u64>,
}

/// The type of the client entry at `seq` on some subject: the fold keeps every
/// hypothesis, decision and action by seq; any other subject entry is evidence.
fn entry_kind(s: &State, seq: u64) -> EventType {
    let is = |v: &[Event]| v.binary_search_by_key(&seq, |e| e.seq).is_ok();
    if s.hypotheses.contains_key(&seq) {
        EventType::Hypothesis
    } else if is(&s.decisions) {
        EventType::Decision
    } else if is(&s.actions) {
        EventType::ActionTaken
    } else {
        EventType::Evidence
    }
}

/// Attempts of one [`Store::pick`] when other writers change the subject meanwhile.
const PICK_ATTEMPTS: u32 = 8;

/// What `pick` did.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PickOutcome {
    /// A decision citing the winner and the losers was appended.
    Picked {
        /// The decision event.
        decision: Event,
        /// Seq of the winning hypothesis.
        winner: u64,
        /// Seqs of the others (they stay in the log as context).
        losers: Vec<u64>,
        /// Which rule decided: `confidence`, `evidence` or `recency`.
        rule: String,
    },
    /// The top hypotheses tie on every rule: escalated instead of guessed.
    Escalated {
        /// The escalation event.
        escalation: Event,
    },
}

/// An escalation as `swarm escalations` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct EscalationView {
    /// Seq of the escalation event.
    pub seq: u64,
    /// What and why.
    pub record: EscalationRecord,
    /// Seq of the resolution, if resolved.
    pub resolved_by: Option<u64>,
}

impl Store {
    fn head(&self, run: &str) -> Result<std::sync::Arc<State>> {
        Ok(self.head_state(run)?.state)
    }

    /// Appends an engine event (a policy, a channel write, a resolution, a close) that
    /// `agent`, a caller's agent, writes: the rules check it as that agent's. The
    /// engine's own name is refused here: its events skip every permission check, so an
    /// agent that could write as it could replace a policy without being its admin.
    pub(crate) fn engine_append(
        &self,
        run: &str,
        agent: &str,
        kind: EventType,
        content: Value,
        subject: Option<String>,
        refs: Vec<u64>,
    ) -> Result<Event> {
        crate::event::refuse_reserved_agent(agent)?;
        self.engine_event(run, agent, kind, content, subject, refs)
    }

    /// [`Store::engine_append`] without refusing the engine's own name: for the engine's
    /// own events (an escalation, an automatic prune's summary) only.
    pub(crate) fn engine_event(
        &self,
        run: &str,
        agent: &str,
        kind: EventType,
        content: Value,
        subject: Option<String>,
        refs: Vec<u64>,
    ) -> Result<Event> {
        let c = Checked::engine(agent, self.user(), kind, content, subject, refs);
        self.append_engine(run, c)
    }

    /// Appends one engine event, durably, to a client's run (never the engine's own
    /// logs), and returns it.
    fn append_engine(&self, run: &str, c: Checked) -> Result<Event> {
        crate::event::check_id("agent_id", &c.agent_id)?;
        crate::event::refuse_engine_run(run)?;
        let v = self.append_checked(run, vec![c], None, Durability::Sync)?;
        v.into_iter()
            .next()
            .ok_or_else(|| Error::invalid("event", "nothing stored"))
    }

    /// Sets the run's policy (permissions, pruning threshold). The first policy may be
    /// set by anyone; replacing one needs an agent with `admin` in it.
    pub fn set_policy(&self, run: &str, agent: &str, policy: &Policy) -> Result<Event> {
        let v =
            serde_json::to_value(policy).map_err(|e| Error::invalid("policy", e.to_string()))?;
        self.engine_append(run, agent, EventType::Policy, v, None, Vec::new())
    }

    /// The run's current policy.
    pub fn policy(&self, run: &str) -> Result<Option<Policy>> {
        let read = || Ok(self.head(run)?.rules.policy.clone());
        match self.is_closed_archive(run)? {
            // Final once closed, and costly to read again (the archive is unpacked
            // whole): kept once read.
            true => self.closed_policy(run, read),
            false => read(),
        }
    }

    /// Declares a channel.
    pub fn declare_channel(&self, run: &str, agent: &str, decl: &ChannelDecl) -> Result<Event> {
        let v = serde_json::to_value(decl).map_err(|e| Error::invalid("channel", e.to_string()))?;
        self.engine_append(run, agent, EventType::ChannelDeclare, v, None, Vec::new())
    }

    /// Writes to a channel. `base_version` is the channel version the writer read
    /// (required by `reject` channels; a stale one is a conflict, see [`crate::fold::rules`]).
    pub fn write_channel(
        &self,
        run: &str,
        agent: &str,
        channel: &str,
        value: Value,
        base_version: Option<u64>,
    ) -> Result<Event> {
        self.write_channel_with_id(run, agent, channel, value, base_version, None)
    }

    /// [`Store::write_channel`] with an idempotency id: a retry of a write whose outcome
    /// was lost returns the stored write (its version moved past `base_version` with it,
    /// so without the id the retry was a conflict that could not tell its own write from
    /// another agent's). The same id with another write is a conflict.
    pub fn write_channel_with_id(
        &self,
        run: &str,
        agent: &str,
        channel: &str,
        value: Value,
        base_version: Option<u64>,
        id: Option<&str>,
    ) -> Result<Event> {
        crate::event::refuse_reserved_agent(agent)?;
        if let Some(id) = id {
            crate::event::check_client_id(id)?;
        }
        let w = ChannelWrite {
            channel: channel.to_string(),
            value,
            base_version,
        };
        let v = serde_json::to_value(&w).map_err(|e| Error::invalid("channel", e.to_string()))?;
        let mut c = Checked::engine(
            agent,
            self.user(),
            EventType::ChannelWrite,
            v,
            None,
            Vec::new(),
        );
        c.id = id.map(str::to_string);
        self.append_engine(run, c)
    }

    /// A channel's state (value, version, history), as `reader` may see it.
    pub fn channel(&self, run: &str, reader: Option<&str>, channel: &str) -> Result<ChannelState> {
        engine_log_hidden(run, reader)?;
        let s = self.head(run)?;
        if let Some(r) = reader {
            if !s.rules.may_read_channel(r, channel) {
                return Err(Error::Forbidden(format!(
                    "agent {r:?} may not read channel {channel:?}"
                )));
            }
        }
        s.rules.channels.get(channel).cloned().ok_or_else(|| {
            Error::invalid(
                "channel",
                format!("{channel:?} is not declared in run {run:?}"),
            )
        })
    }

    /// Declared channel names, as `reader` may see them.
    pub fn channels(&self, run: &str, reader: Option<&str>) -> Result<Vec<String>> {
        engine_log_hidden(run, reader)?;
        let s = self.head(run)?;
        Ok(s.rules
            .channels
            .keys()
            .filter(|c| reader.is_none_or(|r| s.rules.may_read_channel(r, c)))
            .cloned()
            .collect())
    }

    /// The board: each subject's authoritative (latest) entry, its version, its evidence
    /// links, its number of writes and its [`BOARD_HISTORY`] latest seqs. With a
    /// `reader`, subjects whose latest entry's type the reader may not see are left out,
    /// and the others count and list only the entries (and escalation) it may see.
    pub fn board(
        &self,
        run: &str,
        reader: Option<&str>,
        subject: Option<&str>,
    ) -> Result<Vec<BoardEntry>> {
        self.board_with(run, reader, subject, false)
    }

    /// [`Store::board`], with every seq of each subject's history when `full_history`.
    pub fn board_with(
        &self,
        run: &str,
        reader: Option<&str>,
        subject: Option<&str>,
        full_history: bool,
    ) -> Result<Vec<BoardEntry>> {
        engine_log_hidden(run, reader)?;
        let s = self.head(run)?;
        let mut out = Vec::new();
        for (name, st) in &s.subjects {
            if subject.is_some_and(|x| x != name) {
                continue;
            }
            if reader.is_some_and(|r| !s.rules.may_read_type(r, st.latest.kind)) {
                continue;
            }
            // A reader learns nothing of the entries it may not read, not even their seqs
            // or how many there are: `writes`, `history`, `hypotheses` and `blocked_by`
            // count and list only entries of types it is shown.
            let shown = |k: EventType| reader.is_none_or(|r| s.rules.may_read_kind(r, k));
            let seqs: Vec<u64> = match EventType::ALL.iter().all(|k| shown(*k)) {
                true => st.seqs.clone(),
                false => st
                    .seqs
                    .iter()
                    .copied()
                    .filter(|q| shown(entry_kind(&s, *q)))
                    .collect(),
            };
            out.push(BoardEntry {
                subject: name.clone(),
                version: st.latest.seq,
                value: st.latest.clone(),
                refs: st.latest.refs.clone(),
                writes: seqs.len(),
                history: match full_history {
                    true => seqs,
                    false => seqs[seqs.len().saturating_sub(BOARD_HISTORY)..].to_vec(),
                },
                hypotheses: match shown(EventType::Hypothesis) {
                    true => st.hypotheses.clone(),
                    false => Vec::new(),
                },
                blocked_by: s
                    .rules
                    .subjects
                    .get(name)
                    .and_then(|r| r.blocked_by)
                    .filter(|_| shown(EventType::Escalation)),
            });
        }
        if let (Some(x), true) = (subject, out.is_empty()) {
            return Err(Error::invalid(
                "subject",
                format!("no entry on {x:?} in run {run:?}"),
            ));
        }
        Ok(out)
    }

    /// The orchestrator's pick between competing hypotheses on `subject` (seed 000):
    /// highest confidence, then most supporting evidence (evidence entries that ref the
    /// hypothesis), then recency (the hypothesis of the most recently scheduled agent:
    /// the agent whose latest entry is newest). Appends a `decision` by `orchestrator`
    /// citing the winner and the losers; a tie on all three is escalated, never guessed.
    pub fn pick(&self, run: &str, orchestrator: &str, subject: &str) -> Result<PickOutcome> {
        crate::event::refuse_engine_run(run)?;
        // A pick is made again from a fresh state when another writer changed the subject
        // (or opened an escalation on it) between its read and its append, so that
        // concurrent picks store one decision or one escalation, never one each.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.pick_once(run, orchestrator, subject) {
                Err(Error::Conflict(_) | Error::Escalated { .. }) if attempt < PICK_ATTEMPTS => {
                    continue
                }
                r => return r,
            }
        }
    }

    /// One attempt of [`Store::pick`]: an `Error::Conflict` or `Error::Escalated` from
    /// its append means the state it read is gone.
    fn pick_once(&self, run: &str, orchestrator: &str, subject: &str) -> Result<PickOutcome> {
        let s = self.head(run)?;
        // A pick names hypotheses, their agents and seqs: only for an agent shown them.
        if !s.rules.may_read_kind(orchestrator, EventType::Hypothesis) {
            return Err(Error::Forbidden(format!(
                "agent {orchestrator:?} may not pick: the run's policy does not show it hypotheses"
            )));
        }
        let st = s
            .subjects
            .get(subject)
            .ok_or_else(|| Error::invalid("subject", format!("no entry on {subject:?}")))?;
        // An open escalation on the subject stands until a human resolves it: a pick never
        // opens a second one (resolving one left the subject blocked by the other).
        if let Some(esc) = s.rules.subjects.get(subject).and_then(|r| r.blocked_by) {
            if !s.rules.may_read_kind(orchestrator, EventType::Escalation) {
                return Err(Error::Escalated {
                    subject: subject.to_string(),
                    escalation: 0,
                });
            }
            let escalation = self
                .read(
                    run,
                    ReadOptions {
                        from_seq: Some(esc),
                        to_seq: Some(esc),
                        ..ReadOptions::default()
                    },
                )?
                .next()
                .ok_or_else(|| Error::invalid("escalation", format!("#{esc} not found")))??;
            return Ok(PickOutcome::Escalated { escalation });
        }
        let mut cands: Vec<(u64, f64, usize, u64, String)> = st
            .hypotheses
            .iter()
            .filter_map(|h| s.hypotheses.get(h).map(|i| (*h, i)))
            .map(|(h, i)| {
                let recency = s.agents.get(&i.agent).map_or(0, |a| a.last_seq);
                (h, i.confidence, i.support.len(), recency, i.agent.clone())
            })
            .collect();
        if cands.len() < 2 {
            return Err(Error::invalid(
                "subject",
                format!(
                    "{subject:?} has {} hypotheses; a pick needs at least two",
                    cands.len()
                ),
            ));
        }
        // A pick standing over these hypotheses (nothing written on the subject since) is
        // the answer, not a copy of it: picking again must not store a second decision,
        // nor flip it (the pick's own decision made its agent the most recent one, which
        // can turn a recency tie-break the other way).
        let standing = (st.latest.kind == EventType::Decision)
            .then(|| st.latest.meta.as_ref()?.get("pick"))
            .flatten()
            .and_then(|p| {
                let winner = p["winner"].as_u64()?;
                let losers: Vec<u64> = serde_json::from_value(p["losers"].clone()).ok()?;
                let mut picked: Vec<u64> = losers.iter().copied().chain([winner]).collect();
                let mut now: Vec<u64> = cands.iter().map(|c| c.0).collect();
                picked.sort_unstable();
                now.sort_unstable();
                (picked == now)
                    .then(|| (winner, losers, p["rule"].as_str().unwrap_or("").to_string()))
            });
        if let Some((winner, losers, rule)) = standing {
            return Ok(PickOutcome::Picked {
                decision: st.latest.clone(),
                winner,
                losers,
                rule,
            });
        }
        cands.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then(b.2.cmp(&a.2))
                .then(b.3.cmp(&a.3))
                .then(a.0.cmp(&b.0))
        });
        let (w, r) = (&cands[0], &cands[1]);
        let rule = if w.1 != r.1 {
            "confidence"
        } else if w.2 != r.2 {
            "evidence"
        } else if w.3 != r.3 {
            "recency"
        } else {
            let rec = EscalationRecord {
                subject: subject.to_string(),
                reason: format!(
                    "pick: hypotheses #{} ({}) and #{} ({}) tie on confidence {}, evidence {} and recency",
                    w.0, w.4, r.0, r.4, w.1, w.2
                ),
                entries: [r.0.min(w.0), r.0.max(w.0)],
                agents: if r.0 < w.0 { [r.4.clone(), w.4.clone()] } else { [w.4.clone(), r.4.clone()] },
                norms: Default::default(),
            };
            let v = serde_json::to_value(&rec)
                .map_err(|e| Error::invalid("escalation", e.to_string()))?;
            let escalation = self.engine_event(
                run,
                ENGINE_AGENT,
                EventType::Escalation,
                v,
                Some(subject.to_string()),
                vec![w.0, r.0],
            )?;
            return Ok(PickOutcome::Escalated { escalation });
        };
        let losers: Vec<u64> = cands[1..].iter().map(|c| c.0).collect();
        let mut refs = vec![w.0];
        refs.extend(&losers);
        refs.truncate(crate::event::REFS_MAX);
        let text = format!(
            "pick on {subject:?}: hypothesis #{} by {} (confidence {}, {} supporting evidence) over {} by {rule}",
            w.0,
            w.4,
            w.1,
            w.2,
            losers.iter().map(|l| format!("#{l}")).collect::<Vec<_>>().join(", ")
        );
        let mut ev = crate::event::NewEvent::new(orchestrator, EventType::Decision, text);
        ev.subject = Some(subject.to_string());
        ev.refs = refs;
        // Only on the state this pick read.
        ev.expect_subject_seq = Some(st.latest.seq);
        ev.meta = json!({"pick": {"winner": w.0, "losers": losers, "rule": rule}})
            .as_object()
            .cloned();
        let decision = self.append(run, ev, Durability::Sync)?;
        Ok(PickOutcome::Picked {
            decision,
            winner: w.0,
            losers,
            rule: rule.to_string(),
        })
    }

    /// Resolves an escalation (a human's call), unblocking its subject. `winner`, one of
    /// the escalated entries, becomes the standing one.
    pub fn resolve(
        &self,
        run: &str,
        by: &str,
        escalation: u64,
        winner: Option<u64>,
        note: &str,
    ) -> Result<Event> {
        crate::event::refuse_engine_run(run)?;
        // A human's call is kept with its reason: the one thing a later reader needs.
        if note.trim().is_empty() {
            return Err(Error::invalid(
                "note",
                "empty: say why the escalation is resolved so",
            ));
        }
        let head = self.head(run)?;
        let subject = head
            .rules
            .escalations
            .get(&escalation)
            .map(|e| e.record.subject.clone());
        // Only to an agent shown escalations: to the others the rules' refusal says no
        // more than that it may not resolve.
        if subject.is_none() && head.rules.may_read_kind(by, EventType::Escalation) {
            // (Said here: the refs check below would call it "not an earlier event".)
            return Err(Error::invalid(
                "escalation",
                format!(
                    "#{escalation} is not an escalation of this run (swarm escalations lists them)"
                ),
            ));
        }
        let r = ResolutionRecord {
            escalation,
            winner,
            note: note.to_string(),
        };
        let v =
            serde_json::to_value(&r).map_err(|e| Error::invalid("resolution", e.to_string()))?;
        self.engine_append(run, by, EventType::Resolution, v, subject, vec![escalation])
    }

    /// Escalations of the run (open ones only unless `all`).
    pub fn escalations(&self, run: &str, all: bool) -> Result<Vec<EscalationView>> {
        self.escalations_as(run, all, None)
    }

    /// [`Store::escalations`] for a read made as `reader`: none for an agent the run's
    /// policy does not show escalations ([`crate::fold::rules::Rules::may_read_kind`]:
    /// they quote decisions, actions or hypotheses).
    pub fn escalations_as(
        &self,
        run: &str,
        all: bool,
        reader: Option<&str>,
    ) -> Result<Vec<EscalationView>> {
        engine_log_hidden(run, reader)?;
        let s = self.head(run)?;
        if reader.is_some_and(|r| !s.rules.may_read_kind(r, EventType::Escalation)) {
            return Ok(Vec::new());
        }
        Ok(s.rules
            .escalations
            .iter()
            .filter(|(_, e)| all || e.resolved_by.is_none())
            .map(|(seq, e): (&u64, &EscalationState)| EscalationView {
                seq: *seq,
                record: e.record.clone(),
                resolved_by: e.resolved_by,
            })
            .collect())
    }
}
