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

use std::collections::HashMap;

use crate::synth::text;

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
}

impl Default for DedupConfig {
    fn default() -> Self {
        DedupConfig {
            near_threshold: 0.6,
            borderline_low: 0.45,
            variants_max: 4,
            candidates_max: 32,
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
}

/// An outside opinion on borderline pairs (the optional LLM step).
pub trait Judge {
    /// Whether `a` and `b` (same scope) state the same fact; `None` = no opinion (time-out,
    /// failure), and the deterministic answer stands.
    fn same(&mut self, scope: &str, a: &str, b: &str, score: f64) -> Option<bool>;
}

struct Fact {
    scope: u32,
    text: String,
    variants: usize,
}

/// The in-memory dedup engine; memory grows with distinct facts and wordings kept, never
/// with the number of findings classified.
pub struct Deduper {
    cfg: DedupConfig,
    facts: Vec<Fact>,
    scopes: HashMap<String, u32>,
    scope_names: Vec<String>,
    exact: HashMap<u64, FactIdx>,
}

impl Deduper {
    /// An empty deduper.
    pub fn new(cfg: DedupConfig) -> Deduper {
        Deduper {
            cfg,
            facts: Vec::new(),
            scopes: HashMap::new(),
            scope_names: Vec::new(),
            exact: HashMap::new(),
        }
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
        &self.facts[f].text
    }

    /// The scope of fact `f`.
    pub fn scope(&self, f: FactIdx) -> &str {
        &self.scope_names[self.facts[f].scope as usize]
    }

    /// How `text` in `scope` relates to the known facts. Does not change the deduper.
    pub fn classify(&self, scope: &str, text: &str, _judge: Option<&mut dyn Judge>) -> Classified {
        let matched = match self.exact.get(&text::exact_key(scope, text)) {
            Some(&f) => Match::Exact(f),
            None => Match::New,
        };
        Classified {
            matched,
            contradicts: Vec::new(),
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
                s
            }
        };
        let f = self.facts.len();
        self.facts.push(Fact {
            scope: sid,
            text: text.to_string(),
            variants: 1,
        });
        self.exact.entry(text::exact_key(scope, text)).or_insert(f);
        f
    }

    /// Remembers another wording of fact `f` (for later comparisons), unless it is an
    /// exact repeat or the fact already keeps `variants_max` wordings. Returns whether it
    /// was kept.
    pub fn add_variant(&mut self, f: FactIdx, text: &str) -> bool {
        let key = text::exact_key(self.scope(f), text);
        if self.exact.contains_key(&key) || self.facts[f].variants >= self.cfg.variants_max {
            return false;
        }
        self.exact.insert(key, f);
        self.facts[f].variants += 1;
        true
    }
}
