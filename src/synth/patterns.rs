//! Investigation patterns and tool mistakes (seed 002), learned from closed runs.
//!
//! CONTRACT (the driver relies on it):
//! - [`learn_from_run`] is a pure function of one closed run's events, in seq order.
//! - [`PatternBook`] is a pure fold of [`RunLearnings`] (`merge_run`), so the driver can
//!   store each run's learnings as one event and rebuild the book by replaying them.
//!   The fold is commutative: counts add, confidence is a function of the count, and
//!   "latest" text is chosen by timestamp (then by text), never by merge order.
//! - Fields read from events are documented in DESIGN.md ("Patterns and mistakes").
//!
//! # Fields read from events
//!
//! Only client entries (`hypothesis`, `evidence`, `decision`, `action_taken`) are read.
//!
//! | Field              | Type   | Meaning                                                        |
//! |--------------------|--------|----------------------------------------------------------------|
//! | `meta.tool`        | string | The entry reports a call of this tool.                         |
//! | `meta.tool_status` | string | `"ok"` or `"error"`; absent/other: `"error"` iff `meta.error`.   |
//! | `meta.error`       | string | Error message of a failed call.                                |
//! | `meta.args`        | object | The call's arguments (diffed for self-corrections).            |
//! | `meta.symptom`     | string | Symptom type; first one in the run wins. Fallback: subject of  |
//! |                    |        | the run's first `hypothesis`. Slugified.                       |
//! | `meta.root_cause`  | string | Root-cause category, read on `decision`s; last wins. Slugified. |
//! | `meta.resolution`  | string | Resolution summary, any entry, last wins. Fallback: text of    |
//! |                    |        | the last `decision` (`text::content_text`). Max 500 bytes.     |
//! | `ts`               |        | Latest ts of the run orders "latest" texts across runs.        |
//!
//! A run yields a pattern only with a symptom, a root cause and one successful tool call.
//! `tool_sequence` = successful calls in seq order, noisy tools ([`NOISY_TOOLS`]) dropped,
//! consecutive repeats collapsed, at most [`SEQUENCE_MAX`] tools.
//!
//! A failed call is a mistake: its error is normalized ([`normalize_error`]) and
//! classified ([`classify_error`]); fingerprint = FNV-1a 64 of tool and normalized error.
//! Failures are buffered per tool (last [`FAILURE_BUFFER_MAX`]); the next successful call
//! of that tool corrects them, and the argument diff ([`describe_args_diff`]) becomes the
//! correction (none when the arguments did not change).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::event::ts::Ts;
use crate::event::Event;
use crate::synth::text;

/// Tools that say nothing about the investigation; dropped from sequences.
pub const NOISY_TOOLS: [&str; 3] = ["get_current_time", "preload_memory", "load_memory"];
/// Longest tool sequence kept.
pub const SEQUENCE_MAX: usize = 32;
/// Failed calls buffered per tool, waiting for a self-correction.
pub const FAILURE_BUFFER_MAX: usize = 5;
/// Longest resolution summary, in bytes.
pub const RESOLUTION_BYTES_MAX: usize = 500;
/// Longest normalized error, in bytes.
pub const ERROR_BYTES_MAX: usize = 300;
/// Longest rendered argument value in a correction, in bytes.
pub const ARG_VALUE_BYTES_MAX: usize = 60;
/// Longest correction text, in bytes.
pub const CORRECTION_BYTES_MAX: usize = 500;

/// A crystallized investigation (seed 002's `InvestigationPattern`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InvestigationPattern {
    /// Stable key: hash of symptom, root cause and tool sequence.
    pub fingerprint: String,
    /// The observed issue (`high_latency_checkout`).
    pub symptom_type: String,
    /// The confirmed category of the failure.
    pub root_cause_category: String,
    /// Ordered tools that led to the solution.
    pub tool_sequence: Vec<String>,
    /// Brief description of the resolution.
    pub resolution_summary: String,
    /// Times observed.
    pub occurrence_count: u64,
    /// Reinforcement score in 0..=1.
    pub confidence: f64,
    /// Latest event ts of the runs seen; picks the latest `resolution_summary`.
    #[serde(default)]
    pub last_seen: Ts,
    /// Who taught it and since when.
    #[serde(flatten)]
    pub provenance: Provenance,
}

