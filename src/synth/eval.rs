//! Synthesis quality on a labelled set of agent findings, measured end to end: every
//! event goes through a real store (`append`), every user is synthesized (`synth`), and
//! the facts log's records are compared with the labels. The sets live in
//! `data/fixtures/semantic/` (`tune.jsonl`, and `heldout.jsonl`, written before any
//! tuning and never edited; see its README for the format).
//!
//! CONTRACT: [`evaluate_set`] reads `event` lines (`eid`, `user`, `run`, `agent_id`,
//! `type`, `subject`, `content`, `confidence`, `fact`) and relation lines
//! (`hard_negative`, `supersedes`, `contradiction` between fact labels; other kinds are
//! ignored), appends each user's events in file order under a data dir of its own, runs
//! the synthesizer, and reports:
//! - pair precision and recall: pairs of one user's events put in one fact, against pairs
//!   labelled as one fact;
//!   (an escalation the feed opens is resolved by the evaluator, so every event lands);
//! - hard negatives merged: labelled look-alike fact pairs with any two of their events
//!   in one fact;
//! - contradiction precision and recall: reported contradictions between facts that hold
//!   a labelled contradiction pair, against the labelled pairs;
//! - temporal changes flagged: labelled `supersedes` pairs reported as contradictions;
//! - cross-user merges: always 0 by construction (one store per user), counted anyway;
//! - search: for each `query` line (`user`, `text`, `fact`), the library's search
//!   ([`crate::synth::search::search`]) in that user's store, after synthesis; a query is
//!   answered at rank k when one of the first k hits is a fact with an evidence link to
//!   an event labelled with the fact, or such an event itself. Top-1 and top-3 rates;
//!   hits that belong to another user (an entry of another user, a fact holding another
//!   user's events) are counted, and must be 0; the misses are listed with what came
//!   instead.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::embed::Embedder;
use crate::error::{Error, Result};
use crate::event::{EventType, NewEvent};
use crate::log::meta::Durability;
use crate::query::options::ReadOptions;
use crate::store::Store;
use crate::synth::driver::SynthOptions;
use crate::synth::facts::{parse_id, Record, FACTS_RUN};
use crate::synth::search::{self, Found, Ranker, SearchQuery};

/// The figures of one labelled set.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SetReport {
    /// Events fed.
    pub events: usize,
    /// Users (one store each).
    pub users: usize,
    /// Labelled facts, and facts the synthesizer made.
    pub facts_labelled: usize,
    /// Facts the synthesizer made.
    pub facts_made: usize,
    /// Same-fact pairs labelled.
    pub true_pairs: u64,
    /// Pairs put in one fact.
    pub predicted_pairs: u64,
    /// Pairs in both.
    pub correct_pairs: u64,
    /// correct / predicted (1 when none predicted).
    pub pair_precision: f64,
    /// correct / true (1 when none labelled).
    pub pair_recall: f64,
    /// Labelled hard negatives, and how many were merged.
    pub hard_negatives: u64,
    /// Of them, merged (any two of their events in one fact).
    pub hard_negatives_merged: u64,
    /// Labelled contradictions.
    pub contradictions_labelled: u64,
    /// Contradictions reported.
    pub contradictions_reported: u64,
    /// Reported ones that hold a labelled pair.
    pub contradictions_correct: u64,
    /// Labelled ones found.
    pub contradictions_found: u64,
    /// correct / reported (1 when none reported).
    pub contradiction_precision: f64,
    /// found / labelled (1 when none labelled).
    pub contradiction_recall: f64,
    /// Labelled changes over time (`supersedes`).
    pub temporal_changes: u64,
    /// Of them, reported as contradictions.
    pub temporal_flagged: u64,
    /// Facts holding events of two users (always 0: one store per user).
    pub cross_user_merges: u64,
    /// How the search ranked: `lexical` or `hybrid`.
    pub search_mode: String,
    /// The model's id, in hybrid mode.
    pub search_model: Option<String>,
    /// Labelled queries.
    pub search_queries: u64,
    /// Queries whose first hit carries the labelled fact.
    pub search_top1: u64,
    /// Queries with the labelled fact among the first three hits.
    pub search_top3: u64,
    /// top1 / queries (1 when none).
    pub search_top1_rate: f64,
    /// top3 / queries (1 when none).
    pub search_top3_rate: f64,
    /// Hits (of the first three) that belong to another user than the query's: must be 0.
    pub search_foreign_hits: u64,
    /// The queries whose fact was not in the first three hits, with what came instead.
    pub search_misses: Vec<SearchMiss>,
    /// The labelled contradictions not reported (their two facts' labels).
    pub contradiction_misses: Vec<(String, String)>,
    /// The contradictions reported that no label holds (each side's fact labels).
    pub contradiction_false: Vec<(BTreeSet<String>, BTreeSet<String>)>,
    /// Calls to the optional LLM step (`SynthOptions::llm`), over every user.
    pub llm_calls: u64,
    /// Of them, those without a usable answer (the deterministic answer stood).
    pub llm_fallbacks: u64,
}

