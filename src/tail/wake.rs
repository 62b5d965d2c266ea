//! Wake-ups of a tail: an inotify watch on the run's `SYNCED` file, and a timed wait
//! that is the polling safety net.
//!
//! On Linux the tail's own thread waits on the inotify descriptor (with `mio`, which also
//! carries the close signal of a [`super::TailStream`]): one thread wake-up per event.
//! Elsewhere the `notify` crate's watcher thread raises a flag the tail waits on with a
//! condition variable, which costs a second wake-up per event; with 16 tailer processes
//! on 2 cores that second hop showed as a longer p99 in `benches/tail.rs`.
//!
//! A tail can instead take an external [`WakeSource`] (a generation counter that one
//! watch of the run bumps for every tail sharing it, see [`super::hub`]): then it arms
//! nothing of its own, and `clear` remembers the generation that `wait` waits past.
//!
//! Either way the protocol is the same: `arm`, then `clear` (forget earlier wake-ups),
//! then read the watermark, then `wait`. A change made after `clear` is still pending at
//! `wait`, so none is lost; a failed or absent watch degrades to polling, never to a hang.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::log::meta::SYNCED_FILE;
use crate::log::storage::Storage;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A wake-up source that any number of tails (and async waiters) share: a generation
/// counter that whoever watches the run bumps with [`WakeSource::notify`] whenever the
/// run's watermark may have moved.
///
/// A waiter takes the generation *before* it reads the watermark and then waits until
/// the generation differs from it, so a move made after its read is never missed: the
/// same arm/clear/read/wait protocol as a tail's own watch. Clones share one counter.
/// [`super::WatchHub`] makes one per watched run; a `WakeSource::new()` that nothing
/// notifies leaves its tails to their polling interval.
#[derive(Clone)]
pub struct WakeSource(Arc<SourceInner>);

struct SourceInner {
    generation: Mutex<u64>,
    cv: Condvar,
    /// The same generation, for async waiters ([`WakeSource::subscribe`]).
    tx: tokio::sync::watch::Sender<u64>,
    /// A working notification (inotify) feeds this source; false: polling only.
    watching: AtomicBool,
}

impl Default for WakeSource {
    fn default() -> Self {
        WakeSource::new()
    }
}

impl std::fmt::Debug for WakeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WakeSource")
            .field("generation", &self.generation())
            .field("watching", &self.is_watching())
            .finish()
    }
}

impl WakeSource {
    /// A source at generation 0 that nothing watches yet.
    pub fn new() -> WakeSource {
        WakeSource(Arc::new(SourceInner {
            generation: Mutex::new(0),
            cv: Condvar::new(),
            tx: tokio::sync::watch::Sender::new(0),
            watching: AtomicBool::new(false),
        }))
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        *lock(&self.0.generation)
    }

    /// Starts a new generation and wakes every waiter (blocking and async). Never blocks
    /// on a waiter.
    pub fn notify(&self) {
        let g = {
            let mut g = lock(&self.0.generation);
            *g = g.wrapping_add(1);
            *g
        };
        self.0.cv.notify_all();
        self.0.tx.send_replace(g);
    }

    /// Waits until the generation is no longer `seen`, or `timeout` passed; returns the
    /// generation then.
    pub fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        self.wait_past_or(seen, timeout, || false)
    }

    /// As [`WakeSource::wait_past`], and also returns once `stop()` holds (checked at
    /// each wake-up: [`WakeSource::poke`] wakes waiters to look).
    pub(crate) fn wait_past_or(
        &self,
        seen: u64,
        timeout: Duration,
        stop: impl Fn() -> bool,
    ) -> u64 {
        let g = lock(&self.0.generation);
        let Some(deadline) = Instant::now().checked_add(timeout) else {
            let g = self.0.cv.wait_while(g, |g| *g == seen && !stop());
            return *g.unwrap_or_else(|e| e.into_inner());
        };
        let mut g = g;
        while *g == seen && !stop() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = match self.0.cv.wait_timeout(g, deadline - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        *g
    }

    /// Wakes the blocking waiters without a new generation, so that they look at their
    /// `stop` condition (a tail whose stream was dropped).
    pub(crate) fn poke(&self) {
        // Taken so that a waiter between its `stop` check and its wait cannot miss it.
        drop(lock(&self.0.generation));
        self.0.cv.notify_all();
    }

    /// A Tokio `watch` receiver of the generation: `borrow_and_update` before reading the
    /// watermark, then `changed().await`.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.tx.subscribe()
    }

    /// Whether a working notification feeds this source (false: the run's watch failed
    /// or is not armed yet, and only polling bumps it).
    pub fn is_watching(&self) -> bool {
        self.0.watching.load(Ordering::Relaxed)
    }

    /// How many handles share this source.
    #[cfg(test)]
    pub(crate) fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Says whether a working notification feeds this source.
    pub fn set_watching(&self, on: bool) {
        self.0.watching.store(on, Ordering::Relaxed);
    }
}

