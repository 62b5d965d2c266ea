//! One watch per run, shared by every tail of it: a [`WatchHub`] holds one inotify
//! instance for any number of runs and one thread that reads it, and fans each wake-up
//! out to the run's [`WakeSource`], which all of that run's tails wait on.
//!
//! Why: a tail that arms its own watch costs an inotify instance, and Linux allows a user
//! 128 of them (`fs.inotify.max_user_instances`); past that, tails fall back to polling.
//! A server with hundreds of subscribers of one run needs one watch, not hundreds.
//!
//! - [`WatchHub::watch`] returns a [`RunWatch`] handle; the first handle of a run arms
//!   the watch (on `SYNCED`, `IN_MODIFY`), the last one dropped removes it.
//! - The hub's thread waits on the inotify descriptor (with `mio`). An event for a run's
//!   watch notifies that run's source; a queue overflow notifies every run's source.
//! - Polling stays the safety net, once per run rather than once per tail: every
//!   `poll_interval` the thread reads each watched run's marks (one `pread` of `SYNCED`
//!   through the run's [`Storage`]) and notifies the run's source when they moved since
//!   it last read them. A run whose watch cannot be armed (no inotify instance, the watch
//!   limit, a storage that is not the local file system, `SYNCED` not created yet) is
//!   woken by that sweep alone, and its source says so ([`WakeSource::is_watching`]);
//!   the sweep retries arming it each time.
//!
//! **Invariant:** a waiter never misses a move: the watch is armed (and the marks read
//! once) before [`WatchHub::watch`] returns, so any later write of `SYNCED` queues an
//! event; every event notifies (events are never deduplicated, only the sweep compares
//! marks), and a waiter takes the generation before it reads the marks.
//! **Invariant:** the hub never waits for a waiter: notifying is a counter, a condition
//! variable and a Tokio `watch` send.
//! Off Linux there is no inotify here: every run is woken by the sweep.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::log::meta::SYNCED_FILE;
use crate::log::storage::{OpenMode, Storage, StorageFile};
use crate::log::watermark::{self, Marks};
use crate::tail::wake::WakeSource;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Shared watches of runs: one inotify instance and one thread for any number of runs
/// and tails. Clones share the hub; the thread ends when the last clone is dropped.
#[derive(Clone)]
pub struct WatchHub(Arc<Hub>);

/// What a hub is doing now (`/metrics` of the server shows it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HubStats {
    /// The hub's inotify instance is open (at most one, whatever the number of runs).
    pub notify_instances: u64,
    /// Runs watched (each with at least one [`RunWatch`]).
    pub watches: u64,
    /// Of those, runs without a working inotify watch (woken by the polling sweep).
    pub watches_polling: u64,
    /// [`RunWatch`] handles alive (tails sharing the watches).
    pub subscribers: u64,
    /// Of those, handles of runs without a working inotify watch.
    pub subscribers_polling: u64,
    /// Wake-ups fanned out because inotify reported a run's `SYNCED` written (one per
    /// run per event, whatever the number of its tails).
    pub notify_wakeups: u64,
    /// Wake-ups fanned out because the polling sweep found a run's marks moved.
    pub poll_wakeups: u64,
}

/// A tail's share of a run's watch: wait on [`RunWatch::source`]. The run's watch is
/// removed when its last handle is dropped.
pub struct RunWatch {
    hub: Arc<Hub>,
    entry: Arc<Entry>,
}

impl RunWatch {
    /// The run's wake-up source (see [`crate::tail::Tail::with_wake_source`]).
    pub fn source(&self) -> WakeSource {
        self.entry.source.clone()
    }

    /// Whether the hub's thread runs, so that the source is notified at least by the
    /// polling sweep; false only when the thread could not be started, in which case a
    /// waiter must poll by itself.
    pub fn is_swept(&self) -> bool {
        lock(&self.hub.reg).thread == Thread::Running
    }
}

impl std::fmt::Debug for RunWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunWatch")
            .field("dir", &self.entry.dir)
            .field("source", &self.entry.source)
            .finish()
    }
}

impl Drop for RunWatch {
    fn drop(&mut self) {
        self.hub.release(&self.entry.dir);
    }
}

