//! Normalization of a finding's wording, and the signature two findings are compared by.
//!
//! CONTRACT (used by `dedup`, `metrics` and the driver): every function here is pure and
//! deterministic (no randomness, no global state), so a signature can always be rebuilt
//! from the stored text.

/// Text of a finding, lowercased, whitespace collapsed, a final `.` dropped.
pub fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    normalize_into(text, &mut out);
    out
}

/// 64-bit FNV-1a of `scope`, a 0 byte, and the normalized text: equal keys mean an exact
/// duplicate within the scope.
pub fn exact_key(scope: &str, text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    scope.bytes().for_each(&mut eat);
    eat(0);
    // The normalized text, built in a reused buffer: this runs once per finding.
    NORMALIZED.with(|buf| {
        let mut out = buf.borrow_mut();
        out.clear();
        normalize_into(text, &mut out);
        out.bytes().for_each(&mut eat);
    });
    h
}

thread_local! {
    static NORMALIZED: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// [`normalize`] into `out` (appended).
fn normalize_into(text: &str, out: &mut String) {
    let start = out.len();
    for w in text.split_whitespace() {
        if out.len() > start {
            out.push(' ');
        }
        if w.is_ascii() {
            out.extend(w.bytes().map(|b| char::from(b.to_ascii_lowercase())));
        } else {
            out.extend(w.chars().flat_map(char::to_lowercase));
        }
    }
    while out.len() > start && out.ends_with('.') {
        out.pop();
    }
}

/// The text a finding's content stands for: a string as it is; for an object, its
/// `text`, `claim`, `finding` or `summary` string field (first present), else the object
/// as compact JSON (serde_json keeps keys sorted, so equal objects give equal text).
pub fn content_text(content: &serde_json::Value) -> std::borrow::Cow<'_, str> {
    use serde_json::Value;
    match content {
        Value::String(s) => std::borrow::Cow::Borrowed(s.as_str()),
        Value::Object(o) => {
            for k in ["text", "claim", "finding", "summary"] {
                if let Some(Value::String(s)) = o.get(k) {
                    return std::borrow::Cow::Borrowed(s.as_str());
                }
            }
            std::borrow::Cow::Owned(content.to_string())
        }
        other => std::borrow::Cow::Owned(other.to_string()),
    }
}

/// Kind of quantity a number measures, after unit conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dim {
    /// A bare number (count, port, status code, ...).
    Bare,
    /// A duration, in milliseconds.
    Time,
    /// A percentage.
    Percent,
    /// A size, in bytes.
    Bytes,
    /// A ratio (`2x`, "doubled").
    Ratio,
    /// A time of day (`14:01`).
    Clock,
    /// Any other unit suffix, kept as written (`100m` CPU).
    Other,
    /// An HTTP status code (categorical: several can hold at once).
    Status,
}

/// A number of a finding with its unit normalized: `45s`, `45 seconds` and `45 s` all give
/// key `"45000"` with [`Dim::Time`]; `12%` and `12 percent` give `"12"`, [`Dim::Percent`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Value {
    /// Canonical magnitude in the base unit of `dim` (or the clock text).
    pub key: String,
    /// What it measures.
    pub dim: Dim,
    /// For a bare count, the noun counted (`12 partitions` -> `partition`), else empty.
    pub noun: String,
}

/// Mutually exclusive qualifiers: two findings naming different members of one class are
/// about different things (CPU vs memory, p50 vs p99).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// cpu, memory, disk, network, address (cloud quotas: vCPUs vs IP addresses).
    Resource,
    /// p50, p90, p95, p99, p999.
    Percentile,
    /// States a thing is counted in: pending, ready, unacked, unassigned, relocating,
    /// terminating, idle, busy, ... ("3 pods pending" is not "3 pods evicted").
    State,
    /// Deployment environments: prod, staging, canary, dev, sandbox ("2.14.1 deployed to
    /// canary" is not "2.14.1 deployed to staging").
    Environment,
}

/// The comparison signature of a finding: what [`crate::synth::dedup`] scores.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Signature {
    /// Content words: stopwords dropped, lightly stemmed, synonyms mapped to one word;
    /// sorted, deduplicated.
    pub words: Vec<String>,
    /// Numbers with units normalized; sorted, deduplicated.
    pub values: Vec<Value>,
    /// Identifier tokens (containing a digit or a dot: host names, versions, node names,
    /// code references); sorted, deduplicated.
    pub ids: Vec<String>,
    /// Members of exclusive classes named; sorted, deduplicated.
    pub classes: Vec<(Class, String)>,
    /// Names of things (hyphenated or snake_case words other than identifiers, e.g.
    /// `fraud-check`, `order_items`); sorted, deduplicated. Used to tell entities apart
    /// when looking for contradictions.
    pub names: Vec<String>,
    /// The finding is negated (an odd number of negations: no, not, never, without, ...).
    pub negated: bool,
    /// The finding names a bound (limit, max, cap, quota, min).
    pub bound: bool,
    /// The values' canonical keys, sorted, deduplicated (precomputed: compared often).
    pub value_keys: Vec<String>,
    /// The members of `classes`, sorted, deduplicated (precomputed: compared often).
    pub class_members: Vec<String>,
}

