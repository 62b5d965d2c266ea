//! Scratchpad subcommands: policy, channels, board, pick, resolve, escalations.

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::Value;
use swarm_memory::fold::rules::{ChannelDecl, ChannelKind, ConflictPolicy, Policy};
use swarm_memory::{Error, ReadOptions, Store};

pub(crate) fn invalid(field: &str, reason: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Error::Invalid {
        field: field.into(),
        reason: reason.into(),
    })
}

pub(crate) fn print_json(v: &impl Serialize) -> anyhow::Result<ExitCode> {
    let out = io::stdout();
    let mut out = out.lock();
    serde_json::to_writer(&mut out, v)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Exit code when a write was stored but its acknowledgement could not be written
/// (stdout closed or full): the caller must not retry it as if it had failed.
pub(crate) const EXIT_ACK_LOST: u8 = 7;

/// Prints `v`, the acknowledgement of a stored write (`what` names it), as one JSON line.
/// The write already happened: a stdout failure is [`EXIT_ACK_LOST`] with `what` on
/// stderr, never exit 1 (which tells a script to retry) and never a panic.
pub(crate) fn print_ack(v: &impl Serialize, what: &str) -> ExitCode {
    let written = (|| -> io::Result<()> {
        let mut out = io::stdout().lock();
        serde_json::to_writer(&mut out, v)?;
        out.write_all(b"\n")?;
        out.flush()
    })();
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("swarm: {what}, but the acknowledgement could not be written: {e}");
            ExitCode::from(EXIT_ACK_LOST)
        }
    }
}

/// `swarm policy ...`
#[derive(Subcommand)]
pub enum PolicyCmd {
    /// Set the run's policy from a JSON file (or - for stdin).
    ///
    /// Example policy:
    ///   {"permissions": {
    ///      "researcher": {"read_channels": ["research"], "write_channels": ["research"],
    ///                     "read_types": ["*"], "write_types": ["evidence", "hypothesis"]},
    ///      "lead": {"read_channels": ["*"], "write_channels": ["*"], "read_types": ["*"],
    ///               "write_types": ["*"], "admin": true}},
    ///    "prune_max_entries": 200}
    /// Agents not listed get the "*" entry, or nothing if there is none.
    #[command(verbatim_doc_comment)]
    Set {
        /// The run.
        #[arg(long)]
        run: String,
        /// The agent setting it (must be admin to replace a policy).
        #[arg(long)]
        agent: String,
        /// JSON file with the policy, - for stdin.
        #[arg(long)]
        file: String,
    },
    /// Print the run's current policy.
    Show {
        /// The run.
        #[arg(long)]
        run: String,
    },
}

/// `swarm channel ...`
#[derive(Subcommand)]
pub enum ChannelCmd {
    /// Declare a channel: append (a list), replace (last value wins) or merge (JSON merge
    /// patch, RFC 7396), with a size limit and a conflict policy.
    ///
    /// Example:
    ///   swarm channel declare --run inc-42 --agent lead --channel analysis --kind replace --on-conflict reject --max-size-kb 100
    #[command(verbatim_doc_comment)]
    Declare {
        /// The run.
        #[arg(long)]
        run: String,
        /// The declaring agent.
        #[arg(long)]
        agent: String,
        /// Channel name.
        #[arg(long)]
        channel: String,
        /// append, replace or merge.
        #[arg(long)]
        kind: String,
        /// last_write_wins, merge or reject (writes must carry --base-version).
        #[arg(long, default_value = "last_write_wins")]
        on_conflict: String,
        /// Largest value in KiB.
        #[arg(long, default_value_t = 100)]
        max_size_kb: u64,
    },
    /// Write to a channel. The value is JSON (a bare word is taken as a string).
    ///
    /// With --base-version (the version you read), a stale write is a conflict: refused
    /// with exit 4 on `reject` channels, recorded (and merged or overwritten) otherwise.
    ///
    /// Example:
    ///   swarm channel write --run inc-42 --agent analyst --channel analysis --value '{"cause":"pool"}' --base-version 12
    #[command(verbatim_doc_comment)]
    Write {
        /// The run.
        #[arg(long)]
        run: String,
        /// The writing agent.
        #[arg(long)]
        agent: String,
        /// Channel name.
        #[arg(long)]
        channel: String,
        /// The value (JSON).
        #[arg(long)]
        value: String,
        /// The channel version the write is based on.
        #[arg(long)]
        base_version: Option<u64>,
        /// Idempotency id: a retry with the same id (after a lost answer) returns the
        /// stored write instead of a conflict with its own version; the same id with
        /// another write is a conflict (exit 4).
        #[arg(long)]
        id: Option<String>,
    },
    /// Print a channel's value and version.
    Read {
        /// The run.
        #[arg(long)]
        run: String,
        /// Channel name.
        #[arg(long)]
        channel: String,
        /// Read as this agent (its permissions apply).
        #[arg(long)]
        agent: Option<String>,
    },
    /// Print a channel's writes and conflicts as NDJSON.
    History {
        /// The run.
        #[arg(long)]
        run: String,
        /// Channel name.
        #[arg(long)]
        channel: String,
        /// Read as this agent.
        #[arg(long)]
        agent: Option<String>,
    },
    /// List the run's channels.
    List {
        /// The run.
        #[arg(long)]
        run: String,
        /// Read as this agent.
        #[arg(long)]
        agent: Option<String>,
    },
}

