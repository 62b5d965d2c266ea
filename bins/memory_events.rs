//! `swarm memory-events`: seed 002's memory events of the user's runs as NDJSON, derived
//! from the log (`swarm_memory::synth::memory_events`).

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
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
        let mut t = store.tail(&run, opts)?;
        for e in t.by_ref() {
            print(&mut out, &e?)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
