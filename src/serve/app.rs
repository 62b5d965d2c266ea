//! What every request shares: the server's options, the tokens, one `Store` per user, the
//! shared watches and shared readers of followed runs and the shutdown signal; and the
//! helper that runs a library call on a blocking thread.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::commit::SyncCounters;
use crate::serve::feed::Feeds;
use crate::serve::metrics::Metrics;
use crate::serve::problem::Problem;
use crate::serve::token::TokenSet;
use crate::serve::vectors::Vectors;
use crate::store::cache::Bounded;
use crate::store::Store;
use crate::tail::WatchHub;

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// TCP address to listen on (port 0: any free port; the bound address is printed);
    /// `None`: no TCP (a Unix socket only).
    pub listen: Option<SocketAddr>,
    /// A Unix socket to listen on (`--socket`), besides or instead of TCP.
    pub socket: Option<PathBuf>,
    /// HTTPS on the TCP listener (`--tls-cert`, `--tls-key`); the Unix socket stays
    /// plain HTTP.
    pub tls: Option<TlsFiles>,
    /// The data directory (runs, and the tokens file).
    pub data_dir: PathBuf,
    /// Where checkpoints go.
    pub checkpoint_dir: PathBuf,
    /// Automatic checkpoint interval in events (0: never).
    pub checkpoint_every: u64,
    /// Where closed runs are archived.
    pub archive_dir: PathBuf,
    /// Largest request body.
    pub body_limit_bytes: u64,
    /// Bytes of request bodies the server holds at once, all clients together (a JSON
    /// body's bytes as received, until its answer; an NDJSON stream's line being
    /// received): a body that does not fit is answered 503 with `Retry-After`.
    pub body_budget_bytes: u64,
    /// Longest time from a request's first byte to its response's headers.
    pub request_timeout: Duration,
    /// Interval of SSE heartbeat comments.
    pub heartbeat: Duration,
    /// Events buffered per SSE subscriber.
    pub sse_buffer_events: usize,
    /// SSE streams one token may hold open at once.
    pub sse_streams_per_token: usize,
    /// Interval of the SSE tail's polling safety net (once per followed run).
    pub sse_poll: Duration,
    /// Longest wait for in-flight requests at shutdown.
    pub shutdown_timeout: Duration,
    /// Most connections open at once; one past it is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Runs of one user whose writer, index and head state the server keeps open at
    /// once ([`Store::with_open_runs_max`]).
    pub open_runs_per_user: usize,
    /// Users whose store (and its open runs) the server keeps at once; past it, the
    /// stores of the users least recently served that no request holds are closed.
    pub open_users: usize,
    /// Requests per second each token may make (a bucket of one second's worth, so
    /// bursts up to it pass); 0: no limit.
    pub rate_limit_per_s: u32,
    /// The embedding model's directory given on the command line (`--embed-model`);
    /// `None`: `SWARM_EMBED_MODEL`, else `<data dir>/.models/all-MiniLM-L6-v2`.
    pub embed_model: Option<PathBuf>,
    /// Refuse tokens of the `anonymous` user (`--deny-anonymous`, `SWARM_DENY_ANONYMOUS`):
    /// their requests get a 403, as the CLI's do.
    pub deny_anonymous: bool,
}

/// The PEM files of `--tls-cert` and `--tls-key`.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// Each user's store, at most `ServeOptions::open_users` of them.
pub(crate) struct UserStores {
    stores: Bounded<Arc<Store>>,
    /// The fsync counters of the stores closed so far.
    retired: SyncCounters,
}

impl UserStores {
    pub(crate) fn new(max: usize) -> UserStores {
        UserStores {
            stores: Bounded::new(max),
            retired: SyncCounters::default(),
        }
    }
}

