//! The synthesizer's semantic mode (issue 15) end to end through a real store, with
//! fixed vectors (`embed::Table`) so each test sets the cosines it needs: candidates by
//! meaning across subjects, guards that keep look-alikes apart, changes over time versus
//! contradictions, stances, every entry kind, the report saying which mode ran, and
//! determinism. The real model's vectors are checked against sentence-transformers in
//! the embedder's own tests.

use std::sync::Arc;

use serde_json::{json, Value};
use swarm_memory::embed::Table;
use swarm_memory::synth::{FactsQuery, SynthOptions, FACTS_RUN};
use swarm_memory::{Durability, EventType, NewEvent, ReadOptions, Store};

use crate::util::Env;

const DIM: usize = 16;

/// A unit vector along axis `i`, turned towards axis `j` so that its cosine with axis
/// `i` is `c`.
fn v(i: usize, j: usize, c: f32) -> Vec<f32> {
    let mut x = vec![0.0; DIM];
    x[i] = c;
    x[j] += (1.0 - c * c).max(0.0).sqrt();
    x
}

fn table(rows: &[(&str, Vec<f32>)]) -> Arc<Table> {
    let mut t = Table::new("test-vectors@0", DIM);
    for (text, x) in rows {
        t.insert(text, x.clone()).expect("insert");
    }
    Arc::new(t)
}

fn opts(t: Arc<Table>) -> SynthOptions {
    SynthOptions {
        embedder: Some(t),
        ..SynthOptions::default()
    }
}

fn store(env: &Env) -> Store {
    Store::open(env.path())
        .expect("open")
        .with_user("ana", true)
        .expect("user")
}

/// Appends an entry observed at `at` (the agent's `meta.observed_at`).
fn add(s: &Store, agent: &str, kind: EventType, subject: &str, text: &str, at: &str) {
    let mut e = NewEvent::new(agent, kind, text);
    e.subject = Some(subject.to_string());
    e.confidence = Some(0.8);
    let mut meta = serde_json::Map::new();
    meta.insert("observed_at".into(), Value::String(at.to_string()));
    e.meta = Some(meta);
    s.append("inc-1", e, Durability::None).expect("append");
}

/// The facts log's records (content of the `synth` events).
fn records(s: &Store) -> Vec<Value> {
    s.read(FACTS_RUN, ReadOptions::default())
        .expect("read facts")
        .map(|e| e.expect("event"))
        .filter(|e| e.kind == EventType::Synth)
        .flat_map(|e| match e.content {
            Value::Array(a) => a,
            other => vec![other],
        })
        .collect()
}

/// Every fact, superseded ones included.
fn all_facts(s: &Store) -> Vec<swarm_memory::synth::FactView> {
    s.facts(&FactsQuery {
        include_superseded: true,
        ..FactsQuery::default()
    })
    .expect("facts")
    .facts
}

fn ops<'a>(recs: &'a [Value], op: &str) -> Vec<&'a Value> {
    recs.iter().filter(|r| r["op"] == op).collect()
}

#[test]
fn paraphrases_merge_across_subjects_and_look_alikes_stay_apart() {
    let env = Env::new();
    let s = store(&env);
    let a = "the postgres pool is exhausted";
    let b = "no free DB connections left";
    let c = "broker-3 data dir 91% full";
    let d = "broker-2 data dir 91% full";
    let t = table(&[
        (a, v(0, 1, 1.0)),
        (b, v(0, 1, 0.86)),
        (c, v(2, 3, 1.0)),
        (d, v(2, 3, 0.99)),
    ]);
    add(
        &s,
        "db-agent",
        EventType::Evidence,
        "postgres",
        a,
        "2026-03-11T14:00:00Z",
    );
    add(
        &s,
        "app-agent",
        EventType::Evidence,
        "checkout",
        b,
        "2026-03-11T14:01:00Z",
    );
    add(
        &s,
        "kafka-agent",
        EventType::Evidence,
        "kafka",
        c,
        "2026-03-11T14:02:00Z",
    );
    add(
        &s,
        "kafka-agent",
        EventType::Evidence,
        "kafka",
        d,
        "2026-03-11T14:03:00Z",
    );
    let r = s.synth(&opts(t), |_| {}).expect("synth");
    assert_eq!(r.semantic, "on: test-vectors@0");
    assert_eq!(r.facts_new, 3, "{r:?}");
    assert_eq!(
        r.facts_multi_agent, 1,
        "the paraphrase pair is a cross-agent fact"
    );
    let facts = s.facts(&FactsQuery::default()).expect("facts").facts;
    let merged = facts.iter().find(|f| f.text == a).expect("fact of a");
    assert_eq!(merged.evidence, 2, "b joined a's fact whatever its subject");
    assert_eq!(merged.agents, vec!["app-agent", "db-agent"]);
    assert!(
        facts.iter().any(|f| f.text == c) && facts.iter().any(|f| f.text == d),
        "broker-3 and broker-2 are two facts despite a cosine of 0.99"
    );
}

