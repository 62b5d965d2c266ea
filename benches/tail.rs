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
    Redis,
    Sqlite,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Swarm => "swarm-memory tail",
            Backend::Redis => "redis XREAD BLOCK",
            Backend::Sqlite => "sqlite data_version",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Backend::Swarm => "swarm",
            Backend::Redis => "redis",
            Backend::Sqlite => "sqlite",
        }
    }
    fn parse(s: &str) -> Option<Backend> {
        [Backend::Swarm, Backend::Redis, Backend::Sqlite]
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

/// Prints the latencies (µs) of events `WARMUP..` as one line.
fn report(lat_us: &[u64]) {
    let line: Vec<String> = lat_us.iter().skip(WARMUP).map(u64::to_string).collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", line.join(" ")).unwrap();
    out.flush().unwrap();
}

fn ready() {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
}

fn t0_of(v: &Value) -> u64 {
    v["t0"].as_u64().expect("t0")
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
                lat.push((now_ns().saturating_sub(t0_of(&e.content))) / 1000);
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
                    lat.push(now.saturating_sub(t0_of(&v)) / 1000);
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
                    lat.push(now.saturating_sub(t0_of(&v)) / 1000);
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
    let mut lat = Vec::with_capacity(events);
    let payload = |i: usize| json!({"t0": now_ns(), "i": i, "pad": "p".repeat(64)});
    match backend {
        Backend::Swarm => {
            let (data, run) = target.split_once('|').unwrap();
            let store = Store::open(data).unwrap();
            for i in 0..events {
                let start = Instant::now();
                let ev = NewEvent::new("writer", EventType::Evidence, payload(i));
                store.append(run, ev, Durability::Sync).unwrap();
                lat.push(start.elapsed().as_micros() as u64);
                std::thread::sleep(gap);
            }
        }
        Backend::Redis => {
            let (port, key) = target.split_once('|').unwrap();
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
            let mut con = client.get_connection().unwrap();
            for i in 0..events {
                let start = Instant::now();
                let _: String = redis::cmd("XADD")
                    .arg(key)
                    .arg("*")
                    .arg("d")
                    .arg(payload(i).to_string())
                    .query(&mut con)
                    .unwrap();
                lat.push(start.elapsed().as_micros() as u64);
                std::thread::sleep(gap);
            }
        }
        Backend::Sqlite => {
            let db = rusqlite::Connection::open(target).unwrap();
            db.busy_timeout(Duration::from_secs(10)).unwrap();
            db.pragma_update(None, "synchronous", "FULL").unwrap();
            for i in 0..events {
                let start = Instant::now();
                db.execute("INSERT INTO ev(body) VALUES (?1)", [payload(i).to_string()])
                    .unwrap();
                lat.push(start.elapsed().as_micros() as u64);
                std::thread::sleep(gap);
            }
        }
    }
    report(&lat);
}

// ---------------------------------------------------------------- the driver

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

struct Cell {
    tailers: usize,
    backend: Backend,
    deliveries: Vec<u64>,
    appends: Vec<u64>,
}

fn pct(sorted: &[u64], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = (sorted.len() * p / 100).min(sorted.len() - 1);
    sorted[i] as f64 / 1000.0
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

fn read_numbers(line: &str) -> Vec<u64> {
    line.split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect()
}

fn run_cell(
    backend: Backend,
    tailers: usize,
    events: usize,
    work: &Path,
    redis: Option<&Redis>,
    n: usize,
) -> Cell {
    let target = match backend {
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
    let mut children: Vec<(Child, BufReader<std::process::ChildStdout>)> = (0..tailers)
        .map(|_| {
            let mut c = spawn_role("tailer", backend, &target, events);
            let out = BufReader::new(c.stdout.take().unwrap());
            (c, out)
        })
        .collect();
    for (_, out) in &mut children {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "ready");
    }
    let mut w = spawn_role("writer", backend, &target, events);
    let mut wout = BufReader::new(w.stdout.take().unwrap());
    let mut l = String::new();
    wout.read_line(&mut l).unwrap();
    let appends = read_numbers(&l);
    assert!(w.wait().unwrap().success());
    let mut deliveries = Vec::new();
    for (mut c, mut out) in children {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        deliveries.extend(read_numbers(&l));
        assert!(c.wait().unwrap().success());
    }
    deliveries.sort_unstable();
    let mut appends = appends;
    appends.sort_unstable();
    Cell {
        tailers,
        backend,
        deliveries,
        appends,
    }
}

fn orchestrate() {
    let events: usize = env_or("TAIL_BENCH_EVENTS", 300).max(WARMUP + 10);
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
        println!("note: redis-server not found (or did not start); the Redis column is skipped");
    }
    println!(
        "tail latency: durable append in one process -> delivery in another; {events} events per cell \
         ({WARMUP} warm-up), {gap_us} us between appends, sqlite polls every {sqlite_poll_us} us"
    );
    let mut backends = vec![Backend::Swarm];
    if redis.is_some() {
        backends.push(Backend::Redis);
    }
    backends.push(Backend::Sqlite);
    let mut cells = Vec::new();
    let mut n = 0;
    for &t in &tailer_counts {
        for &b in &backends {
            n += 1;
            let started = Instant::now();
            let c = run_cell(b, t, events, work.path(), redis.as_ref(), n);
            eprintln!(
                "  {:>2} tailers  {:<20} done in {:.1} s",
                t,
                b.name(),
                started.elapsed().as_secs_f64()
            );
            cells.push(c);
        }
    }
    println!();
    println!(
        "| tailers | system              | p50 ms | p99 ms | max ms | append p50 ms | p50 / redis | p99 / redis |"
    );
    println!(
        "|--------:|---------------------|-------:|-------:|-------:|--------------:|------------:|------------:|"
    );
    for c in &cells {
        let redis_cell = cells
            .iter()
            .find(|r| r.tailers == c.tailers && r.backend == Backend::Redis);
        let ratio = |p: usize| match redis_cell {
            Some(r) => format!("{:.2}", pct(&c.deliveries, p) / pct(&r.deliveries, p)),
            None => "-".into(),
        };
        println!(
            "| {:>7} | {:<19} | {:>6.2} | {:>6.2} | {:>6.2} | {:>13.2} | {:>11} | {:>11} |",
            c.tailers,
            c.backend.name(),
            pct(&c.deliveries, 50),
            pct(&c.deliveries, 99),
            c.deliveries.last().map_or(f64::NAN, |&m| m as f64 / 1000.0),
            pct(&c.appends, 50),
            ratio(50),
            ratio(99),
        );
    }
}
