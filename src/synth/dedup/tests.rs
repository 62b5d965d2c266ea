//! Tests of the deduper.
use super::*;

/// Feeds findings the way the driver does; returns each finding's fact and the
/// contradictions reported.
fn feed(d: &mut Deduper, items: &[(&str, &str)]) -> (Vec<FactIdx>, Vec<(FactIdx, FactIdx)>) {
    let mut facts = Vec::new();
    let mut contra = Vec::new();
    for (scope, text) in items {
        let c = d.classify(scope, text, None);
        let f = match c.matched {
            Match::New => d.add_fact(scope, text),
            ref m => {
                d.add_variant(m.fact().unwrap(), text);
                m.fact().unwrap()
            }
        };
        for (g, s) in c.contradicts {
            assert_ne!(g, f, "a fact never contradicts itself");
            assert!(s > 0.0 && s <= 1.0);
            contra.push((f, g));
        }
        facts.push(f);
    }
    (facts, contra)
}

fn same(scope: &str, a: &str, b: &str) -> bool {
    let mut d = Deduper::new(DedupConfig::default());
    let (f, _) = feed(&mut d, &[(scope, a), (scope, b)]);
    f[0] == f[1]
}

fn contradicts(scope: &str, a: &str, b: &str) -> bool {
    let mut d = Deduper::new(DedupConfig::default());
    !feed(&mut d, &[(scope, a), (scope, b)]).1.is_empty()
}

#[test]
fn exact_repeat() {
    let mut d = Deduper::new(DedupConfig::default());
    let f = d.add_fact("db", "Pool exhausted.");
    let c = d.classify("db", "pool   exhausted", None);
    assert_eq!(c.matched, Match::Exact(f));
    assert_eq!(
        d.classify("other", "pool exhausted", None).matched,
        Match::New
    );
}

#[test]
fn paraphrases_merge() {
    let s = "billing-db";
    assert!(same(
        s,
        "billing-db connection pool exhausted: 50/50 connections in use",
        "connection pool for billing-db maxed out at 50 active connections"
    ));
    assert!(same(
        s,
        "replica lag on billing-db reached 30s",
        "billing-db replica is lagging 30 seconds behind the primary"
    ));
    assert!(same(
        "web",
        "web pods restarted 4 times, reason OOMKilled",
        "web containers were OOM killed, 4 restarts"
    ));
    assert!(same(
        "web",
        "p99 latency of web rose to 3.1 s",
        "web 99th percentile latency jumped to 3.1s"
    ));
    assert!(same(
        "web",
        "5xx rate of web climbed to 7%",
        "7 percent of web requests fail with 503"
    ));
}

