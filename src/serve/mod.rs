//! `swarm serve`: the engine as a network service. An HTTP JSON API under `/v1`, a live
//! tail over server-sent events, bearer-token identity; one long-lived [`Store`] per
//! user, so every client shares its group commit and its cached head states.
//!
//! - `mod.rs` (this file): the accept loop (limits, timeouts, graceful shutdown).
//! - `listen.rs`: the Unix socket (`--socket`: mode 0600, stale and live sockets).
//! - `tls.rs`: HTTPS on the TCP listener (`--tls-cert`, `--tls-key`; rustls).
//! - `app.rs`: options and the shared [`App`] state (tokens, one store per user).
//! - `token.rs`: the tokens file and `swarm token add | list | revoke`.
//! - `extract.rs`: identity, JSON body and query extractors (every check before a call).
//! - `problem.rs`: RFC 9457 error bodies and the map from the library's errors.
//! - `routes.rs`: the routes, each a thin call into the library on a blocking thread.
//! - `append.rs`: the append route (a JSON body, or an NDJSON stream acknowledged line by
//!   line).
//! - `commit.rs`: server-side group commit (the appends that queue for a run while its
//!   last commit runs are committed together by one thread, one write, one fsync).
//! - `sse.rs`: the live tail over SSE (bounded buffer per subscriber, resume by seq).
//! - `feed.rs`: the live tail's shared reader per followed run (each new event read,
//!   decoded and encoded once, published in `Arc` batches to the run's subscribers).
//! - `mcp.rs` (with feature `mcp`): `/mcp`, the MCP tools over streamable HTTP with the
//!   token's identity.
//! - `metrics.rs`: the counters `/metrics` shows (Prometheus text).
//! - `refuse.rs`: the 503 answer to a connection past `--max-connections` (bounded; no
//!   reset without an answer).
//! - `unread.rs`: `Connection: close` on an answer given before its request's body was
//!   read (so a keep-alive client does not reuse a connection hyper is closing).
//! - `vectors.rs`: the embedding model (loaded once) and each user's vector cache, for
//!   hybrid search.
//! - `openapi.json`: the API's OpenAPI 3.1 document, served at `/v1/openapi.json`; a
//!   test checks it names exactly the routes of `routes.rs`.
//!
//! **Invariant:** the user of a request comes from its token, never from its body or
//! path; a request reaches only the store of that user, so another user's runs are not
//! found on any route. Permission checks (run policy, partitions) stay in the library:
//! this layer only adds the token's own limits (its agents, its role).
//! **Invariant:** no request body is parsed before its size, content type and nesting
//! were checked; a refused request writes nothing.
//! Never imported by any other layer (it is the front door).

pub mod app;
mod append;
mod commit;
pub mod extract;
mod feed;
pub mod listen;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod metrics;
pub mod problem;
mod refuse;
pub mod routes;
pub mod sse;
pub mod tls;
pub mod token;
mod unread;
pub mod vectors;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;

pub use crate::serve::app::{App, ServeOptions, TlsFiles};
use crate::serve::problem::Problem;
use crate::serve::token::TokenSet;
use crate::serve::vectors::Vectors;

/// Default address (loopback: exposing the server is a deliberate choice).
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7700";
/// Default request body limit: a batch's encoded limit (8 MiB) and room for the JSON
/// around it.
pub const BODY_LIMIT_BYTES_DEFAULT: u64 = 9 * 1024 * 1024;
/// Default bytes of request bodies held at once, all clients together: 28 bodies at
/// the largest size. Without it, clients holding bodies just under the limit each added
/// their size to the server's memory until it failed to allocate (a review's 191
/// connections under a 2.5 GB cap; 4,096 at the defaults would need 36 GiB).
pub const BODY_BUDGET_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// Default time a request may take, from its first byte to its response's headers
/// (reading its body included).
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Default interval of SSE heartbeat comments.
pub const HEARTBEAT_MS_DEFAULT: u64 = 15_000;
/// Default events buffered per SSE subscriber before it is closed as too slow.
pub const SSE_BUFFER_EVENTS_DEFAULT: usize = 1024;
/// Default of `--sse-streams-per-token`.
pub const SSE_STREAMS_PER_TOKEN_DEFAULT: usize = 1024;
/// Default interval of the SSE tail's polling safety net (the library tail's default).
pub const SSE_POLL_MS_DEFAULT: u64 = crate::tail::POLL_INTERVAL_MS_DEFAULT;
/// How often new vectors are written to the users' cache files.
const VECTOR_FLUSH_EVERY: Duration = Duration::from_secs(5);
/// Default longest wait for in-flight requests at shutdown.
pub const SHUTDOWN_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Default of `--open-users`.
pub const OPEN_USERS_DEFAULT: usize = 256;
/// Default of `--max-connections`.
pub const MAX_CONNECTIONS_DEFAULT: usize = 4_096;

