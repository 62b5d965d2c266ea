//! The synthesizer's driver: reads new raw events of a user's runs from per-run
//! watermarks, feeds them to the [`Deduper`], and writes facts, contradictions,
//! resolutions and learnings to the user's facts log in atomic passes (see
//! [`crate::synth::facts`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use crate::embed::Embedder;
use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::event::SHARED_USER;
use crate::event::{Checked, Event, EventType};
use crate::fold::checkpoint::{self, CheckpointInfo};
use crate::log::meta::Durability;
use crate::log::storage::OpenMode;
use crate::query::options::{ReadOptions, Visibility};
use crate::query::read::EventIter;
use crate::store::Store;
use crate::synth::dedup::{DedupConfig, Deduper, FactIdx, Judge, Match};
use crate::synth::facts::{
    parse_id, Commit, Evidence, EvidenceLink, FactsFold, NewFact, Record, FACTS_RUN,
    FACT_TEXT_BYTES_MAX,
};
use crate::synth::findings::{
    approx_json_len, clip, engine_event, fact_id, finding_text, is_finding, observed, resolve,
    restore, to_value, EMBED_BATCH,
};
use crate::synth::judge::{LlmJudge, LlmOptions};
use crate::synth::patterns::{self};
pub use crate::synth::report::{RunSynth, SynthProgress, SynthReport};
use crate::synth::sanitize::Sanitizer;
use crate::synth::snapshot;
use crate::synth::text::content_text;

/// The shared scope's log of sanitized learnings.
pub const SHARED_RUN: &str = "@patterns";
/// The subject the `learned` records carry, so that the pattern book is read through
/// the index without folding the facts.
pub const LEARNED_SUBJECT: &str = "@learned";
/// Source events read per pass, at most: bounds the memory a pass holds (its evidence
/// links) and the work a crash can lose.
pub const PASS_EVENTS_MAX_DEFAULT: u64 = 100_000;
/// Evidence links per `synth` record (keeps each record far below the 64 KiB content limit).
pub const EVIDENCE_PER_RECORD_MAX: usize = 128;
/// Contradictions recorded per finding, at most (the strongest).
pub const CONTRADICTIONS_PER_FINDING_MAX: usize = 3;
/// Contradictions a fact takes part in, at most.
pub const CONTRADICTIONS_PER_FACT_MAX: usize = 16;
/// Largest frame the synthesizer writes, in estimated bytes.
const FRAME_BYTES_MAX: usize = 4 << 20;
/// Events per frame the synthesizer writes.
const FRAME_EVENTS_MAX: usize = 1000;

/// What `swarm synth` does.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    /// Runs to synthesize; `None`: every run of the user (engine logs `@…` excluded).
    pub runs: Option<Vec<String>>,
    /// Dedup tuning.
    pub dedup: DedupConfig,
    /// The optional LLM step.
    pub llm: Option<LlmOptions>,
    /// Source events per pass, at most.
    pub pass_events_max: u64,
    /// Project ids the sanitizer must redact besides the detected ones.
    pub project_ids: Vec<String>,
    /// Environment names (clusters, hosts) the sanitizer must redact.
    pub env_names: Vec<String>,
    /// People's names the sanitizer must redact (besides the user's settings).
    pub redact_names: Vec<String>,
    /// What is shared; `None`: the user's setting (default `structured`).
    pub share_patterns: Option<crate::synth::settings::SharePatterns>,
    /// The embedding model (semantic mode, see `dedup/semantic.rs`); `None`: lexical.
    pub embedder: Option<Arc<dyn Embedder>>,
    /// Why there is no model (said in the report), e.g. "model not found at DIR".
    pub no_model_reason: String,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            runs: None,
            dedup: DedupConfig::default(),
            llm: None,
            pass_events_max: PASS_EVENTS_MAX_DEFAULT,
            project_ids: Vec::new(),
            env_names: Vec::new(),
            redact_names: Vec::new(),
            share_patterns: None,
            embedder: None,
            no_model_reason: "no embedding model given".to_string(),
        }
    }
}

/// Per run: the watermark and, when the pass that set it read the run to its end, that
/// end's position.
type Watermarks = BTreeMap<String, (u64, Option<(u64, u64)>)>;

/// A pass ready to be written (by the writer thread).
struct WriteJob {
    /// Each record with the subject its event carries.
    records: Vec<(Option<String>, Record)>,
    commit: Commit,
    /// What the pass learned, as the shared scope gets it (run, sanitized learnings).
    learned: Vec<(String, patterns::RunLearnings)>,
}

/// What writing a pass did.
#[derive(Default)]
struct WriteDone {
    records_written: u64,
    shared_copies: u64,
    /// Seqs the pass's `synth_begin` and `synth_commit` got, and the commit's id.
    begin_seq: u64,
    commit_seq: u64,
    commit_id: String,
}

/// The work of one pass, before it is written.
struct Pass {
    /// Fact index -> what this pass adds to it.
    deltas: BTreeMap<FactIdx, Delta>,
    contradictions: Vec<Record>,
    changes: Vec<Record>,
    change_pairs: BTreeSet<(usize, usize)>,
    pairs: BTreeSet<(usize, usize)>,
    contradiction_counts: BTreeMap<usize, usize>,
    ends: BTreeMap<String, (u64, u64)>,
    watermarks: BTreeMap<String, u64>,
    closed: Vec<String>,
    learned: Vec<(String, patterns::RunLearnings, patterns::RunLearnings)>,
    source_events: u64,
}