struct Hub {
    poll: Duration,
    reg: Mutex<Registry>,
    notify_wakeups: AtomicU64,
    poll_wakeups: AtomicU64,
    /// Wakes the thread (a new run to sweep, or the hub is gone).
    kick: Mutex<Option<Kick>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Thread {
    NotStarted,
    Running,
    Failed,
}

struct Registry {
    thread: Thread,
    runs: HashMap<PathBuf, Slot>,
    /// The run of each armed inotify watch, by watch descriptor id.
    by_wd: HashMap<i32, Arc<Entry>>,
    /// Adds and removes watches of the hub's instance (`None`: no instance).
    #[cfg(target_os = "linux")]
    watches: Option<inotify::Watches>,
}

struct Slot {
    entry: Arc<Entry>,
    handles: u64,
    #[cfg(target_os = "linux")]
    wd: Option<inotify::WatchDescriptor>,
    /// A failure to arm was logged (once per run watch).
    warned: bool,
}

struct Entry {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    source: WakeSource,
    /// `SYNCED` (opened once) and the marks last read from it.
    marks: Mutex<Seen>,
}

/// A run's `SYNCED` file, once opened, and the marks last read from it (`None`: none
/// read yet, or unreadable).
#[derive(Default)]
struct Seen {
    file: Option<Box<dyn StorageFile>>,
    /// When `file` was opened (opened again after [`super::SYNCED_REOPEN`]).
    opened: Option<std::time::Instant>,
    marks: Option<Marks>,
}

impl Entry {
    /// Reads the run's marks; true when they differ from the last read (or cannot be
    /// read: the tails will read them and report why).
    fn refresh(&self) -> bool {
        let path = self.dir.join(SYNCED_FILE);
        let mut st = lock(&self.marks);
        if st
            .opened
            .is_some_and(|t| t.elapsed() >= super::SYNCED_REOPEN)
        {
            // A `SYNCED` lost and rebuilt is a new file.
            st.file = None;
        }
        if st.file.is_none() {
            match self.storage.open(&path, OpenMode::Read) {
                Ok(f) => {
                    st.file = Some(f);
                    st.opened = Some(std::time::Instant::now());
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
                Err(_) => return true,
            }
        }
        let now = (st.file.as_ref()).and_then(|f| watermark::read(&**f, &path).ok());
        let moved = now.is_none() || now != st.marks;
        st.marks = now;
        moved
    }
}

impl WatchHub {
    /// A hub whose sweep reads every watched run's marks each `poll_interval` (at least
    /// 1 ms). Nothing is opened and no thread starts until the first [`WatchHub::watch`].
    pub fn new(poll_interval: Duration) -> WatchHub {
        WatchHub(Arc::new(Hub {
            poll: poll_interval.max(Duration::from_millis(1)),
            reg: Mutex::new(Registry {
                thread: Thread::NotStarted,
                runs: HashMap::new(),
                by_wd: HashMap::new(),
                #[cfg(target_os = "linux")]
                watches: None,
            }),
            notify_wakeups: AtomicU64::new(0),
            poll_wakeups: AtomicU64::new(0),
            kick: Mutex::new(None),
        }))
    }

    /// A handle on the watch of the run in `dir` (read through `storage`), armed before
    /// this returns; the first handle of a run arms it. Blocking (system calls and a
    /// `pread`): call it from a blocking context. Never fails: a watch that cannot be
    /// armed leaves the run to the polling sweep.
    pub fn watch(&self, storage: Arc<dyn Storage>, dir: &Path) -> RunWatch {
        let hub = &self.0;
        let (entry, new) = {
            let mut reg = lock(&hub.reg);
            if reg.thread == Thread::NotStarted {
                hub.start(&mut reg);
            }
            match reg.runs.get_mut(dir) {
                Some(slot) => {
                    slot.handles += 1;
                    (slot.entry.clone(), false)
                }
                None => {
                    let entry = Arc::new(Entry {
                        dir: dir.to_path_buf(),
                        storage,
                        source: WakeSource::new(),
                        marks: Mutex::new(Seen::default()),
                    });
                    let mut slot = Slot {
                        entry: entry.clone(),
                        handles: 1,
                        #[cfg(target_os = "linux")]
                        wd: None,
                        warned: false,
                    };
                    reg.arm(&mut slot, hub.poll);
                    reg.runs.insert(dir.to_path_buf(), slot);
                    (entry, true)
                }
            }
        };
        if new {
            // The marks as of now, so that the sweep wakes tails only when they move.
            entry.refresh();
            hub.kick();
        }
        RunWatch {
            hub: self.0.clone(),
            entry,
        }
    }

