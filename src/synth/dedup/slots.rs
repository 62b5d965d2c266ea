//! Typed slots of a wording for the semantic mode: what a statement is about (its
//! anchors: hosts, services, versions, paths, proper names), the quantities it states,
//! and its stance, compared as evidence *for* the same fact as well as against it.
//!
//! CONTRACT: semantic mode only (the lexical mode never calls this, so its behaviour and
//! speed do not change). Pure and deterministic: [`Slots::of`] of the same text gives the
//! same slots.
//!
//! # Method
//! 1. The wording is first rewritten by generic measurement rules ([`measure_text`]):
//!    percentile forms (`99th percentile`, `99th pct` -> `p99`), `response time` ->
//!    `latency`, magnitudes (`1.2M`, `1.2 million`, `12.5 thousand`, `34B` -> the
//!    number), proportions (`0.41 of` -> `41% of`), rates (`120/s`, `120 every second`,
//!    `7,200 per minute` -> one per-second number), scientific notation (`5e-5`),
//!    versions (`v2.14.0` -> `2.14.0`), `host:port` -> `host port N`, clock ranges
//!    (`11:10-11:35Z` -> `11:10 to 11:35`). Then its lexical [`Signature`] is taken
//!    from that text, so `0.41 of lookups` and `41 percent` state one value.
//! 2. Anchors: the signature's identifiers and names (`pg-orders-01`, `203.0.113.45`,
//!    `/login`, `m_2210`). Two anchors agree when equal or when one's dotted/dashed
//!    parts meet the other's (`sso` in `sso.example.com`).
//! 3. Proper names ([`proper_names`]): words with an inner capital (`iOS`, `FoodHub`,
//!    `NaturalQuestions`) or capitalised inside a sentence (`Android`, `Muller`); all-caps
//!    acronyms and months are left out (paraphrases expand `SSO`, `GC`, `Jul` freely).
//!    Each side naming one the other lacks (`iOS` vs `Android`) is a guard.

use std::borrow::Cow;

use regex::{Captures, Regex};

use crate::synth::text::{self, Signature};

/// What the semantic mode compares of one wording.
#[derive(Clone, Debug)]
pub(crate) struct Slots {
    /// The lexical signature of the measurement-normalised text.
    pub(crate) sig: Signature,
    /// Proper names (lowercased, sorted, deduplicated).
    pub(crate) names: Vec<String>,
    /// Entity-like tokens: identifiers, names, acronyms and proper names, lowercased, with
    /// their dotted/dashed/CamelCase parts and stems (sorted, deduplicated).
    pub(crate) entities: Vec<String>,
    /// Where the statement stands.
    pub(crate) stance: Stance,
    /// A causal claim's two sides, as content words: (what happened, its cause).
    pub(crate) cause: Option<(Vec<String>, Vec<String>)>,
}

impl Slots {
    /// The slots of `text`.
    pub(crate) fn of(text: &str) -> Slots {
        let m = measure_text(text);
        let mut sig = text::signature(&m);
        // `shard=3` (an entity noun and its number: `shard#3`) and `shard 3` (rewritten
        // `shard-3` above) name one thing.
        if sig.ids.iter().any(|i| i.contains('#')) {
            for i in &mut sig.ids {
                *i = i.replace('#', "-");
            }
            sig.ids.sort();
            sig.ids.dedup();
        }
        Slots {
            sig,
            names: proper_names(text),
            entities: entities(&m),
            stance: stance(text),
            cause: cause(text),
        }
    }

    /// Whether the statement states any value.
    pub(crate) fn has_values(&self) -> bool {
        !self.sig.values.is_empty()
    }
}

fn parts(a: &str) -> impl Iterator<Item = &str> {
    a.split(['.', '-', '_', '/', ':', '#'])
        .filter(|p| p.len() >= 2)
}

fn anchor_meets(a: &str, b: &str) -> bool {
    a == b || parts(a).any(|p| parts(b).any(|q| p == q))
}

/// The anchors (identifiers and names) of a signature.
fn anchors(s: &Signature) -> impl Iterator<Item = &str> {
    s.ids.iter().chain(s.names.iter()).map(String::as_str)
}

/// Whether the two name one anchor (equal, or sharing a dotted/dashed part).
pub(crate) fn share_anchor(a: &Slots, b: &Slots) -> bool {
    anchors(&a.sig).any(|x| anchors(&b.sig).any(|y| anchor_meets(x, y)))
}

fn name_meets(a: &str, b: &str) -> bool {
    a == b || (a.len() >= 3 && b.len() >= 3 && (a.contains(b) || b.contains(a)))
}

/// Each side has a proper name the other lacks (`iOS` vs `Android`); a name met inside
/// the other's identifiers (`BitmapFactory` in `BitmapFactory.decodeStream`) is not lacked.
pub(crate) fn names_conflict(a: &Slots, b: &Slots) -> bool {
    let lacks = |x: &Slots, y: &Slots| {
        x.names.iter().any(|n| {
            !y.names.iter().any(|m| name_meets(n, m))
                && !y
                    .entities
                    .iter()
                    .any(|e| anchor_meets(n, e) || name_meets(n, e))
        })
    };
    lacks(a, b) && lacks(b, a)
}

