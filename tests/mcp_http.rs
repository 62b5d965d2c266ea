//! `/mcp` on `swarm serve` driven by the official MCP Python SDK's streamable HTTP client
//! (`tests/mcp/http_client.py`) against a real server process, with bearer tokens.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::mcp::python_or_skip;
use crate::serve::{token, Server};
use crate::util::{Env, SWARM};

/// Runs one scenario of `tests/mcp/http_client.py` against a fresh server with an agent
/// token of alice's (agents `sre`, `lead`) and one of bob's; its JSON result.
fn scenario(name: &str) -> Option<Value> {
    let py = python_or_skip(name)?;
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let alice = token(&env, "alice", &["sre", "lead"], "agent");
    let bob = token(&env, "bob", &["sre"], "agent");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/http_client.py");
    let out = Command::new(py)
        .arg(script)
        .args([name, &srv.url, &alice, &bob])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scenario {name} failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    Some(serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}")))
}

/// Runs a scenario of the stdio client (`tests/mcp/client.py`) against `/mcp` of a server
/// on the same data dir, alice's token holding agents `sre`, `lead` and `agent-*`, bob's
/// `sre`.
/// `bridge`: through `swarm mcp` over stdio with `SWARM_URL` and `SWARM_TOKEN`.
fn stdio_scenario_over_http(name: &str, bridge: bool) -> Option<Value> {
    stdio_scenario_on(name, bridge, false)
}

/// [`stdio_scenario_over_http`]; `socket`: the bridge reaches the server on its Unix
/// socket (`SWARM_URL=unix:///PATH`, `swarm serve --socket PATH`).
fn stdio_scenario_on(name: &str, bridge: bool, socket: bool) -> Option<Value> {
    let py = python_or_skip(name)?;
    let env = Env::fast();
    let sock = env.path().join("swarm.sock");
    let srv = match socket {
        true => Server::start(&env, &["--socket", sock.to_str().unwrap()]),
        false => Server::start(&env, &[]),
    };
    let url = match socket {
        true => format!("unix://{}", sock.display()),
        false => srv.url.clone(),
    };
    let alice = token(&env, "alice", &["sre", "lead", "agent-*"], "agent");
    let bob = token(&env, "bob", &["sre"], "agent");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py");
    let mut cmd = Command::new(py);
    if bridge {
        cmd.env("MCP_BRIDGE", "1");
    }
    let out = cmd
        .arg(script)
        .arg(name)
        .arg(SWARM)
        .arg(env.path())
        .env("MCP_URL", &url)
        .env("MCP_TOKEN_ALICE", &alice)
        .env("MCP_TOKEN_BOB", &bob)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scenario {name} over HTTP failed:\n{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    Some(serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}")))
}

/// An MCP `initialize` request (id 1) of protocol version 2025-06-18.
fn mcp_initialize() -> serde_json::Value {
    serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}})
}

/// The client's `notifications/initialized`, which follows a successful `initialize`.
fn mcp_initialized() -> serde_json::Value {
    serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
}

/// Every one of the 20 tools over streamable HTTP, with the stdio test's checks (CAS
/// conflicts, an escalation, forbidden agents, the memory tools, resources).
#[test]
fn mcp_over_http_calls_every_tool_as_over_stdio() {
    let Some(v) = stdio_scenario_over_http("basic", false) else {
        return;
    };
    assert_eq!(v["tools"], 20);
    assert_eq!(v["cas_conflict"], "cas_conflict");
    assert_eq!(v["forbidden"], true);
}

/// Recorded look-ups over HTTP become memory events of the run, like over stdio.
#[test]
fn mcp_over_http_records_named_look_ups() {
    let Some(v) = stdio_scenario_over_http("lookups", false) else {
        return;
    };
    assert_eq!(
        v["actions"],
        serde_json::json!(["searched", "pattern_applied", "searched", "pattern_applied"])
    );
}

