//! [`Deduper`]: decides whether a finding repeats a known fact or contradicts one.
//!
//! CONTRACT (the driver in `synth/mod.rs`, `quality` and `metrics` rely on exactly this API):
//! - Facts are numbered densely from 0 in the order [`Deduper::add_fact`] is called.
//! - A *scope* is the finding's subject, or "" when it has none. Matching and
//!   contradiction never cross scopes. (Users never meet: the driver keeps one `Deduper`
//!   per user.)
//! - [`Deduper::classify`] does not change the deduper; the caller then calls
//!   [`Deduper::add_fact`] (for [`Match::New`]) or [`Deduper::add_variant`] (otherwise).
//! - Everything is deterministic: the same calls in the same order give the same answers,
//!   so the state can be rebuilt from the facts log by replaying `add_fact`/`add_variant`.
//! - Contradictions are only looked for within a non-empty scope.
//!
//! # Method
//! Each wording becomes a [`Signature`] ([`text::signature`]): content words (stopwords
//! dropped, light stemming, a small generic SRE synonym table: exhausted/saturated/maxed
//! out, OOMKilled/OOM killed, p99/99th percentile, ...), *values* (numbers with units
//! normalized to a base unit: `45s` = `45 seconds` = `45 s`, `12%` = `12 percent`,
//! `3,214` = `3214`), *identifiers* kept whole (`gke-prod-pool-1-a3f`, `2026.11.22-3`,
//! `orders-db.internal`, URL paths such as `/api/cart`) and exclusive qualifiers
//! (cpu/memory/disk/address, p50/p99, states such as pending/ready/unacked/evicted), plus
//! polarity.
//! Two wordings are scored by a weighted Dice coefficient over those tokens (identifiers
//! weigh more, the subject's own name less). Dice rather than MinHash/SimHash: findings are
//! ~10 tokens, so exact set overlap is cheap, deterministic and has no sampling noise, and
//! it needs no corpus statistics (IDF would change as facts arrive and break replay).
//! Values are a hard check, not a score: if each side states a value or identifier the
//! other lacks (45s vs 2s, node a3f vs b7c), names a different hyphenated entity
//! (`billing-writer` vs `audit-writer`), a different exclusive qualifier, or only one names
//! a bound (a limit is not a usage), they are not the same fact, whatever the words say.
//! Nor are two wordings that agree on at most one value but each name a measured thing
//! sharing no measured-thing word with the other (content words other than the subject
//! and trend words: "purge takes 90s to propagate" vs "ttl of 90 seconds"). A polarity
//! flip halves the score.
//! A *contradiction* is the reverse: same topic (Dice over words and identifiers, trend
//! words such as rose/steady/normal ignored), same entities, but incompatible values in
//! one dimension (same unit kind, same counted noun), or only the polarity differs with a
//! near-identical topic. Candidates come from a per-scope inverted index (token -> facts),
//! reading at most `postings_scan_max` postings per token and scoring at most
//! `candidates_max` facts, each against its (at most `variants_max`) kept wordings.

use std::collections::HashMap;

use crate::event::ts::Ts;
use crate::synth::text::{self, Dim, Signature};

mod ann;
mod semantic;
pub(crate) mod slots;

pub use semantic::SemanticConfig;

/// Index of a fact in a [`Deduper`].
pub type FactIdx = usize;

/// Tuning of the deduper.
#[derive(Clone, Debug)]
pub struct DedupConfig {
    /// Score at or above which two wordings are the same fact.
    pub near_threshold: f64,
    /// Scores in `[borderline_low, near_threshold)` are asked to a [`Judge`] when one is given.
    pub borderline_low: f64,
    /// Most wordings kept per fact to compare against (memory bound).
    pub variants_max: usize,
    /// Most candidate facts scored per finding (time bound).
    pub candidates_max: usize,
    /// Most postings read per token when gathering candidates (the most recent ones).
    pub postings_scan_max: usize,
    /// Topic similarity (0..=1) at or above which a known fact stating an incompatible
    /// value is reported as a contradiction.
    pub contradiction_threshold: f64,
    /// Topic similarity needed when the only disagreement is polarity ("accepts" vs "does
    /// not accept"): a flipped negation alone is weak evidence, so the topics must be
    /// nearly identical.
    pub negation_threshold: f64,
    /// Semantic mode (see `semantic.rs`): the tuning of candidates by meaning.
    pub semantic: SemanticConfig,
}

