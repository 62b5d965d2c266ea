//! What `swarm facts` and `swarm metrics` show: facts as views, the evidence chain of one
//! fact back to the raw events, the facts as they stood at a time.

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::event::ts::Ts;
use crate::event::{Event, EventType};
use crate::query::options::ReadOptions;
use crate::store::Store;
use crate::synth::dedup::DedupConfig;
use crate::synth::facts::{parse_id, EvidenceLink, FactsFold, Record, FACTS_RUN};
use crate::synth::metrics::{self, RunMetrics};

/// A fact as `swarm facts` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct FactView {
    /// `F<n>`.
    pub id: String,
    /// Subject, if any.
    pub subject: Option<String>,
    /// Entry type of its first finding.
    pub kind: String,
    /// The entry types of all its findings (`null`: not recorded, facts synthesized
    /// before they were kept).
    pub kinds: Option<Vec<String>>,
    /// First wording.
    pub text: String,
    /// `current` or `superseded`.
    pub status: &'static str,
    /// Grows with independent evidence (noisy-OR over distinct agents).
    pub confidence: f64,
    /// Sum over distinct agents of their confidence (what resolution weighs).
    pub weight: f64,
    /// Evidence links (raw events).
    pub evidence: u64,
    /// Agents that found it independently.
    pub agents: Vec<String>,
    /// Runs it was found in.
    pub runs: Vec<String>,
    /// First evidence.
    pub first_seen: Option<Ts>,
    /// Latest evidence.
    pub last_seen: Option<Ts>,
    /// When superseded: by which fact, through which contradiction, since when.
    pub superseded: Option<Superseded>,
    /// Contradictions it is part of.
    pub contradictions: Vec<String>,
    /// Wordings kept for comparison.
    pub wordings: usize,
    /// The further wordings kept (after `text`): search finds a fact by any of them. Not
    /// printed (`wordings` counts them).
    #[serde(skip)]
    pub variants: Vec<String>,
}

/// Why a fact is no longer current.
#[derive(Clone, Debug, Serialize)]
pub struct Superseded {
    /// The fact that stands instead.
    pub by: String,
    /// The contradiction ("" for a change over time).
    pub contradiction: String,
    /// `evidence_weight` or `recency` (a contradiction lost), or `changed` (a later
    /// observation of the same quantity).
    pub reason: String,
    /// When it stopped being valid.
    pub valid_to: Option<Ts>,
}

/// A contradiction as `swarm facts` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct ContradictionView {
    /// `C<n>`.
    pub id: String,
    /// Subject.
    pub subject: String,
    /// One side.
    pub a: String,
    /// The other side.
    pub b: String,
    /// Text of side a.
    pub a_text: String,
    /// Text of side b.
    pub b_text: String,
    /// The standing side, once resolved.
    pub winner: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// Weights of winner and loser.
    pub weights: Option<(f64, f64)>,
    /// Detected at (raw event time).
    pub detected_at: Ts,
    /// The raw event that completed it (run, seq).
    pub trigger: (String, u64),
}

/// What to list.
#[derive(Clone, Debug, Default)]
pub struct FactsQuery {
    /// Only this subject.
    pub subject: Option<String>,
    /// As they stood at this time.
    pub as_of: Option<Ts>,
    /// Superseded facts too.
    pub include_superseded: bool,
    /// Only what this agent may read ([`Store::fact_gate`]): a fact is drawn from every
    /// run of the user, past each run's read policy, so a read made as an agent gets
    /// the facts whose every source it could read itself. `None`: the user's own read.
    pub reader: Option<String>,
}

/// Which facts a read made as an agent may see: those whose every entry type the agent
/// is shown in every run the fact was found in, under each run's current policy (a fact
/// formed lexically, by subject, may hold several types; one formed by meaning holds
/// one). A fact's wordings come from those runs' entries of those types, so the agent
/// could have read them there. Fails closed: a fact whose types were not recorded
/// (synthesized before they were kept) needs every type, and a run that cannot be read
/// (gone, damaged) shows nothing.
pub struct FactGate<'s> {
    store: &'s Store,
    reader: Option<String>,
    policies: std::collections::BTreeMap<String, Option<crate::fold::rules::Policy>>,
}

