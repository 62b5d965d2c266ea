//! A run's shared reader for the live tail: while a run has SSE subscribers on it, one
//! reader reads each newly visible event once, decodes it once, encodes its SSE bytes
//! (`id: <seq>\ndata: <json>\n\n`) once, and publishes the events in `Arc` batches on a
//! broadcast channel that every subscriber of the run that has caught up with history
//! listens to (`sse.rs` filters and writes them). One append costs one read however many
//! subscribers follow the run.
//!
//! - The reader is the library's [`Tail`], forked from the caught-up tail of the
//!   subscriber that starts it ([`Tail::fork`]: same position, no agent or type filter,
//!   no scan): it reads only what the tail's visibility rule lets it (the visible mark in
//!   `SYNCED`), and waits on the run's shared watch ([`WatchHub`]), taking the wake-up
//!   generation before each read as subscribers do, with the same backstop.
//! - A [`Batch`] names the seqs it covers: `from`, the reader's next seq before it, and
//!   `to`, after it (the seq after its last event). A subscriber that owes seq N knows
//!   whether a batch leaves it a gap (`from > N`) and then reads the log itself (its own
//!   tail, reopened at the cursor of the last batch it took) before taking the batch;
//!   events below N are skipped. The reader moves [`Feed`]'s `next` to a batch's `to` and
//!   sends the batch under one lock, and a subscriber subscribes and reads `next` under
//!   the same lock ([`Feeds::join`]), so it receives exactly the batches from `next` on.
//! - The channel holds [`FEED_BATCHES`] batches (a batch's value is dropped once every
//!   subscriber took it); a subscriber that falls further behind gets `Lagged` and fills
//!   the gap from the log the same way. A batch holds at most [`BATCH_EVENTS_MAX`]
//!   events or about [`BATCH_BYTES_MAX`] bytes of SSE.
//! - The reader runs while subscribers hold its [`Feed`]: when the last handle is
//!   dropped it stops and drops its wake-up source. When it stops for another reason
//!   (the run was closed and read to its end, a read failed, the server stops) it closes
//!   the channel: its subscribers go on reading the log alone, as before they joined, and
//!   the run's next subscriber starts a new reader.
//!
//! **Invariant:** the reader never waits for a subscriber: publishing is a broadcast send
//! under a lock no one holds for longer than a subscribe.
//! Never filters: what a subscriber may see is decided in `sse.rs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use axum::body::Bytes;
use tokio::sync::{broadcast, oneshot, watch};

use crate::event::Event;
use crate::serve::metrics::Metrics;
#[cfg(doc)]
use crate::tail::WatchHub;
use crate::tail::{Cursor, Tail, WakeSource};

/// Batches a run's channel holds for subscribers that have not taken them yet.
pub(crate) const FEED_BATCHES: usize = 256;
/// Most events in one batch.
pub(crate) const BATCH_EVENTS_MAX: usize = 256;
/// A batch is closed once its SSE bytes reach this.
pub(crate) const BATCH_BYTES_MAX: usize = 1 << 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One event as read by the shared reader, with its SSE message.
pub(crate) struct Item {
    pub(crate) event: Event,
    /// `id: <seq>\ndata: <event JSON>\n\n`.
    pub(crate) sse: Bytes,
}

/// Events the reader read in one go, in seq order.
pub(crate) struct Batch {
    /// The reader's next seq before this batch: no event from here to the first item's
    /// seq exists (a gap only `swarm repair` leaves).
    pub(crate) from: u64,
    /// The seq after the last event.
    pub(crate) to: u64,
    pub(crate) items: Vec<Item>,
    /// The cursor of the last event: a tail reopened with it resumes at `to`.
    pub(crate) last: Option<Cursor>,
}

/// The SSE message of a run event: `id: <seq>\ndata: <event JSON>\n\n` (compact JSON
/// holds no line break, so one `data` line), as axum's `Event::id(..).json_data(..)`
/// writes it.
pub(crate) fn encode_event(e: &Event) -> serde_json::Result<Bytes> {
    encode_json(e.seq, e)
}

