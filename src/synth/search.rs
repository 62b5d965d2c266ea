//! Search of one user's memory (issue 15, item 6): the user's synthesized facts and the
//! findings (client entries, tracked tool calls left out) of the user's runs, ranked by
//! words and, when a sentence-embedding model is given, by meaning. `swarm search`,
//! `GET /v1/search` and the MCP tool `search_memory` all call [`search`].
//!
//! # Candidates
//! The user's current facts, and the client entries of the named run or of every open run
//! (the latest [`FINDINGS_PER_RUN_MAX`] per run, [`RUNS_MAX`] runs). Closed (archived)
//! runs are searched only when named: their findings reach a search through the facts
//! their synthesis made. Filters (agent, type, subject, since, until) apply to both.
//!
//! # Lexical rank
//! Each query word (lowercased, light suffix stripping, stopwords dropped) is weighted by
//! its rarity among the candidates (`ln(1 + N / df)`); a candidate scores the weight of
//! the query words it holds over the weight of all of them (0..1), plus a tenth of its
//! confidence. A candidate that holds no query word has no lexical rank.
//!
//! # Embedding rank and fusion
//! With an [`Embedder`], the query and the candidates' distinct texts are embedded (the
//! candidates in one batched call) and ranked by cosine; a candidate whose cosine is below
//! [`COSINE_FLOOR`] has no embedding rank. The two ranks are fused by reciprocal rank
//! fusion: `score = Σ 1 / (RRF_K + rank)` over the lists that rank the candidate. A hit is
//! a candidate with at least one rank, so a paraphrase that shares no word with the query
//! is found by meaning alone. Ties (equal scores) go to the newer, then to the lower fact
//! number or (run, seq): the same store and model give the same order on every call.
//! The first [`RERANK_TOP`] hits are then ordered again by what the question asks for
//! (`synth::rerank`: theories, what was ruled out, decisions, actions, causes,
//! resolutions), in both modes.
//! A finding whose text is the text of a fact ranked above it is left out: the fact
//! stands for it.
//!
//! **Invariant:** only the given store is read (one user), and findings are read as
//! `filters.reader`, so a run's policy hides from a search what it hides from a read.
//! **Invariant:** without a model the answer says `mode: lexical` and why, never silently.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;
use serde_json::Value;

use crate::embed::{dot, Embedder};
use crate::error::{Error, Result};
use crate::event::ts::Ts;
use crate::event::{Event, EventType};
use crate::query::options::ReadOptions;
use crate::store::Store;
use crate::synth::facts::parse_id;
use crate::synth::rerank::{self, Candidate, RERANK_TOP};
use crate::synth::views::{FactView, FactsQuery};

/// Latest matching entries read per run.
pub const FINDINGS_PER_RUN_MAX: usize = 2000;
/// Runs read per search, at most.
pub const RUNS_MAX: usize = 200;
/// Hits returned at most.
pub const HITS_MAX: usize = 100;
/// Distinct candidate texts embedded per search, at most (the newest first); the rest
/// keep their lexical rank only. Bounds a search's model time when the vector cache is
/// cold: at ~1 ms a text on two cores, this is a minute at worst.
pub const EMBED_TEXTS_MAX: usize = 50_000;
/// Query length, in bytes, at most.
pub const QUERY_BYTES_MAX: usize = 4096;
/// Reciprocal rank fusion's constant. 60 is the value of Cormack, Clarke and Büttcher
/// (SIGIR 2009), who found it robust across collections; it keeps the first few ranks of
/// one list from outweighing agreement between the two (1/61 vs 1/62 differ by 2 %, so a
/// candidate ranked well by both beats one ranked first by one alone), and it needs no
/// calibration of the two scores, which live on unrelated scales (a share of rare words;
/// a cosine whose typical range depends on the model).
pub const RRF_K: f64 = 60.0;
/// Cosine below which a candidate gets no embedding rank. With all-MiniLM-L6-v2 on the
/// labelled sets (`data/fixtures/semantic/`), a query and a text of the fact it asks for
/// score above it far more often than unrelated texts of the same user do (DESIGN.md,
/// Search, has the figures); unrelated texts that pass are then outranked by the ones that
/// also share words, and the floor keeps a query about nothing the user knows from
/// returning the least unrelated entries.
pub const COSINE_FLOOR: f32 = 0.3;