impl FactGate<'_> {
    /// Whether a fact found in `runs`, of entry types `kinds` (`None`: unknown, so
    /// every type), may be shown.
    pub fn admits(&mut self, runs: &[String], kinds: Option<&[String]>) -> bool {
        let Some(agent) = self.reader.as_deref() else {
            return true;
        };
        let store = self.store;
        runs.iter().all(|run| {
            let policy = self
                .policies
                .entry(run.clone())
                .or_insert_with(|| store.policy(run).ok().map(Option::unwrap_or_default));
            policy.as_ref().is_some_and(|p| match kinds {
                Some(k) => k.iter().all(|k| p.may_read_type(agent, k)),
                None => EventType::ALL
                    .iter()
                    .all(|k| p.may_read_type(agent, k.as_str())),
            })
        })
    }

    /// [`FactGate::admits`] for a view.
    pub fn admits_view(&mut self, f: &FactView) -> bool {
        self.admits(&f.runs, f.kinds.as_deref())
    }

    /// [`FactGate::admits`] for the fact `id` (`F12`) of `fold`; false for no such fact.
    fn admits_id(&mut self, fold: &FactsFold, id: &str) -> bool {
        let Some(i) = parse_id('F', id).filter(|&i| i < fold.facts.len()) else {
            return false;
        };
        self.reader.is_none() || self.admits_view(&view(fold, i))
    }
}

/// The answer of [`Store::facts`].
#[derive(Clone, Debug, Serialize)]
pub struct FactsAnswer {
    /// The time asked for, if any.
    pub as_of: Option<Ts>,
    /// Committed synth passes.
    pub passes: u64,
    /// Source events synthesized.
    pub source_events: u64,
    /// Facts, by id.
    pub facts: Vec<FactView>,
    /// Contradictions among them.
    pub contradictions: Vec<ContradictionView>,
}

/// One evidence link with the raw event it names.
#[derive(Clone, Debug, Serialize)]
pub struct ExplainedEvidence {
    /// The run.
    pub run: String,
    /// The seq.
    pub seq: u64,
    /// The event id.
    pub id: String,
    /// How it was matched (`first`, `exact`, `near 0.72`, `judged 0.51`).
    pub matched: String,
    /// Seq of the facts-log event that linked it.
    pub facts_log_seq: u64,
    /// The raw event, read back from its run (its id checked); `None` if it cannot be
    /// read (with `error` saying why).
    pub event: Option<Event>,
    /// Why the raw event could not be read back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The answer of [`Store::explain_fact`].
#[derive(Clone, Debug, Serialize)]
pub struct Explanation {
    /// The fact.
    pub fact: FactView,
    /// Its wordings (first, then the variants kept).
    pub wordings: Vec<String>,
    /// Evidence links in total.
    pub evidence_total: u64,
    /// The first `limit` links, each with its raw event.
    pub evidence: Vec<ExplainedEvidence>,
    /// Its contradictions, with the other side and the resolution.
    pub contradictions: Vec<ContradictionView>,
}

fn sorted(it: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = it.collect();
    v.sort();
    v
}

fn view(fold: &FactsFold, i: usize) -> FactView {
    let f = &fold.facts[i];
    let sup = fold
        .superseded_by(i)
        .map(|c| Superseded {
            by: c
                .winner
                .map(|w| fold.facts[w].id.clone())
                .unwrap_or_default(),
            contradiction: c.id.clone(),
            reason: c.reason.clone().unwrap_or_default(),
            valid_to: c.resolved_at,
        })
        .or_else(|| {
            f.changed.map(|(l, at)| Superseded {
                by: fold.facts[l].id.clone(),
                contradiction: String::new(),
                reason: "changed".to_string(),
                valid_to: Some(at),
            })
        });
    FactView {
        id: f.id.clone(),
        subject: f.subject.clone(),
        kind: f.kind.clone(),
        kinds: f.kinds.as_ref().map(|k| k.iter().cloned().collect()),
        text: f.text.clone(),
        status: if sup.is_some() {
            "superseded"
        } else {
            "current"
        },
        confidence: (f.confidence() * 1000.0).round() / 1000.0,
        weight: (f.weight() * 1000.0).round() / 1000.0,
        evidence: f.evidence,
        agents: sorted(f.agents.keys().map(|&a| fold.name(a).to_string())),
        runs: sorted(f.runs.keys().map(|&r| fold.name(r).to_string())),
        first_seen: f.first_seen,
        last_seen: f.last_seen,
        superseded: sup,
        contradictions: f
            .contradictions
            .iter()
            .filter_map(|&n| fold.contradictions.get(n)?.as_ref().map(|c| c.id.clone()))
            .collect(),
        wordings: 1 + f.variants.len(),
        variants: f.variants.clone(),
    }
}

fn contradiction_view(fold: &FactsFold, n: usize) -> Option<ContradictionView> {
    let c = fold.contradictions.get(n)?.as_ref()?;
    Some(ContradictionView {
        id: c.id.clone(),
        subject: c.subject.clone(),
        a: fold.facts[c.a].id.clone(),
        b: fold.facts[c.b].id.clone(),
        a_text: fold.facts[c.a].text.clone(),
        b_text: fold.facts[c.b].text.clone(),
        winner: c.winner.map(|w| fold.facts[w].id.clone()),
        reason: c.reason.clone(),
        weights: c.weights,
        detected_at: c.at,
        trigger: c.trigger.clone(),
    })
}

/// The committed passes of a facts log, as seq ranges (begin, commit).
pub(crate) struct CommittedPasses(Vec<(u64, u64)>);

impl CommittedPasses {
    /// Whether the event at `seq` belongs to a committed pass.
    pub(crate) fn contains(&self, seq: u64) -> bool {
        let k = self.0.partition_point(|&(_, c)| c < seq);
        self.0.get(k).is_some_and(|&(b, _)| b < seq)
    }
}

impl Store {
    /// The committed passes of the user's facts log, from its index (begin and commit
    /// events only).
    pub(crate) fn committed_passes(&self) -> Result<CommittedPasses> {
        let seqs = |kind| -> Result<Vec<u64>> {
            self.read(
                FACTS_RUN,
                ReadOptions {
                    kind: Some(kind),
                    ..ReadOptions::default()
                },
            )?
            .map(|e| e.map(|e| e.seq))
            .collect()
        };
        let begins = seqs(EventType::SynthBegin)?;
        let mut out = Vec::new();
        for c in seqs(EventType::SynthCommit)? {
            // The pass a commit closes began at the last begin before it.
            let k = begins.partition_point(|&b| b < c);
            if k > 0 {
                out.push((begins[k - 1], c));
            }
        }
        Ok(CommittedPasses(out))
    }

