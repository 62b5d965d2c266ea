//! The multi-process writer of a run's log: one `RunLog` per run and process.
//!
//! - `writer`: the append path: validation under the lock, rules check, seq and ts
//!   assignment, one `pwrite` per group, rotation.
//! - `group`: durability: the `fdatasync`s that make appends durable, shared by every
//!   thread and process waiting on them (one fsync in flight per process, one per run across processes under `SYNC_LOCK`); the `SYNCED` marks.
//! - `recovery`: catching up with other processes' frames, loading the rules from a
//!   checkpoint, and repairing a torn tail (bytes after the last whole frame).
//! - `tests`: failed writes and fsyncs, torn tails, retries and panics in a group.
//!
//! # Protocol
//! Appends from every process go through the run's `LOCK` file (`flock`, exclusive).
//! Under it a writer catches up with what other processes appended since its last look
//! (only the frames' CRCs are checked; the last frame is parsed for seq and ts), repairs a
//! torn tail left by a writer that died mid-`write`, assigns seqs and timestamps, and
//! writes every frame of its group in one `pwrite` at the end of the last segment.
//!
//! Durability is then reached *outside* the append lock, so that other writers can append
//! while one waits for the disk (group commit):
//! - **Threads.** Appending threads combine: the first in leads, writes every waiting
//!   request in one `pwrite`, hands the write lead to the next arrival, and registers
//!   the group's `sync` requests as waiters on their frames' ends. One thread at a time
//!   leads the data fsyncs (`SyncLocal::leader`; the write leader when none does): each
//!   covers every frame the process wrote before it began, and the leader marks done and
//!   unparks every waiter it covered itself, then syncs again while waiters are left
//!   uncovered (at most `LEAD_ROUNDS` times, then it hands the lead to one of them). So
//!   each fsync serves everybody who queued during the last, and each appending thread
//!   parks once and is woken once. While a thread leads the fsyncs, `sync` appends do
//!   not write themselves: they queue, and the fsync leader writes everything queued in
//!   one group when its fsync ends, just before the next one (`write_pending`), as Redis
//!   writes every waiting client's command once per loop turn. No write-lead hand-off,
//!   no lock or `pwrite` per arrival: at 64 threads a write group is about the whole
//!   next fsync's worth.
//! - **Processes.** fsyncs of a run are taken one at a time under the `SYNC_LOCK` file. A
//!   process that waited for it first re-reads the durable mark in `SYNCED`, which the
//!   flush before it may have moved past its frame (then it has nothing to do); otherwise
//!   it extends its cover over the whole (CRC-valid) frames other processes wrote after
//!   its own in the segment, `fdatasync`s, and, under the `SYNCED` file's lock, publishes
//!   the end of the last of them. A leader/follower flush, as PostgreSQL's WAL flush lock:
//!   while one process syncs, the others' frames pile up and the next fsync covers them all.
//!
//! The published position is always the end of a whole frame written before the fsync
//! began (this process's, or a CRC-valid one of another process found after it), never the
//! file's length, which may include a torn frame of a writer that died mid-`write`; so a
//! tail repair never has to take back a durable position. (So a writer whose `pwrite`
//! fails part-way never cuts a whole frame that reached the file: those, which a flush may
//! have published, stay, the bytes after them are a torn tail, cut aside by the next
//! load, and its appends have an unknown outcome. When no whole frame reached the file,
//! the part of one is cut at once, and not kept: nobody can have published it.)
//!
//! Lock order, always: writer mutex, then `LOCK`, then `SYNC_LOCK`, then the `sync_io`
//! mutex, then `SYNCED`.
//! The `sync` state mutex is never held across I/O; only the `combine` queue's mutex is
//! taken inside it (when the fsync leader steps down), never the other way round.

//!
//! Invariant: every acknowledged `sync` append was covered by an `fdatasync` before it
//! was acknowledged; after a failed fsync this run's writer refuses every append.
//! Invariant: seqs are handed out under the `LOCK` file only, gap-free, and `ts` never
//! decreases in seq order.
//! Invariant: only bytes after the last whole frame are ever cut (kept in `.broken`, but
//! for the part of a frame this process's own failed write left, cut at once).
//! Never imports: `store`, `query`, `scratchpad`, `tail`, `synth` (this layer sits below
//! the store and above `fold`, whose rules it checks every append against).

