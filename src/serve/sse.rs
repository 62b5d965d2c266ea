//! The live tail over server-sent events: `GET /v1/runs/{run}/events?follow=1`.
//!
//! Each subscriber is a Tokio task (its pump) and a response stream, joined by a queue
//! of at most `sse_buffer_events` events. The pump first catches up alone: it reads the
//! run with the library's [`Tail`] on the blocking pool (the tail's reads are blocking
//! `pread`s), filters, encodes and queues the events. Once it has caught up it joins the
//! run's *feed* (`feed.rs`): one shared reader per run with subscribers, which reads each
//! newly visible event once, decodes it once, encodes its SSE bytes once, and publishes
//! them in `Arc` batches; the pump then only filters them and queues the shared bytes, so
//! one append costs one read, not one per subscriber. Wake-ups come from one watch per
//! run shared by all of that run's subscribers and its reader ([`WatchHub`] in
//! [`App::watches`]: one inotify instance for the whole server, one polling sweep per run
//! as the safety net); every waiter takes the run's wake-up generation *before* its tail
//! reads the marks, so a move after the read ends its next wait at once. The tail
//! switches from history to live with no gap and no duplicate; this layer keeps that
//! promise to the client across the switch to the feed:
//!
//! - a pump owes its client one seq, the next: it skips what is below it. A feed batch
//!   that starts above it (the pump joined between two reads of the feed, or fell more
//!   than the feed's channel behind it) is a gap: the pump reads the log itself with its
//!   own tail (reopened at the cursor of the last batch it took) up to what is visible,
//!   then goes on with the feed. The feed publishes only what its tail may read, so only
//!   visible events are ever sent. If the feed's reader stops (the run was read to its
//!   `run_closed`, a read failed, the server stops), the pump reads alone again;
//! - every event is sent with `id: <seq>`; a client that reconnects with `Last-Event-ID`
//!   (or `from_seq`) resumes right after it;
//! - the pump never waits for a client: when a subscriber's queue is full, it stops and
//!   the stream ends, after the queued events, with `event: lagged` whose data names
//!   `resume_from_seq` (the first event not sent). Nothing is skipped silently, and a slow
//!   client never holds back writers, the run's reader or other subscribers;
//! - at shutdown the stream ends with `event: shutdown` naming `resume_from_seq`;
//! - a failure ends it with `event: error` and a problem body;
//! - a comment (`: heartbeat`) goes out after `heartbeat` without a message, so proxies
//!   and clients can tell a quiet run from a dead connection.
//!
//! The body is written as raw `text/event-stream` bytes (not axum's `Sse`), so the feed's
//! bytes go out as they were encoded, byte for byte what `Sse` wrote.
//!
//! Filters and permissions, the same on both paths (the pump's tail has no filter of its
//! own): agent, type, subject; the run's policy applies to the token's agent as in reads,
//! and the rules are taken again whenever a `policy` event goes by (whatever the other
//! filters), so a new policy applies from it on. In memory mode each admitted event is
//! sent as the memory events it derives, encoded by the pump.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc, watch};

use crate::event::{Event, EventType};
use crate::fold::state::State;
use crate::serve::app::{blocking, App};
use crate::serve::feed::{encode_event, encode_json, Batch, Feed, Feeds, Joined, Start};
use crate::serve::metrics::{Metrics, Subscribed};
use crate::serve::problem::Problem;
use crate::store::Store;
use crate::synth::memory_events;
#[cfg(doc)]
use crate::tail::WatchHub;
use crate::tail::{Cursor, RunWatch, Tail, TailOptions};

/// The shortest time a subscriber waits without a wake-up before it reads its run again:
/// a backstop behind the shared watch and its polling sweep (which run at `sse_poll`),
/// not a path events are meant to take.
const BACKSTOP_MS_MIN: u64 = 1_000;
/// A pump hands its queued events to the response at least every this many events.
const FLUSH_EVENTS: usize = 64;
/// Most bytes a subscriber's queue holds (beside `--sse-buffer-events`): events may be
/// large, and a client that stops reading keeps its queue for as long as its connection
/// lives. Past it the stream ends with `lagged`, as past the event bound.
pub const SSE_BUFFER_BYTES: usize = 4 << 20;