/// Arguments of `swarm board`.
#[derive(Args)]
pub struct BoardArgs {
    /// The run.
    #[arg(long)]
    pub(crate) run: String,
    /// Only this subject.
    #[arg(long)]
    pub(crate) subject: Option<String>,
    /// Read as this agent.
    #[arg(long)]
    pub(crate) agent: Option<String>,
    /// List every seq of each subject's history (default: the 16 most recent; `writes`
    /// counts them all).
    #[arg(long)]
    pub(crate) history: bool,
}

/// Arguments of `swarm pick`.
#[derive(Args)]
pub struct PickArgs {
    /// The run.
    #[arg(long)]
    pub(crate) run: String,
    /// The subject with competing hypotheses.
    #[arg(long)]
    pub(crate) subject: String,
    /// The agent id the decision is written as.
    #[arg(long, default_value = "orchestrator")]
    pub(crate) agent: String,
}

/// Arguments of `swarm resolve`.
#[derive(Args)]
pub struct ResolveArgs {
    /// The run.
    #[arg(long)]
    pub(crate) run: String,
    /// Seq of the escalation.
    #[arg(long)]
    pub(crate) escalation: u64,
    /// The escalated entry that stands (optional).
    #[arg(long)]
    pub(crate) winner: Option<u64>,
    /// Who resolves it.
    #[arg(long, default_value = "human")]
    pub(crate) by: String,
    /// Why.
    #[arg(long)]
    pub(crate) note: String,
}

/// The policy of `policy set --file FILE` (`-`: stdin), read and checked with the CLI's
/// messages (the embedded and the remote mode alike).
pub fn read_policy(file: &str) -> anyhow::Result<Policy> {
    let text = if file == "-" {
        io::read_to_string(io::stdin())?
    } else {
        std::fs::read_to_string(file).map_err(|e| invalid("file", format!("{file}: {e}")))?
    };
    serde_json::from_str(&text).map_err(|e| invalid("policy", e.to_string()))
}

pub fn policy(store: &Store, cmd: PolicyCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCmd::Set { run, agent, file } => {
            let p = read_policy(&file)?;
            let e = store.set_policy(&run, &agent, &p)?;
            Ok(print_ack(&e, &format!("policy set as seq {}", e.seq)))
        }
        PolicyCmd::Show { run } => print_json(&store.policy(&run)?),
    }
}

/// `--kind` and `--on-conflict` of `channel declare`, with the CLI's messages (the
/// embedded and the remote mode alike).
pub fn channel_kinds(
    kind: &str,
    on_conflict: &str,
) -> anyhow::Result<(ChannelKind, ConflictPolicy)> {
    let k: ChannelKind = serde_json::from_value(Value::String(kind.to_string()))
        .map_err(|_| invalid("kind", format!("{kind:?} is not append, replace or merge")))?;
    let c: ConflictPolicy = serde_json::from_value(Value::String(on_conflict.to_string()))
        .map_err(|_| {
            invalid(
                "on-conflict",
                format!("{on_conflict:?} is not last_write_wins, merge or reject"),
            )
        })?;
    Ok((k, c))
}

