//! Append benchmark (issue 2, point 11): `cargo bench --bench append`.
//!
//! Durable appends of ~250-byte events from 1, 4 and 16 writer *processes*, side by side
//! in the same run with three peers a user could pick instead:
//! - `swarm-memory`: `Store::append(.., Durability::Sync)` (fdatasync'ed, group-committed);
//! - `jsonl`: the seed 004 prototype, a JSONL file with `flock` + `write` + `fsync` per event;
//! - `sqlite`: SQLite in WAL mode, `synchronous=FULL`, one transaction per event;
//! - `redis`: Redis Streams `XADD` with `appendonly yes`, `appendfsync always` (skipped
//!   with a note when `redis-server` is not installed).
//!
//! Plus, in one process: `none`-mode throughput (one event per call from several threads,
//! and the batch API) and `sync` throughput with 64 threads.
//!
//! Writer processes are this same binary re-executed with `SWARM_BENCH_WORKER` set; they
//! get ready (open files, connect), report `ready`, wait for `go` on stdin (a barrier),
//! append for a warm-up and then for `SWARM_BENCH_SECS` seconds, and write each measured
//! append's latency to a file. Every peer's files live under one temporary directory on
//! the repository's disk (`target/tmp`, or `SWARM_BENCH_DIR`), never on tmpfs, so every
//! fsync reaches the same real device.
//!
//! Environment: `SWARM_BENCH_SECS` (default 3) measured seconds per cell;
//! `SWARM_BENCH_PEERS` (default `swarm,jsonl,sqlite,redis,local`; `local` is the three
//! one-process cells `none1,nonebatch,sync64`, where `sync64` runs the 64-thread `none`
//! cell beside it, the two alternating in 4 slices of the window each, and `none64` runs
//! that one alone; `swarm-noprealloc` adds the process
//! cells with preallocated segments turned off) and `SWARM_BENCH_PROCS` (default
//! `1,4,16`) select cells;
//! `SWARM_BENCH_DIR` the parent of the temporary data directory; `SWARM_BENCH_REDIS` the
//! `redis-server` binary.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use swarm_memory::{Durability, Event, EventType, NewEvent, Store, Ts};

/// Writer-process counts of the multi-process cells.
const PROCS: [usize; 3] = [1, 4, 16];
/// Threads of the single-process durable cell.
const SYNC_THREADS: usize = 64;
/// The 64-thread `none` and `sync` cells run in this many alternating slices each.
const SYNC64_SLICES: usize = 4;
/// Events per call in the batch-API `none` cell.
const NONE_BATCH_EVENTS: usize = 1000;
/// Target size of one event as stored (JSON), in bytes.
const EVENT_BYTES: usize = 250;

// Issue 12's acceptance.
const TARGET_VS_REDIS: f64 = 1.2;
const TARGET_NONE: f64 = 1_000_000.0;
const TARGET_SYNC_64_THREADS: f64 = 100_000.0;
const TARGET_SYNC_VS_NONE: f64 = 0.75;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Peer {
    Swarm,
    /// swarm-memory with `SWARM_PREALLOC_BYTES=0`: every durable append grows the file.
    SwarmNoPrealloc,
    Jsonl,
    Sqlite,
    Redis,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Swarm => "swarm",
            Peer::SwarmNoPrealloc => "swarm-noprealloc",
            Peer::Jsonl => "jsonl",
            Peer::Sqlite => "sqlite",
            Peer::Redis => "redis",
        }
    }
    fn parse(s: &str) -> Option<Peer> {
        [
            Peer::Swarm,
            Peer::SwarmNoPrealloc,
            Peer::Jsonl,
            Peer::Sqlite,
            Peer::Redis,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }
    fn is_swarm(self) -> bool {
        matches!(self, Peer::Swarm | Peer::SwarmNoPrealloc)
    }
    fn label(self) -> &'static str {
        match self {
            Peer::Swarm => "swarm-memory `sync`",
            Peer::SwarmNoPrealloc => "swarm-memory `sync`, no preallocation",
            Peer::Jsonl => "seed 004 JSONL (flock+write+fsync)",
            Peer::Sqlite => "SQLite WAL, synchronous=FULL",
            Peer::Redis => "Redis Streams XADD, AOF always",
        }
    }
}

/// What one measured cell produced.
#[derive(Clone, Debug)]
struct Cell {
    key: String,
    label: String,
    writers: String,
    events: u64,
    secs: f64,
    /// Per-call latencies in nanoseconds, sorted.
    lat_ns: Vec<u64>,
    events_per_call: usize,
    /// swarm-memory cells: fdatasyncs made (events per fsync = events / fsyncs).
    fsyncs: Option<u64>,
    /// CPU (user + sys) of the appending processes during the window, in ns.
    cpu_ns: Option<u64>,
}