#[derive(Default)]
struct Delta {
    new: Option<NewFact>,
    variants: Vec<String>,
    /// Semantic mode: the deduper's insertion numbers of the wordings this pass kept
    /// (the new fact's first, then each of `variants`).
    ords: Vec<u64>,
    evidence: Vec<EvidenceLink>,
    /// The entry types of those findings.
    kinds: BTreeSet<&'static str>,
    /// The latest observation time of its findings in this pass, when one was not the
    /// finding's own time.
    observed: Option<Ts>,
}

impl Pass {
    fn new() -> Pass {
        Pass {
            deltas: BTreeMap::new(),
            contradictions: Vec::new(),
            changes: Vec::new(),
            change_pairs: BTreeSet::new(),
            pairs: BTreeSet::new(),
            contradiction_counts: BTreeMap::new(),
            ends: BTreeMap::new(),
            watermarks: BTreeMap::new(),
            closed: Vec::new(),
            learned: Vec::new(),
            source_events: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.watermarks.is_empty() && self.learned.is_empty() && self.ends.is_empty()
    }

    fn feed(
        &mut self,
        deduper: &mut Deduper,
        fold: &FactsFold,
        e: Event,
        vector: Option<&[f32]>,
        judge: Option<&mut dyn Judge>,
        report: &mut SynthReport,
    ) {
        match self.watermarks.get_mut(&e.run_id) {
            Some(w) => *w = e.seq,
            None => {
                self.watermarks.insert(e.run_id.clone(), e.seq);
            }
        }
        self.source_events += 1;
        match e.kind {
            _ if is_finding(&e) => {}
            EventType::RunClosed => {
                self.closed.push(e.run_id.clone());
                return;
            }
            _ => return,
        }
        report.findings += 1;
        let text = content_text(&e.content);
        let text = clip(text.trim(), FACT_TEXT_BYTES_MAX);
        if text.is_empty() {
            return;
        }
        // Semantic mode: one scope per entry type (agents' subjects are not a guard; the
        // type is).
        let scope = match vector {
            Some(_) => e.kind.as_str(),
            None => e.subject.as_deref().unwrap_or(""),
        };
        let seen = observed(&e);
        let e_ts = e.ts;
        let c = match vector {
            Some(v) => deduper.classify_semantic(scope, text, v, seen, judge),
            None => deduper.classify(scope, text, judge),
        };
        let (idx, how) = match c.matched {
            Match::New => {
                let i = deduper.add_fact(scope, text);
                let d = self.deltas.entry(i).or_default();
                if let Some(v) = vector {
                    d.ords.push(deduper.add_vector(i, v));
                }
                report.facts_new += 1;
                d.new = Some(NewFact {
                    subject: e.subject.clone(),
                    kind: e.kind.as_str().to_string(),
                    text: text.to_string(),
                });
                (i, Cow::Borrowed("first"))
            }
            Match::Exact(f) => {
                report.matched_exact += 1;
                (f, Cow::Borrowed("exact"))
            }
            Match::Near { fact, score } | Match::Judged { fact, score } => {
                let judged = matches!(c.matched, Match::Judged { .. });
                if judged {
                    report.matched_judged += 1;
                } else {
                    report.matched_near += 1;
                }
                if deduper.add_variant(fact, text) {
                    let d = self.deltas.entry(fact).or_default();
                    if let Some(v) = vector {
                        d.ords.push(deduper.add_vector(fact, v));
                    }
                    d.variants.push(text.to_string());
                }
                let tag = if judged { "judged" } else { "near" };
                (fact, Cow::Owned(format!("{tag} {score:.2}")))
            }
        };
        let d = self.deltas.entry(idx).or_default();
        d.kinds.insert(e.kind.as_str());
        d.evidence.push(EvidenceLink(
            e.run_id.clone(),
            e.seq,
            e.id,
            e.agent_id,
            e.ts,
            e.confidence,
            how,
        ));
        // Bounded: the strongest few per finding (ties: the newest facts, the standing
        // readings a new one replaces), and a cap per fact, so a subject with
        // many look-alike readings (a metric sampled over time) cannot make the
        // contradictions grow quadratically.
        let mut changes = c.changes;
        changes.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
        changes.truncate(CONTRADICTIONS_PER_FINDING_MAX);
        for (other, score) in changes {
            let other_ts = deduper.last_seen(other).unwrap_or(seen);
            let (earlier, later, at) = if other_ts <= seen {
                (other, idx, seen)
            } else {
                (idx, other, other_ts)
            };
            let known = fold
                .facts
                .get(earlier)
                .is_some_and(|f| f.changed.is_some_and(|(l, _)| l == later));
            if other == idx || known || !self.change_pairs.insert((earlier, later)) {
                continue;
            }
            self.changes.push(Record::Change {
                earlier: fact_id(earlier),
                later: fact_id(later),
                score,
                at,
                trigger: (e.run_id.clone(), e.seq),
            });
        }
        deduper.observe(idx, seen);
        if seen != e_ts {
            let o = &mut self.deltas.entry(idx).or_default().observed;
            *o = Some(o.map_or(seen, |x| x.max(seen)));
        }
        let mut contradicts = c.contradicts;
        contradicts.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
        contradicts.truncate(CONTRADICTIONS_PER_FINDING_MAX);
        let contra_subject = match vector {
            Some(_) => e.subject.as_deref().unwrap_or(""),
            None => scope,
        };
        for (other, score) in contradicts {
            if other == idx || (scope.is_empty() && vector.is_none()) {
                continue;
            }
            let count = |f: usize| {
                fold.facts.get(f).map_or(0, |x| x.contradictions.len())
                    + self.contradiction_counts.get(&f).copied().unwrap_or(0)
            };
            if count(idx) >= CONTRADICTIONS_PER_FACT_MAX
                || count(other) >= CONTRADICTIONS_PER_FACT_MAX
            {
                continue;
            }
            let pair = (idx.min(other), idx.max(other));
            if fold.contradicts(pair.0, pair.1) || !self.pairs.insert(pair) {
                continue;
            }
            *self.contradiction_counts.entry(pair.0).or_default() += 1;
            *self.contradiction_counts.entry(pair.1).or_default() += 1;
            let n = fold.contradictions.len() + self.contradictions.len();
            self.contradictions.push(Record::Contradiction {
                id: format!("C{}", n + 1),
                a: fact_id(pair.0),
                b: fact_id(pair.1),
                subject: contra_subject.to_string(),
                score,
                at: e.ts,
                trigger: (e.run_id.clone(), e.seq),
            });
        }
    }

    /// The pass's records in write order: facts (new ones in number order), then
    /// contradictions, then learnings.
    fn records(&mut self) -> Vec<Record> {
        let mut out = Vec::new();
        for (&i, d) in &mut self.deltas {
            let mut new = d.new.take();
            let mut variants = std::mem::take(&mut d.variants);
            let mut ords = std::mem::take(&mut d.ords);
            // Records of at most EVIDENCE_PER_RECORD_MAX links, each its own allocation
            // of its own size: `split_off` left every record holding the capacity of all
            // the links after it (quadratic memory for a fact found 10,000 times in a
            // pass: 55 MiB of the synth bench's peak).
            let mut links = std::mem::take(&mut d.evidence).into_iter();
            let mut observed = d.observed.take();
            let kinds: Vec<String> = std::mem::take(&mut d.kinds)
                .into_iter()
                .map(str::to_string)
                .collect();
            loop {
                let evidence: Vec<EvidenceLink> =
                    links.by_ref().take(EVIDENCE_PER_RECORD_MAX).collect();
                out.push(Record::Fact {
                    fact: fact_id(i),
                    new: new.take(),
                    variants: std::mem::take(&mut variants),
                    ords: std::mem::take(&mut ords),
                    kinds: match evidence.is_empty() {
                        true => Vec::new(),
                        false => kinds.clone(),
                    },
                    evidence: Evidence(evidence),
                    observed: observed.take(),
                });
                if links.len() == 0 {
                    break;
                }
            }
        }
        out.append(&mut self.contradictions);
        out.append(&mut self.changes);
        for (run, l, shared) in std::mem::take(&mut self.learned) {
            out.push(Record::Learned {
                run,
                learnings: Box::new(l),
                shared: Some(Box::new(shared)),
            });
        }
        out
    }
}

/// The shared copy of a run's learnings: every text field through the sanitizer, and
/// the fingerprints recomputed from the sanitized fields, so the same lesson learned by
/// two users merges in the shared scope.
pub(crate) fn sanitize_learnings(
    s: &Sanitizer,
    mut l: patterns::RunLearnings,
) -> patterns::RunLearnings {
    if let Some(p) = &mut l.pattern {
        p.symptom_type = s.text(&p.symptom_type);
        p.root_cause_category = s.text(&p.root_cause_category);
        for t in &mut p.tool_sequence {
            *t = s.text(t);
        }
        p.resolution_summary = s.text(&p.resolution_summary);
        p.fingerprint = patterns::fingerprint(&[
            &p.symptom_type,
            &p.root_cause_category,
            &p.tool_sequence.join("\u{1}"),
        ]);
    }
    for m in &mut l.mistakes {
        m.tool = s.text(&m.tool);
        m.error = s.text(&m.error);
        // (Not text the sanitizer rewrites in place: a name it would change is dropped,
        // and where the correction's text names it, it says `<ARG>`.)
        let kept = crate::synth::sanitize::shareable_arg_names(s, &m.changed_args);
        let dropped: Vec<&String> = m
            .changed_args
            .iter()
            .filter(|n| !kept.contains(n))
            .collect();
        // The names first: the sanitizer would turn a name it recognizes into its own
        // placeholder (`<NAME>`), which says less than `<ARG>`.
        m.correction = m.correction.as_deref().map(|c| {
            let mut c = c.to_string();
            for name in &dropped {
                if let Ok(re) = regex::Regex::new(&format!(r"(?i)\b{}\b", regex::escape(name))) {
                    c = re.replace_all(&c, "<ARG>").into_owned();
                }
            }
            s.text(&c)
        });
        m.changed_args = kept;
        m.fingerprint = patterns::fingerprint(&[&m.tool, &m.error]);
    }
    l
}

/// An event with its free text (content, subject, meta) through the sanitizer. The
/// subject always: the learner takes a run's symptom from its first hypothesis's subject
/// when no `meta.symptom` names one, and cuts it to a slug, after which an address or a
/// number is no longer recognizable.
fn sanitize_event(s: &Sanitizer, mut e: Event) -> Event {
    e.subject = e.subject.map(|x| s.text(&x));
    if e.meta.is_none() && e.kind != EventType::Decision {
        return e;
    }
    e.content = s.value(&e.content);
    if let Some(m) = e.meta.take() {
        e.meta = match s.value(&Value::Object(m)) {
            Value::Object(m) => Some(m),
            _ => None,
        };
    }
    e
}

impl Store {
    fn synth_lock_path(&self) -> Result<PathBuf> {
        Ok(self.root().join(self.user()).join("@facts.synth-lock"))
    }

