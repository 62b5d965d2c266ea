//! `swarm serve` and `swarm token`: the engine as an HTTP service, and its bearer tokens.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use swarm_memory::serve::token::{self, Role};
use swarm_memory::serve::{self as server, ServeOptions, TlsFiles};

/// Arguments of `swarm serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// TCP address to listen on; port 0 picks a free one. Stdout then says `listening on
    /// http://ADDR` (https://ADDR with --tls-cert; its first line). Default: 127.0.0.1:7700, unless --socket is given
    /// (then TCP only with --listen too).
    #[arg(long, env = "SWARM_LISTEN")]
    listen: Option<SocketAddr>,
    /// Also, or instead (without --listen), listen on a Unix socket at PATH: mode 0600, so
    /// only this OS user can connect (bearer tokens are still required). Stdout says
    /// `listening on unix://PATH`. An existing PATH is removed when it is a stale socket
    /// (nothing answers on it) and refused when a server answers on it or it is not a
    /// socket; the server removes its socket when it stops. Clients:
    /// SWARM_URL=unix:///abs/path (`curl --unix-socket PATH http://localhost/...`).
    /// At most 107 bytes.
    #[arg(long, value_name = "PATH")]
    socket: Option<std::path::PathBuf>,
    /// Serve HTTPS on the TCP listener with the certificate chain in this PEM file (the
    /// server's certificate first); needs --tls-key. Both files are read once, at start.
    /// TLS applies to TCP only: a --socket listener stays plain HTTP (its mode 0600 is
    /// its guard). Clients: SWARM_URL=https://HOST:PORT, and SWARM_CA_CERT=CA.pem when
    /// the certificate is not signed by a public CA (self-signed).
    #[arg(long, value_name = "CERT.pem", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "KEY.pem", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Largest request body, in bytes (413 above it).
    #[arg(long, default_value_t = server::BODY_LIMIT_BYTES_DEFAULT)]
    body_limit_bytes: u64,
    /// Bytes of request bodies held at once, all clients together (a JSON body counts
    /// the bytes received, until its answer; an NDJSON append stream
    /// the line it is receiving); a body that does not fit is answered 503 with
    /// Retry-After: 1. At least --body-limit-bytes (a smaller value is raised to it).
    #[arg(long, default_value_t = server::BODY_BUDGET_BYTES_DEFAULT)]
    body_budget_bytes: u64,
    /// Longest a request may take from its first byte to its response headers, body
    /// included (408, or the connection closed while headers are incomplete).
    #[arg(long, default_value_t = server::REQUEST_TIMEOUT_MS_DEFAULT)]
    request_timeout_ms: u64,
    /// Interval of SSE heartbeat comments.
    #[arg(long, default_value_t = server::HEARTBEAT_MS_DEFAULT)]
    heartbeat_ms: u64,
    /// Events buffered per SSE subscriber; a subscriber that falls further behind gets
    /// `event: lagged` with the seq to resume from, and its stream ends.
    #[arg(long, default_value_t = server::SSE_BUFFER_EVENTS_DEFAULT)]
    sse_buffer_events: usize,
    /// SSE streams one token may hold open at once (each holds a task, a queue and file
    /// descriptors); past it a new one is refused with 429.
    #[arg(long, default_value_t = server::SSE_STREAMS_PER_TOKEN_DEFAULT)]
    sse_streams_per_token: usize,
    /// Polling safety net of the SSE tail, in ms: every subscriber of a run shares one
    /// inotify watch of it, and the server also reads each followed run's marks this
    /// often, in case a change was not notified (a network file system, a failed watch).
    #[arg(long, default_value_t = server::SSE_POLL_MS_DEFAULT)]
    sse_poll_ms: u64,
    /// Longest wait for requests in flight at shutdown (SIGTERM, SIGINT).
    #[arg(long, default_value_t = server::SHUTDOWN_TIMEOUT_MS_DEFAULT)]
    shutdown_timeout_ms: u64,
    /// Most connections open at once (each holds a task and a file descriptor); one
    /// past it is answered `503 too-many-connections` with `Retry-After: 1` and closed
    /// (closed without an answer under TLS, or when 64 are being answered already).
    #[arg(long, default_value_t = server::MAX_CONNECTIONS_DEFAULT)]
    max_connections: usize,
    /// Runs of one user kept open at once: their writers (4 file descriptors each),
    /// indexes (one per segment), head states and hand-off committers. Past it, the
    /// runs least recently used are closed, and opened again when next used.
    #[arg(long, default_value_t = swarm_memory::store::OPEN_RUNS_MAX_DEFAULT)]
    open_runs_per_user: usize,
    /// Users whose store (with its open runs) is kept at once. Past it, the stores of
    /// the users least recently served that no request, stream or MCP session holds
    /// are closed, and opened again at their next request.
    #[arg(long, default_value_t = server::OPEN_USERS_DEFAULT)]
    open_users: usize,
    /// Requests per second each token may make (bursts up to one second's worth); over
    /// it: 429 with Retry-After. 0: no limit.
    #[arg(long, default_value_t = 0)]
    rate_limit_per_s: u32,
    /// The sentence-embedding model `GET /v1/search` and the `/mcp` tool `search_memory`
    /// rank with (hybrid: words and meaning), loaded once at start. Else
    /// SWARM_EMBED_MODEL, else DATA_DIR/.models/all-MiniLM-L6-v2 (`swarm model fetch`
    /// installs it there). Only the first one given is tried; without a model, search
    /// ranks by words and its answers say why (`mode: lexical`, `reason`). The start-up
    /// log (stderr) says which. Files that are there but do not load: the server does
    /// not start.
    #[arg(long, value_name = "DIR")]
    embed_model: Option<std::path::PathBuf>,
}

