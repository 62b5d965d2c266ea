//! [`Store`]: the public handle over a data directory of runs: opens runs and their
//! writers, caches head states and indexes, checks the caller's user and the run's
//! permissions, and starts the background jobs (checkpoints, pruning).
//!
//! - `store/append.rs`: the append path: checks, the archive gate, retries, the hand-off
//!   route, and what follows an append (checkpoints, pruning).
//! - `store/archive.rs`: closing a run, its archive, restore, and reads from an archive.
//! - `store/handoff.rs`: one committer process per run, that others hand appends to.
//! - `store/travel.rs`: time-travel views (`replay --diff`, `--agent`).
//!
//! Invariant: every user's runs live under `<data>/<user>/`; a store acts for one user
//! and never opens another user's directory (the shared scope is reached only through
//! the synthesizer).
//! Never imports: `scratchpad`, `tail`, `synth` (they are built on it).

mod append;
pub mod archive;
pub(crate) mod cache;
mod handoff;
pub mod info;
pub mod travel;

pub use cache::OPEN_RUNS_MAX_DEFAULT;
pub use handoff::HandoffCounters;
pub use info::RunInfo;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::commit::{RunLog, SyncCounters};
use crate::error::{Error, IoContext, Result};
use crate::event::{check_path_id, check_run_id, Event, EventType, LogDamaged, ANONYMOUS};
use crate::fold::checkpoint::{self, CheckpointInfo, CHECKPOINT_EVERY_DEFAULT};
use crate::fold::replay::{self, ReplayStats, Replayed, RunPaths, Target};
use crate::fold::state::State;
use crate::log::meta::{self, LogOptions, RunMeta};
use crate::log::segment;
use crate::log::storage::{file_len, FsStorage, Storage};
use crate::log::watermark::read_marks;
use crate::log::watermark::Marks;
use crate::query::index::{self, IndexCell, IndexSnapshot, IndexStats};
use crate::query::options::{ReadOptions, Visibility};
use crate::query::read::EventIter;
use crate::query::verify::{self, VerifyReport};
use cache::Bounded;

/// A data directory holding one sub-directory per run.
///
/// A `Store` is cheap to share between threads (`&Store` is enough): appends from many
/// threads to one run are combined into shared writes and fsyncs. Any number of
/// processes may open the same directory at once.
pub struct Store {
    root: PathBuf,
    storage: Arc<dyn Storage>,
    opts: LogOptions,
    /// Shared with the store a committer serves other processes through
    /// (`store::handoff`), so that their appends join this process's group commit.
    logs: Arc<Mutex<Writers>>,
    /// Where `sync` appends go: to this process's writer, or handed to another process.
    handoff: handoff::Routes,
    ck_root: PathBuf,
    checkpoint_every: u64,
    user: String,
    archive_root: PathBuf,
    /// The last head state of each run, at a frame boundary (see [`Store::head_state`]).
    heads: Mutex<Bounded<(Arc<State>, CheckpointInfo)>>,
    /// Each run's index as this process has caught it up (see [`crate::query::index`]).
    indexes: Mutex<Bounded<Arc<IndexCell>>>,
    /// Runs whose writer, index, head state and hand-off route each cache keeps at once
    /// ([`Store::with_open_runs_max`]).
    open_runs_max: usize,
    /// The policies of closed runs read so far: final (a closed run refuses every
    /// append), and reading an archived run unpacks it whole (see [`Store::policy`]).
    closed_policies: Mutex<Bounded<Option<crate::fold::rules::Policy>>>,
}

/// The writers of a store's runs, and the counters of those it let go.
pub(crate) struct Writers {
    runs: Bounded<Arc<RunLog>>,
    /// [`SyncCounters`] of the writers dropped from `runs`, so totals only grow.
    retired: SyncCounters,
}

impl Writers {
    fn new(max: usize) -> Writers {
        Writers {
            runs: Bounded::new(max),
            retired: SyncCounters::default(),
        }
    }
}

impl Drop for Store {
    /// Stops committing for other processes: their appends in flight are answered first.
    fn drop(&mut self) {
        self.handoff.shutdown();
    }
}

/// A run's state at its visible head, shared with the store's cache.
#[derive(Clone, Debug)]
pub struct HeadState {
    /// The state.
    pub state: Arc<State>,
    /// How it was brought up to date.
    pub stats: ReplayStats,
    /// The frame boundary it stands at.
    pub boundary: Option<CheckpointInfo>,
}

/// The automatic checkpoints this process has started ([`Store::append`] crossing a
/// multiple of the checkpoint interval), until [`finish_checkpoints`] waits for them.
static CHECKPOINT_JOBS: Mutex<Vec<std::thread::JoinHandle<()>>> = Mutex::new(Vec::new());

