//! The second stage of search: the first [`RERANK_TOP`] hits of the fused rank are
//! ordered again by the question's *intent*, which neither words nor a sentence
//! embedding weigh well: a question about theories (`what was suspected`) wants
//! hypotheses, one about what was ruled out wants a ruled-out statement, one about a
//! decision or an action wants that kind of entry, one about the cause in the end wants
//! a confirmed one, one about whether it is over wants a resolution. Told by the
//! question's words (a fixed list below) and the hit's entry type and the stance of its
//! wordings (`dedup::slots::stance`). A question with no such words has no intent, and
//! the order stands.
//!
//! Each hit's new score is `1 / (60 + position)` in the fused order (the fused rank's own
//! scale) plus [`INTENT_BONUS`] when it is what the intent asks for: a bonus worth about
//! ten places near the top and fewer further down, so the hits keep their order among
//! themselves. Deterministic: ties keep the fused order.
//!
//! What was tried and not kept (README, "The second stage"): a bonus for holding the
//! question's identifiers and names (through the typed slots), and a penalty for naming
//! another proper name. They lifted the template questions of `tune`, but on the
//! hand-written `tune3` each cost a query in the top 3, since an anchor most hits of a
//! run share (its service, the paper every finding cites) reorders them by chance.

use std::sync::OnceLock;

use regex::Regex;

use crate::synth::dedup::slots::{stance, Stance};

/// Hits of the fused rank reordered, at most.
pub const RERANK_TOP: usize = 50;
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
            (Intent::RuledOut, re(r"\b(ruled?[- ]out|rules out|eliminat\w*|exclud\w*|dismiss\w*|disprov\w*|refut\w*|fell apart|fall apart|did ?n[o']t hold|does ?n[o']t hold|not the cause|innocent)\b")),
            (Intent::Hypothesis, re(r"\b(theor(y|ies)|hypothes\w*|suspected|suspects|(we|they|you|i|team|agents?) suspect|suspicions?|guess\w*|speculat\w*|floated|conjectur\w*|working assumption|hunch\w*|possible (cause|explanation|reason)s?|candidates? for the cause)\b")),
            (Intent::Decision, re(r"\b(decid\w*|decision\w*|agreed|chose|chosen|approved (the|a|an|to)|settled on (doing|a plan)|plan(ned)? to)\b")),
            (Intent::Action, re(r"\b(what did (we|they|you|i|anyone|someone) do|actions? (taken|did)|what actions|mitigation steps?|steps? taken|was done|were done)\b")),
            (Intent::Cause, re(r"\b(root[- ]cause|in the end|turn(s|ed)? out|ultimately|actual(ly)? cause|real cause|settle[d]? on|conclu\w*|explanation|why did|what caused|caused)\b")),
            (Intent::Resolution, re(r"\b(resolved|over yet|is (it|the \w+( \w+)?) over|closed out|incident closed|all clear|cleared|back to normal|recovered|fixed yet)\b")),
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

/// A hit as the second stage sees it.
pub struct Candidate<'a> {
    /// Every wording it is found by.
    pub texts: Vec<String>,
    /// Its entry type (`hypothesis`, `decision`, ...).
    pub kind: &'a str,
}

/// The new order of `cands` (the first hits of the fused rank, best first) for a
/// question of intent `want`: a permutation of their positions, each with its new score,
/// `1 / (k + place)` plus the bonus, where `k` is the fused rank's constant.
pub fn reorder(want: Intent, k: f64, cands: &[Candidate<'_>]) -> Vec<(usize, f64)> {
    let mut scored: Vec<(f64, usize)> = cands
        .iter()
        .enumerate()
        .map(|(pos, c)| {
            let stances: Vec<Stance> = c.texts.iter().map(|t| stance(t)).collect();
            let bonus = match answers(want, c.kind, &stances) {
                true => INTENT_BONUS,
                false => 0.0,
            };
            (1.0 / (k + (pos + 1) as f64) + bonus, pos)
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored
        .into_iter()
        .map(|(score, pos)| (pos, score))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand<'a>(text: &str, kind: &'a str) -> Candidate<'a> {
        Candidate {
            texts: vec![text.to_string()],
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
    fn the_hit_the_question_asks_for_moves_up() {
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
            cand(
                "A stuck consumer was ruled out for the queue backlog.",
                "evidence",
            ),
        ];
        let first = |q: &str| intent(q).map(|w| reorder(w, 60.0, &cands)[0].0);
        assert_eq!(
            first("what theories were there about the queue backlog?"),
            Some(2)
        );
        assert_eq!(first("which explanations were eliminated?"), Some(3));
        assert_eq!(first("is the backlog resolved?"), Some(1));
        assert_eq!(first("what caused the backlog in the end?"), Some(0));
        // Symptoms are no intent: a rejected connection, an alert's approval service.
        assert_eq!(first("why were connections rejected?"), None);
        assert_eq!(first("is the approval service slow?"), None);
        // "suspect" as an adjective is no question about theories.
        assert_eq!(
            first("how much light does the suspect transceiver get?"),
            None
        );
        // A question that asks for nothing leaves the order alone.
        assert_eq!(first("how slow was checkout"), None);
    }

    #[test]
    fn a_bonus_moves_a_hit_a_bounded_number_of_places() {
        let mut cands: Vec<Candidate<'_>> = (0..RERANK_TOP)
            .map(|i| cand(&format!("queue note number {i}"), "evidence"))
            .collect();
        cands.push(cand("Maybe the batch size is behind it.", "hypothesis"));
        let want = intent("what was suspected?").unwrap();
        let order = reorder(want, 60.0, &cands[RERANK_TOP - 30..]);
        // Thirty places below the top: the intent bonus alone does not lift it first.
        assert_ne!(order[0].0, 30);
        let order = reorder(want, 60.0, &cands[RERANK_TOP - 5..]);
        assert_eq!(order[0].0, 5);
    }
}
