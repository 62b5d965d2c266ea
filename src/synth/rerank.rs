//! The second stage of search: the first [`RERANK_TOP`] hits of the fused rank are
//! ordered again by what the question itself asks for, which neither words nor a
//! sentence embedding weigh well:
//!
//! - **its anchors**: the identifiers, names and dated values it names (`RideNow 5.2.0`,
//!   `cust_1177`, `db-primary-2`, `May 2026`), taken by the synthesizer's typed slots
//!   (`dedup::slots`) of the question and of each hit's wordings. A hit that holds more
//!   of them ranks higher; one that names a proper name the question lacks while lacking
//!   one the question names (`iOS` for `Android`) ranks lower. The lexical rank splits
//!   `5.2.0` into digits and `db-primary-2` into words, and an embedding hardly tells
//!   `5.2.0` from `5.3.0`;
//! - **its intent**: a question about theories (`what was suspected`) wants hypotheses, one
//!   about what was ruled out wants a ruled-out statement, one about a decision or an
//!   action wants that kind of entry, one about the cause in the end wants a confirmed
//!   one. Told by the question's words (a fixed list below) and the hit's entry type and
//!   stance (`dedup::slots::stance`). A question with no such words has no intent.
//!
//! Each hit's new score is `1 / (60 + position)` (the fused rank's own scale) in the fused order plus
//! [`ANCHOR_BONUS`] times the share of the question's anchors it holds, minus
//! [`CONFLICT_PENALTY`] for a name conflict, plus [`INTENT_BONUS`] when it is what the
//! intent asks for; so a bonus moves a hit up by a bounded number of places, and the order
//! of hits the question says nothing about is kept. Only the first hits are reordered:
//! the slots are computed for at most [`RERANK_TOP`] hits per search. Deterministic:
//! ties keep the fused order.

use std::sync::OnceLock;

use regex::Regex;

use crate::synth::dedup::slots::{self, Slots, Stance};

/// The fused rank's constant (`search::RRF_K`): a place is worth `1 / (K + place)`.
const K: f64 = 60.0;

/// Hits of the fused rank reordered, at most.
pub const RERANK_TOP: usize = 50;
/// Added for holding every anchor of the question (a share for some): about as much as
/// the first place is worth over the eleventh.
pub const ANCHOR_BONUS: f64 = 0.0025;
/// Taken for naming a proper name the question lacks while lacking one it names.
pub const CONFLICT_PENALTY: f64 = 0.0025;
/// Added for being the kind of statement the question asks for.
pub const INTENT_BONUS: f64 = 0.0025;

/// What a question asks for, beyond its topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    /// Theories, suspicions, hypotheses.
    Hypothesis,
    /// What was ruled out.
    RuledOut,
    /// A decision.
    Decision,
    /// An action taken.
    Action,
    /// The cause as it turned out, a conclusion.
    Cause,
    /// Whether or when it was resolved.
    Resolution,
}

fn intent_patterns() -> &'static [(Intent, Regex)] {
    static P: OnceLock<Vec<(Intent, Regex)>> = OnceLock::new();
    P.get_or_init(|| {
        let re = |s: &str| Regex::new(&format!("(?i){s}")).expect("intent pattern");
        // The first that matches decides: "which causes were ruled out" is about what was
        // ruled out, not about the cause.
        vec![
            (Intent::RuledOut, re(r"\b(ruled?[- ]out|rules out|eliminat\w*|exclud\w*|dismiss\w*|discard\w*|rejected|disprov\w*|refut\w*|fell apart|fall apart|did ?n[o']t hold|does ?n[o']t hold|not the cause|innocent|cleared)\b")),
            (Intent::Hypothesis, re(r"\b(theor(y|ies)|hypothes\w*|suspect\w*|suspicion\w*|guess\w*|speculat\w*|floated|conjectur\w*|working assumption|hunch\w*|possible (cause|explanation|reason)s?|candidates? for the cause)\b")),
            (Intent::Decision, re(r"\b(decid\w*|decision\w*|agreed|chose|chosen|approv\w*|settled on (doing|a plan)|plan(ned)? to)\b")),
            (Intent::Action, re(r"\b(what did (we|they|you|i|anyone|someone) do|actions?( taken)?|mitigation steps?|steps? taken|was done|were done)\b")),
            (Intent::Cause, re(r"\b(root[- ]cause|in the end|turn(s|ed)? out|ultimately|actual(ly)? cause|real cause|settle[d]? on|conclu\w*|explanation|why did|what caused|caused)\b")),
            (Intent::Resolution, re(r"\b(resolved|over yet|is (it|the \w+( \w+)?) over|closed|all clear|back to normal|recovered|fixed yet)\b")),
        ]
    })
}

/// The intent of a question, if its words state one.
pub fn intent(query: &str) -> Option<Intent> {
    intent_patterns()
        .iter()
        .find(|(_, r)| r.is_match(query))
        .map(|(i, _)| *i)
}

/// Whether a hit of entry type `kind` whose wordings stand as `stances` is what `intent`
/// asks for.
fn answers(intent: Intent, kind: &str, stances: &[Stance]) -> bool {
    let any = |s: Stance| stances.contains(&s);
    match intent {
        Intent::Hypothesis => kind == "hypothesis" || any(Stance::Hedged),
        Intent::RuledOut => any(Stance::RuledOut),
        Intent::Decision => kind == "decision",
        Intent::Action => kind == "action_taken",
        Intent::Cause => any(Stance::Confirmed),
        Intent::Resolution => any(Stance::Resolved),
    }
}