/// The comparison signature of a finding's text (the subject's own name, when the text
/// mentions it, is kept as a word; the deduper gives it less weight).
pub fn signature(text: &str) -> Signature {
    let raw = raw_tokens(text);
    // Multi-word phrases to one canonical word.
    let mut toks: Vec<Tok> = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if let Some((n, rep)) = phrase_at(&raw, i) {
            toks.push(Tok::Word(rep.to_string(), false));
            i += n;
            continue;
        }
        toks.push(raw[i].clone());
        i += 1;
    }
    let mut sig = Signature::default();
    let mut negs = 0u32;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Num(n, suffix) => {
                let (mut n, suffix) = (*n, suffix.clone());
                let prev = if i > 0 { toks.get(i - 1) } else { None };
                let next = toks.get(i + 1);
                let word_is = |t: Option<&Tok>, set: &[&str]| matches!(t, Some(Tok::Word(w, _)) if set.contains(&w.as_str()));
                let integer = suffix.is_empty() && n.fract() == 0.0;
                // `broker 2`, `node 3`: a number naming an entity is an identifier.
                if integer && word_is(prev, ENTITY_NOUNS) {
                    if let Some(Tok::Word(w, _)) = prev {
                        sig.ids.push(format!("{w}#{}", num_key(n)));
                    }
                    i += 1;
                    continue;
                }
                // `HTTP 503`, `502 Bad Gateway`: a status code is categorical.
                if integer
                    && (100.0..600.0).contains(&n)
                    && (word_is(prev, HTTP_WORDS) || word_is(next, HTTP_WORDS))
                {
                    sig.values.push(Value {
                        key: num_key(n),
                        dim: Dim::Status,
                        noun: String::new(),
                    });
                    i += 1;
                    continue;
                }
                let mut unit = suffix.clone();
                // A unit written as the next word: `45 seconds`, `12 percent`.
                if unit.is_empty() {
                    if let Some(Tok::Word(w, _)) = toks.get(i + 1) {
                        if unit_of(w).is_some() {
                            unit = w.clone();
                            i += 1;
                        }
                    }
                }
                if unit == "k" {
                    n *= 1e3;
                    unit.clear();
                }
                match unit_of(&unit) {
                    Some((dim, f)) => sig.values.push(Value {
                        key: num_key(n * f),
                        dim,
                        noun: String::new(),
                    }),
                    None if unit.is_empty() => {
                        let noun = match toks.get(i + 1) {
                            Some(Tok::Word(w, _)) if !is_stopword(w) && !is_negator(w) => canon(w),
                            _ => String::new(),
                        };
                        sig.values.push(Value {
                            key: num_key(n),
                            dim: Dim::Bare,
                            noun,
                        })
                    }
                    None => sig.values.push(Value {
                        key: format!("{}{}", num_key(n), unit),
                        dim: Dim::Other,
                        noun: String::new(),
                    }),
                }
            }
            Tok::Clock(c) => sig.values.push(Value {
                key: c.clone(),
                dim: Dim::Clock,
                noun: String::new(),
            }),
            Tok::Id(s) => {
                if let Some(p) = percentile(s) {
                    sig.classes.push((Class::Percentile, p));
                } else if s.starts_with(|c: char| c.is_ascii_digit())
                    && s.ends_with("xx")
                    && s.len() == 3
                {
                    sig.words.push("error".to_string());
                } else {
                    sig.ids.push(s.clone());
                }
            }
            Tok::Word(w, camel_part) => {
                if let Some(name) = w.strip_prefix("_name:") {
                    sig.names.push(name.to_string());
                } else if let Some(p) = percentile(w) {
                    sig.classes.push((Class::Percentile, p));
                } else if !camel_part && is_negator(w) {
                    negs += 1;
                } else if let Some(n) = number_word(w) {
                    // `three days`: re-run as a number.
                    let unit = match toks.get(i + 1) {
                        Some(Tok::Word(u, _)) if unit_of(u).is_some() => {
                            i += 1;
                            u.clone()
                        }
                        _ => String::new(),
                    };
                    let (dim, f) = unit_of(&unit).unwrap_or((Dim::Bare, 1.0));
                    sig.values.push(Value {
                        key: num_key(n * f),
                        dim,
                        noun: String::new(),
                    });
                } else if let Some(r) = ratio_word(w) {
                    sig.values.push(Value {
                        key: num_key(r),
                        dim: Dim::Ratio,
                        noun: String::new(),
                    });
                } else if !is_stopword(w) {
                    if w.contains('-') {
                        sig.names.push(w.clone());
                    }
                    if w.len() > 3 && w.starts_with("max") || w.starts_with("min_") {
                        sig.bound = true;
                    }
                    let c = canon(w);
                    // `min` alone is as often a minute (`req/min`) as a minimum.
                    if matches!(c.as_str(), "limit" | "max" | "cap" | "quota")
                        || (c == "min" && w != "min")
                    {
                        sig.bound = true;
                    }
                    if let Some(r) = resource(&c) {
                        sig.classes.push((Class::Resource, r.to_string()));
                    }
                    if is_state(&c) {
                        sig.classes.push((Class::State, c.clone()));
                    }
                    if let Some(env) = environment(w) {
                        sig.classes.push((Class::Environment, env.to_string()));
                    }
                    if c == "median" {
                        sig.classes.push((Class::Percentile, "p50".to_string()));
                    } else if !c.is_empty() {
                        sig.words.push(c);
                    }
                }
            }
        }
        i += 1;
    }
    sig.negated = negs % 2 == 1;
    sig.words.sort();
    sig.words.dedup();
    sig.values.sort();
    sig.values.dedup();
    sig.ids.sort();
    sig.ids.dedup();
    sig.classes.sort();
    sig.classes.dedup();
    sig.names.sort();
    sig.names.dedup();
    sig.value_keys = sig.values.iter().map(|v| v.key.clone()).collect();
    sig.value_keys.sort();
    sig.value_keys.dedup();
    sig.class_members = sig.classes.iter().map(|(_, m)| m.clone()).collect();
    // Sorted: compared by a merge walk.
    sig.class_members.sort();
    sig.class_members.dedup();
    sig
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// A lowercase word; `true` when it came from splitting a CamelCase word.
    Word(String, bool),
    /// A number and the unit letters glued to it (`45s`, `512mi`, `12%`).
    Num(f64, String),
    /// A time of day.
    Clock(String),
    /// An identifier kept whole.
    Id(String),
}

