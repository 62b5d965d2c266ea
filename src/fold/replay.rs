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
    let (mut state, mut boundary, mut walk) = match start {
        Some((state, info)) => {
            stats.from_checkpoint = Some(info.seq);
            let walk = FrameWalk::new(
                p.storage.clone(),
                p.run_dir.clone(),
                &p.run_id,
                Some((info.end(), info.seq + 1)),
            )?;
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
            return Ok(Replayed {
                state,
                stats,
                boundary,
            });
        }
    }
    fold(
        p,
        &mut walk,
        target,
        &mut state,
        &mut stats,
        &mut boundary,
        &mut progress,
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
    Ok(Replayed {
        state,
        stats,
        boundary,
    })
}

/// Applies the events after `from` (a frame boundary whose state is `state`) up to the
/// visible head: how a cached head state is brought up to date.
pub(crate) fn advance(p: &RunPaths, mut state: State, from: CheckpointInfo) -> Result<Replayed> {
    let mut walk = FrameWalk::new(
        p.storage.clone(),
        p.run_dir.clone(),
        &p.run_id,
        Some((from.end(), from.seq + 1)),
    )?;
    let mut stats = ReplayStats::default();
    let mut boundary = Some(from);
    fold(
        p,
        &mut walk,
        Target::Head,
        &mut state,
        &mut stats,
        &mut boundary,
        &mut |_| {},
    )?;
    Ok(Replayed {
        state,
        stats,
        boundary,
    })
}

/// Applies the walk's events to `state` up to `target`, frame by frame, borrowed from the
/// read buffer (see [`State::apply_ref`]). `boundary` ends at the frame boundary at the
/// state's head, or `None` when the target stops inside a frame.
fn fold(
    p: &RunPaths,
    walk: &mut FrameWalk,
    target: Target,
    state: &mut State,
    stats: &mut ReplayStats,
    boundary: &mut Option<CheckpointInfo>,
    progress: &mut dyn FnMut(u64),
) -> Result<()> {
    let mut failed = None;
    walk.run(&mut |events, at| {
        for (i, e) in events.iter().enumerate() {
            if !target.admits(e.seq, e.ts) {
                return false;
            }
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
    failed.map_or(Ok(()), Err)
}
