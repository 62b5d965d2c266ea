//! The CLI's promises to scripts and to the person at the terminal (issue 10, point 8):
//! a reused id with another event is refused, a lost acknowledgement has its own exit
//! code, agents' text never drives the terminal, read-only commands refuse a data dir
//! that does not exist, each OS error is said once, and background checkpoints coalesce.

use std::process::Stdio;

use serde_json::json;

use crate::util::Env;

fn ev(agent: &str, kind: &str, subject: &str, content: &str) -> serde_json::Value {
    json!({"agent_id": agent, "type": kind, "subject": subject, "content": content})
}

/// `swarm append` of one evidence entry to run `r`, with extra flags.
fn append_evidence<'a>(agent: &'a str, content: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "append",
        "--run",
        "r",
        "--agent",
        agent,
        "--type",
        "evidence",
        "--content",
        content,
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn a_reused_id_with_another_event_is_a_conflict_naming_the_stored_seq() {
    let env = Env::new();
    let id = ["--id", "a-1"];
    let first = env
        .swarm(&append_evidence("a", "disk full", &id))
        .ok()
        .events();
    assert_eq!(first[0].seq, 1);
    // The same event again: an idempotent retry, answered with the stored event.
    let again = env
        .swarm(&append_evidence("a", "disk full", &id))
        .ok()
        .events();
    assert_eq!((again.len(), again[0].seq), (1, 1));
    // Another event under the same id: refused, and the stored one is named.
    env.swarm(&append_evidence("a", "disk fine", &id))
        .code(4)
        .one_line_error(&["\"a-1\"", "seq 1", "content"]);
    env.swarm(&append_evidence("b", "disk full", &id))
        .code(4)
        .one_line_error(&["seq 1", "agent_id"]);
    let all = env.read("r");
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].content, json!("disk full"));
}