/// One of a token's open streams, given back when the stream ends.
struct StreamSlot {
    app: Arc<App>,
    token: String,
}

impl StreamSlot {
    fn take(app: &Arc<App>, token: &str) -> Result<StreamSlot, Problem> {
        let mut m = app.streams.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(token.to_string()).or_default();
        let cap = app.opts.sse_streams_per_token;
        if *n >= cap {
            let mut p = Problem::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "sse-streams-per-token",
                "Too many event streams for this token",
                format!(
                    "token {token} holds {cap} open event streams (--sse-streams-per-token); close one first"
                ),
            );
            p.retry_after_s = Some(1);
            return Err(p);
        }
        *n += 1;
        Ok(StreamSlot {
            app: app.clone(),
            token: token.to_string(),
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut m = self.app.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.token) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.token);
            }
        }
    }
}

/// What one subscriber follows: the run, the tail's own filters (from seq, agent, type),
/// the subject, and the agent whose read permissions apply (`None`: unfiltered, admin
/// tokens only).
pub(crate) struct Subscription {
    pub(crate) run: String,
    pub(crate) tail: TailOptions,
    pub(crate) subject: Option<String>,
    pub(crate) reader: Option<String>,
    /// Send the memory events derived from each event (`synth::memory_events`) instead
    /// of the event; events that derive none are skipped.
    pub(crate) memory: bool,
    /// The id of the token the stream was opened with: asked again every heartbeat
    /// interval, the stream ends with a `revoked` event once it is revoked.
    pub(crate) token_id: String,
}

/// One event's SSE message(s), queued for the response.
struct Sent {
    seq: u64,
    bytes: Bytes,
}

/// What the pump hands to the response.
enum Msg {
    Events(Vec<Sent>),
    /// The buffer was full: the stream ends; `resume_from` is the first seq not sent.
    Lagged {
        resume_from: u64,
    },
    Failed(Problem),
}

/// The seq in a `Last-Event-ID` header (the last event the client received).
pub fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, Problem> {
    let Some(v) = headers.get("last-event-id") else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| Problem::invalid("Last-Event-ID must be a seq (digits)"))
}

/// An SSE message with a name and a JSON body (`lagged`, `shutdown`, `error`), as axum's
/// `Event::event(..).data(..)` writes it.
fn named(event: &str, data: &serde_json::Value) -> Bytes {
    let mut b = Vec::with_capacity(128);
    b.extend_from_slice(b"event: ");
    b.extend_from_slice(event.as_bytes());
    b.push(b'\n');
    for line in data.to_string().split('\n') {
        b.extend_from_slice(b"data: ");
        b.extend_from_slice(line.as_bytes());
        b.push(b'\n');
    }
    b.push(b'\n');
    Bytes::from(b)
}