/// A fingerprinted tool mistake, with its self-correction when one was seen.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolMistake {
    /// Stable key: hash of tool and normalized error.
    pub fingerprint: String,
    /// The tool.
    pub tool: String,
    /// Category (syntax, invalid_argument, ...).
    pub category: String,
    /// The error message, normalized.
    pub error: String,
    /// Times seen.
    pub occurrence_count: u64,
    /// What changed when a later call of the same tool succeeded.
    pub correction: Option<String>,
    /// Runs it was seen in.
    #[serde(default)]
    pub runs_seen: u64,
    /// Ts of the successful call that gave `correction`; picks the latest one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrected_at: Option<Ts>,
    /// The names of the arguments `correction` changed (added, removed or changed keys of
    /// the call's argument object, name-like ones only), never their values: what the
    /// structured shared scope tells other users ([`changed_arg_names`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed_args: Vec<String>,
    /// Who showed it.
    #[serde(flatten)]
    pub provenance: Provenance,
}

/// Where a lesson comes from: the opaque ids of the users whose runs taught it (shared
/// scope only: advice from one user is one user's word, however often it repeats it),
/// and the earliest run's time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// Opaque user ids (keyed hashes), shared copies only.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub contributors: BTreeSet<String>,
    /// The earliest time it was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_seen: Option<Ts>,
}

impl Provenance {
    /// Adds one run's provenance: its contributor (if any) and when it was seen.
    fn add(&mut self, contributor: &str, seen: Option<Ts>) {
        if !contributor.is_empty() {
            self.contributors.insert(contributor.to_string());
        }
        self.first_seen = match (self.first_seen, seen) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// What one closed run teaches.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunLearnings {
    /// The run's investigation pattern, when it has one (occurrence 1).
    pub pattern: Option<InvestigationPattern>,
    /// Its tool mistakes (occurrences within the run), by fingerprint.
    pub mistakes: Vec<ToolMistake>,
    /// The run (provenance only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub run_id: String,
    /// The opaque id of the user who learned it (shared copies only; a keyed hash).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub contributor: String,
}

/// Confidence of a pattern seen `count` times: 0.6, then +0.1 per occurrence, capped at 1.
pub fn confidence_for(count: u64) -> f64 {
    let c = 0.6 + 0.1 * count.saturating_sub(1).min(10) as f64;
    // Round to 1e-9 so 0.6 + 0.1 + 0.1 compares equal to 0.8.
    ((c * 1e9).round() / 1e9).min(1.0)
}

/// FNV-1a 64 over parts separated by a 0 byte, as 16 hex digits (stable across builds).
pub(crate) fn fingerprint(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            eat(0);
        }
        p.bytes().for_each(&mut eat);
    }
    format!("{h:016x}")
}

/// Lowercase ASCII-alphanumeric words joined by `_` (`"High latency: checkout"` ->
/// `high_latency_checkout`).
pub fn slugify(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for w in s
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if !out.is_empty() {
            out.push('_');
        }
        out.extend(w.chars().flat_map(char::to_lowercase));
    }
    out
}

