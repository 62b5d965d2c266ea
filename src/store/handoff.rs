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
//! socket: a reader thread per connection checks each request again and queues it; one
//! commit thread appends everything queued with one call through the committer's own
//! writer (one `pwrite` and one `fdatasync` for the lot) and writes each answer once
//! durable. The committer's own `sync` appends join the same queue. The log, its locks
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
//! # Wire format
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
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::event::{Checked, Event, GENERATED_ID_PREFIX};
use crate::log::meta::{Durability, META_FILE};
use crate::log::storage::{OpenMode, StorageFile};
use crate::store::Store;

/// The directory of every run's committer lock (`<run>.lock`, held for as long as it
/// commits) and socket (`<run>.sock`), under the user's directory.
pub(crate) const RENDEZVOUS_DIR: &str = ".commit";
/// Largest message either way.
pub(crate) const MESSAGE_BYTES_MAX: usize = 64 << 20;
/// Most connections a committer serves at once (one thread each); more get appended
/// directly.
const CONNECTIONS_MAX: usize = 256;
/// Most idle connections a handing process keeps per run.
const IDLE_MAX: usize = 64;
/// How long a process appends directly after it could not hand over, before it looks
/// for a committer again (or becomes one).
const DIRECT_FOR: Duration = Duration::from_millis(200);
/// Longest a committer waits to write an answer to a client that does not read.
const ANSWER_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a process waits for a committer's hello before appending directly.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest socket path `bind` takes (108 bytes with the final NUL on Linux).
const SOCKET_PATH_MAX: usize = 107;
const WIRE_VERSION: u32 = 1;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sent by the committer when it accepts a connection.
#[derive(Serialize, Deserialize)]
struct Hello {
    v: u32,
    user: String,
    /// The last seq its writer has seen: a lost answer is searched for after it.
    head: u64,
    pid: u32,
}

/// A handed-off atomic batch.
#[derive(Serialize, Deserialize)]
struct Handed {
    user: String,
    expect_seq: Option<u64>,
    events: Vec<Checked>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    Stored(Vec<Event>),
    Refused(WireError),
}

/// An [`Error`] on the wire.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum WireError {
    Invalid {
        field: String,
        reason: String,
    },
    RunNotFound {
        run: String,
    },
    SeqConflict {
        run: String,
        expected: u64,
        actual: u64,
    },
    Forbidden {
        why: String,
    },
    Conflict {
        why: String,
    },
    Escalated {
        subject: String,
        escalation: u64,
    },
    Corrupt {
        path: PathBuf,
        offset: u64,
        seq: u64,
        reason: String,
    },
    Poisoned {
        run: String,
    },
    External {
        why: String,
    },
    Io {
        op: String,
        path: PathBuf,
        message: String,
    },
}

impl From<Error> for WireError {
    fn from(e: Error) -> WireError {
        match e {
            Error::Invalid { field, reason } => WireError::Invalid { field, reason },
            Error::RunNotFound(run) => WireError::RunNotFound { run },
            Error::SeqConflict {
                run,
                expected,
                actual,
            } => WireError::SeqConflict {
                run,
                expected,
                actual,
            },
            Error::Forbidden(why) => WireError::Forbidden { why },
            Error::Conflict(why) => WireError::Conflict { why },
            Error::Escalated {
                subject,
                escalation,
            } => WireError::Escalated {
                subject,
                escalation,
            },
            Error::Corrupt {
                path,
                offset,
                seq,
                reason,
            } => WireError::Corrupt {
                path,
                offset,
                seq,
                reason,
            },
            Error::Poisoned(run) => WireError::Poisoned { run },
            Error::External(why) => WireError::External { why },
            Error::Io { op, path, source } => WireError::Io {
                op: op.to_string(),
                path,
                message: source.to_string(),
            },
        }
    }
}

