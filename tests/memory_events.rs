//! Memory events (seed 002): `swarm memory-events` (NDJSON, --follow) and
//! `GET /v1/memory-events` (SSE) derive them from the log; each names its source seq.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use serde_json::Value;

use crate::serve::{token, Server};
use crate::util::Env;

fn append(env: &Env, user: &str, run: &str, args: &[&str]) {
    let mut a = vec!["--user", user, "append", "--run", run, "--agent", "sre"];
    a.extend_from_slice(args);
    let out = env.swarm(&a);
    assert_eq!(out.code, 0, "{}", out.stderr);
}

/// An incident of alice's: a finding, a failed tracked call, a self-correction, a
/// conversation message (no memory event) and the closing decision.
fn incident(env: &Env, run: &str) {
    append(
        env,
        "alice",
        run,
        &[
            "--type",
            "evidence",
            "--subject",
            "orders-db",
            "--content",
            "orders-db pool exhausted",
        ],
    );
    append(
        env,
        "alice",
        run,
        &[
            "--type",
            "action_taken",
            "--content",
            "query_metrics failed: bad filter",
            "--meta",
            r#"{"tracked":true,"tool":"query_metrics","tool_status":"error","error":"bad filter"}"#,
        ],
    );
    append(
        env,
        "alice",
        run,
        &[
            "--type",
            "action_taken",
            "--content",
            "query_metrics succeeded after a correction",
            "--meta",
            r#"{"tracked":true,"tool":"query_metrics","tool_status":"ok","lesson":"give resource.type"}"#,
        ],
    );
    append(
        env,
        "alice",
        run,
        &[
            "--type",
            "evidence",
            "--content",
            "checkout is slow",
            "--meta",
            r#"{"role":"user"}"#,
        ],
    );
    append(
        env,
        "alice",
        run,
        &[
            "--type",
            "decision",
            "--content",
            "root cause: pool saturation",
            "--meta",
            r#"{"symptom":"high_latency_checkout","root_cause":"pool saturation","resolution":"pool 10 -> 50"}"#,
        ],
    );
}

fn lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).expect("NDJSON"))
        .collect()
}