/// Cuts `s` to at most `max` bytes on a char boundary, marking the cut with `…`.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_uuid(s: &[u8]) -> bool {
    s.len() == 36
        && s.iter().enumerate().all(|(i, &b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// An error message with its variable parts replaced, so that the same mistake
/// fingerprints alike: lowercased; quoted strings -> `<str>`, UUIDs -> `<uuid>`, hex ids
/// (`0x..`, or 8+ hex digits with a digit) -> `<hex>`, numbers -> `<n>`; whitespace
/// collapsed; at most [`ERROR_BYTES_MAX`] bytes.
pub fn normalize_error(err: &str) -> String {
    let lower = err.to_lowercase();
    let b = lower.as_bytes();
    let mut out = String::with_capacity(lower.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let word_start = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if matches!(c, b'"' | b'\'' | b'`') {
            // A quote closes on the same character; an apostrophe inside a word ("don't")
            // or an unmatched quote is kept as is.
            let is_apostrophe = c == b'\'' && !word_start;
            if !is_apostrophe {
                if let Some(len) = b[i + 1..].iter().position(|&x| x == c) {
                    out.push_str("<str>");
                    i += len + 2;
                    continue;
                }
            }
            out.push(c as char);
            i += 1;
        } else if c.is_ascii_alphanumeric() && word_start {
            if b.len() >= i + 36
                && is_uuid(&b[i..i + 36])
                && b.get(i + 36).is_none_or(|x| !x.is_ascii_alphanumeric())
            {
                out.push_str("<uuid>");
                i += 36;
                continue;
            }
            let mut j = i;
            while j < b.len() && b[j].is_ascii_alphanumeric() {
                j += 1;
            }
            let w = &lower[i..j];
            if w.bytes().all(|x| x.is_ascii_digit()) {
                // Decimals (`3.5`) are one number.
                while j + 1 < b.len() && b[j] == b'.' && b[j + 1].is_ascii_digit() {
                    j += 1;
                    while j < b.len() && b[j].is_ascii_digit() {
                        j += 1;
                    }
                }
                out.push_str("<n>");
            } else if (w.len() > 2 && w.starts_with("0x") && is_hex(&w[2..]))
                || (w.len() >= 8 && is_hex(w) && w.bytes().any(|x| x.is_ascii_digit()))
            {
                out.push_str("<hex>");
            } else {
                out.push_str(w);
            }
            i = j;
        } else {
            // Copy one whole (maybe multi-byte) char.
            let ch_len = lower[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&lower[i..i + ch_len]);
            i += ch_len;
        }
    }
    let collapsed = out.split_whitespace().collect::<Vec<_>>().join(" ");
    truncate(&collapsed, ERROR_BYTES_MAX)
}

/// The category of a normalized error, by keywords (first rule that matches):
/// `syntax`, `invalid_argument`, `permission`, `not_found`, `timeout`, `rate_limit`,
/// `invalid_argument` (a bare "invalid"), else `other`.
pub fn classify_error(normalized: &str) -> &'static str {
    let e = normalized;
    let any = |ks: &[&str]| ks.iter().any(|k| e.contains(k));
    if any(&[
        "syntax",
        "parse",
        "parsing",
        "unexpected token",
        "unexpected end",
        "malformed",
    ]) {
        "syntax"
    } else if any(&[
        "invalid argument",
        "invalid_argument",
        "invalid value",
        "invalid parameter",
        "invalid option",
        "missing required",
        "required argument",
        "required parameter",
        "is required",
        "unknown flag",
        "unknown option",
        "unknown argument",
        "unknown parameter",
        "unrecognized",
        "unexpected argument",
        "bad argument",
    ]) {
        "invalid_argument"
    } else if any(&[
        "permission",
        "forbidden",
        "unauthorized",
        "unauthorised",
        "access denied",
        "not allowed",
    ]) {
        "permission"
    } else if any(&[
        "not found",
        "not_found",
        "no such",
        "does not exist",
        "unknown",
    ]) {
        "not_found"
    } else if any(&["timeout", "timed out", "deadline", "time out"]) {
        "timeout"
    } else if any(&[
        "rate limit",
        "rate_limit",
        "ratelimit",
        "rate-limit",
        "too many requests",
        "quota",
        "throttl",
    ]) {
        "rate_limit"
    } else if e.contains("invalid") {
        "invalid_argument"
    } else {
        "other"
    }
}

/// A value as a correction shows it: strings bare, the rest compact JSON, truncated.
fn render_value(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    truncate(&s, ARG_VALUE_BYTES_MAX)
}

/// A call's arguments as an object: none (or `null`) is the empty one; `None` when they
/// are not an object.
fn args_object(v: Option<&Value>) -> Option<std::borrow::Cow<'_, Map<String, Value>>> {
    match v {
        None | Some(Value::Null) => Some(std::borrow::Cow::Owned(Map::new())),
        Some(Value::Object(m)) => Some(std::borrow::Cow::Borrowed(m)),
        Some(_) => None,
    }
}

