//! Time-travel views of a run over the store: what was learned between two points
//! (`swarm replay --diff`) and what one agent could see at a point (`--agent`).

use serde::Serialize;

use crate::error::Result;
use crate::event::ts::Ts;
use crate::event::{Event, EventType};
use crate::fold::state::State;
use crate::query::options::ReadOptions;
use crate::store::Store;

/// What the swarm learned between two states of one run (`from` older than `to`).
#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    /// Head seq of the older state.
    pub from_seq: u64,
    /// Head seq of the newer state.
    pub to_seq: u64,
    /// Head time of the older state.
    pub from_ts: Option<Ts>,
    /// Head time of the newer state.
    pub to_ts: Option<Ts>,
    /// Entries written in between, per agent.
    pub by_agent: std::collections::BTreeMap<String, u64>,
    /// Subjects first mentioned in between.
    pub new_subjects: Vec<String>,
    /// Subjects whose authoritative (latest) entry changed: (subject, before, after).
    pub changed_subjects: Vec<SubjectChange>,
    /// Decisions made in between.
    pub decisions: Vec<Event>,
    /// Actions taken in between.
    pub actions: Vec<Event>,
    /// Every entry written in between.
    pub entries: Vec<Event>,
}

/// A subject whose latest entry changed.
#[derive(Clone, Debug, Serialize)]
pub struct SubjectChange {
    /// The subject.
    pub subject: String,
    /// Its latest entry before.
    pub before: Event,
    /// Its latest entry after.
    pub after: Event,
}

/// What one agent had been able to see at a state's head.
#[derive(Clone, Debug, Serialize)]
pub struct AgentView {
    /// The agent.
    pub agent: String,
    /// The point (head seq of the state).
    pub at_seq: u64,
    /// Its time.
    pub at_ts: Option<Ts>,
    /// Entries (and engine events) the agent may read, of those written by that point.
    pub visible_entries: u64,
    /// The agent's own entries by then.
    pub own_entries: u64,
    /// Seq of its last own entry, if any.
    pub last_own_seq: Option<u64>,
    /// Entries by peers after its last own entry: what it may not have acted on yet (the
    /// latest [`UNSEEN_MAX`] of them; `unseen_count` counts them all).
    pub unseen_since_last_write: Vec<Event>,
    /// How many entries by peers follow its last own entry.
    pub unseen_count: u64,
    /// The authoritative entry per subject at that point.
    pub subjects: std::collections::BTreeMap<String, Event>,
}

/// Most unseen entries an [`AgentView`] lists (the latest ones).
pub const UNSEEN_MAX: usize = 1_000;

