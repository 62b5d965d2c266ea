//! The live tail: follow one run from a seq (or a saved cursor) through its history and
//! on into live delivery, with no gap and no duplicate at the switch.
//!
//! # Protocol
//! A [`Tail`] keeps one position in the log: a segment (its base seq), the byte offset
//! of the next unread frame in it, and the seq it expects next. Catching up and following
//! live are *the same loop*: read the visibility watermark (`SYNCED`, with `pread`, no
//! lock), read the whole frames between the position and the watermark, move the
//! position past them, and when nothing new is visible wait for a wake-up. There is no
//! hand-over from a history reader to a subscription, so there is no moment where an
//! event can fall between the two or be seen by both.
//!
//! * **No gap.** The position only moves past a frame after its events were queued for
//!   delivery (or filtered out), and every frame's first seq must be the last seq seen
//!   plus one; anything else is reported as corruption, never skipped.
//! * **No duplicate.** The position is a byte offset that only grows, and every event
//!   carries its seq: events below the expected seq (the part of a batch before a
//!   `from_seq`, or before a cursor) are dropped, so none is delivered twice.
//! * **Visibility.** Only frames that end at or before the `visible` mark are read
//!   ([`Visibility::Visible`], the default): in `sync` mode that is the durable mark, so
//!   nothing a power loss could take away is delivered. Bytes past the mark (a write in
//!   progress, or a torn write a later writer will cut off) are never looked at.
//! * **Half-written lines.** With [`Visibility::Written`] (or a watermark that points
//!   into a frame) the last bytes of the last segment may be a frame still being
//!   written: an incomplete frame, or damage with no whole frame after it, is "not yet
//!   complete" and waited on, never reported as corruption. Damage followed by a whole
//!   frame, or at the end of a closed segment, is corruption ([`Error::Corrupt`]).
//! * **Rotation.** A segment is closed once a later one holds a visible record (the
//!   writer syncs a segment before it starts the next one), so when the watermark is in a
//!   later segment the tail reads the rest of the current one and moves to the segment
//!   whose base is the next seq.
//! * **Wake-ups.** A `notify` (inotify) watch on the run's `SYNCED` file wakes the tail
//!   when the watermark moves (every visible append rewrites it), or a [`WakeSource`]
//!   shared by many tails ([`WatchHub`]: one watch per run); polling every
//!   [`TailOptions::poll_interval_ms`] is the safety net (inotify queues can overflow, and
//!   network file systems send nothing), and the only mechanism with
//!   [`TailOptions::notify`] off. The watch is armed, and the wake-up flag cleared, before
//!   the watermark is read, so a move after the read always causes another pass.
//!
//! **Invariant:** a tail never takes a lock a writer takes and never writes to the run:
//! it opens `SYNCED` and the segments read-only and reads them with `pread`, so any
//! number of tailers cannot slow appends (beyond the inotify event the kernel queues per
//! watch when `SYNCED` is rewritten).
//! Never imports: `scratchpad`, `synth`.
//!
//! Files: this one (the loop), [`cursor`] (cursor files), `stream` (the async face),
//! `wake` (inotify and polling wake-ups), `hub` (one watch per run, shared).
//!
//! # Cursors and the delivery guarantee
//! With a cursor file, [`Tail::commit`] saves the position of the last event handed out
//! (its seq and the position of its frame); a new tail with the same cursor file resumes
//! right after it. The caller chooses the guarantee by when it commits: committing
//! *after* handling each event (what `swarm tail` does: print, flush, then commit) gives
//! **at-least-once** delivery where a crash re-delivers at most the one event handled
//! but not yet committed; committing *before* handling gives at-most-once. Seqs only grow,
//! so a consumer that remembers the last seq it handled can drop the re-delivered one and
//! get exactly-once.
//!
//! The cursor is written to a temporary file and renamed over the old one, so a reader
//! sees the old or the new cursor, never a mix. It is not fsynced unless
//! [`TailOptions::cursor_fsync`] is set: an fsync per event would cost more than the
//! delivery itself, and a cursor that a power loss rolls back only causes re-deliveries,
//! which at-least-once allows. A cursor whose position does not hold its seq (the run was
//! rebuilt, the file was edited) is not trusted: the tail scans for the seq instead.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::event::{check_run_id, Event, EventType};
use crate::log::meta::{read_meta, META_FILE, SYNCED_FILE};
use crate::log::quarantine;
use crate::log::segment::{self, FrameReader, Step};
use crate::log::storage::{OpenMode, Storage, StorageFile};
use crate::log::watermark::{self, Marks, Pos};
use crate::query::options::Visibility;
use crate::query::read::check_frame;
use crate::store::archive::TOMBSTONE;
use crate::store::Store;