impl Default for DedupConfig {
    fn default() -> Self {
        DedupConfig {
            near_threshold: 0.6,
            borderline_low: 0.45,
            variants_max: 4,
            candidates_max: 32,
            postings_scan_max: 256,
            contradiction_threshold: 0.65,
            negation_threshold: 0.9,
            semantic: SemanticConfig::default(),
        }
    }
}

/// How a finding relates to the known facts of its scope.
#[derive(Clone, Debug, PartialEq)]
pub enum Match {
    /// No known fact: a new one.
    New,
    /// Same normalized text as a known wording of this fact.
    Exact(FactIdx),
    /// Near-duplicate of this fact, with its score.
    Near {
        /// The fact.
        fact: FactIdx,
        /// Similarity in 0..=1.
        score: f64,
    },
    /// A borderline pair the [`Judge`] called the same.
    Judged {
        /// The fact.
        fact: FactIdx,
        /// Deterministic similarity in 0..=1.
        score: f64,
    },
}

impl Match {
    /// The matched fact, if any.
    pub fn fact(&self) -> Option<FactIdx> {
        match *self {
            Match::New => None,
            Match::Exact(f) | Match::Near { fact: f, .. } | Match::Judged { fact: f, .. } => {
                Some(f)
            }
        }
    }
}

/// The answer of [`Deduper::classify`].
#[derive(Clone, Debug, PartialEq)]
pub struct Classified {
    /// Which fact it repeats, if any.
    pub matched: Match,
    /// Known facts of the same scope that make an incompatible claim, with a score;
    /// never includes the matched fact.
    pub contradicts: Vec<(FactIdx, f64)>,
    /// Semantic mode: known facts that state the same measured quantity with another
    /// value, observed more than the change window apart: a change over time, not a
    /// contradiction. With the score; never includes the matched fact.
    pub changes: Vec<(FactIdx, f64)>,
}

/// An outside opinion on borderline pairs (the optional LLM step).
pub trait Judge {
    /// Whether `a` and `b` (same scope) state the same fact; `None` = no opinion (time-out,
    /// failure), and the deterministic answer stands.
    fn same(&mut self, scope: &str, a: &str, b: &str, score: f64) -> Option<bool>;
}

struct Variant {
    text: String,
    sig: Signature,
}

struct Fact {
    scope: u32,
    variants: Vec<Variant>,
}

/// The vectors of one scope's kept wordings: `data` holds them end to end (`dim` floats
/// each), `facts[k]` is the fact of the `k`-th; once the scope holds more than
/// `SemanticConfig::exact_max` of them, `graph` links them for approximate search.
#[derive(Default)]
pub(crate) struct ScopeVectors {
    pub(crate) dim: usize,
    pub(crate) facts: Vec<u32>,
    pub(crate) data: Vec<f32>,
    pub(crate) graph: Option<ann::Graph>,
}

/// The in-memory dedup engine; memory grows with distinct facts and wordings kept, never
/// with the number of findings classified.
pub struct Deduper {
    cfg: DedupConfig,
    facts: Vec<Fact>,
    scopes: FnvMap<String, u32>,
    scope_names: Vec<String>,
    exact: FnvMap<u64, FactIdx>,
    /// Per scope: token (`w:` word, `v:` value, `i:` identifier) -> facts, sorted by index.
    index: Vec<ScopeIndex>,
    /// Semantic mode, per scope: the vector of every kept wording of its facts, in the
    /// order they were added, in one contiguous array (scanned whole: see `semantic.rs`).
    vectors: Vec<ScopeVectors>,
    /// Per fact, the time of its latest finding (a change over time versus a
    /// contradiction).
    last_ts: Vec<Option<Ts>>,
    /// Semantic mode, per fact: the typed slots of each kept wording that has a vector
    /// (in the order [`Deduper::add_vector`] was called for it; see `slots.rs`).
    slots: Vec<Vec<slots::Slots>>,
    /// Semantic mode: vectors added so far (the next one's insertion number).
    vectors_added: u64,
    /// Made by [`Deduper::new_semantic`]: wordings keep no lexical signature and no
    /// postings (only [`Deduper::classify_semantic`] is asked, which compares typed
    /// slots and vectors).
    semantic: bool,
}