/// Serves until SIGTERM or SIGINT, then stops accepting, lets in-flight requests finish
/// (at most `shutdown_timeout`), ends live tails with a `shutdown` event, and returns.
///
/// Once bound, stdout says `listening on http://ADDR` (TCP, or `https://ADDR` with TLS;
/// first) and/or `listening on
/// unix://PATH` (`--socket`), one line each, so a script (or a test) that started the
/// server with port 0 learns the port from it.
pub fn run(opts: ServeOptions) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("swarm-serve")
        .build()?;
    rt.block_on(serve(opts))
}

async fn serve(opts: ServeOptions) -> std::io::Result<()> {
    let tokens = TokenSet::open(&opts.data_dir).map_err(std::io::Error::other)?;
    let tls = match &opts.tls {
        Some(f) => Some(tls::acceptor(&f.cert, &f.key)?),
        None => None,
    };
    // The model loads before the socket is bound: once `listening` is printed, searches
    // rank as the log line below says.
    let (explicit, data_dir) = (opts.embed_model.clone(), opts.data_dir.clone());
    let vectors =
        tokio::task::spawn_blocking(move || Vectors::load(explicit.as_deref(), &data_dir))
            .await
            .map_err(std::io::Error::other)?
            .map_err(std::io::Error::other)?;
    {
        let line = vectors.describe();
        tracing::info!("{line}");
        let mut err = std::io::stderr().lock();
        writeln!(err, "{line}")?;
    }
    let tcp = match opts.listen {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("--listen {a}: {e}")))?,
        ),
        None => None,
    };
    let unix = match &opts.socket {
        Some(p) => Some(listen::bind_unix(p)?),
        None => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics: Arc<metrics::Metrics> = Arc::default();
    let watches = crate::tail::WatchHub::new(opts.sse_poll);
    let app = Arc::new(App {
        opts: opts.clone(),
        tokens,
        stores: Mutex::new(crate::serve::app::UserStores::new(opts.open_users)),
        shutdown: stop_rx,
        metrics: metrics.clone(),
        watches: watches.clone(),
        feeds: feed::Feeds::default(),
        buckets: Mutex::new(HashMap::new()),
        streams: Mutex::new(HashMap::new()),
        vectors,
        commits: Arc::new(commit::Commits::new(metrics.clone(), watches)),
        body_budget: Arc::new(tokio::sync::Semaphore::new(
            usize::try_from(opts.body_budget_bytes.div_ceil(1024))
                .unwrap_or(usize::MAX)
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        )),
    });
    // New vectors reach the users' cache files every few seconds (and at shutdown), so
    // a restart does not embed the same texts again.
    let flusher = {
        let app = app.clone();
        let mut stop = app.shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(VECTOR_FLUSH_EVERY);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
                let app = app.clone();
                let _ = tokio::task::spawn_blocking(move || app.vectors.flush_all()).await;
            }
        })
    };
    let router = routes::router(app.clone());
    #[cfg(feature = "mcp")]
    let router = router.merge(mcp::router(app.clone()));
    let router = router
        .layer(axum::middleware::from_fn_with_state(app.clone(), deadline))
        .layer(tower_http::trace::TraceLayer::new_for_http());
    {
        // One write: a reader that takes the first line and closes the pipe must not
        // make the second line's write fail.
        let mut lines = String::new();
        if let Some(l) = &tcp {
            let addr = l.local_addr()?;
            let scheme = if tls.is_some() { "https" } else { "http" };
            lines.push_str(&format!("listening on {scheme}://{addr}\n"));
            tracing::info!(%addr, "listening");
        }
        if let Some(u) = &unix {
            lines.push_str(&format!("listening on unix://{}\n", u.path.display()));
            tracing::info!(path = %u.path.display(), "listening");
        }
        let mut out = std::io::stdout().lock();
        out.write_all(lines.as_bytes())?;
        out.flush()?;
    }
    let graceful = GracefulShutdown::new();
    let mut signal = std::pin::pin!(stop_signal());
    // Every connection holds a task and a descriptor until its client leaves or a timeout
    // ends it: bounded, so that connections alone cannot take all of the server's.
    let connections = Arc::new(tokio::sync::Semaphore::new(opts.max_connections.max(1)));
    // Connections past the limit are answered 503 (`refuse`), a bounded number at once.
    let refusals = Arc::new(tokio::sync::Semaphore::new(refuse::REFUSALS_AT_ONCE));
    let refusal: Arc<[u8]> = refuse::answer(opts.max_connections.max(1)).into();
    loop {
        tokio::select! {
            r = accept(tcp.as_ref(), unix.as_ref()) => {
                let io = match r {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of descriptors, mostly: wait a little instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    tracing::warn!(max = opts.max_connections, "too many connections; one refused");
                    app.metrics.connection_refused();
                    // Answered 503 unless TLS (a handshake, just when the server is at
                    // its limit) or too many are being answered already: then closed.
                    let slot = refusals.clone().try_acquire_owned();
                    if let (Ok(slot), None) = (slot, &tls) {
                        let answer = refusal.clone();
                        tokio::spawn(async move {
                            let _slot = slot;
                            match io {
                                Accepted::Tcp(s) => refuse::refuse(s, &answer).await,
                                Accepted::Unix(s) => refuse::refuse(s, &answer).await,
                            }
                        });
                    }
                    continue;
                };
                let (router, watcher) = (router.clone(), graceful.watcher());
                let timeout = (opts.request_timeout, write_timeout(&opts));
                let (acceptor, mut stop) = (tls.clone(), app.shutdown.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match io {
                        Accepted::Tcp(s) => {
                            let _ = s.set_nodelay(true);
                            let Some(acceptor) = acceptor else {
                                return serve_conn(s, router, watcher, timeout).await;
                            };
                            // The handshake, in this connection's task: bounded in time,
                            // and given up when the server stops.
                            let s = tokio::select! {
                                r = tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, acceptor.accept(s)) => r,
                                _ = stop.wait_for(|s| *s) => return,
                            };
                            match s {
                                Ok(Ok(s)) => serve_conn(s, router, watcher, timeout).await,
                                Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                                Err(_) => tracing::debug!("TLS handshake timed out"),
                            }
                        }
                        Accepted::Unix(s) => serve_conn(s, router, watcher, timeout).await,
                    }
                });
            }
            _ = &mut signal => break,
        }
    }
    drop(tcp);
    if let Some(u) = &unix {
        u.remove();
    }
    drop(unix);
    tracing::info!("shutting down: no new connections; waiting for requests in flight");
    let _ = stop_tx.send(true);
    if tokio::time::timeout(opts.shutdown_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown timeout: closing the connections still open");
    }
    let _ = flusher.await;
    let _ = tokio::task::spawn_blocking(move || app.vectors.flush_all()).await;
    Ok(())
}