/// Starts a subscriber and answers with its event stream. A run that does not exist (or
/// is another user's) is a 404 like any read, before any stream is opened.
pub(crate) async fn follow(
    app: Arc<App>,
    store: Arc<Store>,
    mut sub: Subscription,
) -> Result<Response, Problem> {
    let from = sub.tail.from_seq.unwrap_or(1).max(1);
    let mut token_id = std::mem::take(&mut sub.token_id);
    let slot = StreamSlot::take(&app, &token_id)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let queued_bytes = Arc::new(AtomicUsize::new(0));
    let out = Out {
        tx,
        queued: queued.clone(),
        queued_bytes: queued_bytes.clone(),
        cap: app.opts.sse_buffer_events.max(1),
        batch: Vec::new(),
        batch_bytes: 0,
        metrics: app.metrics.clone(),
    };
    let stop = app.shutdown.clone();
    let pump_stop = app.shutdown.clone();
    let counted = app.metrics.subscribe();
    let metrics = app.metrics.clone();
    let hub = app.watches.clone();
    let feeds = app.feeds.clone();
    let poll = app.opts.sse_poll;
    let pump = blocking(move || {
        crate::store::engine_log_hidden(&sub.run, sub.reader.as_deref())?;
        store.run_meta(&sub.run)?;
        let state = match &sub.reader {
            Some(_) => Some(store.head_state(&sub.run)?.state),
            None => None,
        };
        let filters = Filters {
            agent: sub.tail.agent.take(),
            kind: sub.tail.kind.take(),
            subject: sub.subject.take(),
            reader: sub.reader.take(),
            memory: sub.memory,
        };
        // The tail itself delivers every event: the filters run in the pump, the same on
        // both paths (and every `policy` event is seen).
        let mut opts = std::mem::take(&mut sub.tail);
        opts.from_seq = Some(from);
        opts.follow = true;
        opts.poll_interval_ms = u64::try_from(poll.as_millis()).unwrap_or(u64::MAX);
        let key = store.run_dir(&sub.run)?;
        // Armed before the tail's first read of the marks, so no move after it is missed.
        let watch = hub.watch(store.storage().clone(), &key);
        let tail = Tail::open(&store, &sub.run, opts.clone())?.with_wake_source(watch.source());
        // Without the hub's thread nothing notifies the source: poll at `poll` then.
        let backstop = match watch.is_swept() {
            true => poll.max(Duration::from_millis(BACKSTOP_MS_MIN)),
            false => poll,
        };
        Ok(Pump {
            tail,
            opts,
            store,
            run: sub.run,
            key,
            filters,
            state,
            out,
            next: from,
            resume: None,
            stop: pump_stop,
            counted,
            watch,
            feeds,
            backstop,
            joined: false,
        })
    })
    .await?;
    tokio::spawn(pump.run());
    let stream = futures_util::stream::unfold(
        Stream {
            rx,
            stop,
            next: from,
            done: false,
            pending: VecDeque::new(),
            queued,
            queued_bytes,
            metrics,
            heartbeat: app.opts.heartbeat,
            beat: tokio::time::Instant::now() + app.opts.heartbeat,
            live: Live {
                next: tokio::time::Instant::now(),
                token_id: std::mem::take(&mut token_id),
                app: app.clone(),
            },
            ended: false,
            _slot: slot,
        },
        step,
    );
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Tells proxies (nginx) not to buffer the stream.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(r)
}

/// What a subscriber may see: the same on the tail's path and the feed's.
struct Filters {
    agent: Option<String>,
    kind: Option<EventType>,
    subject: Option<String>,
    /// The agent whose read permissions apply (`None`: unfiltered).
    reader: Option<String>,
    memory: bool,
}

impl Filters {
    fn admit(&self, e: &Event, state: Option<&State>) -> bool {
        if self.agent.as_ref().is_some_and(|a| *a != e.agent_id)
            || self.kind.is_some_and(|k| k != e.kind)
            || self
                .subject
                .as_ref()
                .is_some_and(|s| e.subject.as_ref() != Some(s))
        {
            return false;
        }
        if let (Some(r), Some(s)) = (&self.reader, state) {
            if !s.rules.may_read_event(r, e) {
                return false;
            }
        }
        !(self.memory && memory_events::derive(e).is_empty())
    }
}

/// The pump's end of a subscriber's queue: events are counted in `queued` (at most `cap`)
/// from when they are handed over until the response takes them.
struct Out {
    tx: mpsc::UnboundedSender<Msg>,
    queued: Arc<AtomicUsize>,
    /// The bytes of the events counted in `queued` (at most [`SSE_BUFFER_BYTES`]).
    queued_bytes: Arc<AtomicUsize>,
    cap: usize,
    /// Events not handed over yet, and their bytes.
    batch: Vec<Sent>,
    batch_bytes: usize,
    metrics: Arc<Metrics>,
}