/// `swarm token ...`
#[derive(Subcommand)]
pub enum TokenCmd {
    /// Make a bearer token for the user given with --user. The token is printed once,
    /// alone on stdout (its record goes to stderr); only its hash is stored.
    ///
    /// Example:
    ///   TOKEN=$(swarm token add --user alice --agent 'db*' --role agent)
    #[command(verbatim_doc_comment)]
    Add {
        /// An agent id the token may act as, or a prefix ending in `*` (repeatable).
        #[arg(long, required = true)]
        agent: Vec<String>,
        /// agent (read, write as its agents), reader (read only), admin (also operator
        /// calls: replay of whole states, synth).
        #[arg(long, default_value = "agent")]
        role: String,
    },
    /// List the tokens (no secrets) as NDJSON.
    List,
    /// Revoke a token by its id (from `list`); its requests get 401 from then on.
    Revoke {
        /// The token's id.
        id: String,
    },
}

pub fn serve(
    a: ServeArgs,
    data_dir: &Path,
    checkpoint_dir: &Path,
    checkpoint_every: u64,
    archive_dir: &Path,
    deny_anonymous: bool,
) -> anyhow::Result<ExitCode> {
    if a.tls_cert.is_some() && a.listen.is_none() && a.socket.is_some() {
        anyhow::bail!(
            "--tls-cert applies to the TCP listener, and with --socket alone there is none: give --listen too"
        );
    }
    raise_open_file_limit();
    server::run(ServeOptions {
        listen: match (a.listen, &a.socket) {
            (Some(l), _) => Some(l),
            (None, Some(_)) => None,
            (None, None) => Some(server::LISTEN_DEFAULT.parse()?),
        },
        socket: a.socket,
        tls: match (a.tls_cert, a.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            _ => None,
        },
        data_dir: data_dir.to_path_buf(),
        checkpoint_dir: checkpoint_dir.to_path_buf(),
        checkpoint_every,
        archive_dir: archive_dir.to_path_buf(),
        body_limit_bytes: a.body_limit_bytes,
        body_budget_bytes: a.body_budget_bytes.max(a.body_limit_bytes),
        request_timeout: Duration::from_millis(a.request_timeout_ms.max(1)),
        heartbeat: Duration::from_millis(a.heartbeat_ms.max(1)),
        sse_buffer_events: a.sse_buffer_events.max(1),
        sse_streams_per_token: a.sse_streams_per_token.max(1),
        sse_poll: Duration::from_millis(a.sse_poll_ms.max(1)),
        shutdown_timeout: Duration::from_millis(a.shutdown_timeout_ms),
        max_connections: a.max_connections.max(1),
        open_runs_per_user: a.open_runs_per_user.max(1),
        open_users: a.open_users.max(1),
        rate_limit_per_s: a.rate_limit_per_s,
        embed_model: a.embed_model,
        deny_anonymous,
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Each SSE subscriber holds a connection and two open files (the run's `SYNCED` and its
/// segment), so the common soft limit of 1,024 descriptors caps a server near 300 live
/// tails. Raise the soft limit to the hard one, as servers do; say so when that is low.
fn raise_open_file_limit() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let lim = getrlimit(Resource::Nofile);
        let mut soft = lim.current;
        if lim.current < lim.maximum {
            let want = Rlimit {
                current: lim.maximum,
                maximum: lim.maximum,
            };
            if setrlimit(Resource::Nofile, want).is_ok() {
                soft = lim.maximum;
            }
        }
        if soft.is_some_and(|n| n < 4096) {
            tracing::warn!(
                limit = soft,
                "open-file limit is low: each live SSE subscriber holds about 3 descriptors (raise `ulimit -n`)"
            );
        }
    }
}

pub fn token(
    cmd: TokenCmd,
    data_dir: &Path,
    user: &str,
    deny_anonymous: bool,
) -> anyhow::Result<ExitCode> {
    match cmd {
        TokenCmd::Add { agent, role } => {
            if user == swarm_memory::event::ANONYMOUS && deny_anonymous {
                eprintln!("swarm: anonymous access is disabled (--deny-anonymous); give --user");
                return Ok(ExitCode::from(5));
            }
            if user == swarm_memory::event::ANONYMOUS {
                eprintln!(
                    "warning: this token acts as the user `anonymous`, one partition shared by every anonymous token; give each tenant its own --user"
                );
            }
            let t = token::add(data_dir, user, &agent, Role::parse(&role)?)?;
            eprintln!("{}", serde_json::to_string(&t.record)?);
            // The secret is shown once: if it cannot be, the token is useless to anyone
            // and must not stay valid.
            let shown = (|| -> std::io::Result<()> {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", t.token)?;
                out.flush()
            })();
            if let Err(e) = shown {
                let undone = match token::revoke(data_dir, &t.record.id) {
                    Ok(_) => "it was revoked; run `swarm token add` again".to_string(),
                    Err(r) => format!(
                        "revoking it failed too ({r}): run `swarm token revoke {}`",
                        t.record.id
                    ),
                };
                eprintln!(
                    "swarm: token {} was made but could not be shown ({e}); {undone}",
                    t.record.id
                );
                return Ok(ExitCode::from(crate::scratch::EXIT_ACK_LOST));
            }
        }
        TokenCmd::List => {
            let out = std::io::stdout();
            let mut out = out.lock();
            for t in token::list(data_dir)? {
                serde_json::to_writer(&mut out, &t)?;
                out.write_all(b"\n")?;
            }
            out.flush()?;
        }
        TokenCmd::Revoke { id } => {
            let r = token::revoke(data_dir, &id)?;
            return Ok(crate::scratch::print_ack(&r, "the token was revoked"));
        }
    }
    Ok(ExitCode::SUCCESS)
}
