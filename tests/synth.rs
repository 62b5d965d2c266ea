//! The batch synthesizer: incremental, idempotent, crash-safe passes; evidence chains;
//! contradictions and supersession; time travel; user isolation; patterns, mistakes and
//! the shared scope; the LLM step; metrics and quality commands.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use swarm_memory::synth::dedup::DedupConfig;
use swarm_memory::synth::{FactsQuery, LlmOptions, SharePatterns, SynthOptions, FACTS_RUN};
use swarm_memory::{Durability, EventType, NewEvent, ReadOptions, Store, Ts};

use crate::util::{Env, Rng};

fn finding(agent: &str, subject: &str, text: &str, conf: Option<f64>) -> NewEvent {
    let mut e = NewEvent::new(agent, EventType::Evidence, text);
    e.subject = Some(subject.to_string());
    e.confidence = conf;
    e
}

fn user_store(env: &Env, user: &str) -> Store {
    Store::open(env.path())
        .expect("open")
        .with_user(user, true)
        .expect("user")
}

fn append(store: &Store, run: &str, e: NewEvent) -> swarm_memory::Event {
    store.append(run, e, Durability::None).expect("append")
}

fn synth(store: &Store) -> swarm_memory::synth::SynthReport {
    store
        .synth(&SynthOptions::default(), |_| {})
        .expect("synth")
}

fn facts_log_bytes(env: &Env, user: &str) -> BTreeMap<String, Vec<u8>> {
    let dir = env.path().join(user).join(FACTS_RUN);
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(&dir).expect("facts dir") {
        let p = e.expect("entry").path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("seg-") {
            out.insert(name, std::fs::read(&p).expect("read"));
        }
    }
    out
}

/// Running synth twice adds nothing; new events are read from the watermark on, once.
#[test]
fn synth_is_incremental_and_idempotent() {
    let env = Env::new();
    let s = user_store(&env, "alice");
    append(
        &s,
        "inc-1",
        finding("db", "orders-db", "orders-db disk is 91% full", Some(0.9)),
    );
    append(
        &s,
        "inc-1",
        finding("infra", "orders-db", "orders-db disk is 91% full.", None),
    );
    append(
        &s,
        "inc-2",
        finding("db", "orders-db", "orders-db disk is 91% full", Some(0.7)),
    );
    append(
        &s,
        "inc-2",
        finding("net", "dns", "SERVFAIL resolving orders-db.internal", None),
    );
    let r = synth(&s);
    assert_eq!((r.events, r.findings, r.passes), (4, 4, 1), "{r:?}");
    assert_eq!(r.facts_total, 2);
    assert!(!r.nothing_new);

    let before = facts_log_bytes(&env, "alice");
    let again = synth(&s);
    assert!(again.nothing_new, "{again:?}");
    assert!(
        again.semantic.starts_with("off: "),
        "said, never left empty: {again:?}"
    );
    assert_eq!(
        (again.events, again.passes, again.records_written),
        (0, 0, 0)
    );
    assert_eq!(
        facts_log_bytes(&env, "alice"),
        before,
        "a second synth wrote something"
    );

    append(
        &s,
        "inc-2",
        finding("app", "orders-db", "ORDERS-DB disk is 91% full", Some(0.8)),
    );
    let third = synth(&s);
    assert_eq!(third.events, 1, "only the new event is read: {third:?}");
    assert_eq!(third.runs.len(), 1);
    assert_eq!((third.runs[0].from_seq, third.runs[0].to_seq), (3, 3));
    let ans = s.facts(&FactsQuery::default()).expect("facts");
    let disk = ans
        .facts
        .iter()
        .find(|f| f.subject.as_deref() == Some("orders-db"))
        .expect("disk fact");
    assert_eq!(disk.evidence, 4);
    assert_eq!(disk.agents, vec!["app", "db", "infra"]);
    assert_eq!(disk.runs, vec!["inc-1", "inc-2"]);
    assert_eq!(ans.source_events, 5);
}

/// Confidence grows with independent agents, not with one agent repeating itself; every
/// evidence link leads back to the raw event it names.
#[test]
fn facts_link_back_to_raw_events_and_confidence_grows_with_independent_evidence() {
    let env = Env::new();
    let s = user_store(&env, "alice");
    let mut raw = Vec::new();
    for _ in 0..3 {
        raw.push(append(
            &s,
            "r",
            finding("db", "pool", "pool exhausted at 100 connections", Some(0.5)),
        ));
    }
    synth(&s);
    let one_agent = s.facts(&FactsQuery::default()).expect("facts").facts[0].clone();
    assert_eq!(one_agent.evidence, 3);
    assert!((one_agent.confidence - 0.5).abs() < 1e-9, "{one_agent:?}");
    raw.push(append(
        &s,
        "r",
        finding(
            "metrics",
            "pool",
            "pool exhausted at 100 connections",
            Some(0.5),
        ),
    ));
    synth(&s);
    let two_agents = s.facts(&FactsQuery::default()).expect("facts").facts[0].clone();
    assert!(
        (two_agents.confidence - 0.75).abs() < 1e-9,
        "{two_agents:?}"
    );

    let ex = s.explain_fact(&two_agents.id, 100).expect("explain");
    assert_eq!(ex.evidence_total, 4);
    assert_eq!(ex.evidence.len(), 4);
    for (link, e) in ex.evidence.iter().zip(&raw) {
        let got = link.event.as_ref().expect("raw event read back");
        assert_eq!((got.seq, &got.id), (e.seq, &e.id));
        assert_eq!(got, e);
        assert!(link.error.is_none());
    }
    assert_eq!(ex.evidence[0].matched, "first");
    let limited = s.explain_fact(&two_agents.id, 2).expect("explain");
    assert_eq!((limited.evidence_total, limited.evidence.len()), (4, 2));
    let bad = s.explain_fact("F99", 10).unwrap_err();
    assert_eq!(bad.exit_code(), 2, "{bad}");
}

