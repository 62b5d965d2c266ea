//! Dedup and contradiction quality on a labelled fixture (`data/fixtures/synth-quality.jsonl`).
//!
//! CONTRACT: [`evaluate`] reads the fixture's JSON lines (`kind`: `about`, `finding`
//! with `part`, `cluster`, `agent`, `subject`, `text`, `item`; `contradiction` with
//! `part`, `a`, `b` naming clusters), runs each part through a fresh
//! [`Deduper`] in file order with the subject as the scope, and
//! reports pairwise precision and recall of the clustering and the detection of the
//! labelled contradictions, per part.

use serde::Serialize;

use crate::error::Result;
use std::collections::{BTreeMap, BTreeSet};

use crate::error::Error;
use crate::synth::dedup::{DedupConfig, Deduper, Match};

/// Quality of one part of the fixture.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PartReport {
    /// `tune` or `heldout`.
    pub part: String,
    /// Findings in the part.
    pub findings: usize,
    /// Facts the deduper made of them.
    pub facts: usize,
    /// Pairs of findings labelled as the same fact.
    pub true_pairs: u64,
    /// Pairs the deduper put in one fact.
    pub predicted_pairs: u64,
    /// Pairs in both.
    pub correct_pairs: u64,
    /// correct / predicted (1 when nothing was predicted).
    pub precision: f64,
    /// correct / true (1 when nothing is labelled).
    pub recall: f64,
    /// Labelled contradictions (cluster pairs).
    pub contradictions_labelled: u64,
    /// Contradictions the deduper reported (as cluster pairs, by majority label).
    pub contradictions_reported: u64,
    /// Reported and labelled.
    pub contradictions_correct: u64,
    /// correct / reported (1 when none reported).
    pub contradiction_precision: f64,
    /// correct / labelled (1 when none labelled).
    pub contradiction_recall: f64,
}

/// The report of [`evaluate`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct QualityReport {
    /// One entry per part, in order of first appearance in the fixture.
    pub parts: Vec<PartReport>,
}

/// One labelled finding of the fixture.
struct Finding {
    cluster: String,
    subject: String,
    text: String,
}

fn pairs(n: u64) -> u64 {
    n * n.saturating_sub(1) / 2
}

fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        1.0
    } else {
        num as f64 / den as f64
    }
}

fn field<'a>(v: &'a serde_json::Value, k: &str, line: usize) -> Result<&'a str> {
    v.get(k).and_then(|x| x.as_str()).ok_or_else(|| {
        Error::invalid(
            format!("fixture line {line}"),
            format!("missing string field {k:?}"),
        )
    })
}

/// Evaluates the deduper on a fixture's text.
pub fn evaluate(fixture: &str, cfg: &DedupConfig) -> Result<QualityReport> {
    let mut order: Vec<String> = Vec::new();
    let mut findings: BTreeMap<String, Vec<Finding>> = BTreeMap::new();
    let mut contras: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for (n, line) in fixture.lines().enumerate() {
        let line_no = n + 1;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| Error::invalid(format!("fixture line {line_no}"), e.to_string()))?;
        match v.get("kind").and_then(|k| k.as_str()) {
            Some("finding") => {
                let part = field(&v, "part", line_no)?.to_string();
                if !order.contains(&part) {
                    order.push(part.clone());
                }
                findings.entry(part).or_default().push(Finding {
                    cluster: field(&v, "cluster", line_no)?.to_string(),
                    subject: v
                        .get("subject")
                        .and_then(|s| s.as_str())
                        .unwrap_or("")
                        .to_string(),
                    text: field(&v, "text", line_no)?.to_string(),
                });
            }
            Some("contradiction") => {
                let part = field(&v, "part", line_no)?.to_string();
                if !order.contains(&part) {
                    order.push(part.clone());
                }
                let (a, b) = (field(&v, "a", line_no)?, field(&v, "b", line_no)?);
                let pair = if a <= b { (a, b) } else { (b, a) };
                contras
                    .entry(part)
                    .or_default()
                    .insert((pair.0.to_string(), pair.1.to_string()));
            }
            _ => {}
        }
    }
    let mut report = QualityReport::default();
    for part in order {
        let empty = Vec::new();
        let fs = findings.get(&part).unwrap_or(&empty);
        let labelled = contras.remove(&part).unwrap_or_default();
        report.parts.push(evaluate_part(&part, fs, &labelled, cfg));
    }
    Ok(report)
}