/// The keys both argument objects have, with different values, sorted, at most 8,
/// keeping only name-like keys (1-32 of `A-Za-z0-9_.`, starting with a letter or `_`):
/// a key is shared with other users where the values never are. Empty when either side
/// is not an object.
pub fn changed_arg_names(failed: Option<&Value>, ok: Option<&Value>) -> Vec<String> {
    let (Some(a), Some(b)) = (args_object(failed), args_object(ok)) else {
        return Vec::new();
    };
    // Argument names are identifiers (`namespace`, `resource.type`, `maxResults`); a
    // key with a dash or over 32 bytes may be data (`acme-billing-db`), and a key only
    // one of the calls has may be one the caller made up: neither is named.
    let name_like = |k: &str| {
        (1..=32).contains(&k.len())
            && k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
    };
    let mut keys: Vec<String> = a
        .keys()
        .filter(|k| b.get(*k).is_some_and(|v| a.get(*k) != Some(v)) && name_like(k))
        .map(|k| k.to_ascii_lowercase())
        .collect();
    keys.sort();
    keys.dedup();
    keys.truncate(8);
    keys
}

/// What changed from the failed call's arguments to the successful one's, keys sorted:
/// `added flag=value; changed x from a to b; removed y`. `None` when nothing changed.
/// Non-object arguments are compared whole (`changed arguments from a to b`).
pub fn describe_args_diff(failed: Option<&Value>, ok: Option<&Value>) -> Option<String> {
    let (a, b) = match (args_object(failed), args_object(ok)) {
        (Some(a), Some(b)) => (a, b),
        _ => {
            let (fa, fb) = (failed.unwrap_or(&Value::Null), ok.unwrap_or(&Value::Null));
            if fa == fb {
                return None;
            }
            return Some(truncate(
                &format!(
                    "changed arguments from {} to {}",
                    render_value(fa),
                    render_value(fb)
                ),
                CORRECTION_BYTES_MAX,
            ));
        }
    };
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut parts = Vec::new();
    for k in keys {
        match (a.get(k), b.get(k)) {
            (None, Some(v)) => parts.push(format!("added {k}={}", render_value(v))),
            (Some(_), None) => parts.push(format!("removed {k}")),
            (Some(x), Some(y)) if x != y => parts.push(format!(
                "changed {k} from {} to {}",
                render_value(x),
                render_value(y)
            )),
            _ => {}
        }
    }
    if parts.is_empty() {
        None
    } else {
        Some(truncate(&parts.join("; "), CORRECTION_BYTES_MAX))
    }
}

/// A tool call an entry reports, if any: (tool, ok, error, args).
fn tool_call(e: &Event) -> Option<(&str, bool, Option<&str>, Option<&Value>)> {
    let meta = e.meta.as_ref()?;
    let tool = meta.get("tool")?.as_str()?.trim();
    if tool.is_empty() {
        return None;
    }
    let error = meta.get("error").and_then(Value::as_str);
    let ok = match meta.get("tool_status").and_then(Value::as_str) {
        Some(s) if s.eq_ignore_ascii_case("ok") => true,
        Some(s) if s.eq_ignore_ascii_case("error") => false,
        _ => meta.get("error").is_none_or(Value::is_null),
    };
    Some((tool, ok, error, meta.get("args")))
}

fn meta_str<'a>(e: &'a Event, key: &str) -> Option<&'a str> {
    e.meta
        .as_ref()?
        .get(key)?
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Learns from one closed run's events, one at a time (memory grows with its distinct
/// tools and mistakes, never with its events).
#[derive(Debug, Default)]
pub struct Learner {
    run_id: String,
    last_ts: Ts,
    symptom: Option<String>,
    first_hypothesis_subject: Option<String>,
    root_cause: Option<String>,
    resolution: Option<String>,
    last_decision_text: Option<String>,
    sequence: Vec<String>,
    any_ok: bool,
    mistakes: BTreeMap<String, ToolMistake>,
    // Per tool: fingerprints and arguments of its recent failures, oldest first.
    pending: BTreeMap<String, VecDeque<(String, Option<Value>)>>,
    // Failures of calls made (not recorded afterwards): fingerprint and arguments, so a
    // later record of the same failure (`meta.retrospective`) is not counted twice.
    called: std::collections::BTreeSet<(String, String)>,
}