/// What every request shares: options, tokens, the stores, the shutdown signal.
pub struct App {
    /// The options the server runs with.
    pub opts: ServeOptions,
    /// The tokens file.
    pub tokens: TokenSet,
    pub(crate) stores: Mutex<UserStores>,
    /// Becomes `true` when the server starts shutting down (SSE streams end then).
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// What `/metrics` shows.
    pub metrics: Arc<Metrics>,
    /// One watch per followed run, shared by all of its SSE subscribers (one inotify
    /// instance for the server), keyed by run directory, i.e. by (user, run).
    pub watches: WatchHub,
    /// One shared reader per run with SSE subscribers on it, keyed by run directory.
    pub(crate) feeds: Feeds,
    /// Each token's rate-limit bucket: tokens left, and when it was last filled.
    pub(crate) buckets: Mutex<HashMap<String, (f64, Instant)>>,
    /// Each token's open SSE streams (at most `ServeOptions::sse_streams_per_token`).
    pub(crate) streams: Mutex<HashMap<String, usize>>,
    /// The embedding model searches rank with, and each user's vector cache.
    pub vectors: Vectors,
    /// Each run's queue of appends waiting for its next commit.
    pub(crate) commits: Arc<crate::serve::commit::Commits>,
    /// [`ServeOptions::body_budget_bytes`], in KiB permits.
    pub(crate) body_budget: Arc<tokio::sync::Semaphore>,
}

impl App {
    /// The long-lived store of `user` (opened on first use, then shared; closed when
    /// `open_users` others were served since and no request holds it).
    pub fn store_for(&self, user: &str) -> Result<Arc<Store>, Problem> {
        let mut m = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = m.stores.get(user) {
            return Ok(s);
        }
        let s = Store::open(&self.opts.data_dir)?
            .with_checkpoints(&self.opts.checkpoint_dir, self.opts.checkpoint_every)
            .with_archive_dir(&self.opts.archive_dir)
            .with_open_runs_max(self.opts.open_runs_per_user)
            .with_user(user, !self.opts.deny_anonymous)?;
        let s = Arc::new(s);
        // A store a request, a stream or a session holds is in use.
        let gone = m
            .stores
            .insert(user, s.clone(), |s| Arc::strong_count(s) == 1);
        for g in &gone {
            m.retired = m.retired + g.sync_totals();
        }
        drop(m);
        if !gone.is_empty() {
            // Closing a store stops its committers (each waits for its group): not on
            // the request's thread, which may be one of the runtime's workers.
            let _ = std::thread::Builder::new()
                .name("swarm-close-store".into())
                .spawn(move || drop(gone));
        }
        Ok(s)
    }
}

impl App {
    /// The model behind `user`'s vector cache (`None`: lexical, see
    /// [`Vectors::reason`]); opening the cache reads a file: on a blocking thread.
    pub async fn embedder_for(
        self: &Arc<Self>,
        user: &str,
    ) -> Result<Option<Arc<crate::embed::cache::Cached>>, Problem> {
        if !self.vectors.has_model() {
            return Ok(None);
        }
        let (app, user) = (self.clone(), user.to_string());
        blocking(move || app.vectors.for_user(&app.opts.data_dir, &user)).await
    }

    /// The writers' fsync counters summed over every user's store (`/metrics`), those
    /// of the stores closed since included.
    pub fn sync_totals(&self) -> SyncCounters {
        let (stores, retired): (Vec<Arc<Store>>, SyncCounters) = {
            let m = self.stores.lock().unwrap_or_else(|e| e.into_inner());
            (m.stores.values().cloned().collect(), m.retired)
        };
        stores
            .iter()
            .map(|s| s.sync_totals())
            .fold(retired, |a, c| a + c)
    }

    /// Takes one request from the bucket of token `id`; 429 with the seconds to wait
    /// when it is empty.
    pub fn admit(&self, id: &str) -> Result<(), Problem> {
        let rate = f64::from(self.opts.rate_limit_per_s);
        if rate == 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut m = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let (left, at) = m.entry(id.to_string()).or_insert((rate, now));
        *left = (*left + now.duration_since(*at).as_secs_f64() * rate).min(rate);
        *at = now;
        if *left >= 1.0 {
            *left -= 1.0;
            return Ok(());
        }
        let wait_s = ((1.0 - *left) / rate).ceil().max(1.0) as u64;
        Err(Problem::too_many_requests(
            self.opts.rate_limit_per_s,
            wait_s,
        ))
    }
}

/// Runs a library call on a blocking thread (the engine's calls do file I/O and may wait
/// on locks and fsyncs); its error becomes a problem.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::error::Result<T> + Send + 'static,
) -> Result<T, Problem> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Problem::from),
        Err(e) => {
            tracing::error!(error = %e, "a blocking task failed");
            Err(Problem::internal())
        }
    }
}