impl Cell {
    fn rate(&self) -> f64 {
        self.events as f64 / self.secs
    }
    fn per_fsync(&self) -> Option<f64> {
        self.fsyncs
            .filter(|&f| f > 0)
            .map(|f| self.events as f64 / f as f64)
    }
    fn cpu_us_per_event(&self) -> Option<f64> {
        self.cpu_ns
            .filter(|_| self.events > 0)
            .map(|c| c as f64 / 1e3 / self.events as f64)
    }
    fn pct_ms(&self, p: f64) -> f64 {
        if self.lat_ns.is_empty() {
            return f64::NAN;
        }
        let i = ((self.lat_ns.len() as f64 * p / 100.0) as usize).min(self.lat_ns.len() - 1);
        self.lat_ns[i] as f64 / 1e6
    }
}

struct Cfg {
    secs: f64,
    warmup: Duration,
}

fn env_secs() -> f64 {
    std::env::var("SWARM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(3.0)
}

fn cfg() -> Cfg {
    let secs = env_secs();
    Cfg {
        secs,
        warmup: Duration::from_secs_f64((secs / 10.0).clamp(0.2, 1.0)),
    }
}

/// CPU time (user + sys) this process has used, in ns, from `/proc/self/stat` (clock
/// ticks: 10 ms resolution, fine over a window of seconds).
fn cpu_ns() -> u64 {
    let stat = fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    ticks * 10_000_000
}

/// A ~250-byte stored event: the content is padded so the event's JSON is `EVENT_BYTES`.
fn new_event(agent: &str) -> NewEvent {
    let probe = |content: String| Event {
        run_id: "bench".into(),
        seq: 123_456,
        ts: Ts::now(),
        id: "swarm:0123456789abcdef.1e240".into(),
        agent_id: agent.into(),
        user_id: "anonymous".into(),
        kind: EventType::Evidence,
        content: content.into(),
        confidence: None,
        refs: Vec::new(),
        subject: None,
        session_id: None,
        meta: None,
    };
    let base = "db-1 p99 latency 870ms since 14:02, pool 100/100 busy";
    let len = serde_json::to_vec(&probe(base.into())).unwrap().len();
    let content = format!("{base}{}", ".".repeat(EVENT_BYTES.saturating_sub(len)));
    NewEvent::new(agent, EventType::Evidence, content)
}

/// The JSON line a peer stores for event `seq`: the same shape and size as a stored
/// swarm-memory event, serialized per append as the prototype would.
fn peer_line(agent: &str, content: &str, seq: u64) -> String {
    let ev = Event {
        run_id: "bench".into(),
        seq,
        ts: Ts::now(),
        id: format!("{agent}.{seq}"),
        agent_id: agent.into(),
        user_id: "anonymous".into(),
        kind: EventType::Evidence,
        content: content.into(),
        confidence: None,
        refs: Vec::new(),
        subject: None,
        session_id: None,
        meta: None,
    };
    serde_json::to_string(&ev).unwrap()
}

/// [`run_loop`], plus the measured window's share of the whole loop's time (to scale
/// counters read before and after the loop).
fn run_loop_window(cfg: &Cfg, op: impl FnMut() -> usize) -> (u64, Vec<u64>, f64) {
    let t = Instant::now();
    let (events, lat) = run_loop(cfg, op);
    (events, lat, cfg.secs / t.elapsed().as_secs_f64())
}

/// Runs `op` until the window closes; counts and times the calls that complete inside
/// the measured window (after the warm-up).
fn run_loop(cfg: &Cfg, mut op: impl FnMut() -> usize) -> (u64, Vec<u64>) {
    let start = Instant::now();
    let measure_from = start + cfg.warmup;
    let end = measure_from + Duration::from_secs_f64(cfg.secs);
    let mut lat = Vec::with_capacity(1 << 16);
    let mut events = 0u64;
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        let n = op();
        let t1 = Instant::now();
        if t1 >= measure_from && t1 < end {
            lat.push((t1 - t0).as_nanos() as u64);
            events += n as u64;
        }
    }
    (events, lat)
}

// ---------------------------------------------------------------------------------------
// Worker processes.

