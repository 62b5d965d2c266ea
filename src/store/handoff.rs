//! The append hand-off: one process commits a run's durable appends for every process
//! of its user on the machine (issue 12).
//!
//! Processes that append to a run on their own take turns on its `LOCK` file, and
//! `flock` wakes every waiter when it is released: at 16 writer processes, most of the
//! CPU went to those wake-ups, and a fsync covered three events. So a process that
//! appends durably to a run for the second time, and finds nobody committing for it,
//! becomes its *committer*: it holds `<data>/<user>/.commit/<run>.lock` (`flock`,
//! released by the kernel when the process dies) and listens on `<run>.sock` beside it.
//! Every other process of the same user hands its `sync` appends to it over that
//! socket: one thread, the commit loop, reads every connection (`epoll`), checks each
//! request again, appends what it gathered with one call through the committer's own
//! writer (one `pwrite` and one `fdatasync` for the lot) and writes each answer once
//! durable. The committer's own `sync` appends join the same group. The log, its locks
//! and its invariants are unchanged: the committer is an ordinary writer, and any
//! process may still append directly (a `none` or `batch` append, a run's first append,
//! `SWARM_HANDOFF=0`).
//!
//! # A lost answer
//! A committer that is killed, or that closes its connections as its `Store` is dropped,
//! may leave a handed-off append without an answer. A committer thread processes every
//! request it read whole and answers it; a request it did not read whole is never
//! written. When the answer is lost the handing process cannot tell which happened, so
//! before handing anything over it gives every event without an id a generated one, and
//! it then retries through its own writer with `Request::recover_since` (the last seq it
//! knew was stored before it sent): under `LOCK`, the writer first looks for those ids in
//! the frames after that seq (a dead committer's frames stay in the file) and returns
//! the stored batch, made durable, rather than storing it again. So a lost answer costs a
//! scan, never a duplicate or a loss.
//!
//! # Wire format (`wire.rs`)
//! Each message is a little-endian `u32` length and that many bytes of JSON. The
//! committer first sends a [`Hello`]; then each request ([`Handed`]) gets one
//! [`Answer`]. Messages are at most [`MESSAGE_BYTES_MAX`]; the socket lives in the user's
//! directory (0700), and the committer checks the user named in each request and every
//! event again ([`Checked::recheck`]); the rules are checked by its writer, as for any
//! append.
//!
//! Invariant: a committer answers every request it read whole, and writes nothing else.
//! Invariant: a handed-off append is acknowledged only once durable, as a direct one.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::event::{Checked, Event, GENERATED_ID_PREFIX};
use crate::log::meta::{Durability, META_FILE};
use crate::log::storage::{OpenMode, StorageFile};
use crate::store::append::CheckedBatch;
use crate::store::cache::Bounded;
use crate::store::Store;
use looking::{LookDone, Looking};
use peer::{answer_wait, recovery_failed, same_account};

pub(crate) use self::wire::MESSAGE_BYTES_MAX;
use self::wire::{
    encode_msg, read_msg_timed, send_all, write_msg_within, Answer, Handed, HandedRef, Hello,
    WireError, WIRE_VERSION,
};
#[cfg(test)]
use self::wire::{read_msg, write_msg};

/// The directory of every run's committer lock (`<run>.lock`, held for as long as it
/// commits) and socket (`<run>.sock`), under the user's directory.
pub(crate) const RENDEZVOUS_DIR: &str = ".commit";
/// Most connections a committer serves at once; more are closed at once, and their
/// processes append directly.
const CONNECTIONS_MAX: usize = 256;
/// Most idle connections a handing process keeps per run.
const IDLE_MAX: usize = 64;
/// How long a process appends directly after it could not hand over, before it looks
/// for a committer again (or becomes one).
const DIRECT_FOR: Duration = Duration::from_millis(200);
/// Longest a handing process waits for a committer's answer (which includes its fsync).
const ANSWER_WAIT_MAX: Duration = Duration::from_secs(60);
/// Longest a committer spends writing one group's answers to clients that do not read
/// them (each connection past it gets one try that does not wait, and is shut if its
/// answer does not fit): however many such clients there are, the next group waits at
/// most this long for them.
const ANSWERS_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest a process waits for a committer's hello before appending directly.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest socket path `bind` takes (108 bytes with the final NUL on Linux).
const SOCKET_PATH_MAX: usize = 107;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How this process appends durably to one run.
#[derive(Clone)]
enum Route {
    /// It commits for the others; its own appends go to its writer.
    Commit(Arc<Committer>),
    /// It hands its appends to another process.
    Hand(Arc<Handing>),
    /// Directly, until then (no committer reachable).
    Direct(Instant),
    /// Directly: the process's first durable append to the run found no committer. A
    /// process becomes the committer at its second, so that one-shot commands (one
    /// append, then exit) never bind a socket only to close it.
    Seen,
    /// An append of this process is looking for the run's committer: the run's other
    /// appends wait for what it finds (other runs' do not).
    Looking(Arc<Looking>),
}

/// A route, as one append takes it.
enum Via {
    Hand(Arc<Handing>),
    Commit(Arc<Committer>),
    Direct,
}