fn evaluate_part(
    part: &str,
    fs: &[Finding],
    labelled: &BTreeSet<(String, String)>,
    cfg: &DedupConfig,
) -> PartReport {
    let mut d = Deduper::new(cfg.clone());
    let mut fact_of: Vec<usize> = Vec::with_capacity(fs.len());
    let mut reported_facts: BTreeSet<(usize, usize)> = BTreeSet::new();
    for f in fs {
        let c = d.classify(&f.subject, &f.text, None);
        let fact = match c.matched {
            Match::New => d.add_fact(&f.subject, &f.text),
            ref m => {
                let fact = m.fact().unwrap_or(0);
                d.add_variant(fact, &f.text);
                fact
            }
        };
        for (g, _) in c.contradicts {
            reported_facts.insert((fact.min(g), fact.max(g)));
        }
        fact_of.push(fact);
    }
    // Pairwise counts from group sizes.
    let mut by_cluster: BTreeMap<&str, u64> = BTreeMap::new();
    let mut by_fact: BTreeMap<usize, u64> = BTreeMap::new();
    let mut by_both: BTreeMap<(&str, usize), u64> = BTreeMap::new();
    for (f, &fact) in fs.iter().zip(&fact_of) {
        *by_cluster.entry(&f.cluster).or_default() += 1;
        *by_fact.entry(fact).or_default() += 1;
        *by_both.entry((&f.cluster, fact)).or_default() += 1;
    }
    let true_pairs: u64 = by_cluster.values().map(|&n| pairs(n)).sum();
    let predicted_pairs: u64 = by_fact.values().map(|&n| pairs(n)).sum();
    let correct_pairs: u64 = by_both.values().map(|&n| pairs(n)).sum();
    // Majority cluster of each fact (ties: the smallest label).
    let mut label: BTreeMap<usize, &str> = BTreeMap::new();
    for (&(cluster, fact), &n) in &by_both {
        let cur = label.get(&fact).map(|c| by_both[&(*c, fact)]).unwrap_or(0);
        if n > cur {
            label.insert(fact, cluster);
        }
    }
    let reported: BTreeSet<(String, String)> = reported_facts
        .iter()
        .filter_map(|(a, b)| {
            let (x, y) = (label.get(a)?, label.get(b)?);
            let (x, y) = if x <= y { (x, y) } else { (y, x) };
            Some((x.to_string(), y.to_string()))
        })
        .collect();
    let correct = reported.intersection(labelled).count() as u64;
    PartReport {
        part: part.to_string(),
        findings: fs.len(),
        facts: d.len(),
        true_pairs,
        predicted_pairs,
        correct_pairs,
        precision: ratio(correct_pairs, predicted_pairs),
        recall: ratio(correct_pairs, true_pairs),
        contradictions_labelled: labelled.len() as u64,
        contradictions_reported: reported.len() as u64,
        contradictions_correct: correct,
        contradiction_precision: ratio(correct, reported.len() as u64),
        contradiction_recall: ratio(correct, labelled.len() as u64),
    }
}

#[cfg(test)]
mod fixture_tests {
    use super::*;

    #[test]
    fn fixture_quality() {
        let fixture = include_str!("../../data/fixtures/synth-quality.jsonl");
        let r = evaluate(fixture, &DedupConfig::default()).unwrap();
        for p in &r.parts {
            eprintln!("{}", serde_json::to_string(p).unwrap());
        }
        let tune = r.parts.iter().find(|p| p.part == "tune").unwrap();
        assert!(tune.precision >= 0.95, "tune precision {}", tune.precision);
        assert!(tune.recall >= 0.85, "tune recall {}", tune.recall);
        let held = r.parts.iter().find(|p| p.part == "heldout").unwrap();
        assert!(held.findings > 0);
        for x in [
            held.precision,
            held.recall,
            held.contradiction_precision,
            held.contradiction_recall,
        ] {
            assert!((0.0..=1.0).contains(&x));
        }
        assert!(held.facts <= held.findings && held.correct_pairs <= held.predicted_pairs);
    }

    #[test]
    fn evaluate_small_fixture() {
        let fx = r#"{"kind": "about", "text": "x"}
{"kind": "finding", "part": "p", "cluster": "A", "agent": "a", "subject": "web", "text": "web listens on port 8080", "item": "1"}
{"kind": "finding", "part": "p", "cluster": "A", "agent": "b", "subject": "web", "text": "web is serving on port 8080", "item": "2"}
{"kind": "finding", "part": "p", "cluster": "B", "agent": "c", "subject": "web", "text": "web serves HTTP on port 3000", "item": "3"}
{"kind": "contradiction", "part": "p", "a": "B", "b": "A"}"#;
        let r = evaluate(fx, &DedupConfig::default()).unwrap();
        let p = &r.parts[0];
        assert_eq!(
            (
                p.findings,
                p.facts,
                p.true_pairs,
                p.predicted_pairs,
                p.correct_pairs
            ),
            (3, 2, 1, 1, 1)
        );
        assert_eq!(
            (
                p.contradictions_labelled,
                p.contradictions_reported,
                p.contradictions_correct
            ),
            (1, 1, 1)
        );
        assert_eq!(
            (
                p.precision,
                p.recall,
                p.contradiction_precision,
                p.contradiction_recall
            ),
            (1.0, 1.0, 1.0, 1.0)
        );
        assert!(evaluate("{not json", &DedupConfig::default()).is_err());
        assert!(evaluate(
            r#"{"kind": "finding", "part": "p"}"#,
            &DedupConfig::default()
        )
        .is_err());
    }
}
