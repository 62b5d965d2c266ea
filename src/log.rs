//! The writer side of a run's log: multi-process appends, group commit, recovery.
//!
//! # Protocol
//! Appends from every process go through the run's `LOCK` file (`flock`, exclusive).
//! Under it a writer catches up with what other processes appended since its last look
//! (only the frames' CRCs are checked; the last frame is parsed for seq and ts), repairs a
//! torn tail left by a writer that died mid-`write`, assigns seqs and timestamps, and
//! writes every frame of its group in one `pwrite` at the end of the last segment.
//!
//! Durability is then reached *outside* the append lock, so that other writers can append
//! while one waits for the disk. A waiting append first looks at the durable position in
//! `SYNCED` (without a lock, as readers do); if it is not covered yet, it `fdatasync`s the
//! segment and then, under the `SYNCED` file's lock, advances the durable position to the
//! end of the last frame its process wrote. One fsync thus covers every frame its process
//! wrote before it began; across processes the sharing is opportunistic: a process whose
//! frame a published position already covers skips its fsync, and the kernel merges the
//! concurrent fsyncs of one file. fsyncs are not serialized: a writer whose frame is not
//! covered by an fsync already in flight starts its own at once instead of queueing behind
//! it (a single leader at a time, with the others waiting on it, was measured slower on
//! the 2-core VM this was tuned on; see `benches/README.md`). Inside a process, threads
//! first combine their appends into one write (a leader writes for all waiting threads)
//! and then wait for one fsync that covers them all.
//!
//! The published position is always the end of a whole frame this process wrote (all
//! bytes before it were written before the fsync began: catch-up repaired any torn tail
//! first), never the file's length, which may include a torn frame of a writer that died
//! mid-`write`; so a tail repair never has to take back a durable position.
//!
//! Lock order, always: writer mutex, then `LOCK`, then the `sync_io` mutex, then `SYNCED`.
//! The `sync` state mutex is innermost and never held across I/O.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checkpoint;
use crate::error::{Error, IoContext, Result};
use crate::event::{Checked, Event, EventHead, EventType, ENGINE_AGENT, GENERATED_ID_PREFIX};
use crate::frame::{self, PAYLOAD_BYTES_MAX};
use crate::rules::{needs_content, RuleEvent, Rules};
use crate::segment::{self, FrameReader, Step};
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::ts::Ts;
use crate::watermark::{self, Pos};

/// Default size at which a segment is closed and a new one started.
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Largest frame payload a batch may produce (the decoder accepts up to 16 MiB).
pub const BATCH_BYTES_MAX: usize = 8 * 1024 * 1024;

/// When an append is acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// After `fdatasync` (group-committed). A power loss cannot take it away.
    #[default]
    Sync,
    /// After the write; an fsync follows within the batch interval.
    Batch,
    /// After the write; no fsync is issued for it.
    None,
}

impl std::str::FromStr for Durability {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "sync" => Ok(Durability::Sync),
            "batch" => Ok(Durability::Batch),
            "none" => Ok(Durability::None),
            _ => Err(Error::invalid(
                "durability",
                format!("{s:?} is not one of sync, batch, none"),
            )),
        }
    }
}

/// Per-run settings fixed at creation, stored in `run.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    /// Format version of the run directory.
    pub format: u32,
    /// The run id.
    pub run_id: String,
    /// The user who created the run.
    pub user_id: String,
    /// When it was created.
    pub created: Ts,
    /// Segment rotation size, in bytes.
    pub segment_bytes: u64,
}

/// Settings of a store's writers.
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// Segment size for new runs.
    pub segment_bytes: u64,
    /// Longest time a `batch`-mode append stays unsynced.
    pub batch_interval_ms: u64,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            batch_interval_ms: 10,
        }
    }
}

pub(crate) const LOCK_FILE: &str = "LOCK";
pub(crate) const SYNCED_FILE: &str = "SYNCED";
pub(crate) const META_FILE: &str = "run.json";

/// One append request: an atomic batch.
pub(crate) struct Request {
    pub batch: Vec<Checked>,
    pub expect_seq: Option<u64>,
    pub durability: Durability,
}

struct Outcome {
    events: Vec<Event>,
    end: Pos,
    /// The segment holding `end`, when it may still need an fsync.
    seg: Option<Arc<dyn StorageFile>>,
    /// Every event was already stored (an idempotent retry): nothing was written.
    replayed: bool,
}

/// Where a prepared request's frame ends.
enum PlanEnd {
    /// New frame: its end as an offset in the group's write buffer.
    InBuf(u64),
    /// Idempotent retry: the end of the stored frame.
    Stored(Pos),
}

struct Slot {
    req: Mutex<Option<Request>>,
    result: Mutex<Option<Result<Outcome>>>,
    /// The appending thread, woken (unparked) when its result is set or when it is to
    /// lead the next group: waking only the threads concerned, rather than every waiting
    /// one, matters with dozens of threads on two cores.
    thread: std::thread::Thread,
}

