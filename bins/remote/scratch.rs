//! The scratchpad commands through `SWARM_URL`: escalations, pick, resolve, policy,
//! channels, prune. A write names its agent in the body (the token must own it).

use std::io::Read;
use std::process::ExitCode;

use serde_json::{json, Value};

use super::{member, not_remote, print_ack, print_items, print_raw, refusal, run_path, Client};
use crate::prune::PruneArgs;
use crate::scratch::{ChannelCmd, PickArgs, PolicyCmd, ResolveArgs};

pub(super) fn escalations(
    c: &Client,
    run: &str,
    all: bool,
    as_agent: Option<String>,
) -> anyhow::Result<ExitCode> {
    let q: Vec<(&str, String)> = all
        .then(|| ("all", "true".to_string()))
        .into_iter()
        .chain(as_agent.map(|a| ("as", a)))
        .collect();
    print_items(
        &c.get_text(&run_path(run, "/escalations"), &q)?,
        "escalations",
    )
}

/// `pick`: 201 with the decision, or 423 with the escalation a tie caused (exit 6, as
/// the embedded pick); a 423 problem (the subject was already escalated) is a refusal.
pub(super) fn pick(c: &Client, a: PickArgs) -> anyhow::Result<ExitCode> {
    let body = json!({"agent": a.agent, "subject": a.subject}).to_string();
    let r = c.request("POST", &run_path(&a.run, "/pick"), &[]);
    let mut answer = c.answer(r, Some(&body))?;
    let mut text = String::new();
    answer.body.read_to_string(&mut text)?;
    let outcome = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("outcome").and_then(Value::as_str).map(str::to_string));
    let escalated = match (answer.status, outcome.as_deref()) {
        (200..=299, _) => false,
        (423, Some("escalated")) => true,
        (s, _) => return Err(refusal(s, text.as_bytes())),
    };
    let acked = print_ack(&text, "pick stored")?;
    Ok(match (acked == ExitCode::SUCCESS, escalated) {
        (true, true) => ExitCode::from(6),
        _ => acked,
    })
}

pub(super) fn resolve(c: &Client, a: ResolveArgs) -> anyhow::Result<ExitCode> {
    let mut body = json!({"agent": a.by, "note": a.note});
    if let Some(w) = a.winner {
        body["winner"] = w.into();
    }
    let path = run_path(&a.run, &format!("/escalations/{}/resolve", a.escalation));
    print_ack(&c.text("POST", &path, Some(&body))?, "resolution stored")
}

pub(super) fn policy(c: &Client, cmd: PolicyCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCmd::Set { run, agent, file } => {
            // Read and checked here, as the embedded mode does (same messages).
            let p = crate::scratch::read_policy(&file)?;
            let body = json!({"agent": agent, "policy": p});
            print_ack(
                &c.text("PUT", &run_path(&run, "/policy"), Some(&body))?,
                "policy set",
            )
        }
        PolicyCmd::Show { run } => {
            let text = c.get_text(&run_path(&run, "/policy"), &[])?;
            print_raw(member(&text, "policy")?.get())
        }
    }
}

fn channel_path(run: &str, channel: &str) -> String {
    let mut p = run_path(run, "/channels/");
    p.extend(super::url_escape(channel));
    p
}

pub(super) fn channel(c: &Client, cmd: ChannelCmd) -> anyhow::Result<ExitCode> {
    let reader = |agent: Option<String>| -> Vec<(&str, String)> {
        agent.map(|a| ("as", a)).into_iter().collect()
    };
    match cmd {
        ChannelCmd::Declare {
            run,
            agent,
            channel,
            kind,
            on_conflict,
            max_size_kb,
        } => {
            // Checked here, with the embedded mode's messages.
            let (kind, on_conflict) = crate::scratch::channel_kinds(&kind, &on_conflict)?;
            let body = json!({
                "agent": agent, "channel": channel, "kind": kind,
                "on_conflict": on_conflict, "max_size_kb": max_size_kb,
            });
            print_ack(
                &c.text("POST", &run_path(&run, "/channels"), Some(&body))?,
                "channel declared",
            )
        }
        ChannelCmd::Write {
            run,
            agent,
            channel,
            value,
            base_version,
            id,
        } => {
            let v = serde_json::from_str(&value).unwrap_or(Value::String(value));
            let mut body = json!({"agent": agent, "value": v});
            if let Some(b) = base_version {
                body["base_version"] = b.into();
            }
            if let Some(id) = id {
                body["id"] = id.into();
            }
            print_ack(
                &c.text("POST", &channel_path(&run, &channel), Some(&body))?,
                "channel written",
            )
        }
        ChannelCmd::Read {
            run,
            channel,
            agent,
        } => print_raw(&c.get_text(&channel_path(&run, &channel), &reader(agent))?),
        ChannelCmd::History {
            run,
            channel,
            agent,
        } => {
            let mut q = reader(agent);
            q.push(("history", "true".into()));
            print_items(&c.get_text(&channel_path(&run, &channel), &q)?, "events")
        }
        ChannelCmd::List { run, agent } => {
            let text = c.get_text(&run_path(&run, "/channels"), &reader(agent))?;
            print_raw(member(&text, "channels")?.get())
        }
    }
}

/// `prune` with the server's built-in summariser (a summariser command would run on the
/// server: refused).
pub(super) fn prune(c: &Client, a: PruneArgs) -> anyhow::Result<ExitCode> {
    if a.summarizer_cmd.is_some() {
        return Err(not_remote(
            "summarizer-cmd",
            "the server prunes with the built-in summariser only; run it on the data directory",
        ));
    }
    let body = json!({"agent": a.agent, "force": a.force});
    let text = c.text("POST", &run_path(&a.run, "/prune"), Some(&body))?;
    let what = match serde_json::from_str::<Value>(&text)?["seq"].as_u64() {
        Some(seq) => format!("summary stored as seq {seq}"),
        None => "nothing pruned".to_string(),
    };
    print_ack(&text, &what)
}