impl From<WireError> for Error {
    fn from(e: WireError) -> Error {
        match e {
            WireError::Invalid { field, reason } => Error::Invalid { field, reason },
            WireError::RunNotFound { run } => Error::RunNotFound(run),
            WireError::SeqConflict {
                run,
                expected,
                actual,
            } => Error::SeqConflict {
                run,
                expected,
                actual,
            },
            WireError::Forbidden { why } => Error::Forbidden(why),
            WireError::Conflict { why } => Error::Conflict(why),
            WireError::Escalated {
                subject,
                escalation,
            } => Error::Escalated {
                subject,
                escalation,
            },
            WireError::Corrupt {
                path,
                offset,
                seq,
                reason,
            } => Error::Corrupt {
                path,
                offset,
                seq,
                reason,
            },
            WireError::Poisoned { run } => Error::Poisoned(run),
            WireError::External { why } => Error::External(why),
            WireError::Io { op, path, message } => Error::Io {
                op: "append (in the committing process)",
                path,
                source: std::io::Error::other(format!("{op}: {message}")),
            },
        }
    }
}

/// A message as it goes on the wire; `None` when over [`MESSAGE_BYTES_MAX`].
fn encode_msg(msg: &impl Serialize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4];
    serde_json::to_writer(&mut buf, msg).ok()?;
    let n = buf.len() - 4;
    if n > MESSAGE_BYTES_MAX {
        return None;
    }
    buf[..4].copy_from_slice(&(n as u32).to_le_bytes());
    Some(buf)
}

fn write_msg(s: &UnixStream, msg: &impl Serialize) -> std::io::Result<()> {
    let buf = encode_msg(msg)
        .ok_or_else(|| std::io::Error::other(format!("message over {MESSAGE_BYTES_MAX} bytes")))?;
    send_all(s, &buf)
}