/// Splits a text into tokens, keeping identifiers (`gke-prod-pool-1-a3f`,
/// `orders-db.internal`, `2026.11.22-3`) and numbers with units (`512Mi`, `3,214`) whole.
fn raw_tokens(text: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut cleaned = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        // A URL path (`/api/cart`, `/static/*`) names one endpoint: keep it whole.
        let path = word
            .trim_start_matches(|c: char| "(\"'`[".contains(c))
            .trim_end_matches(|c: char| !c.is_alphanumeric());
        if path.len() > 1
            && path.starts_with('/')
            && path
                .chars()
                .all(|c| c.is_alphanumeric() || "/-_.".contains(c))
        {
            out.push(Tok::Id(path.to_lowercase()));
            continue;
        }
        cleaned.extend(word.chars().map(|c| {
            if c.is_alphanumeric() || "-._:,%'".contains(c) {
                c
            } else {
                ' '
            }
        }));
        cleaned.push(' ');
    }
    for chunk in cleaned.split(' ') {
        // Split on ',' and ':' unless between digits (thousands, clock times).
        let cs: Vec<char> = chunk.chars().collect();
        let mut piece = String::new();
        for (k, &c) in cs.iter().enumerate() {
            let between_digits = k > 0
                && cs[k - 1].is_ascii_digit()
                && cs.get(k + 1).is_some_and(|d| d.is_ascii_digit());
            if (c == ',' || c == ':') && !between_digits {
                push_piece(&mut out, &piece);
                piece.clear();
            } else {
                piece.push(c);
            }
        }
        push_piece(&mut out, &piece);
    }
    out
}

