//! The reader side of a run's log: ordered, checked, filtered iteration, and `verify`.
//!
//! Readers take no lock. They read up to the visibility watermark (see
//! [`crate::log::watermark`]), check every frame's CRC and every event's seq (gap-free) and ts
//! (non-decreasing), and tell a torn tail (damage in the last segment with nothing valid
//! after it: a write in progress or a writer that died, repaired by the next writer) from
//! corruption (anything else), which is an error naming the file, offset and seq unless
//! the caller asked to skip it, and then every skip is recorded.
//!
//! Size: one state machine, `EventIter` (scan, index plan, seek, fall-back, damage and
//! gaps), whose branches share its fields; split by branch, they would pass a dozen
//! fields between files.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use serde::Serialize;

use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::event::{Event, EventRef, EventSpans};
use crate::log::frame::{self, Decoded};
use crate::log::quarantine::{self, Quarantine, Range as QuarantinedRange};
use crate::log::segment::{self, FrameReader, Step};
use crate::log::storage::{file_len, OpenMode, Storage};
use crate::log::watermark::{read_marks, Pos};
pub(crate) use crate::query::check::{check_frame, check_frame_refs};
use crate::query::index::{Access, IndexCell, IndexSnapshot, Plan, ReadRun};
use crate::query::options::{ReadOptions, Visibility};

/// A range of damaged bytes a reader skipped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// Segment file.
    pub segment: PathBuf,
    /// First damaged byte.
    pub offset: u64,
    /// Where reading resumed (the next whole record), or the end of the file.
    pub resumed_at: u64,
    /// The seq the damaged record should have carried.
    pub seq: u64,
    /// Which check failed.
    pub reason: String,
    /// For seqs missing at a segment's end (it was cut short, or the segment after it
    /// is gone): the last one missing. `seq..=gap_to` are lost, no bytes skipped.
    #[serde(skip)]
    pub(crate) gap_to: Option<u64>,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes {}..{} (seq {}): {}",
            self.segment.display(),
            self.offset,
            self.resumed_at,
            self.seq,
            self.reason
        )
    }
}

/// Bytes at the end of the last segment that are not (yet) a whole record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TornTail {
    /// Segment file.
    pub segment: PathBuf,
    /// Offset of the first byte after the last whole record.
    pub offset: u64,
    /// How many bytes follow it.
    pub bytes: u64,
}

/// Which events a reader may see (see [`EventIter::with_permission`]).
pub(crate) type Permission = dyn Fn(&Event) -> bool + Send + Sync;

/// Iterates a run's events in seq order. Built by [`crate::Store::read`].
pub struct EventIter {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    run_id: String,
    bases: Vec<u64>,
    /// Index in `bases` of the segment being read.
    idx: usize,
    reader: Option<FrameReader>,
    limit: Option<Pos>,
    pending: VecDeque<Event>,
    expect_seq: Option<u64>,
    last_ts: Ts,
    opts: ReadOptions,
    returned: usize,
    done: bool,
    skipped: Vec<Skipped>,
    // The run's quarantine (`swarm repair`), read when damage is first met.
    quarantine: Option<Quarantine>,
    // Quarantined ranges stepped over so far.
    quarantined: Vec<QuarantinedRange>,
    torn_tail: Option<TornTail>,
    /// A segment opened wanting an earlier seq than its base, not yet checked: the seq
    /// wanted, the base, and where the segment before it ended.
    gap: Option<(u64, u64, Pos)>,
    /// Where the last segment read to its end ended (its whole frames).
    seg_end: Pos,
    /// The durable mark when the read began (see [`EventIter::with_index`]).
    acked: Pos,
    /// The end-of-log check against the durable mark ran, or the loss it looks for was
    /// reported already (the last segment ends below the mark: one report, not two).
    end_checked: bool,
    frames: u64,
    bytes: u64,
    pos: Pos,
    frame_start: u64,
    /// The reader's permission, when reading as an agent (the run's read rules, given by
    /// the store: this layer sits below the fold and knows no rules).
    perm: Option<Box<Permission>>,
    /// Where to start instead of a segment's first byte: a frame boundary and the seq of
    /// the frame there (from a checkpoint or the index).
    start: Option<(Pos, u64)>,
    /// The index-driven part of the read, while it lasts.
    plan: Option<Plan>,
    /// The index a seek offset came from: a failure right there is the index's fault, not
    /// the log's, so the segment is then read again from its start.
    seek_from: Option<Arc<IndexCell>>,
    /// Events below this seq are not returned (returned already, before a fallback).
    min_seq: u64,
    /// With `opts.last`: the matching events, once the read is complete.
    tail: Option<VecDeque<Event>>,
    tail_returned: usize,
    /// With `opts.last`: the error that ended the read early, returned after the events
    /// read before it (as a read without `last` returns them before its error).
    tail_err: Option<Error>,
    run_buf: Vec<u8>,
}

/// Where a frame lies in the log: what a checkpoint taken right after it records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FrameBounds {
    /// Base seq of its segment.
    pub seg: u64,
    /// Offset of its first byte.
    pub start: u64,
    /// Offset just after its last byte.
    pub end: u64,
}