fn worker(spec: &str) {
    let peer = Peer::parse(spec).unwrap_or_else(|| panic!("unknown worker peer {spec:?}"));
    let target = std::env::var("SWARM_BENCH_TARGET").expect("SWARM_BENCH_TARGET");
    let id: usize = std::env::var("SWARM_BENCH_ID").unwrap().parse().unwrap();
    let out = PathBuf::from(std::env::var("SWARM_BENCH_OUT").expect("SWARM_BENCH_OUT"));
    let cfg = cfg();
    let agent = format!("agent-{id:02}");
    let ev = new_event(&agent);
    let content = ev.content.as_str().unwrap().to_string();
    let mut fsyncs: Box<dyn Fn() -> u64> = Box::new(|| 0);
    let mut op: Box<dyn FnMut() -> usize> = match peer {
        Peer::Swarm | Peer::SwarmNoPrealloc => {
            let (root, run) = target.split_once('#').expect("root#run");
            let store = Arc::new(Store::open(root).unwrap());
            // The first append loads the log head; it is not measured.
            store.append(run, ev.clone(), Durability::Sync).unwrap();
            let run = run.to_string();
            let (s, r) = (store.clone(), run.clone());
            fsyncs = Box::new(move || s.sync_counters(&r).fsyncs);
            Box::new(move || {
                store.append(&run, ev.clone(), Durability::Sync).unwrap();
                1
            })
        }
        Peer::Jsonl => {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&target)
                .unwrap();
            let mut seq = 0u64;
            Box::new(move || {
                seq += 1;
                let mut line = peer_line(&agent, &content, seq);
                line.push('\n');
                f.lock().unwrap();
                (&f).write_all(line.as_bytes()).unwrap();
                f.sync_all().unwrap();
                f.unlock().unwrap();
                1
            })
        }
        Peer::Sqlite => {
            let conn = rusqlite::Connection::open(&target).unwrap();
            conn.busy_timeout(Duration::from_secs(60)).unwrap();
            conn.pragma_update(None, "synchronous", "FULL").unwrap();
            let mode: String = conn
                .pragma_query_value(None, "journal_mode", |r| r.get(0))
                .unwrap();
            assert_eq!(mode, "wal");
            let mut seq = 0u64;
            Box::new(move || {
                seq += 1;
                let line = peer_line(&agent, &content, seq);
                // Autocommit: one transaction (and one WAL fsync) per event.
                conn.prepare_cached("INSERT INTO events(body) VALUES (?1)")
                    .unwrap()
                    .execute([&line])
                    .unwrap();
                1
            })
        }
        Peer::Redis => {
            let (addr, key) = target.split_once('#').expect("url#key");
            let client = redis::Client::open(addr).unwrap();
            let mut con = client.get_connection().unwrap();
            let key = key.to_string();
            let mut seq = 0u64;
            Box::new(move || {
                seq += 1;
                let line = peer_line(&agent, &content, seq);
                let _id: String = redis::cmd("XADD")
                    .arg(&key)
                    .arg("*")
                    .arg("ev")
                    .arg(&line)
                    .query(&mut con)
                    .unwrap();
                1
            })
        }
    };
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready").unwrap();
    stdout.flush().unwrap();
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    assert_eq!(go.trim(), "go");
    let (f0, c0) = (fsyncs(), cpu_ns());
    let (events, lat, window) = run_loop_window(&cfg, &mut op);
    // fsyncs and CPU over the whole loop (warm-up included), scaled to the window.
    let scale = |x: u64| (x as f64 * window) as u64;
    let (f1, c1) = (scale(fsyncs() - f0), scale(cpu_ns() - c0));
    drop(op);
    let mut bytes = Vec::with_capacity(lat.len() * 8);
    for l in &lat {
        bytes.extend_from_slice(&l.to_le_bytes());
    }
    fs::write(&out, bytes).unwrap();
    writeln!(stdout, "done {events} {f1} {c1}").unwrap();
    stdout.flush().unwrap();
}

struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    out: PathBuf,
}