/// How two signatures compare.
#[derive(Clone, Copy, Debug, Default)]
struct Cmp {
    /// Weighted Dice over words, values and identifiers.
    sim: f64,
    /// Weighted Dice over words and identifiers only: are they about the same thing?
    slot: f64,
    /// Each side has a value the other lacks.
    value_conflict: bool,
    /// Within one dimension, each side has a value the other lacks.
    dim_conflict: bool,
    /// As `dim_conflict`, but a value that rounds to the other side's coarser one
    /// (`6.2%` / `6%`, `52%` / `50%`) does not count: a conflict a contradiction can rest on.
    dim_apart: bool,
    /// Each side has an identifier the other lacks.
    id_conflict: bool,
    /// Different members of an exclusive class (cpu vs memory, p50 vs p99).
    class_conflict: bool,
    /// One is negated, the other not.
    neg_diff: bool,
    /// One names a bound (limit, max), the other not.
    bound_diff: bool,
    /// Each side names a thing (`fraud-check`, `order_items`) the other does not.
    name_conflict: bool,
    /// Each side names a hyphenated entity (`billing-writer`, `email-jobs`) the other does
    /// not (snake_case names are often metric names: two wordings may cite different ones).
    entity_conflict: bool,
    /// Dice over the *measured-thing* words (content words other than the subject's name
    /// and trend words), with whether each side has such words the other lacks. Two
    /// wordings that each name a measured thing and share none of those words
    /// (`purge takes 90s to propagate` / `caches with a ttl of 90 seconds`) are not the same
    /// fact on the strength of one shared value, subject and identifier.
    topic: f64,
    /// Each side has measured-thing words the other lacks.
    topic_swap: bool,
    /// Weight of the values both state.
    values_shared: f64,
}

impl Cmp {
    /// Same-fact score: 0 when the values, identifiers, entities, classes or bounds
    /// disagree, or when the measured things share no word and at most one value backs
    /// the match; halved when the polarity differs.
    fn same_score(&self) -> f64 {
        if self.value_conflict
            || self.id_conflict
            || self.class_conflict
            || self.entity_conflict
            || self.bound_diff
            || (self.topic_swap && self.topic <= 0.0 && self.values_shared < 2.0 * W_VALUE)
        {
            0.0
        } else if self.neg_diff {
            self.sim * 0.5
        } else {
            self.sim
        }
    }

    /// Contradiction score: the topic similarity when both are about the same entity and
    /// slot but state incompatible values or opposite polarity; else 0.
    fn contra_score(&self, cfg: &DedupConfig) -> f64 {
        if self.id_conflict || self.class_conflict || self.bound_diff || self.name_conflict {
            return 0.0;
        }
        let by_value = self.dim_conflict && self.slot >= cfg.contradiction_threshold;
        let by_polarity =
            self.neg_diff && !self.value_conflict && self.slot >= cfg.negation_threshold;
        if by_value || by_polarity {
            self.slot
        } else {
            0.0
        }
    }
}

const W_WORD: f64 = 1.0;
const W_SCOPE: f64 = 0.5;
const W_VALUE: f64 = 1.0;
const W_ID: f64 = 1.5;

fn slot_w(w: &str, scope: &str) -> f64 {
    if text::TREND_WORDS.contains(&w) {
        0.0
    } else {
        word_w(w, scope)
    }
}

fn word_w(w: &str, scope: &str) -> f64 {
    if w == scope {
        W_SCOPE
    } else {
        W_WORD
    }
}

