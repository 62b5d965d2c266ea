//! Replay and time travel: the [`State`] of a run at any seq or time, from the nearest
//! valid checkpoint plus the events after it (or from the start when none is usable).

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::checkpoint::{self, CheckpointInfo};
use crate::error::Result;
use crate::event::Event;
use crate::read::{read_marks, EventIter, ReadOptions};
use crate::state::State;
use crate::storage::Storage;
use crate::ts::Ts;

/// Which point of a run to reconstruct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Everything visible now.
    Head,
    /// The state right after this seq.
    Seq(u64),
    /// The state after the last event at or before this time.
    Time(Ts),
}

impl Target {
    fn admits(&self, e: &Event) -> bool {
        match *self {
            Target::Head => true,
            Target::Seq(s) => e.seq <= s,
            Target::Time(t) => e.ts <= t,
        }
    }

    fn admits_checkpoint(&self, c: &CheckpointInfo) -> bool {
        match *self {
            Target::Head => true,
            Target::Seq(s) => c.seq <= s,
            Target::Time(t) => c.ts <= t,
        }
    }
}

/// A reconstructed state and how it was obtained.
#[derive(Clone, Debug)]
pub struct Replayed {
    /// The state.
    pub state: State,
    /// Stats of the reconstruction.
    pub stats: ReplayStats,
    /// The frame boundary at the state's head, when the head is one (checkpointable).
    pub boundary: Option<CheckpointInfo>,
}

/// How a state was reconstructed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReplayStats {
    /// Seq of the checkpoint it started from, if any.
    pub from_checkpoint: Option<u64>,
    /// Checkpoints found unusable (damaged, or not matching the log) and skipped.
    pub checkpoints_skipped: u64,
    /// Events applied after the checkpoint.
    pub events_applied: u64,
}

/// Where a run's files are.
#[derive(Clone)]
pub(crate) struct RunPaths {
    pub storage: Arc<dyn Storage>,
    pub run_dir: PathBuf,
    pub ck_dir: PathBuf,
    pub run_id: String,
}

/// Reconstructs the state at `target`. `progress` gets the events applied so far.
pub(crate) fn state_at(
    p: &RunPaths,
    target: Target,
    mut progress: impl FnMut(u64),
) -> Result<Replayed> {
    let visible = read_marks(&*p.storage, &p.run_dir)?.visible;
    let mut stats = ReplayStats::default();
    let mut start: Option<(State, CheckpointInfo)> = None;
    for seq in checkpoint::list(&*p.storage, &p.ck_dir)? {
        let path = p.ck_dir.join(checkpoint::checkpoint_name(seq));
        match checkpoint::load(&*p.storage, &path) {
            Ok((state, info)) => {
                if !target.admits_checkpoint(&info) {
                    continue;
                }
                if info.end() > visible || !checkpoint::matches_log(&*p.storage, &p.run_dir, &info)?
                {
                    tracing::warn!(checkpoint = %path.display(), "checkpoint does not match the log; trying an older one");
                    stats.checkpoints_skipped += 1;
                    continue;
                }
                if state.run_id != p.run_id {
                    tracing::warn!(checkpoint = %path.display(), "checkpoint of another run; skipped");
                    stats.checkpoints_skipped += 1;
                    continue;
                }
                start = Some((state, info));
                break;
            }
            Err(e) => {
                tracing::warn!(checkpoint = %path.display(), error = %e, "damaged checkpoint; trying an older one");
                stats.checkpoints_skipped += 1;
            }
        }
    }
    let (mut state, mut boundary, mut it) = match start {
        Some((state, info)) => {
            stats.from_checkpoint = Some(info.seq);
            let it = EventIter::new_at(
                p.storage.clone(),
                p.run_dir.clone(),
                &p.run_id,
                info.end(),
                info.seq + 1,
                ReadOptions::default(),
            )?;
            (state, Some(info), it)
        }
        None => (
            State::new(&p.run_id),
            None,
            EventIter::new(
                p.storage.clone(),
                p.run_dir.clone(),
                &p.run_id,
                ReadOptions::default(),
            )?,
        ),
    };
    if let Target::Seq(s) = target {
        if state.head_seq >= s && s > 0 {
            return Ok(Replayed {
                state,
                stats,
                boundary,
            });
        }
    }
    while let Some(e) = it.next() {
        let e = e?;
        if !target.admits(&e) {
            break;
        }
        state.apply(&e);
        stats.events_applied += 1;
        if stats.events_applied.is_multiple_of(65_536) {
            progress(stats.events_applied);
        }
        boundary = it.at_frame_end().then(|| CheckpointInfo {
            seq: e.seq,
            segment: it.position().seg,
            frame_start: it.frame_start(),
            frame_end: it.position().off,
            ts: e.ts,
        });
    }
    progress(stats.events_applied);
    Ok(Replayed {
        state,
        stats,
        boundary,
    })
}

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

