//! The facts log's records and their fold.
//!
//! Every user has one facts log, the run `@facts` in the user's partition. The
//! synthesizer writes it in *passes*: a `synth_begin` event, any number of `synth` events
//! (each one [`Record`]), and a `synth_commit` event carrying the per-run watermarks the
//! pass reached ([`Commit`]). [`FactsFold`] applies a pass's records only when its commit
//! arrives, so a pass cut short by a crash (a begin with no commit) has no effect at all:
//! the facts and the watermarks move together or not at all. The next pass's begin
//! discards the uncommitted records.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::event::ts::Ts;
use crate::event::{Event, EventType};
use crate::synth::patterns::{PatternBook, RunLearnings};

/// The facts log's run id (in each user's partition). Run ids starting with `@` are
/// reserved for the engine's own logs: clients cannot append to them.
pub const FACTS_RUN: &str = "@facts";

/// One link from a fact to a raw event: run, seq, event id, agent, ts, confidence, and
/// how the event was matched to the fact (`first`, `exact`, `near 0.72`, `judged 0.51`).
/// Stored compactly inside an [`Evidence`].
#[derive(Clone, Debug, PartialEq)]
pub struct EvidenceLink(
    pub String,
    pub u64,
    pub String,
    pub String,
    pub Ts,
    pub Option<f64>,
    pub std::borrow::Cow<'static, str>,
);

impl EvidenceLink {
    /// The run of the raw event.
    pub fn run(&self) -> &str {
        &self.0
    }
    /// Its seq.
    pub fn seq(&self) -> u64 {
        self.1
    }
    /// Its event id.
    pub fn id(&self) -> &str {
        &self.2
    }
    /// Its agent.
    pub fn agent(&self) -> &str {
        &self.3
    }
    /// Its time.
    pub fn ts(&self) -> Ts {
        self.4
    }
    /// The confidence the agent gave, if any.
    pub fn confidence(&self) -> Option<f64> {
        self.5
    }
}

/// The evidence links of one `fact` record, stored compactly: run and agent names once
/// per record, each link as `[run index, seq, event id, agent index, ts (µs since the
/// epoch), confidence or null]` plus, when it was not an exact repeat, how it was
/// matched (`first`, `near 0.72`, `judged 0.51`):
/// `{"runs": ["inc-42"], "agents": ["db", "net"], "links": [[0, 17, "db-3", 0, 1795…, 0.9, "first"], [0, 18, "swarm:…", 1, 1795…, null]]}`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence(pub Vec<EvidenceLink>);

impl Evidence {
    /// No links.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl IntoIterator for Evidence {
    type Item = EvidenceLink;
    type IntoIter = std::vec::IntoIter<EvidenceLink>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Evidence {
    type Item = &'a EvidenceLink;
    type IntoIter = std::slice::Iter<'a, EvidenceLink>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

fn index_of<'a>(names: &mut Vec<&'a str>, name: &'a str) -> usize {
    match names.iter().rposition(|n| *n == name) {
        Some(i) => i,
        None => {
            names.push(name);
            names.len() - 1
        }
    }
}

impl Serialize for Evidence {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeSeq, SerializeStruct};
        struct Link<'a>(usize, &'a EvidenceLink, usize);
        impl Serialize for Link<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let l = self.1;
                let exact = l.6 == "exact";
                let mut q = s.serialize_seq(Some(if exact { 6 } else { 7 }))?;
                q.serialize_element(&self.0)?;
                q.serialize_element(&l.1)?;
                q.serialize_element(&l.2)?;
                q.serialize_element(&self.2)?;
                q.serialize_element(&l.4 .0)?;
                q.serialize_element(&l.5)?;
                if !exact {
                    q.serialize_element(&l.6)?;
                }
                q.end()
            }
        }
        let (mut runs, mut agents) = (Vec::new(), Vec::new());
        let links: Vec<Link<'_>> = self
            .0
            .iter()
            .map(|l| Link(index_of(&mut runs, &l.0), l, index_of(&mut agents, &l.3)))
            .collect();
        let mut st = s.serialize_struct("Evidence", 3)?;
        st.serialize_field("runs", &runs)?;
        st.serialize_field("agents", &agents)?;
        st.serialize_field("links", &links)?;
        st.end()
    }
}