/// A labelled query the search missed (top 3).
#[derive(Clone, Debug, Serialize)]
pub struct SearchMiss {
    /// The user asked for.
    pub user: String,
    /// The question.
    pub query: String,
    /// The fact label it asks for.
    pub fact: String,
    /// The first three hits: source, the labels they carry, text.
    pub got: Vec<(String, Vec<String>, String)>,
}

/// Hits a labelled query looks at.
const SEARCH_TOP: usize = 3;
/// Why the evaluator's search is lexical when it is given no model.
const NO_MODEL: &str = "no embedding model given to the evaluator";

#[derive(Deserialize)]
struct Line {
    kind: String,
    #[serde(default)]
    eid: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    run: String,
    #[serde(default)]
    agent_id: String,
    #[serde(default, rename = "type")]
    kind_of_entry: String,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    content: serde_json::Value,
    #[serde(default)]
    confidence: Option<f64>,
    #[serde(default)]
    fact: String,
    /// When the agent observed it (RFC 3339): the event's `meta.observed_at`.
    #[serde(default)]
    ts: Option<String>,
    #[serde(default)]
    a: String,
    #[serde(default)]
    b: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    later: String,
    #[serde(default)]
    earlier: String,
}

fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        1.0
    } else {
        num as f64 / den as f64
    }
}