fn topic_w(w: &str, scope: &str) -> f64 {
    if w == scope || text::TREND_WORDS.contains(&w) {
        0.0
    } else {
        W_WORD
    }
}

fn id_w(w: &str, scope: &str) -> f64 {
    if w == scope {
        W_SCOPE
    } else {
        W_ID
    }
}

/// Weight of the intersection and of each side, over two sorted string lists.
fn overlap<'a, A, B>(a: A, b: B, w: impl Fn(&str) -> f64) -> (f64, f64, f64, bool, bool)
where
    A: IntoIterator<Item = &'a String>,
    B: IntoIterator<Item = &'a String>,
{
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    let (mut both, mut wa, mut wb) = (0.0, 0.0, 0.0);
    let (mut a_only, mut b_only) = (false, false);
    loop {
        let ord = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => x.as_str().cmp(y.as_str()),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => break,
        };
        match ord {
            std::cmp::Ordering::Equal => {
                let x = a.next().map_or(0.0, |t| w(t));
                b.next();
                both += x;
                wa += x;
                wb += x;
            }
            std::cmp::Ordering::Less => {
                wa += a.next().map_or(0.0, |t| w(t));
                a_only = true;
            }
            std::cmp::Ordering::Greater => {
                wb += b.next().map_or(0.0, |t| w(t));
                b_only = true;
            }
        }
    }
    (both, wa, wb, a_only, b_only)
}

/// Two value keys (as [`text::num_key`] writes them, with any unit after the number) name the
/// same number, or the more precise one rounds to the coarser one at the coarser one's
/// precision (`6.2%` / `6%`, `0.612` / `0.61`, `52` / `50`, never `412` / `421`).
fn rounds_alike(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let split = |k: &str| {
        let end = k
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
            .unwrap_or(k.len());
        (k[..end].to_string(), k[end..].to_string())
    };
    let ((na, ua), (nb, ub)) = (split(a), split(b));
    let (Ok(xa), Ok(xb)) = (na.parse::<f64>(), nb.parse::<f64>()) else {
        return false;
    };
    if ua != ub || xa.signum() != xb.signum() {
        return false;
    }
    // The step of a number as written: 0.01 for `6.25`, 1 for `6`, 10 for `50`.
    let step = |n: &str| -> f64 {
        match n.split_once('.') {
            Some((_, d)) => 10f64.powi(-(d.len() as i32)),
            None => {
                let digits = n.trim_start_matches('-');
                let zeros = digits.len() - digits.trim_end_matches('0').len();
                10f64.powi(zeros.min(digits.len().saturating_sub(1)) as i32)
            }
        }
    };
    let (sa, sb) = (step(&na), step(&nb));
    let (coarse, fine, s) = if sa >= sb { (xa, xb, sa) } else { (xb, xa, sb) };
    if sa == sb {
        return false;
    }
    ((fine / s).round() * s - coarse).abs() < s * 1e-6
}