/// What a store's hand-off did, over every run (see [`Store::handoff_counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HandoffCounters {
    /// Batches this process handed to another process and got an answer for.
    pub handed: u64,
    /// Batches whose answer was lost (the committer died or stopped) and that this
    /// process appended itself after a search.
    pub recovered: u64,
    /// Batches this process committed for itself and other processes as a committer.
    pub committed: u64,
}

/// A store's routes, one per run it appended to durably.
pub(crate) struct Routes {
    enabled: bool,
    handed: AtomicU64,
    recovered: AtomicU64,
    committed: Arc<AtomicU64>,
    /// At most the store's open runs ([`crate::Store::with_open_runs_max`]): past it,
    /// the committers and connections of the runs least recently appended to are let go.
    map: Mutex<Bounded<Route>>,
    /// Generated ids of handed-off events: `swarm:<nonce>.h<n>`.
    id_prefix: String,
    next_id: AtomicU64,
}

impl Routes {
    /// Routes of a store on `local` storage; off with `SWARM_HANDOFF=0`.
    pub(crate) fn new(local: bool, max: usize) -> Routes {
        use std::hash::{BuildHasher, Hasher};
        let nonce = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let off = std::env::var("SWARM_HANDOFF").is_ok_and(|v| v.trim() == "0");
        Routes {
            enabled: local && !off,
            handed: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
            committed: Arc::new(AtomicU64::new(0)),
            map: Mutex::new(Bounded::new(max)),
            id_prefix: format!("{GENERATED_ID_PREFIX}{nonce:016x}.h"),
            next_id: AtomicU64::new(0),
        }
    }

    /// Routes that always append directly (the committer's own store, engine jobs).
    pub(crate) fn off() -> Routes {
        let mut r = Routes::new(false, 1);
        r.enabled = false;
        r
    }

    fn counters(&self) -> HandoffCounters {
        HandoffCounters {
            handed: self.handed.load(Ordering::Relaxed),
            recovered: self.recovered.load(Ordering::Relaxed),
            committed: self.committed.load(Ordering::Relaxed),
        }
    }

    /// Stops every committer of this store: waits for the appends it is serving.
    pub(crate) fn shutdown(&self) {
        let routes = lock(&self.map).drain();
        Routes::close(routes);
    }

    /// Changes how many runs' routes are kept.
    pub(crate) fn set_max(&self, max: usize) {
        lock(&self.map).set_max(max);
    }

    /// Puts the route of `run`; routes let go past the bound are closed (a committer
    /// stops, answering what it gathered; idle connections close) once the map's lock
    /// is let go.
    fn insert(&self, mut map: MutexGuard<'_, Bounded<Route>>, run: &str, route: Route) {
        // A route an append holds (its `Via`) is in use; a committer's own thread holds
        // it too, for as long as it runs.
        let gone = map.insert(run, route, |r| match r {
            Route::Commit(c) => Arc::strong_count(c) <= 2,
            Route::Hand(h) => Arc::strong_count(h) == 1,
            Route::Direct(_) | Route::Seen => true,
            // (Its looker puts the route in anyway.)
            Route::Looking(_) => true,
        });
        drop(map);
        if gone.iter().any(|r| matches!(r, Route::Commit(_))) {
            // A committer stops after its group and its answers (up to a second for
            // clients that do not read): not on the thread of the append that pushed
            // it out. Until it has, its lock keeps its run's appends direct here.
            let spawned = std::thread::Builder::new()
                .name("swarm-commit-stop".into())
                .spawn(move || Routes::close(gone));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a thread to stop a committer");
            }
        }
    }

    fn close(routes: Vec<Route>) {
        for r in routes {
            if let Route::Commit(c) = r {
                c.stop();
            }
        }
    }
}

/// The committing side: one thread, the commit loop, that waits in `epoll` on the
/// listening socket, every connection and a wake-up `eventfd` for this process's own
/// appends; reads what every ready connection sent, checks it, and appends the lot with
/// one call (one `pwrite`, one `fdatasync`), then writes the answers. It then looks at
/// the sockets again without waiting: what arrived during the fsync is the next group.
/// (A reader thread per connection, before, cost every handed-off append one more
/// wake-up: the reader's, then the commit thread's, then the client's.)
pub(crate) struct Committer {
    socket: PathBuf,
    stop: AtomicBool,
    commit: Mutex<Option<JoinHandle<()>>>,
    queue: Mutex<Queue>,
    /// Wakes the commit loop in `epoll_wait`: an append of this process, or the stop.
    wake: OwnedFd,
    /// Held for the committer's life.
    lock: Mutex<Option<Box<dyn StorageFile>>>,
    /// The store's [`HandoffCounters::committed`].
    committed: Arc<AtomicU64>,
}

/// This process's own appends, waiting for the commit loop.
#[derive(Default)]
struct Queue {
    pending: Vec<Pending>,
    closing: bool,
    /// The commit loop waits in `epoll_wait`: the next push rings its `eventfd`. While
    /// it commits, pushes skip the wake-up (a system call each, most of a local append's
    /// overhead with many threads); it takes the queue again before it would wait.
    waiting: bool,
}

impl Queue {
    /// Queues a request; true when the commit loop must be woken for it.
    fn push(&mut self, p: Pending) -> bool {
        self.pending.push(p);
        std::mem::replace(&mut self.waiting, false)
    }
}