/// The content tokens (words, identifiers, values, qualifiers) each side has and the other lacks, leaving
/// out tokens that share a dotted/dashed part with one of the other side's
/// (`cluster-wide` / `cluster`), and how many both have.
fn unique_tokens<'a>(a: &'a Signature, b: &'a Signature) -> (Vec<&'a str>, Vec<&'a str>, usize) {
    let toks = |s: &'a Signature| -> Vec<&'a str> {
        let mut v: Vec<&str> = s
            .words
            .iter()
            .chain(&s.ids)
            .chain(&s.value_keys)
            .chain(&s.class_members)
            .map(String::as_str)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let (ta, tb) = (toks(a), toks(b));
    let shared = ta.iter().filter(|x| tb.binary_search(x).is_ok()).count();
    let only = |x: &[&'a str], y: &[&'a str]| -> Vec<&'a str> {
        x.iter()
            .filter(|t| y.binary_search(t).is_err())
            .copied()
            .collect()
    };
    let (oa, ob) = (only(&ta, &tb), only(&tb, &ta));
    let keep = |x: &[&'a str], y: &[&'a str]| -> Vec<&'a str> {
        x.iter()
            .filter(|t| !y.iter().any(|u| anchor_meets(t, u)))
            .copied()
            .collect()
    };
    (keep(&oa, &ob), keep(&ob, &oa), shared)
}

