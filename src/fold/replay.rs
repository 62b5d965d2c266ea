//! Replay and time travel: the [`State`] of a run at any seq or time, from the nearest
//! valid checkpoint plus the events after it (or from the start when none is usable).

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::event::ts::Ts;
use crate::fold::checkpoint::{self, CheckpointInfo};
use crate::fold::state::State;
use crate::log::segment;
use crate::log::storage::Storage;
use crate::log::watermark::read_marks;
use crate::query::read::FrameWalk;

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
    fn admits(&self, seq: u64, ts: Ts) -> bool {
        match *self {
            Target::Head => true,
            Target::Seq(s) => seq <= s,
            Target::Time(t) => ts <= t,
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
///
/// A checkpoint that folded an event the log now declares lost (a `log_damaged` event
/// after it whose lost seqs start at or before the checkpoint's seq: a record in the
/// middle repaired after the checkpoint was written, where `swarm repair` did not see
/// that checkpoint, e.g. one kept in another checkpoint directory or restored from a
/// backup) is not used: the state is made again from a checkpoint before the loss, so
/// that with or without checkpoints it is the same.
pub(crate) fn state_at(
    p: &RunPaths,
    target: Target,
    mut progress: impl FnMut(u64),
) -> Result<Replayed> {
    let mut below = u64::MAX;
    let mut skipped = 0;
    loop {
        let (mut r, lost_from) = state_at_below(p, target, below, &mut progress)?;
        r.stats.checkpoints_skipped += skipped;
        match (r.stats.from_checkpoint, lost_from) {
            (Some(c), Some(lost)) if lost <= c => {
                tracing::warn!(
                    checkpoint = c,
                    lost_from = lost,
                    "checkpoint folded events the log declares lost; using an older one"
                );
                below = lost;
                skipped = r.stats.checkpoints_skipped + 1;
            }
            _ => return Ok(r),
        }
    }
}

/// [`state_at`] from checkpoints before seq `below` only; also the first seq the events
/// folded after the checkpoint declare lost, if any.
fn state_at_below(
    p: &RunPaths,
    target: Target,
    below: u64,
    progress: &mut impl FnMut(u64),
) -> Result<(Replayed, Option<u64>)> {
    let visible = read_marks(&*p.storage, &p.run_dir)?.visible;
    let mut stats = ReplayStats::default();
    let mut start: Option<(State, CheckpointInfo)> = None;
    for seq in checkpoint::list(&*p.storage, &p.ck_dir)? {
        if seq >= below {
            continue;
        }
        let path = p.ck_dir.join(checkpoint::checkpoint_name(seq));
        match checkpoint::load(&*p.storage, &path) {
            Ok((state, info)) => {
                if !target.admits_checkpoint(&info) {
                    continue;
                }
                if info.end() > visible {
                    // Written by a process that saw a later mark than the one read here:
                    // a race, not damage.
                    tracing::debug!(checkpoint = %path.display(), "checkpoint is newer than the visible mark read; trying an older one");
                    stats.checkpoints_skipped += 1;
                    continue;
                }
                if !checkpoint::matches_log(&*p.storage, &p.run_dir, &info)? {
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
            // Removed by another process's retention between the listing and the load.
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(checkpoint = %path.display(), "checkpoint removed meanwhile; trying an older one");
                stats.checkpoints_skipped += 1;
            }
            Err(e) => {
                tracing::warn!(checkpoint = %path.display(), error = %e, "damaged checkpoint; trying an older one");
                stats.checkpoints_skipped += 1;
            }
        }
    }
    if let (Some((_, info)), false) = (&start, target == Target::Head) {
        // A target before the `log_damaged` event would not fold it (the head's fold
        // does, and `state_at` goes back a checkpoint then): when a listed loss lies at
        // or before the checkpoint, the events after it are looked through for one.
        // Only then, and never for the head, whose state every cache miss rebuilds: a
        // read of the rest of the log, without folding, on a run repaired mid-log.
        let q = crate::log::quarantine::read(&*p.storage, &p.run_dir);
        if q.ranges.iter().any(|r| r.lost_from <= info.seq) {
            if let Some(lost) = declared_lost_after(p, info)?.filter(|l| *l <= info.seq) {
                let r = Replayed {
                    state: State::new(&p.run_id),
                    stats: ReplayStats {
                        from_checkpoint: Some(info.seq),
                        ..stats
                    },
                    boundary: None,
                };
                return Ok((r, Some(lost)));
            }
        }
    }
    let (mut state, mut boundary, mut walk) = match start {
        Some((state, info)) => {
            stats.from_checkpoint = Some(info.seq);
            let walk = after(p, &info)?;
            (state, Some(info), walk)
        }
        None => (
            State::new(&p.run_id),
            None,
            FrameWalk::new(p.storage.clone(), p.run_dir.clone(), &p.run_id, None)?,
        ),
    };
    if let Target::Seq(s) = target {
        if state.head_seq >= s && s > 0 {
            // (A loss declared after `s` cannot touch the state at `s`.)
            let r = Replayed {
                state,
                stats,
                boundary,
            };
            return Ok((r, None));
        }
    }
    let lost_from = fold(
        p,
        &mut walk,
        target,
        &mut state,
        &mut stats,
        &mut boundary,
        progress,
    )?;
    progress(stats.events_applied);
    if let Target::Seq(s) = target {
        // A seq in a gap that `swarm repair` declared lost (the run goes on past it): the
        // state there is the state at the last seq before it, as for a time.
        let head =
            crate::log::watermark::read_marks(&*p.storage, &p.run_dir).map_or(0, |m| m.visible_seq);
        if s > state.head_seq && s > head {
            // Past the head there is no state to show: clamping would answer a question
            // the caller did not ask.
            return Err(Error::invalid(
                "at-seq",
                format!(
                    "seq {s} is past the run's head (seq {}); the run has no state there yet",
                    head.max(state.head_seq)
                ),
            ));
        }
    }
    let r = Replayed {
        state,
        stats,
        boundary,
    };
    Ok((r, lost_from))
}

/// The first seq that a `log_damaged` event after `from` declares lost, if any.
fn declared_lost_after(p: &RunPaths, from: &CheckpointInfo) -> Result<Option<u64>> {
    let mut walk = after(p, from)?;
    let mut lost_from: Option<u64> = None;
    walk.run(&mut |events, _| {
        events.iter().for_each(|e| note_lost(e, &mut lost_from));
        true
    })?;
    Ok(lost_from)
}

/// The walk of the events after frame boundary `from`.
fn after(p: &RunPaths, from: &CheckpointInfo) -> Result<FrameWalk> {
    FrameWalk::new(
        p.storage.clone(),
        p.run_dir.clone(),
        &p.run_id,
        Some((from.end(), from.seq + 1)),
    )
}

/// Lowers `lost_from` to the first seq `e` declares lost, when it is a `log_damaged`.
fn note_lost(e: &crate::event::EventRef<'_>, lost_from: &mut Option<u64>) {
    if e.kind == crate::event::EventType::LogDamaged {
        let mut content = serde_json::Deserializer::from_str(e.content.get());
        if let Some((l, _)) = crate::event::LogDamaged::declared(e.kind, &mut content) {
            *lost_from = Some(lost_from.map_or(l, |x| x.min(l)));
        }
    }
}

/// Applies the events after `from` (a frame boundary whose state is `state`) up to the
/// visible head: how a cached head state is brought up to date.
pub(crate) fn advance(p: &RunPaths, mut state: State, from: CheckpointInfo) -> Result<Replayed> {
    let mut walk = after(p, &from)?;
    let mut stats = ReplayStats::default();
    let mut boundary = Some(from);
    let lost_from = fold(
        p,
        &mut walk,
        Target::Head,
        &mut state,
        &mut stats,
        &mut boundary,
        &mut |_| {},
    )?;
    if lost_from.is_some_and(|l| l <= from.seq) {
        // The state brought up to date folded events since declared lost (repaired by
        // another process): made again from the log.
        return state_at(p, Target::Head, |_| {});
    }
    Ok(Replayed {
        state,
        stats,
        boundary,
    })
}

/// Applies the walk's events to `state` up to `target`, frame by frame, borrowed from the
/// read buffer (see [`State::apply_ref`]). `boundary` ends at the frame boundary at the
/// state's head, or `None` when the target stops inside a frame. Returns the first seq
/// that a `log_damaged` event among those applied declares lost, if any.
fn fold(
    p: &RunPaths,
    walk: &mut FrameWalk,
    target: Target,
    state: &mut State,
    stats: &mut ReplayStats,
    boundary: &mut Option<CheckpointInfo>,
    progress: &mut dyn FnMut(u64),
) -> Result<Option<u64>> {
    let mut failed = None;
    let mut lost_from: Option<u64> = None;
    walk.run(&mut |events, at| {
        for (i, e) in events.iter().enumerate() {
            if !target.admits(e.seq, e.ts) {
                return false;
            }
            note_lost(e, &mut lost_from);
            if let Err(reason) = state.apply_ref(e) {
                let path = segment::segment_path(&p.run_dir, at.seg);
                failed = Some(Error::corrupt(&path, at.start, e.seq, reason));
                return false;
            }
            stats.events_applied += 1;
            if stats.events_applied.is_multiple_of(65_536) {
                progress(stats.events_applied);
            }
            *boundary = (i + 1 == events.len()).then_some(CheckpointInfo {
                seq: e.seq,
                segment: at.seg,
                frame_start: at.start,
                frame_end: at.end,
                ts: e.ts,
            });
        }
        true
    })?;
    failed.map_or(Ok(lost_from), Err)
}
