//! `swarm`: the command-line front end of swarm-memory. Thin over the library.

use std::io::{self, BufRead, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use serde_json::Value;
use swarm_memory::{Durability, Error, EventType, NewEvent, ReadOptions, Store, Target, Ts};

const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  1  I/O or internal error
  2  invalid input or usage (the message names the field or line)
  3  corruption found (the message names the file, byte offset and seq)
  4  precondition failed (--expect-seq did not match the run's last seq)

Logging: warnings go to stderr; set SWARM_LOG=debug (or any tracing filter) for more.";

/// Event-sourced shared memory for swarms of concurrent agents.
///
/// Every run is one append-only, CRC-framed JSONL log under the data directory. Any
/// number of agent processes may append to the same run at once: nothing acknowledged is
/// ever lost, seqs are gap-free, timestamps never go backwards.
#[derive(Parser)]
#[command(name = "swarm", version, after_help = EXIT_CODES)]
struct Cli {
    /// Directory holding one sub-directory per run.
    #[arg(long, global = true, env = "SWARM_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,
    /// Directory holding checkpoints (one sub-directory per run).
    #[arg(
        long,
        global = true,
        env = "SWARM_CHECKPOINT_DIR",
        default_value = "./checkpoints"
    )]
    checkpoint_dir: PathBuf,
    /// Write a checkpoint automatically every N events (0: never).
    #[arg(
        long,
        global = true,
        env = "SWARM_CHECKPOINT_EVERY",
        default_value_t = 10_000
    )]
    checkpoint_every: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Append one event (or, with --stdin, a stream of events and batches) to a run.
    ///
    /// Prints each stored event as one JSON line, with its seq and ts.
    ///
    /// Examples:
    ///   swarm append --run inc-42 --agent db --type evidence --content "disk 100% on db-1" --subject db-1
    ///   swarm append --run inc-42 --agent lead --type decision --content "fail over db-1" --ref 1 --expect-seq 7
    ///   printf '%s\n' '{"agent_id":"a","type":"hypothesis","content":"dns"}' | swarm append --run inc-42 --stdin
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Append(AppendArgs),
    /// Print a run's events as NDJSON, in seq order.
    ///
    /// Examples:
    ///   swarm read --run inc-42 | jq -r '.content'
    ///   swarm read --run inc-42 --agent db --type evidence --since 2026-11-22T14:00:00Z
    ///   swarm read --run inc-42 --from-seq 100 --limit 10
    ///   swarm read --run inc-42 --agent db --type evidence --last 50
    ///
    /// Filters on agent, type, subject and user, and --from-seq/--since/--last, go through
    /// the run's index (caught up and checked first; rebuilt if stale or damaged).
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Read(ReadArgs),
    /// Check every record of one run (or all runs) and print a JSON report per run.
    ///
    /// Exits 3 if any run has a corrupt record. A torn tail (a write in progress, or one
    /// cut by a crash, repaired at the next append) is reported but is not corruption.
    ///
    /// Example:
    ///   swarm verify --run inc-42 | jq '.ok, .corrupt'
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Verify {
        /// Only this run.
        #[arg(long)]
        run: Option<String>,
    },
    /// Rebuild or inspect the per-run index used by filtered reads.
    #[command(subcommand)]
    Index(IndexCmd),
    /// List the runs of the data directory.
    ///
    /// Example:
    ///   swarm runs --json | jq -r 'select(.events > 100) | .run_id'
    #[command(verbatim_doc_comment)]
    Runs {
        /// One JSON object per run instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Write a checkpoint of a run's current state (zstd, checksummed).
    ///
    /// Checkpoints make replay fast; they are also written automatically every
    /// --checkpoint-every events. The newest 3 per run are kept.
    ///
    /// Example:
    ///   swarm checkpoint --run inc-42
    #[command(verbatim_doc_comment)]
    Checkpoint {
        /// The run.
        #[arg(long)]
        run: String,
    },
    /// Reconstruct what a run knew at a point: its state, timeline, or a diff.
    ///
    /// The state comes from the nearest valid checkpoint plus the events after it, or
    /// from a full replay if no checkpoint is usable; the result is the same either way.
    ///
    /// Examples:
    ///   swarm replay --run inc-42 --at 2026-11-22T14:03:00Z | jq '.state.subjects | keys'
    ///   swarm replay --run inc-42 --at-seq 120 --timeline
    ///   swarm replay --run inc-42 --diff 2026-11-22T14:00:00Z 2026-11-22T14:05:00Z
    ///   swarm replay --run inc-42 --at-seq 50 --agent db-agent
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Replay(ReplayArgs),
    /// Run the demo: agent processes work an SRE incident together in a new run.
    ///
    /// Four agent processes append hypotheses, evidence, decisions and actions
    /// concurrently; the demo then reads the run back, verifies it and summarises it.
    Demo {
        /// Run id to use (default: demo-<time>).
        #[arg(long)]
        run: Option<String>,
    },
}