fn compare(a: &Signature, b: &Signature, scope: &str) -> Cmp {
    let (ww, wa, wb, _, _) = overlap(&a.words, &b.words, |w| word_w(w, scope));
    let (sw, sa, sb, _, _) = overlap(&a.words, &b.words, |w| slot_w(w, scope));
    let (_, _, _, na_only, nb_only) = overlap(
        a.names.iter().filter(|n| *n != scope),
        b.names.iter().filter(|n| *n != scope),
        |_| 1.0,
    );
    let (_, _, _, ea_only, eb_only) = overlap(
        a.names
            .iter()
            .filter(|n| *n != scope && n.contains('-') && !n.contains('_')),
        b.names
            .iter()
            .filter(|n| *n != scope && n.contains('-') && !n.contains('_')),
        |_| 1.0,
    );
    let (tw, ta, tb, _, _) = overlap(&a.words, &b.words, |w| topic_w(w, scope));
    let (cw, ca, cb, _, _) = overlap(&a.class_members, &b.class_members, |_| W_WORD);
    let (iw, ia, ib, ia_only, ib_only) = overlap(&a.ids, &b.ids, |w| id_w(w, scope));
    // Values match on their canonical key (a bare 95 matches 95%).
    let (vw, va, vb, va_only, vb_only) = overlap(&a.value_keys, &b.value_keys, |_| W_VALUE);
    let dice = |both: f64, x: f64, y: f64| {
        if x + y > 0.0 {
            2.0 * both / (x + y)
        } else {
            0.0
        }
    };
    // Within a dimension (and counted noun), each side states a value the other lacks.
    let compatible = |x: &text::Value, y: &text::Value| {
        x.dim == y.dim
            && x.dim != Dim::Status
            && x.dim != Dim::Clock
            && (x.noun == y.noun || x.noun.is_empty() || y.noun.is_empty())
    };
    let one_way = |p: &Signature, q: &Signature| {
        p.values.iter().any(|x| {
            let mut comp = q.values.iter().filter(|y| compatible(x, y)).peekable();
            comp.peek().is_some() && comp.all(|y| y.key != x.key)
        })
    };
    let dim_conflict = one_way(a, b) && one_way(b, a);
    let apart_way = |p: &Signature, q: &Signature| {
        p.values.iter().any(|x| {
            let mut comp = q.values.iter().filter(|y| compatible(x, y)).peekable();
            comp.peek().is_some() && comp.all(|y| !rounds_alike(&x.key, &y.key))
        })
    };
    let dim_apart = dim_conflict && apart_way(a, b) && apart_way(b, a);
    let mut class_conflict = false;
    for c in [
        text::Class::Resource,
        text::Class::Percentile,
        text::Class::State,
        text::Class::Environment,
    ] {
        let mut ca = a.classes.iter().filter(|x| x.0 == c).map(|x| x.1.as_str());
        let cb = || b.classes.iter().filter(|x| x.0 == c).map(|x| x.1.as_str());
        let (a_any, b_any) = (ca.clone().next().is_some(), cb().next().is_some());
        if a_any && b_any && !ca.any(|x| cb().any(|y| y == x)) {
            class_conflict = true;
        }
    }
    Cmp {
        sim: dice(ww + iw + vw + cw, wa + ia + va + ca, wb + ib + vb + cb),
        slot: dice(sw + iw + cw, sa + ia + ca, sb + ib + cb),
        value_conflict: va_only && vb_only,
        dim_conflict,
        dim_apart,
        id_conflict: ia_only && ib_only,
        class_conflict,
        neg_diff: a.negated != b.negated,
        bound_diff: a.bound != b.bound,
        name_conflict: na_only && nb_only,
        entity_conflict: ea_only && eb_only,
        topic: dice(tw, ta, tb),
        topic_swap: ta > tw && tb > tw,
        values_shared: vw,
    }
}

/// Same-fact score of two wordings in one scope (0 when their values, identifiers or
/// exclusive qualifiers disagree), as [`Deduper::classify`] computes it.
pub fn similarity(scope: &str, a: &str, b: &str) -> f64 {
    compare(
        &text::signature(a),
        &text::signature(b),
        &scope.to_lowercase(),
    )
    .same_score()
}

/// Index tokens of a signature.
fn index_tokens(sig: &Signature) -> impl Iterator<Item = (usize, &str)> {
    // Identifiers, then values, then words, each sorted: the order the candidates'
    // weights are summed in.
    let ids = sig.ids.iter().map(|t| (TOK_ID, t.as_str()));
    let values = sig.value_keys.iter().map(|t| (TOK_VALUE, t.as_str()));
    let words = sig.words.iter().map(|t| (TOK_WORD, t.as_str()));
    ids.chain(values).chain(words)
}

const TOK_ID: usize = 0;
const TOK_VALUE: usize = 1;
const TOK_WORD: usize = 2;

/// FNV-1a for the deduper's maps: short keys, no need for SipHash's DoS resistance
/// (the keys are the user's own findings, and a map is per user).
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FnvMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<Fnv>>;

/// One scope's inverted index: per token kind (identifier, value, word), token -> facts,
/// sorted by fact index.
#[derive(Default)]
struct ScopeIndex {
    tokens: [FnvMap<String, Vec<u32>>; 3],
}