#[test]
fn a_later_reading_supersedes_and_a_simultaneous_one_contradicts() {
    let env = Env::new();
    let s = store(&env);
    let rose = "checkout p99 rose to 2.3 s";
    let back = "checkout p99 back to 420 ms";
    let other = "checkout p99 is 900 ms";
    let t = table(&[
        (rose, v(0, 1, 1.0)),
        (back, v(0, 1, 0.7)),
        (other, v(0, 1, 0.69)),
    ]);
    add(
        &s,
        "latency",
        EventType::Evidence,
        "checkout",
        rose,
        "2026-03-11T14:02:00Z",
    );
    // Twenty-eight minutes later: a change over time.
    add(
        &s,
        "latency",
        EventType::Evidence,
        "checkout",
        back,
        "2026-03-11T14:30:00Z",
    );
    // One minute after that, another agent reads another value: a contradiction.
    add(
        &s,
        "apm",
        EventType::Evidence,
        "checkout",
        other,
        "2026-03-11T14:31:00Z",
    );
    let r = s.synth(&opts(t), |_| {}).expect("synth");
    assert_eq!(r.facts_new, 3, "{r:?}");
    let recs = records(&s);
    let changes = ops(&recs, "change");
    assert!(
        changes
            .iter()
            .any(|c| c["earlier"] == "F1" && c["later"] == "F2"),
        "2.3 s at 14:02 is superseded by 420 ms at 14:30: {changes:?}"
    );
    let contra = ops(&recs, "contradiction");
    assert!(
        !contra
            .iter()
            .any(|c| (c["a"] == "F1" && c["b"] == "F2") || (c["a"] == "F2" && c["b"] == "F1")),
        "a change over time is not a contradiction: {contra:?}"
    );
    assert!(
        contra.iter().any(|c| c["a"] == "F2" && c["b"] == "F3"),
        "two readings a minute apart contradict: {contra:?}"
    );
    let all = all_facts(&s);
    let f1 = all.iter().find(|f| f.id == "F1").expect("F1");
    assert_eq!(f1.status, "superseded");
    let sup = f1.superseded.as_ref().expect("superseded");
    assert_eq!((sup.by.as_str(), sup.reason.as_str()), ("F2", "changed"));
    assert_eq!(
        sup.valid_to.map(|t| t.to_string()).as_deref(),
        Some("2026-03-11T14:30:00.000000Z")
    );
}

/// Seed 004's example in semantic mode: agent A says port 8080, agent B port 3000, for
/// one service at one time. The two wordings differ only in the port, a value: one thing
/// with two values is a contradiction (and, an hour apart, a change), not two look-alike
/// things kept apart, which the numbers once counted as.
#[test]
fn one_port_stated_two_ways_at_one_time_contradicts() {
    let env = Env::new();
    let s = store(&env);
    let a = "orders-svc listens on port 8080";
    let b = "orders-svc listens on port 3000";
    let later = "orders-svc listens on port 9090";
    let t = table(&[
        (a, v(0, 1, 1.0)),
        (b, v(0, 1, 0.97)),
        (later, v(0, 1, 0.96)),
    ]);
    for (agent, subject, text, at) in [
        ("k8s", "orders-svc", a, "2026-03-11T14:10:00Z"),
        ("config", "ports", b, "2026-03-11T14:11:00Z"),
        ("k8s", "orders-svc", later, "2026-03-11T15:30:00Z"),
    ] {
        add(&s, agent, EventType::Evidence, subject, text, at);
    }
    let r = s.synth(&opts(t), |_| {}).expect("synth");
    assert_eq!(r.facts_new, 3, "{r:?}");
    let recs = records(&s);
    let contra = ops(&recs, "contradiction");
    assert_eq!(contra.len(), 1, "{contra:?}");
    assert_eq!(
        (&contra[0]["a"], &contra[0]["b"]),
        (&json!("F1"), &json!("F2"))
    );
    let changes = ops(&recs, "change");
    assert!(
        changes.iter().any(|c| c["later"] == "F3"),
        "port 9090 an hour later is a change: {changes:?}"
    );
}