    /// Folds the user's facts log (committed passes only). With `cutoff`, the facts as
    /// they stood at that time.
    pub fn facts_fold(&self, cutoff: Option<Ts>) -> Result<FactsFold> {
        self.facts_fold_with(cutoff, Visibility::Visible)
    }

    /// The fold the synthesizer builds on: every whole frame *written*, durable or not.
    /// A synth killed after writing a pass's commit but before its fsync leaves a commit
    /// that readers do not see yet; the next synth appends after it (and its own fsync
    /// covers it), so it must build on it too, or that pass would be applied twice.
    fn facts_fold_with(&self, cutoff: Option<Ts>, visibility: Visibility) -> Result<FactsFold> {
        let opts = ReadOptions {
            visibility,
            // Written frames past the visible mark are not in the index.
            full_scan: visibility == Visibility::Written,
            ..ReadOptions::default()
        };
        let run_dir = self.run_dir(FACTS_RUN)?;
        // The newest valid snapshot, then the events after its commit (a time-travel fold
        // has its own cutoff and starts from the beginning).
        if cutoff.is_none() {
            let snap = snapshot::load_checked(
                &**self.storage(),
                &self.checkpoint_dir(FACTS_RUN),
                &run_dir,
            )?;
            if let Some((mut fold, info)) = snap {
                let it = EventIter::new_at(
                    self.storage().clone(),
                    run_dir,
                    FACTS_RUN,
                    info.end(),
                    info.seq + 1,
                    opts,
                )?;
                for e in it {
                    fold.apply(&e?);
                }
                return Ok(fold);
            }
        }
        let mut fold = FactsFold::new(cutoff);
        match self.read(FACTS_RUN, opts) {
            Ok(it) => {
                for e in it {
                    fold.apply(&e?);
                }
            }
            Err(Error::RunNotFound(_)) => {}
            Err(e) => return Err(e),
        }
        Ok(fold)
    }

