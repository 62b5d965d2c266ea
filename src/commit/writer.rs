//! The append path of [`RunLog`]: validation, the rules check under the `LOCK` file,
//! seq and ts assignment, combining the appends of many threads into one `pwrite`, and
//! segment rotation.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::event::{
    write_event_json, Checked, Event, EventType, ENGINE_AGENT, GENERATED_ID_PREFIX,
};
use crate::fold::rules::Rules;
use crate::log::frame::{self, PAYLOAD_BYTES_MAX};
use crate::log::meta::{
    read_meta, Durability, LogOptions, RunMeta, ARCHIVED_FILE, BATCH_BYTES_MAX, LOCK_FILE,
    META_FILE, SYNCED_FILE, SYNC_LOCK_FILE,
};
use crate::log::segment::{self, FrameReader, Step};
use crate::log::storage::{OpenMode, Storage, StorageFile};
use crate::log::watermark::Pos;

use crate::commit::{
    io_copy, lock, rule_event, Combine, FrameEnd, Outcome, PlanEnd, Request, RunLog, Slot,
    SyncCounters, SyncLocal, SyncStats, Writer,
};

/// A refill of the active segment's zero fill covers this many groups of the size of the
/// one that triggers it (`RunLog::preallocate`).
const REFILL_GROUPS: u64 = 32;
/// The smallest wanted fill.
const REFILL_BYTES_MIN: u64 = 64 << 10;

fn archived(run: &str) -> Error {
    Error::Forbidden(format!(
        "run {run:?} is closed and archived; `swarm run restore {run}` brings it back (closed)"
    ))
}

/// A test's way to make the next write group of the run in this directory panic.
#[cfg(test)]
pub(super) static PANIC_IN_NEXT_GROUP: std::sync::Mutex<Option<std::path::PathBuf>> =
    std::sync::Mutex::new(None);

/// A test's way to make the next write group of the run in this directory panic right
/// after its `pwrite`.
#[cfg(test)]
pub(super) static PANIC_AFTER_NEXT_WRITE: std::sync::Mutex<Option<std::path::PathBuf>> =
    std::sync::Mutex::new(None);

impl RunLog {
    /// Opens (creating when `create` is set) the run's directory and files. Does not read
    /// the log yet: that happens under the lock at the first append.
    pub(crate) fn open(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        ck_dir: Option<PathBuf>,
        run_id: &str,
        user_id: &str,
        opts: &LogOptions,
    ) -> Result<RunLog> {
        storage.create_dir_all(&dir).ctx("create", &dir)?;
        let lock_path = dir.join(LOCK_FILE);
        let lock_file = storage
            .open(&lock_path, OpenMode::ReadWriteCreate)
            .ctx("open", &lock_path)?;
        lock_file.lock().ctx("lock", &lock_path)?;
        let meta = Self::init_under_lock(&*storage, &dir, run_id, user_id, opts);
        lock_file.unlock().ctx("unlock", &lock_path)?;
        let meta = meta?;
        let synced_path = dir.join(SYNCED_FILE);
        let synced = storage
            .open(&synced_path, OpenMode::ReadWriteCreate)
            .ctx("open", &synced_path)?;
        let sync_lock_path = dir.join(SYNC_LOCK_FILE);
        let sync_lock = storage
            .open(&sync_lock_path, OpenMode::ReadWriteCreate)
            .ctx("open", &sync_lock_path)?;
        let placeholder: Arc<dyn StorageFile> = Arc::from(
            storage
                .open(&lock_path, OpenMode::Read)
                .ctx("open", &lock_path)?,
        );
        let nonce = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Ok(RunLog {
            run_id: run_id.to_string(),
            run_id_json: serde_json::to_vec(run_id).unwrap_or_default(),
            dir,
            ck_dir,
            storage,
            meta,
            batch_interval_ms: opts.batch_interval_ms.max(1),
            prealloc_bytes: opts
                .prealloc_bytes
                .min(crate::log::meta::PREALLOC_BYTES_MAX),
            combine: Mutex::new(Combine::default()),
            writer: Mutex::new(Writer {
                lock_file,
                rules: Rules::default(),
                recorded: false,
                group_written: false,
                loaded: false,
                damage: None,
                seg_base: 0,
                seg: placeholder,
                end: 0,
                alloc: 0,
                prealloc_warned: false,
                head_seq: 0,
                head_ts: Ts(0),
                ids: HashMap::new(),
                ids_upto: Pos::default(),
                buf: Vec::new(),
            }),
            sync: Mutex::new(SyncLocal {
                durable: Pos::default(),
                written: None,
                inflight: Vec::new(),
                next_id: 0,
                waiters: Vec::new(),
                leader: false,
            }),
            sync_cv: Condvar::new(),
            sync_io: Mutex::new(()),
            synced,
            synced_path,
            sync_lock,
            sync_lock_path,
            stats: SyncStats::default(),
            poisoned: AtomicBool::new(false),
            prune_running: AtomicBool::new(false),
            prune_wanted: AtomicBool::new(false),
            checkpoint_job: Mutex::new((false, false)),
            batch_dirty: Mutex::new(None),
            flusher_started: AtomicBool::new(false),
            id_prefix: format!("{GENERATED_ID_PREFIX}{nonce:016x}."),
            id_counter: AtomicU64::new(0),
        })
    }