#[test]
fn mcp_over_http_lists_calls_and_refuses_with_the_tokens_identity() {
    let Some(v) = scenario("basic") else { return };
    assert_eq!(v["tools"], 20, "{v}");
    assert_eq!(v["stored_seq"], 1, "{v}");
    assert!(v["hits"].as_u64().is_some_and(|n| n >= 1), "{v}");
    assert_eq!(v["cas_conflict"], "cas_conflict", "{v}");
    assert_eq!(v["escalated"], "escalated", "{v}");
    // An agent the token does not name is forbidden.
    assert_eq!(v["forbidden"], "forbidden", "{v}");
    assert_eq!(v["no_token"], 401, "{v}");
    // A session's DELETE is answered as the SDKs take it (200 or 204).
    assert_eq!(v["delete_status"], 204, "{v}");
    assert_eq!(v["wrong_token"], 401, "{v}");
    assert_eq!(v["sdk_wrong_token"], "refused", "{v}");
}

#[test]
fn mcp_over_http_keeps_40_concurrent_findings_of_two_sessions_once() {
    let Some(v) = scenario("concurrency") else {
        return;
    };
    assert_eq!(v["acknowledged"], 40, "{v}");
    assert_eq!(v["stored"], 40, "{v}");
    assert_eq!(v["distinct"], 40, "{v}");
    assert_eq!(v["retried_same"], true, "{v}");
}

#[test]
fn mcp_over_http_a_subscriber_hears_of_another_sessions_append() {
    let Some(v) = scenario("subscribe") else {
        return;
    };
    assert_eq!(v["updated"], "swarm://runs/inc-sub", "{v}");
    let missing = v["missing"].as_str().unwrap_or_default();
    assert!(
        missing != "accepted" && missing.contains("no-such-run"),
        "a subscription to a run that does not exist is refused: {v}"
    );
}

#[test]
fn mcp_over_http_a_bob_token_cannot_read_alices_findings() {
    let Some(v) = scenario("isolation") else {
        return;
    };
    assert!(v["alice_hits"].as_u64().is_some_and(|n| n >= 1), "{v}");
    assert_eq!(v["bob_hits"], 0, "{v}");
    assert_eq!(v["bob_read"], "run_not_found", "{v}");
    assert_eq!(v["bob_runs"], 0, "{v}");
}

/// Checks of the server's own before MCP (no SDK needed): a reader token is refused, and
/// a body over the server's limit is refused by the transport.
#[test]
fn mcp_over_http_refuses_reader_tokens_and_bodies_over_the_limit() {
    let env = Env::fast();
    let srv = Server::start(&env, &["--body-limit-bytes", "4096"]);
    let reader = token(&env, "alice", &["sre"], "reader");
    let agent = token(&env, "alice", &["sre"], "agent");
    let init = mcp_initialize();
    let r = srv.post("/mcp", Some(&reader), &init);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("reader role"), "{}", r.body);
    let big = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "x".repeat(8192), "version": "1"}}});
    let r = srv
        .http
        .post(&format!("{}/mcp", srv.url))
        .set("Authorization", &format!("Bearer {agent}"))
        .set("Content-Type", "application/json")
        .set("Accept", "application/json, text/event-stream")
        .send_bytes(big.to_string().as_bytes());
    let status = match r {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(s, _)) => s,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(status, 413);
}

/// One token holds at most `MCP_SESSIONS_PER_TOKEN` (64) MCP sessions: past it its new
/// sessions are refused (429), while another token of the server still opens one (one
/// tenant could fill the server's 1,000 sessions for ten minutes).
#[test]
fn one_token_cannot_take_every_mcp_session() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let alice = token(&env, "alice", &["sre"], "agent");
    let bob = token(&env, "bob", &["sre"], "agent");
    let open = |t: &str| -> u16 {
        let r = srv
            .http
            .post(&format!("{}/mcp", srv.url))
            .set("Authorization", &format!("Bearer {t}"))
            .set("Content-Type", "application/json")
            .set("Accept", "application/json, text/event-stream")
            .send_bytes(mcp_initialize().to_string().as_bytes());
        match r {
            Ok(r) => {
                assert!(r.header("mcp-session-id").is_some());
                r.status()
            }
            Err(ureq::Error::Status(s, _)) => s,
            Err(e) => panic!("{e}"),
        }
    };
    for i in 0..64 {
        assert_eq!(open(&alice), 200, "session {i}");
    }
    assert_eq!(open(&alice), 429);
    assert_eq!(open(&bob), 200);
}