#[derive(Default)]
struct Combine {
    pending: Vec<Arc<Slot>>,
    leader: bool,
}

struct Writer {
    lock_file: Box<dyn StorageFile>,
    /// The rule part of the fold, current with the log up to `end`.
    rules: Rules,
    /// The group being written holds an engine event recorded by a refused request.
    recorded: bool,
    /// Nothing below is valid until `loaded`.
    loaded: bool,
    seg_base: u64,
    seg: Arc<dyn StorageFile>,
    /// End of the last whole frame of `seg` known to this process.
    end: u64,
    head_seq: u64,
    head_ts: Ts,
    /// Client-given ids, with the seq and frame position of their event.
    ids: HashMap<String, (u64, Pos)>,
    /// `ids` covers every frame before this position.
    ids_upto: Pos,
    buf: Vec<u8>,
}

/// An fsync of a segment in flight in this process.
struct InFlight {
    id: u64,
    /// The position it makes durable when it succeeds (`None`: rotation or repair).
    covers: Option<Pos>,
    /// Its `sync_data` returned successfully.
    done: bool,
}

struct SyncLocal {
    /// Largest durable position this process has seen.
    durable: Pos,
    /// End of the last frame this process wrote, and its segment.
    written: Option<(Pos, Arc<dyn StorageFile>)>,
    /// fsyncs in flight in this process.
    inflight: Vec<InFlight>,
    next_id: u64,
    /// Threads parked until a frame ending at the position is durable, waiting for an
    /// fsync in flight that covers it.
    waiters: Vec<(Pos, std::thread::Thread)>,
}

