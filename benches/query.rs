//! Selective queries through the index against SQLite, and append throughput with the
//! index kept current by another process against without.
//!
//! `cargo bench --bench query` builds (once, cached under target/tmp) a run of 1,000,000
//! events of ~250 bytes: 125 agents, where `agent-000` writes 1/64 of the events and the
//! others share the rest; types 50% evidence, 25% hypothesis, 15% decision, 10%
//! action_taken; 1000 subjects on evidence and hypotheses; one user (runs belong to one).
//! "agent-000 and evidence" then has ~7,800 hits.
//! The same events go into SQLite (bundled) with an index on (agent_id, type, seq).
//! `SWARM_BENCH_EVENTS=N` changes the run size (a separate cache); `SWARM_BENCH_SKIP_APPEND=1`
//! skips the append part; `SWARM_BENCH_PROFILE=N` (with `SWARM_BENCH_COLD=1` for a new
//! `Store` each time) only loops the all-hits query, for `perf record`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use swarm_memory::{
    Durability, Event, EventType, FsStorage, LogOptions, NewEvent, ReadOptions, Store, Ts,
};

const RUN: &str = "query-1m";
const AGENTS: u64 = 125;
const HOT_AGENT: &str = "agent-000";
/// Bumped when the generated data changes, so that a stale cache is rebuilt.
const DATA_VERSION: u32 = 2;

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn gen_event(rng: &mut u64) -> NewEvent {
    let r = splitmix(rng);
    let agent = if r.is_multiple_of(64) {
        0
    } else {
        1 + (r >> 8) % (AGENTS - 1)
    };
    let t = (r >> 20) % 100;
    let kind = match t {
        0..50 => EventType::Evidence,
        50..75 => EventType::Hypothesis,
        75..90 => EventType::Decision,
        _ => EventType::ActionTaken,
    };
    let subject = (r >> 28) % 1000;
    let content = format!(
        "p99 latency {} ms on svc-{subject:04} after deploy {}",
        (r >> 44) % 5000,
        (r >> 52) % 90
    );
    let mut e = NewEvent::new(&format!("agent-{agent:03}"), kind, content);
    // Decisions and actions of different agents on one subject would be escalated by the
    // engine (extra events): give them none. A run belongs to one user (the store's).
    if matches!(kind, EventType::Evidence | EventType::Hypothesis) {
        e.subject = Some(format!("svc-{subject:04}"));
    }
    e
}

fn tmp_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

fn open_store(root: &Path) -> Store {
    Store::open_with(Arc::new(FsStorage), root, LogOptions::default()).expect("open store")
}