mod group;
mod recovery;
mod writer;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::event::ts::Ts;
use crate::event::{Checked, Event, EventType};
use crate::fold::rules::{RuleEvent, Rules};
use crate::log::meta::{Durability, RunMeta};
use crate::log::storage::{Storage, StorageFile};
use crate::log::watermark::Pos;

/// One append request: an atomic batch.
pub(crate) struct Request {
    pub batch: Vec<Checked>,
    pub expect_seq: Option<u64>,
    pub durability: Durability,
    /// Each event's JSON after `id` ([`Checked::encode_tail`]), encoded by the appending
    /// thread before it queues; empty until then.
    pub tails: Vec<Vec<u8>>,
    /// A retry after a handed-off append's outcome was lost (the committing process died
    /// or closed the connection): every event carries an id, generated ones included, and
    /// frames after this seq are searched for them first, so that a batch the committer
    /// wrote is returned rather than stored twice (`store::handoff`).
    pub recover_since: Option<u64>,
}

impl Slot {
    /// A slot for a thread that only waits for durability (no request of its own).
    fn waiter() -> Arc<Slot> {
        Arc::new(Slot {
            req: Mutex::new(None),
            sync: true,
            result: Mutex::new(None),
            done: AtomicBool::new(false),
            taken: AtomicBool::new(true),
            lead: AtomicBool::new(false),
            thread: std::thread::current(),
        })
    }
}

impl Request {
    pub(crate) fn new(
        batch: Vec<Checked>,
        expect_seq: Option<u64>,
        durability: Durability,
    ) -> Request {
        Request {
            batch,
            expect_seq,
            durability,
            tails: Vec::new(),
            recover_since: None,
        }
    }
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
    /// The request asks for `sync` durability.
    sync: bool,
    result: Mutex<Option<Result<Outcome>>>,
    /// `result` is final (for `sync`, durable): the thread may return.
    done: AtomicBool,
    /// A write leader took the request (it is written, or failed): the thread waits for
    /// `done` and does not lead a write.
    taken: AtomicBool,
    /// The thread is asked to lead the next data fsync (a hand-off from the last one).
    lead: AtomicBool,
    /// The appending thread, woken (unparked) when its result is set or when it is to
    /// lead the next group: waking only the threads concerned, rather than every waiting
    /// one, matters with dozens of threads on two cores.
    thread: std::thread::Thread,
}

#[derive(Default)]
struct Combine {
    pending: Vec<Arc<Slot>>,
    /// A thread is writing a group.
    leader: bool,
    /// A thread leads the data fsyncs and writes, before each one, the appends that
    /// queued while the last one ran (`RunLog::write_pending`). Set and cleared by that
    /// leader; cleared only under the `sync` mutex, with `pending` empty (or handed on).
    fsync_active: bool,
}

impl Combine {
    /// When nobody writes, wakes the first queued append to write the queue.
    fn hand_on(&self) {
        if !self.leader {
            if let Some(next) = self.pending.first() {
                next.thread.unpark();
            }
        }
    }
}

struct Writer {
    lock_file: Box<dyn StorageFile>,
    /// The rule part of the fold, current with the log up to `end`.
    rules: Rules,
    /// The group being written holds an engine event recorded by a refused request.
    recorded: bool,
    /// The group being written reached its `pwrite` (a panic after it leaves the
    /// outcome of its appends unknown, not "wrote nothing").
    group_written: bool,
    /// Nothing below is valid until `loaded`.
    loaded: bool,
    /// Where the last `load` found acknowledged bytes damaged or missing (at the end of
    /// the log, where `repair` can cut them), if it did.
    damage: Option<Pos>,
    seg_base: u64,
    seg: Arc<dyn StorageFile>,
    /// End of the last whole frame of `seg` known to this process.
    end: u64,
    /// Length of `seg` as last seen under the lock: past `end` it is the zero fill.
    alloc: u64,
    /// A failed zero fill was logged (once until one succeeds: at a full disk every
    /// append would log it).
    prealloc_warned: bool,
    head_seq: u64,
    head_ts: Ts,
    /// Client-given ids, with the seq and frame position of their event.
    ids: HashMap<String, (u64, Pos)>,
    /// `ids` covers every frame before this position.
    ids_upto: Pos,
    buf: Vec<u8>,
}

/// The end of a frame this process wrote, the seq of its last event, and its segment.
type FrameEnd = (Pos, u64, Arc<dyn StorageFile>);

/// An fsync of a segment in flight in this process.
struct InFlight {
    id: u64,
    /// Its `sync_data` returned successfully.
    done: bool,
}