struct Pending {
    reply: Reply,
    /// (Its tails encoded by the appending thread for this process's own appends.)
    batch: CheckedBatch,
}

/// Where a queued request's outcome goes.
enum Reply {
    Socket(Arc<UnixStream>),
    Local(Arc<LocalSlot>),
}

/// A committing process's own append, waiting in its queue.
#[derive(Default)]
struct LocalSlot {
    result: Mutex<Option<LocalAnswer>>,
    done: Condvar,
}

/// A committed group's local waiters wake each other in a binary tree: the commit
/// thread wakes two, and the waiter at index `i` wakes `2i + 2` and `2i + 3`. Tens of
/// wake-ups (a futex call each) then run on every core, in parallel, and the commit
/// thread goes on to the next group after two.
type Wakes = (Arc<Vec<Arc<LocalSlot>>>, usize);

/// A local append's outcome, and its part of the group's wake-ups.
type LocalAnswer = (Result<Vec<Event>>, Option<Wakes>);

/// Wakes the waiters at `first` and `first + 1` of `list`.
fn wake_pair(list: &[Arc<LocalSlot>], first: usize) {
    for slot in list.iter().skip(first).take(2) {
        slot.done.notify_one();
    }
}

/// The commit loop's `epoll` tokens: its `eventfd`, the listening socket, then one per
/// connection.
const WAKE: u64 = 0;
const LISTENING: u64 = 1;
/// Most bytes the commit loop reads from one connection in one turn (the rest waits for
/// the next turn: `epoll` reports it again), so that no client holds the others' group.
const READ_PER_TURN: usize = 1 << 20;
/// Most bytes of partial messages the commit loop holds over all its connections: a
/// connection whose read would pass it is ended (its process recovers its batch and
/// appends directly), so that 256 connections trickling 16 MiB messages cannot pin 4 GiB.
/// (16 MiB in unit tests, so that one can pass it.)
const BUFFERED_MAX: usize = if cfg!(test) { 16 << 20 } else { 256 << 20 };
/// How long the loop leaves the listening socket alone after `accept` failed (out of
/// file descriptors, say): not a busy loop.
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);

/// A connection of a handing process, in the commit loop.
struct Conn {
    stream: Arc<UnixStream>,
    /// Bytes read that are not a whole message yet.
    buf: Vec<u8>,
}

/// The commit loop's own state: the sockets, and the group it gathers.
struct Gather {
    epoll: OwnedFd,
    listener: UnixListener,
    /// Until when the listening socket is out of the `epoll` set.
    accept_paused: Option<Instant>,
    conns: HashMap<u64, Conn>,
    next_token: u64,
    group: Vec<Pending>,
    scratch: Vec<u8>,
    /// Bytes held in every connection's `buf` (partial messages), at most
    /// `BUFFERED_MAX`.
    buffered: usize,
}

/// Ends a committer whose commit loop panicked: without it, everything queued and every
/// client would wait forever. Clients see their connection end as the loop's state
/// unwinds (and recover their batch); this process's own queued appends get an error.
struct CommitGuard<'a>(&'a Committer);

impl Drop for CommitGuard<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let c = self.0;
        c.stop.store(true, Ordering::Release);
        let mut held = lock(&c.lock);
        if held.is_some() {
            let _ = std::fs::remove_file(&c.socket);
        }
        let pending = {
            let mut q = lock(&c.queue);
            q.closing = true;
            std::mem::take(&mut q.pending)
        };
        for p in pending {
            fail_local(p.reply);
        }
        // Another process may commit for the run now (this one appends directly).
        if let Some(l) = held.take() {
            let _ = l.unlock();
        }
    }
}

/// Answers a local append queued or in flight when the commit loop panicked: its
/// outcome is unknown, as after a timeout. (A socket's reply is left to the connection's
/// end: the client recovers its batch.)
fn fail_local(reply: Reply) {
    if let Reply::Local(slot) = reply {
        let e = Error::Io {
            op: "commit",
            path: std::path::PathBuf::new(),
            source: std::io::Error::other(
                "the commit thread failed (a bug: it panicked): whether this append is stored is unknown (read the run, or append again with the same id)",
            ),
        };
        *lock(&slot.result) = Some((Err(e), None));
        slot.done.notify_one();
    }
}

/// A group's replies while it commits. If the commit panics, the group's local waiters
/// are answered with an error as it unwinds (they would wait for ever); handing
/// processes see their connection end and recover their batches.
struct InFlight(Vec<Reply>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for reply in self.0.drain(..) {
            fail_local(reply);
        }
    }
}

