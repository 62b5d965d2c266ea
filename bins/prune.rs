//! `swarm prune` and `swarm context`.

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use swarm_memory::fold::summary::{Builtin, Summarizer};
use swarm_memory::scratchpad::prune::CommandSummarizer;
use swarm_memory::Store;

/// Arguments of `swarm prune`.
#[derive(Args)]
pub struct PruneArgs {
    /// The run.
    #[arg(long)]
    pub(crate) run: String,
    /// The agent id the summary is written as.
    #[arg(long, default_value = "pruner")]
    pub(crate) agent: String,
    /// External summariser: gets the events as a JSON array on stdin, prints the summary
    /// (e.g. an LLM command line). Default: the built-in extractive summariser.
    /// Its failure (start, time-out, non-zero exit, empty output) is exit 1 and leaves the
    /// run unchanged. The command line is never stored (it may hold a key): summaries
    /// name it `cmd`, or `cmd:NAME` with --summarizer-name.
    #[arg(long)]
    pub(crate) summarizer_cmd: Option<String>,
    /// The name summaries by --summarizer-cmd record (e.g. the model's name).
    #[arg(long, requires = "summarizer_cmd")]
    pub(crate) summarizer_name: Option<String>,
    /// Longest the summariser may run.
    #[arg(long, default_value_t = 60)]
    pub(crate) timeout_secs: u64,
    /// Summarise even when the policy's threshold is not crossed (or pruning is off).
    #[arg(long)]
    pub(crate) force: bool,
}

/// Arguments of `swarm context`.
#[derive(Args)]
pub struct ContextArgs {
    /// The run.
    #[arg(long)]
    pub(crate) run: String,
    /// The agent whose prompt this is (its read permissions apply).
    #[arg(long)]
    pub(crate) agent: String,
    /// Hard limit on the printed context, in bytes.
    #[arg(long)]
    pub(crate) budget_bytes: usize,
    /// Print a JSON object (items, bytes used, what was left out) instead of the text.
    #[arg(long)]
    pub(crate) json: bool,
}

pub fn prune(store: &Store, a: PruneArgs) -> anyhow::Result<ExitCode> {
    let s: Box<dyn Summarizer> = match a.summarizer_cmd {
        Some(cmd) => Box::new(CommandSummarizer {
            name: a.summarizer_name,
            cmd,
            timeout: Duration::from_secs(a.timeout_secs.max(1)),
        }),
        None => Box::new(Builtin),
    };
    Ok(match store.prune(&a.run, &a.agent, &*s, a.force)? {
        Some(e) => crate::scratch::print_ack(&e, &format!("summary stored as seq {}", e.seq)),
        None => crate::scratch::print_ack(
            &serde_json::json!({"pruned": false, "reason": "working view under the threshold (or empty)"}),
            "nothing pruned",
        ),
    })
}

pub fn context(store: &Store, a: ContextArgs) -> anyhow::Result<ExitCode> {
    let c = store.context(&a.run, &a.agent, a.budget_bytes)?;
    let out = io::stdout();
    let mut out = out.lock();
    if a.json {
        serde_json::to_writer(&mut out, &c)?;
        out.write_all(b"\n")?;
    } else {
        // Exactly the budgeted bytes: the library escaped what a terminal would
        // interpret, and each line carries its own end.
        out.write_all(c.text.as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
