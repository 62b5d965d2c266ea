//! Scratchpad costs: `context` and `board` on a 100,000-event run from a checkpoint
//! (target p50 <= 5 ms each), and append throughput with a permission policy and a board
//! compare-and-swap on every append vs neither (target: <= 10% apart).
//!
//! ```sh
//! cargo bench --bench scratchpad
//! SCRATCH_BENCH_EVENTS=20000 SCRATCH_BENCH_SECS=2 cargo bench --bench scratchpad
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use swarm_memory::fold::rules::{Perms, Policy};
use swarm_memory::{Durability, EventType, NewEvent, Store};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p) as usize]
}

fn event(x: u64) -> NewEvent {
    let mut e = NewEvent::new(
        &format!("agent-{:02}", x % 16),
        EventType::ALL[(x % 2) as usize],
        format!(
            "finding {x}: p99 latency of service {} at {} ms; pool {}/100",
            x % 97,
            100 + x % 900,
            x % 100
        ),
    );
    e.subject = Some(format!("svc-{}", x % 500));
    e.confidence = Some(0.5);
    e
}

/// Appends for `secs` from `threads` threads; returns events/s.
fn throughput(
    store: &Arc<Store>,
    run: &str,
    threads: u64,
    secs: u64,
    durability: Durability,
    cas: bool,
) -> f64 {
    let stop = Instant::now() + Duration::from_secs(secs);
    let done = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (store, done, run) = (store.clone(), done.clone(), run.to_string());
            std::thread::spawn(move || {
                let mut i = t * 1_000_000_000;
                // Each thread owns its subjects and remembers each one's version (the seq
                // its last append got), as an agent does: the CAS is checked on every
                // append and never fails, so what is measured is the check itself.
                let mut versions = std::collections::HashMap::new();
                while Instant::now() < stop {
                    let mut e = event(i);
                    let subject = format!("{run}-t{t}-s{}", i % 50);
                    e.subject = Some(subject.clone());
                    if cas {
                        e.expect_subject_seq = Some(*versions.get(&subject).unwrap_or(&0));
                    }
                    let stored = store.append(&run, e, durability).unwrap();
                    versions.insert(subject, stored.seq);
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / secs as f64
}

fn main() {
    let n = env_u64("SCRATCH_BENCH_EVENTS", 100_000);
    let secs = env_u64("SCRATCH_BENCH_SECS", 3);
    let base = std::env::current_dir().unwrap().join("target");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let store = Store::open(dir.path().join("data"))
        .unwrap()
        .with_checkpoints(dir.path().join("ck"), 0);
    let mut i = 0;
    while i < n {
        let batch: Vec<NewEvent> = (i..(i + 1000).min(n)).map(event).collect();
        i += batch.len() as u64;
        store
            .append_batch("big", batch, None, Durability::None)
            .unwrap();
    }
    store.checkpoint("big", |_| {}).unwrap();
    let mut ctx = Vec::new();
    let mut board = Vec::new();
    for k in 0..30 {
        let t = Instant::now();
        let c = store
            .context("big", &format!("agent-{:02}", k % 16), 8000)
            .unwrap();
        ctx.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(c.used_bytes <= 8000);
        let t = Instant::now();
        let b = store
            .board("big", None, Some(&format!("svc-{}", k * 7)))
            .unwrap();
        board.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(b.len(), 1);
    }
    println!("| measure ({n}-event run, from a checkpoint) | p50 ms | p99 ms | target |");
    println!("|---|---:|---:|---:|");
    println!(
        "| context, 8,000-byte budget | {:.2} | {:.2} | p50 <= 5 ms |",
        pct(&mut ctx, 0.5),
        pct(&mut ctx, 0.99)
    );
    println!(
        "| board, one subject | {:.2} | {:.2} | p50 <= 5 ms |",
        pct(&mut board, 0.5),
        pct(&mut board, 0.99)
    );

    // Append throughput: a run with a policy and a CAS on every append vs a plain run.
    let store = Arc::new(
        Store::open(dir.path().join("data2"))
            .unwrap()
            .with_checkpoints(dir.path().join("ck2"), 0),
    );
    let everyone = Perms {
        read_types: vec!["*".into()],
        write_types: vec!["hypothesis".into(), "evidence".into()],
        read_channels: vec!["*".into()],
        write_channels: vec![],
        admin: false,
    };
    let mut perms = std::collections::BTreeMap::new();
    perms.insert("*".to_string(), everyone.clone());
    perms.insert(
        "lead".to_string(),
        Perms {
            admin: true,
            ..everyone
        },
    );
    let policy = Policy {
        permissions: Some(perms),
        prune_max_entries: None,
    };
    for run in ["checked-none", "checked-sync", "cas-none", "cas-sync"] {
        store.append(run, event(0), Durability::None).unwrap();
        store.set_policy(run, "lead", &policy).unwrap();
    }
    println!();
    println!("| appends (4 threads, {secs} s) | plain events/s | policy + CAS events/s | ratio | target |");
    println!("|---|---:|---:|---:|---:|");
    for (label, d) in [("none", Durability::None), ("sync", Durability::Sync)] {
        let plain = throughput(&store, &format!("plain-{label}"), 4, secs, d, false);
        let checked_plain = throughput(&store, &format!("checked-{label}"), 4, secs, d, false);
        let checked_cas = throughput(&store, &format!("cas-{label}"), 4, secs, d, true);
        println!(
            "| `{label}`, permissions only | {plain:.0} | {checked_plain:.0} | {:.2} | >= 0.90 |",
            checked_plain / plain
        );
        println!(
            "| `{label}`, permissions + board CAS | {plain:.0} | {checked_cas:.0} | {:.2} | >= 0.90 |",
            checked_cas / plain
        );
    }
}