/// Writes all of `buf` with `send(MSG_NOSIGNAL)`: a peer that went away is an `EPIPE`
/// error, never a `SIGPIPE`, which kills a process that does not ignore it (Rust's
/// runtime ignores it, but a host that embeds the library may not). A write timeout
/// (`SO_SNDTIMEO`) ends it with `WouldBlock`, as `write_all` does.
fn send_all(s: &UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match rustix::net::send(s, buf, rustix::net::SendFlags::NOSIGNAL) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// [`read_msg`], waiting at most `limit` for it to begin.
fn read_msg_timed(s: &UnixStream, limit: Duration) -> std::io::Result<Option<Vec<u8>>> {
    let ts = rustix::event::Timespec {
        tv_sec: limit.as_secs() as i64,
        tv_nsec: limit.subsec_nanos() as i64,
    };
    let mut fds = [rustix::event::PollFd::new(s, rustix::event::PollFlags::IN)];
    if rustix::event::poll(&mut fds, Some(&ts))? == 0 {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    read_msg(s)
}

/// The next message, or `None` at the end of the stream before one began.
fn read_msg(mut s: &UnixStream) -> std::io::Result<Option<Vec<u8>>> {
    // Wait in `poll` for input, not in `recv`: a Unix socket wakes every thread sleeping
    // in `recv` on it when the other side consumes what this side sent (write space),
    // so each message would cost a wake-up for nothing; `poll` filters by event.
    loop {
        let mut fds = [rustix::event::PollFd::new(s, rustix::event::PollFlags::IN)];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match s.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MESSAGE_BYTES_MAX {
        return Err(std::io::Error::other(format!(
            "message of {n} bytes, limit {MESSAGE_BYTES_MAX}"
        )));
    }
    let mut body = vec![0u8; n];
    s.read_exact(&mut body)?;
    Ok(Some(body))
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
    map: Mutex<HashMap<String, Route>>,
    /// Generated ids of handed-off events: `swarm:<nonce>.h<n>`.
    id_prefix: String,
    next_id: AtomicU64,
}

impl Routes {
    /// Routes of a store on `local` storage; off with `SWARM_HANDOFF=0`.
    pub(crate) fn new(local: bool) -> Routes {
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
            map: Mutex::new(HashMap::new()),
            id_prefix: format!("{GENERATED_ID_PREFIX}{nonce:016x}.h"),
            next_id: AtomicU64::new(0),
        }
    }

    /// Routes that always append directly (the committer's own store, engine jobs).
    pub(crate) fn off() -> Routes {
        let mut r = Routes::new(false);
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
        let routes: Vec<Route> = lock(&self.map).drain().map(|(_, r)| r).collect();
        for r in routes {
            if let Route::Commit(c) = r {
                c.stop();
            }
        }
    }
}

/// The committing side: a listener thread, one reading thread per connection, and one
/// commit thread that appends everything queued with one call (one `pwrite`, one
/// `fdatasync`) and writes the answers.
pub(crate) struct Committer {
    socket: PathBuf,
    stop: AtomicBool,
    /// Every connection's stream (to end their reads on stop) and thread.
    conns: Mutex<Vec<(UnixStream, JoinHandle<()>)>>,
    listener: Mutex<Option<JoinHandle<()>>>,
    /// The listening socket (a second handle), shut down to end the listener's
    /// `accept`: its path may no longer be this committer's by then.
    listening: Mutex<Option<UnixListener>>,
    commit: Mutex<Option<JoinHandle<()>>>,
    queue: Mutex<Queue>,
    queued: Condvar,
    /// Held for the committer's life.
    lock: Mutex<Option<Box<dyn StorageFile>>>,
    /// The store's [`HandoffCounters::committed`].
    committed: Arc<AtomicU64>,
}

/// Requests read whole, waiting for the commit thread.
#[derive(Default)]
struct Queue {
    pending: Vec<Pending>,
    closing: bool,
    /// The commit thread sleeps on `queued`: the next push wakes it. While it commits,
    /// pushes skip the wake-up (a `futex` call each, most of a local append's overhead
    /// with many threads); it takes the queue again before it would sleep.
    waiting: bool,
}

impl Queue {
    /// Queues a request; true when the commit thread must be woken for it.
    fn push(&mut self, p: Pending) -> bool {
        self.pending.push(p);
        std::mem::replace(&mut self.waiting, false)
    }
}

struct Pending {
    reply: Reply,
    batch: Vec<Checked>,
    expect_seq: Option<u64>,
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

/// Ends a committer whose commit thread panicked: without it, everything queued and every
/// client would wait forever. Clients see their connection end (and recover their
/// batch); this process's own queued appends get an error.
struct CommitGuard<'a>(&'a Committer);

impl Drop for CommitGuard<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let c = self.0;
        let _ = std::fs::remove_file(&c.socket);
        let pending = {
            let mut q = lock(&c.queue);
            q.closing = true;
            std::mem::take(&mut q.pending)
        };
        for p in pending {
            fail_local(p.reply);
        }
        {
            // No connection accepted from here on (one waiting in the backlog would be
            // greeted, and its request never answered).
            let conns = lock(&c.conns);
            c.stop.store(true, Ordering::Release);
            if let Some(l) = lock(&c.listening).as_ref() {
                let _ = rustix::net::shutdown(l, rustix::net::Shutdown::Both);
            }
            for (s, _) in conns.iter() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        // Another process may commit for the run now (this one appends directly).
        if let Some(l) = lock(&c.lock).take() {
            let _ = l.unlock();
        }
    }
}

/// Answers a local append queued or in flight when the commit thread panicked: its
/// outcome is unknown, as after a timeout. (A socket's reply is left to the connection's
/// end: the client recovers its batch.)
fn fail_local(reply: Reply) {
    if let Reply::Local(slot) = reply {
        let e = Error::invalid(
            "handoff",
            "the commit thread failed; the append may or may not be stored: read the run, or append again with the same id",
        );
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
    for (s, r) in sockets {
        let answer = match r {
            Ok(events) => Answer::Stored(events),
            Err(e) => Answer::Refused(e.into()),
        };
        // A write that fails (a connection gone, or a client that stopped reading) ends
        // the connection: its reader ends too.
        if write_msg(&s, &answer).is_err() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
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
        // A committer that died left its socket behind; the lock says it is gone.
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).map_err(|source| Error::Io {
            op: "bind",
            path: socket.clone(),
            source,
        })?;
        let c = Arc::new(Committer {
            socket,
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            listener: Mutex::new(None),
            listening: Mutex::new(listener.try_clone().ok()),
            commit: Mutex::new(None),
            queue: Mutex::new(Queue::default()),
            queued: Condvar::new(),
            lock: Mutex::new(Some(held)),
            committed,
        });
        let spawn_err = |source| Error::Io {
            op: "spawn",
            path: c.socket.clone(),
            source,
        };
        let (me, st, r) = (c.clone(), store.clone(), run.to_string());
        let h = std::thread::Builder::new()
            .name("swarm-commit".into())
            .spawn(move || me.commit_loop(&st, &r))
            .map_err(spawn_err)?;
        *lock(&c.commit) = Some(h);
        let (me, run) = (c.clone(), run.to_string());
        let h = std::thread::Builder::new()
            .name("swarm-commit-accept".into())
            .spawn(move || me.accept(listener, store, run));
        match h {
            Ok(h) => *lock(&c.listener) = Some(h),
            Err(e) => {
                c.stop();
                return Err(spawn_err(e));
            }
        }
        Ok(c)
    }

    fn accept(self: Arc<Self>, listener: UnixListener, store: Arc<Store>, run: String) {
        for s in listener.incoming() {
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            let Ok(s) = s else {
                // Out of file descriptors, say: not a busy loop.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            let mut conns = lock(&self.conns);
            // Under the lock `stop` takes: a connection is either registered before the
            // stop (and its reads ended by it) or never served.
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            conns.retain(|(_, h)| !h.is_finished());
            if conns.len() >= CONNECTIONS_MAX {
                // Dropped: the other side appends directly.
                continue;
            }
            let Ok(reader) = s.try_clone() else { continue };
            let (me, store, run) = (self.clone(), store.clone(), run.clone());
            let spawned = std::thread::Builder::new()
                .name("swarm-commit-conn".into())
                .spawn(move || me.serve(&store, &run, s));
            match spawned {
                Ok(h) => conns.push((reader, h)),
                Err(e) => tracing::warn!(error = %e, "cannot start a committer thread"),
            }
        }
    }

    /// Reads one connection's requests whole, checks each and queues it for the commit
    /// thread, which answers it.
    fn serve(&self, store: &Store, run: &str, s: UnixStream) {
        // Any seq stored before the hello (the durable mark's, read without waiting for
        // the writer, which may be waiting for `LOCK`): a lost answer's batch comes after.
        let head = store
            .writer(run, store.user())
            .map_or(0, |l| l.durable_seq());
        let hello = Hello {
            v: WIRE_VERSION,
            user: store.user().to_string(),
            head,
            pid: std::process::id(),
        };
        // A client that stops reading must not stall the commit thread, which writes
        // every answer: after this long the connection is shut, and the client, which
        // sees it end without an answer, finds its batch stored (`recover_since`).
        if s.set_write_timeout(Some(ANSWER_WRITE_TIMEOUT)).is_err()
            || write_msg(&s, &hello).is_err()
        {
            return;
        }
        let s = Arc::new(s);
        loop {
            let body = match read_msg(&s) {
                Ok(Some(b)) => b,
                // The other side left, or the committer stops: nothing read, nothing
                // written.
                Ok(None) | Err(_) => return,
            };
            let checked = serde_json::from_slice::<Handed>(&body)
                .map_err(|e| Error::invalid("handoff", format!("bad request: {e}")))
                .and_then(|h| Ok((store.check_handed(h.user, h.events)?, h.expect_seq)));
            match checked {
                Ok((batch, expect_seq)) => {
                    let wake = lock(&self.queue).push(Pending {
                        reply: Reply::Socket(s.clone()),
                        batch,
                        expect_seq,
                    });
                    if wake {
                        self.queued.notify_one();
                    }
                }
                Err(e) => {
                    if write_msg(&s, &Answer::Refused(e.into())).is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Commits what is queued, as one group, until the committer stops and the queue is
    /// empty.
    fn commit_loop(&self, store: &Store, run: &str) {
        let _guard = CommitGuard(self);
        loop {
            let group = {
                let mut q = lock(&self.queue);
                while q.pending.is_empty() && !q.closing {
                    q.waiting = true;
                    q = self.queued.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                q.waiting = false;
                if q.pending.is_empty() {
                    return;
                }
                std::mem::take(&mut q.pending)
            };
            let (replies, batches): (Vec<Reply>, Vec<_>) = group
                .into_iter()
                .map(|p| (p.reply, Ok((p.batch, p.expect_seq))))
                .unzip();
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
            if results.iter().any(|r| matches!(r, Err(Error::Poisoned(_)))) {
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
        let wake = {
            let mut q = lock(&self.queue);
            if q.closing {
                return Err(batch);
            }
            q.push(Pending {
                reply: Reply::Local(slot.clone()),
                batch,
                expect_seq,
            })
        };
        if wake {
            self.queued.notify_one();
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

    /// Stops accepting, ends every connection's next read, commits and answers what was
    /// read, and lets the lock go (after removing the socket, so that the next
    /// committer's socket is never removed).
    fn stop(&self) {
        {
            let _conns = lock(&self.conns);
            self.stop.store(true, Ordering::Release);
        }
        if let Some(h) = lock(&self.listener).take() {
            // Wakes the listener's `accept` (it sees `stop` and returns). Not by
            // connecting to the socket's path: a committer whose writer was poisoned, or
            // whose commit thread panicked, removed it, and another may listen there.
            match lock(&self.listening).take() {
                Some(l) => {
                    let _ = rustix::net::shutdown(&l, rustix::net::Shutdown::Both);
                }
                None => {
                    let _ = UnixStream::connect(&self.socket);
                }
            }
            let _ = h.join();
        }
        // Only while this committer holds the run's lock is the socket its own: after a
        // panic it let the lock go, and another committer may listen there now.
        if lock(&self.lock).is_some() {
            let _ = std::fs::remove_file(&self.socket);
        }
        let conns: Vec<(UnixStream, JoinHandle<()>)> = lock(&self.conns).drain(..).collect();
        for (s, _) in &conns {
            let _ = s.shutdown(std::net::Shutdown::Read);
        }
        for (_, h) in conns {
            let _ = h.join();
        }
        lock(&self.queue).closing = true;
        self.queued.notify_all();
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
    /// Sent, answer lost: recover, searching after this seq.
    Lost(u64),
}

impl Handing {
    fn connect(socket: &Path, user: &str) -> std::io::Result<(UnixStream, u64)> {
        let s = UnixStream::connect(socket)?;
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
        if send_all(&s, &msg).is_err() {
            return Sent::Lost(since);
        }
        let body = match read_msg(&s) {
            Ok(Some(b)) => b,
            _ => return Sent::Lost(since),
        };
        let answer: Answer = match serde_json::from_slice(&body) {
            Ok(a) => a,
            Err(_) => return Sent::Lost(since),
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
            Answer::Refused(WireError::Poisoned { .. }) => Sent::Lost(since),
            Answer::Refused(e) => Sent::Answered(Err(e.into())),
        }
    }
}

/// [`Handed`], borrowed.
#[derive(Serialize)]
struct HandedRef<'a> {
    user: &'a str,
    expect_seq: Option<u64>,
    events: &'a [Checked],
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
            Sent::Lost(since) => {
                self.go_direct(run);
                tracing::info!(
                    run,
                    since,
                    "committer gone with an append in flight; recovering it"
                );
                let r = self.append_recovered(run, batch, expect_seq, since);
                self.handoff.recovered.fetch_add(1, Ordering::Relaxed);
                Ok(r)
            }
        }
    }

    fn go_direct(&self, run: &str) {
        lock(&self.handoff.map).insert(run.to_string(), Route::Direct(Instant::now() + DIRECT_FOR));
    }

    /// Whether this process hands its appends to `run` to a committer (which only
    /// commits for a run that exists).
    pub(crate) fn hands_off(&self, run: &str) -> bool {
        matches!(lock(&self.handoff.map).get(run), Some(Route::Hand(_)))
    }

    /// Where this process's `sync` appends to `run` go.
    fn route(&self, run: &str) -> Via {
        let mut map = lock(&self.handoff.map);
        let may_commit = match map.get(run) {
            Some(Route::Hand(h)) => return Via::Hand(h.clone()),
            Some(Route::Commit(c)) => return Via::Commit(c.clone()),
            Some(Route::Direct(until)) if Instant::now() < *until => return Via::Direct,
            Some(Route::Direct(_) | Route::Seen) => true,
            None => false,
        };
        let Some(route) = self.find_route(run, may_commit) else {
            return Via::Direct;
        };
        let via = match &route {
            Route::Hand(h) => Via::Hand(h.clone()),
            Route::Commit(c) => Via::Commit(c.clone()),
            Route::Direct(_) | Route::Seen => Via::Direct,
        };
        map.insert(run.to_string(), route);
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

#[cfg(test)]
mod tests;