/// Seed 004's example: agent A says port 8080, agent B says port 3000. The contradiction
/// links both sides, is resolved by evidence weight then recency, and the loser is
/// marked superseded with the time it stopped being valid, never deleted; when the
/// evidence turns, the resolution is recorded again and time travel shows both states.
#[test]
fn contradictions_are_resolved_by_weight_then_recency_and_superseded_facts_stay() {
    let env = Env::new();
    let s = user_store(&env, "alice");
    append(
        &s,
        "r",
        finding(
            "k8s",
            "orders-svc",
            "orders-svc listens on port 8080",
            Some(0.8),
        ),
    );
    append(
        &s,
        "r",
        finding(
            "net",
            "orders-svc",
            "orders-svc listens on port 8080",
            Some(0.8),
        ),
    );
    let b = append(
        &s,
        "r",
        finding(
            "config",
            "orders-svc",
            "orders-svc listens on port 3000",
            Some(0.8),
        ),
    );
    let r = synth(&s);
    assert_eq!((r.contradictions_new, r.resolutions), (1, 1), "{r:?}");
    let all = s
        .facts(&FactsQuery {
            include_superseded: true,
            ..FactsQuery::default()
        })
        .expect("facts");
    assert_eq!(all.facts.len(), 2);
    assert_eq!(all.contradictions.len(), 1);
    let c = &all.contradictions[0];
    let f8080 = all.facts.iter().find(|f| f.text.contains("8080")).unwrap();
    let f3000 = all.facts.iter().find(|f| f.text.contains("3000")).unwrap();
    assert_eq!(c.winner.as_deref(), Some(f8080.id.as_str()));
    assert_eq!(c.reason.as_deref(), Some("evidence_weight"));
    assert_eq!(f8080.status, "current");
    assert_eq!(f3000.status, "superseded");
    let sup = f3000.superseded.as_ref().unwrap();
    assert_eq!(sup.by, f8080.id);
    assert_eq!(sup.valid_to, Some(b.ts));
    let current = s.facts(&FactsQuery::default()).expect("facts");
    assert_eq!(
        current.facts.len(),
        1,
        "superseded facts are hidden by default"
    );
    let t_before_flip = Ts::now();

    std::thread::sleep(Duration::from_millis(2));
    for agent in ["app", "lb", "sre"] {
        append(
            &s,
            "r",
            finding(
                agent,
                "orders-svc",
                "orders-svc listens on port 3000",
                Some(0.8),
            ),
        );
    }
    let r2 = synth(&s);
    assert_eq!((r2.contradictions_new, r2.resolutions), (0, 1), "{r2:?}");
    let now = s
        .facts(&FactsQuery {
            include_superseded: true,
            ..FactsQuery::default()
        })
        .expect("facts");
    let f3000 = now.facts.iter().find(|f| f.text.contains("3000")).unwrap();
    let f8080 = now.facts.iter().find(|f| f.text.contains("8080")).unwrap();
    assert_eq!(f3000.status, "current");
    assert_eq!(f8080.status, "superseded");

    // Equal weight: the newer evidence wins (recency).
    let then = s
        .facts(&FactsQuery {
            as_of: Some(t_before_flip),
            include_superseded: true,
            ..FactsQuery::default()
        })
        .expect("facts as of");
    let f8080_then = then.facts.iter().find(|f| f.text.contains("8080")).unwrap();
    assert_eq!(
        f8080_then.status, "current",
        "as of before the flip: {then:?}"
    );
    assert_eq!(
        then.facts
            .iter()
            .find(|f| f.text.contains("3000"))
            .unwrap()
            .evidence,
        1
    );

    // The resolutions are events of the facts log.
    let resolutions: Vec<_> = s
        .read(FACTS_RUN, ReadOptions::default())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.content.get("op").and_then(Value::as_str) == Some("resolution"))
        .collect();
    assert_eq!(resolutions.len(), 2);
}

/// Equal evidence weight: the side with the newer evidence stands (recency).
#[test]
fn equal_weight_contradiction_is_decided_by_recency() {
    let env = Env::new();
    let s = user_store(&env, "alice");
    append(
        &s,
        "r",
        finding(
            "a",
            "orders-svc",
            "orders-svc memory limit is 512Mi",
            Some(0.7),
        ),
    );
    append(
        &s,
        "r",
        finding(
            "b",
            "orders-svc",
            "orders-svc memory limit is 1Gi",
            Some(0.7),
        ),
    );
    synth(&s);
    let ans = s
        .facts(&FactsQuery {
            include_superseded: true,
            ..FactsQuery::default()
        })
        .unwrap();
    assert_eq!(ans.contradictions.len(), 1, "{ans:?}");
    let c = &ans.contradictions[0];
    assert_eq!(c.reason.as_deref(), Some("recency"));
    let winner = ans
        .facts
        .iter()
        .find(|f| Some(&f.id) == c.winner.as_ref())
        .unwrap();
    assert!(winner.text.contains("1Gi"));
}

/// `--as-of` shows the facts as they stood: evidence after the time does not count.
#[test]
fn as_of_shows_the_facts_as_they_stood() {
    let env = Env::new();
    let s = user_store(&env, "alice");
    append(
        &s,
        "r",
        finding("a", "checkout", "checkout p99 latency is 2.4s", None),
    );
    std::thread::sleep(Duration::from_millis(2));
    let t = Ts::now();
    std::thread::sleep(Duration::from_millis(2));
    append(
        &s,
        "r",
        finding("b", "checkout", "checkout p99 latency is 2.4s", None),
    );
    append(
        &s,
        "r",
        finding("b", "cache", "redis hit ratio fell to 40%", None),
    );
    synth(&s);
    let then = s
        .facts(&FactsQuery {
            as_of: Some(t),
            ..FactsQuery::default()
        })
        .unwrap();
    assert_eq!(then.facts.len(), 1);
    assert_eq!(then.facts[0].evidence, 1);
    assert_eq!(then.facts[0].agents, vec!["a"]);
    let now = s.facts(&FactsQuery::default()).unwrap();
    assert_eq!(now.facts.len(), 2);
}

/// Findings never cross users: same run id, same text, two users, two facts logs; the
/// shared scope cannot be acted as, and the engine's logs refuse client appends.
#[test]
fn facts_never_cross_users() {
    let env = Env::new();
    let alice = user_store(&env, "alice");
    let bob = user_store(&env, "bob");
    append(
        &alice,
        "inc",
        finding("db", "orders-db", "orders-db pool exhausted", None),
    );
    append(
        &bob,
        "inc",
        finding("db", "orders-db", "orders-db pool exhausted", None),
    );
    synth(&alice);
    assert!(bob.facts(&FactsQuery::default()).unwrap().facts.is_empty());
    synth(&bob);
    let fa = alice.facts(&FactsQuery::default()).unwrap().facts;
    let fb = bob.facts(&FactsQuery::default()).unwrap().facts;
    assert_eq!((fa.len(), fb.len()), (1, 1));
    assert_eq!((fa[0].evidence, fb[0].evidence), (1, 1));
    let ex = bob.explain_fact(&fb[0].id, 10).unwrap();
    assert_eq!(ex.evidence[0].event.as_ref().unwrap().user_id, "bob");

    let e = Store::open(env.path())
        .unwrap()
        .with_user(swarm_memory::synth::SHARED_USER, true)
        .err()
        .expect("the shared scope is refused as a user");
    assert_eq!(e.exit_code(), 5);
    env.swarm(&[
        "--user",
        "alice",
        "append",
        "--run",
        FACTS_RUN,
        "--agent",
        "x",
        "--type",
        "evidence",
        "--content",
        "forged",
    ])
    .code(5);
    env.swarm(&["--user", "alice", "synth", "--run", FACTS_RUN])
        .code(2);
}