#[derive(Args)]
struct AppendArgs {
    /// The run (created on first append). 1..128 of A-Z a-z 0-9 . _ : @ -
    #[arg(long)]
    run: String,
    /// Read NDJSON from stdin: each line an event object, or a JSON array appended as one
    /// atomic batch. Each stored event is printed (and flushed) as soon as it is
    /// acknowledged. The first invalid line stops with exit 2 naming the line number.
    #[arg(long, conflicts_with_all = ["agent", "kind", "content"])]
    stdin: bool,
    /// The writing agent.
    #[arg(long, required_unless_present = "stdin")]
    agent: Option<String>,
    /// hypothesis, evidence, decision or action_taken.
    #[arg(long = "type", required_unless_present = "stdin")]
    kind: Option<String>,
    /// The entry's content, as text (see --json).
    #[arg(long, required_unless_present = "stdin")]
    content: Option<String>,
    /// Parse --content as a JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The user the run belongs to (default: anonymous).
    #[arg(long)]
    user: Option<String>,
    /// Idempotency key: a retry with the same id returns the stored event.
    #[arg(long)]
    id: Option<String>,
    /// Confidence in 0..1.
    #[arg(long)]
    confidence: Option<f64>,
    /// Seq of an earlier entry this one builds on (repeatable).
    #[arg(long = "ref")]
    refs: Vec<u64>,
    /// What the entry is about (service, port, hypothesis slot).
    #[arg(long)]
    subject: Option<String>,
    /// The agent's session id.
    #[arg(long)]
    session: Option<String>,
    /// Metadata, a JSON object (e.g. '{"tool":"kubectl"}').
    #[arg(long)]
    meta: Option<String>,
    /// Append only if the run's last seq is N (0 for a new run); else exit 4.
    #[arg(long)]
    expect_seq: Option<u64>,
    /// sync (ack after fdatasync), batch (fsync within 10 ms), none (no fsync).
    #[arg(long, default_value = "sync")]
    durability: String,
}

#[derive(Args)]
struct ReplayArgs {
    /// The run.
    #[arg(long)]
    run: String,
    /// The state right after this seq.
    #[arg(long, conflicts_with = "at")]
    at_seq: Option<u64>,
    /// The state after the last event at or before this RFC 3339 time.
    #[arg(long)]
    at: Option<String>,
    /// Print a readable timeline of the events up to the point instead of the state.
    #[arg(long, conflicts_with_all = ["diff", "agent"])]
    timeline: bool,
    /// What the swarm learned between two points (each a seq or an RFC 3339 time).
    #[arg(long, num_args = 2, value_names = ["FROM", "TO"], conflicts_with_all = ["at_seq", "at", "agent"])]
    diff: Option<Vec<String>>,
    /// What this agent had been able to see at the point, and what its peers wrote
    /// after its own last entry.
    #[arg(long)]
    agent: Option<String>,
}