    /// Writes a snapshot of `fold` (standing at its last commit), so the next synth and
    /// the next `swarm facts` fold only what comes after it. Best effort: a failure is
    /// logged and costs only time later.
    fn write_snapshot(&self, fold: &FactsFold) {
        let Some((_, commit)) = fold.last_pass else {
            return;
        };
        let r = (|| -> Result<bool> {
            // This synth holds the lock and wrote the commit last, with `sync`: the commit's
            // frame is the one that ends at the visible mark. Find where it starts by
            // reading backwards to the previous line end (no index needed).
            let run_dir = self.run_dir(FACTS_RUN)?;
            let marks = crate::log::watermark::read_marks(&**self.storage(), &run_dir)?;
            let end = marks.visible;
            let Some(start) = snapshot::frame_start_before(&**self.storage(), &run_dir, end)?
            else {
                return Ok(false);
            };
            let info = CheckpointInfo {
                seq: commit,
                segment: end.seg,
                frame_start: start,
                frame_end: end.off,
                ts: Ts::now(),
            };
            if !checkpoint::frame_ends_at(&**self.storage(), &run_dir, &info)? {
                return Ok(false);
            }
            snapshot::write(self.storage(), &self.checkpoint_dir(FACTS_RUN), fold, &info)?;
            Ok(true)
        })();
        match r {
            Ok(true) => {}
            Ok(false) => tracing::debug!("facts snapshot skipped: the commit frame was not found"),
            Err(e) => tracing::warn!(error = %e, "cannot write a facts snapshot"),
        }
    }

    /// The watermarks of the facts log, from its commits alone (through the index: fast
    /// when nothing is new).
    #[allow(clippy::type_complexity)]
    fn synth_watermarks(&self) -> Result<(Watermarks, Option<(u64, Commit)>)> {
        let mut w = Watermarks::new();
        let mut last = None;
        let it = match self.read(
            FACTS_RUN,
            ReadOptions {
                kind: Some(EventType::SynthCommit),
                ..ReadOptions::default()
            },
        ) {
            Ok(it) => it,
            Err(Error::RunNotFound(_)) => return Ok((w, last)),
            Err(e) => return Err(e),
        };
        for e in it {
            let e = e?;
            if let Ok(c) = serde_json::from_value::<Commit>(e.content) {
                // As `FactsFold::apply_commit`: a moved watermark forgets the end; an
                // end recorded (in this pass or a later one) sets it.
                for (run, &seq) in &c.watermarks {
                    let x = w.entry(run.clone()).or_default();
                    *x = (x.0.max(seq), None);
                }
                for (run, &end) in &c.ends {
                    w.entry(run.clone()).or_default().1 = Some(end);
                }
                last = Some((e.seq, c));
            }
        }
        Ok((w, last))
    }

