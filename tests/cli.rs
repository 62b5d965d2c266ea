//! CLI behaviour not covered elsewhere: a closed stdout (`swarm read | head -1`).

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use swarm_memory::{Durability, Event};

use crate::util::{new_ev, Env};

#[test]
fn read_into_a_closed_pipe_exits_quietly() {
    let env = Env::new();
    let run = "big";
    let store = env.store();
    let batch = |k: usize| {
        (0..1000)
            .map(|i| new_ev(None, &format!("event {k}.{i} {}", "p".repeat(100))))
            .collect()
    };
    for k in 0..5 {
        store
            .append_batch(run, batch(k), None, Durability::Sync)
            .unwrap();
    }
    drop(store);
    let mut child = env
        .cmd(&["read", "--run", run])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut first).unwrap();
    let e: Event = serde_json::from_str(&first).unwrap();
    assert_eq!(e.seq, 1);
    drop(out); // like `head -1` exiting
    let done = child.wait_with_output().unwrap();
    assert_eq!(
        done.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(
        done.stderr.is_empty(),
        "stderr: {}",
        String::from_utf8_lossy(&done.stderr)
    );
}

/// The same through a shell pipeline, as a user would type it.
#[test]
fn read_piped_to_head_in_a_shell() {
    let env = Env::new();
    let run = "big";
    let store = env.store();
    let batch: Vec<_> = (0..3000)
        .map(|i| new_ev(None, &format!("event {i} {}", "h".repeat(100))))
        .collect();
    for chunk in batch.chunks(1000) {
        store
            .append_batch(run, chunk.to_vec(), None, Durability::Sync)
            .unwrap();
    }
    drop(store);
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#""$0" --data-dir "$1" read --run big | head -1"#)
        .arg(crate::util::SWARM)
        .arg(env.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("swarm:") && !stderr.contains("panicked"),
        "{stderr}"
    );
}