/// `id: <seq>\ndata: <value as JSON>\n\n`.
pub(crate) fn encode_json<T: serde::Serialize>(seq: u64, v: &T) -> serde_json::Result<Bytes> {
    let mut b = Vec::with_capacity(256);
    b.extend_from_slice(b"id: ");
    b.extend_from_slice(seq.to_string().as_bytes());
    b.extend_from_slice(b"\ndata: ");
    serde_json::to_writer(&mut b, v)?;
    b.extend_from_slice(b"\n\n");
    Ok(Bytes::from(b))
}

/// The shared readers of the server's followed runs, keyed by run directory, i.e. by
/// (user, run). Clones share the registry.
#[derive(Clone, Default)]
pub(crate) struct Feeds(Arc<Mutex<HashMap<PathBuf, Weak<Feed>>>>);

/// A subscriber's hold on its run's shared reader: the reader stops when the last one is
/// dropped.
pub(crate) struct Feed {
    key: PathBuf,
    feeds: Feeds,
    shared: Arc<Shared>,
    /// Dropped with the last handle: the reader's signal to stop.
    _stop: oneshot::Sender<()>,
}

/// What the reader publishes to.
struct Shared(Mutex<Published>);

struct Published {
    /// The `to` of the last batch published (at first, where the reader starts).
    next: u64,
    /// `None` once the reader stopped.
    tx: Option<broadcast::Sender<Arc<Batch>>>,
}

/// A subscriber's place on a feed: it receives every batch published from `next` on.
pub(crate) struct Joined {
    pub(crate) rx: broadcast::Receiver<Arc<Batch>>,
    pub(crate) next: u64,
}

/// What a new reader needs: its tail (at its first subscriber's position), the run's
/// wake-up source, the longest wait without a wake-up, the server's stop signal.
pub(crate) struct Start {
    pub(crate) tail: Tail,
    pub(crate) source: WakeSource,
    pub(crate) backstop: Duration,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) metrics: Arc<Metrics>,
}

impl Shared {
    fn subscribe(&self) -> Option<Joined> {
        let p = lock(&self.0);
        let tx = p.tx.as_ref()?;
        Some(Joined {
            rx: tx.subscribe(),
            next: p.next,
        })
    }

    fn publish(&self, batch: Batch) {
        let mut p = lock(&self.0);
        p.next = batch.to;
        if let Some(tx) = &p.tx {
            // No receiver now is no error: the subscribers are all reading by themselves.
            let _ = tx.send(Arc::new(batch));
        }
    }

    fn close(&self) {
        lock(&self.0).tx = None;
    }
}

impl Feeds {
    /// Joins the run's feed, starting its reader with `start()` when it has none (or its
    /// reader stopped). Must be called within the Tokio runtime.
    pub(crate) fn join(&self, key: &Path, start: impl FnOnce() -> Start) -> (Arc<Feed>, Joined) {
        // Declared before the guard so that a stopped feed is dropped after the guard:
        // its `Drop` takes the lock.
        let mut _stopped = None;
        let mut m = lock(&self.0);
        if let Some(f) = m.get(key).and_then(Weak::upgrade) {
            match f.shared.subscribe() {
                Some(j) => return (f, j),
                None => _stopped = Some(f),
            }
        }
        let s = start();
        let (tx, rx) = broadcast::channel(FEED_BATCHES);
        let next = s.tail.position().next_seq;
        let shared = Arc::new(Shared(Mutex::new(Published { next, tx: Some(tx) })));
        let (stop_tx, stop_rx) = oneshot::channel();
        let feed = Arc::new(Feed {
            key: key.to_path_buf(),
            feeds: self.clone(),
            shared: shared.clone(),
            _stop: stop_tx,
        });
        m.insert(key.to_path_buf(), Arc::downgrade(&feed));
        tokio::spawn(read_loop(s, shared, stop_rx));
        (feed, Joined { rx, next })
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        let mut m = lock(&self.feeds.0);
        // Unless a new feed of the run took the slot since.
        if m.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            m.remove(&self.key);
        }
    }
}

