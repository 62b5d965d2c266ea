//! Server benchmark (issue 13): `cargo bench --bench serve`.
//!
//! Durable appends over the network from 16 and 64 client *processes*, one request in
//! flight each, side by side with Redis:
//! - `swarm serve`: `POST /v1/runs/bench/events` (one ~250-byte event, `sync`: acknowledged
//!   after `fdatasync`), one keep-alive HTTP/1.1 connection per client, through a lean
//!   client (`LeanHttp`: one write per request, the response read whole by its
//!   `Content-Length`) or, with `SWARM_BENCH_HTTP=ureq`, through ureq;
//! - `redis`: Redis Streams `XADD` with `appendonly yes`, `appendfsync always`, one
//!   connection per client (skipped with a note when `redis-server` is not installed).
//!
//! Clients are this binary re-executed with `SWARM_BENCH_WORKER` set: they connect, say
//! `ready`, wait for `go` on stdin, append for a warm-up and then `SWARM_BENCH_SECS`
//! seconds, and write each measured latency to a file. Data lives under `target/tmp` (or
//! `SWARM_BENCH_DIR`): a real disk, so every fsync reaches the device.
//!
//! Environment: `SWARM_BENCH_SECS` (default 3), `SWARM_BENCH_CLIENTS` (default `16,64`),
//! `SWARM_BENCH_DIR`, `SWARM_BENCH_REDIS` (the `redis-server` binary).
//!
//! Then `context` and `board` over HTTP on a 100k-event run (`SWARM_BENCH_ONLY=views`
//! runs that cell alone). SSE tail latency and 1,000 idle subscribers are in
//! `cargo bench --bench tail` (`TAIL_BENCH_SYSTEMS=sse,redis`).

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SWARM: &str = env!("CARGO_BIN_EXE_swarm");
const WARMUP: Duration = Duration::from_millis(500);
const EVENT_BYTES: usize = 250;

fn event(client: &str, n: u64) -> String {
    let pad = "x".repeat(EVENT_BYTES.saturating_sub(120));
    format!(
        "{{\"agent_id\":\"a{client}\",\"type\":\"evidence\",\"content\":\"{n} {pad}\",\"subject\":\"s{client}\"}}"
    )
}

/// A client process: one request in flight until the time is up.
fn worker(kind: &str) {
    let target = std::env::var("SWARM_BENCH_TARGET").expect("target");
    let id = std::env::var("SWARM_BENCH_ID").expect("id");
    let out = PathBuf::from(std::env::var("SWARM_BENCH_OUT").expect("out"));
    let secs: f64 = std::env::var("SWARM_BENCH_SECS")
        .expect("secs")
        .parse()
        .expect("secs");
    let mut op: Box<dyn FnMut(u64)> = match kind {
        "swarm" if std::env::var("SWARM_BENCH_HTTP").as_deref() != Ok("ureq") => {
            let (url, token) = target.split_once('#').expect("url#token");
            let mut http = LeanHttp::connect(url, token, "/v1/runs/bench/events");
            let id = id.clone();
            Box::new(move |n| {
                let status = http.post(event(&id, n).as_bytes());
                assert_eq!(status, 201);
            })
        }
        "swarm" => {
            let (url, token) = target.split_once('#').expect("url#token");
            let agent = ureq::AgentBuilder::new().build();
            let (url, auth) = (
                format!("{url}/v1/runs/bench/events"),
                format!("Bearer {token}"),
            );
            let id = id.clone();
            Box::new(move |n| {
                let r = agent
                    .post(&url)
                    .set("Authorization", &auth)
                    .set("Content-Type", "application/json")
                    .send_string(&event(&id, n))
                    .expect("append");
                assert_eq!(r.status(), 201);
                let _ = r.into_string();
            })
        }
        _ => {
            let mut con = redis::Client::open(target.as_str())
                .and_then(|c| c.get_connection())
                .expect("redis");
            let id = id.clone();
            Box::new(move |n| {
                let _: String = redis::cmd("XADD")
                    .arg("bench")
                    .arg("*")
                    .arg("ev")
                    .arg(event(&id, n))
                    .query(&mut con)
                    .expect("xadd");
            })
        }
    };
    op(0);
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready").unwrap();
    stdout.flush().unwrap();
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    let start = Instant::now();
    let mut n = 1;
    while start.elapsed() < WARMUP {
        op(n);
        n += 1;
    }
    let (start, until) = (Instant::now(), Duration::from_secs_f64(secs));
    let mut lat = Vec::new();
    while start.elapsed() < until {
        let t = Instant::now();
        op(n);
        lat.push(t.elapsed().as_nanos() as u64);
        n += 1;
    }
    let bytes: Vec<u8> = lat.iter().flat_map(|l| l.to_le_bytes()).collect();
    fs::write(&out, bytes).unwrap();
    writeln!(stdout, "done {}", lat.len()).unwrap();
}

