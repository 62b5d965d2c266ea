//! Unit tests of `Store` that need a hook inside one of its calls.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::json;

use crate::fold::rules::Policy;
use crate::{Durability, EventType, NewEvent, ReadOptions, Store};

type Hook = Box<dyn FnOnce() + Send>;

/// Run once by the next `Store::read` as an agent of the run in this directory, between
/// taking the rules and reading the log.
static AFTER_RULES: Mutex<Option<(PathBuf, Hook)>> = Mutex::new(None);

pub(super) fn take_after_rules(dir: &Path) -> Option<Hook> {
    let mut slot = AFTER_RULES.lock().unwrap_or_else(|e| e.into_inner());
    match slot.take() {
        Some((d, f)) if d == dir => Some(f),
        other => {
            *slot = other;
            None
        }
    }
}

/// A policy tightened, then a secret written, between the moment a read as an agent took
/// its rules and the moment it read the log: the read stops at the head its rules hold
/// for, so the secret (filtered by the older rules, which showed that agent everything)
/// is not in it. Without the cap (`3a60197`) this read returned the secret.
#[test]
fn a_read_as_an_agent_ends_where_its_rules_hold() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path())
        .unwrap()
        .with_user("alice", true)
        .unwrap();
    let open: Policy = serde_json::from_value(json!({
        "permissions": {
            "lead": {"read_types": ["*"], "write_types": ["*"], "admin": true},
            "w": {"read_types": ["*"], "write_types": ["evidence"]}
        }
    }))
    .unwrap();
    let tight: Policy = serde_json::from_value(json!({
        "permissions": {
            "lead": {"read_types": ["*"], "write_types": ["*"], "admin": true},
            "w": {"read_types": ["decision"], "write_types": ["evidence"]}
        }
    }))
    .unwrap();
    store.set_policy("r", "lead", &open).unwrap();
    let ev = |agent: &str, text: &str| NewEvent::new(agent, EventType::Evidence, text);
    store
        .append_batch("r", vec![ev("w", "public note")], None, Durability::Sync)
        .unwrap();
    let run_dir = store.existing_run("r").unwrap();
    let hook_store = Store::open(dir.path())
        .unwrap()
        .with_user("alice", true)
        .unwrap();
    *AFTER_RULES.lock().unwrap() = Some((
        run_dir,
        Box::new(move || {
            hook_store.set_policy("r", "lead", &tight).unwrap();
            hook_store
                .append_batch("r", vec![ev("lead", "SECRET-1")], None, Durability::Sync)
                .unwrap();
        }),
    ));
    let opts = ReadOptions {
        reader: Some("w".to_string()),
        ..ReadOptions::default()
    };
    let got: Vec<String> = store
        .read("r", opts.clone())
        .unwrap()
        .map(|e| e.unwrap().content.to_string())
        .collect();
    assert!(AFTER_RULES.lock().unwrap().is_none(), "the hook ran");
    assert!(got.iter().any(|c| c.contains("public note")), "{got:?}");
    assert!(!got.iter().any(|c| c.contains("SECRET")), "{got:?}");
    // The next read takes the tightened rules: evidence is hidden from `w` now.
    let again: Vec<String> = store
        .read("r", opts)
        .unwrap()
        .map(|e| e.unwrap().content.to_string())
        .collect();
    assert!(!again.iter().any(|c| c.contains("SECRET")), "{again:?}");
    assert!(
        !again.iter().any(|c| c.contains("public note")),
        "{again:?}"
    );
}
