//! Server-side group commit: the appends to one run that queue while its last commit
//! runs are committed together, by one blocking thread, with one lock, one `pwrite` and
//! one fsync ([`Store::append_many`]), as Redis covers every waiting client with one
//! fsync per event-loop turn.
//!
//! Without it each request would hold a blocking thread parked in the engine's group
//! commit: the fsyncs are shared either way, but every request then costs a thread hand-off
//! and a park and wake-up or two, which on two cores shared with the clients is most
//! of an append's cost.
//!
//! - A request pushes its batch on its run's queue (one per user and run) and waits for
//!   its own outcome on a oneshot channel; the first request of an idle queue starts its
//!   drain on the blocking pool.
//! - The drain takes everything queued, commits it, answers each request, and goes on
//!   while requests keep arriving; then it stops and its queue leaves the map.
//! - Each batch keeps its own outcome (a refused `expect_seq` refuses that request only),
//!   its atomicity and its durability: a `sync` request is answered after the fsync
//!   that covers it, exactly as through [`Store::append_batch`].
//!
//! **Invariant:** a queued request is always answered: by its drain, or (if the drain
//! thread panics) with an error when its channel closes; and a queue with requests
//! always has a drain running (it is started under the queue's lock by whoever finds it
//! idle, and a drain stops only after finding the queue empty under that lock).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::error::Result;
use crate::event::{Event, NewEvent};
use crate::log::meta::Durability;
use crate::serve::metrics::Metrics;
use crate::serve::problem::Problem;
use crate::store::Store;
use crate::tail::WatchHub;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Most requests one drain commits together (the rest wait for its next turn), so that a
/// burst cannot make one commit unboundedly large.
const REQUESTS_PER_COMMIT_MAX: usize = 1024;

/// The queues of the runs being appended to, keyed by (user, run).
pub(crate) struct Commits {
    queues: Mutex<HashMap<(String, String), Arc<Queue>>>,
    /// Counts the turns and the requests they take (`/metrics`).
    metrics: Arc<Metrics>,
    /// The live tails' watches: a commit wakes its run's tails itself.
    watches: WatchHub,
}

#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    jobs: Vec<Job>,
    /// A drain is running (it takes every job pushed before it finds the queue empty).
    draining: bool,
}

struct Job {
    events: Vec<NewEvent>,
    expect_seq: Option<u64>,
    durability: Durability,
    reply: oneshot::Sender<Result<Vec<Event>>>,
}

impl Commits {
    /// The queues of a server whose `/metrics` is `metrics`.
    pub(crate) fn new(metrics: Arc<Metrics>, watches: WatchHub) -> Commits {
        Commits {
            queues: Mutex::default(),
            metrics,
            watches,
        }
    }

    /// Appends one atomic batch to `run` in `store` (the token's user's), committed with
    /// whatever else queued for the run meanwhile; its stored events, as
    /// [`Store::append_batch`] returns them.
    pub(crate) async fn append(
        self: &Arc<Self>,
        store: Arc<Store>,
        run: String,
        events: Vec<NewEvent>,
        expect_seq: Option<u64>,
        durability: Durability,
    ) -> std::result::Result<Vec<Event>, Problem> {
        let key = (store.user().to_string(), run);
        let queue = lock(&self.queues).entry(key.clone()).or_default().clone();
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut st = lock(&queue.state);
            st.jobs.push(Job {
                events,
                expect_seq,
                durability,
                reply,
            });
            !std::mem::replace(&mut st.draining, true)
        };
        if start {
            let (commits, queue) = (self.clone(), queue.clone());
            tokio::task::spawn_blocking(move || commits.drain(&store, &key, &queue));
        }
        match answer.await {
            Ok(r) => r.map_err(Problem::from),
            Err(_) => {
                tracing::error!("an append's commit thread failed");
                Err(Problem::internal())
            }
        }
    }

    /// Commits the queue's jobs until it finds it empty.
    fn drain(&self, store: &Store, key: &(String, String), queue: &Arc<Queue>) {
        // If this thread panics, `draining` must not stay set with jobs waiting: the guard
        // clears it and fails whatever is queued (their requests answer 500).
        struct Stop<'a>(&'a Queue);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    let mut st = lock(&self.0.state);
                    st.draining = false;
                    st.jobs.clear();
                }
            }
        }
        let _stop = Stop(queue);
        loop {
            let jobs = {
                let mut st = lock(&queue.state);
                if st.jobs.is_empty() {
                    st.draining = false;
                    drop(st);
                    self.forget(key, queue);
                    return;
                }
                let n = st.jobs.len().min(REQUESTS_PER_COMMIT_MAX);
                st.jobs.drain(..n).collect::<Vec<Job>>()
            };
            self.metrics.commit(jobs.len());
            commit(store, &key.1, jobs, &self.watches);
        }
    }

    /// Removes an idle queue from the map (a request that holds it still finds it
    /// working: it starts a drain of its own).
    fn forget(&self, key: &(String, String), queue: &Arc<Queue>) {
        let mut m = lock(&self.queues);
        if m.get(key).is_some_and(|q| Arc::ptr_eq(q, queue)) {
            let idle = {
                let st = lock(&queue.state);
                st.jobs.is_empty() && !st.draining
            };
            if idle {
                m.remove(key);
            }
        }
    }
}