/// A test's way to make the next commit of the committer on this socket panic
/// (`CommitGuard`, `InFlight`).
#[cfg(test)]
static PANIC_IN_NEXT_COMMIT: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Answers a committed group's requests, in their order.
fn answer_all(answers: Vec<(Reply, Result<Vec<Event>>)>) {
    let mut locals = Vec::new();
    let mut sockets = Vec::new();
    for (reply, r) in answers {
        match reply {
            Reply::Local(slot) => locals.push((slot, r)),
            Reply::Socket(s) => sockets.push((s, r)),
        }
    }
    // This process's waiters first: they wake each other while the sockets are written.
    if !locals.is_empty() {
        let list: Arc<Vec<Arc<LocalSlot>>> =
            Arc::new(locals.iter().map(|(s, _)| s.clone()).collect());
        for (i, (slot, r)) in locals.into_iter().enumerate() {
            *lock(&slot.result) = Some((r, Some((list.clone(), i))));
        }
        wake_pair(&list, 0);
    }
    let deadline = Instant::now() + ANSWERS_WRITE_TIMEOUT;
    for (s, r) in sockets {
        let answer = match r {
            Ok(events) => Answer::Stored(events),
            Err(e) => Answer::Refused(e.into()),
        };
        // A write that fails (a connection gone, or a client that stopped reading) ends
        // the connection: the loop sees its end at its next turn.
        let left = deadline.saturating_duration_since(Instant::now());
        if write_msg_within(&s, &answer, left).is_err() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

impl Committer {
    fn start(
        store: Arc<Store>,
        run: &str,
        socket: PathBuf,
        held: Box<dyn StorageFile>,
        committed: Arc<AtomicU64>,
    ) -> Result<Arc<Committer>> {
        use rustix::event::{epoll, eventfd, EventfdFlags};
        // A committer that died left its socket behind; the lock says it is gone.
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).map_err(io_err("bind", &socket))?;
        listener
            .set_nonblocking(true)
            .map_err(io_err("bind", &socket))?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| io_err("eventfd", &socket)(e.into()))?;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)
            .map_err(|e| io_err("epoll", &socket)(e.into()))?;
        for (fd, token) in [(wake.as_fd(), WAKE), (listener.as_fd(), LISTENING)] {
            epoll::add(
                &ep,
                fd,
                epoll::EventData::new_u64(token),
                epoll::EventFlags::IN,
            )
            .map_err(|e| io_err("epoll", &socket)(e.into()))?;
        }
        let c = Arc::new(Committer {
            socket,
            stop: AtomicBool::new(false),
            commit: Mutex::new(None),
            queue: Mutex::new(Queue::default()),
            wake,
            lock: Mutex::new(Some(held)),
            committed,
        });
        let gather = Gather {
            epoll: ep,
            listener,
            accept_paused: None,
            conns: HashMap::new(),
            next_token: LISTENING + 1,
            group: Vec::new(),
            scratch: vec![0; 64 << 10],
            buffered: 0,
        };
        let (me, r) = (c.clone(), run.to_string());
        let h = std::thread::Builder::new()
            .name("swarm-commit".into())
            .spawn(move || me.commit_loop(&store, &r, gather))
            .map_err(io_err("spawn", &c.socket))?;
        *lock(&c.commit) = Some(h);
        Ok(c)
    }

    /// Wakes the commit loop.
    fn ring(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Gathers and commits groups until the committer stops: then commits what it
    /// gathered and this process's queue, answers, and ends (its connections close:
    /// a client whose request was not read whole sees the end and recovers it).
    fn commit_loop(&self, store: &Store, run: &str, mut g: Gather) {
        use rustix::event::{epoll, Timespec};
        let _guard = CommitGuard(self);
        let mut ready: Vec<epoll::Event> = Vec::with_capacity(CONNECTIONS_MAX + 2);
        loop {
            if let Some(until) = g.accept_paused {
                if Instant::now() >= until {
                    g.accept_paused = None;
                    let _ = epoll::add(
                        &g.epoll,
                        &g.listener,
                        epoll::EventData::new_u64(LISTENING),
                        epoll::EventFlags::IN,
                    );
                }
            }
            // Wait only with nothing gathered and nothing queued.
            let wait = g.group.is_empty() && {
                let mut q = lock(&self.queue);
                q.waiting = q.pending.is_empty() && !q.closing;
                q.waiting
            };
            let timeout = match (wait, g.accept_paused) {
                (false, _) => Some(Duration::ZERO),
                (true, None) => None,
                (true, Some(until)) => Some(until.saturating_duration_since(Instant::now())),
            };
            let ts = timeout.map(|t| Timespec {
                tv_sec: t.as_secs() as i64,
                tv_nsec: t.subsec_nanos() as i64,
            });
            ready.clear();
            match epoll::wait(
                &g.epoll,
                rustix::buffer::spare_capacity(&mut ready),
                ts.as_ref(),
            ) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => panic!("epoll_wait on a committer's sockets: {e}"),
            }
            let stopping = self.stop.load(Ordering::Acquire);
            for ev in &ready {
                let data = ev.data;
                match data.u64() {
                    WAKE => {
                        let mut b = [0u8; 8];
                        let _ = rustix::io::read(&self.wake, &mut b);
                    }
                    _ if stopping => {}
                    LISTENING => self.accept_all(store, run, &mut g),
                    token => self.read_conn(store, token, &mut g),
                }
            }
            let closing = {
                let mut q = lock(&self.queue);
                q.waiting = false;
                g.group.append(&mut q.pending);
                q.closing
            };
            if !g.group.is_empty() {
                let group = std::mem::take(&mut g.group);
                self.commit(store, run, group);
            }
            if closing {
                return;
            }
        }
    }

    /// Accepts every waiting connection: greets it and watches it.
    fn accept_all(&self, store: &Store, run: &str, g: &mut Gather) {
        use rustix::event::epoll;
        loop {
            let s = match g.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "a committer cannot accept connections");
                    let _ = epoll::delete(&g.epoll, &g.listener);
                    g.accept_paused = Some(Instant::now() + ACCEPT_PAUSE);
                    return;
                }
            };
            if g.conns.len() >= CONNECTIONS_MAX || !same_account(&s) {
                // Dropped: the other side appends directly. (Only this account's
                // processes hand over, whatever the directories' modes.)
                continue;
            }
            // Any seq stored before the hello (the durable mark's, read without waiting
            // for the writer, which may be waiting for `LOCK`): a lost answer's batch
            // comes after.
            let head = store
                .writer(run, store.user())
                .map_or(0, |l| l.durable_seq());
            let hello = Hello {
                v: WIRE_VERSION,
                user: store.user().to_string(),
                head,
                pid: std::process::id(),
            };
            // (A new connection's buffer is empty: the hello never waits.)
            if s.set_nonblocking(true).is_err()
                || write_msg_within(&s, &hello, Duration::ZERO).is_err()
            {
                continue;
            }
            let token = g.next_token;
            g.next_token += 1;
            let watched = epoll::add(
                &g.epoll,
                &s,
                epoll::EventData::new_u64(token),
                epoll::EventFlags::IN,
            );
            if watched.is_ok() {
                g.conns.insert(
                    token,
                    Conn {
                        stream: Arc::new(s),
                        buf: Vec::new(),
                    },
                );
            }
        }
    }

    /// Reads what a connection sent; checks every whole request and gathers it (or
    /// answers its refusal). A connection that ended, failed or sent a message over the
    /// limit is closed: its partial request is never written.
    fn read_conn(&self, store: &Store, token: u64, g: &mut Gather) {
        // (An event for a connection closed earlier in this turn.)
        let Some(c) = g.conns.get_mut(&token) else {
            return;
        };
        let mut end = false;
        let mut got = 0;
        while got < READ_PER_TURN {
            match (&*c.stream).read(&mut g.scratch) {
                Ok(0) => {
                    end = true;
                    break;
                }
                Ok(n) if g.buffered + n > BUFFERED_MAX => {
                    end = true;
                    break;
                }
                Ok(n) => {
                    c.buf.extend_from_slice(&g.scratch[..n]);
                    g.buffered += n;
                    got += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    end = true;
                    break;
                }
            }
        }
        let mut at = 0;
        while let Some(len) = c.buf.get(at..at + 4) {
            let n = u32::from_le_bytes(len.try_into().expect("four bytes")) as usize;
            if n > MESSAGE_BYTES_MAX {
                end = true;
                break;
            }
            let Some(body) = c.buf.get(at + 4..at + 4 + n) else {
                break;
            };
            at += 4 + n;
            let checked = serde_json::from_slice::<Handed>(body)
                .map_err(|e| Error::invalid("handoff", format!("bad request: {e}")))
                .and_then(|h| Ok((store.check_handed(h.user, h.events)?, h.expect_seq)));
            match checked {
                Ok((batch, expect_seq)) => g.group.push(Pending {
                    reply: Reply::Socket(c.stream.clone()),
                    batch: CheckedBatch::new(batch, expect_seq),
                }),
                Err(e) => {
                    // Not waited for: a client that sends refused requests without reading
                    // their answers must not stall everyone's commits (its connection ends).
                    let refused = Answer::Refused(e.into());
                    if write_msg_within(&c.stream, &refused, Duration::ZERO).is_err() {
                        end = true;
                        break;
                    }
                }
            }
        }
        c.buf.drain(..at);
        g.buffered -= at;
        if c.buf.capacity() > READ_PER_TURN && c.buf.len() < c.buf.capacity() / 4 {
            // A large batch's buffer is not kept for the connection's life, nor behind
            // the few bytes of the next message (`buffered` counts bytes held, and the
            // capacity stays within twice them).
            c.buf.shrink_to(c.buf.len());
        }
        if end {
            let _ = rustix::event::epoll::delete(&g.epoll, &*c.stream);
            if let Some(c) = g.conns.remove(&token) {
                g.buffered -= c.buf.len();
            }
        }
    }

    /// Appends a group with one call and answers each of its requests.
    fn commit(&self, store: &Store, run: &str, group: Vec<Pending>) {
        let (replies, batches): (Vec<Reply>, Vec<_>) =
            group.into_iter().map(|p| (p.reply, Ok(p.batch))).unzip();
        let mut in_flight = InFlight(replies);
        #[cfg(test)]
        if lock(&PANIC_IN_NEXT_COMMIT)
            .take_if(|p| *p == self.socket)
            .is_some()
        {
            panic!("a commit panics (injected by a test)");
        }
        let results = store.append_many_checked(run, batches, Durability::Sync);
        let replies = std::mem::take(&mut in_flight.0);
        // (Asked of the writer: its refusals are `Poisoned`, but the appends it wrote
        // before an fsync failed get that fsync's error.)
        if results.iter().any(Result::is_err)
            && store
                .writer(run, store.user())
                .is_ok_and(|l| l.is_poisoned())
        {
            // This process cannot commit any more: nobody new connects to it; the
            // connected ones append directly on its refusals.
            let _ = std::fs::remove_file(&self.socket);
        }
        self.committed
            .fetch_add(results.len() as u64, Ordering::Relaxed);
        // Answered here, not by a second thread: one tried (the next group's fsync
        // overlapping the last one's answers) made smaller groups and was 10-25 %
        // slower on two cores.
        answer_all(replies.into_iter().zip(results).collect());
    }

    /// Commits an append of this process in the same groups as the handed-off ones
    /// (one stream of fsyncs, not two). `Err` gives the batch back once the committer
    /// is closing.
    fn commit_local(
        &self,
        batch: Vec<Checked>,
        expect_seq: Option<u64>,
    ) -> std::result::Result<Result<Vec<Event>>, Vec<Checked>> {
        let slot = Arc::new(LocalSlot::default());
        // Encoded here, in the appending thread: the committing thread is the one every
        // append of the run waits on (at 64 threads, a third of its time per group went
        // to encoding).
        let tails = batch.iter().map(Checked::encode_tail).collect();
        let wake = {
            let mut q = lock(&self.queue);
            if q.closing {
                return Err(batch);
            }
            q.push(Pending {
                reply: Reply::Local(slot.clone()),
                batch: CheckedBatch {
                    events: batch,
                    expect_seq,
                    tails,
                },
            })
        };
        if wake {
            self.ring();
        }
        let mut r = lock(&slot.result);
        loop {
            if let Some((r, wakes)) = r.take() {
                if let Some((list, i)) = wakes {
                    // Its part of the group's wake-ups (it may have found its answer
                    // before sleeping: the ones after it wait all the same).
                    wake_pair(&list, 2 * i + 2);
                }
                return Ok(r);
            }
            r = slot.done.wait(r).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Stops: reads nothing more, commits and answers what was read whole and queued,
    /// closes every connection and the listening socket (a client connecting then is
    /// refused and appends directly), removes the socket's path, and lets the lock go.
    fn stop(&self) {
        {
            // Both at once: the loop, which reads nothing once it sees `stop`, ends in
            // the turn it sees them (level-triggered, it would spin in between).
            let mut q = lock(&self.queue);
            q.closing = true;
            self.stop.store(true, Ordering::Release);
        }
        self.ring();
        {
            // Only while this committer holds the run's lock is the socket its own: after
            // a panic it let the lock go, and another committer may listen there now.
            let held = lock(&self.lock);
            if held.is_some() {
                let _ = std::fs::remove_file(&self.socket);
            }
        }
        if let Some(h) = lock(&self.commit).take() {
            let _ = h.join();
        }
        if let Some(l) = lock(&self.lock).take() {
            let _ = l.unlock();
        }
    }
}

/// The handing side: idle connections to the run's committer.
pub(crate) struct Handing {
    socket: PathBuf,
    idle: Mutex<Vec<(UnixStream, u64)>>,
    /// The highest seq the committer acknowledged to this process.
    acked: AtomicU64,
}

/// What became of a handed-off batch.
enum Sent {
    Answered(Result<Vec<Event>>),
    /// Not sent, the committer unreachable: append directly, for a while.
    Unsent,
    /// Not sent, over [`MESSAGE_BYTES_MAX`]: this batch is appended directly, the route
    /// stays.
    TooLarge,
    /// Sent, answer lost: recover, searching after this seq. `false`: the committer
    /// answered that it wrote nothing (its writer is poisoned).
    Lost(u64, bool),
    /// Sent, and no answer within `answer_wait()`: the committer is alive (or was) but
    /// stopped; the outcome is unknown.
    Stuck,
}

impl Handing {
    fn connect(socket: &Path, user: &str) -> std::io::Result<(UnixStream, u64)> {
        let s = UnixStream::connect(socket)?;
        if !same_account(&s) {
            // Events are handed only to a process of this account.
            return Err(std::io::Error::other(
                "the committer's socket belongs to another account",
            ));
        }
        // Nothing is sent before the hello: a committer that does not greet in time is
        // left alone, safely.
        s.set_read_timeout(Some(HELLO_TIMEOUT))?;
        let hello: Hello = match read_msg_timed(&s, HELLO_TIMEOUT)? {
            Some(b) => serde_json::from_slice(&b).map_err(std::io::Error::other)?,
            None => return Err(std::io::ErrorKind::UnexpectedEof.into()),
        };
        if hello.v != WIRE_VERSION || hello.user != user {
            return Err(std::io::Error::other(format!(
                "committer pid {} speaks version {} for user {:?}",
                hello.pid, hello.v, hello.user
            )));
        }
        s.set_read_timeout(None)?;
        Ok((s, hello.head))
    }

    fn hand(&self, user: &str, batch: &[Checked], expect_seq: Option<u64>) -> Sent {
        let req = HandedRef {
            user,
            expect_seq,
            events: batch,
        };
        // Too large to hand over (nothing sent): appended directly.
        let Some(msg) = encode_msg(&req) else {
            return Sent::TooLarge;
        };
        // An idle connection the committer closed (it stopped) is readable: not used, so
        // that a committer's orderly exit costs no recovery.
        let conn = loop {
            let Some((s, head)) = lock(&self.idle).pop() else {
                break None;
            };
            let mut fds = [rustix::event::PollFd::new(&s, rustix::event::PollFlags::IN)];
            let zero = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            if matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0)) {
                break Some((s, head));
            }
        };
        let (s, head) = match conn {
            Some(c) => c,
            None => match Handing::connect(&self.socket, user) {
                Ok(c) => c,
                Err(_) => return Sent::Unsent,
            },
        };
        let since = head.max(self.acked.load(Ordering::Acquire));
        if send_all(&s, &msg, None).is_err() {
            return Sent::Lost(since, true);
        }
        // A committer that does not answer (stopped: `SIGSTOP`, a frozen container, a
        // debugger) holds this append for no longer than `answer_wait`. It may still
        // write it when it goes on, so the outcome is unknown (a recovery now could
        // miss a frame written after it looked); the connection is closed.
        let body = match read_msg_timed(&s, answer_wait(&self.socket)) {
            Ok(Some(b)) => b,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                let _ = s.shutdown(std::net::Shutdown::Both);
                return Sent::Stuck;
            }
            _ => return Sent::Lost(since, true),
        };
        let answer: Answer = match serde_json::from_slice(&body) {
            Ok(a) => a,
            Err(_) => return Sent::Lost(since, true),
        };
        let mut idle = lock(&self.idle);
        if idle.len() < IDLE_MAX {
            idle.push((s, head));
        }
        drop(idle);
        match answer {
            Answer::Stored(events) => {
                if let Some(top) = events.iter().map(|e| e.seq).max() {
                    self.acked.fetch_max(top, Ordering::AcqRel);
                }
                Sent::Answered(Ok(events))
            }
            // The committer's writer refuses everything after a failed fsync of its
            // own; it wrote nothing of this batch: appended directly (this process's
            // writer is not poisoned).
            Answer::Refused(WireError::Poisoned { .. }) => Sent::Lost(since, false),
            Answer::Refused(e) => Sent::Answered(Err(e.into())),
        }
    }
}