/// How [`search`] ranks: by words alone (with the reason no model is used), or by words
/// and meaning fused.
#[derive(Clone, Copy)]
pub enum Ranker<'a> {
    /// Words only; the reason (e.g. `no model at /var/lib/swarm/models/...`) is reported.
    Lexical(&'a str),
    /// Words and embeddings, fused by reciprocal rank.
    Hybrid(&'a dyn Embedder),
}

impl<'a> Ranker<'a> {
    /// Hybrid with `embedder`, else lexical for `reason`.
    pub fn new(embedder: Option<&'a dyn Embedder>, reason: &'a str) -> Ranker<'a> {
        match embedder {
            Some(e) => Ranker::Hybrid(e),
            None => Ranker::Lexical(reason),
        }
    }
}

/// What a hit is: a fact or a raw entry.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum Found {
    /// A fact (deduplicated, with its confidence, agents and runs).
    Fact {
        /// The fact.
        fact: FactView,
    },
    /// A client entry of a run.
    Finding {
        /// The entry.
        entry: Event,
    },
}

/// One ranked hit.
#[derive(Clone, Debug, Serialize)]
pub struct Hit {
    /// Rank score, higher is better: the lexical score in lexical mode, the fused
    /// reciprocal-rank score in hybrid mode; for the first hits of a question that
    /// states an intent, the second stage's: `1/(60 + place)` plus its bonus for the
    /// first hits, `1/(60 + place)` for the rest, so the scores fall down the list.
    pub score: f64,
    /// Lexical score (share of the query's rarity-weighted words, plus a tenth of the
    /// confidence), when the candidate holds a query word.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lexical: Option<f64>,
    /// Cosine with the query (hybrid mode), when the candidate was embedded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cosine: Option<f32>,
    /// The fact or entry.
    #[serde(flatten)]
    pub found: Found,
}

impl Hit {
    fn new(found: Found) -> Hit {
        Hit {
            score: 0.0,
            lexical: None,
            cosine: None,
            found,
        }
    }

    /// The text it is shown by (a fact's first wording, an entry's text).
    pub fn text(&self) -> String {
        match &self.found {
            Found::Fact { fact } => fact.text.clone(),
            Found::Finding { entry } => entry_text(&entry.content),
        }
    }

    fn subject(&self) -> Option<&str> {
        match &self.found {
            Found::Fact { fact } => fact.subject.as_deref(),
            Found::Finding { entry } => entry.subject.as_deref(),
        }
    }

    /// Every wording it is found by: a fact's first wording and the further ones it kept
    /// (a question may be phrased like any of them), an entry's text.
    fn texts(&self) -> Vec<String> {
        match &self.found {
            Found::Fact { fact } => std::iter::once(&fact.text)
                .chain(&fact.variants)
                .cloned()
                .collect(),
            Found::Finding { .. } => vec![self.text()],
        }
    }

    /// The words it is found by: those of its wordings and its subject.
    fn words(&self) -> BTreeSet<String> {
        let mut w: BTreeSet<String> = self.texts().iter().flat_map(|t| words(t)).collect();
        w.extend(self.subject().map(words).unwrap_or_default());
        w
    }

    fn confidence(&self) -> Option<f64> {
        match &self.found {
            Found::Fact { fact } => Some(fact.confidence),
            Found::Finding { entry } => entry.confidence,
        }
    }

    /// A fact's latest evidence, an entry's time.
    pub fn ts(&self) -> Option<Ts> {
        match &self.found {
            Found::Fact { fact } => fact.last_seen,
            Found::Finding { entry } => Some(entry.ts),
        }
    }

    /// The last tie-break: facts by number, then entries by (run, seq). Unique within a
    /// store, so the order of hits never depends on the order candidates were read in.
    fn key(&self) -> (u8, &str, u64) {
        match &self.found {
            Found::Fact { fact } => (
                0,
                "",
                parse_id('F', &fact.id).map_or(u64::MAX, |n| n as u64),
            ),
            Found::Finding { entry } => (1, entry.run_id.as_str(), entry.seq),
        }
    }