fn push_piece(out: &mut Vec<Tok>, piece: &str) {
    let p = piece.trim_matches(|c: char| "-._:,'".contains(c));
    if p.is_empty() {
        return;
    }
    let lower = p.to_lowercase();
    // Thousands separators: `3,214`, `250,000`.
    let unsep: String = if is_thousands(&lower) {
        lower.replace(',', "")
    } else if lower.contains(',') {
        for part in p.split(',') {
            push_piece(out, part);
        }
        return;
    } else {
        lower.clone()
    };
    if let Some(t) = parse_number(&unsep) {
        out.push(t);
        return;
    }
    if is_clock(&unsep) {
        out.push(Tok::Clock(unsep));
        return;
    }
    // `java.lang.NullPointerException`: a package path stands for its class name (which
    // starts with a capital; `shop.example.com` is a host name, kept whole).
    let segs: Vec<&str> = p.split('.').collect();
    if segs.len() >= 3
        && segs[segs.len() - 1].starts_with(|c: char| c.is_ascii_uppercase())
        && segs[..segs.len() - 1]
            .iter()
            .all(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase()))
        && segs[segs.len() - 1]
            .chars()
            .all(|c| c.is_ascii_alphabetic())
    {
        push_piece(out, segs[segs.len() - 1]);
        return;
    }
    let has_digit = unsep.chars().any(|c| c.is_ascii_digit());
    let dotted = unsep.contains('.');
    if has_digit || dotted {
        out.push(Tok::Id(unsep.replace('\'', "")));
        return;
    }
    if p.contains('\'') {
        // `doesn't` -> `doesnt`; quotes around words dropped.
        let w = lower.replace('\'', "");
        out.push(Tok::Word(w, false));
        return;
    }
    if p.contains('_') {
        out.push(Tok::Word(format!("_name:{lower}"), false));
        // snake_case: `evicted_keys`, `max_connections` -> its words.
        for part in lower.split('_').filter(|x| !x.is_empty()) {
            out.push(Tok::Word(part.to_string(), false));
        }
        return;
    }
    if p.contains('-') || p.chars().all(|c| !c.is_uppercase()) {
        out.push(Tok::Word(lower, false));
        return;
    }
    // CamelCase: `NullPointerException`, `OOMKilled`, `DiskPressure`.
    let cs: Vec<char> = p.chars().collect();
    let mut parts: Vec<String> = Vec::new();
    let mut cur = String::new();
    for k in 0..cs.len() {
        let c = cs[k];
        let boundary = k > 0
            && c.is_uppercase()
            && (cs[k - 1].is_lowercase()
                || (cs[k - 1].is_uppercase() && cs.get(k + 1).is_some_and(|n| n.is_lowercase())));
        if boundary && !cur.is_empty() {
            parts.push(std::mem::take(&mut cur));
        }
        cur.extend(c.to_lowercase());
    }
    if !cur.is_empty() {
        parts.push(cur);
    }
    let camel = parts.len() > 1;
    for w in parts {
        out.push(Tok::Word(w, camel));
    }
}

fn is_thousands(s: &str) -> bool {
    let mut groups = s.split(',');
    let first = groups.next().unwrap_or("");
    if !s.contains(',') || first.is_empty() || first.len() > 3 {
        return false;
    }
    if !first.chars().all(|c| c.is_ascii_digit()) {
        return false;
    }
    let rest: Vec<&str> = groups.collect();
    let n = rest.len();
    rest.iter().enumerate().all(|(k, g)| {
        let digits: String = g.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.len() == 3 && (k + 1 == n || digits.len() == g.len())
    })
}

fn is_clock(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 2 && p.chars().all(|c| c.is_ascii_digit()))
}

/// `45`, `2.4s`, `512mi`, `12%`, `250k`, `1.0`: a number with an optional unit suffix made
/// of letters (or `%`). Anything else (`2026.11.22-3`, `a3f`, `5xx` with a digit inside a
/// name) is not a number.
fn parse_number(s: &str) -> Option<Tok> {
    let bytes = s.as_bytes();
    let mut k = 0;
    while k < bytes.len() && (bytes[k].is_ascii_digit() || bytes[k] == b'.') {
        k += 1;
    }
    let (num, suffix) = s.split_at(k);
    if num.is_empty() || !num.as_bytes()[0].is_ascii_digit() || num.matches('.').count() > 1 {
        return None;
    }
    if num.ends_with('.') {
        return None;
    }
    let n: f64 = num.parse().ok()?;
    let suffix = suffix.to_string();
    if suffix.is_empty() || suffix == "%" {
        return Some(Tok::Num(n, suffix));
    }
    if suffix.chars().all(|c| c.is_ascii_alphabetic())
        && (unit_of(&suffix).is_some() || suffix == "k" || suffix == "m")
    {
        return Some(Tok::Num(n, suffix));
    }
    None
}

/// Unit word or suffix -> (dimension, factor to the base unit).
pub(crate) fn unit_of(u: &str) -> Option<(Dim, f64)> {
    Some(match u {
        "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => (Dim::Time, 1.0),
        "s" | "sec" | "secs" | "second" | "seconds" => (Dim::Time, 1e3),
        "min" | "mins" | "minute" | "minutes" => (Dim::Time, 60e3),
        "h" | "hr" | "hrs" | "hour" | "hours" => (Dim::Time, 3600e3),
        "d" | "day" | "days" => (Dim::Time, 86400e3),
        "w" | "week" | "weeks" => (Dim::Time, 7.0 * 86400e3),
        "%" | "percent" | "pct" => (Dim::Percent, 1.0),
        "b" | "bytes" => (Dim::Bytes, 1.0),
        "kb" => (Dim::Bytes, 1e3),
        "mb" => (Dim::Bytes, 1e6),
        "gb" => (Dim::Bytes, 1e9),
        "tb" => (Dim::Bytes, 1e12),
        "ki" | "kib" => (Dim::Bytes, 1024.0),
        "mi" | "mib" => (Dim::Bytes, 1024.0 * 1024.0),
        "gi" | "gib" => (Dim::Bytes, 1024.0 * 1024.0 * 1024.0),
        "ti" | "tib" => (Dim::Bytes, 1024.0 * 1024.0 * 1024.0 * 1024.0),
        "x" => (Dim::Ratio, 1.0),
        _ => return None,
    })
}