#[derive(Subcommand)]
enum IndexCmd {
    /// Rebuild the index of one run (or all runs) from its log and write it; prints one
    /// JSON line of figures per run.
    ///
    /// The index is derived and rebuilt on its own when stale or damaged; this is for
    /// operators (after restoring a backup, or to pay the build cost ahead of queries).
    ///
    /// Example:
    ///   swarm index rebuild --run inc-42 | jq '.events, .elapsed_ms'
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Rebuild {
        /// Only this run.
        #[arg(long)]
        run: Option<String>,
    },
    /// Catch up the index of one run (or all runs) and print one JSON line of figures per
    /// run, including any index file found stale or damaged (and rebuilt).
    #[command(after_help = EXIT_CODES)]
    Status {
        /// Only this run.
        #[arg(long)]
        run: Option<String>,
    },
}

#[derive(Args)]
struct ReadArgs {
    /// The run.
    #[arg(long)]
    run: String,
    /// Only this agent's events.
    #[arg(long)]
    agent: Option<String>,
    /// Only this type.
    #[arg(long = "type")]
    kind: Option<String>,
    /// Only events about this subject.
    #[arg(long)]
    subject: Option<String>,
    /// Only this user's events.
    #[arg(long)]
    user: Option<String>,
    /// Only the last N matching events (still printed in seq order).
    #[arg(long)]
    last: Option<usize>,
    /// First seq.
    #[arg(long)]
    from_seq: Option<u64>,
    /// Last seq.
    #[arg(long)]
    to_seq: Option<u64>,
    /// Only events at or after this RFC 3339 time (or date).
    #[arg(long)]
    since: Option<String>,
    /// Only events at or before this RFC 3339 time (or date).
    #[arg(long)]
    until: Option<String>,
    /// At most N events.
    #[arg(long)]
    limit: Option<usize>,
    /// Skip corrupt records instead of stopping; each skip is reported on stderr.
    #[arg(long)]
    skip_corrupt: bool,
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SWARM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_target(false)
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            let code = e
                .chain()
                .find_map(|c| c.downcast_ref::<Error>())
                .map_or(1, Error::exit_code);
            let msg = format!("{e:#}");
            eprintln!("swarm: {}", msg.replace('\n', " "));
            ExitCode::from(code as u8)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let store =
        Store::open(&cli.data_dir)?.with_checkpoints(&cli.checkpoint_dir, cli.checkpoint_every);
    match cli.cmd {
        Cmd::Checkpoint { run } => {
            let bar = progress("checkpoint");
            let info = store.checkpoint(&run, bar)?;
            let out = serde_json::json!({"run": run, "checkpoint": info, "dir": store.checkpoint_dir(&run)});
            println!("{out}");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Replay(a) => replay(&store, a),
        Cmd::Append(a) => append(&store, a),
        Cmd::Read(a) => read(&store, a),
        Cmd::Verify { run } => verify(&store, run),
        Cmd::Runs { json } => runs(&store, json),
        Cmd::Index(IndexCmd::Rebuild { run }) => index_rebuild(&store, run),
        Cmd::Index(IndexCmd::Status { run }) => index_status(&store, run),
        Cmd::Demo { run } => demo(&cli.data_dir, &cli.checkpoint_dir, run),
    }
}

fn index_runs(store: &Store, run: Option<String>) -> anyhow::Result<Vec<String>> {
    Ok(match run {
        Some(r) => vec![r],
        None => store.run_ids()?,
    })
}

fn index_rebuild(store: &Store, run: Option<String>) -> anyhow::Result<ExitCode> {
    let out = io::stdout();
    let mut out = out.lock();
    for r in index_runs(store, run)? {
        let bar = io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b.set_message(format!("indexing {r}"));
            b
        });
        let stats = store
            .rebuild_index(&r, |done, total| {
                if let Some(b) = &bar {
                    b.set_length(total);
                    b.set_position(done);
                }
            })
            .with_context(|| format!("rebuilding the index of run {r:?}"))?;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        serde_json::to_writer(&mut out, &stats)?;
        out.write_all(b"\n")?;
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

fn index_status(store: &Store, run: Option<String>) -> anyhow::Result<ExitCode> {
    let out = io::stdout();
    let mut out = out.lock();
    for r in index_runs(store, run)? {
        let stats = store
            .index_stats(&r)
            .with_context(|| format!("the index of run {r:?}"))?;
        serde_json::to_writer(&mut out, &stats)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn invalid(field: &str, reason: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Error::Invalid {
        field: field.into(),
        reason: reason.into(),
    })
}

fn append(store: &Store, a: AppendArgs) -> anyhow::Result<ExitCode> {
    let durability: Durability = a.durability.parse()?;
    let out = io::stdout();
    let mut out = out.lock();
    if a.stdin {
        return append_stdin(store, &a.run, durability, &mut out);
    }
    let content = match (a.json, a.content) {
        (true, Some(c)) => serde_json::from_str::<Value>(&c)
            .map_err(|e| invalid("content", format!("not JSON: {e}")))?,
        (false, Some(c)) => Value::String(c),
        (_, None) => bail!(invalid("content", "missing")),
    };
    let meta = match a.meta {
        Some(m) => match serde_json::from_str::<Value>(&m) {
            Ok(Value::Object(o)) => Some(o),
            _ => bail!(invalid("meta", "must be a JSON object")),
        },
        None => None,
    };
    let ev = NewEvent {
        id: a.id,
        agent_id: a.agent.unwrap_or_default(),
        user_id: a.user,
        kind: a.kind.unwrap_or_default(),
        content,
        confidence: a.confidence,
        refs: a.refs,
        subject: a.subject,
        session_id: a.session,
        meta,
        expect_seq: a.expect_seq,
    };
    let stored = store.append(&a.run, ev, durability)?;
    serde_json::to_writer(&mut out, &stored)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Lines of at most this many bytes are accepted on stdin.
const STDIN_LINE_BYTES_MAX: u64 = 16 * 1024 * 1024;

fn append_stdin(
    store: &Store,
    run: &str,
    durability: Durability,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let stdin = io::stdin();
    let mut input = stdin.lock();
    let mut line = Vec::new();
    let mut n = 0u64;
    loop {
        line.clear();
        let read = io::Read::take(&mut input, STDIN_LINE_BYTES_MAX + 1)
            .read_until(b'\n', &mut line)
            .context("reading stdin")?;
        if read == 0 {
            break;
        }
        n += 1;
        if line.len() as u64 > STDIN_LINE_BYTES_MAX {
            bail!(invalid(&format!("line {n}"), "longer than 16 MiB"));
        }
        let text = line.trim_ascii();
        if text.is_empty() {
            continue;
        }
        let value: Value = serde_json::from_slice(text)
            .map_err(|e| invalid(&format!("line {n}"), format!("not JSON: {e}")))?;
        let at_line = |e: Error| -> anyhow::Error {
            match e {
                Error::Invalid { field, reason } => invalid(&format!("line {n}: {field}"), reason),
                other => anyhow::Error::new(other).context(format!("line {n}")),
            }
        };
        let parse = |v: Value| -> Result<NewEvent, anyhow::Error> {
            serde_json::from_value::<NewEvent>(v)
                .map_err(|e| invalid(&format!("line {n}"), e.to_string()))
        };
        let stored = match value {
            Value::Array(items) => {
                let evs = items
                    .into_iter()
                    .map(parse)
                    .collect::<Result<Vec<_>, _>>()?;
                let expect = evs.first().and_then(|e| e.expect_seq);
                store
                    .append_batch(run, evs, expect, durability)
                    .map_err(at_line)?
            }
            v @ Value::Object(_) => {
                vec![store.append(run, parse(v)?, durability).map_err(at_line)?]
            }
            _ => bail!(invalid(
                &format!("line {n}"),
                "must be an event object or an array of them"
            )),
        };
        for e in stored {
            serde_json::to_writer(&mut *out, &e)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_ts(field: &str, s: &Option<String>) -> anyhow::Result<Option<Ts>> {
    match s {
        None => Ok(None),
        Some(s) => Ts::parse(s)
            .map(Some)
            .ok_or_else(|| invalid(field, format!("{s:?} is not an RFC 3339 time"))),
    }
}

fn read(store: &Store, a: ReadArgs) -> anyhow::Result<ExitCode> {
    let kind = a.kind.as_deref().map(EventType::parse_client).transpose()?;
    let opts = ReadOptions {
        from_seq: a.from_seq,
        to_seq: a.to_seq,
        agent: a.agent,
        kind,
        subject: a.subject,
        user: a.user,
        since: parse_ts("since", &a.since)?,
        until: parse_ts("until", &a.until)?,
        limit: a.limit,
        last: a.last,
        skip_corrupt: a.skip_corrupt,
        ..ReadOptions::default()
    };
    let mut it = store.read(&a.run, opts)?;
    let out = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, out.lock());
    for e in &mut it {
        serde_json::to_writer(&mut out, &e?)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    for s in it.skipped() {
        eprintln!(
            "swarm: skipped corrupt bytes {}..{} of {} (expected seq {}): {}",
            s.offset,
            s.resumed_at,
            s.segment.display(),
            s.seq,
            s.reason
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn verify(store: &Store, run: Option<String>) -> anyhow::Result<ExitCode> {
    let runs = match run {
        Some(r) => vec![r],
        None => store.run_ids()?,
    };
    let out = io::stdout();
    let mut out = out.lock();
    let mut bad = false;
    for r in runs {
        let report = store.verify(&r, |_| {})?;
        bad |= !report.ok;
        serde_json::to_writer(&mut out, &report)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(if bad {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

fn runs(store: &Store, json: bool) -> anyhow::Result<ExitCode> {
    let out = io::stdout();
    let mut out = out.lock();
    let ids = store.run_ids()?;
    if !json {
        writeln!(
            out,
            "{:<28} {:>9} {:>11} {:<27} {:<27}",
            "RUN", "EVENTS", "BYTES", "FIRST", "LAST"
        )?;
    }
    for id in ids {
        let info = store.run_info(&id)?;
        if json {
            serde_json::to_writer(&mut out, &info)?;
            out.write_all(b"\n")?;
        } else {
            let t = |t: Option<Ts>| t.map_or("-".to_string(), |t| t.to_string());
            writeln!(
                out,
                "{:<28} {:>9} {:>11} {:<27} {:<27}",
                info.run_id,
                info.events,
                info.bytes,
                t(info.first_ts),
                t(info.last_ts)
            )?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The scripted incident: each agent's entries, in its own order. Later entries of the
/// lead refer to the seqs its peers' findings got, looked up by id at run time.
fn demo_script() -> Vec<(&'static str, Vec<Value>)> {
    use serde_json::json;
    let ev = |id: &str, agent: &str, kind: &str, subject: &str, content: &str, conf: f64| {
        json!({"id": id, "agent_id": agent, "type": kind, "subject": subject,
               "content": content, "confidence": conf, "session_id": format!("{agent}-s1")})
    };
    vec![
        (
            "metrics",
            vec![
                ev(
                    "m1",
                    "metrics",
                    "evidence",
                    "checkout-latency",
                    "p99 latency of checkout rose from 180 ms to 2.4 s at 14:01",
                    0.95,
                ),
                ev(
                    "m2",
                    "metrics",
                    "hypothesis",
                    "root-cause",
                    "connection pool saturation on orders-db",
                    0.7,
                ),
                ev(
                    "m3",
                    "metrics",
                    "evidence",
                    "orders-db",
                    "orders-db active connections pinned at max_connections=100",
                    0.9,
                ),
            ],
        ),
        (
            "logs",
            vec![
                ev(
                    "l1",
                    "logs",
                    "evidence",
                    "checkout",
                    "checkout pods log 'timeout acquiring connection' 3,214 times since 14:01",
                    0.9,
                ),
                ev(
                    "l2",
                    "logs",
                    "hypothesis",
                    "root-cause",
                    "deploy 2026.11.22-3 of orders-svc leaks connections",
                    0.6,
                ),
                ev(
                    "l3",
                    "logs",
                    "evidence",
                    "orders-svc",
                    "orders-svc deploy 2026.11.22-3 rolled out at 13:58",
                    0.95,
                ),
            ],
        ),
        (
            "traces",
            vec![
                ev(
                    "t1",
                    "traces",
                    "evidence",
                    "checkout",
                    "trace exemplars: 96% of checkout time spent waiting on orders-db",
                    0.85,
                ),
                ev(
                    "t2",
                    "traces",
                    "hypothesis",
                    "root-cause",
                    "orders-svc retries without closing connections after 13:58",
                    0.75,
                ),
            ],
        ),
        (
            "lead",
            vec![
                ev(
                    "d1",
                    "lead",
                    "decision",
                    "orders-svc",
                    "roll back orders-svc to 2026.11.22-2",
                    0.8,
                ),
                ev(
                    "a1",
                    "lead",
                    "action_taken",
                    "orders-svc",
                    "rolled back orders-svc; pool usage fell to 35/100 by 14:09",
                    0.9,
                ),
            ],
        ),
    ]
}

fn demo(
    data_dir: &std::path::Path,
    checkpoint_dir: &std::path::Path,
    run: Option<String>,
) -> anyhow::Result<ExitCode> {
    use std::process::{Command, Stdio};
    let run = run.unwrap_or_else(|| format!("demo-{}", Ts::now().0 / 1000));
    let exe = std::env::current_exe().context("locating the swarm binary")?;
    println!("swarm demo: run {run:?} in {}", data_dir.display());
    println!("starting 4 agent processes that append concurrently ...");
    let mut children = Vec::new();
    for (agent, entries) in demo_script() {
        let mut child = Command::new(&exe)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["append", "--run", &run, "--stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting an agent process")?;
        let mut stdin = child.stdin.take().context("agent stdin")?;
        let body: String = entries
            .iter()
            .map(|e| {
                let mut e = e.clone();
                e["id"] = Value::String(format!("{run}.{}", e["id"].as_str().unwrap_or("x")));
                format!("{e}\n")
            })
            .collect();
        std::thread::spawn(move || {
            let _ = stdin.write_all(body.as_bytes());
        });
        children.push((agent, child));
    }
    for (agent, child) in children {
        let out = child.wait_with_output().context("waiting for an agent")?;
        if !out.status.success() {
            bail!("agent {agent} failed with {}", out.status);
        }
        let n = out
            .stdout
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        println!("  agent {agent:<8} appended {n} entries (pid-separate process, sync durability)");
    }
    let store = Store::open(data_dir)?.with_checkpoints(checkpoint_dir, 10_000);
    let events: Vec<_> = store
        .read(&run, ReadOptions::default())?
        .collect::<Result<_, _>>()?;
    println!("\nthe run, read back in seq order:");
    for e in &events {
        let content = e
            .content
            .as_str()
            .map_or_else(|| e.content.to_string(), str::to_string);
        println!(
            "  #{:<3} {}  {:<8} {:<12} [{}] {}",
            e.seq,
            &e.ts.to_string()[11..23],
            e.agent_id,
            e.kind.as_str(),
            e.subject.as_deref().unwrap_or("-"),
            content
        );
    }
    let report = store.verify(&run, |_| {})?;
    println!(
        "\nverify: ok={} records={} frames={} bytes={} corrupt={}",
        report.ok,
        report.records,
        report.frames,
        report.bytes,
        report.corrupt.len()
    );
    let count = |k: EventType| events.iter().filter(|e| e.kind == k).count();
    println!(
        "summary: {} hypotheses, {} evidence, {} decisions, {} actions from {} agents; seqs 1..{} gap-free",
        count(EventType::Hypothesis),
        count(EventType::Evidence),
        count(EventType::Decision),
        count(EventType::ActionTaken),
        {
            let mut a: Vec<_> = events.iter().map(|e| e.agent_id.as_str()).collect();
            a.sort();
            a.dedup();
            a.len()
        },
        events.len()
    );
    if io::stdout().is_terminal() {
        println!("\nnext: swarm read --run {run} | jq .   |   swarm verify --run {run}");
    }
    if !report.ok {
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// A progress callback: an indicatif bar on a terminal, nothing when stderr is piped.
fn progress(label: &'static str) -> impl FnMut(u64) {
    let bar = io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} {pos} events ({per_sec})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        b.set_message(label);
        b
    });
    move |n| {
        if let Some(b) = &bar {
            b.set_position(n);
        }
    }
}

/// A point given as a seq (digits) or an RFC 3339 time.
fn parse_point(field: &str, s: &str) -> anyhow::Result<Target> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(Target::Seq(
            s.parse().map_err(|_| invalid(field, "seq out of range"))?,
        ));
    }
    Ts::parse(s).map(Target::Time).ok_or_else(|| {
        invalid(
            field,
            format!("{s:?} is neither a seq nor an RFC 3339 time"),
        )
    })
}

fn clip(v: &Value, max: usize) -> String {
    let s = v.as_str().map_or_else(|| v.to_string(), str::to_string);
    let s = s.replace('\n', " ");
    if s.chars().count() <= max {
        return s;
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

fn timeline_line(e: &swarm_memory::Event) -> String {
    let refs = if e.refs.is_empty() {
        String::new()
    } else {
        let r: Vec<String> = e.refs.iter().map(|r| format!("#{r}")).collect();
        format!("  <- builds on {}", r.join(" "))
    };
    let ts = e.ts.to_string();
    format!(
        "{} {}  #{:<5} {:<10} {:<12} [{}] {}{}",
        &ts[..10],
        &ts[11..23],
        e.seq,
        e.agent_id,
        e.kind.as_str(),
        e.subject.as_deref().unwrap_or("-"),
        clip(&e.content, 80),
        refs
    )
}

fn replay(store: &Store, a: ReplayArgs) -> anyhow::Result<ExitCode> {
    let out = io::stdout();
    let mut out = BufWriter::new(out.lock());
    if let Some(d) = &a.diff {
        let (from, to) = (
            parse_point("diff FROM", &d[0])?,
            parse_point("diff TO", &d[1])?,
        );
        let sa = store.state_at(&a.run, from, |_| {})?;
        let sb = store.state_at(&a.run, to, |_| {})?;
        let diff = swarm_memory::replay::diff(&sa.state, &sb.state, store, &a.run)?;
        serde_json::to_writer(&mut out, &diff)?;
        out.write_all(b"\n")?;
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    let target = match (&a.at_seq, &a.at) {
        (Some(s), _) => Target::Seq(*s),
        (None, Some(t)) => parse_point("at", t)?,
        (None, None) => Target::Head,
    };
    let bar = progress("replay");
    let r = store.state_at(&a.run, target, bar)?;
    if a.timeline {
        let it = store.read(
            &a.run,
            ReadOptions {
                to_seq: Some(r.state.head_seq),
                ..ReadOptions::default()
            },
        )?;
        writeln!(
            out,
            "timeline of run {} up to seq {}",
            a.run, r.state.head_seq
        )?;
        for e in it {
            writeln!(out, "{}", timeline_line(&e?))?;
        }
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(agent) = &a.agent {
        let view = swarm_memory::replay::agent_view(&r.state, agent, store, &a.run)?;
        serde_json::to_writer(&mut out, &view)?;
        out.write_all(b"\n")?;
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    serde_json::to_writer(
        &mut out,
        &serde_json::json!({"replay": r.stats, "state": r.state}),
    )?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