pub mod cursor;
mod hub;
mod stream;
pub(crate) mod wake;

pub use cursor::Cursor;
pub use hub::{HubStats, RunWatch, WatchHub};
pub use stream::TailStream;
pub use wake::WakeSource;
use wake::{Waiter, Wake};

/// Default interval of the polling safety net.
pub const POLL_INTERVAL_MS_DEFAULT: u64 = 50;

/// How long an idle tail (and the shared watch's sweep) keeps `SYNCED` open before
/// opening it again: a `SYNCED` deleted and rebuilt by a reader is a new file, which the
/// open one never shows.
pub(crate) const SYNCED_REOPEN: Duration = Duration::from_secs(1);
/// Format version written in cursor files.
pub const CURSOR_FORMAT: u32 = 1;
/// Largest cursor file accepted (a cursor is about 100 bytes).
pub const CURSOR_BYTES_MAX: u64 = 4096;
/// Events a [`TailStream`] buffers ahead of its consumer.
const STREAM_BUFFER_EVENTS: usize = 256;

/// What to follow and how.
#[derive(Clone, Debug)]
pub struct TailOptions {
    /// First seq to deliver (default 1). Ignored when a cursor file exists.
    pub from_seq: Option<u64>,
    /// Only this agent's events.
    pub agent: Option<String>,
    /// Only events of this type.
    pub kind: Option<EventType>,
    /// Keep waiting for new events (default). When false, the tail delivers what is
    /// visible when it is opened and then ends.
    pub follow: bool,
    /// Resume from, and [`Tail::commit`] to, this cursor file.
    pub cursor_file: Option<PathBuf>,
    /// fsync the cursor file (and its directory) at each commit. Off by default.
    pub cursor_fsync: bool,
    /// Interval of the polling safety net, in milliseconds (at least 1).
    pub poll_interval_ms: u64,
    /// Use inotify wake-ups (default). When false, the tail only polls.
    pub notify: bool,
    /// Deliver only visible (in `sync` mode: durable) records (default), or every whole
    /// record written.
    pub visibility: Visibility,
}

impl Default for TailOptions {
    fn default() -> Self {
        TailOptions {
            from_seq: None,
            agent: None,
            kind: None,
            follow: true,
            cursor_file: None,
            cursor_fsync: false,
            poll_interval_ms: POLL_INTERVAL_MS_DEFAULT,
            notify: true,
            visibility: Visibility::Visible,
        }
    }
}

/// Where a tail stands: the next frame to read and the next seq expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TailPosition {
    /// Start of the next unread frame.
    pub pos: Pos,
    /// The seq the tail delivers (or filters out) next.
    pub next_seq: u64,
}

/// The outcome of one wait for the next event.
// Short-lived: boxing the event would cost an allocation per event to save a 272-byte move.
#[allow(clippy::large_enum_variant)]
enum Next {
    Event(Event),
    /// The deadline passed (or the stream handle was dropped).
    Timeout,
    /// Not following, and everything visible at open was delivered.
    End,
}