/// A connection the accept loop took.
enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// The next connection on either listener.
async fn accept(
    tcp: Option<&tokio::net::TcpListener>,
    unix: Option<&listen::UnixSocket>,
) -> std::io::Result<Accepted> {
    let t = async {
        match tcp {
            Some(l) => l.accept().await.map(|(s, _)| Accepted::Tcp(s)),
            None => std::future::pending().await,
        }
    };
    let u = async {
        match unix {
            Some(u) => u.listener.accept().await.map(|(s, _)| Accepted::Unix(s)),
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = t => r,
        r = u => r,
    }
}

/// Serves HTTP/1.1 on one connection until it closes (or the graceful shutdown ends it).
async fn serve_conn<I>(
    io: I,
    router: axum::Router,
    watcher: Watcher,
    (timeout, write_timeout): (Duration, Duration),
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = TowerToHyperService::new(router);
    // A write that makes no progress for `write_timeout` ends the connection: a client
    // that stopped reading (a live tail's, mostly: its heartbeats cannot be written
    // either) held its task, its stream slot, its queue and a connection for ever, and
    // held up shutdown.
    let mut io = tokio_io_timeout::TimeoutStream::new(io);
    io.set_write_timeout(Some(write_timeout));
    let io = Box::pin(io);
    let mut b = hyper::server::conn::http1::Builder::new();
    // A client that never finishes its request headers is cut off here; one that never
    // finishes its body, by `deadline`.
    b.timer(TokioTimer::new()).header_read_timeout(timeout);
    if let Err(e) = watcher
        .watch(b.serve_connection(TokioIo::new(io), svc))
        .await
    {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// How long a write may make no progress before its connection is ended: the request
/// timeout, and at least two heartbeats (a live tail writes one at each).
fn write_timeout(opts: &ServeOptions) -> Duration {
    opts.request_timeout.max(opts.heartbeat * 2)
}

/// Resolves at the first SIGTERM or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => {
            tracing::warn!("cannot install signal handlers; stop the server with SIGKILL");
            std::future::pending::<()>().await
        }
    }
}

/// Cuts off a request whose response headers are not ready in time (a body that never
/// arrives, mostly) with a 408, and counts responses by status. A live tail's stream is
/// not limited: its headers are sent at once. An answer given before the request's body
/// was read closes the connection ([`unread`]).
async fn deadline(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let (req, ended) = unread::watch(req);
    let r = within_deadline(&app, req, next).await;
    app.metrics.request(r.status().as_u16());
    unread::close_if_unread(r, ended)
}

async fn within_deadline(app: &App, req: Request, next: Next) -> Response {
    match tokio::time::timeout(app.opts.request_timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => Problem::new(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            "timeout",
            "Request timeout",
            format!(
                "the request was not complete and answered within {} ms",
                app.opts.request_timeout.as_millis()
            ),
        )
        .into_response(),
    }
}