    /// The user's facts: current ones (and superseded ones with `include_superseded`),
    /// optionally of one subject, optionally as they stood at a time.
    pub fn facts(&self, q: &FactsQuery) -> Result<FactsAnswer> {
        let fold = self.facts_fold(q.as_of)?;
        let mut gate = self.fact_gate(q.reader.as_deref());
        let mut facts = Vec::new();
        let mut listed = std::collections::BTreeSet::new();
        for (i, f) in fold.facts.iter().enumerate() {
            if f.evidence == 0 {
                continue; // not yet found at the cutoff
            }
            if q.subject.is_some() && f.subject != q.subject {
                continue;
            }
            let v = view(&fold, i);
            if v.status == "superseded" && !q.include_superseded {
                continue;
            }
            if !gate.admits_view(&v) {
                continue;
            }
            listed.insert(v.id.clone());
            facts.push(v);
        }
        // A contradiction is listed with a fact it is about (not between two superseded
        // facts left off the list), and only when the reader may see both sides: it
        // quotes them.
        let contradictions = (0..fold.contradictions.len())
            .filter_map(|n| contradiction_view(&fold, n))
            .filter(|c| q.subject.as_ref().is_none_or(|s| *s == c.subject))
            .filter(|c| listed.contains(&c.a) || listed.contains(&c.b))
            .filter(|c| gate.admits_id(&fold, &c.a) && gate.admits_id(&fold, &c.b))
            .collect();
        Ok(FactsAnswer {
            as_of: q.as_of,
            passes: fold.passes,
            source_events: fold.source_events,
            facts,
            contradictions,
        })
    }

    /// The gate of the facts a read made as `reader` may see (all of them for `None`).
    pub fn fact_gate(&self, reader: Option<&str>) -> FactGate<'_> {
        FactGate {
            store: self,
            reader: reader.map(str::to_string),
            policies: Default::default(),
        }
    }