/// Follows one run: a blocking iterator over its events, from a seq or a cursor, on into
/// live delivery. See the [module documentation](self) for the protocol and guarantees.
///
/// ```
/// use std::time::Duration;
/// use swarm_memory::{Durability, EventType, NewEvent, Store, Tail, TailOptions};
/// let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path()).unwrap();
/// store.append("inc-1", NewEvent::new("db", EventType::Evidence, "disk full"), Durability::Sync).unwrap();
/// let mut tail = Tail::open(&store, "inc-1", TailOptions::default()).unwrap();
/// let first = tail.next_timeout(Duration::from_secs(5)).unwrap().unwrap();
/// assert_eq!(first.seq, 1);
/// store.append("inc-1", NewEvent::new("net", EventType::Hypothesis, "dns"), Durability::Sync).unwrap();
/// assert_eq!(tail.next_timeout(Duration::from_secs(5)).unwrap().unwrap().seq, 2);
/// ```
pub struct Tail {
    storage: Arc<dyn Storage>,
    /// Where cursor files are read and saved (the log's storage may be an archive's).
    cursor_storage: Arc<dyn Storage>,
    /// A handle on the data directory, to find the run's archive if it is closed and
    /// archived while this tail follows it; `None` once reading from the archive.
    live_store: Option<Store>,
    dir: PathBuf,
    run: String,
    opts: TailOptions,
    poll: Duration,
    /// The position has been resolved to a segment (the run exists).
    located: bool,
    /// A cursor loaded at open, checked when the run is located.
    resume: Option<Cursor>,
    seg: u64,
    seg_file: Option<Arc<dyn StorageFile>>,
    /// Start of the next unread frame in `seg`.
    off: u64,
    /// The seq to deliver or filter out next.
    next_seq: u64,
    /// The last seq read from the log (delivered, filtered or skipped).
    head_seen: u64,
    last_ts: Ts,
    /// Events of the last frame read that are not consumed yet, and that frame's start.
    pending: VecDeque<Event>,
    pending_frame: Pos,
    synced: Option<Box<dyn StorageFile>>,
    /// When `synced` was opened: an idle tail opens it again after
    /// [`SYNCED_REOPEN`], so a `SYNCED` deleted and rebuilt (a new file) is followed.
    synced_opened: Instant,
    /// The watermark as of open, when not following.
    frozen: Option<Marks>,
    wake: Arc<Wake>,
    waiter: Waiter,
    last: Option<Cursor>,
    committed: Option<Cursor>,
    finished: bool,
    /// The run's creation time, saved in cursors.
    created: Option<Ts>,
}

impl Tail {
    /// Opens a tail of `run` in `store`.
    ///
    /// When following, the run need not exist yet: the tail waits for it (by polling).
    /// When not following, a missing run is [`Error::RunNotFound`]. With a cursor file
    /// that exists, the tail resumes after the cursor's event and `from_seq` is ignored;
    /// a cursor file of another run is [`Error::Invalid`].
    pub fn open(store: &Store, run: &str, opts: TailOptions) -> Result<Tail> {
        check_run_id(run)?;
        // Cursor files live on the caller's file system, whatever the log is read from.
        let cursor_storage = store.storage().clone();
        // A closed run is read from its archive, like `read` does; it ends with its
        // `run_closed` event, so a following tail ends there too.
        let archived = store.archived_store(run)?;
        let (store, opts) = match &archived {
            Some(a) => (
                a,
                TailOptions {
                    notify: false,
                    ..opts
                },
            ),
            None => (store, opts),
        };
        let storage = store.storage().clone();
        let dir = store.run_dir(run)?;
        // Lost marks are rebuilt from the log first: else the tail would wait forever
        // for a run whose records are all there.
        if storage.exists(&dir.join(META_FILE)) {
            store.marks(run, &dir)?;
        }
        let resume = match &opts.cursor_file {
            Some(p) => Cursor::load(&*cursor_storage, p)?,
            None => None,
        };
        if let Some(c) = &resume {
            if c.run != run {
                return Err(Error::invalid(
                    "cursor file",
                    format!("it belongs to run {:?}, not {run:?}", c.run),
                ));
            }
        }
        let next_seq = match &resume {
            Some(c) => c.seq.saturating_add(1),
            None => opts.from_seq.unwrap_or(1).max(1),
        };
        let wake = Arc::new(Wake::default());
        let notify = opts.notify;
        let mut t = Tail {
            storage,
            cursor_storage,
            live_store: archived.is_none().then(|| store.same_config()),
            dir,
            run: run.to_string(),
            poll: Duration::from_millis(opts.poll_interval_ms.max(1)),
            opts,
            located: false,
            resume,
            seg: 0,
            seg_file: None,
            off: 0,
            next_seq,
            head_seen: 0,
            last_ts: Ts(0),
            pending: VecDeque::new(),
            pending_frame: Pos::default(),
            synced: None,
            synced_opened: Instant::now(),
            frozen: None,
            wake: wake.clone(),
            waiter: Waiter::new(wake, notify),
            last: None,
            committed: None,
            finished: false,
            created: None,
        };
        t.check_created();
        if !t.opts.follow {
            if !t.storage.exists(&t.dir.join(META_FILE)) {
                return Err(Error::RunNotFound(run.to_string()));
            }
            t.frozen = Some(t.read_marks()?);
        }
        Ok(t)
    }

