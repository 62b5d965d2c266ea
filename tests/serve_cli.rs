//! The CLI as a client of the server (`SWARM_URL`, `SWARM_TOKEN`) against the embedded
//! CLI on the same data directory: the same commands print the same bytes and exit with
//! the same codes. Also the operator routes (`/healthz`, `/readyz`, `/metrics`,
//! `/v1/openapi.json`).

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use serde_json::{json, Value};

use crate::serve::{token, Server};
use crate::util::{Env, Out};

/// `swarm ARGS` as a client of `srv` with `token`.
fn remote(env: &Env, srv: &Server, token: &str, args: &[&str], input: &str) -> Out {
    let mut c = env.cmd(args);
    c.env("SWARM_URL", &srv.url).env("SWARM_TOKEN", token);
    Out::run(c, args, input)
}

/// `swarm --user alice ARGS` on the files.
fn local(env: &Env, args: &[&str], input: &str) -> Out {
    let mut all = vec!["--user", "alice"];
    all.extend_from_slice(args);
    let mut c = env.cmd(&all);
    c.env_remove("SWARM_URL");
    Out::run(c, &all, input)
}

#[test]
fn serve_cli_through_swarm_url_prints_what_the_embedded_cli_prints() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    // An admin token reads unfiltered, as the embedded CLI does without --as-agent.
    let t = token(&env, "alice", &["*"], "admin");
    let r = |args: &[&str]| remote(&env, &srv, &t, args, "");
    // Appends through the server and on the files, one after the other.
    let a = r(&[
        "append",
        "--run",
        "inc",
        "--agent",
        "db-1",
        "--type",
        "hypothesis",
        "--content",
        "disk full",
        "--subject",
        "db-1",
        "--confidence",
        "0.7",
        "--id",
        "h1",
    ])
    .ok();
    assert_eq!(a.events()[0].seq, 1);
    local(
        &env,
        &[
            "append",
            "--run",
            "inc",
            "--agent",
            "db-2",
            "--type",
            "evidence",
            "--content",
            "{\"disk\":\"100%\"}",
            "--json",
            "--subject",
            "db-1",
            "--ref",
            "1",
        ],
        "",
    )
    .ok();
    let lines = "{\"agent_id\":\"db-1\",\"type\":\"evidence\",\"content\":\"wal 40G\",\"subject\":\"db-1\"}\n\
                 [{\"agent_id\":\"net\",\"type\":\"hypothesis\",\"content\":\"dns\",\"subject\":\"net\"},{\"agent_id\":\"net\",\"type\":\"evidence\",\"content\":\"nxdomain\",\"subject\":\"net\"}]\n";
    let stdin = remote(
        &env,
        &srv,
        &t,
        &["append", "--run", "inc", "--stdin"],
        lines,
    )
    .ok();
    assert_eq!(
        stdin.events().iter().map(|e| e.seq).collect::<Vec<_>>(),
        [3, 4, 5]
    );
    // A retry with the same id stores nothing new and prints the stored event.
    let again = r(&[
        "append",
        "--run",
        "inc",
        "--agent",
        "db-1",
        "--type",
        "hypothesis",
        "--content",
        "disk full",
        "--subject",
        "db-1",
        "--confidence",
        "0.7",
        "--id",
        "h1",
    ])
    .ok();
    assert_eq!(again.stdout, a.stdout);

    for args in [
        vec!["read", "--run", "inc"],
        vec![
            "read",
            "--run",
            "inc",
            "--type",
            "evidence",
            "--subject",
            "db-1",
        ],
        vec!["read", "--run", "inc", "--last", "2"],
        vec!["read", "--run", "inc", "--from-seq", "2", "--limit", "2"],
        vec!["read", "--run", "inc", "--as-agent", "db-1"],
        vec!["tail", "--run", "inc", "--from-seq", "3"],
        vec!["board", "--run", "inc"],
        vec!["board", "--run", "inc", "--history"],
        vec![
            "board",
            "--run",
            "inc",
            "--subject",
            "net",
            "--agent",
            "net",
        ],
        vec![
            "context",
            "--run",
            "inc",
            "--agent",
            "db-1",
            "--budget-bytes",
            "2000",
        ],
        vec![
            "context",
            "--run",
            "inc",
            "--agent",
            "db-1",
            "--budget-bytes",
            "300",
            "--json",
        ],
    ] {
        let (over, files) = (r(&args), local(&env, &args, ""));
        assert_eq!(over.code, 0, "{args:?}: {}", over.stderr);
        assert!(!over.stdout.is_empty(), "{args:?}");
        assert_eq!(over.stdout, files.stdout, "{args:?}");
        assert_eq!(over.code, files.code, "{args:?}");
    }
    // Errors: the same exit code, and for a missing run the same message.
    for args in [
        vec!["read", "--run", "nope"],
        vec!["board", "--run", "nope"],
    ] {
        let (over, files) = (r(&args), local(&env, &args, ""));
        assert_eq!((over.code, &over.stderr), (2, &files.stderr), "{args:?}");
        assert_eq!(files.code, 2);
    }
    let bad = [
        "append",
        "--run",
        "inc",
        "--agent",
        "db-1",
        "--type",
        "bogus",
        "--content",
        "x",
    ];
    assert_eq!(r(&bad).code, local(&env, &bad, "").code);
    assert_eq!(r(&bad).code, 2);
    let cas = [
        "append",
        "--run",
        "inc",
        "--agent",
        "db-1",
        "--type",
        "evidence",
        "--content",
        "x",
        "--expect-seq",
        "1",
    ];
    assert_eq!((r(&cas).code, local(&env, &cas, "").code), (4, 4));
    // A token that may not act as the agent: exit 5, as a policy refusal is.
    let db = token(&env, "alice", &["db*"], "agent");
    let not_mine = [
        "append",
        "--run",
        "inc",
        "--agent",
        "net",
        "--type",
        "evidence",
        "--content",
        "x",
    ];
    assert_eq!(remote(&env, &srv, &db, &not_mine, "").code, 5);
    assert_eq!(
        remote(&env, &srv, "swm_0_0", &["read", "--run", "inc"], "").code,
        5
    );
    // The file-only commands refuse instead of using local files.
    assert_eq!(r(&["checkpoint", "--run", "inc"]).code, 2);
    // Nothing of the refused appends was written.
    assert_eq!(local(&env, &["read", "--run", "inc"], "").events().len(), 5);

    // A live tail through the server gets what is there, then what comes.
    let mut c = env.cmd(&["tail", "--run", "inc", "--follow", "--from-seq", "4"]);
    c.env("SWARM_URL", &srv.url)
        .env("SWARM_TOKEN", &t)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = c.spawn().expect("tail");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let seq = |l: String| serde_json::from_str::<Value>(&l).unwrap()["seq"].as_u64();
    assert_eq!(seq(lines.next().unwrap().unwrap()), Some(4));
    assert_eq!(seq(lines.next().unwrap().unwrap()), Some(5));
    local(
        &env,
        &[
            "append",
            "--run",
            "inc",
            "--agent",
            "lead",
            "--type",
            "decision",
            "--content",
            "fix db-1",
        ],
        "",
    )
    .ok();
    let live = lines.next().unwrap().unwrap();
    let files = local(&env, &["read", "--run", "inc", "--from-seq", "6"], "").ok();
    assert_eq!(format!("{live}\n"), files.stdout);
    let _ = child.kill();
    let _ = child.wait();
}

