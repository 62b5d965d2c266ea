//! Tail latency: a durable append in one process to its delivery in another, p50/p99,
//! with 1 and 16 tailer processes, side by side with Redis Streams (`XREAD BLOCK`, AOF
//! with `appendfsync always`) and SQLite (WAL, `synchronous=FULL`, readers polling
//! `PRAGMA data_version`). Same driver, same run, same payload.
//!
//! ```sh
//! cargo bench --bench tail
//! TAIL_BENCH_EVENTS=1000 TAIL_BENCH_TAILERS=1,4,16 cargo bench --bench tail
//! ```
//!
//! Every cell spawns its tailer processes, waits until each is subscribed, then spawns
//! one writer process that appends `TAIL_BENCH_EVENTS` events one at a time, each
//! acknowledged only once durable, `TAIL_BENCH_GAP_MS` apart. Each event carries the
//! wall-clock time taken just before its append; a tailer records `now - t0` when the
//! event reaches it (both clocks are the same machine's `CLOCK_REALTIME`). Percentiles
//! pool every delivery of the cell; the first `WARMUP` events are not counted.
//! Redis is skipped with a note when `redis-server` is not installed.
//!
//! `swarm serve SSE` is the server's live tail (issue 13): the tailers hold
//! `GET /v1/runs/{run}/events?follow=1` streams of one `swarm serve`, the writer appends
//! with `POST` (durable); the same driver and payload. After the table, the idle cell:
//! `TAIL_BENCH_IDLE` (default 1,000) SSE subscribers that sit on one run, the server's
//! resident memory before and with them, and one append's delivery to all.
//! `TAIL_BENCH_SYSTEMS=sse,redis TAIL_BENCH_TAILERS=16,256` runs the issue's cells.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use swarm_memory::{Durability, EventType, FsStorage, LogOptions, NewEvent, Store, TailOptions};

const ROLE: &str = "TAIL_BENCH_ROLE";
const WARMUP: usize = 10;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    Swarm,
    /// `swarm serve`'s SSE tail (`GET /v1/runs/{run}/events?follow=1`), appends by `POST`.
    Sse,
    Redis,
    Sqlite,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Swarm => "swarm-memory tail",
            Backend::Sse => "swarm serve SSE",
            Backend::Redis => "redis XREAD BLOCK",
            Backend::Sqlite => "sqlite data_version",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Backend::Swarm => "swarm",
            Backend::Sse => "sse",
            Backend::Redis => "redis",
            Backend::Sqlite => "sqlite",
        }
    }
    fn parse(s: &str) -> Option<Backend> {
        [
            Backend::Swarm,
            Backend::Sse,
            Backend::Redis,
            Backend::Sqlite,
        ]
        .into_iter()
        .find(|b| b.key() == s)
    }
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let backend = std::env::var("TAIL_BENCH_BACKEND")
            .ok()
            .and_then(|b| Backend::parse(&b))
            .expect("TAIL_BENCH_BACKEND");
        let target = std::env::var("TAIL_BENCH_TARGET").expect("TAIL_BENCH_TARGET");
        let events: usize = env_or("TAIL_BENCH_EVENTS", 300);
        match role.as_str() {
            "tailer" => tailer(backend, &target, events),
            "writer" => writer(backend, &target, events),
            other => panic!("unknown role {other}"),
        }
        return;
    }
    orchestrate();
}

// ---------------------------------------------------------------- child processes

/// Prints `i:time_ns` for each event as one line.
fn report(times: &[(u64, u64)]) {
    let line: Vec<String> = times.iter().map(|(i, t)| format!("{i}:{t}")).collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", line.join(" ")).unwrap();
    out.flush().unwrap();
}

fn ready() {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
}

fn index_of(v: &Value) -> u64 {
    v["i"].as_u64().expect("i")
}