    /// Wakes the tails of the run in `dir` now, if it is watched: for a writer in this
    /// process that has just made an append visible, so that its tails need not wait for
    /// inotify to report the `SYNCED` write (they read the marks, as after any wake-up;
    /// the inotify event still comes and finds nothing more). Never blocks on a waiter.
    pub fn wake_run(&self, dir: &Path) {
        let entry = lock(&self.0.reg).runs.get(dir).map(|s| s.entry.clone());
        if let Some(e) = entry {
            e.source.notify();
        }
    }

    /// What the hub is doing now.
    pub fn stats(&self) -> HubStats {
        let reg = lock(&self.0.reg);
        let mut s = HubStats {
            notify_wakeups: self.0.notify_wakeups.load(Ordering::Relaxed),
            poll_wakeups: self.0.poll_wakeups.load(Ordering::Relaxed),
            ..HubStats::default()
        };
        #[cfg(target_os = "linux")]
        {
            s.notify_instances = u64::from(reg.watches.is_some());
        }
        for slot in reg.runs.values() {
            s.watches += 1;
            s.subscribers += slot.handles;
            if !slot.entry.source.is_watching() {
                s.watches_polling += 1;
                s.subscribers_polling += slot.handles;
            }
        }
        s
    }
}

impl std::fmt::Debug for WatchHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("WatchHub").field(&self.stats()).finish()
    }
}

