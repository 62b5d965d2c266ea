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

/// What changed from the failed call's arguments to the successful one's, keys sorted:
/// `added flag=value; changed x from a to b; removed y`. `None` when nothing changed.
/// Non-object arguments are compared whole (`changed arguments from a to b`).
pub fn describe_args_diff(failed: Option<&Value>, ok: Option<&Value>) -> Option<String> {
    let empty = Map::new();
    let as_obj = |v: Option<&Value>| -> Option<Map<String, Value>> {
        match v {
            None | Some(Value::Null) => Some(empty.clone()),
            Some(Value::Object(m)) => Some(m.clone()),
            Some(_) => None,
        }
    };
    let (a, b) = match (as_obj(failed), as_obj(ok)) {
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
}

/// Whether `(ts_b, b)` is later than `(ts_a, a)`: by ts, then by text (deterministic).
fn later(ts_a: Ts, a: &str, ts_b: Ts, b: &str) -> bool {
    (ts_b, b) > (ts_a, a)
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
                    let take = !p.resolution_summary.is_empty()
                        && (q.resolution_summary.is_empty()
                            || later(
                                q.last_seen,
                                &q.resolution_summary,
                                p.last_seen,
                                &p.resolution_summary,
                            ));
                    if take {
                        q.resolution_summary.clone_from(&p.resolution_summary);
                    }
                    q.last_seen = q.last_seen.max(p.last_seen);
                }
            }
        }
        for m in &l.mistakes {
            match self.mistakes.get_mut(&m.fingerprint) {
                None => {
                    let mut m = m.clone();
                    m.runs_seen = m.runs_seen.max(1);
                    m.provenance.add(&l.contributor, None);
                    self.mistakes.insert(m.fingerprint.clone(), m);
                }
                Some(q) => {
                    q.provenance.add(&l.contributor, None);
                    q.occurrence_count += m.occurrence_count;
                    q.runs_seen += m.runs_seen.max(1);
                    if let Some(c) = m.correction.as_deref().filter(|c| !c.is_empty()) {
                        let at = m.corrected_at.unwrap_or_default();
                        let take = match (&q.correction, q.corrected_at) {
                            (Some(qc), qat) if !qc.is_empty() => {
                                later(qat.unwrap_or_default(), qc, at, c)
                            }
                            _ => true,
                        };
                        if take {
                            q.correction = Some(c.to_string());
                            q.corrected_at = m.corrected_at;
                        }
                    }
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
mod tests {
    use super::*;
    use crate::event::EventType;
    use serde_json::json;

    fn ev(seq: u64, agent: &str, kind: EventType, content: Value, meta: Value) -> Event {
        Event {
            run_id: "r".into(),
            seq,
            ts: Ts(seq * 1_000_000),
            id: format!("e{seq}"),
            agent_id: agent.into(),
            user_id: "u".into(),
            kind,
            content,
            confidence: None,
            refs: vec![],
            subject: None,
            session_id: None,
            meta: match meta {
                Value::Object(m) => Some(m),
                _ => None,
            },
        }
    }

    fn call(seq: u64, tool: &str, args: Value) -> Event {
        ev(
            seq,
            "a",
            EventType::ActionTaken,
            json!("call"),
            json!({"tool": tool, "args": args}),
        )
    }

    fn fail(seq: u64, tool: &str, err: &str, args: Value) -> Event {
        ev(
            seq,
            "a",
            EventType::ActionTaken,
            json!("call"),
            json!({"tool": tool, "args": args, "error": err}),
        )
    }

    /// A checkout-latency investigation, its ts shifted by `t0` seconds.
    fn investigation(t0: u64, resolution: &str) -> Vec<Event> {
        let mut v = vec![
            ev(
                1,
                "a",
                EventType::Hypothesis,
                json!("pool is saturated"),
                json!({"symptom": "high_latency_checkout"}),
            ),
            call(2, "get_current_time", json!({})),
            call(3, "query_metrics", json!({"q": "p99"})),
            call(4, "query_metrics", json!({"q": "p50"})),
            call(5, "load_memory", json!({})),
            call(6, "fetch_trace_exemplar", json!({})),
            call(7, "get_logs_for_trace", json!({})),
            ev(
                8,
                "b",
                EventType::Decision,
                json!({"text": "raise the pool size"}),
                json!({"root_cause": "connection_pool_saturation", "resolution": resolution}),
            ),
        ];
        for e in &mut v {
            e.ts = Ts(e.ts.0 + t0 * 1_000_000);
        }
        v
    }

    #[test]
    fn pattern_of_a_run_drops_noise_and_collapses_repeats() {
        let l = learn_from_run(&investigation(0, "bumped pool to 50"));
        let p = l.pattern.expect("pattern");
        assert_eq!(p.symptom_type, "high_latency_checkout");
        assert_eq!(p.root_cause_category, "connection_pool_saturation");
        assert_eq!(
            p.tool_sequence,
            [
                "query_metrics",
                "fetch_trace_exemplar",
                "get_logs_for_trace"
            ]
        );
        assert_eq!(p.resolution_summary, "bumped pool to 50");
        assert_eq!((p.occurrence_count, p.confidence), (1, 0.6));
        assert_eq!(p.fingerprint.len(), 16);
        assert_eq!(l.run_id, "r");
    }

    #[test]
    fn two_runs_merge_and_ten_cap_at_one() {
        let a = learn_from_run(&investigation(0, "first"));
        let b = learn_from_run(&investigation(100, "second"));
        assert_eq!(
            a.pattern.as_ref().map(|p| &p.fingerprint),
            b.pattern.as_ref().map(|p| &p.fingerprint)
        );
        let mut book = PatternBook::default();
        book.merge_run(&a);
        book.merge_run(&b);
        let p = book.patterns.values().next().expect("one pattern");
        assert_eq!(book.patterns.len(), 1);
        assert_eq!((p.occurrence_count, p.confidence), (2, 0.7));
        assert_eq!(p.resolution_summary, "second");
        // Order-insensitive.
        let mut rev = PatternBook::default();
        rev.merge_run(&b);
        rev.merge_run(&a);
        assert_eq!(rev.patterns, book.patterns);

        let mut book = PatternBook::default();
        for i in 0..10 {
            book.merge_run(&learn_from_run(&investigation(i, "x")));
            let p = book.patterns.values().next().expect("one pattern");
            assert_eq!(p.confidence, confidence_for(i + 1));
        }
        let p = book.patterns.values().next().expect("one pattern");
        assert_eq!((p.occurrence_count, p.confidence), (10, 1.0));
        assert_eq!(confidence_for(3), 0.8);
        assert_eq!(confidence_for(5), 1.0);
    }

    #[test]
    fn learnings_roundtrip_through_json() {
        let l = learn_from_run(&investigation(0, "x"));
        let s = serde_json::to_string(&l).expect("ser");
        let back: RunLearnings = serde_json::from_str(&s).expect("de");
        assert_eq!(back, l);
    }

    #[test]
    fn no_pattern_without_root_cause_symptom_or_success() {
        let mut v = investigation(0, "x");
        v[7].meta = None;
        assert!(learn_from_run(&v).pattern.is_none());

        let mut v = investigation(0, "x");
        v[0].meta = None;
        assert!(learn_from_run(&v).pattern.is_none());
        // ... unless the first hypothesis has a subject.
        v[0].subject = Some("High latency: checkout".into());
        let p = learn_from_run(&v).pattern.expect("pattern");
        assert_eq!(p.symptom_type, "high_latency_checkout");

        let v: Vec<Event> = investigation(0, "x")
            .into_iter()
            .filter(|e| e.meta.as_ref().is_none_or(|m| !m.contains_key("tool")))
            .collect();
        assert!(learn_from_run(&v).pattern.is_none());
    }

    #[test]
    fn resolution_falls_back_to_last_decision_text() {
        let mut v = investigation(0, "x");
        if let Some(m) = v[7].meta.as_mut() {
            m.remove("resolution");
        }
        let p = learn_from_run(&v).pattern.expect("pattern");
        assert_eq!(p.resolution_summary, "raise the pool size");
    }

    #[test]
    fn errors_normalize_and_classify() {
        let a = normalize_error("Syntax error at line 3, column 12: near 'SELEC'");
        let b = normalize_error("syntax error at line 7, column 1: near \"FRM\"");
        assert_eq!(a, b);
        assert_eq!(a, "syntax error at line <n>, column <n>: near <str>");
        assert_eq!(
            normalize_error("trace 4bf92f3577b34da6 / 0xDEAD not found for 123e4567-e89b-12d3-a456-426614174000 after 2.5s"),
            "trace <hex> / <hex> not found for <uuid> after <n>s"
        );
        assert_eq!(normalize_error("don't  do it"), "don't do it");
        let cases = [
            ("parse error: unexpected token", "syntax"),
            ("missing required argument --service", "invalid_argument"),
            ("unknown flag: --verbose", "invalid_argument"),
            ("403 forbidden", "permission"),
            ("index <str> not found", "not_found"),
            ("deadline exceeded", "timeout"),
            ("quota exhausted", "rate_limit"),
            ("invalid window", "invalid_argument"),
            ("boom", "other"),
        ];
        for (e, want) in cases {
            assert_eq!(classify_error(&normalize_error(e)), want, "{e}");
        }
    }

    #[test]
    fn mistakes_fingerprint_alike_and_self_correct() {
        let v = vec![
            fail(
                1,
                "query_logs",
                "syntax error at line 3",
                json!({"q": "SELEC *", "limit": 10}),
            ),
            fail(
                2,
                "query_logs",
                "syntax error at line 7",
                json!({"q": "SELEC *", "verbose": true}),
            ),
            call(
                3,
                "query_logs",
                json!({"q": "SELECT *", "limit": 10, "format": "json"}),
            ),
            fail(4, "other_tool", "permission denied", json!({})),
        ];
        let l = learn_from_run(&v);
        assert_eq!(l.mistakes.len(), 2);
        let m = l
            .mistakes
            .iter()
            .find(|m| m.tool == "query_logs")
            .expect("m");
        assert_eq!(m.occurrence_count, 2);
        assert_eq!(m.category, "syntax");
        // Latest failure's diff wins within the run.
        assert_eq!(
            m.correction.as_deref(),
            Some("added format=json; added limit=10; changed q from SELEC * to SELECT *; removed verbose")
        );
        let o = l
            .mistakes
            .iter()
            .find(|m| m.tool == "other_tool")
            .expect("o");
        assert_eq!(
            (o.category.as_str(), o.correction.as_deref()),
            ("permission", None)
        );
        assert_eq!(
            describe_args_diff(Some(&json!({"a": 1})), Some(&json!({"a": 1}))),
            None
        );
    }

    /// A failure tracked as it happened and recorded again afterwards
    /// (`record_tool_failure_pattern`: `meta.retrospective`) is one occurrence; a
    /// recorded failure the run never tracked counts, and so do repeated real calls.
    #[test]
    fn a_recorded_failure_restating_a_tracked_one_counts_once() {
        let retro = |mut e: Event| {
            if let Some(m) = e.meta.as_mut() {
                m.insert("retrospective".into(), json!(true));
            }
            e
        };
        let args = json!({"filter": "x"});
        let v = vec![
            fail(1, "query_metrics", "unknown field filter", args.clone()),
            call(2, "query_metrics", json!({"resource.type": "x"})),
            retro(fail(
                3,
                "query_metrics",
                "unknown field filter",
                args.clone(),
            )),
            retro(call(4, "query_metrics", json!({"resource.type": "x"}))),
            retro(fail(5, "other_tool", "permission denied", json!({}))),
            fail(6, "third", "timeout", json!({})),
            fail(7, "third", "timeout", json!({})),
        ];
        let l = learn_from_run(&v);
        let count = |tool: &str| {
            l.mistakes
                .iter()
                .find(|m| m.tool == tool)
                .map(|m| m.occurrence_count)
        };
        assert_eq!(count("query_metrics"), Some(1));
        assert_eq!(count("other_tool"), Some(1));
        assert_eq!(count("third"), Some(2));
        // The detector of anti-patterns sees the calls made, not the records.
        #[cfg(feature = "mcp")]
        {
            let calls: Vec<_> = v.iter().filter_map(crate::mcp::anti::tool_call).collect();
            assert_eq!(
                calls.iter().map(|c| c.seq).collect::<Vec<_>>(),
                [1, 2, 6, 7]
            );
        }
    }

    #[test]
    fn tool_status_overrides_error_presence() {
        let mut e = call(1, "t", json!({}));
        if let Some(m) = e.meta.as_mut() {
            m.insert("tool_status".into(), json!("error"));
        }
        let l = learn_from_run(&[e]);
        assert_eq!(l.mistakes.len(), 1);
        assert_eq!(l.mistakes[0].error, "error");
    }

    #[test]
    fn failure_buffer_keeps_last_five() {
        let mut v: Vec<Event> = (1..=7)
            .map(|i| fail(i, "t", &format!("bad value{i}"), json!({"k": i})))
            .collect();
        v.push(call(8, "t", json!({"k": 0})));
        let l = learn_from_run(&v);
        assert_eq!(l.mistakes.len(), 7);
        let corrected: Vec<&str> = l
            .mistakes
            .iter()
            .filter(|m| m.correction.is_some())
            .map(|m| m.error.as_str())
            .collect();
        assert_eq!(corrected.len(), 5);
        assert!(!corrected.contains(&"bad value1") && !corrected.contains(&"bad value2"));
    }

    #[test]
    fn merge_mistakes_keeps_known_correction() {
        let a = learn_from_run(&[
            fail(1, "t", "unknown flag --x", json!({"x": 1})),
            call(2, "t", json!({"y": 1})),
        ]);
        let b = learn_from_run(&[fail(1, "t", "unknown flag --x", json!({"x": 1}))]);
        let mut book = PatternBook::default();
        book.merge_run(&a);
        book.merge_run(&b);
        let m = book.advise("t");
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].occurrence_count, m[0].runs_seen), (2, 2));
        assert_eq!(m[0].correction.as_deref(), Some("removed x; added y=1"));
        let mut rev = PatternBook::default();
        rev.merge_run(&b);
        rev.merge_run(&a);
        assert_eq!(rev.mistakes, book.mistakes);
    }

    #[test]
    fn recommend_and_advise_order() {
        let mk = |sym: &str, rc: &str, n: u64| {
            let mut p = InvestigationPattern {
                symptom_type: sym.into(),
                root_cause_category: rc.into(),
                occurrence_count: n,
                confidence: confidence_for(n),
                ..Default::default()
            };
            p.fingerprint = fingerprint(&[sym, rc]);
            RunLearnings {
                pattern: Some(p),
                ..Default::default()
            }
        };
        let mut book = PatternBook::default();
        book.merge_run(&mk("high_latency_checkout", "pool", 1));
        book.merge_run(&mk("high_latency_checkout", "gc", 3));
        book.merge_run(&mk("high_latency_search", "index", 5));
        book.merge_run(&mk("disk_full", "logs", 9));
        let got: Vec<&str> = book
            .recommend("High latency checkout")
            .iter()
            .map(|p| p.root_cause_category.as_str())
            .collect();
        assert_eq!(got, ["gc", "pool", "index"]);
        assert!(book.recommend("nothing_alike").is_empty());

        let mut book = PatternBook::default();
        let l = learn_from_run(&[
            fail(1, "t", "timeout", json!({})),
            fail(2, "t", "syntax error", json!({})),
            fail(3, "t", "syntax error", json!({})),
            fail(4, "u", "syntax error", json!({})),
        ]);
        book.merge_run(&l);
        let got: Vec<(&str, u64)> = book
            .advise("t")
            .iter()
            .map(|m| (m.category.as_str(), m.occurrence_count))
            .collect();
        assert_eq!(got, [("syntax", 2), ("timeout", 1)]);
    }
}