/// Starts `procs` workers of `peer`, releases them together, and merges what they measured.
fn run_procs(peer: Peer, procs: usize, target: &str, tmp: &Path, cfg: &Cfg) -> Cell {
    let exe = std::env::current_exe().unwrap();
    let mut ws: Vec<Running> = (0..procs)
        .map(|i| {
            let out = tmp.join(format!("lat-{}-{procs}-{i}.bin", peer.name()));
            let mut cmd = Command::new(&exe);
            if peer == Peer::SwarmNoPrealloc {
                cmd.env("SWARM_PREALLOC_BYTES", "0");
            }
            let mut child = cmd
                .env("SWARM_BENCH_WORKER", peer.name())
                .env("SWARM_BENCH_TARGET", target)
                .env("SWARM_BENCH_ID", i.to_string())
                .env("SWARM_BENCH_OUT", &out)
                .env("SWARM_BENCH_SECS", cfg.secs.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            let stdin = child.stdin.take().unwrap();
            let stdout = BufReader::new(child.stdout.take().unwrap());
            Running {
                child,
                stdin,
                stdout,
                out,
            }
        })
        .collect();
    for w in &mut ws {
        let mut line = String::new();
        w.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "worker failed to get ready");
    }
    for w in &mut ws {
        w.stdin.write_all(b"go\n").unwrap();
        w.stdin.flush().unwrap();
    }
    let mut events = 0;
    let (mut fsyncs, mut cpu) = (0, 0);
    let mut lat = Vec::new();
    for mut w in ws {
        let mut line = String::new();
        w.stdout.read_line(&mut line).unwrap();
        let nums: Vec<u64> = line
            .trim()
            .strip_prefix("done ")
            .unwrap_or_else(|| panic!("worker said {line:?}"))
            .split(' ')
            .map(|x| x.parse().unwrap())
            .collect();
        events += nums[0];
        fsyncs += nums[1];
        cpu += nums[2];
        let status = w.child.wait().unwrap();
        assert!(status.success(), "worker exited with {status}");
        let b = fs::read(&w.out).unwrap();
        lat.extend(
            b.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
        );
    }
    lat.sort_unstable();
    Cell {
        key: format!("{}_{procs}p", peer.name()),
        label: peer.label().into(),
        writers: format!("{procs} proc{}", if procs == 1 { "" } else { "s" }),
        events,
        secs: cfg.secs,
        lat_ns: lat,
        events_per_call: 1,
        fsyncs: peer.is_swarm().then_some(fsyncs),
        cpu_ns: peer.is_swarm().then_some(cpu),
    }
}

/// Thread `t`'s op in the one-process cells: one event per call to `run`, as `d`.
fn one_append(
    store: &Arc<Store>,
    run: &'static str,
    d: Durability,
    t: usize,
) -> impl FnMut() -> usize + Send + 'static {
    let s = store.clone();
    let ev = new_event(&format!("agent-{t:02}"));
    move || {
        s.append(run, ev.clone(), d).unwrap();
        1
    }
}

/// Runs `threads` threads in this process, each with its own op, released together.
fn run_threads<F>(threads: usize, cfg: &Cfg, make_op: impl Fn(usize) -> F) -> (u64, Vec<u64>)
where
    F: FnMut() -> usize + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let mut op = make_op(i);
            let b = barrier.clone();
            let c = Cfg {
                secs: cfg.secs,
                warmup: cfg.warmup,
            };
            std::thread::spawn(move || {
                b.wait();
                run_loop(&c, &mut op)
            })
        })
        .collect();
    let mut events = 0;
    let mut lat = Vec::new();
    for h in handles {
        let (n, l) = h.join().unwrap();
        events += n;
        lat.extend(l);
    }
    lat.sort_unstable();
    (events, lat)
}

// ---------------------------------------------------------------------------------------
// Peers' setup.

struct Redis {
    child: Child,
    url: String,
}

impl Redis {
    fn find() -> Option<PathBuf> {
        if let Ok(p) = std::env::var("SWARM_BENCH_REDIS") {
            return Some(PathBuf::from(p));
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|d| d.join("redis-server"))
            .find(|p| p.is_file())
    }

