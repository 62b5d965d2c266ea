//! `swarm mcp` driven by a client nobody here wrote: the official MCP Python SDK (`mcp` on
//! PyPI), over stdio, with real server processes (`tests/mcp/client.py`).
//!
//! The SDK lives in a virtualenv: `$SWARM_MCP_PYTHON`, else `.venv-mcp/bin/python` at the
//! repository root (what `.ci/run` creates:
//! `python3 -m venv .venv-mcp && .venv-mcp/bin/pip install mcp`). Without it these tests
//! FAIL, saying how to create it; outside CI, `SWARM_SKIP_PYTHON_MCP=1` skips them with a
//! message (never under `CI=true`).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::util::SWARM;

/// The Python interpreter with the `mcp` package, or why there is none.
pub(crate) fn python() -> Result<PathBuf, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let py = std::env::var_os("SWARM_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv-mcp/bin/python"));
    let ok = Command::new(&py)
        .args(["-c", "import mcp.client.stdio"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        Ok(py)
    } else {
        Err(format!(
            "the MCP Python SDK is not importable from {} (create it: python3 -m venv .venv-mcp && .venv-mcp/bin/pip install mcp; or set SWARM_MCP_PYTHON)",
            py.display()
        ))
    }
}

/// The SDK's interpreter; `None` only when skipping was asked for outside CI.
pub(crate) fn python_or_skip(name: &str) -> Option<PathBuf> {
    match python() {
        Ok(p) => Some(p),
        Err(why) => {
            let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
            if !in_ci && std::env::var_os("SWARM_SKIP_PYTHON_MCP").is_some() {
                eprintln!("SKIPPED mcp::{name}: {why}");
                return None;
            }
            panic!("{why}");
        }
    }
}

/// Runs one scenario of `tests/mcp/client.py` against a fresh data dir; its JSON result.
/// `None` only when skipping was asked for outside CI.
fn scenario(name: &str) -> Option<Value> {
    let py = python_or_skip(name)?;
    let dir = tempfile::tempdir().unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py");
    let out = Command::new(py)
        .arg(script)
        .args([name, SWARM])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scenario {name} failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    Some(serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}")))
}

#[test]
fn every_tool_answers_and_refusals_name_their_cause() {
    let Some(v) = scenario("basic") else { return };
    assert_eq!(v["tools"], 20);
    assert_eq!(v["cas_conflict"], "cas_conflict");
    assert!(v["escalated"].as_u64().is_some_and(|s| s > 0));
    assert_eq!(v["forbidden"], true);
    let seq: Vec<&str> = v["pattern"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(seq.contains(&"query_metrics"), "{v}");
    assert!(v["anti_patterns"]
        .as_array()
        .unwrap()
        .contains(&Value::from("repeated_failing_call")));
    // Unknown arguments refused, no run made by a typo, cursors at their edges, and
    // large entries paged by bytes (checked in the scenario).
    assert!(v["read_pages"].as_u64().is_some_and(|p| p >= 2), "{v}");
}

#[test]
fn two_server_processes_keep_every_acknowledged_write_exactly_once() {
    let Some(v) = scenario("concurrency") else {
        return;
    };
    assert_eq!(v["acknowledged"], 40);
    assert_eq!(v["stored"], 40);
    assert_eq!(v["distinct"], 40);
    assert_eq!(v["retried"], 40);
}

#[test]
fn a_subscriber_hears_of_another_process_append() {
    let Some(v) = scenario("subscribe") else {
        return;
    };
    assert_eq!(v["updated"], "swarm://runs/inc-sub");
}

#[test]
fn a_subscriber_hears_only_of_changes_its_agent_may_read() {
    let Some(v) = scenario("subscribe_policy") else {
        return;
    };
    assert_eq!(v["after_hidden"], 0, "{v}");
    assert!(v["after_visible"].as_u64().is_some_and(|n| n >= 1), "{v}");
}

#[test]
fn one_user_cannot_see_another_users_findings() {
    let Some(v) = scenario("isolation") else {
        return;
    };
    assert_eq!(v["bob_hits"], 0);
}

#[test]
fn named_look_ups_become_searched_and_pattern_applied_memory_events() {
    let Some(v) = scenario("lookups") else { return };
    assert_eq!(
        v["actions"],
        serde_json::json!(["searched", "pattern_applied", "searched", "pattern_applied"])
    );
    assert!(v["facts"].as_u64().is_some_and(|n| n > 0), "{v}");
}

/// With the embedding model (`SWARM_EMBED_MODEL`; CI installs it), `search_memory` over
/// stdio ranks hybrid and finds a paraphrase that shares no word with the finding.
#[test]
fn search_memory_with_a_model_finds_a_paraphrase() {
    if std::env::var_os("SWARM_EMBED_MODEL").is_none_or(|v| v.is_empty()) {
        assert!(
            std::env::var_os("CI").is_none(),
            "SWARM_EMBED_MODEL is not set under CI: .ci/run installs the model"
        );
        eprintln!("SKIPPED: SWARM_EMBED_MODEL is not set; hybrid search_memory did not run");
        return;
    }
    let Some(v) = scenario("hybrid") else { return };
    assert_eq!(v["mode"], "hybrid");
    assert!(v["top"].as_str().unwrap().contains("pool exhausted"), "{v}");
}
