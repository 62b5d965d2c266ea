//! Semantic mode of the [`Deduper`]: candidates by meaning, decisions by typed slots.
//!
//! CONTRACT: used when the synthesizer has an embedding model (`embed::Embedder`). Every
//! wording kept for a fact carries its unit vector ([`Deduper::add_vector`]); a finding is
//! compared with the facts whose wordings are nearest by cosine, whatever `subject` the
//! agents gave (agents pick subjects inconsistently: in the labelled sets only 28-64 % of
//! same-fact pairs share one). Same inputs in the same order give the same answers.
//!
//! # Method
//! 1. Candidates: the `candidates` facts with the highest cosine over their kept
//!    wordings, at or above `floor`. While the scope keeps at most `exact_max` wordings:
//!    brute force, one dot product of 384 floats per kept wording (at most
//!    `variants_max` per fact), exact. Beyond that: the `ann_ef` nearest wordings by the
//!    scope's neighbour graph (`ann.rs`), approximate but deterministic, so the cost per
//!    finding grows with the log of the scope, not with its size.
//! 2. Slots (`slots.rs`): each wording is rewritten by generic measurement rules
//!    (`99th pct` -> `p99`, `1.2M` -> `1200000`, `0.41 of` -> `41% of`, `120/s` and
//!    `7,200 per minute` -> one rate, `v2.14.0` -> `2.14.0`, `host:5433` -> `host port
//!    5433`, ...) before its lexical [`Signature`](text::Signature) is taken; its proper
//!    names (`iOS`, `FoodHub`) and entity-like tokens are kept beside it, and its stance.
//! 3. Guards, from those slots: values with their units normalised (2.3 s = 2300 ms),
//!    identifiers (hosts, versions, error codes, ports, paths), hyphenated entity names,
//!    exclusive qualifiers (cpu/memory, p50/p99, states), bounds (a limit is not a
//!    usage), two marked stances that differ, each side naming a proper name the other
//!    lacks (`iOS` / `Android`), and a *minimal pair* (the same wording but for at most
//!    three tokens on each side, one of them an entity: `p99 on cart-svc ...` / `p99 on
//!    checkout ...`). Any of them: never the same fact, however close the meaning
//!    (look-alikes that differ in one slot score near 1 on cosine alone).
//! 4. Same fact: no guard fires and the cosine is at least `merge`, or at least
//!    `merge_supported` with a lexical similarity of at least `lexical_support`, or the
//!    slots *agree*: one anchor (identifier or name, or a dotted/dashed part of one) and
//!    one value at cosine `merge_anchored_value`; one anchor, neither stating a value, at
//!    `merge_anchored`; one value and a shared measured-thing word at `merge_valued`
//!    (MiniLM scores paraphrases that share little wording near 0.4-0.6: agreeing typed
//!    slots are the evidence the cosine lacks).
//! 5. Otherwise, a candidate about the same thing (cosine at least `related`, same
//!    entities, identifiers, qualifiers and bound) that states another value of the same
//!    dimension (not one that rounds to the other's coarser value) is a *change* when
//!    the two were observed more than `change_window_secs` apart (a later measurement
//!    supersedes the earlier one), and a *contradiction* when they overlap in time.
//! 6. With a [`Judge`] (the optional LLM step): when nothing merged, the nearest
//!    unguarded candidate at or above `borderline` is asked; "same" merges it. Opposite polarity with a cosine of at least `polarity` is a
//!    contradiction whatever the time (a cause asserted and ruled out).

use crate::event::ts::Ts;
use crate::synth::dedup::ann;
use crate::synth::dedup::slots::{
    causes_differ, minimal_pair, names_conflict, share_anchor, Slots, Stance,
};
use crate::synth::dedup::{compare, Classified, Cmp, Deduper, FactIdx, Judge, Match};
use crate::synth::text;