/// Computes what was learned between `a` and `b` (swapped if `a` is the newer).
pub fn diff(a: &State, b: &State, store: &crate::Store, run: &str) -> Result<Diff> {
    let (a, b) = if a.head_seq <= b.head_seq {
        (a, b)
    } else {
        (b, a)
    };
    let entries: Vec<Event> = store
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
            Some(sa) if sa.latest.seq != sb.latest.seq => changed_subjects.push(SubjectChange {
                subject: k.clone(),
                before: sa.latest.clone(),
                after: sb.latest.clone(),
            }),
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

/// What one agent had been able to see at a state's head.
#[derive(Clone, Debug, Serialize)]
pub struct AgentView {
    /// The agent.
    pub agent: String,
    /// The point (head seq of the state).
    pub at_seq: u64,
    /// Its time.
    pub at_ts: Option<Ts>,
    /// Entries visible to the agent at that point (every agent sees every entry).
    pub visible_entries: u64,
    /// The agent's own entries by then.
    pub own_entries: u64,
    /// Seq of its last own entry, if any.
    pub last_own_seq: Option<u64>,
    /// Entries by peers after its last own entry: what it may not have acted on yet.
    pub unseen_since_last_write: Vec<Event>,
    /// The authoritative entry per subject at that point.
    pub subjects: std::collections::BTreeMap<String, Event>,
}

/// Builds an agent's view of a state.
pub fn agent_view(s: &State, agent: &str, store: &crate::Store, run: &str) -> Result<AgentView> {
    let own = s.agents.get(agent);
    let last_own = own.map(|a| a.last_seq);
    let unseen: Vec<Event> = store
        .read(
            run,
            ReadOptions {
                from_seq: Some(last_own.unwrap_or(0) + 1),
                to_seq: Some(s.head_seq),
                ..ReadOptions::default()
            },
        )?
        .filter(|e| e.as_ref().map_or(true, |e| e.agent_id != agent))
        .collect::<Result<_>>()?;
    Ok(AgentView {
        agent: agent.to_string(),
        at_seq: s.head_seq,
        at_ts: s.head_ts,
        visible_entries: s.head_seq,
        own_entries: own.map_or(0, |a| a.counts.total),
        last_own_seq: last_own,
        unseen_since_last_write: unseen,
        subjects: s
            .subjects
            .iter()
            .map(|(k, v)| (k.clone(), v.latest.clone()))
            .collect(),
    })
}

/// Applies the events after `from` (a frame boundary whose state is `state`) up to the
/// visible head: how a cached head state is brought up to date.
pub(crate) fn advance(p: &RunPaths, mut state: State, from: CheckpointInfo) -> Result<Replayed> {
    let mut it = EventIter::new_at(
        p.storage.clone(),
        p.run_dir.clone(),
        &p.run_id,
        from.end(),
        from.seq + 1,
        ReadOptions::default(),
    )?;
    let mut stats = ReplayStats::default();
    let mut boundary = Some(from);
    while let Some(e) = it.next() {
        let e = e?;
        state.apply(&e);
        stats.events_applied += 1;
        boundary = it.at_frame_end().then(|| CheckpointInfo {
            seq: e.seq,
            segment: it.position().seg,
            frame_start: it.frame_start(),
            frame_end: it.position().off,
            ts: e.ts,
        });
    }
    Ok(Replayed {
        state,
        stats,
        boundary,
    })
}