/// A keep-alive HTTP/1.1 client that does what a lean client does per request (as
/// redis-rs does for RESP): one `write` of the request, reads until the headers end,
/// `Content-Length` parsed, the body read whole. No URL parsing or header validation per
/// request, so the two cores measure the server rather than the client library
/// (`SWARM_BENCH_HTTP=ureq` runs the clients on ureq instead).
struct LeanHttp {
    stream: std::net::TcpStream,
    head: Vec<u8>,
    req: Vec<u8>,
    buf: Vec<u8>,
}

impl LeanHttp {
    fn connect(url: &str, token: &str, path: &str) -> LeanHttp {
        let host = url.trim_start_matches("http://").trim_end_matches('/');
        let stream = std::net::TcpStream::connect(host).expect("connect");
        stream.set_nodelay(true).unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: "
        )
        .into_bytes();
        LeanHttp {
            stream,
            head,
            req: Vec::with_capacity(1024),
            buf: vec![0; 16 << 10],
        }
    }

    /// Sends one request with `body`; returns the response's status once it is read whole.
    fn post(&mut self, body: &[u8]) -> u16 {
        use std::io::Read;
        self.req.clear();
        self.req.extend_from_slice(&self.head);
        self.req
            .extend_from_slice(format!("{}\r\n\r\n", body.len()).as_bytes());
        self.req.extend_from_slice(body);
        self.stream.write_all(&self.req).expect("send");
        let mut have = 0;
        let end = loop {
            let n = self.stream.read(&mut self.buf[have..]).expect("recv");
            assert!(n > 0, "server closed the connection");
            have += n;
            if let Some(i) = self.buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(have < self.buf.len(), "response headers over 16 KiB");
        };
        let head = std::str::from_utf8(&self.buf[..end]).expect("utf-8 headers");
        let status: u16 = head
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .expect("a Content-Length response");
        let mut body = have - end;
        while body < len {
            let n = self.stream.read(&mut self.buf[..]).expect("recv body");
            assert!(n > 0, "server closed the connection");
            body += n;
        }
        assert_eq!(body, len, "one response at a time");
        status
    }
}

/// Runs `clients` workers of `kind` against `target`; events per second and the sorted
/// latencies (ns).
fn cell(kind: &str, clients: usize, target: &str, tmp: &Path, secs: f64) -> (f64, Vec<u64>) {
    let exe = std::env::current_exe().unwrap();
    let mut ws: Vec<(Child, PathBuf)> = (0..clients)
        .map(|i| {
            let out = tmp.join(format!("lat-{kind}-{clients}-{i}"));
            let child = Command::new(&exe)
                .env("SWARM_BENCH_WORKER", kind)
                .env("SWARM_BENCH_TARGET", target)
                .env("SWARM_BENCH_ID", i.to_string())
                .env("SWARM_BENCH_OUT", &out)
                .env("SWARM_BENCH_SECS", secs.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            (child, out)
        })
        .collect();
    let mut readers: Vec<_> = ws
        .iter_mut()
        .map(|(c, _)| BufReader::new(c.stdout.take().unwrap()))
        .collect();
    for r in &mut readers {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "ready");
    }
    for (c, _) in &mut ws {
        c.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }
    let mut lat = Vec::new();
    for ((mut c, out), mut r) in ws.into_iter().zip(readers) {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        assert!(c.wait().unwrap().success());
        let b = fs::read(out).unwrap();
        lat.extend(
            b.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
        );
    }
    lat.sort_unstable();
    (lat.len() as f64 / secs, lat)
}