    /// Creates `run.json` and the first segment if this is a new run.
    pub(super) fn init_under_lock(
        storage: &dyn Storage,
        dir: &Path,
        run_id: &str,
        user_id: &str,
        opts: &LogOptions,
    ) -> Result<RunMeta> {
        let meta_path = dir.join(META_FILE);
        if storage.exists(&meta_path) {
            return read_meta(storage, dir);
        }
        // An archived run's working files are gone: never a new run in its place.
        if storage.exists(&dir.join(ARCHIVED_FILE)) {
            return Err(archived(run_id));
        }
        // Nor over a log whose `run.json` was lost: a new one would give the run another
        // creation time (its index and checkpoints then discarded) and segment size.
        if segment::log_holds_records(storage, dir)? {
            return Err(Error::corrupt(
                &meta_path,
                0,
                0,
                format!("missing, but the run's log is there; `swarm repair --run {run_id}` rebuilds it"),
            ));
        }
        let meta = RunMeta {
            format: frame::FORMAT_VERSION,
            run_id: run_id.to_string(),
            user_id: user_id.to_string(),
            created: Ts::now(),
            segment_bytes: opts.segment_bytes.max(4096),
        };
        let seg_path = segment::segment_path(dir, 1);
        if !storage.exists(&seg_path) {
            let f = storage
                .open(&seg_path, OpenMode::ReadWriteCreate)
                .ctx("create", &seg_path)?;
            f.sync_data().ctx("fsync", &seg_path)?;
        }
        let tmp = dir.join("run.json.tmp");
        let f = storage
            .open(&tmp, OpenMode::ReadWriteCreate)
            .ctx("create", &tmp)?;
        let mut bytes = serde_json::to_vec_pretty(&meta).map_err(|e| Error::Io {
            op: "encode",
            path: tmp.clone(),
            source: std::io::Error::other(e),
        })?;
        bytes.push(b'\n');
        f.set_len(0).ctx("truncate", &tmp)?;
        f.write_all_at(&bytes, 0).ctx("write", &tmp)?;
        f.sync_data().ctx("fsync", &tmp)?;
        storage.rename(&tmp, &meta_path).ctx("rename", &tmp)?;
        storage.sync_dir(dir).ctx("fsync dir", dir)?;
        if let Some(parent) = dir.parent() {
            storage.sync_dir(parent).ctx("fsync dir", parent)?;
        }
        Ok(meta)
    }

