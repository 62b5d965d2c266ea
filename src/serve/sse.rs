//! The live tail over server-sent events: `GET /v1/runs/{run}/events?follow=1`.
//!
//! Each subscriber gets the library's [`Tail`], driven by a Tokio task: the task reads
//! what is visible on the blocking pool (the tail's reads are blocking `pread`s), hands
//! the events to the response through a bounded channel of `sse_buffer_events`, then
//! waits for a wake-up without holding a thread. Wake-ups come from one watch per run
//! shared by all of that run's subscribers ([`WatchHub`] in [`App::watches`]: one
//! inotify instance for the whole server, one polling sweep per run as the safety net),
//! so the number of subscribers is not bounded by the kernel's inotify instances. Each
//! subscriber keeps the tail's no-gap protocol: it takes the run's wake-up generation
//! *before* the tail reads the marks, so a move after the read ends its next wait at
//! once. The tail switches from history to live with no gap and no duplicate; this
//! layer keeps that promise to the client:
//!
//! - every event is sent with `id: <seq>`; a client that reconnects with `Last-Event-ID`
//!   (or `from_seq`) resumes right after it;
//! - the reader never waits for a client: when a subscriber's buffer is full, it stops
//!   and the stream ends, after the buffered events, with `event: lagged` whose data
//!   names `resume_from_seq` (the first event not sent). Nothing is skipped silently, and
//!   a slow client never holds back writers, the shared watch or other subscribers;
//! - at shutdown the stream ends with `event: shutdown` naming `resume_from_seq`;
//! - a failure ends it with `event: error` and a problem body;
//! - a comment (`: heartbeat`) goes out every `heartbeat` so proxies and clients can tell
//!   a quiet run from a dead connection.
//!
//! Permissions: the run's policy applies to the token's agent as in reads; the rules are
//! taken again whenever a `policy` event goes by, so a new policy applies from it on.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::sync::watch;

use crate::event::{Event, EventType};
use crate::fold::state::State;
use crate::serve::app::{blocking, App};
use crate::serve::metrics::{Metrics, Subscribed};
use crate::serve::problem::Problem;
use crate::store::Store;
use crate::synth::memory_events;
#[cfg(doc)]
use crate::tail::WatchHub;
use crate::tail::{RunWatch, Tail, TailOptions};

/// The shortest time a subscriber waits without a wake-up before it reads its run again:
/// a backstop behind the shared watch and its polling sweep (which run at `sse_poll`),
/// not a path events are meant to take.
const BACKSTOP_MS_MIN: u64 = 1_000;

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
}

