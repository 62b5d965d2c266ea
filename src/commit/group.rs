//! Durability: group commit. The `fdatasync`s that make appends durable, shared by
//! every thread of the process waiting on them (and skipped when another process's
//! published `SYNCED` mark covers the frame), the `SYNCED` marks, and `batch` mode's
//! deferred syncs.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::error::{Error, IoContext, Result};
use crate::log::segment::{self, FrameReader, Step};
use crate::log::storage::StorageFile;
use crate::log::watermark::{self, Pos};

use crate::commit::{io_copy, lock, FrameEnd, InFlight, LiteEvent, RunLog, Slot, SyncLocal};

/// Rounds of fsyncs a leader makes before it hands the lead to a waiter (its own caller
/// waits meanwhile; a hand-off costs a wake-up and leaves the disk idle until it runs).
const LEAD_ROUNDS: u32 = 4;

thread_local! {
    /// The run log (its address) whose data fsyncs this thread leads, while it does.
    static LEADING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks this thread as the fsync leader of a run for as long as it lives.
struct Leading {
    before: usize,
}

impl Leading {
    fn new(log: &RunLog) -> Leading {
        let before = LEADING.with(|l| l.replace(log as *const RunLog as usize));
        Leading { before }
    }
}

impl Drop for Leading {
    fn drop(&mut self) {
        LEADING.with(|l| l.set(self.before));
    }
}

fn unpark_all(wake: Vec<Arc<Slot>>) {
    let me = std::thread::current().id();
    for w in wake {
        if w.thread.id() != me {
            w.thread.unpark();
        }
    }
}

/// The seq of the last event of a frame's payload (a JSON array of events).
fn last_seq(payload: &[u8]) -> Option<u64> {
    let events: Vec<LiteEvent> = serde_json::from_slice(payload).ok()?;
    events.last().map(|e| e.seq)
}

impl RunLog {
    /// The marks in `SYNCED`. Unreadable marks (garbage, not a torn write: writers update
    /// them under the file's lock) read as the start of the log; the next write replaces
    /// them with the marks this writer knows, and `Store::marks` rebuilds them for readers.
    pub(super) fn synced_marks(&self) -> watermark::Marks {
        watermark::read(&*self.synced, &self.synced_path).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "unreadable SYNCED marks; writing new ones");
            watermark::Marks::default()
        })
    }

    /// Makes frames up to `p` visible without syncing them (batch and none modes).
    pub(super) fn advance_visible(&self, p: Pos, seq: u64) -> Result<()> {
        let _io = lock(&self.sync_io);
        self.synced.lock().ctx("lock", &self.synced_path)?;
        let r = (|| {
            let mut m = self.synced_marks();
            if m.visible < p {
                m.advance_visible(p, seq);
                watermark::write(&*self.synced, &self.synced_path, m)?;
            }
            Ok(())
        })();
        let _ = self.synced.unlock();
        r
    }

    /// Waits until everything before `end` is durable, syncing if nobody else is.
    ///
    /// At most one thread of the process leads the data fsyncs at a time (`leader`): a
    /// thread whose frame is not durable yet waits for it, parked in `waiters`; when none
    /// leads, it leads. Each fsync covers every frame this process wrote before it began
    /// (`written`), so that one fsync serves everybody who queued during the previous one.
    /// (The appends of a written group wait in `waiters` directly: `group_durable`.)
    pub(super) fn wait_durable(
        &self,
        end: Pos,
        end_seq: u64,
        seg: &Arc<dyn StorageFile>,
    ) -> Result<()> {
        let mut me: Option<Arc<Slot>> = None;
        let forget = |s: &mut SyncLocal, me: &Option<Arc<Slot>>| {
            if let Some(w) = me {
                s.waiters.retain(|(_, x)| !Arc::ptr_eq(x, w));
            }
        };
        if LEADING.with(|l| l.get()) == self as *const RunLog as usize {
            // The fsync leader itself, writing the queued group (`write_pending`), and
            // the write must be durable now (a refusal's engine event): it syncs here, as
            // nobody else will while it leads.
            return self.sync_now((end, end_seq, seg.clone())).map(|_| ());
        }
        let mut s = lock(&self.sync);
        loop {
            let asked = me
                .as_ref()
                .is_some_and(|w| w.lead.swap(false, Ordering::AcqRel));
            if !asked {
                if s.durable >= end {
                    forget(&mut s, &me);
                    return Ok(());
                }
                if self.poisoned.load(Ordering::Acquire) {
                    forget(&mut s, &me);
                    // (Its frame is written.)
                    return Err(self.outcome_unknown());
                }
            }
            if asked || !s.leader {
                s.leader = true;
                forget(&mut s, &me);
                drop(s);
                // (Callers may hold the writer mutex: no writing of the queue here.)
                return self.lead_fsyncs(Some((end, end_seq, seg.clone())), false);
            }
            let w = me.get_or_insert_with(Slot::waiter).clone();
            if !s.waiters.iter().any(|(_, x)| Arc::ptr_eq(x, &w)) {
                w.done.store(false, Ordering::Relaxed);
                s.waiters.push(((end, end_seq, seg.clone()), w));
            }
            drop(s);
            std::thread::park();
            s = lock(&self.sync);
        }
    }

    /// The fsync leader's work (the caller set `leader`): with `write` (the caller holds
    /// no writer mutex), it writes the appends queued for it before each fsync
    /// (`write_pending`); fsyncs, each covering every
    /// frame this process wrote before it began, until no waiter is left uncovered, waking
    /// the waiters each one covers; after `LEAD_ROUNDS` it hands the lead to a waiter
    /// rather than keep its own caller waiting. `own`: a frame the caller waits for,
    /// when it is not in `written` (or not yet). Returns `own`'s outcome.
    pub(super) fn lead_fsyncs(&self, mut own: Option<FrameEnd>, write: bool) -> Result<()> {
        let mut result = Ok(());
        let mut rounds = 0;
        let _leading = Leading::new(self);
        {
            let mut c = lock(&self.combine);
            c.fsync_active = write;
            if !write {
                // Appends queued for a writing leader before this one took over.
                c.hand_on();
            }
        }
        loop {
            // The `sync` appends that queued during the last fsync: one group, covered by
            // the next fsync.
            if write {
                self.write_pending();
            }
            let (id, cover, cover_seq, file) = {
                let mut s = lock(&self.sync);
                let durable = s.durable;
                if own.as_ref().is_some_and(|(e, _, _)| durable >= *e) {
                    own = None;
                }
                let poisoned = self.poisoned.load(Ordering::Acquire);
                if poisoned && own.is_some() {
                    own = None;
                    result = Err(self.outcome_unknown());
                }
                let uncovered = s.waiters.iter().any(|((e, _, _), _)| durable < *e);
                if poisoned || (own.is_none() && !uncovered) {
                    // Appends queued for this leader since `write_pending`: write them first.
                    if write && !poisoned && self.queued_for_fsync_leader() {
                        continue;
                    }
                    self.end_fsync_lead(&mut s);
                    let wake = self.settle_waiters(&mut s, None);
                    drop(s);
                    unpark_all(wake);
                    return result;
                }
                if own.is_none() && rounds >= LEAD_ROUNDS {
                    // Hand the lead on (`leader` stays set) to a waiter this thread's next
                    // fsync would have served.
                    let me = std::thread::current().id();
                    let next = s
                        .waiters
                        .iter()
                        .find(|((e, _, _), w)| durable < *e && w.thread.id() != me)
                        .map(|(_, w)| w.clone());
                    if let Some(next) = next {
                        // Set under the mutex: whoever settles `next` (an fsync of a
                        // rotation, a poisoning) does so under it too, so its thread sees
                        // the lead before it can see `done` and leave without it (the
                        // run's appends would wait for a leader for ever).
                        next.lead.store(true, Ordering::Release);
                        drop(s);
                        next.thread.unpark();
                        return result;
                    }
                }
                // Cover everything this process wrote, and whatever frame a waiter (or the
                // caller) waits for beyond it (a retry waits for a stored frame).
                let mut cover: Option<&FrameEnd> = s.written.as_ref();
                for f in s
                    .waiters
                    .iter()
                    .map(|(f, _)| f)
                    .filter(|f| durable < f.0)
                    .chain(own.as_ref())
                {
                    if cover.is_none_or(|c| c.0 < f.0) {
                        cover = Some(f);
                    }
                }
                let Some((cover, cover_seq, file)) = cover.cloned() else {
                    self.end_fsync_lead(&mut s);
                    return result;
                };
                let id = s.next_id;
                s.next_id += 1;
                s.inflight.push(InFlight { id, done: false });
                (id, cover, cover_seq, file)
            };
            let r = self.sync_and_settle(id, (cover, cover_seq, file));
            rounds += 1;
            if let Err(e) = r {
                if own.take().is_some() {
                    result = Err(e);
                }
            }
        }
    }

    /// One data fsync covering `cover` (and everything this process wrote), outside
    /// `lead_fsyncs`' rounds but in the same bookkeeping: the waiters it covers are woken.
    fn sync_now(&self, cover: FrameEnd) -> Result<Pos> {
        let (id, cover) = {
            let mut s = lock(&self.sync);
            let id = s.next_id;
            s.next_id += 1;
            s.inflight.push(InFlight { id, done: false });
            let cover = match &s.written {
                Some(w) if w.0 > cover.0 => w.clone(),
                _ => cover,
            };
            (id, cover)
        };
        self.sync_and_settle(id, cover)
    }

    /// fsync `id` (registered in `inflight`) of everything up to `cover`, published; then
    /// the waiters it covered (all of them, with the error, when it failed) are woken.
    fn sync_and_settle(&self, id: u64, (cover, cover_seq, file): FrameEnd) -> Result<Pos> {
        let r = self.sync_and_publish(id, cover, cover_seq, &file);
        let wake = {
            let mut s = lock(&self.sync);
            s.inflight.retain(|f| f.id != id);
            if let Ok(p) = &r {
                s.durable = s.durable.max(*p);
            }
            self.sync_cv.notify_all();
            self.settle_waiters(&mut s, r.as_ref().err())
        };
        unpark_all(wake);
        r
    }

    /// Whether appends wait in the queue for the fsync leader to write them. (Called
    /// under the `sync` mutex: `combine` is taken inside it, never the other way round.)
    fn queued_for_fsync_leader(&self) -> bool {
        let c = lock(&self.combine);
        !c.leader && !c.pending.is_empty()
    }

    /// The fsync leader steps down (under the `sync` mutex, so that a writer that
    /// registers waiters after it sees no leader and leads). Appends still queued for it
    /// (a poisoned writer's) are handed to the first of them, which writes them.
    fn end_fsync_lead(&self, s: &mut SyncLocal) {
        s.leader = false;
        let mut c = lock(&self.combine);
        c.fsync_active = false;
        c.hand_on();
    }

    /// Settles the waiters: those whose frame is now durable are done; when `failed` (an
    /// fsync failed) or the writer is poisoned, every one is done with an error. Returns
    /// the threads to unpark (once the sync mutex is released).
    pub(super) fn settle_waiters(
        &self,
        s: &mut SyncLocal,
        failed: Option<&Error>,
    ) -> Vec<Arc<Slot>> {
        let poisoned = self.poisoned.load(Ordering::Acquire);
        let durable = s.durable;
        let mut wake = Vec::new();
        s.waiters.retain(|((end, _, _), w)| {
            // (A waiter's frame is written: an error is an unknown outcome, never
            // `Poisoned`.)
            if durable >= *end {
            } else if let Some(e) = failed.filter(|e| !matches!(e, Error::Poisoned(_))) {
                *lock(&w.result) = Some(Err(io_copy(e)));
            } else if poisoned || failed.is_some() {
                *lock(&w.result) = Some(Err(self.outcome_unknown()));
            } else {
                return true;
            }
            w.done.store(true, Ordering::Release);
            wake.push(w.clone());
            false
        });
        wake
    }

    /// Makes everything before `cover` (the end of a frame this process wrote, in
    /// `file`) durable and publishes it. Returns the durable position now known.
    ///
    /// Across processes, fsyncs of a run are taken one at a time under the `SYNC_LOCK`
    /// file (a leader/follower flush, as PostgreSQL's WAL flush lock): a process that
    /// waited for the lock first re-reads the durable mark, which the fsync before it may
    /// have moved past its frame; if not, it extends `cover` over the whole frames other
    /// processes wrote after it in the same segment (written before this fsync begins, so
    /// it makes them durable too), fsyncs, and publishes the extended mark.
    pub(super) fn sync_and_publish(
        &self,
        id: u64,
        cover: Pos,
        cover_seq: u64,
        file: &Arc<dyn StorageFile>,
    ) -> Result<Pos> {
        self.sync_and_publish_inner(id, cover, cover_seq, file)
            .map_err(|e| self.flush_failed(e))
    }

    fn sync_and_publish_inner(
        &self,
        id: u64,
        cover: Pos,
        cover_seq: u64,
        file: &Arc<dyn StorageFile>,
    ) -> Result<Pos> {
        // Another process's fsync may have covered it already.
        let m = self.synced_marks();
        if m.durable >= cover {
            return Ok(m.durable);
        }
        let path = &self.sync_lock_path;
        if !self.sync_lock.try_lock().ctx("lock", path)? {
            // Another process is flushing: wait for it to end (the shared lock is granted
            // to every waiter at once when it does, so the processes it covered leave
            // together instead of filing through the exclusive lock one by one).
            self.sync_lock.lock_shared().ctx("lock", path)?;
            let m = self.synced_marks();
            self.sync_lock.unlock().ctx("unlock", path)?;
            if m.durable >= cover {
                self.stats.coalesced.fetch_add(1, Ordering::Relaxed);
                return Ok(m.durable);
            }
            self.sync_lock.lock().ctx("lock", path)?;
        }
        let r = self.sync_and_publish_locked(id, cover, cover_seq, file);
        if let Err(e) = self.sync_lock.unlock() {
            tracing::error!(error = %e, "cannot release the fsync lock");
        }
        r
    }

    /// The error of a flush of frames already written: whether they are stored is
    /// unknown, whatever failed (the fsync, a lock, the mark's write: the next flush may
    /// publish them, and a reader that rebuilds lost marks shows them). Not "failed",
    /// which an id-less retry takes as "not stored", nor, at a full disk, "nothing was
    /// stored". An fsync's error keeps its op (and the writer stays poisoned).
    fn flush_failed(&self, e: Error) -> Error {
        match e {
            e if e.outcome_unknown() => e,
            Error::Io {
                op: "fsync",
                path,
                source,
            } => Error::Io {
                op: "fsync",
                path,
                source: std::io::Error::other(format!(
                    "{source}; whether this append reached the disk {} the run, or append again with the same id)",
                    crate::error::OUTCOME_UNKNOWN
                )),
            },
            e => self.write_outcome_unknown(e),
        }
    }

    fn sync_and_publish_locked(
        &self,
        id: u64,
        cover: Pos,
        cover_seq: u64,
        file: &Arc<dyn StorageFile>,
    ) -> Result<Pos> {
        let m = self.synced_marks();
        if m.durable >= cover {
            self.stats.coalesced.fetch_add(1, Ordering::Relaxed);
            return Ok(m.durable);
        }
        let path = segment::segment_path(&self.dir, cover.seg);
        let own = (cover, cover_seq);
        let (cover, cover_seq) = self.whole_frames_after(file, &path, cover, cover_seq);
        tracing::trace!(own = ?own, extended = ?cover, seq_from = own.1, seq_to = cover_seq, "fsync cover");
        let r = file.sync_data().ctx("fsync", &path);
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.end_fsync(id, r)?;
        let _io = lock(&self.sync_io);
        self.synced.lock().ctx("lock", &self.synced_path)?;
        let r = (|| {
            // Publish others' frames only while they are still there (a defence: writers
            // never cut whole frames, but the file may have been cut from outside).
            let (cover, cover_seq) = if cover > own.0 && file.len().is_ok_and(|l| l < cover.off) {
                own
            } else {
                (cover, cover_seq)
            };
            let mut m = self.synced_marks();
            if m.durable < cover {
                m.advance_durable(cover, cover_seq);
                watermark::write(&*self.synced, &self.synced_path, m)?;
            }
            Ok(m.durable)
        })();
        let _ = self.synced.unlock();
        r
    }

    /// The end of the last whole frame at or after `from` in `file` (and the seq of its
    /// last event): frames other processes wrote after this process's last one. Frames
    /// are written whole by one `pwrite` under `LOCK`, so a CRC-valid frame is complete;
    /// the scan stops at the first incomplete or invalid one (a write in progress, or a
    /// torn tail the next writer will cut). Best effort: any error keeps `from`.
    pub(super) fn whole_frames_after(
        &self,
        file: &Arc<dyn StorageFile>,
        path: &Path,
        from: Pos,
        from_seq: u64,
    ) -> (Pos, u64) {
        // Trusting the fill is safe here: a frame is whole only when its CRC checks, and
        // the scan stops at anything else. No `stat`: see `RunLog::catch_up`.
        let mut r = FrameReader::unbounded(file.clone(), path.to_path_buf(), from.off)
            .with_chunk(16 << 10)
            .trust_fill();
        let mut best = (from, from_seq);
        while let Ok(Step::Frame { offset, len }) = r.step() {
            let Some(seq) = last_seq(r.payload()) else {
                break;
            };
            best = (
                Pos {
                    seg: from.seg,
                    off: offset + len,
                },
                seq,
            );
        }
        best
    }

    /// Whether a whole frame begins at `at` of a segment: `None` when reading it back
    /// fails, so nothing is known (a failed write's outcome, `write_group_locked`).
    pub(super) fn whole_frame_at(
        &self,
        file: &Arc<dyn StorageFile>,
        path: &Path,
        at: u64,
    ) -> Option<bool> {
        let mut r = FrameReader::unbounded(file.clone(), path.to_path_buf(), at)
            .with_chunk(16 << 10)
            .trust_fill();
        match r.step() {
            Ok(Step::Frame { .. }) => Some(true),
            Ok(_) => Some(false),
            Err(_) => None,
        }
    }

    /// fsyncs a segment outside `wait_durable` (rotation, tail repair), in the same
    /// bookkeeping, so that its failure is seen by every overlapping fsync.
    pub(super) fn fsync_segment(&self, file: &dyn StorageFile, path: &Path) -> Result<()> {
        let id = {
            let mut s = lock(&self.sync);
            let id = s.next_id;
            s.next_id += 1;
            s.inflight.push(InFlight { id, done: false });
            id
        };
        let r = file.sync_data().ctx("fsync", path);
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        let r = self.end_fsync(id, r);
        let wake = {
            let mut s = lock(&self.sync);
            s.inflight.retain(|f| f.id != id);
            self.sync_cv.notify_all();
            // On a failure every waiter is done, with an error.
            self.settle_waiters(&mut s, None)
        };
        unpark_all(wake);
        r
    }

    /// Settles the outcome of fsync `id`. Threads may fsync one file description at
    /// once, and Linux reports a writeback error to only the first fsync that looks, so
    /// a success counts only once every fsync that overlapped it has succeeded too. Any
    /// failure poisons the writer: never retry an fsync and then acknowledge, the kernel
    /// may have dropped the dirty pages.
    pub(super) fn end_fsync(&self, id: u64, r: Result<()>) -> Result<()> {
        let mut s = lock(&self.sync);
        if let Err(e) = r {
            self.poisoned.store(true, Ordering::Release);
            tracing::error!(error = %e, "fsync failed; the run's writer is poisoned");
            s.inflight.retain(|f| f.id != id);
            self.sync_cv.notify_all();
            return Err(e);
        }
        let overlapping: Vec<u64> = s
            .inflight
            .iter()
            .filter(|f| !f.done && f.id != id)
            .map(|f| f.id)
            .collect();
        if let Some(f) = s.inflight.iter_mut().find(|f| f.id == id) {
            f.done = true;
        }
        self.sync_cv.notify_all();
        while s
            .inflight
            .iter()
            .any(|f| !f.done && overlapping.contains(&f.id))
        {
            s = self.sync_cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if self.poisoned.load(Ordering::Acquire) {
            return Err(self.outcome_unknown());
        }
        Ok(())
    }

    /// The error of an append whose frame was written when the writer got poisoned (an
    /// fsync of the run failed): whether it reached the disk is unknown. Not `Poisoned`,
    /// which says the append wrote nothing (a handing process then appends the batch
    /// itself, and would find this frame in the page cache and acknowledge it after an
    /// fsync of its own that cannot see the error).
    pub(super) fn outcome_unknown(&self) -> Error {
        Error::Io {
            op: "fsync",
            path: self.dir.clone(),
            source: std::io::Error::other(
                "an fsync of this run failed in this process: whether this append reached the disk is unknown (read the run, or append again with the same id)",
            ),
        }
    }

    /// The error of the appends of a write group whose frames may be in the log: its
    /// `pwrite` failed after a whole frame of it reached the file (that frame may be
    /// published by another process's flush, so it stays), or a step after the write
    /// failed. Whether each append is stored is unknown.
    pub(super) fn write_outcome_unknown(&self, e: Error) -> Error {
        if e.outcome_unknown() {
            return e; // (said once)
        }
        Error::Io {
            op: "write",
            path: self.dir.clone(),
            source: std::io::Error::other(format!(
                "{e}; this append's frame may be in the log: whether it is stored is unknown (read the run, or append again with the same id)"
            )),
        }
    }

    /// The error of an append whose write group panicked after its `pwrite`: its frame
    /// may be in the file, so whether it is stored is unknown (see `write_group`).
    pub(super) fn panicked_after_write(&self) -> Error {
        Error::Io {
            op: "write",
            path: self.dir.clone(),
            source: std::io::Error::other(
                "a write group of this run failed (a bug: it panicked) after its write: whether this append is stored is unknown (read the run, or append again with the same id)",
            ),
        }
    }

    pub(super) fn note_batch_write(
        self: &Arc<Self>,
        end: Pos,
        end_seq: u64,
        seg: Arc<dyn StorageFile>,
    ) {
        {
            let mut d = lock(&self.batch_dirty);
            match &*d {
                Some((p, _, _)) if *p >= end => {}
                _ => *d = Some((end, end_seq, seg)),
            }
        }
        if !self.flusher_started.swap(true, Ordering::AcqRel) {
            let weak: Weak<RunLog> = Arc::downgrade(self);
            let interval = Duration::from_millis(self.batch_interval_ms);
            std::thread::Builder::new()
                .name("swarm-batch-flush".into())
                .spawn(move || loop {
                    std::thread::sleep(interval);
                    let Some(log) = weak.upgrade() else { return };
                    log.flush_batch();
                })
                .ok();
        }
    }

    /// `batch`-mode data written and not yet covered by a flush: dropping the writer
    /// would fsync it (and a failure there would poison a writer nobody keeps).
    pub(crate) fn batch_pending(&self) -> bool {
        lock(&self.batch_dirty).is_some()
    }

    pub(crate) fn flush_batch(&self) {
        let pending = lock(&self.batch_dirty).take();
        if let Some((end, seq, seg)) = pending {
            if let Err(e) = self.wait_durable(end, seq, &seg) {
                tracing::error!(error = %e, run = %self.run_id, "batch-mode fsync failed");
            }
        }
    }
}