/// Waits, at most `max`, for the automatic checkpoints this process started: a
/// short-lived process (one `swarm append`) calls it before it exits, or the checkpoint
/// its append started dies with it, and a run fed by such processes never gets one. One
/// still running at `max` is left (a later append or read writes one).
pub fn finish_checkpoints(max: std::time::Duration) {
    let jobs = std::mem::take(&mut *CHECKPOINT_JOBS.lock().unwrap_or_else(|e| e.into_inner()));
    let deadline = std::time::Instant::now() + max;
    for h in jobs {
        while !h.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if h.is_finished() {
            let _ = h.join();
        } else {
            tracing::warn!("an automatic checkpoint still running at exit was left unfinished");
        }
    }
}

impl Store {
    /// Opens a data directory on the real file system (created on first append).
    pub fn open(root: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(Arc::new(FsStorage), root.as_ref(), LogOptions::default())
    }

    /// Opens a data directory on any storage, with options.
    pub fn open_with(storage: Arc<dyn Storage>, root: &Path, opts: LogOptions) -> Result<Store> {
        let local = storage.is_local_fs();
        Ok(Store {
            root: root.to_path_buf(),
            storage,
            opts,
            logs: Arc::new(Mutex::new(Writers::new(OPEN_RUNS_MAX_DEFAULT))),
            handoff: handoff::Routes::new(local, OPEN_RUNS_MAX_DEFAULT),
            ck_root: root.join(".checkpoints"),
            checkpoint_every: CHECKPOINT_EVERY_DEFAULT,
            user: ANONYMOUS.to_string(),
            archive_root: root.join(".archive"),
            heads: Mutex::new(Bounded::new(OPEN_RUNS_MAX_DEFAULT)),
            closed_policies: Mutex::new(Bounded::new(OPEN_RUNS_MAX_DEFAULT)),
            indexes: Mutex::new(Bounded::new(OPEN_RUNS_MAX_DEFAULT)),
            open_runs_max: OPEN_RUNS_MAX_DEFAULT,
        })
    }

    /// The same store, acting for `user`: every run belongs to one user (the partition
    /// key, a directory level: `<data>/<user>/<run>`), and a `Store` only ever sees the
    /// runs of its user. Another user's runs are not found, on every path.
    /// `allow_anonymous = false` refuses the `anonymous` user (exit 5).
    pub fn with_user(mut self, user: &str, allow_anonymous: bool) -> Result<Store> {
        check_path_id("user_id", user)?;
        if user == ANONYMOUS && !allow_anonymous {
            return Err(Error::Forbidden(
                "anonymous access is disabled; give a user".to_string(),
            ));
        }
        if user == crate::event::SHARED_USER {
            return Err(Error::Forbidden(format!(
                "{user:?} is the shared patterns scope; only the synthesizer writes it"
            )));
        }
        self.user = user.to_string();
        self.handoff.shutdown();
        // Every cache is keyed by run name alone: none may carry over from the user this
        // store acted for before (another user's run of the same name).
        self.logs = Arc::new(Mutex::new(Writers::new(self.open_runs_max)));
        self.heads = Mutex::new(Bounded::new(self.open_runs_max));
        self.closed_policies = Mutex::new(Bounded::new(self.open_runs_max));
        self.indexes = Mutex::new(Bounded::new(self.open_runs_max));
        Ok(self)
    }

    /// At most `n` runs (default [`OPEN_RUNS_MAX_DEFAULT`]) whose writer, index, head
    /// state and hand-off route this store keeps at once: past it, the least recently
    /// used ones that no call is using are let go (their files closed, their memory
    /// freed) and rebuilt from the files when the run is met again. Each writer holds
    /// four descriptors and each index one per segment, so a server that meets many runs
    /// needs this bound under its open-file limit.
    pub fn with_open_runs_max(mut self, n: usize) -> Store {
        let n = n.max(1);
        self.open_runs_max = n;
        self.logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .runs
            .set_max(n);
        self.heads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set_max(n);
        self.indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set_max(n);
        self.closed_policies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set_max(n);
        self.handoff.set_max(n);
        self
    }

    /// Keeps closed runs' archives under `dir` (`<dir>/<user>/<run>.swarc`); without this
    /// call they go to `<data dir>/.archive`.
    pub fn with_archive_dir(mut self, dir: impl Into<PathBuf>) -> Store {
        self.archive_root = dir.into();
        self
    }

    /// Where archives go.
    pub fn archive_root(&self) -> &Path {
        &self.archive_root
    }

    /// The user this store acts for.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Keeps checkpoints under `dir` (one sub-directory per run) and writes one
    /// automatically every `every` events (0: never automatically). Without this call
    /// they live in `<data dir>/.checkpoints`, every 10,000 events.
    pub fn with_checkpoints(mut self, dir: impl Into<PathBuf>, every: u64) -> Store {
        self.ck_root = dir.into();
        self.checkpoint_every = every;
        self
    }

    fn paths(&self, run: &str) -> Result<RunPaths> {
        Ok(RunPaths {
            storage: self.storage.clone(),
            run_dir: self.existing_run(run)?,
            ck_dir: self.checkpoint_dir(run),
            run_id: run.to_string(),
        })
    }