    /// The next event, waiting at most `timeout` for one. `Ok(None)` when the time ran
    /// out, or, when not following, at the end (see [`Tail::is_finished`]).
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Event>> {
        let deadline = Instant::now().checked_add(timeout);
        match self.next_inner(deadline)? {
            Next::Event(e) => Ok(Some(e)),
            Next::Timeout | Next::End => Ok(None),
        }
    }

    /// The next event if one is visible now, without waiting.
    pub fn try_next(&mut self) -> Result<Option<Event>> {
        self.next_timeout(Duration::ZERO)
    }

    /// True when not following and every event visible at open was delivered.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The cursor of the last event delivered, if any.
    pub fn cursor(&self) -> Option<&Cursor> {
        self.last.as_ref()
    }

    /// Where the tail stands.
    pub fn position(&self) -> TailPosition {
        TailPosition {
            pos: Pos {
                seg: self.seg,
                off: self.off,
            },
            next_seq: self.next_seq,
        }
    }

    /// Saves the cursor of the last event delivered to the cursor file (a no-op without
    /// a cursor file, or when nothing new was delivered since the last commit).
    pub fn commit(&mut self) -> Result<()> {
        let (Some(path), Some(c)) = (&self.opts.cursor_file, &self.last) else {
            return Ok(());
        };
        if self.committed.as_ref() == Some(c) {
            return Ok(());
        }
        c.save(&*self.cursor_storage, path, self.opts.cursor_fsync)?;
        self.committed = Some(c.clone());
        Ok(())
    }

    /// Waits on `source` (shared: [`WatchHub`]) instead of a watch of its own; polling stays.
    pub fn with_wake_source(mut self, source: WakeSource) -> Tail {
        self.waiter.share(source);
        self
    }