impl<'de> Deserialize<'de> for Evidence {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Evidence, D::Error> {
        use serde::de::Error as _;
        #[derive(Deserialize)]
        struct Link(
            usize,
            u64,
            String,
            usize,
            u64,
            Option<f64>,
            #[serde(default)] Option<String>,
        );
        #[derive(Deserialize)]
        struct Raw {
            runs: Vec<String>,
            agents: Vec<String>,
            links: Vec<Link>,
        }
        let raw = Raw::deserialize(d)?;
        let mut out = Vec::with_capacity(raw.links.len());
        for l in raw.links {
            let (Some(run), Some(agent)) = (raw.runs.get(l.0), raw.agents.get(l.3)) else {
                return Err(D::Error::custom(
                    "evidence link names a run or agent index out of range",
                ));
            };
            out.push(EvidenceLink(
                run.clone(),
                l.1,
                l.2,
                agent.clone(),
                Ts(l.4),
                l.5,
                match l.6 {
                    Some(h) => std::borrow::Cow::Owned(h),
                    None => std::borrow::Cow::Borrowed("exact"),
                },
            ));
        }
        Ok(Evidence(out))
    }
}

/// The first finding of a new fact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewFact {
    /// Its subject (the dedup scope), if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The entry type of its first finding (`evidence`, `hypothesis`).
    pub kind: String,
    /// Its first wording (at most [`FACT_TEXT_BYTES_MAX`] bytes).
    pub text: String,
}

/// Longest wording kept for a fact, in bytes (longer findings are cut at a character
/// boundary before comparison).
pub const FACT_TEXT_BYTES_MAX: usize = 2048;

/// One record of a pass: the content of a `synth` event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Record {
    /// A new fact and/or new evidence for one.
    Fact {
        /// Its id (`F<n>`, numbered from 1 in the order facts appear).
        fact: String,
        /// Present on the fact's first record.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        new: Option<NewFact>,
        /// Further wordings kept for comparison.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        variants: Vec<String>,
        /// Semantic mode: the deduper's insertion numbers of the wordings this record
        /// adds (the first wording's when `new`, then each of `variants`'), so a
        /// deduper rebuilt from the log adds their vectors in the order they came.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ords: Vec<u64>,
        /// Links to the raw events behind it.
        #[serde(default, skip_serializing_if = "Evidence::is_empty")]
        evidence: Evidence,
        /// The entry types of the findings this record links (a fact may hold several
        /// when formed by subject, lexically): what an agent must be shown to see the
        /// fact ([`crate::synth::FactGate`]). Absent in records written before it was kept:
        /// then the fact's types are unknown.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        kinds: Vec<String>,
        /// The latest observation time among this record's findings (their
        /// `meta.observed_at`, else their time), when it differs from every link's time:
        /// what tells a change over time from a contradiction in a later pass.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        observed: Option<Ts>,
    },
    /// Two facts of one subject make incompatible claims.
    Contradiction {
        /// Its id (`C<n>`).
        id: String,
        /// One side (the older fact).
        a: String,
        /// The other side.
        b: String,
        /// The subject.
        subject: String,
        /// The deduper's score.
        score: f64,
        /// Time of the raw event that completed the contradiction.
        at: Ts,
        /// That event: run and seq.
        trigger: (String, u64),
    },
    /// A later finding states another value of the quantity an earlier fact measured
    /// (semantic mode): the earlier fact was valid until the later one was observed.
    /// A change over time, not a contradiction.
    Change {
        /// The earlier fact.
        earlier: String,
        /// The later fact.
        later: String,
        /// The cosine of the two wordings that met.
        score: f64,
        /// When the earlier fact stopped being valid: the later one's observation.
        at: Ts,
        /// The raw event that showed the change: run and seq.
        trigger: (String, u64),
    },
    /// A contradiction is (re)decided: by evidence weight, then recency.
    Resolution {
        /// The contradiction.
        contradiction: String,
        /// The fact that stands.
        winner: String,
        /// The fact superseded.
        loser: String,
        /// `evidence_weight` or `recency`.
        reason: String,
        /// Weights of winner and loser (sum over independent agents of their confidence).
        weights: (f64, f64),
        /// When the loser stopped being valid: the newest evidence of either side.
        at: Ts,
    },
    /// What a closed run taught (patterns and mistakes).
    Learned {
        /// The run (private copy) or an opaque hash of it (shared copy).
        run: String,
        /// The learnings (private: full context).
        learnings: Box<RunLearnings>,
        /// The same learned from the run's events after the sanitizer (what the shared
        /// scope gets); absent in the shared scope's own copies.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shared: Option<Box<RunLearnings>>,
    },
}