struct SyncLocal {
    /// Largest durable position this process has seen.
    durable: Pos,
    /// End of the last frame this process wrote, the seq of its last event, and its
    /// segment.
    written: Option<FrameEnd>,
    /// fsyncs in flight in this process.
    inflight: Vec<InFlight>,
    next_id: u64,
    /// Threads parked until a frame ending at the position is durable (their `done` is
    /// set, or their `lead` when they are to lead the next fsync), waiting for the fsync
    /// in flight or the next one.
    /// (The frame's segment and last seq come with it: a retried request waits for a
    /// stored frame that may not be in `written`.)
    waiters: Vec<(FrameEnd, Arc<Slot>)>,
    /// A thread leads the data fsyncs (or has been asked to): the others wait for it.
    leader: bool,
}

/// Counters of a run's durable path in this process, since it opened the run.
#[derive(Default)]
pub(crate) struct SyncStats {
    /// `fdatasync`s of segments this process made (appends, rotations, repairs).
    pub fsyncs: AtomicU64,
    /// Times this process found, after waiting for `SYNC_LOCK`, that another process's
    /// fsync had already made its frames durable (an fsync saved).
    pub coalesced: AtomicU64,
    /// Events appended with `sync` durability and acknowledged.
    pub durable_events: AtomicU64,
    pub recovered_found: AtomicU64,
}

/// A snapshot of [`SyncStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SyncCounters {
    /// `fdatasync`s this process made on the run's segments.
    pub fsyncs: u64,
    /// fsyncs saved because another process's fsync covered the frames first.
    pub coalesced: u64,
    /// Events appended with `sync` durability and acknowledged.
    pub durable_events: u64,
    /// Events of handed-off appends whose answer was lost that the search after them
    /// found stored by the process that committed them (`Request::recover_since`).
    pub recovered_found: u64,
}

impl std::ops::Add for SyncCounters {
    type Output = SyncCounters;
    /// Counts of two writers (or stores) summed.
    fn add(self, c: SyncCounters) -> SyncCounters {
        SyncCounters {
            fsyncs: self.fsyncs + c.fsyncs,
            coalesced: self.coalesced + c.coalesced,
            durable_events: self.durable_events + c.durable_events,
            recovered_found: self.recovered_found + c.recovered_found,
        }
    }
}

/// The writer handle of one run, shared by the threads of a process.
pub(crate) struct RunLog {
    run_id: String,
    /// `run_id` as JSON, for the pre-encoded events.
    run_id_json: Vec<u8>,
    dir: PathBuf,
    /// Where checkpoints are, to start the rules from one.
    ck_dir: Option<PathBuf>,
    storage: Arc<dyn Storage>,
    meta: RunMeta,
    batch_interval_ms: u64,
    /// Zero fill kept ahead of the active segment's last frame (`LogOptions`).
    prealloc_bytes: u64,
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
    /// `SYNC_LOCK`: one data fsync of this run at a time across processes.
    sync_lock: Box<dyn StorageFile>,
    sync_lock_path: PathBuf,
    /// Counters of the durable path (for benchmarks and metrics).
    stats: SyncStats,
    poisoned: AtomicBool,
    /// A background prune of this process is running.
    prune_running: AtomicBool,
    /// The rules wanted a prune as of this process's last written group: what
    /// [`RunLog::claim_prune`] reads while another thread holds the writer (so that an
    /// acknowledged append never waits for the next group's write just to ask).
    prune_wanted: AtomicBool,
    /// The background checkpoint job of this run in this process: (running, another
    /// crossing came while it ran). At most one runs; crossings meanwhile coalesce.
    checkpoint_job: Mutex<(bool, bool)>,
    /// Position of the last `batch`-mode write not yet covered by a flush (seg, off).
    batch_dirty: Mutex<Option<FrameEnd>>,
    flusher_started: AtomicBool,
    /// `swarm:<nonce>.`: generated ids are this and a counter in hex.
    id_prefix: String,
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
        Error::Forbidden(m) => Error::Forbidden(m.clone()),
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

impl Drop for RunLog {
    fn drop(&mut self) {
        self.flush_batch();
        let c = self.counters();
        if c.fsyncs + c.durable_events > 0 {
            tracing::debug!(run = %self.run_id, fsyncs = c.fsyncs, coalesced = c.coalesced, durable_events = c.durable_events, "group commit");
        }
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

#[cfg(test)]
mod tests;