#[test]
fn look_alikes_stay_apart() {
    assert!(!same(
        "nodes",
        "node gke-prod-pool-2-x1 reports DiskPressure=True",
        "node gke-prod-pool-2-y9 reports DiskPressure=True"
    ));
    assert!(!same(
        "web",
        "web listens on port 8080",
        "web listens on port 9090"
    ));
    assert!(!same(
        "db",
        "db CPU utilization at 97%",
        "db memory utilization at 97%"
    ));
    assert!(!same(
        "web",
        "web p50 latency is 45ms",
        "web p99 latency is 45ms"
    ));
    assert!(!same(
        "web",
        "web deploy 2026.01.02-4 rolled out at 10:00",
        "web deploy 2026.01.02-5 rolled out at 10:00"
    ));
    assert!(!same(
        "web",
        "web NullPointerException in FooMapper.toDto",
        "web NullPointerException in BarMapper.toDto"
    ));
    assert!(!same(
        "edge",
        "ingress returns 502 on /login",
        "ingress returns 504 on /login"
    ));
    assert!(!same(
        "tls",
        "api still accepts TLS 1.0 connections",
        "api does not accept TLS 1.0 connections"
    ));
    // Same measure, different entity (hyphenated name, host name, URL path).
    assert!(!same(
        "mq",
        "queue a-jobs has 40k ready messages",
        "queue b-jobs has 40k ready messages"
    ));
    assert!(!same(
        "dns",
        "api.example.org TTL is 300 seconds",
        "www.example.org TTL is 300 seconds"
    ));
    assert!(!same(
        "edge",
        "ingress p95 latency for /api/a is 800ms",
        "ingress p95 latency for /api/b is 800ms"
    ));
    // Same numbers, different measured thing: state, bound, resource, wording.
    assert!(!same(
        "mq",
        "queue q has 40k ready messages",
        "queue q has 40k unacked messages"
    ));
    assert!(!same(
        "db",
        "db max_connections is 500",
        "db has 500 open connections"
    ));
    assert!(!same(
        "quota",
        "region-1 vCPU quota is 80% used",
        "region-1 elastic IP quota is 80% used"
    ));
    assert!(!same(
        "cdn",
        "cdn purge of /static/* takes 90s to propagate",
        "cdn caches /static/* with a ttl of 90 seconds"
    ));
    assert!(!same(
        "web",
        "web p99 latency is 2.4s",
        "web timeout is 2.4s"
    ));
    assert!(!same(
        "web",
        "web cache hit ratio is 40%",
        "web error rate is 40%"
    ));
    assert!(!same("k8s", "3 pods restarted", "3 nodes NotReady"));
    // ... while paraphrases of one measure still merge.
    assert!(same(
        "cdn",
        "cdn purge of /static/* takes 90s to propagate",
        "purge of /static/* on the cdn needs 90 seconds to reach all edges"
    ));
    assert!(same(
        "gw",
        "gw rate limit is 1000 requests per minute per client",
        "per-client rate limit on gw: 1000 req/min"
    ));
    // Scopes never mix.
    let mut d = Deduper::new(DedupConfig::default());
    let (f, _) = feed(
        &mut d,
        &[
            ("a", "pool exhausted at 10 connections"),
            ("b", "pool exhausted at 10 connections"),
        ],
    );
    assert_ne!(f[0], f[1]);
}

#[test]
fn contradiction_cases() {
    assert!(contradicts(
        "web",
        "web listens on port 8080",
        "web serves HTTP on port 3000"
    ));
    assert!(contradicts(
        "db",
        "replica lag on db reached 45s",
        "db replication lag stays below 2s"
    ));
    assert!(contradicts(
        "web",
        "web error rate is 12%",
        "web error rate is normal at 0.3%"
    ));
    assert!(contradicts(
        "web",
        "memory limit for web is 512Mi",
        "web has a 1Gi memory limit"
    ));
    assert!(contradicts(
        "tls",
        "api still accepts TLS 1.0 connections",
        "api does not accept TLS 1.0 connections"
    ));
    // Different entities, different measures, no subject: no contradiction.
    assert!(!contradicts(
        "nodes",
        "node pool-1-a3f has 3 evicted pods",
        "node pool-1-b7c has 9 evicted pods"
    ));
    assert!(!contradicts(
        "dns",
        "intermittent SERVFAIL resolving a-db.internal",
        "b-db.internal resolves fine, no SERVFAIL"
    ));
    assert!(!contradicts(
        "db",
        "db CPU utilization at 97%",
        "db memory utilization at 40%"
    ));
    assert!(!contradicts(
        "k",
        "topic t has 12 partitions",
        "consumer c is 5000 messages behind on topic t"
    ));
    assert!(!contradicts(
        "",
        "web listens on port 8080",
        "web listens on port 3000"
    ));
    // The matched fact is never reported.
    let mut d = Deduper::new(DedupConfig::default());
    let f = d.add_fact("web", "web listens on port 8080");
    let c = d.classify("web", "web is serving on port 8080", None);
    assert_eq!(c.matched.fact(), Some(f));
    assert!(c.contradicts.is_empty());
}