impl Out {
    /// Adds an event; false when the queue is full.
    fn push(&mut self, seq: u64, bytes: Bytes) -> bool {
        // (One event alone always fits, however large: the client could not get past it.)
        let held = self.queued_bytes.load(Ordering::Acquire) + self.batch_bytes;
        if self.queued.load(Ordering::Acquire) + self.batch.len() >= self.cap
            || (held > 0 && held + bytes.len() > SSE_BUFFER_BYTES)
        {
            return false;
        }
        self.batch_bytes += bytes.len();
        self.batch.push(Sent { seq, bytes });
        self.batch.len() < FLUSH_EVENTS || self.flush()
    }

    /// Hands the events added over; false when the response is gone.
    fn flush(&mut self) -> bool {
        if self.batch.is_empty() {
            return !self.tx.is_closed();
        }
        let n = self.batch.len();
        let bytes = std::mem::take(&mut self.batch_bytes);
        // Counted before the send: the response may take them at once.
        self.queued.fetch_add(n, Ordering::AcqRel);
        self.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        self.metrics.buffered(n as u64);
        match self.tx.send(Msg::Events(std::mem::take(&mut self.batch))) {
            Ok(()) => true,
            Err(_) => {
                self.queued.fetch_sub(n, Ordering::AcqRel);
                self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
                self.metrics.unbuffered(n as u64, false);
                false
            }
        }
    }

    /// Ends the stream after what was added.
    fn end(&mut self, m: Msg) {
        if self.flush() {
            let _ = self.tx.send(m);
        }
    }
}

/// One subscriber's pump: its tail, its filters, its share of the run's watch, its hold
/// on the run's feed once it joined, and the pump's end of its queue.
struct Pump {
    tail: Tail,
    /// The tail's options, to reopen it further on.
    opts: TailOptions,
    store: Arc<Store>,
    run: String,
    /// The run's directory: the key of its watch and its feed.
    key: PathBuf,
    filters: Filters,
    state: Option<Arc<State>>,
    out: Out,
    /// The next seq owed to the client: everything below was sent or filtered out.
    next: u64,
    /// The cursor of the last event of the last feed batch taken (of seq `next - 1`
    /// when no read since moved `next`).
    resume: Option<Cursor>,
    stop: watch::Receiver<bool>,
    counted: Subscribed,
    /// Held while the subscriber lives: the run's watch goes with its last subscriber.
    watch: RunWatch,
    feeds: Feeds,
    /// The longest wait without a wake-up.
    backstop: Duration,
    /// It joined a feed once: after that feed's reader stops, it reads alone.
    joined: bool,
}

/// How a read of what is visible ended.
enum Read {
    /// Everything visible was read.
    CaughtUp,
    /// The stream is over (lagged, failed, gone, or the server is stopping).
    Ended,
}

/// What a subscriber on a feed got.
enum Got {
    Batch(Arc<Batch>),
    /// It fell more than the channel behind: a gap to fill.
    Lagged,
    /// The feed's reader stopped.
    Closed,
    /// The response is gone or the server is stopping.
    End,
}

