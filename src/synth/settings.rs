//! A user's synthesis settings: what is shared with other users, and which names the
//! sanitizer redacts.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What a user's synthesis copies to the shared scope (`share_patterns`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SharePatterns {
    /// Nothing leaves the user.
    Off,
    /// Structured fields only (the default): the symptom as a short slug, the tool
    /// sequence, the root cause and the fix as categories of closed vocabularies, and for
    /// mistakes the tool, the error category and the names of the arguments the
    /// correction changed. No free text.
    #[default]
    Structured,
    /// The structured fields plus the sanitized free text (root cause, resolution, error
    /// message, argument values): more useful advice, more exposure to what the
    /// sanitizer misses.
    Sanitized,
}

impl std::str::FromStr for SharePatterns {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        // The same names as in settings.json.
        serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
            Error::invalid(
                "share_patterns",
                format!("{s:?} is not one of off, structured, sanitized"),
            )
        })
    }
}

/// A user's settings, in `<data dir>/<user>/settings.json` (all optional):
/// `{"share_patterns": "structured", "redact_names": ["Dana Whitfield"]}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSettings {
    /// What this user's synthesis shares (`swarm synth --share-patterns` overrides it).
    #[serde(default)]
    pub share_patterns: SharePatterns,
    /// People's names the sanitizer redacts from anything shared.
    #[serde(default)]
    pub redact_names: Vec<String>,
}