#[test]
fn deterministic_replay() {
    let items: Vec<(&str, &str)> = vec![
        ("web", "web listens on port 8080"),
        ("web", "web is serving on port 8080"),
        ("web", "web serves HTTP on port 3000"),
        ("db", "db pool exhausted: 100/100 connections in use"),
        (
            "db",
            "db pool saturated, every one of the 100 connections busy",
        ),
        ("db", "db CPU at 97%"),
        ("db", "db memory at 97%"),
        ("", "incident started after the 13:58 deploy"),
        ("", "errors began right after the deploy at 13:58"),
    ];
    let run = || {
        let mut d = Deduper::new(DedupConfig::default());
        let out = feed(&mut d, &items);
        let texts: Vec<String> = (0..d.len()).map(|f| d.text(f).to_string()).collect();
        (out, texts)
    };
    let a = run();
    assert_eq!(a, run());
    // Replaying the facts log gives the same answers to new findings.
    let mut d1 = Deduper::new(DedupConfig::default());
    let (facts, _) = feed(&mut d1, &items);
    let mut d2 = Deduper::new(DedupConfig::default());
    for (i, (scope, text)) in items.iter().enumerate() {
        if facts[..i].contains(&facts[i]) {
            d2.add_variant(facts[i], text);
        } else {
            assert_eq!(d2.add_fact(scope, text), facts[i]);
        }
    }
    for (scope, text) in [
        ("web", "web listens on 3000"),
        ("db", "db CPU pegged at 97%"),
    ] {
        assert_eq!(
            d1.classify(scope, text, None),
            d2.classify(scope, text, None)
        );
    }
}

struct Recorder {
    scores: Vec<f64>,
    answer: Option<bool>,
}

impl Judge for Recorder {
    fn same(&mut self, _scope: &str, _a: &str, _b: &str, score: f64) -> Option<bool> {
        self.scores.push(score);
        self.answer
    }
}

#[test]
fn judge_only_on_borderline() {
    let cfg = DedupConfig::default();
    let mut d = Deduper::new(cfg.clone());
    d.add_fact("web", "web p99 latency rose to 2.4s after the deploy");
    let probes = [
        "web p99 latency rose to 2.4s after the deploy",
        "web p99 latency jumped to 2.4 seconds after the release",
        "web p99 latency is 2.4s",
        "web p99 latency 2.4s, queue depth growing on workers",
        "completely unrelated words here",
        "web p99 latency rose to 9s",
    ];
    let mut j = Recorder {
        scores: Vec::new(),
        answer: Some(true),
    };
    let mut judged = 0;
    for p in probes {
        let before = j.scores.len();
        let c = d.classify("web", p, Some(&mut j));
        let s = crate::synth::dedup::similarity("web", p, d.text(0));
        let borderline = s >= cfg.borderline_low && s < cfg.near_threshold;
        assert_eq!(
            j.scores.len() - before,
            usize::from(borderline && c.matched != Match::Exact(0)),
            "{p}: {s}"
        );
        if borderline {
            assert!(matches!(c.matched, Match::Judged { fact: 0, .. }));
            judged += 1;
        }
    }
    assert!(judged >= 1, "no probe was borderline");
    assert!(j
        .scores
        .iter()
        .all(|s| *s >= cfg.borderline_low && *s < cfg.near_threshold));
    // No opinion or "different": the deterministic answer stands.
    for answer in [None, Some(false)] {
        let mut j = Recorder {
            scores: Vec::new(),
            answer,
        };
        let c = d.classify(
            "web",
            "web p99 latency 2.4s, queue depth growing on workers",
            Some(&mut j),
        );
        assert_eq!(
            c.matched,
            d.classify(
                "web",
                "web p99 latency 2.4s, queue depth growing on workers",
                None
            )
            .matched
        );
    }
}