/// The reader: reads what is visible and publishes it, then waits for the run's next
/// wake-up (or the backstop), until its last subscriber leaves, the run ends, a read
/// fails or the server stops. Between reads it holds no thread (a small read takes its
/// Tokio worker for that read; a large one goes to the blocking pool).
///
/// However it ends, a panic in a read included, the channel is closed on the way out,
/// so its pumps go on reading alone rather than wait for batches that never come.
async fn read_loop(s: Start, shared: Arc<Shared>, mut gone: oneshot::Receiver<()>) {
    struct CloseOnExit(Arc<Shared>);
    impl Drop for CloseOnExit {
        fn drop(&mut self) {
            self.0.close();
        }
    }
    let _close = CloseOnExit(shared.clone());
    let Start {
        mut tail,
        source,
        backstop,
        mut stop,
        metrics,
    } = s;
    let _counted = metrics.reader();
    let mut wakeups = source.subscribe();
    loop {
        // Forgets the wake-ups so far *before* the tail reads the marks (see `sse.rs`).
        wakeups.borrow_and_update();
        // What one wake-up made visible is usually a few events in the page cache: read
        // one batch's worth here, without a hop to the blocking pool and back (a third of
        // the delay from the append's acknowledgement to delivery); more than that (a
        // burst, a slow storage) is read on the blocking pool.
        let ok = match read(&mut tail, &shared, Some(1)) {
            Read::Failed => false,
            Read::CaughtUp => true,
            Read::More => {
                let sh = shared.clone();
                let Ok((back, ok)) = tokio::task::spawn_blocking(move || {
                    let ok = !matches!(read(&mut tail, &sh, None), Read::Failed);
                    (tail, ok)
                })
                .await
                else {
                    break;
                };
                tail = back;
                ok
            }
        };
        if !ok || tail.is_finished() {
            break;
        }
        let source_gone = tokio::select! {
            r = wakeups.changed() => r.is_err(),
            _ = tokio::time::sleep(backstop) => false,
            _ = &mut gone => break,
            _ = async { stop.wait_for(|s| *s).await.is_ok() } => break,
        };
        if source_gone {
            // Cannot happen while the run's subscribers hold the watch; never spin.
            tokio::time::sleep(backstop).await;
        }
    }
}

/// What [`read`] did.
enum Read {
    /// Everything visible was published.
    CaughtUp,
    /// It stopped after its batches; more may be visible.
    More,
    /// A read or an encoding failed: the reader must stop (its subscribers read alone
    /// and meet the failure themselves).
    Failed,
}

/// Reads and publishes what is visible now: everything, or at most `batches` batches.
/// Blocking (file reads).
fn read(tail: &mut Tail, shared: &Shared, mut batches: Option<usize>) -> Read {
    loop {
        let from = Tail::position(tail).next_seq;
        let mut items: Vec<Item> = Vec::new();
        let mut bytes = 0;
        let (caught_up, ok) = loop {
            let e = match tail.try_next() {
                Ok(Some(e)) => e,
                Ok(None) => break (true, true),
                Err(err) => {
                    tracing::warn!(error = %err, "the shared tail reader stops; its subscribers read alone");
                    break (true, false);
                }
            };
            match encode_event(&e) {
                Ok(sse) => {
                    bytes += sse.len();
                    items.push(Item { event: e, sse });
                }
                Err(err) => {
                    tracing::error!(error = %err, "cannot encode an event");
                    break (true, false);
                }
            }
            if items.len() >= BATCH_EVENTS_MAX || bytes >= BATCH_BYTES_MAX {
                break (false, true);
            }
        };
        if let Some(last) = items.last() {
            let to = last.event.seq + 1;
            let last = tail.cursor().filter(|c| c.seq == last.event.seq).cloned();
            shared.publish(Batch {
                from,
                to,
                items,
                last,
            });
        }
        if !ok {
            return Read::Failed;
        }
        if caught_up {
            return Read::CaughtUp;
        }
        if let Some(n) = batches.as_mut() {
            *n -= 1;
            if *n == 0 {
                return Read::More;
            }
        }
    }
}