/// Tuning of the semantic mode (tuned on `data/fixtures/semantic/tune.jsonl` and
/// `tune2.jsonl` only).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SemanticConfig {
    /// Facts compared per finding, nearest first.
    pub candidates: usize,
    /// Cosine below which a fact is not a candidate.
    pub floor: f32,
    /// Cosine at or above which a guarded pair is the same fact.
    pub merge: f32,
    /// Cosine at or above which a guarded pair is the same fact if its words agree too.
    pub merge_supported: f32,
    /// Lexical similarity (the lexical mode's score) needed with `merge_supported`.
    pub lexical_support: f64,
    /// Cosine from which a guarded pair below `merge` (and not merged by lexical
    /// support) is asked to the [`Judge`] (the optional LLM step), when one is given.
    pub borderline: f32,
    /// Cosine at or above which a pair with incompatible values is about the same thing.
    pub related: f32,
    /// Cosine at or above which opposite polarity is a contradiction.
    pub polarity: f32,
    /// Cosine at or above which an unguarded pair that names one anchor (host, service,
    /// path, version...) and states one value is the same fact (slot agreement).
    pub merge_anchored_value: f32,
    /// Cosine at or above which an unguarded pair that names one anchor, neither stating
    /// a value, is the same fact.
    pub merge_anchored: f32,
    /// Cosine at or above which an unguarded pair that states one value and shares a
    /// measured-thing word is the same fact.
    pub merge_valued: f32,
    /// Findings further apart than this (seconds) that state another value of the same
    /// quantity are a change over time; closer ones contradict.
    pub change_window_secs: u64,
    /// Most kept wordings of one scope searched by brute force (exact); a larger scope
    /// is searched through its approximate neighbour graph (`ann.rs`).
    pub exact_max: usize,
    /// Nodes the approximate search keeps (its breadth): more finds more of the true
    /// neighbours, at more cost.
    pub ann_ef: usize,
}

impl Default for SemanticConfig {
    fn default() -> Self {
        SemanticConfig {
            candidates: 16,
            floor: 0.40,
            merge: 0.75,
            merge_supported: 0.70,
            lexical_support: 0.45,
            borderline: 0.55,
            related: 0.60,
            polarity: 0.75,
            merge_anchored_value: 0.45,
            merge_anchored: 0.60,
            merge_valued: 0.55,
            change_window_secs: 20 * 60,
            exact_max: 4096,
            ann_ef: 96,
        }
    }
}

/// What the guards say of a pair, whatever the cosine.
fn guarded(c: &Cmp) -> bool {
    c.value_conflict
        || c.id_conflict
        || c.class_conflict
        || c.entity_conflict
        || c.bound_diff
        || c.name_conflict
}

/// Same entities, identifiers, qualifiers and bound: the two are about one thing.
fn same_thing(c: &Cmp) -> bool {
    !(c.id_conflict || c.class_conflict || c.entity_conflict || c.bound_diff || c.name_conflict)
}

impl Deduper {
    /// Remembers the vector of the wording of fact `f` added last (call right after
    /// [`Deduper::add_fact`] or a kept [`Deduper::add_variant`]). Returns its insertion
    /// number (0, 1, 2... over the deduper's life): a deduper rebuilt from the facts log
    /// must add the vectors in this order again, because a large scope's neighbour graph
    /// depends on the order its vectors arrived in (`findings::restore` does).
    ///
    /// Panics if `v`'s dimension differs from the scope's earlier vectors (one model per
    /// synthesis).
    pub fn add_vector(&mut self, f: FactIdx, v: &[f32]) -> u64 {
        let sid = self.facts[f].scope as usize;
        if self.vectors.len() <= sid {
            self.vectors.resize_with(sid + 1, Default::default);
        }
        let exact_max = self.cfg.semantic.exact_max;
        let sv = &mut self.vectors[sid];
        if sv.facts.is_empty() {
            sv.dim = v.len();
        }
        assert_eq!(sv.dim, v.len(), "one embedding dimension per synthesis");
        sv.facts.push(f as u32);
        sv.data.extend_from_slice(v);
        let n = sv.facts.len();
        let (data, dim) = (&sv.data, sv.dim);
        match &mut sv.graph {
            Some(g) => g.insert((n - 1) as u32, data, dim),
            None if n > exact_max => {
                // The scope outgrew brute force: link every vector so far, in the order
                // they came (the same graph as linking each on arrival).
                let mut g = ann::Graph::default();
                for k in 0..n {
                    g.insert(k as u32, data, dim);
                }
                sv.graph = Some(g);
            }
            None => {}
        }
        if self.slots.len() <= f {
            self.slots.resize_with(f + 1, Vec::new);
        }
        let k = self.slots[f].len();
        if let Some(w) = self.facts[f].variants.get(k) {
            self.slots[f].push(Slots::of(&w.text));
        }
        self.vectors_added += 1;
        self.vectors_added - 1
    }