/// A question's or a hit's anchors: identifiers, names of things, proper names and the
/// keys of dated values (a date is the one value a question names to pick a fact out).
fn anchors(s: &Slots) -> Vec<String> {
    let mut a: Vec<String> = s
        .sig
        .ids
        .iter()
        .chain(&s.sig.names)
        .chain(&s.names)
        .cloned()
        .collect();
    a.extend(s.sig.value_keys.iter().filter(|k| is_date_key(k)).cloned());
    a.sort();
    a.dedup();
    a
}

/// `20260506` or `202605` (what `measure_text` makes of a date): a value key that is all
/// digits of a year 19xx/20xx and a month.
fn is_date_key(k: &str) -> bool {
    (k.len() == 6 || k.len() == 8)
        && k.bytes().all(|b| b.is_ascii_digit())
        && (k.starts_with("19") || k.starts_with("20"))
}

/// A hit as the second stage sees it.
pub struct Candidate<'a> {
    /// Every wording it is found by.
    pub texts: Vec<String>,
    /// Its subject.
    pub subject: Option<&'a str>,
    /// Its entry type (`hypothesis`, `decision`, ...).
    pub kind: &'a str,
}

/// The new order of `cands` (the first hits of the fused rank, best first) for `query`:
/// a permutation of their positions. `None` when the question names no anchor and no
/// intent (the order stands).
pub fn reorder(query: &str, cands: &[Candidate<'_>]) -> Option<Vec<usize>> {
    let q = Slots::of(query);
    let q_anchors = anchors(&q);
    let want = intent(query);
    if q_anchors.is_empty() && want.is_none() && q.names.is_empty() {
        return None;
    }
    let mut scored: Vec<(f64, usize)> = Vec::with_capacity(cands.len());
    for (pos, c) in cands.iter().enumerate() {
        let slots: Vec<Slots> = c.texts.iter().map(|t| Slots::of(t)).collect();
        let mut score = 1.0 / (K + (pos + 1) as f64);
        if !q_anchors.is_empty() {
            let mut held: Vec<String> = slots.iter().flat_map(anchors).collect();
            held.extend(c.subject.map(str::to_lowercase));
            let got = q_anchors.iter().filter(|a| held.contains(a)).count();
            score += ANCHOR_BONUS * got as f64 / q_anchors.len() as f64;
        }
        if !q.names.is_empty() && slots.iter().all(|s| slots::names_conflict(&q, s)) {
            score -= CONFLICT_PENALTY;
        }
        if let Some(i) = want {
            let stances: Vec<Stance> = slots.iter().map(|s| s.stance).collect();
            if answers(i, c.kind, &stances) {
                score += INTENT_BONUS;
            }
        }
        scored.push((score, pos));
    }
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    Some(scored.into_iter().map(|(_, pos)| pos).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand<'a>(text: &str, kind: &'a str) -> Candidate<'a> {
        Candidate {
            texts: vec![text.to_string()],
            subject: None,
            kind,
        }
    }

    #[test]
    fn a_question_states_its_intent_in_words() {
        for (q, want) in [
            (
                "what did we suspect was behind the queue backlog?",
                Some(Intent::Hypothesis),
            ),
            (
                "which causes were ruled out for the outage?",
                Some(Intent::RuledOut),
            ),
            (
                "what was decided about the rollback?",
                Some(Intent::Decision),
            ),
            (
                "what did we do about the disk alarms?",
                Some(Intent::Action),
            ),
            ("what turned out to be the root cause?", Some(Intent::Cause)),
            (
                "is the checkout incident resolved?",
                Some(Intent::Resolution),
            ),
            ("how slow was checkout at the worst point?", None),
        ] {
            assert_eq!(intent(q), want, "{q}");
        }
    }

    #[test]
    fn the_hit_the_question_names_or_asks_for_moves_up() {
        // Anchors: the version and the platform the question names.
        let cands = [
            cand(
                "Crash-free sessions for RideNow 5.3.0 on iOS are at 93.8 percent.",
                "evidence",
            ),
            cand(
                "Crash-free sessions for RideNow 5.2.0 on Android are at 97.1 percent.",
                "evidence",
            ),
            cand(
                "Crash-free sessions for RideNow 5.2.0 on iOS are at 98.2 percent.",
                "evidence",
            ),
        ];
        let order = reorder("how stable is RideNow 5.2.0 on iOS?", &cands).unwrap();
        assert_eq!(order[0], 2, "{order:?}");
        // Intent: a hypothesis for a question about theories, whatever its place.
        let cands = [
            cand(
                "The queue backlog was caused by a stuck consumer.",
                "evidence",
            ),
            cand("queue backlog: resolved, lag back to baseline", "evidence"),
            cand(
                "Maybe the new batch size is behind the queue backlog.",
                "hypothesis",
            ),
        ];
        let order = reorder("what theories were there about the queue backlog?", &cands).unwrap();
        assert_eq!(order[0], 2, "{order:?}");
        // A question that names nothing and asks for nothing leaves the order alone.
        assert!(reorder("how slow was checkout", &cands).is_none());
    }

    #[test]
    fn a_bonus_moves_a_hit_a_bounded_number_of_places() {
        let mut cands: Vec<Candidate<'_>> = (0..RERANK_TOP)
            .map(|i| cand(&format!("queue note number {i}"), "evidence"))
            .collect();
        cands.push(cand("Maybe the batch size is behind it.", "hypothesis"));
        let order = reorder("what was suspected?", &cands[RERANK_TOP - 30..]).unwrap();
        // Thirty places below the top: the intent bonus alone does not lift it first.
        assert_ne!(order[0], 30);
        let order = reorder("what was suspected?", &cands[RERANK_TOP - 5..]).unwrap();
        assert_eq!(order[0], 5);
    }
}
