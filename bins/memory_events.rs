//! `swarm memory-events`: seed 002's memory events of the user's runs as NDJSON, derived
//! from the log (`swarm_memory::synth::memory_events`).

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use swarm_memory::store::travel::AgentFilter;
use swarm_memory::synth::memory_events::derive;
use swarm_memory::{Event, Store, TailOptions};

use crate::scratch::invalid;

/// Arguments of `swarm memory-events`.
#[derive(Args)]
pub struct MemoryEventsArgs {
    /// Only this run (default: every run of --user, one after the other).
    #[arg(long)]
    pub(crate) run: Option<String>,
    /// Keep running and print the memory events of new appends (needs --run).
    #[arg(long)]
    pub(crate) follow: bool,
    /// First seq of the run to derive from (with --run).
    #[arg(long)]
    pub(crate) from_seq: Option<u64>,
    /// Derive from what this agent is shown: the run's policy filters the events (a
    /// policy appended while following applies from there on). Through SWARM_URL, the
    /// agent the read is made as (needed when the token acts as several).
    #[arg(long)]
    pub(crate) as_agent: Option<String>,
}

fn print(out: &mut impl Write, e: &Event) -> anyhow::Result<()> {
    for m in derive(e) {
        serde_json::to_writer(&mut *out, &m)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

pub fn memory_events(store: &Store, a: MemoryEventsArgs) -> anyhow::Result<ExitCode> {
    if a.run.is_none() && (a.follow || a.from_seq.is_some()) {
        bail!(invalid("run", "--follow and --from-seq need --run"));
    }
    let every = a.run.is_none();
    let runs = match a.run {
        Some(r) => vec![r],
        None => store.run_ids()?,
    };
    let out = io::stdout();
    let mut out = out.lock();
    for run in runs {
        let opts = TailOptions {
            from_seq: a.from_seq,
            follow: a.follow,
            ..TailOptions::default()
        };
        // The engine's own logs are no agent's to read (named, they are not found).
        if every && a.as_agent.is_some() && run.starts_with('@') {
            continue;
        }
        let mut filter = match &a.as_agent {
            Some(agent) => Some(AgentFilter::new(store, &run, agent)?),
            None => None,
        };
        let mut t = store.tail(&run, opts)?;
        for e in t.by_ref() {
            let e = e?;
            if let Some(f) = filter.as_mut() {
                if !f.shows(store, &e)? {
                    continue;
                }
            }
            print(&mut out, &e)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