/// `swarm tail --as-agent` reads as one agent in both modes: the run's read policy
/// applies on the files as through the server, and through `SWARM_URL` a token that acts
/// as several agents names the one (without it the server asks which, exit 2).
#[test]
fn tail_as_agent_applies_the_runs_policy_in_both_modes() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let t = token(&env, "alice", &["db*", "lead"], "agent");
    let append = |agent: &str, kind: &str, content: &str| {
        let args = [
            "append",
            "--run",
            "inc",
            "--agent",
            agent,
            "--type",
            kind,
            "--content",
            content,
        ];
        remote(&env, &srv, &t, &args, "").ok();
    };
    append("lead", "hypothesis", "pool exhausted on db-1");
    append("db-1", "evidence", "db-1 pool at 100/100");
    let policy = env.path().join("policy.json");
    std::fs::write(
        &policy,
        r#"{"permissions": {"db-1": {"read_types": ["evidence"], "write_types": ["evidence"]},
          "lead": {"read_types": ["*"], "write_types": ["*"], "admin": true}}}"#,
    )
    .unwrap();
    let set = [
        "policy",
        "set",
        "--run",
        "inc",
        "--agent",
        "lead",
        "--file",
        policy.to_str().unwrap(),
    ];
    remote(&env, &srv, &t, &set, "").ok();
    append("lead", "hypothesis", "SECRET zebra");
    append("db-1", "evidence", "db-1 pool back to 40/100");
    let args = ["tail", "--run", "inc", "--as-agent", "db-1"];
    let (over, files) = (
        remote(&env, &srv, &t, &args, "").ok(),
        local(&env, &args, "").ok(),
    );
    assert_eq!(over.stdout, files.stdout);
    let kinds: Vec<String> = files
        .events()
        .iter()
        .map(|e| e.kind.as_str().to_string())
        .collect();
    assert!(
        !files.stdout.contains("zebra") && !files.stdout.contains("pool exhausted"),
        "{}",
        files.stdout
    );
    assert!(
        kinds.iter().filter(|k| *k == "evidence").count() == 2,
        "{kinds:?}"
    );
    // The lead reads everything; without --as-agent the token cannot say who reads.
    let lead = ["tail", "--run", "inc", "--as-agent", "lead"];
    assert!(remote(&env, &srv, &t, &lead, "")
        .ok()
        .stdout
        .contains("zebra"));
    remote(&env, &srv, &t, &["tail", "--run", "inc"], "").code(2);
    // No agent reads an engine log.
    local(&env, &["tail", "--run", "@facts", "--as-agent", "db-1"], "").code(2);
}