impl Store {
    /// What this store's append hand-off did so far, over every run.
    pub fn handoff_counters(&self) -> HandoffCounters {
        self.handoff.counters()
    }

    /// Hands a `sync` batch to the run's committer when another process is one. `Err`
    /// gives the batch back, to append directly (this process commits, no committer is
    /// reachable, the run is new, or the batch holds engine events).
    pub(crate) fn hand_off(
        &self,
        run: &str,
        mut batch: Vec<Checked>,
        expect_seq: Option<u64>,
    ) -> std::result::Result<Result<Vec<Event>>, Vec<Checked>> {
        if !self.handoff.enabled
            || run.starts_with('@')
            || !batch.iter().all(|c| c.kind.is_client())
        {
            return Err(batch);
        }
        let h = match self.route(run) {
            Via::Hand(h) => h,
            Via::Commit(c) => return c.commit_local(batch, expect_seq),
            Via::Direct => return Err(batch),
        };
        for c in &mut batch {
            if c.id.is_none() {
                let n = self.handoff.next_id.fetch_add(1, Ordering::Relaxed);
                c.id = Some(format!("{}{n}", self.handoff.id_prefix));
            }
        }
        match h.hand(&self.user, &batch, expect_seq) {
            Sent::Answered(r) => {
                self.handoff.handed.fetch_add(1, Ordering::Relaxed);
                Ok(r)
            }
            Sent::Unsent => {
                self.go_direct(run);
                Err(batch)
            }
            Sent::TooLarge => Err(batch),
            Sent::Stuck => {
                self.go_direct(run);
                Ok(Err(Error::Io {
                    op: "append",
                    path: PathBuf::from(run),
                    source: std::io::Error::other(format!(
                        "the run's committer process has not answered in {:?}: whether this append is stored is unknown (read the run)",
                        answer_wait(&h.socket)
                    )),
                }))
            }
            Sent::Lost(since, maybe_stored) => {
                self.go_direct(run);
                tracing::info!(
                    run,
                    since,
                    "committer gone with an append in flight; recovering it"
                );
                let r = self
                    .append_recovered(run, batch, expect_seq, since)
                    .map_err(|e| match maybe_stored {
                        true => recovery_failed(run, e),
                        false => e,
                    });
                self.handoff.recovered.fetch_add(1, Ordering::Relaxed);
                Ok(r)
            }
        }
    }

