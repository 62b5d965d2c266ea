//! Many OS processes appending to one run at once.

use std::collections::HashMap;
use std::process::{Child, Stdio};

use serde_json::{json, Value};
use swarm_memory::Event;

use crate::util::{Env, Rng};

/// Starts one writer process fed `lines` on stdin by a thread of its own.
fn spawn_writer(env: &Env, run: &str, durability: &str, lines: &[Value]) -> Child {
    use std::io::Write;
    let mut child = env
        .cmd(&[
            "append",
            "--run",
            run,
            "--stdin",
            "--durability",
            durability,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn swarm append");
    let mut stdin = child.stdin.take().expect("stdin");
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::thread::spawn(move || {
        let _ = stdin.write_all(body.as_bytes());
    });
    child
}

/// Waits for every writer, checks it succeeded, and returns what each acknowledged.
fn acked(children: Vec<Child>) -> Vec<Vec<Event>> {
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("wait writer");
            assert!(
                out.status.success(),
                "writer failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            crate::util::parse_events(&String::from_utf8_lossy(&out.stdout))
        })
        .collect()
}

/// Checks that every acknowledged event is stored exactly once, as acknowledged, and that
/// each process's events kept its order.
fn check_acked(stored: &[Event], acked: &[Vec<Event>]) {
    let by_id: HashMap<&str, &Event> = stored.iter().map(|e| (e.id.as_str(), e)).collect();
    assert_eq!(by_id.len(), stored.len(), "duplicate ids in the log");
    for (p, evs) in acked.iter().enumerate() {
        let mut last_seq = 0;
        for e in evs {
            let s = by_id
                .get(e.id.as_str())
                .unwrap_or_else(|| panic!("acknowledged event {} of writer {p} missing", e.id));
            assert_eq!(*s, e, "stored event differs from the acknowledged one");
            assert!(e.seq > last_seq, "writer {p}: its events out of order");
            last_seq = e.seq;
        }
    }
}

#[test]
fn eight_processes_200_events_each() {
    let env = Env::new();
    let run = "conc";
    let (procs, per) = (8, 200);
    let children: Vec<Child> = (0..procs)
        .map(|p| {
            let lines: Vec<Value> = (0..per)
                .map(|i| {
                    json!({"id": format!("p{p}-{i}"), "agent_id": format!("agent-{p}"),
                           "type": "evidence", "content": format!("finding {i} of agent {p}: {}", "x".repeat(150))})
                })
                .collect();
            spawn_writer(&env, run, "sync", &lines)
        })
        .collect();
    let acked = acked(children);
    for a in &acked {
        assert_eq!(a.len(), per);
    }
    let stored = env.check_run(run);
    assert_eq!(stored.len(), procs * per);
    check_acked(&stored, &acked);
}

/// Singles and batches, in all three durability modes, with segments small enough to
/// rotate dozens of times while the processes race.
#[test]
fn mixed_singles_batches_and_rotation() {
    let env = Env::new();
    let run = "mixed";
    // Create the run with 4 KiB segments; every process reads the size from run.json.
    crate::util::lib_append(&env.store_with_segment_bytes(4096), run, "created");
    let mut rng = Rng::from_env("mixed_singles_batches_and_rotation");
    let modes = [
        "sync", "sync", "sync", "sync", "sync", "batch", "none", "sync",
    ];
    let mut batches: Vec<Vec<String>> = Vec::new();
    let mut children = Vec::new();
    for (p, mode) in modes.iter().enumerate() {
        let mut lines = Vec::new();
        for i in 0..60 {
            let ev = |j: u64| {
                json!({"id": format!("p{p}-{i}-{j}"), "agent_id": format!("agent-{p}"),
                       "type": "hypothesis", "content": format!("{} {j}", "y".repeat(120)),
                       "confidence": 0.5})
            };
            if p % 2 == 1 && rng.below(3) > 0 {
                let n = rng.range(1, 8);
                batches.push((0..n).map(|j| format!("p{p}-{i}-{j}")).collect());
                lines.push(Value::Array((0..n).map(ev).collect()));
            } else {
                lines.push(ev(0));
            }
        }
        children.push(spawn_writer(&env, run, mode, &lines));
    }
    let acked = acked(children);
    // One more sync append makes everything the none/batch writers left durable.
    crate::util::lib_append(&env.store(), run, "closing");
    let stored = env.check_run(run);
    let total: usize = acked.iter().map(Vec::len).sum();
    assert_eq!(stored.len(), total + 2);
    check_acked(&stored, &acked);
    let seq_of: HashMap<&str, u64> = stored.iter().map(|e| (e.id.as_str(), e.seq)).collect();
    for b in &batches {
        let seqs: Vec<u64> = b.iter().map(|id| seq_of[id.as_str()]).collect();
        let want: Vec<u64> = (seqs[0]..seqs[0] + b.len() as u64).collect();
        assert_eq!(seqs, want, "batch not stored as consecutive seqs");
    }
    let segs = env.segments(run);
    assert!(segs.len() > 10, "only {} segments", segs.len());
}

/// Two rebuilds of one run's index at once, beside an appender that rotates segments:
/// a rebuild removed the index files without the index lock, a temporary file another
/// process was writing among them, and that one failed ("rename ….idx.tmp: No such file";
/// 17 of 200 rebuilds in a review's loop). Each store is its own open of the lock file,
/// as two processes are.
#[test]
fn concurrent_index_rebuilds_do_not_fail() {
    let env = Env::new();
    let run = "ix";
    let writer = env.store_with_segment_bytes(4096);
    for i in 0..200 {
        crate::util::lib_append(&writer, run, &format!("seed {i} {}", "z".repeat(100)));
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                crate::util::lib_append(&writer, run, &format!("more {i} {}", "z".repeat(100)));
                i += 1;
            }
        });
        let rebuilders: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let store = env.store();
                    for _ in 0..40 {
                        store.rebuild_index(run, |_, _| {}).expect("rebuild");
                    }
                })
            })
            .collect();
        for r in rebuilders {
            let joined = r.join();
            if joined.is_err() {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            joined.unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}