/// The content of a `synth_commit` event.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Commit {
    /// The pass number (1, 2, ...).
    pub pass: u64,
    /// For each run read in this pass, the last seq it covers.
    pub watermarks: BTreeMap<String, u64>,
    /// Closed runs whose patterns and mistakes this pass learned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub learned: Vec<String>,
    /// Source events read in this pass.
    pub source_events: u64,
    /// Facts in the log once this pass is applied.
    #[serde(default)]
    pub facts_total: u64,
    /// For each run read to its visible end in this pass: that end (segment base, byte
    /// offset). A later synth compares it with the run's visible mark to see, without
    /// reading the run, that nothing was appended since.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ends: BTreeMap<String, (u64, u64)>,
}

/// A fact as folded from the log.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Fact {
    /// `F<n>`.
    pub id: String,
    /// Subject (scope).
    pub subject: Option<String>,
    /// Entry type of its first finding.
    pub kind: String,
    /// The entry types of all its findings; `None` when a record that linked findings
    /// did not say (written before they were kept): unknown, so a reader must be shown
    /// every type ([`crate::synth::FactGate`]).
    #[serde(default)]
    pub kinds: Option<BTreeSet<String>>,
    /// First wording.
    pub text: String,
    /// Further wordings kept for comparison.
    pub variants: Vec<String>,
    /// Semantic mode: the deduper's insertion number of each wording (first, then the
    /// variants), when the records gave them (see [`Record::Fact`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ords: Vec<u64>,
    /// Each agent that found it (a [`FactsFold::name`] id), with the highest confidence
    /// it gave (0.5 when none).
    pub agents: BTreeMap<u32, f64>,
    /// Number of evidence links.
    pub evidence: u64,
    /// Evidence links per run (a [`FactsFold::name`] id).
    pub runs: BTreeMap<u32, u64>,
    /// Time of its first evidence.
    pub first_seen: Option<Ts>,
    /// Time of its latest evidence.
    pub last_seen: Option<Ts>,
    /// Contradictions it is part of (indexes into [`FactsFold::contradictions`]).
    pub contradictions: Vec<usize>,
    /// The latest observation time of its findings, when a record stated one (see
    /// [`Record::Fact`]); else [`Fact::last_seen`] is that time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_observed: Option<Ts>,
    /// Replaced by a later observation of the same quantity: that fact's index and
    /// when this one stopped being valid (the earliest such change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<(usize, Ts)>,
}

/// Confidence given to an agent's finding that carries none.
pub const CONFIDENCE_DEFAULT: f64 = 0.5;
/// Highest confidence a fact reaches.
pub const CONFIDENCE_MAX: f64 = 0.99;

impl Fact {
    /// Confidence that grows with independent evidence: `1 - Π(1 - c_a)` over the
    /// distinct agents that found it, `c_a` the highest confidence agent `a` gave;
    /// repeats by the same agent add nothing. Capped at [`CONFIDENCE_MAX`].
    pub fn confidence(&self) -> f64 {
        let miss: f64 = self.agents.values().map(|c| 1.0 - c).product();
        (1.0 - miss).clamp(0.0, CONFIDENCE_MAX)
    }

    /// Evidence weight for contradiction resolution: the sum over distinct agents of the
    /// confidence each gave.
    pub fn weight(&self) -> f64 {
        self.agents.values().sum()
    }

    /// The scope it is deduplicated in.
    pub fn scope(&self) -> &str {
        self.subject.as_deref().unwrap_or("")
    }
}

/// A contradiction as folded from the log.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Contradiction {
    /// `C<n>`.
    pub id: String,
    /// One side (index into [`FactsFold::facts`]).
    pub a: usize,
    /// The other side.
    pub b: usize,
    /// The subject.
    pub subject: String,
    /// Score.
    pub score: f64,
    /// When it was detected (raw event time).
    pub at: Ts,
    /// The raw event that completed it.
    pub trigger: (String, u64),
    /// The standing side, once resolved.
    pub winner: Option<usize>,
    /// Why it stands.
    pub reason: Option<String>,
    /// Weights of winner and loser at the last resolution.
    pub weights: Option<(f64, f64)>,
    /// When the loser stopped being valid.
    pub resolved_at: Option<Ts>,
}

