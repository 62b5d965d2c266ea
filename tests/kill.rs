//! Writers killed with SIGKILL at random moments, round after round.
//!
//! Each round starts three `swarm append --stdin` processes on one run, feeds them
//! events, and kills each one at a random moment (after a random number of
//! acknowledgements plus a random delay of up to a few milliseconds, so the kill lands
//! anywhere: mid-write, mid-fsync, holding a lock). Afterwards every event a child
//! printed (acknowledged) must be stored exactly once, batches all or nothing, seqs
//! gap-free, ts non-decreasing, every segment line a whole frame, and appends must work.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};
use swarm_memory::Event;

use crate::util::{lib_append, Env, Rng};

struct Victim {
    child: Child,
    acks: mpsc::Receiver<()>,
    reader: JoinHandle<Vec<Event>>,
}

fn spawn_victim(env: &Env, run: &str, lines: Vec<Value>, prealloc: Option<u64>) -> Victim {
    let mut cmd = env.cmd(&["append", "--run", run, "--stdin"]);
    if let Some(bytes) = prealloc {
        cmd.env("SWARM_PREALLOC_BYTES", bytes.to_string());
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn swarm append");
    let mut stdin = child.stdin.take().expect("stdin");
    std::thread::spawn(move || {
        for l in lines {
            // The child dies at some point; the pipe then breaks, which is expected.
            if writeln!(stdin, "{l}").is_err() {
                return;
            }
        }
    });
    let stdout = child.stdout.take().expect("stdout");
    let (tx, acks) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut got = Vec::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return got,
                Ok(_) => {}
            }
            // A line cut by the kill was not fully acknowledged; only whole lines count.
            if line.last() != Some(&b'\n') {
                return got;
            }
            let e: Event = serde_json::from_slice(&line)
                .unwrap_or_else(|e| panic!("child printed a bad ack line: {e}"));
            got.push(e);
            let _ = tx.send(());
        }
    });
    Victim {
        child,
        acks,
        reader,
    }
}

/// Runs the kill loop; `batches` makes most input lines atomic batches of 1..=40 events
/// of up to 2 KiB each (frames of up to ~80 KiB). Torn frames are rare with real kills
/// (a page-cache write is seldom cut); `truncate.rs` and `visibility.rs` cover them.
///
/// With `small`, `(segment bytes, preallocation chunk)`: the run is created with small
/// segments and the writers zero-fill ahead in small chunks, so kills land often during
/// a preallocation and during a rotation's trim.
fn kill_loop(test: &str, rounds: usize, batches: bool, small: Option<(u64, u64)>) {
    let env = Env::new();
    let run = "killed";
    let mut rng = Rng::from_env(test);
    let mut sent_batches: Vec<Vec<String>> = Vec::new();
    let mut sent_ids: HashSet<String> = HashSet::new();
    if let Some((segment_bytes, _)) = small {
        // The first append creates the run, with its segment size, for every process.
        let first = lib_append(&env.store_with_segment_bytes(segment_bytes), run, "created");
        sent_ids.insert(first.id);
    }
    let mut acked: Vec<Event> = Vec::new();
    for round in 0..rounds {
        let mut victims = Vec::new();
        for w in 0..3 {
            let mut lines = Vec::new();
            for i in 0..40 {
                let mut one = |j: u64, len: usize| {
                    let id = format!("r{round}-w{w}-{i}-{j}");
                    sent_ids.insert(id.clone());
                    (
                        id.clone(),
                        json!({"id": id, "agent_id": format!("w{w}"), "type": "evidence",
                               "content": format!("{} {j}", "z".repeat(len))}),
                    )
                };
                if batches && rng.below(4) > 0 {
                    let n = rng.range(1, 40);
                    let len = rng.range(50, 2000) as usize;
                    let (ids, evs): (Vec<String>, Vec<Value>) = (0..n).map(|j| one(j, len)).unzip();
                    sent_batches.push(ids);
                    lines.push(Value::Array(evs));
                } else {
                    let len = rng.range(20, 300) as usize;
                    lines.push(one(0, len).1);
                }
            }
            victims.push(spawn_victim(&env, run, lines, small.map(|s| s.1)));
        }
        // Kill in a random order, each after a random number of acks and a random delay.
        while !victims.is_empty() {
            let mut v = victims.swap_remove(rng.below(victims.len() as u64) as usize);
            for _ in 0..rng.below(4) {
                if v.acks.recv_timeout(Duration::from_secs(30)).is_err() {
                    break; // finished all its input or died: kill it anyway
                }
            }
            std::thread::sleep(Duration::from_micros(rng.below(3000)));
            let _ = v.child.kill();
            let _ = v.child.wait();
            acked.extend(v.reader.join().expect("reader thread"));
        }
    }
    // Appending works afterwards (and repairs any tail cut by a kill).
    let last = env
        .swarm(&[
            "append",
            "--run",
            run,
            "--agent",
            "after",
            "--type",
            "decision",
            "--content",
            "after the kills",
        ])
        .ok()
        .events();
    let stored = env.check_run(run);
    assert_eq!(stored.last(), last.last());
    let by_id: HashMap<&str, &Event> = stored.iter().map(|e| (e.id.as_str(), e)).collect();
    for a in &acked {
        assert_eq!(
            by_id.get(a.id.as_str()).copied(),
            Some(a),
            "acknowledged event {} lost or changed",
            a.id
        );
    }
    for e in &stored[..stored.len() - 1] {
        assert!(sent_ids.contains(&e.id), "stored event {} never sent", e.id);
    }
    for b in &sent_batches {
        let seqs: Vec<Option<u64>> = b
            .iter()
            .map(|id| by_id.get(id.as_str()).map(|e| e.seq))
            .collect();
        if seqs[0].is_none() {
            assert!(seqs.iter().all(Option::is_none), "batch partly stored");
        } else {
            let first = seqs[0].unwrap_or_default();
            let want: Vec<Option<u64>> = (first..first + b.len() as u64).map(Some).collect();
            assert_eq!(seqs, want, "batch not stored whole and consecutive");
        }
    }
    eprintln!(
        "{test}: {rounds} rounds, {} acknowledged, {} stored, {} torn tails repaired, {} segments",
        acked.len(),
        stored.len(),
        env.broken_files(run).len(),
        env.segments(run).len()
    );
    if small.is_some() {
        assert!(env.segments(run).len() > 3, "the run never rotated");
    }
    assert!(!acked.is_empty(), "no writer ever acknowledged anything");
}

#[test]
fn kill9_loop_single_events() {
    kill_loop("kill9_loop_single_events", 24, false, None);
}

#[test]
fn kill9_loop_batches() {
    kill_loop("kill9_loop_batches", 20, true, None);
}

/// Kills during preallocation and during rotation: 16 KiB segments zero-filled ahead in
/// 4 KiB chunks, so most groups extend the fill and many end a segment (trim, fsync,
/// create the next).
#[test]
fn kill9_loop_preallocation_and_rotation() {
    kill_loop(
        "kill9_loop_preallocation_and_rotation",
        16,
        false,
        Some((16 << 10, 4 << 10)),
    );
}
