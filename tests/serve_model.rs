//! `swarm serve` with the embedding model: `GET /v1/search` and `/mcp`'s `search_memory`
//! rank by words and meaning (hybrid) when the server loaded a model, through each user's
//! own vector cache, and say so; without one they rank by words and say why.
//!
//! The model directory comes from `SWARM_EMBED_MODEL` (`.ci/run` installs it). Unset:
//! the hybrid test fails under CI (`CI` set) and prints a SKIPPED notice elsewhere.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};

use crate::serve::{token, Server};
use crate::util::Env;

/// The model directory, or None after a printed notice (a panic under CI).
fn model_dir() -> Option<PathBuf> {
    match std::env::var_os("SWARM_EMBED_MODEL").filter(|v| !v.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var_os("CI").is_some() => panic!(
            "SWARM_EMBED_MODEL is not set: install the model with `swarm model fetch` and set SWARM_EMBED_MODEL to its directory"
        ),
        None => {
            eprintln!("SKIPPED: SWARM_EMBED_MODEL is not set; the server's hybrid search test did not run (see README: swarm model fetch)");
            None
        }
    }
}

/// `swarm serve` on a free port with its stderr in `log`.
fn start_logged(env: &Env, extra: &[&str], log: &Path) -> Server {
    let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut child = env
        .cmd(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(log).unwrap())
        .spawn()
        .expect("start swarm serve");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| {
            panic!(
                "the server did not start: {first:?}\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        })
        .to_string();
    let http = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout_read(Duration::from_secs(120))
        .build();
    Server { child, url, http }
}

fn finding(agent: &str, content: &str) -> Value {
    json!({"agent_id": agent, "type": "evidence", "content": content})
}

/// The texts of a search answer's hits (`/v1/search`'s rows, or `search_memory`'s hits
/// whose findings carry their entry).
fn texts(v: &Value) -> Vec<String> {
    v["hits"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|h| {
            let t = h["text"].as_str().or(h["entry"]["content"].as_str());
            t.unwrap_or_else(|| panic!("{h}")).to_string()
        })
        .collect()
}

/// One tool call over `/mcp` (streamable HTTP, JSON-RPC): initialize, initialized, the
/// call; the tool's JSON answer.
fn mcp_tool(srv: &Server, token: &str, tool: &str, args: Value) -> Value {
    let post = |session: Option<&str>, body: Value| -> ureq::Response {
        let mut r = srv
            .http
            .post(&format!("{}/mcp", srv.url))
            .set("Authorization", &format!("Bearer {token}"))
            .set("Content-Type", "application/json")
            .set("Accept", "application/json, text/event-stream");
        if let Some(s) = session {
            r = r.set("Mcp-Session-Id", s);
        }
        r.send_string(&body.to_string())
            .unwrap_or_else(|e| panic!("{body}: {e}"))
    };
    // The JSON-RPC answer with `id`, from a JSON or an SSE body.
    let answer = |r: ureq::Response, id: u64| -> Value {
        for line in BufReader::new(r.into_reader()).lines() {
            let line = line.unwrap();
            let data = line.strip_prefix("data:").unwrap_or(&line).trim();
            if let Ok(v) = serde_json::from_str::<Value>(data) {
                if v["id"] == id {
                    return v;
                }
            }
        }
        panic!("no answer to request {id}");
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}});
    let r = post(None, init);
    let session = r
        .header("mcp-session-id")
        .expect("a session id")
        .to_string();
    answer(r, 1);
    post(
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": args}});
    let v = answer(post(Some(&session), call), 2);
    assert_ne!(v["result"]["isError"], true, "{v}");
    let text = v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    serde_json::from_str(text).unwrap()
}

/// The vector cache files of `user` under the data dir.
fn cache_files(env: &Env, user: &str) -> Vec<(PathBuf, u64)> {
    let dir = env.path().join(".vectors").join(user);
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    rd.map(|e| {
        let p = e.unwrap().path();
        let n = std::fs::metadata(&p).unwrap().len();
        (p, n)
    })
    .collect()
}

const POOL: &str = "postgres connection pool exhausted on orders-db";
/// Shares no word with [`POOL`] (nor with the other findings).
const PARAPHRASE: &str = "the database ran out of available sessions";

/// With the model, a paraphrase that shares no word is found (`mode: hybrid`, the
/// model's id) on `/v1/search` and `/mcp`'s `search_memory`; each user's texts go to
/// that user's vector cache only.
#[cfg(feature = "semantic")]
#[test]
fn serve_search_with_the_model_is_hybrid_and_finds_a_paraphrase() {
    let Some(model) = model_dir() else { return };
    let env = Env::fast();
    let log = env.path().join("serve.log");
    let srv = start_logged(&env, &["--embed-model", model.to_str().unwrap()], &log);
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        stderr.contains("search: hybrid (words and all-MiniLM-L6-v2@sha256:"),
        "{stderr}"
    );
    let alice = token(&env, "alice", &["db"], "agent");
    let bob = token(&env, "bob", &["db"], "agent");
    for c in [
        POOL,
        "disk full on kafka-3 broker",
        "a bad deploy of checkout",
    ] {
        let r = srv.post("/v1/runs/inc/events", Some(&alice), &finding("db", c));
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let r = srv.post(
        "/v1/runs/inc/events",
        Some(&bob),
        &finding("db", "bob's ledger replica lost quorum"),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let q = "/v1/search?q=the%20database%20ran%20out%20of%20available%20sessions";
    let v = srv.get(q, Some(&alice)).json();
    assert_eq!(v["mode"], "hybrid", "{v}");
    assert!(
        v["model"]
            .as_str()
            .is_some_and(|m| m.starts_with("all-MiniLM-L6-v2@sha256:")),
        "{v}"
    );
    assert_eq!(texts(&v).first().map(String::as_str), Some(POOL), "{v}");
    // Alice's vectors are in her cache file (written with the answer), none of bob's.
    let a = cache_files(&env, "alice");
    assert_eq!(a.len(), 1, "{a:?}");
    assert!(a[0].1 > 100, "{a:?}");
    assert!(cache_files(&env, "bob").is_empty());
    // Bob's search ranks his own findings only, through his own cache; hers is untouched.
    let b = srv.get(q, Some(&bob)).json();
    assert_eq!(b["mode"], "hybrid", "{b}");
    assert!(texts(&b).iter().all(|t| t.contains("bob")), "{b}");
    assert_eq!(cache_files(&env, "bob").len(), 1);
    assert_eq!(cache_files(&env, "alice"), a);
    // The same through /mcp's search_memory.
    let m = mcp_tool(&srv, &alice, "search_memory", json!({"query": PARAPHRASE}));
    assert_eq!(m["mode"], "hybrid", "{m}");
    assert_eq!(texts(&m).first().map(String::as_str), Some(POOL), "{m}");
    let m = mcp_tool(&srv, &bob, "search_memory", json!({"query": PARAPHRASE}));
    assert!(texts(&m).iter().all(|t| t.contains("bob")), "{m}");
    assert!(srv.stop().success());
}

/// The runs a synth report says it read.
fn synth_runs(v: &Value) -> Vec<&str> {
    let runs = v["runs"].as_array().unwrap_or_else(|| panic!("{v}"));
    runs.iter().map(|r| r["run"].as_str().unwrap()).collect()
}

/// `POST /v1/synth` synthesizes with the server's model (the report says `on: <model>`),
/// takes `swarm synth`'s options in its body (only the runs named), and refuses
/// `llm_cmd` (the server never runs a client's command), unknown options, a bad
/// `share_patterns`, and agent tokens.
#[test]
fn serve_synth_uses_the_server_model_and_takes_options() {
    let Some(model) = model_dir() else { return };
    let env = Env::fast();
    let log = env.path().join("serve.log");
    let srv = start_logged(&env, &["--embed-model", model.to_str().unwrap()], &log);
    let admin = token(&env, "alice", &["*"], "admin");
    let agent = token(&env, "alice", &["db"], "agent");
    for (run, agent_id, c) in [
        ("inc", "db-1", POOL),
        ("inc", "db-2", PARAPHRASE),
        ("other", "db-1", "disk full on kafka-3 broker"),
        ("other", "db-2", "a bad deploy of checkout"),
    ] {
        let r = srv.post(
            &format!("/v1/runs/{run}/events"),
            Some(&admin),
            &finding(agent_id, c),
        );
        assert_eq!(r.status, 201, "{}", r.body);
    }
    for (body, status) in [
        (json!({"llm_cmd": "true"}), 400),
        (json!({"runz": ["inc"]}), 400),
        (json!({"share_patterns": "everything"}), 400),
        (json!({"pass_events": "many"}), 400),
    ] {
        let r = srv.post("/v1/synth", Some(&admin), &body);
        assert_eq!(r.status, status, "{body}: {}", r.body);
    }
    assert_eq!(srv.post("/v1/synth", Some(&agent), &json!({})).status, 403);
    let r = srv.post(
        "/v1/synth",
        Some(&admin),
        &json!({"runs": ["inc"], "pass_events": 1}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let v = r.json();
    let semantic = v["semantic"].as_str().unwrap_or_default();
    assert!(semantic.starts_with("on: all-MiniLM-L6-v2@sha256:"), "{v}");
    assert_eq!(synth_runs(&v), ["inc"], "{v}");
    let small_passes = v["passes"].as_u64().unwrap();
    // The other run is left for the next pass, which takes every run.
    let v = srv.post("/v1/synth", Some(&admin), &json!({})).json();
    assert_eq!(synth_runs(&v), ["other"], "{v}");
    // The same two findings in passes of one source event took more passes.
    assert!(
        small_passes > v["passes"].as_u64().unwrap(),
        "{small_passes} vs {v}"
    );
    assert!(srv.stop().success());
}

/// Without a model (the data dir has none, `SWARM_EMBED_MODEL` unset): lexical, and the
/// answer and the start-up log say where the model was looked for. A model directory
/// whose files do not load keeps the server from starting.
#[test]
fn serve_search_without_a_model_is_lexical_and_says_why() {
    let env = Env::fast();
    let log = env.path().join("serve.log");
    let missing = env.path().join("no-model-here");
    let srv = start_logged(&env, &["--embed-model", missing.to_str().unwrap()], &log);
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        stderr.contains("search: lexical (model not found at"),
        "{stderr}"
    );
    assert!(stderr.contains("no-model-here"), "{stderr}");
    let alice = token(&env, "alice", &["db"], "agent");
    let r = srv.post("/v1/runs/inc/events", Some(&alice), &finding("db", POOL));
    assert_eq!(r.status, 201, "{}", r.body);
    let q = "/v1/search?q=the%20database%20ran%20out%20of%20available%20sessions";
    let v = srv.get(q, Some(&alice)).json();
    assert_eq!(v["mode"], "lexical", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no-model-here")),
        "{v}"
    );
    assert_eq!(texts(&v), Vec::<String>::new());
    let v = srv
        .get("/v1/search?q=connection%20pool", Some(&alice))
        .json();
    assert_eq!(texts(&v), [POOL]);
    let m = mcp_tool(
        &srv,
        &alice,
        "search_memory",
        json!({"query": "connection pool"}),
    );
    assert_eq!(m["mode"], "lexical", "{m}");
    assert!(
        m["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no-model-here")),
        "{m}"
    );
    assert!(cache_files(&env, "alice").is_empty());
    // The synthesizer is lexical too, and its report says why.
    let admin = token(&env, "alice", &["*"], "admin");
    let v = srv.post("/v1/synth", Some(&admin), &json!({})).json();
    let semantic = v["semantic"].as_str().unwrap_or_default();
    assert!(
        semantic.starts_with("off: ") && semantic.contains("no-model-here"),
        "{v}"
    );
    drop(srv);
    // Files that are there but are not a model: refused at start, naming the path.
    let broken = env.path().join("broken-model");
    std::fs::create_dir(&broken).unwrap();
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::write(broken.join(f), "not a model").unwrap();
    }
    let out = env
        .cmd(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--embed-model",
            broken.to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "it never listened");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken-model") && err.contains("does not load"),
        "{err}"
    );
}