#[test]
fn a_cause_asserted_and_ruled_out_contradicts_and_never_merges() {
    let env = Env::new();
    let s = store(&env);
    let asserted = "root cause: the 14:00 deploy of checkout-api";
    let ruled = "the 14:00 deploy of checkout-api was ruled out";
    let hedged = "maybe the 14:00 deploy of checkout-api";
    let t = table(&[
        (asserted, v(0, 1, 1.0)),
        (ruled, v(0, 1, 0.95)),
        (hedged, v(0, 1, 0.96)),
    ]);
    add(
        &s,
        "a",
        EventType::Evidence,
        "checkout",
        asserted,
        "2026-03-11T14:10:00Z",
    );
    add(
        &s,
        "b",
        EventType::Evidence,
        "deploys",
        ruled,
        "2026-03-11T14:11:00Z",
    );
    // A hypothesis is another kind of entry: it never merges with evidence.
    add(
        &s,
        "c",
        EventType::Hypothesis,
        "checkout",
        hedged,
        "2026-03-11T14:12:00Z",
    );
    let r = s.synth(&opts(t), |_| {}).expect("synth");
    assert_eq!(r.facts_new, 3, "{r:?}");
    let recs = records(&s);
    let contra = ops(&recs, "contradiction");
    assert_eq!(contra.len(), 1, "{contra:?}");
    assert_eq!(
        (&contra[0]["a"], &contra[0]["b"]),
        (&json!("F1"), &json!("F2"))
    );
}

#[test]
fn decisions_and_actions_become_facts_of_their_kind() {
    let env = Env::new();
    let s = store(&env);
    let d1 = "decision: roll back checkout-api to 2.15.0";
    let d2 = "we agreed to revert checkout-api to 2.15.0";
    let a1 = "restarted redis-cache primary in eu-west-1";
    let t = table(&[(d1, v(0, 1, 1.0)), (d2, v(0, 1, 0.9)), (a1, v(4, 5, 1.0))]);
    add(
        &s,
        "lead",
        EventType::Decision,
        "checkout",
        d1,
        "2026-03-11T15:00:00Z",
    );
    add(
        &s,
        "sre",
        EventType::Decision,
        "rollback",
        d2,
        "2026-03-11T15:01:00Z",
    );
    add(
        &s,
        "sre",
        EventType::ActionTaken,
        "redis",
        a1,
        "2026-03-11T15:02:00Z",
    );
    let r = s.synth(&opts(t), |_| {}).expect("synth");
    assert_eq!((r.findings, r.facts_new), (3, 2), "{r:?}");
    let facts = s.facts(&FactsQuery::default()).expect("facts").facts;
    let kinds: Vec<(&str, u64)> = facts
        .iter()
        .map(|f| (f.kind.as_str(), f.evidence))
        .collect();
    assert_eq!(kinds, vec![("decision", 2), ("action_taken", 1)]);
}

#[test]
fn without_a_model_the_report_says_lexical() {
    let env = Env::new();
    let s = store(&env);
    add(
        &s,
        "a",
        EventType::Evidence,
        "db",
        "pool exhausted",
        "2026-03-11T15:00:00Z",
    );
    let r = s
        .synth(
            &SynthOptions {
                no_model_reason: "model not found at /nowhere".into(),
                ..SynthOptions::default()
            },
            |_| {},
        )
        .expect("synth");
    assert_eq!(r.semantic, "off: model not found at /nowhere");
    assert_eq!(r.facts_new, 1);
}