    fn go_direct(&self, run: &str) {
        let map = lock(&self.handoff.map);
        self.handoff
            .insert(map, run, Route::Direct(Instant::now() + DIRECT_FOR));
    }

    /// Whether this process hands its appends to `run` to a committer (which only
    /// commits for a run that exists).
    pub(crate) fn hands_off(&self, run: &str) -> bool {
        matches!(lock(&self.handoff.map).peek(run), Some(Route::Hand(_)))
    }

    /// Where this process's `sync` appends to `run` go.
    fn route(&self, run: &str) -> Via {
        let mut map = lock(&self.handoff.map);
        let may_commit = match map.get(run) {
            Some(Route::Hand(h)) => return Via::Hand(h),
            Some(Route::Commit(c)) => return Via::Commit(c),
            Some(Route::Direct(until)) if Instant::now() < until => return Via::Direct,
            Some(Route::Direct(_) | Route::Seen) => true,
            Some(Route::Looking(l)) => {
                drop(map);
                return match l.wait() {
                    true => self.route(run),
                    // (A look that takes this long: directly meanwhile.)
                    false => Via::Direct,
                };
            }
            None => false,
        };
        // Found without the map's lock: connecting waits up to `HELLO_TIMEOUT` for a
        // committer, and every other run's appends take that lock (one slow committer
        // stalled them all). Meanwhile this run's other appends wait for it.
        let looking = Arc::new(Looking::default());
        self.handoff
            .insert(map, run, Route::Looking(looking.clone()));
        let _done = LookDone(looking.clone());
        let found = self.find_route(run, may_commit);
        let map = lock(&self.handoff.map);
        if !matches!(map.peek(run), Some(Route::Looking(l)) if Arc::ptr_eq(l, &looking)) {
            // Its place was taken in the meantime (pushed out of the map, and a route
            // found since): what is there stays, this one is let go.
            drop(map);
            if let Some(r @ Route::Commit(_)) = found {
                Routes::close(vec![r]);
            }
            return self.route(run);
        }
        let Some(route) = found else {
            // (No run yet: as before the look, so that the next append looks again.)
            if may_commit {
                self.handoff.insert(map, run, Route::Seen);
            } else {
                let mut map = map;
                map.remove(run);
            }
            return Via::Direct;
        };
        let via = match &route {
            Route::Hand(h) => Via::Hand(h.clone()),
            Route::Commit(c) => Via::Commit(c.clone()),
            Route::Direct(_) | Route::Seen | Route::Looking(_) => Via::Direct,
        };
        self.handoff.insert(map, run, route);
        via
    }