impl Pump {
    /// Catches up alone, then follows the run's feed (or, when there is none to be had,
    /// reads alone after each wake-up), until the subscriber goes away, falls behind,
    /// fails, or the server stops. Between reads it holds no thread.
    async fn run(mut self) {
        let mut wakeups = self.watch.source().subscribe();
        let (tx, mut stop) = (self.out.tx.clone(), self.stop.clone());
        let mut feed: Option<(Arc<Feed>, broadcast::Receiver<Arc<Batch>>)> = None;
        // It owes events the feed already passed: read the log before the next batch.
        let mut behind = false;
        loop {
            let Some((_, rx)) = &mut feed else {
                // Forgets the wake-ups so far *before* the tail reads the marks: a move
                // after that read leaves the generation changed, and the wait below
                // returns at once.
                wakeups.borrow_and_update();
                self = match self.read_alone().await {
                    Some(p) => p,
                    None => return,
                };
                // A tail past `run_closed` has nothing more to read: wait for the end.
                let live = !self.tail.is_finished();
                if live && !self.joined {
                    self.joined = true;
                    let (f, j) = self.join();
                    behind = j.next > self.next;
                    feed = Some((f, j.rx));
                    continue;
                }
                let source_gone = tokio::select! {
                    r = wakeups.changed(), if live => r.is_err(),
                    _ = tokio::time::sleep(self.backstop), if live => false,
                    _ = tx.closed() => return,
                    _ = async { stop.wait_for(|s| *s).await.is_ok() } => return,
                };
                if source_gone {
                    // Cannot happen while this pump holds the watch; never spin if it does.
                    tokio::time::sleep(self.backstop).await;
                }
                continue;
            };
            if behind {
                behind = false;
                self = match self.fill_gap().await {
                    Some(p) => p,
                    None => return,
                };
            }
            let got = tokio::select! {
                r = rx.recv() => match r {
                    Ok(b) => Got::Batch(b),
                    Err(RecvError::Lagged(_)) => Got::Lagged,
                    Err(RecvError::Closed) => Got::Closed,
                },
                _ = tx.closed() => Got::End,
                _ = async { stop.wait_for(|s| *s).await.is_ok() } => Got::End,
            };
            match got {
                Got::Batch(b) => {
                    if b.from > self.next {
                        self = match self.fill_gap().await {
                            Some(p) => p,
                            None => return,
                        };
                    }
                    if !self.take(&b).await {
                        return;
                    }
                }
                Got::Lagged => behind = true,
                Got::Closed => feed = None,
                Got::End => return,
            }
        }
    }

    /// Joins the run's feed, starting its reader at this pump's position if it has none.
    fn join(&self) -> (Arc<Feed>, Joined) {
        self.feeds.join(&self.key, || Start {
            tail: self.tail.fork(self.watch.source()),
            source: self.watch.source(),
            backstop: self.backstop,
            stop: self.stop.clone(),
            metrics: self.out.metrics.clone(),
        })
    }

    /// Reads what is visible with its own tail, on the blocking pool. `None` when the
    /// stream is over.
    async fn read_alone(mut self) -> Option<Pump> {
        match tokio::task::spawn_blocking(move || {
            let r = self.read();
            (self, r)
        })
        .await
        {
            Ok((p, Read::CaughtUp)) => Some(p),
            // Ended, or the read panicked: dropping the sender ends the stream.
            _ => None,
        }
    }

    /// A read to fill a gap the feed left.
    async fn fill_gap(self) -> Option<Pump> {
        self.out.metrics.gap_read();
        self.read_alone().await
    }

    /// Takes a feed batch: its events from `next` on, filtered, with their shared bytes.
    /// False when the stream is over.
    async fn take(&mut self, b: &Batch) -> bool {
        for item in &b.items {
            let e = &item.event;
            if e.seq < self.next {
                continue;
            }
            if e.kind == EventType::Policy && self.state.is_some() {
                let (store, run) = (self.store.clone(), self.run.clone());
                match blocking(move || store.head_state(&run)).await {
                    Ok(h) => self.state = Some(h.state),
                    Err(p) => {
                        self.out.end(Msg::Failed(p));
                        return false;
                    }
                }
            }
            if !self.offer(e, Some(&item.sse)) {
                return false;
            }
        }
        if b.to >= self.next {
            self.next = b.to;
            self.resume = b.last.clone();
        }
        self.out.flush()
    }