#[test]
fn an_acknowledgement_that_cannot_be_written_exits_7_naming_the_stored_seq() {
    let env = Env::new();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = env
        .cmd(&[
            "append",
            "--run",
            "r",
            "--agent",
            "a",
            "--type",
            "evidence",
            "--content",
            "x",
        ])
        .stdin(Stdio::null())
        .stdout(full.try_clone().expect("dup"))
        .output()
        .expect("run swarm");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "stderr: {stderr}");
    assert!(stderr.contains("stored as seq 1"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The event is durable although nobody saw the acknowledgement.
    assert_eq!(env.read("r").len(), 1);
    let out = env
        .cmd(&["append", "--run", "r", "--stdin"])
        .stdin(Stdio::piped())
        .stdout(full)
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            let mut i = c.stdin.take().expect("stdin");
            i.write_all(b"[{\"agent_id\":\"a\",\"type\":\"evidence\",\"content\":\"y\"},{\"agent_id\":\"a\",\"type\":\"evidence\",\"content\":\"z\"}]\n")?;
            drop(i);
            c.wait_with_output()
        })
        .expect("run swarm");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "stderr: {stderr}");
    assert!(stderr.contains("stored as seqs 2..3"), "{stderr}");
    assert_eq!(env.read("r").len(), 3);
    // Every other command that writes, then prints: exit 7 once the write is stored, never
    // exit 1 (a script would retry it) nor a panic (exit 101).
    env.append_lines(
        "r",
        &[
            json!({"agent_id": "a", "type": "hypothesis", "subject": "cause", "content": "disk", "confidence": 0.9}),
            json!({"agent_id": "b", "type": "hypothesis", "subject": "cause", "content": "dns", "confidence": 0.4}),
        ],
    );
    let policy_file = tempfile::NamedTempFile::new().unwrap();
    let policy = policy_file.path();
    std::fs::write(policy, r#"{"permissions": {"*": {"read_channels": ["*"], "write_channels": ["*"], "read_types": ["*"], "write_types": ["*"], "admin": true}}}"#).unwrap();
    let policy = policy.to_str().unwrap();
    let writes: [&[&str]; 7] = [
        &["checkpoint", "--run", "r"],
        &[
            "policy", "set", "--run", "r", "--agent", "lead", "--file", policy,
        ],
        &[
            "channel",
            "declare",
            "--run",
            "r",
            "--agent",
            "lead",
            "--channel",
            "notes",
            "--kind",
            "replace",
        ],
        &[
            "channel",
            "write",
            "--run",
            "r",
            "--agent",
            "lead",
            "--channel",
            "notes",
            "--value",
            "\"v1\"",
        ],
        &["pick", "--run", "r", "--subject", "cause"],
        &["prune", "--run", "r", "--force"],
        &["run", "close", "r", "--by", "lead"],
    ];
    for args in writes {
        let before = env.read("r").len();
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = env
            .cmd(args)
            .stdin(Stdio::null())
            .stdout(full)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(7), "{args:?}: {stderr}");
        assert!(
            stderr.contains("acknowledgement could not be written"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        if args[0] != "checkpoint" {
            assert!(env.read("r").len() > before, "{args:?} stored nothing");
        }
        // The stored write's seq is named, so a script can find it without retrying.
        if ["channel", "pick", "policy", "resolve"].contains(&args[0]) {
            let seq = env.read("r").last().unwrap().seq;
            assert!(stderr.contains(&format!("seq {seq}")), "{args:?}: {stderr}");
        }
    }
}

#[test]
fn the_append_that_opens_an_escalation_prints_it() {
    let env = Env::new();
    env.append_lines(
        "r",
        &[ev(
            "db",
            "action_taken",
            "orders-db",
            "failed over to replica",
        )],
    );
    let out = env
        .swarm(&[
            "append",
            "--run",
            "r",
            "--agent",
            "app",
            "--type",
            "action_taken",
            "--subject",
            "orders-db",
            "--content",
            "restarted primary",
        ])
        .ok();
    let evs = out.events();
    assert_eq!(evs.len(), 2, "{}", out.stdout);
    assert_eq!(evs[0].seq, 2);
    assert_eq!(evs[1].kind.as_str(), "escalation");
    assert_eq!(evs[1].seq, 3);
}

#[test]
fn agents_text_is_escaped_in_every_human_facing_output() {
    let env = Env::new();
    let nasty = "pool full\u{1b}]0;pwned\u{7}\u{1b}[2J\rhidden";
    env.append_lines(
        "r",
        &[
            ev("db", "evidence", "orders-db", nasty),
            ev("db", "evidence", "orders-db", nasty),
        ],
    );
    let timeline = env.swarm(&["replay", "--run", "r", "--timeline"]).ok();
    let facts = {
        env.swarm(&["synth", "--all"]).ok();
        env.swarm(&["facts", "--table"]).ok()
    };
    let context = env
        .swarm(&[
            "context",
            "--run",
            "r",
            "--agent",
            "db",
            "--budget-bytes",
            "4000",
        ])
        .ok();
    for (what, out) in [
        ("timeline", &timeline),
        ("facts", &facts),
        ("context", &context),
    ] {
        assert!(out.stdout.contains("pool full"), "{what}: {}", out.stdout);
        assert!(
            !out.stdout
                .bytes()
                .any(|b| b == 0x1b || b == b'\r' || b == 0x07),
            "{what} prints control characters raw: {:?}",
            out.stdout
        );
        assert!(out.stdout.contains("\\x1b"), "{what}: {:?}", out.stdout);
    }
    // JSON output stays exact: the content round-trips.
    assert_eq!(env.read("r")[0].content, json!(nasty));
}

#[test]
fn replay_past_the_head_is_an_error_naming_the_head() {
    let env = Env::new();
    env.append_lines(
        "r",
        &[
            ev("a", "evidence", "s", "one"),
            ev("a", "evidence", "s", "two"),
        ],
    );
    env.swarm(&["replay", "--run", "r", "--at-seq", "2"]).ok();
    env.swarm(&["replay", "--run", "r", "--at-seq", "9"])
        .code(2)
        .one_line_error(&["seq 9", "head (seq 2)"]);
}

#[test]
fn read_only_commands_refuse_a_data_dir_that_does_not_exist() {
    let env = Env::new();
    let missing = env.path().join("no-such-dir");
    let swarm_at = |args: &[&str]| {
        let out = std::process::Command::new(crate::util::SWARM)
            .env_remove("SWARM_DATA_DIR")
            .arg("--data-dir")
            .arg(&missing)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run swarm");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for args in [
        vec!["runs"],
        vec!["read", "--run", "r"],
        vec!["tail", "--run", "r"],
        vec!["verify"],
        vec!["synth", "--all"],
        vec!["facts"],
        vec!["metrics", "--run", "r"],
    ] {
        let (code, stdout, stderr) = swarm_at(&args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("no-such-dir") && stderr.contains("does not exist"),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert!(!missing.exists(), "{args:?} created the data dir");
    }
    // A write creates it.
    let (code, _, stderr) = swarm_at(&[
        "append",
        "--run",
        "r",
        "--agent",
        "a",
        "--type",
        "evidence",
        "--content",
        "x",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(missing.is_dir());
}

#[test]
fn stderr_has_no_colours_when_piped_and_each_os_error_once() {
    let env = Env::new();
    env.append_lines("r", &[ev("a", "evidence", "s", "one")]);
    // An empty cursor file is no cursor: a WARN (no escape codes on a pipe), exit 0.
    let cursor = env.path().join("lead.cursor");
    std::fs::write(&cursor, b"").expect("write cursor");
    let out = env
        .swarm(&[
            "tail",
            "--run",
            "r",
            "--cursor-file",
            cursor.to_str().expect("utf-8"),
        ])
        .ok();
    assert_eq!(out.events().len(), 1);
    assert!(out.stderr.contains("empty cursor file"), "{}", out.stderr);
    assert!(!out.stderr.contains('\u{1b}'), "{:?}", out.stderr);
    // A cursor path that is a directory: the OS error is said once.
    let dir = env.path().join("a-dir");
    std::fs::create_dir(&dir).expect("mkdir");
    let out = env
        .swarm(&[
            "tail",
            "--run",
            "r",
            "--cursor-file",
            dir.to_str().expect("utf-8"),
        ])
        .one_line_error(&["a-dir"]);
    let line = out.stderr.trim();
    let os = "Is a directory";
    assert_eq!(line.matches(os).count(), 1, "{line}");
    assert!(!line.contains('\u{1b}'), "{line:?}");
}

#[test]
fn background_checkpoints_coalesce_instead_of_one_thread_per_crossing() {
    let env = Env::fast();
    let lines: String = (0..3000)
        .map(|i| {
            format!(
                "{}\n",
                ev(
                    "a",
                    "evidence",
                    &format!("s{}", i % 7),
                    &format!("event {i}")
                )
            )
        })
        .collect();
    let out = env.swarm_stdin(
        &[
            "--checkpoint-every",
            "1",
            "append",
            "--run",
            "r",
            "--stdin",
            "--durability",
            "none",
        ],
        &lines,
    );
    let out = out.ok();
    assert_eq!(out.events().len(), 3000);
    let warns = out.stderr.lines().filter(|l| l.contains("WARN")).count();
    assert_eq!(warns, 0, "{}", out.stderr);
    // Checkpoints were written (the last job ran at a late head), and they are usable.
    let cks = env.swarm(&["replay", "--run", "r"]).ok();
    let v: serde_json::Value = serde_json::from_str(cks.stdout.trim()).expect("replay json");
    assert_eq!(v["state"]["head_seq"], 3000);
    assert!(
        v["replay"]["from_checkpoint"].as_u64().is_some(),
        "{}",
        v["replay"]
    );
}

/// The README's first command, 50 times, four at a time (each in its own data dir) while
/// two threads keep both cores busy: every run exits 0. (It used to fail in about one run
/// of 25 when its foreground prune lost a race to a writer's background pruner.)
#[test]
fn fifty_demos_under_cpu_load_all_exit_0() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let stop = Arc::new(AtomicBool::new(false));
    let burners: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                x
            })
        })
        .collect();
    let mut failures = Vec::new();
    for round in 0..13 {
        let kids: Vec<_> = (0..4)
            .filter(|i| round * 4 + i < 50)
            .map(|_| {
                let dir = tempfile::tempdir().expect("tempdir");
                // A data dir that does not exist yet, as a new user's would be.
                let child = std::process::Command::new(crate::util::SWARM)
                    .env_remove("SWARM_DATA_DIR")
                    .arg("--data-dir")
                    .arg(dir.path().join("data"))
                    .arg("demo")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn demo");
                (dir, child)
            })
            .collect();
        for (_dir, child) in kids {
            let out = child.wait_with_output().expect("wait demo");
            if !out.status.success() {
                failures.push(format!(
                    "{:?}: {}",
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for b in burners {
        b.join().unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} demo runs failed: {failures:?}",
        failures.len()
    );
}

/// Closed runs read like open ones: `tail` replays an archived run, `--follow` ends
/// (exit 0) after `run_closed`, a following tail ends when the run is closed under it,
/// `index rebuild` counts the archived events, and the run reads the same from another
/// working directory (archive paths are relative to the data dir), including one closed
/// by an older build that recorded a path relative to its working directory.
#[test]
fn closed_runs_read_like_open_ones() {
    let env = Env::new();
    let lines: Vec<_> = (0..5)
        .map(|i| ev("a", "evidence", "s", &format!("e{i}")))
        .collect();
    env.append_lines("r", &lines);
    let mut follower = env
        .cmd(&["tail", "--run", "r", "--follow", "--poll-ms", "20"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    env.swarm(&["run", "close", "r", "--by", "lead"]).ok();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while follower.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "a following tail did not end after run_closed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = follower.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = crate::util::parse_events(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(got.len(), 6);
    assert_eq!(got[5].kind.as_str(), "run_closed");
    let all = env.read("r");
    assert_eq!(all.len(), 6);
    assert_eq!(env.swarm(&["tail", "--run", "r"]).ok().events(), all);
    assert_eq!(
        env.swarm(&["tail", "--run", "r", "--follow"]).ok().events(),
        all
    );
    let idx = env.swarm(&["index", "rebuild", "--run", "r"]).ok();
    assert!(idx.stdout.contains("\"head_seq\":6"), "{}", idx.stdout);
    // Another working directory: the same events.
    let elsewhere = tempfile::tempdir().unwrap();
    let out = env
        .cmd(&["read", "--run", "r"])
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        crate::util::parse_events(&String::from_utf8_lossy(&out.stdout)),
        all
    );
    // An older build's record: the archive path relative to the closer's directory.
    let closer = tempfile::tempdir().unwrap();
    let old_dir = closer.path().join("archive").join("anonymous");
    std::fs::create_dir_all(&old_dir).unwrap();
    let tomb = env.run_dir("r").join("ARCHIVED");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&tomb).unwrap()).unwrap();
    let now = env.path().join(v["archive"].as_str().unwrap());
    std::fs::rename(&now, old_dir.join("r.swarc")).unwrap();
    std::fs::write(
        &tomb,
        serde_json::to_vec(&json!({"archive": "archive/anonymous/r.swarc", "head_seq": 6}))
            .unwrap(),
    )
    .unwrap();
    let read_from = |dir: &std::path::Path| {
        let out = env
            .cmd(&["read", "--run", "r"])
            .current_dir(dir)
            .output()
            .unwrap();
        (
            out.status.code(),
            crate::util::parse_events(&String::from_utf8_lossy(&out.stdout)),
        )
    };
    assert_eq!(read_from(closer.path()), (Some(0), all.clone()));
    // The record was migrated: any directory reads it now.
    assert_eq!(read_from(elsewhere.path()), (Some(0), all));
}

/// A one-shot append that crosses the checkpoint interval leaves its checkpoint behind:
/// the job it started ran on a thread the process's exit killed, so a run fed by
/// `swarm append` processes got its checkpoints only from readers.
#[test]
fn a_one_shot_append_leaves_its_checkpoint() {
    let env = Env::new();
    let ck_dir = env.path().join(".checkpoints").join("anonymous").join("r");
    let count = || {
        std::fs::read_dir(&ck_dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".swck"))
                    .count()
            })
            .unwrap_or(0)
    };
    for round in 1..=3 {
        let lines: String = (0..4)
            .map(|i| {
                format!(
                    "{{\"agent_id\":\"a\",\"type\":\"evidence\",\"content\":\"e{round}-{i}\"}}\n"
                )
            })
            .collect();
        env.swarm_stdin(
            &["--checkpoint-every", "4", "append", "--run", "r", "--stdin"],
            &lines,
        )
        .ok();
        assert_eq!(
            count(),
            round,
            "round {round}: no checkpoint at seq {}",
            round * 4
        );
    }
}
