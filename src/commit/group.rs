//! Durability: group commit. The `fdatasync`s that make appends durable, shared by
//! every thread of the process waiting on them (and skipped when another process's
//! published `SYNCED` mark covers the frame), the `SYNCED` marks, and `batch` mode's
//! deferred syncs.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::error::{Error, IoContext, Result};
use crate::log::segment::{self};
use crate::log::storage::StorageFile;
use crate::log::watermark::{self, Pos};

use crate::commit::{lock, InFlight, RunLog, SyncLocal};

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
                // An fsync of ours in flight covers this frame: wait for it rather than
                // start another.
                if s.inflight
                    .iter()
                    .any(|f| f.covers.is_some_and(|c| c >= end))
                {
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
        let r = self.sync_and_publish(id, cover, cover_seq, &*file);
        let mut s = lock(&self.sync);
        s.inflight.retain(|f| f.id != id);
        if let Ok(p) = &r {
            s.durable = s.durable.max(*p);
        }
        self.sync_cv.notify_all();
        self.wake_waiters(&mut s);
        r.map(|_| ())
    }

    /// Unparks the waiting threads whose frame is now durable, and every one when the
    /// writer is poisoned or no fsync in flight covers its frame any more.
    pub(super) fn wake_waiters(&self, s: &mut SyncLocal) {
        let poisoned = self.poisoned.load(Ordering::Acquire);
        let (durable, inflight) = (s.durable, &s.inflight);
        s.waiters.retain(|(end, t)| {
            let covered = inflight.iter().any(|f| f.covers.is_some_and(|c| c >= *end));
            let wake = poisoned || durable >= *end || !covered;
            if wake {
                t.unpark();
            }
            !wake
        });
    }

    /// Makes everything before `cover` (the end of a frame this process wrote, in
    /// `file`) durable and publishes it. Returns the durable position now known.
    pub(super) fn sync_and_publish(
        &self,
        id: u64,
        cover: Pos,
        cover_seq: u64,
        file: &dyn StorageFile,
    ) -> Result<Pos> {
        // Another process's fsync may have covered it already.
        let m = self.synced_marks();
        if m.durable >= cover {
            return Ok(m.durable);
        }
        let path = segment::segment_path(&self.dir, cover.seg);
        let r = file.sync_data().ctx("fsync", &path);
        self.end_fsync(id, r)?;
        let _io = lock(&self.sync_io);
        self.synced.lock().ctx("lock", &self.synced_path)?;
        let r = (|| {
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