/// Feeds `set` (JSON lines) through stores under `root` (an empty directory) and the
/// synthesizer with `opts`, compares the facts with the labels, and runs the labelled
/// queries through the search (hybrid with `embedder`, else lexical).
pub fn evaluate_set(
    set: &str,
    root: &Path,
    opts: &SynthOptions,
    embedder: Option<&dyn Embedder>,
) -> Result<SetReport> {
    let mut events: Vec<Line> = Vec::new();
    let mut relations: Vec<Line> = Vec::new();
    for (n, raw) in set.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(raw)
            .map_err(|e| Error::invalid(format!("set line {}", n + 1), e.to_string()))?;
        match l.kind.as_str() {
            "event" => events.push(l),
            _ => relations.push(l),
        }
    }
    // (user, run, seq) of each event -> its label.
    let mut label: HashMap<(String, String, u64), String> = HashMap::new();
    let mut fact_user: BTreeMap<String, String> = BTreeMap::new();
    let mut users: BTreeMap<String, Store> = BTreeMap::new();
    for e in &events {
        let store = match users.get(&e.user) {
            Some(s) => s,
            None => {
                let s = Store::open(root)?.with_user(&e.user, false)?;
                users.entry(e.user.clone()).or_insert(s)
            }
        };
        let kind = EventType::parse_client(&e.kind_of_entry)?;
        let mut ev = NewEvent::new(&e.agent_id, kind, e.content.clone());
        ev.subject = e.subject.clone().filter(|s| !s.is_empty());
        ev.confidence = e.confidence;
        ev.id = Some(format!("eval-{}", e.eid));
        if let Some(ts) = &e.ts {
            let mut meta = serde_json::Map::new();
            meta.insert("observed_at".into(), serde_json::Value::String(ts.clone()));
            ev.meta = Some(meta);
        }
        // Contradictory actions on a subject open an escalation that blocks the next
        // one until a human resolves it: resolve it (no winner) and append again, so
        // every labelled event reaches the synthesizer.
        let stored = match store.append(&e.run, ev.clone(), Durability::None) {
            Err(Error::Escalated { escalation, .. }) => {
                store.resolve(&e.run, "evaluator", escalation, None, "evaluation feed")?;
                store.append(&e.run, ev, Durability::None)?
            }
            r => r?,
        };
        label.insert((e.user.clone(), e.run.clone(), stored.seq), e.fact.clone());
        fact_user.insert(e.fact.clone(), e.user.clone());
    }
    // Facts made: per user, fact id -> labels of its events; contradictions as pairs.
    let mut made: Vec<Vec<String>> = Vec::new();
    let mut reported: Vec<(BTreeSet<String>, BTreeSet<String>)> = Vec::new();
    // Per user: fact number -> its slot in `made`.
    let mut fact_slots: BTreeMap<String, BTreeMap<usize, usize>> = BTreeMap::new();
    let (mut llm_calls, mut llm_fallbacks) = (0, 0);
    for store in users.values() {
        let synth = store.synth(opts, |_| {})?;
        llm_calls += synth.llm_calls;
        llm_fallbacks += synth.llm_fallbacks;
        let mut index: BTreeMap<usize, usize> = BTreeMap::new();
        let mut contradictions: Vec<(usize, usize)> = Vec::new();
        for e in store.read(FACTS_RUN, ReadOptions::default())? {
            let e = e?;
            let Ok(rec) = serde_json::from_value::<Record>(e.content) else {
                continue;
            };
            match rec {
                Record::Fact { fact, evidence, .. } => {
                    let Some(i) = parse_id('F', &fact) else {
                        continue;
                    };
                    let slot = *index.entry(i).or_insert_with(|| {
                        made.push(Vec::new());
                        made.len() - 1
                    });
                    for link in &evidence {
                        let key = (store.user().to_string(), link.run().to_string(), link.seq());
                        if let Some(l) = label.get(&key) {
                            made[slot].push(l.clone());
                        }
                    }
                }
                Record::Contradiction { a, b, .. } => {
                    if let (Some(a), Some(b)) = (parse_id('F', &a), parse_id('F', &b)) {
                        contradictions.push((a, b));
                    }
                }
                _ => {}
            }
        }
        for (a, b) in contradictions {
            let labels = |i: usize| -> BTreeSet<String> {
                index
                    .get(&i)
                    .map(|&s| made[s].iter().cloned().collect())
                    .unwrap_or_default()
            };
            reported.push((labels(a), labels(b)));
        }
        fact_slots.insert(store.user().to_string(), index);
    }
    // A tuning aid: the facts made (their events' labels) and the contradictions.
    if let Ok(path) = std::env::var("SWARM_EVAL_DUMP") {
        let dump = serde_json::json!({ "made": made, "reported": reported });
        let _ = std::fs::write(path, dump.to_string());
    }
    let mut r = SetReport {
        events: events.len(),
        users: users.len(),
        facts_labelled: fact_user.len(),
        facts_made: made.len(),
        llm_calls,
        llm_fallbacks,
        ..SetReport::default()
    };
    // Pairs.
    let mut per_label: BTreeMap<&str, u64> = BTreeMap::new();
    for l in label.values() {
        *per_label.entry(l).or_default() += 1;
    }
    r.true_pairs = per_label
        .values()
        .map(|n| n * n.saturating_sub(1) / 2)
        .sum();
    for f in &made {
        let n = f.len() as u64;
        r.predicted_pairs += n * n.saturating_sub(1) / 2;
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        for l in f {
            *counts.entry(l).or_default() += 1;
        }
        r.correct_pairs += counts
            .values()
            .map(|n| n * n.saturating_sub(1) / 2)
            .sum::<u64>();
        let owners: BTreeSet<_> = f.iter().filter_map(|l| fact_user.get(l)).collect();
        r.cross_user_merges += u64::from(owners.len() > 1);
    }
    r.pair_precision = ratio(r.correct_pairs, r.predicted_pairs);
    r.pair_recall = ratio(r.correct_pairs, r.true_pairs);
    let together = |a: &str, b: &str| {
        made.iter()
            .any(|f| f.iter().any(|l| l == a) && f.iter().any(|l| l == b))
    };
    let across = |a: &str, b: &str| {
        reported
            .iter()
            .any(|(x, y)| (x.contains(a) && y.contains(b)) || (x.contains(b) && y.contains(a)))
    };
    let mut labelled_contradictions: Vec<(&str, &str)> = Vec::new();
    for rel in &relations {
        match rel.kind.as_str() {
            "hard_negative" => {
                r.hard_negatives += 1;
                r.hard_negatives_merged += u64::from(together(&rel.a, &rel.b));
            }
            "contradiction" => {
                r.contradictions_labelled += 1;
                let found = across(&rel.a, &rel.b);
                r.contradictions_found += u64::from(found);
                if !found {
                    r.contradiction_misses.push((rel.a.clone(), rel.b.clone()));
                }
                labelled_contradictions.push((&rel.a, &rel.b));
            }
            "supersedes" => {
                r.temporal_changes += 1;
                r.temporal_flagged += u64::from(across(&rel.later, &rel.earlier));
            }
            _ => {}
        }
    }
    r.contradictions_reported = reported.len() as u64;
    for (x, y) in &reported {
        let labelled = labelled_contradictions
            .iter()
            .any(|(a, b)| (x.contains(*a) && y.contains(*b)) || (x.contains(*b) && y.contains(*a)));
        if labelled {
            r.contradictions_correct += 1;
        } else {
            r.contradiction_false.push((x.clone(), y.clone()));
        }
    }
    r.contradiction_precision = ratio(r.contradictions_correct, r.contradictions_reported);
    r.contradiction_recall = ratio(r.contradictions_found, r.contradictions_labelled);
    // Search: each labelled query in its user's store.
    let ranker = Ranker::new(embedder, NO_MODEL);
    r.search_mode = match ranker {
        Ranker::Lexical(_) => "lexical",
        Ranker::Hybrid(_) => "hybrid",
    }
    .to_string();
    r.search_model = embedder.map(|e| e.id().to_string());
    let no_slots = BTreeMap::new();
    for q in relations.iter().filter(|l| l.kind == "query") {
        r.search_queries += 1;
        let Some(store) = users.get(&q.user) else {
            continue; // a user with no events: nothing to find
        };
        let slots = fact_slots.get(&q.user).unwrap_or(&no_slots);
        let query = SearchQuery {
            limit: SEARCH_TOP,
            ..SearchQuery::new(&q.text)
        };
        let hits = match search::search(store, &query, ranker) {
            Ok(a) => a.hits,
            // A query with no searchable word is a miss; any other error (a model's) stops.
            Err(Error::Invalid { field, .. }) if field == "query" => Vec::new(),
            Err(e) => return Err(e),
        };
        // The labels each hit carries, and whether it belongs to another user.
        let mut carries: Vec<bool> = Vec::new();
        let mut got = Vec::new();
        for h in &hits {
            let (labels, foreign): (Vec<&String>, bool) = match &h.found {
                Found::Fact { fact } => {
                    let ls: Vec<&String> = parse_id('F', &fact.id)
                        .and_then(|i| slots.get(&i))
                        .map(|&s| made[s].iter().collect())
                        .unwrap_or_default();
                    let foreign = ls.iter().any(|l| fact_user.get(*l) != Some(&q.user));
                    (ls, foreign)
                }
                Found::Finding { entry } => {
                    let key = (q.user.clone(), entry.run_id.clone(), entry.seq);
                    let ls: Vec<&String> = label.get(&key).into_iter().collect();
                    (ls, entry.user_id != q.user)
                }
            };
            r.search_foreign_hits += u64::from(foreign);
            carries.push(labels.iter().any(|l| **l == q.fact));
            let source = match h.found {
                Found::Fact { .. } => "fact",
                Found::Finding { .. } => "finding",
            };
            let mut labels: Vec<String> = labels.into_iter().cloned().collect();
            labels.sort();
            labels.dedup();
            got.push((source.to_string(), labels, h.text()));
        }
        r.search_top1 += u64::from(carries.first() == Some(&true));
        let found = carries.iter().take(SEARCH_TOP).any(|c| *c);
        r.search_top3 += u64::from(found);
        if !found {
            r.search_misses.push(SearchMiss {
                user: q.user.clone(),
                query: q.text.clone(),
                fact: q.fact.clone(),
                got,
            });
        }
    }
    r.search_top1_rate = ratio(r.search_top1, r.search_queries);
    r.search_top3_rate = ratio(r.search_top3, r.search_queries);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny hand-checked set: two paraphrases (one fact), a look-alike, and a
    /// contradiction; the figures follow from what the synthesizer made of them.
    const SET: &str = r#"{"kind":"about"}
{"kind":"event","eid":"1","user":"u","run":"r","agent_id":"a","type":"evidence","subject":"db","content":"postgres pool exhausted 100/100","fact":"F1"}
{"kind":"event","eid":"2","user":"u","run":"r","agent_id":"b","type":"evidence","subject":"db","content":"postgres pool exhausted 100/100","fact":"F1"}
{"kind":"event","eid":"3","user":"v","run":"r","agent_id":"a","type":"evidence","subject":"db","content":"postgres pool exhausted 100/100","fact":"F2"}
{"kind":"hard_negative","a":"F1","b":"F2"}
{"kind":"query","user":"v","text":"is the postgres pool exhausted?","fact":"F2"}
{"kind":"query","user":"u","text":"no spare connections left","fact":"F1"}"#;

    #[test]
    fn figures_follow_from_the_facts_made() {
        let dir = tempfile::tempdir().unwrap();
        let r = evaluate_set(SET, dir.path(), &SynthOptions::default(), None).unwrap();
        assert_eq!((r.events, r.users, r.facts_labelled), (3, 2, 2));
        // Exact repeats of one user merge; the other user's identical text never does.
        assert_eq!(
            (r.true_pairs, r.predicted_pairs, r.correct_pairs),
            (1, 1, 1)
        );
        assert_eq!((r.hard_negatives, r.hard_negatives_merged), (1, 0));
        assert_eq!(r.cross_user_merges, 0);
        assert_eq!(r.facts_made, 2);
        // By words, v's question is answered (by v's own fact, never u's identical one)
        // and u's paraphrase with no shared word is not.
        assert_eq!(r.search_mode, "lexical");
        assert_eq!((r.search_queries, r.search_top1, r.search_top3), (2, 1, 1));
        assert_eq!(r.search_foreign_hits, 0);
        assert_eq!(r.search_misses.len(), 1);
        assert_eq!(
            (
                r.search_misses[0].user.as_str(),
                r.search_misses[0].fact.as_str()
            ),
            ("u", "F1")
        );
        assert!(r.search_misses[0].got.is_empty());
    }

    #[test]
    fn a_model_lets_the_search_answer_a_paraphrase() {
        let mut t = crate::embed::Table::new("t@0", 2);
        t.insert("postgres pool exhausted 100/100", vec![1.0, 0.1])
            .unwrap();
        t.insert("is the postgres pool exhausted?", vec![1.0, 0.0])
            .unwrap();
        t.insert("no spare connections left", vec![0.9, 0.2])
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let r = evaluate_set(SET, dir.path(), &SynthOptions::default(), Some(&t)).unwrap();
        assert_eq!(r.search_mode, "hybrid");
        assert_eq!(r.search_model.as_deref(), Some("t@0"));
        assert_eq!((r.search_queries, r.search_top1, r.search_top3), (2, 2, 2));
        assert_eq!(r.search_foreign_hits, 0);
    }
}