    pub(super) fn generated_id(&self) -> String {
        let n = self.id_counter.fetch_add(1, Ordering::Relaxed);
        // (Without `format!`: this runs once per event, under the append lock.)
        let mut digits = [0u8; 16];
        let mut i = digits.len();
        let mut v = n;
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(v & 0xf) as usize];
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        let mut id = String::with_capacity(self.id_prefix.len() + 16);
        id.push_str(&self.id_prefix);
        id.extend(digits[i..].iter().map(|&b| b as char));
        id
    }

    /// An fsync of the run failed in this process: its writer refuses every append.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// The seq of the run's durable mark (0 when unknown): stored before now.
    pub(crate) fn durable_seq(&self) -> u64 {
        self.synced_marks().durable_seq
    }

    /// This process's counters of the run's durable path.
    pub(crate) fn counters(&self) -> SyncCounters {
        SyncCounters {
            fsyncs: self.stats.fsyncs.load(Ordering::Relaxed),
            coalesced: self.stats.coalesced.load(Ordering::Relaxed),
            durable_events: self.stats.durable_events.load(Ordering::Relaxed),
            recovered_found: self.stats.recovered_found.load(Ordering::Relaxed),
        }
    }

    /// Appends one atomic batch and waits for its durability. Returns the stored events.
    ///
    /// Threads combine: the first one in leads, writes every waiting request in one
    /// `pwrite` under `LOCK`, hands the write lead on to the next arrival (which may
    /// write while this group's fsync runs), and registers the group's `sync` requests as
    /// waiters, leading the fsync itself when nobody does (`group_durable`). Whoever
    /// makes a frame durable wakes its thread: each thread parks once and is woken once,
    /// with a final (durable) result.
    pub(crate) fn append(self: &Arc<Self>, req: Request) -> Result<Vec<Event>> {
        self.append_many(vec![req])
            .pop()
            .unwrap_or_else(|| Err(self.lost()))
    }

    fn lost(&self) -> Error {
        Error::Io {
            op: "append",
            path: self.dir.clone(),
            source: std::io::Error::other("append result lost"),
        }
    }

    /// Appends several independent atomic batches from one thread, as [`RunLog::append`]
    /// does one: they join the same write group (one `pwrite`) and wait for the same
    /// fsync, and each gets its own outcome, in order (one refused, say by its
    /// `expect_seq`, does not refuse the others). A server uses it to commit every
    /// request that queued while its last commit ran with one thread, one lock and one
    /// fsync, rather than a parked thread per request.
    pub(crate) fn append_many(self: &Arc<Self>, reqs: Vec<Request>) -> Vec<Result<Vec<Event>>> {
        let me = std::thread::current();
        let slots: Vec<(Durability, Arc<Slot>)> = reqs
            .into_iter()
            .map(|mut req| {
                let durability = req.durability;
                // Encoding is most of an event's cost: done here, in parallel, not under
                // the lock.
                if req.tails.len() != req.batch.len() {
                    req.tails = req.batch.iter().map(Checked::encode_tail).collect();
                }
                let slot = Arc::new(Slot {
                    req: Mutex::new(Some(req)),
                    sync: durability == Durability::Sync,
                    result: Mutex::new(None),
                    done: AtomicBool::new(false),
                    taken: AtomicBool::new(false),
                    lead: AtomicBool::new(false),
                    thread: me.clone(),
                });
                (durability, slot)
            })
            .collect();
        if slots.is_empty() {
            return Vec::new();
        }
        // All at once, so that one write leader takes them all.
        lock(&self.combine)
            .pending
            .extend(slots.iter().map(|(_, s)| s.clone()));
        let untaken = || slots.iter().any(|(_, s)| !s.taken.load(Ordering::Acquire));
        let all_sync = slots.iter().all(|(_, s)| s.sync);
        loop {
            // `done` is read *before* the lead, so that a hand-off is never dropped: the
            // fsync leader sets `lead` under the sync mutex, and whoever settles the slot
            // (its fsync, a rotation's, a poisoning) does so under it later; a thread that
            // saw `done` sees the lead set before it. (Read the other way round, the lead
            // could come between the two reads: the thread left without it, and every
            // later `sync` append of the run waited for a leader for ever.)
            let done = slots.iter().all(|(_, s)| s.done.load(Ordering::Acquire));
            if slots
                .iter()
                .any(|(_, s)| s.lead.swap(false, Ordering::AcqRel))
            {
                // (No frame of its own: the outcomes go to the waiters.)
                let _ = self.lead_fsyncs(None, true);
                continue;
            }
            if done {
                break;
            }
            if untaken() {
                let mut c = lock(&self.combine);
                // While an fsync leader runs, `sync` appends queue for it: it writes them
                // all in one group when its fsync ends, and the next fsync covers them.
                let queued_for_leader = c.fsync_active && all_sync;
                if !(c.leader || queued_for_leader) && untaken() {
                    c.leader = true;
                    let group = std::mem::take(&mut c.pending);
                    for s in &group {
                        s.taken.store(true, Ordering::Release);
                    }
                    drop(c);
                    self.write_group(&group);
                    self.end_write_lead();
                    self.group_durable(&group);
                    continue;
                }
            }
            // The leader unparks us when a result is final (durable), to lead the next
            // write, or to lead the next fsync.
            std::thread::park();
        }
        slots
            .iter()
            .map(|(durability, slot)| {
                let taken = lock(&slot.result).take();
                let outcome = taken.ok_or_else(|| self.lost())??;
                // The last seq of the frame ending at `outcome.end` (a retried batch is
                // its whole frame), recorded with the marks.
                let end_seq = outcome.events.iter().map(|e| e.seq).max().unwrap_or(0);
                match (durability, outcome.replayed) {
                    // A retry is not acknowledged before the original is durable either.
                    // A stored frame in an older segment is durable already: rotation
                    // syncs the old one. (The group's leader made it durable already:
                    // this only checks.)
                    (Durability::Sync, _) => {
                        if let Some(seg) = &outcome.seg {
                            self.wait_durable(outcome.end, end_seq, seg)?
                        }
                        self.stats
                            .durable_events
                            .fetch_add(outcome.events.len() as u64, Ordering::Relaxed);
                    }
                    (Durability::Batch, false) => {
                        if let Some(seg) = &outcome.seg {
                            self.note_batch_write(outcome.end, end_seq, seg.clone())
                        }
                    }
                    _ => {}
                }
                Ok(outcome.events)
            })
            .collect()
    }

    /// Ends a write lead: the appends that arrived during the write are left to the fsync
    /// leader when one runs and they all wait for an fsync anyway (it writes them when
    /// its fsync ends, without a wake-up); otherwise the first of them leads next.
    pub(super) fn end_write_lead(&self) {
        let mut c = lock(&self.combine);
        c.leader = false;
        if !(c.fsync_active && c.pending.iter().all(|s| s.sync)) {
            c.hand_on();
        }
    }

    /// The fsync leader's write: the appends that queued while its last fsync ran, in one
    /// group (one `LOCK`, one `pwrite`), registered as waiters for its next fsync.
    pub(super) fn write_pending(&self) {
        let group = {
            let mut c = lock(&self.combine);
            if c.leader || c.pending.is_empty() {
                return;
            }
            c.leader = true;
            let group = std::mem::take(&mut c.pending);
            for s in &group {
                s.taken.store(true, Ordering::Release);
            }
            group
        };
        self.write_group(&group);
        self.end_write_lead();
        // (This thread leads the fsyncs: `group_durable` only registers the waiters.)
        self.group_durable(&group);
    }

    /// Settles a written group: every request that needs no fsync (not `sync`, failed,
    /// or an old frame) is done now; the `sync` ones wait, each for the fsync that covers
    /// its frame, and are woken by whoever makes it (this thread leads one when no fsync
    /// is in flight). This thread's own slots need no unpark.
    fn group_durable(&self, group: &[Arc<Slot>]) {
        let me = std::thread::current().id();
        let mut waiting: Vec<(FrameEnd, Arc<Slot>)> = Vec::new();
        for s in group {
            if s.sync {
                if let Some(Ok(o)) = &*lock(&s.result) {
                    if let Some(seg) = &o.seg {
                        let seq = o.events.iter().map(|e| e.seq).max().unwrap_or(0);
                        waiting.push(((o.end, seq, seg.clone()), s.clone()));
                        continue;
                    }
                }
            }
            s.done.store(true, Ordering::Release);
            if s.thread.id() != me {
                s.thread.unpark();
            }
        }
        if waiting.is_empty() {
            return;
        }
        let (wake, lead) = {
            let mut s = lock(&self.sync);
            s.waiters.extend(waiting);
            let wake = self.settle_waiters(&mut s, None);
            let lead = !s.leader && !s.waiters.is_empty();
            if lead {
                s.leader = true;
            }
            (wake, lead)
        };
        for w in wake {
            if w.thread.id() != me {
                w.thread.unpark();
            }
        }
        if lead {
            // (No frame of its own: the outcomes go to the waiters.)
            let _ = self.lead_fsyncs(None, true);
        }
    }

    /// The leader's work: one lock, one catch-up, one write for a group of requests.
    pub(super) fn write_group(&self, group: &[Arc<Slot>]) {
        let mut w = lock(&self.writer);
        let (slots, reqs): (Vec<Arc<Slot>>, Vec<Request>) = group
            .iter()
            .filter_map(|s| lock(&s.req).take().map(|r| (s.clone(), r)))
            .unzip();
        if self.poisoned.load(Ordering::Acquire) {
            for s in &slots {
                *lock(&s.result) = Some(Err(Error::Poisoned(self.run_id.clone())));
            }
            return;
        }
        let lock_path = self.dir.join(LOCK_FILE);
        if let Err(e) = w.lock_file.lock().ctx("lock", &lock_path) {
            for s in &slots {
                *lock(&s.result) = Some(Err(io_copy(&e)));
            }
            return;
        }
        // A panic in the group (a bug) must neither leave `LOCK` held by this process
        // (every writer of the run would wait until the `Store` is dropped) nor leave the
        // group's waiters and the next leader waiting for ever. This writer's view may be
        // half-updated, so it stops as after a failed fsync: poisoned (every later
        // append here refused; other processes, and a new `Store`, go on from the log),
        // the lock let go. The group is answered `Poisoned` (wrote nothing) if it
        // panicked before its `pwrite`; after it, its frames may be in the file and be
        // made durable by any later fsync, so the outcome is unknown (a caller that took
        // `Poisoned` at its word and appended again without an id would store it twice).
        w.group_written = false;
        let results = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.write_group_locked(&mut w, reqs)
        }));
        let results = match results {
            Ok(r) => r,
            Err(_) => {
                tracing::error!(run = %self.run_id, "a write group panicked; this process appends no more to the run");
                self.poisoned.store(true, Ordering::Release);
                w.loaded = false;
                let _ = w.lock_file.unlock();
                for s in &slots {
                    *lock(&s.result) = Some(Err(if w.group_written {
                        self.panicked_after_write()
                    } else {
                        Error::Poisoned(self.run_id.clone())
                    }));
                }
                return;
            }
        };
        self.prune_wanted
            .store(w.rules.wants_prune(), Ordering::Relaxed);
        if let Err(e) = w.lock_file.unlock().ctx("unlock", &lock_path) {
            tracing::error!(error = %e, "cannot release the append lock");
        }
        match results {
            Ok(list) => {
                for (s, r) in slots.iter().zip(list) {
                    *lock(&s.result) = Some(r);
                }
            }
            Err(e) => {
                for s in &slots {
                    *lock(&s.result) = Some(Err(io_copy(&e)));
                }
            }
        }
    }

    pub(super) fn write_group_locked(
        &self,
        w: &mut Writer,
        reqs: Vec<Request>,
    ) -> Result<Vec<Result<Outcome>>> {
        #[cfg(test)]
        if lock(&PANIC_IN_NEXT_GROUP)
            .take_if(|d| *d == self.dir)
            .is_some()
        {
            panic!("a write group panics (injected by a test)");
        }
        // Closed and archived by another process since this one opened the run (the
        // rules refuse a closed run too, but its segments may be gone): checked once a
        // group, under `LOCK`.
        if self.storage.exists(&self.dir.join(ARCHIVED_FILE)) {
            return Err(archived(&self.run_id));
        }
        self.catch_up(w)?;
        if w.end >= self.meta.segment_bytes {
            self.rotate(w)?;
        }
        // Generated ids (handed-off events carry them) are never looked up.
        let client_id = |e: &Checked| {
            e.id.as_deref()
                .is_some_and(|id| !id.starts_with(GENERATED_ID_PREFIX))
        };
        if reqs.iter().any(|r| r.batch.iter().any(client_id)) {
            self.catch_up_ids(w)?;
        }
        // Generated ids of recovered hand-offs are not kept in `ids`: found for this
        // group only, and forgotten after it.
        let recovered = self.find_recovered(w, &reqs)?;
        let saved = (w.head_seq, w.head_ts);
        let head_before = w.head_seq;
        let mut added_ids: Vec<String> = Vec::new();
        let mut buf = std::mem::take(&mut w.buf);
        buf.clear();
        let now = Ts::now();
        let mut plans: Vec<Result<(Vec<Event>, PlanEnd)>> = Vec::with_capacity(reqs.len());
        let mut last_visible_end: Option<(u64, u64)> = None;
        let group_ts = now.max(w.head_ts);
        let ts_json = serde_json::to_vec(&group_ts).unwrap_or_default();
        for r in reqs {
            let durability = r.durability;
            let plan = self.prepare(w, r, (group_ts, &ts_json), &mut buf, &mut added_ids);
            if let Ok((events, PlanEnd::InBuf(end_in_buf))) = &plan {
                if durability != Durability::Sync {
                    let seq = events.iter().map(|e| e.seq).max().unwrap_or(0);
                    // (The max: a same-group retry's frame ends before later ones.)
                    last_visible_end = last_visible_end.max(Some((*end_in_buf, seq)));
                }
            }
            plans.push(plan);
        }
        let start = w.end;
        // An error once bytes of this group reached the file: the plans whose frames were
        // in `buf` get it, the others (refusals; retries of events stored before) keep
        // their answers (a stored retry told "failed" may be appended again without its id).
        let mut failed: Option<Error> = None;
        if !buf.is_empty() {
            let seg_path = segment::segment_path(&self.dir, w.seg_base);
            self.preallocate(w, start + buf.len() as u64, buf.len() as u64, &seg_path);
            w.group_written = true;
            let written = w.seg.write_all_at(&buf, start).ctx("write", &seg_path);
            #[cfg(test)]
            if lock(&PANIC_AFTER_NEXT_WRITE)
                .take_if(|d| *d == self.dir)
                .is_some()
            {
                panic!("a write group panics after its write (injected by a test)");
            }
            if let Err(e) = written {
                // Bytes after a whole frame of this group stay: never cut. Another process's
                // flush extends its cover over whole frames it finds after its own
                // (`whole_frames_after`), so a whole frame of this group may already be
                // published and read, and cutting it would give its seqs to other events.
                // The next group loads the log again (`loaded` below): this group's whole
                // frames are the log's, the bytes after the last of them a torn tail, cut
                // aside (never published: a publisher needs a whole frame). So when a
                // whole frame reached the file, whether each append is stored is unknown;
                // and so it is when reading the file back fails too (an id-less retry
                // told "not stored" would store the event twice).
                let e = if self.whole_frame_at(&w.seg, &seg_path, start) != Some(false) {
                    self.write_outcome_unknown(e)
                } else {
                    // Part of a frame, nobody's to publish: cut now (needs no space), not
                    // copied aside by the next load, which fails too at a full disk.
                    if w.seg.set_len(start).is_ok() {
                        w.alloc = start;
                    }
                    e
                };
                w.head_seq = saved.0;
                w.head_ts = saved.1;
                for id in added_ids.into_iter().chain(recovered) {
                    w.ids.remove(&id);
                }
                // The rules moved with the prepared events: fold the log again next time.
                w.loaded = false;
                w.recorded = false;
                w.buf = buf;
                return Ok(self.outcomes(plans, start, w.seg_base, &w.seg, Some(e)));
            }
            if w.ids_upto
                == (Pos {
                    seg: w.seg_base,
                    off: start,
                })
            {
                w.ids_upto.off = start + buf.len() as u64;
            }
            w.end = start + buf.len() as u64;
            {
                let mut s = lock(&self.sync);
                let p = Pos {
                    seg: w.seg_base,
                    off: w.end,
                };
                if s.written.as_ref().is_none_or(|(q, _, _)| *q < p) {
                    s.written = Some((p, w.head_seq, w.seg.clone()));
                }
            }
            // The group is in the log from here: an error now is an unknown outcome for
            // its appends, never a group-wide "failed" (`failed`).
            if let Some((e, seq)) = last_visible_end {
                let at = Pos {
                    seg: w.seg_base,
                    off: start + e,
                };
                if let Err(e) = self.advance_visible(at, seq) {
                    failed = Some(e);
                }
            }
            if std::mem::take(&mut w.recorded) && failed.is_none() {
                // A refusal recorded an engine event (a channel conflict) and returns an
                // error: nobody waits for that frame, so make it durable and visible now.
                // Rare, so it is done under the lock rather than threaded through.
                let seg = w.seg.clone();
                let end = Pos {
                    seg: w.seg_base,
                    off: w.end,
                };
                if let Err(e) = self.wait_durable(end, w.head_seq, &seg) {
                    failed = Some(e);
                }
            }
        }
        // A request refused by the rules was judged on everything the catch-up found,
        // including whole frames a writer that died before its fsync left beyond the
        // visible mark. Make those durable and visible now, so the caller's next read
        // sees what it was refused on (else a retry reads the same stale view and is
        // refused again, forever). Only on refusals: the append path is unchanged.
        let refused = plans.iter().any(|p| {
            matches!(
                p,
                Err(Error::Conflict(_)
                    | Error::SeqConflict { .. }
                    | Error::Forbidden(_)
                    | Error::Escalated { .. })
            )
        });
        if refused && start > 0 && failed.is_none() {
            let seg = w.seg.clone();
            let at = Pos {
                seg: w.seg_base,
                off: start,
            };
            match self.wait_durable(at, head_before, &seg) {
                Ok(_) => {}
                // Nothing of this group written: its answers are this error, as before.
                Err(e) if buf.is_empty() => {
                    w.buf = buf;
                    return Err(e);
                }
                Err(e) => failed = Some(e),
            }
        }
        self.stats
            .recovered_found
            .fetch_add(recovered.len() as u64, Ordering::Relaxed);
        for id in recovered {
            w.ids.remove(&id);
        }
        w.buf = buf;
        let failed = failed.map(|e| self.write_outcome_unknown(e));
        Ok(self.outcomes(plans, start, w.seg_base, &w.seg, failed))
    }

    /// The answers of a write group whose frames were laid out from `start` of segment
    /// `seg_base`: with `failed` (its write, or what followed it, failed), the plans
    /// whose frames were in the group's buffer get that error; refusals keep theirs, and
    /// retries of events stored before keep their stored events.
    fn outcomes(
        &self,
        plans: Vec<Result<(Vec<Event>, PlanEnd)>>,
        start: u64,
        seg_base: u64,
        seg_file: &Arc<dyn StorageFile>,
        failed: Option<Error>,
    ) -> Vec<Result<Outcome>> {
        plans
            .into_iter()
            .map(|p| {
                let (events, end) = p?;
                Ok(match end {
                    PlanEnd::InBuf(_) if failed.is_some() => {
                        return Err(super::io_copy(failed.as_ref().expect("checked")));
                    }
                    PlanEnd::InBuf(e) => Outcome {
                        end: Pos {
                            seg: seg_base,
                            off: start + e,
                        },
                        seg: Some(seg_file.clone()),
                        events,
                        replayed: false,
                    },
                    PlanEnd::Stored(pos) => Outcome {
                        end: pos,
                        seg: (pos.seg == seg_base).then(|| seg_file.clone()),
                        events,
                        replayed: true,
                    },
                })
            })
            .collect()
    }

    /// Validates one request against the run and encodes its frame into `buf`.
    /// Returns the events and where their frame ends.
    pub(super) fn prepare(
        &self,
        w: &mut Writer,
        r: Request,
        (now, now_json): (Ts, &[u8]),
        buf: &mut Vec<u8>,
        added_ids: &mut Vec<String>,
    ) -> Result<(Vec<Event>, PlanEnd)> {
        if r.batch.is_empty() {
            return Err(Error::invalid("batch", "no events"));
        }
        // Idempotent retry: every id already stored returns the stored events.
        let known: Vec<Option<(u64, Pos)>> = r
            .batch
            .iter()
            .map(|e| e.id.as_ref().and_then(|id| w.ids.get(id).copied()))
            .collect();
        if known.iter().all(Option::is_some) {
            let mut events = Vec::with_capacity(known.len());
            let mut end = Pos::default();
            let mut end_in_buf: Option<u64> = None;
            let unwritten = Pos {
                seg: w.seg_base,
                off: w.end,
            };
            for (seq, pos) in known.into_iter().flatten() {
                if pos >= unwritten {
                    // An earlier request of this same group stored it (a retry raced its
                    // original): the frame is still in `buf`, not yet in the file.
                    let (ev, rel_end) = self.read_buffered(buf, pos.off - w.end, seq)?;
                    end_in_buf = end_in_buf.max(Some(rel_end));
                    events.push(ev);
                    continue;
                }
                let (ev, frame_end) = self.read_stored(seq, pos)?;
                end = end.max(frame_end);
                events.push(ev);
            }
            for (asked, stored) in r.batch.iter().zip(&events) {
                if asked.agent_id != stored.agent_id
                    && !w.rules.may_read_event(&asked.agent_id, stored)
                {
                    // Another agent's event that the run's policy hides from this one: its
                    // seq and fields are not this caller's to learn.
                    return Err(Error::Conflict(format!(
                        "id {:?} is already used in this run by another agent's event; \
                         use a new id for a new event",
                        stored.id
                    )));
                }
                if let Some(field) = asked.differs_from(stored) {
                    return Err(Error::Conflict(format!(
                        "id {:?} is already stored as seq {} with a different {field}; \
                         a retry must carry the same event (use a new id for a new event)",
                        stored.id, stored.seq
                    )));
                }
            }
            // A frame in `buf` ends after every frame in the file: its end covers them.
            let end = end_in_buf.map_or(PlanEnd::Stored(end), PlanEnd::InBuf);
            return Ok((events, end));
        }
        if let Some(i) = known.iter().position(Option::is_some) {
            return Err(Error::invalid(
                "id",
                format!(
                    "{:?} is already stored but other events of this batch are not; \
                     a batch is retried whole or not at all",
                    r.batch[i].id.as_deref().unwrap_or_default()
                ),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for e in &r.batch {
            if let Some(id) = &e.id {
                if !seen.insert(id.as_str()) {
                    return Err(Error::invalid(
                        "id",
                        format!("{id:?} appears twice in the batch"),
                    ));
                }
            }
        }
        if let Some(expected) = r.expect_seq {
            if expected != w.head_seq {
                return Err(Error::SeqConflict {
                    run: self.run_id.clone(),
                    expected,
                    actual: w.head_seq,
                });
            }
        }
        let ts = now.max(w.head_ts);
        let first = w.head_seq + 1;
        let mut events = Vec::with_capacity(r.batch.len());
        // Nothing is applied to the writer's rules before the whole request is accepted.
        // Events whose checks do not depend on each other (entries without a board CAS
        // and without a subject on a decision or action) are all checked against the
        // rules as they are, then applied; other batches are checked and applied on a
        // copy, which replaces the rules once the batch is accepted.
        // The synthesizer's events never touch the rules: independent too.
        let independent = r.batch.iter().all(|c| {
            matches!(
                c.kind,
                EventType::SynthBegin | EventType::Synth | EventType::SynthCommit
            ) || (c.kind.is_client()
                && c.expect_subject_seq.is_none()
                && !(c.kind.is_pinned() && c.subject.is_some()))
        });
        let mut scratch: Option<Rules> =
            (r.batch.len() > 1 && !independent).then(|| w.rules.clone());
        // The frame's payload, `[event,event,...]`: client events from their pre-encoded
        // tails (the lock holder copies bytes), engine events through serde.
        let ts_json = if ts == now {
            std::borrow::Cow::Borrowed(now_json)
        } else {
            std::borrow::Cow::Owned(serde_json::to_vec(&ts).unwrap_or_default())
        };
        let mut payload: Vec<u8> =
            Vec::with_capacity(2 + r.tails.iter().map(|t| t.len() + 96).sum::<usize>());
        payload.push(b'[');
        let encode = |payload: &mut Vec<u8>, e: &Event| -> Result<()> {
            if payload.len() > 1 {
                payload.push(b',');
            }
            serde_json::to_writer(payload, e).map_err(|e| Error::invalid("event", e.to_string()))
        };
        let mut tails = r.tails.into_iter();
        for mut c in r.batch {
            let seq = first + events.len() as u64;
            if let Some(bad) = c.refs.iter().find(|&&x| x == 0 || x >= seq) {
                return Err(Error::invalid(
                    "refs",
                    format!("seq {bad} does not name an earlier event (this one gets seq {seq})"),
                ));
            }
            let id = c.id.take().unwrap_or_else(|| self.generated_id());
            let expect_subject_seq = c.expect_subject_seq;
            let tail = tails.next();
            let ev = c.into_event(&self.run_id, seq, ts, id);
            let on_copy = scratch.is_some();
            let rules = scratch.as_mut().unwrap_or(&mut w.rules);
            let fx = rules.check(&rule_event(&ev), expect_subject_seq)?;
            if let Some(refusal) = fx.refuse {
                // Refused, but what the refusal records (a channel conflict) is stored.
                let mut recorded = Vec::new();
                for (kind, content) in fx.after {
                    let seq = w.head_seq + 1 + recorded.len() as u64;
                    recorded.push(self.engine_event(seq, ts, kind, content, None));
                }
                if !recorded.is_empty() {
                    for e in &recorded {
                        w.rules.apply(&rule_event(e));
                    }
                    let payload = serde_json::to_vec(&recorded)
                        .map_err(|e| Error::invalid("event", e.to_string()))?;
                    frame::encode(&payload, buf);
                    w.head_seq += recorded.len() as u64;
                    w.head_ts = ts;
                    w.recorded = true;
                }
                return Err(refusal);
            }
            if on_copy {
                rules.apply(&rule_event(&ev));
            }
            match tail {
                Some(tail) => {
                    if payload.len() > 1 {
                        payload.push(b',');
                    }
                    write_event_json(
                        &mut payload,
                        &self.run_id_json,
                        ev.seq,
                        &ts_json,
                        &ev.id,
                        &tail,
                    );
                }
                None => encode(&mut payload, &ev)?,
            }
            let subject = ev.subject.clone();
            events.push(ev);
            for (kind, content) in fx.after {
                let seq = first + events.len() as u64;
                let e = self.engine_event(seq, ts, kind, content, subject.clone());
                if on_copy {
                    rules.apply(&rule_event(&e));
                }
                encode(&mut payload, &e)?;
                events.push(e);
            }
        }
        payload.push(b']');
        debug_assert_eq!(
            std::str::from_utf8(&payload).ok(),
            serde_json::to_string(&events).ok().as_deref(),
            "pre-encoded frame differs from serde's"
        );
        if payload.len() > BATCH_BYTES_MAX.min(PAYLOAD_BYTES_MAX) {
            return Err(Error::invalid(
                "batch",
                format!("{} bytes encoded, limit {BATCH_BYTES_MAX}", payload.len()),
            ));
        }
        // Accepted: only now do the rules move.
        match scratch {
            Some(rules) => w.rules = rules,
            None => {
                for e in &events {
                    w.rules.apply(&rule_event(e));
                }
            }
        }
        let frame_start = w.end + buf.len() as u64;
        frame::encode(&payload, buf);
        for e in &events {
            if !e.id.starts_with(GENERATED_ID_PREFIX) {
                w.ids.insert(
                    e.id.clone(),
                    (
                        e.seq,
                        Pos {
                            seg: w.seg_base,
                            off: frame_start,
                        },
                    ),
                );
                added_ids.push(e.id.clone());
            }
        }
        w.head_seq = first + events.len() as u64 - 1;
        w.head_ts = ts;
        Ok((events, PlanEnd::InBuf(buf.len() as u64)))
    }

    pub(super) fn engine_event(
        &self,
        seq: u64,
        ts: Ts,
        kind: EventType,
        content: serde_json::Value,
        subject: Option<String>,
    ) -> Event {
        Event {
            run_id: self.run_id.clone(),
            seq,
            ts,
            id: self.generated_id(),
            agent_id: ENGINE_AGENT.to_string(),
            user_id: self.meta.user_id.clone(),
            kind,
            content,
            confidence: None,
            refs: Vec::new(),
            subject,
            session_id: None,
            meta: None,
        }
    }

    /// Reads an event back from a frame of the group being prepared, at `rel` in `buf`.
    /// Returns it and the frame's end in `buf`.
    pub(super) fn read_buffered(&self, buf: &[u8], rel: u64, seq: u64) -> Result<(Event, u64)> {
        let bug = |reason: &str| Error::Io {
            op: "append",
            path: self.dir.clone(),
            source: std::io::Error::other(format!(
                "internal: no buffered frame for seq {seq}: {reason}"
            )),
        };
        let at = usize::try_from(rel).map_err(|_| bug("offset"))?;
        let Some(bytes) = buf.get(at..) else {
            return Err(bug("offset past the buffer"));
        };
        match frame::decode(bytes) {
            frame::Decoded::Frame { payload, len } => {
                let events: Vec<Event> =
                    serde_json::from_slice(payload).map_err(|e| bug(&e.to_string()))?;
                let ev = events
                    .into_iter()
                    .find(|e| e.seq == seq)
                    .ok_or_else(|| bug("seq not in the frame"))?;
                Ok((ev, rel + len as u64))
            }
            _ => Err(bug("not a frame")),
        }
    }

    /// Reads a stored event back (for idempotent retries). Returns it and its frame end.
    pub(super) fn read_stored(&self, seq: u64, pos: Pos) -> Result<(Event, Pos)> {
        let path = segment::segment_path(&self.dir, pos.seg);
        let mut r = FrameReader::open(&*self.storage, &path, pos.off, None)?;
        match r.step()? {
            Step::Frame { offset, len } => {
                let events: Vec<Event> = serde_json::from_slice(r.payload()).map_err(|e| {
                    Error::corrupt(&path, offset, seq, format!("bad event JSON: {e}"))
                })?;
                let ev = events.into_iter().find(|e| e.seq == seq).ok_or_else(|| {
                    Error::corrupt(
                        &path,
                        offset,
                        seq,
                        "frame does not hold the indexed seq".into(),
                    )
                })?;
                Ok((
                    ev,
                    Pos {
                        seg: pos.seg,
                        off: offset + len,
                    },
                ))
            }
            _ => Err(Error::corrupt(
                &path,
                pos.off,
                seq,
                "no frame where the id index points".into(),
            )),
        }
    }

    /// Zero-fills the segment ahead of `need` (the end of the group about to be written,
    /// `group` bytes long) when less than half of the wanted fill is left, up to the
    /// segment's size: the group's `pwrite` then overwrites blocks that exist, and its
    /// `fdatasync` commits no size change (one per refill instead of one per fsync).
    /// Written, never `fallocate`d: unwritten extents cost the same journal commit when
    /// first written. A failure only costs the speed-up (the data write that follows
    /// reports its own). Under `LOCK`.
    ///
    /// The wanted fill is [`REFILL_GROUPS`] groups of this one's size, at least
    /// [`REFILL_BYTES_MIN`] and at most the store's chunk: the fsync after a refill also
    /// flushes its zeros and commits the size change, so a refill costs about one
    /// group's worth of extra fsync time per [`REFILL_GROUPS`] groups at any load, and
    /// few writers (small groups, where latency is watched) refill a little at a time.
    /// (A fixed 512 KiB refill made the group after it take 0.6-1 ms instead of 0.12 at
    /// 16 writer processes: their p99. A fixed 64 KiB one puts a journal commit in every
    /// 7th fsync at 64 threads; their ratio to `none` fell to 0.71-0.74 in 3 runs, partly
    /// because `none` got faster.)
    fn preallocate(&self, w: &mut Writer, need: u64, group: u64, path: &Path) {
        let chunk = self.prealloc_bytes;
        let cap = self.meta.segment_bytes;
        let ahead = group
            .saturating_mul(REFILL_GROUPS)
            .max(REFILL_BYTES_MIN)
            .min(chunk);
        if chunk == 0 || w.alloc >= cap || w.alloc >= need + ahead / 2 {
            return;
        }
        let target = (need + ahead).div_ceil(4096).saturating_mul(4096).min(cap);
        let mut at = w.alloc.max(need);
        static ZEROS: [u8; 64 << 10] = [segment::FILL; 64 << 10];
        while at < target {
            let n = (target - at).min(ZEROS.len() as u64) as usize;
            if let Err(e) = w.seg.write_all_at(&ZEROS[..n], at) {
                if !std::mem::replace(&mut w.prealloc_warned, true) {
                    tracing::warn!(segment = %path.display(), error = %e, "cannot preallocate the segment (said once until it succeeds)");
                }
                return;
            }
            at += n as u64;
        }
        w.alloc = target;
        w.prealloc_warned = false;
    }

    /// Starts a new segment after a full one. The full one is trimmed to its last frame
    /// (its zero fill cut, so tools like `jq` read sealed segments as plain JSON lines)
    /// and synced first, so that a durable position in a later segment implies every
    /// earlier segment is durable. A crash before the trim leaves the fill, which every
    /// reader takes as the end of the segment's bytes.
    pub(super) fn rotate(&self, w: &mut Writer) -> Result<()> {
        let old = segment::segment_path(&self.dir, w.seg_base);
        if w.alloc > w.end || w.seg.len().ctx("stat", &old)? > w.end {
            w.seg.set_len(w.end).ctx("trim", &old)?;
        }
        self.fsync_segment(&*w.seg, &old)?;
        let base = w.head_seq + 1;
        let path = segment::segment_path(&self.dir, base);
        let f = self
            .storage
            .open(&path, OpenMode::CreateNew)
            .ctx("create", &path)?;
        self.storage
            .sync_dir(&self.dir)
            .ctx("fsync dir", &self.dir)?;
        w.seg = Arc::from(f);
        w.seg_base = base;
        w.end = 0;
        w.alloc = 0;
        Ok(())
    }

    /// Syncs what `batch`-mode appends left unsynced.
    /// Whether the rules, as of this process's last look, want a prune, and no prune
    /// started by this process is running. Claims the prune when it returns true.
    /// While another thread holds the writer, the answer as of the last written group.
    pub(crate) fn claim_prune(&self) -> bool {
        let wants = match self.writer.try_lock() {
            Ok(w) => w.rules.wants_prune(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().rules.wants_prune(),
            Err(std::sync::TryLockError::WouldBlock) => self.prune_wanted.load(Ordering::Relaxed),
        };
        wants && !self.prune_running.swap(true, Ordering::AcqRel)
    }

    /// Claims the background checkpoint job: true when none runs (the caller starts it);
    /// false when one runs, which is then told to run once more when it ends.
    pub(crate) fn claim_checkpoint(&self) -> bool {
        let mut j = lock(&self.checkpoint_job);
        if j.0 {
            j.1 = true;
            return false;
        }
        *j = (true, false);
        true
    }

    /// Called by the checkpoint job when a checkpoint is written: true when crossings
    /// came meanwhile (write one more, at the new head), false when the job has ended.
    pub(crate) fn checkpoint_again(&self) -> bool {
        let mut j = lock(&self.checkpoint_job);
        if j.1 {
            j.1 = false;
            return true;
        }
        j.0 = false;
        false
    }

    /// Ends a prune claimed with `claim_prune`.
    pub(crate) fn release_prune(&self) {
        self.prune_running.store(false, Ordering::Release);
    }

    /// A background prune of this process is running.
    pub(crate) fn prune_running(&self) -> bool {
        self.prune_running.load(Ordering::Acquire)
    }
}
