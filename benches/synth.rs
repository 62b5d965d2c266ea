//! The batch synthesizer on 1,000,000 events: events/s (target >= 200,000/s), peak memory
//! (target < 256 MiB), and a re-run with nothing new (target < 1 s); side by side, in the
//! same run, with a plain scan of the same events (`swarm read > /dev/null`), the floor
//! any synthesis over this log pays.
//!
//! ```sh
//! cargo bench --bench synth                       # 1,000,000 events
//! SYNTH_BENCH_EVENTS=200000 cargo bench --bench synth
//! ```
//!
//! The data: 10 runs of equal size in one user's partition, written with `none`
//! durability in batches of 1,000 (~250-byte events). 90% are findings (evidence and
//! hypotheses) about 500 subjects drawn from 20,000 distinct claims (40 topics per
//! subject), each written in one of 3 wordings (two differ in case and punctuation, one
//! in word order) by one of 64 agents, so most findings repeat a known fact exactly or
//! nearly; 1% state an incompatible value (contradictions); 10% are decisions. The synthesizer runs as a
//! child process (`swarm synth --all`, the release binary), which reports its own peak
//! resident memory (`VmHWM`). Then: a re-run with nothing new, and an incremental run
//! after 10,000 more events.
//!
//! The `embed` cell (feature `semantic`, model from `SWARM_EMBED_MODEL` or
//! `data/models/all-MiniLM-L6-v2`): texts/s of the local model over
//! `SYNTH_BENCH_EMBED_TEXTS` (default 1,024) findings in batches of 32, and in the same run
//! sentence-transformers on PyTorch (CPU, 2 threads) for the same model directory, texts
//! and batch size, run by the Python in `SWARM_BENCH_ST_PYTHON` (default
//! `/work/venv-ref/bin/python` when it exists; else that column is skipped, saying so).
//! `SYNTH_BENCH_ONLY=embed` runs this cell alone.
//!
//! The `semantic` cell (same model): `swarm synth --all` with the model on
//! `SYNTH_BENCH_SEMANTIC_EVENTS` (default 100,000) events of the same generator, cold (an
//! empty vector cache) and warm (the same events in a second data dir, with the cold
//! run's vector cache copied in): events/s and peak RSS of each.
//! `SYNTH_BENCH_ONLY=semantic` runs this cell alone; `SYNTH_BENCH_KEEP=1` keeps its two
//! data dirs and prints where.

/// The allocator of the `swarm` binary (bins/swarm.rs), so the cells measure what a user
/// runs (glibc's malloc returned the model's per-batch buffers to the kernel and faulted
/// them back in: a fifth of the embedding cell's time).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::process::Command;
use std::time::Instant;

use serde_json::Value;
use swarm_memory::{Durability, EventType, NewEvent, Store};

const SWARM: &str = env!("CARGO_BIN_EXE_swarm");

/// Claim `x` of 20,000: one of 40 topics (8 measures x 5 zones) about one of 500
/// services, with its value; `wording` 0/1 differ only in case and punctuation (exact
/// duplicates), 2 puts the zone first (a near duplicate); `contradict` changes the value
/// (an incompatible claim on the same topic).
fn claim(x: u64, wording: u64, contradict: bool) -> (String, String) {
    let subject = format!("svc-{}", x % 500);
    let t = (x / 500) % 40;
    let zone = format!("zone-{}", t / 8);
    let mut v = 10 + (x * 7919) % 90;
    if contradict {
        v += 1000;
    }
    let measure = match t % 8 {
        0 => format!("p99 latency is {v} ms"),
        1 => format!("error rate is {v}%"),
        2 => format!("connection pool uses {v} of 2000 connections"),
        3 => format!("disk usage is at {v}%"),
        4 => format!("memory limit is set to {v}Mi"),
        5 => format!("pods restarted {v} times"),
        6 => format!("runs {v} replicas"),
        _ => format!("listens on port {}", 8000 + v),
    };
    let text = match wording {
        0 => format!("{subject} {measure} in {zone}"),
        1 => format!("{} {measure} in {zone}.", subject.to_uppercase()),
        _ => format!("in {zone}, {subject} {measure}"),
    };
    (subject, text)
}