    /// Queues `e` (seq `next` or above) if the subscriber may see it, with `shared` as
    /// its bytes when given; false when the stream is over (lagged, failed or gone).
    fn offer(&mut self, e: &Event, shared: Option<&Bytes>) -> bool {
        self.next = e.seq + 1;
        if !self.filters.admit(e, self.state.as_deref()) {
            return true;
        }
        let bytes = match (self.filters.memory, shared) {
            (true, _) => {
                let mut b = Vec::new();
                for m in memory_events::derive(e) {
                    match encode_json(e.seq, &m) {
                        Ok(m) => b.extend_from_slice(&m),
                        Err(err) => tracing::error!(error = %err, "cannot encode a memory event"),
                    }
                }
                Bytes::from(b)
            }
            (false, Some(b)) => b.clone(),
            (false, None) => match encode_event(e) {
                Ok(b) => b,
                Err(err) => {
                    tracing::error!(error = %err, "cannot encode an event");
                    self.out.end(Msg::Failed(Problem::internal()));
                    return false;
                }
            },
        };
        if !self.out.push(e.seq, bytes) {
            if self.out.tx.is_closed() {
                return false;
            }
            // The queue is full: the stream ends after what it holds.
            self.counted.lagged();
            self.out.end(Msg::Lagged { resume_from: e.seq });
            return false;
        }
        true
    }

    /// Its own tail at `next`: reopened there (from the cursor of the last feed batch
    /// taken when it is of seq `next - 1`) when the feed took the subscriber past it.
    fn reopen(&mut self) -> crate::error::Result<()> {
        if self.tail.position().next_seq >= self.next {
            return Ok(());
        }
        let opts = TailOptions {
            from_seq: Some(self.next),
            ..self.opts.clone()
        };
        let mut t = Tail::open(&self.store, &self.run, opts)?.with_wake_source(self.watch.source());
        if let Some(c) = self.resume.take() {
            if c.seq.saturating_add(1) == self.next {
                t = t.with_resume(c);
            }
        }
        self.tail = t;
        Ok(())
    }

    /// Reads, filters and queues what is visible, never waiting for the subscriber.
    /// Blocking (file reads).
    fn read(&mut self) -> Read {
        if let Err(err) = self.reopen() {
            self.out.end(Msg::Failed(Problem::from(err)));
            return Read::Ended;
        }
        loop {
            if self.out.tx.is_closed() || *self.stop.borrow() {
                return Read::Ended;
            }
            let e = match self.tail.try_next() {
                Ok(Some(e)) => e,
                Ok(None) => break,
                Err(err) => {
                    self.out.end(Msg::Failed(Problem::from(err)));
                    return Read::Ended;
                }
            };
            if e.seq < self.next {
                continue;
            }
            if e.kind == EventType::Policy && self.state.is_some() {
                match self.store.head_state(&self.run) {
                    Ok(h) => self.state = Some(h.state),
                    Err(err) => {
                        self.out.end(Msg::Failed(Problem::from(err)));
                        return Read::Ended;
                    }
                }
            }
            if !self.offer(&e, None) {
                return Read::Ended;
            }
        }
        self.next = self.next.max(self.tail.position().next_seq);
        match self.out.flush() {
            true => Read::CaughtUp,
            false => Read::Ended,
        }
    }
}

/// The response's end of a subscriber's queue.
struct Stream {
    rx: mpsc::UnboundedReceiver<Msg>,
    stop: watch::Receiver<bool>,
    /// The first seq not sent yet.
    next: u64,
    done: bool,
    /// Events taken from `rx`, not written yet.
    pending: VecDeque<Sent>,
    /// Events handed over by the pump and not written yet (its bound).
    queued: Arc<AtomicUsize>,
    /// Their bytes.
    queued_bytes: Arc<AtomicUsize>,
    /// Counts the events queued (`swarm_tail_buffered_events`).
    metrics: Arc<Metrics>,
    heartbeat: Duration,
    /// When the next heartbeat is due if nothing is sent before.
    beat: tokio::time::Instant,
    /// The stream's token, asked again every heartbeat interval.
    live: Live,
    /// Ended by a revocation: nothing more goes out (what is queued is dropped).
    ended: bool,
    /// Its place among its token's open streams.
    _slot: StreamSlot,
}