/// Builds (or reuses) the run and the SQLite copy. Returns the data directory.
fn dataset(n: u64) -> PathBuf {
    let dir = tmp_root().join(format!("query-bench-{n}"));
    let marker = dir.join("COMPLETE");
    let want = format!("v{DATA_VERSION} {n}");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(want.as_str()) {
        eprintln!("using cached data set in {}", dir.display());
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create bench dir");
    let t0 = Instant::now();
    {
        let store = open_store(&dir);
        // Several threads, one event per append (one frame each, as agents write): the
        // writer combines them into shared writes. `none` durability: generation only.
        let threads = 4u64;
        std::thread::scope(|s| {
            for t in 0..threads {
                let store = &store;
                s.spawn(move || {
                    let mut rng = 0x5eed_0000 + t;
                    for _ in 0..n / threads {
                        store
                            .append(RUN, gen_event(&mut rng), Durability::None)
                            .expect("append");
                    }
                });
            }
        });
        store.flush_index(RUN).expect("flush");
    }
    eprintln!(
        "generated {n} events in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let t0 = Instant::now();
    build_sqlite(&dir);
    eprintln!("filled SQLite in {:.1} s", t0.elapsed().as_secs_f64());
    std::fs::write(&marker, want).expect("marker");
    dir
}

fn build_sqlite(dir: &Path) {
    let conn = rusqlite::Connection::open(dir.join("events.sqlite")).expect("sqlite");
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;
         CREATE TABLE events (
            seq INTEGER PRIMARY KEY, ts INTEGER NOT NULL, id TEXT NOT NULL,
            agent_id TEXT NOT NULL, user_id TEXT NOT NULL, type TEXT NOT NULL,
            content TEXT NOT NULL, confidence REAL, refs TEXT, subject TEXT,
            session_id TEXT, meta TEXT);",
    )
    .expect("schema");
    let store = open_store(dir);
    let tx = conn.unchecked_transaction().expect("tx");
    {
        let mut ins = tx
            .prepare("INSERT INTO events VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)")
            .expect("prepare");
        let opts = ReadOptions {
            full_scan: true,
            ..ReadOptions::default()
        };
        for e in store.read(RUN, opts).expect("read") {
            let e = e.expect("event");
            let content = match &e.content {
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            ins.execute(rusqlite::params![
                e.seq as i64,
                e.ts.0 as i64,
                e.id,
                e.agent_id,
                e.user_id,
                e.kind.as_str(),
                content,
                e.confidence,
                (!e.refs.is_empty()).then(|| serde_json::to_string(&e.refs).unwrap_or_default()),
                e.subject,
                e.session_id,
                e.meta
                    .as_ref()
                    .map(|m| Value::Object(m.clone()).to_string()),
            ])
            .expect("insert");
        }
    }
    tx.commit().expect("commit");
    conn.execute_batch("CREATE INDEX events_agent_type ON events(agent_id, type, seq); ANALYZE;")
        .expect("index");
}

/// SQLite rows back into the same `Event` values the log returns.
fn sqlite_query(stmt: &mut rusqlite::Statement, agent: &str, kind: &str) -> Vec<Event> {
    let rows = stmt
        .query_map(rusqlite::params![agent, kind], |r| {
            let kind: String = r.get(5)?;
            let refs: Option<String> = r.get(8)?;
            let meta: Option<String> = r.get(11)?;
            Ok(Event {
                run_id: RUN.to_string(),
                seq: r.get::<_, i64>(0)? as u64,
                ts: Ts(r.get::<_, i64>(1)? as u64),
                id: r.get(2)?,
                agent_id: r.get(3)?,
                user_id: r.get(4)?,
                kind: EventType::parse_client(&kind).unwrap_or(EventType::Evidence),
                content: Value::String(r.get(6)?),
                confidence: r.get(7)?,
                refs: refs
                    .and_then(|s| serde_json::from_str(&s).ok())
                    .unwrap_or_default(),
                subject: r.get(9)?,
                session_id: r.get(10)?,
                meta: meta.and_then(|s| serde_json::from_str(&s).ok()),
            })
        })
        .expect("query");
    rows.map(|r| r.expect("row")).collect()
}

/// Median and p90 of `reps` timed runs of `f`, in milliseconds.
fn time_ms<T>(reps: usize, mut f: impl FnMut() -> T) -> (f64, f64, T) {
    let mut out = f(); // warm-up
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        out = f();
        v.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[(v.len() * 9 / 10).min(v.len() - 1)], out)
}

struct Row {
    name: String,
    ours: (f64, f64),
    sqlite: Option<(f64, f64)>,
}

fn query_bench(dir: &Path) -> Vec<Row> {
    let store = open_store(dir);
    let all_opts = ReadOptions {
        agent: Some(HOT_AGENT.into()),
        kind: Some(EventType::Evidence),
        ..ReadOptions::default()
    };
    let last_opts = ReadOptions {
        last: Some(50),
        ..all_opts.clone()
    };
    let run = |s: &Store, o: &ReadOptions| -> Vec<Event> {
        s.read(RUN, o.clone())
            .expect("read")
            .collect::<Result<_, _>>()
            .expect("events")
    };
    let conn = rusqlite::Connection::open(dir.join("events.sqlite")).expect("sqlite");
    let cols = "seq, ts, id, agent_id, user_id, type, content, confidence, refs, subject, session_id, meta";
    let mut all_stmt = conn
        .prepare(&format!(
            "SELECT {cols} FROM events WHERE agent_id = ?1 AND type = ?2 ORDER BY seq"
        ))
        .expect("prepare");
    let mut last_stmt = conn
        .prepare(&format!(
            "SELECT * FROM (SELECT {cols} FROM events WHERE agent_id = ?1 AND type = ?2 \
             ORDER BY seq DESC LIMIT 50) ORDER BY seq"
        ))
        .expect("prepare");
    let reps = 30;
    let (s_all, s_all90, sq_all) =
        time_ms(reps, || sqlite_query(&mut all_stmt, HOT_AGENT, "evidence"));
    let (s_last, s_last90, sq_last) = time_ms(reps * 10, || {
        sqlite_query(&mut last_stmt, HOT_AGENT, "evidence")
    });
    let (o_all, o_all90, ours_all) = time_ms(reps, || run(&store, &all_opts));
    let (o_last, o_last90, ours_last) = time_ms(reps * 10, || run(&store, &last_opts));
    assert_eq!(ours_all, sq_all, "index and SQLite disagree");
    assert_eq!(ours_last, sq_last, "index and SQLite disagree (last 50)");
    eprintln!("hits: {} (last: {})", ours_all.len(), ours_last.len());
    // Cold: a new process-like Store each time, so the index files are read and checked.
    let (c_all, c_all90, _) = time_ms(5, || run(&open_store(dir), &all_opts));
    let (c_last, c_last90, _) = time_ms(5, || run(&open_store(dir), &last_opts));
    let scan_opts = ReadOptions {
        full_scan: true,
        ..all_opts.clone()
    };
    let (f_all, f_all90, scanned) = time_ms(2, || run(&store, &scan_opts));
    assert_eq!(scanned, ours_all);
    vec![
        Row {
            name: format!("agent+type, all {} hits", ours_all.len()),
            ours: (o_all, o_all90),
            sqlite: Some((s_all, s_all90)),
        },
        Row {
            name: "agent+type, last 50 hits".into(),
            ours: (o_last, o_last90),
            sqlite: Some((s_last, s_last90)),
        },
        Row {
            name: "  same, all hits, cold (new Store: load index)".into(),
            ours: (c_all, c_all90),
            sqlite: None,
        },
        Row {
            name: "  same, last 50, cold (new Store: load index)".into(),
            ours: (c_last, c_last90),
            sqlite: None,
        },
        Row {
            name: "  same, all hits, full scan (no index)".into(),
            ours: (f_all, f_all90),
            sqlite: None,
        },
    ]
}

/// The other process of the append benchmark: every millisecond until told to stop
/// (stdin closes), either reads through the index (keeping it current: caught up, and
/// written to disk per the policy) or, as the baseline, only looks at the run without
/// the index (same wake-ups, no index work).
fn follower(root: &Path, with_index: bool) {
    let store = open_store(root);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    std::thread::spawn(move || {
        let mut b = [0u8; 1];
        let _ = std::io::Read::read(&mut std::io::stdin(), &mut b);
        s2.store(true, std::sync::atomic::Ordering::Release);
    });
    let q = if with_index {
        ReadOptions {
            agent: Some(HOT_AGENT.into()),
            last: Some(1),
            ..ReadOptions::default()
        }
    } else {
        // Lists the segments and reads the watermark, reads no frame.
        ReadOptions {
            limit: Some(0),
            ..ReadOptions::default()
        }
    };
    let mut polls = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        if let Ok(it) = store.read(RUN, q.clone()) {
            for e in it {
                let _ = e;
            }
        }
        polls += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    let stats = with_index.then(|| store.index_stats(RUN).ok()).flatten();
    println!(
        "{}",
        serde_json::json!({"polls": polls, "indexed": stats.map(|s| s.events)})
    );
}

fn spawn_follower(root: &Path, with_index: bool) -> Child {
    Command::new(std::env::current_exe().expect("exe"))
        .env("SWARM_BENCH_ROLE", "follower")
        .env(
            "SWARM_BENCH_FOLLOW_INDEX",
            if with_index { "1" } else { "0" },
        )
        .env("SWARM_BENCH_ROOT", root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn follower")
}

/// Which other process runs while a round appends.
#[derive(Clone, Copy, PartialEq)]
enum Other {
    Nothing,
    Poller,
    Indexer,
}

/// Appends `n` events from `threads` threads; returns events per second.
fn append_round(root: &Path, n: u64, threads: u64, d: Durability, other: Other) -> (f64, String) {
    // A new directory per round: nothing of an earlier round can be appended to.
    assert!(!root.exists(), "{} exists", root.display());
    std::fs::create_dir_all(root).expect("dir");
    let store = open_store(root);
    store
        .append(RUN, gen_event(&mut 1), Durability::Sync)
        .expect("create run");
    let follower = match other {
        Other::Nothing => None,
        Other::Poller => Some(spawn_follower(root, false)),
        Other::Indexer => Some(spawn_follower(root, true)),
    };
    // Let the follower start up and take its first look.
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let store = &store;
            s.spawn(move || {
                let mut rng = 77 + t;
                for _ in 0..n / threads {
                    store.append(RUN, gen_event(&mut rng), d).expect("append");
                }
            });
        }
    });
    let rate = n as f64 / t0.elapsed().as_secs_f64();
    let note = match follower {
        Some(mut c) => {
            drop(c.stdin.take());
            let out = c.wait_with_output().expect("follower");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        }
        None => String::new(),
    };
    (rate, note)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn append_bench() -> Vec<(String, f64, f64, f64)> {
    let base = tmp_root().join("append-index-bench");
    let _ = std::fs::remove_dir_all(&base);
    let mut out = Vec::new();
    let mut round = 0;
    for (name, n, threads, d) in [
        ("none, 1 thread", 60_000u64, 1u64, Durability::None),
        ("sync, 4 threads", 2_000, 4, Durability::Sync),
    ] {
        let mut alone = Vec::new();
        let mut without = Vec::new();
        let mut with = Vec::new();
        // Alternated rounds, so that drifts of the machine hit every side alike.
        for _ in 0..5 {
            round += 1;
            let dir = |x: &str| base.join(format!("r{round}{x}"));
            let (r0, _) = append_round(&dir("a"), n, threads, d, Other::Nothing);
            let (r1, _) = append_round(&dir("b"), n, threads, d, Other::Poller);
            let (r2, note) = append_round(&dir("c"), n, threads, d, Other::Indexer);
            eprintln!("  {name}: alone {r0:.0}/s, reader without index {r1:.0}/s, reader keeping the index {r2:.0}/s ({note})");
            alone.push(r0);
            without.push(r1);
            with.push(r2);
        }
        out.push((
            name.to_string(),
            median(alone),
            median(without),
            median(with),
        ));
    }
    let _ = std::fs::remove_dir_all(&base);
    out
}

