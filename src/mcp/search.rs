//! `search_memory`'s search: lexical, over the user's synthesized facts and the findings
//! (client entries, tracked tool calls left out) of the user's runs, ranked. Everything
//! goes through [`search`], so the semantic search of issue 15 can replace the ranking
//! without touching the tools.
//!
//! Ranking: each query word (lowercased, light suffix stripping, stopwords dropped) is
//! weighted by its rarity among the candidates (`ln(1 + N / df)`); a candidate scores the
//! weight of the query words it holds over the weight of all of them (0..1), plus a tenth
//! of its confidence; ties go to the newer. A candidate that holds no query word is not a
//! hit.
//!
//! Closed (archived) runs are searched only when named: their findings reach a search
//! through the facts their synthesis made (`complete_investigation` synthesizes).
//!
//! **Invariant:** only the session's store is read (one user), and findings are read as
//! the session's agent, so the run's policy hides what it hides from `read_entries`.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::event::ts::Ts;
use crate::event::{Event, EventType};
use crate::query::options::ReadOptions;
use crate::store::Store;
use crate::synth::views::{FactView, FactsQuery};

/// Latest matching entries read per run.
pub const FINDINGS_PER_RUN_MAX: usize = 2000;
/// Runs read per search, at most.
pub const RUNS_MAX: usize = 200;
/// Hits returned at most.
pub const HITS_MAX: usize = 100;

/// One ranked hit: a synthesized fact or a raw entry of a run.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum Hit {
    /// A fact (deduplicated, with its confidence, agents and runs).
    Fact {
        /// Rank score (higher is better).
        score: f64,
        /// The fact.
        fact: FactView,
    },
    /// A client entry of an open run.
    Finding {
        /// Rank score (higher is better).
        score: f64,
        /// The entry.
        entry: Event,
    },
}

impl Hit {
    fn score_mut(&mut self) -> &mut f64 {
        match self {
            Hit::Fact { score, .. } | Hit::Finding { score, .. } => score,
        }
    }

    fn score(&self) -> f64 {
        match self {
            Hit::Fact { score, .. } | Hit::Finding { score, .. } => *score,
        }
    }

    /// The words it is found by: its text and its subject.
    fn words(&self) -> BTreeSet<String> {
        let (text, subject) = match self {
            Hit::Fact { fact, .. } => (fact.text.clone(), fact.subject.as_deref()),
            Hit::Finding { entry, .. } => (entry_text(&entry.content), entry.subject.as_deref()),
        };
        let mut w = words(&text);
        w.extend(subject.map(words).unwrap_or_default());
        w
    }

    fn confidence(&self) -> Option<f64> {
        match self {
            Hit::Fact { fact, .. } => Some(fact.confidence),
            Hit::Finding { entry, .. } => entry.confidence,
        }
    }

    fn ts(&self) -> Option<Ts> {
        match self {
            Hit::Fact { fact, .. } => fact.last_seen,
            Hit::Finding { entry, .. } => Some(entry.ts),
        }
    }
}

/// The answer of [`search`].
#[derive(Clone, Debug, Serialize)]
pub struct SearchAnswer {
    /// `lexical` (for now).
    pub mode: &'static str,
    /// Facts considered.
    pub facts_considered: usize,
    /// Entries considered.
    pub findings_considered: usize,
    /// The hits, best first.
    pub hits: Vec<Hit>,
}

const STOPWORDS: &str = "a an and are as at be by for from has have in into is it its of on or that the this to was were with we our not no";

/// The query words of `text`: lowercased alphanumeric runs of 2+ characters, stopwords
/// dropped, a plural or verb suffix stripped.
pub fn words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 2)
        .map(|w| stem(&w.to_lowercase()))
        .filter(|w| !STOPWORDS.split(' ').any(|s| s == w))
        .collect()
}

fn stem(w: &str) -> String {
    for suffix in ["ing", "ed", "es", "s"] {
        if let Some(b) = w.strip_suffix(suffix) {
            if b.chars().count() >= 3 && !w.ends_with("ss") {
                return b.to_string();
            }
        }
    }
    w.to_string()
}

/// The text of an entry's content: a string, or an object's `text` / `claim` /
/// `finding` / `summary`, or its JSON.
pub fn entry_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Object(o) => ["text", "claim", "finding", "summary"]
            .iter()
            .find_map(|k| o.get(*k).and_then(Value::as_str))
            .map_or_else(|| content.to_string(), str::to_string),
        other => other.to_string(),
    }
}

/// Whether an entry records a tool call for tracking (not a finding).
pub fn is_tracked_call(e: &Event) -> bool {
    e.meta
        .as_ref()
        .and_then(|m| m.get("tracked"))
        .and_then(Value::as_bool)
        == Some(true)
}

fn facts(store: &Store, run: Option<&str>, f: &ReadOptions) -> Result<Vec<Hit>> {
    let fq = FactsQuery {
        subject: f.subject.clone(),
        ..FactsQuery::default()
    };
    let ans = match store.facts(&fq) {
        Ok(a) => a,
        Err(Error::RunNotFound(_)) => return Ok(Vec::new()), // no synthesis yet
        Err(e) => return Err(e),
    };
    let kind = f.kind.map(EventType::as_str);
    Ok(ans
        .facts
        .into_iter()
        .filter(|x| run.is_none_or(|r| x.runs.iter().any(|y| y == r)))
        .filter(|x| f.agent.as_ref().is_none_or(|a| x.agents.contains(a)))
        .filter(|x| kind.is_none_or(|k| x.kind == k))
        .filter(|x| f.since.is_none_or(|t| x.last_seen.is_some_and(|l| l >= t)))
        .filter(|x| f.until.is_none_or(|t| x.first_seen.is_some_and(|l| l <= t)))
        .map(|fact| Hit::Fact { score: 0.0, fact })
        .collect())
}