impl Registry {
    /// Arms the inotify watch of a run whose `SYNCED` exists, if the hub has an
    /// instance. A failure leaves the run to the sweep (which calls this again).
    #[cfg(target_os = "linux")]
    fn arm(&mut self, slot: &mut Slot, poll: Duration) {
        let Some(w) = self.watches.as_mut() else {
            return;
        };
        if slot.wd.is_some() {
            return;
        }
        let e = &slot.entry;
        let synced = e.dir.join(SYNCED_FILE);
        if !e.storage.exists(&synced) {
            return;
        }
        match w.add(&synced, inotify::WatchMask::MODIFY) {
            // The same inode under two paths would share one descriptor, and removing
            // one would disarm the other: the second is left to the sweep.
            Ok(wd) if self.by_wd.contains_key(&wd.get_watch_descriptor_id()) => {}
            Ok(wd) => {
                self.by_wd
                    .insert(wd.get_watch_descriptor_id(), slot.entry.clone());
                slot.wd = Some(wd);
                e.source.set_watching(true);
            }
            // Not on this file system (another storage), or removed meanwhile.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                if !slot.warned {
                    slot.warned = true;
                    tracing::warn!(path = %synced.display(), error = %err, poll_ms = poll.as_millis() as u64,
                        "cannot watch for changes; this run's tails are woken by polling");
                }
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn arm(&mut self, _slot: &mut Slot, _poll: Duration) {}

    /// Forgets a run's watch (removed, or its file gone): the sweep wakes its tails
    /// until it is armed again.
    #[cfg(target_os = "linux")]
    fn disarm(&mut self, id: i32) -> Option<Arc<Entry>> {
        let e = self.by_wd.remove(&id)?;
        if let Some(slot) = self.runs.get_mut(&e.dir) {
            slot.wd = None;
        }
        e.source.set_watching(false);
        Some(e)
    }
}

impl Hub {
    /// Starts the thread (and on Linux opens the inotify instance). Without the
    /// instance, every run is swept; without the thread, nothing notifies and waiters
    /// poll by themselves.
    fn start(self: &Arc<Self>, reg: &mut Registry) {
        let weak = Arc::downgrade(self);
        match sleeper::Sleeper::new() {
            Ok((sleeper, kick, _ino)) => {
                #[cfg(target_os = "linux")]
                {
                    reg.watches = _ino.as_ref().map(|i| i.watches());
                }
                let spawned = std::thread::Builder::new()
                    .name("swarm-watch".into())
                    .spawn(move || run(weak, sleeper, _ino));
                match spawned {
                    Ok(_) => {
                        *lock(&self.kick) = Some(kick);
                        reg.thread = Thread::Running;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start the watch thread; tails poll");
                        reg.thread = Thread::Failed;
                        #[cfg(target_os = "linux")]
                        {
                            reg.watches = None;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the watch thread; tails poll");
                reg.thread = Thread::Failed;
            }
        }
    }

    fn kick(&self) {
        if let Some(k) = lock(&self.kick).as_ref() {
            k.kick();
        }
    }

    fn release(&self, dir: &Path) {
        let mut reg = lock(&self.reg);
        let Some(slot) = reg.runs.get_mut(dir) else {
            return;
        };
        slot.handles = slot.handles.saturating_sub(1);
        if slot.handles > 0 {
            return;
        }
        let Some(slot) = reg.runs.remove(dir) else {
            return;
        };
        slot.entry.source.set_watching(false);
        #[cfg(target_os = "linux")]
        if let Some(wd) = slot.wd {
            reg.by_wd.remove(&wd.get_watch_descriptor_id());
            if let Some(w) = reg.watches.as_mut() {
                // Fails only if the watch is gone already (the file was removed).
                let _ = w.remove(wd);
            }
        }
    }

    /// Whether any run is watched (else the thread sleeps until kicked).
    fn idle(&self) -> bool {
        lock(&self.reg).runs.is_empty()
    }

    /// Reads every queued inotify event and notifies the runs they name.
    #[cfg(target_os = "linux")]
    fn dispatch(&self, ino: &mut inotify::Inotify, buf: &mut [u8]) {
        use inotify::EventMask;
        let (mut ids, mut gone, mut all) = (Vec::new(), Vec::new(), false);
        loop {
            match ino.read_events(buf) {
                Ok(events) => {
                    for e in events {
                        let id = e.wd.get_watch_descriptor_id();
                        if e.mask.contains(EventMask::Q_OVERFLOW) {
                            all = true;
                        } else if e.mask.contains(EventMask::IGNORED) {
                            gone.push(id);
                        } else {
                            ids.push(id);
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // The instance is unusable: every run goes to the sweep, and its
                    // tails are woken now in case an event was lost.
                    tracing::warn!(error = %e, "cannot read inotify events; tails are woken by polling");
                    let mut reg = lock(&self.reg);
                    let armed: Vec<i32> = reg.by_wd.keys().copied().collect();
                    for id in armed {
                        reg.disarm(id);
                    }
                    reg.watches = None;
                    all = true;
                    break;
                }
            }
        }
        ids.sort_unstable();
        ids.dedup();
        let targets: Vec<Arc<Entry>> = {
            let mut reg = lock(&self.reg);
            let mut t: Vec<Arc<Entry>> = if all {
                reg.runs.values().map(|s| s.entry.clone()).collect()
            } else {
                ids.iter()
                    .filter_map(|id| reg.by_wd.get(id).cloned())
                    .collect()
            };
            // A watch the kernel removed (its file deleted): woken, then swept.
            for id in gone {
                if let Some(e) = reg.disarm(id) {
                    if !all {
                        t.push(e);
                    }
                }
            }
            t
        };
        for e in targets {
            // Recorded so that the sweep does not wake the tails again for this move.
            e.refresh();
            // Counted first, so that a waiter that wakes sees itself counted.
            self.notify_wakeups.fetch_add(1, Ordering::Relaxed);
            e.source.notify();
        }
    }

    /// The polling safety net: arms runs not armed yet, and notifies each run whose
    /// marks moved since they were last read.
    fn sweep(&self) {
        let entries: Vec<Arc<Entry>> = {
            let mut reg = lock(&self.reg);
            let mut slots = std::mem::take(&mut reg.runs);
            for slot in slots.values_mut() {
                if !slot.entry.source.is_watching() {
                    reg.arm(slot, self.poll);
                }
            }
            reg.runs = slots;
            reg.runs.values().map(|s| s.entry.clone()).collect()
        };
        for e in entries {
            if e.refresh() {
                self.poll_wakeups.fetch_add(1, Ordering::Relaxed);
                e.source.notify();
            }
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        // The thread holds only a weak reference: woken, it finds the hub gone and ends.
        if let Some(k) = lock(&self.kick).as_ref() {
            k.kick();
        }
    }
}

/// The hub's thread: waits for inotify events (or a kick) until the next sweep.
fn run(hub: Weak<Hub>, mut sleeper: sleeper::Sleeper, mut _ino: sleeper::Ino) {
    let mut _buf = vec![0u8; 4096];
    // The first sweep one interval after the start, as every later one: a run is armed
    // when it is added, and a sweep right at the first addition could race an append
    // made just after it and count the append's wake-up as the sweep's.
    let mut next_sweep = Instant::now() + hub.upgrade().map_or(Duration::ZERO, |h| h.poll);
    loop {
        let timeout = {
            let Some(h) = hub.upgrade() else { return };
            if h.idle() {
                None
            } else {
                Some(next_sweep.saturating_duration_since(Instant::now()))
            }
        };
        // No strong reference is held while blocked, so that the hub can be dropped.
        sleeper.sleep(timeout);
        let Some(h) = hub.upgrade() else { return };
        #[cfg(target_os = "linux")]
        if let Some(ino) = _ino.as_mut() {
            h.dispatch(ino, &mut _buf);
        }
        let now = Instant::now();
        if now >= next_sweep {
            h.sweep();
            next_sweep = now + h.poll;
        }
    }
}

/// How the hub's thread sleeps, and how it is woken.
#[cfg(target_os = "linux")]
mod sleeper {
    use std::io;
    use std::os::fd::AsRawFd;
    use std::sync::Arc;
    use std::time::Duration;

    use mio::unix::SourceFd;
    use mio::{Events, Interest, Poll, Token, Waker};

    const INOTIFY: Token = Token(0);
    const WAKER: Token = Token(1);

    /// The inotify instance the thread reads (`None`: it could not be opened).
    pub(super) type Ino = Option<inotify::Inotify>;

    pub(super) struct Sleeper {
        poll: Poll,
        events: Events,
    }

    /// Wakes the thread.
    pub(super) struct Kick(Arc<Waker>);

    impl Kick {
        pub(super) fn kick(&self) {
            let _ = self.0.wake();
        }
    }

    impl Sleeper {
        pub(super) fn new() -> io::Result<(Sleeper, Kick, Ino)> {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
            // Non-blocking (IN_NONBLOCK), so that reading stops when the queue is empty.
            let ino = match inotify::Inotify::init() {
                Ok(i) => match poll.registry().register(
                    &mut SourceFd(&i.as_raw_fd()),
                    INOTIFY,
                    Interest::READABLE,
                ) {
                    Ok(()) => Some(i),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot poll the inotify instance; tails are woken by polling");
                        None
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open an inotify instance; tails are woken by polling");
                    None
                }
            };
            let s = Sleeper {
                poll,
                events: Events::with_capacity(4),
            };
            Ok((s, Kick(waker), ino))
        }

        /// Returns at an inotify event, a kick, or the timeout (the queue is
        /// edge-triggered: the caller reads it to its end before sleeping again).
        pub(super) fn sleep(&mut self, timeout: Option<Duration>) {
            if let Err(e) = self.poll.poll(&mut self.events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::warn!(error = %e, "cannot wait for inotify events");
                    std::thread::sleep(timeout.unwrap_or(Duration::from_millis(50)));
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod sleeper {
    use std::io;
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    /// No inotify off Linux.
    pub(super) type Ino = ();

    pub(super) struct Sleeper(Arc<(Mutex<bool>, Condvar)>);

    /// Wakes the thread.
    pub(super) struct Kick(Arc<(Mutex<bool>, Condvar)>);

    impl Kick {
        pub(super) fn kick(&self) {
            *self.0 .0.lock().unwrap_or_else(|e| e.into_inner()) = true;
            self.0 .1.notify_all();
        }
    }

    impl Sleeper {
        pub(super) fn new() -> io::Result<(Sleeper, Kick, Ino)> {
            let k = Arc::new((Mutex::new(false), Condvar::new()));
            Ok((Sleeper(k.clone()), Kick(k), ()))
        }

        pub(super) fn sleep(&mut self, timeout: Option<Duration>) {
            let (m, cv) = &*self.0;
            let g = m.lock().unwrap_or_else(|e| e.into_inner());
            let mut g = match timeout {
                Some(t) => cv
                    .wait_timeout_while(g, t, |k| !*k)
                    .map(|r| r.0)
                    .unwrap_or_else(|e| e.into_inner().0),
                None => cv.wait_while(g, |k| !*k).unwrap_or_else(|e| e.into_inner()),
            };
            *g = false;
        }
    }
}

use sleeper::Kick;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::meta::Durability;
    use crate::store::Store;
    use crate::tail::{Tail, TailOptions};
    use crate::{EventType, NewEvent};

    fn ev(n: u64) -> NewEvent {
        NewEvent::new("a", EventType::Evidence, format!("finding {n}"))
    }

    /// Two handles of one run share one watch (and the hub one instance); an append
    /// notifies the shared source with no polling (the sweep is an hour away); the watch
    /// goes with the last handle.
    #[test]
    fn one_watch_per_run_shared_and_released() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.append("r", ev(1), Durability::Sync).unwrap();
        store.append("s", ev(1), Durability::Sync).unwrap();
        let hub = WatchHub::new(Duration::from_secs(3600));
        let run_dir = store.run_dir("r").unwrap();
        let a = hub.watch(store.storage().clone(), &run_dir);
        let b = hub.watch(store.storage().clone(), &run_dir);
        let other = hub.watch(store.storage().clone(), &store.run_dir("s").unwrap());
        let s = hub.stats();
        assert_eq!(
            (
                s.notify_instances,
                s.watches,
                s.subscribers,
                s.subscribers_polling
            ),
            (1, 2, 3, 0),
            "{s:?}"
        );
        assert!(a.source().is_watching() && a.is_swept());
        let src = a.source();
        let seen = src.generation();
        store.append("r", ev(2), Durability::Sync).unwrap();
        let now = src.wait_past(seen, Duration::from_secs(30));
        assert_ne!(now, seen, "no wake-up from the shared watch");
        assert_eq!(b.source().generation(), now, "one source per run");
        assert!(hub.stats().notify_wakeups >= 1);
        drop((a, b));
        let s = hub.stats();
        assert_eq!((s.watches, s.subscribers), (1, 1), "{s:?}");
        drop(other);
        assert_eq!(hub.stats().watches, 0);
    }

    /// A storage inotify cannot see (in memory) is swept: its tails are woken within a
    /// polling interval, once per move.
    #[test]
    fn a_run_without_a_watch_is_woken_by_the_sweep() {
        let mem = crate::log::storage::MemStorage::new();
        let store = Store::open_with(
            Arc::new(mem),
            Path::new("/data"),
            crate::log::meta::LogOptions::default(),
        )
        .unwrap();
        store.append("r", ev(1), Durability::Sync).unwrap();
        let hub = WatchHub::new(Duration::from_millis(5));
        let w = hub.watch(store.storage().clone(), &store.run_dir("r").unwrap());
        assert!(!w.source().is_watching());
        assert_eq!(hub.stats().subscribers_polling, 1);
        let src = w.source();
        let seen = src.generation();
        store.append("r", ev(2), Durability::Sync).unwrap();
        assert_ne!(src.wait_past(seen, Duration::from_secs(30)), seen);
        assert!(hub.stats().poll_wakeups >= 1);
    }

    /// A run with one event and a tail on it that waits on an external source, with
    /// polling an hour away.
    fn tail_on_a_source() -> (tempfile::TempDir, Store, WakeSource, Tail) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.append("r", ev(1), Durability::Sync).unwrap();
        let src = WakeSource::new();
        let opts = TailOptions {
            poll_interval_ms: 3_600_000,
            ..TailOptions::default()
        };
        let t = Tail::open(&store, "r", opts)
            .unwrap()
            .with_wake_source(src.clone());
        (dir, store, src, t)
    }

    /// A tail with an external source waits on it instead of a watch of its own: with
    /// polling an hour away, only a notification delivers the next event; a notification
    /// made between its read of the marks and its wait is not lost.
    #[test]
    fn a_tail_waits_on_an_external_source() {
        let (dir, store, src, mut t) = tail_on_a_source();
        assert_eq!(t.try_next().unwrap().unwrap().seq, 1);
        assert!(t.try_next().unwrap().is_none());
        // Appended and notified after the tail read the marks, before it waits.
        store.append("r", ev(2), Durability::Sync).unwrap();
        src.notify();
        let got = t.next_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(got.map(|e| e.seq), Some(2));
        let root = dir.path().to_path_buf();
        let notifier = src.clone();
        let writer = std::thread::spawn(move || {
            let store = Store::open(root).unwrap();
            store.append("r", ev(3), Durability::Sync).unwrap();
            notifier.notify();
        });
        let got = t.next_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(got.map(|e| e.seq), Some(3));
        writer.join().unwrap();
    }

    /// Dropping a stream wakes its tail's thread out of a wait on a shared source.
    #[test]
    fn a_dropped_stream_stops_its_tail_waiting_on_a_source() {
        let (_dir, _store, src, t) = tail_on_a_source();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let stream = t.into_stream().unwrap();
        let stream = rt.block_on(async move {
            let mut stream = stream;
            let first = std::future::poll_fn(|cx| {
                futures_core::Stream::poll_next(std::pin::Pin::new(&mut stream), cx)
            })
            .await;
            assert_eq!(first.unwrap().unwrap().seq, 1);
            stream
        });
        drop(stream);
        // The source's waiter count is not observable; the thread's exit is: it drops
        // its clone of the source.
        let until = Instant::now() + Duration::from_secs(30);
        while src.holders() > 1 {
            assert!(Instant::now() < until, "the tail thread kept waiting");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