#[test]
fn bounded_growth_many_findings() {
    let cfg = DedupConfig {
        candidates_max: 8,
        ..DedupConfig::default()
    };
    let mut d = Deduper::new(cfg.clone());
    let mut first: Vec<Option<FactIdx>> = vec![None; 2000];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x % 2000) as usize;
        let w = ((x >> 20) % 3) as usize;
        let r = i % 7 + 2;
        let scope = format!("svc-{}", i % 20);
        let text = match w {
            0 => format!("pod api-{i} restarted {r} times, reason OOMKilled"),
            1 => format!("api-{i} containers were OOM killed, {r} restarts"),
            _ => format!("api-{i} was killed by the OOM killer {r} times"),
        };
        let c = d.classify(&scope, &text, None);
        let f = match c.matched {
            Match::New => d.add_fact(&scope, &text),
            ref m => {
                let f = m.fact().unwrap();
                d.add_variant(f, &text);
                f
            }
        };
        assert_eq!(
            *first[i].get_or_insert(f),
            f,
            "finding of fact {i} went elsewhere"
        );
    }
    assert_eq!(d.len(), 2000);
    assert!((0..d.len()).all(|f| d.variants(f) <= cfg.variants_max));
}

/// A scope past `exact_max` is searched through its neighbour graph; the graph depends on
/// the order vectors arrived in, so a deduper rebuilt from the facts log adds them by
/// their insertion numbers (as `findings::restore` does), not fact by fact.
#[test]
fn past_exact_max_the_graph_is_rebuilt_in_insertion_order() {
    let mut cfg = DedupConfig::default();
    cfg.semantic.exact_max = 8;
    let dim = 16;
    let vector = |k: usize| -> Vec<f32> {
        let mut s = k as u64 * 7919 + 1;
        let mut v: Vec<f32> = (0..dim)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect();
        crate::embed::l2_normalize(&mut v);
        v
    };
    // 40 facts; every second wording arrives after all the first ones.
    let mut arrival = Deduper::new(cfg.clone());
    let mut added: Vec<(u64, FactIdx, usize)> = Vec::new();
    for i in 0..40 {
        let f = arrival.add_fact("evidence", &format!("first wording {i}"));
        added.push((arrival.add_vector(f, &vector(2 * i)), f, 2 * i));
    }
    for i in 0..40 {
        assert!(arrival.add_variant(i, &format!("second wording {i}")));
        added.push((arrival.add_vector(i, &vector(2 * i + 1)), i, 2 * i + 1));
    }
    let rebuild = |order: &[(u64, FactIdx, usize)]| {
        let mut d = Deduper::new(cfg.clone());
        for i in 0..40 {
            d.add_fact("evidence", &format!("first wording {i}"));
            d.add_variant(i, &format!("second wording {i}"));
        }
        for &(_, f, k) in order {
            d.add_vector(f, &vector(k));
        }
        d
    };
    let links = |d: &Deduper| {
        d.vectors[0]
            .graph
            .as_ref()
            .expect("a graph")
            .links()
            .to_vec()
    };
    let mut by_fact = added.clone();
    by_fact.sort_by_key(|x| (x.1, x.2));
    let mut by_number = by_fact.clone();
    by_number.sort_by_key(|x| x.0);
    let (same, other) = (rebuild(&by_number), rebuild(&by_fact));
    assert_eq!(links(&same), links(&arrival));
    assert_ne!(links(&other), links(&arrival));
    // And the same answers.
    let ts = crate::event::ts::Ts(0);
    for k in [3, 17, 55] {
        let q = vector(k);
        assert_eq!(
            same.classify_semantic("evidence", "a query", &q, ts, None),
            arrival.classify_semantic("evidence", "a query", &q, ts, None)
        );
    }
}

/// Two readings of one value at two precisions (`6.2%` / `~6%`) are not a contradiction,
/// nor a change; two readings that differ at the coarser precision are.
#[test]
fn a_value_and_its_rounded_form_do_not_contradict() {
    let mut d = Deduper::new_semantic(DedupConfig::default());
    let mut v = vec![0.0f32; 8];
    v[0] = 1.0;
    let f = d.add_fact("evidence", "checkout redis timeouts on 6.2% of requests");
    d.add_vector(f, &v);
    let at = crate::event::ts::Ts(1_000_000);
    d.observe(f, at);
    let c = d.classify_semantic(
        "evidence",
        "checkout redis timeouts on ~6% of requests",
        &v,
        at,
        None,
    );
    assert!(c.contradicts.is_empty() && c.changes.is_empty(), "{c:?}");
    let c = d.classify_semantic(
        "evidence",
        "checkout redis timeouts on 9% of requests",
        &v,
        at,
        None,
    );
    assert_eq!(c.contradicts.len(), 1, "{c:?}");
}