/// The writer handle of one run, shared by the threads of a process.
pub(crate) struct RunLog {
    run_id: String,
    dir: PathBuf,
    /// Where checkpoints are, to start the rules from one.
    ck_dir: Option<PathBuf>,
    storage: Arc<dyn Storage>,
    meta: RunMeta,
    batch_interval_ms: u64,
    combine: Mutex<Combine>,
    writer: Mutex<Writer>,
    sync: Mutex<SyncLocal>,
    /// Signalled whenever an fsync of this process ends (for `end_fsync`'s wait on
    /// overlapping fsyncs; appends waiting for durability are parked in `waiters`).
    sync_cv: Condvar,
    /// Held while this process uses the `SYNCED` file's lock: `flock` does not exclude
    /// threads sharing one file description.
    sync_io: Mutex<()>,
    synced: Box<dyn StorageFile>,
    synced_path: PathBuf,
    poisoned: AtomicBool,
    /// A background prune of this process is running.
    prune_running: AtomicBool,
    /// Position of the last `batch`-mode write not yet covered by a flush (seg, off).
    batch_dirty: Mutex<Option<(Pos, Arc<dyn StorageFile>)>>,
    flusher_started: AtomicBool,
    id_nonce: u64,
    id_counter: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn io_copy(e: &Error) -> Error {
    match e {
        Error::Io { op, path, source } => Error::Io {
            op,
            path: path.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        Error::Poisoned(r) => Error::Poisoned(r.clone()),
        Error::Corrupt {
            path,
            offset,
            seq,
            reason,
        } => Error::Corrupt {
            path: path.clone(),
            offset: *offset,
            seq: *seq,
            reason: reason.clone(),
        },
        other => Error::Io {
            op: "append",
            path: PathBuf::new(),
            source: std::io::Error::other(other.to_string()),
        },
    }
}

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
            dir,
            ck_dir,
            storage,
            meta,
            batch_interval_ms: opts.batch_interval_ms.max(1),
            combine: Mutex::new(Combine::default()),
            writer: Mutex::new(Writer {
                lock_file,
                rules: Rules::default(),
                recorded: false,
                loaded: false,
                seg_base: 0,
                seg: placeholder,
                end: 0,
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
            }),
            sync_cv: Condvar::new(),
            sync_io: Mutex::new(()),
            synced,
            synced_path,
            poisoned: AtomicBool::new(false),
            prune_running: AtomicBool::new(false),
            batch_dirty: Mutex::new(None),
            flusher_started: AtomicBool::new(false),
            id_nonce: nonce,
            id_counter: AtomicU64::new(0),
        })
    }

    /// Creates `run.json` and the first segment if this is a new run.
    fn init_under_lock(
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

    fn generated_id(&self) -> String {
        let n = self.id_counter.fetch_add(1, Ordering::Relaxed);
        format!("{GENERATED_ID_PREFIX}{:016x}.{n:x}", self.id_nonce)
    }

    /// Appends one atomic batch and waits for its durability. Returns the stored events.
    pub(crate) fn append(self: &Arc<Self>, req: Request) -> Result<Vec<Event>> {
        let durability = req.durability;
        let slot = Arc::new(Slot {
            req: Mutex::new(Some(req)),
            result: Mutex::new(None),
            thread: std::thread::current(),
        });
        let mut c = lock(&self.combine);
        c.pending.push(slot.clone());
        while lock(&slot.result).is_none() {
            if c.leader {
                // The leader unparks us with our result, or to lead the next group.
                drop(c);
                std::thread::park();
                c = lock(&self.combine);
                continue;
            }
            c.leader = true;
            let group = std::mem::take(&mut c.pending);
            drop(c);
            self.write_group(&group);
            for s in &group {
                if !Arc::ptr_eq(s, &slot) {
                    s.thread.unpark();
                }
            }
            c = lock(&self.combine);
            c.leader = false;
            // Appends that arrived during the write: the first of them leads next.
            if let Some(next) = c.pending.first() {
                next.thread.unpark();
            }
        }
        drop(c);
        let taken = lock(&slot.result).take();
        let Some(result) = taken else {
            return Err(Error::Io {
                op: "append",
                path: self.dir.clone(),
                source: std::io::Error::other("append result lost"),
            });
        };
        let outcome = result?;
        match (durability, outcome.replayed) {
            // A retry is not acknowledged before the original is durable either. A stored
            // frame in an older segment is durable already: rotation syncs the old one.
            (Durability::Sync, _) => {
                if let Some(seg) = &outcome.seg {
                    self.wait_durable(outcome.end, seg)?
                }
            }
            (Durability::Batch, false) => {
                if let Some(seg) = &outcome.seg {
                    self.note_batch_write(outcome.end, seg.clone())
                }
            }
            _ => {}
        }
        Ok(outcome.events)
    }

    /// The leader's work: one lock, one catch-up, one write for a group of requests.
    fn write_group(&self, group: &[Arc<Slot>]) {
        let mut w = lock(&self.writer);
        let reqs: Vec<(Arc<Slot>, Request)> = group
            .iter()
            .filter_map(|s| lock(&s.req).take().map(|r| (s.clone(), r)))
            .collect();
        if self.poisoned.load(Ordering::Acquire) {
            for (s, _) in &reqs {
                *lock(&s.result) = Some(Err(Error::Poisoned(self.run_id.clone())));
            }
            return;
        }
        let lock_path = self.dir.join(LOCK_FILE);
        if let Err(e) = w.lock_file.lock().ctx("lock", &lock_path) {
            for (s, _) in &reqs {
                *lock(&s.result) = Some(Err(io_copy(&e)));
            }
            return;
        }
        let results = self.write_group_locked(&mut w, reqs.iter().map(|(_, r)| r).collect());
        if let Err(e) = w.lock_file.unlock().ctx("unlock", &lock_path) {
            tracing::error!(error = %e, "cannot release the append lock");
        }
        match results {
            Ok(list) => {
                for ((s, _), r) in reqs.iter().zip(list) {
                    *lock(&s.result) = Some(r);
                }
            }
            Err(e) => {
                for (s, _) in &reqs {
                    *lock(&s.result) = Some(Err(io_copy(&e)));
                }
            }
        }
    }

    fn write_group_locked(
        &self,
        w: &mut Writer,
        reqs: Vec<&Request>,
    ) -> Result<Vec<Result<Outcome>>> {
        self.catch_up(w)?;
        if w.end >= self.meta.segment_bytes {
            self.rotate(w)?;
        }
        if reqs.iter().any(|r| r.batch.iter().any(|e| e.id.is_some())) {
            self.catch_up_ids(w)?;
        }
        let saved = (w.head_seq, w.head_ts);
        let mut added_ids: Vec<String> = Vec::new();
        let mut buf = std::mem::take(&mut w.buf);
        buf.clear();
        let now = Ts::now();
        let mut plans: Vec<Result<(Vec<Event>, PlanEnd)>> = Vec::with_capacity(reqs.len());
        let mut last_visible_end: Option<u64> = None;
        for r in &reqs {
            let plan = self.prepare(w, r, now, &mut buf, &mut added_ids);
            if let Ok((_, PlanEnd::InBuf(end_in_buf))) = &plan {
                if r.durability != Durability::Sync {
                    last_visible_end = Some(*end_in_buf);
                }
            }
            plans.push(plan);
        }
        let start = w.end;
        if !buf.is_empty() {
            let seg_path = segment::segment_path(&self.dir, w.seg_base);
            if let Err(e) = w.seg.write_all_at(&buf, start).ctx("write", &seg_path) {
                // Remove whatever part of the group reached the file, so that no
                // unacknowledged bytes stay behind a later append.
                if w.seg.set_len(start).is_err() {
                    self.poisoned.store(true, Ordering::Release);
                }
                w.head_seq = saved.0;
                w.head_ts = saved.1;
                for id in added_ids {
                    w.ids.remove(&id);
                }
                // The rules moved with the prepared events: fold the log again next time.
                w.loaded = false;
                w.recorded = false;
                w.buf = buf;
                return Err(e);
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
                if s.written.as_ref().is_none_or(|(q, _)| *q < p) {
                    s.written = Some((p, w.seg.clone()));
                }
            }
            if let Some(e) = last_visible_end {
                self.advance_visible(Pos {
                    seg: w.seg_base,
                    off: start + e,
                })?;
            }
            if std::mem::take(&mut w.recorded) {
                // A refusal recorded an engine event (a channel conflict) and returns an
                // error: nobody waits for that frame, so make it durable and visible now.
                // Rare, so it is done under the lock rather than threaded through.
                let seg = w.seg.clone();
                self.wait_durable(
                    Pos {
                        seg: w.seg_base,
                        off: w.end,
                    },
                    &seg,
                )?;
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
        if refused && start > 0 {
            let seg = w.seg.clone();
            self.wait_durable(
                Pos {
                    seg: w.seg_base,
                    off: start,
                },
                &seg,
            )?;
        }
        let seg_file = w.seg.clone();
        let seg_base = w.seg_base;
        w.buf = buf;
        Ok(plans
            .into_iter()
            .map(|p| {
                p.map(|(events, end)| match end {
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
            .collect())
    }

    /// Validates one request against the run and encodes its frame into `buf`.
    /// Returns the events and where their frame ends.
    fn prepare(
        &self,
        w: &mut Writer,
        r: &Request,
        now: Ts,
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
        for c in &r.batch {
            let seq = first + events.len() as u64;
            if let Some(bad) = c.refs.iter().find(|&&x| x == 0 || x >= seq) {
                return Err(Error::invalid(
                    "refs",
                    format!("seq {bad} does not name an earlier event (this one gets seq {seq})"),
                ));
            }
            let id = c.id.clone().unwrap_or_else(|| self.generated_id());
            let ev = c.clone().into_event(&self.run_id, seq, ts, id);
            let on_copy = scratch.is_some();
            let rules = scratch.as_mut().unwrap_or(&mut w.rules);
            let fx = rules.check(&rule_event(&ev), c.expect_subject_seq)?;
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
            let subject = ev.subject.clone();
            events.push(ev);
            for (kind, content) in fx.after {
                let seq = first + events.len() as u64;
                let e = self.engine_event(seq, ts, kind, content, subject.clone());
                if on_copy {
                    rules.apply(&rule_event(&e));
                }
                events.push(e);
            }
        }
        let payload =
            serde_json::to_vec(&events).map_err(|e| Error::invalid("event", e.to_string()))?;
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

    fn engine_event(
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
    fn read_buffered(&self, buf: &[u8], rel: u64, seq: u64) -> Result<(Event, u64)> {
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
    fn read_stored(&self, seq: u64, pos: Pos) -> Result<(Event, Pos)> {
        let path = segment::segment_path(&self.dir, pos.seg);
        let mut r = FrameReader::open(&*self.storage, &path, pos.off, None)?;
        match r.step()? {
            Step::Frame { offset, len } => {
                let events: Vec<Event> = serde_json::from_slice(r.payload())
                    .map_err(|e| corrupt(&path, offset, seq, format!("bad event JSON: {e}")))?;
                let ev = events.into_iter().find(|e| e.seq == seq).ok_or_else(|| {
                    corrupt(
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
            _ => Err(corrupt(
                &path,
                pos.off,
                seq,
                "no frame where the id index points".into(),
            )),
        }
    }

    /// Brings the writer up to date with the log: loads the head on first use, reads what
    /// other processes appended, repairs a torn tail, follows rotations. Under `LOCK`.
    fn catch_up(&self, w: &mut Writer) -> Result<()> {
        if !w.loaded {
            self.load(w)?;
        }
        loop {
            let seg_path = segment::segment_path(&self.dir, w.seg_base);
            let len = w.seg.len().ctx("stat", &seg_path)?;
            if len < w.end {
                return Err(corrupt(
                    &seg_path,
                    len,
                    w.head_seq + 1,
                    format!(
                        "segment shrank from {} to {len} bytes under the lock",
                        w.end
                    ),
                ));
            }
            if len > w.end {
                self.scan_tail(w, len, true)?;
            }
            if w.end < self.meta.segment_bytes {
                return Ok(());
            }
            let next = w.head_seq + 1;
            let next_path = segment::segment_path(&self.dir, next);
            if !self.storage.exists(&next_path) {
                return Ok(());
            }
            self.switch_segment(w, next)?;
        }
    }

    fn switch_segment(&self, w: &mut Writer, base: u64) -> Result<()> {
        let path = segment::segment_path(&self.dir, base);
        w.seg = Arc::from(
            self.storage
                .open(&path, OpenMode::ReadWriteCreate)
                .ctx("open", &path)?,
        );
        w.seg_base = base;
        w.end = 0;
        Ok(())
    }

    /// First look at the log: the rules, head seq and ts, and the valid end. Starts from
    /// the newest checkpoint that matches the log (its rules are the fold up to there),
    /// then reads every frame after it.
    fn load(&self, w: &mut Writer) -> Result<()> {
        let bases = segment::list_segments(&*self.storage, &self.dir)?;
        if bases.is_empty() {
            return Err(Error::RunNotFound(self.run_id.clone()));
        }
        w.rules = Rules::default();
        w.head_seq = 0;
        w.head_ts = Ts(0);
        let mut from = Pos {
            seg: bases[0],
            off: 0,
        };
        if let Some((rules, info)) = self.newest_checkpoint()? {
            w.rules = rules;
            w.head_seq = info.seq;
            w.head_ts = info.ts;
            from = info.end();
        }
        for (i, &base) in bases.iter().enumerate() {
            if base < from.seg {
                continue;
            }
            self.switch_segment(w, base)?;
            if base == from.seg {
                w.end = from.off;
            } else if w.head_seq + 1 != base {
                let path = segment::segment_path(&self.dir, base);
                return Err(corrupt(
                    &path,
                    0,
                    w.head_seq + 1,
                    format!("segment starts at seq {base}"),
                ));
            }
            let len = w
                .seg
                .len()
                .ctx("stat", &segment::segment_path(&self.dir, base))?;
            self.scan_tail(w, len, i + 1 == bases.len())?;
        }
        self.clamp_watermark(Pos {
            seg: w.seg_base,
            off: w.end,
        })?;
        w.ids_upto = Pos::default();
        w.loaded = true;
        Ok(())
    }

    fn newest_checkpoint(&self) -> Result<Option<(Rules, checkpoint::CheckpointInfo)>> {
        let Some(ck_dir) = &self.ck_dir else {
            return Ok(None);
        };
        for seq in checkpoint::list(&*self.storage, ck_dir)? {
            let path = ck_dir.join(checkpoint::checkpoint_name(seq));
            match checkpoint::load(&*self.storage, &path) {
                Ok((state, info))
                    if state.run_id == self.run_id
                        && checkpoint::matches_log(&*self.storage, &self.dir, &info)? =>
                {
                    return Ok(Some((state.rules, info)));
                }
                Ok(_) => {
                    tracing::warn!(checkpoint = %path.display(), "checkpoint does not match the log; skipped")
                }
                Err(e) => {
                    tracing::warn!(checkpoint = %path.display(), error = %e, "damaged checkpoint; skipped")
                }
            }
        }
        Ok(None)
    }

    /// Lowers the watermark to `end`, the end of the log's whole frames, if it points
    /// past it. `SYNCED` is not fsynced, so after a power loss its newer `visible` can
    /// survive while the unsynced frames it covered did not; and a cut segment leaves
    /// both marks past its end. Left alone, such a mark would cover the next frames
    /// written there: shown to readers before their fsync, or, for `durable`,
    /// acknowledged without one. Under `LOCK`: every live writer's frames are whole and
    /// before `end`, so no mark a live process set is lowered.
    fn clamp_watermark(&self, end: Pos) -> Result<()> {
        let mut s = lock(&self.sync);
        s.durable = s.durable.min(end);
        self.synced.lock().ctx("lock", &self.synced_path)?;
        let r = (|| {
            let mut m = watermark::read(&*self.synced, &self.synced_path)?;
            if m.durable > end || m.visible > end {
                tracing::warn!(
                    path = %self.synced_path.display(),
                    ?m,
                    ?end,
                    "watermark past the end of the log; lowered"
                );
                m.durable = m.durable.min(end);
                m.visible = m.visible.min(end);
                watermark::write(&*self.synced, &self.synced_path, m)?;
            }
            Ok(())
        })();
        let _ = self.synced.unlock();
        r
    }

    /// Reads frames in `[w.end, len)` of the current segment, moving the head; a torn tail
    /// is cut off (kept in a `.broken` file), damage followed by valid frames is an error.
    fn scan_tail(&self, w: &mut Writer, len: u64, last_segment: bool) -> Result<()> {
        let path = segment::segment_path(&self.dir, w.seg_base);
        let mut r = FrameReader::new(w.seg.clone(), path.clone(), w.end, Some(len))?;
        let (bad_at, reason) = loop {
            match r.step()? {
                Step::Frame { offset, len } => {
                    let events: Vec<LiteEvent> =
                        serde_json::from_slice(r.payload()).map_err(|e| {
                            corrupt(
                                &path,
                                offset,
                                w.head_seq + 1,
                                format!("bad event JSON: {e}"),
                            )
                        })?;
                    for e in &events {
                        if e.seq != w.head_seq + 1 {
                            return Err(corrupt(
                                &path,
                                offset,
                                w.head_seq + 1,
                                format!("holds seq {}", e.seq),
                            ));
                        }
                        let content = if needs_content(e.kind) {
                            serde_json::from_str(e.content.get()).map_err(|err| {
                                corrupt(&path, offset, e.seq, format!("bad content: {err}"))
                            })?
                        } else {
                            serde_json::Value::Null
                        };
                        w.rules.apply(&RuleEvent {
                            seq: e.seq,
                            agent: &e.agent_id,
                            kind: e.kind,
                            subject: e.subject.as_deref(),
                            refs: &e.refs,
                            content: &content,
                        });
                        w.head_seq = e.seq;
                        w.head_ts = e.ts;
                    }
                    w.end = offset + len;
                }
                Step::End { offset, incomplete } => {
                    if incomplete {
                        break (offset, "incomplete frame");
                    }
                    w.end = offset;
                    break (u64::MAX, "");
                }
                Step::Corrupt { offset, reason } => break (offset, reason),
            }
        };
        if bad_at == u64::MAX {
            return Ok(());
        }
        if !last_segment {
            return Err(corrupt(
                &path,
                bad_at,
                w.head_seq + 1,
                format!("{reason} in a segment that is not the last"),
            ));
        }
        // Damage at `bad_at`. We hold the append lock, so no live writer is mid-write.
        if let Some(next) = r.skip_to_next_frame()? {
            return Err(corrupt(
                &path,
                bad_at,
                w.head_seq + 1,
                format!("{reason}; valid records follow at byte {next}, refusing to truncate"),
            ));
        }
        self.repair_tail(w, bad_at, len, reason)
    }

    fn repair_tail(&self, w: &mut Writer, at: u64, len: u64, reason: &str) -> Result<()> {
        let path = segment::segment_path(&self.dir, w.seg_base);
        let mut torn = vec![0u8; (len - at) as usize];
        w.seg.read_exact_at(&mut torn, at).ctx("read", &path)?;
        let broken = self
            .dir
            .join(format!("{}.{at}.broken", segment::segment_name(w.seg_base)));
        let bf = self
            .storage
            .open(&broken, OpenMode::ReadWriteCreate)
            .ctx("create", &broken)?;
        bf.set_len(0).ctx("truncate", &broken)?;
        bf.write_all_at(&torn, 0).ctx("write", &broken)?;
        bf.sync_data().ctx("fsync", &broken)?;
        self.storage
            .sync_dir(&self.dir)
            .ctx("fsync dir", &self.dir)?;
        let _io = lock(&self.sync_io);
        let cut = Pos {
            seg: w.seg_base,
            off: at,
        };
        {
            // The cut bytes were never a whole frame, so no durable position of this
            // process can lie past them; lower the cache anyway, never trust it blindly.
            let mut s = lock(&self.sync);
            s.durable = s.durable.min(cut);
        }
        self.synced.lock().ctx("lock", &self.synced_path)?;
        let r = (|| {
            w.seg.set_len(at).ctx("truncate", &path)?;
            self.fsync_segment(&*w.seg, &path)?;
            let mut m = watermark::read(&*self.synced, &self.synced_path)?;
            m.durable = m.durable.min(cut);
            m.visible = m.visible.min(cut);
            watermark::write(&*self.synced, &self.synced_path, m)
        })();
        let _ = self.synced.unlock();
        r?;
        w.end = at;
        tracing::warn!(
            segment = %path.display(),
            offset = at,
            bytes = len - at,
            reason,
            kept_in = %broken.display(),
            "truncated a torn tail left by a writer that died mid-write"
        );
        Ok(())
    }

    /// Starts a new segment after a full one. The full one is synced first, so that a
    /// durable position in a later segment implies every earlier segment is durable.
    fn rotate(&self, w: &mut Writer) -> Result<()> {
        let old = segment::segment_path(&self.dir, w.seg_base);
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
        Ok(())
    }

    /// Loads the client ids of every frame since `ids_upto` (lazily: only appends that
    /// carry an id pay for it).
    fn catch_up_ids(&self, w: &mut Writer) -> Result<()> {
        let bases = segment::list_segments(&*self.storage, &self.dir)?;
        let head = Pos {
            seg: w.seg_base,
            off: w.end,
        };
        for &base in &bases {
            if base > head.seg {
                break;
            }
            if base < w.ids_upto.seg {
                continue;
            }
            let from = if base == w.ids_upto.seg {
                w.ids_upto.off
            } else {
                0
            };
            let limit = if base == head.seg {
                Some(head.off)
            } else {
                None
            };
            let path = segment::segment_path(&self.dir, base);
            let mut r = FrameReader::open(&*self.storage, &path, from, limit)?;
            loop {
                match r.step()? {
                    Step::Frame { offset, .. } => {
                        let heads: Vec<EventHead> =
                            serde_json::from_slice(r.payload()).map_err(|e| {
                                corrupt(&path, offset, 0, format!("bad event JSON: {e}"))
                            })?;
                        for h in heads {
                            if !h.id.starts_with(GENERATED_ID_PREFIX) {
                                w.ids.insert(
                                    h.id.into_owned(),
                                    (
                                        h.seq,
                                        Pos {
                                            seg: base,
                                            off: offset,
                                        },
                                    ),
                                );
                            }
                        }
                    }
                    Step::End { .. } => break,
                    Step::Corrupt { offset, reason } => {
                        return Err(corrupt(&path, offset, 0, reason.to_string()))
                    }
                }
            }
        }
        w.ids_upto = head;
        Ok(())
    }

    /// Makes frames up to `p` visible without syncing them (batch and none modes).
    fn advance_visible(&self, p: Pos) -> Result<()> {
        let _io = lock(&self.sync_io);
        self.synced.lock().ctx("lock", &self.synced_path)?;
        let r = (|| {
            let mut m = watermark::read(&*self.synced, &self.synced_path)?;
            if m.visible < p {
                m.visible = p;
                watermark::write(&*self.synced, &self.synced_path, m)?;
            }
            Ok(())
        })();
        let _ = self.synced.unlock();
        r
    }

    /// Waits until everything before `end` is durable, syncing if nobody else has.
    fn wait_durable(&self, end: Pos, seg: &Arc<dyn StorageFile>) -> Result<()> {
        let (id, cover, file) = {
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
            let (cover, file) = match &s.written {
                Some((p, f)) if *p >= end => (*p, f.clone()),
                _ => (end, seg.clone()),
            };
            let id = s.next_id;
            s.next_id += 1;
            s.inflight.push(InFlight {
                id,
                covers: Some(cover),
                done: false,
            });
            (id, cover, file)
        };
        let r = self.sync_and_publish(id, cover, &*file);
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
    fn wake_waiters(&self, s: &mut SyncLocal) {
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
    fn sync_and_publish(&self, id: u64, cover: Pos, file: &dyn StorageFile) -> Result<Pos> {
        // Another process's fsync may have covered it already.
        let m = watermark::read(&*self.synced, &self.synced_path)?;
        if m.durable >= cover {
            return Ok(m.durable);
        }
        let path = segment::segment_path(&self.dir, cover.seg);
        let r = file.sync_data().ctx("fsync", &path);
        self.end_fsync(id, r)?;
        let _io = lock(&self.sync_io);
        self.synced.lock().ctx("lock", &self.synced_path)?;
        let r = (|| {
            let mut m = watermark::read(&*self.synced, &self.synced_path)?;
            if m.durable < cover {
                m.durable = cover;
                m.visible = m.visible.max(cover);
                watermark::write(&*self.synced, &self.synced_path, m)?;
            }
            Ok(m.durable)
        })();
        let _ = self.synced.unlock();
        r
    }

    /// fsyncs a segment outside `wait_durable` (rotation, tail repair), in the same
    /// bookkeeping, so that its failure is seen by every overlapping fsync.
    fn fsync_segment(&self, file: &dyn StorageFile, path: &Path) -> Result<()> {
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
    fn end_fsync(&self, id: u64, r: Result<()>) -> Result<()> {
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

    fn note_batch_write(self: &Arc<Self>, end: Pos, seg: Arc<dyn StorageFile>) {
        {
            let mut d = lock(&self.batch_dirty);
            match &*d {
                Some((p, _)) if *p >= end => {}
                _ => *d = Some((end, seg)),
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

    /// Syncs what `batch`-mode appends left unsynced.
    /// Whether the rules, as of this process's last look, want a prune, and no prune
    /// started by this process is running. Claims the prune when it returns true.
    pub(crate) fn claim_prune(&self) -> bool {
        let wants = lock(&self.writer).rules.wants_prune();
        wants && !self.prune_running.swap(true, Ordering::AcqRel)
    }

    /// Ends a prune claimed with `claim_prune`.
    pub(crate) fn release_prune(&self) {
        self.prune_running.store(false, Ordering::Release);
    }

    pub(crate) fn flush_batch(&self) {
        let pending = lock(&self.batch_dirty).take();
        if let Some((end, seg)) = pending {
            if let Err(e) = self.wait_durable(end, &seg) {
                tracing::error!(error = %e, run = %self.run_id, "batch-mode fsync failed");
            }
        }
    }
}

impl Drop for RunLog {
    fn drop(&mut self) {
        self.flush_batch();
    }
}

fn corrupt(path: &Path, offset: u64, seq: u64, reason: String) -> Error {
    Error::Corrupt {
        path: path.to_path_buf(),
        offset,
        seq,
        reason,
    }
}

/// The fields of a stored event the writer folds into its rules; content stays raw
/// unless the rules read it.
#[derive(Deserialize)]
struct LiteEvent<'a> {
    seq: u64,
    ts: Ts,
    #[serde(borrow)]
    agent_id: std::borrow::Cow<'a, str>,
    #[serde(rename = "type")]
    kind: EventType,
    #[serde(borrow, default)]
    subject: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    refs: Vec<u64>,
    #[serde(borrow)]
    content: &'a serde_json::value::RawValue,
}

fn rule_event(e: &Event) -> RuleEvent<'_> {
    RuleEvent {
        seq: e.seq,
        agent: &e.agent_id,
        kind: e.kind,
        subject: e.subject.as_deref(),
        refs: &e.refs,
        content: &e.content,
    }
}

/// Reads a run's `run.json`.
pub(crate) fn read_meta(storage: &dyn Storage, dir: &Path) -> Result<RunMeta> {
    let path = dir.join(META_FILE);
    let f = storage.open(&path, OpenMode::Read).ctx("open", &path)?;
    let len = f.len().ctx("stat", &path)?;
    if len > 1 << 20 {
        return Err(corrupt(&path, 0, 0, "run.json over 1 MiB".into()));
    }
    let mut b = vec![0u8; len as usize];
    f.read_exact_at(&mut b, 0).ctx("read", &path)?;
    serde_json::from_slice(&b).map_err(|e| corrupt(&path, 0, 0, format!("bad run.json: {e}")))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::path::Path;
    use std::sync::Arc;

    use crate::event::{EventType, NewEvent};
    use crate::read::{ReadOptions, Visibility};
    use crate::storage::MemStorage;
    use crate::store::Store;

    use super::{Durability, LogOptions};

    fn store(mem: &MemStorage, segment_bytes: u64) -> Store {
        Store::open_with(
            Arc::new(mem.clone()),
            Path::new("/data"),
            LogOptions {
                segment_bytes,
                ..LogOptions::default()
            },
        )
        .unwrap()
    }

    fn seqs(s: &Store, run: &str, visibility: Visibility) -> Vec<u64> {
        let opts = ReadOptions {
            visibility,
            ..ReadOptions::default()
        };
        s.read(run, opts).unwrap().map(|e| e.unwrap().seq).collect()
    }

    /// Many threads append in `sync` mode (their fsyncs overlap, across segment
    /// rotations); after a power loss that keeps nothing unsynced, every acknowledged
    /// event is there and readers see exactly the gap-free prefix.
    #[test]
    fn acknowledged_sync_appends_survive_a_power_loss() {
        let mem = MemStorage::new();
        let s = Arc::new(store(&mem, 4096));
        let acked: Vec<u64> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..8)
                .map(|t| {
                    let s = s.clone();
                    sc.spawn(move || {
                        (0..40)
                            .map(|i| {
                                let ev = NewEvent::new(
                                    &format!("a{t}"),
                                    EventType::Evidence,
                                    format!("finding {i}"),
                                );
                                s.append("r", ev, Durability::Sync).unwrap().seq
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        // Every acknowledged event is visible at once (visible == durable in sync mode).
        assert_eq!(
            seqs(&s, "r", Visibility::Visible),
            (1..=320).collect::<Vec<_>>()
        );
        drop(s);
        mem.crash(|_, _| 0);
        let s = store(&mem, 4096);
        // `SYNCED` itself is never fsynced, so what survives is read as written.
        let after: HashSet<u64> = seqs(&s, "r", Visibility::Written).into_iter().collect();
        for q in &acked {
            assert!(after.contains(q), "acknowledged seq {q} lost");
        }
        let ev = NewEvent::new("a0", EventType::Decision, "go on");
        assert_eq!(s.append("r", ev, Durability::Sync).unwrap().seq, 321);
    }

    /// An fsync fails while other threads' fsyncs may be in flight: no append is
    /// acknowledged unless it survives a power loss, and the writer stays poisoned.
    #[test]
    fn a_failed_fsync_acknowledges_nothing_lost_and_poisons() {
        let mem = MemStorage::new();
        let s = Arc::new(store(&mem, 1 << 20));
        let ev = |i: u32| NewEvent::new("a", EventType::Evidence, format!("e{i}"));
        s.append("r", ev(0), Durability::Sync).unwrap();
        mem.fail_syncs(1);
        let results: Vec<Result<u64, String>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..6)
                .map(|t| {
                    let s = s.clone();
                    sc.spawn(move || {
                        (0..10)
                            .map(|i| {
                                s.append("r", ev(t * 100 + i), Durability::Sync)
                                    .map(|e| e.seq)
                                    .map_err(|e| e.to_string())
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        assert!(
            results.iter().any(Result::is_err),
            "the injected failure was seen"
        );
        let err = s.append("r", ev(999), Durability::Sync).unwrap_err();
        assert!(err.to_string().contains("poison"), "{err}");
        drop(s);
        mem.crash(|_, _| 0);
        let s = store(&mem, 1 << 20);
        // `SYNCED` itself is never fsynced, so what survives is read as written.
        let after: HashSet<u64> = seqs(&s, "r", Visibility::Written).into_iter().collect();
        for q in results.iter().filter_map(|r| r.as_ref().ok()) {
            assert!(after.contains(q), "acknowledged seq {q} lost");
        }
    }
}