fn pct(lat: &[u64], p: f64) -> f64 {
    if lat.is_empty() {
        return f64::NAN;
    }
    let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
    lat[i] as f64 / 1e6
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_redis(dir: &Path) -> Result<(Child, String), String> {
    let bin = std::env::var("SWARM_BENCH_REDIS").unwrap_or_else(|_| "redis-server".into());
    fs::create_dir_all(dir).unwrap();
    let port = free_port();
    let child = Command::new(&bin)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {bin}: {e}"))?;
    let url = format!("redis://127.0.0.1:{port}/");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let ok = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
        if ok.is_ok() {
            return Ok((child, url));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("redis-server did not answer PING within 10 s".into())
}

/// The server's `/metrics` counters `swarm_fsyncs_total`, `swarm_durable_events_total`
/// and `swarm_append_commits_total`.
fn sync_counters(swarm: &str) -> (f64, f64, f64) {
    let url = swarm.split_once('#').unwrap().0;
    let text = ureq::get(&format!("{url}/metrics"))
        .call()
        .expect("metrics")
        .into_string()
        .unwrap();
    let read = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    (
        read("swarm_fsyncs_total"),
        read("swarm_durable_events_total"),
        read("swarm_append_commits_total"),
    )
}

/// A process's CPU time so far (user + system), in seconds, from `/proc` (Linux).
fn cpu_secs(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`: state is the 3rd field; utime and stime the 14th, 15th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // USER_HZ is 100 on Linux.
    (ticks(14) + ticks(15)) / 100.0
}

fn start_swarm(dir: &Path) -> (Child, String) {
    let out = Command::new(SWARM)
        .arg("--data-dir")
        .arg(dir)
        .args([
            "--user", "bench", "token", "add", "--agent", "*", "--role", "agent",
        ])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let mut child = Command::new(SWARM)
        .arg("--data-dir")
        .arg(dir)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("SWARM_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first.trim().trim_start_matches("listening on ").to_string();
    (child, format!("{url}#{token}"))
}

/// `context` and `board` over HTTP on a run of `SWARM_BENCH_VIEW_EVENTS` (default
/// 100,000) events: p50 and p99 of `SWARM_BENCH_VIEW_REQUESTS` (default 200) requests
/// each, one client, keep-alive (target: p50 < 3 ms).
fn views(dir: &Path, swarm: &str) {
    use swarm_memory::{Durability, EventType, NewEvent, Store};
    let n: usize = std::env::var("SWARM_BENCH_VIEW_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let requests: usize = std::env::var("SWARM_BENCH_VIEW_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let run = "views";
    let store = Store::open(dir).unwrap().with_user("bench", true).unwrap();
    let kinds = [
        EventType::Evidence,
        EventType::Hypothesis,
        EventType::Evidence,
    ];
    let mut i = 0;
    while i < n {
        let batch: Vec<NewEvent> = (i..(i + 1000).min(n))
            .map(|k| {
                let mut e = NewEvent::new(
                    &format!("a{}", k % 16),
                    kinds[k % 3],
                    format!("finding {k}: {} on svc-{}", "x".repeat(120), k % 500),
                );
                e.subject = Some(format!("svc-{}", k % 500));
                e
            })
            .collect();
        i += batch.len();
        store
            .append_batch(run, batch, None, Durability::None)
            .unwrap();
    }
    let (url, token) = swarm.split_once('#').unwrap();
    let agent = ureq::AgentBuilder::new().build();
    let auth = format!("Bearer {token}");
    let time = |path: &str| -> Vec<u64> {
        let u = format!("{url}{path}");
        for _ in 0..5 {
            agent
                .get(&u)
                .set("Authorization", &auth)
                .call()
                .unwrap()
                .into_string()
                .unwrap();
        }
        let mut lat: Vec<u64> = (0..requests)
            .map(|_| {
                let t = Instant::now();
                let body = agent
                    .get(&u)
                    .set("Authorization", &auth)
                    .call()
                    .unwrap()
                    .into_string()
                    .unwrap();
                assert!(!body.is_empty());
                t.elapsed().as_nanos() as u64
            })
            .collect();
        lat.sort_unstable();
        lat
    };
    let context = time(&format!("/v1/runs/{run}/context?budget_bytes=4000&as=a1"));
    let board = time(&format!("/v1/runs/{run}/board?as=a1"));
    println!();
    println!("views over HTTP on a run of {n} events ({requests} requests each, one client):");
    println!("| route | p50 ms | p99 ms | target |");
    println!("|---|---:|---:|---:|");
    for (name, lat) in [
        ("context (4,000-byte budget)", &context),
        ("board (500 subjects)", &board),
    ] {
        println!(
            "| {name} | {:.2} | {:.2} | p50 < 3 ms |",
            pct(lat, 0.5),
            pct(lat, 0.99)
        );
    }
}

fn main() {
    if let Ok(kind) = std::env::var("SWARM_BENCH_WORKER") {
        return worker(&kind);
    }
    if std::env::var("SWARM_BENCH_ONLY").as_deref() == Ok("views") {
        let parent = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tmp");
        fs::create_dir_all(&parent).unwrap();
        let tmp = tempfile::tempdir_in(&parent).unwrap();
        let dir = tmp.path().join("swarm");
        let (mut server, swarm) = start_swarm(&dir);
        views(&dir, &swarm);
        let _ = server.kill();
        let _ = server.wait();
        return;
    }
    let secs: f64 = std::env::var("SWARM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let clients: Vec<usize> = std::env::var("SWARM_BENCH_CLIENTS")
        .unwrap_or_else(|_| "16,64".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let parent = std::env::var("SWARM_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tmp"));
    fs::create_dir_all(&parent).unwrap();
    let tmp = tempfile::tempdir_in(&parent).unwrap();
    let (mut server, swarm) = start_swarm(&tmp.path().join("swarm"));
    let redis = start_redis(&tmp.path().join("redis"));
    println!("serve bench: {secs} s per cell, one durable append in flight per client process");
    println!(
        "http client: {}",
        if std::env::var("SWARM_BENCH_HTTP").as_deref() == Ok("ureq") {
            "ureq"
        } else {
            "lean keep-alive HTTP/1.1 (SWARM_BENCH_HTTP=ureq for ureq)"
        }
    );
    println!(
        "{:<10} {:>8} {:>12} {:>9} {:>9}",
        "peer", "clients", "events/s", "p50 ms", "p99 ms"
    );
    for &n in &clients {
        let (fsyncs0, events0, commits0) = sync_counters(&swarm);
        let cpu0 = cpu_secs(server.id());
        let (rate, lat) = cell("swarm", n, &swarm, tmp.path(), secs);
        let cpu = cpu_secs(server.id()) - cpu0;
        let (fsyncs1, events1, commits1) = sync_counters(&swarm);
        let events = events1 - events0;
        println!(
            "{:<10} {:>8} {:>12.0} {:>9.2} {:>9.2}   {:.1} events/fsync, {:.1} requests/commit turn, server {:.0} us CPU/event (warm-up included)",
            "swarm",
            n,
            rate,
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            events / (fsyncs1 - fsyncs0).max(1.0),
            events / (commits1 - commits0).max(1.0),
            cpu * 1e6 / events.max(1.0),
        );
        match &redis {
            Ok((_, url)) => {
                let (r_rate, r_lat) = cell("redis", n, url, tmp.path(), secs);
                println!(
                    "{:<10} {:>8} {:>12.0} {:>9.2} {:>9.2}",
                    "redis",
                    n,
                    r_rate,
                    pct(&r_lat, 0.5),
                    pct(&r_lat, 0.99)
                );
                println!(
                    "  swarm/redis at {n}: {:.2}x events/s (target >= 2x), p99 {:.2} vs {:.2} ms (target <=)",
                    rate / r_rate,
                    pct(&lat, 0.99),
                    pct(&r_lat, 0.99)
                );
            }
            Err(e) => println!("redis: skipped, {e}"),
        }
    }
    views(&tmp.path().join("swarm"), &swarm);
    let _ = server.kill();
    let _ = server.wait();
    if let Ok((mut r, _)) = redis {
        let _ = r.kill();
        let _ = r.wait();
    }
}