/// `swarm mcp` over stdio with `SWARM_URL` and `SWARM_TOKEN`: the same 20 tools and checks,
/// run by the server as the token's user and agents.
#[test]
fn swarm_mcp_with_swarm_url_bridges_every_tool_to_the_server() {
    let Some(v) = stdio_scenario_over_http("basic", true) else {
        return;
    };
    assert_eq!(v["tools"], 20);
    assert_eq!(v["cas_conflict"], "cas_conflict");
    assert_eq!(v["forbidden"], true);
}

/// The bridge over the server's Unix socket: every tool, and a subscription's updates
/// (the session's GET stream, a chunked SSE body on the socket).
#[test]
fn swarm_mcp_with_a_unix_socket_url_bridges_tools_and_updates() {
    let Some(v) = stdio_scenario_on("basic", true, true) else {
        return;
    };
    assert_eq!(v["tools"], 20);
    assert_eq!(v["cas_conflict"], "cas_conflict");
    assert_eq!(v["forbidden"], true);
    let Some(v) = stdio_scenario_on("subscribe", true, true) else {
        return;
    };
    assert_eq!(v["updated"], "swarm://runs/inc-sub");
}

/// Through the bridge, a subscription hears of another process's append (the server's
/// GET stream is forwarded to stdout), and bob's token sees none of alice's findings.
#[test]
fn swarm_mcp_with_swarm_url_forwards_updates_and_keeps_users_apart() {
    let Some(v) = stdio_scenario_over_http("subscribe", true) else {
        return;
    };
    assert_eq!(v["updated"], "swarm://runs/inc-sub");
    let Some(v) = stdio_scenario_over_http("isolation", true) else {
        return;
    };
    assert_eq!(v["bob_hits"], 0);
}

/// Two `swarm mcp` bridge processes, 20 concurrent `add_finding_to_memory` calls through
/// each (and again, retried with the same client ids): 40 of 40 stored once.
#[test]
fn swarm_mcp_with_swarm_url_keeps_40_concurrent_findings_once() {
    let Some(v) = stdio_scenario_over_http("concurrency", true) else {
        return;
    };
    assert_eq!(v["acknowledged"], 40);
    assert_eq!(v["stored"], 40);
    assert_eq!(v["distinct"], 40);
    assert_eq!(v["retried"], 40);
}

/// The bridge answers a request the server refuses with a JSON-RPC error that names the
/// cause (so a client never waits), and `swarm mcp` without `--agent` and without
/// `SWARM_URL` says what to give (exit 2).
#[test]
fn swarm_mcp_bridge_names_a_refused_token_and_mcp_needs_an_agent() {
    use std::io::Write;
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let mut child = env
        .cmd(&["mcp"])
        .env("SWARM_URL", &srv.url)
        .env("SWARM_TOKEN", "not-a-token")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let init = mcp_initialize().to_string();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{init}").unwrap();
    writeln!(stdin, "not json").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["id"], 1);
    let msg = lines[0]["error"]["message"].as_str().unwrap();
    assert!(msg.contains("401") && msg.contains("SWARM_TOKEN"), "{msg}");
    assert_eq!(lines[1]["error"]["code"], -32700);

    let out = env
        .cmd(&["mcp"])
        .env_remove("SWARM_AGENT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--agent") && err.contains("SWARM_URL"),
        "{err}"
    );
}