    fn start(bin: &Path, dir: &Path) -> Result<Redis, String> {
        fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(dir)
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", "", "--daemonize", "no"])
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut r = Redis {
            child,
            url: format!("redis://127.0.0.1:{port}/"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ok = redis::Client::open(r.url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if ok.is_ok() {
                break;
            }
            if let Ok(Some(st)) = r.child.try_wait() {
                return Err(format!(
                    "redis-server exited with {st}; see its log in {}",
                    dir.display()
                ));
            }
            if Instant::now() > deadline {
                r.stop();
                return Err("redis-server did not answer PING within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut c = redis::Client::open(r.url.as_str())
            .and_then(|c| c.get_connection())
            .map_err(|e| e.to_string())?;
        let conf: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .query(&mut c)
            .map_err(|e| e.to_string())?;
        if conf.get(1).map(String::as_str) != Some("always") {
            r.stop();
            return Err(format!(
                "redis-server did not take appendfsync always: {conf:?}"
            ));
        }
        Ok(r)
    }

    fn stop(&mut self) {
        // Ask politely (no RDB save), then make sure.
        if let Ok(mut s) = TcpStream::connect(
            self.url
                .trim_start_matches("redis://")
                .trim_end_matches('/'),
        ) {
            let _ = s.write_all(b"SHUTDOWN NOSAVE\r\n");
            let mut sink = Vec::new();
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = s.read_to_end(&mut sink);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sqlite_setup(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.execute_batch(
        "CREATE TABLE events(seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);",
    )
    .unwrap();
}

/// The file system holding `path`, from `/proc/self/mounts` (longest matching mount).
fn fs_of(path: &Path) -> String {
    let path = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for l in mounts.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 3 {
            continue;
        }
        if path.starts_with(f[1]) && best.as_ref().is_none_or(|(n, _)| f[1].len() > *n) {
            best = Some((f[1].len(), format!("{} on {} ({})", f[1], f[0], f[2])));
        }
    }
    best.map_or_else(|| "unknown".into(), |b| b.1)
}

/// The raw cost of what every durable peer pays: append 250 bytes + `fdatasync`.
fn disk_probe(dir: &Path, secs: f64) -> Cell {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("probe.bin"))
        .unwrap();
    let line = [b'x'; EVENT_BYTES];
    let c = Cfg {
        secs,
        warmup: Duration::from_millis(100),
    };
    let (events, mut lat) = run_loop(&c, || {
        (&f).write_all(&line).unwrap();
        f.sync_data().unwrap();
        1
    });
    lat.sort_unstable();
    Cell {
        key: "disk_append_fdatasync".into(),
        label: "disk: 250-byte append + fdatasync".into(),
        writers: "1 thread".into(),
        events,
        secs,
        lat_ns: lat,
        events_per_call: 1,
        fsyncs: Some(events),
        cpu_ns: None,
    }
}

// ---------------------------------------------------------------------------------------
// Report.

fn fmt_rate(r: f64) -> String {
    let n = r.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn fmt_ms(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v < 0.1 {
        format!("{v:.3}")
    } else {
        format!("{v:.2}")
    }
}

fn main() {
    if let Ok(spec) = std::env::var("SWARM_BENCH_WORKER") {
        worker(&spec);
        return;
    }
    let cfg = cfg();
    let peers_sel = std::env::var("SWARM_BENCH_PEERS")
        .unwrap_or_else(|_| "swarm,jsonl,sqlite,redis,local".into());
    let want = |name: &str| peers_sel.split(',').any(|p| p.trim() == name);
    let parent = std::env::var_os("SWARM_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    fs::create_dir_all(&parent).unwrap();
    let tmp = tempfile::Builder::new()
        .prefix("swarm-bench-")
        .tempdir_in(&parent)
        .unwrap();
    let fsinfo = fs_of(tmp.path());
    eprintln!(
        "swarm-memory append bench: {} s per cell (+{} ms warm-up), data in {} [{fsinfo}], {} cores",
        cfg.secs,
        cfg.warmup.as_millis(),
        tmp.path().display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if fsinfo.contains("(tmpfs)") || fsinfo.contains("(ramfs)") {
        eprintln!(
            "WARNING: the data directory is on a RAM file system; fsync costs nothing there. \
             Set SWARM_BENCH_DIR to a directory on a real disk."
        );
    }
    let mut cells: Vec<Cell> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let report = |c: &Cell| {
        eprintln!(
            "  {:<40} {:<11} {:>12} ev/s  p50 {:>7} ms  p99 {:>7} ms  {:>6} ev/fsync  {:>6} µs CPU/ev",
            c.label,
            c.writers,
            fmt_rate(c.rate()),
            fmt_ms(c.pct_ms(50.0)),
            fmt_ms(c.pct_ms(99.0)),
            c.per_fsync().map_or("-".into(), |x| format!("{x:.1}")),
            c.cpu_us_per_event().map_or("-".into(), |x| format!("{x:.1}")),
        );
    };

    let probe = disk_probe(tmp.path(), (cfg.secs / 3.0).clamp(0.5, 2.0));
    report(&probe);
    cells.push(probe);

    let redis_bin = Redis::find();
    let mut redis: Option<Redis> = None;
    if want("redis") {
        match &redis_bin {
            None => notes.push(
                "redis: skipped, `redis-server` is not installed (set SWARM_BENCH_REDIS to its path)"
                    .into(),
            ),
            Some(bin) => match Redis::start(bin, &tmp.path().join("redis")) {
                Ok(r) => redis = Some(r),
                Err(e) => notes.push(format!("redis: skipped, {e}")),
            },
        }
    }
    let procs_sel: Vec<usize> = std::env::var("SWARM_BENCH_PROCS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| PROCS.to_vec());
    for procs in procs_sel.iter().copied() {
        for peer in [
            Peer::Swarm,
            Peer::SwarmNoPrealloc,
            Peer::Jsonl,
            Peer::Sqlite,
            Peer::Redis,
        ] {
            if !want(peer.name()) {
                continue;
            }
            let target = match peer {
                Peer::Swarm | Peer::SwarmNoPrealloc => {
                    let root = tmp.path().join(peer.name());
                    let run = format!("bench-{procs}p");
                    // Create the run up front so the workers only append.
                    let store = Store::open(&root).unwrap();
                    store
                        .append(&run, new_event("setup"), Durability::Sync)
                        .unwrap();
                    format!("{}#{run}", root.display())
                }
                Peer::Jsonl => {
                    let p = tmp.path().join(format!("jsonl-{procs}p.jsonl"));
                    p.display().to_string()
                }
                Peer::Sqlite => {
                    let p = tmp.path().join(format!("sqlite-{procs}p.db"));
                    sqlite_setup(&p);
                    p.display().to_string()
                }
                Peer::Redis => match &redis {
                    Some(r) => format!("{}#bench-{procs}p", r.url),
                    None => continue,
                },
            };
            let c = run_procs(peer, procs, &target, tmp.path(), &cfg);
            report(&c);
            cells.push(c);
            if peer == Peer::Swarm && Some(&procs) == procs_sel.last() {
                let store = Store::open(tmp.path().join(peer.name())).unwrap();
                let info = store.run_info(&format!("bench-{procs}p")).unwrap();
                notes.push(format!(
                    "swarm-memory stored {} bytes per event on disk in the {procs}-process run \
                     (one frame per append: 45-byte header + `[`..`]}}\\n` around the event)",
                    info.bytes / info.head_seq.max(1)
                ));
            }
        }
    }
    if let Some(mut r) = redis.take() {
        r.stop();
    }

    let local = want("local");
    if local || want("none1") || want("nonebatch") || want("sync64") || want("none64") {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let store = Arc::new(Store::open(tmp.path().join("local")).unwrap());
        // Each cell: its events, latencies, and the fsyncs and CPU of this process over
        // the cell (scaled to the measured window).
        let mut local_cell = |key: String,
                              label: String,
                              writers: String,
                              per_call,
                              run: &str,
                              f: &mut dyn FnMut() -> (u64, Vec<u64>)| {
            let (f0, c0, t0) = (store.sync_counters(run).fsyncs, cpu_ns(), Instant::now());
            let (events, lat) = f();
            let scale = cfg.secs / t0.elapsed().as_secs_f64();
            let fsyncs = store.sync_counters(run).fsyncs - f0;
            let c = Cell {
                key,
                label,
                writers,
                events,
                secs: cfg.secs,
                lat_ns: lat,
                events_per_call: per_call,
                fsyncs: (fsyncs > 0).then_some((fsyncs as f64 * scale) as u64),
                cpu_ns: Some(((cpu_ns() - c0) as f64 * scale) as u64),
            };
            report(&c);
            cells.push(c);
        };
        let one_event = |run: &'static str, threads: usize, d: Durability| {
            let store = store.clone();
            let cfg = &cfg;
            move || {
                store.append(run, new_event("setup"), d).unwrap();
                run_threads(threads, cfg, |i| one_append(&store, run, d, i))
            }
        };

        // `none`, one event per call, from a few threads (combined into shared writes).
        if local || want("none1") {
            let none_threads = threads * 2;
            local_cell(
                format!("swarm_none_1ev_{none_threads}t"),
                "swarm-memory `none`, 1 event/call".into(),
                format!("{none_threads} threads"),
                1,
                "none-1",
                &mut one_event("none-1", none_threads, Durability::None),
            );
        }

        // `none`, batch API.
        if local || want("nonebatch") {
            store
                .append("none-batch", new_event("setup"), Durability::None)
                .unwrap();
            local_cell(
                format!("swarm_none_batch{NONE_BATCH_EVENTS}_{threads}t"),
                format!("swarm-memory `none`, batches of {NONE_BATCH_EVENTS}"),
                format!("{threads} threads"),
                NONE_BATCH_EVENTS,
                "none-batch",
                &mut || {
                    run_threads(threads, &cfg, |i| {
                        let s = store.clone();
                        let batch: Vec<NewEvent> = (0..NONE_BATCH_EVENTS)
                            .map(|_| new_event(&format!("agent-{i:02}")))
                            .collect();
                        move || {
                            s.append_batch("none-batch", batch.clone(), None, Durability::None)
                                .unwrap();
                            NONE_BATCH_EVENTS
                        }
                    })
                },
            );
        }

        // 64 threads, one event per call: `none` (the ceiling without the disk) and
        // `sync` (group commit: how close it gets to that ceiling), in alternating slices
        // of the window (`SYNC64_SLICES`), each cell the sum of its slices: this VM's CPU
        // cost per event drifts by up to 1.5x within a minute, and two cells measured one
        // after the other compared a slow-state `sync` with a fast-state `none` (or the
        // reverse) as often as not.
        let with_sync = local || want("sync64");
        if with_sync || want("none64") {
            let mut modes = vec![("none-64", Durability::None)];
            if with_sync {
                modes.push(("sync-64", Durability::Sync));
            }
            let slices = if with_sync { SYNC64_SLICES } else { 1 };
            let slice = Cfg {
                secs: cfg.secs / slices as f64,
                warmup: cfg.warmup,
            };
            // Per mode: events, latencies, fsyncs and CPU ns (each scaled to its slice's
            // measured window).
            let mut acc: Vec<(u64, Vec<u64>, f64, f64)> =
                modes.iter().map(|_| (0, Vec::new(), 0.0, 0.0)).collect();
            for (run, d) in &modes {
                store.append(run, new_event("setup"), *d).unwrap();
            }
            for _ in 0..slices {
                for (i, (run, d)) in modes.iter().enumerate() {
                    let (f0, c0, t0) = (store.sync_counters(run).fsyncs, cpu_ns(), Instant::now());
                    let (events, lat) =
                        run_threads(SYNC_THREADS, &slice, |t| one_append(&store, run, *d, t));
                    let scale = slice.secs / t0.elapsed().as_secs_f64();
                    let a = &mut acc[i];
                    a.0 += events;
                    a.1.extend(lat);
                    a.2 += (store.sync_counters(run).fsyncs - f0) as f64 * scale;
                    a.3 += (cpu_ns() - c0) as f64 * scale;
                }
            }
            for ((_, d), (events, mut lat, fsyncs, cpu)) in modes.iter().zip(acc) {
                lat.sort_unstable();
                let mode = if *d == Durability::Sync {
                    "sync"
                } else {
                    "none"
                };
                let c = Cell {
                    key: format!("swarm_{mode}_{SYNC_THREADS}t"),
                    label: format!("swarm-memory `{mode}`, 1 event/call"),
                    writers: format!("{SYNC_THREADS} threads"),
                    events,
                    secs: cfg.secs,
                    lat_ns: lat,
                    events_per_call: 1,
                    fsyncs: (fsyncs >= 1.0).then_some(fsyncs as u64),
                    cpu_ns: Some(cpu as u64),
                };
                report(&c);
                cells.push(c);
            }
        }
    }

    print_report(&cfg, &fsinfo, &cells, &notes);
}

fn print_report(cfg: &Cfg, fsinfo: &str, cells: &[Cell], notes: &[String]) {
    let by: BTreeMap<&str, &Cell> = cells.iter().map(|c| (c.key.as_str(), c)).collect();
    let rate = |k: &str| by.get(k).map(|c| c.rate());
    println!();
    println!(
        "### Append benchmark (`cargo bench --bench append`, {} s per cell, {} cores, {fsinfo})",
        cfg.secs,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    println!(
        "| peer | writers | events/s | p50 ms | p99 ms | events/fsync | CPU µs/event | swarm-memory ÷ peer |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for c in cells {
        let ratio = c
            .key
            .rsplit_once('_')
            .filter(|(p, _)| Peer::parse(p).is_some())
            .and_then(|(p, n)| {
                let ours = rate(&format!("swarm_{n}"))?;
                (p != "swarm").then(|| format!("{:.1}×", ours / c.rate()))
            })
            .unwrap_or_default();
        let calls = if c.events_per_call > 1 {
            " (per call)"
        } else {
            ""
        };
        println!(
            "| {} | {} | {} | {}{calls} | {}{calls} | {} | {} | {ratio} |",
            c.label,
            c.writers,
            fmt_rate(c.rate()),
            fmt_ms(c.pct_ms(50.0)),
            fmt_ms(c.pct_ms(99.0)),
            c.per_fsync().map_or(String::new(), |x| format!("{x:.1}")),
            c.cpu_us_per_event()
                .map_or(String::new(), |x| format!("{x:.1}")),
        );
    }
    println!();

    // Targets of issue 12 on this machine.
    let mut checks: Vec<(String, Option<bool>)> = Vec::new();
    let cell = |k: &str| by.get(k).copied();
    for n in [16, 4] {
        let (ours, redis) = (cell(&format!("swarm_{n}p")), cell(&format!("redis_{n}p")));
        let vs = ours
            .zip(redis)
            .map(|(a, b)| (a.rate() / b.rate(), a.pct_ms(99.0), b.pct_ms(99.0)));
        checks.push((
            format!(
                "{n} processes `sync` >= {TARGET_VS_REDIS}× Redis AOF-always at {n} clients{}: {}",
                if n == 16 { ", p99 no worse" } else { "" },
                vs.map_or("not run".into(), |(v, a, b)| format!(
                    "{v:.2}×, p99 {} ms vs {} ms",
                    fmt_ms(a),
                    fmt_ms(b)
                ))
            ),
            vs.map(|(v, a, b)| v >= TARGET_VS_REDIS && (n != 16 || a <= b)),
        ));
    }
    let none = cells
        .iter()
        .filter(|c| c.key.starts_with("swarm_none_batch"))
        .max_by(|a, b| a.rate().total_cmp(&b.rate()));
    checks.push((
        format!(
            "one process in `none` mode with batches >= {} events/s: {}",
            fmt_rate(TARGET_NONE),
            none.map_or("not run".into(), |c| format!(
                "{} ({}, {})",
                fmt_rate(c.rate()),
                c.label,
                c.writers
            ))
        ),
        none.map(|c| c.rate() >= TARGET_NONE),
    ));
    let s64 = rate(&format!("swarm_sync_{SYNC_THREADS}t"));
    let n64 = rate(&format!("swarm_none_{SYNC_THREADS}t"));
    checks.push((
        format!(
            "{SYNC_THREADS} threads `sync` >= {TARGET_SYNC_VS_NONE}× {SYNC_THREADS} threads `none` and >= {} events/s: {}",
            fmt_rate(TARGET_SYNC_64_THREADS),
            s64.zip(n64).map_or("not run".into(), |(s, n)| format!(
                "{} ({:.2}× of {})",
                fmt_rate(s),
                s / n,
                fmt_rate(n)
            ))
        ),
        s64.zip(n64)
            .map(|(s, n)| s >= TARGET_SYNC_64_THREADS && s / n >= TARGET_SYNC_VS_NONE),
    ));
    for (text, ok) in &checks {
        let mark = match ok {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "n/a",
        };
        println!("- target {text} — {mark}");
    }
    if let Some(d) = by.get("disk_append_fdatasync") {
        let f = d.pct_ms(50.0);
        println!(
            "- context: one 250-byte append + fdatasync takes {} ms (p50) on this disk, so N \
             writers with one durable append in flight each cannot exceed about N / {} ms",
            fmt_ms(f),
            fmt_ms(f)
        );
    }
    for n in notes {
        println!("- note: {n}");
    }

    // One JSON line with every figure.
    let mut json = serde_json::Map::new();
    json.insert("bench".into(), "append".into());
    json.insert("secs".into(), cfg.secs.into());
    json.insert("fs".into(), fsinfo.into());
    let mut cs = serde_json::Map::new();
    for c in cells {
        cs.insert(
            c.key.clone(),
            serde_json::json!({
                "label": c.label,
                "writers": c.writers,
                "events": c.events,
                "events_per_s": c.rate().round(),
                "calls": c.lat_ns.len(),
                "events_per_call": c.events_per_call,
                "p50_ms": (c.pct_ms(50.0) * 1000.0).round() / 1000.0,
                "p99_ms": (c.pct_ms(99.0) * 1000.0).round() / 1000.0,
                "events_per_fsync": c.per_fsync().map(|x| (x * 10.0).round() / 10.0),
                "cpu_us_per_event": c.cpu_us_per_event().map(|x| (x * 10.0).round() / 10.0),
            }),
        );
    }
    json.insert("cells".into(), cs.into());
    let mut ratios = serde_json::Map::new();
    for c in cells {
        if let Some((p, n)) = c.key.rsplit_once('_') {
            if p != "swarm" && Peer::parse(p).is_some() {
                if let Some(ours) = rate(&format!("swarm_{n}")) {
                    ratios.insert(
                        format!("swarm_vs_{}", c.key),
                        ((ours / c.rate() * 100.0).round() / 100.0).into(),
                    );
                }
            }
        }
    }
    json.insert("ratios".into(), ratios.into());
    json.insert(
        "targets_met".into(),
        serde_json::Value::Array(
            checks
                .iter()
                .map(|(t, ok)| serde_json::json!({"target": t, "met": ok}))
                .collect(),
        ),
    );
    println!();
    println!("{}", serde_json::Value::Object(json));
}