/// Takes each whole, checked frame of a [`FrameWalk`]: its events and bounds. Returns
/// false to stop the walk.
pub(crate) type FrameSink<'s> = dyn FnMut(&[EventRef<'_>], FrameBounds) -> bool + 's;

/// A [`FrameSink`] that also gets the text of the frame the events are borrowed from.
type TextSink<'s> = dyn FnMut(&str, &[EventRef<'_>], FrameBounds) -> bool + 's;

/// What one frame-walk hands its sink at once: the text of its frames (each frame's
/// events of `frames`), the walk's frames detached from the read buffer as
/// [`EventSpans`], so that the reading thread can go on to the next frames.
struct Chunk {
    text: String,
    events: Vec<EventSpans>,
    /// Each frame: its bounds and the end of its events in `events`.
    frames: Vec<(FrameBounds, usize)>,
}

impl Chunk {
    /// Events and bytes a chunk gathers before it is handed over: few enough that the
    /// two threads overlap from the first megabyte, many enough that one hand-over (a
    /// channel send and perhaps a wake-up) is paid per thousands of events, not per
    /// frame (a log appended one event at a time has one event per frame).
    const EVENTS: usize = 4096;
    const BYTES: usize = 1 << 20;

    fn new() -> Chunk {
        Chunk {
            text: String::new(),
            events: Vec::new(),
            frames: Vec::new(),
        }
    }

    /// Adds a frame: its text, and its events as places in the chunk's text (measured in
    /// the frame's own text, which they borrow from, then moved by where it lands).
    fn push(&mut self, text: &str, events: &[EventRef<'_>], bounds: FrameBounds) {
        let base = self.text.len();
        self.events
            .extend(events.iter().map(|e| e.spans(text, base)));
        self.text.push_str(text);
        self.frames.push((bounds, self.events.len()));
    }

    fn clear(&mut self) {
        self.text.clear();
        self.events.clear();
        self.frames.clear();
    }

    fn full(&self) -> bool {
        self.events.len() >= Chunk::EVENTS || self.text.len() >= Chunk::BYTES
    }

    /// Hands each frame to `sink` in order; false when it said stop.
    fn drain(&self, sink: &mut FrameSink<'_>) -> bool {
        let mut from = 0;
        let mut events = Vec::new();
        for &(bounds, to) in &self.frames {
            events.clear();
            events.extend(
                self.events[from..to]
                    .iter()
                    .map(|e| e.event_ref(&self.text)),
            );
            from = to;
            if !sink(&events, bounds) {
                return false;
            }
        }
        true
    }
}

/// A read of every event of a run, frame by frame, for a fold: the events of each frame
/// are handed over borrowed from the read buffer, with their content unparsed, instead
/// of being built one by one as owned [`Event`]s. Everything else is the plain read's
/// ([`EventIter`]: the same visibility limit, CRC, seq, ts and run checks, and the same
/// handling of torn tails and damage), which it reuses; it has no filters and no index.
pub(crate) struct FrameWalk {
    it: EventIter,
}

impl FrameWalk {
    /// Walks up to the visible mark from the start of the log, or from `start`: a frame
    /// boundary and the seq of the frame there (as a checkpoint records).
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        run_id: &str,
        start: Option<(Pos, u64)>,
    ) -> Result<Self> {
        let opts = ReadOptions::default();
        let it = match start {
            None => EventIter::new(storage, dir, run_id, opts)?,
            Some((pos, seq)) => EventIter::new_at(storage, dir, run_id, pos, seq, opts)?,
        };
        Ok(FrameWalk { it })
    }

    /// Hands every following frame to `sink`, in log order, until it returns false or the
    /// log ends. An error stops the walk.
    ///
    /// A long walk (past [`FrameWalk::PIPELINE_BYTES`]) runs on two threads: this one
    /// calls `sink`, a second one reads, checks and parses the frames ahead of it, in
    /// chunks of [`Chunk::EVENTS`] events (parsing the events' JSON is about half of a
    /// replay's time, the fold the other half). The sink sees the same frames in the same
    /// order either way, and the walk stops at the same point: at the sink's first false,
    /// or at the first error of the log (after every frame before it was handed over).
    pub(crate) fn run(&mut self, sink: &mut FrameSink<'_>) -> Result<()> {
        if self.long() {
            if let Some(walked) = self.run_on_two_threads(sink) {
                return walked;
            }
        }
        while self
            .it
            .fill(Some(&mut |_: &str, events: &[EventRef<'_>], b| {
                sink(events, b)
            }))?
        {}
        Ok(())
    }