pub fn channel(store: &Store, cmd: ChannelCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        ChannelCmd::Declare {
            run,
            agent,
            channel,
            kind,
            on_conflict,
            max_size_kb,
        } => {
            let (kind, on_conflict) = channel_kinds(&kind, &on_conflict)?;
            let d = ChannelDecl {
                channel,
                kind,
                on_conflict,
                max_size_kb,
            };
            let e = store.declare_channel(&run, &agent, &d)?;
            Ok(print_ack(&e, &format!("channel declared as seq {}", e.seq)))
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
            let e = store.write_channel_with_id(
                &run,
                &agent,
                &channel,
                v,
                base_version,
                id.as_deref(),
            )?;
            Ok(print_ack(&e, &format!("channel written as seq {}", e.seq)))
        }
        ChannelCmd::Read {
            run,
            channel,
            agent,
        } => {
            let c = store.channel(&run, agent.as_deref(), &channel)?;
            print_json(&serde_json::json!({
                "channel": channel, "kind": c.decl.kind, "on_conflict": c.decl.on_conflict,
                "version": c.version, "value": c.value, "writes": c.history.len(),
                "conflicts": c.conflicts.len(),
            }))
        }
        ChannelCmd::History {
            run,
            channel,
            agent,
        } => {
            let c = store.channel(&run, agent.as_deref(), &channel)?;
            let mut seqs: Vec<u64> = c.history.iter().chain(&c.conflicts).copied().collect();
            seqs.sort_unstable();
            let out = io::stdout();
            let mut out = out.lock();
            let first = seqs.first().copied().unwrap_or(1);
            let last = seqs.last().copied().unwrap_or(0);
            let opts = ReadOptions {
                from_seq: Some(first),
                to_seq: Some(last),
                reader: agent,
                ..ReadOptions::default()
            };
            for e in store.read(&run, opts)? {
                let e = e?;
                if seqs.binary_search(&e.seq).is_ok() {
                    serde_json::to_writer(&mut out, &e)?;
                    out.write_all(b"\n")?;
                }
            }
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        ChannelCmd::List { run, agent } => print_json(&store.channels(&run, agent.as_deref())?),
    }
}

pub fn board(store: &Store, a: BoardArgs) -> anyhow::Result<ExitCode> {
    let b = store.board_with(&a.run, a.agent.as_deref(), a.subject.as_deref(), a.history)?;
    let out = io::stdout();
    let mut out = out.lock();
    for e in b {
        serde_json::to_writer(&mut out, &e)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn pick(store: &Store, a: PickArgs) -> anyhow::Result<ExitCode> {
    let r = store.pick(&a.run, &a.agent, &a.subject)?;
    let what = match &r {
        swarm_memory::PickOutcome::Picked { decision, .. } => {
            format!("pick stored as seq {}", decision.seq)
        }
        swarm_memory::PickOutcome::Escalated { escalation } => {
            format!("pick escalated as seq {}", escalation.seq)
        }
    };
    let acked = print_ack(&r, &what);
    if acked != ExitCode::SUCCESS {
        return Ok(acked);
    }
    Ok(match r {
        swarm_memory::PickOutcome::Picked { .. } => ExitCode::SUCCESS,
        swarm_memory::PickOutcome::Escalated { .. } => ExitCode::from(6),
    })
}

pub fn resolve(store: &Store, a: ResolveArgs) -> anyhow::Result<ExitCode> {
    let r = store.resolve(&a.run, &a.by, a.escalation, a.winner, &a.note)?;
    Ok(print_ack(
        &r,
        &format!("resolution stored as seq {}", r.seq),
    ))
}

pub fn escalations(
    store: &Store,
    run: &str,
    all: bool,
    as_agent: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let list = store.escalations_as(run, all, as_agent)?;
    let out = io::stdout();
    let mut out = out.lock();
    for e in list {
        serde_json::to_writer(&mut out, &e)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