/// An MCP session answers only the token that opened it: another user's token with the
/// session's id can neither use it nor end it (404, as for a session that does not
/// exist), and the owner's session goes on.
#[test]
fn mcp_over_http_a_session_answers_only_its_token() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let alice = token(&env, "alice", &["lead"], "agent");
    let bob = token(&env, "bob", &["lead"], "agent");
    let call = |method: &str, tok: &str, sid: Option<&str>, body: Option<serde_json::Value>| {
        let mut r = srv
            .http
            .request(method, &format!("{}/mcp", srv.url))
            .set("Authorization", &format!("Bearer {tok}"))
            .set("Content-Type", "application/json")
            .set("Accept", "application/json, text/event-stream");
        if let Some(s) = sid {
            r = r
                .set("mcp-session-id", s)
                .set("mcp-protocol-version", "2025-06-18");
        }
        let r = match body {
            Some(b) => r.send_string(&b.to_string()),
            None => r.call(),
        };
        match r {
            Ok(r) => (
                r.status(),
                r.header("mcp-session-id").map(str::to_string),
                r.into_string().unwrap_or_default(),
            ),
            Err(ureq::Error::Status(s, r)) => (s, None, r.into_string().unwrap_or_default()),
            Err(e) => panic!("{e}"),
        }
    };
    let init = mcp_initialize();
    let (st, sid, body) = call("POST", &alice, None, Some(init));
    assert_eq!(st, 200, "{body}");
    let sid = sid.expect("a session id");
    let inited = mcp_initialized();
    let (st, _, body) = call("POST", &alice, Some(&sid), Some(inited));
    assert!((200..300).contains(&st), "{st} {body}");
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (st, _, body) = call("POST", &bob, Some(&sid), Some(list.clone()));
    assert_eq!(st, 404, "bob used alice's session: {body}");
    let (st, _, body) = call("DELETE", &bob, Some(&sid), None);
    assert_eq!(st, 404, "bob ended alice's session: {body}");
    let (st, _, body) = call("POST", &alice, Some(&sid), Some(list));
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("append_entry"), "{body}");
    let (st, _, body) = call("DELETE", &alice, Some(&sid), None);
    assert_eq!(st, 204, "{body}");
}

/// An MCP session's open stream ends once its token is revoked (within the server's
/// once-a-second sweep), and the session's next request is refused (401): a stream
/// opened before the revocation does not go on carrying resource updates.
#[test]
fn mcp_over_http_a_revoked_tokens_open_stream_ends() {
    use std::io::Read;
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let alice = token(&env, "alice", &["lead"], "agent");
    let post = |sid: Option<&str>, body: serde_json::Value| {
        let mut r = srv
            .http
            .post(&format!("{}/mcp", srv.url))
            .set("Authorization", &format!("Bearer {alice}"))
            .set("Content-Type", "application/json")
            .set("Accept", "application/json, text/event-stream");
        if let Some(s) = sid {
            r = r
                .set("mcp-session-id", s)
                .set("mcp-protocol-version", "2025-06-18");
        }
        match r.send_string(&body.to_string()) {
            Ok(r) => (r.status(), r.header("mcp-session-id").map(str::to_string)),
            Err(ureq::Error::Status(s, _)) => (s, None),
            Err(e) => panic!("{e}"),
        }
    };
    let init = mcp_initialize();
    let (st, sid) = post(None, init);
    assert_eq!(st, 200);
    let sid = sid.expect("a session id");
    let inited = mcp_initialized();
    assert!((200..300).contains(&post(Some(&sid), inited).0));
    // The session's server-to-client stream, read to its end on another thread.
    let stream = srv
        .http
        .get(&format!("{}/mcp", srv.url))
        .set("Authorization", &format!("Bearer {alice}"))
        .set("Accept", "text/event-stream")
        .set("mcp-session-id", &sid)
        .set("mcp-protocol-version", "2025-06-18")
        .call()
        .expect("the stream opens");
    assert_eq!(stream.status(), 200);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = stream.into_reader();
        let mut buf = [0u8; 4096];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = tx.send(());
    });
    // Still open a moment later.
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(1500))
            .is_err(),
        "the stream ended before the revocation"
    );
    let id = alice.split('_').nth(1).unwrap();
    let out = env.swarm(&["token", "revoke", id]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("the stream of a revoked token's session ended");
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    assert_eq!(post(Some(&sid), list).0, 401);
}
