//! `swarm synth|facts|patterns|advise|metrics|quality`: the synthesizer and its results.

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use swarm_memory::synth::dedup::DedupConfig;
use swarm_memory::synth::{metrics, quality, FactsQuery, LlmOptions, SynthOptions};
use swarm_memory::{Store, Ts};

use crate::scratch::{invalid, print_json};

/// The labelled fixture, built in so `swarm quality` works from any directory.
const FIXTURE: &str = include_str!("../data/fixtures/synth-quality.jsonl");

/// Peak resident memory of this process (Linux `VmHWM`), in bytes.
fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[derive(Args)]
pub struct SynthArgs {
    /// Synthesize only this run (repeatable).
    #[arg(long = "run", conflicts_with = "all")]
    pub(crate) runs: Vec<String>,
    /// Synthesize every run of the user (the default when no --run is given).
    #[arg(long)]
    pub(crate) all: bool,
    /// Optional LLM step: a command (run with sh -c) that gets each borderline pair as
    /// JSON on stdin ({"question","scope","a","b","score"}) and prints {"same": true|false}.
    /// Failures and time-outs fall back to the deterministic answer.
    #[arg(long)]
    pub(crate) llm_cmd: Option<String>,
    /// Longest one LLM call may take.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) llm_timeout_ms: u64,
    /// Most LLM calls in one synth.
    #[arg(long, default_value_t = 200)]
    pub(crate) llm_calls_max: u64,
    /// A project id the sanitizer must redact from shared patterns (repeatable).
    #[arg(long = "project-id")]
    pub(crate) project_ids: Vec<String>,
    /// An environment name (cluster, host) the sanitizer must redact (repeatable).
    #[arg(long = "env-name")]
    pub(crate) env_names: Vec<String>,
    /// A person's name the sanitizer must redact from shared patterns (repeatable; also
    /// `redact_names` in DATA_DIR/USER/settings.json).
    #[arg(long = "redact-name")]
    pub(crate) redact_names: Vec<String>,
    /// What this synth copies to the shared scope, overriding the user's setting
    /// (`share_patterns` in DATA_DIR/USER/settings.json, default structured):
    /// off (nothing), structured (slugs and categories, no free text), sanitized
    /// (structured fields plus sanitized free text).
    #[arg(long, value_parser = ["off", "structured", "sanitized"])]
    pub(crate) share_patterns: Option<String>,
    /// Source events per atomic pass (bounds memory and the work a crash loses).
    #[arg(long, default_value_t = swarm_memory::synth::PASS_EVENTS_MAX_DEFAULT)]
    pub(crate) pass_events: u64,
    /// The sentence-embedding model directory for the semantic mode (else
    /// SWARM_EMBED_MODEL, else DATA_DIR/.models/all-MiniLM-L6-v2, where `swarm model
    /// fetch` puts it). Without one the synthesis is lexical and the report says why.
    #[arg(long, value_name = "DIR")]
    pub(crate) embed_model: Option<std::path::PathBuf>,
}