/// Canonical text of a magnitude: integers without a fraction, others with at most 6
/// decimals, trailing zeros dropped (`1.0` -> `1`, `2.4 * 1000` -> `2400`).
pub(crate) fn num_key(x: f64) -> String {
    let r = (x * 1e6).round() / 1e6;
    if r.fract() == 0.0 && r.abs() < 1e15 {
        format!("{}", r as i64)
    } else {
        let s = format!("{r:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn number_word(w: &str) -> Option<f64> {
    Some(match w {
        "two" => 2.0,
        "three" => 3.0,
        "four" => 4.0,
        "five" => 5.0,
        "six" => 6.0,
        "seven" => 7.0,
        "eight" => 8.0,
        "nine" => 9.0,
        "ten" => 10.0,
        "eleven" => 11.0,
        "twelve" => 12.0,
        "zero" => 0.0,
        _ => return None,
    })
}

fn ratio_word(w: &str) -> Option<f64> {
    Some(match w {
        "doubled" | "doubles" | "doubling" => 2.0,
        "tripled" | "triples" | "tripling" => 3.0,
        "halved" | "halves" | "halving" => 0.5,
        _ => return None,
    })
}

/// `p99` -> `p99`; `99th` is handled as a phrase (`99th percentile`).
fn percentile(s: &str) -> Option<String> {
    let d = s.strip_prefix('p')?;
    (!d.is_empty() && d.len() <= 4 && d.chars().all(|c| c.is_ascii_digit())).then(|| s.to_string())
}

fn is_negator(w: &str) -> bool {
    matches!(
        w,
        "no" | "not"
            | "never"
            | "without"
            | "none"
            | "nothing"
            | "cannot"
            | "missing"
            | "lacks"
            | "lacking"
            | "absent"
    ) || (w.len() > 3 && w.ends_with("nt") && NT_FORMS.contains(&w))
}

/// Nouns a following integer identifies (`broker 2`).
pub(crate) const ENTITY_NOUNS: &[&str] = &[
    "broker",
    "node",
    "shard",
    "host",
    "server",
    "worker",
    "instance",
    "zone",
    "region",
    "rack",
    "az",
    "dc",
    "datacenter",
    "cluster",
    "replica",
    "partition",
    "pod",
    "vm",
];

/// Words next to which a number in 100..600 is an HTTP status code.
pub(crate) const HTTP_WORDS: &[&str] = &[
    "http",
    "https",
    "status",
    "code",
    "codes",
    "gateway",
    "unavailable",
    "bad",
    "errors",
    "error",
    "returns",
    "return",
    "responds",
    "response",
    "responses",
    "not",
    "internal",
    "too",
    "forbidden",
    "unauthorized",
];

/// Canonical words that describe how a value moves or compares, not what is measured:
/// they count for similarity but not for the topic of a contradiction.
pub const TREND_WORDS: &[&str] = &[
    "rise", "drop", "steady", "flat", "stable", "normal", "reach", "stay", "below", "under",
    "above", "elevat", "high", "low", "spik", "unchang", "still",
];

const NT_FORMS: &[&str] = &[
    "doesnt", "dont", "didnt", "isnt", "arent", "wasnt", "werent", "cant", "couldnt", "wont",
    "wouldnt", "hasnt", "havent", "hadnt", "shouldnt",
];

fn is_stopword(w: &str) -> bool {
    STOPWORDS.binary_search(&w).is_ok()
}

/// Function words and filler adverbs; sorted (binary search).
const STOPWORDS: &[&str] = &[
    "a",
    "about",
    "according",
    "after",
    "again",
    "against",
    "ago",
    "all",
    "almost",
    "already",
    "also",
    "am",
    "an",
    "and",
    "any",
    "approximately",
    "are",
    "around",
    "as",
    "at",
    "be",
    "because",
    "been",
    "being",
    "both",
    "but",
    "by",
    "can",
    "could",
    "currently",
    "did",
    "do",
    "does",
    "due",
    "during",
    "each",
    "every",
    "for",
    "from",
    "get",
    "gets",
    "got",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "here",
    "his",
    "how",
    "http",
    "https",
    "i",
    "if",
    "immediately",
    "in",
    "indicate",
    "indicates",
    "into",
    "is",
    "it",
    "its",
    "just",
    "made",
    "make",
    "makes",
    "many",
    "more",
    "most",
    "mostly",
    "much",
    "nearly",
    "now",
    "observed",
    "of",
    "on",
    "one",
    "only",
    "or",
    "other",
    "our",
    "out",
    "over",
    "per",
    "rate",
    "really",
    "reason",
    "report",
    "reported",
    "reports",
    "right",
    "roughly",
    "said",
    "same",
    "says",
    "see",
    "seen",
    "sees",
    "set",
    "she",
    "show",
    "showed",
    "shown",
    "shows",
    "since",
    "so",
    "some",
    "still",
    "such",
    "take",
    "takes",
    "than",
    "that",
    "the",
    "their",
    "them",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "times",
    "to",
    "too",
    "took",
    "true",
    "up",
    "upon",
    "us",
    "user",
    "users",
    "very",
    "via",
    "vs",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "why",
    "will",
    "with",
    "within",
    "would",
    "yes",
    "you",
    "your",
];

/// Multi-word phrases mapped to one word, matched on raw tokens at `i`.
fn phrase_at(toks: &[Tok], i: usize) -> Option<(usize, &'static str)> {
    const PHRASES: &[(&[&str], &str)] = &[
        (&["maxed", "out"], "exhausted"),
        (&["max", "out"], "exhausted"),
        (&["in", "use"], "busy"),
        (&["oom", "killed"], "oomkill"),
        (&["oom", "killer"], "oomkill"),
        (&["oom", "kill"], "oomkill"),
        (&["out", "of", "memory"], "oomkill"),
        (&["went", "live"], "deploy"),
        (&["go", "live"], "deploy"),
        (&["rolled", "out"], "deploy"),
        (&["roll", "out"], "deploy"),
        (&["rolling", "out"], "deploy"),
        (&["turned", "on"], "enable"),
        (&["switched", "on"], "enable"),
        (&["turned", "off"], "disable"),
        (&["switched", "off"], "disable"),
        (&["timed", "out"], "timeout"),
        (&["time", "out"], "timeout"),
        (&["times", "out"], "timeout"),
        (&["rate", "limiter"], "throttle"),
        (&["rate", "limiting"], "throttle"),
        (&["rate", "limited"], "throttle"),
        (&["rate", "limit"], "ratelimit"),
        (&["hit", "rate"], "hitratio"),
        (&["hit", "ratio"], "hitratio"),
        (&["null", "pointer", "exception"], "npe"),
        (&["under", "disk", "pressure"], "diskpressure"),
        (&["disk", "pressure"], "diskpressure"),
        (&["not", "ready"], "notready"),
        (&["stop", "the", "world"], "stw"),
        (&["now", "and", "then"], "intermittent"),
        (&["too", "many", "requests"], "throttle"),
        (&["service", "unavailable"], ""),
        (&["bad", "gateway"], ""),
        (&["gateway", "timeout"], "timeout"),
        (&["internal", "server", "error"], "error"),
        (&["from", "time", "to", "time"], "intermittent"),
        (&["look", "up"], "resolve"),
        (&["looking", "up"], "resolve"),
        (&["looks", "up"], "resolve"),
    ];
    for (words, rep) in PHRASES {
        if i + words.len() <= toks.len()
            && words
                .iter()
                .enumerate()
                .all(|(k, w)| matches!(&toks[i + k], Tok::Word(t, _) if t == w))
        {
            return Some((words.len(), rep));
        }
    }
    // `99th percentile` -> p99.
    if let (Some(Tok::Id(a)), Some(Tok::Word(b, _))) = (toks.get(i), toks.get(i + 1)) {
        if b == "percentile" {
            if let Some(d) = a
                .strip_suffix("th")
                .filter(|d| d.chars().all(|c| c.is_ascii_digit()))
            {
                return Some((2, leak_percentile(d)));
            }
        }
    }
    None
}

fn leak_percentile(d: &str) -> &'static str {
    match d {
        "50" => "median",
        "90" => "p90",
        "95" => "p95",
        "99" => "p99",
        "999" => "p999",
        _ => "percentile",
    }
}

/// Light stemming: plural and verb endings, a final `e`, a doubled final consonant.
pub fn stem(w: &str) -> String {
    if w.len() < 4 || !w.chars().all(|c| c.is_ascii_alphabetic()) {
        return w.to_string();
    }
    let mut s = w.to_string();
    if s.len() > 6 {
        if let Some(b) = s.strip_suffix("ly") {
            s = b.to_string();
        }
    }
    if let Some(b) = s.strip_suffix("ies") {
        s = format!("{b}y");
    } else if let Some(b) = s.strip_suffix("ing").filter(|b| b.len() >= 3) {
        s = b.to_string();
    } else if let Some(b) = s.strip_suffix("ed").filter(|b| b.len() >= 3) {
        s = b.to_string();
    } else if s.ends_with('s') && !s.ends_with("ss") && !s.ends_with("us") && !s.ends_with("is") {
        s.pop();
    }
    if s.len() > 3 && s.ends_with('e') {
        s.pop();
    }
    let b = s.as_bytes();
    let n = b.len();
    if n > 3 && b[n - 1] == b[n - 2] && !b"aeiouls".contains(&b[n - 1]) {
        s.pop();
    }
    s
}

/// Stems `w` and maps it to its synonym group's word (generic SRE vocabulary).
fn canon(w: &str) -> String {
    let s = stem(w);
    synonyms().get(&s).map(|c| c.to_string()).unwrap_or(s)
}

/// Synonym groups: canonical word, then words (any inflection) mapped to it. Generic SRE
/// vocabulary only; a word belongs to one group (checked by a test).
#[rustfmt::skip]
const SYNONYM_GROUPS: &[(&str, &[&str])] = &[
    ("exhaust", &["exhausted", "saturated", "depleted", "pegged", "pinned"]),
    ("busy", &["active", "occupied"]),
    ("lag", &["lagging", "behind", "lags", "delay", "delayed"]),
    ("replica", &["replication", "replicas", "replicated"]),
    ("deploy", &["deployment", "deployed", "release", "released", "releases", "rollout", "rollouts"]),
    ("listen", &["serving", "serves", "serve", "bound", "binds", "exposes"]),
    ("error", &["errors", "failure", "failures", "fail", "fails", "failed", "failing"]),
    ("request", &["requests", "req", "reqs", "call", "calls", "traffic", "queries", "query"]),
    ("rise", &["rose", "jumped", "climbed", "increased", "spiked", "spiking", "grew", "grown", "went"]),
    ("drop", &["dropped", "fell", "fallen", "decreased", "down"]),
    ("start", &["started", "began", "begun", "onset", "starting", "beginning"]),
    ("timeout", &["timeouts", "timed"]),
    ("close", &["closes", "closing", "closed", "freed", "free"]),
    ("restart", &["restarts", "restarted", "restarting", "crashloop", "crashloopbackoff"]),
    ("usage", &["utilization", "utilisation", "full", "capacity", "used"]),
    ("disk", &["volume", "storage"]),
    ("memory", &["mem", "ram"]),
    ("normal", &["usual", "usually", "normally", "baseline", "typical", "typically"]),
    ("cert", &["certificate", "certificates", "certs"]),
    ("expire", &["expires", "expiry", "expiration", "expiring"]),
    ("node", &["kubelet", "nodes", "host", "hosts"]),
    ("throttle", &["throttled", "throttling"]),
    ("hpa", &["autoscaler", "autoscaling"]),
    ("cap", &["caps", "capped", "ceiling"]),
    ("limit", &["limits", "limited"]),
    ("max", &["maximum"]),
    ("min", &["minimum"]),
    ("slow", &["slowness", "latency", "latencies", "slowdown"]),
    ("index", &["indexed", "indexes", "indices"]),
    ("evict", &["evicted", "evicting", "evicts", "eviction", "evictions"]),
    ("succeed", &["succeeds", "success", "successful", "accept", "accepts", "accepted"]),
    ("intermittent", &["intermittently", "sporadic", "sporadically", "occasional", "occasionally", "flaky", "flapping"]),
    ("resolve", &["resolving", "resolves", "resolution", "lookup", "lookups"]),
    ("return", &["returns", "returned", "returning", "respond", "responds", "responded", "responding", "gives", "give"]),
    ("throw", &["thrown", "throws", "raise", "raised", "raises"]),
    ("recent", &["last", "past", "previous"]),
    ("connection", &["connections", "handshake", "handshakes", "conn", "conns"]),
];

fn synonyms() -> &'static std::collections::HashMap<String, &'static str> {
    static MAP: std::sync::OnceLock<std::collections::HashMap<String, &'static str>> =
        std::sync::OnceLock::new();
    MAP.get_or_init(|| {
        let mut m = std::collections::HashMap::new();
        for (c, words) in SYNONYM_GROUPS {
            m.insert(stem(c), *c);
            for w in *words {
                m.insert(stem(w), *c);
            }
        }
        m
    })
}

/// Canonical words naming the state counted things are in (exclusive: a count of pending
/// pods is not a count of evicted ones).
/// The deployment environment a word names, in one form.
fn environment(w: &str) -> Option<&'static str> {
    Some(match w {
        "prod" | "production" | "prd" => "prod",
        "staging" | "stg" => "staging",
        "canary" | "canaries" => "canary",
        "dev" | "development" => "dev",
        "sandbox" => "sandbox",
        _ => return None,
    })
}