/// Commits jobs: those of one durability together (the usual case is all `sync`), in
/// their order, each answered with its own outcome.
/// The run's live tails are woken before the requests are answered (the events are
/// visible by then), as Redis serves its blocked readers before it replies to the writer.
fn commit(store: &Store, run: &str, jobs: Vec<Job>, watches: &WatchHub) {
    let mut rest = jobs.into_iter().peekable();
    while let Some(first) = rest.next() {
        let durability = first.durability;
        let mut group = vec![first];
        while let Some(j) = rest.next_if(|j| j.durability == durability) {
            group.push(j);
        }
        let (batches, replies): (Vec<_>, Vec<_>) = group
            .into_iter()
            .map(|j| ((j.events, j.expect_seq), j.reply))
            .unzip();
        let results = store.append_many(run, batches, durability);
        if results.iter().any(|r| r.is_ok()) {
            if let Ok(dir) = store.run_dir(run) {
                watches.wake_run(&dir);
            }
        }
        for (reply, r) in replies.into_iter().zip(results) {
            // A request whose client went away: nobody to answer.
            let _ = reply.send(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventType;
    use crate::query::options::ReadOptions;

    /// Concurrent requests of one run, committed by the queue: each gets its own outcome
    /// (one stale `expect_seq` is refused alone), seqs are gap-free, everything acknowledged
    /// is in the log once, and the idle queue leaves the map.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_appends_each_get_their_own_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            Store::open(dir.path())
                .unwrap()
                .with_user("u", true)
                .unwrap(),
        );
        let commits = Arc::new(Commits::new(
            Arc::default(),
            WatchHub::new(std::time::Duration::from_millis(50)),
        ));
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let (c, s) = (commits.clone(), store.clone());
            tasks.push(tokio::spawn(async move {
                let e = NewEvent::new(&format!("a{}", i % 4), EventType::Evidence, format!("e{i}"));
                // Request 7 asks for a seq the run cannot be at.
                let expect = (i == 7).then_some(1_000);
                let batch = if i % 5 == 0 {
                    vec![e.clone(), e]
                } else {
                    vec![e]
                };
                c.append(s, "r".into(), batch, expect, Durability::Sync)
                    .await
            }));
        }
        let mut seqs = Vec::new();
        for (i, t) in tasks.into_iter().enumerate() {
            match t.await.unwrap() {
                Ok(evs) => {
                    assert_ne!(i, 7, "the stale expect_seq was accepted");
                    assert_eq!(evs.len(), if i % 5 == 0 { 2 } else { 1 });
                    // A batch is atomic: consecutive seqs.
                    assert!(evs.windows(2).all(|w| w[1].seq == w[0].seq + 1));
                    seqs.extend(evs.iter().map(|e| e.seq));
                }
                Err(p) => {
                    assert_eq!(i, 7, "request {i} refused: {}", p.detail);
                    assert_eq!(p.status, 412);
                }
            }
        }
        seqs.sort_unstable();
        let n = seqs.len() as u64;
        assert_eq!(
            n,
            63 + 13,
            "13 of 64 requests carry two events; one (of one event) is refused"
        );
        assert_eq!(
            seqs,
            (1..=n).collect::<Vec<_>>(),
            "seqs gap-free, each once"
        );
        let stored: Vec<u64> = store
            .read("r", ReadOptions::default())
            .unwrap()
            .map(|e| e.unwrap().seq)
            .collect();
        assert_eq!(stored, seqs);
        // The drain answers its last requests before it finds the queue empty and
        // removes it: give it a moment after the last answer.
        let idle_since = std::time::Instant::now();
        while !lock(&commits.queues).is_empty()
            && idle_since.elapsed() < std::time::Duration::from_secs(5)
        {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert!(
            lock(&commits.queues).is_empty(),
            "an idle queue stays in the map"
        );
    }
}
