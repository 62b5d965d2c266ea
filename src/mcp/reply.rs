//! Tool results: a success is the answer as JSON (structured content and the same JSON as
//! text); a refusal is a tool error (`isError: true`) whose JSON names the cause in
//! `error`, the engine's message, the values a model needs to recover (the current
//! version of a CAS, the escalation's seq) and a `hint` saying what to do next.

use rmcp::model::CallToolResult;
use serde_json::{json, Map, Value};

use crate::error::Error;

/// A refused or failed tool call: the engine's error and what the tool adds to it.
#[derive(Debug)]
pub struct ToolError {
    /// The engine's error.
    pub error: Error,
    /// Extra fields for the model (e.g. `current_version` after a board CAS).
    pub extra: Map<String, Value>,
}

impl From<Error> for ToolError {
    fn from(error: Error) -> ToolError {
        ToolError {
            error,
            extra: Map::new(),
        }
    }
}

impl ToolError {
    /// Adds a field to the error's JSON.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> ToolError {
        self.extra.insert(key.to_string(), value.into());
        self
    }
}

/// What a tool returns to the handler.
pub type ToolResult = std::result::Result<Value, ToolError>;

/// A value as the JSON of an answer.
pub fn to_json(v: &impl serde::Serialize) -> ToolResult {
    serde_json::to_value(v).map_err(|e| Error::invalid("answer", e.to_string()).into())
}

/// The successful answer.
pub fn success(v: Value) -> CallToolResult {
    CallToolResult::structured(v)
}

/// An error's message as a client sees it: the data directory's layout stays on the
/// machine (behind `swarm serve` it is the server's): a failed file operation says what
/// failed, a damaged log names its segment; the whole error goes to the log.
pub fn public_message(e: &Error) -> String {
    match e {
        Error::Io { op, source, .. } => {
            tracing::error!(error = %e, "tool failed");
            format!("cannot {op} a file of the data directory: {source}")
        }
        Error::Corrupt {
            path,
            offset,
            seq,
            reason,
        } => {
            tracing::error!(error = %e, "tool failed");
            let file = path
                .file_name()
                .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
            format!(
                "corrupt record in {file} at byte offset {offset} (expected seq {seq}): {reason}"
            )
        }
        other => other.to_string(),
    }
}

/// The JSON of a refusal: `error` (a stable cause name), `message`, the cause's values, a
/// `hint`, and the tool's extra fields.
pub fn failure_json(e: &ToolError) -> Value {
    let message = public_message(&e.error);
    let mut v = match &e.error {
        Error::Invalid { field, .. } => json!({
            "error": "invalid_input", "field": field,
            "hint": "fix the named field and call again",
        }),
        Error::RunNotFound(run) => json!({
            "error": "run_not_found", "run": run,
            "hint": "check the run id (list_runs); a run is created by its first append",
        }),
        Error::SeqConflict {
            expected, actual, ..
        } => json!({
            "error": "cas_conflict", "expected_seq": expected, "current_seq": actual,
            "hint": "another entry landed since you read the run: read the entries after your cursor, then retry with expect_seq = current_seq if your entry still holds",
        }),
        Error::Conflict(_) => json!({
            "error": "cas_conflict",
            "hint": "someone wrote first (the subject or channel moved on, or this client_id is stored with another entry): read the current value (get_board / read_channel), then retry with its version if your write still holds, or with a new client_id for a new entry",
        }),
        Error::Forbidden(_) => json!({
            "error": "forbidden",
            "hint": "the run's policy, a closed run or this session's identity does not allow it; do not retry the same call",
        }),
        Error::Escalated {
            subject,
            escalation,
        } => json!({
            "error": "escalated", "subject": subject,
            "escalation_seq": (*escalation > 0).then_some(*escalation),
            "hint": "decisions and actions on this subject wait for a human to resolve the escalation; hypotheses and evidence are still accepted (list_escalations shows it)",
        }),
        Error::Corrupt { seq, .. } => json!({
            "error": "corrupt", "seq": seq,
            "hint": "the run's log is damaged; an operator must run swarm verify / swarm repair",
        }),
        Error::Poisoned(_) | Error::Io { .. } => json!({
            "error": "unavailable",
            "hint": "the server cannot write to its disk now; retry later with the same client_id",
        }),
        Error::External(_) => json!({
            "error": "external_command",
            "hint": "an external command failed; nothing was written",
        }),
    };
    if let Value::Object(m) = &mut v {
        m.insert("message".into(), Value::String(message));
        for (k, x) in &e.extra {
            m.insert(k.clone(), x.clone());
        }
    }
    v
}

/// The refusal as a tool error.
pub fn failure(e: &ToolError) -> CallToolResult {
    CallToolResult::structured_error(failure_json(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_do_not_show_the_data_directory() {
        let io = ToolError::from(Error::Io {
            op: "open",
            path: "/srv/swarm-data/alice/inc/seg-00000000000000000001.jsonl".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        });
        let v = failure_json(&io);
        assert_eq!(v["error"], "unavailable");
        assert!(!v.to_string().contains("/srv/swarm-data"), "{v}");
        let c = ToolError::from(Error::corrupt(
            std::path::Path::new("/srv/swarm-data/alice/inc/seg-00000000000000000001.jsonl"),
            120,
            7,
            "bad CRC".into(),
        ));
        let v = failure_json(&c);
        let m = v["message"].as_str().unwrap();
        assert!(
            m.contains("seg-00000000000000000001.jsonl") && m.contains("bad CRC"),
            "{m}"
        );
        assert!(!v.to_string().contains("/srv/swarm-data"), "{v}");
    }

    #[test]
    fn escalation_names_its_seq_and_conflict_its_version() {
        let e = ToolError::from(Error::Escalated {
            subject: "db".into(),
            escalation: 17,
        });
        let v = failure_json(&e);
        assert_eq!(v["error"], "escalated");
        assert_eq!(v["escalation_seq"], 17);
        let c = ToolError::from(Error::Conflict("subject \"db\" is at seq 9".into()))
            .with("current_version", 9);
        let v = failure_json(&c);
        assert_eq!(v["error"], "cas_conflict");
        assert_eq!(v["current_version"], 9);
        assert!(v["message"].as_str().is_some_and(|m| m.contains("seq 9")));
    }
}