    /// [`FrameWalk::run`] with a reading thread; `None` when that thread could not be
    /// started (nothing was read then).
    fn run_on_two_threads(&mut self, sink: &mut FrameSink<'_>) -> Option<Result<()>> {
        let stop = AtomicBool::new(false);
        let it = &mut self.it;
        std::thread::scope(|s| {
            // Made inside the scope: if the sink panics, unwinding drops `rx` before the
            // scope waits for the reader, whose next send then fails and ends it.
            let (tx, rx) = mpsc::sync_channel::<Chunk>(2);
            // Drained chunks go back to the reader and are filled again: no allocation
            // per chunk, and no memory freed by the thread that did not allocate it.
            let (back_tx, back_rx) = mpsc::channel::<Chunk>();
            let stop = &stop;
            let reader = std::thread::Builder::new().name("swarm-walk".into());
            let reader = reader.spawn_scoped(s, move || -> Result<()> {
                let mut chunk = Chunk::new();
                let mut forward = |text: &str, events: &[EventRef<'_>], bounds| {
                    chunk.push(text, events, bounds);
                    if chunk.full() {
                        let mut next = back_rx.try_recv().unwrap_or_else(|_| Chunk::new());
                        next.clear();
                        let full = std::mem::replace(&mut chunk, next);
                        return !stop.load(Ordering::Relaxed) && tx.send(full).is_ok();
                    }
                    true
                };
                let ended = loop {
                    match it.fill(Some(&mut forward)) {
                        Ok(true) => {}
                        Ok(false) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                };
                // What was read before the end (or the error) is handed over first.
                if !chunk.frames.is_empty() {
                    let _ = tx.send(chunk);
                }
                ended
            });
            let reader = match reader {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(error = %e, "no thread for the walk; reading on this one");
                    return None;
                }
            };
            let mut stopped = false;
            for chunk in rx.iter() {
                if !chunk.drain(sink) {
                    stopped = true;
                    stop.store(true, Ordering::Relaxed);
                    break;
                }
                let _ = back_tx.send(chunk);
            }
            // The reader's next hand-over fails, and it stops.
            drop(rx);
            let read = match reader.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            // A sink that stopped was given everything it asked for; what the reader met
            // past that point is none of the walk's business.
            Some(match stopped {
                true => Ok(()),
                false => read,
            })
        })
    }

    /// Bytes of log from which a walk runs on two threads: below it (a cached head state
    /// brought up to date, a short run) a thread would cost more than it saves.
    const PIPELINE_BYTES: u64 = 4 << 20;

    /// Whether this walk covers more than [`FrameWalk::PIPELINE_BYTES`] of the log, or
    /// more than one segment.
    fn long(&self) -> bool {
        let it = &self.it;
        let Some(limit) = it.limit else {
            return true;
        };
        let start = match it.start {
            Some((pos, _)) => pos,
            None => Pos {
                seg: it.bases.get(it.idx).copied().unwrap_or(0),
                off: 0,
            },
        };
        limit.seg != start.seg || limit.off.saturating_sub(start.off) >= FrameWalk::PIPELINE_BYTES
    }
}

