//! Runs through `SWARM_URL`: `runs`, `verify`, `replay` (at a seq or a time, the
//! timeline, an agent's view, a diff) and `run close|restore`.

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use serde_json::{json, Value};
use swarm_memory::Target;

use super::{each_event, member, print_ack, print_items, print_raw, run_path, Client};
use crate::run::RunCmd;
use crate::ReplayArgs;

/// The user's runs, as `GET /v1/runs` lists them.
fn run_list(c: &Client) -> anyhow::Result<Vec<Value>> {
    let text = c.get_text("/v1/runs", &[])?;
    Ok(serde_json::from_str(member(&text, "runs")?.get())?)
}

pub(super) fn runs(c: &Client, json: bool) -> anyhow::Result<ExitCode> {
    // Asked before anything is printed: a refusal leaves stdout empty.
    let text = c.get_text("/v1/runs", &[])?;
    // A damaged run is listed, and the exit code says so, as in the embedded mode.
    let list: Vec<Value> = serde_json::from_str(member(&text, "runs")?.get())?;
    let code = match list
        .iter()
        .any(|i| i.get("damaged").is_some_and(|d| !d.is_null()))
    {
        true => ExitCode::from(3),
        false => ExitCode::SUCCESS,
    };
    if json {
        print_items(&text, "runs")?;
        return Ok(code);
    }
    let out = io::stdout();
    let mut out = out.lock();
    writeln!(
        out,
        "{:<28} {:>9} {:>11} {:<27} {:<27}",
        "RUN", "EVENTS", "BYTES", "FIRST", "LAST"
    )?;
    for info in list {
        let t = |k: &str| info[k].as_str().unwrap_or("-").to_string();
        writeln!(
            out,
            "{:<28} {:>9} {:>11} {:<27} {:<27}",
            info["run_id"].as_str().unwrap_or_default(),
            info["events"].as_u64().unwrap_or_default(),
            info["bytes"].as_u64().unwrap_or_default(),
            t("first_ts"),
            t("last_ts")
        )?;
        if let Some(d) = info["damaged"].as_str() {
            writeln!(out, "  {}", crate::term::safe(d))?;
        }
    }
    out.flush()?;
    Ok(code)
}

pub(super) fn verify(c: &Client, run: Option<String>) -> anyhow::Result<ExitCode> {
    let runs = match run {
        Some(r) => vec![r],
        None => run_list(c)?
            .iter()
            .filter_map(|i| i["run_id"].as_str().map(str::to_string))
            .collect(),
    };
    let out = io::stdout();
    let mut out = out.lock();
    let mut bad = false;
    for r in runs {
        let text = c.get_text(&run_path(&r, "/verify"), &[])?;
        bad |= serde_json::from_str::<Value>(&text)?["ok"] != Value::Bool(true);
        out.write_all(text.trim().as_bytes())?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(if bad {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

/// A point as the query of `replay` (`at_seq`/`at`) or `diff` (`{prefix}_seq`/`prefix`).
fn point(
    prefix: &'static str,
    seq_key: &'static str,
    t: &Target,
    given: &str,
) -> Vec<(&'static str, String)> {
    match t {
        Target::Seq(s) => vec![(seq_key, s.to_string())],
        Target::Time(_) => vec![(prefix, given.to_string())],
        Target::Head => Vec::new(),
    }
}

pub(super) fn replay(c: &Client, a: ReplayArgs) -> anyhow::Result<ExitCode> {
    if let Some(d) = &a.diff {
        // Checked here, with the embedded mode's messages.
        let from = crate::parse_point("diff FROM", &d[0])?;
        let to = crate::parse_point("diff TO", &d[1])?;
        let mut q = point("from", "from_seq", &from, &d[0]);
        q.extend(point("to", "to_seq", &to, &d[1]));
        return print_raw(&c.get_text(&run_path(&a.run, "/diff"), &q)?);
    }
    let (target, given) = match (&a.at_seq, &a.at) {
        (Some(s), _) => (Target::Seq(*s), String::new()),
        (None, Some(t)) => (crate::parse_point("at", t)?, t.clone()),
        (None, None) => (Target::Head, String::new()),
    };
    let mut q = point("at", "at_seq", &target, &given);
    q.extend(a.agent.clone().map(|g| ("as", g)));
    let text = c.get_text(&run_path(&a.run, "/replay"), &q)?;
    if a.timeline {
        let v: Value = serde_json::from_str(&text)?;
        // The whole state (an admin token naming no agent) or an agent's view, whose
        // point is `at_seq`.
        let head = v["state"]["head_seq"]
            .as_u64()
            .or_else(|| v["view"]["at_seq"].as_u64())
            .unwrap_or_default();
        let out = io::stdout();
        let mut out = BufWriter::new(out.lock());
        writeln!(out, "timeline of run {} up to seq {}", a.run, head)?;
        if head > 0 {
            let mut q = vec![("to_seq", head.to_string())];
            q.extend(a.agent.clone().map(|g| ("as", g)));
            each_event(c, &a.run, &q, |e| {
                writeln!(out, "{}", crate::term::safe(&crate::timeline_line(e)))?;
                Ok(())
            })?;
        }
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    if a.agent.is_some() {
        return print_raw(member(&text, "view")?.get());
    }
    print_raw(&text)
}

pub(super) fn run(c: &Client, cmd: RunCmd) -> anyhow::Result<ExitCode> {
    let (text, what) = match cmd {
        RunCmd::Close { run, by } => (
            c.text(
                "POST",
                &run_path(&run, "/close"),
                Some(&json!({"agent": by})),
            )?,
            "run closed",
        ),
        RunCmd::Restore { run } => (
            c.text("POST", &run_path(&run, "/restore"), None)?,
            "run restored",
        ),
    };
    print_ack(&text, what)
}