/// The two sides of a causal claim (`X was caused by Y`, `X due to Y`, `root cause of X:
/// Y`, `Y is behind X`, `Y turns out to be what broke X`), each as its content words
/// (words other than the claim's own: `issue`, `cause`...), when the wording makes one.
fn cause(text: &str) -> Option<(Vec<String>, Vec<String>)> {
    static PATTERNS: std::sync::OnceLock<[Regex; 3]> = std::sync::OnceLock::new();
    let [effect_first, root, cause_first] = PATTERNS.get_or_init(|| {
        [
            re(r"^(?P<e>.*?)\b(?:caused by|due to|because of|comes? down to|came down to|stems? from|stemm(?:ed|ing) from|traced (?:back )?to|triggered by|the result of)\b(?P<c>.*)$"),
            re(r"\b(?:root[- ]cause|rc)\b(?:\s+(?:of|for)\s+(?P<e>.*?))?\s*(?:\bis\b|\bwas\b|:|=)\s*(?P<c>.*)$"),
            re(r"^(?P<c>.*?)\b(?:is|was|are|were|be)\s+(?:what (?:broke|caused|is causing|was causing)|behind|the (?:root )?cause of|responsible for|hurting|breaking)\b(?P<e>.*)$"),
        ]
    });
    let t = text.to_lowercase();
    // Most wordings make no causal claim: a substring test spares them the patterns.
    const KEYS: &[&str] = &[
        "caus",
        "due to",
        "because of",
        "down to",
        "stem",
        "traced",
        "triggered",
        "result of",
        "rc",
        "behind",
        "broke",
        "responsible",
        "hurting",
        "breaking",
    ];
    if !KEYS.iter().any(|k| t.contains(k)) {
        return None;
    }
    let (e, c) = [effect_first, root, cause_first].iter().find_map(|r| {
        r.captures(&t).map(|m| {
            let side = |k: &str| m.name(k).map_or("", |x| x.as_str()).to_string();
            (side("e"), side("c"))
        })
    })?;
    #[rustfmt::skip]
    const CLAIM: &[&str] = &[
        "issue", "issu", "problem", "trouble", "troubl", "incident", "impact", "cause", "caus",
        "root", "rc", "theory", "theori", "hypothesis", "hypothesi", "confirm", "suspect",
        "work", "turn", "out", "dig", "digg", "after", "found", "think", "might", "may",
        "could", "seem", "appear", "likely", "probabl", "check", "need", "my",
    ];
    let words = |x: &str| -> Vec<String> {
        let sig = text::signature(x);
        let mut v: Vec<String> = sig
            .words
            .into_iter()
            .chain(sig.ids)
            .chain(sig.names)
            .filter(|w| !CLAIM.contains(&w.as_str()))
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let (e, c) = (words(&e), words(&c));
    (!c.is_empty()).then_some((e, c))
}

/// Two causal claims whose causes share no word (`... caused by CPU contention` / `...
/// caused by a hot partition`), or whose effects share none when both name one (`GC
/// pauses behind the search release` / `GC pauses hurting partner handshakes`): two claims.
pub(crate) fn causes_differ(a: &Slots, b: &Slots) -> bool {
    let (Some((ea, ca)), Some((eb, cb))) = (&a.cause, &b.cause) else {
        return false;
    };
    let disjoint = |x: &[String], y: &[String]| !x.iter().any(|w| y.binary_search(w).is_ok());
    disjoint(ca, cb) || (!ea.is_empty() && !eb.is_empty() && disjoint(ea, eb))
}

/// Most tokens on each side of a minimal pair.
const SWAP_MAX: usize = 3;

/// A minimal pair: the same wording but for at most three tokens on each side, one of
/// which names an entity (`p99 on cart-svc ...` / `p99 on checkout ...`, `... on iOS` /
/// `... on Android`): a look-alike that differs in one slot, whatever the cosine.
pub(crate) fn minimal_pair(a: &Slots, b: &Slots) -> bool {
    let (oa, ob, shared) = unique_tokens(&a.sig, &b.sig);
    let small = |x: &[&str]| !x.is_empty() && x.len() <= SWAP_MAX;
    if !small(&oa) || !small(&ob) || shared < 2 || shared < oa.len() + ob.len() {
        return false;
    }
    // A number the wording states as a value is not an entity: `port 8080` / `port 3000`
    // is one thing with two values (a contradiction or a change), not two things.
    let named = |x: &[&str], s: &Slots| {
        x.iter().any(|t| {
            s.entities.binary_search_by(|e| e.as_str().cmp(t)).is_ok()
                && !s.sig.value_keys.iter().any(|k| k == t)
        })
    };
    named(&oa, a) || named(&ob, b)
}

/// Entity-like tokens of a wording (see [`Slots::entities`]).
fn entities(text: &str) -> Vec<String> {
    static TOKEN: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    let token = TOKEN.get_or_init(|| re(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*[A-Za-z0-9]|[A-Za-z0-9]"));
    static CAMEL: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    let camel = CAMEL.get_or_init(|| re(r"[A-Z]+[a-z0-9]*|[a-z0-9]+"));
    let mut out: Vec<String> = Vec::new();
    let add = |w: &str, out: &mut Vec<String>| {
        if w.len() >= 2 {
            out.push(w.to_string());
            out.push(text::stem(w));
        }
    };
    for m in token.find_iter(text) {
        let w = m.as_str();
        let before = text[..m.start()].trim_end();
        let sentence_start = before.is_empty()
            || before.ends_with(['.', ':', '!', '?', '>', ';', '"'])
            || before.ends_with(" -");
        // Identifiers whole; proper names (not all-caps acronyms: `DB`, `TLS`, `OOM` are
        // common nouns to a paraphrase) with their CamelCase parts.
        let ident = w.contains(['-', '_', '.', '/', ':']) || w.chars().any(|c| c.is_ascii_digit());
        let proper = w.chars().any(|c| c.is_ascii_lowercase())
            && (w.chars().skip(1).any(|c| c.is_ascii_uppercase())
                || (w.starts_with(|c: char| c.is_ascii_uppercase()) && !sentence_start));
        if ident {
            add(&w.to_ascii_lowercase(), &mut out);
        } else if proper {
            add(&w.to_ascii_lowercase(), &mut out);
            for p in camel.find_iter(w) {
                add(&p.as_str().to_ascii_lowercase(), &mut out);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

const MONTHS: &[&str] = &[
    "jan",
    "feb",
    "mar",
    "apr",
    "may",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "january",
    "february",
    "march",
    "april",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

fn re(p: &str) -> Regex {
    Regex::new(p).expect("slot pattern")
}

/// Proper names of a wording (see the module doc), lowercased, sorted, deduplicated.
pub(crate) fn proper_names(text: &str) -> Vec<String> {
    static TOKEN: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    // Whole tokens, identifiers included (`pg-orders-01`, `a.b`): only plain words count.
    let token = TOKEN.get_or_init(|| re(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*[A-Za-z0-9]|[A-Za-z0-9]"));
    let mut out: Vec<String> = Vec::new();
    for m in token.find_iter(text) {
        let w = m.as_str();
        if !w.chars().all(|c| c.is_ascii_alphanumeric())
            || !w.starts_with(|c: char| c.is_ascii_alphabetic())
            || !w.chars().any(|c| c.is_ascii_lowercase())
            || w.len() < 2
        {
            continue; // an identifier, a number or an acronym
        }
        if w.len() >= 3
            && w.ends_with('s')
            && w[..w.len() - 1].chars().all(|c| c.is_ascii_uppercase())
        {
            continue; // an acronym's plural (`PGs`, `OSDs`)
        }
        let before = text[..m.start()].trim_end();
        let sentence_start = before.is_empty()
            || before.ends_with(['.', ':', '!', '?', '>', ';', '"'])
            || before.ends_with(" -");
        let inner = w.chars().skip(1).any(|c| c.is_ascii_uppercase());
        let proper = w.starts_with(|c: char| c.is_ascii_uppercase()) && !sentence_start;
        let lw = w.to_ascii_lowercase();
        if (inner || proper) && !MONTHS.contains(&lw.as_str()) {
            out.push(lw);
        }
    }
    out.sort();
    out.dedup();
    out
}

fn num(s: &str) -> Option<f64> {
    s.replace(',', "").parse().ok()
}

/// The wording with measurements in one form (see the module doc); borrowed when no
/// rule applies.
pub(crate) fn measure_text(text: &str) -> Cow<'_, str> {
    type Rule = (Regex, fn(&Captures) -> String);
    static RULES: std::sync::OnceLock<Vec<Rule>> = std::sync::OnceLock::new();
    let rules = RULES.get_or_init(|| {
        const N: &str = r"(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)";
        const MONTH: &str = r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)";
        let v: Vec<Rule> = vec![
            // Number words as digits: `forty-five` -> `45`, `twenty` -> `20`, `three
            // hundred` -> `300`, `eleven hundred` -> `1100`; `one` only before a ratio's
            // `in` (`one in five`): alone it is rarely a count.
            (
                re(&format!(r"(?i)(^|[^\w.-])({NUMBER_WORD})(?:\s+(hundred|thousand))?([^\w.-]|$)")),
                number_words,
            ),
            (
                re(r"(?i)(^|[^\w.-])one((?:\s+[a-z]+)?\s+(?:in|out\s+of)\s+(?:every\s+|each\s+|a\s+)?(?:\d|hundred\b|thousand\b|million\b))"),
                |c| format!("{}1{}", &c[1], &c[2]),
            ),
            // A decimal without its leading zero: `.612` -> `0.612`.
            (re(r"(^|[\s(=:~<>/,])\.(\d+)\b"), |c| format!("{}0.{}", &c[1], &c[2])),
            // A ratio as a percentage: `8 in 1000`, `1 flaky in 200`, `2 in 10k`, `3 per
            // thousand`, `62 in every 1000` -> `0.8%`, `0.5% flaky`, ...; not a part of an
            // identifier (`eu-west-1 in 2 AZs`, `10.0.0.5 in 2 racks`), an entity's number
            // (`broker 3 in 10 racks`, `HTTP 503 in 1000`), a year (`3 outages in 2026`),
            // nor before a unit (`3 in 5 minutes`, `79 out of 80 GB`).
            (
                re(&format!(r"(?i)(^|[^\w.:/-])((?:[a-z]+\s+)?){N}((?:\s+[a-z]+)?)\s+(in|per|out\s+of)\s+(?:every\s+|each\s+|a\s+)?(\d{{1,3}}(?:,\d{{3}})+|\d+(?:\.\d+)?k?|hundred|thousand|million)(\s+(?:thousand|million))?((?:\s+[a-z]+)?)([^\w.:/-]|$)")),
                ratio,
            ),
            // Possessives: `broker-3's disk` names `broker-3`, `checkout's p99` `checkout`.
            (re(r"\b([A-Za-z0-9][\w.-]*)['’]s\b"), |c| c[1].to_string()),
            // Plural acronyms name the acronym: `PGs` -> `PG`, `OSDs` -> `OSD`.
            (re(r"\b([A-Z]{2,6})s\b"), |c| c[1].to_string()),
            // Dates in one form, a value (`20260731`) rather than an identifier, so that
            // two dates of one thing (a certificate's expiry, a partition's row count)
            // compare as values do: `2026-07-31T23:59:59Z` -> `20260731 23:59`;
            // `2026-05-06`, `6 May 2026`, `May 6th, 2026` -> `20260506`; `2026-03`,
            // `March 2026` -> `202603`.
            (
                re(r"\b((?:19|20)\d{2})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])(?:[T ](\d{2}:\d{2})(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b"),
                |c| match c.get(4) {
                    Some(t) => format!("{}{}{} {}", &c[1], &c[2], &c[3], t.as_str()),
                    None => format!("{}{}{}", &c[1], &c[2], &c[3]),
                },
            ),
            (
                re(r"\b((?:19|20)\d{2})-(0[1-9]|1[0-2])\b"),
                |c| format!("{}{}", &c[1], &c[2]),
            ),
            (
                re(&format!(r"(?i)\b(\d{{1,2}})(?:st|nd|rd|th)?\s+{MONTH}\.?,?\s+((?:19|20)\d{{2}})\b")),
                |c| date_of(&c[3], &c[2], Some(&c[1])),
            ),
            (
                re(&format!(r"(?i)\b{MONTH}\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+((?:19|20)\d{{2}})\b")),
                |c| date_of(&c[3], &c[1], Some(&c[2])),
            ),
            (
                re(&format!(r"(?i)\b{MONTH}\.?\s+((?:19|20)\d{{2}})\b")),
                |c| date_of(&c[2], &c[1], None),
            ),
            // Compound durations: 3h10m, 2m30s, 1h05m20s -> seconds (two parts at least:
            // `10m` alone may be ten million or ten metres).
            (
                re(r"(?i)\b(?:(\d+)h\s?(\d+)m(?:in)?(?:\s?(\d+)s)?|(\d+)h\s?(\d+)s|(\d+)m(?:in)?\s?(\d+)s)\b"),
                compound_duration,
            ),
            // An entity and its number, however written, are one identifier:
            // `broker 3`, `broker-3`, `broker_3`, `osd.12`, `OSD 12` -> `broker-3`, `OSD-12`.
            // (After the dates: `MAY 6, 2026` is a date, not an entity.)
            (
                re(r"\b([A-Za-z]{2,})(?:[._-]|\s+#?)(\d+)([.:/,-]\d|\s*%|\s*[A-Za-z]+)?"),
                entity_number,
            ),
            // Cents are hundredths of the currency: `87,500 cents` -> `875`.
            (re(&format!(r"(?i)\b{N}\s*cents?\b")), |c| match num(&c[1]) {
                Some(x) => text::num_key(x / 100.0),
                None => c[0].to_string(),
            }),
            // A count of a total shares its unit: `79 of 80 GB`, `79/80 GB` -> `79 GB of 80 GB`.
            (
                re(r"(?i)\b(\d+(?:\.\d+)?)\s*(?:of|/|out of)\s*(\d+(?:\.\d+)?)\s*(gb|gib|mb|mib|tb|tib|kb|kib|ms|s|%|percent|cores|vcpus)\b"),
                |c| format!("{} {} of {} {}", &c[1], &c[3], &c[2], &c[3]),
            ),
            // Percentiles: 99th percentile / 99th pct / 99th-percentile / 99%ile -> p99.
            (
                re(r"(?i)\b(\d{2,3})(?:(?:st|nd|rd|th)[ -]?(?:percentile|pct|perc)|[ -]?percentile|%ile)\b"),
                |c| format!("p{}", &c[1]),
            ),
            (re(r"(?i)\bresponse[ -]times?\b"), |_| "latency".to_string()),
            (re(r"(?i)\bserver[ -]errors?\b"), |_| "errors".to_string()),
            // Hyphenated durations: 7-day -> 7 day.
            (
                re(r"(?i)\b(\d+)-(second|minute|hour|day|week)s?\b"),
                |c| format!("{} {}", &c[1], &c[2]),
            ),
            // Scientific notation.
            (re(r"(?i)\b(\d+(?:\.\d+)?)e(-?\d{1,2})\b"), |c| {
                match (num(&c[1]), c[2].parse::<i32>()) {
                    (Some(m), Ok(e)) => text::num_key(m * 10f64.powi(e)),
                    _ => c[0].to_string(),
                }
            }),
            // Magnitudes.
            (re(&format!(r"(?i)\b{N}\s*(?:million|mln)\b")), |c| scaled_of(c, 1e6)),
            (re(&format!(r"\b{N}\s?M\b")), |c| scaled_of(c, 1e6)),
            (re(&format!(r"(?i)\b{N}\s*(?:billion|bn)\b")), |c| scaled_of(c, 1e9)),
            (re(&format!(r"\b{N}B\b")), |c| scaled_of(c, 1e9)),
            (re(&format!(r"(?i)\b{N}\s*thousand\b")), |c| scaled_of(c, 1e3)),
            // Proportions: 0.41 of -> 41% of.
            (re(r"(?i)(^|[^\d.])(0?\.\d+)\s+of\b"), |c| match num(&c[2]) {
                Some(x) => format!("{}{}% of", &c[1], text::num_key(x * 100.0)),
                None => c[0].to_string(),
            }),
            // Rates, per second.
            (
                re(&format!(
                    r"(?i)\b{N}((?:\s+[a-z]+)?)\s*(?:/\s?s(?:ec)?|per\s+sec(?:ond)?|every\s+second|a\s+second)\b"
                )),
                |c| rate(c, 1.0),
            ),
            (
                re(&format!(
                    r"(?i)\b{N}((?:\s+[a-z]+)?)\s*(?:/\s?min|per\s+min(?:ute)?|every\s+minute|a\s+minute)\b"
                )),
                |c| rate(c, 1.0 / 60.0),
            ),
            (
                re(&format!(
                    r"(?i)\b{N}((?:\s+[a-z]+)?)\s*(?:/\s?h(?:r|our)?|per\s+h(?:ou)?r|every\s+hour)\b"
                )),
                |c| rate(c, 1.0 / 3600.0),
            ),
            // Versions: v2.14.0 -> 2.14.0.
            (re(r"(?i)\bv(\d+\.\d+(?:\.\d+)*)\b"), |c| c[1].to_string()),
            // host:port -> host port N.
            (re(r"\b([A-Za-z][\w.-]*[A-Za-z0-9]):(\d{2,5})\b"), |c| {
                format!("{} port {}", &c[1], &c[2])
            }),
            // Clock ranges: 11:10-11:35Z -> 11:10 to 11:35.
            (
                re(r"(?i)\b(\d{1,2}:\d{2})\s*[-–]\s*(\d{1,2}:\d{2})z?\b"),
                |c| format!("{} to {}", &c[1], &c[2]),
            ),
        ];
        v
    });
    let mut out = Cow::Borrowed(text);
    for (r, f) in rules {
        if r.is_match(&out) {
            out = Cow::Owned(r.replace_all(&out, |c: &Captures| f(c)).into_owned());
        }
    }
    out
}

/// `YYYYMMDD` (or `YYYYMM` without a day) of a year, a month name and a day; as
/// written when the day is not one of the month's.
fn date_of(year: &str, month: &str, day: Option<&str>) -> String {
    let m = month.to_ascii_lowercase();
    let Some(mi) = MONTHS.iter().position(|x| m.starts_with(x)) else {
        return format!("{month} {year}");
    };
    match day.map(str::parse::<u32>) {
        None => format!("{year}{:02}", mi + 1),
        Some(Ok(d)) if (1..=31).contains(&d) => format!("{year}{:02}{d:02}", mi + 1),
        Some(_) => format!("{} {month} {year}", day.unwrap_or_default()),
    }
}

/// `3h10m` -> `11400 seconds`; a lone part (`3h`, `10m`, `5s`) or no match at all is
/// left as written (`10m` may be ten million or ten metres).
fn compound_duration(c: &Captures) -> String {
    let part = |i: usize| {
        c.get(i)
            .and_then(|m| m.as_str().parse::<u64>().ok())
            .unwrap_or(0)
    };
    // h m [s] | h s | m s
    let secs = (part(1) + part(4)) * 3600 + (part(2) + part(6)) * 60 + part(3) + part(5) + part(7);
    format!("{secs} seconds")
}

/// `broker 3`, `osd.12`, `OSD 12` -> one identifier (`broker-3`, `osd-12`, `OSD-12`):
/// only after a word that names entities (`broker`, `node`, ...: `text::ENTITY_NOUNS`)
/// or an acronym of one (`ENTITY_ACRONYMS`), and never when the number is a measurement (`CPU 95%`,
/// `TTL 300 s`), a version or an address (`TLS 1.2`, `host 10.0.0.5`), or a status code
/// (`HTTP 503`). Written with a dash, an underscore or a dot (`broker_3`, `osd.12`,
/// `cust_5120/2026-04`), any word and its number are one identifier already: only the
/// separator is made a dash.
/// Acronyms a following number names one of (`OSD 12`, `AZ 2`, `GPU 3`); after others
/// a number is a measurement (`QPS 1200`, `TTL 300`, `USD 875`, `SLO 99`).
const ENTITY_ACRONYMS: &[&str] = &[
    "osd", "az", "dc", "pg", "vm", "gpu", "nic", "ssd", "hdd", "lun", "nvme",
];

fn entity_number(c: &Captures) -> String {
    let word = &c[1];
    let joined = !c[0][word.len()..].starts_with(char::is_whitespace)
        && !c[0][word.len()..].starts_with('#');
    let after = c.get(3).map_or("", |m| m.as_str());
    let next = after.trim();
    let lower = word.to_ascii_lowercase();
    // After an acronym, a number followed by a plural noun counts it (`API 450 errors`,
    // `DB 30 connections`); otherwise it names one (`OSD 12 is down`, `AZ 2`).
    let counts =
        next.len() > 3 && next.ends_with('s') && !matches!(next, "was" | "has" | "is" | "as");
    let entity = text::ENTITY_NOUNS.contains(&lower.as_str())
        || (ENTITY_ACRONYMS.contains(&lower.as_str()) && !counts);
    // A longer number, or one that goes on (`partition 2026-05-08`, `host 10.0.0.5`).
    let measured = c[2].len() > 4
        || next.starts_with(['.', ':', '/', '-', ','])
        || next.starts_with('%')
        || text::unit_of(&next.to_ascii_lowercase()).is_some()
        || text::HTTP_WORDS.contains(&lower.as_str());
    if joined || (entity && !measured) {
        format!("{word}-{}{after}", &c[2])
    } else {
        c[0].to_string()
    }
}

/// Number words of two to ninety-nine (a unit after a tens word: `forty-five`,
/// `forty five`), as a regex alternation.
const NUMBER_WORD: &str = "(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)(?:[- ](?:one|two|three|four|five|six|seven|eight|nine))?|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen";

/// The value of a number word of two to ninety-nine, or `one`.
fn number_word(w: &str) -> Option<u32> {
    const UNITS: [&str; 20] = [
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
    ];
    const TENS: [&str; 8] = [
        "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
    ];
    let w = w.to_ascii_lowercase();
    let mut parts = w.split(['-', ' ']).filter(|p| !p.is_empty());
    let first = parts.next()?;
    let unit = |p: &str| UNITS.iter().position(|u| *u == p).map(|i| i as u32);
    match TENS.iter().position(|t| *t == first) {
        Some(t) => {
            let tens = 20 + 10 * t as u32;
            match parts.next() {
                Some(u) => unit(u).filter(|&u| (1..10).contains(&u)).map(|u| tens + u),
                None => Some(tens),
            }
        }
        None => unit(first),
    }
}

fn number_words(c: &Captures) -> String {
    let scale = match c.get(3).map(|m| m.as_str().to_ascii_lowercase()) {
        Some(w) if w == "hundred" => 100,
        Some(_) => 1000,
        None => 1,
    };
    match number_word(&c[2]) {
        Some(n) => format!("{}{}{}", &c[1], n * scale, &c[4]),
        None => c[0].to_string(),
    }
}

/// `N [word] in|per|out of [every] M [word]` as a percentage (see [`measure_text`]).
fn ratio(c: &Captures) -> String {
    let keep = || c[0].to_string();
    let before = c[2].trim().to_ascii_lowercase();
    if !before.is_empty()
        && (text::ENTITY_NOUNS.contains(&before.as_str())
            || text::HTTP_WORDS.contains(&before.as_str())
            || ENTITY_ACRONYMS.contains(&before.to_ascii_uppercase().as_str()))
    {
        return keep();
    }
    let after = c[8].trim().to_ascii_lowercase();
    const SPANS: [&str; 9] = [
        "week", "weeks", "month", "months", "year", "years", "us", "µs", "ns",
    ];
    if text::unit_of(&after).is_some() || SPANS.contains(&after.as_str()) {
        return keep();
    }
    let m = c[6].to_ascii_lowercase();
    let year = m.len() == 4 && (m.starts_with("19") || m.starts_with("20"));
    if year && c[5].eq_ignore_ascii_case("in") {
        return keep();
    }
    let scale = match c.get(7).map(|x| x.as_str().trim().to_ascii_lowercase()) {
        Some(w) if w == "thousand" => 1e3,
        Some(w) if w == "million" => 1e6,
        _ => 1.0,
    };
    let total = match m.as_str() {
        "hundred" => Some(100.0),
        "thousand" => Some(1000.0),
        "million" => Some(1e6),
        _ => match m.strip_suffix('k') {
            Some(k) => num(k).map(|x| x * 1000.0),
            None => num(&m),
        },
    }
    .map(|t| t * scale);
    match (num(&c[3]), total) {
        (Some(n), Some(t)) if t >= 2.0 && n <= t => format!(
            "{}{}{}%{}{}{}",
            &c[1],
            &c[2],
            text::num_key(n / t * 100.0),
            &c[4],
            &c[8],
            &c[9]
        ),
        _ => keep(),
    }
}

fn scaled_of(c: &Captures, f: f64) -> String {
    match num(&c[1]) {
        Some(x) => text::num_key(x * f),
        None => c[0].to_string(),
    }
}

fn rate(c: &Captures, per_sec: f64) -> String {
    match num(&c[1]) {
        Some(x) => format!("{}{} persec", text::num_key(x * per_sec), &c[2]),
        None => c[0].to_string(),
    }
}

/// Where a statement stands (the epistemic slot): a cause suspected, confirmed, ruled
/// out, or the issue resolved. Two statements in different stances are different facts
/// ("X is suspected" / "X turned out to be the cause"); suspected-or-confirmed against
/// ruled out about one thing is a contradiction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stance {
    /// No marker.
    Plain,
    /// A hypothesis: suspected, might, possibly, a question.
    Hedged,
    /// Confirmed: root cause, caused by, turned out.
    Confirmed,
    /// Ruled out, excluded, not the cause.
    RuledOut,
    /// Resolved, mitigated, closed, back to normal.
    Resolved,
}

fn stance_patterns() -> &'static [(Stance, regex::Regex)] {
    static P: std::sync::OnceLock<Vec<(Stance, regex::Regex)>> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let re = |s: &str| regex::Regex::new(&format!("(?i){s}")).expect("stance pattern");
        // Checked in this order: the first that matches decides.
        vec![
            (Stance::RuledOut, re(r"\b(ruled?[- ]out|rules out|ruling out|exclud\w*|eliminat\w*|not (the|a) (root )?(cause|culprit|issue|problem)|unrelated|red herring|innocent|disprov\w*|refut\w*|no evidence (of|for|that)|can be dismissed|dismissed|false alarm|cleared of)\b")),
            (Stance::Resolved, re(r"\b(resolved|mitigated|closing|closed out|all clear|back to (baseline|normal)|recovered|fully fixed|incident (is )?over)\b")),
            (Stance::Confirmed, re(r"\b(confirm\w*|root[- ]cause|rc:|caused by|turn(s|ed)? out|comes? down to|is due to|was due to|culprit|traced (it |this )?(back )?to|verified)\b|^rc\b")),
            (Stance::Hedged, re(r"\b(suspect\w*|might|may be|maybe|possibl\w*|perhaps|could be|theory|hypothes\w*|likely|probabl\w*|guess\w*|wonder\w*|needs? checking|unconfirmed|not yet confirmed|plausibl\w*)\b|\?\s*\)?\s*$")),
        ]
    })
}

/// The stance of a wording.
pub fn stance(text: &str) -> Stance {
    stance_patterns()
        .iter()
        .find(|(_, r)| r.is_match(text))
        .map_or(Stance::Plain, |(s, _)| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurements_are_normalised() {
        let m = |t: &str| measure_text(t).into_owned();
        assert_eq!(
            m("checkout's 99th percentile latency"),
            "checkout p99 latency"
        );
        assert_eq!(m("tail latency (99th pct)"), "tail latency (p99)");
        assert_eq!(m("lag 1.2M msgs"), "lag 1200000 msgs");
        assert_eq!(m("1.2 million rows"), "1200000 rows");
        assert_eq!(m("12.5 thousand rows"), "12500 rows");
        assert_eq!(m("34B params"), "34000000000 params");
        assert_eq!(m("only 0.41 of lookups"), "only 41% of lookups");
        assert_eq!(m("evictions 120/s"), "evictions 120 persec");
        assert_eq!(
            m("evicting 120 keys every second"),
            "evicting 120 keys persec"
        );
        assert_eq!(m("7,200 per minute"), "120 persec");
        assert_eq!(m("lr=5e-5"), "lr=0.00005");
        assert_eq!(m("rollback to v2.14.0"), "rollback to 2.14.0");
        assert_eq!(
            m("conn refused pg-orders-01:5433"),
            "conn refused pg-orders-01 port 5433"
        );
        assert_eq!(m("502 burst 11:10-11:35Z"), "502 burst 11:10 to 11:35");
        assert_eq!(m("80 GB at 14:00"), "80 GB at 14:00");
        assert_eq!(m("the 7-day retention"), "the 7 day retention");
    }

    #[test]
    fn number_words_ratios_and_bare_decimals_are_values() {
        let m = |t: &str| measure_text(t).into_owned();
        assert_eq!(
            m("pool enlarged from twenty to forty-five machines"),
            "pool enlarged from 20 to 45 machines"
        );
        assert_eq!(m("about eleven hundred merchants"), "about 1100 merchants");
        assert_eq!(m("ndcg back to .607"), "ndcg back to 0.607");
        assert_eq!(m("8 in 1000 customers declined"), "0.8% customers declined");
        assert_eq!(
            m("unit tests fine, like 1 flaky in 200"),
            "unit tests fine, like 0.5% flaky"
        );
        assert_eq!(m("3 per thousand requests"), "0.3% requests");
        assert_eq!(m("roughly one in five runs"), "roughly 20% runs");
        assert_eq!(m("2 in 10k sessions"), "0.02% sessions");
        assert_eq!(m("six in a thousand bounces"), "0.6% bounces");
        assert_eq!(m("about one message in eighty"), "about 1.25% message");
        assert_eq!(m("fourteen per hour"), m("14/h"));
        // Left alone: identifiers, entity numbers, years, units, spans, other phrases.
        for t in [
            "deployed to eu-west-1 in 2 zones",
            "broker-2 in 3 racks",
            "release 1.2.3 in 4 clusters",
            "host 10.0.0.5 in 2 racks",
            "broker 3 in 10 racks",
            "HTTP 503 in 1000 requests",
            "2 incidents in 2025",
            "2 failures in 3 months",
            "3 restarts in 4 h",
            "p99 was 900 ms an hour ago",
        ] {
            assert!(!m(t).contains('%'), "{t}: {}", m(t));
        }
        assert_eq!(m("79 out of 80 GB"), "79 GB of 80 GB");
        assert_eq!(
            m("1 in 10 thousand requests"),
            m("one in ten thousand requests")
        );
        assert_eq!(m("pod-ten and ten.internal"), "pod-ten and ten.internal");
        assert_eq!(m("one instance in eu-west-1"), "one instance in eu-west-1");
        assert_eq!(m("the one in production"), "the one in production");
        assert!(!m("p99 was 900 ms an hour ago").contains("persec"));
        // Not a ratio: a count in a span of time, a rate per unit.
        assert_eq!(m("3 in 5 minutes"), "3 in 5 minutes");
        assert_eq!(m("one broker is down"), "one broker is down");
        let vals = |t: &str| Slots::of(t).sig.value_keys;
        assert_eq!(
            vals("0.8% of legit customers declined"),
            vals("8 in 1000 legit customers declined")
        );
    }

    #[test]
    fn one_form_for_entity_numbers_possessives_durations_and_totals() {
        let ids = |t: &str| Slots::of(t).sig.ids;
        let vals = |t: &str| Slots::of(t).sig.value_keys;
        // An entity and its number, however written.
        for t in [
            "broker 3 at 97%",
            "broker-3 at 97%",
            "broker_3 at 97%",
            "broker-3's disk at 97%",
        ] {
            assert_eq!(ids(t), ["broker-3"], "{t}");
        }
        assert_eq!(ids("osd.12 is down"), ids("Ceph reports OSD 12 as down"));
        assert_ne!(ids("osd.12 is down"), ids("osd.17 is down"));
        // ... but not a measurement, a version, an address or a status code.
        assert_eq!(vals("CPU 95 percent"), ["95"]);
        assert_eq!(vals("TTL 300 s"), ["300000"]);
        assert_eq!(vals("the HTTP 503 rate"), ["503"]);
        assert_eq!(vals("API 450 errors"), ["450"]);
        for t in ["QPS 1200", "TTL 300", "USD 875", "SLO 99", "EUR 12,500"] {
            assert!(ids(t).is_empty(), "{t}: {:?}", ids(t));
        }
        assert!(ids("TLS 1.2 on host 10.0.0.5")
            .iter()
            .all(|i| i == "10.0.0.5"));
        // Compound durations; a lone part is left alone.
        assert_eq!(
            vals("orders_daily took 3h10m"),
            vals("orders_daily took 190 minutes")
        );
        assert_eq!(vals("2m30s"), vals("150 s"));
        assert_eq!(vals("retry in 10m"), ["10m"]);
        assert!(matches!(measure_text("no duration here"), Cow::Borrowed(_)));
        // A count of a total shares its unit.
        assert_eq!(vals("79 of 80 GB in use"), vals("79 GB / 80 GB"));
        // Dates and cents.
        for t in [
            "failed for the 6 May 2026 run",
            "FAILED ds=2026-05-06",
            "failed on May 6th, 2026",
        ] {
            assert_eq!(vals(t), ["20260506"], "{t}");
        }
        assert_eq!(vals("failed on 06 MAY 2026"), ["20260506"]);
        assert_eq!(vals("MAY 6, 2026"), ["20260506"]);
        // A number after a month is a year only when it is one.
        assert_eq!(vals("since May 6 1200 requests failed"), ["1200", "6"]);
        assert_eq!(
            vals("notAfter=2026-07-31T23:59:59Z").first(),
            vals("valid until Jul 31, 2026").first()
        );
        assert_eq!(vals("the March 2026 invoice"), vals("billed for 2026-03"));
        assert_eq!(vals("billed 87,500 cents"), vals("total $875.00"));
        // Plural acronyms are acronyms, not proper names.
        assert!(proper_names("Ceph: 312 PGs degraded, OSDs flapping").is_empty());
    }

    #[test]
    fn proper_names_and_anchors() {
        assert_eq!(
            proper_names("Crash-free sessions for FoodHub 5.1.4 on iOS are at 98.2 percent."),
            vec!["foodhub", "ios"]
        );
        assert_eq!(
            proper_names("SSL cert on pay.example.com valid until Jul 31, 2026 (UTC)"),
            Vec::<String>::new()
        );
        let a = Slots::of("Crash-free sessions for FoodHub 5.1.4 on iOS are at 98.2 percent.");
        let b = Slots::of("Crash-free sessions for FoodHub 5.1.4 on Android are at 98.2 percent.");
        assert!(names_conflict(&a, &b));
        let c = Slots::of("per Muller (2022), MMLU acc 63.5");
        let d = Slots::of("Muller2022: CoT-Distill MMLU = 63.5");
        assert!(!names_conflict(&c, &d));
        let e = Slots::of("612 failed logins 203.0.113.45 -> sso.example.com");
        let f = Slots::of("612 sign-in failures against the SSO portal from 203.0.113.45");
        assert!(share_anchor(&e, &f));
        let g = Slots::of("only 0.41 of lookups are served from redis-cache");
        let h = Slots::of("The cache hit rate on redis-cache is at 41 percent right now.");
        assert_eq!(g.sig.value_keys, h.sig.value_keys);
        // Minimal pairs: one entity swapped; a paraphrase is not one.
        let p = Slots::of("p99 on cart-svc went up to 2.3 s");
        let q = Slots::of("p99 on checkout went up to 2.3 s");
        assert!(minimal_pair(&p, &q));
        assert!(minimal_pair(&a, &b));
        let r = Slots::of("consumer group etl-loader lag: 1.2M messages");
        let s = Slots::of("The etl-loader consumer group is about 1,200,000 messages behind.");
        assert!(!minimal_pair(&r, &s));
        let t = Slots::of("DNS resolution for ledger.internal fails intermittently");
        let u = Slots::of("ledger.internal: intermittent NXDOMAIN on lookup");
        assert!(!minimal_pair(&t, &u) && !names_conflict(&t, &u));
    }
}