    /// The hit as a flat row (what `swarm search --json` and `GET /v1/search` print).
    pub fn row(&self) -> Row {
        let (fact_id, run, seq, agent, agents, kind) = match &self.found {
            Found::Fact { fact } => (
                Some(fact.id.clone()),
                None,
                None,
                None,
                Some(fact.agents.clone()),
                fact.kind.clone(),
            ),
            Found::Finding { entry } => (
                None,
                Some(entry.run_id.clone()),
                Some(entry.seq),
                Some(entry.agent_id.clone()),
                None,
                entry.kind.as_str().to_string(),
            ),
        };
        Row {
            source: match self.found {
                Found::Fact { .. } => "fact",
                Found::Finding { .. } => "finding",
            },
            score: self.score,
            lexical: self.lexical,
            cosine: self.cosine,
            text: self.text(),
            kind,
            subject: self.subject().map(str::to_string),
            fact_id,
            run,
            seq,
            agent,
            agents,
            ts: self.ts(),
        }
    }
}

/// A hit as one flat record: stable field names for scripts.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// `fact` or `finding`.
    pub source: &'static str,
    /// Rank score (see [`Hit::score`]).
    pub score: f64,
    /// Lexical score, when it holds a query word (null otherwise: every key is always
    /// there, for scripts).
    pub lexical: Option<f64>,
    /// Cosine with the query, in hybrid mode (null in lexical mode).
    pub cosine: Option<f32>,
    /// The text.
    pub text: String,
    /// Entry type (a fact's: of its first finding).
    pub kind: String,
    /// Subject, if any.
    pub subject: Option<String>,
    /// A fact's id (`F<n>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fact_id: Option<String>,
    /// A finding's run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// A finding's seq.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// A finding's agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// A fact's agents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    /// A finding's time, a fact's latest evidence.
    pub ts: Option<Ts>,
}

/// The answer of [`search`].
#[derive(Clone, Debug, Serialize)]
pub struct SearchAnswer {
    /// `lexical` or `hybrid`.
    pub mode: &'static str,
    /// The model's id, in hybrid mode.
    pub model: Option<String>,
    /// Why the search is lexical (no model, and where it was looked for); null in
    /// hybrid mode.
    pub reason: Option<String>,
    /// Facts considered.
    pub facts_considered: usize,
    /// Entries considered.
    pub findings_considered: usize,
    /// Distinct texts embedded (hybrid mode).
    pub texts_embedded: usize,
    /// The hits, best first.
    pub hits: Vec<Hit>,
}

/// The answer with its hits as [`Row`]s.
#[derive(Clone, Debug, Serialize)]
pub struct SearchRows {
    /// `lexical` or `hybrid`.
    pub mode: &'static str,
    /// The model's id, in hybrid mode.
    pub model: Option<String>,
    /// Why the search is lexical.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Facts considered.
    pub facts_considered: usize,
    /// Entries considered.
    pub findings_considered: usize,
    /// The hits, best first.
    pub hits: Vec<Row>,
}

impl SearchAnswer {
    /// The answer with flat rows instead of whole facts and events.
    pub fn rows(&self) -> SearchRows {
        SearchRows {
            mode: self.mode,
            model: self.model.clone(),
            reason: self.reason.clone(),
            facts_considered: self.facts_considered,
            findings_considered: self.findings_considered,
            hits: self.hits.iter().map(Hit::row).collect(),
        }
    }
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
    e.meta_flag("tracked")
}

/// Whether an entry records a look-up of the memory (`meta.memory_read`: a search, a
/// strategy or advice asked for; see `src/mcp/memory.rs`), not a finding.
pub fn is_memory_read(e: &Event) -> bool {
    e.meta
        .as_ref()
        .is_some_and(|m| m.contains_key("memory_read"))
}

/// Whether an entry is the memory's bookkeeping (a tracked tool call or a memory
/// look-up): never a finding, a fact or a search hit.
pub fn is_bookkeeping(e: &Event) -> bool {
    is_tracked_call(e) || is_memory_read(e)
}

