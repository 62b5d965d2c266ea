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

use crate::commit::{lock, InFlight, LiteEvent, RunLog, SyncLocal};

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

    /// Waits until everything before `end` is durable, syncing if nobody else has.
    ///
    /// At most one data fsync is in flight per run and process: a thread whose frame is
    /// not durable yet waits for the fsync in flight (it may cover the frame), and the
    /// first one left uncovered leads the next fsync, which covers every frame this
    /// process wrote before it began (`written`), so that one fsync serves everybody who
    /// queued during the previous one.
    pub(super) fn wait_durable(
        &self,
        end: Pos,
        end_seq: u64,
        seg: &Arc<dyn StorageFile>,
    ) -> Result<()> {
        let (id, cover, cover_seq, file) = {
            let mut s = lock(&self.sync);
            loop {
                if s.durable >= end {
                    return Ok(());
                }
                if self.poisoned.load(Ordering::Acquire) {
                    return Err(Error::Poisoned(self.run_id.clone()));
                }
                if s.inflight.iter().any(|f| f.covers.is_some()) {
                    let me = std::thread::current();
                    let id = me.id();
                    s.waiters.push((end, me));
                    drop(s);
                    std::thread::park();
                    s = lock(&self.sync);
                    s.waiters.retain(|(_, t)| t.id() != id);
                    continue;
                }
                break;
            }
            // Cover everything this process wrote, so that threads whose frames were
            // written after ours share this fsync.
            let (cover, cover_seq, file) = match &s.written {
                Some((p, q, f)) if *p >= end => (*p, *q, f.clone()),
                _ => (end, end_seq, seg.clone()),
            };
            let id = s.next_id;
            s.next_id += 1;
            s.inflight.push(InFlight {
                id,
                covers: Some(cover),
                done: false,
            });
            (id, cover, cover_seq, file)
        };
        let r = self.sync_and_publish(id, cover, cover_seq, &file);
        let mut s = lock(&self.sync);
        s.inflight.retain(|f| f.id != id);
        if let Ok(p) = &r {
            s.durable = s.durable.max(*p);
        }
        self.sync_cv.notify_all();
        self.wake_waiters(&mut s);
        r.map(|_| ())
    }

    /// Unparks the waiting threads whose frame is now durable, every one when the writer
    /// is poisoned, and, when no data fsync is in flight any more, the first uncovered
    /// one, to lead the next fsync (which covers the others: they wrote before it).
    pub(super) fn wake_waiters(&self, s: &mut SyncLocal) {
        let poisoned = self.poisoned.load(Ordering::Acquire);
        let durable = s.durable;
        let mut leader_woken = s.inflight.iter().any(|f| f.covers.is_some());
        s.waiters.retain(|(end, t)| {
            let wake = poisoned || durable >= *end || !std::mem::replace(&mut leader_woken, true);
            if wake {
                t.unpark();
            }
            !wake
        });
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
            // A writer whose `pwrite` failed part-way cuts its frames off again (and then
            // lowers the marks under this lock): publish others' frames only while they
            // are still there.
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
        let Ok(len) = file.len() else {
            return (from, from_seq);
        };
        if len <= from.off {
            return (from, from_seq);
        }
        let Ok(mut r) = FrameReader::new(file.clone(), path.to_path_buf(), from.off, Some(len))
        else {
            return (from, from_seq);
        };
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

    /// fsyncs a segment outside `wait_durable` (rotation, tail repair), in the same
    /// bookkeeping, so that its failure is seen by every overlapping fsync.
    pub(super) fn fsync_segment(&self, file: &dyn StorageFile, path: &Path) -> Result<()> {
        let id = {
            let mut s = lock(&self.sync);
            let id = s.next_id;
            s.next_id += 1;
            s.inflight.push(InFlight {
                id,
                covers: None,
                done: false,
            });
            id
        };
        let r = file.sync_data().ctx("fsync", path);
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        let r = self.end_fsync(id, r);
        let mut s = lock(&self.sync);
        s.inflight.retain(|f| f.id != id);
        self.sync_cv.notify_all();
        self.wake_waiters(&mut s);
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
            self.wake_waiters(&mut s);
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
            return Err(Error::Poisoned(self.run_id.clone()));
        }
        Ok(())
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

    pub(crate) fn flush_batch(&self) {
        let pending = lock(&self.batch_dirty).take();
        if let Some((end, seq, seg)) = pending {
            if let Err(e) = self.wait_durable(end, seq, &seg) {
                tracing::error!(error = %e, run = %self.run_id, "batch-mode fsync failed");
            }
        }
    }
}