/// The flags shared by a tail, the `notify` callback and a stream handle.
///
/// A `std::sync::Mutex` and not a Tokio one: it is held only to flip two booleans, never
/// across an await or an I/O call.
#[derive(Default)]
pub(super) struct Wake {
    state: Mutex<WakeState>,
    cv: Condvar,
    /// Wakes a tail waiting in `mio` (Linux inotify path) when the stream is dropped.
    #[cfg(target_os = "linux")]
    mio_waker: Mutex<Option<Arc<mio::Waker>>>,
    /// The external source a tail waits on, poked at close.
    shared: Mutex<Option<WakeSource>>,
}

#[derive(Default)]
struct WakeState {
    signaled: bool,
    closed: bool,
}

impl Wake {
    fn signal(&self) {
        lock(&self.state).signaled = true;
        self.cv.notify_all();
    }

    /// Asks the tail to stop waiting for good (its stream handle was dropped).
    pub(super) fn close(&self) {
        lock(&self.state).closed = true;
        self.cv.notify_all();
        #[cfg(target_os = "linux")]
        if let Some(w) = lock(&self.mio_waker).as_ref() {
            let _ = w.wake();
        }
        if let Some(s) = lock(&self.shared).as_ref() {
            s.poke();
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }

    fn clear(&self) {
        lock(&self.state).signaled = false;
    }

    fn wait(&self, timeout: Duration) {
        let s = lock(&self.state);
        if s.signaled || s.closed {
            return;
        }
        let _ = self
            .cv
            .wait_timeout_while(s, timeout, |s| !s.signaled && !s.closed);
    }
}

/// Which watch is armed.
enum Kind {
    /// None (the run directory does not exist yet, notifications are off, or they failed).
    None,
    /// Through the `notify` crate; `on_synced` once the watch is on `SYNCED` rather than
    /// on the directory. The watcher is kept for its `Drop`, which removes the watch.
    Notify {
        _watcher: notify::RecommendedWatcher,
        on_synced: bool,
    },
    /// Read by the tail's own thread (Linux).
    #[cfg(target_os = "linux")]
    Inotify(Box<linux::Ino>),
    /// An external source shared with other tails; `seen` is the generation at `clear`.
    Shared { source: WakeSource, seen: u64 },
}

/// The wake-up source of one tail.
pub(super) struct Waiter {
    wake: Arc<Wake>,
    enabled: bool,
    failed: bool,
    use_notify_crate: bool,
    kind: Kind,
}

impl Waiter {
    /// A waiter; with `enabled` false it only ever times out (polling only).
    pub(super) fn new(wake: Arc<Wake>, enabled: bool) -> Waiter {
        Waiter {
            wake,
            enabled,
            failed: false,
            use_notify_crate: !cfg!(target_os = "linux"),
            kind: Kind::None,
        }
    }

    /// Waits on `source` instead of a watch of its own (see [`WakeSource`]).
    pub(super) fn share(&mut self, source: WakeSource) {
        *lock(&self.wake.shared) = Some(source.clone());
        let seen = source.generation();
        self.kind = Kind::Shared { source, seen };
    }

    /// Uses the `notify` crate even on Linux (to test that path).
    #[cfg(test)]
    pub(super) fn force_notify_crate(&mut self) {
        self.use_notify_crate = true;
    }

    fn on_synced(&self) -> bool {
        match &self.kind {
            Kind::None => false,
            Kind::Notify { on_synced, .. } => *on_synced,
            #[cfg(target_os = "linux")]
            Kind::Inotify(ino) => ino.on_synced,
            // Armed by its owner.
            Kind::Shared { .. } => true,
        }
    }

    /// Whether a watch is armed (else the tail is polling).
    #[cfg(test)]
    pub(super) fn is_watching(&self) -> bool {
        !matches!(self.kind, Kind::None)
    }

    /// Arms (or moves) the watch: on the run directory until `SYNCED` exists, then on
    /// `SYNCED` only, so that segment writes do not wake tailers (or cost writers an
    /// inotify event per tailer). The new watch is armed before the old one is removed.
    pub(super) fn arm(&mut self, storage: &dyn Storage, dir: &Path) {
        if !self.enabled || self.failed || self.on_synced() {
            // The common case after the first pass: no system call.
            return;
        }
        let synced = dir.join(SYNCED_FILE);
        let synced_exists = storage.exists(&synced);
        if !synced_exists && !storage.exists(dir) {
            return;
        }
        let r = if self.use_notify_crate {
            self.arm_notify(dir, &synced, synced_exists)
                .map_err(std::io::Error::other)
        } else {
            self.arm_inotify(dir, &synced, synced_exists)
        };
        if let Err(e) = r {
            tracing::warn!(path = %dir.display(), error = %e,
                "cannot watch for changes; falling back to polling");
            self.failed = true;
            self.kind = Kind::None;
        }
    }