fn facts(store: &Store, run: Option<&str>, f: &ReadOptions) -> Result<Vec<Hit>> {
    // A search made as an agent gets the facts it may see (see `FactsQuery::reader`).
    let fq = FactsQuery {
        subject: f.subject.clone(),
        reader: f.reader.clone(),
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
        .map(|fact| Hit::new(Found::Fact { fact }))
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
    for one in runs {
        // Damaged records are skipped (and logged): one damaged run must not fail the
        // search of all the others (`swarm runs` and `swarm verify` report it).
        let opts = ReadOptions {
            last: Some(FINDINGS_PER_RUN_MAX),
            skip_corrupt: true,
            ..f.clone()
        };
        // Read as an agent, the run's policy comes from its state, which a damaged
        // record can keep from being built: searching every run, that run is left out
        // and the others searched; a run asked for by name reports its damage.
        let mut it = match store.read(&one, opts) {
            Ok(it) => it,
            Err(e @ Error::Corrupt { .. }) if run.is_none() => {
                tracing::warn!(run = %one, error = %e, "search: run skipped (damaged)");
                continue;
            }
            Err(e) => return Err(e),
        };
        for e in it.by_ref() {
            let entry = e?;
            if entry.kind.is_client() && !is_bookkeeping(&entry) {
                out.push(Hit::new(Found::Finding { entry }));
            }
        }
        if let Some(d) = it.skipped().first() {
            tracing::warn!(run = %one, segment = %d.segment.display(), offset = d.offset, seq = d.seq, "search: damaged records skipped");
        }
    }
    Ok(out)
}

/// Sets each candidate's lexical score for the query words `q` (see the module doc);
/// `None` for a candidate that holds none of them.
fn score_lexical(q: &BTreeSet<String>, cands: &mut [Hit]) {
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
    for (h, d) in cands.iter_mut().zip(&docs) {
        let got: f64 = q.iter().filter(|w| d.contains(*w)).map(|w| weight(w)).sum();
        h.lexical =
            (got > 0.0 && total > 0.0).then(|| got / total + 0.1 * h.confidence().unwrap_or(0.5));
    }
}

/// Sets each candidate's cosine with `query`: the distinct texts of the newest
/// [`EMBED_TEXTS_MAX`] are embedded in one call. Returns how many texts were embedded.
fn score_embedding(e: &dyn Embedder, query: &str, cands: &mut [Hit]) -> Result<usize> {
    let qv = e.embed(&[query])?;
    let qv = match qv.as_slice() {
        [v] if v.len() == e.dim() => v,
        _ => {
            return Err(Error::invalid(
                "embedding",
                format!(
                    "model {} gave no {}-dimensional query vector",
                    e.id(),
                    e.dim()
                ),
            ))
        }
    };
    // Newest first, so the cap drops the oldest texts; ties by key (deterministic).
    let mut order: Vec<usize> = (0..cands.len()).collect();
    order.sort_by(|&a, &b| {
        cands[b]
            .ts()
            .cmp(&cands[a].ts())
            .then(cands[a].key().cmp(&cands[b].key()))
    });
    let texts: Vec<Vec<String>> = cands.iter().map(Hit::texts).collect();
    let mut slot: HashMap<&str, usize> = HashMap::new();
    let mut distinct: Vec<&str> = Vec::new();
    for &i in &order {
        for t in &texts[i] {
            let t = t.as_str();
            if !slot.contains_key(t) {
                if distinct.len() == EMBED_TEXTS_MAX {
                    continue;
                }
                slot.insert(t, distinct.len());
                distinct.push(t);
            }
        }
    }
    if distinct.is_empty() {
        return Ok(0);
    }
    let vs = e.embed(&distinct)?;
    if vs.len() != distinct.len() || vs.iter().any(|v| v.len() != e.dim()) {
        return Err(Error::invalid(
            "embedding",
            format!(
                "model {} gave {} vectors for {} texts (or a vector not of {} dimensions)",
                e.id(),
                vs.len(),
                distinct.len(),
                e.dim()
            ),
        ));
    }
    // A candidate's cosine is that of its nearest wording.
    for (h, ts) in cands.iter_mut().zip(&texts) {
        h.cosine = ts
            .iter()
            .filter_map(|t| slot.get(t.as_str()).map(|&s| dot(qv, &vs[s])))
            .reduce(f32::max);
    }
    Ok(distinct.len())
}

/// Best first by `score`, then newer, then key.
fn order(a: &Hit, b: &Hit, score: impl Fn(&Hit) -> f64) -> std::cmp::Ordering {
    score(b)
        .total_cmp(&score(a))
        .then(b.ts().cmp(&a.ts()))
        .then(a.key().cmp(&b.key()))
}

/// Reciprocal rank fusion of ranked lists of candidate indices (best first, each a
/// permutation of a subset of `0..n`): `Σ 1 / (k + rank)` per candidate, ranks from 1;
/// `None` for a candidate no list ranks.
pub fn rrf(n: usize, lists: &[&[usize]], k: f64) -> Vec<Option<f64>> {
    let mut fused = vec![None; n];
    for list in lists {
        for (rank, &i) in list.iter().enumerate() {
            let s: &mut Option<f64> = &mut fused[i];
            *s = Some(s.unwrap_or(0.0) + 1.0 / (k + (rank + 1) as f64));
        }
    }
    fused
}

/// Ranks scored candidates: lexical alone, or fused with the embedding rank when cosines
/// were set (`hybrid`). Drops candidates with no rank; at most `limit` hits.
fn rank(query: &str, mut cands: Vec<Hit>, hybrid: bool, limit: usize) -> Vec<Hit> {
    let lexical_score = |h: &Hit| h.lexical.unwrap_or(f64::NEG_INFINITY);
    if !hybrid {
        cands.retain(|h| h.lexical.is_some());
        for h in &mut cands {
            h.score = h.lexical.unwrap_or(f64::NEG_INFINITY);
        }
        cands.sort_by(|a, b| order(a, b, lexical_score));
        rerank(query, &mut cands);
        return collapse(cands, limit);
    }
    let ranked = |keep: &dyn Fn(&Hit) -> bool, by: &dyn Fn(&Hit) -> f64| -> Vec<usize> {
        let mut l: Vec<usize> = (0..cands.len()).filter(|&i| keep(&cands[i])).collect();
        l.sort_by(|&a, &b| order(&cands[a], &cands[b], by));
        l
    };
    let lex = ranked(&|h| h.lexical.is_some(), &lexical_score);
    let sem = ranked(&|h| h.cosine.is_some_and(|c| c >= COSINE_FLOOR), &|h| {
        h.cosine.map_or(f64::NEG_INFINITY, f64::from)
    });
    let fused = rrf(cands.len(), &[&lex, &sem], RRF_K);
    let mut hits: Vec<Hit> = cands
        .into_iter()
        .zip(fused)
        .filter_map(|(mut h, s)| {
            h.score = s?;
            Some(h)
        })
        .collect();
    hits.sort_by(|a, b| order(a, b, |h| h.score));
    rerank(query, &mut hits);
    collapse(hits, limit)
}

/// Reorders the first [`RERANK_TOP`] of `hits` (best first) by what `query` asks for
/// (`synth::rerank`); the rest keep their places after them.
fn rerank(query: &str, hits: &mut Vec<Hit>) {
    let Some(want) = rerank::intent(query) else {
        return;
    };
    let n = hits.len().min(RERANK_TOP);
    let cands: Vec<Candidate<'_>> = hits[..n]
        .iter()
        .map(|h| Candidate {
            texts: h.texts(),
            kind: match &h.found {
                Found::Fact { fact } => &fact.kind,
                Found::Finding { entry } => entry.kind.as_str(),
            },
        })
        .collect();
    let order = rerank::reorder(want, RRF_K, &cands);
    let mut head: Vec<Option<Hit>> = hits.drain(..n).map(Some).collect();
    let reordered: Vec<Hit> = order
        .into_iter()
        .map(|(pos, score)| {
            let mut h = head[pos].take().expect("a permutation");
            h.score = score;
            h
        })
        .collect();
    hits.splice(0..0, reordered);
    // The hits after them on the same scale, so scores fall down the whole list.
    for (place, h) in hits.iter_mut().enumerate().skip(n) {
        h.score = 1.0 / (RRF_K + (place + 1) as f64);
    }
}

/// The first `limit` of `hits` (best first), leaving out a finding whose text is the
/// text of a fact ranked above it: the fact stands for it (its wording, with the
/// evidence), and the slot goes to something the caller has not seen yet.
fn collapse(hits: Vec<Hit>, limit: usize) -> Vec<Hit> {
    let mut fact_texts: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::with_capacity(limit);
    for h in hits {
        if out.len() == limit {
            break;
        }
        match &h.found {
            Found::Fact { fact } => {
                fact_texts.insert(fact.text.clone());
                fact_texts.extend(fact.variants.iter().cloned());
            }
            Found::Finding { .. } if fact_texts.contains(&h.text()) => continue,
            Found::Finding { .. } => {}
        }
        out.push(h);
    }
    out
}

/// What to search for.
#[derive(Clone, Debug)]
pub struct SearchQuery<'a> {
    /// The query, in words.
    pub text: &'a str,
    /// Only this run (else every open run).
    pub run: Option<&'a str>,
    /// Agent, type, subject, since, until; `reader` applies the runs' policies.
    pub filters: ReadOptions,
    /// Hits wanted (1..[`HITS_MAX`]).
    pub limit: usize,
    /// Whether to search the user's facts too. Facts are drawn from every run of the
    /// user, past any run's read policy: with `filters.reader` only those whose every
    /// source the agent may read are searched ([`crate::synth::FactGate`]).
    pub facts: bool,
}