/// What the tail thread hands to the response.
// A short-lived message: boxing the event would cost an allocation per event.
#[allow(clippy::large_enum_variant)]
enum Msg {
    Event(Event),
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

/// Starts a subscriber and answers with its event stream. A run that does not exist (or
/// is another user's) is a 404 like any read, before any stream is opened.
pub(crate) async fn follow(
    app: Arc<App>,
    store: Arc<Store>,
    mut sub: Subscription,
) -> Result<Response, Problem> {
    let from = sub.tail.from_seq.unwrap_or(1).max(1);
    let memory = sub.memory;
    let (tx, rx) = mpsc::channel(app.opts.sse_buffer_events.max(1) + 1);
    let stop = app.shutdown.clone();
    let pump_stop = app.shutdown.clone();
    let counted = app.metrics.subscribe();
    let metrics = app.metrics.clone();
    let hub = app.watches.clone();
    let poll = app.opts.sse_poll;
    let pump = blocking(move || {
        store.run_meta(&sub.run)?;
        let state = match &sub.reader {
            Some(_) => Some(store.head_state(&sub.run)?.state),
            None => None,
        };
        sub.tail.from_seq = Some(from);
        sub.tail.follow = true;
        sub.tail.poll_interval_ms = u64::try_from(poll.as_millis()).unwrap_or(u64::MAX);
        // Armed before the tail's first read of the marks, so no move after it is missed.
        let watch = hub.watch(store.storage().clone(), &store.run_dir(&sub.run)?);
        let tail = Tail::open(&store, &sub.run, std::mem::take(&mut sub.tail))?
            .with_wake_source(watch.source());
        Ok(Pump {
            tail,
            store,
            sub,
            state,
            tx,
            stop: pump_stop,
            counted,
            watch,
        })
    })
    .await?;
    tokio::spawn(pump.run(poll));
    let stream = futures_util::stream::unfold(
        Stream {
            rx,
            stop,
            next: from,
            done: false,
            memory,
            pending: VecDeque::new(),
            metrics,
        },
        step,
    );
    let sse = Sse::new(stream).keep_alive(
        KeepAlive::new()
            .interval(app.opts.heartbeat)
            .text("heartbeat"),
    );
    let mut r = sse.into_response();
    // Tells proxies (nginx) not to buffer the stream.
    r.headers_mut().insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    Ok(r)
}

/// One subscriber's reader: its tail, its filters, its share of the run's watch, and the
/// sending end of its buffer.
struct Pump {
    tail: Tail,
    store: Arc<Store>,
    sub: Subscription,
    state: Option<Arc<State>>,
    tx: mpsc::Sender<Msg>,
    stop: watch::Receiver<bool>,
    counted: Subscribed,
    /// Held while the subscriber lives: the run's watch goes with its last subscriber.
    watch: RunWatch,
}

/// How a read of what is visible ended.
enum Read {
    /// Everything visible was read: wait for a wake-up.
    CaughtUp,
    /// The stream is over (lagged, failed, gone, or the server is stopping).
    Ended,
}

impl Pump {
    /// Reads, then waits for the run's next wake-up (or the backstop), until the
    /// subscriber goes away, falls behind, fails, or the server stops. Between reads it
    /// holds no thread.
    async fn run(mut self, poll: Duration) {
        let mut wakeups = self.watch.source().subscribe();
        // Without the hub's thread nothing notifies the source: poll at `poll` then.
        let backstop = match self.watch.is_swept() {
            true => poll.max(Duration::from_millis(BACKSTOP_MS_MIN)),
            false => poll,
        };
        let (tx, mut stop) = (self.tx.clone(), self.stop.clone());
        loop {
            // Forgets the wake-ups so far *before* the tail reads the marks: a move after
            // that read leaves the generation changed, and the wait below returns at once.
            wakeups.borrow_and_update();
            let Ok((back, read)) = tokio::task::spawn_blocking(move || {
                let r = self.read();
                (self, r)
            })
            .await
            else {
                // The read panicked; dropping the sender ends the stream.
                return;
            };
            self = back;
            if let Read::Ended = read {
                return;
            }
            // A tail past `run_closed` has nothing more to read: wait for the end only.
            let live = !self.tail.is_finished();
            let source_gone = tokio::select! {
                r = wakeups.changed(), if live => r.is_err(),
                _ = tokio::time::sleep(backstop), if live => false,
                _ = tx.closed() => return,
                _ = async { stop.wait_for(|s| *s).await.is_ok() } => return,
            };
            if source_gone {
                // Cannot happen while this pump holds the watch; never spin if it does.
                tokio::time::sleep(backstop).await;
            }
        }
    }