impl Store {
    /// Computes what was learned between `a` and `b` (swapped if `a` is the newer).
    pub fn diff(&self, run: &str, a: &State, b: &State) -> Result<Diff> {
        let (a, b) = if a.head_seq <= b.head_seq {
            (a, b)
        } else {
            (b, a)
        };
        let entries: Vec<Event> = self
            .read(
                run,
                ReadOptions {
                    from_seq: Some(a.head_seq + 1),
                    to_seq: Some(b.head_seq),
                    ..ReadOptions::default()
                },
            )?
            .collect::<Result<_>>()?;
        let mut by_agent = std::collections::BTreeMap::new();
        for e in &entries {
            *by_agent.entry(e.agent_id.clone()).or_default() += 1;
        }
        let mut new_subjects = Vec::new();
        let mut changed_subjects = Vec::new();
        for (k, sb) in &b.subjects {
            match a.subjects.get(k) {
                None => new_subjects.push(k.clone()),
                Some(sa) if sa.latest.seq != sb.latest.seq => {
                    changed_subjects.push(SubjectChange {
                        subject: k.clone(),
                        before: sa.latest.clone(),
                        after: sb.latest.clone(),
                    })
                }
                _ => {}
            }
        }
        Ok(Diff {
            from_seq: a.head_seq,
            to_seq: b.head_seq,
            from_ts: a.head_ts,
            to_ts: b.head_ts,
            by_agent,
            new_subjects,
            changed_subjects,
            decisions: b.decisions[a.decisions.len().min(b.decisions.len())..].to_vec(),
            actions: b.actions[a.actions.len().min(b.actions.len())..].to_vec(),
            entries,
        })
    }
    /// Builds an agent's view of a state: only what the run's policy lets the agent read.
    /// The policy in force now decides, not the one of the replayed point (as every read
    /// does): a policy set or tightened later hides earlier entries too.
    pub fn agent_view(&self, run: &str, s: &State, agent: &str) -> Result<AgentView> {
        crate::store::engine_log_hidden(run, Some(agent))?;
        let head = self.head_state(run)?;
        let rules = &head.state.rules;
        let own = s.agents.get(agent);
        let last_own = own.map(|a| a.last_seq);
        // Bounded: an agent that never wrote has the whole run unseen.
        let mut unseen: std::collections::VecDeque<Event> = Default::default();
        let mut unseen_count = 0u64;
        for e in self.read(
            run,
            ReadOptions {
                from_seq: Some(last_own.unwrap_or(0) + 1),
                to_seq: Some(s.head_seq),
                reader: Some(agent.to_string()),
                ..ReadOptions::default()
            },
        )? {
            let e = e?;
            if e.agent_id == agent {
                continue;
            }
            unseen_count += 1;
            if unseen.len() == UNSEEN_MAX {
                unseen.pop_front();
            }
            unseen.push_back(e);
        }
        let unseen: Vec<Event> = unseen.into();
        // What the agent may read by then: counted per type from the state, channel events
        // by their channel (a read of that type). It said `head_seq`, which told an agent
        // how many entries were hidden from it.
        let mut visible_entries = 0u64;
        for (&kind, &n) in &s.counts.by_type {
            if !rules.may_read_kind(agent, kind) {
                continue;
            }
            if matches!(
                kind,
                EventType::ChannelDeclare | EventType::ChannelWrite | EventType::Conflict
            ) {
                let opts = ReadOptions {
                    to_seq: Some(s.head_seq),
                    kind: Some(kind),
                    reader: Some(agent.to_string()),
                    ..ReadOptions::default()
                };
                for e in self.read(run, opts)? {
                    e?;
                    visible_entries += 1;
                }
            } else {
                visible_entries += n;
            }
        }
        Ok(AgentView {
            agent: agent.to_string(),
            at_seq: s.head_seq,
            at_ts: s.head_ts,
            visible_entries,
            own_entries: own.map_or(0, |a| a.counts.total),
            last_own_seq: last_own,
            unseen_since_last_write: unseen,
            unseen_count,
            subjects: s
                .subjects
                .iter()
                .filter(|(_, v)| rules.may_read_event(agent, &v.latest))
                .map(|(k, v)| (k.clone(), v.latest.clone()))
                .collect(),
        })
    }
}

/// What one agent is shown of a run followed live (`swarm tail --as-agent`,
/// `swarm memory-events --as-agent`): the run's read rules as of now, taken again when a
/// policy event passes (a new policy applies from there on). The server's streams keep the
/// same rule over their own state (`serve::sse`).
pub struct AgentFilter {
    run: String,
    agent: String,
    rules: crate::fold::rules::Rules,
}

impl AgentFilter {
    /// The filter for `agent` on `run`; the engine's own logs are no agent's to read.
    pub fn new(store: &Store, run: &str, agent: &str) -> Result<AgentFilter> {
        crate::store::engine_log_hidden(run, Some(agent))?;
        Ok(AgentFilter {
            run: run.to_string(),
            agent: agent.to_string(),
            rules: store.head_state(run)?.state.rules.clone(),
        })
    }

    /// Whether the agent is shown `e`, the next event of the run in seq order.
    pub fn shows(&mut self, store: &Store, e: &Event) -> Result<bool> {
        if e.kind == crate::event::EventType::Policy {
            self.rules = store.head_state(&self.run)?.state.rules.clone();
        }
        Ok(self.rules.may_read_event(&self.agent, e))
    }
}
