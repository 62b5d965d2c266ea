//! The user's memory through `SWARM_URL`: facts, search, memory events, patterns,
//! advice, a run's metrics, and a synthesizer pass (admin tokens).

use std::io::{self, Write};
use std::process::ExitCode;

use serde_json::Value;
use swarm_memory::synth::memory_events::derive;
use swarm_memory::Ts;

use super::{each_event, follow_stream, not_remote, print_items, print_raw, run_path, Client};
use crate::memory_events::MemoryEventsArgs;
use crate::scratch::invalid;
use crate::search::SearchArgs;
use crate::synth::{FactsArgs, SynthArgs};

pub(super) fn facts(c: &Client, a: FactsArgs) -> anyhow::Result<ExitCode> {
    if let Some(id) = a.explain {
        let mut p = String::from("/v1/facts/");
        p.extend(super::url_escape(&id));
        return print_raw(&c.get_text(&p, &[("limit", a.limit.to_string())])?);
    }
    let mut q: Vec<(&str, String)> = Vec::new();
    if let Some(t) = a.as_of {
        // Checked here, with the embedded mode's message.
        if Ts::parse(&t).is_none() {
            return Err(invalid("as-of", format!("{t:?} {}", Ts::refusal(&t))));
        }
        q.push(("as_of", t));
    }
    q.extend(a.subject.map(|s| ("subject", s)));
    if a.all {
        q.push(("all", "true".into()));
    }
    let text = c.get_text("/v1/facts", &q)?;
    if !a.table {
        return print_raw(&text);
    }
    let ans: Value = serde_json::from_str(&text)?;
    let out = io::stdout();
    let mut out = out.lock();
    writeln!(
        out,
        "{:<6} {:<20} {:>5} {:>4} {:>6} {:<11} text",
        "id", "subject", "conf", "agts", "evid", "status"
    )?;
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    for f in ans["facts"].as_array().into_iter().flatten() {
        let text: String = s(&f["text"]).chars().take(80).collect();
        let line = format!(
            "{:<6} {:<20} {:>5.2} {:>4} {:>6} {:<11} {}",
            s(&f["id"]),
            f["subject"].as_str().unwrap_or("-"),
            f["confidence"].as_f64().unwrap_or_default(),
            f["agents"].as_array().map_or(0, Vec::len),
            f["evidence"].as_u64().unwrap_or_default(),
            s(&f["status"]),
            text
        );
        writeln!(out, "{}", crate::term::safe(&line))?;
    }
    for k in ans["contradictions"].as_array().into_iter().flatten() {
        let line = format!(
            "{} on {}: {} vs {} -> {} stands ({})",
            s(&k["id"]),
            s(&k["subject"]),
            s(&k["a"]),
            s(&k["b"]),
            k["winner"].as_str().unwrap_or("?"),
            k["reason"].as_str().unwrap_or("unresolved")
        );
        writeln!(out, "{}", crate::term::safe(&line))?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `search`: with the server's model and vector cache (`--embed-model` is the server's
/// `--embed-model`, not the client's).
pub(super) fn search(c: &Client, a: SearchArgs) -> anyhow::Result<ExitCode> {
    let mut q: Vec<(&str, String)> = vec![("q", a.query), ("limit", a.limit.to_string())];
    let optional = [
        ("run", a.run),
        ("agent", a.agent),
        ("type", a.kind),
        ("since", a.since),
        ("as", a.as_agent),
    ];
    q.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
    let text = c.get_text("/v1/search", &q)?;
    if a.json {
        return print_raw(&text);
    }
    let rows: Value = serde_json::from_str(&text)?;
    let out = io::stdout();
    let mut out = out.lock();
    let mode = match (rows["model"].as_str(), rows["reason"].as_str()) {
        (Some(id), _) => format!("hybrid (words and {id})"),
        (None, Some(why)) => format!("lexical ({why})"),
        (None, None) => rows["mode"].as_str().unwrap_or_default().to_string(),
    };
    let hits = rows["hits"].as_array().cloned().unwrap_or_default();
    writeln!(
        out,
        "{} hits of {} facts and {} findings; mode: {}",
        hits.len(),
        rows["facts_considered"].as_u64().unwrap_or_default(),
        rows["findings_considered"].as_u64().unwrap_or_default(),
        crate::term::safe(&mode)
    )?;
    writeln!(
        out,
        "{:>3} {:>7} {:<7} {:<20} {:<16} {:<20} text",
        "#", "score", "source", "id", "agent", "ts"
    )?;
    for (i, h) in hits.iter().enumerate() {
        let id = match (h["fact_id"].as_str(), h["run"].as_str(), h["seq"].as_u64()) {
            (Some(f), _, _) => f.to_string(),
            (None, Some(r), Some(s)) => format!("{r}#{s}"),
            _ => "-".into(),
        };
        let agent = match (h["agent"].as_str(), h["agents"].as_array()) {
            (Some(a), _) => a.to_string(),
            (None, Some(all)) => all
                .iter()
                .map(|a| a.as_str().unwrap_or_default())
                .collect::<Vec<_>>()
                .join(","),
            _ => "-".into(),
        };
        let ts = h["ts"].as_str().unwrap_or("-");
        let text: String = h["text"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take(80)
            .collect();
        let line = format!(
            "{:>3} {:>7.4} {:<7} {:<20} {:<16} {:<20} {}",
            i + 1,
            h["score"].as_f64().unwrap_or_default(),
            h["source"].as_str().unwrap_or_default(),
            id,
            agent,
            ts.get(..19).unwrap_or(ts),
            text
        );
        writeln!(out, "{}", crate::term::safe(&line))?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `memory-events`: what is there now is derived here from the run's events (read
/// through the server, as the token's agent); `--follow` is the server's memory-event
/// stream (`GET /v1/memory-events`).
pub(super) fn memory_events(c: &Client, a: MemoryEventsArgs) -> anyhow::Result<ExitCode> {
    let Some(run) = a.run else {
        if a.follow || a.from_seq.is_some() {
            return Err(invalid("run", "--follow and --from-seq need --run"));
        }
        let text = c.get_text("/v1/runs", &[])?;
        let runs: Vec<Value> = serde_json::from_str(super::member(&text, "runs")?.get())?;
        for r in runs.iter().filter_map(|r| r["run_id"].as_str()) {
            print_derived(c, r, None, a.as_agent.as_deref())?;
        }
        return Ok(ExitCode::SUCCESS);
    };
    if a.follow {
        let q: Vec<(&str, String)> = std::iter::once(("run", run))
            .chain(a.as_agent.map(|v| ("as", v)))
            .collect();
        return follow_stream(c, "/v1/memory-events", &q, a.from_seq.unwrap_or(1), true);
    }
    print_derived(c, &run, a.from_seq, a.as_agent.as_deref())?;
    Ok(ExitCode::SUCCESS)
}

fn print_derived(
    c: &Client,
    run: &str,
    from: Option<u64>,
    as_agent: Option<&str>,
) -> anyhow::Result<()> {
    let out = io::stdout();
    let mut out = out.lock();
    let q: Vec<(&str, String)> = from
        .map(|s| ("from_seq", s.to_string()))
        .into_iter()
        .chain(as_agent.map(|v| ("as", v.to_string())))
        .collect();
    each_event(c, run, &q, |e| {
        for m in derive(e) {
            serde_json::to_writer(&mut out, &m)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    })?;
    out.flush()?;
    Ok(())
}

/// `patterns` and `advise`: `GET path?key=value`, the list `list` printed as NDJSON.
pub(super) fn lookup(
    c: &Client,
    path: &str,
    (key, value): (&'static str, String),
    as_agent: Option<String>,
    list: &str,
) -> anyhow::Result<ExitCode> {
    let q: Vec<(&str, String)> = std::iter::once((key, value))
        .chain(as_agent.map(|a| ("as", a)))
        .collect();
    print_items(&c.get_text(path, &q)?, list)
}

pub(super) fn metrics(c: &Client, run: &str, json: bool) -> anyhow::Result<ExitCode> {
    let text = c.get_text(&run_path(run, "/metrics"), &[])?;
    if json {
        return print_raw(&text);
    }
    let m: swarm_memory::synth::metrics::RunMetrics = serde_json::from_str(&text)?;
    let table = swarm_memory::synth::metrics::render_table(&m);
    let out = io::stdout();
    let mut out = out.lock();
    out.write_all(crate::term::escape(&table, true).as_bytes())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `synth`: one pass of the server's synthesizer (admin tokens), with the same options,
/// semantic with the server's model. `--llm-cmd` is refused (the server never runs a
/// command a client names), and `--embed-model` (the server's model ranks).
pub(super) fn synth(c: &Client, a: SynthArgs) -> anyhow::Result<ExitCode> {
    if a.llm_cmd.is_some() {
        return Err(not_remote(
            "llm-cmd",
            "the server never runs a command a client names; run it on the data directory",
        ));
    }
    if a.embed_model.is_some() {
        return Err(not_remote(
            "embed-model",
            "the server synthesizes with its own model (`swarm serve --embed-model`)",
        ));
    }
    let mut body = serde_json::json!({
        "pass_events": a.pass_events,
        "project_ids": a.project_ids,
        "env_names": a.env_names,
        "redact_names": a.redact_names,
    });
    if !a.all && !a.runs.is_empty() {
        body["runs"] = serde_json::json!(a.runs);
    }
    if let Some(p) = &a.share_patterns {
        body["share_patterns"] = serde_json::json!(p);
    }
    let text = c.text("POST", "/v1/synth", Some(&body))?;
    // As the embedded report: through a JSON value (its members sorted).
    let v: Value = serde_json::from_str(&text)?;
    crate::scratch::print_json(&v)
}