#[test]
fn a_value_that_rounds_to_a_coarser_one_is_alike() {
    for (a, b) in [
        ("6.2%", "6%"),
        ("0.612", "0.61"),
        ("52", "50"),
        ("3400000", "3400000"),
        ("9.81", "10"),
    ] {
        assert!(rounds_alike(a, b), "{a} / {b}");
        assert!(rounds_alike(b, a), "{b} / {a}");
    }
    for (a, b) in [
        ("412", "421"),
        ("6.7%", "6%"),
        ("2", "3"),
        ("0.3", "0.5"),
        ("55", "50"),
        ("100%", "10%"),
        ("6%", "6"),
        ("-6", "6"),
        ("6.2", "6.3"),
    ] {
        assert!(!rounds_alike(a, b), "{a} / {b}");
        assert!(!rounds_alike(b, a), "{b} / {a}");
    }
}

/// Whether `b` merges with a fact first worded `a` (semantic mode) when both have one
/// vector (cosine 1): what the slots alone decide.
fn merges_at_cosine_one(scope: &str, a: &str, b: &str) -> bool {
    let mut v = vec![0.0f32; 8];
    v[0] = 1.0;
    let mut d = Deduper::new_semantic(DedupConfig::default());
    let f = d.add_fact(scope, a);
    d.add_vector(f, &v);
    d.classify_semantic(scope, b, &v, crate::event::ts::Ts(0), None)
        .matched
        != Match::New
}

/// Deployment environments are exclusive qualifiers: the same release in canary and in
/// staging (or prod) is two facts however close the meaning; one side naming none is
/// no conflict.
#[test]
fn two_environments_are_two_facts() {
    let merges = |a: &str, b: &str| merges_at_cosine_one("action_taken", a, b);
    assert!(!merges(
        "deployed search-api v2.14.1 -> canary",
        "search-api 2.14.1 was deployed to the staging environment"
    ));
    assert!(!merges(
        "checkout-api running 3.0.0-rc1 in canary",
        "checkout-api 3.0.0-rc1 is live in production"
    ));
    assert!(merges(
        "checkout-api running 3.0.0-rc1 in prod",
        "checkout-api 3.0.0-rc1 is live in production"
    ));
    assert!(merges(
        "deployed search-api v2.14.1 to canary",
        "search-api 2.14.1 went out"
    ));
}

/// Two causal claims about one issue whose causes share no word are two claims however
/// close the meaning; the same cause in other words is one.
#[test]
fn two_causes_of_one_issue_are_two_facts() {
    let merges = |a: &str, b: &str| merges_at_cosine_one("finding", a, b);
    assert!(!merges(
        "After digging in, CPU contention from a noisy neighbour turns out to be what broke checkout pods.",
        "The checkout pods issue was caused by a hot partition on a single shard key."
    ));
    assert!(!merges(
        "confirmed - finetune trouble comes down to lr too high",
        "The root cause of the finetune problem is label noise in the newly annotated batch."
    ));
    // One cause, two issues.
    assert!(!merges(
        "hypothesis: search release impact due to GC pauses",
        "a storm of long JVM garbage-collection pauses is hurting partner API handshakes"
    ));
    assert!(merges(
        "The root cause of the card decline spike problem is an expired merchant API key.",
        "The card decline spike issue was caused by an expired merchant API key."
    ));
    assert!(merges(
        "checkout latency was caused by CPU contention from a noisy neighbour",
        "checkout latency: CPU contention on the node"
    ));
}