impl Contradiction {
    /// The superseded side, once resolved.
    pub fn loser(&self) -> Option<usize> {
        self.winner
            .map(|w| if w == self.a { self.b } else { self.a })
    }
}

/// Parses `F12` / `C3` into the index 11 / 2.
pub fn parse_id(prefix: char, id: &str) -> Option<usize> {
    let n: usize = id.strip_prefix(prefix)?.parse().ok()?;
    n.checked_sub(1)
}

/// The facts log folded: facts, contradictions, watermarks, learned patterns.
///
/// Memory grows with distinct facts, their kept wordings and agents, and contradictions;
/// never with evidence links (only counted here; `swarm facts --explain` streams them).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FactsFold {
    /// Facts, index = number - 1.
    pub facts: Vec<Fact>,
    /// Contradictions, index = number - 1 (`None`: not yet detected at the cutoff).
    pub contradictions: Vec<Option<Contradiction>>,
    #[serde(with = "pairs_as_list")]
    pairs: HashSet<(usize, usize)>,
    /// Last seq synthesized, per source run.
    pub watermarks: BTreeMap<String, u64>,
    /// Per run, the visible end its last reading reached, when the pass that set its
    /// watermark read it to the end (see [`Commit::ends`]).
    #[serde(default)]
    pub ends: BTreeMap<String, (u64, u64)>,
    /// Closed runs already learned from.
    pub learned: BTreeSet<String>,
    /// Runs learned in the last committed pass (their shared copies are re-sent, idempotently).
    pub last_learned: Vec<String>,
    /// Seqs of the last committed pass's `synth_begin` and `synth_commit`.
    pub last_pass: Option<(u64, u64)>,
    /// Event id of that `synth_commit` (a snapshot is only used with the log that holds
    /// this very commit).
    #[serde(default)]
    pub last_commit_id: String,
    #[serde(default)]
    begin_seq: u64,
    /// Patterns and mistakes learned (private copy).
    pub book: PatternBook,
    /// Committed passes.
    pub passes: u64,
    /// Seq of the last event folded.
    pub head_seq: u64,
    /// Source events read by all committed passes.
    pub source_events: u64,
    /// Records of a pass begun and not committed yet (never in a snapshot: snapshots
    /// are taken at commits).
    #[serde(skip)]
    pending: Option<Vec<Record>>,
    #[serde(skip)]
    cutoff: Option<Ts>,
    /// Agent and run names, interned: a fact found by many agents in many runs costs a
    /// few bytes per agent, not a string.
    names: Vec<String>,
    #[serde(skip)]
    name_ids: HashMap<String, u32>,
}

impl FactsFold {
    /// An empty fold. With a `cutoff`, it shows the facts as they stood at that time:
    /// only evidence, contradictions and resolutions at or before it count.
    pub fn new(cutoff: Option<Ts>) -> FactsFold {
        FactsFold {
            cutoff,
            ..FactsFold::default()
        }
    }