#[test]
fn serve_operator_routes_health_metrics_and_openapi() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let t = token(&env, "alice", &["db"], "agent");
    assert_eq!(srv.get("/healthz", None).json()["ok"], true);
    assert_eq!(srv.get("/readyz", None).json()["ready"], true);
    let ev = json!({"agent_id": "db", "type": "evidence", "content": "x"});
    assert_eq!(srv.post("/v1/runs/inc/events", Some(&t), &ev).status, 201);
    srv.get("/v1/runs/inc/events", None).problem(401);
    let m = srv.get("/metrics", None);
    assert!(m.ctype.starts_with("text/plain"), "{}", m.ctype);
    for line in [
        "swarm_http_requests_total{status=\"201\"} 1",
        "swarm_http_requests_total{status=\"401\"} 1",
        "swarm_append_seconds_count 1",
        "swarm_appended_events_total 1",
        "swarm_tail_subscribers 0",
    ] {
        assert!(m.body.lines().any(|l| l == line), "{line} in\n{}", m.body);
    }
    // Every documented method of every documented path is routed; the others are 405.
    // (The server refuses, in debug builds, to route a path the document does not list.)
    let doc = srv.get("/v1/openapi.json", None).json();
    assert_eq!(doc["openapi"], "3.1.0");
    let fallback = srv.get("/no/such/route", Some(&t));
    fallback.problem(404);
    let mut checked = 0;
    for (p, item) in doc["paths"].as_object().unwrap() {
        let url = format!(
            "{}{}",
            srv.url,
            p.replace("{run}", "inc")
                .replace("{seq}", "1")
                .replace("{channel}", "c")
                .replace("{fact}", "F1")
        );
        for method in ["get", "post", "put", "delete"] {
            let r = srv
                .http
                .request(&method.to_uppercase(), &url)
                .set("Authorization", &format!("Bearer {t}"))
                .call();
            let r = crate::serve::Resp::from(r);
            if item.get(method).is_some() {
                assert_ne!(r.status, 405, "{method} {p}");
                assert_ne!(r.body, fallback.body, "{method} {p}");
                checked += 1;
            } else {
                assert_eq!(r.status, 405, "{method} {p}: {}", r.body);
                r.problem(405);
                // It says what the route takes.
                let allow = r.header("allow").unwrap_or_default();
                for m in ["get", "post", "put"]
                    .into_iter()
                    .filter(|m| item.get(m).is_some())
                {
                    assert!(allow.contains(&m.to_uppercase()), "{method} {p}: {allow}");
                }
            }
        }
    }
    assert!(checked >= 30, "{checked} routes");
    // Nothing was written by those bodiless calls.
    assert_eq!(srv.get("/v1/runs/inc/events", Some(&t)).seqs(), [1]);
}