/// Whether an entry records a call after the fact (`record_tool_failure_pattern`) rather
/// than reporting one as it is made: it may restate a call already tracked.
pub fn is_retrospective(e: &Event) -> bool {
    e.meta_flag("retrospective")
}

impl Learner {
    /// Takes the run's next event (in seq order).
    pub fn push(&mut self, e: &Event) {
        if self.run_id.is_empty() {
            self.run_id.clone_from(&e.run_id);
        }
        self.last_ts = self.last_ts.max(e.ts);
        if !e.kind.is_client() {
            return;
        }
        if self.symptom.is_none() {
            self.symptom = meta_str(e, "symptom")
                .map(slugify)
                .filter(|s| !s.is_empty());
        }
        if self.first_hypothesis_subject.is_none() && e.kind == crate::event::EventType::Hypothesis
        {
            self.first_hypothesis_subject =
                e.subject.as_deref().map(slugify).filter(|s| !s.is_empty());
        }
        if let Some(r) = meta_str(e, "resolution") {
            self.resolution = Some(r.to_string());
        }
        if e.kind == crate::event::EventType::Decision {
            if let Some(rc) = meta_str(e, "root_cause")
                .map(slugify)
                .filter(|s| !s.is_empty())
            {
                self.root_cause = Some(rc);
            }
            let t = text::content_text(&e.content);
            let t = t.trim();
            if !t.is_empty() {
                self.last_decision_text = Some(t.to_string());
            }
        }
        let Some((tool, ok, error, args)) = tool_call(e) else {
            return;
        };
        if ok {
            self.any_ok = true;
            if !NOISY_TOOLS.contains(&tool)
                && self.sequence.len() < SEQUENCE_MAX
                && self.sequence.last().map(String::as_str) != Some(tool)
            {
                self.sequence.push(tool.to_string());
            }
            if let Some(fails) = self.pending.remove(tool) {
                for (fp, failed_args) in fails {
                    if let Some(c) = describe_args_diff(failed_args.as_ref(), args) {
                        if let Some(m) = self.mistakes.get_mut(&fp) {
                            m.correction = Some(c);
                            m.corrected_at = Some(e.ts);
                            m.changed_args = changed_arg_names(failed_args.as_ref(), args);
                        }
                    }
                }
            }
        } else {
            let norm = normalize_error(error.unwrap_or("error"));
            let fp = fingerprint(&[tool, &norm]);
            // No arguments and `{}` are the same call.
            let args_key = args
                .filter(|a| !a.is_null() && a.as_object().is_none_or(|o| !o.is_empty()))
                .map_or_else(String::new, Value::to_string);
            let key = (fp.clone(), args_key);
            let restated = if is_retrospective(e) {
                self.called.contains(&key)
            } else {
                self.called.insert(key);
                false
            };
            let m = self
                .mistakes
                .entry(fp.clone())
                .or_insert_with(|| ToolMistake {
                    fingerprint: fp.clone(),
                    tool: tool.to_string(),
                    category: classify_error(&norm).to_string(),
                    error: norm,
                    occurrence_count: 0,
                    correction: None,
                    runs_seen: 1,
                    corrected_at: None,
                    changed_args: Vec::new(),
                    provenance: Provenance::default(),
                });
            if !restated {
                m.occurrence_count += 1;
            }
            let buf = self.pending.entry(tool.to_string()).or_default();
            if buf.len() == FAILURE_BUFFER_MAX {
                buf.pop_front();
            }
            buf.push_back((fp, args.cloned()));
        }
    }