pub fn synth(store: &Store, data_dir: &std::path::Path, a: SynthArgs) -> anyhow::Result<ExitCode> {
    let model = crate::search::cached_model(a.embed_model.as_deref(), data_dir, store.user())?;
    if model.embedder.is_none() {
        eprintln!(
            "semantic: off ({}); facts are matched lexically within subjects",
            model.reason
        );
    }
    let opts = SynthOptions {
        // --all, or no --run at all: every run of the user.
        runs: (!a.all && !a.runs.is_empty()).then_some(a.runs),
        dedup: DedupConfig::default(),
        llm: a.llm_cmd.map(|cmd| LlmOptions {
            cmd,
            timeout: Duration::from_millis(a.llm_timeout_ms),
            calls_max: a.llm_calls_max,
        }),
        pass_events_max: a.pass_events.max(1),
        project_ids: a.project_ids,
        env_names: a.env_names,
        redact_names: a.redact_names,
        share_patterns: a.share_patterns.as_deref().map(str::parse).transpose()?,
        embedder: model.embedder,
        no_model_reason: model.reason,
    };
    let bar = io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_style(
            indicatif::ProgressStyle::with_template("synth {spinner} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        b
    });
    let report = store.synth(&opts, |p| {
        if let Some(b) = &bar {
            b.set_message(format!(
                "{}: {} events read, {} passes committed",
                p.run, p.events, p.passes
            ));
            b.tick();
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut v = serde_json::to_value(&report)?;
    if let (Some(o), Some(rss)) = (v.as_object_mut(), peak_rss_bytes()) {
        o.insert("peak_rss_bytes".into(), rss.into());
    }
    let code = print_json(&v)?;
    // Every run was synthesized; damaged records skipped in one make the exit code 3.
    Ok(match report.runs.iter().any(|r| !r.damaged.is_empty()) {
        true => ExitCode::from(3),
        false => code,
    })
}

#[derive(Args)]
pub struct FactsArgs {
    /// Only facts about this subject.
    #[arg(long)]
    pub(crate) subject: Option<String>,
    /// The full evidence chain of one fact (e.g. F12), back to the raw events (JSON).
    #[arg(long, conflicts_with_all = ["subject", "as_of", "all", "table"])]
    pub(crate) explain: Option<String>,
    /// With --explain: at most this many raw events (the total is always given).
    #[arg(long, default_value_t = 50)]
    pub(crate) limit: usize,
    /// The facts as they stood at this time (RFC 3339): evidence, contradictions and
    /// resolutions up to it.
    #[arg(long)]
    pub(crate) as_of: Option<String>,
    /// Superseded facts too.
    #[arg(long)]
    pub(crate) all: bool,
    /// A readable table instead of JSON.
    #[arg(long)]
    pub(crate) table: bool,
}

pub fn facts(store: &Store, a: FactsArgs) -> anyhow::Result<ExitCode> {
    if let Some(id) = a.explain {
        let e = store.explain_fact(&id, a.limit)?;
        return print_json(&e);
    }
    let as_of = match a.as_of {
        Some(t) => Some(
            Ts::parse(&t).ok_or_else(|| invalid("as-of", format!("{t:?} {}", Ts::refusal(&t))))?,
        ),
        None => None,
    };
    let ans = store.facts(&FactsQuery {
        subject: a.subject,
        as_of,
        include_superseded: a.all,
        reader: None,
    })?;
    if !a.table {
        return print_json(&ans);
    }
    let out = io::stdout();
    let mut out = out.lock();
    writeln!(
        out,
        "{:<6} {:<20} {:>5} {:>4} {:>6} {:<11} text",
        "id", "subject", "conf", "agts", "evid", "status"
    )?;
    for f in &ans.facts {
        let text: String = f.text.chars().take(80).collect();
        let line = format!(
            "{:<6} {:<20} {:>5.2} {:>4} {:>6} {:<11} {}",
            f.id,
            f.subject.as_deref().unwrap_or("-"),
            f.confidence,
            f.agents.len(),
            f.evidence,
            f.status,
            text
        );
        writeln!(out, "{}", crate::term::safe(&line))?;
    }
    for c in &ans.contradictions {
        let line = format!(
            "{} on {}: {} vs {} -> {} stands ({})",
            c.id,
            c.subject,
            c.a,
            c.b,
            c.winner.as_deref().unwrap_or("?"),
            c.reason.as_deref().unwrap_or("unresolved")
        );
        writeln!(out, "{}", crate::term::safe(&line))?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn patterns(store: &Store, symptom: &str, as_agent: Option<&str>) -> anyhow::Result<ExitCode> {
    let out = io::stdout();
    let mut out = out.lock();
    for p in store.patterns_as(symptom, as_agent)? {
        serde_json::to_writer(&mut out, &p)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn advise(store: &Store, tool: &str, as_agent: Option<&str>) -> anyhow::Result<ExitCode> {
    let out = io::stdout();
    let mut out = out.lock();
    for m in store.advise_as(tool, as_agent)? {
        serde_json::to_writer(&mut out, &m)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn metrics(store: &Store, run: &str, json: bool) -> anyhow::Result<ExitCode> {
    let m = store.metrics(run, &DedupConfig::default())?;
    if json {
        return print_json(&m);
    }
    let out = io::stdout();
    let mut out = out.lock();
    out.write_all(crate::term::escape(&metrics::render_table(&m), true).as_bytes())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `swarm quality --set FILE`: the synthesizer end to end on a labelled set.
pub fn quality_set(
    set: &std::path::Path,
    json: bool,
    model: &crate::search::Model,
    llm: Option<LlmOptions>,
) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(set)
        .map_err(|e| invalid("set", format!("{}: {e}", set.display())))?;
    let mut opts = SynthOptions {
        embedder: model.embedder.clone(),
        no_model_reason: model.reason.clone(),
        llm,
        ..SynthOptions::default()
    };
    // A tuning aid: the semantic mode's thresholds as JSON (see SemanticConfig).
    if let Ok(j) = std::env::var("SWARM_SEMANTIC_CONFIG") {
        opts.dedup.semantic = serde_json::from_str(&j)
            .map_err(|e| invalid("SWARM_SEMANTIC_CONFIG", e.to_string()))?;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let root = std::env::temp_dir().join(format!("swarm-eval-{}-{nanos}", std::process::id()));
    // Behind a vector cache (in the temporary data dir): the search embeds the same
    // candidates for every question.
    if let Some(m) = opts.embedder.take() {
        let cached = swarm_memory::embed::cache::Cached::open(m, &root.join(".vectors"))?;
        opts.embedder = Some(std::sync::Arc::new(cached));
    }
    let r = swarm_memory::synth::eval::evaluate_set(&text, &root, &opts, opts.embedder.as_deref());
    let _ = std::fs::remove_dir_all(&root);
    let r = r?;
    if json {
        return print_json(&r);
    }
    let out = io::stdout();
    let mut out = out.lock();
    let rows = [
        ("events / users", format!("{} / {}", r.events, r.users)),
        (
            "facts labelled / made",
            format!("{} / {}", r.facts_labelled, r.facts_made),
        ),
        (
            "pair precision",
            format!(
                "{:.3} ({} of {})",
                r.pair_precision, r.correct_pairs, r.predicted_pairs
            ),
        ),
        (
            "pair recall",
            format!(
                "{:.3} ({} of {})",
                r.pair_recall, r.correct_pairs, r.true_pairs
            ),
        ),
        (
            "hard negatives merged",
            format!("{} of {}", r.hard_negatives_merged, r.hard_negatives),
        ),
        (
            "contradiction precision",
            format!(
                "{:.3} ({} of {})",
                r.contradiction_precision, r.contradictions_correct, r.contradictions_reported
            ),
        ),
        (
            "contradiction recall",
            format!(
                "{:.3} ({} of {})",
                r.contradiction_recall, r.contradictions_found, r.contradictions_labelled
            ),
        ),
        (
            "changes flagged as contradictions",
            format!("{} of {}", r.temporal_flagged, r.temporal_changes),
        ),
        ("cross-user merges", r.cross_user_merges.to_string()),
        (
            "llm step calls (no usable answer)",
            format!("{} ({})", r.llm_calls, r.llm_fallbacks),
        ),
        (
            "search mode",
            match &r.search_model {
                Some(id) => format!("hybrid ({id})"),
                None => format!("lexical ({})", model.reason),
            },
        ),
        (
            "search top-1",
            format!(
                "{:.3} ({} of {})",
                r.search_top1_rate, r.search_top1, r.search_queries
            ),
        ),
        (
            "search top-3",
            format!(
                "{:.3} ({} of {})",
                r.search_top3_rate, r.search_top3, r.search_queries
            ),
        ),
        (
            "search hits of another user",
            r.search_foreign_hits.to_string(),
        ),
    ];
    for (k, v) in rows {
        writeln!(out, "{k:<34} {v}")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn quality(fixture: Option<PathBuf>, json: bool) -> anyhow::Result<ExitCode> {
    let text = match &fixture {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| invalid("fixture", format!("{}: {e}", p.display())))?,
        None => FIXTURE.to_string(),
    };
    let r = quality::evaluate(&text, &DedupConfig::default())?;
    if json {
        return print_json(&r);
    }
    let out = io::stdout();
    let mut out = out.lock();
    writeln!(
        out,
        "{:<8} {:>8} {:>6} {:>9} {:>7} {:>13} {:>10}",
        "part", "findings", "facts", "precision", "recall", "contra. prec.", "contra. rec."
    )?;
    for p in &r.parts {
        writeln!(
            out,
            "{:<8} {:>8} {:>6} {:>9.3} {:>7.3} {:>13.3} {:>10.3}",
            p.part,
            p.findings,
            p.facts,
            p.precision,
            p.recall,
            p.contradiction_precision,
            p.contradiction_recall
        )?;
    }
    writeln!(
        out,
        "targets: precision >= 0.95, recall >= 0.85 (the tune part was tuned on; heldout never)"
    )?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
