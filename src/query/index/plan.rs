//! The read planner: from a frozen [`IndexSnapshot`] and a read's filters, which frames to
//! fetch and how to group them into contiguous reads.

use crate::query::index::cell::IndexSnapshot;
use crate::query::index::format::{Field, READ_GAP_BYTES, READ_RUN_BYTES_MAX};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::event::ts::Ts;
use crate::log::segment::{self};
use crate::log::storage::StorageFile;
use crate::query::options::ReadOptions;

/// One frame a planned read fetches.
#[derive(Debug)]
pub(crate) struct PlannedFrame {
    pub off: u64,
    pub len: u64,
    pub first_seq: u64,
    pub events: u64,
    pub ts: Ts,
}

/// One contiguous read of a segment covering one or more wanted frames.
pub(crate) struct ReadRun {
    pub seg_base: u64,
    pub file: Arc<dyn StorageFile>,
    pub start: u64,
    pub end: u64,
    pub frames: Vec<PlannedFrame>,
}

impl ReadRun {
    /// The segment's path (built only for error messages: it costs an allocation).
    pub(crate) fn path(&self, dir: &Path) -> PathBuf {
        segment::segment_path(dir, self.seg_base)
    }
}

/// The frames a filtered read must fetch, computed segment by segment from the postings.
pub(crate) struct Plan {
    pub(crate) snap: IndexSnapshot,
    pub(crate) keys: Vec<(Field, String)>,
    pub(crate) lo: u64,
    pub(crate) hi: u64,
    /// Hits up to here surely match the time range; those in `(hi_sure, hi]` may not (a
    /// frame whose events straddle `until`), so `last` does not count them.
    pub(crate) hi_sure: u64,
    /// Next segment (position in the snapshot) whose hits are not computed yet.
    pub(crate) next_seg: usize,
    /// Wanted frames, per segment: (segment position, frame indexes, next to read).
    pub(crate) queue: VecDeque<(usize, Vec<usize>, usize)>,
}

/// The key filters of a read, as index fields.
pub(crate) fn key_filters(opts: &ReadOptions) -> Vec<(Field, String)> {
    let mut keys = Vec::new();
    if let Some(k) = opts.kind {
        keys.push((Field::Type, k.as_str().to_string()));
    }
    if let Some(a) = &opts.agent {
        keys.push((Field::Agent, a.clone()));
    }
    if let Some(u) = &opts.user {
        keys.push((Field::User, u.clone()));
    }
    if let Some(s) = &opts.subject {
        keys.push((Field::Subject, s.clone()));
    }
    keys
}

/// Whether a read gains from the index at all.
pub(crate) fn useful_for(opts: &ReadOptions) -> bool {
    !opts.full_scan
        && (opts.from_seq.is_some_and(|s| s > 1)
            || opts.since.is_some()
            || opts.last.is_some()
            || !key_filters(opts).is_empty())
}

/// How an index-backed read proceeds.
pub(crate) enum Access {
    /// Fetch only the planned frames, then scan what the index does not cover.
    Plan(Plan),
    /// Start scanning at an indexed frame: (segment base, offset, its first seq, ts before).
    Seek(u64, u64, u64, Ts),
    /// Start scanning where the index ends (same fields).
    SeekCovered(u64, u64, u64, Ts),
    /// Nothing to gain: scan.
    Scan,
}

impl Plan {
    /// Chooses how to read with this snapshot.
    pub(crate) fn access(snap: IndexSnapshot, opts: &ReadOptions) -> Access {
        let Some((cov_pos, next_seq, _)) = snap.covered() else {
            return Access::Scan;
        };
        let mut lo = opts.from_seq.unwrap_or(1).max(1);
        let mut hi = opts.to_seq.unwrap_or(u64::MAX);
        let mut hi_sure = hi;
        if let Some(t) = opts.since {
            lo = lo.max(snap.seq_since(t));
        }
        if let Some(t) = opts.until {
            let (sure, maybe) = snap.seq_until(t);
            hi = hi.min(maybe);
            hi_sure = hi_sure.min(sure);
        }
        let keys = key_filters(opts);
        if keys.is_empty() && opts.last.is_none() {
            if lo >= next_seq {
                let ts = Ts(snap.segs.last().map_or(0, |s| s.last_ts()));
                return Access::SeekCovered(cov_pos.seg, cov_pos.off, next_seq, ts);
            }
            return match snap.seek(lo) {
                Some((base, off, first, ts)) if first > 1 => Access::Seek(base, off, first, ts),
                _ => Access::Scan,
            };
        }
        let mut plan = Plan {
            snap,
            keys,
            lo,
            hi,
            hi_sure,
            next_seg: 0,
            queue: VecDeque::new(),
        };
        if let Some(n) = opts.last {
            plan.plan_last(n);
        }
        Access::Plan(plan)
    }