/// The value of an unlabelled series in a `/metrics` text.
pub(crate) fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} in\n{text}"))
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `/metrics` counts the writers' fsyncs and the durable events they covered (events per
/// fsync), and the live tail's subscribers and what is buffered for them.
#[test]
fn serve_metrics_count_fsyncs_durable_events_and_tail_subscribers() {
    let env = Env::fast();
    // Heartbeats show the server a closed tail connection quickly.
    let srv = Server::start(&env, &["--heartbeat-ms", "100"]);
    let t = token(&env, "alice", &["db"], "agent");
    let scrape = || srv.get("/metrics", None).body;
    let before = scrape();
    for name in [
        "swarm_fsyncs_total",
        "swarm_durable_events_total",
        "swarm_tail_subscribers",
    ] {
        assert_eq!(metric(&before, name), 0, "{name}");
    }
    // Durable appends: a single event and a batch of three.
    let ev = |c: &str| json!({"agent_id": "db", "type": "evidence", "content": c});
    let r = srv.post("/v1/runs/inc/events?durability=sync", Some(&t), &ev("one"));
    assert_eq!(r.status, 201, "{}", r.body);
    let batch = json!([ev("two"), ev("three"), ev("four")]);
    assert_eq!(
        srv.post("/v1/runs/inc/events", Some(&t), &batch).status,
        201
    );
    // Not durable: counted as appended, not as durable.
    let r = srv.post("/v1/runs/inc/events?durability=none", Some(&t), &ev("five"));
    assert_eq!(r.status, 201, "{}", r.body);
    let m = scrape();
    let fsyncs = metric(&m, "swarm_fsyncs_total");
    assert!(fsyncs >= 1, "{m}");
    assert_eq!(metric(&m, "swarm_durable_events_total"), 4, "{m}");
    assert_eq!(metric(&m, "swarm_appended_events_total"), 5, "{m}");
    assert!(m.contains("# TYPE swarm_fsyncs_total counter"), "{m}");
    // Another user's store counts too (the totals are the server's).
    let bob = token(&env, "bob", &["db"], "agent");
    assert_eq!(
        srv.post("/v1/runs/x/events", Some(&bob), &ev("b")).status,
        201
    );
    let m = scrape();
    assert!(metric(&m, "swarm_fsyncs_total") > fsyncs, "{m}");
    assert_eq!(metric(&m, "swarm_durable_events_total"), 5, "{m}");
    // A live tail: one subscriber while it is open; the events it got were sent and
    // nothing stays buffered once it read them.
    let mut sse = srv.follow("/v1/runs/inc/events?follow=1", &t, None);
    for want in 1..=5 {
        assert_eq!(sse.next_seq(), want);
    }
    let m = scrape();
    assert_eq!(metric(&m, "swarm_tail_subscribers"), 1, "{m}");
    assert_eq!(metric(&m, "swarm_tail_sent_events_total"), 5, "{m}");
    assert_eq!(metric(&m, "swarm_tail_buffered_events"), 0, "{m}");
    drop(sse);
    // The server sees the connection gone at its next write or check (a heartbeat at
    // the latest): wait for the gauge to come down.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let m = scrape();
        if metric(&m, "swarm_tail_subscribers") == 0 {
            assert_eq!(metric(&m, "swarm_tail_buffered_events"), 0, "{m}");
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the subscriber stayed\n{m}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `swarm demo --server`: the agent processes are clients of a `swarm serve` the demo
/// starts (one token per agent); the incident runs to the same stages, the live tail
/// included, and the server stops cleanly on SIGTERM.
#[test]
fn demo_with_a_server_runs_the_incident_through_it() {
    let env = Env::fast();
    let out = env
        .cmd(&["demo", "--server", "--run", "inc-demo"])
        .env_remove("SWARM_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "the agents are clients of `swarm serve` at http://127.0.0.1:",
        "the tailing agent got the logs agent's finding",
        "ESCALATION",
        "verify: ok=true",
        "stopped by SIGTERM: exit 0",
        "the nightly synthesis",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
    // The agents wrote through the server as themselves, one token per agent, all
    // revoked at the end.
    let tokens: Vec<Value> = env
        .swarm(&["token", "list"])
        .ok()
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for agent in ["metrics", "logs", "traces"] {
        assert!(
            tokens.iter().any(|t| t["agents"] == json!([agent])),
            "{tokens:?}"
        );
    }
    assert!(
        tokens
            .iter()
            .all(|t| t.get("revoked").is_some_and(|r| !r.is_null())),
        "{tokens:?}"
    );
}

/// `swarm tail --follow` through `SWARM_URL` waits for a run that does not exist yet, as
/// the embedded tail does, and prints its first event once another client creates it.
#[test]
fn remote_follow_waits_for_a_run_to_be_created() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let t = token(&env, "alice", &["db"], "agent");
    let mut tail = env
        .cmd(&["tail", "--run", "later", "--follow"])
        .env("SWARM_URL", &srv.url)
        .env("SWARM_TOKEN", &t)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(600));
    assert!(
        tail.try_wait().unwrap().is_none(),
        "the tail gave up on a missing run"
    );
    let body = json!({"agent_id": "db", "type": "evidence", "content": "first"});
    assert_eq!(
        srv.post("/v1/runs/later/events", Some(&t), &body).status,
        201
    );
    let mut line = String::new();
    BufReader::new(tail.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = tail.kill();
    let _ = tail.wait();
    let e: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (e["seq"].as_u64(), e["content"].as_str()),
        (Some(1), Some("first"))
    );
}

/// Every served command through `SWARM_URL` prints what the embedded CLI prints on the
/// same data directory, and exits with the same code; writes through the server print
/// what was stored (the events the files then hold); the file-only commands refuse.
#[test]
fn serve_cli_every_served_command_prints_what_the_embedded_cli_prints() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let t = token(&env, "alice", &["*"], "admin");
    let r = |args: &[&str]| remote(&env, &srv, &t, args, "");
    let l = |args: &[&str]| local(&env, args, "");
    // The same bytes and exit code both ways (`nonempty`: and something was printed).
    let same = |args: &[&str], nonempty: bool| {
        let (over, files) = (r(args), l(args));
        assert_eq!(over.stdout, files.stdout, "{args:?}: {}", over.stderr);
        assert_eq!(over.code, files.code, "{args:?}: {}", over.stderr);
        if nonempty {
            assert!(!over.stdout.is_empty(), "{args:?}: {}", over.stderr);
        }
        over
    };
    // The stored event at `seq`, as the files print it.
    let stored = |seq: u64| {
        l(&[
            "read",
            "--run",
            "inc",
            "--from-seq",
            &seq.to_string(),
            "--limit",
            "1",
        ])
        .ok()
        .stdout
    };
    let append = |agent: &str, kind: &str, content: &str, subject: &str, conf: &str| {
        l(&[
            "append",
            "--run",
            "inc",
            "--agent",
            agent,
            "--type",
            kind,
            "--content",
            content,
            "--subject",
            subject,
            "--confidence",
            conf,
            "--meta",
            "{\"tool\":\"kubectl\"}",
        ])
        .ok()
    };
    append("a1", "hypothesis", "disk full on db-1", "cause", "0.6");
    append("a1", "hypothesis", "dns broken", "cause", "0.6");
    append("a1", "hypothesis", "pool exhausted", "net", "0.9");
    append("a2", "hypothesis", "packet loss", "net", "0.4");
    append("a3", "evidence", "disk 100% on db-1", "db-1", "0.8");

    // pick: a decision (exit 0), then a tie escalated (exit 6); a pick on the escalated
    // subject is refused alike both ways.
    let picked = r(&["pick", "--run", "inc", "--subject", "net"]).ok();
    let p: Value = serde_json::from_str(&picked.stdout).unwrap();
    assert_eq!(p["outcome"], "picked");
    let seq = p["decision"]["seq"].as_u64().unwrap();
    assert!(
        picked.stdout.contains(stored(seq).trim_end()),
        "{}",
        picked.stdout
    );
    let tie = r(&["pick", "--run", "inc", "--subject", "cause"]).code(6);
    let esc: Value = serde_json::from_str(&tie.stdout).unwrap();
    assert_eq!(esc["outcome"], "escalated");
    let esc_seq = esc["escalation"]["seq"].as_u64().unwrap();
    let again = ["pick", "--run", "inc", "--subject", "cause"];
    assert_eq!(r(&again).code, l(&again).code);
    same(&["escalations", "--run", "inc"], true);
    // resolve: a reader token may not (exit 5, as a policy refusal); an admin's is stored.
    let reader = token(&env, "alice", &["human"], "reader");
    let res = [
        "resolve",
        "--run",
        "inc",
        "--escalation",
        &esc_seq.to_string(),
        "--note",
        "dns",
    ];
    assert_eq!(remote(&env, &srv, &reader, &res, "").code, 5);
    let done = r(&res).ok();
    let ev: Value = serde_json::from_str(&done.stdout).unwrap();
    assert_eq!(done.stdout, stored(ev["seq"].as_u64().unwrap()));
    same(&["escalations", "--run", "inc"], false);
    same(&["escalations", "--run", "inc", "--all"], true);

    // runs, verify.
    same(&["runs"], true);
    same(&["runs", "--json"], true);
    same(&["verify"], true);
    same(&["verify", "--run", "inc"], true);
    same(&["verify", "--run", "nope"], false);

    // policy and channels.
    let policy = env.path().join("policy.json");
    std::fs::write(
        &policy,
        r#"{"permissions": {"*": {"read_channels": ["*"], "write_channels": ["*"],
            "read_types": ["*"], "write_types": ["*"]},
          "lead": {"read_channels": ["*"], "write_channels": ["*"], "read_types": ["*"],
            "write_types": ["*"], "admin": true}}, "prune_max_entries": 200}"#,
    )
    .unwrap();
    let set = r(&[
        "policy",
        "set",
        "--run",
        "inc",
        "--agent",
        "lead",
        "--file",
        policy.to_str().unwrap(),
    ])
    .ok();
    let ev: Value = serde_json::from_str(&set.stdout).unwrap();
    assert_eq!(set.stdout, stored(ev["seq"].as_u64().unwrap()));
    same(&["policy", "show", "--run", "inc"], true);
    let declare = r(&[
        "channel",
        "declare",
        "--run",
        "inc",
        "--agent",
        "lead",
        "--channel",
        "analysis",
        "--kind",
        "replace",
        "--on-conflict",
        "reject",
    ])
    .ok();
    let ev: Value = serde_json::from_str(&declare.stdout).unwrap();
    assert_eq!(declare.stdout, stored(ev["seq"].as_u64().unwrap()));
    let write = |value: &str, base: &str| {
        vec![
            "channel",
            "write",
            "--run",
            "inc",
            "--agent",
            "a1",
            "--channel",
            "analysis",
            "--value",
            value,
            "--base-version",
            base,
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>()
    };
    let w = write("{\"cause\":\"pool\"}", "0");
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    let wrote = r(&w).ok();
    let ev: Value = serde_json::from_str(&wrote.stdout).unwrap();
    assert_eq!(wrote.stdout, stored(ev["seq"].as_u64().unwrap()));
    // A stale write on a `reject` channel: exit 4 both ways.
    let stale = write("dns", "0");
    let stale: Vec<&str> = stale.iter().map(String::as_str).collect();
    assert_eq!((r(&stale).code, l(&stale).code), (4, 4));
    for args in [
        vec!["channel", "read", "--run", "inc", "--channel", "analysis"],
        vec![
            "channel",
            "read",
            "--run",
            "inc",
            "--channel",
            "analysis",
            "--agent",
            "a2",
        ],
        vec!["channel", "list", "--run", "inc"],
        vec![
            "channel",
            "history",
            "--run",
            "inc",
            "--channel",
            "analysis",
        ],
    ] {
        same(&args, true);
    }
    // prune: under the threshold, nothing pruned, both ways.
    same(&["prune", "--run", "inc"], true);
    assert_eq!(
        r(&["prune", "--run", "inc", "--summarizer-cmd", "cat"]).code,
        2
    );

    // replay: at a seq, at a time, a timeline, an agent's view, a diff.
    let ts = serde_json::from_str::<Value>(&stored(3)).unwrap()["ts"]
        .as_str()
        .unwrap()
        .to_string();
    for args in [
        vec!["replay", "--run", "inc"],
        vec!["replay", "--run", "inc", "--at-seq", "3"],
        vec!["replay", "--run", "inc", "--at", &ts],
        vec!["replay", "--run", "inc", "--at-seq", "4", "--timeline"],
        vec!["replay", "--run", "inc", "--timeline"],
        vec!["replay", "--run", "inc", "--at-seq", "4", "--agent", "a1"],
        vec!["replay", "--run", "inc", "--diff", "2", "6"],
        vec!["replay", "--run", "inc", "--diff", &ts, "8"],
        vec!["metrics", "--run", "inc"],
        vec!["metrics", "--run", "inc", "--json"],
        vec!["memory-events", "--run", "inc"],
        vec!["memory-events", "--run", "inc", "--from-seq", "3"],
        vec!["memory-events"],
    ] {
        same(&args, true);
    }
    same(&["replay", "--run", "inc", "--diff", "x", "2"], false);
    // A point past the head is named as the diff's, not as `at-seq`.
    let past = ["replay", "--run", "inc", "--diff", "2", "9999"];
    let (over, files) = (r(&past).code(2), l(&past).code(2));
    assert!(
        files.stderr.contains("diff TO") && !files.stderr.contains("at-seq"),
        "{}",
        files.stderr
    );
    assert!(
        over.stderr.contains("to_seq") && !over.stderr.contains("at-seq"),
        "{}",
        over.stderr
    );

    // The synthesizer (admin tokens only), then the memory it made.
    let agent_token = token(&env, "alice", &["a1"], "agent");
    // A one-agent token's replay answers the agent's view, whose point is `at_seq`: the
    // timeline lists the events up to it (it listed none, "up to seq 0", before).
    let args = ["replay", "--run", "inc", "--at-seq", "4", "--timeline"];
    let timeline = remote(&env, &srv, &agent_token, &args, "").ok();
    assert!(
        timeline
            .stdout
            .starts_with("timeline of run inc up to seq 4\n"),
        "{}",
        timeline.stdout
    );
    assert_eq!(timeline.stdout, l(&args).ok().stdout);
    assert_eq!(remote(&env, &srv, &agent_token, &["synth"], "").code, 5);
    assert_eq!(r(&["synth", "--llm-cmd", "true"]).code, 2);
    assert_eq!(r(&["synth", "--embed-model", "/models/x"]).code, 2);
    // The options reach the server: only the run named is read.
    let synth = r(&[
        "synth",
        "--run",
        "inc",
        "--pass-events",
        "3",
        "--share-patterns",
        "off",
    ])
    .ok();
    let report: Value = serde_json::from_str(&synth.stdout).unwrap();
    assert_eq!(report["nothing_new"], false, "{report}");
    assert_eq!(report["runs"][0]["run"], "inc", "{report}");
    assert_eq!(report["runs"].as_array().map(Vec::len), Some(1), "{report}");
    let facts: Value = serde_json::from_str(&l(&["facts"]).ok().stdout).unwrap();
    let f1 = facts["facts"][0]["id"]
        .as_str()
        .expect("a fact")
        .to_string();
    for args in [
        vec!["facts"],
        vec!["facts", "--table"],
        vec!["facts", "--all"],
        vec!["facts", "--subject", "db-1"],
        vec!["facts", "--as-of", &ts, "--all"],
        vec!["facts", "--explain", &f1],
        vec!["facts", "--explain", &f1, "--limit", "1"],
        vec!["search", "disk full"],
        vec!["search", "disk full", "--json"],
        vec![
            "search",
            "pool",
            "--run",
            "inc",
            "--kind",
            "hypothesis",
            "--limit",
            "2",
        ],
        vec!["search", "disk", "--as-agent", "a1", "--json"],
    ] {
        same(&args, true);
    }
    same(&["facts", "--explain", "F999"], false);
    same(&["facts", "--as-of", "yesterday"], false);
    same(&["patterns", "--symptom", "disk_full"], false);
    same(&["advise", "--tool", "kubectl"], false);

    // A live memory-event stream gets what is there, then what comes.
    let first = l(&["memory-events", "--run", "inc"]).ok().stdout;
    let first = first.lines().next().unwrap().to_string();
    let mut c = env.cmd(&["memory-events", "--run", "inc", "--follow"]);
    c.env("SWARM_URL", &srv.url)
        .env("SWARM_TOKEN", &t)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = c.spawn().expect("memory-events");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().unwrap().unwrap(), first);
    let _ = child.kill();
    let _ = child.wait();

    // run close and restore through the server.
    let closed = r(&["run", "close", "inc", "--by", "lead"]).ok();
    assert!(closed.stdout.contains("inc.swarc"), "{}", closed.stdout);
    same(&["runs", "--json"], false);
    r(&["run", "restore", "inc"]).ok();
    same(&["read", "--run", "inc"], true);

    // The file-only commands refuse, saying so.
    for args in [
        vec!["repair", "--run", "inc"],
        vec!["checkpoint", "--run", "inc"],
        vec!["index", "status"],
    ] {
        let out = r(&args);
        assert_eq!(out.code, 2, "{args:?}");
        assert!(out.stderr.contains("data directory"), "{}", out.stderr);
    }
}