    /// Reads and filters what is visible and hands it over, never waiting for the
    /// subscriber. Blocking (file reads).
    fn read(&mut self) -> Read {
        let metrics = self.counted.metrics();
        loop {
            if self.tx.is_closed() || *self.stop.borrow() {
                return Read::Ended;
            }
            let e = match self.tail.try_next() {
                Ok(Some(e)) => e,
                Ok(None) => return Read::CaughtUp,
                Err(err) => {
                    let _ = self.tx.try_send(Msg::Failed(Problem::from(err)));
                    return Read::Ended;
                }
            };
            if e.kind == EventType::Policy && self.state.is_some() {
                match self.store.head_state(&self.sub.run) {
                    Ok(h) => self.state = Some(h.state),
                    Err(err) => {
                        let _ = self.tx.try_send(Msg::Failed(Problem::from(err)));
                        return Read::Ended;
                    }
                }
            }
            let sub = &self.sub;
            if sub
                .subject
                .as_ref()
                .is_some_and(|s| e.subject.as_ref() != Some(s))
            {
                continue;
            }
            if let (Some(r), Some(s)) = (&sub.reader, &self.state) {
                if !s.rules.may_read_event(r, &e) {
                    continue;
                }
            }
            if sub.memory && memory_events::derive(&e).is_empty() {
                continue;
            }
            // The last slot is kept for the message that ends the stream.
            if self.tx.capacity() <= 1 {
                self.counted.lagged();
                let _ = self.tx.try_send(Msg::Lagged { resume_from: e.seq });
                return Read::Ended;
            }
            if self.tx.try_send(Msg::Event(e)).is_err() {
                return Read::Ended;
            }
            metrics.buffered();
        }
    }
}

struct Stream {
    rx: mpsc::Receiver<Msg>,
    stop: watch::Receiver<bool>,
    /// The first seq not sent yet.
    next: u64,
    done: bool,
    /// Memory mode (see [`Subscription::memory`]).
    memory: bool,
    /// Memory events of the last event not sent yet.
    pending: VecDeque<SseEvent>,
    /// Counts the events in `rx` (`swarm_tail_buffered_events`).
    metrics: Arc<Metrics>,
}

impl Drop for Stream {
    /// The connection went away (or the stream ended): what is still buffered leaves the
    /// gauge. Closing first makes the tail thread's next send fail, so none is missed.
    fn drop(&mut self) {
        self.rx.close();
        while let Ok(m) = self.rx.try_recv() {
            if matches!(m, Msg::Event(_)) {
                self.metrics.unbuffered(false);
            }
        }
    }
}

async fn step(mut st: Stream) -> Option<(Result<SseEvent, Infallible>, Stream)> {
    if let Some(ev) = st.pending.pop_front() {
        return Some((Ok(ev), st));
    }
    if st.done {
        return None;
    }
    // `None`: the server is stopping; `Some(None)`: the tail thread is gone.
    let s: Option<Option<Msg>> = {
        let (rx, stop) = (&mut st.rx, &mut st.stop);
        tokio::select! {
            // Buffered events go out before a stop is looked at.
            biased;
            m = rx.recv() => Some(m),
            _ = stop.wait_for(|s| *s) => None,
        }
    };
    let ev = match s {
        // The tail thread also stops at shutdown, and may be gone before the stop is
        // seen here: the stream still ends with `shutdown`, never silently.
        Some(None) if !*st.stop.borrow() => return None,
        None | Some(None) => {
            st.done = true;
            SseEvent::default()
                .event("shutdown")
                .data(json!({"resume_from_seq": st.next}).to_string())
        }
        Some(Some(Msg::Event(e))) if st.memory => {
            st.metrics.unbuffered(true);
            st.next = e.seq + 1;
            for m in memory_events::derive(&e) {
                match SseEvent::default().id(e.seq.to_string()).json_data(&m) {
                    Ok(ev) => st.pending.push_back(ev),
                    Err(err) => tracing::error!(error = %err, "cannot encode a memory event"),
                }
            }
            st.pending
                .pop_front()
                .unwrap_or_else(|| SseEvent::default().comment("no memory event"))
        }
        Some(Some(Msg::Event(e))) => {
            st.metrics.unbuffered(true);
            st.next = e.seq + 1;
            match SseEvent::default().id(e.seq.to_string()).json_data(&e) {
                Ok(ev) => ev,
                Err(err) => {
                    tracing::error!(error = %err, "cannot encode an event");
                    st.done = true;
                    SseEvent::default()
                        .event("error")
                        .data(json!(Problem::internal()).to_string())
                }
            }
        }
        Some(Some(Msg::Lagged { resume_from })) => {
            st.done = true;
            SseEvent::default().event("lagged").data(
                json!({
                    "resume_from_seq": resume_from,
                    "reason": "the client read too slowly; reconnect from resume_from_seq",
                })
                .to_string(),
            )
        }
        Some(Some(Msg::Failed(p))) => {
            st.done = true;
            SseEvent::default()
                .event("error")
                .data(json!(p).to_string())
        }
    };
    Some((Ok(ev), st))
}