    /// Highest seq the read can return (`u64::MAX` when open).
    pub(crate) fn hi(&self) -> u64 {
        self.hi
    }

    pub(crate) fn snapshot(&self) -> &IndexSnapshot {
        &self.snap
    }

    pub(crate) fn seg_frames(&self, k: usize, hits: &[u32]) -> Vec<usize> {
        let s = &self.snap.segs[k];
        let mut frames: Vec<usize> = Vec::with_capacity(hits.len());
        for &h in hits {
            let i = match frames.last() {
                // Hits ascend; most share or follow the previous frame.
                Some(&p) if s.frame_events(p) + u64::from(s.frame_seq[p]) > u64::from(h) => p,
                _ => s.frame_of(h),
            };
            if frames.last() != Some(&i) {
                frames.push(i);
            }
        }
        frames
    }

    pub(crate) fn keys(&self) -> Vec<(Field, &str)> {
        self.keys.iter().map(|(f, k)| (*f, k.as_str())).collect()
    }

    /// Plans the frames of the last `n` hits, walking segments from the end.
    pub(crate) fn plan_last(&mut self, n: usize) {
        let keys = self.keys();
        let mut need = n;
        let mut parts = Vec::new();
        for k in (0..self.snap.segs.len()).rev() {
            if need == 0 {
                break;
            }
            let s = &self.snap.segs[k];
            // Hits above `hi_sure` may fail the time filter: take them all, uncounted.
            let mut hits = if self.hi > self.hi_sure {
                s.hits(&keys, self.lo.max(self.hi_sure.saturating_add(1)), self.hi)
            } else {
                Vec::new()
            };
            let sure = s.last_hits(&keys, self.lo, self.hi.min(self.hi_sure), need);
            need -= sure.len();
            hits.splice(0..0, sure);
            let frames = self.seg_frames(k, &hits);
            if !frames.is_empty() {
                parts.push((k, frames, 0));
            }
        }
        parts.reverse();
        self.queue = parts.into();
        self.next_seg = self.snap.segs.len();
    }

    /// Drops what [`Plan::plan_last`] planned: every hit is planned again, segment by
    /// segment, as for a read without `last` (for a reader that is not shown every event,
    /// whose last `n` are not the index's last `n` hits).
    pub(crate) fn forget_last(&mut self) {
        self.queue.clear();
        self.next_seg = 0;
    }

    /// The next contiguous read, or `None` when every planned frame was handed out.
    pub(crate) fn next_run(&mut self) -> Option<ReadRun> {
        loop {
            if let Some((k, frames, at)) = self.queue.front_mut() {
                if *at < frames.len() {
                    let s = &self.snap.segs[*k];
                    let first = frames[*at];
                    let start = s.frame_off[first];
                    let mut end = s.frame_end(first);
                    let mut planned = Vec::new();
                    while *at < frames.len() {
                        let i = frames[*at];
                        let (off, fend) = (s.frame_off[i], s.frame_end(i));
                        if !planned.is_empty()
                            && (off - end > READ_GAP_BYTES || fend - start > READ_RUN_BYTES_MAX)
                        {
                            break;
                        }
                        planned.push(PlannedFrame {
                            off,
                            len: fend - off,
                            first_seq: s.frame_first_seq(i),
                            events: s.frame_events(i),
                            ts: Ts(s.frame_ts[i]),
                        });
                        end = fend;
                        *at += 1;
                    }
                    return Some(ReadRun {
                        seg_base: s.base,
                        file: self.snap.files[*k].clone(),
                        start,
                        end,
                        frames: planned,
                    });
                }
                self.queue.pop_front();
                continue;
            }
            if self.next_seg >= self.snap.segs.len() {
                return None;
            }
            let k = self.next_seg;
            self.next_seg += 1;
            let s = &self.snap.segs[k];
            if s.base > self.hi {
                self.next_seg = self.snap.segs.len();
                return None;
            }
            let hits = s.hits(&self.keys(), self.lo, self.hi);
            let frames = self.seg_frames(k, &hits);
            if !frames.is_empty() {
                self.queue.push_back((k, frames, 0));
            }
        }
    }
}