    /// The run's state at `target`, from the nearest valid checkpoint and the events after
    /// it. A replay to the head that applied at least the checkpoint interval of events
    /// leaves a new checkpoint behind.
    pub fn state_at(
        &self,
        run: &str,
        target: Target,
        progress: impl FnMut(u64),
    ) -> Result<Replayed> {
        if let Some(a) = self.archived_store(run)? {
            return a.state_at(run, target, progress);
        }
        let p = self.paths(run)?;
        self.marks(run, &p.run_dir)?;
        let r = replay::state_at(&p, target, progress)?;
        if target == Target::Head
            && self.checkpoint_every > 0
            && r.stats.events_applied >= self.checkpoint_every
        {
            if let Some(info) = &r.boundary {
                if let Err(e) = checkpoint::write(&self.storage, &p.ck_dir, &r.state, info) {
                    tracing::warn!(run, error = %e, "cannot write a checkpoint");
                }
            }
        }
        Ok(r)
    }

    /// The run's state at its visible head, shared. A long-lived `Store` keeps the last
    /// head state of each run and only applies what was appended since (after checking
    /// that the log still holds the frame it stopped at); a new one starts from the newest
    /// checkpoint. Board, context, pick and the permission checks of reads use it.
    pub fn head_state(&self, run: &str) -> Result<HeadState> {
        if let Some(a) = self.archived_store(run)? {
            return a.head_state(run);
        }
        let p = self.paths(run)?;
        self.marks(run, &p.run_dir)?;
        let cached = self
            .heads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run);
        let r = match cached {
            Some(c) if checkpoint::matches_log(&*self.storage, &p.run_dir, &c.1)? => {
                let visible = read_marks(&*self.storage, &p.run_dir)?.visible;
                if c.1.end() == visible {
                    return Ok(HeadState {
                        state: c.0.clone(),
                        stats: ReplayStats::default(),
                        boundary: Some(c.1),
                    });
                }
                let damaged = |s: &State| {
                    s.counts
                        .by_type
                        .get(&crate::event::EventType::LogDamaged)
                        .copied()
                        .unwrap_or(0)
                };
                let r = replay::advance(&p, (*c.0).clone(), c.1)?;
                if damaged(&r.state) == damaged(&c.0) {
                    r
                } else {
                    // A repair (in another process: `swarm repair` beside a server)
                    // declared seqs lost that the cached state had folded in: the state
                    // is folded again without them.
                    self.heads
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(run);
                    replay::state_at(&p, Target::Head, |_| {})?
                }
            }
            _ => {
                let r = replay::state_at(&p, Target::Head, |_| {})?;
                if self.checkpoint_every > 0 && r.stats.events_applied >= self.checkpoint_every {
                    if let Some(info) = &r.boundary {
                        if let Err(e) = checkpoint::write(&self.storage, &p.ck_dir, &r.state, info)
                        {
                            tracing::warn!(run, error = %e, "cannot write a checkpoint");
                        }
                    }
                }
                r
            }
        };
        let state = Arc::new(r.state);
        if let Some(b) = r.boundary {
            let gone = self.heads.lock().unwrap_or_else(|e| e.into_inner()).insert(
                run,
                (state.clone(), b),
                |_| true,
            );
            drop(gone);
        }
        Ok(HeadState {
            state,
            stats: r.stats,
            boundary: r.boundary,
        })
    }

    /// Writes a checkpoint of the run's head (unless the newest one is already there).
    pub fn checkpoint(
        &self,
        run: &str,
        progress: impl FnMut(u64),
    ) -> Result<Option<CheckpointInfo>> {
        let p = self.paths(run)?;
        write_checkpoint(&p, progress)
    }

    /// Seqs of the run's checkpoints, newest first.
    pub fn checkpoints(&self, run: &str) -> Result<Vec<u64>> {
        let p = self.paths(run)?;
        checkpoint::list(&*self.storage, &p.ck_dir)
    }

    /// The checkpoint directory of a run.
    pub fn checkpoint_dir(&self, run: &str) -> PathBuf {
        self.ck_root.join(&self.user).join(run)
    }

    fn maybe_checkpoint(&self, log: &Arc<RunLog>, run: &str, stored: &[Event]) {
        let every = self.checkpoint_every;
        let (Some(first), Some(last)) = (stored.first(), stored.last()) else {
            return;
        };
        if every == 0 || (first.seq - 1) / every == last.seq / every {
            return;
        }
        // The engine's own logs (`@facts`, `@patterns`) are folded by their own readers;
        // a scratchpad-state checkpoint of them would only cost a replay.
        if run.starts_with('@') {
            return;
        }
        let Ok(p) = self.paths(run) else { return };
        // At most one checkpoint job per run and process: crossings while it runs make
        // it write once more at the then head, instead of a thread each.
        if !log.claim_checkpoint() {
            return;
        }
        let job = log.clone();
        // Off the append path: the appender has its acknowledgement already.
        let spawned = std::thread::Builder::new()
            .name("swarm-checkpoint".into())
            .spawn(move || loop {
                if let Err(e) = write_checkpoint(&p, |_| {}) {
                    tracing::warn!(run = %p.run_id, error = %e, "automatic checkpoint failed");
                }
                if !job.checkpoint_again() {
                    break;
                }
            });
        match spawned {
            Ok(handle) => {
                let mut jobs = CHECKPOINT_JOBS.lock().unwrap_or_else(|e| e.into_inner());
                jobs.retain(|h| !h.is_finished());
                jobs.push(handle);
            }
            Err(e) => {
                // Nothing runs: release the claim (a crossing meanwhile is dropped with it).
                while log.checkpoint_again() {}
                tracing::warn!(run, error = %e, "cannot start the checkpoint thread");
            }
        }
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `p` as a message that may reach a remote client shows it: relative to the data,
    /// checkpoint or archive directory it lies under (`alice/r/SYNCED`), else its file
    /// name; never the server's absolute path.
    pub(crate) fn shown_path(&self, p: &Path) -> String {
        [&self.root, &self.ck_root, &self.archive_root]
            .iter()
            .find_map(|r| p.strip_prefix(r).ok())
            .or_else(|| p.file_name().map(Path::new))
            .unwrap_or(p)
            .display()
            .to_string()
    }

    /// The storage backend.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The directory of a run of this store's user.
    pub fn run_dir(&self, run: &str) -> Result<PathBuf> {
        check_run_id(run)?;
        Ok(self.root.join(&self.user).join(run))
    }

    /// This process's counters of a run's durable path (fsyncs made, fsyncs another
    /// process's flush saved, durable events acknowledged) since this store last opened
    /// the run's writer (a writer let go past [`Store::with_open_runs_max`] takes its
    /// counts into [`Store::sync_totals`] only); zeros when it has none open.
    /// `durable_events / fsyncs` is the group commit's events per fsync.
    pub fn sync_counters(&self, run: &str) -> SyncCounters {
        let logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        logs.runs
            .peek(run)
            .map(|l| l.counters())
            .unwrap_or_default()
    }

    /// [`Store::sync_counters`] summed over every run this store has appended to (the
    /// server's `/metrics`). Each count only grows: the counts of a writer the store
    /// let go ([`Store::with_open_runs_max`]) stay in the totals.
    pub fn sync_totals(&self) -> SyncCounters {
        let logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        logs.runs
            .values()
            .map(|l| l.counters())
            .fold(logs.retired, |a, c| a + c)
    }

    pub(crate) fn writer(&self, run: &str, user: &str) -> Result<Arc<RunLog>> {
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = logs.runs.get(run) {
            return Ok(l);
        }
        let dir = self.run_dir(run)?;
        let ck = Some(self.checkpoint_dir(run));
        let l = Arc::new(RunLog::open(
            self.storage.clone(),
            dir,
            ck,
            run,
            user,
            &self.opts,
        )?);
        // A writer nobody holds (no append, prune or checkpoint job in flight) may go; a
        // poisoned one stays, so that its run keeps refusing this process's appends; so
        // does one with `batch` data not yet flushed (its flusher soon makes it idle):
        // dropped, it would fsync, and a failure there would poison a writer nobody
        // keeps, the next one acknowledging appends after the failed fsync.
        let gone = logs.runs.insert(run, l.clone(), |w| {
            Arc::strong_count(w) == 1 && !w.is_poisoned() && !w.batch_pending()
        });
        for w in &gone {
            logs.retired = logs.retired + w.counters();
        }
        drop(logs);
        // Closed outside the lock.
        drop(gone);
        Ok(l)
    }

    /// Waits, at most `limit`, for this process's background prunes to end; returns
    /// whether they did. A process that exits while its pruner is between the summary's
    /// write and its fsync leaves the summary past the visible mark until the next append
    /// (harmless, but surprising): a command-line writer calls this before it exits.
    pub fn wait_background(&self, limit: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + limit;
        let logs: Vec<Arc<RunLog>> = {
            let logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
            logs.runs.values().cloned().collect()
        };
        for l in logs {
            while l.prune_running() {
                if std::time::Instant::now() >= until {
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        true
    }

    /// A new handle with this one's storage, directories, options and user.
    pub(crate) fn same_config(&self) -> Store {
        self.same_config_as(&self.user)
    }

    /// A new handle with this one's storage, directories and options, acting for `user`
    /// (internal: the synthesizer writes the shared patterns scope through it).
    pub(crate) fn same_config_as(&self, user: &str) -> Store {
        Store {
            root: self.root.clone(),
            storage: self.storage.clone(),
            opts: self.opts.clone(),
            logs: Arc::new(Mutex::new(Writers::new(self.open_runs_max))),
            handoff: handoff::Routes::off(),
            ck_root: self.ck_root.clone(),
            checkpoint_every: self.checkpoint_every,
            user: user.to_string(),
            archive_root: self.archive_root.clone(),
            heads: Mutex::new(Bounded::new(self.open_runs_max)),
            closed_policies: Mutex::new(Bounded::new(self.open_runs_max)),
            indexes: Mutex::new(Bounded::new(self.open_runs_max)),
            open_runs_max: self.open_runs_max,
        }
    }

    /// Reads a run's events in seq order.
    ///
    /// A read with a key filter (agent, type, subject, user), `last`, `from_seq` or `since`
    /// goes through the run's index (caught up first, see [`crate::query::index`]) and fetches
    /// only the frames that can match; every frame read is still checked, and an index
    /// that disagrees with the log is dropped and the read goes on by scanning.
    pub fn read(&self, run: &str, opts: ReadOptions) -> Result<EventIter> {
        engine_log_hidden(run, opts.reader.as_deref())?;
        let dir = self.existing_run(run)?;
        if let Some(a) = self.archived_store(run)? {
            return a.read(run, opts);
        }
        let mut opts = opts;
        let rules = match opts.reader {
            Some(_) => {
                let head = self.head_state(run)?;
                // The rules hold up to the state's head: a read past it could meet a
                // `policy` event after which they no longer apply (a secret written
                // right after a tightened policy would come back unfiltered). So a
                // reader's read ends there; what came since is for its next read.
                let at = head.state.head_seq;
                opts.to_seq = Some(opts.to_seq.map_or(at, |t| t.min(at)));
                #[cfg(test)]
                if let Some(f) = tests::take_after_rules(&dir) {
                    f();
                }
                Some(head.state.rules.clone())
            }
            None => None,
        };
        let opts_reader = opts.reader.clone();
        let (mut marks, snap) = match index::useful_for(&opts) {
            true => self.index_snapshot(run, &dir)?,
            false => (self.marks(run, &dir)?, None),
        };
        if let Some((covered, _, _)) = snap.as_ref().and_then(|s| s.covered()) {
            if covered > marks.visible {
                // Loaded from a file written by a process that saw a later watermark.
                marks = read_marks(&*self.storage, &dir)?;
            }
        }
        let snap = snap.filter(|s| s.covered().is_none_or(|(c, _, _)| c <= marks.visible));
        let limit = match opts.visibility {
            Visibility::Visible => Some(marks.visible),
            Visibility::Written => None,
        };
        let it = EventIter::with_index(
            self.storage.clone(),
            dir,
            run,
            opts,
            limit,
            marks.durable,
            snap,
        )?;
        Ok(match (rules, opts_reader) {
            // An agent shown everything reads unfiltered: `last` keeps its index plan.
            (Some(r), Some(agent)) if !r.sees_everything(&agent) => {
                it.with_permission(Box::new(move |e: &Event| r.may_read_event(&agent, e)))
            }
            _ => it,
        })
    }

    fn index_cell(&self, run: &str) -> Arc<IndexCell> {
        let mut m = self.indexes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = m.get(run) {
            return c;
        }
        let c = Arc::new(IndexCell::new(run));
        // An index a read holds stays; the others close their segment files.
        let gone = m.insert(run, c.clone(), |c| Arc::strong_count(c) == 1);
        drop(m);
        drop(gone);
        c
    }

    /// The watermark and the run's index caught up to it; no index when it cannot serve
    /// this read (then the read scans: the index is an accelerator, never a requirement).
    fn index_snapshot(&self, run: &str, dir: &Path) -> Result<(Marks, Option<IndexSnapshot>)> {
        self.marks(run, dir)?;
        match self.index_cell(run).snapshot(&self.storage, dir) {
            Ok((marks, snap)) => Ok((marks, Some(snap))),
            Err(e) => {
                tracing::warn!(run, error = %e, "index unavailable; scanning the log");
                Ok((read_marks(&*self.storage, dir)?, None))
            }
        }
    }

    /// Catches up a run's index (loading, checking and extending it, writing it when the
    /// policy of [`crate::query::index`] says so) and reports on it.
    pub fn index_stats(&self, run: &str) -> Result<IndexStats> {
        self.index_op(run, false, false, &mut |_, _| {})
    }

    /// Catches up a run's index and writes every part of it not on disk yet (waiting for
    /// the index lock), e.g. before a process exits.
    pub fn flush_index(&self, run: &str) -> Result<IndexStats> {
        self.index_op(run, true, false, &mut |_, _| {})
    }

    /// Forgets a run's index, in memory and on disk, builds it again from the log up to
    /// the visible position and writes it. `progress` gets (bytes indexed, bytes total).
    pub fn rebuild_index(
        &self,
        run: &str,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<IndexStats> {
        self.index_op(run, true, true, &mut progress)
    }

    fn index_op(
        &self,
        run: &str,
        flush: bool,
        rebuild: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<IndexStats> {
        let dir = self.existing_run(run)?;
        // A closed run's index is part of its archive: built over the archive's log,
        // the figures say what it holds.
        if let Some(a) = self.archived_store(run)? {
            return a.index_op(run, flush, rebuild, progress);
        }
        let marks = self.marks(run, &dir)?;
        let mut total = 0;
        for b in segment::list_segments(&*self.storage, &dir)? {
            if b < marks.visible.seg {
                let p = segment::segment_path(&dir, b);
                total += file_len(&*self.storage, &p)?;
            } else if b == marks.visible.seg {
                total += marks.visible.off;
            }
        }
        let mut done = 0;
        let mut report = |n: u64| {
            done += n;
            progress(done, total);
        };
        self.index_cell(run).stats(
            &self.storage,
            &dir,
            marks.visible,
            flush,
            rebuild,
            &mut report,
        )
    }

    /// Checks every record of a run; `progress` is called with the records checked so far.
    pub fn verify(&self, run: &str, progress: impl FnMut(u64)) -> Result<VerifyReport> {
        let dir = self.existing_run(run)?;
        if let Some(a) = self.archived_store(run)? {
            return a.verify(run, progress);
        }
        // Lost marks are rebuilt (and said so) before the check, so verify never reports a
        // run as empty because its `SYNCED` is gone.
        let synced = dir.join(meta::SYNCED_FILE);
        let before = self
            .storage
            .exists(&synced)
            .then(|| read_marks(&*self.storage, &dir));
        self.marks(run, &dir)?;
        let mut report = verify::verify(self.storage.clone(), dir, run, progress)?;
        match before {
            None => report.rebuilt.push(format!(
                "{}: missing; rebuilt from the log's frames",
                self.shown_path(&synced)
            )),
            Some(Err(_)) => report.rebuilt.push(format!(
                "{}: unreadable; rebuilt from the log's frames",
                self.shown_path(&synced)
            )),
            Some(Ok(_)) => {}
        }
        // Derived files: reported when damaged, never trusted, rebuilt as needed.
        let ck_dir = self.checkpoint_dir(run);
        let run_dir = self.run_dir(run)?;
        for seq in checkpoint::list(&*self.storage, &ck_dir)? {
            let p = ck_dir.join(checkpoint::checkpoint_name(seq));
            match checkpoint::load(&*self.storage, &p) {
                Err(e) => report.rebuilt.push(format!(
                    "{}: damaged ({e}); ignored, the next checkpoint replaces it",
                    self.shown_path(&p)
                )),
                Ok((_, info)) if !checkpoint::matches_log(&*self.storage, &run_dir, &info)? => {
                    report.rebuilt.push(format!(
                        "{}: does not match the log; ignored",
                        self.shown_path(&p)
                    ))
                }
                Ok(_) => {}
            }
        }
        if let Ok(stats) = self.index_stats(run) {
            for d in stats.discarded {
                report
                    .rebuilt
                    .push(format!("index: {d}; rebuilt from the log"));
            }
        }
        if let Err(e) = meta::read_meta(&*self.storage, &self.run_dir(run)?) {
            report.ok = false;
            report
                .rebuilt
                .push(format!("{e}; `swarm repair --run {run}` rebuilds it"));
        }
        Ok(report)
    }

    fn existing_run(&self, run: &str) -> Result<PathBuf> {
        let dir = self.run_dir(run)?;
        let meta_path = dir.join(meta::META_FILE);
        if !self.storage.exists(&meta_path) {
            // A run whose `run.json` is gone but whose log is there is damaged, not absent:
            // saying "not found" would hide every record it holds. An empty first
            // segment alone is a run being created (the segment comes before `run.json`),
            // or a creation cut short: no record either way, so the run is not there yet.
            if segment::log_holds_records(&*self.storage, &dir)? {
                return Err(Error::corrupt(
                    &meta_path,
                    0,
                    0,
                    format!("missing, but the run's log is there; `swarm repair --run {run}` rebuilds it"),
                ));
            }
            return Err(Error::RunNotFound(run.to_string()));
        }
        Ok(dir)
    }

    /// Rebuilds a lost `run.json` from the log (the run id, this store's user, the first
    /// event's time; the segment size from the largest sealed segment, or the default).
    fn rebuild_meta(&self, run: &str) -> Result<()> {
        let dir = self.run_dir(run)?;
        let bases = segment::list_segments(&*self.storage, &dir)?;
        let mut segment_bytes = self.opts.segment_bytes;
        for &b in &bases[..bases.len().saturating_sub(1)] {
            segment_bytes =
                segment_bytes.max(file_len(&*self.storage, &segment::segment_path(&dir, b))?);
        }
        let first = segment::segment_path(&dir, bases.first().copied().unwrap_or(1));
        let created = crate::log::segment::FrameReader::open(&*self.storage, &first, 0, None)
            .ok()
            .and_then(|mut r| match r.step() {
                Ok(crate::log::segment::Step::Frame { .. }) => {
                    serde_json::from_slice::<Vec<Event>>(r.payload())
                        .ok()?
                        .first()
                        .map(|e| e.ts)
                }
                _ => None,
            })
            .unwrap_or_else(crate::event::ts::Ts::now);
        let m = RunMeta {
            format: crate::log::frame::FORMAT_VERSION,
            run_id: run.to_string(),
            user_id: self.user.clone(),
            created,
            segment_bytes,
        };
        let bytes =
            serde_json::to_vec_pretty(&m).map_err(|e| Error::invalid("run.json", e.to_string()))?;
        let tmp = dir.join("run.json.tmp");
        let f = self
            .storage
            .open(&tmp, crate::log::storage::OpenMode::ReadWriteCreate)
            .ctx("create", &tmp)?;
        f.set_len(0).ctx("truncate", &tmp)?;
        f.write_all_at(&bytes, 0).ctx("write", &tmp)?;
        f.sync_data().ctx("fsync", &tmp)?;
        self.storage
            .rename(&tmp, &dir.join(meta::META_FILE))
            .ctx("rename", &tmp)?;
        self.storage.sync_dir(&dir).ctx("fsync dir", &dir)?;
        tracing::warn!(run, "run.json was missing; rebuilt from the log");
        Ok(())
    }

    /// A run's marks, rebuilt first when they are lost: `SYNCED` missing or emptied while
    /// the log holds frames, or unreadable. Nothing hides silently: without this, a lost
    /// `SYNCED` would make every record of the run invisible. The rebuild takes the
    /// writer lock (it must fsync what it makes visible) and says so on stderr.
    pub(crate) fn marks(&self, run: &str, dir: &Path) -> Result<Marks> {
        let synced = dir.join(meta::SYNCED_FILE);
        let lost = match read_marks(&*self.storage, dir) {
            Ok(m) if m != Marks::default() => return Ok(m),
            // Empty or missing: a run with nothing appended yet, or lost marks.
            Ok(m) => {
                let missing = !self.storage.exists(&synced);
                let first = segment::segment_path(dir, 1);
                let bytes = match self.storage.exists(&first) {
                    true => file_len(&*self.storage, &first)?,
                    false => 0,
                };
                let later = segment::list_segments(&*self.storage, dir)?.len() > 1;
                if bytes == 0 && !later {
                    return Ok(m);
                }
                // An empty file is also what a run's first append leaves until its fsync
                // publishes the marks: rebuilding then is harmless (it syncs and publishes
                // the same thing), so only a missing file is worth a warning.
                if missing {
                    "missing"
                } else {
                    "empty"
                }
            }
            Err(Error::Corrupt { .. }) => "unreadable",
            Err(e) => return Err(e),
        };
        let log = self.writer(run, &self.user)?;
        let n = log.rebuild_marks()?;
        match lost {
            "empty" => tracing::debug!(run, events = n, "empty SYNCED marks rebuilt"),
            _ => tracing::warn!(
                run,
                events = n,
                "the run's SYNCED marks were {lost}; rebuilt from the log's CRC-valid frames"
            ),
        }
        read_marks(&*self.storage, dir)
    }

    /// [`Store::repair_all`]'s first `log_damaged` event (the tail's, if it was cut), or
    /// `None` when the run needed no repair.
    pub fn repair(&self, run: &str) -> Result<Option<Event>> {
        Ok(self.repair_all(run)?.into_iter().next())
    }

    /// Repairs a run whose acknowledged bytes are damaged (`swarm repair`). Damage at the
    /// end of the log is cut: the damaged bytes are moved aside, a `log_damaged` event
    /// records the lost seqs, and appends go on after the highest seq readers may have
    /// seen. Damage that valid records follow is quarantined (`log::quarantine`): its
    /// bytes copied aside, the range listed so that every read steps over it, and one
    /// `log_damaged` event per range names its lost seqs; nothing valid is dropped.
    /// Returns the `log_damaged` events (none: nothing needed repair).
    pub fn repair_all(&self, run: &str) -> Result<Vec<Event>> {
        let meta_lost = match self.existing_run(run) {
            Err(Error::Corrupt { path, .. }) => path.ends_with(meta::META_FILE),
            Ok(dir) => meta::read_meta(&*self.storage, &dir).is_err(),
            Err(_) => false,
        };
        if meta_lost {
            self.rebuild_meta(run)?;
        }
        self.existing_run(run)?;
        if self.archived_store(run)?.is_some() {
            return Err(Error::Forbidden(format!(
                "run {run:?} is closed and archived; restore it first"
            )));
        }
        let middle = crate::query::verify::middle_damage(
            self.storage.clone(),
            self.existing_run(run)?,
            run,
        )?;
        // Checkpoints that folded events now lost go first: the writer's reload in
        // `repair` starts its rules from the newest checkpoint left.
        if let Some(from) = middle.iter().map(|r| r.lost_from).min() {
            self.drop_derived(run, from)?;
        }
        // The log's declared losses matter only where ranges are (or were) listed: no
        // read of the whole log for a repair of the tail alone.
        let listed = crate::log::quarantine::read(&*self.storage, &self.existing_run(run)?).ranges;
        let declared = match middle.is_empty() && listed.is_empty() {
            true => Vec::new(),
            false => self.declared_losses(run)?,
        };
        let undeclared = undeclared_quarantine(listed, &declared);
        let log = self.writer(run, &self.user)?;
        let repaired = log.repair(&middle, &undeclared, &declared)?;
        let lost_from = repaired
            .iter()
            .map(|ev| LogDamaged::declared(ev.kind, &ev.content).map_or(ev.seq, |(a, _)| a))
            .min();
        if let Some(lost_from) = lost_from {
            self.drop_derived(run, lost_from)?;
        }
        // Damage followed by valid records is not cut (that would drop them): said,
        // never answered with "nothing to repair" (nor hidden behind a repaired tail).
        let report = self.verify(run, |_| {})?;
        if let Some(d) = report.corrupt.first() {
            let tail = match repaired.first() {
                Some(ev) => format!(" (log_damaged written at seq {})", ev.seq),
                None => String::new(),
            };
            return Err(Error::corrupt(
                &d.segment,
                d.offset,
                d.seq,
                format!(
                    "{}; left in place (bytes {}..{}): repair quarantines damage that valid records follow only where the seqs it lost are known (not right after other damage); `swarm read --skip-corrupt` reads every intact record, `swarm verify` lists the damage{tail}",
                    d.reason, d.offset, d.resumed_at
                ),
            ));
        }
        Ok(repaired)
    }

    /// The losses the run's `log_damaged` events declare (read over any damage): a
    /// repair declares a loss once, also when it lists its range again after a lost
    /// `QUARANTINE`.
    fn declared_losses(&self, run: &str) -> Result<Vec<LogDamaged>> {
        let opts = ReadOptions {
            kind: Some(EventType::LogDamaged),
            skip_corrupt: true,
            visibility: crate::query::options::Visibility::Written,
            ..ReadOptions::default()
        };
        let mut declared = Vec::new();
        for e in self.read(run, opts)? {
            if let Ok(d) = serde_json::from_value::<LogDamaged>(e?.content) {
                declared.push(d);
            }
        }
        Ok(declared)
    }

    /// Drops what was built on a run's events from `lost_from` on, now lost: the cached
    /// head state, the in-memory index, and the checkpoints at or past that seq (they
    /// folded events that are gone).
    fn drop_derived(&self, run: &str, lost_from: u64) -> Result<()> {
        self.heads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(run);
        if let Some(cell) = self
            .indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(run)
        {
            cell.invalidate("the run was repaired");
        }
        let ck_dir = self.checkpoint_dir(run);
        for seq in checkpoint::list(&*self.storage, &ck_dir)? {
            if seq >= lost_from {
                let p = ck_dir.join(checkpoint::checkpoint_name(seq));
                if let Err(e) = self.storage.remove_file(&p) {
                    tracing::warn!(checkpoint = %p.display(), error = %e, "cannot remove a checkpoint past the damage");
                }
            }
        }
        Ok(())
    }

    /// The run's settings.
    pub fn run_meta(&self, run: &str) -> Result<RunMeta> {
        let dir = self.existing_run(run)?;
        meta::read_meta(&*self.storage, &dir)
    }

    /// Ids of every run in the store, sorted.
    pub fn run_ids(&self) -> Result<Vec<String>> {
        let root = self.root.join(&self.user);
        if !self.storage.exists(&root) {
            return Ok(Vec::new());
        }
        let mut ids: Vec<String> = self
            .storage
            .list(&root)
            .map_err(|source| Error::Io {
                op: "list",
                path: root.clone(),
                source,
            })?
            .into_iter()
            .filter(|n| {
                check_run_id(n).is_ok() && self.storage.exists(&root.join(n).join(meta::META_FILE))
            })
            .collect();
        ids.sort();
        Ok(ids)
    }
}

fn write_checkpoint(p: &RunPaths, progress: impl FnMut(u64)) -> Result<Option<CheckpointInfo>> {
    let r = replay::state_at(p, Target::Head, progress)?;
    let Some(info) = r.boundary else {
        return Ok(None);
    };
    if r.stats.from_checkpoint == Some(info.seq) {
        return Ok(Some(info));
    }
    checkpoint::write(&p.storage, &p.ck_dir, &r.state, &info)?;
    Ok(Some(info))
}

/// The engine's own logs (`@facts`, `@patterns`) are drawn past every run's read policy:
/// a read made as an agent (`reader`) finds no such run, as it finds no run of another
/// user; only an unfiltered read (the user's own CLI, an admin token) sees them.
pub fn engine_log_hidden(run: &str, reader: Option<&str>) -> Result<()> {
    if reader.is_some() && run.starts_with('@') {
        return Err(Error::RunNotFound(run.to_string()));
    }
    Ok(())
}

/// The quarantined ranges (`listed`) that no `log_damaged` event names yet (a repair
/// that crashed between listing them and declaring them): the next repair declares
/// them, so every quarantined loss is recorded in the log itself.
fn undeclared_quarantine(
    listed: Vec<crate::log::quarantine::Range>,
    declared: &[LogDamaged],
) -> Vec<crate::log::quarantine::Range> {
    listed
        .into_iter()
        .filter(|r| {
            let seg = segment::segment_name(r.segment);
            !declared
                .iter()
                .any(|d| d.segment == seg && d.offset == r.offset)
        })
        .collect()
}

#[cfg(test)]
mod tests;