impl<'a> SearchQuery<'a> {
    /// `text` over facts and the findings of every open run, unfiltered, 10 hits.
    pub fn new(text: &'a str) -> SearchQuery<'a> {
        SearchQuery {
            text,
            run: None,
            filters: ReadOptions::default(),
            limit: 10,
            facts: true,
        }
    }
}

/// Searches the user's memory for `q.text`: facts (when `q.facts`) and findings (of
/// `q.run`, or of every open run), filtered by `q.filters`, ranked by `ranker`, at most
/// `q.limit` hits. The one entry point of search.
pub fn search(store: &Store, q: &SearchQuery<'_>, ranker: Ranker<'_>) -> Result<SearchAnswer> {
    let (text, run, filters) = (q.text, q.run, &q.filters);
    if text.len() > QUERY_BYTES_MAX {
        return Err(Error::invalid(
            "query",
            format!("{} bytes, at most {QUERY_BYTES_MAX}", text.len()),
        ));
    }
    if q.limit == 0 || q.limit > HITS_MAX {
        return Err(Error::invalid(
            "limit",
            format!("{} hits asked for; give 1 to {HITS_MAX}", q.limit),
        ));
    }
    let terms = words(text);
    // A query of stopwords alone can still be searched by meaning, not by words.
    if text.trim().is_empty() || (terms.is_empty() && matches!(ranker, Ranker::Lexical(_))) {
        return Err(Error::invalid(
            "query",
            "give at least one word of two or more letters or digits",
        ));
    }
    let f = match q.facts {
        true => facts(store, run, filters)?,
        false => Vec::new(),
    };
    let e = findings(store, run, filters)?;
    let (facts_considered, findings_considered) = (f.len(), e.len());
    let mut all = f;
    all.extend(e);
    score_lexical(&terms, &mut all);
    let limit = q.limit;
    Ok(match ranker {
        Ranker::Lexical(reason) => SearchAnswer {
            mode: "lexical",
            model: None,
            reason: Some(reason.to_string()),
            facts_considered,
            findings_considered,
            texts_embedded: 0,
            hits: rank(text, all, false, limit),
        },
        Ranker::Hybrid(model) => {
            let texts_embedded = score_embedding(model, text, &mut all)?;
            SearchAnswer {
                mode: "hybrid",
                model: Some(model.id().to_string()),
                reason: None,
                facts_considered,
                findings_considered,
                texts_embedded,
                hits: rank(text, all, true, limit),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::Table;

    fn entry(seq: u64, text: &str, conf: f64) -> Hit {
        Hit::new(Found::Finding {
            entry: Event {
                run_id: "r".into(),
                seq,
                ts: Ts(1_000 + seq),
                id: format!("e{seq}"),
                agent_id: "a".into(),
                user_id: "u".into(),
                kind: EventType::Evidence,
                content: Value::String(text.into()),
                confidence: Some(conf),
                refs: vec![],
                subject: None,
                session_id: None,
                meta: None,
            },
        })
    }

    fn texts(hits: &[Hit]) -> Vec<String> {
        hits.iter().map(Hit::text).collect()
    }

    fn lexical(q: &str, mut cands: Vec<Hit>) -> Vec<Hit> {
        score_lexical(&words(q), &mut cands);
        rank(q, cands, false, 10)
    }

    fn hybrid(t: &Table, q: &str, mut cands: Vec<Hit>) -> Vec<Hit> {
        score_lexical(&words(q), &mut cands);
        score_embedding(t, q, &mut cands).unwrap();
        rank(q, cands, true, 10)
    }

    #[test]
    fn rarer_words_rank_higher_and_non_matches_drop() {
        let r = lexical(
            "connection pool exhausted on orders-db",
            vec![
                entry(1, "orders-db is up", 0.5),
                entry(2, "the orders-db connection pool is exhausted", 0.5),
                entry(3, "dns resolution fails", 0.9),
            ],
        );
        assert_eq!(
            texts(&r),
            [
                "the orders-db connection pool is exhausted",
                "orders-db is up"
            ]
        );
        assert!(r[0].score > r[1].score);
    }

    fn fact(n: usize, text: &str) -> Hit {
        Hit::new(Found::Fact {
            fact: FactView {
                id: format!("F{n}"),
                subject: None,
                kind: "evidence".into(),
                kinds: Some(vec!["evidence".into()]),
                text: text.into(),
                status: "current",
                confidence: 0.5,
                weight: 0.5,
                evidence: 1,
                agents: vec!["a".into()],
                runs: vec!["r".into()],
                first_seen: Some(Ts(1_001)),
                last_seen: Some(Ts(1_001)),
                superseded: None,
                contradictions: vec![],
                wordings: 1,
                variants: vec![],
            },
        })
    }

    #[test]
    fn a_finding_a_fact_above_it_stands_for_is_left_out() {
        let r = lexical(
            "pool exhausted",
            vec![
                entry(1, "pool exhausted on orders-db", 0.5),
                fact(1, "pool exhausted on orders-db"),
                entry(2, "payments pool exhausted", 0.5),
            ],
        );
        let sources: Vec<(&str, String)> = r
            .iter()
            .map(|h| match &h.found {
                Found::Fact { .. } => ("fact", h.text()),
                Found::Finding { .. } => ("finding", h.text()),
            })
            .collect();
        assert_eq!(
            sources,
            [
                ("finding", "payments pool exhausted".to_string()),
                ("fact", "pool exhausted on orders-db".to_string()),
            ]
        );
    }

    /// A fact whose first wording shares nothing with the question but whose kept
    /// variant does: found by the variant, by words and by meaning, and a finding that
    /// repeats the variant is left out below it.
    #[test]
    fn a_fact_is_found_by_any_of_its_wordings() {
        let with_variant = || {
            let mut f = fact(1, "cpu steal on node-7");
            if let Found::Fact { fact } = &mut f.found {
                fact.variants = vec!["postgres pool is exhausted".into()];
                fact.wordings = 2;
                // Newer than the finding: it wins their tie and ranks above it.
                fact.last_seen = Some(Ts(2_000));
            }
            f
        };
        let lex = lexical("postgres pool", vec![with_variant()]);
        assert_eq!(
            texts(&lex),
            ["cpu steal on node-7"],
            "found by its variant's words"
        );
        let t = table();
        let h = hybrid(
            &t,
            "no free DB connections left",
            vec![with_variant(), entry(2, "postgres pool is exhausted", 0.5)],
        );
        // The fact's cosine is its nearest wording's (the variant, 0.95), not its first
        // wording's (0.1, below the floor); the finding with the variant's text is left out.
        assert_eq!(texts(&h), ["cpu steal on node-7"]);
        assert!(h[0].cosine.unwrap() > 0.9);
    }

    #[test]
    fn words_are_stemmed_and_stopwords_dropped() {
        let w = words("The pools were Exhausted");
        assert!(w.contains("pool") && w.contains("exhaust"));
        assert!(!w.contains("the") && !w.contains("were"));
    }

    #[test]
    fn rrf_sums_reciprocal_ranks_and_leaves_unranked_out() {
        let f = rrf(4, &[&[2, 0], &[0, 3]], 60.0);
        let (r1, r2) = (1.0 / 61.0, 1.0 / 62.0);
        assert!((f[0].unwrap() - (r2 + r1)).abs() < 1e-12);
        assert_eq!(f[1], None);
        assert!((f[2].unwrap() - r1).abs() < 1e-12);
        assert!((f[3].unwrap() - r2).abs() < 1e-12);
        // Agreement beats one first place: ranked 2nd by both > ranked 1st by one.
        let g = rrf(3, &[&[0, 1], &[2, 1]], 60.0);
        assert!(g[1] > g[0] && g[1] > g[2]);
    }

    /// Three texts on a plane: the query, its paraphrase (no shared word) close to it,
    /// and an unrelated text that shares a word.
    fn table() -> Table {
        let mut t = Table::new("test@0", 3);
        t.insert("no free DB connections left", vec![1.0, 0.0, 0.0])
            .unwrap();
        t.insert("postgres pool is exhausted", vec![0.9, 0.3, 0.0])
            .unwrap();
        t.insert("the free tier quota was raised", vec![0.0, 0.2, 1.0])
            .unwrap();
        t.insert("cpu steal on node-7", vec![0.1, 1.0, 0.3])
            .unwrap();
        t
    }

    #[test]
    fn a_paraphrase_is_found_by_meaning_in_hybrid_mode_only() {
        let cands = || {
            vec![
                entry(1, "postgres pool is exhausted", 0.5),
                entry(2, "the free tier quota was raised", 0.5),
                entry(3, "cpu steal on node-7", 0.5),
            ]
        };
        let q = "no free DB connections left";
        assert_eq!(
            texts(&lexical(q, cands())),
            ["the free tier quota was raised"]
        );
        let t = table();
        let h = hybrid(&t, q, cands());
        // The paraphrase: first by cosine (0.95), no lexical rank; the word match: first
        // lexically, below the floor by cosine; cpu steal: cosine 0.1 < floor, no word.
        assert_eq!(h.len(), 2);
        let para = h.iter().find(|x| x.lexical.is_none()).unwrap();
        assert_eq!(para.text(), "postgres pool is exhausted");
        assert!(para.cosine.unwrap() > 0.9);
        let word = h.iter().find(|x| x.lexical.is_some()).unwrap();
        assert!(word.cosine.unwrap() < COSINE_FLOOR);
        // Equal fused scores (each first in one list): the newer wins the tie.
        assert_eq!(h[0].score, h[1].score);
        assert_eq!(texts(&h)[0], "the free tier quota was raised");
        let mut older = cands();
        if let Found::Finding { entry } = &mut older[1].found {
            entry.ts = Ts(10);
        }
        let h2 = hybrid(&t, q, older);
        assert_eq!(
            texts(&h2),
            [
                "postgres pool is exhausted",
                "the free tier quota was raised"
            ]
        );
    }

    #[test]
    fn ranking_is_deterministic_whatever_the_candidate_order() {
        let t = table();
        let q = "no free DB connections left";
        let mk = || {
            vec![
                entry(1, "postgres pool is exhausted", 0.5),
                entry(2, "postgres pool is exhausted", 0.5),
                entry(3, "the free tier quota was raised", 0.7),
                entry(4, "cpu steal on node-7", 0.5),
            ]
        };
        let a = hybrid(&t, q, mk());
        let mut rev = mk();
        rev.reverse();
        let b = hybrid(&t, q, rev);
        let keys = |h: &[Hit]| -> Vec<(String, u64, u64)> {
            h.iter()
                .map(|x| {
                    let (_, r, s) = x.key();
                    (r.to_string(), s, x.score.to_bits())
                })
                .collect()
        };
        assert_eq!(keys(&a), keys(&b));
        assert_eq!(a.len(), 3);
    }

    #[test]
    fn an_embedder_that_returns_too_few_vectors_is_an_error() {
        struct Short;
        impl Embedder for Short {
            fn id(&self) -> &str {
                "short@0"
            }
            fn dim(&self) -> usize {
                2
            }
            fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
                // One vector for the query, one too few for the candidates.
                let n = texts.len().saturating_sub(1).max(1);
                Ok(vec![vec![1.0, 0.0]; n])
            }
        }
        let mut c = vec![entry(1, "a b", 0.5), entry(2, "c d", 0.5)];
        assert!(score_embedding(&Short, "q", &mut c).is_err());
    }
}