    /// The watermarks of the newest valid facts snapshot, if the facts log has nothing
    /// visible after the commit it stands at (then they are the log's).
    #[allow(clippy::type_complexity)]
    fn snapshot_watermarks(&self) -> Result<Option<(Watermarks, Option<(u64, Commit)>)>> {
        let run_dir = self.run_dir(FACTS_RUN)?;
        let Some((fold, info)) =
            snapshot::load_checked(&**self.storage(), &self.checkpoint_dir(FACTS_RUN), &run_dir)?
        else {
            return Ok(None);
        };
        let marks = crate::log::watermark::read_marks(&**self.storage(), &run_dir)?;
        if marks.visible != info.end() {
            return Ok(None);
        }
        let w = fold
            .watermarks
            .iter()
            .map(|(run, &seq)| (run.clone(), (seq, fold.ends.get(run).copied())))
            .collect();
        // What the fast path needs of the last commit: its learned runs (to re-send
        // their shared copies) and the facts total.
        let last = fold.last_pass.map(|(_, commit)| {
            (
                commit,
                Commit {
                    learned: fold.last_learned.clone(),
                    facts_total: fold.facts.len() as u64,
                    ..Commit::default()
                },
            )
        });
        Ok(Some((w, last)))
    }

    /// The learnings recorded by the pass that ends with the commit at `commit_seq` (and
    /// begins at `begin`, when known: then read from every written frame; else the begin
    /// is looked up among the visible events).
    fn pass_learnings(
        &self,
        begin: Option<u64>,
        commit_seq: u64,
    ) -> Result<Vec<(String, patterns::RunLearnings)>> {
        let (begin, opts) = match begin {
            Some(b) => (
                b,
                ReadOptions {
                    visibility: Visibility::Written,
                    full_scan: true,
                    ..ReadOptions::default()
                },
            ),
            None => {
                let b = self
                    .read(
                        FACTS_RUN,
                        ReadOptions {
                            kind: Some(EventType::SynthBegin),
                            to_seq: Some(commit_seq),
                            last: Some(1),
                            ..ReadOptions::default()
                        },
                    )?
                    .next()
                    .transpose()?
                    .map_or(1, |e| e.seq);
                (b, ReadOptions::default())
            }
        };
        let mut out = Vec::new();
        for e in self.read(
            FACTS_RUN,
            ReadOptions {
                kind: Some(EventType::Synth),
                from_seq: Some(begin),
                to_seq: Some(commit_seq),
                ..opts
            },
        )? {
            let e = e?;
            if e.content.get("op").and_then(Value::as_str) != Some("learned") {
                continue;
            }
            if let Ok(Record::Learned {
                run,
                learnings,
                shared,
            }) = serde_json::from_value(e.content)
            {
                out.push((run, *shared.unwrap_or(learnings)));
            }
        }
        Ok(out)
    }

    /// Whether a run has events after its watermark, cheaply: when the last pass read the
    /// run to its end, the run's visible mark is compared with that end (one small file
    /// read, no event read); otherwise the first event after the watermark is looked for.
    fn run_has_new(&self, run: &str, mark: Option<(u64, Option<(u64, u64)>)>) -> Result<bool> {
        let Some((seq, end)) = mark else {
            let mut it = self.read(
                run,
                ReadOptions {
                    limit: Some(1),
                    ..ReadOptions::default()
                },
            )?;
            return Ok(it.next().transpose()?.is_some());
        };
        if let (Some((seg, off)), None) = (end, self.archived(run)?) {
            let marks = crate::log::watermark::read_marks(&**self.storage(), &self.run_dir(run)?)?;
            return Ok((marks.visible.seg, marks.visible.off) != (seg, off));
        }
        let mut it = self.read(
            run,
            ReadOptions {
                from_seq: Some(seq + 1),
                limit: Some(1),
                ..ReadOptions::default()
            },
        )?;
        Ok(it.next().transpose()?.is_some())
    }