/// Longest a stream goes without asking again whether its token is live (it asks every
/// heartbeat interval, within `TokenSet::RECHECK_MIN` and this).
const TOKEN_RECHECK_MAX: Duration = Duration::from_secs(5);

/// When and how a stream asks again whether its token is still live.
struct Live {
    next: tokio::time::Instant,
    token_id: String,
    app: Arc<App>,
}

impl Drop for Stream {
    /// The connection went away (or the stream ended): what is still queued leaves the
    /// gauge. Closing first makes the pump's next send fail, so none is missed.
    fn drop(&mut self) {
        self.rx.close();
        let mut n = self.pending.len() as u64;
        while let Ok(m) = self.rx.try_recv() {
            if let Msg::Events(v) = m {
                n += v.len() as u64;
            }
        }
        if n > 0 {
            self.metrics.unbuffered(n, false);
        }
    }
}

async fn step(mut st: Stream) -> Option<(Result<Bytes, Infallible>, Stream)> {
    let b = st.next_message().await?;
    st.beat = tokio::time::Instant::now() + st.heartbeat;
    Some((Ok(b), st))
}

impl Stream {
    /// The next message to write; `None` at the end.
    async fn next_message(&mut self) -> Option<Bytes> {
        loop {
            if self.ended {
                return None;
            }
            let now = tokio::time::Instant::now();
            if now >= self.live.next {
                // At least once every 5 s, at most once a second, whatever the heartbeat.
                self.live.next = now
                    + self.heartbeat.clamp(
                        crate::serve::token::TokenSet::RECHECK_MIN,
                        TOKEN_RECHECK_MAX,
                    );
                if !self.live.app.tokens.is_live(&self.live.token_id) {
                    self.ended = true;
                    return Some(named(
                        "revoked",
                        &json!({
                            "resume_from_seq": self.next,
                            "reason": "the token this stream was opened with was revoked",
                        }),
                    ));
                }
            }
            if let Some(s) = self.pending.pop_front() {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                self.queued_bytes.fetch_sub(s.bytes.len(), Ordering::AcqRel);
                self.metrics.unbuffered(1, true);
                self.next = s.seq + 1;
                return Some(s.bytes);
            }
            if self.done {
                return None;
            }
            // `None`: the server is stopping; `Some(None)`: the pump is gone.
            let s: Option<Option<Msg>> = {
                let (rx, stop, beat) = (&mut self.rx, &mut self.stop, self.beat);
                let recheck = self.live.next;
                tokio::select! {
                    // Queued events go out before a stop is looked at.
                    biased;
                    m = rx.recv() => Some(m),
                    _ = stop.wait_for(|s| *s) => None,
                    _ = tokio::time::sleep_until(beat) => {
                        return Some(Bytes::from_static(b": heartbeat\n\n"));
                    }
                    // An idle stream asks about its token on time too (it waited for the
                    // heartbeat, 15 s, or the next event).
                    _ = tokio::time::sleep_until(recheck) => continue,
                }
            };
            return Some(match s {
                // The pump also stops at shutdown, and may be gone before the stop is
                // seen here: the stream still ends with `shutdown`, never silently.
                Some(None) if !*self.stop.borrow() => return None,
                None | Some(None) => {
                    self.done = true;
                    named("shutdown", &json!({"resume_from_seq": self.next}))
                }
                Some(Some(Msg::Events(v))) => {
                    self.pending.extend(v);
                    continue;
                }
                Some(Some(Msg::Lagged { resume_from })) => {
                    self.done = true;
                    named(
                        "lagged",
                        &json!({
                            "resume_from_seq": resume_from,
                            "reason": "the client read too slowly; reconnect from resume_from_seq",
                        }),
                    )
                }
                Some(Some(Msg::Failed(p))) => {
                    self.done = true;
                    named("error", &json!(p))
                }
            });
        }
    }
}