    /// What the run taught.
    pub fn finish(self) -> RunLearnings {
        let Learner {
            run_id,
            last_ts,
            symptom,
            first_hypothesis_subject,
            root_cause,
            resolution,
            last_decision_text,
            sequence,
            any_ok,
            mistakes,
            ..
        } = self;
        let symptom = symptom.or(first_hypothesis_subject);
        let pattern = match (symptom, root_cause) {
            (Some(symptom), Some(root_cause)) if any_ok => {
                let fp = fingerprint(&[&symptom, &root_cause, &sequence.join("\u{1}")]);
                let summary = resolution.or(last_decision_text).unwrap_or_default();
                Some(InvestigationPattern {
                    fingerprint: fp,
                    symptom_type: symptom,
                    root_cause_category: root_cause,
                    tool_sequence: sequence,
                    resolution_summary: truncate(&summary, RESOLUTION_BYTES_MAX),
                    occurrence_count: 1,
                    confidence: confidence_for(1),
                    last_seen: last_ts,
                    // A run is seen at its end; across runs these span first to last.
                    provenance: Provenance {
                        first_seen: Some(last_ts),
                        ..Provenance::default()
                    },
                })
            }
            _ => None,
        };
        RunLearnings {
            pattern,
            mistakes: mistakes.into_values().collect(),
            run_id,
            contributor: String::new(),
        }
    }
}

/// Learns from one closed run's events.
pub fn learn_from_run<'a>(events: impl IntoIterator<Item = &'a Event>) -> RunLearnings {
    let mut l = Learner::default();
    for e in events {
        l.push(e);
    }
    l.finish()
}

/// All patterns and mistakes learned so far: a fold of [`RunLearnings`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PatternBook {
    /// Patterns by fingerprint.
    pub patterns: BTreeMap<String, InvestigationPattern>,
    /// Mistakes by fingerprint.
    pub mistakes: BTreeMap<String, ToolMistake>,
    /// Who taught each text of each item (a pattern's resolution, a mistake's
    /// correction), by fingerprint: the item shows the text taught by the most distinct
    /// contributors, then the latest, so in the shared scope one tenant cannot replace
    /// what several others taught. (Private books have no contributors: the latest.)
    /// (Kept in the facts snapshots with the book: a book loaded from one goes on
    /// choosing as a book folded from the start.)
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    taught: BTreeMap<String, BTreeMap<String, Taught>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Resolution,
    Correction,
}

impl Kind {
    /// The key of item `fingerprint`'s texts of this kind in [`PatternBook::taught`].
    fn key(self, fingerprint: &str) -> String {
        match self {
            Kind::Resolution => format!("resolution:{fingerprint}"),
            Kind::Correction => format!("correction:{fingerprint}"),
        }
    }
}

/// Who taught one text of an item, the latest time, and (corrections) the argument names.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Taught {
    #[serde(default)]
    users: BTreeSet<String>,
    #[serde(default)]
    at: Ts,
    #[serde(default)]
    args: Vec<String>,
}

impl PatternBook {
    /// Records that `contributor` taught `text` for item `key` at `at`; returns the text
    /// to show now and its record: most distinct contributors, then latest, then the
    /// larger text (order-independent).
    fn teach(
        &mut self,
        key: String,
        text: &str,
        contributor: &str,
        at: Ts,
        args: &[String],
    ) -> (String, Taught) {
        let texts = self.taught.entry(key).or_default();
        let t = texts.entry(text.to_string()).or_default();
        if !contributor.is_empty() {
            t.users.insert(contributor.to_string());
        }
        if at >= t.at {
            t.at = at;
            t.args = args.to_vec();
        }
        texts
            .iter()
            .max_by(|(xa, a), (xb, b)| (a.users.len(), a.at, xa).cmp(&(b.users.len(), b.at, xb)))
            .map(|(x, t)| (x.clone(), t.clone()))
            .unwrap_or_default()
    }
}