#[test]
fn memory_events_cli_prints_seed_002_fields_linked_to_their_seq() {
    let env = Env::fast();
    incident(&env, "inc");
    let out = env.swarm(&["--user", "alice", "memory-events", "--run", "inc"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let got = lines(&out.stdout);
    let summary: Vec<(u64, &str, &str)> = got
        .iter()
        .map(|m| {
            (
                m["seq"].as_u64().unwrap(),
                m["action"].as_str().unwrap(),
                m["category"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (1, "stored", "success"),
            (2, "tool_tracked", "tracking"),
            (2, "stored", "failure"),
            (3, "tool_tracked", "tracking"),
            (3, "pattern_learned", "pattern"),
            (5, "pattern_learned", "pattern"),
        ]
    );
    let events = lines(
        &env.swarm(&["--user", "alice", "read", "--run", "inc"])
            .stdout,
    );
    for m in &got {
        assert_eq!(m["type"], "memory");
        assert_eq!(m["run"], "inc");
        for k in ["title", "description", "timestamp"] {
            assert!(m[k].as_str().is_some_and(|s| !s.is_empty()), "{k}: {m}");
        }
        assert!(m["metadata"].is_object(), "{m}");
        let src = &events[m["seq"].as_u64().unwrap() as usize - 1];
        assert_eq!(m["timestamp"], src["ts"], "{m}");
        assert_eq!(m["metadata"]["agent"], src["agent_id"]);
    }
    assert_eq!(got[1]["tool_name"], "query_metrics");
    assert_eq!(got[2]["metadata"]["error"], "bad filter");
    // Without --run: every run of the user; bob has none of alice's.
    let all = env.swarm(&["--user", "alice", "memory-events"]);
    assert_eq!(lines(&all.stdout).len(), 6);
    let bob = env.swarm(&["--user", "bob", "memory-events"]);
    assert_eq!((bob.code, bob.stdout.as_str()), (0, ""), "{}", bob.stderr);
}

/// `--as-agent`: memory events only of the events that agent is shown (a policy that
/// shows "db" evidence only hides the actions and the decision they come from).
#[test]
fn memory_events_as_an_agent_follow_the_run_policy() {
    let env = Env::fast();
    incident(&env, "inc");
    let policy = r#"{"permissions": {
        "sre": {"read_types": ["*"], "write_types": ["*"], "admin": true},
        "db": {"read_types": ["evidence"], "write_types": ["evidence"]}}}"#;
    let set = env.swarm_stdin(
        &[
            "--user", "alice", "policy", "set", "--run", "inc", "--agent", "sre", "--file", "-",
        ],
        policy,
    );
    assert_eq!(set.code, 0, "{}", set.stderr);
    let seqs = |agent: &str| -> Vec<(u64, String)> {
        let out = env.swarm(&[
            "--user",
            "alice",
            "memory-events",
            "--run",
            "inc",
            "--as-agent",
            agent,
        ]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        lines(&out.stdout)
            .iter()
            .map(|m| {
                (
                    m["seq"].as_u64().unwrap(),
                    m["action"].as_str().unwrap().into(),
                )
            })
            .collect()
    };
    assert_eq!(seqs("db"), [(1, "stored".to_string())]);
    assert_eq!(seqs("sre").len(), 6);
    // Every run: the same filter; the engine's own logs are skipped, not refused.
    let all = env.swarm(&["--user", "alice", "memory-events", "--as-agent", "db"]);
    assert_eq!(
        (all.code, lines(&all.stdout).len()),
        (0, 1),
        "{}",
        all.stderr
    );
}

#[test]
fn memory_events_follow_sees_a_new_append() {
    let env = Env::fast();
    append(
        &env,
        "alice",
        "inc",
        &["--type", "evidence", "--content", "first"],
    );
    let mut child = env
        .cmd(&[
            "--user",
            "alice",
            "memory-events",
            "--run",
            "inc",
            "--follow",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let first: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (first["seq"].as_u64(), first["action"].as_str()),
        (Some(1), Some("stored"))
    );
    append(
        &env,
        "alice",
        "inc",
        &[
            "--type",
            "action_taken",
            "--content",
            "called get_logs: ok",
            "--meta",
            r#"{"tracked":true,"tool":"get_logs","tool_status":"ok"}"#,
        ],
    );
    line.clear();
    r.read_line(&mut line).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let next: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (next["seq"].as_u64(), next["action"].as_str()),
        (Some(2), Some("tool_tracked"))
    );
    assert_eq!(next["tool_name"], "get_logs");
}

#[test]
fn memory_events_route_streams_the_tokens_users_events_only() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let alice = token(&env, "alice", &["sre"], "agent");
    let bob = token(&env, "bob", &["sre"], "agent");
    incident(&env, "inc");
    let mut sse = srv.follow("/v1/memory-events?run=inc", &alice, None);
    let mut got = Vec::new();
    for _ in 0..6 {
        let m = sse.next().expect("a memory event");
        let v: Value = serde_json::from_str(&m.data).unwrap();
        assert_eq!(m.id, v["seq"].as_u64(), "{v}");
        got.push((
            v["seq"].as_u64().unwrap(),
            v["action"].as_str().unwrap().to_string(),
        ));
    }
    assert_eq!(got[0], (1, "stored".to_string()));
    assert_eq!(got[5], (5, "pattern_learned".to_string()));
    // Live: an append by another process arrives.
    append(
        &env,
        "alice",
        "inc",
        &["--type", "evidence", "--content", "replica lag 30 s"],
    );
    let m = sse.next().expect("the new append's memory event");
    assert_eq!(m.id, Some(6));
    // Bob's token: alice's run does not exist for him.
    let r = srv.get("/v1/memory-events?run=inc", Some(&bob));
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(!r.body.contains("pool"), "{}", r.body);
    let r = srv.get("/v1/memory-events?run=inc", None);
    assert_eq!(r.status, 401, "{}", r.body);
}
