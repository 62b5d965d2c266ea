//! `swarm search`: the user's facts and findings ranked, filters, the JSON rows, the
//! mode it says it ran in, and another user's memory never in the answer.

use serde_json::Value;
use swarm_memory::synth::SynthOptions;
use swarm_memory::{Durability, EventType, NewEvent, Store};

use crate::util::Env;

fn user_store(env: &Env, user: &str) -> Store {
    Store::open(env.path())
        .expect("open")
        .with_user(user, true)
        .expect("user")
}

fn add(s: &Store, run: &str, agent: &str, kind: EventType, text: &str) {
    s.append(run, NewEvent::new(agent, kind, text), Durability::None)
        .expect("append");
}

fn search(env: &Env, user: &str, args: &[&str]) -> Value {
    let mut all = vec!["--user", user, "search"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = env.swarm(&all).ok();
    serde_json::from_str(&out.stdout).expect("one JSON object")
}

fn texts(v: &Value) -> Vec<String> {
    v["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|h| h["text"].as_str().expect("text").to_string())
        .collect()
}

#[test]
fn search_ranks_the_users_facts_and_findings_and_filters_them() {
    let env = Env::new();
    let alice = user_store(&env, "alice");
    let bob = user_store(&env, "bob");
    let pool = "orders-db connection pool exhausted: 100 of 100 in use";
    add(&alice, "inc-1", "db", EventType::Evidence, pool);
    add(
        &alice,
        "inc-1",
        "net",
        EventType::Hypothesis,
        "dns resolution is flaky",
    );
    add(
        &alice,
        "inc-2",
        "db",
        EventType::Evidence,
        "payments-db pool exhausted",
    );
    add(
        &bob,
        "inc-1",
        "db",
        EventType::Evidence,
        "bob-ledger connection pool exhausted",
    );
    alice
        .synth(&SynthOptions::default(), |_| {})
        .expect("synth");
    let again = "orders-db connection pool exhausted again after the restart";
    add(&alice, "inc-1", "db2", EventType::Evidence, again);

    let v = search(&env, "alice", &["connection pool exhausted"]);
    assert_eq!(v["mode"], "lexical");
    assert!(v["model"].is_null());
    assert!(
        v["reason"].as_str().unwrap().contains("model not found at"),
        "{v}"
    );
    let t = texts(&v);
    // The fact (its finding left out: the fact stands for it), the newer finding, the
    // other run's partial match; the hypothesis shares no word; bob's identical words
    // are never read.
    assert_eq!(t.len(), 3, "{v}");
    assert!(
        t[..2].contains(&pool.to_string()) && t[..2].contains(&again.to_string()),
        "{t:?}"
    );
    assert_eq!(t[2], "payments-db pool exhausted", "{v}");
    let hits = v["hits"].as_array().unwrap();
    let fact = hits.iter().find(|h| h["source"] == "fact").expect("a fact");
    assert_eq!(fact["text"], pool);
    assert!(fact["fact_id"].as_str().unwrap().starts_with('F'));
    assert_eq!(fact["agents"], serde_json::json!(["db"]));
    let finding = hits
        .iter()
        .find(|h| h["source"] == "finding" && h["text"] == again)
        .expect("the finding");
    assert_eq!(
        (&finding["run"], &finding["seq"], &finding["agent"]),
        (&Value::from("inc-1"), &Value::from(3), &Value::from("db2"))
    );
    assert!(finding["ts"].is_string());
    let scores: Vec<f64> = hits.iter().map(|h| h["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");

    // Filters: run, agent and type, since, limit.
    let r2 = search(&env, "alice", &["pool exhausted", "--run", "inc-2"]);
    assert!(texts(&r2).iter().all(|x| x.contains("payments-db")), "{r2}");
    let net = search(
        &env,
        "alice",
        &["dns", "--agent", "net", "--kind", "hypothesis"],
    );
    let net = texts(&net);
    assert!(
        !net.is_empty() && net.iter().all(|x| x == "dns resolution is flaky"),
        "{net:?}"
    );
    let none = search(&env, "alice", &["dns", "--agent", "db"]);
    assert_eq!(texts(&none), Vec::<String>::new());
    let later = search(&env, "alice", &["pool", "--since", "2999-01-01"]);
    assert_eq!(texts(&later), Vec::<String>::new());
    let one = search(&env, "alice", &["pool exhausted", "--limit", "1"]);
    assert_eq!(texts(&one).len(), 1);
    // A limit out of 1..100 is refused, not quietly clamped.
    for bad in ["0", "101"] {
        env.swarm(&["--user", "alice", "search", "pool", "--limit", bad])
            .code(2)
            .stderr_has(&["limit", "give 1 to 100"]);
    }

    // Bob finds only his own, whatever alice holds.
    let b = search(&env, "bob", &["orders-db payments-db pool exhausted"]);
    assert_eq!(texts(&b), ["bob-ledger connection pool exhausted"]);
    let b = search(&env, "bob", &["orders-db"]);
    assert_eq!(texts(&b), Vec::<String>::new());

    // The table names the mode and the ids; a model dir given says where it looked.
    let table = env
        .swarm(&["--user", "alice", "search", "connection pool exhausted"])
        .ok()
        .stdout;
    assert!(table.contains("mode: lexical"), "{table}");
    assert!(table.contains("inc-1#3") && table.contains("F1"), "{table}");
    let m = search(
        &env,
        "alice",
        &["pool", "--embed-model", "/nonexistent/minilm"],
    );
    assert!(
        m["reason"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/minilm"),
        "{m}"
    );
    // Refusals: no word to search by, an unknown type.
    env.swarm(&["--user", "alice", "search", "the"])
        .code(2)
        .one_line_error(&["query"]);
    env.swarm(&["--user", "alice", "search", "pool", "--kind", "bogus"])
        .code(2);
}

/// `swarm quality --set` reports the search's top-1/top-3 and its mode; with fixed vectors
/// (`--embed-vectors`) a paraphrase that shares no word is found, without them it is not;
/// a text the vectors do not hold is an error, never a made-up vector.
#[test]
fn quality_set_reports_search_figures_by_mode() {
    let env = Env::new();
    let set = env.path().join("set.jsonl");
    std::fs::write(
        &set,
        r#"{"kind":"event","eid":"1","user":"u","run":"r","agent_id":"a","type":"evidence","content":"postgres pool exhausted 100/100","fact":"F1"}
{"kind":"event","eid":"2","user":"u","run":"r","agent_id":"b","type":"evidence","content":"disk full on kafka-3","fact":"F2"}
{"kind":"query","user":"u","text":"no spare connections left","fact":"F1"}
"#,
    )
    .unwrap();
    let vectors = env.path().join("vectors.json");
    let write_vectors = |v: Value| std::fs::write(&vectors, v.to_string()).unwrap();
    write_vectors(serde_json::json!({
        "postgres pool exhausted 100/100": [1.0, 0.1],
        "disk full on kafka-3": [0.0, 1.0],
        "no spare connections left": [0.9, 0.2],
    }));
    let set_arg = set.to_str().unwrap();
    let run = |extra: &[&str]| -> Value {
        let mut args = vec!["quality", "--set", set_arg, "--json"];
        args.extend_from_slice(extra);
        serde_json::from_str(&env.swarm(&args).ok().stdout).unwrap()
    };
    let lexical = run(&[]);
    assert_eq!(lexical["search_mode"], "lexical");
    assert_eq!(
        (&lexical["search_queries"], &lexical["search_top3"]),
        (&Value::from(1), &Value::from(0))
    );
    let hybrid = run(&["--embed-vectors", vectors.to_str().unwrap()]);
    assert_eq!(hybrid["search_mode"], "hybrid");
    assert_eq!(hybrid["search_model"], "vectors:vectors.json");
    assert_eq!(
        (&hybrid["search_top1"], &hybrid["search_top3"]),
        (&Value::from(1), &Value::from(1))
    );
    assert_eq!(hybrid["search_foreign_hits"], 0);
    write_vectors(serde_json::json!({"no spare connections left": [0.9, 0.2]}));
    env.swarm(&[
        "quality",
        "--set",
        set_arg,
        "--embed-vectors",
        vectors.to_str().unwrap(),
    ])
    .code(2)
    .stderr_has(&["no vector for"]);
}