fn words(s: &str) -> Vec<String> {
    s.split(|c: char| c == '_' || c == '-' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

impl PatternBook {
    /// Folds in one run's learnings. Commutative: the book does not depend on the order
    /// runs are merged in.
    pub fn merge_run(&mut self, l: &RunLearnings) {
        if let Some(p) = &l.pattern {
            match self.patterns.get_mut(&p.fingerprint) {
                None => {
                    let mut p = p.clone();
                    p.occurrence_count = p.occurrence_count.max(1);
                    p.confidence = confidence_for(p.occurrence_count);
                    let seen = p.provenance.first_seen.or(Some(p.last_seen));
                    p.provenance.add(&l.contributor, seen);
                    self.patterns.insert(p.fingerprint.clone(), p);
                }
                Some(q) => {
                    let seen = p.provenance.first_seen.or(Some(p.last_seen));
                    q.provenance.add(&l.contributor, seen);
                    q.occurrence_count += p.occurrence_count.max(1);
                    q.confidence = confidence_for(q.occurrence_count);
                    q.last_seen = q.last_seen.max(p.last_seen);
                }
            }
            if !p.resolution_summary.is_empty() {
                let key = Kind::Resolution.key(&p.fingerprint);
                let (text, _) =
                    self.teach(key, &p.resolution_summary, &l.contributor, p.last_seen, &[]);
                if let Some(q) = self.patterns.get_mut(&p.fingerprint) {
                    q.resolution_summary = text;
                }
            }
        }
        // A run counts once per mistake: its sanitized copy can hold several mistakes
        // that became one (errors that differed only in what the sanitizer replaced).
        let mut counted = BTreeSet::new();
        for m in &l.mistakes {
            let first_in_run = counted.insert(m.fingerprint.as_str());
            match self.mistakes.get_mut(&m.fingerprint) {
                None => {
                    let mut m = m.clone();
                    m.runs_seen = 1;
                    m.provenance.add(&l.contributor, None);
                    self.mistakes.insert(m.fingerprint.clone(), m);
                }
                Some(q) => {
                    q.provenance.add(&l.contributor, None);
                    q.occurrence_count += m.occurrence_count;
                    if first_in_run {
                        q.runs_seen += 1;
                    }
                }
            }
            if let Some(c) = m.correction.as_deref().filter(|c| !c.is_empty()) {
                let key = Kind::Correction.key(&m.fingerprint);
                let at = m.corrected_at.unwrap_or_default();
                let (text, t) = self.teach(key, c, &l.contributor, at, &m.changed_args);
                if let Some(q) = self.mistakes.get_mut(&m.fingerprint) {
                    q.correction = Some(text);
                    q.corrected_at = Some(t.at).filter(|&a| a != Ts::default());
                    q.changed_args = t.args;
                }
            }
        }
    }

    /// Patterns for a symptom, best first: exact symptom matches (after [`slugify`]),
    /// then patterns whose symptom shares a word with the query (words split on `_`, `-`,
    /// space); each group by confidence, then occurrences (desc), then fingerprint.
    pub fn recommend(&self, symptom: &str) -> Vec<&InvestigationPattern> {
        let q = slugify(symptom);
        let qw = words(&q);
        let mut exact = Vec::new();
        let mut near = Vec::new();
        for p in self.patterns.values() {
            if !q.is_empty() && p.symptom_type == q {
                exact.push(p);
            } else if words(&p.symptom_type).iter().any(|w| qw.contains(w)) {
                near.push(p);
            }
        }
        let order = |a: &&InvestigationPattern, b: &&InvestigationPattern| {
            b.confidence
                .total_cmp(&a.confidence)
                .then(b.occurrence_count.cmp(&a.occurrence_count))
                .then(a.fingerprint.cmp(&b.fingerprint))
        };
        exact.sort_by(order);
        near.sort_by(order);
        exact.extend(near);
        exact
    }

    /// Known mistakes of a tool, most frequent first (ties: fingerprint).
    pub fn advise(&self, tool: &str) -> Vec<&ToolMistake> {
        let mut v: Vec<&ToolMistake> = self.mistakes.values().filter(|m| m.tool == tool).collect();
        v.sort_by(|a, b| {
            b.occurrence_count
                .cmp(&a.occurrence_count)
                .then(a.fingerprint.cmp(&b.fingerprint))
        });
        v
    }
}

#[cfg(test)]
mod tests;