/// A synth killed with SIGKILL at random moments leaves the facts log with whole passes
/// only (facts always agree with the watermarks), and finishing it gives exactly the
/// facts of an uninterrupted synth of the same data.
#[test]
fn synth_killed_at_random_moments_converges_to_the_uninterrupted_result() {
    let env = Env::fast();
    let s = user_store(&env, "alice");
    let mut rng = Rng::from_env("synth_kill");
    let services = ["orders-db", "checkout", "payments-api", "dns", "nodes"];
    let claims = [
        "connection pool exhausted at 100 connections",
        "p99 latency rose to 2.4s",
        "error rate is 12% mostly 503",
        "TLS certificate expires on 2026-11-25",
        "3 nodes report DiskPressure",
        "SERVFAIL on lookups",
    ];
    let mut findings_by_run: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for run in ["r1", "r2", "r3"] {
        let mut batch = Vec::new();
        for i in 0..1500 {
            let svc = services[rng.below(services.len() as u64) as usize];
            let claim = claims[rng.below(claims.len() as u64) as usize];
            let agent = format!("agent-{}", rng.below(6));
            let mut e = finding(
                &agent,
                svc,
                &format!("{svc} {claim}"),
                Some(0.5 + rng.below(5) as f64 / 10.0),
            );
            if i % 7 == 0 {
                // A decision: a finding too (no subject, so no contradictory-action
                // escalation either).
                e.kind = "decision".into();
                e.subject = None;
            }
            batch.push(e);
            if batch.len() == 100 {
                let stored = s
                    .append_batch(run, std::mem::take(&mut batch), None, Durability::None)
                    .unwrap();
                findings_by_run.entry(run.to_string()).or_default().extend(
                    stored
                        .iter()
                        .filter(|e| matches!(e.kind, EventType::Evidence | EventType::Decision))
                        .map(|e| e.seq),
                );
            }
        }
    }
    // The reference: the same data, synthesized without interruption.
    let reference = Env::fast();
    copy_dir(env.path(), reference.path());
    let rs = user_store(&reference, "alice");
    rs.synth(
        &SynthOptions {
            pass_events_max: 150,
            ..SynthOptions::default()
        },
        |_| {},
    )
    .unwrap();

    let mut kills = 0;
    // A synth that finishes before any kill proves nothing: then its facts log is wiped
    // and the rounds start again, with shorter delays.
    'attempt: for attempt in 0..6u64 {
        for round in 0..40 {
            let mut child = env
                .cmd(&["--user", "alice", "synth", "--all", "--pass-events", "150"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn synth");
            let max_us = 40_000 >> attempt.min(4);
            std::thread::sleep(Duration::from_micros(rng.range(500, max_us)));
            let finished = child.try_wait().unwrap().is_some();
            if !finished {
                child.kill().unwrap(); // SIGKILL
                kills += 1;
            }
            let _ = child.wait();
            // Whatever is committed agrees with its watermarks: every finding at or
            // below the watermark of its run is linked exactly once, none above.
            let fold = s.facts_fold(None).unwrap();
            let linked: u64 = fold.facts.iter().map(|f| f.evidence).sum();
            let expected: u64 = findings_by_run
                .iter()
                .map(|(run, seqs)| {
                    let w = fold.watermarks.get(run).copied().unwrap_or(0);
                    seqs.iter().filter(|&&q| q <= w).count() as u64
                })
                .sum();
            assert_eq!(
                linked, expected,
                "attempt {attempt} round {round}: facts disagree with the watermarks"
            );
            if finished {
                if kills > 0 {
                    break 'attempt;
                }
                // Start over: no facts log, no snapshot, no shared copies.
                for d in [
                    env.path().join("alice").join(FACTS_RUN),
                    env.path()
                        .join(".checkpoints")
                        .join("alice")
                        .join(FACTS_RUN),
                ] {
                    let _ = std::fs::remove_dir_all(d);
                }
                continue 'attempt;
            }
        }
    }
    assert!(
        kills > 0,
        "no synth was ever killed mid-way; the test proved nothing"
    );
    let done = synth_cli(&env);
    assert_eq!(done["facts_total"], synth_cli(&reference)["facts_total"]);
    let a = env
        .swarm(&["--user", "alice", "facts", "--all"])
        .ok()
        .stdout;
    let b = reference
        .swarm(&["--user", "alice", "facts", "--all"])
        .ok()
        .stdout;
    let strip = |s: &str| {
        let mut v: Value = serde_json::from_str(s).unwrap();
        // Pass counts differ (the killed synth committed in more, smaller steps).
        v.as_object_mut().unwrap().remove("passes");
        v
    };
    assert_eq!(
        strip(&a),
        strip(&b),
        "interrupted synth differs from the reference"
    );
    let total: u64 = findings_by_run.values().map(|v| v.len() as u64).sum();
    let fold = s.facts_fold(None).unwrap();
    assert_eq!(fold.facts.iter().map(|f| f.evidence).sum::<u64>(), total);
}

fn synth_cli(env: &Env) -> Value {
    let out = env.swarm(&["--user", "alice", "synth", "--all"]).ok();
    serde_json::from_str(&out.stdout).expect("synth report")
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        let dst = to.join(e.file_name());
        if p.is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_dir(&p, &dst);
        } else {
            std::fs::copy(&p, &dst).unwrap();
        }
    }
}

/// One investigation, as a closed run: a symptom, tool calls (one failing, then fixed),
/// a root cause on the decision.
fn investigation(s: &Store, run: &str, project: &str) {
    let tool = |agent: &str, tool: &str, meta: Value, text: &str| {
        let mut e = NewEvent::new(agent, EventType::Evidence, text);
        e.subject = Some("checkout".into());
        let mut m = meta.as_object().unwrap().clone();
        m.insert("tool".into(), json!(tool));
        e.meta = Some(m);
        e
    };
    let mut h = NewEvent::new(
        "lead",
        EventType::Hypothesis,
        "checkout slow because of the db pool",
    );
    h.meta = Some(
        json!({"symptom": "high_latency_checkout"})
            .as_object()
            .unwrap()
            .clone(),
    );
    append(s, run, h);
    append(
        s,
        run,
        tool(
            "metrics",
            "query_metrics",
            json!({"tool_status": "error",
        "error": format!("invalid filter: resource.type required (project {project}, caller ops@{project}.example.com, from 10.2.3.4)"),
        "args": {"filter": "metric.type=latency"}}),
            "query failed",
        ),
    );
    append(
        s,
        run,
        tool(
            "metrics",
            "query_metrics",
            json!({"tool_status": "ok",
        "args": {"filter": "metric.type=latency", "resource_type": "k8s_container"}}),
            "p99 2.4s",
        ),
    );
    append(
        s,
        run,
        tool(
            "traces",
            "fetch_trace_exemplar",
            json!({"tool_status": "ok"}),
            "slow span in db",
        ),
    );
    append(
        s,
        run,
        tool(
            "logs",
            "get_logs_for_trace",
            json!({"tool_status": "ok"}),
            "timeout acquiring connection",
        ),
    );
    let mut d = NewEvent::new("lead", EventType::Decision, "raise the pool from 10 to 50");
    d.meta = Some(
        json!({"root_cause": "connection_pool_saturation",
        "resolution": format!("Increased pool size from 10 to 50 in {project}")})
        .as_object()
        .unwrap()
        .clone(),
    );
    append(s, run, d);
    s.close_run(run, "lead").expect("close");
}

/// The same events give the same contradictions however the synth splits them into
/// passes: a decision that kept its winner while its weights changed kept the reason and
/// weights of the pass that first decided it (`recency`, 0.8 to 0.8, where one pass says
/// `evidence_weight`, 1.6 to 0.8).
#[test]
fn contradictions_read_the_same_whatever_the_passes() {
    let facts_json = |pass_events_max: u64| {
        let env = Env::new();
        let s = user_store(&env, "alice");
        for (agent, port) in [("k8s", 8080), ("config", 3000), ("app", 3000)] {
            let text = format!("orders-svc listens on port {port}");
            append(&s, "r", finding(agent, "orders-svc", &text, Some(0.8)));
            std::thread::sleep(Duration::from_millis(2));
        }
        let opts = SynthOptions {
            pass_events_max,
            ..SynthOptions::default()
        };
        s.synth(&opts, |_| {}).unwrap();
        let all = s
            .facts(&FactsQuery {
                include_superseded: true,
                ..FactsQuery::default()
            })
            .unwrap();
        assert_eq!(all.contradictions.len(), 1, "{all:?}");
        serde_json::to_value(&all).unwrap()
    };
    let one = facts_json(1000);
    assert_eq!(
        one["contradictions"][0]["reason"], "evidence_weight",
        "{one}"
    );
    let mut split = facts_json(2);
    let mut one = one;
    // The two stores' events were written at other times: their times differ.
    for v in [&mut one, &mut split] {
        v["contradictions"][0]
            .as_object_mut()
            .unwrap()
            .remove("detected_at");
    }
    assert_eq!(split["contradictions"], one["contradictions"]);
}