impl Deduper {
    /// An empty deduper.
    pub fn new(cfg: DedupConfig) -> Deduper {
        Deduper {
            cfg,
            facts: Vec::new(),
            scopes: FnvMap::default(),
            scope_names: Vec::new(),
            exact: FnvMap::default(),
            index: Vec::new(),
            vectors: Vec::new(),
            last_ts: Vec::new(),
            slots: Vec::new(),
            vectors_added: 0,
            semantic: false,
        }
    }

    /// An empty deduper for semantic mode only: it keeps neither the lexical signature of
    /// each wording nor the inverted index of them (memory and time that
    /// [`Deduper::classify_semantic`] never uses), so [`Deduper::classify`] on it finds
    /// exact repeats only.
    pub fn new_semantic(cfg: DedupConfig) -> Deduper {
        Deduper {
            semantic: true,
            ..Deduper::new(cfg)
        }
    }

    /// A wording's lexical signature, indexed under fact `f` (lexical mode only).
    fn lexical(&mut self, f: FactIdx, text: &str) -> Signature {
        if self.semantic {
            return Signature::default();
        }
        let sig = text::signature(text);
        self.index_variant(f, &sig);
        sig
    }

    /// The configuration.
    pub fn config(&self) -> &DedupConfig {
        &self.cfg
    }

    /// Number of facts.
    pub fn len(&self) -> usize {
        self.facts.len()
    }

    /// Whether there are no facts.
    pub fn is_empty(&self) -> bool {
        self.facts.is_empty()
    }

    /// The first wording of fact `f`.
    pub fn text(&self, f: FactIdx) -> &str {
        &self.facts[f].variants[0].text
    }

    /// The scope of fact `f`.
    pub fn scope(&self, f: FactIdx) -> &str {
        &self.scope_names[self.facts[f].scope as usize]
    }

    /// Number of wordings kept for fact `f`.
    pub fn variants(&self, f: FactIdx) -> usize {
        self.facts[f].variants.len()
    }

    /// Candidate facts of scope `sid` for `sig`, best prefilter overlap first (ties: lower
    /// index first), at most `candidates_max`.
    fn candidates(&self, sid: u32, sig: &Signature, scope_lc: &str) -> Vec<u32> {
        let Some(idx) = self.index.get(sid as usize) else {
            return Vec::new();
        };
        // Per fact, the shared tokens' weights, summed in token order.
        let mut acc: FnvMap<u32, f64> = FnvMap::default();
        for (kind, tok) in index_tokens(sig) {
            let Some(post) = idx.tokens[kind].get(tok) else {
                continue;
            };
            let w = match kind {
                TOK_WORD => word_w(tok, scope_lc),
                TOK_ID => id_w(tok, scope_lc),
                _ => W_VALUE,
            };
            // Rare tokens (identifiers, unusual values) say more than common words: weigh a
            // shared token by its weight over its posting length, a cheap IDF that only
            // ranks candidates (the score itself stays corpus-free).
            let w = w / post.len() as f64;
            let from = post.len().saturating_sub(self.cfg.postings_scan_max);
            for &f in &post[from..] {
                *acc.entry(f).or_insert(0.0) += w;
            }
        }
        let mut merged: Vec<(u32, f64)> = acc.into_iter().collect();
        merged.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        merged.truncate(self.cfg.candidates_max);
        merged.into_iter().map(|(f, _)| f).collect()
    }