impl EventIter {
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        run_id: &str,
        opts: ReadOptions,
    ) -> Result<EventIter> {
        let marks = read_marks(&*storage, &dir)?;
        let limit = match opts.visibility {
            Visibility::Visible => Some(marks.visible),
            Visibility::Written => None,
        };
        EventIter::with_index(storage, dir, run_id, opts, limit, marks.durable, None)
    }

    /// A read up to `limit` (`None`: everything written), through `index` when given.
    /// `durable` is the durable mark read before anything else of the read (before the
    /// segments are listed): every byte below it was durable before this read began, so
    /// damage there is real, never a write in progress.
    pub(crate) fn with_index(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        run_id: &str,
        opts: ReadOptions,
        limit: Option<Pos>,
        durable: Pos,
        index: Option<IndexSnapshot>,
    ) -> Result<EventIter> {
        // Never past the read's own limit: stopping there is not a short segment.
        let acked = limit.map_or(durable, |l| durable.min(l));
        let bases = match &index {
            // The index listed the segments up to what it covers, which is the limit.
            Some(snap) if limit.is_some() && snap.covered().map(|c| c.0) == limit => {
                snap.bases().to_vec()
            }
            _ => segment::list_segments(&*storage, &dir)?,
        };
        let from = opts.from_seq.unwrap_or(1).max(1);
        // Start in the last segment whose first seq is at or before `from`.
        let idx = bases.iter().rposition(|&b| b <= from).unwrap_or(0);
        let mut it = EventIter {
            storage,
            dir,
            run_id: run_id.to_string(),
            bases,
            idx,
            reader: None,
            limit,
            pending: VecDeque::new(),
            expect_seq: None,
            last_ts: Ts(0),
            opts,
            returned: 0,
            done: false,
            skipped: Vec::new(),
            quarantine: None,
            quarantined: Vec::new(),
            torn_tail: None,
            gap: None,
            seg_end: Pos::default(),
            acked,
            end_checked: false,
            frames: 0,
            bytes: 0,
            pos: Pos::default(),
            frame_start: 0,
            perm: None,
            start: None,
            plan: None,
            seek_from: None,
            min_seq: 0,
            tail: None,
            tail_returned: 0,
            tail_err: None,
            run_buf: Vec::new(),
        };
        if let Some(snap) = index {
            let cell = snap.cell().clone();
            match Plan::access(snap, &it.opts) {
                Access::Plan(p) => it.plan = Some(p),
                Access::Seek(base, off, first, ts) => it.seek(base, off, first, ts, Some(cell)),
                // Where the index ends: a frame boundary it checked (the frame before it is
                // verified on every refresh), and the spot where a scan reports any damage
                // that stopped the index, which is then the log's, not the index's.
                Access::SeekCovered(base, off, first, ts) => it.seek(base, off, first, ts, None),
                Access::Scan => {}
            }
        }
        Ok(it)
    }

    /// Continues the read at an indexed frame: `off` in segment `base`, holding `first`.
    fn seek(
        &mut self,
        base: u64,
        off: u64,
        first: u64,
        ts_before: Ts,
        cell: Option<Arc<IndexCell>>,
    ) {
        let Some(i) = self.bases.iter().position(|&b| b == base) else {
            // The segment is gone from the listing: scan instead; nothing is lost.
            return;
        };
        self.idx = i;
        self.reader = None;
        self.start = Some((Pos { seg: base, off }, first));
        self.expect_seq = Some(first);
        self.last_ts = ts_before;
        self.seek_from = cell.filter(|_| off > 0);
    }

    /// The index disagreed with the log at seq `seq`: drop it and read that segment again
    /// from its start, returning nothing below `seq` (returned already).
    fn fall_back(&mut self, seq: u64, reason: &str) {
        if let Some(cell) = self.seek_from.take() {
            cell.invalidate(reason);
        }
        if let Some(plan) = self.plan.take() {
            plan.snapshot().cell().invalidate(reason);
        }
        self.idx = self.bases.iter().rposition(|&b| b <= seq).unwrap_or(0);
        // The segment's index file disagrees with the log (it passed the load checks,
        // which look at where it ends): without it, the next process rebuilds that
        // segment's index from the log instead of falling back on every read. Derived
        // data, so removing it is always safe.
        if let Some(&base) = self.bases.get(self.idx) {
            let p = self
                .dir
                .join(crate::query::index::INDEX_DIR)
                .join(crate::query::index::index_file_name(base));
            match self.storage.remove_file(&p) {
                Ok(()) => {
                    tracing::debug!(file = %p.display(), "removed an index file that disagrees with the log")
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(file = %p.display(), error = %e, "cannot remove an index file that disagrees with the log")
                }
            }
        }
        self.reader = None;
        self.start = None;
        self.expect_seq = None;
        self.last_ts = Ts(0);
        self.min_seq = self.min_seq.max(seq);
    }

    /// Reads the next planned frames into `pending`. Returns false when the plan is over
    /// (the read goes on by scanning whatever the index does not cover) or was abandoned.
    fn fill_from_plan(&mut self) -> Result<bool> {
        let Some(plan) = self.plan.as_mut() else {
            return Ok(false);
        };
        let Some(run) = plan.next_run() else {
            let Some(plan) = self.plan.take() else {
                return Ok(false);
            };
            let snap = plan.snapshot();
            match snap.covered() {
                // Nothing past the index can be in range.
                Some((_, next, _)) if plan.hi() < next => self.idx = self.bases.len(),
                Some((pos, next, ts)) => {
                    // Where the index ends (see `Access::SeekCovered`).
                    self.seek(pos.seg, pos.off, next, ts, None);
                }
                None => {}
            }
            return Ok(false);
        };
        let mut buf = std::mem::take(&mut self.run_buf);
        let r = self.read_run(&run, &mut buf);
        self.run_buf = buf;
        r
    }

    fn read_run(&mut self, run: &ReadRun, buf: &mut Vec<u8>) -> Result<bool> {
        buf.clear();
        buf.resize((run.end - run.start) as usize, 0);
        match run.file.read_exact_at(buf, run.start) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                let first = run.frames.first().map_or(1, |f| f.first_seq);
                self.fall_back(first, "segment shorter than the index says");
                return Ok(!self.pending.is_empty());
            }
            Err(e) => return Err(e).ctx("read", &run.path(&self.dir)),
        }
        for f in &run.frames {
            let a = (f.off - run.start) as usize;
            let bytes = &buf[a..a + f.len as usize];
            let checked = match frame::decode(bytes) {
                Decoded::Frame { payload, len } if len as u64 == f.len => {
                    check_frame(payload, Some(f.first_seq), self.last_ts, &self.run_id)
                        .map_err(|(_, reason)| reason)
                }
                Decoded::Frame { .. } => Err("frame length differs from the index".into()),
                Decoded::Incomplete => Err("incomplete frame where the index points".into()),
                Decoded::Corrupt(reason) => Err(reason.to_string()),
            };
            match checked {
                Ok(events)
                    if events.len() as u64 == f.events
                        && events.last().map(|e| e.ts) == Some(f.ts) =>
                {
                    self.frames += 1;
                    self.bytes += f.len;
                    self.pos = Pos {
                        seg: run.seg_base,
                        off: f.off + f.len,
                    };
                    self.last_ts = f.ts;
                    self.expect_seq = events.last().map(|e| e.seq + 1);
                    self.pending.extend(events);
                }
                other => {
                    let reason = match other {
                        Err(reason) => reason,
                        Ok(_) => "frame holds other events than the index says".into(),
                    };
                    let reason = format!(
                        "{} at byte {}: {reason}",
                        run.path(&self.dir).display(),
                        f.off
                    );
                    self.fall_back(f.first_seq, &reason);
                    return Ok(!self.pending.is_empty());
                }
            }
        }
        Ok(true)
    }

    /// Like `new`, but starts at `pos`, a frame boundary whose frame begins with
    /// `next_seq` (as recorded by a checkpoint). Nothing before it is read.
    pub(crate) fn new_at(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        run_id: &str,
        pos: Pos,
        next_seq: u64,
        opts: ReadOptions,
    ) -> Result<EventIter> {
        let mut it = EventIter::new(storage, dir, run_id, opts)?;
        match it.bases.iter().position(|&b| b == pos.seg) {
            Some(i) => {
                it.idx = i;
                it.start = Some((pos, next_seq));
                it.pos = pos;
            }
            // The segment is gone (an empty segment at the very end is only created by a
            // rotation, so this means the checkpoint points past the log): start after it.
            None => {
                it.idx = it
                    .bases
                    .iter()
                    .position(|&b| b > pos.seg)
                    .unwrap_or(it.bases.len())
            }
        }
        Ok(it)
    }

    /// Damaged ranges skipped so far (only with `skip_corrupt`).
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// Quarantined ranges (damage `swarm repair` declared lost) stepped over so far.
    pub fn quarantined(&self) -> &[QuarantinedRange] {
        &self.quarantined
    }

    /// Whether damage found at `offset` of segment `base`, with the next valid frame at
    /// `next`, is a range `swarm repair` quarantined (same start, same end): then the
    /// read steps over it and expects the seq after its lost ones. Anything else is
    /// damage as before. The list is read when damage is first met.
    fn step_over_quarantined(&mut self, base: u64, offset: u64, next: Option<u64>) -> bool {
        let (storage, dir) = (&self.storage, &self.dir);
        let q = self
            .quarantine
            .get_or_insert_with(|| quarantine::read(&**storage, dir));
        let Some(r) = q.at(base, offset).filter(|r| r.end == next).cloned() else {
            return false;
        };
        self.expect_seq = Some(r.lost_to.saturating_add(1));
        self.quarantined.push(r);
        true
    }

    /// Whether the gap between the segment just read (the next seq it wanted: `want`)
    /// and the next segment (first seq `base`) is a range `swarm repair` listed: seqs
    /// lost at the end of that segment, or with a whole segment gone. The range must
    /// name that segment, run to its end, and hold exactly the missing seqs.
    fn step_over_listed_gap(&mut self, want: u64, base: u64) -> bool {
        // Before the first segment there is: the run's first segment, gone.
        let prev = match self.idx {
            0 => 1,
            i => self.bases[i - 1],
        };
        let (storage, dir) = (&self.storage, &self.dir);
        let q = self
            .quarantine
            .get_or_insert_with(|| quarantine::read(&**storage, dir));
        let Some(r) = q.gap(prev, want, base).cloned() else {
            return false;
        };
        self.quarantined.push(r);
        true
    }

    /// The torn or in-progress tail found at the end, if any.
    pub fn torn_tail(&self) -> Option<&TornTail> {
        self.torn_tail.as_ref()
    }

    /// How many segment files the read covers.
    pub fn segments(&self) -> usize {
        self.bases.len()
    }

    /// Whole frames read so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Bytes of whole frames read so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn is_last_segment(&self) -> bool {
        self.idx + 1 >= self.bases.len()
    }

    fn open_segment(&mut self) -> Result<bool> {
        let Some(&base) = self.bases.get(self.idx) else {
            return Ok(false);
        };
        let seg_limit = match self.limit {
            Some(l) if base > l.seg => return Ok(false),
            Some(l) if base == l.seg => Some(l.off),
            _ => None,
        };
        let path = segment::segment_path(&self.dir, base);
        if let Some((pos, next_seq)) = self.start.take().filter(|(p, _)| p.seg == base) {
            self.reader = Some(FrameReader::open(
                &*self.storage,
                &path,
                pos.off,
                seg_limit,
            )?);
            self.expect_seq = Some(next_seq);
            return Ok(true);
        }
        self.reader = Some(FrameReader::open(&*self.storage, &path, 0, seg_limit)?);
        // A read from the start wants seq 1 of the first segment there is: a first
        // segment that starts later means the ones before it are gone.
        let from_start = self.idx == 0 && self.opts.from_seq.unwrap_or(1) < base;
        let expect = self.expect_seq.or(from_start.then_some(1));
        match expect {
            // Seqs lost at a segment's end (a sealed segment cut short, or one missing
            // in between) that `swarm repair` listed: stepped over as listed, only if
            // the gap is exactly the listed one.
            Some(want) if want < base && self.step_over_listed_gap(want, base) => {}
            // A later base may follow a repaired segment: its first event must declare
            // the gap (checked with the frame, in `check_frame`).
            Some(want) if want < base => {
                self.expect_seq = Some(want);
                // Where the seqs went missing: the end of the segment read before, or
                // the start of the run's first segment (base 1), gone.
                let end = match self.idx {
                    0 => Pos { seg: 1, off: 0 },
                    i if self.seg_end.seg == self.bases[i - 1] => self.seg_end,
                    // (Not read to its end here: then its length.)
                    i => {
                        let prev = self.bases[i - 1];
                        let path = segment::segment_path(&self.dir, prev);
                        Pos {
                            seg: prev,
                            off: file_len(&*self.storage, &path)?,
                        }
                    }
                };
                self.gap = Some((want, base, end));
                return Ok(true);
            }
            Some(want) if want != base => {
                let reason = format!("segment starts at seq {base}, expected {want}");
                if !self.opts.skip_corrupt {
                    return Err(Error::corrupt(&path, 0, want, reason));
                }
                self.skip(path, 0, 0, want, reason);
            }
            _ => {}
        }
        self.expect_seq = Some(base);
        Ok(true)
    }

    /// Reads the next frame into `pending`, or with `sink` (a [`FrameWalk`]) hands its
    /// events to it. Returns false at the end of the log (or when `sink` says stop).
    fn fill(&mut self, mut sink: Option<&mut TextSink<'_>>) -> Result<bool> {
        loop {
            // A walk is built without an index, so it never has a plan.
            if self.plan.is_some() && sink.is_none() {
                if self.fill_from_plan()? {
                    return Ok(true);
                }
                continue;
            }
            if self.reader.is_none() && !self.open_segment()? {
                self.check_marked_segments_exist()?;
                return Ok(false);
            }
            let last_segment = self.is_last_segment();
            let Some(r) = self.reader.as_mut() else {
                return Ok(false);
            };
            match r.step()? {
                Step::Frame { offset, len } => {
                    let path = r.path().to_path_buf();
                    self.frames += 1;
                    self.bytes += len;
                    self.pos = Pos {
                        seg: self.bases[self.idx],
                        off: offset + len,
                    };
                    self.frame_start = offset;
                    let (expect, last_ts) = (self.expect_seq, self.last_ts);
                    let checked = match sink.as_deref_mut() {
                        None => {
                            check_frame(r.payload(), expect, last_ts, &self.run_id).map(|events| {
                                let last = events.last().map(|e| (e.seq, e.ts));
                                // Nothing below `min_seq`: after a fall-back the plan
                                // handed those out already (returned, or still pending).
                                let min = self.min_seq;
                                self.pending
                                    .extend(events.into_iter().filter(|e| e.seq >= min));
                                (last, true)
                            })
                        }
                        Some(sink) => check_frame_refs(r.payload(), expect, last_ts, &self.run_id)
                            .map(|(text, events)| {
                                let last = events.last().map(|e| (e.seq, e.ts));
                                let bounds = FrameBounds {
                                    seg: self.pos.seg,
                                    start: offset,
                                    end: offset + len,
                                };
                                // Nothing below `min_seq` (none in a walk: it has no
                                // index to fall back from).
                                let skip =
                                    events.iter().take_while(|e| e.seq < self.min_seq).count();
                                let rest = &events[skip..];
                                (last, rest.is_empty() || sink(text, rest, bounds))
                            }),
                    };
                    // The first frame of a segment opened past the seq wanted, whole and
                    // following on from the segment's own base: seqs missing between two
                    // segments, nothing else wrong with it.
                    let missing = self.gap.take().filter(|&(_, base, _)| {
                        offset == 0
                            && checked.is_err()
                            && check_frame(r.payload(), Some(base), last_ts, &self.run_id).is_ok()
                    });
                    match checked {
                        Ok((last, go_on)) => {
                            self.seek_from = None;
                            if let Some((seq, ts)) = last {
                                self.expect_seq = Some(seq + 1);
                                self.last_ts = ts;
                            }
                            return Ok(go_on);
                        }
                        Err((_, reason)) if self.seek_from.is_some() => {
                            let seq = self.expect_seq.unwrap_or(1);
                            self.fall_back(
                                seq,
                                &format!("{} at byte {offset}: {reason}", path.display()),
                            );
                        }
                        // Seqs missing between two segments, not declared: reported at the
                        // end of the segment that lost them; a read that skips damage
                        // goes on with this frame.
                        Err(_) if missing.is_some() => {
                            let (want, base, end) = missing.unwrap_or_default();
                            let at = segment::segment_path(&self.dir, end.seg);
                            let next = segment::segment_name(base);
                            let what = match self.storage.exists(&at) {
                                true => format!(
                                    "this segment ends at byte {} and the next one, {next}, starts at seq {base} (acknowledged records cut off, or a segment lost)",
                                    end.off
                                ),
                                false => format!(
                                    "this segment is gone and the next one, {next}, starts at seq {base}"
                                ),
                            };
                            let reason = format!(
                                "seqs {want}..={} are missing: {what}; `swarm repair --run {}` records the loss and lets reads and appends go on",
                                base - 1,
                                self.run_id
                            );
                            if !self.opts.skip_corrupt {
                                return Err(Error::corrupt(&at, end.off, want, reason));
                            }
                            self.skip(at, end.off, end.off, want, reason);
                            if let Some(s) = self.skipped.last_mut() {
                                s.gap_to = Some(base - 1);
                            }
                            // This frame again, in its place in the log.
                            self.expect_seq = Some(base);
                            self.frames -= 1;
                            self.bytes -= len;
                            let limit = self.limit.filter(|l| l.seg == base).map(|l| l.off);
                            self.reader = Some(FrameReader::open(&*self.storage, &path, 0, limit)?);
                        }
                        Err((seq, reason)) => {
                            let seq = seq.or(self.expect_seq).unwrap_or(0);
                            if !self.opts.skip_corrupt {
                                return Err(Error::corrupt(&path, offset, seq, reason));
                            }
                            self.skip(path, offset, offset + len, seq, reason);
                        }
                    }
                }
                // Past the last segment's end this is a write in progress (a torn tail),
                // anywhere else the index pointed into the middle of something.
                Step::End { offset, incomplete }
                    if incomplete && self.seek_from.is_some() && !last_segment =>
                {
                    let seq = self.expect_seq.unwrap_or(1);
                    let reason =
                        format!("{} at byte {offset}: incomplete frame", r.path().display());
                    self.fall_back(seq, &reason);
                }
                Step::End { offset, incomplete } => {
                    self.seek_from = None;
                    let path = r.path().to_path_buf();
                    let seq = self.expect_seq.unwrap_or(1);
                    // Only the last segment can end early legitimately; an earlier one
                    // that ends short shows at the next segment's first seq.
                    let lost = match last_segment {
                        true => self.lost_below_durable(self.bases[self.idx], offset, seq)?,
                        false => None,
                    };
                    if let Some(lost) = lost {
                        self.reader = None;
                        self.idx += 1;
                        self.end_checked = true;
                        self.report(path, offset, seq, lost)?;
                        continue;
                    }
                    if incomplete && last_segment {
                        let bytes = torn_bytes(&*self.storage, &path, offset)?;
                        self.torn_tail = Some(TornTail {
                            segment: path,
                            offset,
                            bytes,
                        });
                    }
                    self.seg_end = Pos {
                        seg: self.bases[self.idx],
                        off: offset,
                    };
                    self.reader = None;
                    self.idx += 1;
                }
                Step::Corrupt { offset, reason } if self.seek_from.is_some() => {
                    let seq = self.expect_seq.unwrap_or(1);
                    let reason = format!("{} at byte {offset}: {reason}", r.path().display());
                    self.fall_back(seq, &reason);
                }
                Step::Corrupt { offset, reason } => {
                    let path = r.path().to_path_buf();
                    let seq = self.expect_seq.unwrap_or(1);
                    let next = r.skip_to_next_frame()?;
                    let base = self.bases[self.idx];
                    if self.step_over_quarantined(base, offset, next) {
                        if next.is_none() {
                            self.reader = None;
                            self.idx += 1;
                        }
                        continue;
                    }
                    match next {
                        None if last_segment
                            && self.lost_below_durable(base, offset, seq)?.is_some() =>
                        {
                            let lost = self
                                .lost_below_durable(base, offset, seq)?
                                .unwrap_or_default();
                            self.reader = None;
                            self.idx += 1;
                            self.end_checked = true;
                            self.report(path, offset, seq, format!("{reason}; {lost}"))?;
                        }
                        None if last_segment => {
                            // Nothing valid follows, past the durable mark: a torn tail
                            // (a write in progress, or one a crash cut), not corruption.
                            let bytes = torn_bytes(&*self.storage, &path, offset)?;
                            self.torn_tail = Some(TornTail {
                                segment: path,
                                offset,
                                bytes,
                            });
                            self.reader = None;
                            self.idx += 1;
                        }
                        _ if !self.opts.skip_corrupt => {
                            let tail = match next {
                                Some(n) => format!("valid records follow at byte {n}"),
                                None => "later segments follow".to_string(),
                            };
                            return Err(Error::corrupt(
                                &path,
                                offset,
                                seq,
                                format!("{reason}; {tail}"),
                            ));
                        }
                        _ => {
                            let resumed_at = match next {
                                Some(n) => n,
                                None => file_len(&*self.storage, &path)?,
                            };
                            self.skip(path, offset, resumed_at, seq, reason.to_string());
                            if next.is_none() {
                                self.reader = None;
                                self.idx += 1;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Whether bytes from `off` of segment `seg` on lie below the durable mark, i.e. were
    /// acknowledged: then their loss is corruption, never a torn tail. Returns what was
    /// lost, for the message.
    fn lost_below_durable(&self, seg: u64, off: u64, seq: u64) -> Result<Option<String>> {
        if (Pos { seg, off }) >= self.acked {
            return Ok(None);
        }
        let m = read_marks(&*self.storage, &self.dir)?;
        let upto = m.visible_seq.max(m.durable_seq);
        let seqs = if upto >= seq {
            format!("seqs {seq}..={upto}")
        } else {
            format!("records from seq {seq}")
        };
        Ok(Some(format!(
            "acknowledged bytes are damaged or missing below the durable mark (segment {}, byte {}): {seqs} lost; `swarm repair --run {}` moves them aside and lets appends go on",
            m.durable.seg, m.durable.off, self.run_id
        )))
    }

    /// At the end of the log: every segment up to the durable mark must reach it (a lost
    /// segment, or a cut one, is corruption of acknowledged data).
    fn check_marked_segments_exist(&mut self) -> Result<()> {
        if self.end_checked {
            return Ok(());
        }
        self.end_checked = true;
        let acked = self.acked;
        // A segment after the mark's continues the log (after a repair, its first event
        // declares what the mark's segment lost): then seq continuity is the check.
        if acked == Pos::default() || self.bases.iter().any(|&b| b > acked.seg) {
            return Ok(());
        }
        let path = segment::segment_path(&self.dir, acked.seg);
        let len = match self.storage.exists(&path) {
            true => file_len(&*self.storage, &path)?,
            false => 0,
        };
        if len >= acked.off {
            return Ok(());
        }
        let seq = self.expect_seq.unwrap_or(1);
        if let Some(lost) = self.lost_below_durable(acked.seg, len, seq)? {
            self.report(path, len, seq, lost)?;
        }
        Ok(())
    }

    /// Corruption found: an error, or with `skip_corrupt` a recorded skip.
    fn report(&mut self, path: PathBuf, offset: u64, seq: u64, reason: String) -> Result<()> {
        if !self.opts.skip_corrupt {
            self.done = true;
            return Err(Error::corrupt(&path, offset, seq, reason));
        }
        let resumed_at = file_len(&*self.storage, &path).unwrap_or(offset);
        self.skip(path, offset, resumed_at, seq, reason);
        Ok(())
    }

    /// Records a skipped range; the seq after it is whatever the next record says.
    fn skip(&mut self, segment: PathBuf, offset: u64, resumed_at: u64, seq: u64, reason: String) {
        tracing::warn!(segment = %segment.display(), offset, resumed_at, seq, reason, "skipped a corrupt record");
        self.skipped.push(Skipped {
            segment,
            offset,
            resumed_at,
            seq,
            reason,
            gap_to: None,
        });
        self.expect_seq = None;
    }

    /// End of the frame that held the last event returned.
    pub fn position(&self) -> Pos {
        self.pos
    }

    /// Start offset (in `position().seg`) of the frame that held the last event returned.
    pub fn frame_start(&self) -> u64 {
        self.frame_start
    }

    /// Whether the last event returned was the last of its frame (a frame boundary,
    /// where a checkpoint may be taken).
    pub fn at_frame_end(&self) -> bool {
        self.pending.is_empty()
    }

    /// Keeps only the events `perm` lets the reader see.
    pub(crate) fn with_permission(mut self, perm: Box<Permission>) -> EventIter {
        // The index's last `n` hits may hold events this reader is not shown: `last`
        // counts the events it is shown, so every hit is read.
        if self.opts.last.is_some() {
            if let Some(p) = self.plan.as_mut() {
                p.forget_last();
            }
        }
        self.perm = Some(perm);
        self
    }

    fn permitted(&self, e: &Event) -> bool {
        self.perm.as_ref().is_none_or(|p| p(e))
    }

    fn matches(&self, e: &Event) -> bool {
        if !self.permitted(e) {
            return false;
        }
        let o = &self.opts;
        o.from_seq.is_none_or(|s| e.seq >= s)
            && o.agent.as_ref().is_none_or(|a| *a == e.agent_id)
            && o.user.as_ref().is_none_or(|u| *u == e.user_id)
            && o.kind.is_none_or(|k| k == e.kind)
            && o.subject
                .as_ref()
                .is_none_or(|s| Some(s) == e.subject.as_ref())
            && o.since.is_none_or(|t| e.ts >= t)
    }
}

impl Iterator for EventIter {
    type Item = Result<Event>;

    fn next(&mut self) -> Option<Result<Event>> {
        let Some(n) = self.opts.last else {
            return self.next_match();
        };
        if self.tail.is_none() {
            // The last `n` matches are known only at the end of the read.
            let mut q = VecDeque::with_capacity(n.min(4096));
            loop {
                match self.next_match() {
                    Some(Ok(e)) => {
                        if q.len() == n {
                            q.pop_front();
                        }
                        if n > 0 {
                            q.push_back(e);
                        }
                    }
                    Some(Err(e)) => {
                        // The last `n` matches before the damage, then the error.
                        self.tail_err = Some(e);
                        break;
                    }
                    None => break,
                }
            }
            self.tail = Some(q);
        }
        let limited = self.opts.limit.is_some_and(|l| self.tail_returned >= l);
        match self.tail.as_mut()?.pop_front() {
            Some(e) if !limited => {
                self.tail_returned += 1;
                Some(Ok(e))
            }
            _ => self.tail_err.take().map(Err),
        }
    }
}

impl EventIter {
    /// The next matching event, in seq order (`limit` applies here unless `last` is set).
    fn next_match(&mut self) -> Option<Result<Event>> {
        loop {
            if self.done {
                return None;
            }
            if self.opts.last.is_none() && self.opts.limit.is_some_and(|l| self.returned >= l) {
                self.done = true;
                return None;
            }
            if let Some(e) = self.pending.pop_front() {
                if self.opts.to_seq.is_some_and(|t| e.seq > t)
                    || self.opts.until.is_some_and(|u| e.ts > u)
                {
                    // seq and ts only grow: nothing later can match.
                    self.done = true;
                    return None;
                }
                if self.matches(&e) {
                    self.returned += 1;
                    return Some(Ok(e));
                }
                continue;
            }
            match self.fill(None) {
                Ok(true) => {}
                Ok(false) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// Bytes of a torn tail from `offset`: what was written, without the preallocated fill.
fn torn_bytes(storage: &dyn Storage, path: &Path, offset: u64) -> Result<u64> {
    let f = storage.open(path, OpenMode::Read).ctx("open", path)?;
    let len = f.len().ctx("stat", path)?;
    let end = segment::content_end(&*f, offset, len).ctx("read", path)?;
    Ok(end - offset)
}

#[cfg(test)]
mod tests;