    /// A tail at this one's position that delivers every event from there on, with no
    /// agent or type filter and no cursor file, waking on `source`: the server's shared
    /// reader of a run starts where the subscriber that started it caught up, without
    /// scanning the segment again. Its next seq is the one after the last event read
    /// (delivered or filtered), or the first pending one; a tail not located yet starts
    /// from seq 1.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn fork(&self, source: WakeSource) -> Tail {
        let wake = Arc::new(Wake::default());
        let next_seq = match (self.located, self.pending.front()) {
            (true, Some(e)) => e.seq,
            (true, None) => self.head_seen + 1,
            (false, _) => 1,
        };
        let mut waiter = Waiter::new(wake.clone(), self.opts.notify);
        waiter.share(source);
        Tail {
            storage: self.storage.clone(),
            cursor_storage: self.cursor_storage.clone(),
            live_store: self.live_store.as_ref().map(Store::same_config),
            dir: self.dir.clone(),
            run: self.run.clone(),
            opts: TailOptions {
                from_seq: Some(next_seq),
                agent: None,
                kind: None,
                follow: true,
                cursor_file: None,
                ..self.opts.clone()
            },
            poll: self.poll,
            located: self.located,
            resume: None,
            seg: self.seg,
            seg_file: self.seg_file.clone(),
            off: self.off,
            next_seq,
            head_seen: self.head_seen,
            last_ts: self.last_ts,
            pending: self.pending.clone(),
            pending_frame: self.pending_frame,
            synced: None,
            synced_opened: Instant::now(),
            frozen: None,
            wake,
            waiter,
            last: None,
            committed: None,
            finished: false,
            created: self.created,
        }
    }

    /// Resumes right after `cursor`'s event, as from a cursor file (a position that does
    /// not hold its seq is scanned for instead). Only before the first read.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn with_resume(mut self, cursor: Cursor) -> Tail {
        self.next_seq = cursor.seq.saturating_add(1);
        self.resume = Some(cursor);
        self
    }

    /// Turns the tail into an async [`futures_core::Stream`].
    ///
    /// The tail runs on its own thread (file reads and waits are blocking) and hands
    /// events over through a bounded Tokio channel, so a slow consumer holds the thread
    /// back instead of buffering without limit. Dropping the stream stops the thread.
    pub fn into_stream(self) -> Result<TailStream> {
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_BUFFER_EVENTS);
        let wake = self.wake.clone();
        let storage = self.cursor_storage.clone();
        let cursor_file = self.opts.cursor_file.clone();
        let cursor_fsync = self.opts.cursor_fsync;
        let dir = self.dir.clone();
        let mut tail = self;
        std::thread::Builder::new()
            .name("swarm-tail".into())
            .spawn(move || loop {
                match tail.next_inner(None) {
                    Ok(Next::Event(e)) => {
                        let Some(c) = tail.last.clone() else { return };
                        if tx.blocking_send(Ok((e, c))).is_err() {
                            return;
                        }
                    }
                    Ok(Next::End) => return,
                    Ok(Next::Timeout) => {
                        if tail.wake.is_closed() || tx.is_closed() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e));
                        return;
                    }
                }
            })
            .ctx("spawn tail thread for", &dir)?;
        Ok(TailStream {
            rx,
            wake,
            storage,
            cursor_file,
            cursor_fsync,
            last: None,
            committed: None,
        })
    }

    fn next_inner(&mut self, deadline: Option<Instant>) -> Result<Next> {
        loop {
            if let Some(e) = self.pop_pending() {
                // A closed run refuses every later append: nothing can follow.
                if e.kind == EventType::RunClosed {
                    self.finished = true;
                    self.pending.clear();
                }
                return Ok(Next::Event(e));
            }
            if self.finished {
                return Ok(Next::End);
            }
            if self.wake.is_closed() {
                return Ok(Next::Timeout);
            }
            self.waiter.arm(&*self.storage, &self.dir);
            self.waiter.clear();
            self.advance()?;
            if !self.pending.is_empty() {
                continue;
            }
            if !self.opts.follow {
                self.finished = true;
                continue;
            }
            // Closed and archived under this tail before it read to the end (the working
            // files are gone): go on from the archive, at the same position (it holds the
            // same segment bytes). One stat per idle pass.
            if self.switch_to_archive()? {
                continue;
            }
            let now = Instant::now();
            let wait = match deadline {
                Some(d) if d <= now => return Ok(Next::Timeout),
                Some(d) => (d - now).min(self.poll),
                None => self.poll,
            };
            self.waiter.wait(wait);
            if self.synced_opened.elapsed() >= SYNCED_REOPEN {
                // A `SYNCED` lost and rebuilt is a new file: the open one would show the
                // old marks for good (and its watch never fires again; polling delivers).
                self.synced = None;
            }
        }
    }

    /// Hands out the next pending event that passes the filters.
    fn pop_pending(&mut self) -> Option<Event> {
        while let Some(e) = self.pending.pop_front() {
            self.next_seq = e.seq + 1;
            let o = &self.opts;
            if o.agent.as_ref().is_none_or(|a| *a == e.agent_id)
                && o.kind.is_none_or(|k| k == e.kind)
            {
                self.last = Some(Cursor {
                    format: CURSOR_FORMAT,
                    run: self.run.clone(),
                    seq: e.seq,
                    segment: self.pending_frame.seg,
                    offset: self.pending_frame.off,
                    created: self.created,
                });
                return Some(e);
            }
        }
        None
    }

    /// When the run was archived under this tail, reads it from its archive from now on.
    /// True when it switched.
    fn switch_to_archive(&mut self) -> Result<bool> {
        let Some(live) = &self.live_store else {
            return Ok(false);
        };
        if !self.storage.exists(&self.dir.join(TOMBSTONE)) {
            return Ok(false);
        }
        let Some(a) = live.archived_store(&self.run)? else {
            return Ok(false);
        };
        self.storage = a.storage().clone();
        self.dir = a.run_dir(&self.run)?;
        self.live_store = None;
        self.synced = None;
        if self.located {
            let off = self.off;
            self.open_segment(self.seg)?;
            self.off = off;
        }
        Ok(true)
    }

    fn read_marks(&mut self) -> Result<Marks> {
        let path = self.dir.join(SYNCED_FILE);
        if self.synced.is_none() {
            match self.storage.open(&path, OpenMode::Read) {
                Ok(f) => {
                    self.synced = Some(f);
                    self.synced_opened = Instant::now();
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Marks::default()),
                Err(e) => return Err(e).ctx("open", &path),
            }
        }
        match &self.synced {
            Some(f) => watermark::read(&**f, &path),
            None => Ok(Marks::default()),
        }
    }

    fn seg_path(&self) -> PathBuf {
        segment::segment_path(&self.dir, self.seg)
    }

    fn open_segment(&mut self, base: u64) -> Result<()> {
        let path = segment::segment_path(&self.dir, base);
        let f = self
            .storage
            .open(&path, OpenMode::Read)
            .ctx("open", &path)?;
        self.seg_file = Some(Arc::from(f));
        self.seg = base;
        self.off = 0;
        Ok(())
    }

    /// Reads the run's creation time (once `run.json` is there), which cursors carry, and
    /// drops a cursor of an earlier run of this name (deleted and created again): every
    /// event of this run is new to the consumer, and resuming at the old run's seq would
    /// skip the first ones. Cursors of older builds carry no time and are kept.
    fn check_created(&mut self) {
        if self.created.is_none() {
            self.created = read_meta(&*self.storage, &self.dir).ok().map(|m| m.created);
        }
        let Some(c) = &self.resume else { return };
        if c.created.is_some() && self.created.is_some() && c.created != self.created {
            tracing::warn!(run = %self.run, cursor_seq = c.seq, "the cursor file is of an earlier run of this name (deleted and created again); starting from --from-seq");
            self.resume = None;
            self.next_seq = self.opts.from_seq.unwrap_or(1).max(1);
        }
    }

    /// Resolves the starting position once the run exists: from the cursor when its
    /// position holds its seq, else by scanning from the segment that holds `next_seq`.
    fn locate(&mut self) -> Result<bool> {
        if self.located {
            return Ok(true);
        }
        if !self.storage.exists(&self.dir.join(META_FILE)) {
            return Ok(false);
        }
        // A tail opened before the run existed learns its creation time now.
        self.check_created();
        if let Some(c) = self.resume.take() {
            if self.resume_at(&c)? {
                self.located = true;
                return Ok(true);
            }
            tracing::warn!(run = %self.run, seq = c.seq, segment = c.segment, offset = c.offset,
                "cursor position does not hold its seq; scanning for the seq instead");
        }
        let bases = segment::list_segments(&*self.storage, &self.dir)?;
        let Some(&first) = bases.first() else {
            return Ok(false);
        };
        let base = bases
            .iter()
            .rev()
            .find(|&&b| b <= self.next_seq)
            .copied()
            .unwrap_or(first);
        // The seqs wanted come before the first segment there is: the run's first
        // segment is gone. Stepped over only where `swarm repair` listed the loss.
        if self.next_seq < first
            && quarantine::read(&*self.storage, &self.dir)
                .gap(1, 1, first)
                .is_none()
        {
            return Err(Error::corrupt(
                &segment::segment_path(&self.dir, 1),
                0,
                self.next_seq,
                format!(
                    "seqs {}..={} are missing: the run's first segment is gone and the first one left starts at seq {first}; `swarm repair --run {}` records the loss",
                    self.next_seq,
                    first - 1,
                    self.run
                ),
            ));
        }
        self.open_segment(base)?;
        self.head_seen = base.saturating_sub(1);
        self.last_ts = Ts(0);
        self.located = true;
        Ok(true)
    }

    /// Checks that the cursor's position holds a visible frame with its seq, and if so
    /// moves there, with the rest of that frame pending.
    fn resume_at(&mut self, c: &Cursor) -> Result<bool> {
        let path = segment::segment_path(&self.dir, c.segment);
        if !self.storage.exists(&path) {
            return Ok(false);
        }
        let marks = self.marks()?;
        let limit = self.limit_in(c.segment, &marks);
        let file: Arc<dyn StorageFile> = Arc::from(
            self.storage
                .open(&path, OpenMode::Read)
                .ctx("open", &path)?,
        );
        let mut r = FrameReader::new(file.clone(), path, c.offset, limit)?;
        let Step::Frame { offset, len } = r.step()? else {
            return Ok(false);
        };
        let Ok(events) = check_frame(r.payload(), None, Ts(0), &self.run) else {
            return Ok(false);
        };
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return Ok(false);
        };
        if !(first.seq..=last.seq).contains(&c.seq) {
            return Ok(false);
        }
        self.seg = c.segment;
        self.seg_file = Some(file);
        self.off = offset + len;
        self.head_seen = last.seq;
        self.last_ts = last.ts;
        self.next_seq = c.seq + 1;
        self.pending_frame = c.pos();
        self.pending = events.into_iter().filter(|e| e.seq > c.seq).collect();
        Ok(true)
    }

    fn marks(&mut self) -> Result<Marks> {
        match self.frozen {
            Some(m) => Ok(m),
            None => self.read_marks(),
        }
    }

    /// Byte limit of what may be read in segment `seg` (`None`: all of it).
    fn limit_in(&self, seg: u64, marks: &Marks) -> Option<u64> {
        match self.opts.visibility {
            Visibility::Written => None,
            Visibility::Visible if marks.visible.seg > seg => None,
            Visibility::Visible if marks.visible.seg == seg => Some(marks.visible.off),
            Visibility::Visible => Some(0),
        }
    }

    /// Reads frames from the position up to what may be read, until some event is
    /// pending or nothing more can be read now.
    fn advance(&mut self) -> Result<()> {
        if !self.locate()? {
            return Ok(());
        }
        let marks = match self.opts.visibility {
            Visibility::Visible => self.marks()?,
            Visibility::Written => Marks::default(),
        };
        loop {
            let path = self.seg_path();
            let Some(file) = self.seg_file.clone() else {
                return Ok(());
            };
            // A closed segment is one a later segment follows; its length is final.
            let closed = match self.opts.visibility {
                Visibility::Visible => marks.visible.seg > self.seg,
                Visibility::Written => {
                    (self.storage
                        .exists(&segment::segment_path(&self.dir, self.head_seen + 1))
                        && self.head_seen + 1 > self.seg)
                        // Or a later one starts past a gap (declared by `swarm repair`,
                        // or lost seqs, which the step to it reports): the visible mark
                        // has moved past this segment.
                        || self.marks()?.visible.seg > self.seg
                }
            };
            let (limit, to_file_end) = match self.limit_in(self.seg, &marks) {
                Some(l) => (l, false),
                None => (file.len().ctx("stat", &path)?, true),
            };
            if limit <= self.off && !closed {
                // Nothing new is visible: the common case of an idle poll, one pread.
                return Ok(());
            }
            let mut r = FrameReader::new(file.clone(), path.clone(), self.off, Some(limit))?;
            if to_file_end && !closed {
                // Reading what is written, up to the preallocated fill: stop at it
                // without reading the rest of the segment on every wake-up (a writer's
                // next append repairs whatever a crash left past it). Not in a closed
                // segment, read once: zeros there followed by frames are damage (lost
                // blocks `swarm repair` may have quarantined), not the fill.
                r = r.with_chunk(64 << 10).trust_fill();
            }
            let tail_incomplete = loop {
                match r.step()? {
                    Step::Frame { offset, len } => {
                        self.take_frame(r.payload(), &path, offset)?;
                        self.off = offset + len;
                        if !self.pending.is_empty() {
                            return Ok(());
                        }
                    }
                    Step::End { incomplete, offset } => {
                        // The segment ends below its durable mark: acknowledged bytes are
                        // gone (a cut file), not yet written ones. Say so, never wait.
                        if marks.durable.seg == self.seg && offset < marks.durable.off {
                            return Err(Error::corrupt(
                                &path,
                                offset,
                                self.head_seen + 1,
                                format!(
                                    "the segment ends below its durable mark (byte {}): acknowledged records from seq {} are lost; `swarm repair --run {}` records the loss",
                                    marks.durable.off,
                                    self.head_seen + 1,
                                    self.run
                                ),
                            ));
                        }
                        break incomplete;
                    }
                    Step::Corrupt { offset, reason } => {
                        if let Some(next) = r.skip_to_next_frame()? {
                            // Damage `swarm repair` quarantined: its seqs are lost.
                            if let Some(q) = quarantine::read(&*self.storage, &self.dir)
                                .at(self.seg, offset)
                                .filter(|q| q.end == Some(next))
                            {
                                self.head_seen = q.lost_to;
                                continue;
                            }
                            return Err(Error::corrupt(
                                &path,
                                offset,
                                self.head_seen + 1,
                                format!("{reason}; valid records follow at byte {next}"),
                            ));
                        }
                        // A listed range that runs to the end of an older segment.
                        let listed = closed
                            .then(|| quarantine::read(&*self.storage, &self.dir))
                            .and_then(|q| {
                                q.at(self.seg, offset)
                                    .filter(|q| q.end.is_none())
                                    .map(|q| q.lost_to)
                            });
                        if let Some(lost_to) = listed {
                            self.head_seen = lost_to;
                            break false;
                        }
                        // Nothing whole follows: a frame still being written (or a torn
                        // one the next writer will cut off), unless the segment is closed.
                        break true;
                    }
                }
            };
            if !closed {
                return Ok(());
            }
            // Bytes may have been added to a closed segment between our stat and the
            // creation of the next one: read to its final length before leaving it.
            let len = file.len().ctx("stat", &path)?;
            if len > limit {
                continue;
            }
            // A frame cut at the end of an older segment, its seqs listed as lost by
            // `swarm repair` (from its last whole frame on): the segment ends here.
            let listed_cut = tail_incomplete
                && quarantine::read(&*self.storage, &self.dir).cut_at(
                    self.seg,
                    self.off,
                    self.head_seen + 1,
                );
            if tail_incomplete && !listed_cut {
                return Err(Error::corrupt(
                    &path,
                    self.off,
                    self.head_seen + 1,
                    "damaged bytes at the end of a closed segment".into(),
                ));
            }
            let mut next = self.head_seen + 1;
            // (`next` is this segment's own base when it holds nothing: an emptied one.)
            if next <= self.seg || !self.storage.exists(&segment::segment_path(&self.dir, next)) {
                // After `swarm repair` the next segment starts past a gap its first event
                // declares (checked with the frame); any other later base is damage.
                match segment::list_segments(&*self.storage, &self.dir)?
                    .into_iter()
                    .find(|&b| b > self.seg)
                {
                    Some(b) if b > next => {
                        // Or seqs lost at this segment's end, listed by `swarm repair`.
                        let q = quarantine::read(&*self.storage, &self.dir);
                        if q.gap(self.seg, next, b).is_some() {
                            self.head_seen = b - 1;
                        }
                        next = b;
                    }
                    // The run was archived under us: its later segments are in the archive.
                    _ if self.switch_to_archive()? => return Ok(()),
                    _ => {
                        return Err(Error::corrupt(
                            &path,
                            self.off,
                            next,
                            format!(
                                "no segment starts at seq {next} after this one, but a later segment holds visible records"
                            ),
                        ))
                    }
                }
            }
            self.open_segment(next)?;
        }
    }

    /// Parses and checks a frame (the reader's checks: seqs follow on, ts never goes
    /// back, the run is this one), and queues its events from `next_seq` on.
    fn take_frame(&mut self, payload: &[u8], path: &Path, offset: u64) -> Result<()> {
        let want = self.head_seen + 1;
        let events = check_frame(payload, Some(want), self.last_ts, &self.run)
            .map_err(|(seq, reason)| Error::corrupt(path, offset, seq.unwrap_or(want), reason))?;
        let Some(last) = events.last() else {
            return Err(Error::corrupt(path, offset, want, "empty frame".into()));
        };
        self.head_seen = last.seq;
        self.last_ts = last.ts;
        self.pending_frame = Pos {
            seg: self.seg,
            off: offset,
        };
        let from = self.next_seq;
        self.pending
            .extend(events.into_iter().filter(|e| e.seq >= from));
        Ok(())
    }
}

impl Iterator for Tail {
    type Item = Result<Event>;

    /// Blocks until the next event when following; ends at the end of what was visible
    /// at open when not. After an error it ends.
    fn next(&mut self) -> Option<Result<Event>> {
        if self.finished {
            return None;
        }
        match self.next_inner(None) {
            Ok(Next::Event(e)) => Some(Ok(e)),
            Ok(Next::End | Next::Timeout) => {
                self.finished = true;
                None
            }
            Err(e) => {
                self.finished = true;
                Some(Err(e))
            }
        }
    }
}

impl Store {
    /// Opens a live tail of `run`: see [`Tail::open`].
    pub fn tail(&self, run: &str, opts: TailOptions) -> Result<Tail> {
        Tail::open(self, run, opts)
    }
}

#[cfg(test)]
mod tests;