    /// How `text` in `scope` relates to the known facts. Does not change the deduper.
    pub fn classify(&self, scope: &str, text: &str, judge: Option<&mut dyn Judge>) -> Classified {
        if let Some(&f) = self.exact.get(&text::exact_key(scope, text)) {
            return Classified {
                matched: Match::Exact(f),
                contradicts: Vec::new(),
                changes: Vec::new(),
            };
        }
        let none = Classified {
            matched: Match::New,
            contradicts: Vec::new(),
            changes: Vec::new(),
        };
        let Some(&sid) = self.scopes.get(scope) else {
            return none;
        };
        let sig = text::signature(text);
        let scope_lc = scope.to_lowercase();
        // (fact, best same-score, its variant, best contradiction score)
        let mut scored: Vec<(FactIdx, f64, usize, f64)> = Vec::new();
        for f in self.candidates(sid, &sig, &scope_lc) {
            let f = f as usize;
            let (mut best, mut best_v, mut contra) = (0.0f64, 0usize, 0.0f64);
            for (vi, v) in self.facts[f].variants.iter().enumerate() {
                let c = compare(&sig, &v.sig, &scope_lc);
                let s = c.same_score();
                if s > best {
                    best = s;
                    best_v = vi;
                }
                contra = contra.max(c.contra_score(&self.cfg));
            }
            scored.push((f, best, best_v, contra));
        }
        let mut matched = Match::New;
        let top = scored
            .iter()
            .filter(|x| x.1 > 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
        if let Some(&(f, s, vi, _)) = top {
            if s >= self.cfg.near_threshold {
                matched = Match::Near { fact: f, score: s };
            } else if s >= self.cfg.borderline_low {
                if let Some(j) = judge {
                    let other = &self.facts[f].variants[vi].text;
                    if j.same(scope, text, other, s) == Some(true) {
                        matched = Match::Judged { fact: f, score: s };
                    }
                }
            }
        }
        let mut contradicts = Vec::new();
        if !scope.is_empty() {
            let m = matched.fact();
            contradicts = scored
                .iter()
                .filter(|x| Some(x.0) != m && x.3 > 0.0)
                .map(|x| (x.0, x.3))
                .collect();
            contradicts.sort_by_key(|a| a.0);
        }
        Classified {
            matched,
            contradicts,
            changes: Vec::new(),
        }
    }

    fn index_variant(&mut self, f: FactIdx, sig: &Signature) {
        let sid = self.facts[f].scope as usize;
        let idx = &mut self.index[sid];
        for (kind, tok) in index_tokens(sig) {
            // Postings stay sorted by fact index whatever order wordings arrive in, so a
            // deduper rebuilt from the facts log (facts in number order, each with its
            // wordings) is identical to the one that wrote it; a token another wording
            // of the fact already indexed is found and not added twice.
            let map = &mut idx.tokens[kind];
            let post = match map.get_mut(tok) {
                Some(p) => p,
                None => map.entry(tok.to_string()).or_default(),
            };
            if let Err(at) = post.binary_search(&(f as u32)) {
                post.insert(at, f as u32);
            }
        }
    }

    /// Adds a new fact whose first wording is `text`.
    pub fn add_fact(&mut self, scope: &str, text: &str) -> FactIdx {
        let sid = match self.scopes.get(scope) {
            Some(&s) => s,
            None => {
                let s = self.scope_names.len() as u32;
                self.scopes.insert(scope.to_string(), s);
                self.scope_names.push(scope.to_string());
                self.index.push(ScopeIndex::default());
                s
            }
        };
        let f = self.facts.len();
        self.facts.push(Fact {
            scope: sid,
            variants: Vec::new(),
        });
        self.last_ts.push(None);
        let sig = self.lexical(f, text);
        self.facts[f].variants.push(Variant {
            text: text.to_string(),
            sig,
        });
        self.exact.entry(text::exact_key(scope, text)).or_insert(f);
        f
    }

    /// Remembers another wording of fact `f` (for later comparisons), unless it is an
    /// exact repeat or the fact already keeps `variants_max` wordings. Returns whether it
    /// was kept.
    pub fn add_variant(&mut self, f: FactIdx, text: &str) -> bool {
        let key = text::exact_key(self.scope(f), text);
        if self.exact.contains_key(&key) || self.facts[f].variants.len() >= self.cfg.variants_max {
            return false;
        }
        self.exact.insert(key, f);
        let sig = self.lexical(f, text);
        self.facts[f].variants.push(Variant {
            text: text.to_string(),
            sig,
        });
        true
    }
}

#[cfg(test)]
mod tests;