fn tailer(backend: Backend, target: &str, events: usize) {
    let mut lat = Vec::with_capacity(events);
    match backend {
        Backend::Swarm => {
            let (data, run) = target.split_once('|').expect("data|run");
            let store = Store::open(data).unwrap();
            let mut t = store
                .tail(
                    run,
                    TailOptions {
                        from_seq: Some(2),
                        ..TailOptions::default()
                    },
                )
                .unwrap();
            // Arms the inotify watch and reads the (empty) backlog.
            assert!(t.try_next().unwrap().is_none());
            ready();
            while lat.len() < events {
                let e = t.next().unwrap().unwrap();
                lat.push((index_of(&e.content), now_ns()));
            }
        }
        Backend::Sse => {
            let (url, token, run) = sse_target(target);
            // The server opens the subscription before it answers: once the response
            // head is here, every later append reaches this stream.
            let resp = ureq::get(&format!("{url}/v1/runs/{run}/events"))
                .query("follow", "1")
                .query("from_seq", "2")
                .query("as", "tailer")
                .set("Authorization", &format!("Bearer {token}"))
                .call()
                .unwrap();
            ready();
            let mut lines = BufReader::new(resp.into_reader()).lines();
            while lat.len() < events {
                let l = lines.next().expect("the stream ended").unwrap();
                if let Some(data) = l.strip_prefix("data:") {
                    let now = now_ns();
                    let e: Value = serde_json::from_str(data.trim()).unwrap();
                    lat.push((index_of(&e["content"]), now));
                }
            }
        }
        Backend::Redis => {
            let (port, key) = target.split_once('|').expect("port|key");
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
            let mut con = client.get_connection().unwrap();
            let _: String = redis::cmd("PING").query(&mut con).unwrap();
            ready();
            let mut last = "0-0".to_string();
            while lat.len() < events {
                let v: redis::Value = redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(1000)
                    .arg("BLOCK")
                    .arg(0)
                    .arg("STREAMS")
                    .arg(key)
                    .arg(&last)
                    .query(&mut con)
                    .unwrap();
                let now = now_ns();
                for (id, body) in xread_entries(v) {
                    let v: Value = serde_json::from_slice(&body).unwrap();
                    lat.push((index_of(&v), now));
                    last = id;
                }
            }
        }
        Backend::Sqlite => {
            let poll = Duration::from_micros(env_or("TAIL_BENCH_SQLITE_POLL_US", 1000));
            let db = rusqlite::Connection::open(target).unwrap();
            db.busy_timeout(Duration::from_secs(10)).unwrap();
            let mut version: i64 = -1;
            let mut last: i64 = 0;
            ready();
            while lat.len() < events {
                let v: i64 = db
                    .query_row("PRAGMA data_version", [], |r| r.get(0))
                    .unwrap();
                if v == version {
                    std::thread::sleep(poll);
                    continue;
                }
                version = v;
                let mut st = db
                    .prepare_cached("SELECT seq, body FROM ev WHERE seq > ?1 ORDER BY seq")
                    .unwrap();
                let rows: Vec<(i64, String)> = st
                    .query_map([last], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                let now = now_ns();
                for (seq, body) in rows {
                    let v: Value = serde_json::from_str(&body).unwrap();
                    lat.push((index_of(&v), now));
                    last = seq;
                }
            }
        }
    }
    report(&lat);
}

/// `[[key, [[id, [field, value]], ...]]]` -> (id, value) pairs.
fn xread_entries(v: redis::Value) -> Vec<(String, Vec<u8>)> {
    use redis::Value as V;
    let mut out = Vec::new();
    let V::Array(streams) = v else { return out };
    for s in streams {
        let V::Array(mut kv) = s else { continue };
        let Some(V::Array(entries)) = kv.pop() else {
            continue;
        };
        for e in entries {
            let V::Array(mut pair) = e else { continue };
            let (Some(V::Array(mut fields)), Some(V::BulkString(id))) = (pair.pop(), pair.pop())
            else {
                continue;
            };
            if let Some(V::BulkString(body)) = fields.pop() {
                out.push((String::from_utf8(id).unwrap(), body));
            }
        }
    }
    out
}

fn writer(backend: Backend, target: &str, events: usize) {
    let gap = Duration::from_micros(env_or("TAIL_BENCH_GAP_US", 2000));
    let first: u64 = env_or("TAIL_BENCH_FIRST", 0);
    let mut starts = Vec::with_capacity(events);
    let mut acks = Vec::with_capacity(events);
    let payload = |i: u64| json!({"i": i, "pad": "p".repeat(64)});
    // One closure per backend that appends durably and returns when acknowledged.
    let mut append: Box<dyn FnMut(Value)> = match backend {
        Backend::Sse => {
            let (url, token, run) = sse_target(target);
            let agent = ureq::AgentBuilder::new().build();
            let (url, auth) = (
                format!("{url}/v1/runs/{run}/events"),
                format!("Bearer {token}"),
            );
            Box::new(move |v| {
                let body = json!({"agent_id": "writer", "type": "evidence", "content": v});
                agent
                    .post(&url)
                    .set("Authorization", &auth)
                    .send_json(body)
                    .unwrap();
            })
        }
        Backend::Swarm => {
            let (data, run) = target.split_once('|').unwrap();
            let store = Store::open(data).unwrap();
            let run = run.to_string();
            Box::new(move |v| {
                let ev = NewEvent::new("writer", EventType::Evidence, v);
                store.append(&run, ev, Durability::Sync).unwrap();
            })
        }
        Backend::Redis => {
            let (port, key) = target.split_once('|').unwrap();
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
            let mut con = client.get_connection().unwrap();
            let key = key.to_string();
            Box::new(move |v| {
                let _: String = redis::cmd("XADD")
                    .arg(&key)
                    .arg("*")
                    .arg("d")
                    .arg(v.to_string())
                    .query(&mut con)
                    .unwrap();
            })
        }
        Backend::Sqlite => {
            let db = rusqlite::Connection::open(target).unwrap();
            db.busy_timeout(Duration::from_secs(10)).unwrap();
            db.pragma_update(None, "synchronous", "FULL").unwrap();
            Box::new(move |v| {
                db.execute("INSERT INTO ev(body) VALUES (?1)", [v.to_string()])
                    .unwrap();
            })
        }
    };
    for i in first..first + events as u64 {
        let v = payload(i);
        let t0 = now_ns();
        append(v);
        let t1 = now_ns();
        starts.push((i, t0));
        acks.push((i, t1));
        std::thread::sleep(gap);
    }
    report(&starts);
    report(&acks);
}

/// `url|token|run` of the SSE backend.
fn sse_target(target: &str) -> (&str, &str, &str) {
    let mut p = target.splitn(3, '|');
    match (p.next(), p.next(), p.next()) {
        (Some(u), Some(t), Some(r)) => (u, t, r),
        _ => panic!("sse target: url|token|run"),
    }
}

// ---------------------------------------------------------------- the driver

/// A `swarm serve` on a free loopback port over its own data dir, with an agent token
/// that may act as any agent.
struct Serve {
    child: Child,
    url: String,
    token: String,
    data: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_serve(work: &Path) -> Serve {
    let swarm = env!("CARGO_BIN_EXE_swarm");
    let data = work.join("serve-data");
    std::fs::create_dir_all(&data).unwrap();
    let out = Command::new(swarm)
        .arg("--data-dir")
        .arg(&data)
        .args(["token", "add", "--role", "agent", "--agent", "*"])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let mut child = Command::new(swarm)
        .arg("--data-dir")
        .arg(&data)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("SWARM_EMBED_MODEL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first
        .trim()
        .strip_prefix("listening on ")
        .expect("swarm serve did not start")
        .to_string();
    Serve {
        child,
        url,
        token,
        data,
    }
}

/// The server's resident memory (`VmRSS` of /proc), in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// 1,000 (`TAIL_BENCH_IDLE`) SSE subscribers on one run that sit idle: the server's RSS
/// before and with them, and one append's delivery to all of them.
fn idle_subscribers(serve: &Serve) {
    let n: usize = env_or("TAIL_BENCH_IDLE", 1000);
    let run = "idle";
    let store = Store::open(&serve.data).unwrap();
    store
        .append(
            run,
            NewEvent::new("setup", EventType::Decision, "start"),
            Durability::Sync,
        )
        .unwrap();
    let before = rss_mib(serve.child.id());
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let mut joins = Vec::new();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    for _ in 0..n {
        let (url, token, tx, ready_tx) = (
            serve.url.clone(),
            serve.token.clone(),
            tx.clone(),
            ready_tx.clone(),
        );
        joins.push(
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    let resp = ureq::get(&format!("{url}/v1/runs/{run}/events"))
                        .query("follow", "1")
                        .query("from_seq", "2")
                        .query("as", "idler")
                        .set("Authorization", &format!("Bearer {token}"))
                        .call();
                    let _ = ready_tx.send(());
                    let Ok(resp) = resp else { return };
                    for l in BufReader::new(resp.into_reader()).lines() {
                        match l {
                            Ok(l) if l.starts_with("data:") => {
                                let _ = tx.send(());
                                return;
                            }
                            Ok(_) => {}
                            Err(_) => return,
                        }
                    }
                })
                .unwrap(),
        );
    }
    for _ in 0..n {
        ready_rx.recv().unwrap();
    }
    std::thread::sleep(Duration::from_secs(2));
    let with = rss_mib(serve.child.id());
    let t = Instant::now();
    store
        .append(
            run,
            NewEvent::new("writer", EventType::Evidence, "wake"),
            Durability::Sync,
        )
        .unwrap();
    let mut got = 0;
    while got < n && rx.recv_timeout(Duration::from_secs(30)).is_ok() {
        got += 1;
    }
    let all = t.elapsed();
    println!();
    println!("| idle SSE subscribers on one run | server RSS before | with them | per subscriber | one append delivered to | in | target |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {n} | {before:.0} MiB | {with:.0} MiB | {:.0} KiB | {got} of {n} | {:.0} ms | < 200 MiB |",
        (with - before) * 1024.0 / n as f64,
        all.as_secs_f64() * 1e3
    );
    drop(joins);
}

struct Redis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis() -> Option<Redis> {
    let bin = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())?;
    let dir = tempfile::tempdir().ok()?;
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new(bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .args(["--save", "", "--daemonize", "no", "--protected-mode", "no"])
        .arg("--dir")
        .arg(dir.path())
        .arg("--logfile")
        .arg(dir.path().join("redis.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let r = Redis {
        child,
        port,
        _dir: dir,
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if let Ok(mut c) = client.get_connection() {
            if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                return Some(r);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Everything measured for one (tailers, system) pair, pooled over rounds.
struct Cell {
    tailers: usize,
    backend: Backend,
    /// Append start to delivery, per delivery, ns.
    e2e: Vec<u64>,
    /// Acknowledgement to delivery, per delivery, ns (negative: delivered before the ack
    /// reached the writer).
    after_ack: Vec<i64>,
    /// Append start to acknowledgement, per append, ns.
    appends: Vec<u64>,
}

/// The `p`th percentile of sorted nanoseconds, in milliseconds.
fn pct(sorted: &[u64], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = (sorted.len() * p / 100).min(sorted.len() - 1);
    sorted[i] as f64 / 1e6
}

fn spawn_role(role: &str, backend: Backend, target: &str, events: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env(ROLE, role)
        .env("TAIL_BENCH_BACKEND", backend.key())
        .env("TAIL_BENCH_TARGET", target)
        .env("TAIL_BENCH_EVENTS", events.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Parses a `report` line into a map from event index to time.
fn read_times(r: &mut impl BufRead) -> HashMap<u64, u64> {
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    l.split_whitespace()
        .map(|x| {
            let (i, t) = x.split_once(':').unwrap();
            (i.parse().unwrap(), t.parse().unwrap())
        })
        .collect()
}

/// One round of one cell: fresh store/stream/database, `tailers` subscribed processes,
/// one writer process.
fn run_round(
    cell: &mut Cell,
    events: usize,
    work: &Path,
    redis: Option<&Redis>,
    serve: Option<&Serve>,
    n: usize,
) {
    let target = match cell.backend {
        Backend::Swarm => {
            let data = work.join(format!("swarm-{n}"));
            let run = "bench";
            let store =
                Store::open_with(Arc::new(FsStorage), &data, LogOptions::default()).unwrap();
            store
                .append(
                    run,
                    NewEvent::new("setup", EventType::Decision, "start"),
                    Durability::Sync,
                )
                .unwrap();
            format!("{}|{run}", data.display())
        }
        Backend::Sse => {
            let serve = serve.expect("a server for the SSE cells");
            let run = format!("bench-{n}");
            let store = Store::open(&serve.data).unwrap();
            store
                .append(
                    &run,
                    NewEvent::new("setup", EventType::Decision, "start"),
                    Durability::Sync,
                )
                .unwrap();
            format!("{}|{}|{run}", serve.url, serve.token)
        }
        Backend::Redis => {
            let port = redis.map(|r| r.port).unwrap_or(0);
            format!("{port}|bench:{n}")
        }
        Backend::Sqlite => {
            let path = work.join(format!("sqlite-{n}.db"));
            let db = rusqlite::Connection::open(&path).unwrap();
            db.pragma_update(None, "journal_mode", "WAL").unwrap();
            db.pragma_update(None, "synchronous", "FULL").unwrap();
            db.execute_batch("CREATE TABLE ev(seq INTEGER PRIMARY KEY, body TEXT NOT NULL);")
                .unwrap();
            path.display().to_string()
        }
    };
    let mut children: Vec<(Child, BufReader<std::process::ChildStdout>)> = (0..cell.tailers)
        .map(|_| {
            let mut c = spawn_role("tailer", cell.backend, &target, events);
            let out = BufReader::new(c.stdout.take().unwrap());
            (c, out)
        })
        .collect();
    for (_, out) in &mut children {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "ready");
    }
    let mut w = spawn_role("writer", cell.backend, &target, events);
    let mut wout = BufReader::new(w.stdout.take().unwrap());
    let starts = read_times(&mut wout);
    let acks = read_times(&mut wout);
    assert!(w.wait().unwrap().success());
    for i in WARMUP as u64..events as u64 {
        cell.appends.push(acks[&i] - starts[&i]);
    }
    for (mut c, mut out) in children {
        let got = read_times(&mut out);
        assert!(c.wait().unwrap().success());
        assert_eq!(got.len(), events, "a tailer missed events");
        for (i, d) in got {
            if i < WARMUP as u64 {
                continue;
            }
            cell.e2e.push(d.saturating_sub(starts[&i]));
            cell.after_ack.push(d as i64 - acks[&i] as i64);
        }
    }
}

fn orchestrate() {
    let events: usize = env_or("TAIL_BENCH_EVENTS", 100).max(WARMUP + 10);
    let rounds: usize = env_or("TAIL_BENCH_ROUNDS", 3).max(1);
    let tailer_counts: Vec<usize> = std::env::var("TAIL_BENCH_TAILERS")
        .unwrap_or_else(|_| "1,16".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let gap_us: u64 = env_or("TAIL_BENCH_GAP_US", 2000);
    let sqlite_poll_us: u64 = env_or("TAIL_BENCH_SQLITE_POLL_US", 1000);
    let work = tempfile::tempdir().unwrap();
    let redis = start_redis();
    if redis.is_none() {
        println!("note: redis-server not found (or did not start); the Redis rows are skipped");
    }
    println!(
        "tail latency: durable append in one process -> delivery in another process\n\
         {rounds} rounds x {events} events per cell ({WARMUP} warm-up per round), \
         {gap_us} us between appends, sqlite readers poll every {sqlite_poll_us} us"
    );
    // TAIL_BENCH_SYSTEMS: which systems (default all): swarm,sse,redis,sqlite.
    let systems =
        std::env::var("TAIL_BENCH_SYSTEMS").unwrap_or_else(|_| "swarm,sse,redis,sqlite".into());
    let want = |b: Backend| systems.split(',').any(|s| s.trim() == b.key());
    let serve = (want(Backend::Sse) || std::env::var_os("TAIL_BENCH_IDLE").is_some())
        .then(|| start_serve(work.path()));
    let mut backends = Vec::new();
    for b in [
        Backend::Swarm,
        Backend::Sse,
        Backend::Redis,
        Backend::Sqlite,
    ] {
        if want(b) && (b != Backend::Redis || redis.is_some()) {
            backends.push(b);
        }
    }
    let mut cells: Vec<Cell> = tailer_counts
        .iter()
        .flat_map(|&t| {
            backends.iter().map(move |&b| Cell {
                tailers: t,
                backend: b,
                e2e: Vec::new(),
                after_ack: Vec::new(),
                appends: Vec::new(),
            })
        })
        .collect();
    let started = Instant::now();
    let mut n = 0;
    // Rounds interleave the systems (in a rotating order) so that a slow spell of the
    // disk hits all of them alike.
    for round in 0..rounds {
        for &t in &tailer_counts {
            for k in 0..backends.len() {
                let b = backends[(k + round) % backends.len()];
                n += 1;
                let Some(cell) = cells.iter_mut().find(|c| c.tailers == t && c.backend == b) else {
                    continue;
                };
                run_round(cell, events, work.path(), redis.as_ref(), serve.as_ref(), n);
            }
        }
        eprintln!(
            "  round {}/{rounds} done at {:.1} s",
            round + 1,
            started.elapsed().as_secs_f64()
        );
    }
    for c in &mut cells {
        c.e2e.sort_unstable();
        c.after_ack.sort_unstable();
        c.appends.sort_unstable();
    }
    println!();
    println!("| tailers | system              | p50 ms | p99 ms | max ms | append p50 ms | after ack p50 / p99 ms | p50 vs redis | p99 vs redis |");
    println!("|--------:|---------------------|-------:|-------:|-------:|--------------:|-----------------------:|-------------:|-------------:|");
    for c in &cells {
        let redis_cell = cells
            .iter()
            .find(|r| r.tailers == c.tailers && r.backend == Backend::Redis);
        let ratio = |p: usize| match redis_cell {
            Some(r) => format!("{:.2}x", pct(&c.e2e, p) / pct(&r.e2e, p)),
            None => "-".into(),
        };
        let f = |v: &[i64], p: usize| {
            if v.is_empty() {
                return f64::NAN;
            }
            v[(v.len() * p / 100).min(v.len() - 1)] as f64 / 1e6
        };
        println!(
            "| {:>7} | {:<19} | {:>6.2} | {:>6.2} | {:>6.2} | {:>13.2} | {:>10.2} / {:>9.2} | {:>12} | {:>12} |",
            c.tailers,
            c.backend.name(),
            pct(&c.e2e, 50),
            pct(&c.e2e, 99),
            c.e2e.last().map_or(f64::NAN, |&m| m as f64 / 1e6),
            pct(&c.appends, 50),
            f(&c.after_ack, 50),
            f(&c.after_ack, 99),
            ratio(50),
            ratio(99),
        );
    }
    println!(
        "(after ack: delivery time minus the writer's acknowledgement time; negative when the"
    );
    println!(" tailer had the event before the writer's call returned)");
    if let Some(s) = &serve {
        idle_subscribers(s);
    }
}