fn is_state(c: &str) -> bool {
    matches!(
        c,
        "pend"
            | "ready"
            | "notready"
            | "unack"
            | "unassign"
            | "relocat"
            | "initializ"
            | "terminat"
            | "evict"
            | "idle"
            | "busy"
    )
}

fn resource(c: &str) -> Option<&'static str> {
    Some(match c {
        "cpu" | "vcpu" | "core" => "cpu",
        "ip" | "address" => "address",
        "memory" => "memory",
        "disk" => "disk",
        "network" | "bandwidth" => "network",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(t: &str) -> Vec<String> {
        signature(t).values.into_iter().map(|v| v.key).collect()
    }

    #[test]
    fn normalize_and_exact_key() {
        assert_eq!(
            normalize("  Orders-DB  pool\tExhausted. "),
            "orders-db pool exhausted"
        );
        assert_eq!(normalize("x..."), "x");
        assert_eq!(
            exact_key("s", "Pool  exhausted."),
            exact_key("s", "pool exhausted")
        );
        assert_ne!(
            exact_key("s", "pool exhausted"),
            exact_key("t", "pool exhausted")
        );
        assert_ne!(exact_key("", "a b"), exact_key("a", "b"));
    }

    #[test]
    fn identifiers_are_kept_whole() {
        let s = signature("node gke-prod-pool-1-a3f reports DiskPressure=True");
        assert_eq!(s.ids, vec!["gke-prod-pool-1-a3f".to_string()]);
        let s = signature("SERVFAIL resolving orders-db.internal after deploy 2026.11.22-3.");
        assert!(s.ids.contains(&"orders-db.internal".to_string()));
        assert!(s.ids.contains(&"2026.11.22-3".to_string()));
        let s = signature("fails in OrderMapper.toDto");
        assert_eq!(s.ids, vec!["ordermapper.todto".to_string()]);
        // A package path stands for its class name.
        assert_eq!(
            signature("java.lang.NullPointerException").words,
            signature("NullPointerException").words
        );
        // Host names are not package paths; URL paths are kept whole.
        assert_eq!(
            signature("shop.example.com cert expires").ids,
            vec!["shop.example.com".to_string()]
        );
        assert_eq!(
            signature("ingress 502 on /api/cart, (/static/*)").ids,
            vec!["/api/cart".to_string(), "/static".to_string()]
        );
        // `broker 2` names an entity.
        assert_eq!(
            signature("broker 2 is down").ids,
            vec!["broker#2".to_string()]
        );
    }

    #[test]
    fn numbers_and_units_are_normalized() {
        assert_eq!(keys("lag 45s"), vec!["45000"]);
        assert_eq!(keys("lag 45 seconds"), vec!["45000"]);
        assert_eq!(keys("lag 45 s"), vec!["45000"]);
        assert_eq!(keys("p99 2.4s"), keys("p99 2400 ms"));
        assert_eq!(keys("12%"), keys("12 percent"));
        assert_eq!(keys("3,214 times"), vec!["3214"]);
        assert_eq!(keys("250k messages"), keys("250,000 messages"));
        assert_eq!(keys("limit 512Mi"), vec![(512u64 << 20).to_string()]);
        assert_eq!(keys("limit 1Gi"), vec![(1u64 << 30).to_string()]);
        assert_eq!(keys("TLS 1.0"), vec!["1"]);
        assert_eq!(keys("three days"), keys("3 days"));
        assert_eq!(keys("at 14:01"), vec!["14:01"]);
        let mut k = keys("100/100 connections");
        k.dedup();
        assert_eq!(k, vec!["100"]);
        let s = signature("12 partitions");
        assert_eq!(s.values[0].noun, "partition");
        assert_eq!(signature("HTTP 503").values[0].dim, Dim::Status);
    }

    #[test]
    fn synonyms_stems_and_classes() {
        let w = |t: &str| signature(t).words;
        assert_eq!(w("pool exhausted"), w("pool saturated"));
        assert_eq!(w("pool exhausted"), w("pool maxed out"));
        assert_eq!(w("pods OOMKilled"), w("pods OOM killed"));
        assert_eq!(w("connections are leaking"), w("connection leaks"));
        assert_eq!(stem("retries"), "retry");
        assert_eq!(stem("lagging"), "lag");
        assert_eq!(stem("closes"), stem("closed"));
        let c = |t: &str| signature(t).classes;
        assert_eq!(c("p99 latency"), c("99th percentile latency"));
        assert_eq!(c("median latency"), c("p50 latency"));
        assert_ne!(c("cpu at 97%"), c("memory at 97%"));
        assert!(signature("does not accept TLS 1.0").negated);
        assert!(!signature("accepts TLS 1.0").negated);
        assert!(!signature("3 nodes NotReady").negated);
        assert!(signature("memory limit of 512Mi").bound);
        assert!(!signature("1000 req/min").bound);
        assert!(signature("minimum of 2 replicas").bound);
        assert_ne!(c("3 pods pending"), c("3 pods evicted"));
        assert_eq!(c("40k ready messages"), c("40,000 messages ready"));
    }

    #[test]
    fn synonym_groups_do_not_overlap() {
        let mut seen = std::collections::HashMap::new();
        for (c, words) in SYNONYM_GROUPS {
            for w in words.iter().chain(std::iter::once(c)) {
                if let Some(prev) = seen.insert(stem(w), *c) {
                    assert_eq!(prev, *c, "{w} is in two groups");
                }
            }
        }
    }

    #[test]
    fn odd_input_does_not_panic() {
        for t in [
            "",
            " ",
            "...",
            "1.2.3",
            "99999999999999999999999999s",
            "1e5",
            "a,b,,c",
            ":::",
            "é漢字 ñ 12ΩΩ",
            "'quoted' -x- _y_",
            "1,2345",
            "p",
            "0x1F",
            "5xx",
            "max_",
        ] {
            let _ = signature(t);
            let _ = exact_key("s", t);
        }
    }
}