fn findings(store: &Store, run: Option<&str>, f: &ReadOptions) -> Result<Vec<Hit>> {
    let runs = match run {
        Some(r) => vec![r.to_string()],
        None => {
            let mut open = Vec::new();
            for r in store.run_ids()?.into_iter().filter(|r| !r.starts_with('@')) {
                // A closed run is read from its archive (unpacked whole): its findings
                // reach the search through the facts its synthesis made instead.
                if store.archived(&r)?.is_none() {
                    open.push(r);
                }
                if open.len() == RUNS_MAX {
                    break;
                }
            }
            open
        }
    };
    let mut out = Vec::new();
    for run in runs {
        let opts = ReadOptions {
            last: Some(FINDINGS_PER_RUN_MAX),
            ..f.clone()
        };
        for e in store.read(&run, opts)? {
            let entry = e?;
            if entry.kind.is_client() && !is_tracked_call(&entry) {
                out.push(Hit::Finding { score: 0.0, entry });
            }
        }
    }
    Ok(out)
}

/// Ranks `cands` for the query words `q` (see the module doc); drops non-matches.
pub fn rank(q: &BTreeSet<String>, cands: Vec<Hit>, limit: usize) -> Vec<Hit> {
    let docs: Vec<BTreeSet<String>> = cands.iter().map(Hit::words).collect();
    let n = docs.len().max(1) as f64;
    let mut df: HashMap<&str, usize> = HashMap::new();
    for d in &docs {
        for w in q.iter().filter(|w| d.contains(*w)) {
            *df.entry(w.as_str()).or_default() += 1;
        }
    }
    let weight = |w: &str| (1.0 + n / df.get(w).copied().unwrap_or(1) as f64).ln();
    let total: f64 = q.iter().map(|w| weight(w)).sum();
    let mut hits: Vec<Hit> = cands
        .into_iter()
        .zip(&docs)
        .filter_map(|(mut h, d)| {
            let got: f64 = q.iter().filter(|w| d.contains(*w)).map(|w| weight(w)).sum();
            if got <= 0.0 || total <= 0.0 {
                return None;
            }
            *h.score_mut() = got / total + 0.1 * h.confidence().unwrap_or(0.5);
            Some(h)
        })
        .collect();
    hits.sort_by(|a, b| b.score().total_cmp(&a.score()).then(b.ts().cmp(&a.ts())));
    hits.truncate(limit);
    hits
}

/// Searches the user's memory for `text`: facts and findings (of `run`, or of every open
/// run), filtered by `filters` (agent, type, subject, since, until; `reader` applies the
/// runs' policies), ranked, at most `limit` hits. The one entry point of search.
pub fn search(
    store: &Store,
    text: &str,
    run: Option<&str>,
    filters: &ReadOptions,
    limit: usize,
) -> Result<SearchAnswer> {
    let terms = words(text);
    if terms.is_empty() {
        return Err(Error::invalid(
            "query",
            "give at least one word of two or more letters or digits",
        ));
    }
    let f = facts(store, run, filters)?;
    let e = findings(store, run, filters)?;
    let (facts_considered, findings_considered) = (f.len(), e.len());
    let mut all = f;
    all.extend(e);
    Ok(SearchAnswer {
        mode: "lexical",
        facts_considered,
        findings_considered,
        hits: rank(&terms, all, limit.clamp(1, HITS_MAX)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(text: &str, conf: f64) -> Hit {
        let mut entry = crate::event::Event {
            run_id: "r".into(),
            seq: 1,
            ts: Ts::now(),
            id: "e".into(),
            agent_id: "a".into(),
            user_id: "u".into(),
            kind: EventType::Evidence,
            content: Value::String(text.into()),
            confidence: Some(conf),
            refs: vec![],
            subject: None,
            session_id: None,
            meta: None,
        };
        entry.confidence = Some(conf);
        Hit::Finding { score: 0.0, entry }
    }

    #[test]
    fn rarer_words_rank_higher_and_non_matches_drop() {
        let q = words("connection pool exhausted on orders-db");
        let r = rank(
            &q,
            vec![
                hit("orders-db is up", 0.5),
                hit("the orders-db connection pool is exhausted", 0.5),
                hit("dns resolution fails", 0.9),
            ],
            10,
        );
        assert_eq!(r.len(), 2);
        let Hit::Finding { entry, .. } = &r[0] else {
            panic!("a finding")
        };
        assert!(entry_text(&entry.content).contains("pool"));
        assert!(r[0].score() > r[1].score());
    }

    #[test]
    fn words_are_stemmed_and_stopwords_dropped() {
        let w = words("The pools were Exhausted");
        assert!(w.contains("pool") && w.contains("exhaust"));
        assert!(!w.contains("the") && !w.contains("were"));
    }
}