/// The same log and vectors give the same facts, in two data directories.
#[test]
fn semantic_synth_is_deterministic() {
    let letter = |n: usize| (b'a' + n as u8) as char;
    let texts: Vec<String> = (0..60)
        .map(|i| format!("queue depth report {}{}", letter(i / 26), letter(i % 26)))
        .collect();
    let mut rows = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        // Clusters of three nearby vectors.
        rows.push((
            t.as_str(),
            v(i / 3 % DIM, (i / 3 + 1) % DIM, 0.9 + (i % 3) as f32 * 0.03),
        ));
    }
    let t = table(&rows);
    let facts = |env: &Env| {
        let s = store(env);
        for (i, text) in texts.iter().enumerate() {
            let at = format!("2026-03-11T15:{:02}:00Z", i % 60);
            add(
                &s,
                &format!("agent-{}", i % 4),
                EventType::Evidence,
                "q",
                text,
                &at,
            );
        }
        s.synth(&opts(t.clone()), |_| {}).expect("synth");
        let mut recs = records(&s);
        for r in &mut recs {
            // Evidence links carry event ids and append times, and contradictions the
            // append time that completed them: those differ between the two stores.
            if let Some(o) = r.as_object_mut() {
                o.remove("evidence");
                if o.get("op") != Some(&json!("change")) {
                    o.remove("at");
                }
            }
        }
        recs
    };
    let (e1, e2) = (Env::new(), Env::new());
    assert_eq!(facts(&e1), facts(&e2));
}

/// Synthesized in several passes and several synths, the facts are those of one synth:
/// the deduper rebuilt from the facts log (vectors, observation times) is the one that
/// wrote it.
#[test]
fn incremental_semantic_synth_agrees_with_one_synth() {
    let rose = "checkout p99 rose to 2.3 s";
    let back = "checkout p99 back to 420 ms";
    let para = "checkout 99th percentile latency is now ~2300ms";
    let other = "checkout p99 is 900 ms";
    let t = table(&[
        (rose, v(0, 1, 1.0)),
        (back, v(0, 1, 0.7)),
        (para, v(0, 2, 0.9)),
        (other, v(0, 3, 0.8)),
    ]);
    // Observed two minutes after the 2.3 s readings but synthesized in a later synth:
    // a contradiction only if the rebuilt deduper knows when they were observed.
    let feed = |s: &Store, step: usize| {
        let rows = [
            (rose, "2026-03-11T14:02:00Z"),
            (para, "2026-03-11T14:03:00Z"),
            (other, "2026-03-11T14:05:00Z"),
            (back, "2026-03-11T14:40:00Z"),
        ];
        let (text, at) = rows[step];
        add(
            s,
            &format!("agent-{step}"),
            EventType::Evidence,
            "checkout",
            text,
            at,
        );
    };
    let shape = |s: &Store| {
        let mut recs = records(s);
        for r in &mut recs {
            if let Some(o) = r.as_object_mut() {
                o.remove("evidence");
                if o.get("op") != Some(&json!("change")) {
                    o.remove("at");
                }
            }
        }
        let facts = all_facts(s)
            .into_iter()
            .map(|f| (f.id, f.evidence, f.status, f.superseded.map(|x| x.by)))
            .collect::<Vec<_>>();
        let relations = recs
            .into_iter()
            .filter(|r| r["op"] == "change" || r["op"] == "contradiction")
            .collect::<Vec<_>>();
        (relations, facts)
    };
    let one = Env::new();
    let s1 = store(&one);
    (0..4).for_each(|i| feed(&s1, i));
    s1.synth(&opts(t.clone()), |_| {}).expect("synth");
    let many = Env::new();
    let s2 = store(&many);
    for i in 0..4 {
        feed(&s2, i);
        s2.synth(&opts(t.clone()), |_| {}).expect("synth");
    }
    let (a, b) = (shape(&s1), shape(&s2));
    assert_eq!(a, b);
    let ops: Vec<&str> = a.0.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, vec!["contradiction", "change"], "{a:?}");
    assert_eq!(a.1.len(), 3, "{a:?}");
    assert_eq!(a.1[0].1, 2, "the paraphrase joined the 2.3 s fact: {a:?}");
}