/// Damage in the middle of a segment: through `SWARM_URL` a read exits 3 naming the
/// damaged record, as the embedded CLI does (not 1 with "the server could not complete
/// the request"), and the server's answer names the segment, not its path.
#[test]
fn remote_reads_of_a_damaged_run_exit_3_as_embedded() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let t = token(&env, "alice", &["db-1"], "agent");
    for i in 1..=5 {
        let content = format!("event number {i}");
        let args = [
            "append",
            "--run",
            "r1",
            "--agent",
            "db-1",
            "--type",
            "evidence",
            "--content",
            &content,
        ];
        remote(&env, &srv, &t, &args, "").ok();
    }
    let dir = env.path().join("alice/r1");
    let seg = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes
        .windows(14)
        .position(|w| w == b"event number 3")
        .unwrap();
    bytes[at] ^= 0x04;
    std::fs::write(&seg, &bytes).unwrap();
    let local = local(&env, &["read", "--run", "r1"], "").code(3);
    assert!(local.stderr.contains("corrupt record"), "{}", local.stderr);
    let out = remote(&env, &srv, &t, &["read", "--run", "r1"], "").code(3);
    assert!(
        out.stderr.contains("corrupt record in seg-"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains(&env.path().display().to_string()),
        "the server's path: {}",
        out.stderr
    );
}

/// A live tail through the server whose token is revoked ends saying so, exit 5 (as a
/// 401): it said only that the server closed the stream, exit 1, as for a lost server.
#[test]
fn a_remote_tail_whose_token_is_revoked_says_so() {
    let env = Env::fast();
    let srv = Server::start(&env, &["--heartbeat-ms", "100"]);
    let t = token(&env, "alice", &["*"], "admin");
    local(
        &env,
        &[
            "append",
            "--run",
            "inc",
            "--agent",
            "a",
            "--type",
            "evidence",
            "--content",
            "x",
        ],
        "",
    )
    .ok();
    let mut c = env.cmd(&["tail", "--run", "inc", "--follow"]);
    c.env("SWARM_URL", &srv.url)
        .env("SWARM_TOKEN", &t)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("tail");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert!(lines.next().unwrap().unwrap().contains("\"seq\":1"));
    let id = t.split('_').nth(1).unwrap();
    env.swarm(&["token", "revoke", id]).ok();
    let out = child.wait_with_output().expect("tail ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("revoked"), "{stderr}");
}
