//! Replay of a large run: the state at the head from the latest checkpoint (target
//! < 100 ms) and a full replay from the start (target >= 1,000,000 events/s).
//!
//! ```sh
//! cargo bench --bench replay                      # 1,000,000 events
//! REPLAY_BENCH_EVENTS=200000 cargo bench --bench replay
//! ```
//!
//! The run is generated once per invocation in a temp dir on the repository's disk
//! (`none` durability, batches of 1,000, ~250-byte events, 64 agents, 4 types, 1,000
//! subjects) and flushed to disk (`sync`), then: a checkpoint is written at the head; `state_at(Head)` is timed from
//! that checkpoint (median of 5); the checkpoint is deleted and `state_at(Head)` is timed
//! again as a full replay. Both states must be byte-identical, or the bench fails.
//!
//! Besides wall-clock time it reports the CPU time of the replaying thread (Linux,
//! `/proc/thread-self/schedstat`): on a shared machine that figure moves less with the
//! load of other processes than the wall clock does, so both are printed.

use std::time::Instant;

use swarm_memory::{Durability, EventType, NewEvent, Store, Target};

/// CPU time of this thread so far, in seconds (0 where the kernel does not say).
fn thread_cpu_s() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

fn main() {
    let n: u64 = std::env::var("REPLAY_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let base = std::env::current_dir().unwrap().join("target");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let store = Store::open(dir.path().join("data"))
        .unwrap()
        .with_checkpoints(dir.path().join("ck"), 0);
    let t = Instant::now();
    let mut i = 0u64;
    while i < n {
        let batch: Vec<NewEvent> = (0..1000.min(n - i))
            .map(|k| {
                let x = i + k;
                let mut e = NewEvent::new(
                    &format!("agent-{:02}", x % 64),
                    EventType::ALL[(x % 2) as usize],
                    format!("finding {x}: p99 latency of service {} rose to {} ms after deploy {}; pool at {}/100", x % 97, 100 + x % 900, x % 13, x % 100),
                );
                e.subject = Some(format!("svc-{}", x % 1000));
                e.confidence = Some((x % 10) as f64 / 10.0);
                e
            })
            .collect();
        i += batch.len() as u64;
        store
            .append_batch("big", batch, None, Durability::None)
            .unwrap();
    }
    println!("generated {n} events in {:.1} s", t.elapsed().as_secs_f64());
    // The generated run (written with `none`) is flushed before anything is timed, as in
    // the synth bench: the kernel writing it back would otherwise take the second core
    // (and the disk) from the replay, which reads on one thread and folds on another.
    let t = Instant::now();
    let flushed = std::process::Command::new("sync").status();
    println!(
        "flushed in {:.1} s ({})",
        t.elapsed().as_secs_f64(),
        match flushed {
            Ok(s) if s.success() => "sync",
            _ => "sync(1) failed: figures may include the write-back",
        }
    );
    let t = Instant::now();
    store.checkpoint("big", |_| {}).unwrap();
    println!(
        "checkpoint at head written in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    let mut from_ck = Vec::new();
    let mut from_ck_cpu = Vec::new();
    let mut state_ck = None;
    for _ in 0..5 {
        let (t, cpu) = (Instant::now(), thread_cpu_s());
        let r = store.state_at("big", Target::Head, |_| {}).unwrap();
        from_ck.push(t.elapsed().as_secs_f64() * 1e3);
        from_ck_cpu.push((thread_cpu_s() - cpu) * 1e3);
        assert!(r.stats.from_checkpoint.is_some());
        state_ck = Some(r.state);
    }
    from_ck.sort_by(f64::total_cmp);
    from_ck_cpu.sort_by(f64::total_cmp);
    for seq in store.checkpoints("big").unwrap() {
        std::fs::remove_file(
            store
                .checkpoint_dir("big")
                .join(swarm_memory::fold::checkpoint::checkpoint_name(seq)),
        )
        .unwrap();
    }
    let (t, cpu) = (Instant::now(), thread_cpu_s());
    let full = store.state_at("big", Target::Head, |_| {}).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let cpu_secs = thread_cpu_s() - cpu;
    assert_eq!(full.stats.from_checkpoint, None);
    assert_eq!(
        full.state.to_bytes(),
        state_ck.unwrap().to_bytes(),
        "replay from a checkpoint and from the start must agree"
    );
    let rate = full.stats.events_applied as f64 / secs;
    let cpu_rate = full.stats.events_applied as f64 / cpu_secs;
    println!();
    println!("| measure | result | CPU time | target |");
    println!("|---|---:|---:|---:|");
    println!(
        "| state at head from the latest checkpoint ({n} events), median of 5 | {:.0} ms | {:.0} ms | < 100 ms |",
        from_ck[2], from_ck_cpu[2]
    );
    println!(
        "| full replay from the start | {:.0} events/s ({:.2} s) | {:.0} events/s ({:.2} s) | >= 1,000,000 events/s |",
        rate, secs, cpu_rate, cpu_secs
    );
    println!(
        "{}",
        serde_json::json!({"bench": "replay", "events": n, "head_from_checkpoint_ms": from_ck[2], "head_from_checkpoint_cpu_ms": from_ck_cpu[2], "full_replay_events_per_s": rate, "full_replay_events_per_cpu_s": cpu_rate})
    );
}
