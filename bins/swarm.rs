//! `swarm`: the command-line front end of swarm-memory. Thin over the library.

use std::io::{self, BufRead, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

mod demo;
#[cfg(feature = "server")]
mod http;
#[cfg(feature = "mcp")]
mod mcp;
#[cfg(all(feature = "mcp", feature = "server"))]
mod mcp_bridge;
mod memory_events;
#[cfg(feature = "semantic")]
mod model;
mod prune;
#[cfg(feature = "server")]
mod remote;
mod run;
mod scratch;
mod search;
#[cfg(feature = "server")]
mod serve;
mod synth;
mod term;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use serde::Deserialize;
use serde_json::Value;
use swarm_memory::store::travel::AgentFilter;
use swarm_memory::{
    Durability, Error, EventType, NewEvent, ReadOptions, Store, TailOptions, Target, Ts,
};

/// jemalloc rather than glibc's malloc: under `swarm serve` glibc's allocator took a fifth
/// of the server's CPU (many small, short-lived allocations per request across threads).
/// mimalloc was as fast but held 2x the memory per idle SSE subscriber. The library
/// itself leaves the choice to the program that embeds it.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  1  I/O or internal error
  2  invalid input or usage (the message names the field or line)
  3  corruption found (the message names the file, byte offset and seq)
  4  precondition failed (--expect-seq, --expect-subject-seq, a channel version, an
     --id reused with a different event: the message names the stored seq; another
     swarm synth of the same user running)
  5  forbidden (another user's run, the run's policy, a closed run)
  6  escalated: actions on the subject wait for a human (swarm resolve)
  7  written, but the acknowledgement could not be written (any command that writes;
     stderr names what was stored): do not retry with new ids

Colours: only when stderr is a terminal and NO_COLOR is unset.

Server: with SWARM_URL (and SWARM_TOKEN) set, the commands talk to that `swarm serve`
with the same flags, output and exit codes; repair, index, checkpoint, quality, model,
token and demo work on the data directory itself and refuse (exit 2); serve ignores it.

Logging: warnings go to stderr; set SWARM_LOG=debug (or any tracing filter) for more.";

/// Event-sourced shared memory for swarms of concurrent agents.
///
/// Every run is one append-only, CRC-framed JSONL log under the data directory. Any
/// number of agent processes may append to the same run at once: nothing acknowledged is
/// ever lost, seqs are gap-free, timestamps never go backwards.
#[derive(Parser)]
#[command(name = "swarm", version, after_help = EXIT_CODES)]
struct Cli {
    /// The data directory: each user's runs live in DATA_DIR/USER/RUN.
    #[arg(long, global = true, env = "SWARM_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,
    /// Directory holding checkpoints (CHECKPOINT_DIR/USER/RUN) [default: DATA_DIR/.checkpoints].
    #[arg(long, global = true, env = "SWARM_CHECKPOINT_DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// The user (tenant) to act as: every run belongs to one user, and another user's
    /// runs are invisible.
    #[arg(long, global = true, env = "SWARM_USER", default_value = "anonymous")]
    user: String,
    /// Refuse the `anonymous` user (exit 5) instead of treating it as its own partition.
    #[arg(long, global = true, env = "SWARM_DENY_ANONYMOUS")]
    deny_anonymous: bool,
    /// Cold storage for closed runs (one sub-directory per user) [default: DATA_DIR/.archive].
    #[arg(long, global = true, env = "SWARM_ARCHIVE_DIR")]
    archive_dir: Option<PathBuf>,
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
    /// Filters on agent, type and subject, and --from-seq/--since/--last, go through
    /// the run's index (caught up and checked first; rebuilt if stale or damaged).
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Read(ReadArgs),
    /// Follow a run: print its events as NDJSON from a seq (or a saved cursor) and, with
    /// --follow, every new event as soon as it is visible (durable, for sync appends).
    ///
    /// Each event is one line, flushed at once. Without --follow it prints what is
    /// visible when it starts and exits. With --cursor-file the position is saved after
    /// each printed event (temp file + rename, not fsynced), and a restarted tail resumes
    /// after the last event saved: delivery is at-least-once, and a crash re-delivers at
    /// most the one event printed last (drop it by seq: seqs only grow). Wake-ups come
    /// from inotify on the run's SYNCED file, with polling every --poll-ms as the safety
    /// net (the only mechanism with --no-notify). A run that does not exist yet is
    /// waited for when following; the data directory must exist (a misspelled one is an
    /// error, exit 1, not a wait for ever).
    ///
    /// Examples:
    ///   swarm tail --run inc-42 --follow | jq -r '"\(.seq) \(.agent_id): \(.content)"'
    ///   swarm tail --run inc-42 --follow --type decision --cursor-file ~/.lead.cursor
    ///   swarm tail --run inc-42 --from-seq 100 --agent db
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Tail(TailArgs),
    /// Check every record of one run (or all runs) and print a JSON report per run.
    ///
    /// Exits 3 if any run has a corrupt record, or lost acknowledged bytes (a segment
    /// shorter than its durable mark, damage below it: `swarm repair`). A torn tail past
    /// the durable mark (a write in progress, or one cut by a crash, repaired at the next
    /// append) is reported but is not corruption. A closed run whose archive is missing
    /// or does not read back is reported as `{"run", "ok": false, "corrupt": [], "error"}`
    /// (exit 3), and the other runs are still checked.
    ///
    /// Example:
    ///   swarm verify --run inc-42 | jq '.ok, .corrupt'
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Verify {
        /// Only this run.
        #[arg(long)]
        run: Option<String>,
    },
    /// Record lost acknowledged bytes at the end of a run's log, so appends go on.
    ///
    /// When bytes below the durable mark were damaged or lost (a bad restore, a partial
    /// copy, a disk that lost blocks), appends are refused and reads end with exit 3.
    /// Repair moves the damaged bytes aside (`<segment>.<offset>.damaged`, beside it),
    /// appends a `log_damaged` event naming the lost seqs, and goes on numbering after
    /// the highest seq any reader may have seen: no seq is ever reused. Damage that valid
    /// records follow (a flipped bit mid-segment) is not cut: it is quarantined (listed in
    /// the run's QUARANTINE file, which every read then steps over; a `log_damaged` event
    /// names its lost seqs), and nothing valid is dropped. Prints the `log_damaged`
    /// events, one a line, or `null` when nothing needed repair.
    ///
    /// Example:
    ///   swarm verify --run inc-42 || swarm repair --run inc-42
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Repair {
        /// The run.
        #[arg(long)]
        run: String,
    },
    /// Rebuild or inspect the per-run index used by filtered reads.
    #[command(subcommand)]
    Index(IndexCmd),
    /// List the runs of the data directory.
    ///
    /// Every run is listed. A run with damaged records met while reading its first and
    /// last events is listed with where the damage is (JSON: "damaged"), and the exit
    /// code is 3; `swarm verify --run R` checks every record.
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
    /// Set or show the run's policy (permissions per agent, pruning threshold).
    #[command(subcommand)]
    Policy(scratch::PolicyCmd),
    /// Declare, write, read and inspect channels (append / replace / merge).
    #[command(subcommand)]
    Channel(scratch::ChannelCmd),
    /// The board: each subject's authoritative (latest) entry, version, evidence, number
    /// of writes and its 16 latest seqs (--history: all of them).
    ///
    /// Use a subject's version as --expect-subject-seq to append only if nobody else
    /// wrote on it since you read it.
    ///
    /// Example:
    ///   swarm board --run inc-42 --subject orders-db | jq '.version, .value.content'
    #[command(verbatim_doc_comment)]
    Board(scratch::BoardArgs),
    /// Pick between competing hypotheses on a subject (confidence, then supporting
    /// evidence, then recency); appends a decision citing winner and losers. A tie it
    /// cannot break is escalated (exit 6) instead of guessed.
    ///
    /// Example:
    ///   swarm pick --run inc-42 --subject root-cause
    #[command(verbatim_doc_comment)]
    Pick(scratch::PickArgs),
    /// Resolve an escalation (a human's call); actions on its subject are allowed again.
    ///
    /// Example:
    ///   swarm resolve --run inc-42 --escalation 17 --winner 15 --by alice --note "15 is right, 16 raced"
    #[command(verbatim_doc_comment)]
    Resolve(scratch::ResolveArgs),
    /// List the run's open escalations as NDJSON (--all: resolved ones too).
    Escalations {
        /// The run.
        #[arg(long)]
        run: String,
        /// Resolved ones too.
        #[arg(long)]
        all: bool,
        /// Read as this agent: none when the run's policy does not show it decisions,
        /// actions and hypotheses (an escalation quotes the two entries it is between).
        /// Through SWARM_URL, the agent a token of several agents reads as.
        #[arg(long)]
        as_agent: Option<String>,
    },
    /// Summarise the oldest half of the working view into one summary event when the
    /// run's policy threshold (prune_max_entries) is crossed. Decisions and actions are
    /// pinned and never summarised; the raw log is never rewritten.
    ///
    /// Examples:
    ///   swarm prune --run inc-42
    ///   swarm prune --run inc-42 --force --summarizer-cmd 'llm -m small "summarise these findings"'
    #[command(verbatim_doc_comment)]
    Prune(prune::PruneArgs),
    /// Print what an agent should put in its prompt: summaries, pinned decisions and
    /// actions, and the most recent entries, in seq order, never over the byte budget.
    ///
    /// Example:
    ///   swarm context --run inc-42 --agent db --budget-bytes 8000
    #[command(verbatim_doc_comment)]
    Context(prune::ContextArgs),
    /// Close, archive and restore runs.
    #[command(subcommand)]
    Run(run::RunCmd),
    /// The batch synthesizer (the nightly job): distil new raw events into deduplicated,
    /// evidence-linked facts in the user's facts log (run @facts), detect and resolve
    /// contradictions, and learn investigation patterns and tool mistakes from closed runs
    /// (copied, sanitized, to the shared scope).
    ///
    /// Incremental from per-run watermarks; streaming (memory bounded by one pass);
    /// idempotent (nothing new: nothing written, "nothing_new": true); crash-safe (each
    /// pass is committed with its watermarks as a whole, or not at all); one synth per
    /// user at a time (exit 4 if another holds the lock). Prints a JSON report. Damaged
    /// records are skipped and named in the report (runs[].damaged); every intact record
    /// is synthesized, and the exit code is then 3.
    ///
    /// Examples:
    ///   swarm synth --all
    ///   swarm synth --run inc-42 --llm-cmd 'llm -m small --json' --llm-timeout-ms 5000
    ///   swarm synth --all --project-id my-secret-project --env-name prod-east
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Synth(synth::SynthArgs),
    /// The synthesized facts (current ones by default), one fact's evidence chain, or the
    /// facts as they stood at a time.
    ///
    /// Examples:
    ///   swarm facts | jq -r '.facts[] | "\(.id) \(.confidence) \(.text)"'
    ///   swarm facts --subject orders-svc --table
    ///   swarm facts --explain F12 | jq '.evidence[].event.content'
    ///   swarm facts --as-of 2026-11-22T14:03:00Z --all
    #[command(verbatim_doc_comment)]
    Facts(synth::FactsArgs),
    /// Search the user's memory: its synthesized facts and the findings of its open runs
    /// (a closed run only when named with --run), best first.
    ///
    /// Ranked by words (rare query words weigh more); with a sentence-embedding model
    /// (--embed-model DIR or SWARM_EMBED_MODEL), also by meaning, the two ranks fused by
    /// reciprocal rank, so "no free DB connections" can find "postgres pool exhausted". The
    /// output says which: `mode: hybrid` and the model, or `mode: lexical` and why. Only
    /// --user's memory is searched; with --as-agent, only what the runs' policies let that
    /// agent read.
    ///
    /// Examples:
    ///   swarm search "connection pool exhausted"
    ///   swarm search "why is checkout slow" --run inc-42 --kind evidence --limit 5
    ///   swarm search "disk full" --since 2026-11-22 --json | jq -r '.hits[] | "\(.score) \(.text)"'
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Search(search::SearchArgs),
    /// Seed 002's memory events (stored, pattern_learned, tool_tracked) derived from the
    /// runs' events, as NDJSON; each names the run and seq of the event that caused it.
    ///
    /// Examples:
    ///   swarm memory-events --run inc-42
    ///   swarm memory-events --run inc-42 --follow | jq -r '"\(.action) \(.title)"'
    #[command(name = "memory-events", verbatim_doc_comment)]
    MemoryEvents(memory_events::MemoryEventsArgs),
    /// Proven investigation patterns for a symptom (the user's own, then the shared
    /// scope's), as NDJSON, best first.
    ///
    /// Example:
    ///   swarm patterns --symptom high_latency_checkout | jq -r '.tool_sequence | join(" -> ")'
    #[command(verbatim_doc_comment)]
    Patterns {
        /// The symptom type (exact match first, then shared words).
        #[arg(long)]
        symptom: String,
        /// Read as this agent: the user's own patterns only from runs whose policy shows
        /// it every entry type (a pattern quotes the run's decisions). Through SWARM_URL,
        /// the agent a token of several agents reads as.
        #[arg(long)]
        as_agent: Option<String>,
    },
    /// Known mistakes of a tool, before calling it (the user's own, then the shared
    /// scope's), as NDJSON, most frequent first, with the correction when one was seen.
    ///
    /// Example:
    ///   swarm advise --tool query_metrics | jq -r '.error, .correction'
    #[command(verbatim_doc_comment)]
    Advise {
        /// The tool name (as in the events' meta.tool).
        #[arg(long)]
        tool: String,
        /// Read as this agent: the user's own mistakes only from runs whose policy shows
        /// it every entry type (a mistake quotes the tool's arguments and errors).
        /// Through SWARM_URL, the agent a token of several agents reads as.
        #[arg(long)]
        as_agent: Option<String>,
    },
    /// Swarm metrics of a run: duplication (independent rediscovery), cross-agent
    /// influence, discovery-to-visibility latency, conflicts and escalations.
    ///
    /// Example:
    ///   swarm metrics --run inc-42
    ///   swarm metrics --run inc-42 --json | jq '.duplication_rate'
    #[command(verbatim_doc_comment)]
    Metrics {
        /// The run.
        #[arg(long)]
        run: String,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Dedup precision/recall and contradiction detection on the labelled fixture
    /// (data/fixtures/synth-quality.jsonl, built in), per part: `tune` (tuned on) and
    /// `heldout` (never tuned on).
    #[command(verbatim_doc_comment)]
    Quality {
        /// Another fixture file, same format.
        #[arg(long)]
        fixture: Option<PathBuf>,
        /// Instead: a labelled set of agent findings (data/fixtures/semantic/*.jsonl),
        /// measured end to end: appended to fresh stores (a temporary data dir),
        /// synthesized, and compared with its labels (pairs, look-alikes merged,
        /// contradictions, changes over time flagged as contradictions).
        #[arg(long, conflicts_with = "fixture")]
        set: Option<PathBuf>,
        /// With --set: the sentence-transformers model the synthesizer and the search use
        /// (default: the one under the data dir; without one both are lexical, and say so).
        #[arg(long, env = "SWARM_EMBED_MODEL", requires = "set")]
        embed_model: Option<PathBuf>,
        /// With --set: fixed vectors instead of a model, a JSON object of text to vector
        /// (made by .ci/embed_vectors.py with sentence-transformers), for measuring; it
        /// takes the place of --embed-model.
        #[arg(long, requires = "set")]
        embed_vectors: Option<PathBuf>,
        /// With --set: the optional LLM step, as `swarm synth --llm-cmd` (borderline pairs
        /// as JSON on stdin, `{"same": true|false}` on stdout), to measure a judge.
        #[arg(long, requires = "set")]
        llm_cmd: Option<String>,
        /// With --llm-cmd: longest one call may take.
        #[arg(long, default_value_t = 10_000, requires = "llm_cmd")]
        llm_timeout_ms: u64,
        /// With --llm-cmd: most calls per synthesized user.
        #[arg(long, default_value_t = 200, requires = "llm_cmd")]
        llm_calls_max: u64,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Serve the data directory over HTTP: a JSON API under /v1, a live tail over SSE,
    /// bearer tokens (`swarm token add`) for identity. Stops on SIGTERM or SIGINT after
    /// the requests in flight.
    ///
    /// Example:
    ///   swarm serve --listen 127.0.0.1:7700
    #[cfg(feature = "server")]
    #[command(verbatim_doc_comment)]
    Serve(serve::ServeArgs),
    /// Manage the server's bearer tokens (stored hashed in <data dir>/.tokens.json).
    #[cfg(feature = "server")]
    #[command(subcommand)]
    Token(serve::TokenCmd),
    /// The local embedding model (semantic synthesis and search): install it, show it.
    #[cfg(feature = "semantic")]
    #[command(subcommand)]
    Model(model::ModelCmd),
    /// Run the demo: agent processes work an SRE incident together in a new run.
    ///
    /// Four agent processes append hypotheses, evidence, decisions and actions
    /// concurrently; the demo then reads the run back, verifies it, closes and archives
    /// it, and ends with the nightly synthesis: the facts, one explained back to its raw
    /// events, a contradiction's resolution, the patterns learned, and the run's metrics.
    Demo {
        /// Run id to use (default: demo-<time>).
        #[arg(long)]
        run: Option<String>,
        /// Start a `swarm serve` on a free loopback port and run the agent processes as
        /// its clients (SWARM_URL, one token per agent); the summary is the same.
        #[cfg(feature = "server")]
        #[arg(long)]
        server: bool,
    },
    /// Serve the memory tools, the scratchpad tools and the runs (as resources) over the
    /// Model Context Protocol on stdin/stdout, for an agent framework or an MCP client.
    ///
    /// The tools act as --user (SWARM_USER) and as the --agent ids given; a tool cannot
    /// name another user. Refusals come back as tool errors naming their cause.
    ///
    /// Example (an MCP client's server entry):
    ///   {"command": "swarm", "args": ["--data-dir", "/var/lib/swarm", "--user", "alice", "mcp", "--agent", "sre-agent"]}
    ///
    /// With SWARM_URL (and SWARM_TOKEN) set, the same stdio server runs its tools on that
    /// `swarm serve` (its /mcp endpoint), as the user and agents of the token:
    ///   {"command": "swarm", "args": ["mcp"], "env": {"SWARM_URL": "http://127.0.0.1:7700", "SWARM_TOKEN": "..."}}
    #[cfg(feature = "mcp")]
    #[command(verbatim_doc_comment)]
    Mcp(mcp::McpArgs),
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
    /// Board compare-and-swap: append only if the latest entry on --subject is seq N
    /// (0: none yet); else exit 4.
    #[arg(long, requires = "subject")]
    expect_subject_seq: Option<u64>,
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
    /// Read as this agent: only what the run's policy lets it see.
    #[arg(long)]
    as_agent: Option<String>,
}

#[derive(Args)]
struct TailArgs {
    /// The run.
    #[arg(long)]
    run: String,
    /// First seq to print (default 1). Ignored when the cursor file exists.
    #[arg(long)]
    from_seq: Option<u64>,
    /// Keep running and print new events as they become visible.
    #[arg(long)]
    follow: bool,
    /// Only this agent's events.
    #[arg(long)]
    agent: Option<String>,
    /// Only this type.
    #[arg(long = "type")]
    kind: Option<String>,
    /// Resume after the event saved in this file, and save each printed event to it.
    #[arg(long)]
    cursor_file: Option<PathBuf>,
    /// fsync the cursor file at each save (slower; survives a power loss).
    #[arg(long)]
    cursor_fsync: bool,
    /// Polling interval of the safety net, in milliseconds.
    #[arg(long, default_value_t = swarm_memory::tail::POLL_INTERVAL_MS_DEFAULT)]
    poll_ms: u64,
    /// Do not use inotify: poll only.
    #[arg(long)]
    no_notify: bool,
    /// Read as this agent: only what the run's policy lets it see (a policy appended
    /// while following applies from there on). Through SWARM_URL, the agent the read is
    /// made as (needed when the token acts as several).
    #[arg(long)]
    as_agent: Option<String>,
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SWARM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_target(false)
        .with_ansi(colours_on_stderr())
        .init();
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.chain().find_map(exit_code_of).unwrap_or(1);
            eprintln!("swarm: {}", error_message(&e));
            ExitCode::from(code as u8)
        }
    };
    // A checkpoint an append started would die with this process: waited for, after
    // the answer and any error are out, for a bounded time.
    swarm_memory::store::finish_checkpoints(std::time::Duration::from_secs(10));
    code
}

/// The exit code an error in the chain names: a library error's class, or (as a client
/// of a server) the class of the server's refusal.
fn exit_code_of(c: &(dyn std::error::Error + 'static)) -> Option<i32> {
    if let Some(e) = c.downcast_ref::<Error>() {
        return Some(e.exit_code());
    }
    #[cfg(feature = "server")]
    if let Some(r) = c.downcast_ref::<remote::Refused>() {
        return Some(r.code);
    }
    None
}

/// Colours only when stderr is a terminal and `NO_COLOR` is not set (no-color.org).
fn colours_on_stderr() -> bool {
    use std::io::IsTerminal;
    io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The error and its causes on one line, each cause once: a library error already
/// quotes the OS error it wraps, so a cause whose text the message holds is left out.
fn error_message(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg.replace('\n', " ")
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    // (A broken connection to a server is not a closed stdout.)
    #[cfg(feature = "server")]
    if e.downcast_ref::<crate::http::ServerIo>().is_some() {
        return false;
    }
    e.chain().any(|c| {
        // serde_json wraps the writer's io::Error in its own error type (and does not
        // return it as the source), so look there too.
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == Some(io::ErrorKind::BrokenPipe)
    })
}

/// Whether the command only reads: those refuse a data dir that does not exist (a
/// nightly job with a mistyped path must fail, not report an empty store); only
/// commands that write create it.
fn reads_only(cmd: &Cmd) -> bool {
    !matches!(
        cmd,
        Cmd::Append(_)
            | Cmd::Policy(_)
            | Cmd::Channel(_)
            | Cmd::Pick(_)
            | Cmd::Resolve(_)
            | Cmd::Prune(_)
            | Cmd::Demo { .. }
            | Cmd::Quality { .. }
    ) && !is_mcp(cmd)
}

/// `swarm mcp` writes (its tools append), so it may create the data dir.
fn is_mcp(cmd: &Cmd) -> bool {
    #[cfg(feature = "mcp")]
    if matches!(cmd, Cmd::Mcp(_)) {
        return true;
    }
    let _ = cmd;
    false
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let checkpoint_dir = cli
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| cli.data_dir.join(".checkpoints"));
    let archive_dir = cli
        .archive_dir
        .clone()
        .unwrap_or_else(|| cli.data_dir.join(".archive"));
    // A token or a model made here would land in this machine's data dir, not the
    // server's: refused while SWARM_URL points at a server (`swarm serve` itself ignores it).
    #[cfg(feature = "server")]
    if remote::url().is_some() {
        #[cfg(feature = "semantic")]
        let model = matches!(cli.cmd, Cmd::Model(_));
        #[cfg(not(feature = "semantic"))]
        let model = false;
        if model || matches!(cli.cmd, Cmd::Token(_)) {
            return Err(remote::files_only());
        }
    }
    #[cfg(feature = "semantic")]
    if let Cmd::Model(c) = cli.cmd {
        return model::model(c, &cli.data_dir);
    }
    #[cfg(feature = "server")]
    let cmd = match cli.cmd {
        Cmd::Serve(a) => {
            return serve::serve(
                a,
                &cli.data_dir,
                &checkpoint_dir,
                cli.checkpoint_every,
                &archive_dir,
                cli.deny_anonymous,
            )
        }
        Cmd::Token(c) => return serve::token(c, &cli.data_dir, &cli.user, cli.deny_anonymous),
        cmd => {
            if let Some(url) = remote::url() {
                #[cfg(feature = "mcp")]
                if let Cmd::Mcp(a) = &cmd {
                    if !a.agents.is_empty() {
                        eprintln!("swarm mcp: SWARM_URL is set: the tools act as the agents of SWARM_TOKEN; --agent is not used");
                    }
                    return mcp_bridge::run(&url);
                }
                return remote::run(url, cmd);
            }
            cmd
        }
    };
    #[cfg(not(feature = "server"))]
    let cmd = cli.cmd;
    if reads_only(&cmd) && !cli.data_dir.is_dir() {
        anyhow::bail!(
            "data directory {} does not exist (set --data-dir or SWARM_DATA_DIR; only commands that write create it)",
            cli.data_dir.display()
        );
    }
    let store = Store::open(&cli.data_dir)?
        .with_checkpoints(&checkpoint_dir, cli.checkpoint_every)
        .with_archive_dir(&archive_dir)
        .with_user(&cli.user, !cli.deny_anonymous)?;
    match cmd {
        Cmd::Checkpoint { run } => {
            let bar = progress("checkpoint");
            let info = store.checkpoint(&run, bar)?;
            let out = serde_json::json!({"run": run, "checkpoint": info, "dir": store.checkpoint_dir(&run)});
            Ok(scratch::print_ack(&out, "checkpoint written"))
        }
        Cmd::Replay(a) => replay(&store, a),
        Cmd::Policy(c) => scratch::policy(&store, c),
        Cmd::Prune(a) => prune::prune(&store, a),
        Cmd::Run(c) => run::run(&store, c),
        Cmd::Context(a) => prune::context(&store, a),
        Cmd::Channel(c) => scratch::channel(&store, c),
        Cmd::Board(a) => scratch::board(&store, a),
        Cmd::Pick(a) => scratch::pick(&store, a),
        Cmd::Resolve(a) => scratch::resolve(&store, a),
        Cmd::Escalations { run, all, as_agent } => {
            scratch::escalations(&store, &run, all, as_agent.as_deref())
        }
        Cmd::Append(a) => {
            let r = append(&store, a);
            // A background prune this append started finishes before the process exits.
            if !store.wait_background(std::time::Duration::from_secs(30)) {
                tracing::warn!("a background prune is still running; exiting without it");
            }
            r
        }
        Cmd::Read(a) => read(&store, a),
        Cmd::Tail(a) => tail(&store, a),
        Cmd::Verify { run } => verify(&store, run),
        Cmd::Repair { run } => {
            let repaired = store.repair_all(&run)?;
            if repaired.is_empty() {
                return Ok(scratch::print_ack(&None::<swarm_memory::Event>, "repaired"));
            }
            let mut code = ExitCode::SUCCESS;
            for ev in &repaired {
                code = scratch::print_ack(&Some(ev), "repaired");
            }
            Ok(code)
        }
        Cmd::Runs { json } => runs(&store, json),
        Cmd::Index(IndexCmd::Rebuild { run }) => index_rebuild(&store, run),
        Cmd::Index(IndexCmd::Status { run }) => index_status(&store, run),
        Cmd::Synth(a) => synth::synth(&store, &cli.data_dir, a),
        Cmd::Facts(a) => synth::facts(&store, a),
        Cmd::Search(a) => search::search(&store, &cli.data_dir, a),
        Cmd::MemoryEvents(a) => memory_events::memory_events(&store, a),
        Cmd::Patterns { symptom, as_agent } => {
            synth::patterns(&store, &symptom, as_agent.as_deref())
        }
        Cmd::Advise { tool, as_agent } => synth::advise(&store, &tool, as_agent.as_deref()),
        Cmd::Metrics { run, json } => synth::metrics(&store, &run, json),
        Cmd::Quality {
            set: Some(set),
            json,
            embed_model,
            embed_vectors,
            llm_cmd,
            llm_timeout_ms,
            llm_calls_max,
            ..
        } => {
            let m = match embed_vectors {
                Some(file) => search::table_model(&file)?,
                None => search::model(embed_model.as_deref(), &cli.data_dir)?,
            };
            let llm = llm_cmd.map(|cmd| swarm_memory::synth::LlmOptions {
                cmd,
                timeout: std::time::Duration::from_millis(llm_timeout_ms),
                calls_max: llm_calls_max,
            });
            synth::quality_set(&set, json, &m, llm)
        }
        Cmd::Quality { fixture, json, .. } => synth::quality(fixture, json),
        #[cfg(feature = "mcp")]
        Cmd::Mcp(a) => mcp::mcp(store, &cli.data_dir, a),
        #[cfg(feature = "server")]
        Cmd::Demo { run, server } => demo::run(
            &cli.data_dir,
            &checkpoint_dir,
            &archive_dir,
            &cli.user,
            run,
            server,
        ),
        #[cfg(not(feature = "server"))]
        Cmd::Demo { run } => demo::run(
            &cli.data_dir,
            &checkpoint_dir,
            &archive_dir,
            &cli.user,
            run,
            false,
        ),
        #[cfg(feature = "server")]
        Cmd::Serve(_) | Cmd::Token(_) => unreachable!("handled above"),
        #[cfg(feature = "semantic")]
        Cmd::Model(_) => unreachable!("handled above"),
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
        user_id: None,
        kind: a.kind.unwrap_or_default(),
        content,
        confidence: a.confidence,
        refs: a.refs,
        subject: a.subject,
        session_id: a.session,
        meta,
        expect_seq: a.expect_seq,
        expect_subject_seq: a.expect_subject_seq,
    };
    // Through the batch call, so the engine events the append caused (an escalation it
    // opened) are printed after it: the agent learns at once that its action escalated.
    let expect = ev.expect_seq;
    let stored = store.append_batch(&a.run, vec![ev], expect, durability)?;
    if let Err(code) = acknowledge(&mut out, &stored) {
        return Ok(code);
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints stored events as JSON lines. When stdout fails after the events are durable,
/// says on stderr which seqs were stored and returns [`scratch::EXIT_ACK_LOST`]: the write
/// happened, and a script must be able to tell that from a failed append.
fn acknowledge(out: &mut impl Write, stored: &[swarm_memory::Event]) -> Result<(), ExitCode> {
    let written = (|| -> io::Result<()> {
        for e in stored {
            serde_json::to_writer(&mut *out, e)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    })();
    match written {
        Ok(()) => Ok(()),
        Err(e) => {
            let seqs = match (stored.first(), stored.last()) {
                (Some(a), Some(b)) if a.seq != b.seq => format!("seqs {}..{}", a.seq, b.seq),
                (Some(a), _) => format!("seq {}", a.seq),
                _ => "nothing".into(),
            };
            eprintln!("swarm: stored as {seqs}, but the acknowledgement could not be written: {e}");
            Err(ExitCode::from(scratch::EXIT_ACK_LOST))
        }
    }
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
        let parse = |i: usize, v: &Value| -> Result<NewEvent, anyhow::Error> {
            NewEvent::deserialize(v).map_err(|e| {
                // serde's message names an unknown or missing field but not the field
                // whose value has the wrong type: find it, so the message names it.
                let at = if i > 0 {
                    format!("[{i}].")
                } else {
                    String::new()
                };
                match bad_field(v) {
                    Some(f) => invalid(&format!("line {n}: {at}{f}"), e.to_string()),
                    None if i > 0 => invalid(&format!("line {n}: [{i}]"), e.to_string()),
                    None => invalid(&format!("line {n}"), e.to_string()),
                }
            })
        };
        let stored = match value {
            Value::Array(items) => {
                let evs = items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| parse(i, v))
                    .collect::<Result<Vec<_>, _>>()?;
                let expect = evs.first().and_then(|e| e.expect_seq);
                store
                    .append_batch(run, evs, expect, durability)
                    .map_err(at_line)?
            }
            // Engine events the append caused (an escalation) are printed after it, so
            // the agent learns at once that its action was escalated.
            v @ Value::Object(_) => {
                let e = parse(0, &v)?;
                let expect = e.expect_seq;
                store
                    .append_batch(run, vec![e], expect, durability)
                    .map_err(at_line)?
            }
            _ => bail!(invalid(
                &format!("line {n}"),
                "must be an event object or an array of them"
            )),
        };
        if let Err(code) = acknowledge(out, &stored) {
            return Ok(code);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The first field of an event object that cannot be read as its field: each one is
/// tried alone beside valid required fields.
fn bad_field(v: &Value) -> Option<String> {
    let obj = v.as_object()?;
    obj.iter().find_map(|(k, val)| {
        let mut probe = serde_json::json!({"agent_id": "a", "type": "evidence", "content": "x"});
        probe[k.as_str()] = val.clone();
        NewEvent::deserialize(&probe).is_err().then(|| k.clone())
    })
}

fn parse_ts(field: &str, s: &Option<String>) -> anyhow::Result<Option<Ts>> {
    match s {
        None => Ok(None),
        Some(s) => Ts::parse(s)
            .map(Some)
            .ok_or_else(|| invalid(field, format!("{s:?} {}", Ts::refusal(s)))),
    }
}

fn read(store: &Store, a: ReadArgs) -> anyhow::Result<ExitCode> {
    let kind = match a.kind.as_deref() {
        None => None,
        Some(k) => Some(EventType::parse(k).ok_or_else(|| {
            invalid("type", format!("{k:?} is not an entry type (hypothesis, evidence, decision, action_taken, or an engine type such as summary, escalation)"))
        })?),
    };
    let opts = ReadOptions {
        from_seq: a.from_seq,
        to_seq: a.to_seq,
        agent: a.agent,
        kind,
        subject: a.subject,
        since: parse_ts("since", &a.since)?,
        until: parse_ts("until", &a.until)?,
        limit: a.limit,
        last: a.last,
        skip_corrupt: a.skip_corrupt,
        reader: a.as_agent,
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

fn tail(store: &Store, a: TailArgs) -> anyhow::Result<ExitCode> {
    let kind = match a.kind.as_deref() {
        None => None,
        Some(k) => Some(EventType::parse(k).ok_or_else(|| {
            invalid("type", format!("{k:?} is not an entry type (hypothesis, evidence, decision, action_taken, or an engine type such as summary, escalation)"))
        })?),
    };
    if a.poll_ms == 0 {
        bail!(invalid("poll-ms", "must be at least 1"));
    }
    let opts = TailOptions {
        from_seq: a.from_seq,
        agent: a.agent,
        kind,
        follow: a.follow,
        cursor_file: a.cursor_file,
        cursor_fsync: a.cursor_fsync,
        poll_interval_ms: a.poll_ms,
        notify: !a.no_notify,
        ..TailOptions::default()
    };
    // Engine logs (`@facts`) are drawn past every run's read policy: no agent reads them.
    let mut filter = match &a.as_agent {
        Some(agent) => Some(AgentFilter::new(store, &a.run, agent)?),
        None => None,
    };
    let mut t = store.tail(&a.run, opts)?;
    let out = io::stdout();
    let mut out = out.lock();
    let mut line = Vec::with_capacity(1024);
    while let Some(e) = t.next() {
        let e = e?;
        if let Some(f) = filter.as_mut() {
            if !f.shows(store, &e)? {
                // Not shown, but passed: a resumed tail does not see it again.
                t.commit()?;
                continue;
            }
        }
        line.clear();
        serde_json::to_writer(&mut line, &e)?;
        line.push(b'\n');
        out.write_all(&line)?;
        out.flush()?;
        // After the flush: a crash between the two re-delivers this event (at-least-once).
        t.commit()?;
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
        match store.verify(&r, progress("verify")) {
            Ok(report) => {
                bad |= !report.ok;
                serde_json::to_writer(&mut out, &report)?;
            }
            // A run that cannot be checked at all (a closed run whose archive is gone or
            // does not read back) is reported like any damaged one, and the others are
            // still checked.
            Err(e @ Error::Corrupt { .. }) => {
                bad = true;
                eprintln!("swarm: run {r:?}: {e}");
                let report = serde_json::json!({
                    "run": r, "ok": false, "corrupt": [], "error": e.to_string()
                });
                serde_json::to_writer(&mut out, &report)?;
            }
            Err(e) => return Err(e.into()),
        }
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
    let mut damaged = false;
    for id in ids {
        let info = store.run_info(&id)?;
        damaged |= info.damaged.is_some();
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
            if let Some(d) = &info.damaged {
                writeln!(out, "  {}", crate::term::safe(d))?;
            }
        }
    }
    out.flush()?;
    // Every run is listed; a damaged one makes the exit code say so (3), as `verify`.
    Ok(match damaged {
        true => ExitCode::from(3),
        false => ExitCode::SUCCESS,
    })
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
        let sa = store
            .state_at(&a.run, from, |_| {})
            .map_err(|e| e.renamed("at-seq", "diff FROM"))?;
        let sb = store
            .state_at(&a.run, to, |_| {})
            .map_err(|e| e.renamed("at-seq", "diff TO"))?;
        let diff = store.diff(&a.run, &sa.state, &sb.state)?;
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
            writeln!(out, "{}", term::safe(&timeline_line(&e?)))?;
        }
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(agent) = &a.agent {
        let view = store.agent_view(&a.run, &r.state, agent)?;
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

#[cfg(all(test, feature = "server"))]
mod tests {
    use super::*;

    /// A broken pipe to the server (its body could not be sent) is an error, exit 1; only
    /// a broken stdout ends a command quietly.
    #[test]
    fn a_broken_connection_to_the_server_is_not_a_closed_stdout() {
        let pipe = || io::Error::new(io::ErrorKind::BrokenPipe, "Broken pipe");
        assert!(is_broken_pipe(
            &anyhow::Error::new(pipe()).context("printing")
        ));
        let server = anyhow::Error::new(pipe())
            .context(crate::http::ServerIo("cannot reach http://x".into()))
            .context("appending");
        assert!(!is_broken_pipe(&server));
    }
}