    /// Rebuilds what a snapshot does not store (the name index) and checks that every
    /// index in it points inside the fold, so a snapshot that passed its checksums but
    /// does not hold together is refused instead of making a view panic.
    pub(crate) fn after_load(&mut self) -> Result<(), String> {
        let (nf, nc, nn) = (
            self.facts.len(),
            self.contradictions.len(),
            self.names.len(),
        );
        for (i, f) in self.facts.iter().enumerate() {
            if parse_id('F', &f.id) != Some(i) {
                return Err(format!("fact {} stored at index {i}", f.id));
            }
            if f.contradictions.iter().any(|&n| n >= nc) {
                return Err(format!("fact {} names a contradiction out of range", f.id));
            }
            if f.agents
                .keys()
                .chain(f.runs.keys())
                .any(|&a| a as usize >= nn)
            {
                return Err(format!("fact {} names an agent or run out of range", f.id));
            }
        }
        for c in self.contradictions.iter().flatten() {
            let sides_ok = c.a < nf && c.b < nf;
            let winner_ok = c.winner.is_none_or(|w| w == c.a || w == c.b);
            if !sides_ok || !winner_ok {
                return Err(format!("contradiction {} names facts out of range", c.id));
            }
        }
        if self.pairs.iter().any(|&(a, b)| a >= nf || b >= nf) {
            return Err("a contradiction pair names facts out of range".into());
        }
        self.name_ids = self
            .names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u32))
            .collect();
        Ok(())
    }

    /// The agent or run name behind an interned id.
    pub fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", String::as_str)
    }

    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.name_ids.get(s) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(s.to_string());
        self.name_ids.insert(s.to_string(), i);
        i
    }

    /// Records that the fold stands at the pass written at `begin..=commit` (the driver,
    /// once the writer has written every pass it applied itself).
    pub(crate) fn stand_at(&mut self, begin: u64, commit: u64, commit_id: &str) {
        self.last_pass = Some((begin, commit));
        // As the `synth_begin` and `synth_commit` of that pass left it when folded.
        self.begin_seq = begin;
        self.last_commit_id = commit_id.to_string();
        self.head_seq = self.head_seq.max(commit);
    }

    /// Applies a pass's commit (the driver, after applying the pass's records itself).
    pub fn apply_commit(&mut self, c: &Commit) {
        for (run, seq) in &c.watermarks {
            let w = self.watermarks.entry(run.clone()).or_default();
            *w = (*w).max(*seq);
            // The watermark moved: the end is unknown until a pass records it (this one
            // or a later one, when the pass ended right at the run's last event).
            self.ends.remove(run);
        }
        for (run, &end) in &c.ends {
            self.ends.insert(run.clone(), end);
        }
        self.learned.extend(c.learned.iter().cloned());
        self.last_learned.clone_from(&c.learned);
        self.passes = self.passes.max(c.pass);
        self.source_events += c.source_events;
    }

    /// Whether a pass was begun and not committed (at the end of the log: a crashed pass).
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Whether facts `a` and `b` are already known to contradict each other.
    pub fn contradicts(&self, a: usize, b: usize) -> bool {
        self.pairs.contains(&(a.min(b), a.max(b)))
    }

    /// Applies the next event of the facts log.
    pub fn apply(&mut self, e: &Event) {
        if e.seq <= self.head_seq {
            return;
        }
        self.head_seq = e.seq;
        match e.kind {
            EventType::SynthBegin => {
                self.pending = Some(Vec::new());
                self.begin_seq = e.seq;
            }
            EventType::Synth => {
                let Ok(r) = serde_json::from_value::<Record>(e.content.clone()) else {
                    tracing::warn!(seq = e.seq, "facts log: unreadable synth record skipped");
                    return;
                };
                match &mut self.pending {
                    Some(p) => p.push(r),
                    // A record outside a pass: the shared patterns log writes single,
                    // self-contained records.
                    None => self.apply_record(&r),
                }
            }
            EventType::SynthCommit => {
                let Some(records) = self.pending.take() else {
                    return;
                };
                let Ok(c) = serde_json::from_value::<Commit>(e.content.clone()) else {
                    tracing::warn!(seq = e.seq, "facts log: unreadable commit; pass ignored");
                    return;
                };
                for r in &records {
                    self.apply_record(r);
                }
                self.apply_commit(&c);
                self.last_pass = Some((self.begin_seq, e.seq));
                self.last_commit_id.clone_from(&e.id);
            }
            _ => {}
        }
    }

    fn visible(&self, ts: Ts) -> bool {
        self.cutoff.is_none_or(|c| ts <= c)
    }

    /// Applies one record (of a committed pass).
    pub fn apply_record(&mut self, r: &Record) {
        match r {
            Record::Fact {
                fact,
                new,
                variants,
                ords,
                evidence,
                observed,
                kinds,
            } => {
                let Some(i) = parse_id('F', fact) else { return };
                if let Some(n) = new {
                    if i != self.facts.len() {
                        tracing::warn!(fact, "facts log: fact numbered out of order; skipped");
                        return;
                    }
                    self.facts.push(Fact {
                        id: fact.clone(),
                        subject: n.subject.clone(),
                        kind: n.kind.clone(),
                        kinds: Some(BTreeSet::new()),
                        text: n.text.clone(),
                        ..Fact::default()
                    });
                }
                let cutoff = self.cutoff;
                if i >= self.facts.len() {
                    return;
                }
                let known = &mut self.facts[i].kinds;
                match (evidence.is_empty(), kinds.is_empty()) {
                    (true, _) => {}
                    (false, true) => *known = None,
                    (false, false) => {
                        if let Some(k) = known {
                            k.extend(kinds.iter().cloned());
                        }
                    }
                }
                self.facts[i].variants.extend(variants.iter().cloned());
                self.facts[i].ords.extend_from_slice(ords);
                if let Some(t) = observed.filter(|t| cutoff.is_none_or(|c| *t <= c)) {
                    let o = &mut self.facts[i].last_observed;
                    *o = Some(o.map_or(t, |x| x.max(t)));
                }
                for l in evidence {
                    if cutoff.is_some_and(|c| l.ts() > c) {
                        continue;
                    }
                    let (run, agent) = (self.intern(l.run()), self.intern(l.agent()));
                    let f = &mut self.facts[i];
                    f.evidence += 1;
                    *f.runs.entry(run).or_default() += 1;
                    let c = l.confidence().unwrap_or(CONFIDENCE_DEFAULT).clamp(0.0, 1.0);
                    let a = f.agents.entry(agent).or_insert(c);
                    *a = a.max(c);
                    f.first_seen = Some(f.first_seen.map_or(l.ts(), |t| t.min(l.ts())));
                    f.last_seen = Some(f.last_seen.map_or(l.ts(), |t| t.max(l.ts())));
                }
            }
            Record::Contradiction {
                id,
                a,
                b,
                subject,
                score,
                at,
                trigger,
            } => {
                let (Some(n), Some(a), Some(b)) =
                    (parse_id('C', id), parse_id('F', a), parse_id('F', b))
                else {
                    return;
                };
                if a >= self.facts.len() || b >= self.facts.len() || a == b {
                    return;
                }
                // Numbered in order even when hidden by the cutoff, so later ids line up.
                if self.contradictions.len() <= n {
                    self.contradictions.resize(n + 1, None);
                }
                self.pairs.insert((a.min(b), a.max(b)));
                if !self.visible(*at) {
                    return;
                }
                self.contradictions[n] = Some(Contradiction {
                    id: id.clone(),
                    a,
                    b,
                    subject: subject.clone(),
                    score: *score,
                    at: *at,
                    trigger: trigger.clone(),
                    winner: None,
                    reason: None,
                    weights: None,
                    resolved_at: None,
                });
                self.facts[a].contradictions.push(n);
                self.facts[b].contradictions.push(n);
            }
            Record::Resolution {
                contradiction,
                winner,
                reason,
                weights,
                at,
                ..
            } => {
                if !self.visible(*at) {
                    return;
                }
                let (Some(n), Some(w)) = (parse_id('C', contradiction), parse_id('F', winner))
                else {
                    return;
                };
                if let Some(Some(c)) = self.contradictions.get_mut(n) {
                    if w == c.a || w == c.b {
                        c.winner = Some(w);
                        c.reason = Some(reason.clone());
                        c.weights = Some(*weights);
                        c.resolved_at = Some(*at);
                    }
                }
            }
            Record::Change {
                earlier, later, at, ..
            } => {
                if !self.visible(*at) {
                    return;
                }
                let (Some(e), Some(l)) = (parse_id('F', earlier), parse_id('F', later)) else {
                    return;
                };
                if e >= self.facts.len() || l >= self.facts.len() || e == l {
                    return;
                }
                let c = &mut self.facts[e].changed;
                if c.is_none_or(|(_, t)| *at < t) {
                    *c = Some((l, *at));
                }
            }
            Record::Learned { learnings, .. } => self.book.merge_run(learnings),
        }
    }

    /// The contradiction that currently supersedes fact `i`, if any (the first one, in
    /// detection order, that it lost).
    pub fn superseded_by(&self, i: usize) -> Option<&Contradiction> {
        self.facts.get(i)?.contradictions.iter().find_map(|&n| {
            let c = self.contradictions.get(n)?.as_ref()?;
            (c.loser() == Some(i)).then_some(c)
        })
    }
}

/// The known contradiction pairs, stored sorted (a snapshot's bytes do not depend on
/// hash order).
mod pairs_as_list {
    use std::collections::HashSet;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(p: &HashSet<(usize, usize)>, s: S) -> Result<S::Ok, S::Error> {
        let mut v: Vec<_> = p.iter().copied().collect();
        v.sort_unstable();
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<HashSet<(usize, usize)>, D::Error> {
        Ok(Vec::<(usize, usize)>::deserialize(d)?.into_iter().collect())
    }
}