fn main() {
    if std::env::var("SWARM_BENCH_ROLE").as_deref() == Ok("follower") {
        let root = std::env::var("SWARM_BENCH_ROOT").expect("SWARM_BENCH_ROOT");
        let with_index = std::env::var("SWARM_BENCH_FOLLOW_INDEX").as_deref() == Ok("1");
        follower(Path::new(&root), with_index);
        return;
    }
    // `cargo bench` passes `--bench`; a filter argument is not supported here.
    let n: u64 = std::env::var("SWARM_BENCH_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let dir = dataset(n);
    if let Some(loops) = std::env::var("SWARM_BENCH_PROFILE")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        // For `perf record`: the warm all-hits query, over and over.
        let store = open_store(&dir);
        let q = ReadOptions {
            agent: Some(HOT_AGENT.into()),
            kind: Some(EventType::Evidence),
            ..ReadOptions::default()
        };
        let cold = std::env::var("SWARM_BENCH_COLD").is_ok();
        let mut hits = 0;
        for _ in 0..loops {
            let fresh;
            let s = if cold {
                fresh = open_store(&dir);
                &fresh
            } else {
                &store
            };
            hits += s.read(RUN, q.clone()).expect("read").count();
        }
        eprintln!("{hits} hits");
        return;
    }
    {
        let store = open_store(&dir);
        let t0 = Instant::now();
        let stats = store.rebuild_index(RUN, |_, _| {}).expect("rebuild");
        let s = t0.elapsed().as_secs_f64();
        eprintln!(
            "index rebuild: {} events, {} segments, {:.1} MB of index, {:.2} s ({:.0} events/s)",
            stats.events,
            stats.segments,
            stats.index_bytes as f64 / 1e6,
            s,
            stats.events as f64 / s
        );
    }
    let rows = query_bench(&dir);
    let appends = match std::env::var("SWARM_BENCH_SKIP_APPEND") {
        Ok(_) => Vec::new(),
        Err(_) => append_bench(),
    };
    println!();
    println!("selective queries, {n} events ({RUN}), median (p90) in ms");
    println!(
        "{:<48} {:>18} {:>18} {:>8}",
        "query", "swarm-memory", "SQLite", "ratio"
    );
    for r in &rows {
        let ours = format!("{:.3} ({:.3})", r.ours.0, r.ours.1);
        match r.sqlite {
            Some(s) => println!(
                "{:<48} {:>18} {:>18} {:>7.2}x",
                r.name,
                ours,
                format!("{:.3} ({:.3})", s.0, s.1),
                s.0 / r.ours.0
            ),
            None => println!("{:<48} {:>18} {:>18} {:>8}", r.name, ours, "", ""),
        }
    }
    println!("(ratio = SQLite time / swarm-memory time: above 1 means the index is faster)");
    println!();
    println!("append throughput (median of 5 alternated rounds): alone; while another process");
    println!("polls the run every ms without the index; while it reads through the index every");
    println!("ms, keeping it current (caught up and written to disk per the policy)");
    println!(
        "{:<18} {:>12} {:>14} {:>16} {:>16}",
        "durability", "alone", "reader, no idx", "reader, index", "index vs no idx"
    );
    for (name, alone, without, with) in appends {
        println!(
            "{:<18} {:>10.0}/s {:>12.0}/s {:>14.0}/s {:>+15.1}%",
            name,
            alone,
            without,
            with,
            (with / without - 1.0) * 100.0
        );
    }
}