    /// Runs the batch synthesizer over the user's runs: incremental from each run's
    /// watermark, streaming (memory bounded by one pass, never by the log), idempotent
    /// (nothing new: nothing written), crash-safe (a pass is committed as a whole with the
    /// watermarks it reached, or not at all). Only one synth per user runs at a time.
    pub fn synth(
        &self,
        opts: &SynthOptions,
        mut progress: impl FnMut(&SynthProgress),
    ) -> Result<SynthReport> {
        let started = Instant::now();
        if self.user() == SHARED_USER {
            return Err(Error::Forbidden(format!(
                "{SHARED_USER:?} is the shared scope; synthesize as a user"
            )));
        }
        let mut report = SynthReport {
            user: self.user().to_string(),
            ..SynthReport::default()
        };
        let runs: Vec<String> = match &opts.runs {
            Some(r) => {
                for run in r {
                    crate::event::check_run_id(run)?;
                    if run.starts_with('@') {
                        return Err(Error::invalid(
                            "run",
                            format!("{run:?} is an engine log, not a run to synthesize"),
                        ));
                    }
                    if !self.run_ids()?.contains(run) {
                        return Err(Error::RunNotFound(run.clone()));
                    }
                }
                r.clone()
            }
            None => self
                .run_ids()?
                .into_iter()
                .filter(|r| !r.starts_with('@'))
                .collect(),
        };
        let lock_path = self.synth_lock_path()?;
        let dir = self.root().join(self.user());
        self.storage()
            .create_dir_all(&dir)
            .ctx("create dir", &dir)?;
        let lock = self
            .storage()
            .open(&lock_path, OpenMode::ReadWriteCreate)
            .ctx("open", &lock_path)?;
        if !lock.try_lock().ctx("lock", &lock_path)? {
            return Err(Error::Conflict(format!(
                "another synth is running for user {:?} (lock {})",
                self.user(),
                lock_path.display()
            )));
        }

        // Fast path: nothing new since the last commit. The watermarks come from the
        // facts fold's snapshot when nothing was written after it, else from the
        // commits (through the index).
        let (marks, last_commit) = match self.snapshot_watermarks()? {
            Some(w) => w,
            None => {
                tracing::debug!("synth: watermarks from the commits (no current snapshot)");
                self.synth_watermarks()?
            }
        };
        tracing::debug!(
            ms = started.elapsed().as_millis() as u64,
            "synth: watermarks read"
        );
        let mut any_new = false;
        for r in &runs {
            // A run that cannot be read (a damaged archive) is reported below.
            if !matches!(
                self.run_has_new(r, marks.get(r).copied()),
                Ok(false) | Err(Error::Corrupt { .. })
            ) {
                any_new = true;
                break;
            }
        }
        tracing::debug!(
            ms = started.elapsed().as_millis() as u64,
            any_new,
            "synth: runs checked"
        );
        // Re-send the last pass's shared copies (idempotent ids): a crash may have come
        // between its commit and them.
        if let Some((seq, c)) = &last_commit {
            if !c.learned.is_empty() {
                report.shared_copies +=
                    self.share_learnings(self.pass_learnings(None, *seq)?, opts)?;
            }
        }
        // Said also when there is nothing new: the mode is never left unsaid.
        report.semantic = match opts.embedder.as_deref() {
            Some(m) => format!("on: {}", m.id()),
            None => format!("off: {}", opts.no_model_reason),
        };
        if !any_new {
            report.nothing_new = true;
            report.facts_total = last_commit.map_or(0, |(_, c)| c.facts_total);
            report.elapsed_ms = started.elapsed().as_millis() as u64;
            let _ = lock.unlock();
            return Ok(report);
        }

        let mut judge = opts.llm.as_ref().map(|o| LlmJudge {
            opts: o,
            calls: 0,
            fallbacks: 0,
        });
        let mut fold = self.facts_fold_with(None, Visibility::Written)?;
        // The last pass may be one whose commit was not visible to the fast path above.
        if let Some((begin, commit)) = fold.last_pass {
            if !fold.last_learned.is_empty() && Some(commit) != last_commit.as_ref().map(|c| c.0) {
                report.shared_copies +=
                    self.share_learnings(self.pass_learnings(Some(begin), commit)?, opts)?;
            }
        }
        let embedder = opts.embedder.as_deref();
        let mut deduper = restore(&fold, &opts.dedup, embedder)?;
        let mut pass = Pass::new();
        let mut prog = SynthProgress::default();
        // The seqs of the last pass written (begin, commit): the fold stands there at the end.
        let last_written: std::cell::RefCell<Option<(u64, u64, String)>> =
            std::cell::RefCell::new(None);
        // Passes are written by a second thread while this one classifies the next pass.
        // At most one pass is in flight, and passes are written in order: a pass's
        // commit is on disk before the next pass's begin is written.
        std::thread::scope(|scope| -> Result<()> {
            let (jobs, inbox) = std::sync::mpsc::sync_channel::<WriteJob>(0);
            let (results, outbox) = std::sync::mpsc::channel::<Result<WriteDone>>();
            let writer = scope.spawn(move || {
                for job in inbox {
                    let r = self.write_pass(job, opts);
                    let failed = r.is_err();
                    if results.send(r).is_err() || failed {
                        return;
                    }
                }
            });
            let mut in_flight = false;
            let last_written = &last_written;
            let collect = |in_flight: &mut bool, report: &mut SynthReport| -> Result<()> {
                if std::mem::take(in_flight) {
                    let done = outbox
                        .recv()
                        .map_err(|_| Error::invalid("synth", "the writer thread stopped"))??;
                    report.records_written += done.records_written;
                    report.shared_copies += done.shared_copies;
                    *last_written.borrow_mut() =
                        Some((done.begin_seq, done.commit_seq, done.commit_id));
                }
                Ok(())
            };
            let send =
                |job: WriteJob, in_flight: &mut bool, report: &mut SynthReport| -> Result<()> {
                    collect(in_flight, report)?;
                    jobs.send(job)
                        .map_err(|_| Error::invalid("synth", "the writer thread stopped"))?;
                    *in_flight = true;
                    Ok(())
                };
            for run in &runs {
                let from = fold.watermarks.get(run).copied().unwrap_or(0) + 1;
                let mut rs = RunSynth {
                    run: run.clone(),
                    from_seq: from,
                    to_seq: from - 1,
                    ..RunSynth::default()
                };
                prog.run = run.clone();
                // From the start: a plain scan (a filtered read would first build the
                // run's index); from a watermark: the index seeks to it.
                // Damaged records are skipped and reported: one damaged run must not
                // stop the nightly synthesis of every run of the user.
                let read = ReadOptions {
                    from_seq: (from > 1).then_some(from),
                    skip_corrupt: true,
                    ..ReadOptions::default()
                };
                let mut it = match self.read(run, read) {
                    Ok(it) => it,
                    Err(e @ Error::Corrupt { .. }) => {
                        rs.damaged.push(e.to_string());
                        report.runs.push(rs);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                // In chunks, so the model embeds a chunk's findings in one call.
                let mut chunk: Vec<Event> = Vec::with_capacity(EMBED_BATCH);
                let mut vectors: Vec<Option<Vec<f32>>> = Vec::new();
                loop {
                    chunk.clear();
                    for e in it.by_ref() {
                        chunk.push(e?);
                        if chunk.len() == EMBED_BATCH {
                            break;
                        }
                    }
                    if chunk.is_empty() {
                        break;
                    }
                    vectors.clear();
                    vectors.resize(chunk.len(), None);
                    if let Some(m) = embedder {
                        let texts: Vec<(usize, String)> = chunk
                            .iter()
                            .enumerate()
                            .filter_map(|(i, e)| finding_text(e).map(|t| (i, t)))
                            .collect();
                        let refs: Vec<&str> = texts.iter().map(|t| t.1.as_str()).collect();
                        for ((i, _), v) in texts.iter().zip(m.embed(&refs)?) {
                            vectors[*i] = Some(v);
                        }
                    }
                    for (e, vector) in chunk.drain(..).zip(vectors.drain(..)) {
                        let before = report.findings;
                        let seq = e.seq;
                        pass.feed(
                            &mut deduper,
                            &fold,
                            e,
                            vector.as_deref(),
                            judge.as_mut().map(|j| j as &mut dyn Judge),
                            &mut report,
                        );
                        rs.findings += report.findings - before;
                        rs.events += 1;
                        rs.to_seq = seq;
                        report.events += 1;
                        prog.events += 1;
                        if prog.events % 4096 == 0 {
                            progress(&prog);
                        }
                        if pass.source_events >= opts.pass_events_max.max(1) {
                            self.learn_closed(&mut pass, &fold, opts)?;
                            let job = self.prepare_pass(&mut fold, &mut pass, &mut report)?;
                            send(job, &mut in_flight, &mut report)?;
                            prog.passes = report.passes;
                            pass = Pass::new();
                        }
                    }
                }
                // Read to its visible end: where the next synth's fast path looks. Only
                // for a run that had new events (its watermark moves in this pass).
                rs.damaged = it.skipped().iter().map(ToString::to_string).collect();
                if !rs.damaged.is_empty() {
                    tracing::warn!(run = %run, damaged = ?rs.damaged, "synth: damaged records skipped");
                }
                if rs.events > 0 {
                    let end = it.position();
                    pass.ends.insert(run.clone(), (end.seg, end.off));
                }
                if rs.events > 0 || !rs.damaged.is_empty() {
                    report.runs.push(rs);
                }
            }
            self.learn_closed(&mut pass, &fold, opts)?;
            if !pass.is_empty() {
                let job = self.prepare_pass(&mut fold, &mut pass, &mut report)?;
                send(job, &mut in_flight, &mut report)?;
            }
            collect(&mut in_flight, &mut report)?;
            drop(jobs);
            writer
                .join()
                .map_err(|_| Error::invalid("synth", "the writer thread panicked"))?;
            Ok(())
        })?;
        // Not needed past the last pass: freed before the snapshot's encoding, the
        // synth's peak of memory (the fold, its JSON and the compressed body at once).
        drop(deduper);
        if let Some(j) = judge {
            report.llm_calls = j.calls;
            report.llm_fallbacks = j.fallbacks;
        }
        report.facts_total = fold.facts.len() as u64;
        report.facts_multi_agent = fold.facts.iter().filter(|f| f.agents.len() >= 2).count() as u64;
        if let Some((begin, commit, id)) = last_written.into_inner() {
            // Every pass is written: the fold stands at the last commit.
            fold.stand_at(begin, commit, &id);
            self.write_snapshot(&fold);
        }
        report.elapsed_ms = started.elapsed().as_millis() as u64;
        let secs = started.elapsed().as_secs_f64();
        if secs > 0.0 {
            report.events_per_s = report.events as f64 / secs;
        }
        progress(&prog);
        let _ = lock.unlock();
        Ok(report)
    }

    /// Learns patterns and mistakes from the runs this pass saw close (once per run).
    fn learn_closed(&self, pass: &mut Pass, fold: &FactsFold, opts: &SynthOptions) -> Result<()> {
        if pass.closed.is_empty() {
            return Ok(());
        }
        let settings = self.user_settings()?;
        for run in std::mem::take(&mut pass.closed) {
            if fold.learned.contains(&run) || pass.learned.iter().any(|(r, _, _)| *r == run) {
                continue;
            }
            // Two learners: the private one sees the events as they are; the shared one
            // sees them after the sanitizer (error texts are redacted before they are
            // normalized, which keeps e-mails and addresses recognizable).
            let s = Sanitizer::new(self.sanitize_context(&run, opts, &settings));
            let mut private = patterns::Learner::default();
            let mut shared = patterns::Learner::default();
            // A damaged record is skipped, and an archive that cannot be read is left
            // for a later synth: one closed run must not stop every synth of the user.
            let opts = ReadOptions {
                skip_corrupt: true,
                ..ReadOptions::default()
            };
            let it = match self.read(&run, opts) {
                Ok(it) => it,
                Err(e) => {
                    tracing::warn!(run = %run, error = %e, "synth: closed run not readable; not learned from");
                    continue;
                }
            };
            for e in it {
                let e = e?;
                private.push(&e);
                shared.push(&sanitize_event(&s, e));
            }
            let shared = sanitize_learnings(&s, shared.finish());
            pass.learned.push((run, private.finish(), shared));
        }
        Ok(())
    }

    /// Prepares one pass for the writer: its records, the resolutions they call for, and
    /// the `synth_commit` with the watermarks; applies them to the fold.
    fn prepare_pass(
        &self,
        fold: &mut FactsFold,
        pass: &mut Pass,
        report: &mut SynthReport,
    ) -> Result<WriteJob> {
        let mut records = pass.records();
        // The pass is applied to the fold record by record as it is written below (the
        // same records, so the fold is what a reader of the log would fold); resolutions
        // are decided on the state the pass leads to. If a write fails, the synth stops
        // and this fold is dropped with it.
        let mut touched = BTreeSet::new();
        for r in &records {
            fold.apply_record(r);
            match r {
                Record::Fact { fact, .. } => {
                    touched.extend(parse_id('F', fact));
                }
                Record::Contradiction { a, b, .. } => {
                    touched.extend(parse_id('F', a));
                    touched.extend(parse_id('F', b));
                }
                _ => {}
            }
        }
        let (resolutions, new_winners) = resolve(fold, &touched);
        report.resolutions += new_winners;
        report.contradictions_new += records
            .iter()
            .filter(|r| matches!(r, Record::Contradiction { .. }))
            .count() as u64;
        report.changes_new += records
            .iter()
            .filter(|r| matches!(r, Record::Change { .. }))
            .count() as u64;
        records.extend(resolutions);

        let pass_no = fold.passes + 1;
        let learned_items: Vec<(String, patterns::RunLearnings)> = records
            .iter()
            .filter_map(|r| match r {
                Record::Learned {
                    run,
                    learnings,
                    shared,
                } => Some((
                    run.clone(),
                    *shared.clone().unwrap_or_else(|| learnings.clone()),
                )),
                _ => None,
            })
            .collect();
        let learned: Vec<String> = learned_items.iter().map(|(r, _)| r.clone()).collect();
        let commit = Commit {
            pass: pass_no,
            watermarks: std::mem::take(&mut pass.watermarks),
            learned: learned.clone(),
            source_events: pass.source_events,
            facts_total: fold.facts.len() as u64,
            ends: std::mem::take(&mut pass.ends),
        };
        // Subjects now, while the fold is at hand; the writer thread gets plain data.
        let records: Vec<(Option<String>, Record)> = records
            .into_iter()
            .map(|r| {
                let subject = match &r {
                    Record::Fact { fact, .. } => parse_id('F', fact)
                        .and_then(|i| fold.facts.get(i))
                        .and_then(|f| f.subject.clone()),
                    Record::Contradiction { subject, .. } => Some(subject.clone()),
                    Record::Learned { .. } => Some(LEARNED_SUBJECT.to_string()),
                    Record::Resolution { .. } | Record::Change { .. } => None,
                };
                (subject, r)
            })
            .collect();
        fold.apply_commit(&commit);
        report.passes += 1;
        report.learned_runs.extend(learned.iter().cloned());
        Ok(WriteJob {
            records,
            commit,
            learned: learned_items,
        })
    }

    /// Writes one prepared pass: `synth_begin`, its records, `synth_commit`, in frames
    /// bounded in events and bytes, written as they fill (memory: one frame); only the
    /// last one (with the commit) is synced, and its fdatasync covers all. Then the
    /// shared copies of what the pass learned.
    fn write_pass(&self, job: WriteJob, opts: &SynthOptions) -> Result<WriteDone> {
        let user = self.user().to_string();
        let mut done = WriteDone::default();
        let mut batch: Vec<Checked> = vec![engine_event(
            &user,
            EventType::SynthBegin,
            None,
            serde_json::json!({ "pass": job.commit.pass }),
        )];
        let mut bytes = 0usize;
        for (subject, r) in job.records {
            let content = to_value(&r)?;
            drop(r);
            let size = 256 + approx_json_len(&content);
            if batch.len() >= FRAME_EVENTS_MAX || bytes + size > FRAME_BYTES_MAX {
                let n = batch.len() as u64;
                let stored = self.append_checked(
                    FACTS_RUN,
                    std::mem::take(&mut batch),
                    None,
                    Durability::None,
                )?;
                if done.begin_seq == 0 {
                    done.begin_seq = stored.first().map_or(0, |e| e.seq);
                }
                done.records_written += n;
                bytes = 0;
            }
            bytes += size;
            batch.push(engine_event(&user, EventType::Synth, subject, content));
        }
        batch.push(engine_event(
            &user,
            EventType::SynthCommit,
            None,
            to_value(&job.commit)?,
        ));
        let n = batch.len() as u64;
        let stored = self.append_checked(FACTS_RUN, batch, None, Durability::Sync)?;
        if done.begin_seq == 0 {
            done.begin_seq = stored.first().map_or(0, |e| e.seq);
        }
        done.commit_seq = stored.last().map_or(0, |e| e.seq);
        done.commit_id = stored.last().map(|e| e.id.clone()).unwrap_or_default();
        done.records_written += n;
        done.shared_copies += self.share_learnings(job.learned, opts)?;
        Ok(done)
    }
}

#[cfg(test)]
mod tests;