/// A user who changes `share_patterns` between synths goes on being learned: the last
/// pass's copies, sent again in the other mode, differ from the ones stored under their
/// ids, and the synth failed on that conflict from then on (exit 4), its new runs never
/// learned. The first copy of a run stands; the new run is shared in the new mode.
#[test]
fn changing_the_share_mode_does_not_stop_the_synth() {
    let env = Env::new();
    let alice = user_store(&env, "alice").with_archive_dir(env.path().join(".archive"));
    let mode = |m| SynthOptions {
        share_patterns: Some(m),
        ..SynthOptions::default()
    };
    investigation(&alice, "inc-1", "acme-prod-7781");
    let r = alice
        .synth(&mode(SharePatterns::Sanitized), |_| {})
        .unwrap();
    assert_eq!(r.learned_runs, vec!["inc-1"], "{r:?}");
    investigation(&alice, "inc-2", "acme-prod-7781");
    let r = alice
        .synth(&mode(SharePatterns::Structured), |_| {})
        .unwrap();
    assert_eq!(r.learned_runs, vec!["inc-2"], "{r:?}");
    let r = alice
        .synth(&mode(SharePatterns::Sanitized), |_| {})
        .unwrap();
    assert!(r.nothing_new, "{r:?}");
    let bob = user_store(&env, "bob");
    let shared: u64 = bob
        .patterns("high_latency_checkout")
        .unwrap()
        .iter()
        .map(|p| p.item.occurrence_count)
        .sum();
    assert_eq!(shared, 2, "each run shared once");
}

/// A run counts once for a shared mistake even when its shared copy holds several mistakes
/// that became one: `--share-patterns structured` keeps an error's category, not its text
/// (each was counted once per mistake it held before: 291 runs for 5).
#[test]
fn a_shared_mistake_counts_each_run_once() {
    let env = Env::new();
    let alice = user_store(&env, "alice").with_archive_dir(env.path().join(".archive"));
    for run in ["inc-1", "inc-2"] {
        for what in ["table orders", "table users", "schema billing"] {
            let mut e = NewEvent::new("db", EventType::Evidence, "query failed");
            e.meta = Some(
                json!({"tool": "query_db", "tool_status": "error",
                    "error": format!("permission denied for {what}"),
                    "args": {"sql": "select 1"}})
                .as_object()
                .unwrap()
                .clone(),
            );
            append(&alice, run, e);
        }
        alice.close_run(run, "lead").expect("close");
    }
    let opts = SynthOptions {
        share_patterns: Some(SharePatterns::Structured),
        ..SynthOptions::default()
    };
    alice.synth(&opts, |_| {}).unwrap();
    assert_eq!(
        alice.advise("query_db").unwrap().len(),
        3 + 1,
        "three of its own"
    );
    let bob = user_store(&env, "bob");
    let tips = bob.advise("query_db").unwrap();
    assert_eq!(tips.len(), 1, "{tips:?}");
    assert_eq!(tips[0].scope, "shared");
    assert_eq!(
        (tips[0].item.runs_seen, tips[0].item.occurrence_count),
        (2, 6),
        "{tips:?}"
    );
}

/// A pattern quotes its run's decision and resolution, a mistake the tool's arguments
/// and errors: read as an agent, the user's own come only from runs whose policy shows
/// that agent every entry type (the library call behind `swarm patterns --as-agent`,
/// `GET /v1/patterns?as=` and the MCP strategy and advice tools).
#[test]
fn learned_patterns_follow_the_runs_read_policy() {
    let env = Env::new();
    let alice = user_store(&env, "alice").with_archive_dir(env.path().join(".archive"));
    let policy: swarm_memory::fold::rules::Policy = serde_json::from_value(json!({
        "permissions": {
            "lead": {"read_types": ["*"], "write_types": ["*"], "admin": true},
            "db": {"read_types": ["evidence"], "write_types": ["evidence"]},
            "metrics": {"read_types": ["*"], "write_types": ["*"]},
            "traces": {"read_types": ["*"], "write_types": ["*"]},
            "logs": {"read_types": ["*"], "write_types": ["*"]}
        }
    }))
    .unwrap();
    alice.set_policy("inc-1", "lead", &policy).unwrap();
    investigation(&alice, "inc-1", "acme-prod-7781");
    let opts = SynthOptions {
        share_patterns: Some(SharePatterns::Off),
        ..SynthOptions::default()
    };
    alice.synth(&opts, |_| {}).unwrap();
    let own = |reader: Option<&str>| {
        let p = alice.patterns_as("high_latency_checkout", reader).unwrap();
        let m = alice.advise_as("query_metrics", reader).unwrap();
        let text = serde_json::to_string(&(&p, &m)).unwrap();
        (p.len(), m.len(), text)
    };
    let (p, m, text) = own(None);
    assert_eq!((p, m), (1, 1), "{text}");
    assert!(text.contains("Increased pool size"), "{text}");
    assert_eq!(own(Some("lead")).2, text);
    let (p, m, text) = own(Some("db"));
    assert_eq!((p, m), (0, 0), "db is not shown inc-1's decisions: {text}");
    // Another agent shown every type gets them.
    assert_eq!(own(Some("traces")).0, 1);

    // A second run with no policy teaches db the same pattern, from that run only.
    investigation(&alice, "inc-2", "acme-prod-7781");
    alice.synth(&opts, |_| {}).unwrap();
    let p = alice
        .patterns_as("high_latency_checkout", Some("db"))
        .unwrap();
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(
        p[0].item.occurrence_count, 1,
        "inc-1's occurrence is not counted for db"
    );
    assert_eq!(
        alice.patterns("high_latency_checkout").unwrap()[0]
            .item
            .occurrence_count,
        2
    );

    // A `sanitized` copy in the shared scope keeps the resolution's wording: carol's own
    // copies of a run that hides decisions from db are not shown to db either (another
    // user, who gets the shared scope by design, still sees it).
    let carol = user_store(&env, "carol").with_archive_dir(env.path().join(".archive"));
    carol.set_policy("inc-9", "lead", &policy).unwrap();
    investigation(&carol, "inc-9", "acme-prod-7781");
    let sanitized = SynthOptions {
        share_patterns: Some(SharePatterns::Sanitized),
        ..SynthOptions::default()
    };
    assert_eq!(carol.synth(&sanitized, |_| {}).unwrap().shared_copies, 1);
    let scopes = |reader: Option<&str>| -> Vec<&'static str> {
        let p = carol.patterns_as("high_latency_checkout", reader).unwrap();
        let m = carol.advise_as("query_metrics", reader).unwrap();
        p.iter()
            .map(|x| x.scope)
            .chain(m.iter().map(|x| x.scope))
            .collect()
    };
    assert_eq!(
        scopes(Some("lead")),
        ["private", "shared", "private", "shared"]
    );
    assert!(scopes(Some("db")).is_empty(), "{:?}", scopes(Some("db")));
    let dave = user_store(&env, "dave");
    assert_eq!(
        dave.patterns_as("high_latency_checkout", Some("db"))
            .unwrap()
            .len(),
        1
    );
}