    /// Where a run's committer meets the others: its lock and its socket, in
    /// `<data>/<user>/.commit/` (outside the run's directory, which holds only the log
    /// and its marks: archives, `verify` and backups never meet a socket).
    fn rendezvous(&self, run: &str) -> Result<(PathBuf, PathBuf, PathBuf)> {
        crate::event::check_run_id(run)?;
        let dir = self.root().join(self.user()).join(RENDEZVOUS_DIR);
        let lock = dir.join(format!("{run}.lock"));
        let socket = dir.join(format!("{run}.sock"));
        Ok((dir, lock, socket))
    }

    /// The route to take now and keep; `None` for this append only (a run not created
    /// yet: created directly, under `LOCK`, and looked at again on the next append).
    /// Connects to the run's committer if there is one; else, with `may_commit`, becomes
    /// it.
    fn find_route(&self, run: &str, may_commit: bool) -> Option<Route> {
        let direct = Some(Route::Direct(Instant::now() + DIRECT_FOR));
        let run_dir = self.run_dir(run).ok()?;
        if !self.storage.exists(&run_dir.join(META_FILE)) {
            return None;
        }
        let (dir, lock_path, socket) = self.rendezvous(run).ok()?;
        if socket.as_os_str().len() > SOCKET_PATH_MAX {
            return Some(Route::Direct(Instant::now() + Duration::from_secs(3600)));
        }
        if let Ok(conn) = Handing::connect(&socket, &self.user) {
            return Some(Route::Hand(Arc::new(Handing {
                socket,
                idle: Mutex::new(vec![conn]),
                acked: AtomicU64::new(0),
            })));
        }
        if !may_commit {
            return Some(Route::Seen);
        }
        if self.storage.create_dir_all(&dir).is_err() {
            return direct;
        }
        let Ok(held) = self.storage.open(&lock_path, OpenMode::ReadWriteCreate) else {
            return direct;
        };
        match held.try_lock() {
            Ok(true) => {
                let store = Arc::new(self.committing_store());
                match Committer::start(store, run, socket, held, self.handoff.committed.clone()) {
                    Ok(c) => Some(Route::Commit(c)),
                    Err(e) => {
                        tracing::warn!(run, error = %e, "cannot commit for other processes");
                        direct
                    }
                }
            }
            // Another process holds the lock but does not answer yet (starting, or
            // stopping): directly for now.
            Ok(false) | Err(_) => direct,
        }
    }

    /// A handed-off batch, in the committer: every event checked again, for this
    /// store's user.
    fn check_handed(&self, user: String, events: Vec<Checked>) -> Result<Vec<Checked>> {
        if user != self.user {
            return Err(Error::Forbidden(format!(
                "the committing process acts for user {:?}, not {user:?}",
                self.user
            )));
        }
        if events.is_empty() || events.len() > crate::event::BATCH_EVENTS_MAX {
            return Err(Error::invalid(
                "batch",
                format!(
                    "{} events, limit 1..={}",
                    events.len(),
                    crate::event::BATCH_EVENTS_MAX
                ),
            ));
        }
        let mut batch = Vec::with_capacity(events.len());
        for c in events {
            let c = c.recheck()?;
            if c.user_id != self.user {
                return Err(Error::Forbidden(format!(
                    "event names user {:?} but the caller is {:?}",
                    c.user_id, self.user
                )));
            }
            batch.push(c);
        }
        Ok(batch)
    }
}

mod looking;
mod peer;
#[cfg(test)]
mod tests;
mod wire;