fn generate(store: &Store, runs: u64, per_run: u64, seed: u64) {
    let mut x = seed;
    let mut next = || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for r in 0..runs {
        let run = format!("inc-{r:02}");
        let mut i = 0;
        while i < per_run {
            let batch: Vec<NewEvent> = (0..1000.min(per_run - i))
                .map(|_| {
                    let n = next();
                    let agent = format!("agent-{:02}", n % 64);
                    if n % 10 == 0 {
                        return NewEvent::new(&agent, EventType::Decision, "keep investigating");
                    }
                    let (subject, text) =
                        claim((n >> 8) % 20_000, (n >> 40) % 3, (n >> 50) % 100 == 0);
                    let kind = if n % 7 == 0 {
                        EventType::Hypothesis
                    } else {
                        EventType::Evidence
                    };
                    let mut e = NewEvent::new(&agent, kind, text);
                    e.subject = Some(subject);
                    e.confidence = Some(((n >> 20) % 10) as f64 / 10.0);
                    e
                })
                .collect();
            i += batch.len() as u64;
            store
                .append_batch(&run, batch, None, Durability::None)
                .unwrap();
        }
    }
}

fn swarm(data: &std::path::Path, args: &[&str]) -> (Value, f64) {
    let t = Instant::now();
    let mut cmd = Command::new(SWARM);
    if !args.contains(&"--embed-model") {
        // The lexical cells stay lexical even where a model is installed.
        cmd.env_remove("SWARM_EMBED_MODEL");
    }
    if let Some(f) = std::env::var_os("SYNTH_BENCH_LOG") {
        cmd.env("SWARM_LOG", f);
    }
    let out = cmd
        .arg("--data-dir")
        .arg(data)
        .arg("--checkpoint-dir")
        .arg(data.with_file_name("ck"))
        .args(["--user", "bench"])
        .args(args)
        .output()
        .expect("run swarm");
    if std::env::var_os("SYNTH_BENCH_LOG").is_some() {
        eprintln!("swarm {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let secs = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "swarm {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (v, secs)
}

#[cfg(feature = "semantic")]
/// `count` findings as agents write them: the claims above in their three wordings,
/// mixed with longer sentences.
fn findings(count: usize) -> Vec<String> {
    let long = [
        "no free DB connections left: the orders service waits 30 s for a connection and then fails with HTTP 503",
        "rolled back the deploy after the error rate on the charge endpoint rose from 0.1% to 4.2%",
        "hypothesis: the retry storm comes from the mobile client, which retries every failed call 5 times without backoff",
        "confirmed: kafka consumer lag on topic orders reached 1.2M messages while the billing consumers were restarting",
    ];
    (0..count as u64)
        .map(|i| {
            if i % 5 == 4 {
                format!(
                    "{} (seen by agent-{:02} at 14:{:02})",
                    long[(i / 5 % 4) as usize],
                    i % 64,
                    i % 60
                )
            } else {
                claim(i * 7 % 20_000, i % 3, false).1
            }
        })
        .collect()
}

/// The `embed` cell: (texts/s of our model, texts/s of sentence-transformers or why not).
#[cfg(feature = "semantic")]
fn embed_cell() -> Option<(usize, f64, Result<f64, String>)> {
    use swarm_memory::embed;
    let located = embed::locate(None, std::path::Path::new("data"));
    let Some(model) = embed::load(&located).unwrap() else {
        println!(
            "embed cell skipped: {}",
            located.reason().unwrap_or_default()
        );
        return None;
    };
    let count: usize = std::env::var("SYNTH_BENCH_EMBED_TEXTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let texts = findings(count);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    model.embed(&refs[..32.min(count)]).unwrap(); // warm-up
    let t = Instant::now();
    let v = model.embed(&refs).unwrap();
    let ours = count as f64 / t.elapsed().as_secs_f64();
    assert_eq!(v.len(), count);

    let python = std::env::var("SWARM_BENCH_ST_PYTHON").ok().or_else(|| {
        let p = "/work/venv-ref/bin/python";
        std::path::Path::new(p).exists().then(|| p.to_string())
    });
    let st = match python {
        None => Err("no Python with sentence-transformers (set SWARM_BENCH_ST_PYTHON)".to_string()),
        Some(py) => {
            let dir = tempfile::tempdir().unwrap();
            let input = dir.path().join("texts.json");
            std::fs::write(&input, serde_json::to_vec(&texts).unwrap()).unwrap();
            let script = "import json, sys, time, torch\n\
                from sentence_transformers import SentenceTransformer\n\
                torch.set_num_threads(2)\n\
                m = SentenceTransformer(sys.argv[1], device='cpu')\n\
                texts = json.load(open(sys.argv[2]))\n\
                m.encode(texts[:32], batch_size=32)\n\
                t = time.perf_counter()\n\
                m.encode(texts, batch_size=32, normalize_embeddings=True)\n\
                print(len(texts) / (time.perf_counter() - t))\n";
            let out = Command::new(&py)
                .arg("-c")
                .arg(script)
                .arg(&located.path)
                .arg(&input)
                .output();
            match out {
                Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .lines()
                    .last()
                    .and_then(|l| l.parse::<f64>().ok())
                    .ok_or_else(|| "no number from the Python run".to_string()),
                Ok(o) => Err(format!(
                    "{py} failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                )),
                Err(e) => Err(format!("{py}: {e}")),
            }
        }
    };
    Some((count, ours, st))
}

#[cfg(not(feature = "semantic"))]
fn embed_cell() -> Option<(usize, f64, Result<f64, String>)> {
    println!("embed cell skipped: built without the `semantic` feature");
    None
}

fn print_embed_row(cell: &Option<(usize, f64, Result<f64, String>)>) {
    if let Some((count, ours, st)) = cell {
        match st {
            Ok(st) => println!(
                "| embed: all-MiniLM-L6-v2, {count} findings, batch 32 | {ours:.0} texts/s; sentence-transformers (PyTorch CPU, 2 threads) {st:.0} texts/s; ratio {:.2}x | >= 1x |",
                ours / st
            ),
            Err(why) => println!(
                "| embed: all-MiniLM-L6-v2, {count} findings, batch 32 | {ours:.0} texts/s; sentence-transformers column skipped: {why} | >= 1x |"
            ),
        }
    }
}

/// The `semantic` cell: `swarm synth --all` with the model over the same kind of data,
/// `SYNTH_BENCH_SEMANTIC_EVENTS` events (default 100,000): cold (an empty vector cache:
/// every distinct text goes through the model) and warm (a second data dir holding the
/// same events, with the first one's vector cache copied in: every text is a cache hit).
/// Whole-process events/s and the process's peak resident memory for each.
#[cfg(feature = "semantic")]
fn semantic_cell(base: &std::path::Path) {
    use swarm_memory::embed;
    let located = embed::locate(None, std::path::Path::new("data"));
    if let Some(why) = located.reason() {
        println!("semantic cell skipped: {why}");
        return;
    }
    let model = located.path.to_str().unwrap().to_string();
    let n: u64 = std::env::var("SYNTH_BENCH_SEMANTIC_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let runs = 10;
    let dir = tempfile::tempdir_in(base).unwrap();
    // SYNTH_BENCH_KEEP=1: keep both data dirs (to compare settings on the same data).
    let keep = std::env::var("SYNTH_BENCH_KEEP").as_deref() == Ok("1");
    let make = |name: &str| {
        let data = dir.path().join(name).join("data");
        let store = Store::open(&data)
            .unwrap()
            .with_checkpoints(dir.path().join(name).join("ck"), 0)
            .with_user("bench", true)
            .unwrap();
        generate(&store, runs, n / runs, 1);
        data
    };
    let (cold_dir, warm_dir) = (make("cold"), make("warm"));
    let args = ["synth", "--all", "--embed-model", model.as_str()];
    let (cold, cold_secs) = swarm(&cold_dir, &args);
    assert_eq!(cold["events"].as_u64(), Some(n), "{cold}");
    assert!(
        cold["semantic"].as_str().unwrap_or("").starts_with("on"),
        "{cold}"
    );
    let copied = Command::new("cp")
        .arg("-a")
        .arg(cold_dir.join(".vectors"))
        .arg(&warm_dir)
        .status()
        .unwrap();
    assert!(copied.success());
    let (warm, warm_secs) = swarm(&warm_dir, &args);
    assert_eq!(warm["facts_total"], cold["facts_total"], "{cold} {warm}");
    let mib = |v: &Value| v["peak_rss_bytes"].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64;
    println!(
        "| semantic synth, {n} events, cold (empty vector cache; {} facts) | {:.0} events/s ({:.1} s), peak RSS {:.0} MiB | RSS < 512 MiB |",
        cold["facts_total"], n as f64 / cold_secs, cold_secs, mib(&cold)
    );
    println!(
        "| semantic synth, {n} events, warm (every vector cached) | {:.0} events/s ({:.1} s), peak RSS {:.0} MiB | >= 100,000 events/s, RSS < 512 MiB |",
        n as f64 / warm_secs, warm_secs, mib(&warm)
    );
    println!(
        "{}",
        serde_json::json!({"bench": "synth-semantic", "events": n, "cold_events_per_s": n as f64 / cold_secs,
            "cold_peak_rss_mib": mib(&cold), "warm_events_per_s": n as f64 / warm_secs,
            "warm_peak_rss_mib": mib(&warm), "facts": cold["facts_total"]})
    );
    if keep {
        println!("data kept in {}", dir.keep().display());
    }
}

#[cfg(not(feature = "semantic"))]
fn semantic_cell(_: &std::path::Path) {
    println!("semantic cell skipped: built without the `semantic` feature");
}

fn main() {
    if std::env::var("SYNTH_BENCH_ONLY").as_deref() == Ok("semantic") {
        let base = std::env::current_dir().unwrap().join("target");
        std::fs::create_dir_all(&base).unwrap();
        println!();
        println!("| measure | result | target |");
        println!("|---|---:|---:|");
        semantic_cell(&base);
        return;
    }
    let embed = embed_cell();
    if std::env::var("SYNTH_BENCH_ONLY").as_deref() == Ok("embed") {
        println!();
        println!("| measure | result | target |");
        println!("|---|---:|---:|");
        print_embed_row(&embed);
        return;
    }
    let n: u64 = std::env::var("SYNTH_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let runs = 10;
    let base = std::env::current_dir().unwrap().join("target");
    std::fs::create_dir_all(&base).unwrap();
    // SYNTH_BENCH_DIR keeps the data (to profile `swarm synth` on it afterwards).
    let dir = tempfile::tempdir_in(&base).unwrap();
    let root = std::env::var_os("SYNTH_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.path().to_path_buf());
    let data = root.join("data");
    let store = Store::open(&data)
        .unwrap()
        .with_checkpoints(root.join("ck"), 0)
        .with_user("bench", true)
        .unwrap();
    let t = Instant::now();
    generate(&store, runs, n / runs, 1);
    println!(
        "generated {n} events in {runs} runs in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // The floor: reading every event once, through the same reader the synthesizer uses.
    let t = Instant::now();
    let mut scanned = 0u64;
    for r in 0..runs {
        for e in store
            .read(&format!("inc-{r:02}"), swarm_memory::ReadOptions::default())
            .unwrap()
        {
            e.unwrap();
            scanned += 1;
        }
    }
    let scan_secs = t.elapsed().as_secs_f64();
    assert_eq!(scanned, n);

    let (first, first_secs) = swarm(&data, &["synth", "--all"]);
    assert_eq!(first["events"].as_u64(), Some(n), "{first}");
    let rate = n as f64 / first_secs;
    let rss = first["peak_rss_bytes"].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64;
    let (again, again_secs) = swarm(&data, &["synth", "--all"]);
    if std::env::var_os("SYNTH_BENCH_DEBUG").is_some() {
        let (again2, again2_secs) = swarm(&data, &["synth", "--all"]);
        eprintln!(
            "re-run 2: {} ms inside, {:.0} ms wall",
            again2["elapsed_ms"],
            again2_secs * 1e3
        );
    }
    assert_eq!(again["nothing_new"], Value::Bool(true), "{again}");
    generate(&store, 1, 10_000, 2);
    let _ = Command::new("sync").status();
    let (incr, incr_secs) = swarm(&data, &["synth", "--all"]);
    assert_eq!(incr["events"].as_u64(), Some(10_000), "{incr}");
    let (facts, facts_secs) = swarm(&data, &["facts"]);
    let nfacts = facts["facts"].as_array().map_or(0, Vec::len);

    println!();
    println!("| measure ({n} events, {runs} runs) | result | target |");
    println!("|---|---:|---:|");
    println!(
        "| `swarm synth --all`, first run (whole process) | {:.0} events/s ({:.2} s) | >= 200,000 events/s |",
        rate, first_secs
    );
    println!(
        "| plain scan of the same events (library read, no synthesis) | {:.0} events/s ({:.2} s); synth ÷ scan = {:.2} | |",
        n as f64 / scan_secs,
        scan_secs,
        rate / (n as f64 / scan_secs)
    );
    println!("| peak resident memory of the synth process | {rss:.0} MiB | < 256 MiB |");
    print_embed_row(&embed);
    semantic_cell(&base);
    println!(
        "| re-run with nothing new (whole process; inside the synth: {} ms) | {:.0} ms | < 1 s |",
        again["elapsed_ms"],
        again_secs * 1e3
    );
    println!(
        "| incremental run after 10,000 new events | {:.0} ms | |",
        incr_secs * 1e3
    );
    println!(
        "| facts: {} new, {} exact + {} near matches, {} passes; `swarm facts` lists {nfacts} current facts in {:.0} ms | | |",
        first["facts_new"], first["matched_exact"], first["matched_near"], first["passes"], facts_secs * 1e3
    );
    println!(
        "{}",
        serde_json::json!({"bench": "synth", "events": n, "events_per_s": rate, "scan_events_per_s": n as f64 / scan_secs,
            "peak_rss_mib": rss, "rerun_nothing_new_ms": again_secs * 1e3, "incremental_10k_ms": incr_secs * 1e3,
            "facts": first["facts_total"], "passes": first["passes"]})
    );
}