    /// The slots of every kept wording of fact `f` (computed here for a wording added
    /// without its vector).
    fn fact_slots(&self, f: FactIdx) -> std::borrow::Cow<'_, [Slots]> {
        let have = self.slots.get(f).map_or(&[][..], Vec::as_slice);
        let variants = &self.facts[f].variants;
        if have.len() >= variants.len() {
            return std::borrow::Cow::Borrowed(&have[..variants.len()]);
        }
        let mut all = have.to_vec();
        all.extend(variants[have.len()..].iter().map(|w| Slots::of(&w.text)));
        std::borrow::Cow::Owned(all)
    }

    /// The time fact `f` was last found (as told by [`Deduper::observe`]).
    pub fn last_seen(&self, f: FactIdx) -> Option<Ts> {
        self.last_ts.get(f).copied().flatten()
    }

    /// Records that fact `f` was found again at `ts` (the latest time counts).
    pub fn observe(&mut self, f: FactIdx, ts: Ts) {
        if let Some(t) = self.last_ts.get_mut(f) {
            *t = Some(t.map_or(ts, |x| x.max(ts)));
        }
    }

    /// How `text` (with unit vector `v`, found at `ts`) relates to the known facts, by
    /// meaning, among the facts of `scope` (the driver passes the entry type: a typed
    /// guard, decisions never merge with observations).
    /// Does not change the deduper.
    pub fn classify_semantic(
        &self,
        scope: &str,
        text: &str,
        v: &[f32],
        ts: Ts,
        judge: Option<&mut dyn Judge>,
    ) -> Classified {
        let mut out = Classified {
            matched: Match::New,
            contradicts: Vec::new(),
            changes: Vec::new(),
        };
        if let Some(&f) = self.exact.get(&text::exact_key(scope, text)) {
            out.matched = Match::Exact(f);
            return out;
        }
        let cfg = &self.cfg.semantic;
        // Best cosine per fact.
        let mut best: Vec<(u32, f32)> = Vec::new();
        let mut slot: std::collections::HashMap<u32, usize> = Default::default();
        let Some(&sid) = self.scopes.get(scope) else {
            return out;
        };
        let Some(sv) = self
            .vectors
            .get(sid as usize)
            .filter(|sv| sv.dim == v.len())
        else {
            return out;
        };
        let mut keep = |f: u32, cos: f32| {
            if cos < cfg.floor {
                return;
            }
            match slot.get(&f) {
                Some(&k) => {
                    if cos > best[k].1 {
                        best[k] = (f, cos);
                    }
                }
                None => {
                    slot.insert(f, best.len());
                    best.push((f, cos));
                }
            }
        };
        match &sv.graph {
            // A large scope: its nearest wordings by the graph (approximate).
            Some(g) => {
                let ef = cfg.ann_ef.max(cfg.candidates);
                for n in g.search(v, ef, cfg.floor, &sv.data, sv.dim) {
                    keep(sv.facts[n.node as usize], n.sim);
                }
            }
            // Brute force: exact.
            None => {
                for (f, w) in sv.facts.iter().zip(sv.data.chunks_exact(sv.dim)) {
                    keep(*f, crate::embed::dot(v, w));
                }
            }
        }
        best.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        best.truncate(cfg.candidates);
        if best.is_empty() {
            return out;
        }
        let mine = Slots::of(text);
        let st = mine.stance;
        let mut same: Option<(FactIdx, f32)> = None;
        // The nearest unguarded candidate in the borderline band: the judge's question.
        let mut borderline: Option<(FactIdx, f32)> = None;
        for &(f, cos) in &best {
            let f = f as usize;
            // The decision over every kept wording: same if any wording says so (and
            // none of them trips a guard), related by the best one.
            let theirs = self.fact_slots(f);
            let cmps: Vec<Cmp> = theirs
                .iter()
                .map(|w| compare(&mine.sig, &w.sig, ""))
                .collect();
            let stances: Vec<Stance> = theirs.iter().map(|w| w.stance).collect();
            // Slots that tell two things apart: different proper names, or the same wording
            // but for an entity (a look-alike).
            let names = theirs.iter().any(|w| {
                names_conflict(&mine, w) || minimal_pair(&mine, w) || causes_differ(&mine, w)
            });
            // A statement without a marker says nothing of its stance: only two marked
            // stances that differ keep statements apart.
            let stance_differs = stances
                .iter()
                .any(|&x| x != st && x != Stance::Plain && st != Stance::Plain);
            let ruled_vs_asserted = stances.iter().any(|&x| {
                (x == Stance::RuledOut) != (st == Stance::RuledOut)
                    && matches!(x, Stance::RuledOut | Stance::Confirmed | Stance::Hedged)
                    && matches!(st, Stance::RuledOut | Stance::Confirmed | Stance::Hedged)
            });
            let any_guard = stance_differs || names || cmps.iter().any(guarded);
            let lexical = cmps.iter().map(Cmp::same_score).fold(0.0, f64::max);
            // Slot agreement, per kept wording: one anchor, one value, one measured thing.
            let agree = theirs.iter().zip(&cmps).any(|(w, c)| {
                let anchor = share_anchor(&mine, w);
                (anchor && c.values_shared > 0.0 && cos >= cfg.merge_anchored_value)
                    || (anchor
                        && !mine.has_values()
                        && !w.has_values()
                        && cos >= cfg.merge_anchored)
                    || (c.values_shared > 0.0 && c.topic > 0.0 && cos >= cfg.merge_valued)
            });
            let is_same = !any_guard
                && (cos >= cfg.merge
                    || (cos >= cfg.merge_supported && lexical >= cfg.lexical_support)
                    || agree);
            tracing::trace!(
                text,
                fact = f,
                other = self.facts[f].variants[0].text.as_str(),
                cmps = ?cmps,
                names,
                anchor = theirs.first().is_some_and(|w| share_anchor(&mine, w)),
                vals = mine.has_values(),
                ovals = theirs.first().is_some_and(Slots::has_values),
                cos,
                any_guard,
                lexical,
                is_same,
                ?st,
                ?stances,
                "semantic candidate"
            );
            if is_same {
                if same.is_none() {
                    same = Some((f, cos));
                }
                continue;
            }
            if !any_guard && cos >= cfg.borderline && borderline.is_none() {
                borderline = Some((f, cos));
            }
            if cos < cfg.related || names || !cmps.iter().all(same_thing) {
                continue;
            }
            let by_value = cmps.iter().any(|c| c.dim_apart);
            let by_polarity = cos >= cfg.polarity
                && (ruled_vs_asserted || cmps.iter().any(|c| c.neg_diff && !c.value_conflict));
            if by_polarity {
                out.contradicts.push((f, f64::from(cos)));
            } else if by_value {
                let apart = self.last_ts[f].is_some_and(|t| {
                    t.0.abs_diff(ts.0) > cfg.change_window_secs.saturating_mul(1_000_000)
                });
                if apart {
                    out.changes.push((f, f64::from(cos)));
                } else {
                    out.contradicts.push((f, f64::from(cos)));
                }
            }
        }
        if same.is_none() {
            if let (Some((f, cos)), Some(j)) = (borderline, judge) {
                let other = &self.facts[f].variants[0].text;
                if j.same(scope, text, other, f64::from(cos)) == Some(true) {
                    out.matched = Match::Judged {
                        fact: f,
                        score: f64::from(cos),
                    };
                    out.contradicts.retain(|x| x.0 != f);
                    out.changes.retain(|x| x.0 != f);
                }
            }
        }
        if let Some((f, cos)) = same {
            out.matched = Match::Near {
                fact: f,
                score: f64::from(cos),
            };
            out.contradicts.retain(|x| x.0 != f);
            out.changes.retain(|x| x.0 != f);
        }
        out.contradicts.sort_by_key(|a| a.0);
        out.changes.sort_by_key(|a| a.0);
        out
    }
}