/// Past `exact_max` wordings a scope is searched through its neighbour graph, whose
/// links depend on the order its vectors arrived in. Later wordings of early facts arrive
/// after other facts here, so a deduper rebuilt in fact order would hold another graph:
/// the facts log records each wording's insertion number and the rebuild follows it.
/// Synthesized in one synth or in eleven, the records and facts are the same.
#[test]
fn incremental_synth_past_the_exact_limit_agrees_with_one_synth() {
    // 16 clusters of 5 wordings; wording m of cluster c leans from axis c towards
    // axis c+1+m, cosine 0.97 down to 0.81 with the axis.
    let letter = |n: usize| (b'a' + n as u8) as char;
    let mut rows: Vec<(String, Vec<f32>)> = Vec::new();
    for m in 0..5 {
        for c in 0..16 {
            let i = c * 5 + m;
            let text = format!("queue depth report {}{}", letter(i / 26), letter(i % 26));
            rows.push((text, v(c, (c + 1 + m) % DIM, 0.97 - 0.04 * m as f32)));
        }
    }
    let t = table(
        &rows
            .iter()
            .map(|(t, x)| (t.as_str(), x.clone()))
            .collect::<Vec<_>>(),
    );
    let mut o = opts(t);
    o.dedup.semantic.exact_max = 8;
    // A search of breadth 1 (greedy) follows the graph's links closely, so another
    // graph would find other neighbours.
    o.dedup.semantic.candidates = 1;
    o.dedup.semantic.ann_ef = 1;
    let feed = |s: &Store, i: usize| {
        let at = format!("2026-03-11T15:{:02}:00Z", i % 60);
        add(
            s,
            &format!("agent-{}", i % 4),
            EventType::Evidence,
            "q",
            &rows[i].0,
            &at,
        );
    };
    let shape = |s: &Store| {
        let facts = all_facts(s)
            .into_iter()
            .map(|f| (f.id, f.evidence, f.text, f.wordings))
            .collect::<Vec<_>>();
        (records(s), facts)
    };
    let one = Env::new();
    let s1 = store(&one);
    (0..rows.len()).for_each(|i| feed(&s1, i));
    s1.synth(&o, |_| {}).expect("synth");
    let many = Env::new();
    let s2 = store(&many);
    for i in 0..rows.len() {
        feed(&s2, i);
        if i % 8 == 7 {
            s2.synth(&o, |_| {}).expect("synth");
        }
    }
    s2.synth(&o, |_| {}).expect("synth");
    let (a, b) = (shape(&s1), shape(&s2));
    // Merges happened (fewer facts than wordings) and wordings carry their numbers.
    assert!(a.1.len() < rows.len() && a.1.len() >= 16, "{:?}", a.1);
    let ords: usize =
        a.0.iter()
            .filter(|r| r["op"] == "fact")
            .map(|r| r["ords"].as_array().map_or(0, Vec::len))
            .sum();
    assert!(ords > a.1.len(), "insertion numbers recorded: {ords}");
    assert_eq!(a.1, b.1);
}

/// The LLM step in semantic mode: an unguarded pair in the borderline band (below the
/// merge cosine) is asked; its answer decides; a guarded pair is never asked.
#[test]
fn the_llm_judges_borderline_pairs_by_meaning() {
    let run = |cmd: &str| {
        let env = Env::new();
        let s = store(&env);
        let a = "the postgres pool is exhausted";
        let b = "no free DB connections left";
        let c = "broker-3 data dir 91% full";
        let d = "broker-2 data dir 91% full";
        let t = table(&[
            (a, v(0, 1, 1.0)),
            (b, v(0, 1, 0.6)),
            (c, v(2, 3, 1.0)),
            (d, v(2, 3, 0.6)),
        ]);
        for (i, text) in [a, b, c, d].into_iter().enumerate() {
            let at = format!("2026-03-11T14:0{i}:00Z");
            add(
                &s,
                &format!("agent-{i}"),
                EventType::Evidence,
                "x",
                text,
                &at,
            );
        }
        let o = SynthOptions {
            llm: Some(swarm_memory::synth::LlmOptions {
                cmd: cmd.to_string(),
                timeout: std::time::Duration::from_secs(5),
                calls_max: 10,
            }),
            ..opts(t)
        };
        let r = s.synth(&o, |_| {}).expect("synth");
        (r.llm_calls, r.matched_judged, r.facts_total)
    };
    assert_eq!(run(r#"cat >/dev/null; echo '{"same": true}'"#), (1, 1, 3));
    assert_eq!(run(r#"cat >/dev/null; echo '{"same": false}'"#), (1, 0, 4));
}