    fn arm_notify(
        &mut self,
        dir: &Path,
        synced: &Path,
        synced_exists: bool,
    ) -> Result<(), notify::Error> {
        use notify::Watcher;
        match self.kind {
            Kind::Notify {
                on_synced: true, ..
            } => return Ok(()),
            Kind::Notify { .. } if !synced_exists => return Ok(()),
            _ => {}
        }
        let wake = self.wake.clone();
        let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            // Opens and closes do not move the watermark; every other event, and every
            // error (an overflowed queue among them), may have.
            if let Ok(ev) = &res {
                if matches!(ev.kind, notify::EventKind::Access(_)) {
                    return;
                }
            }
            wake.signal();
        })?;
        let target = if synced_exists { synced } else { dir };
        w.watch(target, notify::RecursiveMode::NonRecursive)?;
        self.kind = Kind::Notify {
            _watcher: w,
            on_synced: synced_exists,
        };
        Ok(())
    }

    #[cfg(target_os = "linux")]
    fn arm_inotify(
        &mut self,
        dir: &Path,
        synced: &Path,
        synced_exists: bool,
    ) -> std::io::Result<()> {
        if !matches!(self.kind, Kind::Inotify(_)) {
            let ino = linux::Ino::new()?;
            *lock(&self.wake.mio_waker) = Some(ino.waker.clone());
            self.kind = Kind::Inotify(Box::new(ino));
        }
        match &mut self.kind {
            Kind::Inotify(ino) => ino.arm(dir, synced, synced_exists),
            _ => Ok(()),
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn arm_inotify(&mut self, dir: &Path, synced: &Path, exists: bool) -> std::io::Result<()> {
        self.arm_notify(dir, synced, exists)
            .map_err(std::io::Error::other)
    }

    /// Forgets wake-ups so far. Called right before the watermark is read.
    pub(super) fn clear(&mut self) {
        match &mut self.kind {
            #[cfg(target_os = "linux")]
            Kind::Inotify(ino) => {
                if let Err(e) = ino.drain() {
                    tracing::warn!(error = %e, "cannot read inotify events; falling back to polling");
                    self.failed = true;
                    self.kind = Kind::None;
                }
            }
            Kind::Shared { source, seen } => *seen = source.generation(),
            _ => self.wake.clear(),
        }
    }

    /// Waits for a wake-up, a close, or the timeout (the polling safety net).
    pub(super) fn wait(&mut self, timeout: Duration) {
        match &mut self.kind {
            #[cfg(target_os = "linux")]
            Kind::Inotify(ino) => {
                if self.wake.is_closed() {
                    return;
                }
                if let Err(e) = ino.wait(timeout) {
                    tracing::warn!(error = %e, "cannot wait for inotify events; falling back to polling");
                    self.failed = true;
                    self.kind = Kind::None;
                }
            }
            Kind::Shared { source, seen } => {
                let wake = &self.wake;
                source.wait_past_or(*seen, timeout, || wake.is_closed());
            }
            _ => self.wake.wait(timeout),
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::os::fd::AsRawFd;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use inotify::{Inotify, WatchDescriptor, WatchMask};
    use mio::unix::SourceFd;
    use mio::{Events, Interest, Poll, Token, Waker};

    const INOTIFY: Token = Token(0);
    const WAKER: Token = Token(1);

    /// An inotify instance polled by the tail's thread.
    pub(super) struct Ino {
        ino: Inotify,
        poll: Poll,
        events: Events,
        buf: Vec<u8>,
        pub(super) waker: Arc<Waker>,
        dir_wd: Option<WatchDescriptor>,
        pub(super) on_synced: bool,
    }

    impl Ino {
        pub(super) fn new() -> io::Result<Ino> {
            // Non-blocking (IN_NONBLOCK), so that `drain` stops when the queue is empty.
            let ino = Inotify::init()?;
            let poll = Poll::new()?;
            poll.registry().register(
                &mut SourceFd(&ino.as_raw_fd()),
                INOTIFY,
                Interest::READABLE,
            )?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
            Ok(Ino {
                ino,
                poll,
                events: Events::with_capacity(4),
                buf: vec![0; 4096],
                waker,
                dir_wd: None,
                on_synced: false,
            })
        }

        pub(super) fn arm(&mut self, dir: &Path, synced: &Path, exists: bool) -> io::Result<()> {
            if self.on_synced {
                return Ok(());
            }
            if exists {
                // `SYNCED` is rewritten in place (never replaced), so a watch on the file
                // lasts as long as the run.
                self.ino.watches().add(synced, WatchMask::MODIFY)?;
                self.on_synced = true;
                if let Some(wd) = self.dir_wd.take() {
                    self.ino.watches().remove(wd)?;
                }
            } else if self.dir_wd.is_none() {
                let mask = WatchMask::CREATE | WatchMask::MODIFY | WatchMask::MOVED_TO;
                self.dir_wd = Some(self.ino.watches().add(dir, mask)?);
            }
            Ok(())
        }

        /// Reads every queued event (the queue is edge-triggered in `mio`: it must be
        /// emptied for the next event to wake `wait`).
        pub(super) fn drain(&mut self) -> io::Result<()> {
            loop {
                match self.ino.read_events(&mut self.buf) {
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
        }

        pub(super) fn wait(&mut self, timeout: Duration) -> io::Result<()> {
            match self.poll.poll(&mut self.events, Some(timeout)) {
                Err(e) if e.kind() != io::ErrorKind::Interrupted => Err(e),
                _ => Ok(()),
            }
        }
    }
}
