//! Tests of the synth driver's passes.

use super::*;

/// A fact found many times in one pass is written as records of at most
/// `EVIDENCE_PER_RECORD_MAX` links, and no record holds room for more: `split_off`
/// left each record the capacity of every link after it (quadratic memory; 55 MiB of
/// the synth bench's peak, whose 100,000 decisions share one wording).
#[test]
fn a_fact_found_often_is_split_into_records_of_their_own_size() {
    let n = 10 * EVIDENCE_PER_RECORD_MAX + 7;
    let mut pass = Pass::new();
    let d = pass.deltas.entry(3).or_default();
    d.kinds.insert("decision");
    for seq in 0..n as u64 {
        d.evidence.push(EvidenceLink(
            "r".into(),
            seq + 1,
            format!("id-{seq}"),
            "a".into(),
            Ts(seq),
            None,
            Cow::Borrowed("decision"),
        ));
    }
    let records = pass.records();
    let mut seqs = Vec::new();
    for r in &records {
        let Record::Fact { fact, evidence, .. } = r else {
            panic!("{r:?}")
        };
        assert_eq!(fact, &fact_id(3));
        assert!(!evidence.0.is_empty(), "an empty record");
        assert!(
            evidence.0.capacity() <= EVIDENCE_PER_RECORD_MAX,
            "a record holds room for {} links",
            evidence.0.capacity()
        );
        seqs.extend(evidence.0.iter().map(|l| l.seq()));
    }
    assert_eq!(records.len(), 11);
    assert_eq!(seqs, (1..=n as u64).collect::<Vec<_>>());
}

/// An argument name left out of a shared mistake's `changed_args` (shaped like data) is
/// not named by its correction's text either: `changed x4155550132 from v1 to v2` kept
/// what the list dropped.
#[test]
fn a_dropped_argument_name_is_not_named_by_the_correction() {
    let s = Sanitizer::new(crate::synth::sanitize::SanitizeContext::default());
    let l = patterns::RunLearnings {
        mistakes: vec![patterns::ToolMistake {
            tool: "query".into(),
            error: "bad filter".into(),
            correction: Some("changed X4155550132 from v1 to v2, ip_10_20_30_40 and limit".into()),
            changed_args: vec![
                "x4155550132".into(),
                "ip_10_20_30_40".into(),
                "limit".into(),
            ],
            ..Default::default()
        }],
        ..Default::default()
    };
    let m = &sanitize_learnings(&s, l).mistakes[0];
    assert_eq!(m.changed_args, ["limit"]);
    let c = m.correction.as_deref().unwrap();
    assert!(
        !c.contains("4155550132") && !c.contains("10_20_30_40"),
        "{c}"
    );
    // Each dropped name says `<ARG>`, as DESIGN.md says, not the sanitizer's own
    // placeholder for what it found inside the name.
    assert_eq!(c, "changed <ARG> from v1 to v2, <ARG> and limit");
}
