//! `/mcp` on `swarm serve` driven by the official MCP Python SDK's streamable HTTP client
//! (`tests/mcp/http_client.py`) against a real server process, with bearer tokens.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::mcp::python_or_skip;
use crate::serve::{token, Server};
use crate::util::Env;

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

#[test]
fn mcp_over_http_lists_calls_and_refuses_with_the_tokens_identity() {
    let Some(v) = scenario("basic") else { return };
    assert_eq!(v["tools"], 20, "{v}");
    assert_eq!(v["stored_seq"], 1, "{v}");
    assert!(v["hits"].as_u64().is_some_and(|n| n >= 1), "{v}");
    assert_eq!(v["cas_conflict"], "cas_conflict", "{v}");
    // An agent the token does not name is forbidden.
    assert_eq!(v["forbidden"], "forbidden", "{v}");
    assert_eq!(v["no_token"], 401, "{v}");
    assert_eq!(v["wrong_token"], 401, "{v}");
    assert_eq!(v["sdk_wrong_token"], "refused", "{v}");
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