/// Seed 002: closed runs teach patterns (occurrences add, confidence +0.1 each) and tool
/// mistakes with their self-correction; both are copied to the shared scope sanitized,
/// so another user benefits without seeing the first one's project, e-mail or address.
#[test]
fn patterns_and_mistakes_are_learned_and_shared_sanitized() {
    let env = Env::new();
    let alice = user_store(&env, "alice").with_archive_dir(env.path().join(".archive"));
    investigation(&alice, "inc-1", "acme-prod-7781");
    investigation(&alice, "inc-2", "acme-prod-7781");
    // Project ids are told to the sanitizer (`--project-id`); e-mails, addresses, the
    // user and the run ids are found on their own.
    let opts = SynthOptions {
        project_ids: vec!["acme-prod-7781".into()],
        ..SynthOptions::default()
    };
    let r = alice.synth(&opts, |_| {}).unwrap();
    assert_eq!(r.learned_runs, vec!["inc-1", "inc-2"], "{r:?}");
    assert_eq!(r.shared_copies, 2);
    // Learned once: a second synth learns nothing again.
    assert!(synth(&alice).learned_runs.is_empty());

    let p = alice.patterns("high_latency_checkout").unwrap();
    let own: Vec<_> = p.iter().filter(|x| x.scope == "private").collect();
    assert_eq!(own.len(), 1, "{p:?}");
    assert_eq!(own[0].item.occurrence_count, 2);
    assert!((own[0].item.confidence - 0.7).abs() < 1e-9);
    assert_eq!(
        own[0].item.tool_sequence,
        vec![
            "query_metrics",
            "fetch_trace_exemplar",
            "get_logs_for_trace"
        ]
    );
    assert_eq!(
        own[0].item.root_cause_category,
        "connection_pool_saturation"
    );

    let advice = alice.advise("query_metrics").unwrap();
    let mine = advice
        .iter()
        .find(|m| m.scope == "private")
        .expect("private mistake");
    assert_eq!(mine.item.occurrence_count, 2);
    assert!(
        mine.item
            .correction
            .as_deref()
            .unwrap_or("")
            .contains("resource_type"),
        "{mine:?}"
    );

    // Bob has no runs of his own but gets the shared, sanitized lessons.
    let bob = user_store(&env, "bob");
    let shared = bob.patterns("high_latency_checkout").unwrap();
    assert_eq!(shared.len(), 1);
    assert_eq!(shared[0].scope, "shared");
    assert_eq!(shared[0].item.occurrence_count, 2);
    let tips = bob.advise("query_metrics").unwrap();
    assert_eq!(tips.len(), 1);
    assert!(tips[0].item.correction.is_some());
    // Nothing of alice's identity or environment is in the shared scope's files.
    let mut bytes = Vec::new();
    let dir = env.path().join(swarm_memory::synth::SHARED_USER);
    for e in walk(&dir) {
        bytes.extend(std::fs::read(e).unwrap());
    }
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("query_metrics"), "the shared lesson is there");
    for secret in [
        "acme-prod-7781",
        "ops@",
        "10.2.3.4",
        "alice",
        "inc-1",
        "inc-2",
    ] {
        assert!(
            !text.contains(secret),
            "{secret:?} leaked into the shared scope"
        );
    }
    // Findings never leave their user: no fact text in the shared scope.
    assert!(!text.contains("p99 2.4s"));

    // A crash between the private commit and the shared copies loses them: the next
    // synth, even with nothing new, sends the last pass's copies again, idempotently.
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(bob.advise("query_metrics").unwrap().is_empty());
    let again = alice.synth(&opts, |_| {}).unwrap();
    assert!(again.nothing_new, "{again:?}");
    assert_eq!(again.shared_copies, 2);
    assert_eq!(bob.advise("query_metrics").unwrap().len(), 1);
    let once_more = alice.synth(&opts, |_| {}).unwrap();
    assert_eq!(
        once_more.shared_copies, 2,
        "re-sent, and deduplicated by id"
    );
    assert_eq!(
        bob.patterns("high_latency_checkout").unwrap()[0]
            .item
            .occurrence_count,
        2,
        "a re-sent copy is not counted twice"
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The LLM step: borderline pairs go to the command; its answer is used; a command that
/// times out or fails leaves the deterministic answer.
#[test]
fn llm_step_judges_borderline_pairs_and_falls_back() {
    let run = |cmd: &str, timeout_ms: u64| {
        let env = Env::new();
        let s = user_store(&env, "alice");
        append(
            &s,
            "r",
            finding(
                "a",
                "checkout",
                "checkout requests are slow since the deploy",
                None,
            ),
        );
        append(
            &s,
            "r",
            finding(
                "b",
                "checkout",
                "checkout slowness began right after the deploy",
                None,
            ),
        );
        let opts = SynthOptions {
            dedup: DedupConfig {
                borderline_low: 0.0,
                near_threshold: 0.999,
                ..DedupConfig::default()
            },
            llm: Some(LlmOptions {
                cmd: cmd.to_string(),
                timeout: Duration::from_millis(timeout_ms),
                calls_max: 10,
            }),
            ..SynthOptions::default()
        };
        let r = s.synth(&opts, |_| {}).unwrap();
        (
            r.llm_calls,
            r.llm_fallbacks,
            r.matched_judged,
            r.facts_total,
        )
    };
    assert_eq!(
        run(r#"cat >/dev/null; echo '{"same": true}'"#, 5_000),
        (1, 0, 1, 1)
    );
    assert_eq!(
        run(r#"cat >/dev/null; echo '{"same": false}'"#, 5_000),
        (1, 0, 0, 2)
    );
    assert_eq!(run("sleep 5", 200), (1, 1, 0, 2), "a time-out falls back");
    assert_eq!(
        run("echo not json", 5_000),
        (1, 1, 0, 2),
        "garbage falls back"
    );
}

/// `swarm metrics`: JSON a script can rely on and a table a person reads.
#[test]
fn metrics_command_measures_duplication_and_influence() {
    let env = Env::new();
    let s = user_store(&env, "alice");
    let a = append(
        &s,
        "r",
        finding("db", "orders-db", "orders-db pool exhausted", None),
    );
    append(
        &s,
        "r",
        finding("metrics", "orders-db", "orders-db pool exhausted", None),
    );
    let mut built = NewEvent::new("lead", EventType::Hypothesis, "the leak explains the pool");
    built.refs = vec![a.seq];
    append(&s, "r", built);
    let out = env
        .swarm(&["--user", "alice", "metrics", "--run", "r", "--json"])
        .ok();
    let m: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(m["events"], 3);
    let text = out.stdout;
    assert!(text.contains("duplication_rate"), "{text}");
    let table = env
        .swarm(&["--user", "alice", "metrics", "--run", "r"])
        .ok()
        .stdout;
    assert!(table.lines().count() > 3, "{table}");
}

/// `swarm quality` reports both parts of the labelled fixture.
#[test]
fn quality_command_reports_tune_and_heldout() {
    let env = Env::new();
    let out = env.swarm(&["quality", "--json"]).ok();
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    let parts = v["parts"].as_array().unwrap();
    let names: Vec<_> = parts.iter().map(|p| p["part"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["tune", "heldout"]);
    for p in parts {
        assert!(p["findings"].as_u64().unwrap() > 100);
        for k in [
            "precision",
            "recall",
            "contradiction_precision",
            "contradiction_recall",
        ] {
            let x = p[k].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&x), "{k} = {x}");
        }
    }
    let table = env.swarm(&["quality"]).ok().stdout;
    assert!(table.contains("heldout"), "{table}");
}

/// Two synths of one user at once: the second is refused (exit 4), never interleaved.
#[test]
fn one_synth_per_user_at_a_time() {
    let env = Env::new();
    let s = user_store(&env, "alice");
    append(&s, "r", finding("a", "x", "something", None));
    let lock = env.path().join("alice").join("@facts.synth-lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .unwrap();
    f.lock().unwrap();
    let e = s.synth(&SynthOptions::default(), |_| {}).unwrap_err();
    assert_eq!(e.exit_code(), 4, "{e}");
    f.unlock().unwrap();
    synth(&s);
}

/// The facts fold snapshot written at the end of a synth gives the same facts as a fold
/// from the start; a damaged or deleted snapshot costs time, never a fact; the next synth
/// builds on the snapshot and still agrees with a fold from the start.
#[test]
fn facts_snapshot_agrees_with_a_fold_from_the_start() {
    let env = Env::new();
    let s = user_store(&env, "alice");
    for i in 0..40 {
        let agent = format!("a{}", i % 3);
        append(
            &s,
            "r",
            finding(
                &agent,
                "orders-svc",
                &format!("orders-svc pod {} restarted {} times", i % 5, i % 5),
                Some(0.6),
            ),
        );
    }
    append(
        &s,
        "r",
        finding(
            "k8s",
            "orders-svc",
            "orders-svc listens on port 8080",
            Some(0.9),
        ),
    );
    append(
        &s,
        "r",
        finding(
            "cfg",
            "orders-svc",
            "orders-svc listens on port 3000",
            Some(0.5),
        ),
    );
    synth(&s);
    let dir = s.checkpoint_dir(FACTS_RUN);
    let snaps: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    // It loads, stands at the last commit, and the log holds that commit's frame.
    let (fold, info) =
        swarm_memory::synth::snapshot::load(&swarm_memory::FsStorage, &snaps[0]).unwrap();
    assert_eq!(fold.last_pass.map(|p| p.1), Some(info.seq));
    assert_eq!(fold.facts.len(), s.facts_fold(None).unwrap().facts.len());
    let last_commit = s
        .read(FACTS_RUN, ReadOptions::default())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.kind == EventType::SynthCommit)
        .last()
        .unwrap();
    assert_eq!(info.seq, last_commit.seq);
    let q = FactsQuery {
        include_superseded: true,
        ..FactsQuery::default()
    };
    let json = |s: &Store| serde_json::to_string(&s.facts(&q).unwrap()).unwrap();
    let with_snapshot = json(&s);
    let fresh = user_store(&env, "alice");
    std::fs::rename(&snaps[0], snaps[0].with_extension("moved")).unwrap();
    assert_eq!(json(&fresh), with_snapshot, "snapshot and full fold differ");
    // Damaged: one flipped byte in the body is detected and skipped.
    let mut bytes = std::fs::read(snaps[0].with_extension("moved")).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0x40;
    std::fs::write(&snaps[0], bytes).unwrap();
    std::fs::remove_file(snaps[0].with_extension("moved")).unwrap();
    assert_eq!(json(&user_store(&env, "alice")), with_snapshot);

    // The next synth starts from a snapshot again and the two ways still agree.
    synth(&s);
    append(
        &s,
        "r",
        finding(
            "net",
            "orders-svc",
            "orders-svc is serving on port 8080",
            Some(0.7),
        ),
    );
    append(
        &s,
        "r2",
        finding("db", "orders-db", "orders-db disk is 91% full", None),
    );
    let r = synth(&s);
    assert_eq!(r.events, 2, "{r:?}");
    let after = json(&user_store(&env, "alice"));
    for p in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(p.unwrap().path()).unwrap();
    }
    assert_eq!(json(&user_store(&env, "alice")), after);
}

/// Power loss in the middle of a synth (the fault-injecting storage: an fsync fails, the
/// process is gone, each file keeps its durable image plus a random part of what was
/// written after it): the facts log comes back with whole passes only, and synthesizing
/// again gives the facts an uninterrupted synth gives.
#[test]
fn synth_survives_power_loss_at_a_pass_commit() {
    use std::sync::Arc;
    use swarm_memory::{LogOptions, MemStorage};

    let open = |mem: &MemStorage| {
        Store::open_with(
            Arc::new(mem.clone()),
            std::path::Path::new("/data"),
            LogOptions::default(),
        )
        .unwrap()
        .with_user("alice", true)
        .unwrap()
    };
    let fill = |s: &Store| {
        for run in ["r1", "r2", "r3"] {
            let batch: Vec<NewEvent> = (0..120)
                .map(|i| {
                    finding(
                        &format!("a{}", i % 4),
                        &format!("svc-{}", i % 3),
                        &format!(
                            "svc-{} error rate is {}% on host-{}",
                            i % 3,
                            5 + i % 7,
                            i % 5
                        ),
                        Some(0.5 + (i % 5) as f64 / 10.0),
                    )
                })
                .collect();
            s.append_batch(run, batch, None, Durability::Sync).unwrap();
        }
    };
    // What the facts must be: an uninterrupted synth of the same data.
    type Shape = Vec<(String, Option<String>, u64, Vec<String>, &'static str)>;
    let shape = |s: &Store| -> Shape {
        s.facts(&FactsQuery {
            include_superseded: true,
            ..FactsQuery::default()
        })
        .unwrap()
        .facts
        .into_iter()
        .map(|f| (f.text, f.subject, f.evidence, f.agents, f.status))
        .collect()
    };
    let small = |runs: Option<Vec<String>>| SynthOptions {
        runs,
        pass_events_max: 50,
        ..SynthOptions::default()
    };
    // After a power loss each source run gets one more durable append (see below): the
    // reference gets the same.
    let keep_going = |s: &Store| {
        for run in ["r1", "r2", "r3"] {
            s.append(
                run,
                NewEvent::new("lead", EventType::Decision, "keep going"),
                Durability::Sync,
            )
            .unwrap();
        }
    };
    let reference = {
        let mem = MemStorage::new();
        let s = open(&mem);
        fill(&s);
        keep_going(&s);
        s.synth(&small(None), |_| {}).unwrap();
        shape(&s)
    };
    let mut rng = Rng::from_env("synth_power_loss");
    for case in 0..8 {
        let mem = MemStorage::new();
        let s = open(&mem);
        fill(&s);
        // Some runs already synthesized, so the failing sync comes at different passes.
        if case % 2 == 1 {
            s.synth(&small(Some(vec!["r1".into()])), |_| {}).unwrap();
        }
        mem.fail_syncs(1);
        let err = s.synth(&small(None), |_| {}).unwrap_err();
        assert_eq!(err.exit_code(), 1, "case {case}: {err}");
        let keep = rng.next_u64();
        mem.crash(|_, unsynced| (keep as usize) % (unsynced + 1));
        // After the power loss. The log engine's documented recovery: a run's visible
        // mark may lag until its next durable append, so each source run gets one (the
        // reference has the same).
        let back = open(&mem);
        keep_going(&back);
        // The facts log may end in a torn or uncommitted pass; never in corruption.
        if back.run_ids().unwrap().iter().any(|r| r == FACTS_RUN) {
            let v = back.verify(FACTS_RUN, |_| {}).unwrap();
            assert!(v.ok, "case {case}: {v:?}");
        }
        let r = back.synth(&small(None), |_| {}).unwrap();
        assert!(!r.nothing_new, "case {case}: {r:?}");
        assert_eq!(
            shape(&back),
            reference,
            "case {case}: differs from the uninterrupted synth"
        );
    }
}

/// One of bob's investigations, full of what must never reach another tenant: an API key
/// of a shape no vendor rule names, phone numbers, a colleague's name bob listed, and a
/// free-text root cause and resolution.
fn leaky_investigation(s: &Store, run: &str) {
    let mut h = NewEvent::new("lead", EventType::Hypothesis, "checkout slow");
    h.meta = Some(
        json!({"symptom": "high_latency_checkout"})
            .as_object()
            .unwrap()
            .clone(),
    );
    append(s, run, h);
    for (status, args) in [
        // Argument names changed between the calls: one ordinary, the others data that
        // only look like names (a listed name, a key).
        (
            "error",
            json!({"filter": "metric.type=latency", "token": "x", "timeout_ms": 100,
                   "whitfield": "read", "sk_live_51HxYzAbCdEf12GhIjKl34Mn": 1}),
        ),
        (
            "ok",
            json!({"filter": "metric.type=latency", "resource_type": "k8s_container", "timeout_ms": 500,
                   "whitfield": "write", "sk_live_51HxYzAbCdEf12GhIjKl34Mn": 2}),
        ),
    ] {
        let mut e = NewEvent::new("metrics", EventType::Evidence, "queried");
        e.meta = Some(
            json!({"tool": "query_metrics", "tool_status": status, "args": args,
                   "error": "invalid filter; ask Dana Whitfield at +1 415 555 0132"})
            .as_object()
            .unwrap()
            .clone(),
        );
        append(s, run, e);
    }
    let mut d = NewEvent::new(
        "lead",
        EventType::Decision,
        "rotate the key and raise the pool",
    );
    d.meta = Some(
        json!({"root_cause": "Dana Whitfield's cron job hammered the primary with sk-live-abcdef123456",
               "resolution": "rotated sk-live-abcdef123456, called (415) 555-0132 and Dana Whitfield signed off"})
        .as_object()
        .unwrap()
        .clone(),
    );
    append(s, run, d);
    s.close_run(run, "lead").expect("close");
}

/// User bob, archiving under the data dir, whose settings list the name "Dana Whitfield".
fn bob_listing_dana(env: &Env) -> Store {
    let bob = user_store(env, "bob").with_archive_dir(env.path().join(".archive"));
    std::fs::create_dir_all(env.path().join("bob")).unwrap();
    std::fs::write(
        env.path().join("bob").join("settings.json"),
        r#"{"redact_names": ["Dana Whitfield"]}"#,
    )
    .unwrap();
    bob
}

fn shared_scope_text(env: &Env) -> String {
    let dir = env.path().join(swarm_memory::synth::SHARED_USER);
    let mut bytes = Vec::new();
    if dir.exists() {
        for e in walk(&dir) {
            bytes.extend(std::fs::read(e).unwrap());
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The leak reproduction of issue 10: nothing of bob's reaches alice, in the default
/// (structured) mode and in the sanitized one (with the name bob listed); `off` shares
/// nothing; the shared copy's run id is a keyed hash that differs between data dirs.
#[test]
fn the_shared_scope_carries_no_tenant_secret() {
    let secrets = [
        "abcdef123456",
        "sk-live",
        "555 0132",
        "555-0132",
        "Whitfield",
        "whitfield",
        "Dana",
        "sk_live",
        "51HxYzAb",
        "51hxyzab",
        "cron job",
        "bob",
        "inc-7",
    ];
    let mut ids = Vec::new();
    for mode in [
        None,
        Some(SharePatterns::Sanitized),
        Some(SharePatterns::Off),
    ] {
        let env = Env::new();
        let bob = bob_listing_dana(&env);
        leaky_investigation(&bob, "inc-7");
        let opts = SynthOptions {
            share_patterns: mode,
            ..SynthOptions::default()
        };
        let r = bob.synth(&opts, |_| {}).unwrap();
        let alice = user_store(&env, "alice");
        let text = shared_scope_text(&env);
        let shown = format!(
            "{}{}",
            serde_json::to_string(&alice.patterns("high_latency_checkout").unwrap()).unwrap(),
            serde_json::to_string(&alice.advise("query_metrics").unwrap()).unwrap()
        );
        if mode == Some(SharePatterns::Off) {
            assert_eq!(r.shared_copies, 0);
            assert!(alice.patterns("high_latency_checkout").unwrap().is_empty());
            continue;
        }
        assert_eq!(r.shared_copies, 1, "{mode:?}");
        assert!(
            shown.contains("query_metrics"),
            "{mode:?}: the lesson is shared: {shown}"
        );
        assert!(
            shown.contains("timeout_ms"),
            "{mode:?}: an ordinary argument name is shared: {shown}"
        );
        for secret in secrets {
            assert!(
                !text.contains(secret),
                "{mode:?}: {secret:?} in the shared scope's files"
            );
            assert!(
                !shown.contains(secret),
                "{mode:?}: {secret:?} shown to alice: {shown}"
            );
        }
        if mode.is_none() {
            // Structured: categories, not text.
            let p = &alice.patterns("high_latency_checkout").unwrap()[0].item;
            assert_eq!(p.root_cause_category, "unknown");
            assert_eq!(p.resolution_summary, "renew");
            let key = env.path().join(".share-key");
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
                0o600
            );
            assert_eq!(
                std::fs::metadata(env.path().join("bob").join("inc-7"))
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o077,
                0,
                "a user's directory is the user's alone"
            );
        }
        let v: serde_json::Value = serde_json::from_str(
            text.lines()
                .find(|l| l.contains("\"learned\"") || l.contains("learnings"))
                .unwrap_or("{}"),
        )
        .unwrap_or_default();
        ids.push(v.to_string());
    }
    // Two data dirs, same (user, run): different opaque ids.
    let run_id = |s: &str| s.split("\"run\":\"").nth(1).map(|t| t[..17].to_string());
    assert_ne!(run_id(&ids[0]), run_id(&ids[1]), "{ids:?}");
}

/// Provenance of shared advice: a lesson one user repeats is marked as one user's word
/// (`users: 1`, however many occurrences); the same lesson from two users says 2.
#[test]
fn shared_advice_says_how_many_users_taught_it() {
    let env = Env::new();
    let bob = user_store(&env, "bob").with_archive_dir(env.path().join(".archive"));
    investigation(&bob, "inc-1", "acme-1");
    investigation(&bob, "inc-2", "acme-1");
    synth(&bob);
    let alice = user_store(&env, "alice");
    let p = alice.patterns("high_latency_checkout").unwrap();
    assert_eq!(
        (p.len(), p[0].users, p[0].item.occurrence_count),
        (1, Some(1), 2),
        "{p:?}"
    );
    assert!(p[0].item.provenance.first_seen.is_some());
    let carol = user_store(&env, "carol").with_archive_dir(env.path().join(".archive"));
    investigation(&carol, "inc-9", "other-2");
    synth(&carol);
    let p = alice.patterns("high_latency_checkout").unwrap();
    assert_eq!(
        (p[0].users, p[0].item.occurrence_count),
        (Some(2), 3),
        "{p:?}"
    );
    let tips = alice.advise("query_metrics").unwrap();
    assert_eq!(tips[0].users, Some(2));
    let shown = serde_json::to_string(&p).unwrap();
    assert!(shown.contains("\"users\":2"), "{shown}");
    // Who taught it and exactly when stay with them: no contributor ids (they linked one
    // tenant's incidents across lessons), times cut to the UTC day.
    const DAY_US: u64 = 86_400_000_000;
    for s in p.iter().filter(|s| s.scope == "shared") {
        assert!(s.item.provenance.contributors.is_empty(), "{s:?}");
        assert_eq!(s.item.last_seen.0 % DAY_US, 0, "{s:?}");
        assert!(s
            .item
            .provenance
            .first_seen
            .is_some_and(|t| t.0 % DAY_US == 0));
    }
    assert!(!shown.contains("contributors"), "{shown}");
    let shown_tips = serde_json::to_string(&tips).unwrap();
    assert!(!shown_tips.contains("contributors"), "{shown_tips}");
    for t in &tips {
        assert!(
            t.item.corrected_at.is_none_or(|c| c.0 % DAY_US == 0),
            "{t:?}"
        );
    }
    // Bob's own view of his lessons is private and carries no count.
    assert!(bob
        .patterns("high_latency_checkout")
        .unwrap()
        .iter()
        .any(|x| x.scope == "private" && x.users.is_none()));
}

/// The fold a snapshot gives is the fold the log gives, field by field (not only
/// the facts' views): the next synth's deduper is rebuilt from it (`findings::restore`:
/// the wordings' insertion numbers, the entry types, the scopes), so any field the
/// snapshot holds differently makes a resumed synth decide otherwise.
#[test]
fn a_snapshot_fold_equals_the_fold_from_the_start_field_by_field() {
    let env = Env::new();
    let s = user_store(&env, "alice");
    for i in 0..30 {
        let agent = format!("a{}", i % 4);
        let mut e = finding(
            &agent,
            if i % 2 == 0 {
                "orders-svc"
            } else {
                "orders-db"
            },
            &format!("orders pod {} restarted {} times", i % 6, i % 6),
            Some(0.5),
        );
        if i % 5 == 0 {
            e.kind = "hypothesis".into();
        }
        append(&s, if i % 3 == 0 { "r1" } else { "r2" }, e);
    }
    for (agent, port, c) in [("k8s", 8080, 0.9), ("cfg", 3000, 0.5)] {
        let text = format!("orders-svc listens on port {port}");
        append(&s, "r1", finding(agent, "orders-svc", &text, Some(c)));
    }
    investigation(&s, "closed-1", "acme");
    let opts = SynthOptions {
        pass_events_max: 7,
        ..SynthOptions::default()
    };
    s.synth(&opts, |_| {}).expect("synth");
    append(
        &s,
        "r2",
        finding("net", "orders-db", "orders-db disk is 91% full", None),
    );
    s.synth(&opts, |_| {}).expect("synth");
    let dir = s.checkpoint_dir(FACTS_RUN);
    let with_snapshot =
        serde_json::to_value(user_store(&env, "alice").facts_fold(None).unwrap()).unwrap();
    std::fs::rename(&dir, dir.with_extension("moved")).unwrap();
    let from_start =
        serde_json::to_value(user_store(&env, "alice").facts_fold(None).unwrap()).unwrap();
    let fields = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(fields(&with_snapshot), fields(&from_start));
    for k in fields(&from_start) {
        assert_eq!(with_snapshot[&k], from_start[&k], "field {k} differs");
    }
}

/// A fresh-eyes review's leaks (2026-11-29): the symptom taken from a hypothesis's
/// subject (no `meta.symptom`) was shared unsanitized in the sanitized mode, cut to a
/// slug no detector could read; an address after `_` in an argument or tool name, a
/// listed name glued to a digit and a password under `MYSQL_PWD` / `DB_PASS` got through
/// in both modes. Nothing of them may reach another user.
#[test]
fn the_shared_scope_carries_no_secret_of_a_subject_an_argument_or_a_tool_name() {
    let secrets = [
        "carol",
        "acme",
        "10_9_8_7",
        "10.9.8.7",
        "7946",
        "0958",
        "10.20.30.40",
        "dana",
        "whitfield",
        "hunter",
        "900123",
        "0132",
    ];
    for mode in [None, Some(SharePatterns::Sanitized)] {
        let env = Env::new();
        let bob = bob_listing_dana(&env);
        let run = "inc-9";
        let mut h = NewEvent::new("lead", EventType::Hypothesis, "h");
        h.subject = Some(
            "login failure for carol.white@acme.com from 10.9.8.7 pager +44 20 7946 0958".into(),
        );
        append(&bob, run, h);
        let with_meta = |agent: &str, kind, content: &str, meta: serde_json::Value| {
            let mut e = NewEvent::new(agent, kind, content);
            e.meta = Some(meta.as_object().unwrap().clone());
            e
        };
        let act = EventType::ActionTaken;
        append(
            &bob,
            run,
            with_meta("a", act, "x", json!({"tool": "check", "tool_status": "ok"})),
        );
        for (status, pwd) in [("error", "hunter44"), ("ok", "hunter45")] {
            let meta = json!({"tool": "query_db", "tool_status": status, "error": "invalid argument",
                              "args": {"host_10.20.30.40": status, "dana2": status, "MYSQL_PWD": pwd,
                                       "timeout_ms": status}});
            append(&bob, run, with_meta("a", act, "c", meta));
        }
        let page = json!({"tool": "page_whitfield2", "tool_status": "ok"});
        append(&bob, run, with_meta("a", act, "x", page));
        let decision = "DB_PASS=hunter22 was wrong; call phone:415-555-0132 or 07700 900123";
        let cause = json!({"root_cause": "config"});
        append(
            &bob,
            run,
            with_meta("lead", EventType::Decision, decision, cause),
        );
        bob.close_run(run, "lead").expect("close");
        let opts = SynthOptions {
            share_patterns: mode,
            ..SynthOptions::default()
        };
        assert_eq!(
            bob.synth(&opts, |_| {}).unwrap().shared_copies,
            1,
            "{mode:?}"
        );
        let alice = user_store(&env, "alice");
        let text = shared_scope_text(&env).to_lowercase();
        let shown = serde_json::to_string(&alice.advise("query_db").unwrap())
            .unwrap()
            .to_lowercase();
        assert!(
            shown.contains("query_db"),
            "{mode:?}: the lesson is shared: {shown}"
        );
        assert!(shown.contains("timeout_ms"), "{mode:?}: {shown}");
        for secret in secrets {
            assert!(
                !text.contains(secret),
                "{mode:?}: {secret:?} in the shared scope: {text}"
            );
            assert!(
                !shown.contains(secret),
                "{mode:?}: {secret:?} shown to alice: {shown}"
            );
        }
    }
}