    /// The full evidence chain of one fact: its links (from the facts log, committed
    /// passes only) and, for the first `limit` of them, the raw event read back from its
    /// run, checked to carry the linked id.
    pub fn explain_fact(&self, id: &str, limit: usize) -> Result<Explanation> {
        self.explain_fact_as(id, limit, None)
    }

    /// [`Store::explain_fact`] for a read made as `reader` (see [`FactsQuery::reader`]):
    /// a fact the agent may not see is "no such fact", as one that does not exist.
    pub fn explain_fact_as(
        &self,
        id: &str,
        limit: usize,
        reader: Option<&str>,
    ) -> Result<Explanation> {
        let fold = self.facts_fold(None)?;
        let mut gate = self.fact_gate(reader);
        let i = parse_id('F', id)
            .filter(|_| gate.admits_id(&fold, id))
            .ok_or_else(|| Error::invalid("fact", format!("no fact {id:?} (ids look like F12)")))?;
        let f = &fold.facts[i];
        let committed = self.committed_passes()?;
        let is_committed = |seq: u64| committed.contains(seq);
        // The fact's records carry its subject: the index finds them.
        let opts = ReadOptions {
            subject: f.subject.clone(),
            kind: Some(EventType::Synth),
            ..ReadOptions::default()
        };
        let mut links: Vec<(u64, EvidenceLink)> = Vec::new();
        let mut total = 0u64;
        for e in self.read(FACTS_RUN, opts)? {
            let e = e?;
            if e.content.get("fact").and_then(Value::as_str) != Some(id) || !is_committed(e.seq) {
                continue;
            }
            if let Ok(Record::Fact { evidence, .. }) = serde_json::from_value(e.content) {
                for l in evidence {
                    total += 1;
                    if links.len() < limit {
                        links.push((e.seq, l));
                    }
                }
            }
        }
        let mut x = self.explanation(&fold, i, links, total);
        // The contradictions quote their other side: only those the reader may see.
        x.contradictions
            .retain(|c| gate.admits_id(&fold, &c.a) && gate.admits_id(&fold, &c.b));
        Ok(x)
    }

    fn explanation(
        &self,
        fold: &FactsFold,
        i: usize,
        links: Vec<(u64, EvidenceLink)>,
        total: u64,
    ) -> Explanation {
        let f = &fold.facts[i];
        let evidence = links
            .into_iter()
            .map(|(log_seq, l)| {
                let got = self
                    .read(
                        l.run(),
                        ReadOptions {
                            from_seq: Some(l.seq()),
                            limit: Some(1),
                            ..ReadOptions::default()
                        },
                    )
                    .and_then(|mut it| it.next().transpose());
                let (event, error) = match got {
                    Ok(Some(e)) if e.seq == l.seq() && e.id == l.id() => (Some(e), None),
                    Ok(Some(e)) => (
                        None,
                        Some(format!(
                            "seq {} of run {:?} carries id {:?}, the link says {:?}",
                            e.seq,
                            l.run(),
                            e.id,
                            l.id()
                        )),
                    ),
                    Ok(None) => (None, Some("the run no longer has this seq".to_string())),
                    Err(e) => (None, Some(e.to_string())),
                };
                ExplainedEvidence {
                    run: l.run().to_string(),
                    seq: l.seq(),
                    id: l.id().to_string(),
                    matched: l.6.to_string(),
                    facts_log_seq: log_seq,
                    event,
                    error,
                }
            })
            .collect();
        let mut wordings = vec![f.text.clone()];
        wordings.extend(f.variants.iter().cloned());
        Explanation {
            fact: view(fold, i),
            wordings,
            evidence_total: total,
            evidence,
            contradictions: f
                .contradictions
                .iter()
                .filter_map(|&n| contradiction_view(fold, n))
                .collect(),
        }
    }

    /// Swarm metrics of one run (seed 004), in one streaming pass over its events.
    pub fn metrics(&self, run: &str, cfg: &DedupConfig) -> Result<RunMetrics> {
        let mut err = None;
        let it = self.read(run, ReadOptions::default())?;
        let events = it.map_while(|r| match r {
            Ok(e) => Some(e),
            Err(e) => {
                err = Some(e);
                None
            }
        });
        let m = metrics::run_metrics(events, cfg);
        match err {
            Some(e) => Err(e),
            None => Ok(m),
        }
    }
}
